//! T4: the state machine, every status against every operation, and racing
//! writers that end it exactly once.

use std::sync::Arc;
use std::time::Duration;

use crate::events::test_options;
use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, RuntimeStore, TaskId, TaskStatus, TaskStore, WorkerChange,
};

use super::TaskHarness;
use super::support::*;

/// Brings a fresh task to `status`; `k0` is outstanding when it is
/// `input_required`.
async fn task_in<S: RuntimeStore>(f: &Fixture<S>, status: TaskStatus) -> (TaskId, String) {
    let (task, id) = f.create().await;
    let finish = match status {
        TaskStatus::Working => None,
        TaskStatus::InputRequired => {
            f.request(&task, "k0").await;
            None
        }
        TaskStatus::Completed => Some(Finish::Completed(b"{\"content\":[]}")),
        TaskStatus::Failed => Some(Finish::Failed(b"{\"code\":1,\"message\":\"no\"}")),
        TaskStatus::Cancelled => Some(Finish::Cancelled),
    };
    if let Some(finish) = finish {
        assert!(is_changed(
            &f.apply(&task, WorkerChange::Finish(finish)).await
        ));
    }
    assert_eq!(f.get(&id).await.status, status);
    (task, id)
}

/// T4: every (status, operation) pair: what each does from each status,
/// `rev` bumped by every change and by nothing else, terminal tasks
/// immutable.
pub async fn every_status_and_operation<H: TaskHarness>(h: &H) {
    use TaskStatus::*;
    let f = fixture(h).await;
    let changes: [(&str, WorkerChange<'_>); 10] = [
        (
            "request_input",
            WorkerChange::RequestInput {
                key: "new",
                request: b"{}",
            },
        ),
        ("take_answer", WorkerChange::TakeAnswer { key: "k0" }),
        ("set_message", WorkerChange::SetMessage(Some("m"))),
        (
            "set_poll_interval",
            WorkerChange::SetPollInterval(Some(Duration::from_secs(2))),
        ),
        (
            "set_ttl",
            WorkerChange::SetTtl(Some(Duration::from_secs(3600))),
        ),
        (
            "complete",
            WorkerChange::Finish(Finish::Completed(b"{\"r\":1}")),
        ),
        ("fail", WorkerChange::Finish(Finish::Failed(b"{\"e\":1}"))),
        ("cancelled", WorkerChange::Finish(Finish::Cancelled)),
        ("set_context", WorkerChange::SetContext(b"ctx")),
        (
            "replace_inputs",
            WorkerChange::ReplaceInputs {
                requests: &[("fresh", b"{}")],
                message: Some("asking"),
            },
        ),
    ];
    for status in TaskStatus::ALL {
        for (name, change) in changes {
            let (task, id) = task_in(&f, status).await;
            let before = f.get(&id).await;
            let applied = f.apply(&task, change).await;
            let after = f.get(&id).await;
            let what = format!("{name} on a {status} task");
            if status.is_terminal() {
                assert_eq!(applied, Applied::AlreadyTerminal(status), "{what}");
                assert_eq!(after, before, "{what} changed a terminal task");
                continue;
            }
            if name == "take_answer" {
                // Nothing answered yet: nothing to take, nothing changes.
                assert_eq!(
                    applied,
                    Applied::Changed {
                        rev: before.rev,
                        answer: None
                    },
                    "{what}"
                );
                assert_eq!(after, before, "{what}");
                continue;
            }
            assert_eq!(
                applied,
                Applied::Changed {
                    rev: after.rev,
                    answer: None
                },
                "{what}"
            );
            assert!(after.rev > before.rev, "{what}: rev did not increase");
            assert!(after.updated_at >= before.updated_at, "{what}");
            let want = match change {
                WorkerChange::RequestInput { .. } | WorkerChange::ReplaceInputs { .. } => {
                    InputRequired
                }
                WorkerChange::Finish(finish) => finish.status(),
                _ => status,
            };
            assert_eq!(after.status, want, "{what}");
            match change {
                WorkerChange::SetMessage(m) => assert_eq!(after.message.as_deref(), m),
                WorkerChange::SetPollInterval(_) => assert_eq!(after.poll_interval_ms, Some(2_000)),
                WorkerChange::SetTtl(_) => assert_eq!(after.ttl_ms, Some(3_600_000)),
                WorkerChange::Finish(finish) => {
                    assert_eq!(after.outcome.as_deref(), finish.outcome(), "{what}");
                    assert!(after.outstanding.is_empty(), "{what}");
                }
                WorkerChange::SetContext(c) => assert_eq!(after.context.as_deref(), Some(c)),
                WorkerChange::ReplaceInputs { .. } => {
                    // `k0`, outstanding on an input_required task, is
                    // superseded.
                    assert_eq!(keys(&after.outstanding), ["fresh"], "{what}");
                    assert_eq!(after.message.as_deref(), Some("asking"), "{what}");
                }
                _ => {}
            }
        }
        // The client's calls from the same status.
        for mode in [
            None,
            Some(CancelMode::Cooperative),
            Some(CancelMode::Immediate),
        ] {
            let (_, id) = task_in(&f, status).await;
            let before = f.get(&id).await;
            let returned = match mode {
                None => f.answer(&id, &[("k0", b"{\"a\":1}")]).await,
                Some(mode) => f.cancel(&id, mode).await,
            };
            let after = f.get(&id).await;
            assert_eq!(
                returned, after,
                "{mode:?} on a {status} task returns the task"
            );
            let what = format!("{} on a {status} task", mode.map_or("answer", |_| "cancel"));
            if status.is_terminal() || (mode.is_none() && status == Working) {
                assert_eq!(after, before, "{what} changed it");
                continue;
            }
            assert!(after.rev > before.rev, "{what}: rev did not increase");
            let want = match mode {
                Some(CancelMode::Immediate) => Cancelled,
                _ => Working,
            };
            assert_eq!(after.status, want, "{what}");
            assert_eq!(after.cancel_requested, mode.is_some(), "{what}");
            assert!(after.outstanding.is_empty(), "{what}");
        }
    }
    f.close(h).await;
}

/// T4: of 32 finishers racing on two handles, exactly one wins; the others
/// see the winner's status and the winner's outcome stays.
pub async fn racing_finishers_exactly_one_wins<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let a = Arc::new(h.open(test_options(&f.clock)).await);
    let b = Arc::new(h.open(test_options(&f.clock)).await);
    for round in 0..3 {
        let (task, id) = f.create().await;
        let racers: Vec<_> = (0..32u32)
            .map(|i| {
                let store = if i % 2 == 0 { a.clone() } else { b.clone() };
                let me = f.me;
                tokio::spawn(async move {
                    let outcome = format!("{{\"winner\":{i}}}");
                    let change = match i % 3 {
                        0 => WorkerChange::Finish(Finish::Completed(outcome.as_bytes())),
                        1 => WorkerChange::Finish(Finish::Failed(outcome.as_bytes())),
                        _ => WorkerChange::Finish(Finish::Cancelled),
                    };
                    let status = match change {
                        WorkerChange::Finish(finish) => finish.status(),
                        _ => unreachable!(),
                    };
                    let applied = store.apply(&task, me, change).await.unwrap();
                    (i, status, outcome, applied)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut losers = Vec::new();
        for racer in racers {
            let (i, status, outcome, applied) = racer.await.unwrap();
            match applied {
                Applied::Changed { .. } => winners.push((i, status, outcome)),
                Applied::AlreadyTerminal(seen) => losers.push(seen),
                other => panic!("round {round}: racer {i} got {other:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} finishers won",
            winners.len()
        );
        let (_, status, outcome) = &winners[0];
        assert!(losers.iter().all(|seen| seen == status), "round {round}");
        let after = f.get(&id).await;
        assert_eq!(after.status, *status);
        let want = (*status != TaskStatus::Cancelled).then_some(outcome.as_bytes());
        assert_eq!(after.outcome.as_deref(), want, "round {round}");
        assert_eq!(after.rev, 2, "round {round}: one change, one bump");
    }
    for store in [a, b] {
        h.close(Arc::into_inner(store).expect("racers done")).await;
    }
    f.close(h).await;
}

/// T4: an answer racing a finish, and an input request racing a cancel,
/// end in a state one order or the other would give; `rev` never goes
/// back for a watcher.
pub async fn racing_answers_cancels_and_finishes_stay_consistent<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = Arc::new(h.open(test_options(&f.clock)).await);
    let owner = f.owner;
    for round in 0..20 {
        // Answer against finish.
        let (task, id) = f.create().await;
        f.request(&task, "k").await;
        let answer = {
            let (other, id) = (other.clone(), id.clone());
            tokio::spawn(async move { other.answer(&id, &owner, &[("k", b"1")]).await })
        };
        let finish = f
            .apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await;
        let answered = answer.await.unwrap().unwrap().expect("visible");
        assert!(
            is_changed(&finish),
            "round {round}: the finish must win: {finish:?}"
        );
        let end = f.get(&id).await;
        assert_eq!(end.status, TaskStatus::Completed, "round {round}");
        assert!(answered.rev <= end.rev, "round {round}");
        assert!(end.outstanding.is_empty(), "round {round}");

        // Input request against cancel.
        let (task, id) = f.create().await;
        let cancel = {
            let (other, id) = (other.clone(), id.clone());
            tokio::spawn(async move {
                other
                    .request_cancel(&id, &owner, CancelMode::Cooperative, None)
                    .await
            })
        };
        let request = f
            .apply(
                &task,
                WorkerChange::RequestInput {
                    key: "k",
                    request: b"{}",
                },
            )
            .await;
        cancel.await.unwrap().unwrap().expect("visible");
        assert!(
            matches!(request, Applied::Changed { .. } | Applied::CancelRequested),
            "round {round}: {request:?}"
        );
        let end = f.get(&id).await;
        assert_eq!(end.status, TaskStatus::Working, "round {round}");
        assert!(end.cancel_requested, "round {round}");
        assert!(
            end.outstanding.is_empty(),
            "round {round}: an input request outlived the cancel"
        );
        let again = f
            .apply(
                &task,
                WorkerChange::RequestInput {
                    key: "k",
                    request: b"{}",
                },
            )
            .await;
        let want = match request {
            Applied::Changed { .. } => Applied::KeySpent,
            _ => Applied::CancelRequested,
        };
        assert_eq!(again, want, "round {round}");
    }
    h.close(Arc::into_inner(other).expect("racers done")).await;
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_states {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            every_status_and_operation,
            racing_finishers_exactly_one_wins,
            racing_answers_cancels_and_finishes_stay_consistent,
        );
    };
}
