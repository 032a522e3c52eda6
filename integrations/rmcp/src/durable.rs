//! Everything rmcp needs from one store, wired once: [`Durable`].

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use mcp_event_store_core::task::{CancelMode, Owner};
use mcp_event_store_core::{DEFAULT_PRESENCE_LEASE, Error, Presence, Result, SessionStore, Store};
use rmcp::ServerHandler;
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::task::JoinHandle;

use crate::sessions::DEFAULT_SESSION_TTL;
use crate::tasks::{DurableTasks, DurableTasksBuilder};
use crate::{
    DEFAULT_FOLLOW_HOLD, DEFAULT_SESSION_CHECK_INTERVAL, RmcpEventStore, RmcpSessionStore,
    SessionScoped,
};

/// How often [`Durable`] purges the store by default: expired events and
/// sessions ([`EventStore::purge_expired`](mcp_event_store_core::EventStore::purge_expired)) and expired or orphaned tasks
/// ([`TaskStore::purge_expired_tasks`](mcp_event_store_core::task::TaskStore::purge_expired_tasks)).
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);

/// The retry hint of every stream's priming event by default (rmcp's
/// default): how long a client waits before it resumes.
pub const DEFAULT_SSE_RETRY: Duration = Duration::from_secs(3);

/// The session-mode manager [`Durable`] hands to rmcp.
pub type SessionManager = SessionScoped<LocalSessionManager, dyn Store>;

/// Everything rmcp's Streamable HTTP server needs from one store, every
/// guarantee wired once.
///
/// ```no_run
/// # use rmcp::{ServerHandler, model::ServerInfo};
/// # #[derive(Clone)] struct Counter;
/// # impl ServerHandler for Counter {}
/// # async fn demo() -> mcp_event_store_core::Result<()> {
/// use std::sync::Arc;
/// use mcp_event_store_rmcp::Durable;
///
/// let store = Arc::new(mcp_event_store_core::MemoryStore::new()); // or mcp_event_store::connect(url).await?
/// let service = Durable::builder(store).start().await?.service(|| Ok(Counter));
/// // axum::Router::new().nest_service("/mcp", service)
/// # let _ = service; Ok(()) }
/// ```
///
/// What one [`Durable`] wires, from the store alone:
///
/// * **Events**: the store as rmcp's `EventStore`
///   ([`RmcpEventStore`]); a resume follows its stream live for at most
///   the [follow hold](DurableBuilder::follow_hold), and ends early once
///   the instance writing the stream is known gone (the [`Presence`]).
/// * **Sessions** (session mode): the store as rmcp's `SessionStore`
///   ([`RmcpSessionStore`], in [`config`](Self::config)), so another
///   instance restores a session; rmcp's `LocalSessionManager` inside
///   [`SessionScoped`] (one per `Durable`, [`session_manager`](Self::session_manager)),
///   so a `Last-Event-ID` only resumes streams of its own session, stream
///   bindings live as long as the store's retention
///   ([`EventStore::retention`](mcp_event_store_core::EventStore::retention): never passed twice), and a session
///   deleted or expired on one instance ends on every instance.
/// * **Tasks** (MCP 2026-07-28): [`DurableTasks`] over the same store
///   ([`tasks`](Self::tasks)), to clone into each handler.
/// * **One maintenance loop**: every third of the
///   [lease](DurableBuilder::lease) it renews this instance's task
///   heartbeat and its presence (each on its own, so one never waits for
///   the other or for a purge), and every
///   [purge interval](DurableBuilder::purge_every) it purges expired
///   events, sessions and tasks, on a task of its own. It runs while the
///   `Durable` or anything serving with it (a service, a session manager,
///   the event store) lives, and stops at [`shutdown`](Self::shutdown).
///
/// Stateless mode (no MCP sessions) takes [`stateless_service`](Self::stateless_service),
/// or [`stateless_session_manager`](Self::stateless_session_manager) and
/// [`stateless_config`](Self::stateless_config).
///
/// Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct Durable {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    events: RmcpEventStore<dyn Store>,
    sessions: Arc<RmcpSessionStore<dyn Store>>,
    session_manager: Arc<SessionManager>,
    tasks: DurableTasks,
    presence: Presence,
    sse_retry: Duration,
    maintenance: Mutex<Option<JoinHandle<()>>>,
}

/// Held by every event store a [`Durable`] hands out (so by every service
/// and manager): the maintenance loop runs while one lives.
#[derive(Debug)]
pub(crate) struct Alive;

impl fmt::Debug for Durable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Durable")
            .field("events", &self.inner.events)
            .field("tasks", &self.inner.tasks)
            .field("presence", &self.inner.presence)
            .field("sse_retry", &self.inner.sse_retry)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Durable`]; see [`Durable::builder`]. Every setting has a
/// default; the store itself gives the rest.
pub struct DurableBuilder {
    store: Arc<dyn Store>,
    follow_hold: Option<Duration>,
    lease: Duration,
    purge_every: Option<Duration>,
    session_ttl: Duration,
    session_check: Duration,
    sse_retry: Duration,
    tasks: DurableTasksBuilder,
}

impl fmt::Debug for DurableBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableBuilder")
            .field("follow_hold", &self.follow_hold)
            .field("lease", &self.lease)
            .field("purge_every", &self.purge_every)
            .field("session_ttl", &self.session_ttl)
            .field("session_check", &self.session_check)
            .field("sse_retry", &self.sse_retry)
            .field("tasks", &self.tasks)
            .finish_non_exhaustive()
    }
}

impl Durable {
    /// Starts wiring `store` (any of ours: an `Arc` of a concrete store, or
    /// the facade's `DynStore`).
    pub fn builder(store: Arc<dyn Store>) -> DurableBuilder {
        let tasks = DurableTasks::builder(store.clone());
        DurableBuilder {
            store,
            follow_hold: Some(DEFAULT_FOLLOW_HOLD),
            lease: DEFAULT_PRESENCE_LEASE,
            purge_every: Some(DEFAULT_PURGE_EVERY),
            session_ttl: DEFAULT_SESSION_TTL,
            session_check: DEFAULT_SESSION_CHECK_INTERVAL,
            sse_retry: DEFAULT_SSE_RETRY,
            tasks,
        }
    }

    /// The session-mode service: rmcp's Streamable HTTP service with
    /// `handler` making each session's handler, [`session_manager`](Self::session_manager)
    /// and [`config`](Self::config). Serve it with axum's
    /// `Router::nest_service("/mcp", service)`.
    pub fn service<H, F>(&self, handler: F) -> StreamableHttpService<H, SessionManager>
    where
        H: ServerHandler + Send + 'static,
        F: Fn() -> std::io::Result<H> + Send + Sync + 'static,
    {
        StreamableHttpService::new(handler, self.session_manager(), self.config())
    }

    /// The stateless-mode service (no MCP sessions; streams still stored
    /// and resumable with `GET` + `Last-Event-ID`).
    pub fn stateless_service<H, F>(
        &self,
        handler: F,
    ) -> StreamableHttpService<H, NeverSessionManager>
    where
        H: ServerHandler + Send + 'static,
        F: Fn() -> std::io::Result<H> + Send + Sync + 'static,
    {
        StreamableHttpService::new(
            handler,
            self.stateless_session_manager(),
            self.stateless_config(),
        )
    }

    /// The one session-mode manager of this `Durable`: rmcp's
    /// `LocalSessionManager` with the event store, inside [`SessionScoped`].
    /// Every service of this instance must share it (it holds the live
    /// sessions).
    pub fn session_manager(&self) -> Arc<SessionManager> {
        self.inner.session_manager.clone()
    }

    /// rmcp's configuration for session mode: its defaults, the priming
    /// events' retry hint and the session store. Change what else you need
    /// (allowed hosts, a cancellation token) on the value returned.
    pub fn config(&self) -> StreamableHttpServerConfig {
        let mut config =
            StreamableHttpServerConfig::default().with_sse_retry(Some(self.inner.sse_retry));
        config.session_store = Some(self.inner.sessions.clone());
        config
    }

    /// A stateless-mode manager: rmcp's `NeverSessionManager` with the
    /// event store.
    pub fn stateless_session_manager(&self) -> Arc<NeverSessionManager> {
        Arc::new(
            NeverSessionManager::default().with_event_store(Arc::new(self.inner.events.clone())),
        )
    }

    /// rmcp's configuration for stateless mode: its defaults, the priming
    /// events' retry hint, no sessions.
    pub fn stateless_config(&self) -> StreamableHttpServerConfig {
        StreamableHttpServerConfig::default()
            .with_sse_retry(Some(self.inner.sse_retry))
            .with_legacy_session_mode(false)
    }

    /// The durable-task runtime, to clone into each handler (its
    /// `call_tool`, `get_task`, `update_task` and `cancel_task`).
    pub fn tasks(&self) -> DurableTasks {
        self.inner.tasks.clone()
    }

    /// The event store as rmcp's `EventStore`, as the services use it.
    pub fn events(&self) -> &RmcpEventStore<dyn Store> {
        &self.inner.events
    }

    /// The session store as rmcp's `SessionStore`, as [`config`](Self::config) sets it.
    pub fn sessions(&self) -> &Arc<RmcpSessionStore<dyn Store>> {
        &self.inner.sessions
    }

    /// This instance's presence in the store.
    pub fn presence(&self) -> &Presence {
        &self.inner.presence
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Stops the maintenance loop and removes this instance's presence, so
    /// resumes of its unfinished calls on other instances end at their
    /// next check: for a graceful shutdown, after the server stopped
    /// serving. The store stays open.
    pub async fn shutdown(&self) {
        let maintenance = self
            .inner
            .maintenance
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(maintenance) = maintenance {
            maintenance.abort();
            let _ = maintenance.await;
        }
        self.inner.presence.close().await;
    }
}

impl DurableBuilder {
    /// How long a resume follows its stream at most when no answer ends it
    /// (default [`DEFAULT_FOLLOW_HOLD`], five minutes); `None` makes every
    /// resume a plain replay of what is stored (the client polls).
    pub fn follow_hold(mut self, hold: Option<Duration>) -> Self {
        self.follow_hold = hold;
        self
    }

    /// How long one renewal keeps this instance alive, for its durable
    /// tasks (T11) and for resumes of its streams elsewhere (default
    /// [`DEFAULT_PRESENCE_LEASE`], 30 s); renewed every third of it. A
    /// killed instance's running tasks read `failed`, and resumes of its
    /// calls end, this long after it died.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often expired events, sessions and tasks are purged (default
    /// [`DEFAULT_PURGE_EVERY`]); `None` leaves purging to someone else
    /// (another instance, or an operator's `mcp-event-store purge`).
    pub fn purge_every(mut self, every: Option<Duration>) -> Self {
        self.purge_every = every;
        self
    }

    /// How long a session stays restorable on another instance (default
    /// [`DEFAULT_SESSION_TTL`], 24 hours).
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// How often, at most, each session held in memory is looked up in the
    /// store, so that one deleted or expired elsewhere ends here (default
    /// one second; zero: on every request).
    pub fn session_check_interval(mut self, every: Duration) -> Self {
        self.session_check = every;
        self
    }

    /// The retry hint of every stream's priming event (default
    /// [`DEFAULT_SSE_RETRY`]). Priming events are what lets a stream be
    /// resumed before its first message, and what records its writer.
    pub fn sse_retry(mut self, retry: Duration) -> Self {
        self.sse_retry = retry;
        self
    }

    /// Who may see the tasks a request creates (T3); see
    /// [`DurableTasksBuilder::owner`].
    pub fn owner(
        mut self,
        owner: impl Fn(&RequestContext<RoleServer>) -> Owner + Send + Sync + 'static,
    ) -> Self {
        self.tasks = self.tasks.owner(owner);
        self
    }

    /// How `tasks/cancel` ends a task (T6); default cooperative.
    pub fn cancel_mode(mut self, mode: CancelMode) -> Self {
        self.tasks = self.tasks.cancel_mode(mode);
        self
    }

    /// Anything else of the durable-task runtime: resumable tools
    /// ([`DurableTasksBuilder::resumable`]), handing them off to workers,
    /// their attempts, the claim interval and bound. The heartbeat, its
    /// lease and purging are this builder's ([`lease`](Self::lease),
    /// [`purge_every`](Self::purge_every)) and override the same settings
    /// made here.
    ///
    /// ```no_run
    /// # async fn demo(store: std::sync::Arc<dyn mcp_event_store_core::Store>) -> mcp_event_store_core::Result<()> {
    /// use mcp_event_store_rmcp::Durable;
    /// use rmcp::model::{CallToolResult, ContentBlock};
    ///
    /// let durable = Durable::builder(store)
    ///     .tasks(|tasks| {
    ///         tasks.resumable("echo", |_task, call| {
    ///             Box::pin(async move {
    ///                 let text = format!("{:?}", call.arguments);
    ///                 Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    ///             })
    ///         })
    ///     })
    ///     .start()
    ///     .await?;
    /// # let _ = durable; Ok(()) }
    /// ```
    pub fn tasks(
        mut self,
        configure: impl FnOnce(DurableTasksBuilder) -> DurableTasksBuilder,
    ) -> Self {
        self.tasks = configure(self.tasks);
        self
    }

    /// Registers this instance (its presence and its task heartbeat),
    /// builds every piece, and starts the maintenance loop. Needs a tokio
    /// runtime. A lease under 3 ms, or a zero purge interval, is
    /// [`Error::Config`].
    pub async fn start(self) -> Result<Durable> {
        if self.purge_every.is_some_and(|every| every.is_zero()) {
            return Err(Error::Config(
                "the purge interval must not be zero (None turns purging off)".into(),
            ));
        }
        let store = self.store;
        // What guards a stream lives as long as its events.
        let guard_ttl = store.retention().max_age.unwrap_or(self.session_ttl);
        let presence = Presence::register(store.clone() as Arc<dyn SessionStore>, self.lease)
            .await?
            .with_producer_ttl(guard_ttl);
        let beat = self.lease / 3;
        let tasks = self
            .tasks
            .heartbeat(beat, self.lease)
            .purge_every(None)
            .build_maintained_elsewhere()
            .await?;
        let alive = Arc::new(Alive);
        let mut events = RmcpEventStore::new(store.clone())
            .with_presence(presence.clone())
            .kept_alive_by(alive.clone());
        events = match self.follow_hold {
            Some(hold) => events.with_follow_hold(hold),
            None => events.without_follow(),
        };
        let sessions = Arc::new(RmcpSessionStore::new(store.clone()).with_ttl(self.session_ttl));
        let mut local = LocalSessionManager::default();
        local.session_config.sse_retry = Some(self.sse_retry);
        let local = local.with_event_store(Arc::new(events.clone()));
        let session_manager = Arc::new(
            SessionScoped::new(local, store.clone())
                .with_binding_ttl(guard_ttl)
                .with_session_store(&sessions)
                .with_session_check_interval(self.session_check),
        );
        let inner = Arc::new(Inner {
            store,
            events,
            sessions,
            session_manager,
            tasks,
            presence,
            sse_retry: self.sse_retry,
            maintenance: Mutex::new(None),
        });
        let maintenance = tokio::spawn(maintain(
            Arc::downgrade(&alive),
            Maintained {
                store: inner.store.clone(),
                tasks: inner.tasks.clone(),
                presence: inner.presence.clone(),
            },
            beat,
            self.purge_every,
        ));
        *inner
            .maintenance
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(maintenance);
        Ok(Durable { inner })
    }
}

/// What the maintenance loop keeps up.
struct Maintained {
    store: Arc<dyn Store>,
    tasks: DurableTasks,
    presence: Presence,
}

/// The one maintenance loop: heartbeats every `beat`, purges every
/// `purge_every`, while `alive` lives. Each heartbeat and each purge runs
/// on a task of its own, so none waits for another; a purge still running
/// when the next is due is not started twice.
async fn maintain(
    alive: Weak<Alive>,
    maintained: Maintained,
    beat: Duration,
    purge_every: Option<Duration>,
) {
    let mut beats = tokio::time::interval(beat);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    beats.tick().await;
    let mut purges = tokio::time::interval(purge_every.unwrap_or(Duration::MAX / 4));
    purges.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    purges.tick().await;
    let mut purging: Option<JoinHandle<()>> = None;
    loop {
        tokio::select! {
            _ = beats.tick() => {
                if alive.strong_count() == 0 {
                    return;
                }
                let tasks = maintained.tasks.clone();
                tokio::spawn(async move { tasks.beat().await });
                let presence = maintained.presence.clone();
                tokio::spawn(async move {
                    if let Err(error) = presence.renew().await {
                        tracing::warn!(%error, "cannot renew this instance's presence");
                    }
                });
            }
            _ = purges.tick(), if purge_every.is_some() => {
                if alive.strong_count() == 0 {
                    return;
                }
                if purging.as_ref().is_some_and(|purge| !purge.is_finished()) {
                    continue;
                }
                purging = Some(tokio::spawn(purge(maintained.store.clone())));
            }
        }
    }
}

/// Purges expired events and sessions, then expired and orphaned tasks;
/// a failure is logged and tried again next time.
async fn purge(store: Arc<dyn Store>) {
    match store.purge_expired().await {
        Ok(report) => tracing::debug!(?report, "purged events and sessions"),
        Err(error) => tracing::warn!(%error, "event and session purge failed"),
    }
    match store.purge_expired_tasks().await {
        Ok(report) => tracing::debug!(?report, "purged tasks"),
        Err(error) => tracing::warn!(%error, "task purge failed"),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;
    use mcp_event_store_core::backend::StreamKey;
    use mcp_event_store_core::task::{NewTask, TaskStatus, TaskStore};
    use mcp_event_store_core::{
        EventStore, ManualClock, MemoryStore, NewEvent, Retention, StoreOptions,
    };

    use super::*;

    /// "Must happen eventually" guard; never a latency bound.
    const EVENTUALLY: Duration = Duration::from_secs(30);

    fn clock() -> Arc<ManualClock> {
        Arc::new(ManualClock::new(1_700_000_000_000))
    }

    #[tokio::test]
    async fn the_store_alone_decides_what_guards_a_stream() {
        let options = StoreOptions::default()
            .retention(Retention::default().max_age(Duration::from_secs(900)));
        let store = Arc::new(MemoryStore::with_options(options));
        let durable = Durable::builder(store)
            .session_check_interval(Duration::from_millis(250))
            .start()
            .await
            .unwrap();
        let manager = durable.session_manager();
        assert_eq!(manager.binding_ttl(), Duration::from_secs(900));
        assert_eq!(manager.session_check_interval(), Duration::from_millis(250));
        assert!(
            Arc::ptr_eq(&manager, &durable.session_manager()),
            "one manager"
        );
        let config = durable.config();
        assert!(config.session_store.is_some());
        assert_eq!(config.sse_retry, Some(DEFAULT_SSE_RETRY));
        assert!(!durable.stateless_config().legacy_session_mode);
        assert_eq!(durable.events().follow_hold(), Some(DEFAULT_FOLLOW_HOLD));
        durable.shutdown().await;
    }

    /// With a lease of 60 ms, many leases later the instance is still
    /// alive: its tasks read working and a follower elsewhere does not
    /// take its streams for lost. Once everything it handed out is
    /// dropped, its presence lapses.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_loop_keeps_the_instance_alive_while_it_serves() {
        let store = Arc::new(MemoryStore::new());
        let lease = Duration::from_millis(60);
        let durable = Durable::builder(store.clone())
            .lease(lease)
            .start()
            .await
            .unwrap();
        let stream = StreamKey::generate().unwrap().token("a call");
        durable.presence().produces(&stream).await.unwrap();
        let (task, _) = store
            .create(NewTask::new(&Owner::Anonymous, durable.tasks().instance()))
            .await
            .unwrap();
        let watcher = Presence::start(store.clone(), lease).await.unwrap();
        let manager = durable.session_manager();
        drop(durable);

        tokio::time::sleep(lease * 10).await;
        let seen = store
            .get(&task.to_string(), &Owner::Anonymous)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seen.status, TaskStatus::Working, "{seen:?}");
        let lost = watcher.producer_lost(stream);
        assert!(
            Box::pin(watcher.producer_lost(stream))
                .now_or_never()
                .is_none(),
            "the writer is alive"
        );

        drop(manager);
        tokio::time::timeout(EVENTUALLY, lost)
            .await
            .expect("nothing serves any more: the presence lapses");
    }

    #[tokio::test]
    async fn shutdown_removes_the_presence_at_once() {
        let store = Arc::new(MemoryStore::new());
        let durable = Durable::builder(store.clone()).start().await.unwrap();
        let stream = StreamKey::generate().unwrap().token("a call");
        durable.presence().produces(&stream).await.unwrap();
        let watcher = Presence::register(store, Duration::from_secs(30))
            .await
            .unwrap();
        durable.shutdown().await;
        tokio::time::timeout(EVENTUALLY, watcher.producer_lost(stream))
            .await
            .expect("a closed instance is gone");
    }

    /// Expired events go without anyone calling a purge.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_loop_purges_expired_events() {
        let clock = clock();
        let options = StoreOptions::default()
            .clock(clock.clone())
            .retention(Retention::default().max_age(Duration::from_secs(60)));
        let store = Arc::new(MemoryStore::with_options(options));
        store
            .store_event("old", NewEvent::new(b"gone soon"))
            .await
            .unwrap();
        let durable = Durable::builder(store.clone())
            .purge_every(Some(Duration::from_millis(20)))
            .start()
            .await
            .unwrap();
        clock.advance(Duration::from_secs(61));
        tokio::time::timeout(EVENTUALLY, async {
            while store.stats().await.unwrap().events > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the expired event was purged");
        durable.shutdown().await;
    }

    #[tokio::test]
    async fn nonsense_settings_are_refused() {
        let store = Arc::new(MemoryStore::new());
        let zero = Durable::builder(store.clone())
            .purge_every(Some(Duration::ZERO))
            .start()
            .await;
        assert!(matches!(zero, Err(Error::Config(_))), "{zero:?}");
        let short = Durable::builder(store)
            .lease(Duration::from_millis(1))
            .start()
            .await;
        assert!(matches!(short, Err(Error::Config(_))), "{short:?}");
    }
}
