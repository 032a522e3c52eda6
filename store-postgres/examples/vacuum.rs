//! Measures what `Vacuum::Auto` does for disk space, and what a vacuum of
//! the store's tables costs appends meanwhile.
//!
//! ```text
//! cargo run --release -p mcp-event-store-postgres --example vacuum -- growth
//! cargo run --release -p mcp-event-store-postgres --example vacuum -- appends-during-vacuum
//! ```
//!
//! The server is the tests' (`MCP_EVENT_STORE_POSTGRES_URL`, else the local
//! default). Each run uses a schema of its own, with autovacuum disabled on
//! its tables so that only what is measured vacuums them, and drops it.
//!
//! * `growth`: 100,000 appends over 100 streams that keep 10 events each,
//!   a purge after every 1,000, once with `vacuum=off` and once with
//!   `vacuum=auto`; prints the events table's size as it goes.
//! * `appends-during-vacuum`: 32 tasks append to 32 streams; prints their
//!   throughput before, during and after a plain `VACUUM` (the statement
//!   `vacuum=auto` runs) of an events table holding 2,000,000 rows of which
//!   1,000,000 were just deleted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::{EventStore, NewEvent, Retention, StoreOptions};
use mcp_event_store_postgres::testing::{PostgresHarness, server_url};
use mcp_event_store_postgres::{PostgresStore, Vacuum};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    println!("server: {}", server_url().await);
    match what.as_str() {
        "growth" => {
            for vacuum in [Vacuum::Off, Vacuum::Auto] {
                growth(vacuum).await;
            }
        }
        "appends-during-vacuum" => appends_during_vacuum().await,
        _ => eprintln!("usage: vacuum growth | appends-during-vacuum"),
    }
}

async fn admin(h: &PostgresHarness) -> PgConnection {
    PgConnection::connect(h.url())
        .await
        .expect("admin connection")
}

async fn run(conn: &mut PgConnection, h: &PostgresHarness, statement: &str) {
    let statement = statement.replace("{s}", &format!("\"{}\"", h.schema()));
    sqlx::query(AssertSqlSafe(statement))
        .execute(conn)
        .await
        .unwrap();
}

/// Opens a store on a fresh schema whose tables autovacuum leaves alone.
async fn store(h: &PostgresHarness, store: StoreOptions, vacuum: Vacuum) -> PostgresStore {
    let first = h.open_with(h.options(StoreOptions::default())).await;
    first.close().await;
    let mut conn = admin(h).await;
    for table in ["events", "streams", "sessions"] {
        run(
            &mut conn,
            h,
            &format!(
                "ALTER TABLE {{s}}.{table} SET \
                 (autovacuum_enabled = false, toast.autovacuum_enabled = false)"
            ),
        )
        .await;
    }
    h.open_with(h.options(store).vacuum(vacuum).max_connections(16))
        .await
}

/// The events table's heap, the same with its index and TOAST table, and
/// the streams table with its index, in MiB.
async fn sizes(h: &PostgresHarness) -> (f64, f64, f64) {
    let mut conn = admin(h).await;
    let (heap, total, streams): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT pg_relation_size('\"{0}\".events'), pg_total_relation_size('\"{0}\".events'), \
                pg_total_relation_size('\"{0}\".streams')",
        h.schema()
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let mib = |bytes: i64| bytes as f64 / (1 << 20) as f64;
    (mib(heap), mib(total), mib(streams))
}

async fn growth(vacuum: Vacuum) {
    const APPENDS: usize = 100_000;
    const STREAMS: usize = 100;
    const PURGE_EVERY: usize = 1_000;
    let h = PostgresHarness::new().await;
    let store = Arc::new(
        store(
            &h,
            StoreOptions::default().retention(Retention::unbounded().max_events_per_stream(10)),
            vacuum,
        )
        .await,
    );
    let start = Instant::now();
    println!("{vacuum:?}: appends, MiB of: events heap, events heap+index+toast, streams");
    for round in 0..APPENDS / PURGE_EVERY {
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..16 {
            let store = store.clone();
            tasks.spawn(async move {
                for i in (task..PURGE_EVERY).step_by(16) {
                    let stream = format!("s-{}", i % STREAMS);
                    store
                        .store_event(&stream, NewEvent::new(format!("{round}-{i}").as_bytes()))
                        .await
                        .unwrap();
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        store.purge_expired().await.unwrap();
        if (round + 1) % 10 == 0 {
            let (heap, total, streams) = sizes(&h).await;
            println!(
                "{vacuum:?}: {:>7} {heap:>6.2} {total:>6.2} {streams:>6.2}",
                (round + 1) * PURGE_EVERY
            );
        }
    }
    println!("{vacuum:?}: {:.1} s", start.elapsed().as_secs_f64());
    Arc::into_inner(store).unwrap().close().await;
    h.teardown().await;
}

/// Counts appends from 32 tasks until `stop`.
fn appenders(
    store: &Arc<PostgresStore>,
    count: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..32)
        .map(|t| {
            let (store, count, stop) = (store.clone(), count.clone(), stop.clone());
            tokio::spawn(async move {
                let stream = format!("hot-{t}");
                while !stop.load(Ordering::Relaxed) {
                    store
                        .store_event(&stream, NewEvent::new(b"{\"jsonrpc\":\"2.0\"}"))
                        .await
                        .unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect()
}

async fn appends_during_vacuum() {
    const ROWS: i64 = 2_000_000;
    let h = PostgresHarness::new().await;
    let store = Arc::new(store(&h, StoreOptions::default(), Vacuum::Off).await);
    // A large table with half its rows dead, written directly.
    let mut conn = admin(&h).await;
    store
        .store_event("bulk", NewEvent::new(b"seed"))
        .await
        .unwrap();
    println!("writing {ROWS} rows and deleting half of them ...");
    run(
        &mut conn,
        &h,
        &format!(
            "INSERT INTO {{s}}.events (token, seq, stored_at, cum_bytes, data) \
             SELECT token, g, last_stored_at, g * 100, convert_to(repeat('x', 100), 'UTF8') \
               FROM {{s}}.streams, generate_series(2, {ROWS}) g"
        ),
    )
    .await;
    run(
        &mut conn,
        &h,
        &format!("UPDATE {{s}}.streams SET last_seq = {ROWS}, total_bytes = {ROWS} * 100"),
    )
    .await;
    run(
        &mut conn,
        &h,
        &format!("DELETE FROM {{s}}.events WHERE seq % 2 = 0 AND seq < {ROWS}"),
    )
    .await;

    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = appenders(&store, &count, &stop);
    let rate = |from: u64, to: u64, elapsed: Duration| (to - from) as f64 / elapsed.as_secs_f64();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before_start, before_count) = (Instant::now(), count.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = rate(
        before_count,
        count.load(Ordering::Relaxed),
        before_start.elapsed(),
    );

    let (during_start, during_count) = (Instant::now(), count.load(Ordering::Relaxed));
    run(
        &mut conn,
        &h,
        "VACUUM (SKIP_LOCKED, TRUNCATE false) {s}.events, {s}.streams, {s}.sessions",
    )
    .await;
    let vacuum_took = during_start.elapsed();
    let during = rate(during_count, count.load(Ordering::Relaxed), vacuum_took);

    let (after_start, after_count) = (Instant::now(), count.load(Ordering::Relaxed));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = rate(
        after_count,
        count.load(Ordering::Relaxed),
        after_start.elapsed(),
    );
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    println!("appends/s, 32 tasks on 32 streams:");
    println!("  10 s before the vacuum: {before:>8.0}");
    println!(
        "  during the vacuum ({:.1} s): {during:>8.0}",
        vacuum_took.as_secs_f64()
    );
    println!("  10 s after the vacuum:  {after:>8.0}");
    conn.close().await.unwrap();
    Arc::into_inner(store).unwrap().close().await;
    h.teardown().await;
}
