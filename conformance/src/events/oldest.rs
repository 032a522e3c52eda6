//! C16: a stream replays from its oldest retained event, with no cursor.

use std::time::Duration;

use futures_util::TryStreamExt;

use super::*;
use mcp_event_store_core::{Error, EventId, EventStore, NewEvent, Retention, StoredEvent};

/// Every retained event of `stream`, from its oldest, or the first error.
pub async fn replay_stream_all<S: EventStore + ?Sized>(
    store: &S,
    stream: &str,
) -> Result<Vec<StoredEvent>> {
    let replay = store.replay_stream(stream).await?;
    assert_eq!(replay.stream_id, stream, "the replay names its stream");
    replay.events.try_collect().await
}

fn ids(events: &[StoredEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

/// C16, C3, C7: a stream replays whole from its oldest event, in order,
/// with its ids, payloads and retry hints, over several pages, and never
/// with another stream's events; a stream never written replays nothing.
pub async fn replay_stream_yields_every_event_from_the_oldest<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock).page_size(4)).await;
    let empty = replay_stream_all(&store, "s").await.unwrap();
    assert!(empty.is_empty(), "a stream never written replays nothing");
    let mut want = Vec::new();
    for i in 0..10u8 {
        want.push(append(&store, "s", &[i]).await);
        append(&store, "t", &[100 + i]).await;
    }
    let priming = store
        .store_event("s", NewEvent::priming(Duration::from_millis(2_500)))
        .await
        .unwrap();
    want.push(priming);
    let events = replay_stream_all(&store, "s").await.unwrap();
    assert_eq!(ids(&events), want, "every event of the stream, in order");
    for (i, event) in events[..10].iter().enumerate() {
        assert_eq!(&event.data[..], &[i as u8]);
        assert_eq!(event.retry, None);
    }
    assert!(events[10].data.is_empty());
    assert_eq!(events[10].retry, Some(Duration::from_millis(2_500)));
    let other = replay_stream_all(&store, "t").await.unwrap();
    assert_eq!(other.len(), 10);
    assert!(
        other.iter().all(|e| e.data[0] >= 100),
        "only its own events"
    );
    // The same ids resume: the replay's ids are the store's.
    let (_, after) = replay_all(&store, &text(&want[4])).await.unwrap();
    assert_eq!(ids(&after), want[5..]);
    h.close(store).await;
}

/// C16, C8: the replay starts at the oldest event retention kept; a
/// deleted stream replays nothing, and a stream started again replays only
/// its new life.
pub async fn replay_stream_starts_at_the_oldest_retained<H: Harness>(h: &H) {
    let clock = test_clock();
    let retention = Retention::unbounded().max_events_per_stream(3);
    let store = h.open(test_options(&clock).retention(retention)).await;
    let written = append_n(&store, "s", "old", 5).await;
    store.purge_expired().await.unwrap();
    let events = replay_stream_all(&store, "s").await.unwrap();
    assert_eq!(ids(&events), written[2..], "the three newest, oldest first");
    assert_eq!(&events[0].data[..], b"old-2");
    assert!(store.delete_stream("s").await.unwrap() > 0);
    let gone = replay_stream_all(&store, "s").await.unwrap();
    assert!(gone.is_empty(), "a deleted stream replays nothing");
    let new = append_n(&store, "s", "new", 2).await;
    let events = replay_stream_all(&store, "s").await.unwrap();
    assert_eq!(ids(&events), new, "only the new life");
    assert!(events.iter().all(|e| !written.contains(&e.id)));
    h.close(store).await;
}

/// C16, C9: any valid stream id replays as data; an invalid one is
/// refused, never read.
pub async fn replay_stream_takes_any_stream_id<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    for stream in HOSTILE_STREAM_IDS {
        append(&store, stream, stream.as_bytes()).await;
    }
    for stream in HOSTILE_STREAM_IDS {
        let events = replay_stream_all(&store, stream)
            .await
            .unwrap_or_else(|e| panic!("replay_stream({stream:?}): {e}"));
        assert_eq!(events.len(), 1, "{stream:?}");
        assert_eq!(&events[0].data[..], stream.as_bytes());
    }
    for bad in [
        String::new(),
        "x".repeat(mcp_event_store_core::MAX_STREAM_ID_LEN + 1),
    ] {
        match store.replay_stream(&bad).await {
            Err(Error::InvalidStreamId { .. }) => {}
            Err(other) => panic!("replay_stream of a {} byte id: {other}", bad.len()),
            Ok(_) => panic!("replay_stream of a {} byte id succeeded", bad.len()),
        }
    }
    h.close(store).await;
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_oldest {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            replay_stream_yields_every_event_from_the_oldest,
            replay_stream_starts_at_the_oldest_retained,
            replay_stream_takes_any_stream_id,
        );
    };
}
