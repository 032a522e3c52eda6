//! Following (C13): a replay that stays open, woken by this handle's
//! writer after its commits and by the watcher for other handles and
//! processes, re-reading by cursor with the replay's own read.

use mcp_event_store_core::backend::follow;
use mcp_event_store_core::{Error, EventId, EventStore, FollowOptions, Replay, Result};

use crate::SqliteStore;
use crate::error::NAME;

pub(crate) async fn follow_events_after(
    store: &SqliteStore,
    last_event_id: &str,
    options: FollowOptions,
) -> Result<Replay> {
    let cursor: EventId = last_event_id.parse()?;
    // Subscribe before the first read, so no append falls in between;
    // the watcher, started after the read, wakes a stream it has not
    // seen before at its first poll that finds anything written.
    let subscription = store.inner.wakeups.subscribe(cursor.token);
    let first = store.replay_events_after(last_event_id).await?;
    store.inner.watcher.ensure();
    let store = store.clone();
    Ok(follow::follow(
        NAME,
        first,
        subscription,
        last_event_id.to_owned(),
        store.inner.follow_recheck,
        options,
        move |cursor| {
            let store = store.clone();
            async move {
                match store.replay_events_after(&cursor).await {
                    // The cursor was delivered, so it was issued: the
                    // stream was deleted or expired whole (perhaps
                    // started again) under the follower.
                    Err(Error::UnknownEventId { .. }) => Err(Error::events_purged(&cursor)),
                    other => other,
                }
            }
        },
    ))
}

pub(crate) fn open_follows(store: &SqliteStore) -> usize {
    store.inner.wakeups.followers()
}
