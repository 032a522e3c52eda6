//! T6: cooperative and immediate cancels.

use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, TaskStatus, TaskStore, WorkerChange,
};

use super::TaskHarness;
use super::support::*;

/// T6: a cooperative cancel records the request; the worker sees it, may
/// ask for no more input, and chooses how the task ends.
pub async fn cooperative_cancel_leaves_the_ending_to_the_worker<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let rev = f.get(&id).await.rev;
    let cancelled = f.cancel(&id, CancelMode::Cooperative).await;
    assert_eq!(cancelled.status, TaskStatus::Working);
    assert!(cancelled.cancel_requested);
    assert_eq!(
        f.cancel(&id, CancelMode::Cooperative).await,
        cancelled,
        "a second cancel changed the task"
    );
    let seen = f
        .store
        .watch(&id, &f.owner, rev, LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(seen.cancel_requested, "the worker sees the request");
    assert_eq!(
        f.apply(
            &task,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{}"
            }
        )
        .await,
        Applied::CancelRequested
    );
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some("winding down")))
            .await
    ));
    assert!(is_changed(
        &f.apply(
            &task,
            WorkerChange::Finish(Finish::Completed(b"{\"partial\":true}"))
        )
        .await
    ));
    let end = f.get(&id).await;
    assert_eq!(end.status, TaskStatus::Completed);
    assert_eq!(f.cancel(&id, CancelMode::Immediate).await, end);
    f.close(h).await;
}

/// T6: an immediate cancel ends the task as `cancelled` in the same step;
/// the worker's later finish is refused.
pub async fn immediate_cancel_ends_the_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "k").await;
    let cancelled = f.cancel(&id, CancelMode::Immediate).await;
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert!(cancelled.cancel_requested && cancelled.outstanding.is_empty());
    assert_eq!(f.get(&id).await, cancelled);
    assert_eq!(
        f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await,
        Applied::AlreadyTerminal(TaskStatus::Cancelled)
    );
    assert_eq!(f.cancel(&id, CancelMode::Immediate).await, cancelled);
    assert_eq!(f.cancel(&id, CancelMode::Cooperative).await, cancelled);
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_cancel {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            cooperative_cancel_leaves_the_ending_to_the_worker,
            immediate_cancel_ends_the_task,
        );
    };
}
