//! tower-mcp's `TaskStore` over any store: see [`TowerTaskStore`].

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::Error;
use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, MAX_MESSAGE_BYTES, NewTask, Owner, TaskId, TaskRecord,
    TaskStatus as CoreStatus, TaskView, Worker, WorkerChange,
};
use mcp_event_store_runtime::{Runtime, TaskCall, iso8601, status_message};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::task::AbortHandle;
use tower_mcp::CallToolResult;
use tower_mcp::async_task::{
    AppliedInputResponses, CancellationToken, Result, TaskOwner, TaskPresence, TaskResumeContext,
    TaskSnapshot, TaskStoreError,
};
use tower_mcp::error::JsonRpcError;
use tower_mcp::protocol::{InputRequests, InputResponses, TaskObject, TaskStatus};

use crate::support::{now_millis, task_error};

/// The ttl of a task created without one (tower-mcp leaves it to the
/// store; on the 2026-07-28 protocol the client cannot choose): an hour.
pub const DEFAULT_TASK_TTL: Duration = Duration::from_secs(60 * 60);
/// The poll interval tasks suggest to clients by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a token's guard waits after a failed read.
const RETRY: Duration = Duration::from_secs(1);
/// The version of the fields this adapter keeps in each task's call.
const CONTEXT_VERSION: u64 = 1;
/// The first byte of a stored answer: its envelope's version.
const ANSWER_VERSION: u8 = 1;
/// Bytes of the nonce that marks which `tasks/update` stored an answer.
const NONCE_LEN: usize = 16;

/// What the adapter keeps with each task, as its context (T13): the
/// runtime's [`TaskCall`] (the tool, its arguments, the creating request's
/// trace), with what tower-mcp asks back and the store does not otherwise
/// keep as the call's extra fields: `v` (their version, 1), `owner`, and
/// `meta`. Contexts written before the call was the runtime's (`{"v",
/// "tool", "arguments", "owner", "meta"}`) read the same.
#[derive(Clone, Debug)]
pub(crate) struct Context {
    /// The call; its extras are the fields this release does not know,
    /// written back as they were.
    pub(crate) call: TaskCall,
    /// The owner exactly as tower-mcp gave it.
    pub(crate) owner: TaskOwner,
    /// The task's protocol `_meta`.
    meta: Option<Value>,
}

impl Context {
    fn new(tool: &str, arguments: Value, owner: TaskOwner) -> Self {
        Self {
            call: TaskCall::new(tool, arguments),
            owner,
            meta: None,
        }
    }

    /// The call to keep, this adapter's fields among its extras.
    fn to_call(&self) -> Result<TaskCall> {
        let mut call = self.call.clone();
        let owner = serde_json::to_value(&self.owner)
            .map_err(|e| TaskStoreError::Encode(format!("a task's owner: {e}")))?;
        call.extra.insert("v".into(), CONTEXT_VERSION.into());
        call.extra.insert("owner".into(), owner);
        match &self.meta {
            Some(meta) => call.extra.insert("meta".into(), meta.clone()),
            None => call.extra.remove("meta"),
        };
        Ok(call)
    }

    fn encode(&self) -> Result<Vec<u8>> {
        Ok(self.to_call()?.encode())
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let decode =
            |e: &dyn fmt::Display| TaskStoreError::Decode(format!("a task's context: {e}"));
        let mut call = TaskCall::decode(bytes).map_err(|e| decode(&e))?;
        match call.extra.remove("v") {
            Some(version) if version == CONTEXT_VERSION => {}
            Some(version) => {
                return Err(TaskStoreError::Decode(format!(
                    "a task's context is version {version}; this release reads version \
                     {CONTEXT_VERSION} only"
                )));
            }
            None => return Err(decode(&"it has no version (`v`)")),
        }
        let owner = call.extra.remove("owner").unwrap_or(Value::Null);
        let owner = serde_json::from_value(owner).map_err(|e| decode(&e))?;
        let meta = call.extra.remove("meta").filter(|meta| !meta.is_null());
        Ok(Self { call, owner, meta })
    }
}

/// The store's owner for a tower-mcp owner: anonymous, or the principal
/// (every string, the empty one and one over 256 bytes included, is a
/// principal of its own), as [`Callers`](mcp_event_store_runtime::Callers)
/// binds it for every framework.
fn core_owner(owner: &TaskOwner) -> Result<Owner> {
    Ok(mcp_event_store_runtime::owner_of(owner.as_deref()))
}

fn tower_status(status: CoreStatus) -> TaskStatus {
    match status {
        CoreStatus::Working => TaskStatus::Working,
        CoreStatus::InputRequired => TaskStatus::InputRequired,
        CoreStatus::Completed => TaskStatus::Completed,
        CoreStatus::Failed => TaskStatus::Failed,
        CoreStatus::Cancelled => TaskStatus::Cancelled,
    }
}

/// `message`, cut to the store's limit on a character boundary: a status
/// message is for people, and tower-mcp passes long opaque state there.
pub(crate) fn fit_message(message: &str) -> &str {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// A response as stored: the envelope's version, the nonce of the call
/// that answered, the response's JSON.
fn encode_answer(nonce: &[u8; NONCE_LEN], json: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(1 + NONCE_LEN + json.len());
    bytes.push(ANSWER_VERSION);
    bytes.extend_from_slice(nonce);
    bytes.extend_from_slice(json);
    bytes
}

/// A stored answer's nonce and JSON.
fn decode_answer(bytes: &[u8]) -> Result<(&[u8], &[u8])> {
    match bytes.split_first() {
        Some((&ANSWER_VERSION, rest)) if rest.len() >= NONCE_LEN => Ok(rest.split_at(NONCE_LEN)),
        _ => Err(TaskStoreError::Decode(
            "a task's answer is not in this adapter's envelope".into(),
        )),
    }
}

pub(crate) fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| TaskStoreError::Decode(format!("{what}: {e}")))
}

pub(crate) fn to_json<T: Serialize>(value: &T, what: &str) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| TaskStoreError::Encode(format!("{what}: {e}")))
}

/// A tower-mcp task as read.
enum Found {
    /// No such task: never created, purged, malformed id, or not a task of
    /// this adapter (it has no context).
    Missing,
    /// Past its ttl: unknown to tower-mcp, but still kept for its grace.
    Expired {
        owner: TaskOwner,
    },
    Live(Box<Live>),
}

struct Live {
    id: TaskId,
    view: TaskView,
    context: Context,
}

impl Live {
    fn record(&self) -> &TaskRecord {
        &self.view.record
    }

    fn object(&self, id: &str) -> TaskObject {
        task_object(id, self.record(), &self.context)
    }

    fn snapshot(&self, id: &str) -> Result<TaskSnapshot> {
        let record = self.record();
        let outcome = record.outcome.as_deref();
        let (result, error) = match record.status {
            CoreStatus::Completed => (
                outcome
                    .map(|bytes| parse::<CallToolResult>(bytes, "a task's result"))
                    .transpose()?,
                None,
            ),
            CoreStatus::Failed => (
                None,
                outcome
                    .map(|bytes| parse::<JsonRpcError>(bytes, "a task's error"))
                    .transpose()?,
            ),
            _ => (None, None),
        };
        Ok((self.object(id), result, error))
    }

    /// Every answer given so far, over every round of input.
    fn responses(&self) -> Result<InputResponses> {
        decode_responses(&self.view.answers)
    }

    /// Whether the task's token should be raised: cancelled (or asked to
    /// be), or failed (it can no longer finish: expired, lost, or failed
    /// by its handler).
    fn stops_work(&self) -> bool {
        let record = self.record();
        record.cancel_requested
            || matches!(record.status, CoreStatus::Cancelled | CoreStatus::Failed)
    }

    /// How long until tower-mcp counts the task expired.
    fn until_expiry(&self) -> Duration {
        let left = self.record().expires_at.saturating_sub(now_millis()).max(0);
        Duration::from_millis(u64::try_from(left).unwrap_or(0) + 1)
    }
}

/// Every answer given so far, over every round of input, as stored.
pub(crate) fn decode_responses(answers: &[(String, Bytes)]) -> Result<InputResponses> {
    answers
        .iter()
        .map(|(key, bytes)| {
            let (_, json) = decode_answer(bytes)?;
            Ok((key.clone(), parse(json, "a task's answer")?))
        })
        .collect()
}

fn task_object(id: &str, record: &TaskRecord, context: &Context) -> TaskObject {
    TaskObject {
        task_id: id.to_owned(),
        status: tower_status(record.status),
        status_message: status_message(record),
        created_at: iso8601(record.created_at),
        last_updated_at: iso8601(record.updated_at),
        ttl: record.ttl_ms,
        poll_interval: record.poll_interval_ms,
        result: None,
        error: None,
        meta: context.meta.clone(),
    }
}

/// A task this process created or resumed: its token, the guard that
/// raises it, and the claim this process runs it under, for a task that
/// may be taken over (T18): every write of tower-mcp's run names it.
struct Local {
    token: CancellationToken,
    guard: AbortHandle,
    claim: Option<Worker>,
}

/// What the adapter's handles and its tokens' guards share.
pub(crate) struct Shared {
    /// This instance's runtime: its lease, its claims, its writes.
    pub(crate) runtime: Runtime,
    default_ttl: Duration,
    poll_interval: Option<Duration>,
    /// The tokens of the tasks this process created or resumed, by id.
    local: Mutex<HashMap<String, Local>>,
    /// The tools whose tasks may be taken over: `None` takes none over,
    /// an empty set none, `Some(None)` every tool.
    takeover: Option<Option<BTreeSet<String>>>,
}

impl Shared {
    fn local(&self) -> MutexGuard<'_, HashMap<String, Local>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The task `id` as tower-mcp sees it now.
    async fn read(&self, id: &str) -> Result<Found> {
        let Some(task) = TaskId::parse(id) else {
            return Ok(Found::Missing);
        };
        let view = self.runtime.store().task_runtime().view(&task).await;
        let Some(view) = view.map_err(task_error)? else {
            return Ok(Found::Missing);
        };
        let Some(bytes) = view.record.context.as_deref() else {
            return Ok(Found::Missing);
        };
        let context = Context::decode(bytes)?;
        if now_millis() >= view.record.expires_at {
            return Ok(Found::Expired {
                owner: context.owner,
            });
        }
        Ok(Found::Live(Box::new(Live {
            id: task,
            view,
            context,
        })))
    }

    /// Whether a task of `tool` is created so that it may be taken over:
    /// the builder opted the tool in, and this process runs takeovers (so
    /// that it also resumes what it releases).
    fn takes_over(&self, tool: &str) -> bool {
        self.runtime.runs_takeovers()
            && self
                .takeover
                .as_ref()
                .is_some_and(|tools| tools.as_ref().is_none_or(|tools| tools.contains(tool)))
    }

    /// The claim this process runs task `id` under, if it holds one.
    fn claim_of(&self, id: &str) -> Option<Worker> {
        self.local().get(id).and_then(|local| local.claim)
    }

    /// Whether this process may write to task `id` as `record` shows it:
    /// always for a task that dies with its instance; for one that may be
    /// taken over, only under the current claim, its own, and not released
    /// (T18). A claim's epoch is never reused, so a claim of this process
    /// under an instance it replaced after a lapse reads as lost.
    fn holds(&self, id: &str, record: &TaskRecord) -> bool {
        record.takeover.as_ref().is_none_or(|takeover| {
            !takeover.released
                && self
                    .claim_of(id)
                    .is_some_and(|claim| claim.epoch == takeover.epoch)
        })
    }

    /// Applies a change to task `task` under this process's claim on it,
    /// if it may be taken over (T18), else as this process's instance. A
    /// change refused as [`Applied::Fenced`] (the task was claimed since by
    /// another, or released) raises the task's token here: this process
    /// must stop working on it.
    async fn apply(&self, task: &TaskId, change: WorkerChange<'_>) -> Result<Applied> {
        let id = task.to_string();
        let applied = self
            .runtime
            .write(&task.digest(), self.claim_of(&id), change)
            .await
            .map_err(task_error)?;
        if applied == Applied::Fenced {
            raise(self, &id);
        }
        Ok(applied)
    }

    /// Gives back a task that may be taken over once it parked for input
    /// (T17): its handler returned, nothing runs it, and whichever instance
    /// the answers reach claims it then. A task this process holds no claim
    /// on is left as it is.
    async fn release_parked(&self, task: &TaskId) {
        let Some(claim) = self.claim_of(&task.to_string()) else {
            return;
        };
        if let Err(e) = self
            .runtime
            .write(&task.digest(), Some(claim), WorkerChange::Release)
            .await
        {
            tracing::warn!(
                error = %e,
                "giving back a parked task failed; it is claimed once its instance lapses"
            );
        }
    }
}

/// The token of task `id` in this process, with a guard that raises it:
/// one created now, with `claim`, if the task has none here yet.
fn token_for(shared: &Arc<Shared>, id: &str, claim: Option<Worker>) -> CancellationToken {
    let mut local = shared.local();
    if let Some(known) = local.get(id) {
        return known.token.clone();
    }
    let token = CancellationToken::new();
    let guard = tokio::spawn(guard(shared.clone(), id.to_owned(), token.clone())).abort_handle();
    local.insert(
        id.to_owned(),
        Local {
            token: token.clone(),
            guard,
            claim,
        },
    );
    token
}

/// A fresh token for task `id` in this process under `claim`, replacing
/// (and raising) any it had: for a run under a new claim, which an old
/// claim's raised token must not stop.
fn fresh_token_for(shared: &Arc<Shared>, id: &str, claim: Option<Worker>) -> CancellationToken {
    if let Some(old) = shared.local().remove(id) {
        old.token.cancel();
        old.guard.abort();
    }
    token_for(shared, id, claim)
}

/// Raises task `id`'s token if this process has one.
fn raise(shared: &Shared, id: &str) {
    if let Some(local) = shared.local().get(id) {
        local.token.cancel();
    }
}

/// Watches task `id` for as long as tower-mcp knows it, and raises its
/// process-local token when it is cancelled (here or through any instance
/// sharing the store), fails, expires, goes, or is no longer this
/// process's to run. A change wakes it through the store's watch (T10);
/// expiry at the deadline it waits until; a lost instance at its next
/// re-read. Once the task ended, it only waits for the expiry, reading
/// nothing until then.
async fn guard(shared: Arc<Shared>, id: String, token: CancellationToken) {
    loop {
        let live = match shared.read(&id).await {
            Ok(Found::Live(live)) => live,
            Ok(Found::Missing | Found::Expired { .. }) => {
                token.cancel();
                shared.local().remove(&id);
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading a task for its token failed; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        if live.stops_work() || !shared.holds(&id, live.record()) {
            token.cancel();
        }
        if live.record().status.is_terminal() {
            // It changes no more (T4): only its expiry is left to signal,
            // which a timer does without reading the store. (A `cancel_task`
            // through this process raises the token itself.)
            tokio::time::sleep(live.until_expiry()).await;
            continue;
        }
        let wait = live.until_expiry().min(shared.runtime.watch_wait());
        if let Err(e) = shared
            .runtime
            .store()
            .watch(&id, &live.view.owner, live.record().rev, wait)
            .await
        {
            tracing::debug!(error = %e, "watching a task for its token failed; retrying");
            tokio::time::sleep(RETRY).await;
        }
    }
}

impl TowerTaskStore {
    /// Has `router` announce each change of task `task_id` made through
    /// any instance sharing the store (the store's watch, T10) to its
    /// `subscriptions/listen` streams, until the task ended (its last
    /// change included), goes or expires. A change before the first read
    /// is not announced: tower-mcp's status notifications are best effort,
    /// `tasks/get` the truth.
    pub(crate) async fn announce_changes(&self, task_id: &str, router: &tower_mcp::McpRouter) {
        let shared = &self.inner.shared;
        let mut seen = None;
        loop {
            let live = match shared.read(task_id).await {
                Ok(Found::Live(live)) => live,
                Ok(Found::Missing | Found::Expired { .. }) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "reading a watched task failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let rev = live.record().rev;
            if seen.is_some_and(|seen| seen != rev) {
                router.notify_task_status_changed(task_id).await;
            }
            seen = Some(rev);
            if live.record().status.is_terminal() {
                return;
            }
            let wait = live.until_expiry().min(shared.runtime.watch_wait());
            if let Err(e) = shared
                .runtime
                .store()
                .watch(task_id, &live.view.owner, rev, wait)
                .await
            {
                tracing::debug!(error = %e, "watching a task failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Aborts the tokens' guards when the last handle goes.
struct Inner {
    shared: Arc<Shared>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let local =
            std::mem::take(&mut *self.shared.local.lock().unwrap_or_else(|p| p.into_inner()));
        for (_, task) in local {
            task.guard.abort();
        }
    }
}

/// Any store as tower-mcp's [`TaskStore`](tower_mcp::async_task::TaskStore),
/// so that every instance sharing the store answers for every task
/// (SEP-2663 durable tasks, protocol 2026-07-28, and task-augmented calls
/// of 2025-11-25).
///
/// Build it once per process on the process's [`Runtime`] with
/// [`TowerTaskStore::builder`], and give it to `McpRouter::task_store`. The
/// runtime keeps the instance's lease (T11), purges, and runs takeovers;
/// this adapter keeps the process-local cancellation tokens tower-mcp asks
/// for, which stop with its last clone.
///
/// What the store keeps, and how tower-mcp's rules map onto the task
/// contract, is in the [crate docs](crate#tasks).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use mcp_event_store_tower_mcp::{Runtime, TowerTaskStore};
/// use tower_mcp::McpRouter;
///
/// let store = Arc::new(mcp_event_store_core::MemoryStore::new());
/// let runtime = Runtime::builder(store).start().await?;
/// let tasks = TowerTaskStore::builder(runtime).build()?;
/// let router = McpRouter::new().task_store(Arc::new(tasks));
/// # let _ = router; Ok(()) }
/// ```
#[derive(Clone)]
pub struct TowerTaskStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for TowerTaskStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerTaskStore")
            .field("runtime", &self.inner.shared.runtime)
            .field("default_ttl", &self.inner.shared.default_ttl)
            .finish_non_exhaustive()
    }
}

/// Configures a [`TowerTaskStore`]; see [`TowerTaskStore::builder`].
#[derive(Debug)]
pub struct TowerTaskStoreBuilder {
    runtime: Runtime,
    default_ttl: Duration,
    poll_interval: Option<Duration>,
    takeover: Option<Option<BTreeSet<String>>>,
}

impl TowerTaskStore {
    /// Starts configuring tower-mcp's task store on `runtime`.
    pub fn builder(runtime: Runtime) -> TowerTaskStoreBuilder {
        TowerTaskStoreBuilder {
            runtime,
            default_ttl: DEFAULT_TASK_TTL,
            poll_interval: Some(DEFAULT_POLL_INTERVAL),
            takeover: None,
        }
    }

    /// The runtime running this adapter's tasks.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.shared.runtime
    }

    /// The tasks whose tokens this process holds (it created or resumed
    /// them) and tower-mcp still knows.
    pub fn local_tasks(&self) -> usize {
        self.inner.shared.local().len()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }
}

impl TowerTaskStoreBuilder {
    /// The ttl of a task created without one (default
    /// [`DEFAULT_TASK_TTL`]); the store caps every ttl at its
    /// `max_task_age` (7 days by default).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// The poll interval tasks suggest to clients (default
    /// [`DEFAULT_POLL_INTERVAL`]; `None`: none).
    pub fn poll_interval(mut self, interval: Option<Duration>) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Creates every task so that it may outlive its instance (T16), with at
    /// most the runtime's `max_attempts` runs in all, once this adapter runs
    /// takeovers ([`TowerTaskStore::run_takeovers`]); see the
    /// [crate docs](crate#takeover). Only for tools whose handler is safe to
    /// run again from the top and is not a live handler (tower-mcp never
    /// replays those): prefer [`takeover_tools`](Self::takeover_tools).
    pub fn takeover(mut self) -> Self {
        self.takeover = Some(None);
        self
    }

    /// As [`takeover`](Self::takeover), for the tasks of the tools named
    /// only.
    pub fn takeover_tools<T: Into<String>>(mut self, tools: impl IntoIterator<Item = T>) -> Self {
        self.takeover = Some(Some(tools.into_iter().map(Into::into).collect()));
        self
    }

    /// The adapter; must run inside a tokio runtime (each task's guard is
    /// a tokio task). A zero default ttl expires every task at birth:
    /// [`Error::Config`].
    pub fn build(self) -> mcp_event_store_core::Result<TowerTaskStore> {
        if self.default_ttl.is_zero() {
            return Err(Error::Config(
                "a zero default ttl expires every task at birth".into(),
            ));
        }
        Ok(TowerTaskStore {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared {
                    runtime: self.runtime,
                    default_ttl: self.default_ttl,
                    poll_interval: self.poll_interval,
                    local: Mutex::default(),
                    takeover: self.takeover,
                }),
            }),
        })
    }
}

fn not_applied(applied: &Applied) -> bool {
    !matches!(applied, Applied::Changed { .. })
}

#[async_trait]
impl tower_mcp::async_task::TaskStore for TowerTaskStore {
    /// Creates the task durably (T1) under this process's instance, with
    /// the tool's name, its arguments and the owner as its context (T13);
    /// `ttl: None` is [`DEFAULT_TASK_TTL`] (or the builder's).
    async fn create_task(
        &self,
        tool_name: &str,
        arguments: Value,
        ttl: Option<u64>,
        owner: TaskOwner,
    ) -> Result<(String, CancellationToken)> {
        let shared = self.shared();
        let bound = core_owner(&owner)?;
        let call = Context::new(tool_name, arguments, owner).to_call()?;
        let ttl = ttl.map_or(shared.default_ttl, Duration::from_millis);
        let runtime = &shared.runtime;
        let mut task = NewTask::new(&bound, runtime.instance()).ttl(ttl);
        if let Some(interval) = shared.poll_interval {
            task = task.poll_interval(interval);
        }
        if shared.takes_over(tool_name) {
            // tower-mcp runs the handler here at once: never queued.
            task = task.takeover(runtime.max_attempts());
        }
        let (id, _, run) = runtime.create_call(task, &call).await.map_err(task_error)?;
        let id = id.to_string();
        let token = token_for(shared, &id, run.claim());
        Ok((id, token))
    }

    async fn task_owner(&self, task_id: &str) -> Result<Option<TaskOwner>> {
        Ok(match self.shared().read(task_id).await? {
            Found::Live(live) => Some(live.context.owner),
            Found::Expired { .. } | Found::Missing => None,
        })
    }

    /// `Expired` with its owner for a task past its ttl that the store
    /// still keeps (its grace, `TaskOptions::grace`: an hour by default,
    /// however short its ttl, T21).
    async fn task_presence(&self, task_id: &str) -> Result<TaskPresence> {
        Ok(match self.shared().read(task_id).await? {
            Found::Live(live) => TaskPresence::Present {
                owner: live.context.owner,
            },
            Found::Expired { owner } => TaskPresence::Expired { owner },
            Found::Missing => TaskPresence::Missing,
        })
    }

    async fn get_task(&self, task_id: &str) -> Result<Option<TaskObject>> {
        Ok(match self.shared().read(task_id).await? {
            Found::Live(live) => Some(live.object(task_id)),
            _ => None,
        })
    }

    /// Keeps `meta` in the task's context. Only while the task runs: a
    /// terminal task changes no more (T4).
    async fn set_task_meta(&self, task_id: &str, meta: Value) -> Result<bool> {
        let shared = self.shared();
        let Found::Live(live) = shared.read(task_id).await? else {
            return Ok(false);
        };
        let mut context = live.context;
        context.meta = Some(meta);
        let bytes = context.encode()?;
        let applied = shared
            .apply(&live.id, WorkerChange::SetContext(&bytes))
            .await?;
        Ok(!not_applied(&applied))
    }

    /// Deletes the task (the store's operator call) and forgets its token.
    async fn discard_task(&self, task_id: &str) -> Result<bool> {
        let shared = self.shared();
        let deleted = shared
            .runtime
            .store()
            .delete(task_id)
            .await
            .map_err(task_error)?;
        if let Some(local) = shared.local().remove(task_id) {
            local.guard.abort();
        }
        Ok(deleted)
    }

    async fn get_task_result(&self, task_id: &str) -> Result<Option<TaskSnapshot>> {
        match self.shared().read(task_id).await? {
            Found::Live(live) => live.snapshot(task_id).map(Some),
            _ => Ok(None),
        }
    }

    /// Watches the task through the store (T10), so a change through any
    /// instance wakes it; expiry at its deadline.
    async fn wait_for_completion(&self, task_id: &str) -> Result<Option<TaskSnapshot>> {
        let shared = self.shared();
        loop {
            let Found::Live(live) = shared.read(task_id).await? else {
                return Ok(None);
            };
            if live.record().status.is_terminal() {
                return live.snapshot(task_id).map(Some);
            }
            let wait = live.until_expiry().min(shared.runtime.watch_wait());
            shared
                .runtime
                .store()
                .watch(task_id, &live.view.owner, live.record().rev, wait)
                .await
                .map_err(task_error)?;
        }
    }

    /// The tasks of this process (created or resumed here) that tower-mcp
    /// still knows, read fresh from the store. The store never keeps task
    /// ids (T2: a dump hands out no bearer token), so no instance can list
    /// another's tasks; tower-mcp's router never lists.
    async fn list_tasks(&self, status_filter: Option<TaskStatus>) -> Result<Vec<TaskObject>> {
        let shared = self.shared();
        let ids: Vec<String> = shared.local().keys().cloned().collect();
        let mut tasks = Vec::new();
        for id in ids {
            if let Found::Live(live) = shared.read(&id).await? {
                let task = live.object(&id);
                if status_filter.is_none_or(|status| status == task.status) {
                    tasks.push(task);
                }
            }
        }
        Ok(tasks)
    }

    /// Replaces the outstanding input requests in one atomic step (T15).
    async fn require_input(
        &self,
        task_id: &str,
        requests: InputRequests,
        message: Option<&str>,
    ) -> Result<bool> {
        let Some(task) = TaskId::parse(task_id) else {
            return Ok(false);
        };
        let encoded = requests
            .iter()
            .map(|(key, request)| Ok((key.as_str(), to_json(request, "an input request")?)))
            .collect::<Result<Vec<_>>>()?;
        let pairs: Vec<(&str, &[u8])> = encoded.iter().map(|(k, r)| (*k, &r[..])).collect();
        let change = WorkerChange::ReplaceInputs {
            requests: &pairs,
            message: message.map(fit_message),
        };
        let shared = self.shared();
        match shared.apply(&task, change).await? {
            Applied::Changed { .. } => {
                shared.release_parked(&task).await;
                Ok(true)
            }
            Applied::KeySpent => Err(TaskStoreError::InvalidTransition(
                "input request keys must be unique over a task's lifetime: a key was already \
                 answered or superseded, or a live key was pointed at a different request; use \
                 a new key to ask again"
                    .into(),
            )),
            _ => Ok(false),
        }
    }

    async fn outstanding_input_requests(&self, task_id: &str) -> Result<Option<InputRequests>> {
        let Found::Live(live) = self.shared().read(task_id).await? else {
            return Ok(None);
        };
        if live.record().status != CoreStatus::InputRequired {
            return Ok(Some(InputRequests::new()));
        }
        live.record()
            .outstanding
            .iter()
            .map(|(key, request)| Ok((key.clone(), parse(request, "an input request")?)))
            .collect::<Result<InputRequests>>()
            .map(Some)
    }

    /// Records the answers through the store's `answer` (T5), then reads
    /// back which ones this call stored: each answer carries a nonce of the
    /// call's, so two calls racing with the same key are told apart and
    /// exactly one sees it accepted.
    async fn apply_input_responses(
        &self,
        task_id: &str,
        responses: InputResponses,
    ) -> Result<Option<AppliedInputResponses>> {
        let shared = self.shared();
        let Found::Live(live) = shared.read(task_id).await? else {
            return Ok(None);
        };
        if live.record().status.is_terminal() {
            return Ok(None);
        }
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce)
            .map_err(|e| TaskStoreError::Backend(format!("no OS randomness: {e}")))?;
        let encoded = responses
            .iter()
            .map(|(key, response)| {
                let json = to_json(response, "an input response")?;
                Ok((key.as_str(), encode_answer(&nonce, &json)))
            })
            .collect::<Result<Vec<_>>>()?;
        let pairs: Vec<(&str, &[u8])> = encoded.iter().map(|(k, r)| (*k, &r[..])).collect();
        let Some(after) = shared
            .runtime
            .store()
            .answer(task_id, &live.view.owner, &pairs)
            .await
            .map_err(task_error)?
        else {
            return Ok(None);
        };
        if after.status.is_terminal() {
            return Ok(None);
        }
        let maybe_ours = responses
            .keys()
            .any(|key| after.answered.iter().any(|k| k == key));
        let mut accepted = BTreeSet::new();
        if maybe_ours && let Found::Live(now) = shared.read(task_id).await? {
            for (key, bytes) in &now.view.answers {
                if responses.contains_key(key) && decode_answer(bytes)?.0 == nonce {
                    accepted.insert(key.clone());
                }
            }
        }
        let ignored = responses
            .keys()
            .filter(|key| !accepted.contains(*key))
            .cloned()
            .collect();
        let still_outstanding = after.outstanding.iter().map(|(k, _)| k.clone()).collect();
        Ok(Some(AppliedInputResponses {
            accepted,
            ignored,
            still_outstanding,
        }))
    }

    async fn input_responses(&self, task_id: &str) -> Result<Option<InputResponses>> {
        match self.shared().read(task_id).await? {
            Found::Live(live) => live.responses().map(Some),
            _ => Ok(None),
        }
    }

    /// `working` with a message sets the message; the status itself
    /// follows the task's inputs (it is `input_required` while any is
    /// outstanding), so `input_required` is refused: it is reached through
    /// `require_input`, with the requests to answer.
    async fn set_status(
        &self,
        task_id: &str,
        status: TaskStatus,
        message: Option<&str>,
    ) -> Result<bool> {
        if status != TaskStatus::Working {
            return Err(TaskStoreError::InvalidTransition(format!(
                "set_status sets a running task's message; {status} is reached through \
                 require_input, complete_task, fail_task or cancel_task"
            )));
        }
        let shared = self.shared();
        let Found::Live(live) = shared.read(task_id).await? else {
            return Ok(false);
        };
        if live.record().status.is_terminal() {
            return Ok(false);
        }
        let Some(message) = message else {
            return Ok(true);
        };
        let applied = shared
            .apply(
                &live.id,
                WorkerChange::SetMessage(Some(fit_message(message))),
            )
            .await?;
        Ok(!not_applied(&applied))
    }

    /// The tool, its original arguments, every answer over every round,
    /// and the task's token in this process: the one it was created with
    /// here, or one created now and raised by cancellation through any
    /// instance, or expiry.
    async fn resume_context(&self, task_id: &str) -> Result<Option<TaskResumeContext>> {
        let shared = self.shared();
        let Found::Live(live) = shared.read(task_id).await? else {
            return Ok(None);
        };
        let mut responses = live.responses()?;
        let token = if live.record().takeover.is_some() && !shared.holds(task_id, live.record()) {
            // A task that may be taken over runs only under a claim: claim
            // it here if it waits for one (released when it parked, or its
            // instance lapsed), else leave it to whoever holds it.
            let claimed = shared.runtime.claim_for(&live.id.digest()).await;
            match claimed.map_err(task_error)? {
                Some(run) => match decode_responses(run.answers()) {
                    Ok(all) => {
                        responses = all;
                        fresh_token_for(shared, task_id, run.claim())
                    }
                    Err(e) => {
                        // Claimed but not runnable here: given back, not
                        // held unrun.
                        let _ = run.release().await;
                        return Err(e);
                    }
                },
                None => {
                    let token = token_for(shared, task_id, None);
                    token.cancel();
                    token
                }
            }
        } else {
            token_for(shared, task_id, None)
        };
        if live.stops_work() {
            token.cancel();
        }
        let call = live.context.call;
        Ok(Some(
            TaskResumeContext::new(call.tool, call.arguments, responses)
                .with_cancellation_token(token),
        ))
    }

    /// Moves the expiry, still counted from creation (T8). A terminal task
    /// changes no more (T4): `false`.
    async fn set_ttl(&self, task_id: &str, ttl_ms: u64) -> Result<bool> {
        let Some(task) = TaskId::parse(task_id) else {
            return Ok(false);
        };
        let ttl = Some(Duration::from_millis(ttl_ms));
        let applied = self
            .shared()
            .apply(&task, WorkerChange::SetTtl(ttl))
            .await?;
        Ok(!not_applied(&applied))
    }

    async fn complete_task(&self, task_id: &str, result: CallToolResult) -> Result<bool> {
        let Some(task) = TaskId::parse(task_id) else {
            return Ok(false);
        };
        let result = to_json(&result, "a task's result")?;
        let change = WorkerChange::Finish(Finish::Completed(&result));
        Ok(!not_applied(&self.shared().apply(&task, change).await?))
    }

    async fn fail_task(&self, task_id: &str, error: JsonRpcError) -> Result<bool> {
        let Some(task) = TaskId::parse(task_id) else {
            return Ok(false);
        };
        let error = to_json(&error, "a task's error")?;
        let change = WorkerChange::Finish(Finish::Failed(&error));
        Ok(!not_applied(&self.shared().apply(&task, change).await?))
    }

    /// Raises the task's token in this process before anything else, then
    /// ends the task `cancelled` in one step (T6, `CancelMode::Immediate`);
    /// a terminal task comes back unchanged. The guard of the process
    /// running the task raises its token there. The reason is kept with the
    /// task (T20, cut to the store's 4 KiB), and its status message reads
    /// `Cancelled: <reason>`, as tower-mcp's own store shows it.
    async fn cancel_task(&self, task_id: &str, reason: Option<&str>) -> Result<Option<TaskObject>> {
        let reason = reason.map(fit_message);
        let shared = self.shared();
        let Found::Live(live) = shared.read(task_id).await? else {
            return Ok(None);
        };
        raise(shared, task_id);
        let after = shared
            .runtime
            .store()
            .request_cancel(task_id, &live.view.owner, CancelMode::Immediate, reason)
            .await
            .map_err(task_error)?;
        Ok(after.map(|record| task_object(task_id, &record, &live.context)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_bind_apart_even_empty_and_long() {
        let long = Some("o".repeat(10_000));
        let owners = [None, Some(String::new()), Some("alice".into()), long];
        let bound: Vec<Owner> = owners.iter().map(|o| core_owner(o).unwrap()).collect();
        for (i, a) in bound.iter().enumerate() {
            for b in &bound[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(bound[0], Owner::Anonymous);
    }

    #[test]
    fn messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = fit_message(&long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES && cut.len() > MAX_MESSAGE_BYTES - 2);
        assert_eq!(fit_message("short"), "short");
    }

    #[test]
    fn answers_and_contexts_refuse_what_they_did_not_write() {
        let nonce = [7; NONCE_LEN];
        let stored = encode_answer(&nonce, b"{\"action\":\"accept\"}");
        assert_eq!(
            decode_answer(&stored).unwrap(),
            (&nonce[..], &b"{\"action\":\"accept\"}"[..])
        );
        for bad in [&b""[..], b"\x01short", b"{\"action\":\"accept\"}"] {
            assert!(matches!(decode_answer(bad), Err(TaskStoreError::Decode(_))));
        }
        let context = Context::new("t", serde_json::json!({"a": [1, 2]}), Some(String::new()));
        let back = Context::decode(&context.encode().unwrap()).unwrap();
        assert_eq!(back.owner, Some(String::new()));
        assert_eq!(back.call.arguments, serde_json::json!({"a": [1, 2]}));
        let newer = br#"{"v":2,"tool":"t","arguments":null,"owner":null}"#;
        assert!(
            matches!(Context::decode(newer), Err(TaskStoreError::Decode(m)) if m.contains("version 2"))
        );
        assert!(matches!(
            Context::decode(b"not json"),
            Err(TaskStoreError::Decode(_))
        ));
        // rmcp's calls carry no version: not this adapter's.
        assert!(matches!(
            Context::decode(br#"{"tool":"t","arguments":null}"#),
            Err(TaskStoreError::Decode(_))
        ));
    }

    /// The contexts this adapter wrote before its call was the runtime's
    /// `TaskCall` (stored tasks survive an upgrade), and what it writes
    /// now: the same fields, and the trace when there is one.
    #[test]
    fn contexts_written_before_read_the_same() {
        let old = br#"{"v":1,"tool":"slow_count","arguments":{"count":2},"owner":"u:alice","meta":{"k":"x"}}"#;
        let context = Context::decode(old).unwrap();
        assert_eq!(context.call.tool, "slow_count");
        assert_eq!(context.call.arguments, serde_json::json!({"count": 2}));
        assert_eq!(context.owner.as_deref(), Some("u:alice"));
        assert_eq!(context.meta, Some(serde_json::json!({"k": "x"})));
        assert!(context.call.extra.is_empty());
        let again: Value = serde_json::from_slice(&context.encode().unwrap()).unwrap();
        assert_eq!(again, serde_json::from_slice::<Value>(old).unwrap());

        let anonymous = br#"{"v":1,"tool":"t","arguments":null,"owner":null}"#;
        let context = Context::decode(anonymous).unwrap();
        assert_eq!((context.owner, context.meta), (None, None));

        let mut traced = Context::decode(anonymous).unwrap();
        traced.call.traceparent =
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        traced
            .call
            .extra
            .insert("later".into(), serde_json::json!(true));
        let bytes = traced.encode().unwrap();
        let raw: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(raw["v"], 1);
        assert_eq!(raw["owner"], Value::Null);
        assert_eq!(raw["later"], true, "fields of a later release are kept");
        let back = Context::decode(&bytes).unwrap();
        assert_eq!(back.call.traceparent, traced.call.traceparent);
        assert_eq!(TaskCall::tool_of(&bytes).unwrap(), "t");
    }
}
