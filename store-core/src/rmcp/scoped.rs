//! Resumes bound to the session that owns the stream.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use futures_core::future::BoxFuture;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    EventStore as RmcpEventStoreTrait, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

use super::RmcpEventStore;
use crate::id::EventId;
use crate::store::Store;

/// How long a stream stays bound to its session by default: 24 hours.
/// Make it at least the event retention's maximum age.
pub const DEFAULT_BINDING_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The prefix of the session-store keys that record which session owns a
/// stream.
pub const DEFAULT_BINDING_KEY_PREFIX: &str = "rmcp-stream/";

/// An rmcp `SessionManager` (normally rmcp's `LocalSessionManager` with our
/// event store) whose resumes only reach streams of the resuming session.
///
/// With an event store, rmcp 3.9's `LocalSessionManager::resume` replays
/// whatever stream the `Last-Event-ID` names and ignores the
/// `Mcp-Session-Id` the request carries: a client of session A that holds an
/// event id of session B's stream (a leaked log line, a shared proxy) gets
/// B's messages. Our ids cannot be guessed (contract C2), but the id alone
/// should not be the only credential when the session is known. This wrapper
/// closes that gap:
///
/// * when a request stream starts (`create_stream`), before its first event
///   reaches the client, it records in the store that the stream belongs to
///   the session (one `put_session` per request stream, under
///   `rmcp-stream/<stream token>`, with a time to live);
/// * on `resume`, the `Last-Event-ID` must name a stream bound to this
///   session, or the session's standalone stream (`<session id>:common`,
///   found with `get_stream_id_for_event_id`). Otherwise the resume is
///   refused with [`ScopedError::ForeignEvent`], and rmcp answers the client
///   with an empty SSE stream (HTTP 200).
///
/// Bindings live in the shared store, so a stream begun on one instance can
/// be resumed on another. Everything else is passed to the inner manager.
///
/// ```no_run
/// # async fn demo() -> mcp_event_store_core::Result<()> {
/// use std::sync::Arc;
/// use mcp_event_store_core::MemoryStore;
/// use mcp_event_store_core::rmcp::SessionScoped;
///
/// let store = Arc::new(MemoryStore::new()); // or mcp_event_store::connect(url).await?
/// let session_manager = Arc::new(SessionScoped::local(store));
/// // StreamableHttpService::new(make_handler, session_manager, config)
/// # let _ = session_manager;
/// # Ok(()) }
/// ```
pub struct SessionScoped<M, S: ?Sized> {
    inner: M,
    store: Arc<S>,
    ttl: Duration,
    prefix: String,
}

impl<S: Store + ?Sized> SessionScoped<LocalSessionManager, S> {
    /// rmcp's `LocalSessionManager` (default configuration) with `store` as
    /// its event store, its resumes scoped to their session.
    pub fn local(store: Arc<S>) -> Self {
        let events: Arc<dyn RmcpEventStoreTrait> = Arc::new(RmcpEventStore::new(store.clone()));
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
            store,
            ttl: DEFAULT_BINDING_TTL,
            prefix: DEFAULT_BINDING_KEY_PREFIX.to_owned(),
        }
    }

    /// Sets how long a stream stays bound (default 24 hours). After that, a
    /// resume of the stream is refused; keep it at least as long as events
    /// are retained.
    pub fn with_binding_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the prefix of the binding keys in the session store.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The wrapped manager (for example to reach `LocalSessionManager`'s
    /// sessions).
    pub fn inner(&self) -> &M {
        &self.inner
    }

    fn binding_key(&self, id: &EventId) -> String {
        format!("{}{}", self.prefix, id.token)
    }
}

impl<M, S: ?Sized> fmt::Debug for SessionScoped<M, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionScoped")
            .field("ttl", &self.ttl)
            .field("prefix", &self.prefix)
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
    /// The store failed while the resume was checked; the resume is refused.
    #[error("could not check the Last-Event-ID against the session: {0}")]
    Store(#[source] crate::Error),
}

impl<E> ScopedError<E> {
    fn foreign(event_id: &str) -> Self {
        let crate::Error::UnknownEventId { event_id } = crate::Error::unknown_event_id(event_id)
        else {
            unreachable!("unknown_event_id builds UnknownEventId")
        };
        Self::ForeignEvent { event_id }
    }
}

impl<M, S> SessionScoped<M, S>
where
    M: SessionManager,
    S: Store + ?Sized,
{
    async fn check_owner(
        &self,
        session: &SessionId,
        last_event_id: &str,
    ) -> Result<(), ScopedError<M::Error>> {
        let Some(id) = EventId::parse(last_event_id) else {
            return Err(ScopedError::foreign(last_event_id));
        };
        match self.store.get_session(&self.binding_key(&id)).await {
            Ok(Some(owner)) if owner == session.as_bytes() => return Ok(()),
            Ok(Some(_)) => return Err(ScopedError::foreign(last_event_id)),
            Ok(None) => {}
            Err(e) => return Err(ScopedError::Store(e)),
        }
        // Not a request stream of any session: the standalone stream of
        // this one is the only other thing it may be.
        match self.store.get_stream_id_for_event_id(last_event_id).await {
            Ok(Some(stream)) if stream.strip_suffix(":common") == Some(session.as_ref()) => Ok(()),
            Ok(_) => Err(ScopedError::foreign(last_event_id)),
            Err(e) => Err(ScopedError::Store(e)),
        }
    }
}

impl<M, S> SessionManager for SessionScoped<M, S>
where
    M: SessionManager,
    S: Store + ?Sized,
{
    type Error = ScopedError<M::Error>;
    type Transport = M::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner
            .create_session()
            .await
            .map_err(ScopedError::Manager)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner
            .initialize_session(id, message)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner
            .has_session(id)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner
            .close_session(id)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self
            .inner
            .create_stream(id, message)
            .await
            .map_err(ScopedError::Manager)?;
        let store = self.store.clone();
        let prefix = self.prefix.clone();
        let ttl = self.ttl;
        let session = id.clone();
        let bind = move |event_id: &str| -> Option<BoxFuture<'static, ()>> {
            let id = EventId::parse(event_id)?;
            let key = format!("{prefix}{}", id.token);
            let store = store.clone();
            let session = session.clone();
            Some(Box::pin(async move {
                if let Err(error) = store.put_session(&key, session.as_bytes(), ttl).await {
                    tracing::error!(
                        %error,
                        "could not bind a stream to its session; resuming it will be refused"
                    );
                }
            }))
        };
        Ok(BindFirst {
            inner: Box::pin(stream),
            bind: Some(Box::new(bind)),
            pending: Mutex::new(None),
            held: None,
        })
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner
            .accept_message(id, message)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner
            .create_standalone_stream(id)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if let Err(refused) = self.check_owner(id, &last_event_id).await {
            tracing::warn!(session_id = %id, error = %refused, "resume refused");
            return Err(refused);
        }
        self.inner
            .resume(id, last_event_id)
            .await
            .map_err(ScopedError::Manager)
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner
            .restore_session(id)
            .await
            .map_err(ScopedError::Manager)
    }

    fn event_store(&self) -> Option<Arc<dyn RmcpEventStoreTrait>> {
        self.inner.event_store()
    }
}

type Binder = Box<dyn FnOnce(&str) -> Option<BoxFuture<'static, ()>> + Send + Sync>;

/// Passes a stream through, but holds back its first event with an id until
/// the binding of that id's stream to the session is stored.
struct BindFirst<St> {
    inner: Pin<Box<St>>,
    /// Taken when the first event with an id arrives.
    bind: Option<Binder>,
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
            let Some(event_id) = next.event_id.as_deref() else {
                return Poll::Ready(Some(next));
            };
            let Some(bind) = this.bind.take() else {
                return Poll::Ready(Some(next));
            };
            match bind(event_id) {
                Some(binding) => {
                    *pending = Some(binding);
                    this.held = Some(next);
                }
                None => return Poll::Ready(Some(next)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::{EventStore, MemoryStore, NewEvent, SessionStore};

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
        let bound = BindFirst {
            inner: Box::pin(upstream),
            bind: Some(Box::new({
                let store = store.clone();
                move |event_id: &str| {
                    let key = format!(
                        "{DEFAULT_BINDING_KEY_PREFIX}{}",
                        EventId::parse(event_id)?.token
                    );
                    Some(Box::pin(async move {
                        store
                            .put_session(&key, b"s1", Duration::from_secs(60))
                            .await
                            .unwrap();
                    }) as BoxFuture<'static, ()>)
                }
            })),
            pending: Mutex::new(None),
            held: None,
        };
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
