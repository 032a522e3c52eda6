//! Instances sharing one store as one server, as far as tower-mcp 0.25
//! lets a session's live state out: see [`Across`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use mcp_event_store_core::{Result, SessionDigest};
use mcp_event_store_runtime::{Audience, Heard, Notification, Runtime};
use serde_json::{Value, json};
use tokio::sync::watch;
use tower_mcp::{McpRouter, NotificationReceiver, ServerNotification, SessionHandle};

use crate::TowerTaskStore;

/// The header that names a request's session (HTTP header names are
/// case-insensitive).
const SESSION_HEADER: &str = "mcp-session-id";

tokio::task_local! {
    /// Set while a session ends on purpose: a client's `DELETE` through
    /// [`AcrossService`], or a session ended on another instance. A delete
    /// outside it is tower-mcp's idle cleanup.
    static ENDING: ();
}

/// Whether the caller runs where a session ends on purpose (a client's
/// `DELETE`, or an end heard from another instance) rather than in
/// tower-mcp's idle cleanup: what lets the session and event stores built
/// `across_instances` spare a session idle only here.
pub(crate) fn ending_on_purpose() -> bool {
    ENDING.try_with(|()| ()).is_ok()
}

/// How many notifications heard on the bus wait for tower-mcp's fan-out
/// before the listener waits too (the bus keeps the rest).
const FEED_CAPACITY: usize = 64;

/// A notification for every client of every instance: the kinds tower-mcp
/// 0.25 can deliver to all of an instance's clients at once (through its
/// external notification channel, `HttpTransport::external_notifications`).
///
/// Progress, log messages and task status are for one session or one
/// request, and tower-mcp has no way to send to one session from outside
/// it: they are not here (see [the crate docs](crate#across-instances)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Broadcast {
    /// `notifications/tools/list_changed`.
    ToolsListChanged,
    /// `notifications/prompts/list_changed`.
    PromptsListChanged,
    /// `notifications/resources/list_changed`.
    ResourcesListChanged,
    /// `notifications/resources/updated` for `uri`: tower-mcp delivers it
    /// to the 2025-11-25 sessions that subscribed to `uri` *on that
    /// instance* (`resources/subscribe` is kept per instance), and to the
    /// 2026-07-28 `subscriptions/listen` streams that name it.
    ResourceUpdated {
        /// The resource that changed.
        uri: String,
    },
}

impl Broadcast {
    /// The JSON-RPC method.
    pub fn method(&self) -> &'static str {
        match self {
            Self::ToolsListChanged => "notifications/tools/list_changed",
            Self::PromptsListChanged => "notifications/prompts/list_changed",
            Self::ResourcesListChanged => "notifications/resources/list_changed",
            Self::ResourceUpdated { .. } => "notifications/resources/updated",
        }
    }

    /// The JSON-RPC notification, as it goes over the bus and the wire.
    pub fn to_json(&self) -> Vec<u8> {
        let message = match self {
            Self::ResourceUpdated { uri } => json!({
                "jsonrpc": "2.0", "method": self.method(), "params": {"uri": uri}
            }),
            _ => json!({"jsonrpc": "2.0", "method": self.method()}),
        };
        message.to_string().into_bytes()
    }

    /// The broadcast a JSON-RPC notification is, if it is one of these
    /// kinds.
    pub fn from_json(message: &[u8]) -> Option<Self> {
        let message: Value = serde_json::from_slice(message).ok()?;
        Some(match message.get("method")?.as_str()? {
            "notifications/tools/list_changed" => Self::ToolsListChanged,
            "notifications/prompts/list_changed" => Self::PromptsListChanged,
            "notifications/resources/list_changed" => Self::ResourcesListChanged,
            "notifications/resources/updated" => Self::ResourceUpdated {
                uri: message.get("params")?.get("uri")?.as_str()?.to_owned(),
            },
            _ => return None,
        })
    }
}

impl From<Broadcast> for ServerNotification {
    fn from(broadcast: Broadcast) -> Self {
        match broadcast {
            Broadcast::ToolsListChanged => Self::ToolsListChanged,
            Broadcast::PromptsListChanged => Self::PromptsListChanged,
            Broadcast::ResourcesListChanged => Self::ResourcesListChanged,
            Broadcast::ResourceUpdated { uri } => Self::ResourceUpdated { uri },
        }
    }
}

/// What one tower-mcp instance tells the others sharing its store, over the
/// runtime's bus ([`Runtime::end_session`], [`Runtime::notify`]): sessions a
/// client deleted, and notifications for every client.
///
/// * **Sessions end everywhere.** [`layer`](Self::layer)
///   gives a layer for the router tower-mcp builds: a `DELETE` it answers
///   200 is published, and every instance ends the session it holds
///   (tower-mcp's `SessionHandle::terminate_session`) and closes the
///   session's SSE responses it is sending (its GET stream, and any
///   POST's), which tower-mcp's own removal leaves open. So a session
///   deleted on one instance answers 404 on the others as soon as they
///   hear of it, rather than being served on from memory and written back.
/// * **Broadcast notifications reach every instance.**
///   [`raise`](Self::raise) publishes a [`Broadcast`] once; every instance
///   hands it to tower-mcp's external notification channel
///   ([`notifications`](Self::notifications)), which delivers it to its
///   own clients.
///   Each instance then refuses the session (404) for an hour, so a record
///   another instance wrote back before it heard is never restored.
/// * **A session initialized through another instance is served here.**
///   tower-mcp holds a session it created waiting for the client's
///   `notifications/initialized`, and refuses its requests until then;
///   behind a load balancer that notification may reach another instance.
///   The layer drops this instance's copy when tower-mcp refuses so, and
///   sends the request again: tower-mcp restores the session from its
///   record, as initialized, as any other instance would. (Its GET stream
///   here, opened on the dropped copy, ends; the client opens it again.)
/// * **Idle cleanup spares what another instance serves**, with the
///   session and event stores built `across_instances` (which need this
///   layer to tell a client's `DELETE` from tower-mcp's idle cleanup).
/// * **A task's status reaches its listeners everywhere**, with the layer
///   [`announcing_tasks`](AcrossLayer::announcing_tasks).
///
/// Every instance on the store should be wired so. The rest of what a
/// session holds live on its instance cannot be carried with tower-mcp
/// 0.25: see [the crate docs](crate#across-instances).
///
/// ```no_run
/// # async fn demo(runtime: mcp_event_store_tower_mcp::Runtime, router: tower_mcp::McpRouter)
/// #     -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use mcp_event_store_tower_mcp::{Across, Broadcast};
/// use tower_mcp::HttpTransport;
///
/// let across = Across::new(runtime);
/// let transport = HttpTransport::new(router.tools_list_changed(true))
///     .external_notifications(across.notifications().await?);
/// let (app, sessions) = transport.into_router_at_with_handle("/mcp");
/// let app = app.layer(across.layer(sessions).await?);
/// // Later, on any instance: every client on every instance hears it.
/// across.raise(&Broadcast::ToolsListChanged).await?;
/// # let _ = app; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Across {
    runtime: Runtime,
}

impl fmt::Debug for Across {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Across")
            .field("instance", &self.runtime.instance())
            .finish()
    }
}

impl Across {
    /// Over `runtime`'s bus: the process's one runtime.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }

    /// The runtime it publishes and listens through.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Raises `notification` once for every client of every instance (this
    /// one included, which hears it over the bus like the others).
    ///
    /// # Errors
    ///
    /// The bus's, if it cannot publish (the store is unreachable).
    pub async fn raise(&self, notification: &Broadcast) -> Result<()> {
        self.runtime
            .notify(&Audience::All, &notification.to_json())
            .await
    }

    /// tower-mcp's external notification channel, fed with every
    /// [`Broadcast`] raised on any instance: pass it to
    /// `HttpTransport::external_notifications` (or `with_notifications`).
    ///
    /// It listens until the runtime shuts down or the receiver is dropped;
    /// once this returns, nothing raised is missed. A notification for one
    /// session (`Audience::Session`, which another framework's adapter may
    /// publish) or of another kind is skipped: tower-mcp 0.25 can send only
    /// to all of an instance's sessions. When the bus's retention overtook
    /// it, those raised meanwhile are lost (logged).
    ///
    /// # Errors
    ///
    /// The bus's, if it cannot subscribe; `Closed` after the runtime shut
    /// down.
    pub async fn notifications(&self) -> Result<NotificationReceiver> {
        let mut heard = self.runtime.notifications().await?;
        let (feed, receiver) = tower_mcp::notification_channel(FEED_CAPACITY);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    () = feed.closed() => return,
                    next = heard.next() => next,
                };
                let notification = match next {
                    None => return,
                    Some(Heard::Missed) => {
                        tracing::warn!(
                            "notifications raised on other instances were lost (the bus's retention overtook this instance)"
                        );
                        continue;
                    }
                    Some(Heard::Message(notification)) => notification,
                };
                let Some(broadcast) = broadcast_of(&notification) else {
                    continue;
                };
                if feed.send(broadcast.into()).await.is_err() {
                    return;
                }
            }
        });
        Ok(receiver)
    }

    /// A layer for the router tower-mcp builds
    /// (`HttpTransport::into_router_at_with_handle`, or
    /// `into_router_with_handle`), given the `SessionHandle` built with it:
    /// sessions a client deleted on any instance end on this one.
    ///
    /// * A `DELETE` the router answers 200 is published
    ///   ([`Runtime::end_session`]) before the answer leaves, and the
    ///   session's SSE responses on this instance end.
    /// * Every session published so, by any instance, is ended here if this
    ///   instance holds it (`SessionHandle::terminate_session`, which also
    ///   deletes the record and events again if a request here wrote them
    ///   back meanwhile), and its SSE responses here end.
    ///
    /// The layer also refuses a deleted session for an hour, and serves a
    /// session whose `notifications/initialized` reached another instance
    /// (see [`Across`]); it buffers each `POST` in a session (up to 4 MiB;
    /// a larger one is answered 413) to send it again if need be.
    ///
    /// Only a client's `DELETE` is published, not tower-mcp's idle cleanup
    /// (which removes a session idle *on this instance* from its memory).
    /// With the session and event stores built `across_instances`
    /// ([`TowerSessionStore::across_instances`](crate::TowerSessionStore::across_instances)),
    /// that cleanup deletes no record and purges no events of a session
    /// another instance served within its time to live: the stores tell
    /// it from a client's `DELETE` by this layer.
    /// Apply it to tower-mcp's router itself (not after merging routes of
    /// your own: it reads every `DELETE` with an `Mcp-Session-Id`).
    ///
    /// It listens until the runtime shuts down, or the layer and the
    /// services it made are dropped; once this returns, nothing published
    /// is missed.
    ///
    /// # Errors
    ///
    /// The bus's, if it cannot subscribe; `Closed` after the runtime shut
    /// down.
    pub async fn layer(&self, sessions: SessionHandle) -> Result<AcrossLayer> {
        let mut ended = self.runtime.ended_sessions().await?;
        let shared = Arc::new(Shared {
            runtime: self.runtime.clone(),
            sessions,
            streams: Mutex::new(HashMap::new()),
        });
        let listening = Arc::downgrade(&shared);
        tokio::spawn(async move {
            while let Some(heard) = ended.next().await {
                let Some(shared) = Weak::upgrade(&listening) else {
                    return;
                };
                match heard {
                    Heard::Message(session) => shared.ended_somewhere(session).await,
                    Heard::Missed => tracing::warn!(
                        "sessions deleted on other instances may have been missed (the bus's retention overtook this instance); each lives on here until idle"
                    ),
                }
            }
        });
        Ok(AcrossLayer {
            shared,
            tasks: None,
        })
    }
}

/// The broadcast a notification heard on the bus carries, if tower-mcp
/// can deliver it.
fn broadcast_of(notification: &Notification) -> Option<Broadcast> {
    if let Audience::Session(session) = &notification.audience {
        tracing::debug!(
            session_id = %session,
            "skipped a notification for one session: tower-mcp 0.25 cannot send to one session"
        );
        return None;
    }
    let broadcast = Broadcast::from_json(&notification.message);
    if broadcast.is_none() {
        tracing::debug!(
            "skipped a notification for every session that is not a list change or resource update"
        );
    }
    broadcast
}

/// What the layer, its services and the listener share.
struct Shared {
    runtime: Runtime,
    sessions: SessionHandle,
    /// Per session, the signal its SSE responses on this instance end on;
    /// an entry lives while a response watches it.
    streams: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl Shared {
    /// A client deleted `session` here: tells every instance, and ends its
    /// responses here.
    async fn deleted_here(&self, session: &str) {
        if let Err(error) = self.runtime.end_session(session).await {
            tracing::warn!(
                session_id = %session, %error,
                "could not tell the other instances that a session was deleted; they serve it until idle"
            );
        }
        self.end_streams(session);
    }

    /// `session` was deleted on some instance (this one included).
    /// Ends here the session a digest heard on the bus names (C20: the bus
    /// never carries ids), if this instance holds it or a stream of it.
    async fn ended_somewhere(&self, ended: SessionDigest) {
        let held = self.sessions.list_sessions().await;
        let streams: Vec<String> = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        let Some(session) = held
            .into_iter()
            .map(|info| info.id)
            .chain(streams)
            .find(|id| SessionDigest::of(id) == ended)
        else {
            return;
        };
        let terminated = ENDING.scope((), self.sessions.terminate_session(&session));
        if terminated.await {
            tracing::info!(session_id = %session, "session deleted on another instance; ended here");
        }
        self.end_streams(&session);
    }

    fn end_streams(&self, session: &str) {
        let signal = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
        if let Some(signal) = signal {
            signal.send_replace(true);
        }
    }

    /// Starts watching for the end of `session`, for a response not yet
    /// answered (so an end while the router works on it is seen too).
    fn watch(self: &Arc<Self>, session: &str) -> Watching {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let ended = streams
            .entry(session.to_owned())
            .or_insert_with(|| watch::channel(false).0)
            .subscribe();
        Watching {
            shared: self.clone(),
            session: session.to_owned(),
            ended: Some(ended),
        }
    }
}

/// One response's watch on its session's end; leaves the map when the last
/// watch of its session goes.
struct Watching {
    shared: Arc<Shared>,
    session: String,
    ended: Option<watch::Receiver<bool>>,
}

impl Watching {
    /// Resolves when the session ends.
    async fn ended(&mut self) {
        if let Some(ended) = &mut self.ended
            && ended.wait_for(|ended| *ended).await.is_ok()
        {
            return;
        }
        std::future::pending().await
    }

    /// `response` with its body ending when the session does.
    fn cut(mut self, response: Response<Body>) -> Response<Body> {
        let (parts, body) = response.into_parts();
        let ended = async move { self.ended().await };
        let body = body.into_data_stream().take_until(ended);
        Response::from_parts(parts, Body::from_stream(body))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        drop(self.ended.take());
        let mut streams = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if streams
            .get(&self.session)
            .is_some_and(|signal| signal.receiver_count() == 0)
        {
            streams.remove(&self.session);
        }
    }
}

/// The layer [`Across::layer`] returns: apply it to tower-mcp's
/// router (`Router::layer`).
#[derive(Clone)]
pub struct AcrossLayer {
    shared: Arc<Shared>,
    tasks: Option<Arc<TaskWatch>>,
}

impl AcrossLayer {
    /// The same, also carrying task status across instances: for each task
    /// a `subscriptions/listen` request through this layer names
    /// (`taskIds`), this instance watches the task in the store while the
    /// request's stream lasts, and has `router` announce every change made
    /// through any instance (`notifications/tasks`, tower-mcp's
    /// `McpRouter::notify_task_status_changed`) to its own listeners of
    /// that task. tower-mcp announces only the transitions it drives on
    /// the instance driving them; so a listener on this instance of a task
    /// that another instance runs, completes, takes over or asks input for
    /// hears of it too. (On the instance driving a transition its
    /// listeners may hear it twice: each notification is the whole task,
    /// as `tasks/get` reads it.)
    ///
    /// `router` is the router tower-mcp serves (a clone), `tasks` its task
    /// store. The layer reads the body of a `POST` whose `Mcp-Method`
    /// header is `subscriptions/listen` (at most 1 MiB; a larger one is
    /// answered 413).
    pub fn announcing_tasks(mut self, router: McpRouter, tasks: TowerTaskStore) -> Self {
        self.tasks = Some(Arc::new(TaskWatch {
            router,
            tasks,
            watched: Mutex::new(HashMap::new()),
        }));
        self
    }
}

/// The largest `subscriptions/listen` body the layer reads for its
/// `taskIds`.
const LISTEN_BODY_LIMIT: usize = 1 << 20;

/// The largest request body in a session the layer keeps to send again
/// (see [`AcrossService`]); a larger one goes through once, as it came.
const RETRY_BODY_LIMIT: usize = 4 << 20;

/// The largest JSON answer the layer reads to tell tower-mcp's refusal of
/// a session whose `initialized` notification reached another instance.
const REFUSAL_LIMIT: usize = 4 << 10;

/// What tower-mcp answers, on an instance holding a session it created,
/// to a request sent after the client's `notifications/initialized`
/// reached another instance.
const NOT_INITIALIZED: &str = "Client must send notifications/initialized before making requests";

/// The tasks this instance watches for its `subscriptions/listen` streams.
struct TaskWatch {
    router: McpRouter,
    tasks: TowerTaskStore,
    /// Per task id, how many streams want it and the watcher announcing it.
    watched: Mutex<HashMap<String, (usize, tokio::task::AbortHandle)>>,
}

impl TaskWatch {
    /// Watches `ids` (once each, however many streams want one) until the
    /// returned guard drops.
    fn watch(self: &Arc<Self>, ids: Vec<String>) -> WatchedTasks {
        let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        for id in &ids {
            let entry = watched.entry(id.clone()).or_insert_with(|| {
                let (router, tasks, id) = (self.router.clone(), self.tasks.clone(), id.clone());
                let watcher = tokio::spawn(async move {
                    tasks.announce_changes(&id, &router).await;
                });
                (0, watcher.abort_handle())
            });
            entry.0 += 1;
        }
        WatchedTasks {
            watch: self.clone(),
            ids,
        }
    }
}

/// A stream's hold on the tasks it listens to; the last one's drop stops
/// a task's watcher.
struct WatchedTasks {
    watch: Arc<TaskWatch>,
    ids: Vec<String>,
}

impl Drop for WatchedTasks {
    fn drop(&mut self) {
        let mut watched = self
            .watch
            .watched
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for id in &self.ids {
            if let Some((wanted, watcher)) = watched.get_mut(id) {
                *wanted -= 1;
                if *wanted == 0 {
                    watcher.abort();
                    watched.remove(id);
                }
            }
        }
    }
}

/// The task ids a `subscriptions/listen` request's filter names.
fn listened_tasks(body: &[u8]) -> Vec<String> {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    request["params"]["notifications"]["taskIds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|id| id.as_str().map(str::to_owned))
        .collect()
}

impl fmt::Debug for AcrossLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcrossLayer").finish_non_exhaustive()
    }
}

impl<S> tower_layer::Layer<S> for AcrossLayer {
    type Service = AcrossService<S>;

    fn layer(&self, inner: S) -> AcrossService<S> {
        AcrossService {
            inner,
            shared: self.shared.clone(),
            tasks: self.tasks.clone(),
        }
    }
}

/// The service of an [`AcrossLayer`] around tower-mcp's router.
#[derive(Clone)]
pub struct AcrossService<S> {
    inner: S,
    shared: Arc<Shared>,
    tasks: Option<Arc<TaskWatch>>,
}

impl<S> fmt::Debug for AcrossService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcrossService").finish_non_exhaustive()
    }
}

impl<S> tower_service::Service<Request<Body>> for AcrossService<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, std::result::Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|value| value.to_str().ok())
            .filter(|session| !session.is_empty())
            .map(str::to_owned);
        let method = request.method().clone();
        // The clone is the ready one's twin; keep the one polled ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        // Deleted: whatever record another instance wrote back before it
        // heard, this instance restores nothing.
        let deleted = session
            .as_deref()
            .is_some_and(|session| shared.runtime.session_ended(session));
        let watching = match (&method, &session) {
            (&Method::GET | &Method::POST, Some(session)) => Some(self.shared.watch(session)),
            _ => None,
        };
        let tasks = self.tasks.clone().filter(|_| {
            method == Method::POST
                && request
                    .headers()
                    .get("mcp-method")
                    .is_some_and(|m| m.as_bytes() == b"subscriptions/listen")
        });
        Box::pin(async move {
            if deleted {
                return Ok(not_found());
            }
            let (request, watched_tasks) = match tasks {
                None => (request, None),
                Some(tasks) => {
                    let (parts, body) = request.into_parts();
                    let Ok(body) = axum::body::to_bytes(body, LISTEN_BODY_LIMIT).await else {
                        return Ok(Response::builder()
                            .status(StatusCode::PAYLOAD_TOO_LARGE)
                            .body(Body::from(
                                "a subscriptions/listen request is at most 1 MiB",
                            ))
                            .expect("a static response"));
                    };
                    let watched = tasks.watch(listened_tasks(&body));
                    (Request::from_parts(parts, Body::from(body)), Some(watched))
                }
            };
            let response = match (&method, &session) {
                (&Method::DELETE, _) => ENDING.scope((), inner.call(request)).await?,
                (&Method::POST, Some(session)) => {
                    initialized_elsewhere(&mut inner, &shared, session, request).await?
                }
                _ => inner.call(request).await?,
            };
            if method == Method::DELETE
                && response.status() == StatusCode::OK
                && let Some(session) = &session
            {
                shared.deleted_here(session).await;
            }
            let response = match watching {
                Some(watching) if is_event_stream(&response) => watching.cut(response),
                _ => response,
            };
            // The listened tasks are watched while the stream is sent.
            Ok(match watched_tasks {
                Some(watched) => {
                    let (parts, body) = response.into_parts();
                    let body = body.into_data_stream().map(move |chunk| {
                        let _holding = &watched;
                        chunk
                    });
                    Response::from_parts(parts, Body::from_stream(body))
                }
                None => response,
            })
        })
    }
}

/// Sends `request` (a `POST` in `session`) through `inner`; when tower-mcp
/// refuses it because the session, created on this instance, never heard
/// the client's `notifications/initialized` (which reached another
/// instance), drops this instance's copy of the session (its record stays:
/// the session store spares it, as another instance serves it) and sends
/// it again, so tower-mcp restores the session from its record, as the
/// client initialized it, as it would on any other instance.
async fn initialized_elsewhere<S>(
    inner: &mut S,
    shared: &Shared,
    session: &str,
    request: Request<Body>,
) -> std::result::Result<Response<Body>, S::Error>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>>,
{
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, RETRY_BODY_LIMIT).await else {
        return Ok(Response::builder()
            .status(StatusCode::PAYLOAD_TOO_LARGE)
            .body(Body::from("a request is at most 4 MiB"))
            .expect("a static response"));
    };
    let again = Request::from_parts(parts.clone(), Body::from(body.clone()));
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    let response = inner
        .call(Request::from_parts(parts, Body::from(body)))
        .await?;
    let (response, refused) = refused_as_uninitialized(response).await;
    if !refused {
        return Ok(response);
    }
    tracing::info!(
        session_id = %session,
        "the session's initialized notification reached another instance; restoring it here from its record"
    );
    shared.sessions.terminate_session(session).await;
    // Its GET stream here, if any, was the dropped copy's: it ends, and the
    // client opens it again.
    shared.end_streams(session);
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
    inner.call(again).await
}

/// `response`, and whether it is tower-mcp's refusal of a session that
/// never heard `notifications/initialized` (a small JSON answer).
async fn refused_as_uninitialized(response: Response<Body>) -> (Response<Body>, bool) {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    let small = axum::body::HttpBody::size_hint(response.body())
        .upper()
        .is_some_and(|length| length <= REFUSAL_LIMIT as u64);
    if !is_json || !small {
        return (response, false);
    }
    let (parts, body) = response.into_parts();
    let Ok(body) = axum::body::to_bytes(body, REFUSAL_LIMIT).await else {
        return (Response::from_parts(parts, Body::empty()), false);
    };
    let refused = serde_json::from_slice::<Value>(&body)
        .is_ok_and(|answer| answer["error"]["message"] == NOT_INITIALIZED);
    (Response::from_parts(parts, Body::from(body)), refused)
}

/// tower-mcp's answer to a session it does not know.
fn not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .body(Body::from("session not found"))
        .expect("a static response")
}

fn is_event_stream(response: &Response<Body>) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tower_mcps_refusal_of_an_uninitialized_session_is_one() {
        let answer = |body: &str| {
            Response::builder()
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let refusal = format!(
            r#"{{"jsonrpc":"2.0","id":3,"error":{{"code":-32600,"message":"{NOT_INITIALIZED}"}}}}"#
        );
        let (kept, refused) = runtime.block_on(refused_as_uninitialized(answer(&refusal)));
        assert!(refused);
        let kept = runtime
            .block_on(axum::body::to_bytes(kept.into_body(), usize::MAX))
            .unwrap();
        assert_eq!(kept, refusal.as_bytes(), "the answer is kept whole");
        for other in [
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"other"}}"#,
            "not json",
        ] {
            assert!(!runtime.block_on(refused_as_uninitialized(answer(other))).1);
        }
    }

    #[test]
    fn broadcasts_round_trip_as_json_rpc_and_nothing_else_is_one() {
        for broadcast in [
            Broadcast::ToolsListChanged,
            Broadcast::PromptsListChanged,
            Broadcast::ResourcesListChanged,
            Broadcast::ResourceUpdated {
                uri: "file:///a b".into(),
            },
        ] {
            let json = broadcast.to_json();
            let value: Value = serde_json::from_slice(&json).unwrap();
            assert_eq!(value["jsonrpc"], "2.0");
            assert_eq!(value["method"], broadcast.method());
            assert_eq!(Broadcast::from_json(&json), Some(broadcast));
        }
        for other in [
            &br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#[..],
            br#"{"jsonrpc":"2.0","method":"notifications/resources/updated"}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":1}}"#,
            b"not json",
        ] {
            assert_eq!(Broadcast::from_json(other), None);
        }
    }
}
