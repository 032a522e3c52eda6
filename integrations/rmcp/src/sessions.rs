//! rmcp's `SessionStore` over ours.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore as RmcpSessionStoreTrait, SessionStoreError,
};

use super::AdapterError;
use super::callers::caller;
use super::restores::Restores;
use super::tracker::Tracker;
use mcp_event_store_core::Error;
use mcp_event_store_core::SessionStore;
use mcp_event_store_core::backend::validate_session_id;
use mcp_event_store_runtime::{Callers, Runtime};

/// How long a session's state stays restorable by default: 24 hours.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The prefix put before rmcp's session ids in our session store by default,
/// so they cannot collide with other users of the same store.
pub const DEFAULT_SESSION_KEY_PREFIX: &str = "rmcp/";

/// Any of our [`SessionStore`]s as rmcp's
/// `rmcp::transport::streamable_http_server::session::SessionStore`, for
/// `StreamableHttpServerConfig::session_store`.
///
/// rmcp stores a session's `SessionState` (the client's `initialize`
/// parameters) once, after the handshake, and deletes it when the client
/// sends `DELETE`. Another instance that receives a request for a session it
/// does not know loads the state and replays the handshake, so the client
/// carries on without noticing. The state is kept as `serde_json` bytes
/// under `prefix + session id`, with a time to live:
///
/// * rmcp never refreshes the state while a session is in use, so the time
///   to live bounds how long after its start a session can still be
///   restored. Each successful [`load`](RmcpSessionStoreTrait::load) writes
///   the state back with a fresh time to live (turn this off with
///   [`refresh_on_load`](Self::refresh_on_load)), so a session that keeps
///   moving between instances stays restorable.
/// * Session ids come from the client's `Mcp-Session-Id` header. One that
///   our store could not hold (empty, or with the prefix over 1024 bytes) is
///   simply unknown: `load` answers `None`, so rmcp answers 404, not 500.
///
/// Hand the same `Arc` to
/// [`SessionScoped::with_session_store`](super::SessionScoped::with_session_store):
/// the manager then reads this store's keys to learn that a session was
/// deleted or expired, and this store tells it which sessions it wrote.
pub struct RmcpSessionStore<S: ?Sized> {
    store: Arc<S>,
    ttl: Duration,
    prefix: String,
    refresh_on_load: bool,
    /// Managers to tell when a session's state is written, or a load
    /// finds none.
    linked: RwLock<Vec<(Weak<Tracker>, Weak<Restores>)>>,
    /// Tells every instance when a client deleted a session.
    runtime: Option<Runtime>,
    /// Whether sessions are bound to their callers ([`with_callers`](Self::with_callers)).
    callers_bound: bool,
}

impl<S: ?Sized> RmcpSessionStore<S> {
    /// Wraps a store, with [`DEFAULT_SESSION_TTL`] and
    /// [`DEFAULT_SESSION_KEY_PREFIX`].
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            ttl: DEFAULT_SESSION_TTL,
            prefix: DEFAULT_SESSION_KEY_PREFIX.to_owned(),
            refresh_on_load: true,
            linked: RwLock::default(),
            runtime: None,
            callers_bound: false,
        }
    }

    /// Binds each session to the caller that opened it (C20), as `callers`
    /// reads it from the request: a load, a refresh or a delete by anyone
    /// else is answered as for an unknown session (rmcp answers 404), on
    /// every instance. The requests must be served through
    /// [`CallerScoped`](crate::CallerScoped) ([`Durable`](crate::Durable)
    /// does both); one that is not reaches no session.
    pub fn with_callers(mut self, callers: &Callers) -> Self {
        self.callers_bound = callers.is_bound();
        self
    }

    /// Tells every instance on `runtime`'s bus when a client deletes a
    /// session (`DELETE`, the only time rmcp deletes a session's state), so
    /// that each closes its copy at once
    /// ([`SessionScoped::listen_across`](super::SessionScoped::listen_across)).
    pub fn with_runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Sets how long a session stays restorable after it was stored (or
    /// last loaded).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the prefix put before session ids in the store (may be empty).
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Whether a successful load writes the state back with a fresh time to
    /// live (default `true`).
    pub fn refresh_on_load(mut self, refresh: bool) -> Self {
        self.refresh_on_load = refresh;
        self
    }

    /// The time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.store
    }

    /// The prefix put before session ids in the store.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// Tells a manager (its `tracker` and `restores`) about every session
    /// stored from now on, and every load that finds nothing; managers
    /// that are gone are forgotten on the way.
    pub(super) fn link(&self, tracker: &Arc<Tracker>, restores: &Arc<Restores>) {
        let mut linked = self.linked.write().unwrap_or_else(PoisonError::into_inner);
        linked.retain(|(t, _)| t.strong_count() > 0);
        linked.push((Arc::downgrade(tracker), Arc::downgrade(restores)));
    }

    fn linked(&self) -> Vec<Arc<Tracker>> {
        let linked = self.linked.read().unwrap_or_else(PoisonError::into_inner);
        linked.iter().filter_map(|(t, _)| t.upgrade()).collect()
    }

    /// rmcp's attempt to restore `session_id` found no state for its
    /// request's caller (or failed): the requests of the session that wait
    /// for it to be over go on (`Restores::miss`).
    fn nothing_loaded(&self, session_id: &str) {
        let linked = self.linked.read().unwrap_or_else(PoisonError::into_inner);
        for restores in linked.iter().filter_map(|(_, r)| r.upgrade()) {
            restores.nothing_loaded(session_id);
        }
    }

    fn stored(&self, session_id: &str) {
        for tracker in self.linked() {
            tracker.mark_stored(session_id);
        }
    }

    fn deleted(&self, session_id: &str) {
        for tracker in self.linked() {
            tracker.deleted(session_id);
        }
    }

    /// The key in our store, or `None` if the session id cannot be one.
    fn key(&self, session_id: &str) -> Option<String> {
        let key = format!("{}{}", self.prefix, session_id);
        validate_session_id(&key).ok().map(|()| key)
    }
}

impl<S: ?Sized> fmt::Debug for RmcpSessionStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RmcpSessionStore")
            .field("ttl", &self.ttl)
            .field("prefix", &self.prefix)
            .field("refresh_on_load", &self.refresh_on_load)
            .field(
                "linked",
                &self
                    .linked
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len(),
            )
            .finish_non_exhaustive()
    }
}

impl<S: SessionStore + ?Sized> RmcpSessionStore<S> {
    /// The state of `session_id`, for the request's caller.
    async fn load_state(
        &self,
        session_id: &str,
    ) -> std::result::Result<Option<SessionState>, SessionStoreError> {
        let Some(key) = self.key(session_id) else {
            return Ok(None);
        };
        let Some(owner) = caller(self.callers_bound) else {
            return Ok(None);
        };
        let bytes = match self.store.get_session_as(&owner, &key).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) | Err(Error::InvalidSessionId { .. }) => return Ok(None),
            Err(e) => return Err(AdapterError::store("load session", e).into()),
        };
        let state: SessionState =
            serde_json::from_slice(&bytes).map_err(|source| AdapterError::SessionState {
                session_id: session_id.to_owned(),
                source,
            })?;
        if self.refresh_on_load
            && let Err(error) = self
                .store
                .put_session_as(&owner, &key, &bytes, self.ttl)
                .await
        {
            tracing::warn!(%error, "could not refresh the time to live of a restored session");
        }
        Ok(Some(state))
    }
}

#[async_trait]
impl<S: SessionStore + ?Sized> RmcpSessionStoreTrait for RmcpSessionStore<S> {
    async fn load(
        &self,
        session_id: &str,
    ) -> std::result::Result<Option<SessionState>, SessionStoreError> {
        let loaded = self.load_state(session_id).await;
        if !matches!(loaded, Ok(Some(_))) {
            self.nothing_loaded(session_id);
        }
        loaded
    }

    async fn store(
        &self,
        session_id: &str,
        state: &SessionState,
    ) -> std::result::Result<(), SessionStoreError> {
        let key = self.key(session_id).ok_or_else(|| {
            AdapterError::store(
                "store session",
                Error::InvalidSessionId {
                    reason: format!(
                        "{} bytes with the key prefix; at most {} fit",
                        self.prefix.len() + session_id.len(),
                        mcp_event_store_core::MAX_STREAM_ID_LEN
                    ),
                },
            )
        })?;
        let owner = caller(self.callers_bound).ok_or_else(|| {
            AdapterError::store(
                "store session",
                Error::Config("callers are bound, and this request's caller is unknown".into()),
            )
        })?;
        let bytes = serde_json::to_vec(state).map_err(AdapterError::Encode)?;
        self.store
            .put_session_as(&owner, &key, &bytes, self.ttl)
            .await
            .map_err(|e| AdapterError::store("store session", e))?;
        self.stored(session_id);
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> std::result::Result<(), SessionStoreError> {
        let (Some(key), Some(owner)) = (self.key(session_id), caller(self.callers_bound)) else {
            return Ok(());
        };
        match self.store.delete_session_as(&owner, &key).await {
            // Another caller's session (or none): left as it is, and
            // answered as for an unknown one.
            Ok(false) | Err(Error::InvalidSessionId { .. }) => Ok(()),
            Ok(true) => {
                self.deleted(session_id);
                if let Some(runtime) = &self.runtime
                    && let Err(error) = runtime.end_session(session_id).await
                {
                    tracing::warn!(session_id, %error, "could not tell the other instances that a session was deleted; each ends it at its next request");
                }
                Ok(())
            }
            Err(e) => Err(AdapterError::store("delete session", e).into()),
        }
    }
}
