//! T7: the size limits, exact to the byte, and payloads and keys that are
//! bytes, never parsed.

use crate::events::{test_clock, test_options};
use mcp_event_store_core::task::{
    Finish, MAX_INPUT_BYTES, MAX_MESSAGE_BYTES, MAX_OUTSTANDING_INPUTS, NewTask, RuntimeStore,
    TaskStore, WorkerChange,
};

use super::TaskHarness;
use super::support::*;

/// T7: each limit accepts exactly its size and refuses one byte more with
/// `PayloadTooLarge`, leaving the task as it was; keys are 1 to 256 bytes
/// and at most 64 inputs are outstanding.
pub async fn payloads_at_the_limit_are_accepted_one_more_is_refused<H: TaskHarness>(h: &H) {
    const OUTCOME: usize = 64 * 1024;
    let clock = test_clock();
    let f = fixture_with(h, test_options(&clock).max_payload_bytes(OUTCOME)).await;
    let (task, id) = f.create().await;
    let big = vec![b'x'; MAX_INPUT_BYTES + 1];

    let message = "m".repeat(MAX_MESSAGE_BYTES + 1);
    assert_too_large(
        f.store
            .create(NewTask::new(&f.owner, f.me).message(&message))
            .await,
        "create with a long message",
    );
    let before = f.get(&id).await;
    assert_too_large(
        f.store
            .apply(&task, f.me, WorkerChange::SetMessage(Some(&message)))
            .await,
        "message",
    );
    assert_too_large(
        f.store
            .apply(
                &task,
                f.me,
                WorkerChange::RequestInput {
                    key: "k",
                    request: &big,
                },
            )
            .await,
        "input request",
    );
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused payload changed the task"
    );
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some(&message[1..])))
            .await
    ));
    assert!(is_changed(
        &f.apply(
            &task,
            WorkerChange::RequestInput {
                key: "k",
                request: &big[1..]
            }
        )
        .await
    ));
    assert_eq!(f.get(&id).await.outstanding[0].1.len(), MAX_INPUT_BYTES);

    let before = f.get(&id).await;
    assert_too_large(
        f.store.answer(&id, &f.owner, &[("k", &big)]).await,
        "response",
    );
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused response changed the task"
    );
    f.answer(&id, &[("k", &big[1..])]).await;
    assert_eq!(
        f.take(&task, "k").await.map(|a| a.len()),
        Some(MAX_INPUT_BYTES)
    );

    for key in ["", &"k".repeat(257)] {
        let refused = f
            .store
            .apply(
                &task,
                f.me,
                WorkerChange::RequestInput {
                    key,
                    request: b"{}",
                },
            )
            .await;
        assert!(
            refused.is_err(),
            "a key of {} bytes was accepted",
            key.len()
        );
    }
    f.request(&task, &"k".repeat(256)).await;
    for i in 1..MAX_OUTSTANDING_INPUTS {
        f.request(&task, &format!("many-{i}")).await;
    }
    let before = f.get(&id).await;
    assert_eq!(before.outstanding.len(), MAX_OUTSTANDING_INPUTS);
    let refused = f
        .store
        .apply(
            &task,
            f.me,
            WorkerChange::RequestInput {
                key: "one-more",
                request: b"{}",
            },
        )
        .await;
    assert!(refused.is_err(), "a 65th outstanding input was accepted");
    assert_eq!(f.get(&id).await, before);

    let outcome = vec![b'o'; OUTCOME + 1];
    for finish in [Finish::Completed(&outcome), Finish::Failed(&outcome)] {
        assert_too_large(
            f.store
                .apply(&task, f.me, WorkerChange::Finish(finish))
                .await,
            "outcome",
        );
    }
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused outcome changed the task"
    );
    assert!(is_changed(
        &f.apply(
            &task,
            WorkerChange::Finish(Finish::Completed(&outcome[1..]))
        )
        .await
    ));
    assert_eq!(f.get(&id).await.outcome.map(|o| o.len()), Some(OUTCOME));
    f.close(h).await;
}

/// Keys that break naive backends: quoting, LIKE wildcards, Redis hash
/// tags, NUL, emoji.
const HOSTILE_KEYS: &[&str] = &[
    "'", "%", "_", "a%", "a_", "{}", "{x}", "😀", "a\0b", " ", "\\",
];

/// T7: payloads are bytes, never parsed (NUL, invalid UTF-8), and hostile
/// keys are data; everything comes back exactly.
pub async fn hostile_payloads_and_keys_round_trip<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let payload = |i: usize| [&b"\0\xff\xfe{"[..], &i.to_be_bytes(), "😀".as_bytes()].concat();
    for (i, key) in HOSTILE_KEYS.iter().enumerate() {
        assert!(is_changed(
            &f.apply(
                &task,
                WorkerChange::RequestInput {
                    key,
                    request: &payload(i)
                }
            )
            .await
        ));
    }
    let seen = f.get(&id).await;
    let want: Vec<(String, Vec<u8>)> = HOSTILE_KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), payload(i)))
        .collect();
    let got: Vec<(String, Vec<u8>)> = seen
        .outstanding
        .iter()
        .map(|(k, r)| (k.clone(), r.to_vec()))
        .collect();
    assert_eq!(got, want, "requests in order, byte for byte");
    let responses: Vec<(&str, Vec<u8>)> = HOSTILE_KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, payload(i + 100)))
        .collect();
    // One at a time, so a key matched as a pattern would answer another.
    for (key, response) in &responses {
        f.answer(&id, &[(key, response)]).await;
    }
    for (key, response) in &responses {
        assert_eq!(f.take(&task, key).await.as_ref(), Some(response), "{key:?}");
    }
    let message = "\0 '%_{} 😀";
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some(message)))
            .await
    ));
    let outcome = payload(7);
    assert!(is_changed(
        &f.apply(&task, WorkerChange::Finish(Finish::Failed(&outcome)))
            .await
    ));
    let end = f.get(&id).await;
    assert_eq!(end.message.as_deref(), Some(message));
    assert_eq!(end.outcome.as_deref(), Some(&outcome[..]));
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_limits {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            payloads_at_the_limit_are_accepted_one_more_is_refused,
            hostile_payloads_and_keys_round_trip,
        );
    };
}
