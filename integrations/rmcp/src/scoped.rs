//! Resumes bound to the session that owns the stream, and sessions that end
//! everywhere when they end in the shared store.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use futures_core::future::BoxFuture;
use futures_util::StreamExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    EventStore as RmcpEventStoreTrait, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use tokio::time::Instant;

use super::callers::{caller, scoped_caller};
use super::events::is_standalone_of;
use super::listeners::Listeners;
use super::restores::{Restores, replayed};
use super::routed::Routed;
use super::sessions::{DEFAULT_SESSION_KEY_PREFIX, DEFAULT_SESSION_TTL};
use super::tracker::{Absent, Cleanup, Stored, Tracker, spawn};
use super::{RmcpEventStore, RmcpSessionStore};
use mcp_event_store_core::EventId;
use mcp_event_store_core::Retention;
use mcp_event_store_core::SessionDigest;
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::backend::validate_session_id;
use mcp_event_store_core::{EventStore, SessionStore};
use mcp_event_store_runtime::{Audience, Heard, Route, Runtime};

/// How long a stream stays bound to its session by default: one hour, the
/// default [`Retention`]'s maximum age, so a binding lives as long as the
/// events it guards. Set it with [`SessionScoped::with_retention`] (or
/// [`SessionScoped::with_binding_ttl`]) when the store keeps events longer.
pub const DEFAULT_BINDING_TTL: Duration = Duration::from_secs(60 * 60);

/// The prefix of the session-store keys that record which session owns a
/// stream.
pub const DEFAULT_BINDING_KEY_PREFIX: &str = "rmcp-stream/";

/// How often, at most, a [`SessionScoped`] manager asks the session store
/// whether a session it serves still exists: once a second per session.
pub const DEFAULT_SESSION_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long after closing a session the manager waits before it looks the
/// session up in the store to decide whether its bindings can go: rmcp
/// deletes a session's state just *after* closing it (`DELETE`).
const CLEANUP_DELAY: Duration = Duration::from_secs(5);

/// How many binding deletions run at once when a session's bindings are
/// removed.
const CLEANUP_CONCURRENCY: usize = 8;

/// An rmcp `SessionManager` (normally rmcp's `LocalSessionManager` with our
/// event store) whose resumes only reach streams of the resuming session,
/// and whose sessions end on every instance when they end in the shared
/// session store.
///
/// # Resumes stay in their session
///
/// With an event store, rmcp's `LocalSessionManager::resume` replays
/// whatever stream the `Last-Event-ID` names and ignores the
/// `Mcp-Session-Id` the request carries: a client of session A that holds an
/// event id of session B's stream (a leaked log line, a shared proxy) gets
/// B's messages. Our ids cannot be guessed (contract C2), but the id alone
/// should not be the only credential when the session is known. This wrapper
/// closes that gap:
///
/// * when a request stream starts (`create_stream`), before its first event
///   reaches the client, it records in the store that the stream belongs to
///   the session: one `put_session` per request stream, under
///   `rmcp-stream/<stream token>`, with a time to live (the *binding
///   lifetime*, below);
/// * on `resume`, the `Last-Event-ID` must name a stream bound to this
///   session, or the session's standalone stream (`<session id>:common`,
///   found with `get_stream_id_for_event_id`). Otherwise the resume is
///   refused with [`ScopedError::ForeignEvent`], and rmcp answers the client
///   with an empty SSE stream (HTTP 200).
///
/// Bindings live in the shared store, so a stream begun on one instance can
/// be resumed on another.
///
/// # Binding lifetime
///
/// A binding is only useful while the events of its stream are kept, so it
/// lives as long as they do: the event retention's maximum age
/// ([`DEFAULT_BINDING_TTL`], one hour, is the default [`Retention`]'s; pass
/// yours with [`with_retention`](Self::with_retention)). A stream still
/// sending events after half that time writes its binding again, so a long
/// tool call stays resumable to its end: one more write per half lifetime of
/// a long stream. The store then holds one small binding per request stream
/// started within the maximum age, next to at least two events (priming and
/// result) of each such stream.
///
/// When a session ends (deleted with `DELETE` on any instance, or expired
/// in the session store), each instance that served it removes the
/// bindings it wrote for it (up to the latest 1024 per session):
///
/// * the instance that handles the `DELETE` at once, through a
///   [linked](Self::with_session_store) session store, or else five
///   seconds later, after looking the session up in the store;
/// * another instance at once when a request shows it the session is gone,
///   or else when it closes its copy of the session (rmcp's idle timeout,
///   five minutes by default) and the store no longer has it.
///
/// Bindings nobody removes (an instance that was killed, the older ones of
/// a session with more than 1024 streams) expire with their time to live.
/// (One instance could remove all of a session's bindings, whoever wrote
/// them, only if the session store could delete every key under a prefix;
/// [`SessionStore`] has no such operation.)
///
/// # Sessions across instances
///
/// With a session store, rmcp restores a session on any instance from its
/// stored `initialize` parameters, and keeps it there in memory. rmcp itself
/// never looks at the store again for a session it holds, so a session
/// deleted (`DELETE`) on instance A would live on, from memory, on instance
/// B. This wrapper asks the store, in `has_session`, whether a session it
/// holds still has its state there, **at most once per session per
/// [check interval](Self::with_session_check_interval)** (default one
/// second), however many requests arrive; the other requests of that
/// second use the answer. A deleted or expired session answers 404
/// everywhere within one interval: the wrapper closes its copy (so a later
/// restore is not `AlreadyPresent`) and answers `false`, rmcp looks the
/// session up in the store, does not find it, and answers 404. A store that
/// fails to answer is logged and the session served (the check runs again
/// next interval).
///
/// The cost, so: one session-store read (a key lookup) per busy session per
/// interval and instance, whatever the request rate, and a map lookup for
/// the other requests. Measured on loopback (`examples/resumable-server/tests/rmcp_e2e/measure.rs`),
/// `has_session` took 110 to 270 ns a request with the default interval
/// (rmcp's alone: 50 to 70 ns), and 46 to 58 us (SQLite), 81 us (Redis),
/// 180 to 190 us (PostgreSQL) with a look-up on every request. That last is
/// a store round trip, as much as a durable append, added to every request:
/// hence one a second by default, which bounds the load at one read per
/// second per session and still ends a deleted session everywhere within a
/// second. [`with_session_check_interval`](Self::with_session_check_interval)
/// sets it, `Duration::ZERO` for every request.
///
/// Which key to read: by default `rmcp/<session id>` in this manager's
/// store, where [`IntoRmcp::into_rmcp_sessions`](super::IntoRmcp) keeps
/// sessions. Give it the session store you hand to rmcp with
/// [`with_session_store`](Self::with_session_store) (its key prefix and
/// store are then used, and it tells this manager which sessions it wrote):
///
/// * linked like that, every session whose state rmcp stored is checked,
///   from its first request on;
/// * unlinked, a session is checked once it has been seen in the store
///   (every restored session, and a session created here from its first
///   check on). A session created here and absent at its first check is
///   taken as not shared (a server without a session store) and never
///   checked again: such a server pays one read per session, ever. The
///   price: a session created here and deleted on another instance before
///   its first request here is not noticed here. Link the session store.
///
/// With a runtime ([`with_runtime`](Self::with_runtime), as
/// [`Durable`](crate::Durable) wires it), a `DELETE` is also pushed to
/// every instance over the store's bus, and each closes its copy at once
/// ([`listen_across`](Self::listen_across)): the check above remains for
/// sessions that expire, and for a push missed.
///
/// A session expires when its state expires in the session store
/// ([`RmcpSessionStore::with_ttl`], 24 hours by default, counted from its
/// creation or its latest restore on another instance, since rmcp does not
/// refresh the state while a session is in use): from then on it is 404
/// on every instance, in use or not.
///
/// # Restores racing requests
///
/// rmcp restores a session in the request that finds it absent
/// (`has_session` false): it loads the state, calls `restore_session`
/// (from then on the session is held), and replays `initialize` and
/// `notifications/initialized`. Other requests of the session that also
/// found it absent wait for that restore (rmcp's `pending_restores`). Two
/// orderings of two requests arriving together on an instance that must
/// restore their session failed with rmcp 3.11 alone, and are served here:
///
/// * **Seen half made.** A request arriving after `restore_session` and
///   before the replayed `initialize` was served saw the session held, and
///   its message could reach the session's worker before the `initialize`:
///   the worker ended, and both requests were answered 500. Here a restore
///   is marked in flight before the inner manager holds the session, until
///   the replayed `initialize` is served (or fails, or the session closes,
///   or rmcp drops the restore); `has_session` waits while it is in flight
///   (at most 10 s), then answers as always (callers included). Without a
///   restore in flight, `has_session` costs one more atomic read.
/// * **Come too late.** A request that found the session absent but came
///   to rmcp's restore after another request had restored it completely
///   (rmcp forgets a restore once done, and nothing tells the late one)
///   restored it again: the manager answered `AlreadyPresent`, which
///   rmcp 3.11 turns into 500 ("restore_session returned AlreadyPresent
///   unexpectedly"). Here that second restore gets a transport of its own
///   ([`Routed`], carrying nothing but the handshake): rmcp builds a
///   handler (your factory runs once more), replays `initialize` (with
///   `SessionRestoreMarker`) and `notifications/initialized` to it, and
///   drops it; the request is then served by the session held here, and
///   the close rmcp makes when that handler's worker ends leaves the
///   session alone. The session store has just given the state to this
///   request's caller, so the session is theirs; should the held session
///   be another caller's, the request is answered 404.
///
/// With sessions bound to their callers ([`with_callers`](Self::with_callers))
/// and the session store linked ([`with_session_store`](Self::with_session_store)),
/// a request of another caller racing the owner's on such an instance is
/// answered exactly as for an unknown session, 404, and the owner's is
/// served, whatever their order. rmcp hands every request that finds the
/// session absent while a restore attempt of it is under way (or just
/// over) that attempt's outcome: the other caller's request then went on
/// as if the session were its own, to be refused with 500
/// ([`ScopedError::SessionNotFound`]), or the owner's was handed the other
/// caller's "no such session", 404. So a request about to be answered
/// "not held here" asks the session store whether the session is its
/// caller's (one read) and waits, while requests of the other kind are on
/// their way to rmcp's restore, until their attempt is over (the other
/// caller's once rmcp's load found nothing; the owner's once each was
/// served after the restore, or the restore failed; at most 10 s) and
/// 50 ms after, as rmcp forgets an attempt in a task of its own, which
/// nothing tells. Only requests racing a request of the other kind wait.
/// Unlinked, the other caller's request is never served either, but may be
/// answered 500, and the owner's may be answered 404.
///
/// Everything else is passed to the inner manager.
///
/// ```no_run
/// # async fn demo() -> mcp_event_store_core::Result<()> {
/// use std::sync::Arc;
/// use mcp_event_store_core::{MemoryStore, Retention};
/// use mcp_event_store_rmcp::{IntoRmcp, SessionScoped};
/// use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
///
/// let store = Arc::new(MemoryStore::new()); // or mcp_event_store::connect_with(url, options).await?
/// let sessions = store.clone().into_rmcp_sessions();
/// let session_manager = Arc::new(
///     SessionScoped::local(store)
///         .with_retention(Retention::default()) // the store's retention
///         .with_session_store(&sessions),
/// );
/// let mut config = StreamableHttpServerConfig::default();
/// config.session_store = Some(sessions);
/// // StreamableHttpService::new(make_handler, session_manager, config)
/// # let _ = (session_manager, config);
/// # Ok(()) }
/// ```
pub struct SessionScoped<M, S: ?Sized> {
    inner: M,
    store: Arc<S>,
    ttl: Duration,
    prefix: String,
    /// Where sessions' state lives: the store and key prefix read by the
    /// session check.
    sessions: Arc<S>,
    session_prefix: String,
    check_every: Duration,
    tracker: Arc<Tracker>,
    /// The runtime whose bus carries answers and ended sessions between
    /// instances, if any ([`with_runtime`](Self::with_runtime)).
    runtime: Option<Runtime>,
    /// The standalone streams served here, for notifications raised
    /// anywhere.
    listeners: Arc<Listeners>,
    /// Whether sessions are bound to their callers ([`with_callers`](Self::with_callers)).
    callers_bound: bool,
    /// Whether the session store rmcp uses is linked ([`with_session_store`](Self::with_session_store)):
    /// it tells when a restore attempt found nothing.
    linked: bool,
    /// The restores in flight here, and the handshakes replayed for a
    /// second restore of a session held here.
    restores: Arc<Restores>,
}

impl<S: EventStore + SessionStore + ?Sized> SessionScoped<LocalSessionManager, S> {
    /// rmcp's `LocalSessionManager` (default configuration) with `store` as
    /// its event store, its resumes scoped to their session.
    pub fn local(store: Arc<S>) -> Self {
        Self::local_with_events(RmcpEventStore::new(store))
    }

    /// Like [`local`](Self::local), with the event store configured, for
    /// example to follow resumed streams for another hold or not at all
    /// ([`RmcpEventStore::without_follow`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use mcp_event_store_core::MemoryStore;
    /// use mcp_event_store_rmcp::{RmcpEventStore, SessionScoped};
    ///
    /// let events = RmcpEventStore::new(Arc::new(MemoryStore::new()))
    ///     .with_follow_hold(Duration::from_secs(60));
    /// let sessions = SessionScoped::local_with_events(events);
    /// # let _ = sessions;
    /// ```
    pub fn local_with_events(events: RmcpEventStore<S>) -> Self {
        let store = events.inner().clone();
        let events: Arc<dyn RmcpEventStoreTrait> = Arc::new(events);
        Self::new(
            LocalSessionManager::default().with_event_store(events),
            store,
        )
    }
}

impl<M, S: ?Sized> SessionScoped<M, S> {
    /// Wraps a session manager; `store` must be the one behind its event
    /// store (it keeps the bindings and locates the streams).
    pub fn new(inner: M, store: Arc<S>) -> Self {
        Self {
            inner,
            sessions: store.clone(),
            store,
            ttl: DEFAULT_BINDING_TTL,
            prefix: DEFAULT_BINDING_KEY_PREFIX.to_owned(),
            session_prefix: DEFAULT_SESSION_KEY_PREFIX.to_owned(),
            check_every: DEFAULT_SESSION_CHECK_INTERVAL,
            tracker: Arc::default(),
            runtime: None,
            listeners: Arc::default(),
            callers_bound: false,
            linked: false,
            restores: Arc::default(),
        }
    }

    /// Binds each session to the caller that opened it (C20), as `callers`
    /// reads it from the request: for anyone else a session held here is
    /// unknown (rmcp then looks it up in the session store, which answers
    /// the same for the same reason: 404), its streams cannot be resumed
    /// and a `DELETE` leaves it alone. Give the session store the same
    /// callers ([`RmcpSessionStore::with_callers`]) and serve the requests
    /// through [`CallerScoped`](crate::CallerScoped);
    /// [`Durable`](crate::Durable) does all three.
    pub fn with_callers(mut self, callers: &mcp_event_store_runtime::Callers) -> Self {
        self.callers_bound = callers.is_bound();
        self
    }

    /// Refuses a request of another caller that reached session `id`
    /// without [`has_session`](SessionManager::has_session) (rmcp lets the
    /// requests that waited on a restore through once it is done, whoever
    /// made them).
    fn ensure_caller<E>(&self, id: &SessionId) -> Result<(), ScopedError<E>> {
        match self.caller_owns(id) {
            true => Ok(()),
            false => Err(ScopedError::SessionNotFound),
        }
    }

    /// Whether the request being served may use session `id`: always when
    /// callers are not bound, else when it is the session's owner.
    fn caller_owns(&self, id: &SessionId) -> bool {
        !self.callers_bound || caller(true).is_some_and(|owner| self.tracker.owned_by(id, &owner))
    }

    /// Serves sessions across instances through `runtime`'s bus: each
    /// request this instance sends a client carries an id naming this
    /// instance ([`Routed`]), and a client's answer posted to another
    /// instance is forwarded here, to the request waiting for it (once
    /// [`listen_across`](SessionScoped::listen_across) runs). An answer
    /// for an instance that is gone is refused: rmcp answers the client's
    /// `POST` with 500 and this error's text.
    pub fn with_runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Ties the binding lifetime to the event retention of the store: a
    /// stream stays bound as long as events are kept (`max_age`), or, with
    /// no age limit, as long as a session's state ([`DEFAULT_SESSION_TTL`]).
    pub fn with_retention(self, retention: Retention) -> Self {
        self.with_binding_ttl(retention.max_age.unwrap_or(DEFAULT_SESSION_TTL))
    }

    /// Sets how long a stream stays bound (default [`DEFAULT_BINDING_TTL`]).
    /// After that, a resume of the stream is refused; keep it at least as
    /// long as events are retained ([`with_retention`](Self::with_retention)
    /// does exactly that). A zero lifetime is taken as one millisecond.
    pub fn with_binding_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// Sets the prefix of the binding keys in the session store.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The session store rmcp uses (`StreamableHttpServerConfig::session_store`):
    /// sessions whose state is missing from it are deleted or expired and
    /// end here too. Its store and key prefix are the ones checked, and it
    /// tells this manager which sessions it stored, so each of them is
    /// checked from its first request on, and when rmcp's attempt to
    /// restore a session found nothing (so that, with callers bound,
    /// another caller's request never shares the owner's restore: see
    /// *Restores racing requests*). Without this, `rmcp/<session id>`
    /// in this manager's store is checked, as
    /// [`IntoRmcp::into_rmcp_sessions`](super::IntoRmcp) keeps it.
    pub fn with_session_store(mut self, sessions: &Arc<RmcpSessionStore<S>>) -> Self {
        sessions.link(&self.tracker, &self.restores);
        self.linked = true;
        self.sessions = sessions.inner().clone();
        self.session_prefix = sessions.key_prefix().to_owned();
        self
    }

    /// Sets how often, at most, each session is looked up in the session
    /// store (default [`DEFAULT_SESSION_CHECK_INTERVAL`], one second): a
    /// session deleted or expired elsewhere ends here within this interval.
    /// `Duration::ZERO` looks it up on every request.
    pub fn with_session_check_interval(mut self, every: Duration) -> Self {
        self.check_every = every;
        self
    }

    /// How long a stream stays bound to its session.
    pub fn binding_ttl(&self) -> Duration {
        self.ttl
    }

    /// How often, at most, each session is looked up in the session store.
    pub fn session_check_interval(&self) -> Duration {
        self.check_every
    }

    /// The wrapped manager (for example to reach `LocalSessionManager`'s
    /// sessions).
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Restores in flight here, and replayed handshakes not over (tests).
    #[cfg(test)]
    pub(super) fn restores_pending(&self) -> (usize, usize) {
        self.restores.pending()
    }

    /// Sessions with requests on their way to a restore (tests).
    #[cfg(test)]
    pub(super) fn misses_pending(&self) -> usize {
        self.restores.misses()
    }

    fn binding_key(&self, token: &StreamToken) -> String {
        format!("{}{}", self.prefix, token)
    }

    /// The key of the session's state, or `None` if no store could hold it
    /// (then it cannot be in one).
    fn session_key(&self, id: &SessionId) -> Option<String> {
        let key = format!("{}{}", self.session_prefix, id);
        validate_session_id(&key).ok().map(|()| key)
    }
}

impl<M, S: ?Sized> fmt::Debug for SessionScoped<M, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionScoped")
            .field("ttl", &self.ttl)
            .field("prefix", &self.prefix)
            .field("session_prefix", &self.session_prefix)
            .field("check_every", &self.check_every)
            .field("sessions_held", &self.tracker.len())
            .finish_non_exhaustive()
    }
}

/// Why a [`SessionScoped`] manager refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScopedError<E> {
    /// The inner session manager's error.
    #[error(transparent)]
    Manager(E),
    /// The `Last-Event-ID` is not an event of a stream of this session.
    #[error("Last-Event-ID {event_id:?} is not from a stream of this session")]
    ForeignEvent {
        /// The id as received (shortened if long).
        event_id: String,
    },
    /// The session is not one of the caller's (C20): what a request of
    /// another caller gets that reached the session anyway (it waited on
    /// the restore its owner's request made, which only an unlinked
    /// session store lets happen: see *Restores racing requests* on
    /// [`SessionScoped`]; rmcp then answers 500 rather than 404). Says
    /// nothing more than an unknown session would.
    #[error("session not found")]
    SessionNotFound,
    /// A request found its session absent and came to restore it after
    /// another request had restored it here, and the handshake replayed
    /// aside for it (see *Restores racing requests* on [`SessionScoped`])
    /// got no answer from its handler in time.
    #[error("the session's handshake could not be replayed")]
    Replay,
    /// The store failed while the resume was checked; the resume is refused.
    #[error("could not check the Last-Event-ID against the session: {0}")]
    Store(#[source] mcp_event_store_core::Error),
    /// A client answered a request of an instance that is gone (its lease
    /// lapsed): nobody waits for the answer.
    #[error("the instance that sent request {request_id} is gone; nobody waits for this answer")]
    RequestGone {
        /// The request's id.
        request_id: String,
    },
    /// The bus failed while an answer was forwarded to the instance whose
    /// request waits for it.
    #[error("could not forward the answer to request {request_id}: {source}")]
    Forward {
        /// The request's id.
        request_id: String,
        /// What failed.
        #[source]
        source: mcp_event_store_core::Error,
    },
}

impl<E> ScopedError<E> {
    fn foreign(event_id: &str) -> Self {
        let mcp_event_store_core::Error::UnknownEventId { event_id } =
            mcp_event_store_core::Error::unknown_event_id(event_id)
        else {
            unreachable!("unknown_event_id builds UnknownEventId")
        };
        Self::ForeignEvent { event_id }
    }
}

/// Removes bindings from the store, a few at a time; failures are logged
/// (the bindings then expire with their time to live).
async fn delete_bindings<S: SessionStore + ?Sized>(
    store: Arc<S>,
    prefix: String,
    tokens: Vec<StreamToken>,
    session: SessionId,
) {
    if tokens.is_empty() {
        return;
    }
    let count = tokens.len();
    futures_util::stream::iter(tokens)
        .for_each_concurrent(CLEANUP_CONCURRENCY, |token| {
            let store = store.clone();
            let key = format!("{prefix}{token}");
            async move {
                if let Err(error) = store.delete_session(&key).await {
                    tracing::warn!(%error, key, "could not remove a stream binding; it expires with its time to live");
                }
            }
        })
        .await;
    tracing::debug!(session_id = %session, count, "removed the stream bindings of an ended session");
}

impl<M, S> SessionScoped<M, S>
where
    M: SessionManager,
    S: EventStore + SessionStore + ?Sized,
{
    /// `Ok(true)` for the session's standalone stream, `Ok(false)` for one
    /// of its request streams.
    pub(super) async fn check_owner(
        &self,
        session: &SessionId,
        last_event_id: &str,
    ) -> Result<bool, ScopedError<M::Error>> {
        let Some(id) = EventId::parse(last_event_id) else {
            return Err(ScopedError::foreign(last_event_id));
        };
        match self.store.get_session(&self.binding_key(&id.token)).await {
            // The session's digest (C20); a binding written by a release
            // before it holds the id itself, until it expires.
            Ok(Some(owner))
                if owner == SessionDigest::of(session).hex().as_bytes()
                    || owner == session.as_bytes() =>
            {
                return Ok(false);
            }
            Ok(Some(_)) => return Err(ScopedError::foreign(last_event_id)),
            Ok(None) => {}
            Err(e) => return Err(ScopedError::Store(e)),
        }
        // Not a request stream of any session: the standalone stream of
        // this one is the only other thing it may be.
        match self.store.get_stream_id_for_event_id(last_event_id).await {
            Ok(Some(stream)) if is_standalone_of(&stream, session) => Ok(true),
            Ok(_) => Err(ScopedError::foreign(last_event_id)),
            Err(e) => Err(ScopedError::Store(e)),
        }
    }

    /// Whether a session held in memory still exists in the session store,
    /// asked at most once per check interval. `false` once it was seen
    /// there (or stored through a linked session store) and is gone.
    async fn still_stored(&self, id: &SessionId) -> bool {
        if !self
            .tracker
            .claim_check(id, self.check_every, Instant::now())
        {
            return true;
        }
        let Some(key) = self.session_key(id) else {
            // No store could hold its state under this prefix: not shared.
            return true;
        };
        match self.sessions.get_session(&key).await {
            Ok(Some(_)) => {
                self.tracker.seen(id);
                true
            }
            Ok(None) => match self.tracker.absent(id) {
                Absent::NotShared => true,
                Absent::Gone(tracked) => {
                    tracing::info!(session_id = %id, "session deleted or expired in the session store; closing it here");
                    if let Err(error) = self.inner.close_session(id).await {
                        tracing::warn!(session_id = %id, %error, "could not close an ended session");
                    }
                    spawn(delete_bindings(
                        self.store.clone(),
                        self.prefix.clone(),
                        tracked.live_bindings(self.ttl, Instant::now()),
                        id.clone(),
                    ));
                    false
                }
            },
            Err(error) => {
                tracing::warn!(session_id = %id, %error, "could not check that the session still exists; serving it");
                true
            }
        }
    }

    /// Whether the session store gives session `id`'s state to the
    /// request's caller: whether rmcp, restoring it, restores it for them.
    async fn may_restore(&self, id: &SessionId) -> bool {
        let (Some(key), Some(caller)) = (self.session_key(id), caller(self.callers_bound)) else {
            return false;
        };
        matches!(
            self.sessions.get_session_as(&caller, &key).await,
            Ok(Some(_))
        )
    }

    /// Wraps a request stream of session `id` so that its stream is bound to
    /// the session before its first event reaches the client, and bound
    /// again while it runs longer than half the binding lifetime.
    pub(super) fn bind_stream<St>(&self, id: &SessionId, stream: St) -> BindFirst<St>
    where
        St: Stream<Item = ServerSseMessage>,
    {
        let store = self.store.clone();
        let prefix = self.prefix.clone();
        let ttl = self.ttl;
        let session = id.clone();
        let tracker = self.tracker.clone();
        let bind = move |event_id: &str, first: bool| -> Option<BoxFuture<'static, ()>> {
            let token = EventId::parse(event_id)?.token;
            let key = format!("{prefix}{token}");
            let store = store.clone();
            let session = session.clone();
            let tracker = tracker.clone();
            Some(Box::pin(async move {
                let owner = SessionDigest::of(&session).hex();
                match store.put_session(&key, owner.as_bytes(), ttl).await {
                    Ok(()) if first => tracker.remember(&session, token, ttl, Instant::now()),
                    Ok(()) => {}
                    Err(error) => tracing::error!(
                        %error,
                        "could not bind a stream to its session; resuming it will be refused"
                    ),
                }
            }))
        };
        BindFirst {
            inner: Box::pin(stream),
            bind: Some(Box::new(bind)),
            bound_at: None,
            rebind_after: self.ttl / 2,
            pending: Mutex::new(None),
            held: None,
        }
    }
}

/// The request a client's message answers, if it is an answer.
fn answered(message: &ClientJsonRpcMessage) -> Option<&rmcp::model::RequestId> {
    match message {
        ClientJsonRpcMessage::Response(response) => Some(&response.id),
        ClientJsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    }
}

impl<M, S> SessionScoped<M, S>
where
    M: SessionManager + 'static,
    S: EventStore + SessionStore + ?Sized + 'static,
{
    /// Starts hearing, through the runtime's bus
    /// ([`with_runtime`](Self::with_runtime)), what the other instances
    /// tell this one, until the runtime shuts down or this manager is
    /// dropped:
    ///
    /// * answers clients posted to another instance for requests of this
    ///   one, each handed to its session (dropped and counted,
    ///   [`Runtime::replies_dropped`], if the session is not held here);
    /// * sessions a client deleted on another instance, each closed here
    ///   at once if held here (its open streams end, its waiting requests
    ///   fail), where the session check would see it only on the
    ///   session's next request;
    /// * notifications raised on any instance
    ///   ([`Durable::notify`](crate::Durable::notify)), each stored in the
    ///   standalone stream (`<session>:common`) of every session it is for
    ///   whose listener (a standalone `GET`, live or resumed) is here, and
    ///   given to the live ones, so a client hears it wherever its `GET`
    ///   landed, and again after a resume. (A session with no listener
    ///   anywhere does not get it, as a notification rmcp sends with no
    ///   `GET` open reaches no one either.)
    ///
    /// Once it returns, nothing published is missed. Without a runtime it
    /// does nothing.
    pub async fn listen_across(self: &Arc<Self>) -> mcp_event_store_core::Result<()> {
        let Some(runtime) = &self.runtime else {
            return Ok(());
        };
        let mut replies = runtime.replies().await?;
        let mut ended = runtime.ended_sessions().await?;
        let mut notifications = runtime.notifications().await?;
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(heard) = notifications.next().await {
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                match heard {
                    Heard::Message(notification) => manager.deliver(notification).await,
                    Heard::Missed => tracing::warn!(
                        "notifications raised on other instances were lost for this instance's listeners"
                    ),
                }
            }
        });
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(heard) = replies.next().await {
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                let Heard::Message(reply) = heard else {
                    tracing::warn!(
                        "answers forwarded from other instances were lost; their requests wait until they time out"
                    );
                    continue;
                };
                // Each on its own: a busy session must not hold up others.
                tokio::spawn(async move { manager.take_reply(reply).await });
            }
        });
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(heard) = ended.next().await {
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                match heard {
                    Heard::Message(digest) => {
                        if let Some(session) = manager.tracker.find(&digest) {
                            manager.ended_elsewhere(session).await;
                        }
                    }
                    Heard::Missed => tracing::warn!(
                        "sessions ended on other instances may have been missed; each ends here at its next request"
                    ),
                }
            }
        });
        Ok(())
    }

    /// Stores a notification raised on any instance in the standalone
    /// stream of each session it is for that has a listener here, and
    /// gives it to the live ones (the resumed ones follow the store).
    async fn deliver(&self, notification: mcp_event_store_runtime::Notification) {
        let message: ServerJsonRpcMessage = match serde_json::from_slice(&notification.message) {
            Ok(message) => message,
            Err(error) => {
                return tracing::warn!(%error, "dropped a notification that is not a JSON-RPC message");
            }
        };
        let sessions = match notification.audience {
            Audience::All => self.listeners.sessions(),
            Audience::Session(digest) => match self.tracker.find(&digest) {
                Some(session) if self.listeners.has(&session) => vec![session],
                _ => return,
            },
        };
        for session in sessions {
            let mut event = ServerSseMessage::from_message(message.clone());
            if let Some(events) = self.inner.event_store() {
                match events
                    .store_event(&format!("{session}:common"), &event)
                    .await
                {
                    Ok(id) => event.event_id = Some(id),
                    Err(error) => {
                        tracing::warn!(session_id = %session, %error, "could not store a notification; sending it unstored");
                    }
                }
            }
            self.listeners.deliver(&session, &event);
        }
    }

    /// Hands an answer forwarded from another instance to its session.
    /// Whether a client deleted session `id` lately, on any instance
    /// ([`Runtime::session_ended`]).
    fn ended_anywhere(&self, id: &SessionId) -> bool {
        self.runtime
            .as_ref()
            .is_some_and(|runtime| runtime.session_ended(id))
    }

    async fn take_reply(&self, reply: mcp_event_store_runtime::Reply) {
        let dropped = || {
            if let Some(runtime) = &self.runtime {
                runtime.reply_dropped();
            }
        };
        let message: ClientJsonRpcMessage = match serde_json::from_slice(&reply.message) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%error, "dropped a forwarded answer that is not a JSON-RPC message");
                return dropped();
            }
        };
        let session: SessionId = reply.session.into();
        match self.inner.has_session(&session).await {
            Ok(true) => {}
            _ => {
                tracing::warn!(session_id = %session, "dropped a forwarded answer: the session is not held here");
                return dropped();
            }
        }
        if let Err(error) = self.inner.accept_message(&session, message).await {
            tracing::warn!(session_id = %session, %error, "dropped a forwarded answer");
            dropped();
        }
    }

    /// Closes a session a client deleted on another instance, if held here.
    async fn ended_elsewhere(&self, id: SessionId) {
        if !matches!(self.inner.has_session(&id).await, Ok(true)) {
            return;
        }
        tracing::info!(session_id = %id, "session deleted on another instance; closing it here");
        if let Err(error) = self.inner.close_session(&id).await {
            tracing::warn!(session_id = %id, %error, "could not close a session deleted elsewhere");
        }
        if let Some(tracked) = self.tracker.take(&id) {
            spawn(delete_bindings(
                self.store.clone(),
                self.prefix.clone(),
                tracked.live_bindings(self.ttl, Instant::now()),
                id,
            ));
        }
    }
}

impl<M, S> SessionManager for SessionScoped<M, S>
where
    M: SessionManager,
    S: EventStore + SessionStore + ?Sized,
{
    type Error = ScopedError<M::Error>;
    type Transport = Routed<M::Transport>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self
            .inner
            .create_session()
            .await
            .map_err(ScopedError::Manager)?;
        self.tracker.track(&id, Stored::Unknown);
        Ok((id, Routed::new(transport, self.runtime.clone())))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        // The handshake replayed for a second restore of a session held
        // here goes to its own handler, not to the session.
        let message = match self.restores.initialize(id, message) {
            Ok(answer) => return answer.await.ok_or(ScopedError::Replay),
            Err(message) => message,
        };
        // A new session, or one restored for a caller the session store
        // checked: either way, the caller serving it now owns it.
        self.tracker.set_owner(id, caller(self.callers_bound));
        let answer = self
            .inner
            .initialize_session(id, message)
            .await
            .map_err(ScopedError::Manager);
        // A restored session now serves requests: those that waited go on.
        self.restores.finish(id);
        if answer.is_err() {
            self.restores.abandon(id);
        }
        answer
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        loop {
            let mut held = self
                .inner
                .has_session(id)
                .await
                .map_err(ScopedError::Manager)?;
            // Asked after the inner manager: a restore is marked before the
            // session is held, so one seen held mid-restore is seen restoring.
            if self.restores.settle(id).await {
                held = self
                    .inner
                    .has_session(id)
                    .await
                    .map_err(ScopedError::Manager)?;
            }
            if held && self.caller_owns(id) {
                // Checked last: a session ended elsewhere while this ran is
                // closed here, and possibly untracked, by now; it is unknown
                // all the same.
                return Ok(self.still_stored(id).await && !self.ended_anywhere(id));
            }
            // Not held here, or another caller's (unknown to this one, C20):
            // rmcp goes on to restore it, handing this request the outcome
            // of any restore attempt of the session under way. The owner's
            // and another caller's must not share one (see
            // `Restores::miss`): which this request is, the session store
            // says (it gives the state to the owner only).
            if !self.callers_bound || !self.linked {
                return Ok(false);
            }
            let owner = !held && self.may_restore(id).await;
            if self.restores.miss(id, owner).await {
                return Ok(false);
            }
        }
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        if self.callers_bound
            && let Some(owner) = scoped_caller()
            && !self.tracker.owned_by(id, &owner)
        {
            // Another caller's `DELETE`: answered as for an unknown session
            // (which rmcp accepts), the session left alone. (Outside a
            // request, rmcp closes a session whose worker ended.)
            return Ok(());
        }
        if self.restores.replay_closed(id) {
            // The worker of a replayed handshake ended: the session it
            // replayed for lives on.
            return Ok(());
        }
        self.restores.finish(id);
        self.restores.abandon(id);
        let closed = self
            .inner
            .close_session(id)
            .await
            .map_err(ScopedError::Manager);
        let Some(tracked) = self.tracker.take(id) else {
            return closed;
        };
        let tokens = tracked.live_bindings(self.ttl, Instant::now());
        if tokens.is_empty() {
            return closed;
        }
        let store = self.store.clone();
        let prefix = self.prefix.clone();
        let session = id.clone();
        let cleanup: Cleanup =
            Box::new(move || Box::pin(delete_bindings(store, prefix, tokens, session)));
        if tracked.stored == Stored::No {
            // Not shared: closed here, it is gone.
            spawn(cleanup());
            return closed;
        }
        // It may live on elsewhere: its bindings go only once its state is
        // gone from the store. rmcp deletes the state just after closing
        // (`DELETE`); a linked session store says so at once, otherwise
        // the store is asked a little later.
        self.tracker.closing(id, cleanup);
        let tracker = self.tracker.clone();
        let sessions = self.sessions.clone();
        let key = self.session_key(id);
        let session = id.clone();
        spawn(async move {
            tokio::time::sleep(CLEANUP_DELAY).await;
            let gone = match &key {
                Some(key) => match sessions.get_session(key).await {
                    Ok(state) => state.is_none(),
                    Err(error) => {
                        tracing::warn!(session_id = %session, %error, "could not look up a closed session; its stream bindings expire with their time to live");
                        false
                    }
                },
                None => true,
            };
            let cleanup = tracker.take_closing(&session);
            if let (true, Some(cleanup)) = (gone, cleanup) {
                cleanup().await;
            }
        });
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.restores.served(id);
        self.ensure_caller(id)?;
        let stream = self
            .inner
            .create_stream(id, message)
            .await
            .map_err(ScopedError::Manager)?;
        Ok(self.bind_stream(id, stream))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        let Some(message) = self.restores.initialized(id, message) else {
            // The end of a handshake replayed for a session held here.
            return Ok(());
        };
        if !replayed(&message) {
            self.restores.served(id);
        }
        self.ensure_caller(id)?;
        if let Some(runtime) = &self.runtime
            && let Some(request_id) = answered(&message)
        {
            let request_id = request_id.to_string();
            let bytes = serde_json::to_vec(&message).expect("a parsed message serializes");
            let forward = |source| ScopedError::Forward {
                request_id: request_id.clone(),
                source,
            };
            match runtime
                .route_reply(id, &request_id, &bytes)
                .await
                .map_err(forward)?
            {
                Route::Local => {}
                Route::Forwarded(_) => return Ok(()),
                Route::Gone(_) => return Err(ScopedError::RequestGone { request_id }),
            }
        }
        self.inner
            .accept_message(id, message)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.restores.served(id);
        self.ensure_caller(id)?;
        let stream = self
            .inner
            .create_standalone_stream(id)
            .await
            .map_err(ScopedError::Manager)?;
        Ok(self.listeners.live(id, stream))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.restores.served(id);
        if !self.caller_owns(id) {
            return Err(ScopedError::foreign(&last_event_id));
        }
        let standalone = match self.check_owner(id, &last_event_id).await {
            Ok(standalone) => standalone,
            Err(refused) => {
                tracing::warn!(session_id = %id, error = %refused, "resume refused");
                return Err(refused);
            }
        };
        let stream = self
            .inner
            .resume(id, last_event_id)
            .await
            .map_err(ScopedError::Manager)?;
        Ok(match standalone {
            true => self.listeners.following(id, stream).left_stream(),
            false => stream.right_stream(),
        })
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        if self.ended_anywhere(&id) {
            // Whatever state another instance wrote back before it heard.
            self.restores.abandon(&id);
            return Ok(RestoreOutcome::NotSupported);
        }
        // Marked before the inner manager holds the session: a request
        // that sees it held waits until its handshake is replayed. (Dropped
        // unfinished, on an error or an outcome without a transport, it
        // abandons the restore.)
        let restoring = self.restores.begin(&id);
        let outcome = self
            .inner
            .restore_session(id.clone())
            .await
            .map_err(ScopedError::Manager)?;
        Ok(match outcome {
            RestoreOutcome::Restored(transport) => {
                // rmcp restores only what it just loaded from the session store.
                self.tracker.track(&id, Stored::Yes);
                RestoreOutcome::Restored(
                    Routed::new(transport, self.runtime.clone()).restoring(restoring),
                )
            }
            RestoreOutcome::AlreadyPresent => {
                restoring.already_held();
                // Restored (or created) here since this request found it
                // absent. rmcp 3.11 answers `AlreadyPresent` with 500: a
                // handshake replayed to a handler of its own lets the
                // request through to the session held here. The session
                // store just gave its state to this caller; it is theirs.
                if !self.caller_owns(&id) {
                    return Ok(RestoreOutcome::NotSupported);
                }
                tracing::debug!(session_id = %id, "session restored here meanwhile; replaying its handshake aside");
                RestoreOutcome::Restored(Routed::replay(self.restores.replay(&id)))
            }
            // NotSupported, and any outcome a later rmcp adds: no session
            // here to serve.
            _ => RestoreOutcome::NotSupported,
        })
    }

    fn event_store(&self) -> Option<Arc<dyn RmcpEventStoreTrait>> {
        self.inner.event_store()
    }
}

/// Writes a binding: called with an event id and whether it is the stream's
/// first; `None` if the id is not one of ours (nothing to bind).
type Binder = Box<dyn Fn(&str, bool) -> Option<BoxFuture<'static, ()>> + Send + Sync>;

/// Passes a stream through, but holds back its first event with an id until
/// the binding of that id's stream to the session is stored, and later
/// events when the binding is due to be written again.
pub(super) struct BindFirst<St> {
    inner: Pin<Box<St>>,
    /// `None` once an id turned out not to be ours.
    bind: Option<Binder>,
    /// When the binding was last written (tokio's clock).
    bound_at: Option<Instant>,
    /// Write the binding again when an event passes this long after.
    rebind_after: Duration,
    /// The binding being written; `Mutex` only for `Sync`, reached through
    /// `&mut` and never locked.
    pending: Mutex<Option<BoxFuture<'static, ()>>>,
    /// The event waiting for its binding.
    held: Option<ServerSseMessage>,
}

impl<St> Stream for BindFirst<St>
where
    St: Stream<Item = ServerSseMessage>,
{
    type Item = ServerSseMessage;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ServerSseMessage>> {
        let this = self.get_mut();
        loop {
            let pending = this
                .pending
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(binding) = pending {
                if binding.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                *pending = None;
                return Poll::Ready(this.held.take());
            }
            let next = match this.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(event)) => event,
                other => return other,
            };
            let (Some(event_id), Some(bind)) = (next.event_id.as_deref(), &this.bind) else {
                return Poll::Ready(Some(next));
            };
            let now = Instant::now();
            let first = this.bound_at.is_none();
            if this
                .bound_at
                .is_some_and(|at| now.saturating_duration_since(at) < this.rebind_after)
            {
                return Poll::Ready(Some(next));
            }
            match bind(event_id, first) {
                Some(binding) => {
                    this.bound_at = Some(now);
                    *pending = Some(binding);
                    this.held = Some(next);
                }
                None => {
                    this.bind = None;
                    return Poll::Ready(Some(next));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use mcp_event_store_core::{EventStore, MemoryStore, NewEvent};

    fn scoped(store: &Arc<MemoryStore>) -> SessionScoped<LocalSessionManager, MemoryStore> {
        SessionScoped::local(store.clone())
    }

    fn message(id: Option<String>) -> ServerSseMessage {
        let mut message = ServerSseMessage::retry(Duration::from_secs(1));
        message.event_id = id;
        message
    }

    #[tokio::test]
    async fn the_standalone_stream_resumes_only_in_its_own_session() {
        let store = Arc::new(MemoryStore::new());
        let id = store
            .store_event("s1:common", NewEvent::new(b"{}"))
            .await
            .unwrap()
            .to_string();
        let scoped = scoped(&store);
        assert!(scoped.check_owner(&"s1".into(), &id).await.is_ok());
        for other in ["s2", "s", "s1:common", ""] {
            let refused = scoped.check_owner(&other.into(), &id).await;
            assert!(
                matches!(refused, Err(ScopedError::ForeignEvent { .. })),
                "{other:?}"
            );
        }
    }

    #[tokio::test]
    async fn bound_streams_resume_only_in_their_session_and_garbage_never() {
        let store = Arc::new(MemoryStore::new());
        let scoped = scoped(&store);
        let first = store
            .store_event("3f1c-request", NewEvent::new(b""))
            .await
            .unwrap()
            .to_string();
        let later = store
            .store_event("3f1c-request", NewEvent::new(b"{}"))
            .await
            .unwrap()
            .to_string();
        // Unbound, a request stream belongs to nobody.
        assert!(scoped.check_owner(&"s1".into(), &later).await.is_err());

        let upstream = futures_util::stream::iter([
            message(None),
            message(Some(first.clone())),
            message(Some(later.clone())),
        ]);
        let bound = scoped.bind_stream(&"s1".into(), upstream);
        let passed: Vec<Option<String>> = bound.map(|m| m.event_id).collect().await;
        assert_eq!(passed, [None, Some(first.clone()), Some(later.clone())]);

        assert!(scoped.check_owner(&"s1".into(), &first).await.is_ok());
        assert!(scoped.check_owner(&"s1".into(), &later).await.is_ok());
        assert!(matches!(
            scoped.check_owner(&"s2".into(), &later).await,
            Err(ScopedError::ForeignEvent { .. })
        ));
        for junk in ["", "garbage", "0/1", &later[..later.len() - 1]] {
            assert!(
                scoped.check_owner(&"s1".into(), junk).await.is_err(),
                "{junk:?}"
            );
        }
    }
}
