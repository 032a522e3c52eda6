//! Restores of sessions on this instance, as a [`SessionScoped`](super::SessionScoped)
//! manager sees them: which are in flight (so that a request arriving
//! meanwhile waits for the session to be whole), and the handshakes
//! replayed for a second restore of a session already held here (so that
//! the request asking for it is served, not refused).
//!
//! rmcp restores a session in several calls of one request:
//! `restore_session` (the session is held from then on), then
//! `initialize_session` with the stored `initialize` replayed, then
//! `accept_message` with `notifications/initialized`. Concurrent requests
//! for the session are serialized by rmcp only once they are past
//! `has_session`, and only while the first restore runs.
//!
//! Everything here is behind one `std` mutex held for a few map operations
//! at a time, never across an `.await`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rmcp::model::{ClientJsonRpcMessage, GetExtensions, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::SessionRestoreMarker;
use rmcp::transport::streamable_http_server::session::SessionId;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// How long a request waits at most for a restore of its session in flight
/// on this instance, and how long a replayed handshake may take: a restore
/// is a store read and a handshake, milliseconds; past this the restore is
/// taken as abandoned (its request was cancelled) and the request goes on.
pub(super) const RESTORE_WAIT: Duration = Duration::from_secs(10);

/// The restores of one manager.
#[derive(Default)]
pub(super) struct Restores {
    /// How many restores are in flight: `has_session` reads it without
    /// the lock, and takes the lock only when one is.
    in_flight: AtomicUsize,
    serial: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Restores in flight: from `restore_session` until the replayed
    /// `initialize` was served. Dropping the sender wakes the waiters.
    restoring: HashMap<SessionId, (u64, watch::Sender<()>)>,
    /// Handshakes replayed for a second restore of a session held here,
    /// until rmcp has handed them both messages.
    replays: HashMap<SessionId, Replay>,
    /// Sessions whose replayed handshake ended: its worker closes the
    /// session id once (rmcp closes a session when its worker ends), and
    /// that close must leave the session held here alone. With when the
    /// replay ended (a close that never came is forgotten after
    /// [`RESTORE_WAIT`]).
    replay_closes: HashMap<SessionId, (usize, Instant)>,
}

/// The manager's side of a replayed handshake.
struct Replay {
    serial: u64,
    /// What rmcp replays, to the throwaway handler.
    inbox: mpsc::UnboundedSender<ClientJsonRpcMessage>,
    /// The handler's answer to the replayed `initialize`; taken when rmcp
    /// replays it.
    answer: Option<oneshot::Receiver<ServerJsonRpcMessage>>,
}

impl Restores {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, state: &State) {
        self.in_flight
            .store(state.restoring.len(), Ordering::SeqCst);
    }

    /// A restore of `id` begins here; call it before the inner manager
    /// holds the session, so that whoever sees the session held sees the
    /// restore too. It ends with [`finish`](Self::finish), or when the
    /// guard is dropped first. (rmcp restores a session once at a time on
    /// an instance; should two overlap, the first keeps the mark.)
    pub(super) fn begin(self: &Arc<Self>, id: &SessionId) -> Restoring {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock();
        if !state.restoring.contains_key(id) {
            state
                .restoring
                .insert(id.clone(), (serial, watch::channel(()).0));
            self.count(&state);
        }
        Restoring {
            restores: self.clone(),
            id: id.clone(),
            serial,
        }
    }

    /// The restore of `id` in flight here, if any, is over (its replayed
    /// `initialize` was served, or failed, or the session closed): the
    /// requests waiting for it go on.
    pub(super) fn finish(&self, id: &SessionId) {
        self.finish_if(id, None);
    }

    fn finish_if(&self, id: &SessionId, serial: Option<u64>) {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut state = self.lock();
        if state
            .restoring
            .get(id)
            .is_some_and(|(at, _)| serial.is_none_or(|serial| serial == *at))
        {
            state.restoring.remove(id);
            self.count(&state);
        }
    }

    /// Waits while a restore of `id` is in flight here, at most
    /// [`RESTORE_WAIT`]; whether there was one. Free (one atomic read)
    /// when no restore is in flight.
    pub(super) async fn settle(&self, id: &SessionId) -> bool {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let (serial, mut done) = {
            let state = self.lock();
            match state.restoring.get(id) {
                Some((serial, sender)) => (*serial, sender.subscribe()),
                None => return false,
            }
        };
        // Nothing is ever sent: `changed` returns when the sender is
        // dropped, that is when the restore is over.
        if tokio::time::timeout(RESTORE_WAIT, done.changed())
            .await
            .is_err()
        {
            tracing::warn!(session_id = %id, "a restore of the session did not finish within {RESTORE_WAIT:?}; serving the request as it stands");
            self.finish_if(id, Some(serial));
        }
        true
    }

    /// The transport of a handshake replayed for a second restore of
    /// session `id`, held here already: rmcp serves it with a handler of
    /// its own and hands it the replayed messages through
    /// [`initialize`](Self::initialize) and [`initialized`](Self::initialized).
    pub(super) fn replay(self: &Arc<Self>, id: &SessionId) -> Replayed {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let (inbox, received) = mpsc::unbounded_channel();
        let (answer, answered) = oneshot::channel();
        self.lock().replays.insert(
            id.clone(),
            Replay {
                serial,
                inbox,
                answer: Some(answered),
            },
        );
        Replayed {
            restores: self.clone(),
            id: id.clone(),
            serial,
            received,
            answer: Some(answer),
            started: false,
        }
    }

    /// rmcp's replayed `initialize` for a replay of `id`, handed to it;
    /// the handler's answer (`None` if it gave none in time). `Err` gives
    /// back a message that is no such thing.
    #[allow(clippy::result_large_err)] // the message, given back as it came
    pub(super) fn initialize(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Future<Output = Option<ServerJsonRpcMessage>> + use<>, ClientJsonRpcMessage>
    {
        if !replayed(&message) {
            return Err(message);
        }
        let mut state = self.lock();
        let Some(replay) = state.replays.get_mut(id) else {
            return Err(message);
        };
        let Some(answered) = replay.answer.take() else {
            return Err(message);
        };
        let _ = replay.inbox.send(message);
        Ok(async move {
            match tokio::time::timeout(RESTORE_WAIT, answered).await {
                Ok(Ok(answer)) => Some(answer),
                _ => None,
            }
        })
    }

    /// rmcp's replayed `notifications/initialized` for a replay of `id`,
    /// whose `initialize` was answered: handed to it, and the replay is
    /// over (its handler is dropped). `Some` gives back a message that is
    /// no such thing.
    pub(super) fn initialized(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Option<ClientJsonRpcMessage> {
        if !replayed(&message) {
            return Some(message);
        }
        let mut state = self.lock();
        if state
            .replays
            .get(id)
            .is_none_or(|replay| replay.answer.is_some())
        {
            return Some(message);
        }
        let replay = state.replays.remove(id).expect("present");
        let _ = replay.inbox.send(message);
        None
    }

    /// Whether this close of `id` is the one the worker of a replayed
    /// handshake makes when it ends: it must leave the session alone.
    pub(super) fn replay_closed(&self, id: &SessionId) -> bool {
        let mut state = self.lock();
        let Some((count, at)) = state.replay_closes.get_mut(id) else {
            return false;
        };
        if at.elapsed() >= RESTORE_WAIT {
            state.replay_closes.remove(id);
            return false;
        }
        *count -= 1;
        if *count == 0 {
            state.replay_closes.remove(id);
        }
        true
    }

    fn replay_ended(&self, id: &SessionId, serial: u64, served: bool) {
        let mut state = self.lock();
        if state
            .replays
            .get(id)
            .is_some_and(|replay| replay.serial == serial)
        {
            state.replays.remove(id);
        }
        if served {
            let now = Instant::now();
            state
                .replay_closes
                .entry(id.clone())
                .and_modify(|(count, at)| {
                    *count += 1;
                    *at = now;
                })
                .or_insert((1, now));
        }
    }

    /// How many restores are in flight and replays pending (for tests).
    #[cfg(test)]
    pub(super) fn pending(&self) -> (usize, usize) {
        let state = self.lock();
        (state.restoring.len(), state.replays.len())
    }
}

/// Whether rmcp replays this message to restore a session.
fn replayed(message: &ClientJsonRpcMessage) -> bool {
    match message {
        ClientJsonRpcMessage::Request(request) => request.request.extensions(),
        ClientJsonRpcMessage::Notification(notification) => notification.notification.extensions(),
        _ => return false,
    }
    .get::<SessionRestoreMarker>()
    .is_some()
}

/// A restore in flight; dropped before it finished (rmcp gave up on it
/// before replaying the handshake), it is over.
pub(crate) struct Restoring {
    restores: Arc<Restores>,
    id: SessionId,
    serial: u64,
}

impl Drop for Restoring {
    fn drop(&mut self) {
        self.restores.finish_if(&self.id, Some(self.serial));
    }
}

/// The transport end of a replayed handshake: it yields what rmcp
/// replays, keeps the handler's answer to `initialize` and drops the rest,
/// and ends after `notifications/initialized` (or [`RESTORE_WAIT`]
/// without it).
pub(crate) struct Replayed {
    restores: Arc<Restores>,
    id: SessionId,
    serial: u64,
    received: mpsc::UnboundedReceiver<ClientJsonRpcMessage>,
    answer: Option<oneshot::Sender<ServerJsonRpcMessage>>,
    /// Whether rmcp's session worker serves it: then that worker closes
    /// the session id once this ends.
    started: bool,
}

impl Replayed {
    pub(crate) fn send(&mut self, message: ServerJsonRpcMessage) {
        // The first message out is the answer to `initialize`; nobody
        // listens to the handler after that.
        if let Some(answer) = self.answer.take() {
            let _ = answer.send(message);
        }
    }

    pub(crate) async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.started = true;
        tokio::time::timeout(RESTORE_WAIT, self.received.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Replayed {
    fn drop(&mut self) {
        self.restores
            .replay_ended(&self.id, self.serial, self.started);
    }
}

impl std::fmt::Debug for Replayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayed")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
