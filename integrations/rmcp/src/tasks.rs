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
//! Durable state is not durable execution: the operation's future dies with
//! its process; nothing resumes it.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CancelTaskParams, ClientCapabilities, CreateTaskResult, DetailedTask, GetTaskParams,
    GetTaskResult, InputRequest, InputRequests, JsonObject, Task, TaskPayload, UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
pub use rmcp::task_manager::{TaskExit, TaskFuture, TaskOptions};
use serde_json::Value;
use tokio::task::JoinHandle;

use mcp_event_store_core::Error;
use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, InstanceId, NewTask, Owner, Rev, TaskId, TaskRecord, TaskStatus,
    TaskStore, WorkerChange,
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

type OwnerFn = dyn Fn(&RequestContext<RoleServer>) -> Owner + Send + Sync;

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
}

impl fmt::Debug for DurableTasksBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableTasksBuilder")
            .field("cancel_mode", &self.cancel_mode)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("lease", &self.lease)
            .field("watch_wait", &self.watch_wait)
            .field("purge_interval", &self.purge_interval)
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

    /// Registers the instance (its first heartbeat) and starts renewing it
    /// and purging. Needs a tokio runtime.
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
        *lock(&inner.background) = background;
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
        });
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
    /// The heartbeat and purge loops, stopped with the last clone.
    background: Mutex<Vec<JoinHandle<()>>>,
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
    /// is registered, and the task created under it.
    async fn create(
        &self,
        mut task: NewTask<'_>,
    ) -> mcp_event_store_core::Result<(TaskId, TaskRecord)> {
        task.instance = self.instance();
        for _ in 0..2 {
            match self.store.create(task).await {
                Err(Error::InstanceLapsed { .. }) => {
                    task.instance = self.replace_lapsed(task.instance).await?;
                }
                created => return created,
            }
        }
        self.store.create(task).await
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
        }
    }

    /// The instance this runtime runs tasks as (T11).
    pub fn instance(&self) -> InstanceId {
        self.inner.instance()
    }

    /// One heartbeat of this runtime's instance (T11), for a maintenance
    /// loop that is not the runtime's own.
    pub(crate) async fn beat(&self) {
        self.inner.beat().await;
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
    pub async fn spawn<F>(
        &self,
        ctx: &RequestContext<RoleServer>,
        options: TaskOptions,
        operation: F,
    ) -> Result<CreateTaskResult, ErrorData>
    where
        F: FnOnce(DurableTaskContext) -> TaskFuture + Send + 'static,
    {
        if !ctx
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks())
        {
            return Err(ErrorData::missing_required_client_capability(
                ClientCapabilities::builder().enable_tasks().build(),
            ));
        }
        let owner = (self.inner.owner)(ctx);
        let mut new = NewTask::new(&owner, self.inner.instance());
        new.ttl = options.ttl_ms.map(Duration::from_millis);
        new.poll_interval = options.poll_interval_ms.map(Duration::from_millis);
        new.message = options.status_message.as_deref();
        let (id, record) = self
            .inner
            .create(new)
            .await
            .map_err(|e| store_error("create", e))?;
        let task = to_task(&id.to_string(), &record);
        let context = DurableTaskContext {
            id,
            text: id.to_string(),
            owner,
            inner: self.inner.clone(),
        };
        tokio::spawn(run(context, operation));
        Ok(CreateTaskResult::new(task))
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

/// Runs the operation and stores how it ended.
async fn run<F>(context: DurableTaskContext, operation: F)
where
    F: FnOnce(DurableTaskContext) -> TaskFuture + Send + 'static,
{
    let finisher = context.clone();
    // A task of its own, so a panic ends the task as failed, not working.
    let ended = tokio::spawn(operation(context)).await;
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

fn error_bytes(error: &ErrorData) -> Vec<u8> {
    serde_json::to_vec(error)
        .unwrap_or_else(|_| br#"{"code":-32603,"message":"task failed"}"#.to_vec())
}

/// What a task's operation is given: rmcp's `TaskContext` methods, over the
/// store, so they work whichever instance serves the client.
#[derive(Clone)]
pub struct DurableTaskContext {
    id: TaskId,
    text: String,
    owner: Owner,
    inner: Arc<Inner>,
}

impl fmt::Debug for DurableTaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableTaskContext")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl DurableTaskContext {
    /// The id of this task.
    pub fn task_id(&self) -> &str {
        &self.text
    }

    async fn apply(&self, change: WorkerChange<'_>) -> mcp_event_store_core::Result<Applied> {
        self.inner
            .store
            .apply(&self.id, self.inner.instance(), change)
            .await
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
            Ok(other) => tracing::debug!(task = %self.id, ?other, "task already ended"),
            Err(error) => tracing::warn!(task = %self.id, %error, "cannot store the task's end"),
        }
    }

    /// Asks the client for input under `key` (the task becomes
    /// `input_required`) and waits for its `tasks/update` response, which
    /// may come through any instance. Keys are spent once used.
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
        let bytes = serde_json::to_vec(&request).map_err(|e| internal(e.to_string()))?;
        let mut rev = match self
            .apply(WorkerChange::RequestInput {
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
        loop {
            let record = self
                .inner
                .store
                .watch(&self.text, &self.owner, rev, self.inner.watch_wait)
                .await
                .map_err(|e| internal(e.to_string()))?
                .ok_or_else(|| internal("the task no longer exists".into()))?;
            if record.answered.contains(&key) {
                match self
                    .apply(WorkerChange::TakeAnswer { key: &key })
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
            .apply(WorkerChange::SetMessage(Some(&message)))
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
    /// failed read counts as no request.
    pub async fn is_cancel_requested(&self) -> bool {
        match self.inner.store.get(&self.text, &self.owner).await {
            Ok(Some(record)) => record.cancel_requested || record.status.is_terminal(),
            Ok(None) => true,
            Err(error) => {
                tracing::warn!(task = %self.id, %error, "cannot read the task");
                false
            }
        }
    }

    /// Resolves once the client asks to cancel (at once if it has), or the
    /// task ends or is gone. Pair it with `tokio::select!`; an operation
    /// that stops should return [`TaskExit::Cancelled`].
    pub async fn cancelled(&self) {
        let mut rev: Rev = 0;
        loop {
            match self
                .inner
                .store
                .watch(&self.text, &self.owner, rev, self.inner.watch_wait)
                .await
            {
                Ok(Some(record)) if record.cancel_requested || record.status.is_terminal() => {
                    return;
                }
                Ok(Some(record)) => rev = record.rev,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(task = %self.id, %error, "cannot watch the task");
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
