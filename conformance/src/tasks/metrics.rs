//! The task operations an operator watches are counted in the metrics
//! every store records (core's `observe` table): created, claimed, fenced,
//! inputs requested and taken, finished, the time to a takeover, tasks
//! with no run left, requeues.

use mcp_event_store_core::observe::names::*;
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Requeue, RuntimeStore, TaskStore, Worker, WorkerChange,
};

use super::TaskHarness;
use super::support::*;
use crate::events::{install_test_recorder, recorded_metric};

/// Every counter moves by at least what this case did (other cases of
/// the same test binary may run at once and add to them).
pub async fn task_operations_are_counted_in_metrics<H: TaskHarness>(h: &H) {
    install_test_recorder();
    let f = fixture(h).await;
    let count = |name: &str, labels: &[(&str, &str)]| recorded_metric(name, labels);
    let held = count(TASKS_CREATED_TOTAL, &[("mode", "held")]);
    let queued = count(TASKS_CREATED_TOTAL, &[("mode", "queued")]);
    let claims = count(TASK_CLAIMS_TOTAL, &[]);
    let fenced = count(TASK_FENCED_WRITES_TOTAL, &[]);
    let requested = count(TASK_INPUTS_REQUESTED_TOTAL, &[]);
    let taken = count(TASK_INPUTS_TAKEN_TOTAL, &[]);
    let completed = count(TASKS_FINISHED_TOTAL, &[("status", "completed")]);

    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    f.request(&task, "b").await;
    f.answer(&id, &[("a", b"1")]).await;
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"1"[..]));
    assert!(is_changed(
        &f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await
    ));

    let (queued_task, _) = f.create_with(NewTask::new(&f.owner, f.me).queued()).await;
    let claimed = f.store.claim(f.me, 16).await.unwrap();
    let claim = claimed
        .iter()
        .find(|c| c.task == queued_task.digest())
        .expect("the queued task is claimed");
    let stale = Worker {
        instance: claim.worker.instance,
        epoch: claim.worker.epoch - 1,
    };
    assert_eq!(
        f.store
            .apply_claimed(&claim.task, stale, WorkerChange::SetMessage(Some("late")))
            .await
            .unwrap(),
        Applied::Fenced
    );

    assert!(count(TASKS_CREATED_TOTAL, &[("mode", "held")]) >= held + 1.0);
    assert!(count(TASKS_CREATED_TOTAL, &[("mode", "queued")]) >= queued + 1.0);
    assert!(count(TASK_CLAIMS_TOTAL, &[]) >= claims + 1.0);
    assert!(count(TASK_FENCED_WRITES_TOTAL, &[]) >= fenced + 1.0);
    assert!(count(TASK_INPUTS_REQUESTED_TOTAL, &[]) >= requested + 2.0);
    assert!(count(TASK_INPUTS_TAKEN_TOTAL, &[]) >= taken + 1.0);
    assert!(count(TASKS_FINISHED_TOTAL, &[("status", "completed")]) >= completed + 1.0);
    f.close(h).await;
}

/// A takeover after a lapse records how long the lapse lasted; a purge
/// counts a task whose last run was lost; a requeue is counted (T16,
/// T23).
pub async fn takeovers_exhaustion_and_requeues_are_counted_in_metrics<H: TaskHarness>(h: &H) {
    install_test_recorder();
    let f = fixture(h).await;
    let count = |name: &str| recorded_metric(name, &[]);
    let (delays, exhausted, requeued) = (
        count(TASK_TAKEOVER_DELAY_SECONDS),
        count(TASKS_EXHAUSTED_TOTAL),
        count(TASKS_REQUEUED_TOTAL),
    );
    let lease = std::time::Duration::from_secs(30);
    let gone = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(gone, lease).await.unwrap());
    let (moved, _) = f
        .create_with(NewTask::new(&f.owner, gone).takeover(2))
        .await;
    let (last, _) = f
        .create_with(NewTask::new(&f.owner, gone).takeover(1))
        .await;
    f.clock.advance(lease * 2);
    let claimed = f.store.claim(f.me, 16).await.unwrap();
    let claim = claimed.iter().find(|c| c.task == moved.digest()).unwrap();
    assert_eq!(claim.lapsed_for, Some(lease), "lapsed a lease ago");
    assert!(f.store.purge_expired_tasks().await.unwrap().exhausted >= 1);
    assert!(matches!(
        f.store.requeue_task(&last.digest()).await.unwrap(),
        Requeue::Requeued(_)
    ));
    assert!(count(TASK_TAKEOVER_DELAY_SECONDS) >= delays + 1.0);
    assert!(count(TASKS_EXHAUSTED_TOTAL) >= exhausted + 1.0);
    assert!(count(TASKS_REQUEUED_TOTAL) >= requeued + 1.0);
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_metrics {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            task_operations_are_counted_in_metrics,
            takeovers_exhaustion_and_requeues_are_counted_in_metrics,
        );
    };
}
