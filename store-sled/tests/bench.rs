//! A quick measurement, run by hand (it asserts nothing about time):
//!
//! ```text
//! cargo test -p mcp-event-store-sled --release --test bench -- --ignored --nocapture
//! ```
//!
//! Durable appends per second with 1 writer and with 32 writers on 32
//! streams, and replay of 100 and 10,000 events beside a raw sled range
//! scan of the same keys. Medians of several runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store_core::{EventId, EventStore, NewEvent, Position, Retention, StoreOptions};
use mcp_event_store_sled::{Durability, SledOptions, SledStore};

const PAYLOAD: usize = 200;
const RUNS: usize = 5;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn options() -> SledOptions {
    SledOptions::default().store(StoreOptions::default().retention(Retention::unbounded()))
}

async fn appends_per_second(writers: usize, per_writer: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), options()).await.unwrap();
    // Warm up: create the streams.
    for w in 0..writers {
        store
            .store_event(&format!("stream-{w}"), NewEvent::new(&[0; PAYLOAD]))
            .await
            .unwrap();
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let stream = format!("stream-{w}");
                for _ in 0..per_writer {
                    store
                        .store_event(&stream, NewEvent::new(&[7; PAYLOAD]))
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
    store.close().await.unwrap();
    rate
}

/// sled by hand: insert then `flush()` per event, one thread.
fn raw_flush_each_per_second(events: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let tree = db.open_tree("events").unwrap();
    let start = Instant::now();
    for i in 0..events as u64 {
        tree.insert(i.to_be_bytes(), &[7u8; PAYLOAD][..]).unwrap();
        db.flush().unwrap();
    }
    events as f64 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run by hand with --release --ignored --nocapture"]
async fn measure() {
    let mut one = Vec::new();
    let mut many = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..RUNS {
        one.push(appends_per_second(1, 1_000).await);
        many.push(appends_per_second(32, 300).await);
        raw.push(
            tokio::task::spawn_blocking(|| raw_flush_each_per_second(1_000))
                .await
                .unwrap(),
        );
    }
    println!(
        "durable appends, 1 writer:              median {:>8.0} events/s  runs {:?}",
        median(one.clone()),
        rounded(&one)
    );
    println!(
        "durable appends, 32 writers/32 streams: median {:>8.0} events/s  runs {:?}",
        median(many.clone()),
        rounded(&many)
    );
    println!(
        "raw sled insert + flush each, 1 thread: median {:>8.0} events/s  runs {:?}",
        median(raw.clone()),
        rounded(&raw)
    );

    replay().await;
}

fn rounded(samples: &[f64]) -> Vec<u64> {
    samples.iter().map(|s| *s as u64).collect()
}

async fn replay() {
    const STREAM_LEN: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    // Filled in interval mode (fast); replay reads are the same either way.
    let fill = options().durability(Durability::Interval(Duration::from_millis(50)));
    let store = SledStore::open(dir.path(), fill).await.unwrap();
    // Other streams around it, so the range scan has neighbours.
    for s in 0..100 {
        for _ in 0..100 {
            store
                .store_event(&format!("other-{s}"), NewEvent::new(&[1; PAYLOAD]))
                .await
                .unwrap();
        }
    }
    let mut last = None;
    for _ in 0..STREAM_LEN {
        last = Some(
            store
                .store_event("long", NewEvent::new(&[2; PAYLOAD]))
                .await
                .unwrap(),
        );
    }
    let last = last.unwrap();
    store.close().await.unwrap();
    let store = SledStore::open(dir.path(), options()).await.unwrap();

    // The same keys and values in a raw sled tree, for the baseline.
    let raw_dir = tempfile::tempdir().unwrap();
    let raw_db = sled::open(raw_dir.path()).unwrap();
    let raw = raw_db.open_tree("events").unwrap();
    let token = *last.token.as_bytes();
    let key = |seq: u64| [&token[..], &seq.to_be_bytes()].concat();
    for seq in 1..=STREAM_LEN {
        raw.insert(key(seq), &[2u8; 24 + PAYLOAD][..]).unwrap();
    }
    raw_db.flush().unwrap();
    let raw = Arc::new(raw);

    for (count, iterations) in [(100u64, 300), (10_000, 30)] {
        let cursor = EventId::new(last.token, Position::seq(STREAM_LEN - count)).to_string();
        let mut ours = Vec::new();
        let mut by_hand = Vec::new();
        for _ in 0..iterations {
            let start = Instant::now();
            let replay = store.replay_events_after(&cursor).await.unwrap();
            let events: Vec<_> = replay.events.try_collect().await.unwrap();
            ours.push(start.elapsed().as_secs_f64() * 1e6);
            assert_eq!(events.len() as u64, count);

            let raw = raw.clone();
            let range = key(STREAM_LEN - count + 1)..=key(STREAM_LEN);
            let start = Instant::now();
            let rows = tokio::task::spawn_blocking(move || {
                raw.range(range).collect::<Result<Vec<_>, _>>().unwrap()
            })
            .await
            .unwrap();
            by_hand.push(start.elapsed().as_secs_f64() * 1e6);
            assert_eq!(rows.len() as u64, count);
        }
        println!(
            "replay {count:>6} of a {STREAM_LEN} stream: store median {:>8.1} us, raw sled range scan (one spawn_blocking) median {:>8.1} us",
            median(ours),
            median(by_hand)
        );
    }
    store.close().await.unwrap();
}
