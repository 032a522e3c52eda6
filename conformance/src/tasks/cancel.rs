//! T6, T20: cooperative and immediate cancels, and their reasons.

use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, MAX_MESSAGE_BYTES, TaskStatus, TaskStore, WorkerChange,
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

/// T20: the request that changes a task keeps its reason, in the same
/// step, unless a reason is kept already: reads show it, also once the
/// worker ended the task; no worker change alters it; a later request's
/// reason, or one on a terminal task, changes nothing. An immediate cancel
/// keeps its reason as it ends the task.
pub async fn a_cancel_keeps_its_reason<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let asked = f
        .cancel_because(&id, CancelMode::Cooperative, Some("deployment shutdown"))
        .await;
    assert_eq!(asked.cancel_reason.as_deref(), Some("deployment shutdown"));
    assert_eq!(f.get(&id).await, asked);
    assert_eq!(
        f.cancel_because(&id, CancelMode::Cooperative, Some("another"))
            .await,
        asked,
        "a repeated request changed the task"
    );
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some("stopping")))
            .await
    ));
    assert!(is_changed(
        &f.apply(&task, WorkerChange::Finish(Finish::Cancelled))
            .await
    ));
    let ended = f.get(&id).await;
    assert_eq!(ended.status, TaskStatus::Cancelled);
    assert_eq!(ended.message.as_deref(), Some("stopping"));
    assert_eq!(ended.cancel_reason.as_deref(), Some("deployment shutdown"));

    // None kept yet: a later request that changes the task keeps its own.
    let (_, quiet) = f.create().await;
    let first = f.cancel(&quiet, CancelMode::Cooperative).await;
    assert_eq!(first.cancel_reason, None);
    let now = f
        .cancel_because(&quiet, CancelMode::Immediate, Some("client\0stopped 😀"))
        .await;
    assert_eq!(now.status, TaskStatus::Cancelled);
    assert_eq!(now.cancel_reason.as_deref(), Some("client\0stopped 😀"));
    assert_eq!(f.get(&quiet).await, now, "read back byte for byte");

    // A terminal task keeps nothing.
    let (done, done_id) = f.create().await;
    assert!(is_changed(
        &f.apply(&done, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await
    ));
    let finished = f.get(&done_id).await;
    assert_eq!(
        f.cancel_because(&done_id, CancelMode::Immediate, Some("too late"))
            .await,
        finished
    );
    assert_eq!(f.get(&done_id).await.cancel_reason, None);
    f.close(h).await;
}

/// T20, T7: a reason is at most `MAX_MESSAGE_BYTES`: exactly that is kept,
/// one byte more is `PayloadTooLarge` and changes nothing.
pub async fn a_cancel_reason_over_the_limit_is_refused<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let before = f.get(&id).await;
    let long = "r".repeat(MAX_MESSAGE_BYTES + 1);
    assert_too_large(
        f.store
            .request_cancel(&id, &f.owner, CancelMode::Immediate, Some(&long))
            .await,
        "a reason one byte over the limit",
    );
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused cancel changed the task"
    );
    let most = &long[..MAX_MESSAGE_BYTES];
    let kept = f
        .cancel_because(&id, CancelMode::Immediate, Some(most))
        .await;
    assert_eq!(kept.cancel_reason.as_deref(), Some(most));
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
            a_cancel_keeps_its_reason,
            a_cancel_reason_over_the_limit_is_refused,
        );
    };
}
