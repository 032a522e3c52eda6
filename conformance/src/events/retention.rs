//! C8: retention by age, count and bytes, deletes and purges remove exactly what they should.

use std::time::Duration;

use super::*;
use mcp_event_store_core::{Error, EventStore, Retention, SessionStore};

/// C8: a handle reports the retention it was opened with, which the
/// integrations read to keep what guards a stream as long as its events.
pub async fn handle_reports_its_retention<H: Harness>(h: &H) {
    let clock = test_clock();
    for retention in [
        Retention::default(),
        Retention::unbounded(),
        Retention::unbounded()
            .max_age(Duration::from_secs(90))
            .max_events_per_stream(7)
            .max_bytes_per_stream(4096),
    ] {
        let store = h.open(test_options(&clock).retention(retention)).await;
        assert_eq!(store.retention(), retention);
        h.close(store).await;
    }
}

/// C8, C5: events older than `max_age` go; a cursor whose successors went
/// is `EventsPurged`; a cursor whose successors all remain still resumes.
pub async fn retention_by_age<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        )
        .await;
    let e1 = append(&store, "s", b"1").await;
    let e2 = append(&store, "s", b"2").await;
    clock.advance(Duration::from_secs(45));
    let e3 = append(&store, "s", b"3").await;
    clock.advance(Duration::from_secs(30));
    let e4 = append(&store, "s", b"4").await;
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 2, "{report:?}");
    assert_eq!(report.streams, 0, "{report:?}");
    assert_purged(&store, &e1).await;
    assert_eq!(
        replay_data(&store, &e2).await,
        vec![b"3".to_vec(), b"4".to_vec()]
    );
    assert_eq!(replay_data(&store, &e3).await, vec![b"4".to_vec()]);
    assert_eq!(
        store.get_stream_id_for_event_id(&text(&e1)).await.unwrap(),
        None
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&e4))
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    h.close(store).await;
}

/// C8: a stream whose every event expired disappears; others stay.
pub async fn stream_expires_entirely_by_age<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        )
        .await;
    let old = append(&store, "idle", b"x").await;
    append(&store, "idle", b"y").await;
    clock.advance(Duration::from_secs(61));
    let fresh = append(&store, "busy", b"x").await;
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 2, "{report:?}");
    assert_eq!(report.streams, 1, "{report:?}");
    match replay_all(&store, &text(&old)).await {
        Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {}
        other => panic!("replay on an expired stream: {other:?}"),
    }
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&fresh))
            .await
            .unwrap()
            .as_deref(),
        Some("busy")
    );
    h.close(store).await;
}

/// C8, C5: at most `max_events_per_stream` are kept, newest first.
pub async fn retention_by_count<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_events_per_stream(5)))
        .await;
    let mut ids = Vec::new();
    for i in 0..12u8 {
        ids.push(append(&store, "s", &[i]).await);
    }
    let other = append(&store, "other", b"x").await;
    store.purge_expired().await.unwrap();
    assert_purged(&store, &ids[0]).await;
    assert_purged(&store, &ids[5]).await;
    assert_eq!(
        replay_data(&store, &ids[6]).await,
        (7..12u8).map(|i| vec![i]).collect::<Vec<_>>()
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&ids[6]))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&other))
            .await
            .unwrap()
            .as_deref(),
        Some("other")
    );
    h.close(store).await;
}

/// C8: the age limit still applies exactly to a stream the count limit has
/// been trimming: what an append removed for the count does not hide how
/// old the oldest event it left is.
pub async fn age_limit_after_count_trims<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(
            test_options(&clock).retention(
                Retention::unbounded()
                    .max_events_per_stream(3)
                    .max_age(Duration::from_secs(60)),
            ),
        )
        .await;
    append(&store, "s", b"1").await;
    let e2 = append(&store, "s", b"2").await;
    clock.advance(Duration::from_secs(30));
    append(&store, "s", b"3").await;
    let e4 = append(&store, "s", b"4").await;
    let e5 = append(&store, "s", b"5").await;
    clock.advance(Duration::from_secs(40));
    // The count limit leaves 4, 5 and 6; 4 and 5 are 40 s old.
    let e6 = append(&store, "s", b"6").await;
    store.purge_expired().await.unwrap();
    assert_purged(&store, &e2).await;
    assert_eq!(
        replay_data(&store, &e4).await,
        vec![b"5".to_vec(), b"6".to_vec()]
    );
    clock.advance(Duration::from_secs(25));
    // Now 4 and 5 are 65 s old, and 6 is 25 s old.
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 2, "{report:?}");
    assert_eq!(report.streams, 0, "{report:?}");
    assert_purged(&store, &e4).await;
    assert_eq!(replay_data(&store, &e5).await, vec![b"6".to_vec()]);
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&e6))
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    h.close(store).await;
}

/// A store limited to 1,000 bytes per stream, and the ids of ten events of
/// `len` bytes each (event `i` all bytes `i`) appended to stream `s`, then
/// purged.
async fn ten_events_under_a_byte_limit<H: Harness>(h: &H, len: usize) -> (H::Store, Vec<EventId>) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(1_000)))
        .await;
    let mut ids = Vec::new();
    for i in 0..10u8 {
        ids.push(append(&store, "s", &vec![i; len]).await);
    }
    store.purge_expired().await.unwrap();
    (store, ids)
}

/// C8, C5: at most `max_bytes_per_stream` payload bytes are kept.
pub async fn retention_by_bytes<H: Harness>(h: &H) {
    let (store, ids) = ten_events_under_a_byte_limit(h, 300).await;
    assert_purged(&store, &ids[0]).await;
    assert_purged(&store, &ids[5]).await;
    assert_eq!(
        replay_data(&store, &ids[6]).await,
        (7..10u8).map(|i| vec![i; 300]).collect::<Vec<_>>()
    );
    h.close(store).await;
}

/// C8: the byte limit is exact the first time a stream's bytes cross it: a
/// stream holding exactly the limit keeps every event, and one more byte
/// drops its oldest event.
pub async fn byte_limit_is_exact_when_first_crossed<H: Harness>(h: &H) {
    let (store, mut ids) = ten_events_under_a_byte_limit(h, 100).await;
    let retained = super::oldest::replay_stream_all(&store, "s").await.unwrap();
    assert_eq!(retained.len(), 10, "exactly the limit: every event stays");
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&ids[0]))
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    ids.push(append(&store, "s", &[10]).await);
    store.purge_expired().await.unwrap();
    let retained = super::oldest::replay_stream_all(&store, "s").await.unwrap();
    assert_eq!(
        retained.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids[1..],
        "one byte over the limit: the oldest event goes, and only it"
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&ids[0]))
            .await
            .unwrap(),
        None
    );
    assert_eq!(replay_data(&store, &ids[0]).await.len(), 10);
    h.close(store).await;
}

/// C8: the newest event stays even when it alone exceeds the byte limit, so
/// a stream always has something to resume from until it ages out.
pub async fn newest_event_survives_the_byte_limit<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(100)))
        .await;
    let first = append(&store, "s", &[1; 50]).await;
    let big = append(&store, "s", &[2; 500]).await;
    store.purge_expired().await.unwrap();
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&big))
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    assert!(replay_data(&store, &big).await.is_empty());
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&first))
            .await
            .unwrap(),
        None
    );
    h.close(store).await;
}

/// C8: `delete_stream` removes one stream's events and nothing else.
pub async fn delete_stream_removes_only_that_stream<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let doomed = append(&store, "doomed", b"0").await;
    append(&store, "doomed", b"1").await;
    append(&store, "doomed", b"2").await;
    let kept = append(&store, "kept", b"0").await;
    append(&store, "kept", b"1").await;
    assert_eq!(store.delete_stream("doomed").await.unwrap(), 3);
    assert_unknown(&store, &text(&doomed)).await;
    assert_eq!(replay_data(&store, &kept).await, vec![b"1".to_vec()]);
    assert_eq!(store.delete_stream("doomed").await.unwrap(), 0);
    h.close(store).await;
}

/// C8: `delete_stream` removes a long stream whole, every event of it,
/// however a backend splits the work, and leaves the other streams alone.
pub async fn delete_stream_removes_a_long_stream_whole<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let long = append_n(&store, "long", "long", LONG_STREAM).await;
    let kept = append_n(&store, "kept", "kept", 2).await;
    assert_eq!(
        store.delete_stream("long").await.unwrap(),
        LONG_STREAM as u64
    );
    for id in [&long[0], &long[LONG_STREAM / 2], &long[LONG_STREAM - 1]] {
        assert_unknown(&store, &text(id)).await;
    }
    assert_eq!(store.delete_stream("long").await.unwrap(), 0);
    assert_eq!(
        replay_data(&store, &kept[0]).await,
        vec![b"kept-1".to_vec()]
    );
    let again = append(&store, "long", b"again").await;
    assert!(again.position > long[LONG_STREAM - 1].position);
    h.close(store).await;
}

/// C8: deleting a stream that never existed removes nothing.
pub async fn delete_unknown_stream_removes_nothing<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let kept = append(&store, "kept", b"0").await;
    assert_eq!(store.delete_stream("never-existed").await.unwrap(), 0);
    assert!(
        store
            .get_stream_id_for_event_id(&text(&kept))
            .await
            .unwrap()
            .is_some()
    );
    h.close(store).await;
}

/// C8: a purge with nothing expired removes nothing.
pub async fn purge_with_nothing_expired_removes_nothing<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::default()))
        .await;
    let first = append(&store, "s", b"0").await;
    append(&store, "s", b"1").await;
    store
        .put_session("sess", b"state", Duration::from_secs(600))
        .await
        .unwrap();
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report, mcp_event_store_core::PurgeReport::default());
    assert_eq!(replay_data(&store, &first).await, vec![b"1".to_vec()]);
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_retention {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            handle_reports_its_retention,
            retention_by_age,
            stream_expires_entirely_by_age,
            retention_by_count,
            age_limit_after_count_trims,
            retention_by_bytes,
            byte_limit_is_exact_when_first_crossed,
            newest_event_survives_the_byte_limit,
            delete_stream_removes_only_that_stream,
            delete_stream_removes_a_long_stream_whole,
            delete_unknown_stream_removes_nothing,
            purge_with_nothing_expired_removes_nothing
        );
    };
}
