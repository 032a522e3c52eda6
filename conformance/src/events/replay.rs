//! C1, C3, C7: events come back as stored, in order, strictly after the cursor, priming events and retry hints included.

use std::time::Duration;

use super::*;
use mcp_event_store_core::{EventId, EventStore, NewEvent};

/// C1, C3: an event comes back with its id, payload and stream.
pub async fn round_trip<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let first = append(&store, "s", b"first").await;
    let second = append(&store, "s", b"second").await;
    let (stream, events) = replay_all(&store, &text(&first)).await.unwrap();
    assert_eq!(stream, "s");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, second);
    assert_eq!(&events[0].data[..], b"second");
    assert_eq!(events[0].retry, None);
    h.close(store).await;
}

/// C3: replay keeps store order and original ids.
pub async fn replay_preserves_order<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut ids = Vec::new();
    for i in 0..50u32 {
        ids.push(append(&store, "s", &i.to_be_bytes()).await);
    }
    let (_, events) = replay_all(&store, &text(&ids[0])).await.unwrap();
    let got: Vec<EventId> = events.iter().map(|e| e.id).collect();
    assert_eq!(got, ids[1..]);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(&event.data[..], &(i as u32 + 1).to_be_bytes());
    }
    h.close(store).await;
}

/// C3: replay after event k starts at k+1, each once.
pub async fn replay_is_strictly_after<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut ids = Vec::new();
    for i in 0..10u8 {
        ids.push(append(&store, "s", &[i]).await);
    }
    for (k, id) in ids.iter().enumerate() {
        let data = replay_data(&store, id).await;
        let want: Vec<Vec<u8>> = (k as u8 + 1..10).map(|i| vec![i]).collect();
        assert_eq!(data, want, "replay after event {k}");
    }
    h.close(store).await;
}

/// C3: a client that saw everything gets an empty replay, not an error.
pub async fn replay_after_the_newest_event_is_empty<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "s", b"a").await;
    let last = append(&store, "s", b"b").await;
    let (stream, events) = replay_all(&store, &text(&last)).await.unwrap();
    assert_eq!(stream, "s");
    assert!(events.is_empty());
    h.close(store).await;
}

/// C7: a priming event (empty data, retry hint) is stored and replayed, and
/// resuming from it works.
pub async fn priming_event_keeps_its_retry_hint<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let before = append(&store, "s", b"before").await;
    let priming = store
        .store_event("s", NewEvent::priming(Duration::from_millis(3_000)))
        .await
        .unwrap();
    let after = append(&store, "s", b"after").await;
    let (_, events) = replay_all(&store, &text(&before)).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].id, priming);
    assert!(events[0].data.is_empty());
    assert_eq!(events[0].retry, Some(Duration::from_millis(3_000)));
    let (_, events) = replay_all(&store, &text(&priming)).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, after);
    h.close(store).await;
}

/// C7: a retry hint travels with a data event too, at millisecond precision.
pub async fn retry_hint_round_trips_with_data<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    for ms in [0u64, 1, 250, 86_400_000] {
        store
            .store_event(
                "s",
                NewEvent::new(b"x").with_retry(Duration::from_millis(ms)),
            )
            .await
            .unwrap();
    }
    let (_, events) = replay_all(&store, &text(&start)).await.unwrap();
    let retries: Vec<_> = events.iter().map(|e| e.retry).collect();
    assert_eq!(
        retries,
        [0u64, 1, 250, 86_400_000].map(|ms| Some(Duration::from_millis(ms)))
    );
    h.close(store).await;
}

/// C3: a replay never yields another stream's events.
pub async fn streams_are_isolated<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let a0 = append(&store, "a", b"a0").await;
    let b0 = append(&store, "b", b"b0").await;
    for i in 1..5u8 {
        append(&store, "a", &[b'a', i]).await;
        append(&store, "b", &[b'b', i]).await;
    }
    let a = replay_data(&store, &a0).await;
    let b = replay_data(&store, &b0).await;
    assert_eq!(a, (1..5u8).map(|i| vec![b'a', i]).collect::<Vec<_>>());
    assert_eq!(b, (1..5u8).map(|i| vec![b'b', i]).collect::<Vec<_>>());
    h.close(store).await;
}

/// C3: a replay longer than one page comes back whole, in order, at a
/// small page size and at the default.
pub async fn replay_pages_through_long_streams<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock).page_size(7)).await;
    let mut ids = Vec::new();
    for i in 0..100u32 {
        ids.push(append(&store, "long", &i.to_be_bytes()).await);
    }
    for start in [0usize, 6, 7, 13, 14, 98] {
        let (_, events) = replay_all(&store, &text(&ids[start])).await.unwrap();
        let got: Vec<_> = events.iter().map(|e| e.id).collect();
        assert_eq!(got, ids[start + 1..], "replay after event {start}");
    }
    h.close(store).await;
    // At the default page size, across where a backend may end a short
    // first page (read on the calling task) and read on in full pages.
    let (store, _) = open_default(h).await;
    let mut ids = Vec::new();
    for i in 0..300u32 {
        ids.push(append(&store, "long", &i.to_be_bytes()).await);
    }
    for start in [0usize, 126, 127, 128, 171, 298, 299] {
        let (_, events) = replay_all(&store, &text(&ids[start])).await.unwrap();
        let got: Vec<_> = events.iter().map(|e| e.id).collect();
        assert_eq!(
            got,
            ids[start + 1..],
            "default pages: replay after event {start}"
        );
    }
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_replay {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            round_trip,
            replay_preserves_order,
            replay_is_strictly_after,
            replay_after_the_newest_event_is_empty,
            priming_event_keeps_its_retry_hint,
            retry_hint_round_trips_with_data,
            streams_are_isolated,
            replay_pages_through_long_streams
        );
    };
}
