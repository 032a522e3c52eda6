//! The task operations an operator watches are counted in the metrics
//! every store records (core's `observe` table): created, claimed, fenced,
//! inputs requested and taken, finished.

use mcp_event_store_core::observe::names::*;
use mcp_event_store_core::task::{Applied, Finish, NewTask, RuntimeStore, Worker, WorkerChange};

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

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_metrics {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            task_operations_are_counted_in_metrics
        );
    };
}
