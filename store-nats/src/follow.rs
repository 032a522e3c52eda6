//! Following (C13): a replay, then a re-read by cursor after each wake-up.
//! Every append publishes a wake-up on `<prefix>.wake.<token>` (core NATS,
//! not stored), which every handle's watcher turns into a wake-up of its
//! followers of that stream; the re-read every `follow_recheck` finds
//! what a lost wake-up announced.

use mcp_event_store_core::backend::follow;
use mcp_event_store_core::{EventId, FollowOptions, Replay, Result};

use crate::NatsStore;
use crate::error::NAME;

impl NatsStore {
    pub(crate) async fn open_follow(
        &self,
        raw: &str,
        cursor: EventId,
        options: FollowOptions,
    ) -> Result<Replay> {
        // Subscribed before the first read, so no wake-up in between is lost.
        let subscription = self.inner.wakeups.subscribe(cursor.token);
        let first = self.open_replay(raw, cursor).await?;
        Ok(follow::follow(
            NAME,
            first,
            subscription,
            raw.to_owned(),
            self.inner.options.follow_recheck,
            options,
            follow::reread(self.clone()),
        ))
    }

    pub(crate) fn follows(&self) -> usize {
        self.inner.wakeups.followers()
    }
}
