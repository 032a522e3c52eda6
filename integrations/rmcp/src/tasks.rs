//! Durable tasks (SEP-2663) for rmcp servers: [`DurableTasks`], an async
//! twin of rmcp's in-process `TaskManager` whose state lives in a shared
//! [`TaskStore`].
//!
//! rmcp's dispatch never calls a task manager; the handler does, from
//! `call_tool`, `get_task`, `update_task` and `cancel_task`. So does this
//! one. Build it once, clone it into every handler (a clone is one `Arc`):
//!
//! ```no_run
//! # async fn demo() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use mcp_event_store_rmcp::{DurableTaskContext, DurableTasks};
//! use mcp_event_store_core::task::{MemoryTaskStore, Owner};
//! use rmcp::model::{CallToolResult, ContentBlock};
//! use mcp_event_store_rmcp::tasks::TaskOptions; // rmcp's, re-exported
//!
//! let tasks = DurableTasks::builder(Arc::new(MemoryTaskStore::new()))
//!     // Who may see a task: usually the authenticated principal, read
//!     // from `ctx.extensions.get::<http::request::Parts>()`.
//!     .owner(|_ctx| Owner::Anonymous)
//!     .build()
//!     .await?;
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
//!   before returning `CreateTaskResult` (T1), and runs the operation under
//!   `tokio::spawn`, outside the request's cancellation token.
//! * The operation gets a [`DurableTaskContext`] with rmcp's method names,
//!   built on [`TaskStore::apply`] and [`TaskStore::watch`]: its input
//!   requests, answers and cancel requests go through the store, so any
//!   instance sharing it can serve `tasks/get`, `tasks/update` and
//!   `tasks/cancel`.
//! * The operation's end is stored as the outcome: a `CallToolResult` as
//!   `completed`, [`TaskExit::Error`] as `failed`, [`TaskExit::Cancelled`] as
//!   `cancelled`, a panic or an outcome over the store's limit as `failed`
//!   with -32603, so a task never stays `working` because its operation went
//!   wrong.
//! * The instance heartbeats, one write per instance every 10 s with a 30 s
//!   lease (T11), for as long as a clone of the [`DurableTasks`] lives. When
//!   the process dies, its tasks read `failed` ("server instance lost") once
//!   the lease runs out.
//! * Each instance runs [`TaskStore::purge_expired_tasks`] every minute
//!   ([`DurableTasksBuilder::purge_every`]), so expired and orphaned tasks
//!   are written back as `failed` and deleted after their grace.
//! * `get_task`, `update_task` and `cancel_task` answer an unknown id, or a
//!   task of another owner, with -32602 (SEP-2663: invalid or nonexistent
//!   `taskId`).
//!
//! Durable state is not durable execution: a task made by
//! [`spawn`](DurableTasks::spawn) dies with its process (it reads `failed`,
//! "server instance lost", once the lease lapses); nothing resumes it.
//!
//! # Resumable tools: tasks that outlive their instance
//!
//! A tool registered with [`DurableTasksBuilder::resumable`] and called
//! through [`DurableTasks::spawn_resumable`] makes a task that may be taken
//! over (T16 to T19). The call (tool name and arguments, as JSON) is stored
//! with the task, which runs here at once, or, with
//! [`hand_off_to_workers`](DurableTasksBuilder::hand_off_to_workers), waits
//! for a worker. Every runtime with resumable tools (that does not hand
//! them off) claims waiting tasks ([`TaskStore::claim`]) every
//! [`claim_every`](DurableTasksBuilder::claim_every), running at most
//! [`max_running`](DurableTasksBuilder::max_running) at once: tasks queued for workers, tasks given back for input and since
//! answered, and tasks whose instance lapsed with runs left. A worker is
//! such a runtime in a process that serves no HTTP at all.
//!
//! What is guaranteed:
//!
//! * **At least once, with fencing.** A task runs to an end as long as
//!   some runtime with its tool lives and it has runs left
//!   ([`max_attempts`](DurableTasksBuilder::max_attempts), default 3;
//!   after the last run's instance lapses it reads `failed`, "server
//!   instance lost"). A run whose instance lapsed (killed, or stalled past
//!   its lease) may be running still when another runtime claims the task;
//!   every write names its claim ([`TaskStore::apply_claimed`]), so the
//!   stale run's next write (a status message, a checkpoint, an input
//!   request, its outcome) is refused ([`Applied::Fenced`]) and the run is
//!   aborted there, and a newer claim seen by
//!   [`cancelled`](DurableTaskContext::cancelled) or
//!   [`is_cancel_requested`](DurableTaskContext::is_cancel_requested)
//!   stops it too. Exactly one outcome is stored: the current claim's.
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
//! * **Inputs.** In a resumable task, [`request_input`](DurableTaskContext::request_input)
//!   stores the request and gives the task back: the run stops there, so
//!   no runtime is occupied while the client thinks. Once answered (through
//!   any instance), a runtime claims the task and runs the handler again
//!   from its last checkpoint; its `request_input` for a key answered
//!   before returns the answer at once. Answers are kept with the task for
//!   every later run, so the handler asks the same keys in the same way
//!   on every run, and code before the input request runs again.
//! * **Cancel.** A cancel requested while the task waits for a claim is
//!   honoured by the runtime that claims it: the task ends `cancelled`
//!   without running the tool. While a run runs, cancellation is as for
//!   any task (cooperative or immediate, [`CancelMode`]).
//! * **Ids.** A runtime that claims a task knows only its digest (task ids
//!   are bearer credentials and never stored), so
//!   [`task_id`](DurableTaskContext::task_id) is `None` in a claimed run.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CancelTaskParams, ClientCapabilities, CreateTaskResult, DetailedTask,
    GetTaskParams, GetTaskResult, InputRequest, InputRequests, JsonObject, Task, TaskPayload,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
pub use rmcp::task_manager::{TaskExit, TaskFuture, TaskOptions};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;

use mcp_event_store_core::Error;
pub use mcp_event_store_core::task::DEFAULT_MAX_ATTEMPTS;
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, Finish, InstanceId, NewTask, Owner, Rev, TaskDigest, TaskId,
    TaskRecord, TaskStatus, TaskStore, Worker, WorkerChange,
};

/// How often an instance renews its heartbeat by default (T11).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);
/// How long a heartbeat keeps an instance alive by default (T11).
pub const DEFAULT_HEARTBEAT_LEASE: Duration = Duration::from_secs(30);
/// The longest a worker waits on one [`TaskStore::watch`] by default: it
/// bounds how long an operation keeps waiting on a task that already reads
/// expired or lost, which wake no one.
pub const DEFAULT_WATCH_WAIT: Duration = Duration::from_secs(5);
/// How often an instance runs [`TaskStore::purge_expired_tasks`] by
/// default: expired and orphaned tasks are written back as `failed`, and
/// tasks past their grace deleted, in bounded steps.
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// How often a runtime with resumable tools looks for tasks to claim by
/// default ([`DurableTasksBuilder::claim_every`]).
pub const DEFAULT_CLAIM_INTERVAL: Duration = Duration::from_secs(1);
/// How many claimed tasks one runtime runs at once by default
/// ([`DurableTasksBuilder::max_running`]).
pub const DEFAULT_MAX_RUNNING: usize = 16;

type OwnerFn = dyn Fn(&RequestContext<RoleServer>) -> Owner + Send + Sync;

/// A resumable tool's handler ([`DurableTasksBuilder::resumable`]): given
/// the task's context and the call to run, the operation. It may run more
/// than once for one task (see the [module docs](crate::tasks)).
pub type ResumableHandler = dyn Fn(DurableTaskContext, ResumableCall) -> TaskFuture + Send + Sync;

/// The request a resumable task runs: the tool's name and its arguments,
/// kept with the task (its context, T13) so that whichever runtime claims
/// the task can run it again.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ResumableCall {
    /// The tool's name, as registered with [`DurableTasksBuilder::resumable`].
    pub tool: String,
    /// The call's arguments.
    pub arguments: Option<JsonObject>,
}

impl ResumableCall {
    /// The call of `tool` with `arguments`.
    pub fn new(tool: impl Into<String>, arguments: Option<JsonObject>) -> Self {
        Self {
            tool: tool.into(),
            arguments,
        }
    }

    /// The context bytes stored with the task: `{"tool":..,"arguments":..}`.
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// The call a task's context holds.
    fn decode(context: Option<&[u8]>) -> Result<Self, String> {
        let context = context.ok_or("the task has no context to run it from")?;
        serde_json::from_slice(context).map_err(|e| format!("the task's context is no call: {e}"))
    }
}

impl From<&CallToolRequestParams> for ResumableCall {
    fn from(request: &CallToolRequestParams) -> Self {
        Self::new(request.name.clone(), request.arguments.clone())
    }
}

/// Builds a [`DurableTasks`]; see [`DurableTasks::builder`].
pub struct DurableTasksBuilder {
    store: Arc<dyn TaskStore>,
    owner: Arc<OwnerFn>,
    /// Whether [`owner`](Self::owner) was called; if not, `build` warns.
    owner_bound: bool,
    cancel_mode: CancelMode,
    heartbeat_interval: Duration,
    lease: Duration,
    watch_wait: Duration,
    purge_interval: Option<Duration>,
    resumable: HashMap<String, Arc<ResumableHandler>>,
    max_attempts: u32,
    hand_off: bool,
    claim_interval: Duration,
    max_running: usize,
}

impl fmt::Debug for DurableTasksBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<_> = self.resumable.keys().collect();
        tools.sort();
        f.debug_struct("DurableTasksBuilder")
            .field("cancel_mode", &self.cancel_mode)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("lease", &self.lease)
            .field("watch_wait", &self.watch_wait)
            .field("purge_interval", &self.purge_interval)
            .field("resumable", &tools)
            .field("max_attempts", &self.max_attempts)
            .field("hand_off", &self.hand_off)
            .field("claim_interval", &self.claim_interval)
            .field("max_running", &self.max_running)
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

    /// How `tasks/cancel` ends a task (T6); default
    /// [`CancelMode::Cooperative`], as rmcp.
    pub fn cancel_mode(mut self, mode: CancelMode) -> Self {
        self.cancel_mode = mode;
        self
    }

    /// How often the instance renews its heartbeat and for how long each
    /// renewal keeps it alive; default 10 s and 30 s. The lease must be
    /// longer than the interval.
    pub fn heartbeat(mut self, interval: Duration, lease: Duration) -> Self {
        self.heartbeat_interval = interval;
        self.lease = lease;
        self
    }

    /// The longest a worker waits on one `watch` before it reads the task
    /// again; default [`DEFAULT_WATCH_WAIT`].
    pub fn watch_wait(mut self, wait: Duration) -> Self {
        self.watch_wait = wait;
        self
    }

    /// How often this instance purges the store's tasks
    /// ([`TaskStore::purge_expired_tasks`]); default
    /// [`DEFAULT_PURGE_INTERVAL`], the first run one interval after
    /// [`build`](Self::build). `None` leaves purging to someone else (another
    /// instance, or an operator's `mcp-event-store purge`); until someone
    /// purges, expired tasks still read `failed` but keep their space.
    pub fn purge_every(mut self, interval: Option<Duration>) -> Self {
        self.purge_interval = interval;
        self
    }

    /// Registers a tool that is safe to run again, under `tool` (its name
    /// in `tools/call`): [`DurableTasks::spawn_resumable`] creates its tasks
    /// so that they outlive their instance, and this runtime claims and
    /// runs such tasks (its own, those of lapsed instances, those queued
    /// for workers) with `handler`. What "safe to run again" asks of the
    /// handler is in the [module docs](crate::tasks).
    pub fn resumable(
        mut self,
        tool: impl Into<String>,
        handler: impl Fn(DurableTaskContext, ResumableCall) -> TaskFuture + Send + Sync + 'static,
    ) -> Self {
        self.resumable.insert(tool.into(), Arc::new(handler));
        self
    }

    /// The most runs a resumable task gets (T16): when the instance running
    /// it lapses, another claims it and runs it again, up to this many runs
    /// in all; then it reads `failed` ("server instance lost"). Default
    /// [`DEFAULT_MAX_ATTEMPTS`]; at least 1. Runs given back for input do
    /// not count.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Creates resumable tasks queued for workers instead of running them
    /// here ([`NewTask::queued`]), and claims nothing: this runtime is a
    /// front end (it answers `tasks/*`), and a runtime with the tools
    /// registered and without this flag, a worker process for instance,
    /// runs them. A tool handed off need not be registered here.
    pub fn hand_off_to_workers(mut self) -> Self {
        self.hand_off = true;
        self
    }

    /// How often this runtime looks for tasks to claim, when it has
    /// resumable tools and does not hand them off; default
    /// [`DEFAULT_CLAIM_INTERVAL`].
    pub fn claim_every(mut self, interval: Duration) -> Self {
        self.claim_interval = interval;
        self
    }

    /// How many claimed tasks this runtime runs at once; default
    /// [`DEFAULT_MAX_RUNNING`], at least 1. Tasks created and run here by
    /// [`DurableTasks::spawn_resumable`] are not counted: the requests that
    /// create them bound them.
    pub fn max_running(mut self, tasks: usize) -> Self {
        self.max_running = tasks;
        self
    }

    /// Registers the instance (its first heartbeat) and starts renewing it,
    /// purging, and (with resumable tools) claiming. Needs a tokio runtime.
    pub async fn build(self) -> mcp_event_store_core::Result<DurableTasks> {
        let purge_interval = self.purge_interval;
        let heartbeat_interval = self.heartbeat_interval;
        let tasks = self.build_maintained_elsewhere().await?;
        let inner = &tasks.inner;
        let mut background = vec![tokio::spawn(heartbeat(
            Arc::downgrade(inner),
            heartbeat_interval,
        ))];
        if let Some(every) = purge_interval {
            background.push(tokio::spawn(purge(Arc::downgrade(inner), every)));
        }
        lock(&inner.background).extend(background);
        Ok(tasks)
    }

    /// Registers the instance and builds the runtime without its own
    /// heartbeat and purge loops: [`crate::Durable`]'s one maintenance loop
    /// calls [`DurableTasks::beat`] instead.
    pub(crate) async fn build_maintained_elsewhere(
        self,
    ) -> mcp_event_store_core::Result<DurableTasks> {
        if self.lease <= self.heartbeat_interval || self.heartbeat_interval.is_zero() {
            return Err(Error::Config(format!(
                "the heartbeat lease ({:?}) must be longer than its interval ({:?}), which must not be zero",
                self.lease, self.heartbeat_interval
            )));
        }
        if self.purge_interval.is_some_and(|every| every.is_zero()) {
            return Err(Error::Config(
                "the task purge interval must not be zero (None turns purging off)".into(),
            ));
        }
        if self.max_attempts == 0 || self.max_running == 0 || self.claim_interval.is_zero() {
            return Err(Error::Config(format!(
                "resumable tasks need at least one attempt ({}), one running task ({}) and a \
                 claim interval above zero ({:?})",
                self.max_attempts, self.max_running, self.claim_interval
            )));
        }
        if !self.owner_bound {
            tracing::warn!(
                "durable tasks without an owner: every task is Owner::Anonymous and its id is \
                 the only credential; bind tasks to your authentication with \
                 DurableTasksBuilder::owner"
            );
        }
        let instance = register(&*self.store, self.lease).await?;
        let inner = Arc::new(Inner {
            store: self.store,
            owner: self.owner,
            cancel_mode: self.cancel_mode,
            lease: self.lease,
            watch_wait: self.watch_wait,
            instance: Mutex::new(instance),
            registering: tokio::sync::Mutex::new(()),
            background: Mutex::new(Vec::new()),
            resumable: self.resumable,
            max_attempts: self.max_attempts,
            hand_off: self.hand_off,
            running: Arc::new(Semaphore::new(self.max_running)),
            max_running: self.max_running,
            claiming: tokio::sync::Mutex::new(()),
        });
        if inner.claims() {
            let claims = tokio::spawn(claim_loop(Arc::downgrade(&inner), self.claim_interval));
            lock(&inner.background).push(claims);
        }
        Ok(DurableTasks { inner })
    }
}

/// Registers a fresh instance id (T11); a lapsed id is never revived.
async fn register(
    store: &dyn TaskStore,
    lease: Duration,
) -> mcp_event_store_core::Result<InstanceId> {
    for _ in 0..8 {
        let id = InstanceId::generate()?;
        if store.heartbeat(id, lease).await? {
            return Ok(id);
        }
    }
    Err(Error::Corrupt(
        "eight fresh instance ids in a row were refused".into(),
    ))
}

/// Renews the instance every `interval` while a [`DurableTasks`] lives.
async fn heartbeat(inner: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        inner.beat().await;
    }
}

/// Claims tasks every `interval` while a [`DurableTasks`] lives.
async fn claim_loop(inner: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        Inner::claim_now(&inner).await;
    }
}

/// Purges the store's tasks every `interval` while a [`DurableTasks`]
/// lives. A failed purge is logged and tried again next time: what it would
/// have written, reads already show.
async fn purge(inner: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        match inner.store.purge_expired_tasks().await {
            Ok(report) => tracing::debug!(?report, "task purge"),
            Err(error) => tracing::warn!(%error, "task purge failed"),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Inner {
    store: Arc<dyn TaskStore>,
    owner: Arc<OwnerFn>,
    cancel_mode: CancelMode,
    lease: Duration,
    watch_wait: Duration,
    instance: Mutex<InstanceId>,
    /// Held while a lapsed instance is replaced, so that the calls that
    /// find it lapsed at once register one new instance between them.
    registering: tokio::sync::Mutex<()>,
    /// The heartbeat, purge and claim loops, stopped with the last clone.
    background: Mutex<Vec<JoinHandle<()>>>,
    /// The tools safe to run again, by name.
    resumable: HashMap<String, Arc<ResumableHandler>>,
    /// The runs a resumable task gets.
    max_attempts: u32,
    /// Resumable tasks are queued for workers, and nothing is claimed here.
    hand_off: bool,
    /// A permit per claimed task running.
    running: Arc<Semaphore>,
    max_running: usize,
    /// Held while claiming, so the claim loop and a heartbeat never claim
    /// at once.
    claiming: tokio::sync::Mutex<()>,
}

impl Inner {
    fn instance(&self) -> InstanceId {
        *lock(&self.instance)
    }

    /// One heartbeat; a lapsed instance is replaced by a fresh one. Errors
    /// are logged: the next beat tries again.
    async fn beat(&self) {
        let me = self.instance();
        match self.store.heartbeat(me, self.lease).await {
            Ok(true) => {}
            Ok(false) => {
                // We lapsed (a stall longer than the lease): our tasks
                // already read lost; new work goes under a new id.
                if let Err(error) = self.replace_lapsed(me).await {
                    tracing::warn!(%error, "task instance registration failed");
                }
            }
            Err(error) => tracing::warn!(instance = %me, %error, "task heartbeat failed"),
        }
    }

    /// Registers a fresh instance in place of `lapsed` (a lapsed id is
    /// never revived), unless another call already replaced it; the
    /// instance to work under from now on.
    async fn replace_lapsed(&self, lapsed: InstanceId) -> mcp_event_store_core::Result<InstanceId> {
        let _one_at_a_time = self.registering.lock().await;
        let current = self.instance();
        if current != lapsed {
            return Ok(current);
        }
        tracing::warn!(instance = %lapsed, "task instance lapsed; registering a new one");
        let fresh = register(&*self.store, self.lease).await?;
        *lock(&self.instance) = fresh;
        Ok(fresh)
    }

    /// Creates a task under this runtime's instance. The store refuses an
    /// instance it counts lapsed (T11: the task would read `failed` from
    /// birth), which happens when the runtime stalled longer than its
    /// lease and its heartbeat has not noticed yet: then a fresh instance
    /// is registered, and the task created under it. Returns the instance
    /// it was created under too.
    async fn create(
        &self,
        mut task: NewTask<'_>,
    ) -> mcp_event_store_core::Result<(TaskId, TaskRecord, InstanceId)> {
        task.instance = self.instance();
        for _ in 0..2 {
            match self.store.create(task).await {
                Err(Error::InstanceLapsed { .. }) => {
                    task.instance = self.replace_lapsed(task.instance).await?;
                }
                created => return created.map(|(id, record)| (id, record, task.instance)),
            }
        }
        let (id, record) = self.store.create(task).await?;
        Ok((id, record, task.instance))
    }

    /// Whether this runtime claims tasks: it has resumable tools and does
    /// not hand them off.
    fn claims(&self) -> bool {
        !self.resumable.is_empty() && !self.hand_off
    }

    /// Claims as many waiting tasks as this runtime has room for, and runs
    /// each on a task of its own. Errors are logged (the next round tries
    /// again); a lapsed instance is replaced first.
    async fn claim_now(self: &Arc<Self>) {
        if !self.claims() {
            return;
        }
        let Ok(_one_at_a_time) = self.claiming.try_lock() else {
            return;
        };
        let mut permits = Vec::new();
        while permits.len() < self.max_running {
            match self.running.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        if permits.is_empty() {
            return;
        }
        let me = self.instance();
        let claimed = match self.store.claim(me, permits.len()).await {
            Ok(claimed) => claimed,
            Err(Error::InstanceLapsed { .. }) => {
                if let Err(error) = self.replace_lapsed(me).await {
                    tracing::warn!(%error, "task instance registration failed");
                }
                return;
            }
            Err(error) => {
                tracing::warn!(instance = %me, %error, "claiming tasks failed");
                return;
            }
        };
        for (claimed, permit) in claimed.into_iter().zip(permits) {
            tokio::spawn(run_claimed(self.clone(), claimed, permit));
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for handle in lock(&self.background).drain(..) {
            handle.abort();
        }
    }
}

/// Durable tasks for an rmcp server; see the [module docs](crate::tasks).
///
/// Cheap to clone; clones share the instance and its heartbeat, which stops
/// when the last clone (and the last running operation) is dropped.
#[derive(Clone)]
pub struct DurableTasks {
    inner: Arc<Inner>,
}

impl fmt::Debug for DurableTasks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableTasks")
            .field("instance", &self.inner.instance())
            .field("cancel_mode", &self.inner.cancel_mode)
            .finish_non_exhaustive()
    }
}

impl DurableTasks {
    /// Starts building the runtime over `store`.
    pub fn builder(store: Arc<dyn TaskStore>) -> DurableTasksBuilder {
        DurableTasksBuilder {
            store,
            owner: Arc::new(|_| Owner::Anonymous),
            owner_bound: false,
            cancel_mode: CancelMode::default(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            lease: DEFAULT_HEARTBEAT_LEASE,
            watch_wait: DEFAULT_WATCH_WAIT,
            purge_interval: Some(DEFAULT_PURGE_INTERVAL),
            resumable: HashMap::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            hand_off: false,
            claim_interval: DEFAULT_CLAIM_INTERVAL,
            max_running: DEFAULT_MAX_RUNNING,
        }
    }

    /// The instance this runtime runs tasks as (T11).
    pub fn instance(&self) -> InstanceId {
        self.inner.instance()
    }

    /// Whether `tool` was registered with [`DurableTasksBuilder::resumable`].
    pub fn is_resumable(&self, tool: &str) -> bool {
        self.inner.resumable.contains_key(tool)
    }

    /// Whether resumable tasks are queued for workers
    /// ([`DurableTasksBuilder::hand_off_to_workers`]).
    pub fn hands_off(&self) -> bool {
        self.inner.hand_off
    }

    /// One heartbeat of this runtime's instance (T11), for a maintenance
    /// loop that is not the runtime's own (the claim loop runs anyway).
    pub(crate) async fn beat(&self) {
        self.inner.beat().await;
    }

    /// Claims and starts what waits for a runtime now, as the claim loop
    /// does every [`claim_every`](DurableTasksBuilder::claim_every); for
    /// tests and for a worker that wants to look at once. Does nothing
    /// without resumable tools, or when they are handed off.
    pub async fn claim_now(&self) {
        Inner::claim_now(&self.inner).await;
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
    /// takes over, see [`spawn_resumable`](Self::spawn_resumable).
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
        let new = with_options(NewTask::new(&owner, self.inner.instance()), &options);
        let (id, record, _) = self
            .inner
            .create(new)
            .await
            .map_err(|e| store_error("create", e))?;
        let task = to_task(&id.to_string(), &record);
        tokio::spawn(run(self.context(&id, owner, None), operation));
        Ok(CreateTaskResult::new(task))
    }

    /// Materializes a task for `call`, a tool registered with
    /// [`DurableTasksBuilder::resumable`], that may outlive this instance
    /// (T16): the call (tool and arguments) is stored with the task, which
    /// runs here at once, or, with
    /// [`hand_off_to_workers`](DurableTasksBuilder::hand_off_to_workers),
    /// waits for a worker to claim it. When the instance running it dies,
    /// another runtime with the tool claims it and runs the handler again,
    /// up to [`max_attempts`](DurableTasksBuilder::max_attempts) runs.
    ///
    /// -32021 as [`spawn`](Self::spawn) when the request did not declare
    /// the tasks extension; -32602 (nothing written) when the tool is not
    /// registered here and tasks are not handed off.
    pub async fn spawn_resumable(
        &self,
        ctx: &RequestContext<RoleServer>,
        options: TaskOptions,
        call: ResumableCall,
    ) -> Result<CreateTaskResult, ErrorData> {
        require_tasks(ctx)?;
        let handler = self.inner.resumable.get(&call.tool).cloned();
        if handler.is_none() && !self.inner.hand_off {
            return Err(ErrorData::invalid_params(
                format!("no resumable tool named {:?}", call.tool),
                None,
            ));
        }
        let context = call
            .encode()
            .map_err(|e| ErrorData::internal_error(format!("the call: {e}"), None))?;
        let owner = (self.inner.owner)(ctx);
        let mut new = NewTask::new(&owner, self.inner.instance())
            .context(&context)
            .takeover(self.inner.max_attempts);
        if self.inner.hand_off {
            new = new.queued();
        }
        let new = with_options(new, &options);
        let (id, record, instance) = self.inner.create(new).await.map_err(|e| match e {
            Error::PayloadTooLarge { size, max } => ErrorData::invalid_params(
                format!("the call's arguments are {size} bytes, the limit is {max}"),
                None,
            ),
            e => store_error("create", e),
        })?;
        let task = to_task(&id.to_string(), &record);
        if let (Some(handler), false) = (handler, self.inner.hand_off) {
            let first_run = Run::new(Worker::first(instance), None, Vec::new(), 1);
            let context = self.context(&id, owner, Some(Arc::new(first_run)));
            tokio::spawn(run(context, move |t| handler(t, call)));
        }
        Ok(CreateTaskResult::new(task))
    }

    /// The context of a task this runtime just created.
    fn context(&self, id: &TaskId, owner: Owner, run: Option<Arc<Run>>) -> DurableTaskContext {
        DurableTaskContext {
            digest: id.digest(),
            id: Some(id.to_string()),
            owner,
            inner: self.inner.clone(),
            run,
        }
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
            .store
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
        match self
            .inner
            .store
            .answer(&params.task_id, &owner, &responses)
            .await
        {
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
            .store
            .request_cancel(&params.task_id, &owner, self.inner.cancel_mode)
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

/// Runs a task this runtime claimed: its tool's handler, unless the task
/// cannot run (its call unreadable, its tool unknown here: it fails) or
/// its client asked to cancel (it ends `cancelled`).
async fn run_claimed(inner: Arc<Inner>, claimed: Claimed, permit: OwnedSemaphorePermit) {
    let view = claimed.view;
    let (attempt, checkpoint) = view
        .record
        .takeover
        .as_ref()
        .map_or((1, None), |t| (t.attempt(), t.checkpoint.clone()));
    let context = DurableTaskContext {
        digest: claimed.task,
        id: None,
        owner: view.owner,
        inner: inner.clone(),
        run: Some(Arc::new(Run::new(
            claimed.worker,
            checkpoint,
            view.answers,
            attempt,
        ))),
    };
    // A cancel asked while nobody ran the task ends it, whatever it runs.
    if view.record.cancel_requested {
        context.finish(Finish::Cancelled).await;
        return;
    }
    let call = match ResumableCall::decode(view.record.context.as_deref()) {
        Ok(call) => call,
        Err(message) => {
            tracing::warn!(task = ?context.digest, %message, "cannot run a claimed task");
            let error = ErrorData::internal_error(message, None);
            context.finish(Finish::Failed(&error_bytes(&error))).await;
            return;
        }
    };
    let Some(handler) = inner.resumable.get(&call.tool).cloned() else {
        tracing::warn!(task = ?context.digest, tool = %call.tool, "claimed a task of an unknown tool");
        let error = ErrorData::internal_error(
            format!(
                "the runtime that took the task over has no resumable tool named {:?}",
                call.tool
            ),
            None,
        );
        context.finish(Finish::Failed(&error_bytes(&error))).await;
        return;
    };
    tracing::debug!(task = ?context.digest, tool = %call.tool, attempt, "running a claimed task");
    run(context, move |t| handler(t, call)).await;
    drop(permit);
}

/// Runs the operation and stores how it ended. A resumable run that stops
/// (fenced by a newer claim, or given back while it waits for input) is
/// aborted, and nothing more is written.
async fn run<F>(context: DurableTaskContext, operation: F)
where
    F: FnOnce(DurableTaskContext) -> TaskFuture + Send + 'static,
{
    let finisher = context.clone();
    let stop = context.run.as_ref().map(|run| run.stop.subscribe());
    // A task of its own, so a panic ends the task as failed, not working.
    let mut operation = tokio::spawn(operation(context));
    let ended = match stop {
        None => operation.await,
        // The stop first: an operation that returns because its run
        // stopped (a stopped write returns an error) is not the task's end.
        Some(mut stop) => tokio::select! {
            biased;
            why = stop.wait_for(Option::is_some) => {
                operation.abort();
                let why = why.ok().and_then(|why| *why);
                tracing::debug!(task = ?finisher.digest, ?why, "task run stopped");
                return;
            }
            ended = &mut operation => ended,
        },
    };
    let outcome = match ended {
        Ok(Ok(result)) => serde_json::to_vec(&result).map_err(|e| e.to_string()),
        Ok(Err(TaskExit::Cancelled)) => {
            finisher.finish(Finish::Cancelled).await;
            return;
        }
        Ok(Err(TaskExit::Error(error))) => {
            finisher.finish(Finish::Failed(&error_bytes(&error))).await;
            return;
        }
        Err(join) => Err(format!("task operation ended abnormally: {join}")),
    };
    match outcome {
        Ok(bytes) => finisher.finish(Finish::Completed(&bytes)).await,
        Err(message) => {
            let error = ErrorData::internal_error(message, None);
            finisher.finish(Finish::Failed(&error_bytes(&error))).await;
        }
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
    serde_json::to_vec(error)
        .unwrap_or_else(|_| br#"{"code":-32603,"message":"task failed"}"#.to_vec())
}

/// Why a resumable run stopped before its operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// A newer claim holds the task (T18): another runtime runs it.
    Fenced,
    /// The run gave the task back to wait for input: whoever claims it
    /// once answered runs it again.
    Parked,
}

/// A run of a resumable task: the claim it writes under and what the claim
/// saw.
struct Run {
    worker: Worker,
    checkpoint: Option<Bytes>,
    answers: Vec<(String, Bytes)>,
    attempt: u32,
    stop: watch::Sender<Option<Stop>>,
}

impl Run {
    fn new(
        worker: Worker,
        checkpoint: Option<Bytes>,
        answers: Vec<(String, Bytes)>,
        attempt: u32,
    ) -> Self {
        Self {
            worker,
            checkpoint,
            answers,
            attempt,
            stop: watch::Sender::new(None),
        }
    }

    /// Whether `record` shows the task no longer ours: claimed since (a
    /// newer epoch), or given back.
    fn fenced_by(&self, record: &TaskRecord) -> bool {
        record
            .takeover
            .as_ref()
            .is_some_and(|t| t.epoch != self.worker.epoch || t.released)
    }
}

/// What a task's operation is given: rmcp's `TaskContext` methods, over the
/// store, so they work whichever instance serves the client; for a
/// resumable task, its checkpoint and attempt too.
#[derive(Clone)]
pub struct DurableTaskContext {
    digest: TaskDigest,
    /// The id, when this runtime created the task (a claim knows only the
    /// digest: ids are never stored).
    id: Option<String>,
    owner: Owner,
    inner: Arc<Inner>,
    /// For a resumable task: the claim this run holds.
    run: Option<Arc<Run>>,
}

impl fmt::Debug for DurableTaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableTaskContext")
            .field("digest", &self.digest)
            .field("worker", &self.run.as_ref().map(|run| run.worker))
            .finish_non_exhaustive()
    }
}

impl DurableTaskContext {
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
        self.digest
    }

    /// Which run of the task this is, from 1: one more after each takeover
    /// of a lapsed instance's run (runs given back for input do not
    /// count). Always 1 for a task that is not resumable.
    pub fn attempt(&self) -> u32 {
        self.run.as_ref().map_or(1, |run| run.attempt)
    }

    /// Whether this is a run of a resumable task
    /// ([`DurableTasks::spawn_resumable`] or a claim).
    pub fn is_resumable(&self) -> bool {
        self.run.is_some()
    }

    /// The newest checkpoint saved before this run began
    /// ([`checkpoint`](Self::checkpoint)), from which it may resume; `None`
    /// on a first run, or when no run saved one.
    pub fn last_checkpoint(&self) -> Option<&[u8]> {
        self.run.as_ref()?.checkpoint.as_deref()
    }

    /// Saves the operation's progress (T19), at most
    /// `MAX_CHECKPOINT_BYTES`: a run that takes the task over later starts
    /// with it as its [`last_checkpoint`](Self::last_checkpoint). An error
    /// on a task that is not resumable. If another runtime has claimed the
    /// task since, this run is stopped: the operation is aborted (a clone
    /// of this context used outside it gets an error).
    pub async fn checkpoint(&self, checkpoint: impl AsRef<[u8]>) -> Result<(), ErrorData> {
        if self.run.is_none() {
            return Err(ErrorData::internal_error(
                "checkpoints are for resumable tasks (DurableTasks::spawn_resumable)",
                None,
            ));
        }
        match self
            .operation_write(WorkerChange::Checkpoint(checkpoint.as_ref()))
            .await
        {
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

    /// One write to the store: under this run's claim for a resumable
    /// task, else as the runtime's instance (the first claim of a task that
    /// is not taken over).
    async fn apply(&self, change: WorkerChange<'_>) -> mcp_event_store_core::Result<Applied> {
        let by = self
            .run
            .as_ref()
            .map_or_else(|| Worker::first(self.inner.instance()), |run| run.worker);
        self.inner
            .store
            .apply_claimed(&self.digest, by, change)
            .await
    }

    /// [`apply`](Self::apply) from within the operation: a fenced write
    /// stops the run (and is returned as `Fenced`, which the callers turn
    /// into an error).
    async fn operation_write(
        &self,
        change: WorkerChange<'_>,
    ) -> mcp_event_store_core::Result<Applied> {
        let applied = self.apply(change).await?;
        if applied == Applied::Fenced {
            self.stop(Stop::Fenced);
        }
        Ok(applied)
    }

    /// Stops this run: the runner aborts the operation and writes nothing
    /// more. The caller returns at once, with whatever it returns when the
    /// run stopped: the abort ends the operation, and a clone of the
    /// context held elsewhere is not left waiting.
    fn stop(&self, why: Stop) {
        if let Some(run) = &self.run {
            run.stop.send_replace(Some(why));
        }
    }

    /// The task now, as the runtime reads it.
    async fn read(&self) -> mcp_event_store_core::Result<Option<TaskRecord>> {
        match (&self.run, &self.id) {
            (None, Some(text)) => self.inner.store.get(text, &self.owner).await,
            _ => Ok(self
                .inner
                .store
                .view_claimed(&self.digest)
                .await?
                .map(|view| view.record)),
        }
    }

    /// The task once its `rev` is past `after`, or after the watch wait.
    async fn watch(&self, after: Rev) -> mcp_event_store_core::Result<Option<TaskRecord>> {
        let wait = self.inner.watch_wait;
        match (&self.run, &self.id) {
            (None, Some(text)) => self.inner.store.watch(text, &self.owner, after, wait).await,
            _ => {
                self.inner
                    .store
                    .watch_claimed(&self.digest, after, wait)
                    .await
            }
        }
    }

    /// Stops the run if `record` shows another claim holds the task, and
    /// says whether it did.
    fn check_fenced(&self, record: &TaskRecord) -> bool {
        let fenced = self.run.as_ref().is_some_and(|run| run.fenced_by(record));
        if fenced {
            self.stop(Stop::Fenced);
        }
        fenced
    }

    async fn finish(&self, finish: Finish<'_>) {
        let applied = match self.apply(WorkerChange::Finish(finish)).await {
            Err(Error::PayloadTooLarge { size, max }) => {
                let error = ErrorData::internal_error(
                    format!("the task's outcome is {size} bytes, the store's limit is {max}"),
                    None,
                );
                self.apply(WorkerChange::Finish(Finish::Failed(&error_bytes(&error))))
                    .await
            }
            other => other,
        };
        match applied {
            Ok(Applied::Changed { .. }) => {}
            Ok(Applied::Fenced) => {
                tracing::info!(task = ?self.digest, "task taken over: this run's end is not stored")
            }
            Ok(other) => tracing::debug!(task = ?self.digest, ?other, "task already ended"),
            Err(error) => {
                tracing::warn!(task = ?self.digest, %error, "cannot store the task's end")
            }
        }
    }

    /// Asks the client for input under `key` (the task becomes
    /// `input_required`) and waits for its `tasks/update` response, which
    /// may come through any instance. Keys are spent once used.
    ///
    /// In a resumable task, a key answered before (in an earlier run)
    /// returns its answer at once, without asking again. Otherwise the
    /// request is stored and the task given back: this run stops here
    /// (the operation is aborted), no runtime is occupied while the client
    /// thinks, and once the client answers, a runtime claims the task and
    /// runs the operation again, this call then returning the answer.
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
        if let Some(run) = &self.run
            && let Some((_, answer)) = run.answers.iter().find(|(k, _)| *k == key)
        {
            return serde_json::from_slice(answer)
                .map_err(|e| internal(format!("stored answer is not JSON: {e}")));
        }
        let bytes = serde_json::to_vec(&request).map_err(|e| internal(e.to_string()))?;
        let mut rev = match self
            .operation_write(WorkerChange::RequestInput {
                key: &key,
                request: &bytes,
            })
            .await
            .map_err(|e| internal(e.to_string()))?
        {
            Applied::Changed { rev, .. } => rev,
            Applied::CancelRequested => return Err(TaskExit::Cancelled),
            Applied::KeySpent => {
                return Err(internal(format!(
                    "inputRequests key {key:?} was already used for this task"
                )));
            }
            other => return Err(internal(format!("cannot request input: {other:?}"))),
        };
        if self.run.is_some() {
            // Given back: answered, it is claimable, and the run that claims
            // it finds the answer in its view (answers are never taken).
            return match self
                .operation_write(WorkerChange::Release)
                .await
                .map_err(|e| internal(e.to_string()))?
            {
                Applied::Changed { .. } => {
                    self.stop(Stop::Parked);
                    Err(internal(format!(
                        "the task waits for input {key:?}; it runs again once answered"
                    )))
                }
                other => Err(internal(format!(
                    "cannot give the task back while it waits for input: {other:?}"
                ))),
            };
        }
        loop {
            let record = self
                .watch(rev)
                .await
                .map_err(|e| internal(e.to_string()))?
                .ok_or_else(|| internal("the task no longer exists".into()))?;
            if record.answered.contains(&key) {
                match self
                    .operation_write(WorkerChange::TakeAnswer { key: &key })
                    .await
                    .map_err(|e| internal(e.to_string()))?
                {
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

    /// Replaces the task's status message (at most 4 KiB).
    pub async fn set_status_message(&self, message: impl Into<String>) -> Result<(), ErrorData> {
        let message = message.into();
        match self
            .operation_write(WorkerChange::SetMessage(Some(&message)))
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
    /// failed read counts as no request. In a resumable task that another
    /// runtime has claimed since, this run is stopped (and `true`).
    pub async fn is_cancel_requested(&self) -> bool {
        match self.read().await {
            Ok(Some(record)) => {
                self.check_fenced(&record) || record.cancel_requested || record.status.is_terminal()
            }
            Ok(None) => true,
            Err(error) => {
                tracing::warn!(task = ?self.digest, %error, "cannot read the task");
                false
            }
        }
    }

    /// Resolves once the client asks to cancel (at once if it has), or the
    /// task ends or is gone. Pair it with `tokio::select!`; an operation
    /// that stops should return [`TaskExit::Cancelled`]. In a resumable
    /// task, a newer claim seen while waiting stops this run (and this
    /// resolves).
    pub async fn cancelled(&self) {
        let mut rev: Rev = 0;
        loop {
            match self.watch(rev).await {
                Ok(Some(record)) => {
                    if self.check_fenced(&record)
                        || record.cancel_requested
                        || record.status.is_terminal()
                    {
                        return;
                    }
                    rev = record.rev;
                }
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(task = ?self.digest, %error, "cannot watch the task");
                    tokio::time::sleep(self.inner.watch_wait).await;
                }
            }
        }
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
    if let Some(message) = &record.message {
        task = task.with_status_message(message.clone());
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

/// Milliseconds since the epoch as ISO 8601 in UTC, to the millisecond.
fn iso8601(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

#[cfg(test)]
mod tests;
