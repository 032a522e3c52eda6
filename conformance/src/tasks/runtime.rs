//! T13 to T15: what a runtime keeps beside a task: its context, the view
//! whatever the owner, and inputs replaced in one step.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::events::test_options;
use mcp_event_store_core::Error;
use mcp_event_store_core::task::{
    Applied, CancelMode, EXPIRED_ERROR, Finish, MAX_CONTEXT_BYTES, MAX_INPUT_BYTES,
    MAX_OUTSTANDING_INPUTS, NewTask, Owner, RuntimeStore, TaskId, TaskRecord, TaskStatus,
    TaskStore, WorkerChange,
};

use super::TaskHarness;
use super::support::*;

/// T13, T1, T7, T9: a task keeps the context it was created with, byte for
/// byte, readable at once from another handle; the worker replaces it; it
/// outlives the task's end; an empty context is not none; each limit
/// accepts exactly its size and refuses one byte more, changing nothing.
pub async fn context_is_kept_with_the_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let context: &[u8] = b"{\"tool\":\"deploy\"}\0\xff\xfe";
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).context(context))
        .await;
    let seen = other
        .get(&id, &f.owner)
        .await
        .unwrap()
        .expect("visible on B");
    assert_eq!(seen.context.as_deref(), Some(context));
    let view = other.view(&task).await.unwrap().expect("viewed on B");
    assert_eq!(view.record, seen);
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetContext(b"second")).await
    ));
    let seen = other.get(&id, &f.owner).await.unwrap().unwrap();
    assert_eq!(seen.context.as_deref(), Some(&b"second"[..]));
    assert!(is_changed(
        &f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await
    ));
    assert_eq!(f.get(&id).await.context.as_deref(), Some(&b"second"[..]));

    let (_, none) = f.create().await;
    assert_eq!(f.get(&none).await.context, None, "no context given");
    let (_, empty) = f
        .create_with(NewTask::new(&f.owner, f.me).context(b""))
        .await;
    assert_eq!(
        f.get(&empty).await.context.as_deref(),
        Some(&b""[..]),
        "an empty context is kept apart from none"
    );

    let max = vec![b'c'; MAX_CONTEXT_BYTES];
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).context(&max))
        .await;
    assert_eq!(f.get(&id).await.context.as_deref(), Some(&max[..]));
    let over = vec![b'c'; MAX_CONTEXT_BYTES + 1];
    assert!(matches!(
        f.store
            .create(NewTask::new(&f.owner, f.me).context(&over))
            .await,
        Err(Error::PayloadTooLarge { .. })
    ));
    let before = f.get(&id).await;
    assert!(matches!(
        f.store
            .apply(&task, f.me, WorkerChange::SetContext(&over))
            .await,
        Err(Error::PayloadTooLarge { .. })
    ));
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused context changed nothing"
    );
    h.close(other).await;
    f.close(h).await;
}

/// T14, T5: the runtime's view reads a task whoever owns it, with its
/// owner, the record a read shows (expired and lost decided), and every
/// answer given and not yet taken, over several rounds of input; a task
/// never created or purged is `None`.
pub async fn view_reads_any_owner_with_every_answer<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let (owned, owned_id) = f.create().await;
    let (anon, anon_id) = f.create_with(NewTask::new(&Owner::Anonymous, f.me)).await;
    let view = other.view(&owned).await.unwrap().expect("the owned task");
    assert_eq!(view.owner, f.owner);
    assert_eq!(view.record, f.get(&owned_id).await);
    assert!(view.answers.is_empty());
    let view = other
        .view(&anon)
        .await
        .unwrap()
        .expect("the anonymous task");
    assert_eq!(view.owner, Owner::Anonymous);
    assert_eq!(
        Some(view.record),
        f.store.get(&anon_id, &Owner::Anonymous).await.unwrap()
    );

    // Two rounds, each answered; the worker takes none.
    f.request(&owned, "first").await;
    f.answer(&owned_id, &[("first", b"one\0")]).await;
    f.request(&owned, "second").await;
    f.answer(&owned_id, &[("second", b"\xfftwo")]).await;
    let view = other.view(&owned).await.unwrap().unwrap();
    assert_eq!(
        view.answers,
        [
            ("first".to_owned(), Bytes::from_static(b"one\0")),
            ("second".to_owned(), Bytes::from_static(b"\xfftwo")),
        ],
        "every answer not yet taken, in request order"
    );
    assert_eq!(keys(&view.answers), view.record.answered);
    assert_eq!(
        f.take(&owned, "first").await.as_deref(),
        Some(&b"one\0"[..])
    );
    let view = other.view(&owned).await.unwrap().unwrap();
    assert_eq!(keys(&view.answers), ["second"], "a taken answer is gone");

    // As a read shows it: expired reads failed.
    let (short, _) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(60)))
        .await;
    f.clock.advance(Duration::from_secs(61));
    let view = other
        .view(&short)
        .await
        .unwrap()
        .expect("kept for its grace");
    assert_eq!(view.record.status, TaskStatus::Failed);
    assert_eq!(view.record.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.clock.advance(mcp_event_store_core::task::DEFAULT_GRACE);
    assert_eq!(other.view(&short).await.unwrap(), None, "past its grace");
    assert_eq!(
        other.view(&TaskId::generate().unwrap()).await.unwrap(),
        None,
        "never created"
    );
    h.close(other).await;
    f.close(h).await;
}

/// Replaces `id`'s outstanding inputs, each request `{"q":"<key>"}`.
async fn replace<S: RuntimeStore>(
    f: &Fixture<S>,
    id: &TaskId,
    keys: &[&str],
    message: Option<&str>,
) -> Applied {
    let requests: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| format!("{{\"q\":\"{k}\"}}").into_bytes())
        .collect();
    let pairs: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&requests)
        .map(|(k, r)| (*k, &r[..]))
        .collect();
    f.apply(
        id,
        WorkerChange::ReplaceInputs {
            requests: &pairs,
            message,
        },
    )
    .await
}

/// T15, T5: replacing the outstanding inputs supersedes the keys left out,
/// carries forward keys with the same request, and refuses, changing
/// nothing, a spent key (superseded or answered) or a live key pointed at
/// another request; the task is `input_required` while anything is
/// outstanding and `working` once nothing is; the same set again is no
/// change; limits and a cancel are refused as for one request.
pub async fn replacing_inputs_supersedes_and_carries_forward<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let outstanding = |r: &TaskRecord| keys(&r.outstanding).join(",");
    assert!(is_changed(
        &replace(&f, &task, &["approval"], Some("needs a decision")).await
    ));
    let parked = f.get(&id).await;
    assert_eq!(parked.status, TaskStatus::InputRequired);
    assert_eq!(parked.message.as_deref(), Some("needs a decision"));
    assert_eq!(outstanding(&parked), "approval");
    assert!(is_changed(
        &replace(&f, &task, &["approval", "region"], None).await
    ));
    let carried = f.get(&id).await;
    assert_eq!(outstanding(&carried), "approval,region");
    assert_eq!(
        carried.message.as_deref(),
        Some("needs a decision"),
        "no message keeps the current one"
    );
    assert_eq!(
        replace(&f, &task, &["approval", "region"], None).await,
        Applied::Changed {
            rev: carried.rev,
            answer: None
        },
        "the same set again changes nothing"
    );
    assert_eq!(f.get(&id).await, carried);
    assert!(is_changed(&replace(&f, &task, &["region"], None).await));
    let narrowed = f.get(&id).await;
    assert_eq!(outstanding(&narrowed), "region");
    assert_eq!(
        replace(&f, &task, &["approval"], None).await,
        Applied::KeySpent,
        "a superseded key"
    );
    assert_eq!(
        f.get(&id).await,
        narrowed,
        "a refused replacement changed it"
    );
    assert_eq!(
        f.apply(
            &task,
            WorkerChange::RequestInput {
                key: "approval",
                request: b"{}"
            }
        )
        .await,
        Applied::KeySpent,
        "superseded by a replacement is spent for every change"
    );

    assert!(is_changed(
        &replace(&f, &task, &["region", "zone"], None).await
    ));
    let partial = f.answer(&id, &[("region", b"eu")]).await;
    assert_eq!(partial.status, TaskStatus::InputRequired);
    assert_eq!(
        replace(&f, &task, &["region", "zone"], None).await,
        Applied::KeySpent,
        "an answered key"
    );
    let repointed = [("zone", &b"{\"q\":\"something else\"}"[..])];
    assert_eq!(
        f.apply(
            &task,
            WorkerChange::ReplaceInputs {
                requests: &repointed,
                message: None
            }
        )
        .await,
        Applied::KeySpent,
        "a live key pointed at another request"
    );
    assert_eq!(f.get(&id).await, partial);
    let done = f.answer(&id, &[("zone", b"a")]).await;
    assert_eq!(done.status, TaskStatus::Working);
    assert!(done.outstanding.is_empty());
    assert!(is_changed(&replace(&f, &task, &["confirm"], None).await));
    assert!(is_changed(&replace(&f, &task, &[], None).await));
    let emptied = f.get(&id).await;
    assert_eq!(emptied.status, TaskStatus::Working, "nothing outstanding");
    assert!(emptied.outstanding.is_empty());
    assert_eq!(
        replace(&f, &task, &["confirm"], None).await,
        Applied::KeySpent
    );
    let view = f.store.view(&task).await.unwrap().unwrap();
    assert_eq!(keys(&view.answers), ["region", "zone"]);

    // Limits, as for one request.
    let many: Vec<String> = (0..=MAX_OUTSTANDING_INPUTS)
        .map(|i| format!("m{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for bad in [
        &many[..],
        &["twice", "twice"][..],
        &[""][..],
        &[&"k".repeat(257)[..]][..],
    ] {
        let requests: Vec<(&str, &[u8])> = bad.iter().map(|k| (*k, &b"{}"[..])).collect();
        assert!(
            matches!(
                f.store
                    .apply(
                        &task,
                        f.me,
                        WorkerChange::ReplaceInputs {
                            requests: &requests,
                            message: None
                        }
                    )
                    .await,
                Err(Error::Config(_))
            ),
            "{} keys starting {:?}",
            bad.len(),
            bad.first()
        );
    }
    assert_eq!(f.get(&id).await, emptied);
    let big = vec![b'r'; MAX_INPUT_BYTES + 1];
    assert!(matches!(
        f.store
            .apply(
                &task,
                f.me,
                WorkerChange::ReplaceInputs {
                    requests: &[("big", &big)],
                    message: None
                }
            )
            .await,
        Err(Error::PayloadTooLarge { .. })
    ));
    f.cancel(&id, CancelMode::Cooperative).await;
    assert_eq!(
        replace(&f, &task, &["late"], None).await,
        Applied::CancelRequested
    );
    f.close(h).await;
}

/// T15, T4: replacements racing on two handles are each one atomic step:
/// of 16 replacing with a fresh key each, every one changes the task once,
/// one key is left outstanding and every other is spent; of 16 admitting
/// the same fresh key with different requests, exactly one does.
pub async fn racing_replacements_admit_each_key_once<H: TaskHarness>(h: &H) {
    let f = Arc::new(fixture(h).await);
    let other = Arc::new(h.open(test_options(&f.clock)).await);
    let (task, id) = f.create().await;
    let before = f.get(&id).await;
    let mut racers = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            None
        } else {
            Some(other.clone())
        };
        let f = f.clone();
        racers.push(tokio::spawn(async move {
            let key = format!("k{i}");
            let request = format!("{{\"n\":{i}}}").into_bytes();
            let change = WorkerChange::ReplaceInputs {
                requests: &[(&key, &request)],
                message: None,
            };
            let applied = match store {
                None => f.store.apply(&task, f.me, change).await,
                Some(other) => other.apply(&task, f.me, change).await,
            };
            (key, applied.unwrap())
        }));
    }
    let mut keys_changed = Vec::new();
    for racer in racers {
        let (key, applied) = racer.await.unwrap();
        assert!(is_changed(&applied), "{key}: {applied:?}");
        keys_changed.push(key);
    }
    let after = f.get(&id).await;
    assert_eq!(after.rev, before.rev + 16, "each replacement one change");
    assert_eq!(after.outstanding.len(), 1);
    let last = after.outstanding[0].0.clone();
    for key in &keys_changed {
        let again = f
            .apply(
                &task,
                WorkerChange::RequestInput {
                    key,
                    request: b"{}",
                },
            )
            .await;
        assert_eq!(again, Applied::KeySpent, "{key} was used");
        if *key != last {
            assert!(
                !f.get(&id).await.outstanding.iter().any(|(k, _)| k == key),
                "{key} was superseded"
            );
        }
    }

    let (task, id) = f.create().await;
    let mut racers = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            None
        } else {
            Some(other.clone())
        };
        let f = f.clone();
        racers.push(tokio::spawn(async move {
            let request = format!("{{\"n\":{i}}}").into_bytes();
            let change = WorkerChange::ReplaceInputs {
                requests: &[("same", &request)],
                message: None,
            };
            let applied = match store {
                None => f.store.apply(&task, f.me, change).await,
                Some(other) => other.apply(&task, f.me, change).await,
            };
            (request, applied.unwrap())
        }));
    }
    let mut admitted = Vec::new();
    for racer in racers {
        let (request, applied) = racer.await.unwrap();
        match applied {
            Applied::Changed { .. } => admitted.push(request),
            Applied::KeySpent => {}
            other => panic!("a racing replacement answered {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 1, "exactly one admits the key");
    let parked = f.get(&id).await;
    assert_eq!(parked.outstanding.len(), 1);
    assert_eq!(parked.outstanding[0].1[..], admitted[0][..]);
    match Arc::try_unwrap(other) {
        Ok(other) => h.close(other).await,
        Err(_) => panic!("a racer kept the handle"),
    }
    match Arc::try_unwrap(f) {
        Ok(f) => f.close(h).await,
        Err(_) => panic!("a racer kept the fixture"),
    }
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_runtime {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            context_is_kept_with_the_task,
            view_reads_any_owner_with_every_answer,
            replacing_inputs_supersedes_and_carries_forward,
            racing_replacements_admit_each_key_once,
        );
    };
}
