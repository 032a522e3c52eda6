//! C15 on sled beyond the shared cases: the health check with risky and
//! safe settings, listings across the store's internal batches, and
//! trimmed streams' summaries.

use std::collections::HashSet;
use std::time::Duration;

use mcp_event_store_conformance::events::test_clock;
use mcp_event_store_core::{
    Error, EventStore, HealthReport, NewEvent, Retention, StoreOptions, StreamCursor, Verdict,
};
use mcp_event_store_sled::{Durability, FORMAT_VERSION, SledOptions, SledStore};

/// The setting named `name`: its value and whether it warns.
fn setting<'a>(report: &'a HealthReport, name: &str) -> (&'a str, bool) {
    let setting = report
        .settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} in {report:?}"));
    if let Verdict::Warn { remedy } = &setting.verdict {
        assert!(!remedy.is_empty(), "{setting:?}");
    }
    (
        &setting.value,
        matches!(setting.verdict, Verdict::Warn { .. }),
    )
}

/// Durability as the check sees it: `flush` is clean; a handle with a
/// flush interval warns about itself, and every handle on the database
/// warns about it (a crash then restarts every stream) until the database
/// is closed and reopened with `flush` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_about_interval_durability_until_a_clean_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let safe = SledStore::open(dir.path(), SledOptions::default())
        .await
        .unwrap();
    let report = safe.check().await.unwrap();
    assert_eq!(report.backend, "sled");
    assert_eq!(report.format_version, FORMAT_VERSION);
    assert!(report.healthy(), "{report:?}");
    assert_eq!(setting(&report, "durability"), ("flush", false));
    assert_eq!(setting(&report, "database_durability"), ("flush", false));
    assert_eq!(
        setting(&report, "retention"),
        (
            "max_age=3600s max_events_per_stream=10000 max_bytes_per_stream=67108864",
            false
        )
    );

    let url = format!("sled://{}?flush_interval_ms=50", dir.path().display());
    let relaxed = SledStore::connect(&url).await.unwrap();
    assert_eq!(
        relaxed.durability(),
        Durability::Interval(Duration::from_millis(50))
    );
    let report = relaxed.check().await.unwrap();
    assert!(!report.healthy());
    assert_eq!(
        setting(&report, "durability"),
        ("flush_interval_ms=50", true)
    );
    assert_eq!(
        setting(&report, "database_durability"),
        ("flush_interval_ms=50", true)
    );
    // The flushing handle acknowledges durably, but shares the risk.
    let report = safe.check().await.unwrap();
    assert!(!report.healthy());
    assert_eq!(setting(&report, "durability"), ("flush", false));
    assert_eq!(
        setting(&report, "database_durability"),
        ("flush_interval_ms=50", true)
    );

    relaxed.close().await.unwrap();
    safe.close().await.unwrap();
    let reopened = SledStore::open(dir.path(), SledOptions::default())
        .await
        .unwrap();
    let report = reopened.check().await.unwrap();
    assert!(report.healthy(), "{report:?}");
    reopened.close().await.unwrap();
}

/// Without a maximum age nothing ever removes a stream: the check warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_about_retention_without_a_maximum_age() {
    let dir = tempfile::tempdir().unwrap();
    let options =
        |retention| SledOptions::default().store(StoreOptions::default().retention(retention));
    let store = SledStore::open(dir.path(), options(Retention::unbounded()))
        .await
        .unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(
        setting(&report, "retention"),
        (
            "max_age=none max_events_per_stream=none max_bytes_per_stream=none",
            true
        )
    );
    assert!(!report.healthy());
    // Per-stream limits alone do not bound how many streams there are.
    let per_stream = Retention::unbounded().max_events_per_stream(5);
    let store = store
        .handle_with_options(StoreOptions::default().retention(per_stream))
        .await
        .unwrap();
    assert!(setting(&store.check().await.unwrap(), "retention").1);
    let aged = Retention::unbounded().max_age(Duration::from_millis(1500));
    let store = store
        .handle_with_options(StoreOptions::default().retention(aged))
        .await
        .unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(
        setting(&report, "retention"),
        (
            "max_age=1.5s max_events_per_stream=none max_bytes_per_stream=none",
            false
        )
    );
    assert!(report.healthy(), "{report:?}");
    store.close().await.unwrap();
}

/// More streams than the store reads per batch: every page boundary and
/// batch boundary yields each stream once, and the totals agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_cross_batches_and_agree_with_stats() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), SledOptions::default())
        .await
        .unwrap();
    const STREAMS: usize = 600;
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..8 {
        let store = store.clone();
        tasks.spawn(async move {
            for i in (writer..STREAMS).step_by(8) {
                store
                    .store_event(&format!("s{i}"), NewEvent::new(&vec![b'x'; i % 7]))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let bytes: u64 = (0..STREAMS).map(|i| (i % 7) as u64).sum();
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.streams, stats.events, stats.bytes),
        (STREAMS as u64, STREAMS as u64, bytes)
    );

    for limit in [1_000_000, 7, 256, 599, 600] {
        let mut seen = HashSet::new();
        let mut after: Option<StreamCursor> = None;
        let mut pages = 0;
        loop {
            let page = store.list_streams(after.as_ref(), limit).await.unwrap();
            pages += 1;
            assert!(page.streams.len() <= limit.min(mcp_event_store_core::MAX_LIST_PAGE));
            for info in &page.streams {
                assert!(seen.insert(info.stream_id.clone()), "{info:?} twice");
            }
            match page.next {
                Some(next) => {
                    assert_eq!(page.streams.len(), limit.min(1_000), "a short page");
                    after = Some(next);
                }
                None => break,
            }
        }
        assert_eq!(seen.len(), STREAMS, "limit {limit}");
        // No trailing empty page: the last page is the one with the last stream.
        assert_eq!(pages, STREAMS.div_ceil(limit.min(1_000)), "limit {limit}");
    }
    for bad in ["", "not a cursor", "v1.aaaa"] {
        match store.list_streams(Some(&StreamCursor::new(bad)), 5).await {
            Err(Error::Config(_)) => {}
            other => panic!("cursor {bad:?}: {other:?}"),
        }
    }
    store.close().await.unwrap();
}

/// A stream trimmed by its count limit reports what it retains: the count,
/// the bytes and the oldest time of its remaining events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trimmed_streams_report_what_they_retain() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let retention = Retention::unbounded().max_events_per_stream(3);
    let store = SledStore::open(
        dir.path(),
        SledOptions::default().store(
            StoreOptions::default()
                .retention(retention)
                .clock(clock.clone()),
        ),
    )
    .await
    .unwrap();
    let mut times = Vec::new();
    for n in 1..=10usize {
        times.push(mcp_event_store_core::Clock::now_millis(&*clock));
        store
            .store_event("trimmed", NewEvent::new(&vec![0; n]))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
    }
    let page = store.list_streams(None, 10).await.unwrap();
    assert_eq!(page.streams.len(), 1);
    let info = &page.streams[0];
    assert_eq!((info.events, info.bytes), (3, 8 + 9 + 10), "{info:?}");
    assert_eq!(info.oldest_millis, Some(times[7]));
    assert_eq!(info.newest_millis, Some(times[9]));
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.streams, stats.events, stats.bytes), (1, 3, 27));
    assert_eq!(stats.oldest_millis, Some(times[7]));
    store.close().await.unwrap();
}
