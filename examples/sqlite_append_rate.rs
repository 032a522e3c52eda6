//! Measures SQLite durable appends per second on this machine: the store
//! with 1 writer and with 32 concurrent writers on 32 streams, beside raw
//! sqlx inserts through a pool of one connection (each committing alone).
//!
//! ```text
//! cargo run --release --example sqlite_append_rate [-- EVENTS_PER_WRITER]
//! ```
//!
//! A quick measurement for choosing settings, not a benchmark suite: each
//! figure is the median of three runs of a fixed number of appends.

use std::sync::Arc;
use std::time::Instant;

use mcp_event_store::sqlite::{Durability, SqliteOptions, SqliteStore};
use mcp_event_store::{EventStore, NewEvent};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

const PAYLOAD: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}"#;

async fn store_rate(durability: Durability, writers: usize, per_writer: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::open_with(SqliteOptions::new(dir.path().join("e.db")).durability(durability))
            .await
            .unwrap();
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let stream = format!("stream-{w}");
                for _ in 0..per_writer {
                    store
                        .store_event(&stream, NewEvent::new(PAYLOAD))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let rate = (writers * per_writer) as f64 / start.elapsed().as_secs_f64();
    store.close().await;
    rate
}

async fn raw_rate(durability: Durability, writers: usize, per_writer: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let synchronous = match durability {
        Durability::Process => sqlx::sqlite::SqliteSynchronous::Normal,
        _ => sqlx::sqlite::SqliteSynchronous::Full,
    };
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("raw.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE events (stream TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let pool = Arc::new(pool);
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let stream = format!("stream-{w}");
                for seq in 0..per_writer as i64 {
                    sqlx::query("INSERT INTO events (stream, seq, payload) VALUES (?1, ?2, ?3)")
                        .bind(&stream)
                        .bind(seq)
                        .bind(PAYLOAD)
                        .execute(&*pool)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (writers * per_writer) as f64 / start.elapsed().as_secs_f64()
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

#[tokio::main]
async fn main() {
    let total: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("EVENTS_PER_WRITER is a number"))
        .unwrap_or(3_200);
    println!("durability  writers  store ev/s  raw ev/s (pool of 1)  store/raw");
    for durability in [Durability::Process, Durability::PowerLoss] {
        for writers in [1usize, 32] {
            let per_writer = (total / writers).max(1);
            let mut store = Vec::new();
            let mut raw = Vec::new();
            for _ in 0..3 {
                store.push(store_rate(durability, writers, per_writer).await);
                raw.push(raw_rate(durability, writers, per_writer).await);
            }
            let (store, raw) = (median(store), median(raw));
            println!(
                "{:<11} {writers:>7}  {store:>10.0}  {raw:>20.0}  {:>9.2}",
                format!("{durability:?}"),
                store / raw
            );
        }
    }
}
