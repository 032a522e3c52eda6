//! Following a stream (C13): the replay that stays open.
//!
//! [`EventStore::follow_events_after`](crate::EventStore::follow_events_after)
//! yields the stored events after a cursor, then each event appended to that
//! stream afterwards, until it is dropped, its maximum hold passes, or an
//! error ends it. Every backend builds it from the two pieces here:
//!
//! * [`Wakeups`], a per-handle hub of per-stream wake-up counters. A backend
//!   calls [`Wakeups::wake`] after an append is committed (and from its
//!   native notification: `LISTEN`, `XREAD BLOCK`, `PRAGMA data_version`).
//! * [`follow`], the loop: subscribe, read by cursor, wait for a wake-up (or
//!   the backend's periodic re-check), read by cursor again.
//! * [`watch_task`], the same loop for a task watch (T10): the hub keyed by
//!   [`task_token`], a keyed re-read of the task after each wake-up.
//!
//! A wake-up carries no payload: it only prompts a re-read from the store
//! by cursor. Correctness never depends on a notification arriving (the
//! periodic re-check finds what a lost one would have announced), and no
//! follower holds a queue of events that could grow without bound: the
//! store is the queue.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_core::future::BoxFuture;
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::jobs::{EventBackend, ensure_open};
use crate::backend::observe::{self, FollowGauge};
use crate::error::Result;
use crate::id::{EventId, STREAM_TOKEN_LEN, StreamToken};
use crate::store::{FollowOptions, Replay, ReplayEvents};
use crate::task::{Rev, TaskDigest, TaskRecord};

/// Per-stream wake-up counters shared by one store handle's followers.
///
/// Only streams with a follower have an entry; the entry goes with the
/// last follower, so the hub's size is bounded by the followers open.
/// Cheap when nobody follows: [`wake`](Wakeups::wake) is one lock and one
/// hash lookup.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::Arc;
/// use mcp_event_store_core::backend::{StreamKey, follow::Wakeups};
///
/// let hub = Arc::new(Wakeups::default());
/// let token = StreamKey::generate().unwrap().token("stream-a");
/// let mut follower = hub.subscribe(token);
/// assert_eq!(hub.followers(), 1);
/// hub.wake(&token);
/// follower.changed().await; // returns at once: a wake-up is pending
/// drop(follower);
/// assert_eq!(hub.followers(), 0);
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Wakeups {
    streams: Mutex<HashMap<StreamToken, watch::Sender<u64>>>,
}

impl Wakeups {
    fn streams(&self) -> MutexGuard<'_, HashMap<StreamToken, watch::Sender<u64>>> {
        // Every critical section completes its one map operation, so a
        // poisoned lock holds nothing half-done.
        self.streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the followers of one stream: call it after an append to that
    /// stream is committed, so the re-read it prompts sees the event.
    pub fn wake(&self, token: &StreamToken) {
        if let Some(sender) = self.streams().get(token) {
            sender.send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    /// Wakes every follower of this handle: for a backend that learns that
    /// *something* changed (another process wrote) but not which stream.
    pub fn wake_all(&self) {
        for sender in self.streams().values() {
            sender.send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    /// The streams that have at least one follower now.
    pub fn followed(&self) -> Vec<StreamToken> {
        self.streams().keys().copied().collect()
    }

    /// How many followers are open on this handle.
    pub fn followers(&self) -> usize {
        self.streams()
            .values()
            .map(watch::Sender::receiver_count)
            .sum()
    }

    /// Registers a follower of `token`; its wake-ups start now.
    pub fn subscribe(self: &Arc<Self>, token: StreamToken) -> Subscription {
        let receiver = {
            let mut streams = self.streams();
            let sender = streams.entry(token).or_insert_with(|| watch::channel(0).0);
            let mut receiver = sender.subscribe();
            receiver.mark_unchanged();
            receiver
        };
        Subscription {
            hub: self.clone(),
            token,
            receiver: Some(receiver),
        }
    }
}

/// One follower's registration in a [`Wakeups`] hub; dropping it
/// unregisters the follower (and the stream's entry with its last one).
#[derive(Debug)]
pub struct Subscription {
    hub: Arc<Wakeups>,
    token: StreamToken,
    receiver: Option<watch::Receiver<u64>>,
}

impl Subscription {
    /// Marks every wake-up so far as seen: call it before a re-read, so any
    /// append committed after the re-read started wakes the next
    /// [`changed`](Subscription::changed).
    pub fn mark_seen(&mut self) {
        if let Some(receiver) = &mut self.receiver {
            receiver.mark_unchanged();
        }
    }

    /// Waits for a wake-up not yet marked seen.
    pub async fn changed(&mut self) {
        match &mut self.receiver {
            // The hub keeps the sender while a receiver exists, so this
            // only fails if the hub itself is gone; then wait for the
            // re-check instead of spinning.
            Some(receiver) => {
                if receiver.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.receiver.take());
        let mut streams = self.hub.streams();
        if streams
            .get(&self.token)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            streams.remove(&self.token);
        }
    }
}

/// The key a task's watchers wait under in a [`Wakeups`] hub: a prefix of
/// its digest. Two tasks sharing it only cost a spurious re-read.
pub fn task_token(digest: &TaskDigest) -> StreamToken {
    StreamToken::from_bytes(&digest.as_bytes()[..STREAM_TOKEN_LEN])
        .expect("a digest prefix of a token's length")
}

/// A task watch ([`TaskStore::watch`](crate::task::TaskStore::watch), T10)
/// on a subscription to the task's [`task_token`]: `read` the task, and
/// again after each wake-up or every `recheck`, until it reads newer than
/// `after` or as gone (`None`), or `deadline` passes (the task as last
/// read).
///
/// Subscribe before calling it, so that a change committed after the first
/// read started wakes the next wait.
///
/// Each read runs on a tokio task of its own, to its end, whatever becomes
/// of the watch. A watch often waits in a `select!` beside other work (a
/// worker's cancel wait beside its next step) and is then left pinned and
/// unpolled for a while, sometimes in the middle of a read: a read driven
/// by the watch itself would hold its pooled connection all that time, and
/// a thousand such watches starve the pool that every other call needs.
/// Spawned, the read finishes and gives its connection back; the watch
/// picks up the answer when it is polled again.
pub async fn watch_task<F, Fut>(
    mut woken: Subscription,
    after: Rev,
    deadline: Instant,
    recheck: Duration,
    mut read: F,
) -> Result<Option<TaskRecord>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<TaskRecord>>> + Send + 'static,
{
    loop {
        woken.mark_seen();
        let seen = match tokio::spawn(read()).await {
            Ok(seen) => seen?,
            Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
            // Cancelled: only a runtime shutting down does that.
            Err(_) => return Err(crate::Error::Closed),
        };
        match &seen {
            Some(task) if task.rev <= after => {}
            _ => return Ok(seen),
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(seen);
        }
        tokio::select! {
            () = woken.changed() => {}
            () = tokio::time::sleep_until((now + recheck).min(deadline)) => {}
        }
    }
}

/// The re-read a follow of `backend` runs after each wake-up: the
/// backend's replay after the newest id delivered, on a clone of the
/// handle. Once the handle is closed it fails with
/// [`Error::Closed`](crate::Error::Closed), which ends the follow. It is
/// not observed as a replay of its own: the follow it serves was, once,
/// when it opened ([`EventBackend`]).
pub fn reread<B>(
    backend: B,
) -> impl FnMut(String) -> BoxFuture<'static, Result<Replay>> + Send + 'static
where
    B: EventBackend + Clone,
{
    move |cursor: String| {
        let backend = backend.clone();
        Box::pin(async move {
            ensure_open(&backend)?;
            let after: EventId = cursor.parse()?;
            backend.replay_after(&cursor, after).await
        })
    }
}

/// What ended a follow's wait for new events.
enum Wait {
    /// A wake-up, at this time.
    Woken(Instant),
    /// The periodic re-read.
    Recheck,
    /// [`FollowOptions::until`] resolved.
    End,
}

/// Builds a follow from a backend's replay; `backend` labels its metrics.
///
/// `first` is the replay after the follower's cursor, opened *after*
/// `subscription` was registered, so no wake-up between the two is lost.
/// `reread(cursor)` replays after the newest id delivered; the loop calls
/// it after each wake-up and, whatever else happens, every `recheck` (the
/// safety net for a lost notification, and the way a backend without
/// native notifications finds other processes' appends). Events are yielded
/// in order, each once: every read starts strictly after the last id
/// yielded (C3, C6). An error from a read is yielded and ends the follow.
pub fn follow<F, Fut>(
    backend: &'static str,
    first: Replay,
    subscription: Subscription,
    cursor: String,
    recheck: Duration,
    options: FollowOptions,
    reread: F,
) -> Replay
where
    F: FnMut(String) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Replay>> + Send + 'static,
{
    struct State<F> {
        /// Counts this follow in `mcp_event_store_follows_active` until the
        /// follow drops.
        _gauge: FollowGauge,
        backend: &'static str,
        /// When the latest wake-up arrived, until an event it announced is
        /// delivered.
        woke_at: Option<Instant>,
        cursor: String,
        events: Option<ReplayEvents>,
        subscription: Subscription,
        reread: F,
        recheck: Duration,
        deadline: Option<Instant>,
        /// Ends the follow when it resolves ([`FollowOptions::until`]).
        until: Option<BoxFuture<'static, ()>>,
        /// `until` resolved: the read in progress is the last.
        ending: bool,
        done: bool,
    }
    let state = State {
        _gauge: FollowGauge::open(backend),
        backend,
        woke_at: None,
        cursor,
        events: Some(first.events),
        subscription,
        reread,
        recheck,
        deadline: options.max_hold.map(|hold| Instant::now() + hold),
        until: options.until,
        ending: false,
        done: false,
    };
    let events = futures_util::stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        loop {
            if let Some(events) = &mut state.events {
                match events.next().await {
                    Some(Ok(event)) => {
                        state.cursor = event.id.to_string();
                        if let Some(woke_at) = state.woke_at.take() {
                            observe::follow_delivered(state.backend, woke_at.elapsed());
                        }
                        return Some((Ok(event), state));
                    }
                    Some(Err(error)) => {
                        state.done = true;
                        return Some((Err(error), state));
                    }
                    None => state.events = None,
                }
            }
            if state.ending {
                return None;
            }
            let recheck = state.recheck;
            let subscription = &mut state.subscription;
            let until = &mut state.until;
            let wait = async {
                tokio::select! {
                    () = subscription.changed() => Wait::Woken(Instant::now()),
                    () = tokio::time::sleep(recheck) => Wait::Recheck,
                    () = async {
                        match until {
                            Some(end) => end.await,
                            None => std::future::pending().await,
                        }
                    } => Wait::End,
                }
            };
            let waited = match state.deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, wait).await.ok()?,
                None => wait.await,
            };
            state.woke_at = match waited {
                Wait::Woken(at) => Some(at),
                Wait::Recheck => None,
                Wait::End => {
                    // One last read: whatever was stored before the end.
                    state.ending = true;
                    state.until = None;
                    None
                }
            };
            state.subscription.mark_seen();
            match (state.reread)(state.cursor.clone()).await {
                Ok(replay) => state.events = Some(replay.events),
                Err(error) => {
                    state.done = true;
                    return Some((Err(error), state));
                }
            }
        }
    });
    Replay {
        stream_id: first.stream_id,
        events: ReplayEvents::new(events),
    }
}
