//! Following (C13): a replay, then a re-read by cursor after each wake-up.
//! Every append publishes a wake-up on `<prefix>.wake.<token>` (core NATS,
//! not stored), which every handle's watcher turns into a wake-up of its
//! followers of that stream; the re-read every `follow_recheck` finds
//! what a lost wake-up announced.

use mcp_event_store_core::backend::follow;
use mcp_event_store_core::{EventId, FollowOptions, Replay, Result};

use crate::NatsStore;
use crate::error::NAME;
use crate::replay::replay_after;

/// The replay after `cursor` that stays open.
pub(crate) async fn follow_after(
    store: &NatsStore,
    raw: &str,
    cursor: EventId,
    options: FollowOptions,
) -> Result<Replay> {
    // Subscribed before the first read, so no wake-up in between is lost.
    let subscription = store.inner.wakeups.subscribe(cursor.token);
    let first = replay_after(store, raw, cursor).await?;
    Ok(follow::follow(
        NAME,
        first,
        subscription,
        raw.to_owned(),
        store.inner.options.follow_recheck,
        options,
        follow::reread(store.clone()),
    ))
}

/// How many follows of this handle are open.
pub(crate) fn follows_open(store: &NatsStore) -> usize {
    store.inner.wakeups.followers()
}
