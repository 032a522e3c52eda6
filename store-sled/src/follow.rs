//! Following (C13): a replay that stays open. Every handle on a database
//! in this process shares one wake-up hub (see the crate docs on
//! following); a wake-up only prompts a re-read by cursor, which costs no
//! blocking call when nothing new is visible.

use std::sync::Arc;

use mcp_event_store_core::backend::follow::{self, Wakeups};
use mcp_event_store_core::backend::{Page, StreamToken};
use mcp_event_store_core::{Error, EventId, FollowOptions, Replay, Result};

use crate::SledStore;
use crate::error::NAME;
use crate::replay::{PageReader, position_in, start_replay};
use crate::shared::Shared;
use crate::slot::Slot;

/// A replay that stays open: [`EventStore::follow_events_after`](mcp_event_store_core::EventStore::follow_events_after).
pub(crate) async fn follow_after(
    store: &SledStore,
    raw: &str,
    cursor: EventId,
    options: FollowOptions,
) -> Result<Replay> {
    let hub = store.shared()?.wakeups.clone();
    follow_on(store, &hub, raw, cursor, options).await
}

/// Every follower on the database in this process, whichever handle opened
/// it: [`EventStore::open_follows`](mcp_event_store_core::EventStore::open_follows).
/// None once this handle is closed.
pub(crate) fn follows_open(store: &SledStore) -> usize {
    store
        .shared()
        .map_or(0, |shared| shared.wakeups.followers())
}

/// A follow woken through `hub`: the database's own, except in tests
/// that lose every wake-up on purpose.
pub(crate) async fn follow_on(
    store: &SledStore,
    hub: &Arc<Wakeups>,
    raw: &str,
    cursor: EventId,
    options: FollowOptions,
) -> Result<Replay> {
    // Subscribed before the first read, so an append published in
    // between wakes this follower.
    let subscription = hub.subscribe(cursor.token);
    let (stream_id, reader, after, first) = start_replay(store, raw, cursor).await?;
    let first = Replay {
        stream_id: stream_id.clone(),
        events: reader.clone().stream(after, Some(first)),
    };
    let follower = Follower {
        shared: Arc::downgrade(&reader.shared),
        slot: reader.slot.clone(),
        token: reader.token,
        incarnation: reader.incarnation,
        limit: reader.limit,
        stream_id,
    };
    drop(reader);
    Ok(follow::follow(
        NAME,
        first,
        subscription,
        raw.to_owned(),
        store.handle.follow_recheck,
        options,
        move |cursor| std::future::ready(follower.reread(cursor)),
    ))
}

/// What a follow keeps between reads: the life of the stream it follows
/// (its slot), and the database only weakly, so idle followers never keep
/// a closed store open.
struct Follower {
    shared: std::sync::Weak<Shared>,
    slot: Arc<Slot>,
    token: StreamToken,
    incarnation: u64,
    limit: usize,
    stream_id: String,
}

impl Follower {
    /// The replay after `cursor`, the newest id this follow delivered (or
    /// the id it opened with). Without a blocking call when nothing new is
    /// visible, which is what most wake-ups of a busy database and every
    /// idle re-check find.
    fn reread(&self, cursor: String) -> Result<Replay> {
        let shared = self.shared.upgrade().ok_or(Error::Closed)?;
        let id: EventId = cursor.parse()?;
        let position = position_in(id.position, self.incarnation, &shared.incarnations);
        if position.major != self.incarnation {
            // Every id a follow delivers, and the cursor it opened with
            // once checked, is of the life it follows.
            return Err(Error::unknown_event_id(&cursor));
        }
        let after = position.minor;
        let nothing_new = !self.slot.is_dead() && self.slot.durable() <= after;
        let reader = Arc::new(PageReader {
            shared,
            slot: self.slot.clone(),
            token: self.token,
            incarnation: self.incarnation,
            raw: cursor.into(),
            limit: self.limit,
        });
        let first = nothing_new.then(|| Page {
            events: Vec::new(),
            last: true,
        });
        Ok(Replay {
            stream_id: self.stream_id.clone(),
            events: reader.stream(after, first),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use mcp_event_store_core::backend::follow::Wakeups;
    use mcp_event_store_core::{Error, EventStore, FollowOptions, NewEvent};

    use super::follow_on;
    use crate::test_support::{Unpause, until};
    use crate::{SledOptions, SledStore};

    /// The safety net: a follower that never gets a wake-up (subscribed to
    /// a hub nobody wakes) still gets every event, through the re-check,
    /// appended through this handle or another, then ends when the
    /// database closes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_recheck_finds_what_lost_wakeups_announced() {
        use futures_util::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let options = SledOptions::default().follow_recheck(Duration::from_millis(10));
        let store = SledStore::open(dir.path(), options.clone()).await.unwrap();
        let other = SledStore::open(dir.path(), options).await.unwrap();
        let head = store.store_event("s", NewEvent::new(b"h")).await.unwrap();
        let deaf = Arc::new(Wakeups::default());
        let mut follow = follow_on(
            &store,
            &deaf,
            &head.to_string(),
            head,
            FollowOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(deaf.followers(), 1);
        assert_eq!(store.open_follows(), 0, "not on the database's hub");
        for (n, writer) in [&store, &other, &store].into_iter().enumerate() {
            let id = writer
                .store_event("s", NewEvent::new(&[n as u8]))
                .await
                .unwrap();
            let event = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
                .await
                .expect("the re-check never found it")
                .unwrap()
                .unwrap();
            assert_eq!(event.id, id);
        }
        other.close().await.unwrap();
        store.close().await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
            .await
            .expect("the re-check never found the database closed");
        assert!(matches!(end, Some(Err(Error::Closed))));
        drop(follow);
        assert_eq!(deaf.followers(), 0);
    }

    /// With `Flush`, a follower gets an event only once it is flushed, the
    /// moment it is published to readers, never from the unflushed write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn followers_never_get_an_unflushed_event() {
        use futures_util::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let db = store.shared().unwrap();
        let head = store.store_event("s", NewEvent::new(b"h")).await.unwrap();
        let mut follow = store
            .follow_events_after(&head.to_string(), FollowOptions::default())
            .await
            .unwrap();
        db.flusher.pause(true);
        let unpause = Unpause(&db.flusher);
        let written = db.events.len() + 1;
        let pending = tokio::spawn({
            let store = store.clone();
            async move { store.store_event("s", NewEvent::new(b"next")).await }
        });
        until(|| db.events.len() >= written).await;
        // Time for a wrong delivery to happen.
        let early = tokio::time::timeout(Duration::from_millis(100), follow.events.next()).await;
        assert!(early.is_err(), "a follower got an unflushed event");
        assert!(!pending.is_finished());
        drop(unpause);
        let event = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
            .await
            .expect("never delivered after the flush")
            .unwrap()
            .unwrap();
        assert_eq!(pending.await.unwrap().unwrap(), event.id);
        drop(follow);
        drop(db);
        store.close().await.unwrap();
    }
}
