//! T10: watches: at once when newer, at `max_wait` when unchanged, woken
//! across handles, and holding nothing while suspended.

use std::time::{Duration, Instant};

use crate::events::test_options;
use mcp_event_store_core::task::{Applied, RuntimeStore, TaskStore, WorkerChange};

use super::support::*;
use super::{NO_RECHECK, TaskHarness};

/// T10: a watch whose task is already past `after` returns at once.
pub async fn watch_returns_at_once_when_newer<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.apply(&task, WorkerChange::SetMessage(Some("one"))).await;
    let now = f.get(&id).await;
    let seen = eventually(
        "a watch already behind its task",
        f.store.watch(&id, &f.owner, now.rev - 1, NO_RECHECK),
    )
    .await
    .unwrap();
    assert_eq!(seen, Some(now));
    f.close(h).await;
}

/// T10: with no change, a watch returns the unchanged task at `max_wait`;
/// a deleted task ends it with `None`.
pub async fn watch_returns_the_unchanged_task_at_max_wait<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let now = f.get(&id).await;
    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let seen = eventually(
        "a watch with nothing to see, at its max_wait",
        f.store.watch(&id, &f.owner, now.rev, wait),
    )
    .await
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(seen, Some(now));
    assert!(waited >= wait, "returned after {waited:?}");
    let a = h.open_without_recheck(test_options(&f.clock)).await;
    let watch = a.watch(&id, &f.owner, f.get(&id).await.rev, NO_RECHECK);
    let delete = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(f.store.delete(&id).await.unwrap());
    };
    let (gone, ()) = eventually("the watch of a deleted task", async {
        tokio::join!(watch, delete)
    })
    .await;
    assert_eq!(gone.unwrap(), None);
    h.close(a).await;
    f.close(h).await;
}

/// T10: a watcher on one handle wakes when another handle changes the
/// task: its handle re-reads only when woken, and its `max_wait` is an
/// hour, so each of five changes is seen through a wake-up.
pub async fn watch_wakes_across_handles<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let b = h.open_without_recheck(test_options(&f.clock)).await;
    let (task, id) = f.create().await;
    for round in 0..5 {
        let rev = f.get(&id).await.rev;
        let watch = b.watch(&id, &f.owner, rev, NO_RECHECK);
        let change = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let message = format!("round {round}");
            f.apply(&task, WorkerChange::SetMessage(Some(&message)))
                .await
        };
        let (seen, applied) = eventually(&format!("round {round}"), async {
            tokio::join!(watch, change)
        })
        .await;
        let Applied::Changed { rev: new_rev, .. } = applied else {
            panic!("{applied:?}")
        };
        let seen = seen.unwrap().expect("visible");
        assert_eq!(seen.rev, new_rev, "round {round}");
    }
    h.close(b).await;
    f.close(h).await;
}

/// T10: a watch whose caller stops polling it holds nothing the store
/// needs. A worker that waits on its task's cancel in a `select!` beside a
/// short sleep leaves the watch pinned and unpolled, often in the middle of
/// a re-read, while it changes the task; 1,000 such workers at once on one
/// handle all finish, and every read and change succeeds (a watch holding a
/// pooled connection while unpolled starves the pool: every change then
/// waits for a connection that never comes back, and fails at the pool's
/// acquire timeout).
pub async fn suspended_watches_hold_nothing<H: TaskHarness>(h: &H) {
    const WORKERS: usize = 1_000;
    let f = fixture(h).await;
    let worker = |n: usize| {
        let f = &f;
        async move {
            let (task, id) = f.create().await;
            // The cancel wait of rmcp's task context: watch again after
            // every change until a cancel or an end.
            let cancelled = async {
                let mut rev = 0;
                loop {
                    match f.store.watch(&id, &f.owner, rev, LONG).await.unwrap() {
                        Some(t) if !t.cancel_requested && !t.status.is_terminal() => rev = t.rev,
                        _ => return,
                    }
                }
            };
            tokio::pin!(cancelled);
            for step in 0..3 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(1)) => {}
                    () = &mut cancelled => panic!("task {n} was never cancelled"),
                }
                let message = format!("worker {n} step {step}");
                let applied = f
                    .store
                    .apply(&task, f.me, WorkerChange::SetMessage(Some(&message)))
                    .await
                    .unwrap_or_else(|e| panic!("worker {n} step {step}: {e}"));
                assert!(is_changed(&applied), "worker {n} step {step}: {applied:?}");
            }
            // Read while the watch is still pinned, unpolled.
            assert_eq!(f.get(&id).await.message, Some(format!("worker {n} step 2")));
        }
    };
    futures_util::future::join_all((0..WORKERS).map(worker)).await;
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_watch {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            watch_returns_at_once_when_newer,
            watch_returns_the_unchanged_task_at_max_wait,
            watch_wakes_across_handles,
            suspended_watches_hold_nothing,
        );
    };
}
