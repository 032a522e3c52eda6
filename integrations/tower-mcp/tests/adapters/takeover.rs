//! Tasks that outlive their process: two or three adapters on one store,
//! each with a tower-mcp router that runs its takeovers, stand for server
//! processes sharing the store, each adapter on a runtime of its own. A
//! process "dies" when its adapter (which holds the only clone of its
//! runtime) is dropped, or "pauses" when the current-thread tokio runtime
//! it lives on is no longer driven (its lease is no longer renewed, its
//! handle stays usable).
//!
//! No test bounds a latency: each waits, under a generous guard, for what
//! must happen eventually.

use std::sync::Arc;
use std::time::Duration;

use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::task::TaskId;
use mcp_event_store_core::{MemoryStore, Store, StoreOptions};
use mcp_event_store_tower_mcp::{Runtime, Takeovers, TowerTaskStore};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tower_mcp::async_task::TaskStore;
use tower_mcp::protocol::{
    ElicitFormParams, ElicitFormSchema, ElicitRequestParams, InputRequest, InputRequiredResult,
    McpRequest, McpResponse, RequestId, TaskStatus,
};
use tower_mcp::stateless::StatelessRequestMeta;
use tower_mcp::{
    CallToolResult, McpRouter, RequestContext, RouterRequest, TaskSupportMode, ToolBuilder,
};
use tower_service::Service;

/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// What a tool's handler reports when it starts: which process runs it,
/// and with which arguments and answers.
#[derive(Debug)]
struct Started {
    by: &'static str,
    arguments: Value,
    answers: Vec<String>,
}

/// Dropped when a handler's future is: tells the test the handler stopped.
struct Stopped(Option<mpsc::UnboundedSender<&'static str>>, &'static str);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(self.1);
        }
    }
}

/// A process: its task store, its router, and the takeovers it runs.
struct Process {
    tasks: TowerTaskStore,
    router: McpRouter,
    takeovers: Option<Takeovers>,
}

/// The tools every process serves: `work` reports its start, then waits for
/// a permit of `gate` (none: forever) and completes with who ran it; `ask`
/// asks for `confirm` first, then completes with the answer's process.
fn process(
    by: &'static str,
    tasks: TowerTaskStore,
    started: mpsc::UnboundedSender<Started>,
    stopped: mpsc::UnboundedSender<&'static str>,
    gate: Arc<Semaphore>,
) -> Process {
    let on_start = started.clone();
    let work = ToolBuilder::new("work")
        .task_support(TaskSupportMode::Optional)
        .mrtr_handler(move |_ctx: RequestContext, arguments: Value| {
            let started = on_start.clone();
            let stopped = stopped.clone();
            let gate = gate.clone();
            async move {
                let _stopped = Stopped(Some(stopped), by);
                let _ = started.send(Started {
                    by,
                    arguments,
                    answers: Vec::new(),
                });
                let _permit = gate.acquire().await;
                Ok(tower_mcp::protocol::RequestOutcome::Complete(
                    CallToolResult::text(format!("done by {by}")),
                ))
            }
        })
        .build();
    let ask = ToolBuilder::new("ask")
        .task_support(TaskSupportMode::Optional)
        .mrtr_handler(move |ctx: RequestContext, arguments: Value| {
            let started = started.clone();
            async move {
                let answers: Vec<String> = ctx
                    .input_responses()
                    .map(|a| a.keys().cloned().collect())
                    .unwrap_or_default();
                let _ = started.send(Started {
                    by,
                    arguments,
                    answers: answers.clone(),
                });
                if answers.is_empty() {
                    let ask = InputRequest::Elicit(ElicitRequestParams::Form(ElicitFormParams {
                        mode: None,
                        message: "go on?".into(),
                        requested_schema: ElicitFormSchema::new(),
                        meta: None,
                    }));
                    return Ok(tower_mcp::protocol::RequestOutcome::InputRequired(
                        InputRequiredResult::with_requests(
                            [("confirm".to_owned(), ask)].into_iter().collect(),
                        ),
                    ));
                }
                Ok(tower_mcp::protocol::RequestOutcome::Complete(
                    CallToolResult::text(format!("confirmed on {by}")),
                ))
            }
        })
        .build();
    let router = McpRouter::new()
        .task_store(Arc::new(tasks.clone()))
        .tool(work)
        .tool(ask)
        .with_tasks();
    let takeovers = Some(tasks.run_takeovers(router.clone()));
    Process {
        tasks,
        router,
        takeovers,
    }
}

impl Process {
    /// The process dies: its takeovers stop, and with its last handles its
    /// runtime and the runtime's lease.
    fn die(mut self) {
        self.takeovers.take();
    }
}

/// The task store of a process of its own: a runtime with a 250 ms lease
/// claiming every 50 ms, `work` and `ask` taken over.
async fn adapter(store: &Arc<dyn Store>, max_attempts: u32) -> TowerTaskStore {
    let runtime = Runtime::builder(store.clone())
        .lease(Duration::from_millis(250))
        .claim_every(Duration::from_millis(50))
        .max_attempts(max_attempts)
        .start()
        .await
        .unwrap();
    TowerTaskStore::builder(runtime)
        .takeover_tools(["work", "ask"])
        .build()
        .unwrap()
}

/// What the processes of one test share: where their runs report, and the
/// gate their `work` runs wait at (closed until a test adds permits).
struct Channels {
    started_tx: mpsc::UnboundedSender<Started>,
    started: mpsc::UnboundedReceiver<Started>,
    stopped_tx: mpsc::UnboundedSender<&'static str>,
    stopped: mpsc::UnboundedReceiver<&'static str>,
    gate: Arc<Semaphore>,
}

fn channels() -> Channels {
    let (started_tx, started) = mpsc::unbounded_channel();
    let (stopped_tx, stopped) = mpsc::unbounded_channel();
    Channels {
        started_tx,
        started,
        stopped_tx,
        stopped,
        gate: Arc::new(Semaphore::new(0)),
    }
}

impl Channels {
    /// Process `by` on `tasks`, reporting here and gated here.
    fn process(&self, by: &'static str, tasks: TowerTaskStore) -> Process {
        let (started, stopped) = (self.started_tx.clone(), self.stopped_tx.clone());
        process(by, tasks, started, stopped, self.gate.clone())
    }
}

async fn eventually<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(EVENTUALLY, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {EVENTUALLY:?}"))
}

/// Waits until `tasks` reads task `id` in `status`, and returns its result
/// text or error message.
async fn settles(tasks: &TowerTaskStore, id: &str, status: TaskStatus) -> String {
    eventually(&format!("the task reads {status}"), async {
        loop {
            let (task, result, error) = tasks.get_task_result(id).await.unwrap().unwrap();
            if task.status == status {
                return match (result, error) {
                    (Some(result), _) => result.all_text(),
                    (_, Some(error)) => error.message,
                    _ => String::new(),
                };
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// How many runs of the task under `id` lapsed so far.
async fn lapses(store: &Arc<dyn Store>, id: &str) -> u32 {
    let view = store
        .task_runtime()
        .view(&TaskId::parse(id).unwrap())
        .await
        .unwrap()
        .unwrap();
    view.record
        .takeover
        .expect("a task that may be taken over")
        .lapses
}

/// A's task outlives A: once A's instance lapses, B claims it and its
/// router runs the tool again with the task's arguments; the outcome is
/// B's, on run 2.
async fn a_task_is_taken_over_once_its_instance_lapses(store: Arc<dyn Store>) {
    let mut ch = channels();
    let a = ch.process("A", adapter(&store, 3).await);
    let (id, _) = a
        .tasks
        .create_task("work", json!({"n": 7}), None, None)
        .await
        .unwrap();
    a.die();
    let b = ch.process("B", adapter(&store, 3).await);
    let started = eventually("B runs the task", ch.started.recv())
        .await
        .unwrap();
    assert_eq!(started.by, "B");
    assert_eq!(started.arguments, json!({"n": 7}));
    assert_eq!(
        b.tasks.get_task(&id).await.unwrap().unwrap().status,
        TaskStatus::Working
    );
    ch.gate.add_permits(1);
    assert_eq!(
        settles(&b.tasks, &id, TaskStatus::Completed).await,
        "done by B"
    );
    assert_eq!(lapses(&store, &id).await, 1);
    b.die();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_taken_over_once_its_instance_lapses_memory() {
    a_task_is_taken_over_once_its_instance_lapses(Arc::new(MemoryStore::new())).await;
}

/// A current-thread runtime: what it spawned runs only while the test
/// drives it, so leaving it undriven pauses the process that lives on it.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn running_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A pauses past its lease; B takes its task over. When A wakes, each of its
/// writes to the task is refused (fenced) and reads as not applied, so the
/// task ends with B's outcome, not A's.
#[test]
fn a_stale_instance_cannot_write_to_a_task_taken_over() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut ch = channels();
    let on_a = paused_runtime();
    let on_b = running_runtime();
    let (a, id, token) = on_a.block_on(async {
        let a = ch.process("A", adapter(&store, 3).await);
        let (id, token) = a
            .tasks
            .create_task("work", json!({}), None, None)
            .await
            .unwrap();
        (a, id, token)
    });
    // A is paused from here on: B takes the task over once A's lease runs
    // out, and its handler waits at the gate.
    let b = on_b.block_on(async {
        let b = ch.process("B", adapter(&store, 3).await);
        let started = eventually("B runs the task", ch.started.recv())
            .await
            .unwrap();
        assert_eq!(started.by, "B");
        b
    });
    on_a.block_on(async {
        assert!(
            !a.tasks
                .complete_task(&id, CallToolResult::text("done by A"))
                .await
                .unwrap(),
            "a stale completion was applied"
        );
        assert!(
            !a.tasks
                .set_status(&id, TaskStatus::Working, Some("A's message"))
                .await
                .unwrap()
        );
        let error = tower_mcp::error::JsonRpcError::internal_error("A failed it");
        assert!(!a.tasks.fail_task(&id, error).await.unwrap());
        // The refusal raised A's token: its handler must stop.
        assert!(token.is_cancelled());
    });
    on_b.block_on(async {
        let (task, _, _) = b.tasks.get_task_result(&id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Working);
        assert_ne!(task.status_message.as_deref(), Some("A's message"));
        ch.gate.add_permits(1);
        assert_eq!(
            settles(&b.tasks, &id, TaskStatus::Completed).await,
            "done by B"
        );
        b.die();
    });
    on_a.block_on(async { a.die() });
}

/// A process that stalled past its lease runs on under a fresh instance,
/// and its own runtime takes its task over (a second run, through the
/// router): the first run's writes name the first claim, so they are
/// refused and raise its token, even though the same process now holds
/// the task again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_from_before_a_lapse_is_fenced_by_its_own_process() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let clock = Arc::new(mcp_event_store_core::ManualClock::new(
        now.as_millis() as u64
    ));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let mut ch = channels();
    let a = ch.process("A", adapter(&store, 3).await);
    let first_instance = a.tasks.runtime().instance();
    // The first run: tower-mcp's, of the task A creates.
    let (id, token) = a
        .tasks
        .create_task("work", json!({}), None, None)
        .await
        .unwrap();
    // A stalls past its lease: its runtime registers afresh and claims
    // the task back as a second run.
    clock.advance(Duration::from_secs(10));
    let started = eventually("A's runtime runs the task again", ch.started.recv())
        .await
        .unwrap();
    assert_eq!(started.by, "A");
    assert_ne!(a.tasks.runtime().instance(), first_instance);
    assert!(
        !a.tasks
            .complete_task(&id, CallToolResult::text("the first run's"))
            .await
            .unwrap(),
        "the first run wrote under the second run's claim"
    );
    eventually("the first run's token raised", token.cancelled()).await;
    ch.gate.add_permits(1);
    assert_eq!(
        settles(&a.tasks, &id, TaskStatus::Completed).await,
        "done by A"
    );
    assert_eq!(lapses(&store, &id).await, 1);
    a.die();
}

/// With two runs allowed, the task is taken over once: when B, its second
/// run, pauses past its lease too, it reads `failed` ("server instance
/// lost") and nobody runs it a third time.
#[test]
fn attempts_are_bounded() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut ch = channels();
    let on_a = paused_runtime();
    let on_b = paused_runtime();
    let on_c = running_runtime();
    let (a, id) = on_a.block_on(async {
        let a = ch.process("A", adapter(&store, 2).await);
        let (id, _) = a
            .tasks
            .create_task("work", json!({}), None, None)
            .await
            .unwrap();
        (a, id)
    });
    let b = on_b.block_on(async {
        let b = ch.process("B", adapter(&store, 2).await);
        let started = eventually("B runs the task", ch.started.recv())
            .await
            .unwrap();
        assert_eq!(started.by, "B");
        b
    });
    // B is paused from here on, on the task's last run.
    on_c.block_on(async {
        let c = ch.process("C", adapter(&store, 2).await);
        assert_eq!(
            settles(&c.tasks, &id, TaskStatus::Failed).await,
            "server instance lost"
        );
        assert_eq!(lapses(&store, &id).await, 1);
        // Nobody ran it a third time.
        assert!(ch.started.try_recv().is_err(), "a third run started");
        c.die();
    });
    on_b.block_on(async { b.die() });
    on_a.block_on(async { a.die() });
}

/// A cancel through any instance while the task is taken over ends it
/// `cancelled` and stops the handler running it on the claimant.
async fn a_cancel_stops_a_task_taken_over(store: Arc<dyn Store>) {
    let mut ch = channels();
    let a = ch.process("A", adapter(&store, 3).await);
    let (id, _) = a
        .tasks
        .create_task("work", json!({}), None, None)
        .await
        .unwrap();
    a.die();
    let b = ch.process("B", adapter(&store, 3).await);
    let c = ch.process("C", adapter(&store, 3).await);
    let started = eventually("the task is taken over", ch.started.recv())
        .await
        .unwrap();
    // Cancel through the instance that does not run it.
    let other = if started.by == "B" { &c } else { &b };
    let cancelled = other.tasks.cancel_task(&id, None).await.unwrap().unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    let stopped = eventually("the handler stops", ch.stopped.recv())
        .await
        .unwrap();
    assert_eq!(stopped, started.by);
    ch.gate.add_permits(1);
    assert_eq!(
        b.tasks.get_task(&id).await.unwrap().unwrap().status,
        TaskStatus::Cancelled
    );
    b.die();
    c.die();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_task_taken_over_memory() {
    a_cancel_stops_a_task_taken_over(Arc::new(MemoryStore::new())).await;
}

/// The extensions of a 2026-07-28 request from a client that declared the
/// tasks extension and elicitation.
fn final_request(inner: McpRequest) -> RouterRequest {
    let meta: StatelessRequestMeta = serde_json::from_value(json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "elicitation": {"form": {}},
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        }
    }))
    .unwrap();
    let mut request = RouterRequest::new(RequestId::Number(1), inner);
    request.extensions.insert(meta);
    request
}

async fn send(router: &McpRouter, request: McpRequest) -> McpResponse {
    let mut router = router.clone();
    let response = router.call(final_request(request)).await.unwrap();
    response.inner.expect("the router answered")
}

/// End to end through tower-mcp's routers: a `tools/call` on A creates the
/// task, whose handler asks for input; A parks it and gives it back. The
/// `tasks/update` reaches B, whose router resumes it (B claims it), and the
/// task completes with B's outcome while A's late writes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_task_resumes_wherever_it_is_answered() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut ch = channels();
    let a = ch.process("A", adapter(&store, 3).await);
    let b = ch.process("B", adapter(&store, 3).await);
    let call = serde_json::from_value(json!({"name": "ask", "arguments": {"x": 1}})).unwrap();
    let McpResponse::FinalCreateTask(created) = send(&a.router, McpRequest::CallTool(call)).await
    else {
        panic!("tools/call did not create a task");
    };
    let id = serde_json::to_value(&created).unwrap()["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned();
    let first = eventually("A runs the handler", ch.started.recv())
        .await
        .unwrap();
    assert_eq!((first.by, first.answers.len()), ("A", 0));
    settles(&b.tasks, &id, TaskStatus::InputRequired).await;
    let update = serde_json::from_value(json!({
        "taskId": id,
        "inputResponses": {"confirm": {"action": "accept", "content": {}}}
    }))
    .unwrap();
    send(&b.router, McpRequest::UpdateTask(update)).await;
    let resumed = eventually("the handler runs again", ch.started.recv())
        .await
        .unwrap();
    assert_eq!(resumed.answers, ["confirm"]);
    assert_eq!(resumed.arguments, json!({"x": 1}));
    let outcome = settles(&a.tasks, &id, TaskStatus::Completed).await;
    assert_eq!(outcome, format!("confirmed on {}", resumed.by));
    assert!(
        !a.tasks
            .complete_task(&id, CallToolResult::text("late"))
            .await
            .unwrap()
    );
    a.die();
    b.die();
}

/// The cases above on every backend compiled in, on one handle of its
/// kit's harness (`mcp_event_store::for_each_backend!`).
macro_rules! on_each_backend {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        mod $backend {
            use super::*;
            use mcp_event_store_conformance::bench::Kit;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_task_is_taken_over_once_its_instance_lapses() {
                let harness = <$kit as Kit>::harness().await;
                let store = Arc::new(harness.open(StoreOptions::default()).await);
                super::a_task_is_taken_over_once_its_instance_lapses(store).await;
                Harness::teardown(harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_cancel_stops_a_task_taken_over() {
                let harness = <$kit as Kit>::harness().await;
                let store = Arc::new(harness.open(StoreOptions::default()).await);
                super::a_cancel_stops_a_task_taken_over(store).await;
                Harness::teardown(harness).await;
            }
        }
    };
}

mcp_event_store::for_each_backend!(on_each_backend);
