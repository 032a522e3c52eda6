//! Following (C13): a replay that stays open, woken by this handle's
//! writer after its commits and by the watcher (prompted by file
//! notifications, and by its poll) for other handles and processes,
//! re-reading by cursor with the replay's own read.

use mcp_event_store_core::backend::follow::{self, reread};
use mcp_event_store_core::{Error, EventId, FollowOptions, Replay, Result};

use crate::SqliteStore;
use crate::error::NAME;
use crate::replay::replay_after;

/// The replay after `cursor` that stays open.
pub(crate) async fn follow_after(
    store: &SqliteStore,
    raw: &str,
    cursor: EventId,
    options: FollowOptions,
) -> Result<Replay> {
    // Subscribe before the first read, so no append falls in between;
    // the watcher, started after the read, wakes a stream it has not
    // seen before at its first check that finds anything written (a
    // watcher that starts now checks at once, once its notifier is in
    // place; a running one at the next commit's notification).
    let subscription = store.inner.wakeups.subscribe(cursor.token);
    let first = replay_after(store, raw, cursor).await?;
    store.inner.watcher.ensure();
    let mut again = reread(store.clone());
    Ok(follow::follow(
        NAME,
        first,
        subscription,
        raw.to_owned(),
        store.inner.follow_recheck,
        options,
        move |cursor: String| {
            let replay = again(cursor.clone());
            async move {
                match replay.await {
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

/// How many follows of this handle are open.
pub(crate) fn follows_open(store: &SqliteStore) -> usize {
    store.inner.wakeups.followers()
}
