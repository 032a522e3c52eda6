//! T8, T21: ttls, expiry, the grace an expired task reads through, and the
//! purge of expired tasks with their inputs.

use std::time::Duration;

use mcp_event_store_core::task::{
    Applied, EXPIRED_ERROR, Finish, InstanceId, NewTask, RuntimeStore, TaskOptions, TaskStatus,
    TaskStore, WorkerChange,
};

use super::TaskHarness;
use super::support::*;
use crate::events::{test_clock, test_options};

/// The default grace (T21).
const GRACE: Duration = mcp_event_store_core::task::DEFAULT_GRACE;

/// T8: a task past its ttl reads `failed` with "task expired", the worker
/// can no longer change it, and purging persists exactly what reads showed.
pub async fn expired_task_reads_failed<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(60)))
        .await;
    f.request(&task, "k").await;
    f.clock.advance(Duration::from_millis(59_999));
    assert_eq!(f.get(&id).await.status, TaskStatus::InputRequired);
    f.clock.advance(Duration::from_millis(1));
    let expired = f.get(&id).await;
    assert_eq!(expired.status, TaskStatus::Failed);
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    assert!(expired.outstanding.is_empty());
    assert_eq!(
        f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await,
        Applied::AlreadyTerminal(TaskStatus::Failed)
    );
    assert_eq!(f.answer(&id, &[("k", b"1")]).await, expired);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.expired, 1);
    assert_eq!(
        f.get(&id).await,
        expired,
        "the purge changed what reads show"
    );
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().expired, 0);
    f.close(h).await;
}

/// T8, T21: a task is deleted one grace (an hour by default) after it
/// expires, with its inputs, and reads as unknown from then on, finished
/// or not.
pub async fn expired_task_is_purged_with_its_inputs_after_grace<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let rows_before = h.raw_rows().await.map(|rows| rows.len());
    let ttl = Duration::from_secs(60);
    let (running, running_id) = f.create_with(NewTask::new(&f.owner, f.me).ttl(ttl)).await;
    let (done, done_id) = f.create_with(NewTask::new(&f.owner, f.me).ttl(ttl)).await;
    for task in [&running, &done] {
        f.request(task, "asked").await;
        f.request(task, "answered").await;
    }
    f.answer(&running_id, &[("answered", b"1")]).await;
    f.apply(&done, WorkerChange::Finish(Finish::Completed(b"{}")))
        .await;
    f.clock.advance(ttl + GRACE - Duration::from_millis(1));
    assert_eq!(f.get(&running_id).await.status, TaskStatus::Failed);
    assert_eq!(
        f.get(&done_id).await.status,
        TaskStatus::Completed,
        "kept for its grace"
    );
    f.clock.advance(Duration::from_millis(1));
    for id in [&running_id, &done_id] {
        assert_eq!(
            f.store.get(id, &f.owner).await.unwrap(),
            None,
            "past its grace"
        );
    }
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.deleted, 2);
    if let (Some(before), Some(after)) = (rows_before, h.raw_rows().await) {
        assert_eq!(
            after.len(),
            before,
            "rows of purged tasks are left: {after:?}"
        );
    }
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().deleted, 0);
    f.close(h).await;
}

/// T8: a `null` ttl is capped by `max_task_age` (7 days by default).
pub async fn null_ttl_is_capped<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let created = f.get(&id).await;
    assert_eq!(created.ttl_ms, None);
    let week = 7 * DAY;
    assert_eq!(
        created.expires_at,
        created.created_at + week.as_millis() as i64
    );
    let step = Duration::from_secs(12 * 60 * 60);
    for _ in 0..13 {
        f.clock.advance(step);
        assert!(f.store.heartbeat(f.me, DAY).await.unwrap());
    }
    f.clock.advance(step - Duration::from_millis(1));
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    f.clock.advance(Duration::from_millis(1));
    let expired = f.get(&id).await;
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.clock.advance(Duration::from_secs(3600));
    assert_eq!(f.store.get(&id, &f.owner).await.unwrap(), None);
    f.close(h).await;
}

/// T8: `set_ttl` moves the expiry, still counted from creation.
pub async fn set_ttl_takes_effect<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(60)))
        .await;
    let created = f.get(&id).await.created_at;
    f.apply(&task, WorkerChange::SetTtl(Some(Duration::from_secs(600))))
        .await;
    let longer = f.get(&id).await;
    assert_eq!(longer.ttl_ms, Some(600_000));
    assert_eq!(longer.expires_at, created + 600_000);
    f.clock.advance(Duration::from_secs(61));
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    // Expired 11 s ago, within its grace still readable.
    f.apply(&task, WorkerChange::SetTtl(Some(Duration::from_secs(50))))
        .await;
    let expired = f.get(&id).await;
    assert_eq!(
        expired.status,
        TaskStatus::Failed,
        "a ttl already past expires the task"
    );
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.close(h).await;
}

/// T8: a purge of more tasks than a backend handles in one step (1,300,
/// where steps are 500) goes in several steps and still ends, misses
/// none and counts each once: tasks of a live instance past their ttl
/// expire, those of a lapsed one are orphaned, and past the grace every
/// task goes with its inputs; the lapsed instance is forgotten once its
/// tasks are ended, and nothing of them is left in the storage.
pub async fn a_purge_of_many_tasks_goes_in_steps_and_misses_none<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let short = InstanceId::generate().unwrap();
    assert!(
        f.store
            .heartbeat(short, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let rows_before = h.raw_rows().await.map(|rows| rows.len());
    let (expiring, lost) = (700u64, 600u64);
    let ttl = Duration::from_secs(60);
    let mut ids = Vec::new();
    for n in 0..expiring + lost {
        let me = if n < expiring { f.me } else { short };
        let (task, id) = f.create_with(NewTask::new(&f.owner, me).ttl(ttl)).await;
        let key = format!("k{n}");
        let request = WorkerChange::RequestInput {
            key: &key,
            request: b"{}",
        };
        let applied = f.store.apply(&task, me, request).await.unwrap();
        assert!(is_changed(&applied), "{applied:?}");
        ids.push(id);
    }
    // The short instance lapses at 30 s, the ttl ends at 60 s.
    f.clock.advance(ttl);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(
        (
            report.expired,
            report.orphaned,
            report.deleted,
            report.instances
        ),
        (expiring, lost, 0, 1),
        "the first purge: {report:?}"
    );
    for id in ids.iter().step_by(97).chain(ids.last()) {
        let task = f.get(id).await;
        assert_eq!(task.status, TaskStatus::Failed, "{id}");
        assert!(task.outstanding.is_empty(), "{id}");
    }
    // Past the grace, every task goes, with its inputs.
    f.clock.advance(GRACE);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(
        report.deleted,
        expiring + lost,
        "the second purge: {report:?}"
    );
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report, Default::default(), "nothing is left to purge");
    for id in ids.iter().step_by(97) {
        assert_eq!(f.store.get(id, &f.owner).await.unwrap(), None, "{id}");
    }
    if let (Some(before), Some(after)) = (rows_before, h.raw_rows().await) {
        assert_eq!(
            after.len(),
            before - 1,
            "only the live instance is left of what the tasks added"
        );
    }
    f.close(h).await;
}

/// T21: however short its ttl, zero included, an expired task reads as it
/// ended, or `failed` "task expired", for the whole grace after it expired,
/// then as unknown; `set_ttl` to zero expires a running task at once, for
/// the same grace.
pub async fn an_expired_task_reads_expired_for_the_whole_grace<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, zero) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::ZERO))
        .await;
    let expired = f.get(&zero).await;
    assert_eq!(
        expired.status,
        TaskStatus::Failed,
        "a zero ttl expires at once"
    );
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    assert_eq!(expired.ttl_ms, Some(0));
    let (short, short_id) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_millis(1)))
        .await;
    assert!(is_changed(
        &f.apply(&short, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await
    ));
    let (cut, cut_id) = f.create().await;
    assert!(is_changed(
        &f.apply(&cut, WorkerChange::SetTtl(Some(Duration::ZERO)))
            .await
    ));
    let cut_short = f.get(&cut_id).await;
    assert_eq!(cut_short.outcome.as_deref(), Some(EXPIRED_ERROR));

    f.clock.advance(GRACE - Duration::from_millis(1));
    assert_eq!(f.get(&zero).await, expired, "within the grace");
    assert_eq!(f.get(&cut_id).await, cut_short, "within the grace");
    assert_eq!(
        f.get(&short_id).await.status,
        TaskStatus::Completed,
        "a task that ended is kept as it ended"
    );
    f.clock.advance(Duration::from_millis(1));
    assert_eq!(f.store.get(&zero, &f.owner).await.unwrap(), None);
    assert_eq!(f.store.get(&cut_id, &f.owner).await.unwrap(), None);
    assert!(
        f.store.get(&short_id, &f.owner).await.unwrap().is_some(),
        "expired a millisecond later, it has a millisecond left"
    );
    f.clock.advance(Duration::from_millis(1));
    assert_eq!(f.store.get(&short_id, &f.owner).await.unwrap(), None);
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().deleted, 3);
    f.close(h).await;
}

/// T21: the grace is the store's setting (`StoreOptions::tasks`), the same
/// on every backend.
pub async fn the_grace_is_the_stores_setting<H: TaskHarness>(h: &H) {
    let grace = Duration::from_secs(10);
    let options = test_options(&test_clock()).tasks(TaskOptions::default().grace(grace));
    let f = fixture_with(h, options).await;
    let (_, id) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(1)))
        .await;
    let created = f.get(&id).await;
    assert_eq!(created.purge_at, created.expires_at + 10_000);
    f.clock
        .advance(Duration::from_secs(1) + grace - Duration::from_millis(1));
    assert_eq!(f.get(&id).await.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.clock.advance(Duration::from_millis(1));
    assert_eq!(f.store.get(&id, &f.owner).await.unwrap(), None);
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_expiry {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            a_purge_of_many_tasks_goes_in_steps_and_misses_none,
            expired_task_reads_failed,
            expired_task_is_purged_with_its_inputs_after_grace,
            null_ttl_is_capped,
            set_ttl_takes_effect,
            an_expired_task_reads_expired_for_the_whole_grace,
            the_grace_is_the_stores_setting,
        );
    };
}
