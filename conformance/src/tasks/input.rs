//! T5: input requests and answers: each key spent once, partial and unknown
//! answers, wake-ups across handles.

use std::time::Duration;

use crate::events::test_options;
use mcp_event_store_core::task::{Applied, CancelMode, TaskStatus, TaskStore, WorkerChange};

use super::support::*;
use super::{NO_RECHECK, TaskHarness};

/// T5: a key is spent once requested, whether answered, taken or
/// superseded; reusing it changes nothing.
pub async fn spent_keys_are_refused<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let reuse = WorkerChange::RequestInput {
        key: "a",
        request: b"{}",
    };
    f.request(&task, "a").await;
    assert_eq!(
        f.apply(&task, reuse).await,
        Applied::KeySpent,
        "outstanding"
    );
    f.answer(&id, &[("a", b"1")]).await;
    assert_eq!(f.apply(&task, reuse).await, Applied::KeySpent, "answered");
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"1"[..]));
    let before = f.get(&id).await;
    assert_eq!(f.apply(&task, reuse).await, Applied::KeySpent, "taken");
    assert_eq!(f.take(&task, "a").await, None, "an answer is taken once");
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused request changed the task"
    );
    f.close(h).await;
}

/// T5: answering some of the outstanding keys leaves the task
/// `input_required`; answering the rest makes it `working`.
pub async fn partial_answer_keeps_input_required<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    f.request(&task, "b").await;
    let seen = f.get(&id).await;
    let keys: Vec<_> = seen.outstanding.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(seen.outstanding[0].1.as_ref(), b"{\"q\":1}");
    let partial = f.answer(&id, &[("a", b"\"A\"")]).await;
    assert_eq!(partial.status, TaskStatus::InputRequired);
    assert_eq!(partial.outstanding.len(), 1);
    assert_eq!(partial.answered, ["a"]);
    let full = f.answer(&id, &[("b", b"\"B\"")]).await;
    assert_eq!(full.status, TaskStatus::Working);
    assert!(full.outstanding.is_empty());
    assert_eq!(full.answered, ["a", "b"]);
    assert_eq!(f.take(&task, "b").await.as_deref(), Some(&b"\"B\""[..]));
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"\"A\""[..]));
    assert!(f.get(&id).await.answered.is_empty());
    f.close(h).await;
}

/// T5 (SEP:381): keys that are not outstanding are ignored, and answering
/// a key twice changes nothing the second time.
pub async fn unknown_and_duplicate_answers_change_nothing<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    let before = f.get(&id).await;
    let ignored = f
        .answer(&id, &[("zzz", b"1"), ("", b"2"), ("A", b"3")])
        .await;
    assert_eq!(ignored, before, "unknown keys changed the task");
    let once = f.answer(&id, &[("a", b"first"), ("other", b"x")]).await;
    assert!(once.rev > before.rev);
    let twice = f.answer(&id, &[("a", b"second")]).await;
    assert_eq!(twice, once, "a duplicate answer changed the task");
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"first"[..]));
    f.close(h).await;
}

/// T5, T10: an answer written through handle B wakes the worker's watch on
/// handle A, which re-reads only when woken (its `max_wait` is an hour).
pub async fn answer_on_one_handle_wakes_a_watch_on_another<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let a = h.open_without_recheck(test_options(&f.clock)).await;
    let b = h.open(test_options(&f.clock)).await;
    let (task, id) = f.create().await;
    f.request(&task, "k").await;
    let rev = f.get(&id).await.rev;
    let watch = a.watch(&id, &f.owner, rev, NO_RECHECK);
    let answer = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.answer(&id, &f.owner, &[("k", b"42")])
            .await
            .unwrap()
            .expect("the owner may answer")
    };
    let (woken, _) = eventually("the watch on A", async { tokio::join!(watch, answer) }).await;
    let woken = woken.unwrap().expect("the task is there");
    assert!(woken.rev > rev);
    assert_eq!(woken.answered, ["k"]);
    assert_eq!(f.take(&task, "k").await.as_deref(), Some(&b"42"[..]));
    h.close(a).await;
    h.close(b).await;
    f.close(h).await;
}

/// T5, T6: a cancel supersedes the outstanding inputs: they are no longer
/// shown, answers to them are ignored, and their keys are spent.
pub async fn cancel_supersedes_outstanding_inputs<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    f.request(&task, "b").await;
    let cancelled = f.cancel(&id, CancelMode::Cooperative).await;
    assert_eq!(cancelled.status, TaskStatus::Working);
    assert!(cancelled.cancel_requested && cancelled.outstanding.is_empty());
    assert_eq!(f.answer(&id, &[("a", b"1")]).await, cancelled);
    assert_eq!(f.take(&task, "a").await, None);
    for key in ["a", "b"] {
        assert_eq!(
            f.apply(
                &task,
                WorkerChange::RequestInput {
                    key,
                    request: b"{}"
                }
            )
            .await,
            Applied::KeySpent
        );
    }
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_input {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            spent_keys_are_refused,
            partial_answer_keeps_input_required,
            unknown_and_duplicate_answers_change_nothing,
            answer_on_one_handle_wakes_a_watch_on_another,
            cancel_supersedes_outstanding_inputs,
        );
    };
}
