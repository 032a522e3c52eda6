//! Durable tasks (SEP-2663) for rmcp servers: [`DurableTasks`], an async
//! twin of rmcp's in-process `TaskManager`, run by the framework-neutral
//! [`Runtime`] over a shared store.
//!
//! rmcp's dispatch never calls a task manager; the handler does, from
//! `call_tool`, `get_task`, `update_task` and `cancel_task`. So does this
//! one. Build it once per runtime, clone it into every handler (a clone is
//! one `Arc`):
//!
//! ```no_run
//! # async fn demo() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use mcp_event_store_core::task::Owner;
//! use mcp_event_store_rmcp::{DurableTaskContext, DurableTasks, Runtime};
//! use rmcp::model::{CallToolResult, ContentBlock};
//! use rmcp::task_manager::TaskOptions;
//!
//! let store = Arc::new(mcp_event_store_core::MemoryStore::new()); // or connect(url)
//! let runtime = Runtime::builder(store).start().await?;
//! let tasks = DurableTasks::builder()
//!     // Who may see a task: usually the authenticated principal, read
//!     // from `ctx.extensions.get::<http::request::Parts>()`.
//!     .owner(|_ctx| Owner::Anonymous)
//!     .build(&runtime);
//! // In `ServerHandler::call_tool`:
//! // self.tasks.spawn(&ctx, TaskOptions::new(), |t: DurableTaskContext| Box::pin(async move {
//! //     t.set_status_message("working").await?;
//! //     Ok(CallToolResult::success(vec![ContentBlock::text("done")]))
//! // })).await.map(CallToolResponse::Task)
//! // In `get_task`, `update_task`, `cancel_task`:
//! // self.tasks.get_task(&ctx, request).await
//! # let _ = tasks; Ok(()) }
//! ```
//!
//! What it does:
//!
//! * [`spawn`](DurableTasks::spawn) answers -32021 (missing required client
//!   capability) before writing anything when the request did not declare
//!   the tasks extension (rmcp's own guard runs only after the handler, when
//!   the task would already exist). Otherwise it creates the task, durably,
//!   before returning `CreateTaskResult` (T1), and runs the operation on a
//!   task of its own, outside the request's cancellation token.
//! * The operation gets a [`DurableTaskContext`] with rmcp's method names,
//!   over the store: its input requests, answers and cancel requests go
//!   through the store, so any instance sharing it serves `tasks/get`,
//!   `tasks/update` and `tasks/cancel`.
//! * The operation's end is stored as the outcome: a `CallToolResult` as
//!   `completed`, [`TaskExit::Error`] as `failed`, [`TaskExit::Cancelled`] as
//!   `cancelled`, a panic or an outcome over the store's limit as `failed`
//!   with -32603, so a task never stays `working` because its operation went
//!   wrong.
//! * The runtime's lease keeps the tasks alive; when the process dies, its
//!   tasks read `failed` ("server instance lost") once the lease runs out.
//!   The runtime also purges expired and orphaned tasks.
//! * `get_task`, `update_task` and `cancel_task` answer an unknown id, or a
//!   task of another owner, with -32602 (SEP-2663: invalid or nonexistent
//!   `taskId`). A task cancelled with a reason (T20) shows it as its
//!   status message.
//!
//! Durable state is not durable execution: a task made by
//! [`spawn`](DurableTasks::spawn) dies with its process; nothing runs it
//! again.
//!
//! # Takeover: tasks that outlive their instance
//!
//! A tool registered with [`DurableTasksBuilder::takeover`] and called
//! through [`DurableTasks::spawn_takeover`] makes a task that may be taken
//! over (T16 to T19). The call (tool name and arguments, as JSON) is stored
//! with the task, which runs here at once, or, when the runtime hands off
//! to workers, waits for one. The runtime's takeover runner claims waiting
//! tasks (tasks queued for workers, tasks given back for input and since
//! answered, tasks whose instance lapsed with runs left) and runs them with
//! the registered handlers. A worker is such a runtime in a process that
//! serves no HTTP at all.
//!
//! What is guaranteed:
//!
//! * **At least once, with fencing.** A task runs to an end as long as
//!   some runtime with its tool lives and it has runs left (the runtime's
//!   `max_attempts`, default 3; after the last run's instance lapses it
//!   reads `failed`, "server instance lost"). A run whose instance lapsed
//!   (killed, or stalled past its lease) may be running still when another
//!   runtime claims the task; every write names its claim, so the stale
//!   run is stopped at its next write (a status message, a checkpoint, an
//!   input request, its outcome), or as soon as its runtime sees the newer
//!   claim. Exactly one outcome is stored: the current claim's.
//! * **What the tool author makes idempotent.** Everything the handler does
//!   outside the task store, between two of its writes, may happen twice:
//!   once in the stale run before it is fenced, and again in the run that
//!   took over (from the last checkpoint). Side effects must be safe to
//!   repeat (keyed by something in the checkpoint, or checked before they
//!   are made).
//! * **Checkpoints.** [`DurableTaskContext::checkpoint`] saves progress
//!   (bytes, at most 1 MiB); the next run starts with the newest one as
//!   [`last_checkpoint`](DurableTaskContext::last_checkpoint) (`None` on a
//!   first run) and should resume from there.
//!   [`attempt`](DurableTaskContext::attempt) says which run it is.
//! * **Inputs.** In a task that may be taken over,
//!   [`request_input`](DurableTaskContext::request_input) stores the
//!   request and gives the task back: the run stops there, so no runtime is
//!   occupied while the client thinks. Once answered (through any
//!   instance), a runtime claims the task and runs the handler again from
//!   its last checkpoint; its `request_input` for a key answered before
//!   returns the answer at once. Answers are kept with the task for every
//!   later run, so the handler asks the same keys in the same way on every
//!   run, and code before the input request runs again.
//! * **Cancel.** A cancel requested while the task waits for a claim is
//!   honoured by the runtime that claims it: the task ends `cancelled`
//!   without running the tool. While a run runs, cancellation is as for
//!   any task (cooperative or immediate, [`CancelMode`]).
//! * **Ids.** A runtime that claims a task knows only its digest (task ids
//!   are bearer credentials and never stored), so
//!   [`task_id`](DurableTaskContext::task_id) is `None` in a claimed run.
//! * **Traces.** Every run is a `task.run` span (the runtime's
//!   `TaskRun::span`): the first one a child of the span `spawn` or
//!   `spawn_takeover` was called in. With the feature `otel`, the task
//!   keeps that span's W3C trace context with its call, and a run claimed
//!   anywhere else continues that trace.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use mcp_event_store_core::Error;
use mcp_event_store_core::task::{
    Applied, CancelMode, InstanceId, NewTask, Owner, TaskDigest, TaskRecord, TaskStatus,
    WorkerChange,
};
use mcp_event_store_runtime::{
    Executor, Outcome, Runtime, Takeovers, TaskCall, TaskRun, internal_error, iso8601,
    status_message,
};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CancelTaskParams, ClientCapabilities, CreateTaskResult,
    DetailedTask, GetTaskParams, GetTaskResult, InputRequest, InputRequests, JsonObject, Task,
    TaskPayload, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::task_manager::TaskOptions;
pub use rmcp::task_manager::{TaskExit, TaskFuture};
use serde_json::Value;
use tracing::Instrument;

type OwnerFn = dyn Fn(&RequestContext<RoleServer>) -> Owner + Send + Sync;

/// A takeover tool's handler ([`DurableTasksBuilder::takeover`]): given the
/// task's context and the call to run, the operation. It may run more than
/// once for one task (see the [module docs](crate::tasks)).
pub type TakeoverHandler = dyn Fn(DurableTaskContext, TakeoverCall) -> TaskFuture + Send + Sync;

/// The request a task that may be taken over runs: the tool's name and its
/// arguments, kept with the task (its context, T13) so that whichever
/// runtime claims the task can run it again.
///
/// It is kept as the runtime's [`TaskCall`], the one encoding of every
/// framework (with the W3C trace context of the request that created the
/// task, feature `otel`); a handler gets it back as this type.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct TakeoverCall {
    /// The tool's name, as registered with [`DurableTasksBuilder::takeover`].
    pub tool: String,
    /// The call's arguments.
    pub arguments: Option<JsonObject>,
}

impl TakeoverCall {
    /// The call of `tool` with `arguments`.
    pub fn new(tool: impl Into<String>, arguments: Option<JsonObject>) -> Self {
        Self {
            tool: tool.into(),
            arguments,
        }
    }
}

impl From<TakeoverCall> for TaskCall {
    /// The call as the runtime keeps it: arguments `None` are `null`.
    fn from(call: TakeoverCall) -> Self {
        let arguments = call.arguments.map_or(Value::Null, Value::Object);
        TaskCall::new(call.tool, arguments)
    }
}

impl TryFrom<TaskCall> for TakeoverCall {
    type Error = String;

    /// The call a task keeps, as rmcp's: its arguments must be an object
    /// (or `null`, for none).
    fn try_from(call: TaskCall) -> Result<Self, String> {
        let arguments = match call.arguments {
            Value::Null => None,
            Value::Object(arguments) => Some(arguments),
            other => {
                return Err(format!(
                    "the task's call to {:?} has arguments that are no object: {other}",
                    call.tool
                ));
            }
        };
        Ok(Self::new(call.tool, arguments))
    }
}

impl From<&CallToolRequestParams> for TakeoverCall {
    fn from(request: &CallToolRequestParams) -> Self {
        Self::new(request.name.clone(), request.arguments.clone())
    }
}

/// Builds [`DurableTasks`]; see [`DurableTasks::builder`].
pub struct DurableTasksBuilder {
    owner: Arc<OwnerFn>,
    /// Whether [`owner`](Self::owner) was called; if not, `build` warns.
    owner_bound: bool,
    cancel_mode: CancelMode,
    takeover: HashMap<String, Arc<TakeoverHandler>>,
}

impl fmt::Debug for DurableTasksBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<_> = self.takeover.keys().collect();
        tools.sort();
        f.debug_struct("DurableTasksBuilder")
            .field("cancel_mode", &self.cancel_mode)
            .field("takeover", &tools)
            .finish_non_exhaustive()
    }
}

impl DurableTasksBuilder {
    /// Who may see the tasks a request creates, and which tasks a request
    /// may read, answer or cancel (T3). Without it every task is
    /// [`Owner::Anonymous`], and the task id is the only credential.
    pub fn owner(
        mut self,
        owner: impl Fn(&RequestContext<RoleServer>) -> Owner + Send + Sync + 'static,
    ) -> Self {
        self.owner = Arc::new(owner);
        self.owner_bound = true;
        self
    }

    /// Whether [`owner`](Self::owner) was set.
    pub(crate) fn has_owner(&self) -> bool {
        self.owner_bound
    }

    /// How `tasks/cancel` ends a task (T6); default
    /// [`CancelMode::Cooperative`], as rmcp.
    pub fn cancel_mode(mut self, mode: CancelMode) -> Self {
        self.cancel_mode = mode;
        self
    }

    /// Registers a tool that is safe to run again, under `tool` (its name
    /// in `tools/call`): [`DurableTasks::spawn_takeover`] creates its tasks
    /// so that they outlive their instance, and the runtime claims and runs
    /// such tasks (its own, those of lapsed instances, those queued for
    /// workers) with `handler`. What "safe to run again" asks of the handler
    /// is in the [module docs](crate::tasks).
    pub fn takeover(
        mut self,
        tool: impl Into<String>,
        handler: impl Fn(DurableTaskContext, TakeoverCall) -> TaskFuture + Send + Sync + 'static,
    ) -> Self {
        self.takeover.insert(tool.into(), Arc::new(handler));
        self
    }

    /// The tasks of `runtime`: with takeover tools, the runtime's takeover
    /// runner runs them from now on, as long as a clone of the result
    /// lives.
    pub fn build(self, runtime: &Runtime) -> DurableTasks {
        if !self.owner_bound {
            tracing::warn!(
                "durable tasks without an owner: every task is Owner::Anonymous and its id is \
                 the only credential; bind tasks to your authentication with \
                 DurableTasksBuilder::owner"
            );
        }
        let handlers = Arc::new(self.takeover);
        let takeovers = (!handlers.is_empty())
            .then(|| runtime.run_takeovers(Arc::new(Handlers(handlers.clone()))));
        DurableTasks {
            inner: Arc::new(Inner {
                runtime: runtime.clone(),
                owner: self.owner,
                cancel_mode: self.cancel_mode,
                handlers,
                _takeovers: takeovers,
            }),
        }
    }
}

struct Inner {
    runtime: Runtime,
    owner: Arc<OwnerFn>,
    cancel_mode: CancelMode,
    /// The tools safe to run again, by name.
    handlers: Arc<HashMap<String, Arc<TakeoverHandler>>>,
    /// The runtime's takeover runner, while these tasks live.
    _takeovers: Option<Takeovers>,
}

/// Durable tasks for an rmcp server; see the [module docs](crate::tasks).
///
/// Cheap to clone; clones share the runtime and its takeover runner, which
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct DurableTasks {
    inner: Arc<Inner>,
}

impl fmt::Debug for DurableTasks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableTasks")
            .field("runtime", &self.inner.runtime)
            .field("cancel_mode", &self.inner.cancel_mode)
            .finish_non_exhaustive()
    }
}

/// The registered handlers as the runtime's executor: each claimed task
/// runs the handler its stored call names.
struct Handlers(Arc<HashMap<String, Arc<TakeoverHandler>>>);

impl Executor for Handlers {
    fn run(&self, run: TaskRun) -> BoxFuture<'static, Outcome> {
        let fail = |message: String| -> BoxFuture<'static, Outcome> {
            tracing::warn!(task = ?run.digest(), %message, "cannot run a claimed task");
            Box::pin(std::future::ready(Outcome::Failed(internal_error(
                &message,
            ))))
        };
        let call = match run.call().map_err(|e| e.to_string()) {
            Ok(call) => match TakeoverCall::try_from(call) {
                Ok(call) => call,
                Err(message) => return fail(message),
            },
            Err(message) => return fail(message),
        };
        let Some(handler) = self.0.get(&call.tool).cloned() else {
            return fail(format!(
                "the runtime that took the task over has no takeover tool named {:?}",
                call.tool
            ));
        };
        let operation = handler(DurableTaskContext::new(run), call);
        Box::pin(async move { outcome(operation.await) })
    }
}

/// How an rmcp operation's end is stored.
fn outcome(ended: Result<CallToolResult, TaskExit>) -> Outcome {
    match ended {
        Ok(result) => match serde_json::to_vec(&result) {
            Ok(bytes) => Outcome::Completed(bytes),
            Err(e) => Outcome::Failed(internal_error(&e.to_string())),
        },
        Err(TaskExit::Cancelled) => Outcome::Cancelled,
        Err(TaskExit::Error(error)) => Outcome::Failed(error_bytes(&error)),
    }
}

impl DurableTasks {
    /// Starts building the tasks of a runtime.
    pub fn builder() -> DurableTasksBuilder {
        DurableTasksBuilder {
            owner: Arc::new(|_| Owner::Anonymous),
            owner_bound: false,
            cancel_mode: CancelMode::default(),
            takeover: HashMap::new(),
        }
    }

    /// The runtime running these tasks.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The instance this runtime runs tasks as now (T11).
    pub fn instance(&self) -> InstanceId {
        self.inner.runtime.instance()
    }

    /// Whether `tool` was registered with [`DurableTasksBuilder::takeover`].
    pub fn is_takeover(&self, tool: &str) -> bool {
        self.inner.handlers.contains_key(tool)
    }

    /// Whether tasks to be taken over are queued for workers (the
    /// runtime's `hand_off_to_workers`).
    pub fn hands_off(&self) -> bool {
        self.inner.runtime.hands_off()
    }

    /// Materializes a task for the request in `ctx` (`tools/call`): -32021
    /// if the request did not declare the tasks extension (nothing is
    /// written), else the task is created durably (T1) and `operation` runs
    /// on its own tokio task, outside the request's cancellation token.
    /// Return the result as `CallToolResponse::Task`.
    ///
    /// `options.ttl_ms` is the task's ttl (`None`: `null`, capped by the
    /// store's `max_task_age`), `poll_interval_ms` and `status_message` its
    /// first values.
    ///
    /// The task dies with this instance; for one that another runtime
    /// takes over, see [`spawn_takeover`](Self::spawn_takeover).
    pub async fn spawn<F>(
        &self,
        ctx: &RequestContext<RoleServer>,
        options: TaskOptions,
        operation: F,
    ) -> Result<CreateTaskResult, ErrorData>
    where
        F: FnOnce(DurableTaskContext) -> TaskFuture + Send + 'static,
    {
        require_tasks(ctx)?;
        let owner = (self.inner.owner)(ctx);
        let new = with_options(NewTask::new(&owner, self.instance()), &options);
        let (id, record, run) = self
            .inner
            .runtime
            .create(new)
            .await
            .map_err(|e| store_error("create", e))?;
        let task = to_task(&id.to_string(), &record);
        let context = DurableTaskContext::new(run.clone());
        let span = run.span();
        tokio::spawn(
            run.drive(async move { outcome(operation(context).await) })
                .instrument(span),
        );
        Ok(CreateTaskResult::new(task))
    }

    /// Materializes a task for `call`, a tool registered with
    /// [`DurableTasksBuilder::takeover`], that may outlive this instance
    /// (T16): the call (tool and arguments) is stored with the task, which
    /// runs here at once, or, when the runtime hands off to workers, waits
    /// for a worker to claim it. When the instance running it dies, another
    /// runtime with the tool claims it and runs the handler again, up to
    /// the runtime's `max_attempts` runs.
    ///
    /// -32021 as [`spawn`](Self::spawn) when the request did not declare
    /// the tasks extension; -32602 (nothing written) when the tool is not
    /// registered here and tasks are not handed off.
    pub async fn spawn_takeover(
        &self,
        ctx: &RequestContext<RoleServer>,
        options: TaskOptions,
        call: TakeoverCall,
    ) -> Result<CreateTaskResult, ErrorData> {
        require_tasks(ctx)?;
        let runtime = &self.inner.runtime;
        let handler = self.inner.handlers.get(&call.tool).cloned();
        if handler.is_none() && !runtime.hands_off() {
            return Err(ErrorData::invalid_params(
                format!("no takeover tool named {:?}", call.tool),
                None,
            ));
        }
        let owner = (self.inner.owner)(ctx);
        let new = runtime.for_takeover(NewTask::new(&owner, self.instance()));
        let (id, record, run) = runtime
            .create_call(with_options(new, &options), &TaskCall::from(call.clone()))
            .await
            .map_err(|e| match e {
                Error::PayloadTooLarge { size, max } => ErrorData::invalid_params(
                    format!("the call's arguments are {size} bytes, the limit is {max}"),
                    None,
                ),
                e => store_error("create", e),
            })?;
        if let (Some(handler), false) = (handler, runtime.hands_off()) {
            let operation = handler(DurableTaskContext::new(run.clone()), call);
            let span = run.span();
            tokio::spawn(
                run.drive(async move { outcome(operation.await) })
                    .instrument(span),
            );
        }
        Ok(CreateTaskResult::new(to_task(&id.to_string(), &record)))
    }

    /// `tasks/get`: the task as the caller's owner sees it; -32602 when it
    /// is unknown or another owner's.
    pub async fn get_task(
        &self,
        ctx: &RequestContext<RoleServer>,
        params: GetTaskParams,
    ) -> Result<GetTaskResult, ErrorData> {
        let owner = (self.inner.owner)(ctx);
        let record = self
            .inner
            .runtime
            .store()
            .get(&params.task_id, &owner)
            .await
            .map_err(|e| store_error("get", e))?
            .ok_or_else(|| unknown_task(&params.task_id))?;
        Ok(GetTaskResult::new(to_detailed(&params.task_id, &record)?))
    }

    /// `tasks/update`: records the client's `inputResponses`; keys not
    /// outstanding are ignored (SEP-2663). -32602 when the task is unknown,
    /// another owner's, or a response is over 1 MiB.
    pub async fn update_task(
        &self,
        ctx: &RequestContext<RoleServer>,
        params: UpdateTaskParams,
    ) -> Result<(), ErrorData> {
        let owner = (self.inner.owner)(ctx);
        let encoded = params
            .input_responses
            .iter()
            .map(|(key, value)| {
                serde_json::to_vec(value)
                    .map(|bytes| (key.as_str(), bytes))
                    .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let responses: Vec<(&str, &[u8])> = encoded
            .iter()
            .map(|(key, bytes)| (*key, bytes.as_slice()))
            .collect();
        let store = self.inner.runtime.store();
        match store.answer(&params.task_id, &owner, &responses).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(unknown_task(&params.task_id)),
            Err(Error::PayloadTooLarge { size, max }) => Err(ErrorData::invalid_params(
                format!("an input response is {size} bytes, the limit is {max}"),
                None,
            )),
            Err(e) => Err(store_error("answer", e)),
        }
    }

    /// `tasks/cancel`: records the cancel request (T6), as the builder's
    /// [`CancelMode`] says; -32602 when the task is unknown or another
    /// owner's. On a terminal task, an acknowledgement with no change.
    pub async fn cancel_task(
        &self,
        ctx: &RequestContext<RoleServer>,
        params: CancelTaskParams,
    ) -> Result<(), ErrorData> {
        let owner = (self.inner.owner)(ctx);
        self.inner
            .runtime
            .store()
            .request_cancel(&params.task_id, &owner, self.inner.cancel_mode, None)
            .await
            .map_err(|e| store_error("request_cancel", e))?
            .map(drop)
            .ok_or_else(|| unknown_task(&params.task_id))
    }
}

/// -32021 unless the request declared the tasks extension.
fn require_tasks(ctx: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
    if ctx
        .client_capabilities()
        .is_some_and(|caps| caps.supports_tasks())
    {
        Ok(())
    } else {
        Err(ErrorData::missing_required_client_capability(
            ClientCapabilities::builder().enable_tasks().build(),
        ))
    }
}

/// `new` with the ttl, poll interval and status message a `tools/call`
/// asked for.
fn with_options<'a>(mut new: NewTask<'a>, options: &'a TaskOptions) -> NewTask<'a> {
    new.ttl = options.ttl_ms.map(Duration::from_millis);
    new.poll_interval = options.poll_interval_ms.map(Duration::from_millis);
    new.message = options.status_message.as_deref();
    new
}

fn error_bytes(error: &ErrorData) -> Vec<u8> {
    serde_json::to_vec(error).unwrap_or_else(|_| internal_error("task failed"))
}

/// What a task's operation is given: rmcp's `TaskContext` methods, over the
/// store, so they work whichever instance serves the client; for a task
/// that may be taken over, its checkpoint and attempt too.
#[derive(Clone)]
pub struct DurableTaskContext {
    run: TaskRun,
    /// The id, when this runtime created the task (a claim knows only the
    /// digest: ids are never stored).
    id: Option<String>,
}

impl fmt::Debug for DurableTaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableTaskContext")
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

impl DurableTaskContext {
    fn new(run: TaskRun) -> Self {
        let id = run.id().map(ToString::to_string);
        Self { run, id }
    }

    /// The id of this task, when this runtime created it; `None` in a run
    /// claimed from the store (a takeover, a worker's run), which knows
    /// the task only by its digest ([`task_digest`](Self::task_digest)):
    /// the id is the client's credential and is never stored.
    pub fn task_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The digest the store keys this task by: the same on every runtime
    /// that runs it, and safe to log (it gives no way to the id).
    pub fn task_digest(&self) -> TaskDigest {
        self.run.digest()
    }

    /// Which run of the task this is, from 1: one more after each takeover
    /// of a lapsed instance's run (runs given back for input do not
    /// count). Always 1 for a task that may not be taken over.
    pub fn attempt(&self) -> u32 {
        self.run.attempt()
    }

    /// Whether this is a run of a task that may be taken over
    /// ([`DurableTasks::spawn_takeover`] or a claim).
    pub fn is_takeover(&self) -> bool {
        self.run.is_takeover()
    }

    /// The newest checkpoint saved before this run began
    /// ([`checkpoint`](Self::checkpoint)), from which it may resume; `None`
    /// on a first run, or when no run saved one.
    pub fn last_checkpoint(&self) -> Option<&[u8]> {
        self.run.last_checkpoint()
    }

    /// Saves the operation's progress (T19), at most
    /// `MAX_CHECKPOINT_BYTES`: a run that takes the task over later starts
    /// with it as its [`last_checkpoint`](Self::last_checkpoint). An error
    /// on a task that may not be taken over. If another runtime has claimed
    /// the task since, this run is stopped: the operation is aborted (a
    /// clone of this context used outside it gets an error).
    pub async fn checkpoint(&self, checkpoint: impl AsRef<[u8]>) -> Result<(), ErrorData> {
        if !self.is_takeover() {
            return Err(ErrorData::internal_error(
                "checkpoints are for tasks that may be taken over (DurableTasks::spawn_takeover)",
                None,
            ));
        }
        match self.run.checkpoint(checkpoint.as_ref()).await {
            Ok(Applied::Changed { .. }) => Ok(()),
            Ok(other) => Err(ErrorData::internal_error(
                format!("cannot save the checkpoint: {other:?}"),
                None,
            )),
            Err(Error::PayloadTooLarge { size, max }) => Err(ErrorData::internal_error(
                format!("the checkpoint is {size} bytes, the limit is {max}"),
                None,
            )),
            Err(e) => Err(store_error("checkpoint", e)),
        }
    }

    /// Asks the client for input under `key` (the task becomes
    /// `input_required`) and waits for its `tasks/update` response, which
    /// may come through any instance. Keys are spent once used.
    ///
    /// In a task that may be taken over, a key answered before (in an
    /// earlier run) returns its answer at once, without asking again.
    /// Otherwise the request is stored and the task given back: this run
    /// stops here (the operation is aborted), no runtime is occupied while
    /// the client thinks, and once the client answers, a runtime claims the
    /// task and runs the operation again, this call then returning the
    /// answer.
    ///
    /// [`TaskExit::Cancelled`] when the client cancels first (the request is
    /// superseded); [`TaskExit::Error`] when the key was used before, the
    /// task ended (expired, lost) or the store fails.
    pub async fn request_input(
        &self,
        key: impl Into<String>,
        request: InputRequest,
    ) -> Result<Value, TaskExit> {
        let key = key.into();
        if let Some(answer) = self.run.answer(&key) {
            return serde_json::from_slice(answer)
                .map_err(|e| internal(format!("stored answer is not JSON: {e}")));
        }
        let bytes = serde_json::to_vec(&request).map_err(|e| internal(e.to_string()))?;
        let change = WorkerChange::RequestInput {
            key: &key,
            request: &bytes,
        };
        let mut rev = match self.write(change).await? {
            Applied::Changed { rev, .. } => rev,
            Applied::CancelRequested => return Err(TaskExit::Cancelled),
            Applied::KeySpent => {
                return Err(internal(format!(
                    "inputRequests key {key:?} was already used for this task"
                )));
            }
            other => return Err(internal(format!("cannot request input: {other:?}"))),
        };
        if self.is_takeover() {
            // Given back: answered, it is claimable, and the run that claims
            // it finds the answer among its answers (answers are never
            // taken).
            return match self.run.release().await {
                Ok(Applied::Changed { .. }) => Err(internal(format!(
                    "the task waits for input {key:?}; it runs again once answered"
                ))),
                other => Err(internal(format!(
                    "cannot give the task back while it waits for input: {other:?}"
                ))),
            };
        }
        loop {
            let record = self
                .run
                .watch(rev)
                .await
                .map_err(|e| internal(e.to_string()))?
                .ok_or_else(|| internal("the task no longer exists".into()))?;
            if record.answered.contains(&key) {
                match self.write(WorkerChange::TakeAnswer { key: &key }).await? {
                    Applied::Changed {
                        answer: Some(answer),
                        ..
                    } => {
                        return serde_json::from_slice(&answer)
                            .map_err(|e| internal(format!("stored answer is not JSON: {e}")));
                    }
                    Applied::Changed { answer: None, .. } => {}
                    other => return Err(internal(format!("cannot take the answer: {other:?}"))),
                }
            }
            if record.status.is_terminal() {
                return Err(internal(format!(
                    "the task already ended as {}",
                    record.status
                )));
            }
            if record.cancel_requested && !record.outstanding.iter().any(|(k, _)| *k == key) {
                return Err(TaskExit::Cancelled);
            }
            rev = record.rev;
        }
    }

    /// One write of the operation's, as a [`TaskExit`] on a store error.
    async fn write(&self, change: WorkerChange<'_>) -> Result<Applied, TaskExit> {
        self.run
            .write(change)
            .await
            .map_err(|e| internal(e.to_string()))
    }

    /// Replaces the task's status message (at most 4 KiB).
    pub async fn set_status_message(&self, message: impl Into<String>) -> Result<(), ErrorData> {
        let message = message.into();
        match self
            .run
            .write(WorkerChange::SetMessage(Some(&message)))
            .await
            .map_err(|e| store_error("set_message", e))?
        {
            Applied::Changed { .. } => Ok(()),
            other => Err(ErrorData::internal_error(
                format!("cannot set the status message: {other:?}"),
                None,
            )),
        }
    }

    /// `true` once the client asked to cancel, or the task already ended
    /// or is gone (expired, lost, purged): either way the work is moot. A
    /// failed read counts as no request. In a task that another runtime
    /// has claimed since, this run is stopped (and `true`).
    pub async fn is_cancel_requested(&self) -> bool {
        self.run.is_cancel_requested().await
    }

    /// Resolves once the client asks to cancel (at once if it has), or the
    /// task ends or is gone. Pair it with `tokio::select!`; an operation
    /// that stops should return [`TaskExit::Cancelled`]. In a task that may
    /// be taken over, a newer claim seen while waiting stops this run (and
    /// this resolves).
    pub async fn cancelled(&self) {
        self.run.cancelled().await;
    }
}

fn internal(message: String) -> TaskExit {
    TaskExit::Error(ErrorData::internal_error(message, None))
}

fn store_error(operation: &str, error: Error) -> ErrorData {
    tracing::warn!(operation, %error, "task store failed");
    ErrorData::internal_error(format!("task store {operation} failed: {error}"), None)
}

fn unknown_task(id: &str) -> ErrorData {
    ErrorData::invalid_params(format!("unknown task: {id}"), None)
}

fn to_status(status: TaskStatus) -> rmcp::model::TaskStatus {
    match status {
        TaskStatus::Working => rmcp::model::TaskStatus::Working,
        TaskStatus::InputRequired => rmcp::model::TaskStatus::InputRequired,
        TaskStatus::Completed => rmcp::model::TaskStatus::Completed,
        TaskStatus::Failed => rmcp::model::TaskStatus::Failed,
        TaskStatus::Cancelled => rmcp::model::TaskStatus::Cancelled,
    }
}

fn to_task(id: &str, record: &TaskRecord) -> Task {
    let mut task = Task::new(
        id,
        to_status(record.status),
        iso8601(record.created_at),
        iso8601(record.updated_at),
    );
    if let Some(message) = status_message(record) {
        task = task.with_status_message(message);
    }
    if let Some(ttl) = record.ttl_ms {
        task = task.with_ttl_ms(ttl);
    }
    if let Some(poll) = record.poll_interval_ms {
        task = task.with_poll_interval_ms(poll);
    }
    task
}

fn to_detailed(id: &str, record: &TaskRecord) -> Result<DetailedTask, ErrorData> {
    let payload = match record.status {
        TaskStatus::Working => TaskPayload::Working,
        TaskStatus::Cancelled => TaskPayload::Cancelled,
        TaskStatus::InputRequired => {
            let mut input_requests = InputRequests::new();
            for (key, bytes) in &record.outstanding {
                let request = serde_json::from_slice(bytes).map_err(|e| unreadable(id, e))?;
                input_requests.insert(key.clone(), request);
            }
            TaskPayload::InputRequired { input_requests }
        }
        TaskStatus::Completed => TaskPayload::Completed {
            result: object(id, record)?,
        },
        TaskStatus::Failed => TaskPayload::Failed {
            error: object(id, record)?,
        },
    };
    Ok(DetailedTask::new(to_task(id, record), payload))
}

/// The outcome bytes as the JSON object rmcp wants (rmcp has no raw form).
fn object(id: &str, record: &TaskRecord) -> Result<JsonObject, ErrorData> {
    let bytes = record.outcome.as_deref().unwrap_or(b"{}");
    serde_json::from_slice(bytes).map_err(|e| unreadable(id, e))
}

fn unreadable(id: &str, error: serde_json::Error) -> ErrorData {
    tracing::warn!(task = id, %error, "stored task payload is not a JSON object");
    ErrorData::internal_error(format!("stored task state is unreadable: {error}"), None)
}

#[cfg(test)]
mod tests;
