//! C15 Inspect on SQLite beyond the conformance suite: the health check
//! under both durability options, totals and listings over more streams
//! than one page, trimmed streams and rows without events. (The group
//! commit's batch metric has a test binary of its own: `batch_metric.rs`.)

use std::time::Duration;

use mcp_event_store_conformance::events::{test_clock, test_options};
use mcp_event_store_core::{
    Clock, Error, EventStore, MAX_LIST_PAGE, NewEvent, Retention, StreamCursor, StreamInfo, Verdict,
};
use mcp_event_store_sqlite::{FORMAT_VERSION, SqliteOptions, SqliteStore};
use sqlx::{Connection, SqliteConnection};

fn verdict_of<'a>(report: &'a mcp_event_store_core::HealthReport, name: &str) -> &'a Verdict {
    &report
        .settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} not reported: {report:?}"))
        .verdict
}

fn value_of<'a>(report: &'a mcp_event_store_core::HealthReport, name: &str) -> &'a str {
    &report
        .settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} not reported: {report:?}"))
        .value
}

#[tokio::test]
async fn check_warns_under_process_durability_and_is_clean_under_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");

    // The default: survives the process, not a power loss.
    let store = SqliteStore::open(&path).await.unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(report.backend, "sqlite");
    assert_eq!(i64::from(report.format_version), FORMAT_VERSION);
    assert_eq!(value_of(&report, "journal_mode"), "wal");
    assert_eq!(*verdict_of(&report, "journal_mode"), Verdict::Ok);
    assert_eq!(value_of(&report, "synchronous"), "NORMAL");
    assert_eq!(*verdict_of(&report, "synchronous"), Verdict::Ok);
    assert_eq!(value_of(&report, "durability"), "process");
    match verdict_of(&report, "durability") {
        Verdict::Warn { remedy } => assert!(remedy.contains("power_loss"), "{remedy}"),
        other => panic!("durability=process should warn: {other:?}"),
    }
    assert_eq!(*verdict_of(&report, "wal_autocheckpoint"), Verdict::Ok);
    assert!(!report.healthy(), "{report:?}");
    store.close().await;

    // The same file opened to survive power loss: a clean bill.
    let store = SqliteStore::connect(&format!(
        "sqlite://{}?durability=power_loss",
        path.display()
    ))
    .await
    .unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(value_of(&report, "synchronous"), "FULL");
    assert_eq!(value_of(&report, "durability"), "power_loss");
    assert!(report.healthy(), "{report:?}");
    store.close().await;

    // A closed store says so.
    assert!(matches!(store.check().await, Err(Error::Closed)));
}

/// Every stream of `store`, in pages of `limit`.
async fn list_all(store: &SqliteStore, limit: usize) -> (Vec<StreamInfo>, usize) {
    let mut all = Vec::new();
    let mut pages = 0;
    let mut after: Option<StreamCursor> = None;
    loop {
        let page = store.list_streams(after.as_ref(), limit).await.unwrap();
        pages += 1;
        assert!(page.streams.len() <= limit.min(MAX_LIST_PAGE));
        all.extend(page.streams);
        match page.next {
            Some(next) => after = Some(next),
            None => return (all, pages),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_and_listings_span_many_pages() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let store = SqliteStore::open_with(
        SqliteOptions::new(dir.path().join("e.db")).store(test_options(&clock)),
    )
    .await
    .unwrap();
    // More streams than one stats statement sums (512) and than one
    // listing page holds (1,000).
    const STREAMS: usize = 1_100;
    let tasks: Vec<_> = (0..STREAMS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let data = vec![b'x'; i % 7];
                store
                    .store_event(&format!("stream-{i}"), NewEvent::new(&data))
                    .await
                    .unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    let bytes: u64 = (0..STREAMS as u64).map(|i| i % 7).sum();
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.streams, stats.events, stats.bytes),
        (STREAMS as u64, STREAMS as u64, bytes),
        "{stats:?}"
    );
    let now = clock.now_millis();
    assert_eq!(
        (stats.oldest_millis, stats.newest_millis),
        (Some(now), Some(now))
    );

    // A limit above the maximum is cut to it.
    let (listed, pages) = list_all(&store, usize::MAX).await;
    assert_eq!((listed.len(), pages), (STREAMS, 2));
    let (listed, pages) = list_all(&store, 300).await;
    assert_eq!((listed.len(), pages), (STREAMS, 4));
    let mut names: Vec<&str> = listed.iter().map(|s| s.stream_id.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), STREAMS, "a stream listed twice");
    assert_eq!(listed.iter().map(|s| s.bytes).sum::<u64>(), bytes);
    store.close().await;
}

#[tokio::test]
async fn trimmed_streams_count_only_what_they_retain() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let options = test_options(&clock).retention(Retention::unbounded().max_events_per_stream(2));
    let store = SqliteStore::open_with(SqliteOptions::new(dir.path().join("e.db")).store(options))
        .await
        .unwrap();
    let mut times = Vec::new();
    for i in 0..5u8 {
        times.push(clock.now_millis());
        store
            .store_event("s", NewEvent::new(&vec![i; usize::from(i)]))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
    }
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.streams, stats.events, stats.bytes), (1, 2, 3 + 4));
    assert_eq!(
        (stats.oldest_millis, stats.newest_millis),
        (Some(times[3]), Some(times[4]))
    );
    let page = store.list_streams(None, 10).await.unwrap();
    assert_eq!(
        page.streams,
        [StreamInfo::new("s", 2, 7, Some(times[3]), Some(times[4]))]
    );
    assert_eq!(page.next, None);
    store.close().await;
}

#[tokio::test]
async fn stream_rows_without_events_are_neither_counted_nor_listed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .store_event("kept", NewEvent::new(b"abc"))
        .await
        .unwrap();
    // A row left with no event (as a writer that died between creating the
    // row and inserting its event would leave it), sorting first.
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO mes_streams (token, stream_id, incarnation, last_seq, bytes, updated_at) \
         VALUES (zeroblob(15), 'ghost', \
             (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), 0, 0, 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let stats = store.stats().await.unwrap();
    assert_eq!((stats.streams, stats.events, stats.bytes), (1, 1, 3));
    let page = store.list_streams(None, 1).await.unwrap();
    let names: Vec<&str> = page.streams.iter().map(|s| s.stream_id.as_str()).collect();
    assert_eq!(names, ["kept"]);
    assert_eq!(page.next, None);
    store.close().await;
}

#[tokio::test]
async fn a_cursor_not_of_this_store_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("e.db")).await.unwrap();
    for cursor in ["", "not a cursor", "'; DROP TABLE mes_streams; --"] {
        match store
            .list_streams(Some(&StreamCursor::new(cursor)), 10)
            .await
        {
            Err(Error::Config(_)) => {}
            other => panic!("cursor {cursor:?}: {other:?}"),
        }
    }
    store.close().await;
}
