//! T22 and T23: what an operator sees and does: every task listed with
//! its owner and instance, a cancel of anyone's task, and the requeue of a
//! failed task that may run again.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::events::test_options;
use mcp_event_store_core::task::{
    Applied, CancelMode, EXPIRED_ERROR, Finish, INSTANCE_LOST_ERROR, InstanceId, NewTask, Owner,
    Requeue, RequeueRefusal, RuntimeStore, TaskDigest, TaskEntry, TaskStatus, TaskStore, Worker,
    WorkerChange,
};
use mcp_event_store_core::{Clock, Error};

use super::TaskHarness;
use super::support::*;

/// The lease of an instance that is to lapse.
const LEASE: Duration = Duration::from_secs(30);

async fn instance<S: RuntimeStore>(store: &S, lease: Duration) -> InstanceId {
    let id = InstanceId::generate().unwrap();
    assert!(store.heartbeat(id, lease).await.unwrap());
    id
}

/// Every task, a page of `limit` at a time, checking the pages ascend.
async fn list_all<S: RuntimeStore>(store: &S, limit: usize) -> Vec<TaskEntry> {
    let (mut all, mut after) = (Vec::new(), None::<TaskDigest>);
    loop {
        let page = store.task_page(after.as_ref(), limit).await.unwrap();
        assert!(page.tasks.len() <= limit, "a page holds at most its limit");
        for entry in &page.tasks {
            assert!(
                after.is_none_or(|after| entry.task > after),
                "pages ascend by digest"
            );
            after = Some(entry.task);
        }
        all.extend(page.tasks);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

/// T22, T11: paged through, the listing holds every task exactly once,
/// whoever owns it, each as its owner reads it now, with its instance and
/// that instance's lease as read: a live one's deadline, a lapsed one's
/// task failed as lost, a claimed task on its claimant.
pub async fn operators_list_every_task_with_its_instance<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let bob = Owner::principal(b"bob").unwrap();
    let gone = instance(&f.store, LEASE).await;
    let mut made = Vec::new();
    for n in 0..5 {
        let owner = [&f.owner, &bob, &Owner::Anonymous][n % 3];
        let (id, _) = f.create_with(NewTask::new(owner, f.me)).await;
        made.push((id, *owner, f.me));
    }
    let (lost, _) = f.create_with(NewTask::new(&bob, gone)).await;
    made.push((lost, bob, gone));
    let (moved, _) = f
        .create_with(NewTask::new(&f.owner, gone).takeover(3))
        .await;
    f.clock.advance(LEASE);
    let claimant = instance(&f.store, DAY).await;
    let claimed = f.store.claim(claimant, 16).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].view.instance, Some(claimant));
    assert!(
        claimed[0].lapsed_for.is_some(),
        "a takeover after a lapse says how long the lapse lasted"
    );
    made.push((moved, f.owner, claimant));

    for limit in [1, 3, 100] {
        let listed = list_all(&f.store, limit).await;
        let digests: BTreeSet<TaskDigest> = listed.iter().map(|e| e.task).collect();
        assert_eq!(digests.len(), listed.len(), "no task listed twice");
        assert_eq!(
            digests,
            made.iter().map(|(id, ..)| id.digest()).collect(),
            "every task is listed (page size {limit})"
        );
        for (id, owner, on) in &made {
            let entry = listed.iter().find(|e| e.task == id.digest()).unwrap();
            assert_eq!(&entry.view.owner, owner);
            assert_eq!(entry.view.instance, Some(*on), "the task's instance");
            let read = f.store.get(&id.to_string(), owner).await.unwrap().unwrap();
            assert_eq!(entry.view.record, read, "listed as its owner reads it");
        }
        let lost = listed.iter().find(|e| e.task == lost.digest()).unwrap();
        assert_eq!(lost.view.record.status, TaskStatus::Failed);
        assert_eq!(
            lost.view.record.outcome.as_deref(),
            Some(INSTANCE_LOST_ERROR)
        );
        assert!(
            lost.view
                .instance_alive_until
                .is_none_or(|until| until <= Clock::now_millis(&*f.clock)),
            "a lapsed instance's lease reads as run out"
        );
        let live = listed
            .iter()
            .find(|e| e.task == made[0].0.digest())
            .unwrap();
        assert!(
            live.view
                .instance_alive_until
                .is_some_and(|until| until > Clock::now_millis(&*f.clock)),
            "a live instance's lease is listed"
        );
    }
    assert!(matches!(
        f.store.task_page(None, 0).await,
        Err(Error::Config(_))
    ));
    f.close(h).await;
}

/// T22, T6, T20: an operator's cancel ends anyone's task `cancelled` at
/// once with its reason, as its owner's immediate cancel would; its
/// worker's next write finds it ended; an ended task stays as it ended.
pub async fn an_operator_cancels_any_owners_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let bob = Owner::principal(b"bob").unwrap();
    let (task, id) = f.create_with(NewTask::new(&bob, f.me)).await;
    let cancelled = f
        .store
        .cancel_task(&task.digest(), Some("drained for maintenance"))
        .await
        .unwrap()
        .expect("the task is there");
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert!(cancelled.cancel_requested);
    assert_eq!(
        cancelled.cancel_reason.as_deref(),
        Some("drained for maintenance")
    );
    let read = f.store.get(&id, &bob).await.unwrap().unwrap();
    assert_eq!(read, cancelled, "its owner reads it cancelled");
    assert!(matches!(
        f.apply(&task, WorkerChange::SetMessage(Some("still here")))
            .await,
        Applied::AlreadyTerminal(TaskStatus::Cancelled)
    ));

    let (done, _) = f.create().await;
    f.apply(&done, WorkerChange::Finish(Finish::Completed(b"{}")))
        .await;
    let kept = f
        .store
        .cancel_task(&done.digest(), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.status, TaskStatus::Completed, "an ended task stays");

    let (other, _) = f.create().await;
    f.store.delete(&other.to_string()).await.unwrap();
    assert_eq!(
        f.store.cancel_task(&other.digest(), None).await.unwrap(),
        None
    );
    f.close(h).await;
}

/// T23, T16 to T19: a task whose last run's instance lapsed, read lost or
/// persisted so by a purge, is requeued: `working` again, released, with
/// one more run, its checkpoint kept and `rev` past the failure its owner
/// read; a claim takes it and runs it under a new epoch, fencing the old
/// instance, and it completes.
pub async fn a_requeue_gives_an_exhausted_task_another_run<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    for persisted in [false, true] {
        let gone = instance(&f.store, LEASE).await;
        let (task, id) = f
            .create_with(NewTask::new(&f.owner, gone).takeover(1))
            .await;
        let first = Worker::first(gone);
        let digest = task.digest();
        let saved = f
            .store
            .apply_claimed(&digest, first, WorkerChange::Checkpoint(b"step 7"))
            .await
            .unwrap();
        assert!(is_changed(&saved));
        f.clock.advance(LEASE);
        let failed = f.get(&id).await;
        assert_eq!(failed.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
        if persisted {
            let report = f.store.purge_expired_tasks().await.unwrap();
            assert_eq!(report.exhausted, 1, "{report:?}");
            assert_eq!(
                f.get(&id).await,
                failed,
                "a purge persists what reads showed"
            );
        }

        let Requeue::Requeued(record) = f.store.requeue_task(&digest).await.unwrap() else {
            panic!("an exhausted task is requeued");
        };
        assert_eq!(record.status, TaskStatus::Working);
        assert_eq!(record.outcome, None);
        assert!(record.rev > failed.rev, "rev moves past the failure read");
        let takeover = record.takeover.clone().unwrap();
        assert!(takeover.released, "it waits for a claim");
        assert_eq!(takeover.attempt(), 2, "the lost run counts");
        assert_eq!(takeover.max_attempts, 2, "one more run");
        assert_eq!(takeover.checkpoint.as_deref(), Some(&b"step 7"[..]));
        assert_eq!(f.get(&id).await, record, "its owner reads it requeued");

        let runner = instance(&f.store, DAY).await;
        let claimed = f.store.claim(runner, 16).await.unwrap();
        assert_eq!(
            claimed.len(),
            1,
            "the requeued task is claimed: {claimed:?}"
        );
        let claim = &claimed[0];
        assert_eq!((claim.task, claim.worker.epoch), (digest, 2));
        assert_eq!(
            claim
                .view
                .record
                .takeover
                .as_ref()
                .unwrap()
                .checkpoint
                .as_deref(),
            Some(&b"step 7"[..])
        );
        assert_eq!(
            f.store
                .apply_claimed(&digest, first, WorkerChange::SetMessage(Some("back")))
                .await
                .unwrap(),
            Applied::Fenced,
            "the lost instance stays fenced"
        );
        let done = f
            .store
            .apply_claimed(
                &digest,
                claim.worker,
                WorkerChange::Finish(Finish::Completed(b"{\"n\":7}")),
            )
            .await
            .unwrap();
        assert!(is_changed(&done));
        assert_eq!(f.get(&id).await.status, TaskStatus::Completed);
    }
    f.close(h).await;
}

/// T23, T4: every other task is refused with its reason, changing
/// nothing: one that runs or ended otherwise, one made to die with its
/// instance, one past its ttl, one its client asked to cancel; an unknown
/// one is unknown.
pub async fn only_a_failed_task_that_may_run_again_is_requeued<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let refused = |requeue: Requeue| match requeue {
        Requeue::Refused(record, why) => (record, why),
        other => panic!("refused expected: {other:?}"),
    };

    let (running, running_id) = f
        .create_with(NewTask::new(&f.owner, f.me).takeover(2))
        .await;
    let (done, done_id) = f
        .create_with(NewTask::new(&f.owner, f.me).takeover(2))
        .await;
    f.apply(&done, WorkerChange::Finish(Finish::Completed(b"{}")))
        .await;
    let (failed, failed_id) = f
        .create_with(NewTask::new(&f.owner, f.me).takeover(2))
        .await;
    f.apply(
        &failed,
        WorkerChange::Finish(Finish::Failed(b"{\"code\":1}")),
    )
    .await;
    let gone = instance(&f.store, LEASE).await;
    let (plain, plain_id) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let (asked, asked_id) = f
        .create_with(NewTask::new(&f.owner, gone).takeover(1))
        .await;
    f.cancel(&asked_id, CancelMode::Cooperative).await;
    let (short, short_id) = f
        .create_with(
            NewTask::new(&f.owner, f.me)
                .takeover(2)
                .ttl(Duration::from_secs(5)),
        )
        .await;
    f.apply(
        &short,
        WorkerChange::Finish(Finish::Failed(b"{\"code\":2}")),
    )
    .await;
    f.clock.advance(LEASE);

    for (task, id, why) in [
        (
            running,
            running_id,
            RequeueRefusal::NotFailed(TaskStatus::Working),
        ),
        (
            done,
            done_id,
            RequeueRefusal::NotFailed(TaskStatus::Completed),
        ),
        (plain, plain_id.clone(), RequeueRefusal::NotTakenOver),
        (asked, asked_id, RequeueRefusal::CancelRequested),
        (short, short_id.clone(), RequeueRefusal::Expired),
    ] {
        let before = f.get(&id).await;
        let (record, refusal) = refused(f.store.requeue_task(&task.digest()).await.unwrap());
        assert_eq!(refusal, why, "{id}");
        assert_eq!(record, before, "refused as read: {id}");
        assert_eq!(f.get(&id).await, before, "nothing changed: {id}");
    }
    assert_eq!(
        f.get(&plain_id).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR)
    );
    assert_ne!(
        f.get(&short_id).await.outcome.as_deref(),
        Some(EXPIRED_ERROR)
    );

    // A run that failed may run again: the same run, a new claim.
    let Requeue::Requeued(record) = f.store.requeue_task(&failed.digest()).await.unwrap() else {
        panic!("a failed task that may be taken over is requeued");
    };
    assert_eq!(record.takeover.as_ref().unwrap().attempt(), 1);
    assert_eq!(f.get(&failed_id).await.status, TaskStatus::Working);

    let (gone_task, _) = f.create().await;
    f.store.delete(&gone_task.to_string()).await.unwrap();
    assert_eq!(
        f.store.requeue_task(&gone_task.digest()).await.unwrap(),
        Requeue::Unknown
    );
    f.close(h).await;
}

/// Reopens through the harness to check both calls on a second handle:
/// what one handle requeued, another lists as waiting (T9).
pub async fn a_requeue_is_seen_on_every_handle<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let gone = instance(&f.store, LEASE).await;
    let (task, _) = f
        .create_with(NewTask::new(&f.owner, gone).takeover(1))
        .await;
    f.clock.advance(LEASE);
    assert!(matches!(
        f.store.requeue_task(&task.digest()).await.unwrap(),
        Requeue::Requeued(_)
    ));
    let listed = list_all(&other, 10).await;
    assert_eq!(listed.len(), 1);
    let record = &listed[0].view.record;
    assert_eq!(record.status, TaskStatus::Working);
    assert!(record.takeover.as_ref().unwrap().released);
    let runner = instance(&other, DAY).await;
    assert_eq!(other.claim(runner, 16).await.unwrap().len(), 1);
    h.close(other).await;
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_operators {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            operators_list_every_task_with_its_instance,
            an_operator_cancels_any_owners_task,
            a_requeue_gives_an_exhausted_task_another_run,
            only_a_failed_task_that_may_run_again_is_requeued,
            a_requeue_is_seen_on_every_handle,
        );
    };
}
