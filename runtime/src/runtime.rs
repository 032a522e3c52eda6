//! [`Runtime`]: one instance with one lease, and one maintenance loop.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mcp_event_store_core::observe::names;
use mcp_event_store_core::task::{
    Applied, DEFAULT_MAX_ATTEMPTS, Finish, InstanceId, NewTask, RuntimeStore, TaskDigest, TaskId,
    TaskRecord, TaskStatus, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, MAX_LIST_PAGE, Result, Store};
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

use crate::TaskCall;
use crate::card::{CARD_EVERY, InstanceCard};
use crate::run::TaskRun;
use crate::takeover::Executor;

/// How long one renewal keeps an instance alive by default (T11); it is
/// renewed every third of that.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How often expired events, sessions and tasks are purged by default.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);
/// How often the takeover runner looks for tasks to claim by default.
pub const DEFAULT_CLAIM_EVERY: Duration = Duration::from_secs(1);
/// How many claimed tasks one runtime runs at once by default.
pub const DEFAULT_MAX_RUNNING: usize = 16;
/// The longest a run waits on one watch of its task by default: it bounds
/// how long a run keeps going on a task that already reads expired or
/// lost, which wake no one.
pub const DEFAULT_WATCH_WAIT: Duration = Duration::from_secs(5);

/// The most claimed tasks a runtime may run at once.
pub const MAX_RUNNING: usize = 4096;

/// How many fresh instance ids registration tries before it gives up: a
/// fresh id is refused only if it was seen lapsed, which a working random
/// source never draws.
const REGISTRATION_TRIES: usize = 8;

/// The version an instance's card gives unless the server names its own
/// ([`RuntimeBuilder::version`]).
pub const DEFAULT_VERSION: &str = concat!("mcp-event-store-runtime ", env!("CARGO_PKG_VERSION"));

/// One server instance over a shared store: its lease, its maintenance
/// loop and its task runs; see the [crate docs](crate).
///
/// Cheap to clone; clones share everything. The maintenance loop runs
/// while a clone lives (every adapter serving with the runtime holds one),
/// and stops at [`shutdown`](Self::shutdown).
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

/// Builds a [`Runtime`]; see [`Runtime::builder`]. Every setting has a
/// default, the same for every framework.
#[derive(Clone)]
pub struct RuntimeBuilder {
    store: Arc<dyn Store>,
    settings: Settings,
    version: String,
}

/// What a builder sets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    pub(crate) lease: Duration,
    pub(crate) purge_every: Option<Duration>,
    pub(crate) claim_every: Duration,
    pub(crate) max_running: usize,
    pub(crate) max_attempts: u32,
    pub(crate) hand_off: bool,
    pub(crate) watch_wait: Duration,
    pub(crate) producer_ttl: Duration,
    pub(crate) count_tasks_every: Option<Duration>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) settings: Settings,
    /// The instance this runtime runs as: replaced when it lapsed.
    /// (A watch, so that what is addressed to the instance, its replies
    /// on the bus, follows a replacement.)
    pub(crate) instance: tokio::sync::watch::Sender<InstanceId>,
    /// Held while a lapsed instance is replaced, so that the calls that
    /// find it lapsed at once register one new instance between them.
    registering: tokio::sync::Mutex<()>,
    /// What runs the tasks this runtime claims, while a [`Takeovers`]
    /// handle lives, with that handle's generation.
    ///
    /// [`Takeovers`]: crate::Takeovers
    pub(crate) executor: Mutex<Option<(u64, Arc<dyn Executor>)>>,
    /// The generation of the newest [`Takeovers`](crate::Takeovers).
    pub(crate) generations: AtomicU64,
    /// The claimed runs under way, to stop them with the runner.
    pub(crate) runs: Mutex<HashMap<TaskDigest, (AbortHandle, TaskRun)>>,
    /// A permit per claimed run.
    pub(crate) running: Arc<Semaphore>,
    /// Held while claiming, so that two rounds never claim at once.
    pub(crate) claiming: tokio::sync::Mutex<()>,
    maintenance: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    /// The store's bus, for what instances tell each other.
    pub(crate) bus: mcp_event_store_core::bus::StoreBus,
    /// How many request ids this runtime minted.
    pub(crate) requests: AtomicU64,
    /// How many answers were dropped as no request's here.
    pub(crate) dropped: AtomicU64,
    /// Turns `true` at shutdown: listeners end.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// The one subscription to notifications that every
    /// [`notifications`](Runtime::notifications) listener of this runtime
    /// shares, made by the first.
    pub(crate) notified: tokio::sync::OnceCell<crate::bus::Fanout<crate::Notification>>,
    /// Sessions ended anywhere lately ([`Runtime::session_ended`]).
    ended: Mutex<crate::bus::Ended>,
    /// The instance whose lease the store last accepted, and when the
    /// accepted registration or renewal was sent (`None` once the store
    /// answered that it lapsed): what [`Runtime::lease_remaining`] reads.
    renewed: Mutex<(InstanceId, Option<Instant>)>,
    /// What this instance's card says ([`InstanceCard`]).
    version: String,
    started_millis: i64,
    /// The instance whose card was last appended, and when.
    carded: Mutex<Option<(InstanceId, Instant)>>,
}

impl Inner {
    pub(crate) fn ended(&self) -> std::sync::MutexGuard<'_, crate::bus::Ended> {
        lock(&self.ended)
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("instance", &self.instance())
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Runtime {
    /// Starts building the runtime of one instance over `store` (any of
    /// ours: an `Arc` of a concrete store, or the facade's `DynStore`).
    pub fn builder(store: Arc<dyn Store>) -> RuntimeBuilder {
        let producer_ttl = store
            .retention()
            .max_age
            .unwrap_or(crate::streams::DEFAULT_PRODUCER_TTL);
        RuntimeBuilder {
            store,
            settings: Settings {
                lease: DEFAULT_LEASE,
                purge_every: Some(DEFAULT_PURGE_EVERY),
                claim_every: DEFAULT_CLAIM_EVERY,
                max_running: DEFAULT_MAX_RUNNING,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                hand_off: false,
                watch_wait: DEFAULT_WATCH_WAIT,
                producer_ttl,
                count_tasks_every: None,
            },
            version: DEFAULT_VERSION.to_owned(),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The instance this runtime runs as now (a fresh one replaces it if
    /// it lapsed).
    pub fn instance(&self) -> InstanceId {
        *self.inner.instance.borrow()
    }

    /// How long one renewal keeps this instance alive.
    pub fn lease(&self) -> Duration {
        self.inner.settings.lease
    }

    /// How much longer this instance's lease holds, as far as this runtime
    /// knows, if no renewal succeeds before then: the [lease](Self::lease)
    /// minus the time since the last registration or renewal the store
    /// accepted for the current [instance](Self::instance), counted from
    /// when it was sent (so never later than the store's own expiry, clock
    /// rates aside). Reads no store.
    ///
    /// `None` when the lease is not current: no renewal was accepted within
    /// the last lease (the store is unreachable, refuses writes, or the
    /// process stalled), the store answered that the instance lapsed (until
    /// a fresh one is registered), or the runtime was
    /// [shut down](Self::shutdown). For a readiness probe: an instance
    /// whose lease is not current has its tasks taken over or read failed
    /// elsewhere, and should not take new work.
    pub fn lease_remaining(&self) -> Option<Duration> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return None;
        }
        let (instance, renewed) = *lock(&self.inner.renewed);
        if instance != self.instance() {
            return None;
        }
        self.lease()
            .checked_sub(renewed?.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// Whether this instance's lease is current, as far as this runtime
    /// knows: [`lease_remaining`](Self::lease_remaining) is `Some`.
    pub fn lease_current(&self) -> bool {
        self.lease_remaining().is_some()
    }

    /// Whether this instance is ready for traffic, for a readiness probe:
    /// its lease is [current](Self::lease_current), and the store answers,
    /// within `timeout`, that it counts this instance alive
    /// ([`RuntimeStore::is_alive`], one read by key). Otherwise the checks
    /// that failed, one short line each (`lease: ...`, `store: ...`); the
    /// store's error itself goes to the log, not into the lines, which an
    /// unauthenticated probe may read.
    pub async fn readiness(&self, timeout: Duration) -> std::result::Result<(), Vec<String>> {
        let mut failed = Vec::new();
        if !self.lease_current() {
            failed.push(format!(
                "lease: not current (no renewal accepted by the store within the lease, {:?})",
                self.lease()
            ));
        }
        let instance = self.instance();
        let alive = self.store().task_runtime().is_alive(instance);
        match tokio::time::timeout(timeout, alive).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => failed.push(format!(
                "lease: the store counts this instance ({instance}) lapsed"
            )),
            Ok(Err(error)) => {
                tracing::warn!(%error, "readiness: the store failed");
                failed.push("store: failed (the server's log says why)".to_owned());
            }
            Err(_) => {
                tracing::warn!(?timeout, "readiness: the store did not answer");
                failed.push(format!("store: no answer within {timeout:?}"));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }

    /// The longest a run waits on one watch of its task.
    pub fn watch_wait(&self) -> Duration {
        self.inner.settings.watch_wait
    }

    /// The most runs a task taken over gets ([`RuntimeBuilder::max_attempts`]).
    pub fn max_attempts(&self) -> u32 {
        self.inner.settings.max_attempts
    }

    /// Whether tasks to be taken over are queued for workers
    /// ([`RuntimeBuilder::hand_off_to_workers`]).
    pub fn hands_off(&self) -> bool {
        self.inner.settings.hand_off
    }

    /// `task` made a task that may be taken over (T16): at most
    /// [`max_attempts`](Self::max_attempts) runs, and queued for a worker
    /// when this runtime [hands off](RuntimeBuilder::hand_off_to_workers).
    pub fn for_takeover<'a>(&self, task: NewTask<'a>) -> NewTask<'a> {
        let task = task.takeover(self.max_attempts());
        if self.hands_off() {
            task.queued()
        } else {
            task
        }
    }

    /// Creates `task` under this runtime's instance (T1, T11) and returns
    /// the creator's run of it (claim epoch 1 for a task that may be taken
    /// over). The store refuses an instance it counts lapsed, which happens
    /// when this process stalled longer than its lease and its renewal has
    /// not noticed yet: then a fresh instance is registered and the task
    /// created under it. [`Error::Closed`] after [`shutdown`](Self::shutdown).
    pub async fn create(&self, mut task: NewTask<'_>) -> Result<(TaskId, TaskRecord, TaskRun)> {
        self.ensure_open()?;
        task.instance = self.instance();
        let mut tries = 0;
        let (id, record) = loop {
            match self.inner.store.create(task).await {
                Err(Error::InstanceLapsed { .. }) if tries < 2 => {
                    tries += 1;
                    task.instance = self.replace_lapsed(task.instance).await?;
                }
                created => break created?,
            }
        };
        let claim =
            (record.takeover.is_some() && !task.queued).then(|| Worker::first(task.instance));
        let run = TaskRun::created(self.clone(), &id, *task.owner, claim, task.context);
        Ok((id, record, run))
    }

    /// [`create`](Self::create)s `task` to run `call`: its context is the
    /// call's encoding, with (feature `otel`) the W3C trace context of the
    /// current span ([`TaskCall::with_current_trace`]), which the task's
    /// claimed runs continue ([`TaskRun::span`]). What both integrations
    /// create their tasks with.
    pub async fn create_call(
        &self,
        task: NewTask<'_>,
        call: &TaskCall,
    ) -> Result<(TaskId, TaskRecord, TaskRun)> {
        let context = call.clone().with_current_trace().encode();
        self.create(task.context(&context)).await
    }

    /// Applies a change to the task under `task` (T4): under `claim`, the
    /// claim this runtime runs the task under (T18), or, for a task that
    /// dies with its instance (`None`), as this runtime's instance. A write
    /// under a claim another claim replaced is [`Applied::Fenced`] and
    /// changes nothing: the caller must stop working on the task.
    pub async fn write(
        &self,
        task: &TaskDigest,
        claim: Option<Worker>,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let by = claim.unwrap_or_else(|| Worker::first(self.instance()));
        self.runtime_store().apply_claimed(task, by, change).await
    }

    /// Stops the maintenance loop and the takeover runner (the runs it
    /// claimed are aborted), and ends this instance's lease at once
    /// ([`RuntimeStore::retire`]): the tasks it ran are taken over by
    /// other instances (or read `failed`) now rather than a lease later,
    /// and resumes elsewhere of the streams it wrote end at their next
    /// check. For a graceful shutdown, once the server stopped serving.
    /// The store stays open; the runtime creates no task after it.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.stopping.send_replace(true);
        let maintenance = lock(&self.inner.maintenance).take();
        if let Some(maintenance) = maintenance {
            maintenance.abort();
            let _ = maintenance.await;
        }
        // The claimed runs' tasks given back before the lease ends, so
        // that none counts an attempt for it.
        let given_back = crate::takeover::stop_runner(&self.inner, None);
        let _ = tokio::time::timeout(self.lease() / 3, given_back).await;
        let me = self.instance();
        if let Err(error) = self.runtime_store().retire(me).await {
            tracing::warn!(%error, instance = %me, "cannot end this instance's lease; it lapses on its own");
        }
    }

    pub(crate) fn runtime_store(&self) -> &dyn RuntimeStore {
        self.inner.store.task_runtime()
    }

    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::SeqCst) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// Registers a fresh instance in place of `lapsed` (a lapsed id is
    /// never revived, T11), unless another call replaced it already; the
    /// instance to work under from now on.
    pub(crate) async fn replace_lapsed(&self, lapsed: InstanceId) -> Result<InstanceId> {
        self.ensure_open()?;
        let _one_at_a_time = self.inner.registering.lock().await;
        let current = self.instance();
        if current != lapsed {
            return Ok(current);
        }
        tracing::warn!(
            instance = %lapsed,
            "this instance's lease lapsed (was the process paused?); its tasks are taken over or \
             read failed, and new work runs under a fresh instance"
        );
        let (fresh, sent) = register(self.runtime_store(), self.lease()).await?;
        *lock(&self.inner.renewed) = (fresh, Some(sent));
        self.inner.instance.send_replace(fresh);
        Ok(fresh)
    }
}

impl RuntimeBuilder {
    /// How long one renewal keeps this instance alive (default
    /// [`DEFAULT_LEASE`], 30 s); renewed every third of it. A killed
    /// instance's tasks are taken over (or read `failed`), and resumes of
    /// its streams elsewhere end, this long after it died.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How often expired events, sessions and tasks are purged (default
    /// [`DEFAULT_PURGE_EVERY`], the first purge one interval after the
    /// start); `None` leaves purging to someone else (another instance, or
    /// an operator's `mcp-event-store purge`). Until someone purges,
    /// expired data still reads expired but keeps its space.
    pub fn purge_every(mut self, every: Option<Duration>) -> Self {
        self.settings.purge_every = every;
        self
    }

    /// How often the takeover runner looks for tasks to claim (default
    /// [`DEFAULT_CLAIM_EVERY`]): a task whose instance lapsed runs again
    /// within a lease and this interval.
    pub fn claim_every(mut self, every: Duration) -> Self {
        self.settings.claim_every = every;
        self
    }

    /// How many claimed tasks this runtime runs at once (default
    /// [`DEFAULT_MAX_RUNNING`], 1 to [`MAX_RUNNING`]). Tasks created and run here are
    /// not counted: the requests that create them bound them.
    pub fn max_running(mut self, tasks: usize) -> Self {
        self.settings.max_running = tasks;
        self
    }

    /// The most runs a task taken over gets (T16, default 3, at least 1):
    /// when the instance running it lapses, another claims it and runs it
    /// again, up to this many runs in all; then it reads `failed` ("server
    /// instance lost"). Runs given back for input do not count.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts;
        self
    }

    /// Queues tasks to be taken over for workers instead of running them
    /// here ([`NewTask::queued`]), and claims nothing: this runtime is a
    /// front end, and a runtime without this setting (a worker process, for
    /// instance) runs them.
    pub fn hand_off_to_workers(mut self) -> Self {
        self.settings.hand_off = true;
        self
    }

    /// The longest a run waits on one watch of its task (default
    /// [`DEFAULT_WATCH_WAIT`]).
    pub fn watch_wait(mut self, wait: Duration) -> Self {
        self.settings.watch_wait = wait;
        self
    }

    /// How long the writer of each stream is remembered (default: the
    /// store's `max_age`, else
    /// [`DEFAULT_PRODUCER_TTL`](crate::DEFAULT_PRODUCER_TTL)); keep it at
    /// least as long as events are retained.
    pub fn producer_ttl(mut self, ttl: Duration) -> Self {
        self.settings.producer_ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// The version this instance's card gives operators
    /// ([`InstanceCard`], `mcp-event-store instances`); by default
    /// [`DEFAULT_VERSION`]. A server gives its own name and version.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Counts the store's tasks by status every `every` into the gauge
    /// `mcp_event_store_tasks` (label `status`); off (`None`) by default.
    /// Each count reads every task the store holds (a listing read and a
    /// task read per task, T22), so give it minutes, on one instance.
    pub fn count_tasks_every(mut self, every: Option<Duration>) -> Self {
        self.settings.count_tasks_every = every.filter(|every| !every.is_zero());
        self
    }

    /// Registers the instance (its first lease, retried under fresh ids),
    /// appends its card ([`InstanceCard`]) and starts the maintenance loop;
    /// needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a lease under 3 ms, a zero purge or claim
    /// interval or watch wait, no running task or no attempt; the store's
    /// error if registering fails.
    pub async fn start(self) -> Result<Runtime> {
        let s = self.settings;
        if s.lease < Duration::from_millis(3) {
            return Err(Error::Config(format!(
                "an instance lease must be at least 3 ms, got {:?}",
                s.lease
            )));
        }
        if s.purge_every.is_some_and(|every| every.is_zero())
            || s.claim_every.is_zero()
            || s.watch_wait.is_zero()
        {
            return Err(Error::Config(
                "the purge and claim intervals and the watch wait must not be zero (None turns \
                 purging off)"
                    .into(),
            ));
        }
        if s.max_running == 0 || s.max_running > MAX_RUNNING || s.max_attempts == 0 {
            return Err(Error::Config(format!(
                "a runtime needs 1 to {MAX_RUNNING} running tasks ({}) and at least one attempt \
                 ({})",
                s.max_running, s.max_attempts
            )));
        }
        let (instance, sent) = register(self.store.task_runtime(), s.lease).await?;
        let inner = Arc::new(Inner {
            bus: crate::bus::new_bus(&self.store),
            requests: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            stopping: tokio::sync::watch::Sender::new(false),
            notified: tokio::sync::OnceCell::new(),
            ended: Mutex::default(),
            store: self.store,
            settings: s,
            instance: tokio::sync::watch::Sender::new(instance),
            registering: tokio::sync::Mutex::new(()),
            executor: Mutex::default(),
            generations: AtomicU64::new(0),
            runs: Mutex::default(),
            running: Arc::new(Semaphore::new(s.max_running)),
            claiming: tokio::sync::Mutex::new(()),
            maintenance: Mutex::default(),
            closed: AtomicBool::new(false),
            renewed: Mutex::new((instance, Some(sent))),
            version: self.version,
            started_millis: wall_millis(),
            carded: Mutex::default(),
        });
        // Before the start returns, so that it never races what its caller
        // does with the store next (it is one append; a failure is logged).
        inner.clone().card().await;
        let maintenance = tokio::spawn(maintain(Arc::downgrade(&inner)));
        *lock(&inner.maintenance) = Some(maintenance);
        Ok(Runtime { inner })
    }
}

/// Registers a fresh instance with its first lease, and says when the
/// accepted registration was sent; a refused id (one the store saw lapse)
/// is drawn again.
async fn register(store: &dyn RuntimeStore, lease: Duration) -> Result<(InstanceId, Instant)> {
    for _ in 0..REGISTRATION_TRIES {
        let id = InstanceId::generate()?;
        let sent = Instant::now();
        if store.heartbeat(id, lease).await? {
            return Ok((id, sent));
        }
    }
    Err(Error::Corrupt(format!(
        "{REGISTRATION_TRIES} fresh instance ids in a row were refused"
    )))
}

impl Inner {
    /// One renewal; a lapsed instance is replaced by a fresh one. Errors
    /// are logged: the next renewal tries again.
    async fn beat(self: Arc<Self>) {
        let runtime = Runtime { inner: self };
        let me = runtime.instance();
        let sent = Instant::now();
        match runtime.runtime_store().heartbeat(me, runtime.lease()).await {
            Ok(true) => {
                // Only for the instance renewed (a fresh one may have
                // replaced it meanwhile), never back to an older renewal
                // that answered late, and never for one seen lapsed (a
                // renewal in flight before that is no revival).
                let mut renewed = lock(&runtime.inner.renewed);
                if let (true, Some(at)) = (renewed.0 == me, &mut renewed.1) {
                    *at = (*at).max(sent);
                }
            }
            Ok(false) => {
                {
                    let mut renewed = lock(&runtime.inner.renewed);
                    if renewed.0 == me {
                        renewed.1 = None;
                    }
                }
                if let Err(error) = runtime.replace_lapsed(me).await {
                    tracing::warn!(%error, "registering a fresh instance failed; retrying");
                }
            }
            Err(error) => tracing::warn!(instance = %me, %error, "renewing the lease failed"),
        }
        Arc::clone(&runtime.inner).card().await;
    }

    /// Appends this instance's card ([`InstanceCard`]) when the instance
    /// has none yet (it started, or replaced a lapsed one) or its last is
    /// older than [`CARD_EVERY`] (half the store's `max_age` when that is
    /// shorter, so the newest card is always retained). Best effort: a
    /// failure is tried again at the next renewal.
    async fn card(self: Arc<Self>) {
        let me = *self.instance.borrow();
        let every = self
            .store
            .retention()
            .max_age
            .map_or(CARD_EVERY, |age| CARD_EVERY.min(age / 2));
        if lock(&self.carded).is_some_and(|(id, at)| id == me && at.elapsed() < every) {
            return;
        }
        let card = InstanceCard::new(me, self.version.clone(), self.started_millis);
        match card.announce(&*self.store).await {
            Ok(()) => *lock(&self.carded) = Some((me, Instant::now())),
            Err(error) => tracing::debug!(%error, "appending the instance card failed"),
        }
    }

    /// Counts the store's tasks by status into the `mcp_event_store_tasks`
    /// gauge ([`RuntimeBuilder::count_tasks_every`]).
    async fn count_tasks(self: Arc<Self>) {
        let mut counts = [0u64; TaskStatus::ALL.len()];
        let runtime = self.store.task_runtime();
        let mut after = None;
        loop {
            match runtime.task_page(after.as_ref(), MAX_LIST_PAGE).await {
                Ok(page) => {
                    for entry in &page.tasks {
                        counts[usize::from(entry.view.record.status.as_u8())] += 1;
                    }
                    match page.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "counting tasks failed");
                    return;
                }
            }
        }
        for status in TaskStatus::ALL {
            metrics::gauge!(names::TASKS, "status" => status.as_str())
                .set(counts[usize::from(status.as_u8())] as f64);
        }
    }

    /// Purges expired events and sessions, then expired and orphaned
    /// tasks; a failure is logged and tried again next time (what it would
    /// have written, reads already show).
    async fn purge(self: Arc<Self>) {
        match self.store.purge_expired().await {
            Ok(report) => tracing::debug!(?report, "purged events and sessions"),
            Err(error) => tracing::warn!(%error, "event and session purge failed"),
        }
        match self.store.purge_expired_tasks().await {
            Ok(report) => tracing::debug!(?report, "purged tasks"),
            Err(error) => tracing::warn!(%error, "task purge failed"),
        }
    }
}

/// The one maintenance loop: a renewal every third of the lease, a purge
/// every purge interval, a claim round every claim interval, while the
/// runtime lives. Each runs on a task of its own, so none waits for
/// another; a purge or a claim round still running when the next is due
/// is not started twice.
async fn maintain(inner: Weak<Inner>) {
    let Some(settings) = inner.upgrade().map(|inner| inner.settings) else {
        return;
    };
    let interval = |every: Duration| {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    };
    let mut beats = interval(settings.lease / 3);
    let mut purges = interval(settings.purge_every.unwrap_or(Duration::MAX / 4));
    let mut claims = interval(settings.claim_every);
    let mut counts = interval(settings.count_tasks_every.unwrap_or(Duration::MAX / 4));
    // The first ticks are at once: the instance was just registered, and
    // an executor registers after the start (`run_takeovers`), so the
    // first claim round is one `claim_every` after the start, not
    // whenever this task first runs.
    beats.tick().await;
    purges.tick().await;
    claims.tick().await;
    let mut purging: Option<JoinHandle<()>> = None;
    let mut claiming: Option<JoinHandle<()>> = None;
    let mut counting: Option<JoinHandle<()>> = None;
    let busy = |job: &Option<JoinHandle<()>>| job.as_ref().is_some_and(|job| !job.is_finished());
    loop {
        tokio::select! {
            _ = beats.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                tokio::spawn(inner.beat());
            }
            _ = purges.tick(), if settings.purge_every.is_some() => {
                let Some(inner) = inner.upgrade() else { return };
                if !busy(&purging) {
                    purging = Some(tokio::spawn(inner.purge()));
                }
            }
            _ = claims.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                if !busy(&claiming) && crate::takeover::claims_here(&inner) {
                    claiming = Some(tokio::spawn(crate::takeover::claim_round(inner)));
                }
            }
            _ = counts.tick(), if settings.count_tasks_every.is_some() => {
                let Some(inner) = inner.upgrade() else { return };
                if !busy(&counting) {
                    counting = Some(tokio::spawn(inner.count_tasks()));
                }
            }
        }
    }
}

/// Now by the wall clock, in ms since the epoch.
fn wall_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `Finish::Failed` with the JSON-RPC internal error for `message`.
pub(crate) fn failed_with(message: &str) -> Vec<u8> {
    crate::time::internal_error(message)
}

/// What a run that ended `finish` stores, or the failure that replaces an
/// outcome over the store's limit.
pub(crate) async fn store_finish(run: &TaskRun, finish: Finish<'_>) {
    let applied = match run.write(WorkerChange::Finish(finish)).await {
        Err(Error::PayloadTooLarge { size, max }) => {
            let error = failed_with(&format!(
                "the task's outcome is {size} bytes, the store's limit is {max}"
            ));
            run.write(WorkerChange::Finish(Finish::Failed(&error)))
                .await
        }
        other => other,
    };
    match applied {
        Ok(Applied::Changed { .. }) => {}
        Ok(Applied::Fenced) => {
            tracing::info!(task = ?run.digest(), "task taken over: this run's end is not stored")
        }
        Ok(other) => tracing::debug!(task = ?run.digest(), ?other, "task already ended"),
        Err(error) => tracing::warn!(task = ?run.digest(), %error, "cannot store the task's end"),
    }
}
