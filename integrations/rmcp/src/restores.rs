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
//! It also keeps apart, per session, the requests rmcp will hand the
//! outcome of one restore attempt (see [`Restores::miss`]): the owner's
//! and another caller's must not share one.
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

/// How long after a restore attempt of a session is over here a request
/// of the other kind (see [`Restores::miss`]) still keeps away from rmcp's
/// restore: rmcp forgets an attempt in a task it spawns as the attempt
/// ends, and hands its outcome to every request that comes to it before
/// that task ran, which nothing tells. That task runs at once unless its
/// thread is preempted; this leaves it several scheduler time slices.
pub(super) const FORGET_WAIT: Duration = Duration::from_millis(50);

/// The restores of one manager.
#[derive(Default)]
pub(super) struct Restores {
    /// How many restores are in flight: `has_session` reads it without
    /// the lock, and takes the lock only when one is.
    in_flight: AtomicUsize,
    /// How many sessions have [misses](Self::miss) in flight: read without
    /// the lock by the calls that may end them.
    missing: AtomicUsize,
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
    /// Requests answered "not held here" on their way to rmcp's restore of
    /// the session, all of one kind per session at a time.
    misses: HashMap<SessionId, Misses>,
    /// When the latest misses of a session ended, and whether they were
    /// the owner's (kept for [`FORGET_WAIT`]).
    missed: HashMap<SessionId, (bool, Instant)>,
    /// Prune both maps once they hold this many (a miss whose end never
    /// came, after [`RESTORE_WAIT`]: its request was dropped, or the server
    /// never restores sessions).
    prune_at: usize,
}

impl State {
    /// The misses of `id` are over.
    fn end_misses(&mut self, id: &SessionId, now: Instant) {
        if let Some(misses) = self.misses.remove(id) {
            self.missed.insert(id.clone(), (misses.owner, now));
        }
    }

    fn prune(&mut self, now: Instant) {
        if self.misses.len() + self.missed.len() < self.prune_at {
            return;
        }
        self.misses
            .retain(|_, misses| now.duration_since(misses.since) < RESTORE_WAIT);
        self.missed
            .retain(|_, (_, at)| now.duration_since(*at) < FORGET_WAIT);
        self.prune_at = (2 * (self.misses.len() + self.missed.len())).max(64);
    }
}

/// What a request about to miss a session does.
enum Missing {
    /// Goes on to rmcp.
    Go,
    /// Waits for the misses of the other kind (this serial) to be over.
    Waiting(u64, watch::Receiver<()>),
    /// Waits until rmcp has forgotten their attempt.
    Forgetting(Instant),
}

/// Requests of one kind answered "not held here" for one session, whose
/// restore attempt in rmcp is not over.
struct Misses {
    /// The owner's (the session store gives them the session's state, so
    /// rmcp restores the session for them), or not (it finds none).
    owner: bool,
    /// The requests' tasks (the owner's leave when served).
    tasks: Vec<Option<tokio::task::Id>>,
    serial: u64,
    /// When the latest request joined.
    since: Instant,
    /// Dropped when they are over: wakes the requests of the other kind.
    over: watch::Sender<()>,
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
            failed: true,
        }
    }

    /// The restore of `id` in flight here, if any, is over (its replayed
    /// `initialize` was served, or failed, or the session closed): the
    /// requests waiting for it go on.
    pub(super) fn finish(&self, id: &SessionId) {
        self.finish_if(id, None);
    }

    /// Whether it ended a restore in flight.
    fn finish_if(&self, id: &SessionId, serial: Option<u64>) -> bool {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let mut state = self.lock();
        if state
            .restoring
            .get(id)
            .is_some_and(|(at, _)| serial.is_none_or(|serial| serial == *at))
        {
            state.restoring.remove(id);
            self.count(&state);
            return true;
        }
        false
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

    /// A request of session `id` is about to be answered "not held here",
    /// the session's `owner`'s (the session store gives it the session's
    /// state) or not: rmcp then restores the session, or tries to. `true`:
    /// answer it so. `false`, after a wait: decide again.
    ///
    /// rmcp hands every request that finds the session absent while a
    /// restore attempt of it is under way (or just over: see
    /// [`FORGET_WAIT`]) that attempt's outcome. Another caller's request
    /// then went on as if the owner's session were its own, to be refused
    /// with 500, or the owner's was handed the other caller's "no such
    /// session", 404. So a request waits here while requests of the other
    /// kind are on their way, until their attempt is over (the other
    /// caller's once rmcp's load found nothing: [`nothing_loaded`](Self::nothing_loaded);
    /// the owner's once each was served after the restore, [`served`](Self::served),
    /// or the restore failed, [`abandon`](Self::abandon); at most
    /// [`RESTORE_WAIT`]), and [`FORGET_WAIT`] after. Requests of one kind
    /// share an attempt harmlessly.
    pub(super) async fn miss(&self, id: &SessionId, owner: bool) -> bool {
        match self.try_miss(id, owner) {
            Missing::Go => true,
            Missing::Forgetting(until) => {
                tokio::time::sleep_until(until).await;
                false
            }
            Missing::Waiting(serial, mut over) => {
                if tokio::time::timeout(RESTORE_WAIT, over.changed())
                    .await
                    .is_err()
                {
                    tracing::warn!(session_id = %id, "requests of the session on their way to its restore were not answered within {RESTORE_WAIT:?}; going on");
                    self.end_misses(id, Some(serial));
                }
                false
            }
        }
    }

    fn try_miss(&self, id: &SessionId, owner: bool) -> Missing {
        let task = tokio::task::try_id();
        let now = Instant::now();
        let mut state = self.lock();
        match state.misses.get_mut(id) {
            // (Older ones are taken as abandoned.)
            Some(misses) if now.duration_since(misses.since) < RESTORE_WAIT => {
                if misses.owner != owner {
                    return Missing::Waiting(misses.serial, misses.over.subscribe());
                }
                misses.tasks.push(task);
                misses.since = now;
                return Missing::Go;
            }
            _ => {}
        }
        if let Some(&(kind, at)) = state.missed.get(id)
            && kind != owner
            && now.duration_since(at) < FORGET_WAIT
        {
            return Missing::Forgetting(at + FORGET_WAIT);
        }
        state.prune(now);
        state.missed.remove(id);
        let misses = Misses {
            owner,
            tasks: vec![task],
            serial: self.serial.fetch_add(1, Ordering::Relaxed),
            since: now,
            over: watch::channel(()).0,
        };
        state.misses.insert(id.clone(), misses);
        self.missing.store(state.misses.len(), Ordering::SeqCst);
        Missing::Go
    }

    /// rmcp's load of session `id`'s state found nothing (or failed): the
    /// attempt the requests missing it are on is over.
    pub(super) fn nothing_loaded(&self, id: &str) {
        if self.missing.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.end_misses(&id.into(), None);
    }

    /// A request of session `id` is served (its message goes to the
    /// session): if it missed the session (the owner's do), rmcp's restore
    /// of it is over for this one.
    pub(super) fn served(&self, id: &SessionId) {
        if self.missing.load(Ordering::SeqCst) == 0 {
            return;
        }
        let task = tokio::task::try_id();
        let mut state = self.lock();
        let Some(misses) = state.misses.get_mut(id) else {
            return;
        };
        let Some(at) = misses.tasks.iter().position(|t| *t == task) else {
            return;
        };
        misses.tasks.swap_remove(at);
        if misses.tasks.is_empty() {
            state.end_misses(id, Instant::now());
            self.missing.store(state.misses.len(), Ordering::SeqCst);
        }
    }

    /// A restore of session `id` failed, or the session closed: the
    /// requests missing it are answered without it.
    pub(super) fn abandon(&self, id: &SessionId) {
        if self.missing.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.end_misses(id, None);
    }

    fn end_misses(&self, id: &SessionId, serial: Option<u64>) {
        let mut state = self.lock();
        if state
            .misses
            .get(id)
            .is_some_and(|misses| serial.is_none_or(|serial| serial == misses.serial))
        {
            state.end_misses(id, Instant::now());
            self.missing.store(state.misses.len(), Ordering::SeqCst);
        }
    }

    /// How many sessions have requests on their way to a restore (tests).
    #[cfg(test)]
    pub(super) fn misses(&self) -> usize {
        self.lock().misses.len()
    }

    /// How many restores are in flight and replays pending (for tests).
    #[cfg(test)]
    pub(super) fn pending(&self) -> (usize, usize) {
        let state = self.lock();
        (state.restoring.len(), state.replays.len())
    }
}

/// Whether rmcp replays this message to restore a session.
pub(super) fn replayed(message: &ClientJsonRpcMessage) -> bool {
    match message {
        ClientJsonRpcMessage::Request(request) => request.request.extensions(),
        ClientJsonRpcMessage::Notification(notification) => notification.notification.extensions(),
        _ => return false,
    }
    .get::<SessionRestoreMarker>()
    .is_some()
}

/// A restore in flight; dropped before it finished (rmcp gave up on it
/// before replaying the handshake, or there was nothing to restore), it is
/// over, and failed.
pub(crate) struct Restoring {
    restores: Arc<Restores>,
    id: SessionId,
    serial: u64,
    /// Whether ending unfinished fails the requests that
    /// [missed](Restores::miss) the session.
    failed: bool,
}

impl Restoring {
    /// Over: the session was held here already, and the requests that
    /// missed it are served by it.
    pub(crate) fn already_held(mut self) {
        self.failed = false;
    }
}

impl Drop for Restoring {
    fn drop(&mut self) {
        if self.restores.finish_if(&self.id, Some(self.serial)) && self.failed {
            self.restores.abandon(&self.id);
        }
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
