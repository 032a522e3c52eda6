//! T11: instances and their heartbeats: a lapsed instance fails its tasks,
//! no task is born under one, and the store reads and ends leases.

use std::time::Duration;

use mcp_event_store_core::task::{
    Applied, Finish, INSTANCE_LOST_ERROR, InstanceId, InstanceLease, NewTask, RuntimeStore, TaskId,
    TaskStatus, TaskStore, WorkerChange,
};
use mcp_event_store_core::{Clock, Error};

use super::TaskHarness;
use super::support::*;

/// T11: when an instance's heartbeat lapses, its running tasks read
/// `failed` with "server instance lost", and the instance cannot come back.
pub async fn lapsed_instance_fails_its_tasks<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let gone = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(gone, lease).await.unwrap());
    let (task, id) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let (_, finished) = f.create_with(NewTask::new(&f.owner, gone)).await;
    f.store
        .apply(
            &task,
            gone,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{}",
            },
        )
        .await
        .unwrap();
    let done = TaskId::parse(&finished).unwrap();
    f.store
        .apply(&done, gone, WorkerChange::Finish(Finish::Completed(b"{}")))
        .await
        .unwrap();
    let (_, healthy) = f.create().await;
    f.clock.advance(lease - Duration::from_millis(1));
    assert_eq!(f.get(&id).await.status, TaskStatus::InputRequired);
    f.clock.advance(Duration::from_millis(1));
    let lost = f.get(&id).await;
    assert_eq!(lost.status, TaskStatus::Failed);
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    assert_eq!(f.get(&finished).await.status, TaskStatus::Completed);
    assert_eq!(f.get(&healthy).await.status, TaskStatus::Working);
    assert!(
        !f.store.heartbeat(gone, lease).await.unwrap(),
        "a lapsed instance was revived"
    );
    assert_eq!(f.get(&id).await, lost);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.orphaned, 1);
    assert_eq!(f.get(&id).await, lost, "the purge changed what reads show");
    f.close(h).await;
}

/// T11: renewing the heartbeat keeps an instance's tasks running well past
/// one lease.
pub async fn renewed_heartbeat_keeps_tasks_alive<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let me = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(me, lease).await.unwrap());
    let (_, id) = f.create_with(NewTask::new(&f.owner, me)).await;
    for _ in 0..10 {
        f.clock.advance(Duration::from_secs(10));
        assert!(f.store.heartbeat(me, lease).await.unwrap());
        assert_eq!(f.store.purge_expired_tasks().await.unwrap().orphaned, 0);
        assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    }
    f.close(h).await;
}

/// T11: no task is born under an instance the store does not count
/// alive, whether its lease ran out on the store's clock with no renewal
/// in between, or it never registered: creating fails with
/// [`Error::InstanceLapsed`] and stores nothing, where it would otherwise
/// store a task that reads `failed` from its first `get`. A live instance
/// still creates.
pub async fn no_task_is_born_under_a_lapsed_instance<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let lapsed = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(lapsed, lease).await.unwrap());
    let rows = h.raw_rows().await.map(|rows| rows.len());
    f.clock.advance(lease);
    let never = InstanceId::generate().unwrap();
    for instance in [lapsed, never] {
        match f.store.create(NewTask::new(&f.owner, instance)).await {
            Err(Error::InstanceLapsed { instance: named }) => {
                assert_eq!(named, instance.to_string());
            }
            other => panic!("created under {instance:?}: {other:?}"),
        }
    }
    assert_eq!(h.raw_rows().await.map(|rows| rows.len()), rows);
    let (_, id) = f.create().await;
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    f.close(h).await;
}

/// T11: a worker whose instance was reaped gets `AlreadyTerminal` for its
/// late finish, and the task keeps its "instance lost" outcome.
pub async fn late_finish_from_a_reaped_instance_is_already_terminal<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let zombie = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(zombie, lease).await.unwrap());
    let (task, id) = f.create_with(NewTask::new(&f.owner, zombie)).await;
    f.clock.advance(lease + Duration::from_secs(1));
    f.store.purge_expired_tasks().await.unwrap();
    let lost = f.get(&id).await;
    let late = f
        .store
        .apply(
            &task,
            zombie,
            WorkerChange::Finish(Finish::Completed(b"{}")),
        )
        .await
        .unwrap();
    assert_eq!(late, Applied::AlreadyTerminal(TaskStatus::Failed));
    assert_eq!(f.get(&id).await, lost);
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    f.close(h).await;
}

/// T11: the store tells whether an instance is alive and lists the leases
/// it holds, by its own clock; a retired instance (a graceful shutdown)
/// lapses at once, its tasks read lost at once, it cannot come back, and a
/// purge forgets it once nothing of it runs. An instance never seen is not
/// alive.
pub async fn leases_are_read_and_a_retired_instance_lapses_at_once<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let other = InstanceId::generate().unwrap();
    let never = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(other, lease).await.unwrap());
    assert!(f.store.is_alive(f.me).await.unwrap());
    assert!(f.store.is_alive(other).await.unwrap());
    assert!(!f.store.is_alive(never).await.unwrap());
    let leases = |mut all: Vec<InstanceLease>| {
        all.sort_by_key(|lease| lease.instance);
        all.into_iter()
            .map(|lease| (lease.instance, lease.alive))
            .collect::<Vec<_>>()
    };
    let mut both = vec![(f.me, true), (other, true)];
    both.sort();
    assert_eq!(leases(f.store.instances().await.unwrap()), both);
    let listed = f.store.instances().await.unwrap();
    let other_lease = listed.iter().find(|l| l.instance == other).unwrap();
    assert_eq!(
        other_lease.alive_until,
        f.clock.now_millis() + 30_000,
        "the deadline by the store's clock"
    );

    let (_, running) = f.create_with(NewTask::new(&f.owner, other)).await;
    assert!(f.store.retire(other).await.unwrap());
    assert!(!f.store.is_alive(other).await.unwrap());
    let lost = f.get(&running).await;
    assert_eq!(lost.status, TaskStatus::Failed, "lost at once");
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    assert!(
        !f.store.heartbeat(other, lease).await.unwrap(),
        "a retired instance was revived"
    );
    assert!(
        !f.store.retire(other).await.unwrap(),
        "retired twice: it had lapsed"
    );
    let mut one_lapsed = vec![(f.me, true), (other, false)];
    one_lapsed.sort();
    assert_eq!(leases(f.store.instances().await.unwrap()), one_lapsed);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!((report.orphaned, report.instances), (1, 1));
    assert_eq!(
        leases(f.store.instances().await.unwrap()),
        vec![(f.me, true)]
    );
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_instances {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            lapsed_instance_fails_its_tasks,
            renewed_heartbeat_keeps_tasks_alive,
            no_task_is_born_under_a_lapsed_instance,
            late_finish_from_a_reaped_instance_is_already_terminal,
            leases_are_read_and_a_retired_instance_lapses_at_once,
        );
    };
}
