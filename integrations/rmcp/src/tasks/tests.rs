//! End to end, in process: rmcp's own client and server over a duplex pipe,
//! the server's handler backed by [`DurableTasks`] on a runtime over the
//! memory store.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::{RequestContext, RoleClient, RoleServer, RunningService};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::json;

use super::*;
use mcp_event_store_core::task::{NewTask, TaskId, TaskStore};
use mcp_event_store_core::{ManualClock, MemoryStore, Store, StoreOptions};

/// The server: each client is its own owner (its `clientInfo.name`).
#[derive(Clone)]
struct Server {
    tasks: DurableTasks,
}

fn text(result: &CallToolResult) -> String {
    result.content[0].as_text().unwrap().text.clone()
}

fn ok(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text.into())])
}

impl ServerHandler for Server {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let options = TaskOptions::new().with_poll_interval_ms(10);
        if self.tasks.is_takeover(&request.name) || self.tasks.hands_off() {
            let task = self
                .tasks
                .spawn_takeover(&ctx, options, TakeoverCall::from(&request))
                .await?;
            return Ok(CallToolResponse::Task(task));
        }
        let task = match request.name.as_ref() {
            // Counts to `to`, saying where it is, then answers the count.
            "count" => {
                let to = request
                    .arguments
                    .as_ref()
                    .and_then(|a| a.get("to"))
                    .and_then(Value::as_u64)
                    .unwrap_or(3);
                self.tasks
                    .spawn(&ctx, options, move |t| {
                        Box::pin(async move {
                            let mut n = 0;
                            while n < to {
                                n += 1;
                                t.set_status_message(format!("at {n}")).await?;
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Ok(ok(n.to_string()))
                        })
                    })
                    .await?
            }
            // Asks for a name, then greets it.
            "ask" => {
                self.tasks
                    .spawn(&ctx, options, |t| {
                        Box::pin(async move {
                            let request: InputRequest = serde_json::from_value(json!({
                                "method": "elicitation/create",
                                "params": {
                                    "message": "What is your name?",
                                    "requestedSchema": {"type": "object", "properties": {}}
                                }
                            }))
                            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                            let answer = t.request_input("name", request).await?;
                            let name = answer["content"]["name"].as_str().unwrap_or("?");
                            Ok(ok(format!("hello {name}")))
                        })
                    })
                    .await?
            }
            // Waits for a cancel and ends as cancelled.
            "wait" => {
                self.tasks
                    .spawn(&ctx, options, |t| {
                        Box::pin(async move {
                            t.cancelled().await;
                            assert!(t.is_cancel_requested().await);
                            Err(TaskExit::Cancelled)
                        })
                    })
                    .await?
            }
            // Outlives a 500 ms ttl.
            "sleep" => {
                self.tasks
                    .spawn(&ctx, options.with_ttl_ms(500), |_| {
                        Box::pin(async move {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            Ok(ok("never"))
                        })
                    })
                    .await?
            }
            // Runs for 1.5 s (longer than the tests' 600 ms lease).
            "long" => {
                self.tasks
                    .spawn(&ctx, options, |_| {
                        Box::pin(async move {
                            tokio::time::sleep(Duration::from_millis(1500)).await;
                            Ok(ok("survived"))
                        })
                    })
                    .await?
            }
            // Answers 4 KiB of text, over the oversize test's 1 KiB limit.
            "big" => {
                self.tasks
                    .spawn(&ctx, options, |_| {
                        Box::pin(async move { Ok(ok("x".repeat(4096))) })
                    })
                    .await?
            }
            "panic" => {
                self.tasks
                    .spawn(&ctx, options, |_| Box::pin(async move { panic!("boom") }))
                    .await?
            }
            other => {
                return Err(ErrorData::invalid_params(format!("no tool {other}"), None));
            }
        };
        Ok(CallToolResponse::Task(task))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.get_task(&ctx, request).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.update_task(&ctx, request).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&ctx, request).await
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
    }
}

fn by_client_name(ctx: &RequestContext<RoleServer>) -> Owner {
    ctx.peer
        .peer_info()
        .map(|info| Owner::principal(info.client_info.name.as_bytes()).unwrap())
        .unwrap_or(Owner::Anonymous)
}

/// The tasks of a runtime over `store` with a 600 ms lease.
async fn tasks_over(store: Arc<dyn Store>) -> DurableTasks {
    let runtime = Runtime::builder(store)
        .lease(Duration::from_millis(600))
        .watch_wait(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    DurableTasks::builder()
        .owner(by_client_name)
        .build(&runtime)
}

fn memory() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new())
}

type Client = RunningService<RoleClient, ClientConfig>;

/// A client named `name`, declaring the tasks extension or not, connected
/// to a server on `tasks`.
async fn connect(tasks: &DurableTasks, name: &str, declare_tasks: bool) -> Client {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    let server = Server {
        tasks: tasks.clone(),
    };
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let capabilities = if declare_tasks {
        ClientCapabilities::builder().enable_tasks().build()
    } else {
        ClientCapabilities::default()
    };
    let mut info = Implementation::from_build_env();
    info.name = name.into();
    ClientConfig::new(capabilities, info)
        .serve(client_io)
        .await
        .unwrap()
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CreateTaskResult {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    if let Value::Object(arguments) = arguments {
        params = params.with_arguments(arguments);
    }
    match client.call_tool_once(params).await.unwrap() {
        CallToolResponse::Task(task) => task,
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn get(client: &Client, id: &str) -> DetailedTask {
    client
        .peer()
        .get_task(GetTaskParams::new(id.to_owned()))
        .await
        .unwrap()
        .task
}

/// Polls until the task satisfies `done`, for at most 5 s.
async fn until(client: &Client, id: &str, done: impl Fn(&DetailedTask) -> bool) -> DetailedTask {
    for _ in 0..500 {
        let task = get(client, id).await;
        if done(&task) {
            return task;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {id} never reached the expected state");
}

fn terminal(task: &DetailedTask) -> bool {
    task.status().is_terminal()
}

fn error_code(error: rmcp::ServiceError) -> ErrorCode {
    match error {
        rmcp::ServiceError::McpError(e) => e.code,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counting_task_is_durable_at_once_and_completes_with_its_result() {
    let store = memory();
    let tasks = tasks_over(store.clone()).await;
    let client = connect(&tasks, "alice", true).await;
    let created = call(&client, "count", json!({"to": 3})).await;
    assert_eq!(created.result_type, ResultType::TASK);
    assert_eq!(created.task.status, rmcp::model::TaskStatus::Working);
    assert_eq!(created.task.poll_interval_ms, Some(10));
    assert!(
        created.task.created_at.ends_with('Z'),
        "{}",
        created.task.created_at
    );
    let id = created.task.task_id.clone();
    assert!(TaskId::parse(&id).is_some(), "{id}");
    // T1: the store has it before the client had the CreateTaskResult.
    assert!(
        store
            .get(&id, &Owner::principal(b"alice").unwrap())
            .await
            .unwrap()
            .is_some()
    );

    let done = until(&client, &id, terminal).await;
    match &done.payload {
        TaskPayload::Completed { result } => {
            let result: CallToolResult =
                serde_json::from_value(Value::Object(result.clone())).unwrap();
            assert_eq!(text(&result), "3");
        }
        other => panic!("expected completed, got {other:?}"),
    }
    assert_eq!(done.task.status_message.as_deref(), Some("at 3"));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_extension_spawn_answers_32021_and_writes_nothing() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let tasks = tasks_over(store.clone()).await;
    let client = connect(&tasks, "bob", false).await;
    let error = client
        .call_tool_once(CallToolRequestParams::new("count"))
        .await
        .unwrap_err();
    assert_eq!(
        error_code(error),
        ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
    );
    assert_eq!(ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY.0, -32021);
    // rmcp's own guard would also answer -32021, but after the handler had
    // created the task: no task reached the store, so past every task's
    // lifetime a purge deletes none.
    clock.advance(Duration::from_secs(8 * 24 * 3600));
    assert_eq!(store.purge_expired_tasks().await.unwrap().deleted, 0);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asks_for_input_and_gets_the_answer_through_tasks_update() {
    let tasks = tasks_over(memory()).await;
    let client = connect(&tasks, "alice", true).await;
    let id = call(&client, "ask", Value::Null).await.task.task_id;
    let waiting = until(&client, &id, |t| {
        t.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await;
    let TaskPayload::InputRequired { input_requests } = &waiting.payload else {
        panic!("expected input_required, got {waiting:?}");
    };
    assert_eq!(input_requests.keys().collect::<Vec<_>>(), ["name"]);
    assert!(matches!(
        input_requests["name"],
        InputRequest::Elicitation(_)
    ));

    let mut responses = InputResponses::new();
    responses.insert(
        "name".into(),
        json!({"action": "accept", "content": {"name": "Ada"}}),
    );
    responses.insert("unknown".into(), json!({})); // ignored (SEP-2663)
    client
        .peer()
        .update_task(UpdateTaskParams::new(id.clone(), responses))
        .await
        .unwrap();
    let done = until(&client, &id, terminal).await;
    let TaskPayload::Completed { result } = &done.payload else {
        panic!("expected completed, got {done:?}");
    };
    assert_eq!(result["content"][0]["text"], "hello Ada");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_is_seen_by_a_waiting_task_and_by_one_waiting_for_input() {
    let tasks = tasks_over(memory()).await;
    let client = connect(&tasks, "alice", true).await;
    let waiting = call(&client, "wait", Value::Null).await.task.task_id;
    let asking = call(&client, "ask", Value::Null).await.task.task_id;
    until(&client, &asking, |t| {
        t.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await;
    assert_eq!(
        get(&client, &waiting).await.status(),
        rmcp::model::TaskStatus::Working
    );
    for id in [&waiting, &asking] {
        client
            .peer()
            .cancel_task(CancelTaskParams::new(id.clone()))
            .await
            .unwrap();
    }
    for id in [&waiting, &asking] {
        let done = until(&client, id, terminal).await;
        assert_eq!(done.status(), rmcp::model::TaskStatus::Cancelled, "{id}");
    }
    // On a terminal task, cancel is an acknowledgement with no change.
    client
        .peer()
        .cancel_task(CancelTaskParams::new(waiting.clone()))
        .await
        .unwrap();
    assert_eq!(
        get(&client, &waiting).await.status(),
        rmcp::model::TaskStatus::Cancelled
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_task_reads_failed_with_32603() {
    let tasks = tasks_over(memory()).await;
    let client = connect(&tasks, "alice", true).await;
    let created = call(&client, "sleep", Value::Null).await;
    assert_eq!(created.task.ttl_ms, Some(500));
    let id = created.task.task_id;
    assert_eq!(
        get(&client, &id).await.status(),
        rmcp::model::TaskStatus::Working
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let task = get(&client, &id).await;
    let TaskPayload::Failed { error } = &task.payload else {
        panic!("expected failed, got {task:?}");
    };
    assert_eq!(error["code"], -32603);
    assert_eq!(error["message"], "task expired");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_and_other_owners_tasks_are_32602_for_every_call() {
    let tasks = tasks_over(memory()).await;
    let alice = connect(&tasks, "alice", true).await;
    let mallory = connect(&tasks, "mallory", true).await;
    let id = call(&alice, "wait", Value::Null).await.task.task_id;
    for (client, id) in [(&alice, "t1.nope".to_owned()), (&mallory, id.clone())] {
        let peer = client.peer();
        let get = peer.get_task(GetTaskParams::new(id.clone())).await;
        let update = peer
            .update_task(UpdateTaskParams::new(id.clone(), InputResponses::new()))
            .await;
        let cancel = peer.cancel_task(CancelTaskParams::new(id.clone())).await;
        assert_eq!(error_code(get.unwrap_err()), ErrorCode::INVALID_PARAMS);
        assert_eq!(error_code(update.unwrap_err()), ErrorCode::INVALID_PARAMS);
        assert_eq!(error_code(cancel.unwrap_err()), ErrorCode::INVALID_PARAMS);
    }
    // Mallory's cancel changed nothing.
    assert_eq!(
        get(&alice, &id).await.status(),
        rmcp::model::TaskStatus::Working
    );
    alice.cancel().await.unwrap();
    mallory.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_keeps_a_long_task_alive_and_lapses_once_the_runtime_is_gone() {
    let store = memory();
    let tasks = tasks_over(store.clone()).await;
    let client = connect(&tasks, "alice", true).await;
    // The lease is 600 ms; the task runs 1.5 s.
    let id = call(&client, "long", Value::Null).await.task.task_id;
    let done = until(&client, &id, terminal).await;
    assert_eq!(done.status(), rmcp::model::TaskStatus::Completed);

    // A task whose runtime is gone (no clone left, so no lease renewal) reads
    // lost once the lease runs out.
    let owner = Owner::Anonymous;
    let gone = tasks_over(store.clone()).await;
    let (orphan, _) = store
        .create(NewTask::new(&owner, gone.instance()))
        .await
        .unwrap();
    drop(gone);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let lost = store
        .get(&orphan.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lost.status, mcp_event_store_core::task::TaskStatus::Failed);
    assert_eq!(
        lost.outcome.as_deref(),
        Some(mcp_event_store_core::task::INSTANCE_LOST_ERROR)
    );
    client.cancel().await.unwrap();
}

/// T11: a runtime that stalled past its lease before its renewal noticed
/// (here the store's clock jumps four hours; the lease is three, renewed
/// hourly)
/// creates the next task under a fresh instance, not the lapsed one: the
/// task is born working and runs to its end, where under the lapsed
/// instance it would read `failed` ("server instance lost") at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_after_an_unnoticed_lapse_is_born_alive() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let hour = Duration::from_secs(3600);
    let runtime = Runtime::builder(store)
        .lease(3 * hour)
        .start()
        .await
        .unwrap();
    let tasks = DurableTasks::builder()
        .owner(by_client_name)
        .build(&runtime);
    let lapsed = tasks.instance();
    let client = connect(&tasks, "alice", true).await;
    clock.advance(4 * hour);

    let created = call(&client, "count", json!({"to": 2})).await.task;
    assert_eq!(created.status, rmcp::model::TaskStatus::Working);
    assert_ne!(tasks.instance(), lapsed, "a fresh instance was registered");
    let done = until(&client, &created.task_id, terminal).await;
    assert_eq!(done.status(), rmcp::model::TaskStatus::Completed);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_operation_fails_its_task() {
    let tasks = tasks_over(memory()).await;
    let client = connect(&tasks, "alice", true).await;
    let id = call(&client, "panic", Value::Null).await.task.task_id;
    let task = until(&client, &id, terminal).await;
    let TaskPayload::Failed { error } = &task.payload else {
        panic!("expected failed, got {task:?}");
    };
    assert_eq!(error["code"], -32603);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_over_the_store_limit_fails_the_task_instead_of_hanging() {
    let store = MemoryStore::with_options(StoreOptions::default().max_payload_bytes(1024));
    let tasks = tasks_over(Arc::new(store)).await;
    let client = connect(&tasks, "alice", true).await;
    let id = call(&client, "big", Value::Null).await.task.task_id;
    let task = until(&client, &id, terminal).await;
    let TaskPayload::Failed { error } = &task.payload else {
        panic!("expected failed, got {task:?}");
    };
    assert_eq!(error["code"], -32603);
    assert!(
        error["message"].as_str().unwrap().contains("limit is 1024"),
        "{error:?}"
    );
    client.cancel().await.unwrap();
}

mod takeover;
