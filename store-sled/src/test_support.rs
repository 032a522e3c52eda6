//! Helpers for this crate's unit tests.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::{EventId, EventStore, Result};

use crate::SledStore;
use crate::flusher::Flusher;

/// The ids a replay after `id` yields, to its end.
pub(crate) async fn replayed_after(store: &SledStore, id: &EventId) -> Result<Vec<EventId>> {
    let replay = store.replay_events_after(&id.to_string()).await?;
    let events: Vec<_> = replay.events.try_collect().await?;
    Ok(events.into_iter().map(|e| e.id).collect())
}

/// Waits (up to ten seconds) until `done` holds.
pub(crate) async fn until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Releases paused flushes when dropped, also when an assertion fails,
/// so a held blocking task lets the runtime shut down.
pub(crate) struct Unpause<'a>(pub(crate) &'a Flusher);

impl Drop for Unpause<'_> {
    fn drop(&mut self) {
        self.0.pause(false);
    }
}
