//! C15 on PostgreSQL: the health check judges the settings as the server
//! and the store's own connections have them (made risky, then safe), and
//! the totals and the listing read the stream rows in bounded batches,
//! across more streams than one batch holds.

use std::collections::HashSet;
use std::str::FromStr;
use std::time::Duration;

use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::{
    Clock, Error, EventStore, HealthReport, NewEvent, Retention, Setting, StoreOptions,
    StreamCursor, Verdict,
};
use mcp_event_store_postgres::testing::PostgresHarness;
use mcp_event_store_postgres::{FORMAT_VERSION, PostgresStore, Vacuum};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

fn unbounded() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

async fn admin(h: &PostgresHarness) -> PgConnection {
    PgConnection::connect(h.url())
        .await
        .expect("admin connection")
}

async fn execute(h: &PostgresHarness, statement: String) {
    let mut conn = admin(h).await;
    sqlx::query(AssertSqlSafe(statement))
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

async fn show(h: &PostgresHarness, name: &str) -> String {
    let mut conn = admin(h).await;
    let value: String = sqlx::query_scalar("SELECT current_setting($1)")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    value
}

fn setting<'a>(report: &'a HealthReport, name: &str) -> &'a Setting {
    report
        .settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no setting {name} in {report:?}"))
}

fn remedy<'a>(report: &'a HealthReport, name: &str) -> Option<&'a str> {
    match &setting(report, name).verdict {
        Verdict::Warn { remedy } => Some(remedy),
        _ => None,
    }
}

/// A store whose pooled connections run with `synchronous_commit` as given
/// (a role or database setting looks the same to the store).
async fn with_synchronous_commit(h: &PostgresHarness, value: &str) -> PostgresStore {
    let connect = PgConnectOptions::from_str(h.url())
        .unwrap()
        .options([("synchronous_commit", value)]);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_lazy_with(connect);
    PostgresStore::from_pool(pool, h.options(unbounded()))
        .await
        .unwrap()
}

/// C15: `synchronous_commit = off` on the store's connections warns, `on`
/// does not; a table with `autovacuum_enabled = false` warns (with the
/// statement that resets it) unless the store vacuums itself
/// (`vacuum=auto`), and stops warning once reset. The server-wide
/// `autovacuum` is reported as the server has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_about_risky_settings_and_not_about_safe_ones() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded()).await;
    let report = store.check().await.unwrap();
    assert_eq!(report.backend, "postgres");
    assert_eq!(i64::from(report.format_version), FORMAT_VERSION);
    let names: Vec<&str> = report.settings.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "synchronous_commit",
            "fsync",
            "full_page_writes",
            "autovacuum",
            "track_counts",
            "autovacuum_enabled",
            "vacuum",
            "retention"
        ]
    );
    for name in ["fsync", "full_page_writes", "autovacuum", "track_counts"] {
        let on = show(&h, name).await == "on";
        assert_eq!(remedy(&report, name).is_none(), on, "{report:?}");
    }
    let autovacuum_works =
        show(&h, "autovacuum").await == "on" && show(&h, "track_counts").await == "on";
    assert_eq!(remedy(&report, "autovacuum_enabled"), None, "{report:?}");
    assert_eq!(
        remedy(&report, "vacuum").is_none(),
        autovacuum_works,
        "{report:?}"
    );
    // No maximum age: nothing ever removes a stream.
    assert!(remedy(&report, "retention").is_some(), "{report:?}");

    // synchronous_commit, as the store's connections have it.
    let risky = with_synchronous_commit(&h, "off").await;
    let report = risky.check().await.unwrap();
    assert_eq!(setting(&report, "synchronous_commit").value, "off");
    let fix = remedy(&report, "synchronous_commit").expect("a warning");
    assert!(fix.contains("synchronous_commit = on"), "{fix}");
    assert!(!report.healthy());
    risky.close().await;
    let safe = with_synchronous_commit(&h, "on").await;
    let report = safe.check().await.unwrap();
    assert_eq!(setting(&report, "synchronous_commit").value, "on");
    assert_eq!(remedy(&report, "synchronous_commit"), None);
    safe.close().await;

    // A table autovacuum may not touch.
    let schema = h.schema().to_owned();
    execute(
        &h,
        format!("ALTER TABLE \"{schema}\".events SET (autovacuum_enabled = false)"),
    )
    .await;
    let report = store.check().await.unwrap();
    assert_eq!(setting(&report, "autovacuum_enabled").value, "off (events)");
    let fix = remedy(&report, "autovacuum_enabled").expect("a warning");
    assert!(
        fix.contains(&format!(
            "ALTER TABLE \"{schema}\".events RESET (autovacuum_enabled);"
        )),
        "{fix}"
    );
    assert!(remedy(&report, "vacuum").is_some(), "{report:?}");

    // The store vacuums its tables itself: nothing to warn about there.
    let auto = h
        .open_with(h.options(unbounded()).vacuum(Vacuum::Auto))
        .await;
    let report = auto.check().await.unwrap();
    for name in ["autovacuum", "track_counts", "autovacuum_enabled", "vacuum"] {
        assert_eq!(remedy(&report, name), None, "{report:?}");
    }
    assert!(setting(&report, "vacuum").value.starts_with("auto"));
    auto.close().await;

    execute(
        &h,
        format!("ALTER TABLE \"{schema}\".events RESET (autovacuum_enabled)"),
    )
    .await;
    let report = store.check().await.unwrap();
    assert_eq!(remedy(&report, "autovacuum_enabled"), None, "{report:?}");
    h.close(store).await;
    h.teardown().await;
}

/// Streams written straight into the tables, more than one `stats` batch
/// (10,000 stream rows): each has events 1 to 3 of 10 bytes, the first
/// dropped by retention (`first_seq = 2`), so 2 events and 20 bytes
/// retained; five more rows are empty (deleted, not yet purged).
const BULK: i64 = 10_050;

async fn write_bulk(h: &PostgresHarness, base: i64) {
    let s = h.schema().to_owned();
    execute(
        h,
        format!(
            "INSERT INTO \"{s}\".streams
                 (token, stream_id, incarnation, first_seq, last_seq, clean_seq, total_bytes,
                  last_stored_at)
             SELECT substring(sha256(convert_to('bulk-' || i, 'UTF8')) from 1 for 15),
                    convert_to('bulk-' || i, 'UTF8'), nextval('\"{s}\".incarnations'),
                    CASE WHEN i > {BULK} THEN 4 ELSE 2 END, 3, 1, 30, {base} + i * 10 + 3
               FROM generate_series(1, {BULK} + 5) i"
        ),
    )
    .await;
    execute(
        h,
        format!(
            "INSERT INTO \"{s}\".events (token, seq, stored_at, cum_bytes, retry_ms, data)
             SELECT substring(sha256(convert_to('bulk-' || i, 'UTF8')) from 1 for 15), seq,
                    {base} + i * 10 + seq, (seq - 1) * 10, NULL, '\\x00000000000000000000'
               FROM generate_series(1, {BULK} + 5) i, generate_series(1, 3) seq"
        ),
    )
    .await;
}

/// C15 at scale: totals over more stream rows than one batch, equal to the
/// sum of a listing in pages of 1,000 that names every stream once; a
/// stream trimmed by the count limit counts only what it retains, before
/// and after the purge removes the rows; a foreign cursor is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_and_listing_read_every_stream_row_in_batches() {
    let h = PostgresHarness::new().await;
    let clock = test_clock();
    let options = test_options(&clock).retention(Retention::unbounded().max_events_per_stream(3));
    let store = h.open(options).await;
    let base = clock.now_millis() - 1_000_000;
    write_bulk(&h, base).await;
    // Five appends of 1 to 5 bytes, the count limit keeps the last three.
    let mut third_at = 0;
    for n in 1..=5usize {
        if n == 3 {
            third_at = clock.now_millis();
        }
        store
            .store_event("live", NewEvent::new(&vec![b'x'; n]))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
    }
    let last_at = clock.now_millis() - 1_000;

    let expected_streams = BULK as u64 + 1;
    let expected_events = BULK as u64 * 2 + 3;
    let expected_bytes = BULK as u64 * 20 + 12;
    for round in ["before purge", "after purge"] {
        let stats = store.stats().await.unwrap();
        assert_eq!(stats.streams, expected_streams, "{round}: {stats:?}");
        assert_eq!(stats.events, expected_events, "{round}: {stats:?}");
        assert_eq!(stats.bytes, expected_bytes, "{round}: {stats:?}");
        assert_eq!(stats.oldest_millis, Some(base + 12), "{round}: {stats:?}");
        assert_eq!(stats.newest_millis, Some(last_at), "{round}: {stats:?}");

        let mut seen = HashSet::new();
        let (mut events, mut bytes, mut pages) = (0, 0, 0);
        let mut after: Option<StreamCursor> = None;
        loop {
            let page = store.list_streams(after.as_ref(), 1_000).await.unwrap();
            pages += 1;
            assert!(page.streams.len() <= 1_000);
            for info in page.streams {
                events += info.events;
                bytes += info.bytes;
                if info.stream_id == "live" {
                    assert_eq!((info.events, info.bytes), (3, 12), "{round}: {info:?}");
                    assert_eq!(info.oldest_millis, Some(third_at), "{round}");
                    assert_eq!(info.newest_millis, Some(last_at), "{round}");
                } else {
                    assert_eq!((info.events, info.bytes), (2, 20), "{round}: {info:?}");
                }
                assert!(seen.insert(info.stream_id), "listed twice");
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen.len() as u64, expected_streams, "{round}");
        assert_eq!(
            (events, bytes),
            (expected_events, expected_bytes),
            "{round}"
        );
        assert_eq!(pages, 11, "{round}");
        // The purge deletes the rows retention dropped, and the empty
        // streams: the totals and the listing stay as they were.
        store.purge_expired().await.unwrap();
    }

    for garbage in [
        "",
        "nope",
        "zzzzzzzzzzzzzzzzzzzzzzzz",
        "V0000000000000000000000",
    ] {
        match store
            .list_streams(Some(&StreamCursor::new(garbage)), 10)
            .await
        {
            Err(Error::Config(_)) => {}
            other => panic!("cursor {garbage:?}: {other:?}"),
        }
    }
    h.close(store).await;
    h.teardown().await;
}
