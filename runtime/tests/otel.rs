//! Traces that follow the work (feature `otel`): a task created in a
//! traced span keeps its W3C trace context, and the run another runtime
//! claims continues that trace. Spans go to the SDK's in-memory exporter,
//! through a subscriber set for the test's thread (each test runs on a
//! current-thread tokio runtime, so every span it makes is made there).
//!
//! The task is queued for a worker by a front end (deterministic: the
//! worker claims it when told to, `claim_now`). No test bounds a latency:
//! waits are failure guards only.
#![cfg(feature = "otel")]

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use mcp_event_store_core::MemoryStore;
use mcp_event_store_core::task::{NewTask, Owner, TaskId, TaskStatus, TaskStore};
use mcp_event_store_runtime::{Executor, Outcome, Runtime, TaskCall, TaskRun};
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(30);

/// Spans, exported in memory as they end, while the guard lives.
struct Exported {
    spans: InMemorySpanExporter,
    _subscriber: tracing::subscriber::DefaultGuard,
}

fn export() -> Exported {
    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    Exported {
        spans,
        _subscriber: tracing::subscriber::set_default(subscriber),
    }
}

impl Exported {
    /// The span named `name`, once it ended.
    async fn span(&self, name: &str) -> SpanData {
        tokio::time::timeout(EVENTUALLY, async {
            loop {
                let spans = self.spans.get_finished_spans().unwrap();
                if let Some(span) = spans.into_iter().find(|span| span.name == name) {
                    return span;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no span {name:?} within {EVENTUALLY:?}"))
    }
}

/// Completes every task, with the tool its call names.
struct Echo;

impl Executor for Echo {
    fn run(&self, run: TaskRun) -> BoxFuture<'static, Outcome> {
        Box::pin(async move {
            let tool = run.call().map(|call| call.tool).unwrap_or_default();
            tracing::info!(%tool, "running");
            Outcome::Completed(json!({"ran": tool}).to_string().into_bytes())
        })
    }
}

/// A front end that queues its tasks for workers, and a worker that claims
/// only when told to.
async fn front_and_worker(store: &Arc<MemoryStore>) -> (Runtime, Runtime) {
    let front = Runtime::builder(store.clone())
        .hand_off_to_workers()
        .start()
        .await
        .unwrap();
    let worker = Runtime::builder(store.clone())
        .claim_every(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    (front, worker)
}

/// Queues a task to run `call` on `front`.
async fn queue(front: &Runtime, call: &TaskCall) -> TaskId {
    let task = front.for_takeover(NewTask::new(&Owner::Anonymous, front.instance()));
    front.create_call(task, call).await.unwrap().0
}

/// The worker claims and runs the task `id`, to its end.
async fn run_on(worker: &Runtime, store: &MemoryStore, id: &TaskId) {
    let _takeovers = worker.run_takeovers(Arc::new(Echo));
    worker.claim_now().await;
    tokio::time::timeout(EVENTUALLY, async {
        loop {
            let record = store.get(&id.to_string(), &Owner::Anonymous).await;
            if record.unwrap().unwrap().status == TaskStatus::Completed {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the worker completes the task");
}

#[tokio::test]
async fn a_claimed_run_continues_the_trace_of_the_request_that_created_it() {
    let exported = export();
    let store = Arc::new(MemoryStore::new());
    let (front, worker) = front_and_worker(&store).await;
    let call = TaskCall::new("slow_count", json!({"count": 3}));
    let id = queue(&front, &call)
        .instrument(tracing::info_span!("tools/call"))
        .await;

    let stored = store.get(&id.to_string(), &Owner::Anonymous).await;
    let stored = stored.unwrap().unwrap().context.expect("a context");
    let kept = TaskCall::decode(&stored).unwrap();
    assert_eq!(
        (kept.tool.as_str(), &kept.arguments),
        ("slow_count", &call.arguments)
    );
    let traceparent = kept.traceparent.expect("the creating span's trace is kept");

    run_on(&worker, &store, &id).await;
    let created = exported.span("tools/call").await;
    let run = exported.span("task.run").await;
    let creating = created.span_context;
    assert_eq!(
        traceparent,
        format!("00-{}-{}-01", creating.trace_id(), creating.span_id())
    );
    assert_eq!(
        run.span_context.trace_id(),
        creating.trace_id(),
        "the same trace"
    );
    assert_eq!(
        run.parent_span_id,
        creating.span_id(),
        "a child of the creating span"
    );
    assert!(run.parent_span_is_remote, "its parent came from the store");
    assert!(
        run.attributes
            .iter()
            .any(|kv| kv.key.as_str() == "tool" && kv.value.as_str() == "slow_count"),
        "the run names its tool: {:?}",
        run.attributes
    );
    worker.shutdown().await;
    front.shutdown().await;
}

#[tokio::test]
async fn a_task_created_outside_a_span_keeps_no_trace_and_still_runs() {
    let exported = export();
    let store = Arc::new(MemoryStore::new());
    let (front, worker) = front_and_worker(&store).await;
    let id = queue(&front, &TaskCall::new("slow_count", json!(null))).await;

    let stored = store.get(&id.to_string(), &Owner::Anonymous).await;
    let stored = stored.unwrap().unwrap().context.expect("a context");
    let raw: serde_json::Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(raw, json!({"tool": "slow_count", "arguments": null}));

    run_on(&worker, &store, &id).await;
    let outcome = store.get(&id.to_string(), &Owner::Anonymous).await;
    let outcome = outcome.unwrap().unwrap().outcome.expect("an outcome");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&outcome).unwrap(),
        json!({"ran": "slow_count"})
    );
    let run = exported.span("task.run").await;
    assert_eq!(run.parent_span_id, SpanId::INVALID, "a trace of its own");
    worker.shutdown().await;
    front.shutdown().await;
}
