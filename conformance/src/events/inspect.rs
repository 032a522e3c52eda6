//! C15 Inspect: totals, stream listings and the health check; and the
//! metrics every backend reports through `observe`.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;

use super::{Harness, append, open_default, recorded_metric, test_clock, test_options};
use mcp_event_store_core::{
    Clock, Error, EventStore, FollowOptions, NewEvent, StreamCursor, StreamInfo, Verdict,
};

/// C15: a fresh store holds nothing; after appends, stats count every
/// stream, event and payload byte, and the oldest and newest append times.
pub async fn stats_count_streams_events_and_bytes<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    let empty = store.stats().await.unwrap();
    assert_eq!((empty.streams, empty.events, empty.bytes), (0, 0, 0));
    assert_eq!((empty.oldest_millis, empty.newest_millis), (None, None));
    let first_at = clock.now_millis();
    append(&store, "a", b"12345").await;
    clock.advance(Duration::from_secs(10));
    append(&store, "a", b"123").await;
    append(&store, "b", b"").await;
    clock.advance(Duration::from_secs(10));
    let last_at = clock.now_millis();
    append(&store, "c", &[7u8; 100]).await;
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.streams, 3, "{stats:?}");
    assert_eq!(stats.events, 4, "{stats:?}");
    assert_eq!(stats.bytes, 108, "{stats:?}");
    assert_eq!(stats.oldest_millis, Some(first_at), "{stats:?}");
    assert_eq!(stats.newest_millis, Some(last_at), "{stats:?}");
    h.close(store).await;
}

/// Pages through every stream with `limit`, checking the pages' bounds.
async fn list_all<S: EventStore + ?Sized>(store: &S, limit: usize) -> Vec<StreamInfo> {
    let mut all = Vec::new();
    let mut after: Option<StreamCursor> = None;
    for _ in 0..10_000 {
        let page = store
            .list_streams(after.as_ref(), limit)
            .await
            .unwrap_or_else(|e| panic!("list_streams after {after:?}: {e}"));
        assert!(page.streams.len() <= limit, "a page over its limit");
        all.extend(page.streams);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
    panic!("the listing never ended");
}

/// C15: a listing in pages of 10 yields each of 25 streams exactly once,
/// with its event count and bytes.
pub async fn list_streams_pages_through_every_stream_once<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut expected = HashMap::new();
    for i in 0..25u64 {
        let stream = format!("stream-{i}");
        for _ in 0..=i % 3 {
            append(&store, &stream, &[1u8; 10]).await;
        }
        expected.insert(stream, (i % 3 + 1, (i % 3 + 1) * 10));
    }
    let listed = list_all(&store, 10).await;
    assert_eq!(listed.len(), 25, "{listed:?}");
    for info in &listed {
        let Some((events, bytes)) = expected.remove(&info.stream_id) else {
            panic!("{:?} listed twice or never appended", info.stream_id);
        };
        assert_eq!((info.events, info.bytes), (events, bytes), "{info:?}");
        assert!(info.oldest_millis.is_some() && info.oldest_millis <= info.newest_millis);
    }
    assert!(expected.is_empty(), "never listed: {:?}", expected.keys());
    h.close(store).await;
}

/// C15: a zero limit is a configuration error, not an empty page.
pub async fn list_streams_refuses_a_zero_limit<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "s", b"x").await;
    match store.list_streams(None, 0).await {
        Err(Error::Config(_)) => {}
        other => panic!("limit 0: expected a configuration error, got {other:?}"),
    }
    h.close(store).await;
}

/// C15, C8: a deleted stream leaves the totals and the listing.
pub async fn deleted_streams_leave_stats_and_listing<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "kept", b"abc").await;
    append(&store, "deleted", b"abcdef").await;
    append(&store, "deleted", b"g").await;
    store.delete_stream("deleted").await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.streams, stats.events, stats.bytes),
        (1, 1, 3),
        "{stats:?}"
    );
    let listed = list_all(&store, 5).await;
    let names: Vec<&str> = listed.iter().map(|s| s.stream_id.as_str()).collect();
    assert_eq!(names, ["kept"]);
    h.close(store).await;
}

/// C15: the health check names the backend and its format, and every
/// setting it reports has a value and, when risky, a remedy.
pub async fn check_reports_backend_format_and_settings<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let report = store.check().await.unwrap();
    assert!(!report.backend.is_empty());
    assert!(report.format_version >= 1, "{report:?}");
    assert!(
        !report.settings.is_empty(),
        "no settings reported: {report:?}"
    );
    for setting in &report.settings {
        assert!(
            !setting.name.is_empty() && !setting.value.is_empty(),
            "{setting:?}"
        );
        if let Verdict::Warn { remedy } = &setting.verdict {
            assert!(
                !remedy.is_empty(),
                "a warning without a remedy: {setting:?}"
            );
        }
    }
    assert_eq!(
        report.healthy(),
        report.settings.iter().all(|s| s.verdict == Verdict::Ok)
    );
    h.close(store).await;
}

/// The metrics of `observe`, labelled with the backend the health check
/// names: appends (and failed ones, by kind), replays and the events they
/// yield, refused replays, open follows, purges. Other cases of the same
/// backend run in the same process, so counts are checked as lower bounds.
pub async fn operations_are_counted_in_metrics<H: Harness>(h: &H) {
    super::install_test_recorder();
    let clock = test_clock();
    let store = h.open(test_options(&clock).max_payload_bytes(64)).await;
    let backend = store.check().await.unwrap().backend;
    let b = [("backend", backend)];
    let count = |name: &str, extra: &[(&str, &str)]| {
        let mut labels = b.to_vec();
        labels.extend_from_slice(extra);
        recorded_metric(name, &labels)
    };
    use mcp_event_store_core::observe::names::*;
    let appends = count(APPENDS_TOTAL, &[("outcome", "ok")]);
    let too_large = count(
        ERRORS_TOTAL,
        &[("operation", "append"), ("kind", "payload_too_large")],
    );
    let replays = count(REPLAYS_TOTAL, &[("outcome", "ok")]);
    let refused = count(REPLAYS_TOTAL, &[("outcome", "refused")]);
    let replayed = count(REPLAYED_EVENTS_TOTAL, &[]);
    let purges = count(PURGES_TOTAL, &[("outcome", "ok")]);
    let durations = count(APPEND_DURATION_SECONDS, &[]);

    let first = append(&store, "s", b"1").await;
    append(&store, "s", b"2").await;
    append(&store, "s", b"3").await;
    let err = store
        .store_event("s", NewEvent::new(&[0u8; 65]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err}");
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    assert_eq!(replay.events.collect::<Vec<_>>().await.len(), 2);
    assert!(store.replay_events_after("garbage").await.is_err());
    store.purge_expired().await.unwrap();
    let follow = store
        .follow_events_after(&first.to_string(), FollowOptions::default())
        .await
        .unwrap();
    let active = count(FOLLOWS_ACTIVE, &[]);
    drop(follow);

    assert!(
        count(APPENDS_TOTAL, &[("outcome", "ok")]) >= appends + 3.0,
        "appends"
    );
    assert!(
        count(
            ERRORS_TOTAL,
            &[("operation", "append"), ("kind", "payload_too_large")]
        ) >= too_large + 1.0,
        "a failed append by kind"
    );
    assert!(
        count(APPEND_DURATION_SECONDS, &[]) >= durations + 4.0,
        "append latencies"
    );
    assert!(
        count(REPLAYS_TOTAL, &[("outcome", "ok")]) >= replays + 1.0,
        "replays"
    );
    assert!(
        count(REPLAYS_TOTAL, &[("outcome", "refused")]) >= refused + 1.0,
        "refused"
    );
    assert!(
        count(REPLAYED_EVENTS_TOTAL, &[]) >= replayed + 2.0,
        "replayed events"
    );
    assert!(
        count(PURGES_TOTAL, &[("outcome", "ok")]) >= purges + 1.0,
        "purges"
    );
    assert!(
        active >= 1.0,
        "an open follow is counted as active ({active})"
    );
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_inspect {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            stats_count_streams_events_and_bytes,
            list_streams_pages_through_every_stream_once,
            list_streams_refuses_a_zero_limit,
            deleted_streams_leave_stats_and_listing,
            check_reports_backend_format_and_settings,
            operations_are_counted_in_metrics
        );
    };
}
