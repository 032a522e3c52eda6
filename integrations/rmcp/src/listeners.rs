//! The notification listeners this instance holds: each session's
//! standalone `GET` streams, live or resumed, so that a notification raised
//! on any instance reaches them ([`SessionScoped::listen_across`]).
//!
//! [`SessionScoped::listen_across`]: crate::SessionScoped::listen_across

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures_core::Stream;
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId};
use tokio::sync::mpsc;

/// How many notifications a live stream may have waiting; one more is
/// dropped (with a warning), as rmcp drops what a full channel cannot take.
const WAITING: usize = 64;

/// Who listens here, by session.
#[derive(Default)]
pub(crate) struct Listeners {
    sessions: Mutex<HashMap<SessionId, Listening>>,
    next: AtomicU64,
}

/// One session's listeners here.
#[derive(Default)]
struct Listening {
    /// Live standalone streams, fed from rmcp's channel and from here.
    live: Vec<(u64, mpsc::Sender<ServerSseMessage>)>,
    /// Resumed standalone streams: they follow the session's stored
    /// stream, so what is stored there reaches them.
    following: usize,
}

/// Unregisters a listener when its stream is dropped.
pub(crate) struct Registered {
    listeners: Arc<Listeners>,
    session: SessionId,
    live: Option<u64>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut sessions = self.listeners.lock();
        if let Some(listening) = sessions.get_mut(&self.session) {
            match self.live {
                Some(key) => listening.live.retain(|(k, _)| *k != key),
                None => listening.following = listening.following.saturating_sub(1),
            }
            if listening.live.is_empty() && listening.following == 0 {
                sessions.remove(&self.session);
            }
        }
    }
}

impl Listeners {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionId, Listening>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A live standalone stream of `session`: `stream`, with the
    /// notifications [`deliver`](Self::deliver) gives it.
    pub(crate) fn live<St>(self: &Arc<Self>, session: &SessionId, stream: St) -> Listened<St> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, injected) = mpsc::channel(WAITING);
        self.lock()
            .entry(session.clone())
            .or_default()
            .live
            .push((key, sender));
        Listened {
            inner: Box::pin(stream),
            injected: Some(injected),
            _registered: Registered {
                listeners: self.clone(),
                session: session.clone(),
                live: Some(key),
            },
        }
    }

    /// A resumed standalone stream of `session` (a follow of its stored
    /// stream).
    pub(crate) fn following<St>(self: &Arc<Self>, session: &SessionId, stream: St) -> Listened<St> {
        self.lock().entry(session.clone()).or_default().following += 1;
        Listened {
            inner: Box::pin(stream),
            injected: None,
            _registered: Registered {
                listeners: self.clone(),
                session: session.clone(),
                live: None,
            },
        }
    }

    /// The sessions with a listener here.
    pub(crate) fn sessions(&self) -> Vec<SessionId> {
        self.lock().keys().cloned().collect()
    }

    /// Whether `session` has a listener here.
    pub(crate) fn has(&self, session: &str) -> bool {
        self.lock().contains_key(session)
    }

    /// Gives `event` (stored already, if there is a store) to the live
    /// streams of `session`; the resumed ones find it in the store.
    pub(crate) fn deliver(&self, session: &SessionId, event: &ServerSseMessage) {
        let senders: Vec<_> = match self.lock().get(session) {
            Some(listening) => listening.live.iter().map(|(_, s)| s.clone()).collect(),
            None => return,
        };
        for sender in senders {
            if let Err(mpsc::error::TrySendError::Full(_)) = sender.try_send(event.clone()) {
                tracing::warn!(session_id = %session, "a listener is too slow: dropped a notification for it");
            }
        }
    }
}

/// A standalone stream registered as a listener while it lives: rmcp's
/// stream, and for a live one what other instances raised.
pub(crate) struct Listened<St> {
    inner: Pin<Box<St>>,
    injected: Option<mpsc::Receiver<ServerSseMessage>>,
    _registered: Registered,
}

impl<St: Stream<Item = ServerSseMessage>> Stream for Listened<St> {
    type Item = ServerSseMessage;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ServerSseMessage>> {
        let this = self.get_mut();
        if let Some(injected) = &mut this.injected
            && let Poll::Ready(Some(event)) = injected.poll_recv(cx)
        {
            return Poll::Ready(Some(event));
        }
        // rmcp's stream decides when the listener ends.
        this.inner.as_mut().poll_next(cx)
    }
}
