//! What a [`SessionScoped`](super::SessionScoped) manager remembers about the
//! sessions it holds in memory: whether each is known to be in the shared
//! session store, when that was last checked, and which stream bindings it
//! wrote for it.
//!
//! Everything here is synchronous and behind one `std` mutex held for a few
//! map operations at a time, never across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_core::future::BoxFuture;
use rmcp::transport::streamable_http_server::session::SessionId;
use tokio::time::Instant;

use mcp_event_store_core::SessionDigest;
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::task::Owner;

/// How many stream bindings a manager remembers per session, to remove them
/// when the session is deleted or expires. Older ones are forgotten and left
/// to expire with their time to live. 1024 tokens of 15 bytes, with their
/// times, are about 32 KiB per busy session.
pub(super) const MAX_REMEMBERED_BINDINGS: usize = 1024;

/// Whether a session's state is in the shared session store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stored {
    /// Created here and not looked up yet (no linked session store told us).
    Unknown,
    /// Seen in the store, written through a linked session store, or
    /// restored from it: its absence now means deleted or expired.
    Yes,
    /// Created here and absent at its first check: this server keeps no
    /// session state in the store (or the write failed). Never checked
    /// again.
    No,
}

/// One session held in memory by this manager.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) stored: Stored,
    /// Who the session is bound to, once its `initialize` (or restore)
    /// was served; `None` before, and for one served unscoped while
    /// callers are bound (no caller matches it then).
    owner: Option<Owner>,
    /// The digest of its id: what the bus names it by (C20).
    digest: SessionDigest,
    /// When the store was last asked (or a check claimed), on tokio's clock.
    checked_at: Option<Instant>,
    /// Streams bound to the session by this manager, oldest first.
    pub(super) bindings: VecDeque<(Instant, StreamToken)>,
}

impl Tracked {
    fn new(id: &str, stored: Stored) -> Self {
        Self {
            stored,
            owner: None,
            digest: SessionDigest::of(id),
            checked_at: None,
            bindings: VecDeque::new(),
        }
    }

    /// The tokens of bindings younger than `ttl` (older ones have expired in
    /// the store already).
    pub(super) fn live_bindings(&self, ttl: Duration, now: Instant) -> Vec<StreamToken> {
        self.bindings
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) < ttl)
            .map(|(_, token)| *token)
            .collect()
    }
}

/// What a check that found no state in the store means.
#[derive(Debug)]
pub(super) enum Absent {
    /// The session was in the store and is not any more: deleted or expired.
    Gone(Tracked),
    /// This manager never saw it there: it is not shared. Keep serving it.
    NotShared,
}

/// Removes the bindings of a session closed here, once it is known to be
/// gone from the store.
pub(super) type Cleanup = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// Runs `work` on the current tokio runtime, if there is one (rmcp always
/// runs in one); without, the bindings it would remove are left to expire.
pub(super) fn spawn(work: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(work);
        }
        Err(_) => tracing::debug!("no runtime to remove stream bindings on; they expire"),
    }
}

/// The sessions one manager holds, shared with its linked session stores
/// and its request streams.
#[derive(Default)]
pub(super) struct Tracker {
    sessions: Mutex<HashMap<SessionId, Tracked>>,
    /// Sessions closed here whose bindings wait for the store to say
    /// whether the session is gone (a few seconds at most).
    closing: Mutex<HashMap<SessionId, Cleanup>>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("sessions", &self.len())
            .finish_non_exhaustive()
    }
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionId, Tracked>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_closing(&self) -> MutexGuard<'_, HashMap<SessionId, Cleanup>> {
        self.closing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parks the cleanup of a session closed here until the store says it
    /// is gone (or a linked session store deletes it).
    pub(super) fn closing(&self, id: &SessionId, cleanup: Cleanup) {
        self.lock_closing().insert(id.clone(), cleanup);
    }

    /// The parked cleanup of a session closed here, if still parked.
    pub(super) fn take_closing(&self, id: &str) -> Option<Cleanup> {
        self.lock_closing().remove(id)
    }

    /// A linked session store deleted the session's state (rmcp's `DELETE`,
    /// just after closing it): its bindings go now.
    pub(super) fn deleted(&self, id: &str) {
        if let Some(cleanup) = self.take_closing(id) {
            spawn(cleanup());
        }
    }

    /// A session now held in memory (created, or restored from the store).
    pub(super) fn track(&self, id: &SessionId, stored: Stored) {
        self.lock()
            .entry(id.clone())
            .and_modify(|tracked| tracked.stored = stored)
            .or_insert_with(|| Tracked::new(id, stored));
    }

    /// Binds a held session to the caller that opened (or restored) it.
    pub(super) fn set_owner(&self, id: &str, owner: Option<Owner>) {
        if let Some(tracked) = self.lock().get_mut(id) {
            tracked.owner = owner;
        }
    }

    /// Whether `id` is held here and bound to `caller` (C20).
    pub(super) fn owned_by(&self, id: &str, caller: &Owner) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|tracked| tracked.owner.as_ref() == Some(caller))
    }

    /// The held session a digest heard on the bus names.
    pub(super) fn find(&self, digest: &SessionDigest) -> Option<SessionId> {
        self.lock()
            .iter()
            .find(|(_, tracked)| tracked.digest == *digest)
            .map(|(id, _)| id.clone())
    }

    /// A linked session store wrote the session's state.
    pub(super) fn mark_stored(&self, id: &str) {
        if let Some(tracked) = self.lock().get_mut(id) {
            tracked.stored = Stored::Yes;
        }
    }

    /// Whether the store should be asked about `id` now; if so, the check is
    /// claimed, so concurrent requests do not ask again within `every`.
    pub(super) fn claim_check(&self, id: &SessionId, every: Duration, now: Instant) -> bool {
        let mut sessions = self.lock();
        let Some(tracked) = sessions.get_mut(id) else {
            return false;
        };
        if tracked.stored == Stored::No
            || tracked
                .checked_at
                .is_some_and(|at| now.saturating_duration_since(at) < every)
        {
            return false;
        }
        tracked.checked_at = Some(now);
        true
    }

    /// The check found the session's state in the store.
    pub(super) fn seen(&self, id: &SessionId) {
        self.mark_stored(id);
    }

    /// The check found no state for the session in the store.
    pub(super) fn absent(&self, id: &SessionId) -> Absent {
        let mut sessions = self.lock();
        match sessions.get_mut(id).map(|tracked| tracked.stored) {
            Some(Stored::Yes) => Absent::Gone(sessions.remove(id).expect("present")),
            Some(Stored::Unknown) => {
                if let Some(tracked) = sessions.get_mut(id) {
                    tracked.stored = Stored::No;
                }
                Absent::NotShared
            }
            Some(Stored::No) | None => Absent::NotShared,
        }
    }

    /// A stream of the session was bound (at `now`, for `ttl`).
    pub(super) fn remember(&self, id: &SessionId, token: StreamToken, ttl: Duration, now: Instant) {
        let mut sessions = self.lock();
        let Some(tracked) = sessions.get_mut(id) else {
            return;
        };
        while tracked
            .bindings
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= ttl)
            || tracked.bindings.len() >= MAX_REMEMBERED_BINDINGS
        {
            tracked.bindings.pop_front();
        }
        tracked.bindings.push_back((now, token));
    }

    /// Forgets a session closed here.
    pub(super) fn take(&self, id: &SessionId) -> Option<Tracked> {
        self.lock().remove(id)
    }

    /// How many sessions are held (for tests and `Debug`).
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(n: u8) -> StreamToken {
        StreamToken::from_bytes(&[n; 15]).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn checks_are_claimed_once_per_interval_and_never_for_unshared_sessions() {
        let tracker = Tracker::default();
        let id: SessionId = "s".into();
        let every = Duration::from_secs(1);
        assert!(
            !tracker.claim_check(&id, every, Instant::now()),
            "untracked"
        );
        tracker.track(&id, Stored::Unknown);
        let t0 = Instant::now();
        assert!(tracker.claim_check(&id, every, t0));
        assert!(!tracker.claim_check(&id, every, t0 + Duration::from_millis(999)));
        assert!(tracker.claim_check(&id, every, t0 + every));
        assert!(matches!(tracker.absent(&id), Absent::NotShared));
        assert!(
            !tracker.claim_check(&id, every, t0 + every * 10),
            "not shared"
        );
        let shared: SessionId = "shared".into();
        tracker.track(&shared, Stored::Yes);
        assert!(tracker.claim_check(&shared, Duration::ZERO, t0));
        assert!(
            tracker.claim_check(&shared, Duration::ZERO, t0),
            "every request"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stored_session_found_absent_is_gone_with_its_bindings() {
        let tracker = Tracker::default();
        let id: SessionId = "s".into();
        tracker.track(&id, Stored::Unknown);
        tracker.mark_stored("s");
        tracker.remember(&id, token(1), Duration::from_secs(60), Instant::now());
        let Absent::Gone(tracked) = tracker.absent(&id) else {
            panic!("gone");
        };
        assert_eq!(tracked.bindings.len(), 1);
        assert_eq!(tracker.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn remembered_bindings_are_pruned_by_age_and_capped() {
        let tracker = Tracker::default();
        let id: SessionId = "s".into();
        tracker.track(&id, Stored::Yes);
        let ttl = Duration::from_secs(60);
        let t0 = Instant::now();
        tracker.remember(&id, token(1), ttl, t0);
        tracker.remember(&id, token(2), ttl, t0 + ttl);
        let tracked = tracker.take(&id).unwrap();
        assert_eq!(
            tracked.bindings.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
            [token(2)],
            "the expired one is forgotten"
        );
        tracker.track(&id, Stored::Yes);
        for n in 0..MAX_REMEMBERED_BINDINGS + 10 {
            tracker.remember(&id, token(n as u8), ttl, t0);
        }
        let tracked = tracker.take(&id).unwrap();
        assert_eq!(tracked.bindings.len(), MAX_REMEMBERED_BINDINGS);
        assert_eq!(tracked.live_bindings(ttl, t0 + ttl).len(), 0);
    }
}
