//! Everything rmcp needs from one store, wired once: [`Durable`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use mcp_event_store_core::task::{CancelMode, Owner};
use mcp_event_store_core::{Result, Store};
use mcp_event_store_runtime::{Audience, Callers, Heard, Runtime, RuntimeBuilder};
use rmcp::model::{ServerJsonRpcMessage, ServerNotification};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext, SubscriptionSendError};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};

use crate::callers::CallerScoped;
use crate::sessions::DEFAULT_SESSION_TTL;
use crate::tasks::{DurableTasks, DurableTasksBuilder};
use crate::{
    DEFAULT_FOLLOW_HOLD, DEFAULT_SESSION_CHECK_INTERVAL, RmcpEventStore, RmcpSessionStore,
    SessionScoped,
};

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
/// * **The runtime** ([`Runtime`], framework-neutral): this instance's one
///   lease in the store and one maintenance loop (the lease, purges of
///   expired events, sessions and tasks, the takeover runner's claim
///   rounds), configured through [`DurableBuilder::runtime`].
/// * **Events**: the store as rmcp's `EventStore` ([`RmcpEventStore`]); a
///   resume follows its stream live for at most the
///   [follow hold](DurableBuilder::follow_hold), and ends early once the
///   instance writing the stream is known gone (its lease lapsed).
/// * **Sessions** (session mode): the store as rmcp's `SessionStore`
///   ([`RmcpSessionStore`], in [`config`](Self::config)), so another
///   instance restores a session; rmcp's `LocalSessionManager` inside
///   [`SessionScoped`] (one per `Durable`, [`session_manager`](Self::session_manager)),
///   so a `Last-Event-ID` only resumes streams of its own session, stream
///   bindings live as long as the store's retention
///   ([`EventStore::retention`](mcp_event_store_core::EventStore::retention): never passed twice), and a session
///   deleted or expired on one instance ends on every instance.
/// * **Tasks** (MCP 2026-07-28): [`DurableTasks`] on the runtime
///   ([`tasks`](Self::tasks)), to clone into each handler.
/// * **Across instances** (session mode), through the runtime's bus: each
///   request a tool sends the client (sampling, elicitation, roots) goes
///   out under an id naming this instance ([`Routed`](crate::Routed)), so
///   the client's answer reaches the waiting request whichever instance a
///   load balancer sends it to (one for an instance that is gone is
///   refused: 500 with the reason); and a `DELETE` on any instance ends the
///   session on every instance at once (its streams end, its waiting
///   requests fail), not only at the session's next request; and a
///   notification raised once ([`notify`](Self::notify)) reaches the
///   listeners of every instance (and, in any mode, the 2026-07-28
///   `subscriptions/listen` requests served with [`listen`](Self::listen)).
///   No session affinity is needed.
///
/// The runtime runs while the `Durable` or anything serving with it (a
/// service, a session manager, the event store) lives, and stops at
/// [`shutdown`](Self::shutdown). Stateless mode (no MCP sessions) takes
/// [`stateless_service`](Self::stateless_service), or
/// [`stateless_session_manager`](Self::stateless_session_manager) and
/// [`stateless_config`](Self::stateless_config).
///
/// Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct Durable {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Runtime,
    events: RmcpEventStore<dyn Store>,
    sessions: Arc<RmcpSessionStore<dyn Store>>,
    session_manager: Arc<SessionManager>,
    tasks: DurableTasks,
    sse_retry: Duration,
    callers: Callers,
}

impl fmt::Debug for Durable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Durable")
            .field("runtime", &self.inner.runtime)
            .field("events", &self.inner.events)
            .field("sse_retry", &self.inner.sse_retry)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Durable`]; see [`Durable::builder`]. Every setting has a
/// default; the store itself gives the rest.
pub struct DurableBuilder {
    runtime: RuntimeBuilder,
    follow_hold: Option<Duration>,
    session_ttl: Duration,
    session_check: Duration,
    sse_retry: Duration,
    tasks: DurableTasksBuilder,
    callers: Callers,
}

impl fmt::Debug for DurableBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableBuilder")
            .field("runtime", &self.runtime)
            .field("follow_hold", &self.follow_hold)
            .field("session_ttl", &self.session_ttl)
            .field("session_check", &self.session_check)
            .field("sse_retry", &self.sse_retry)
            .field("tasks", &self.tasks)
            .field("callers", &self.callers)
            .finish_non_exhaustive()
    }
}

impl Durable {
    /// Starts wiring `store` (any of ours: an `Arc` of a concrete store, or
    /// the facade's `DynStore`).
    pub fn builder(store: Arc<dyn Store>) -> DurableBuilder {
        DurableBuilder {
            runtime: Runtime::builder(store),
            follow_hold: Some(DEFAULT_FOLLOW_HOLD),
            session_ttl: DEFAULT_SESSION_TTL,
            session_check: DEFAULT_SESSION_CHECK_INTERVAL,
            sse_retry: DEFAULT_SSE_RETRY,
            tasks: DurableTasks::builder(),
            callers: Callers::anonymous(),
        }
    }

    /// The session-mode service: rmcp's Streamable HTTP service with
    /// `handler` making each session's handler, [`session_manager`](Self::session_manager)
    /// and [`config`](Self::config). Serve it with axum's
    /// `Router::nest_service("/mcp", service)`.
    ///
    /// Each request is served as its caller ([`CallerScoped`], with the
    /// builder's [`callers`](DurableBuilder::callers)).
    pub fn service<H, F>(
        &self,
        handler: F,
    ) -> CallerScoped<StreamableHttpService<H, SessionManager>>
    where
        H: ServerHandler + Send + 'static,
        F: Fn() -> std::io::Result<H> + Send + Sync + 'static,
    {
        self.scoped(StreamableHttpService::new(
            handler,
            self.session_manager(),
            self.config(),
        ))
    }

    /// `service` (one you built on [`session_manager`](Self::session_manager)
    /// and [`config`](Self::config)) serving each request as its caller,
    /// which binding sessions to callers needs
    /// ([`DurableBuilder::callers`]).
    pub fn scoped<S>(&self, service: S) -> CallerScoped<S> {
        CallerScoped::new(service, self.inner.callers.clone())
    }

    /// `future`, the handling of one request, run as the caller `callers`
    /// (the builder's [`callers`](DurableBuilder::callers)) reads from
    /// `extensions`: what [`scoped`](Self::scoped) does for each request of
    /// a tower service, for a framework that calls rmcp's service inside a
    /// handler of its own, where no tower service can wrap it (actix-web,
    /// through rmcp-actix-web: wrap the handler's future, from the request
    /// to its response's head, in a middleware). The future need not be
    /// `Send`.
    pub fn as_caller<F: Future>(
        &self,
        extensions: &http::Extensions,
        future: F,
    ) -> impl Future<Output = F::Output> + use<F> {
        crate::callers::serve_as(self.inner.callers.owner(extensions), future)
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

    /// The durable-task runtime's tasks, to clone into each handler (its
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

    /// Raises `notification` once, for the listeners of `audience` on every
    /// instance sharing the store (a `resources/list_changed` for all, a
    /// log message for one session): each instance stores it in the
    /// standalone stream of the sessions whose `GET` it serves and sends
    /// it there ([`SessionScoped::listen_across`]).
    ///
    /// ```no_run
    /// # async fn demo(durable: mcp_event_store_rmcp::Durable) -> mcp_event_store_core::Result<()> {
    /// use mcp_event_store_rmcp::runtime::Audience;
    /// use rmcp::model::{ResourceListChangedNotification, ServerNotification};
    ///
    /// let changed = ServerNotification::ResourceListChangedNotification(
    ///     ResourceListChangedNotification::default(),
    /// );
    /// durable.notify(&Audience::All, changed).await?;
    /// # Ok(()) }
    /// ```
    pub async fn notify(
        &self,
        audience: &Audience,
        notification: ServerNotification,
    ) -> Result<()> {
        let message = ServerJsonRpcMessage::notification(notification);
        let bytes = serde_json::to_vec(&message).expect("a notification serializes");
        self.inner.runtime.notify(audience, &bytes).await
    }

    /// Serves one 2026-07-28 `subscriptions/listen` request across
    /// instances: every notification for all listeners raised on any
    /// instance ([`notify`](Self::notify) with [`Audience::All`]) is sent on
    /// it, as far as the filter the request was accepted with allows
    /// (rmcp's `SubscriptionSink` drops the rest, and refuses progress, log
    /// messages and, in rmcp 3.11, `notifications/tasks`, which have no
    /// filter there). Call it from `ServerHandler::listen`, with
    /// `accepted_subscription_filter` saying what the server sends.
    ///
    /// It returns `Ok` when the request is cancelled or the runtime shuts
    /// down (rmcp then sends the final result, as for a graceful
    /// teardown). A notification for one session is not sent here: the
    /// protocol's `subscriptions/listen` belongs to no session.
    ///
    /// ```no_run
    /// use rmcp::model::SubscriptionFilter;
    /// use rmcp::service::SubscriptionContext;
    /// use rmcp::{ErrorData, ServerHandler};
    ///
    /// struct Server {
    ///     durable: mcp_event_store_rmcp::Durable,
    /// }
    ///
    /// impl ServerHandler for Server {
    ///     fn accepted_subscription_filter(&self, _: &SubscriptionFilter) -> Option<SubscriptionFilter> {
    ///         Some(SubscriptionFilter::builder().tools_list_changed().build())
    ///     }
    ///
    ///     async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
    ///         self.durable.listen(subscription).await
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// An internal error if the bus cannot be subscribed to (the store is
    /// unreachable) or the subscription's stream fails.
    pub async fn listen(
        &self,
        subscription: SubscriptionContext,
    ) -> std::result::Result<(), ErrorData> {
        let mut heard =
            self.inner.runtime.notifications().await.map_err(|e| {
                ErrorData::internal_error(format!("listening on the bus: {e}"), None)
            })?;
        loop {
            let next = tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                next = heard.next() => next,
            };
            let notification = match next {
                None => return Ok(()),
                Some(Heard::Missed) => {
                    tracing::warn!(
                        "notifications raised on other instances were lost for a subscriptions/listen request (the bus's retention overtook this instance)"
                    );
                    continue;
                }
                Some(Heard::Message(notification)) => notification,
            };
            if notification.audience != Audience::All {
                continue;
            }
            let Some(notification) = server_notification(&notification.message) else {
                continue;
            };
            match subscription.sink().send(notification).await {
                Ok(()) => {}
                Err(SubscriptionSendError::SubscriptionClosed) => return Ok(()),
                Err(
                    SubscriptionSendError::NotificationNotAccepted(_)
                    | SubscriptionSendError::UnsupportedNotification(_),
                ) => {}
                Err(error) => {
                    return Err(ErrorData::internal_error(
                        format!("sending on a subscriptions/listen stream: {error}"),
                        None,
                    ));
                }
            }
        }
    }

    /// This instance's runtime: its lease, maintenance and task runs.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.inner.runtime.store()
    }

    /// Stops the runtime ([`Runtime::shutdown`]): its maintenance loop and
    /// takeover runner stop and this instance's lease ends at once, so
    /// resumes of its unfinished calls on other instances end at their
    /// next check and its tasks are taken over (or read `failed`) at once.
    /// For a graceful shutdown, after the server stopped serving. The store
    /// stays open.
    pub async fn shutdown(&self) {
        self.inner.runtime.shutdown().await;
    }
}

impl DurableBuilder {
    /// The runtime's settings: the lease, the purge and claim intervals,
    /// the takeover runner's bounds, handing off to workers (see
    /// [`RuntimeBuilder`]; every default is the runtime's, the same for
    /// every framework).
    ///
    /// ```no_run
    /// # async fn demo(store: std::sync::Arc<dyn mcp_event_store_core::Store>) -> mcp_event_store_core::Result<()> {
    /// use std::time::Duration;
    /// use mcp_event_store_rmcp::Durable;
    ///
    /// let durable = Durable::builder(store)
    ///     .runtime(|runtime| runtime.lease(Duration::from_secs(10)).max_attempts(5))
    ///     .start()
    ///     .await?;
    /// # let _ = durable; Ok(()) }
    /// ```
    pub fn runtime(mut self, configure: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder) -> Self {
        self.runtime = configure(self.runtime);
        self
    }

    /// How long a resume follows its stream at most when no answer ends it
    /// (default [`DEFAULT_FOLLOW_HOLD`], five minutes); `None` makes every
    /// resume a plain replay of what is stored (the client polls).
    pub fn follow_hold(mut self, hold: Option<Duration>) -> Self {
        self.follow_hold = hold;
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

    /// Who is calling (C20, T3): each session is bound to the principal
    /// `callers` reads from the request that opened it, and so are the
    /// streams of that session and the tasks it creates (unless
    /// [`owner`](Self::owner) says otherwise for tasks). A restore, resume,
    /// `DELETE` or task call by another principal is answered as for an
    /// unknown session or task, on every instance. Default: every caller
    /// anonymous.
    ///
    /// ```no_run
    /// # async fn demo(store: std::sync::Arc<dyn mcp_event_store_core::Store>) -> mcp_event_store_core::Result<()> {
    /// use mcp_event_store_rmcp::{Callers, Durable};
    ///
    /// /// What your authentication middleware inserts in the request.
    /// #[derive(Clone)]
    /// struct Claims { sub: String }
    ///
    /// let durable = Durable::builder(store)
    ///     .callers(Callers::from_extension(|claims: &Claims| claims.sub.clone()))
    ///     .start()
    ///     .await?;
    /// # let _ = durable; Ok(()) }
    /// ```
    pub fn callers(mut self, callers: Callers) -> Self {
        self.callers = callers;
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

    /// The tools whose tasks may be taken over
    /// ([`DurableTasksBuilder::takeover`]).
    ///
    /// ```no_run
    /// # async fn demo(store: std::sync::Arc<dyn mcp_event_store_core::Store>) -> mcp_event_store_core::Result<()> {
    /// use mcp_event_store_rmcp::Durable;
    /// use rmcp::model::{CallToolResult, ContentBlock};
    ///
    /// let durable = Durable::builder(store)
    ///     .tasks(|tasks| {
    ///         tasks.takeover("echo", |_task, call| {
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

    /// Starts the runtime (registering this instance), and builds every
    /// piece. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`RuntimeBuilder::start`].
    pub async fn start(self) -> Result<Durable> {
        let runtime = self.runtime.start().await?;
        let store = runtime.store().clone();
        // What guards a stream lives as long as its events.
        let guard_ttl = store.retention().max_age.unwrap_or(self.session_ttl);
        let mut tasks = self.tasks;
        if self.callers.is_bound() && !tasks.has_owner() {
            let callers = self.callers.clone();
            tasks = tasks.owner(move |ctx| {
                ctx.extensions
                    .get::<http::request::Parts>()
                    .map_or(Owner::Anonymous, |parts| callers.owner(&parts.extensions))
            });
        }
        let tasks = tasks.build(&runtime);
        let mut events = RmcpEventStore::new(store.clone()).with_runtime(runtime.clone());
        events = match self.follow_hold {
            Some(hold) => events.with_follow_hold(hold),
            None => events.without_follow(),
        };
        let sessions = Arc::new(
            RmcpSessionStore::new(store.clone())
                .with_ttl(self.session_ttl)
                .with_runtime(runtime.clone())
                .with_callers(&self.callers),
        );
        let mut local = LocalSessionManager::default();
        local.session_config.sse_retry = Some(self.sse_retry);
        let local = local.with_event_store(Arc::new(events.clone()));
        let session_manager = Arc::new(
            SessionScoped::new(local, store)
                .with_binding_ttl(guard_ttl)
                .with_session_store(&sessions)
                .with_session_check_interval(self.session_check)
                .with_runtime(runtime.clone())
                .with_callers(&self.callers),
        );
        session_manager.listen_across().await?;
        Ok(Durable {
            inner: Arc::new(Inner {
                runtime,
                events,
                sessions,
                session_manager,
                tasks,
                sse_retry: self.sse_retry,
                callers: self.callers,
            }),
        })
    }
}

#[cfg(test)]
mod tests;

/// The notification a message heard on the bus carries, if it is one
/// (another framework's adapter may publish what rmcp cannot read).
fn server_notification(message: &[u8]) -> Option<ServerNotification> {
    match serde_json::from_slice(message) {
        Ok(ServerJsonRpcMessage::Notification(notification)) => Some(notification.notification),
        Ok(_) | Err(_) => {
            tracing::debug!("skipped a message on the bus that is no server notification");
            None
        }
    }
}
