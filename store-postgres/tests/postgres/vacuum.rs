//! Disk space (C8): the connect-time warning when autovacuum cannot reclaim
//! the space of purged events, and `Vacuum::Auto`, under which purges
//! reclaim it themselves. Each test owns a random schema whose tables have
//! autovacuum disabled, so the server's own settings and timing never
//! decide the outcome.

use std::sync::{Arc, Mutex};

use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::{EventStore, NewEvent, Retention, StoreOptions};
use mcp_event_store_postgres::testing::PostgresHarness;
use mcp_event_store_postgres::{PostgresStore, Vacuum};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tracing::field::{Field, Visit};
use tracing::instrument::WithSubscriber;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps every event at INFO or above of this crate, with its level.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Level, String)>>>);

struct Text<'a>(&'a mut String);

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Log {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO && metadata.target().starts_with("mcp_event_store")
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = String::new();
        event.record(&mut Text(&mut text));
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), text));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Log {
    fn at(&self, level: Level) -> Vec<String> {
        let log = self.0.lock().unwrap();
        log.iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, text)| text.clone())
            .collect()
    }
}

async fn admin(h: &PostgresHarness) -> PgConnection {
    PgConnection::connect(h.url())
        .await
        .expect("admin connection")
}

async fn run(h: &PostgresHarness, statement: &str) {
    let statement = statement.replace("{s}", &format!("\"{}\"", h.schema()));
    let mut conn = admin(h).await;
    sqlx::query(AssertSqlSafe(statement))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// Creates the harness's schema and turns autovacuum off on its tables.
async fn schema_without_autovacuum(h: &PostgresHarness) {
    let store = h.open(StoreOptions::default()).await;
    h.close(store).await;
    for table in ["events", "streams", "sessions"] {
        run(
            h,
            &format!(
                "ALTER TABLE {{s}}.{table} SET \
                 (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
            ),
        )
        .await;
    }
}

/// The tests here run one at a time: `tracing` caches per call site
/// whether anyone listens, and the log-capturing test must not race the
/// other test's first, unobserved, hits of the same call sites.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Opens a store and returns what it logged while connecting.
async fn open_logged(h: &PostgresHarness, vacuum: Vacuum) -> (PostgresStore, Log) {
    let log = Log::default();
    let store =
        PostgresStore::connect_with(h.url(), h.options(StoreOptions::default()).vacuum(vacuum))
            .with_subscriber(log.clone())
            .await
            .unwrap();
    (store, log)
}

/// C8: connecting warns once, naming what to change, when the store's
/// tables have autovacuum disabled (and when the server runs without
/// autovacuum or without track_counts); under `vacuum=auto` it only
/// informs; with nothing wrong it says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_warns_when_autovacuum_cannot_reclaim_space() {
    let _serial = SERIAL.lock().await;
    let h = PostgresHarness::new().await;
    let (server_autovacuum, server_track_counts): (bool, bool) = {
        let mut conn = admin(&h).await;
        let settings = sqlx::query_as(
            "SELECT current_setting('autovacuum')::bool, current_setting('track_counts')::bool",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        settings
    };
    let server_is_fine = server_autovacuum && server_track_counts;
    let qualified = format!("\"{}\".events", h.schema());

    schema_without_autovacuum(&h).await;
    let (store, log) = open_logged(&h, Vacuum::Off).await;
    h.close(store).await;
    let warnings = log.at(Level::WARN);
    assert_eq!(warnings.len(), 1, "one warning per connect: {warnings:?}");
    let warning = &warnings[0];
    for expected in [
        "grow without bound".to_owned(),
        format!("ALTER TABLE {qualified} RESET (autovacuum_enabled)"),
        format!("ALTER TABLE {qualified} RESET (toast.autovacuum_enabled)"),
        "streams".to_owned(),
        "sessions".to_owned(),
        "Vacuum::Auto".to_owned(),
    ] {
        assert!(
            warning.contains(&expected),
            "{expected:?} missing: {warning}"
        );
    }
    assert_eq!(
        warning.contains("autovacuum is off on the server"),
        !server_autovacuum,
        "{warning}"
    );
    assert_eq!(
        warning.contains("track_counts is off"),
        !server_track_counts,
        "{warning}"
    );

    // vacuum=auto: the purges reclaim the space, so it is information.
    let (store, log) = open_logged(&h, Vacuum::Auto).await;
    h.close(store).await;
    assert!(log.at(Level::WARN).is_empty(), "{:?}", log.at(Level::WARN));
    let infos = log.at(Level::INFO);
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert!(infos[0].contains("vacuum=auto"), "{}", infos[0]);

    // Tables back to the server's defaults.
    for table in ["events", "streams", "sessions"] {
        run(
            &h,
            &format!(
                "ALTER TABLE {{s}}.{table} RESET (autovacuum_enabled, toast.autovacuum_enabled)"
            ),
        )
        .await;
    }
    let (store, log) = open_logged(&h, Vacuum::Off).await;
    h.close(store).await;
    let warnings = log.at(Level::WARN);
    if server_is_fine {
        assert!(warnings.is_empty(), "{warnings:?}");
    } else {
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(!warnings[0].contains("ALTER TABLE"), "{}", warnings[0]);
    }
    h.teardown().await;
}

const STREAMS: usize = 100;
const RETAINED: u64 = 10;
const ROUNDS: usize = 40;
const PER_ROUND: usize = 1_000;

/// The size of the events table in bytes: its heap, and its heap with its
/// index and TOAST table.
async fn events_size(h: &PostgresHarness) -> (i64, i64) {
    let mut conn = admin(h).await;
    let sizes = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT pg_relation_size('\"{0}\".events'), pg_total_relation_size('\"{0}\".events')",
        h.schema()
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    sizes
}

/// Appends `ROUNDS` rounds of `PER_ROUND` events over `STREAMS` streams
/// that keep `RETAINED` events each, purging after every round; returns
/// the table's sizes after each round.
async fn appends_and_purges(vacuum: Vacuum) -> Vec<(i64, i64)> {
    let h = PostgresHarness::new().await;
    schema_without_autovacuum(&h).await;
    let clock = test_clock();
    let store = Arc::new(
        h.open_with(
            h.options(
                test_options(&clock)
                    .retention(Retention::unbounded().max_events_per_stream(RETAINED)),
            )
            .vacuum(vacuum),
        )
        .await,
    );
    let mut sizes = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..16 {
            let store = store.clone();
            tasks.spawn(async move {
                for i in (task..PER_ROUND).step_by(16) {
                    let stream = format!("s-{}", i % STREAMS);
                    let payload = format!("{round}-{i}");
                    store
                        .store_event(&stream, NewEvent::new(payload.as_bytes()))
                        .await
                        .unwrap();
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        store.purge_expired().await.unwrap();
        sizes.push(events_size(&h).await);
    }
    h.close(Arc::into_inner(store).unwrap()).await;
    h.teardown().await;
    sizes
}

/// C8, defect 6 of issue 11: with autovacuum off, the events table grows
/// with every event appended even though only `STREAMS * RETAINED` are
/// kept; under `Vacuum::Auto` the purges vacuum it and its size levels
/// off. Sizes are pages on disk, not timings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_with_vacuum_auto_keep_the_table_from_growing() {
    let _serial = SERIAL.lock().await;
    let without = appends_and_purges(Vacuum::Off).await;
    let with = appends_and_purges(Vacuum::Auto).await;
    let mib = |bytes: i64| bytes as f64 / (1 << 20) as f64;
    for (name, sizes) in [("vacuum=off", &without), ("vacuum=auto", &with)] {
        let line: Vec<String> = sizes
            .iter()
            .step_by(5)
            .map(|(heap, total)| format!("{:.2}/{:.2}", mib(*heap), mib(*total)))
            .collect();
        eprintln!("{name}: heap/total MiB every 5 rounds: {}", line.join(" "));
    }
    // Over the last three quarters of the run, the heap without vacuum
    // keeps growing (page pruning reclaims a little, so not quite
    // linearly); under vacuum=auto it levels off. A vacuum cannot reclaim
    // rows that another session's snapshot may still see, so on a busy
    // server the level creeps by a few pages: the bound is relative to the
    // growth without vacuum, not zero.
    let quarter = ROUNDS / 4;
    let (heap_early, total_early) = with[quarter - 1];
    let (heap_end, total_end) = with[ROUNDS - 1];
    let (off_early, off_total_early) = without[quarter - 1];
    let (off_end, off_total_end) = without[ROUNDS - 1];
    let (off_growth, off_total_growth) = (off_end - off_early, off_total_end - off_total_early);
    assert!(
        off_end >= 2 * off_early,
        "without a vacuum the heap should keep growing: {off_early} bytes after round \
         {quarter}, {off_end} at the end"
    );
    assert!(
        heap_end - heap_early <= off_growth / 5,
        "the heap kept growing under vacuum=auto: {heap_early} bytes after round {quarter}, \
         {heap_end} at the end (without vacuum: {off_early} to {off_end})"
    );
    assert!(
        total_end - total_early <= off_total_growth / 5,
        "the table and its index kept growing under vacuum=auto: {total_early} bytes after \
         round {quarter}, {total_end} at the end (without vacuum: {off_total_early} to \
         {off_total_end})"
    );
}
