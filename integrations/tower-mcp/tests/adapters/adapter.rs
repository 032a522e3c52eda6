//! What the adapters decide beyond tower-mcp's contract suites: two
//! adapters on one store stand for two server processes sharing it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::{MemoryStore, Store, StoreOptions};
use mcp_event_store_tower_mcp::{Runtime, TowerEventStore, TowerTaskStore};
use serde_json::json;
use tower_mcp::CallToolResult;
use tower_mcp::async_task::{TaskPresence, TaskStore, TaskStoreError};
use tower_mcp::event_store::{EventRecord, EventStore};
use tower_mcp::protocol::{
    InputRequest, InputRequests, InputResponses, ListRootsParams, TaskStatus,
};

/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(30);

fn ask(keys: &[&str]) -> InputRequests {
    keys.iter()
        .map(|k| {
            (
                k.to_string(),
                InputRequest::ListRoots(ListRootsParams { meta: None }),
            )
        })
        .collect()
}

fn answer(keys: &[&str], content: serde_json::Value) -> InputResponses {
    keys.iter()
        .map(|k| {
            let response = json!({"action": "accept", "content": content});
            (k.to_string(), serde_json::from_value(response).unwrap())
        })
        .collect()
}

/// An adapter on a runtime of its own: a process of its own.
async fn instance(store: Arc<dyn Store>) -> TowerTaskStore {
    let runtime = Runtime::builder(store).start().await.unwrap();
    TowerTaskStore::builder(runtime).build().unwrap()
}

async fn eventually(what: &str, future: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(EVENTUALLY, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {EVENTUALLY:?}"));
}

/// A cancel through instance B raises the token instance A handed out for
/// its task (A's guard watches the store), and leaves A's other task alone.
async fn a_cancel_elsewhere_raises_the_token_where_the_task_runs(store: Arc<dyn Store>) {
    let a = instance(store.clone()).await;
    let b = instance(store).await;
    let (id, token) = a.create_task("count", json!({}), None, None).await.unwrap();
    let (other, other_token) = a.create_task("count", json!({}), None, None).await.unwrap();
    let cancelled = b.cancel_task(&id, Some("from B")).await.unwrap().unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    // The reason is kept with the task (T20), shown as tower-mcp shows it.
    assert_eq!(
        cancelled.status_message.as_deref(),
        Some("Cancelled: from B")
    );
    let read = a.get_task(&id).await.unwrap().unwrap();
    assert_eq!(read.status_message.as_deref(), Some("Cancelled: from B"));
    eventually("A's token raised", token.cancelled()).await;
    assert!(!other_token.is_cancelled());
    assert_eq!(
        a.get_task(&other).await.unwrap().unwrap().status,
        TaskStatus::Working
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_elsewhere_raises_the_token_memory() {
    a_cancel_elsewhere_raises_the_token_where_the_task_runs(Arc::new(MemoryStore::new())).await;
}

/// A and B on two handles of one storage, as two processes: on a
/// server-backed store the wake-up crosses by the database's own channel.
async fn cancel_elsewhere_raises_the_token_on<H: Harness<Store: Store>>(harness: H) {
    let a = Arc::new(harness.open(StoreOptions::default()).await);
    // B on a handle of its own, as another process.
    let b = Arc::new(harness.open(StoreOptions::default()).await);
    let on_a = instance(a).await;
    let on_b = instance(b).await;
    let (id, token) = on_a
        .create_task("count", json!({}), None, None)
        .await
        .unwrap();
    on_b.cancel_task(&id, None).await.unwrap().unwrap();
    eventually("A's token raised", token.cancelled()).await;
    drop((on_a, on_b));
    Harness::teardown(harness).await;
}

/// Of 16 `tasks/update` calls racing with the same key, on two instances,
/// exactly one is told its answer was accepted (so exactly one resumes
/// the handler), and the stored answer is that call's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_answers_are_accepted_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = instance(store.clone()).await;
    let b = instance(store.clone()).await;
    let (id, _) = a.create_task("t", json!({}), None, None).await.unwrap();
    assert!(a.require_input(&id, ask(&["k"]), None).await.unwrap());
    let mut racers = Vec::new();
    for i in 0..16u8 {
        let adapter = if i % 2 == 0 { a.clone() } else { b.clone() };
        let id = id.clone();
        racers.push(tokio::spawn(async move {
            let applied = adapter
                .apply_input_responses(&id, answer(&["k"], json!({"n": i})))
                .await
                .unwrap()
                .expect("a live task");
            (i, applied)
        }));
    }
    let mut winners = Vec::new();
    for racer in racers {
        let (i, applied) = racer.await.unwrap();
        if applied.accepted.contains("k") {
            assert!(applied.is_complete());
            winners.push(i);
        } else {
            assert!(applied.ignored.contains("k"));
        }
    }
    assert_eq!(winners.len(), 1, "exactly one call's answer was accepted");
    let stored = a.input_responses(&id).await.unwrap().unwrap();
    let stored = serde_json::to_value(&stored["k"]).unwrap();
    assert_eq!(
        stored["content"]["n"].as_f64(),
        Some(f64::from(winners[0])),
        "the stored answer is the winner's"
    );
}

/// Instance B resumes a task A created and parked: the tool, its original
/// arguments and every answer so far, with a token of B's that a cancel
/// through A raises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_resumes_with_everything_and_a_token_of_its_own() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = instance(store.clone()).await;
    let b = instance(store.clone()).await;
    let args = json!({"count": 3, "nested": {"ü": [1, 2]}});
    let (id, _) = a
        .create_task("confirm_count", args.clone(), None, Some("alice".into()))
        .await
        .unwrap();
    a.require_input(&id, ask(&["first"]), None).await.unwrap();
    b.apply_input_responses(&id, answer(&["first"], json!({"ok": true})))
        .await
        .unwrap();
    a.require_input(&id, ask(&["second"]), None).await.unwrap();
    b.apply_input_responses(&id, answer(&["second"], json!({"ok": false})))
        .await
        .unwrap();
    let resume = b.resume_context(&id).await.unwrap().expect("live");
    assert_eq!(resume.tool_name, "confirm_count");
    assert_eq!(resume.arguments, args);
    assert_eq!(
        resume.input_responses.keys().collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(b.task_owner(&id).await.unwrap(), Some(Some("alice".into())));
    let token = resume.cancellation_token.expect("a token");
    assert!(!token.is_cancelled());
    a.cancel_task(&id, None).await.unwrap();
    eventually("B's token raised", token.cancelled()).await;
}

/// Each adapter lists the tasks its process created or resumed; the store
/// keeps no ids to list another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_lists_its_own_tasks() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = instance(store.clone()).await;
    let b = instance(store.clone()).await;
    let (on_a, _) = a.create_task("t", json!({}), None, None).await.unwrap();
    let (on_b, _) = b.create_task("t", json!({}), None, None).await.unwrap();
    let ids = |tasks: Vec<tower_mcp::protocol::TaskObject>| -> Vec<String> {
        tasks.into_iter().map(|t| t.task_id).collect()
    };
    assert_eq!(
        ids(a.list_tasks(None).await.unwrap()),
        std::slice::from_ref(&on_a)
    );
    assert_eq!(ids(b.list_tasks(None).await.unwrap()), [on_b]);
    b.resume_context(&on_a).await.unwrap();
    assert_eq!(b.list_tasks(None).await.unwrap().len(), 2);
}

/// Past its ttl a task is unknown to tower-mcp, but while the store keeps
/// it (its grace, an hour however short the ttl, T21) its owner is told it
/// expired; its tokens are raised. `set_ttl(0)` expires a task at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_task_is_present_as_expired_with_its_owner() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = instance(store.clone()).await;
    let (id, token) = a
        .create_task("t", json!({}), Some(50), Some("bob".into()))
        .await
        .unwrap();
    eventually("expiry raises the token", token.cancelled()).await;
    // Many ttls later, still expired rather than missing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(a.get_task(&id).await.unwrap().map(|t| t.task_id), None);
    assert_eq!(
        a.task_presence(&id).await.unwrap(),
        TaskPresence::Expired {
            owner: Some("bob".into())
        }
    );
    let (cut, _) = a
        .create_task("t", json!({}), None, Some("bob".into()))
        .await
        .unwrap();
    assert!(a.set_ttl(&cut, 0).await.unwrap());
    assert_eq!(
        a.task_presence(&cut).await.unwrap(),
        TaskPresence::Expired {
            owner: Some("bob".into())
        }
    );
    assert!(
        !a.complete_task(&id, CallToolResult::text("late"))
            .await
            .unwrap()
    );
}

/// Dropping an adapter and its runtime stops the lease: its running tasks
/// read `failed` ("server instance lost") on another instance once its
/// lease lapses, as when its process dies; finished ones stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_instance_leaves_its_running_tasks_failed() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let runtime = Runtime::builder(store.clone())
        .lease(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let a = TowerTaskStore::builder(runtime).build().unwrap();
    let b = instance(store.clone()).await;
    let (running, _) = a.create_task("t", json!({}), None, None).await.unwrap();
    let (done, _) = a.create_task("t", json!({}), None, None).await.unwrap();
    assert!(
        a.complete_task(&done, CallToolResult::text("ok"))
            .await
            .unwrap()
    );
    drop(a);
    eventually("the running task reads failed", async {
        loop {
            let (task, _, error) = b.get_task_result(&running).await.unwrap().unwrap();
            if task.status == TaskStatus::Failed {
                assert_eq!(error.unwrap().message, "server instance lost");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        b.get_task(&done).await.unwrap().unwrap().status,
        TaskStatus::Completed
    );
}

/// Bad input is a clear error or an absent task, never a panic: malformed
/// ids, a spent key, a status `set_status` does not set, arguments over
/// the context limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = instance(store.clone()).await;
    for bad in ["", "t1.", "not-a-task", "t1.zzzzzzzzzzzzzzzzzzzzzzzzzz"] {
        assert!(a.get_task(bad).await.unwrap().is_none());
        assert_eq!(a.task_presence(bad).await.unwrap(), TaskPresence::Missing);
        assert!(!a.set_ttl(bad, 1).await.unwrap());
        assert!(a.cancel_task(bad, None).await.unwrap().is_none());
        assert!(!a.discard_task(bad).await.unwrap());
    }
    let (id, _) = a.create_task("t", json!({}), None, None).await.unwrap();
    assert!(matches!(
        a.set_status(&id, TaskStatus::InputRequired, None).await,
        Err(TaskStoreError::InvalidTransition(_))
    ));
    assert!(matches!(
        a.set_status(&id, TaskStatus::Completed, None).await,
        Err(TaskStoreError::InvalidTransition(_))
    ));
    let huge = json!({"blob": "x".repeat(2 * 1024 * 1024)});
    assert!(matches!(
        a.create_task("t", huge, None, None).await,
        Err(TaskStoreError::RetentionLimitExceeded { .. })
    ));
    let many: InputRequests = (0..65)
        .map(|i| {
            (
                format!("k{i}"),
                InputRequest::ListRoots(ListRootsParams { meta: None }),
            )
        })
        .collect::<BTreeMap<_, _>>();
    assert!(matches!(
        a.require_input(&id, many, None).await,
        Err(TaskStoreError::InvalidTransition(_))
    ));
    let long = "m".repeat(10_000);
    assert!(
        a.require_input(&id, ask(&["k"]), Some(&long))
            .await
            .unwrap()
    );
    let parked = a.get_task(&id).await.unwrap().unwrap();
    assert_eq!(parked.status_message.map(|m| m.len()), Some(4096));
}

/// A session's events replay with their numbers and timestamps, and a
/// replay finds them through another handle on the store (a second
/// instance).
async fn events_replay_through_another_handle_with_their_timestamps<H: Harness<Store: Store>>(
    harness: H,
) {
    let a = TowerEventStore::new(Arc::new(harness.open(StoreOptions::default()).await));
    let b = TowerEventStore::new(Arc::new(harness.open(StoreOptions::default()).await));
    let mut first = EventRecord::new(0, "{\"n\":0}");
    first.timestamp = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    a.append("s", first).await.unwrap();
    a.append("s", EventRecord::new(1, "{\"n\":1}"))
        .await
        .unwrap();
    let all = b.replay_after("s", 0).await.unwrap();
    assert_eq!(all.len(), 1, "strictly after 0");
    let mut everything = a.replay_after("s", u64::MAX).await.unwrap();
    assert!(everything.is_empty());
    everything = b.replay_after("s", 0).await.unwrap();
    assert_eq!(everything[0].id, 1);
    b.purge_session("s").await.unwrap();
    assert!(a.replay_after("s", 0).await.unwrap().is_empty());
    Harness::teardown(harness).await;
}

/// The cases above that need storage two handles share, on every backend
/// compiled in (its kit's harness; `mcp_event_store::for_each_backend!`).
macro_rules! on_each_backend {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        mod $backend {
            use super::*;
            use mcp_event_store_conformance::bench::Kit;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cancel_elsewhere_raises_the_token() {
                cancel_elsewhere_raises_the_token_on(<$kit as Kit>::harness().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn events_replay_through_another_handle_with_their_timestamps() {
                super::events_replay_through_another_handle_with_their_timestamps(
                    <$kit as Kit>::harness().await,
                )
                .await;
            }
        }
    };
}

mcp_event_store::for_each_backend!(on_each_backend);
