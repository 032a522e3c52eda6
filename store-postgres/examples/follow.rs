//! Measures what following costs and how fast it is on PostgreSQL.
//!
//! ```text
//! cargo run --release -p mcp-event-store-postgres --example follow -- appends
//! cargo run --release -p mcp-event-store-postgres --example follow -- latency
//! cargo run --release -p mcp-event-store-postgres --example follow -- instances
//! ```
//!
//! The server is the tests' (`MCP_EVENT_STORE_POSTGRES_URL`, else the local
//! default). Each run uses a schema of its own and drops it.
//!
//! * `appends`: durable append throughput, one writer (one commit each)
//!   and 32 writers on 32 streams (batched), each for a few seconds, with
//!   nobody listening and then with 1,000 idle followers on another handle
//!   (which listens on the store's channel).
//! * `instances`: 8 handles (as 8 server instances would), 4 writers each
//!   on streams of their own, for a few seconds: durable commits from
//!   many connections at once, where notifying inside the append
//!   transaction would serialize them.
//! * `latency`: the time from `store_event` returning to the event reaching
//!   a follower, through the same handle and through another handle (its
//!   notification travels through the server), 1,000 samples each; prints
//!   the median and the 99th percentile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::{EventStore, FollowOptions, NewEvent, Retention, StoreOptions};
use mcp_event_store_postgres::PostgresStore;
use mcp_event_store_postgres::testing::{PostgresHarness, server_url};

const RUN: Duration = Duration::from_secs(5);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let what = std::env::args().nth(1).unwrap_or_default();
    println!("server: {}", server_url().await);
    match what.as_str() {
        "appends" => appends().await,
        "latency" => latency().await,
        "instances" => instances().await,
        _ => eprintln!("usage: follow appends | latency | instances"),
    }
}

fn options() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

async fn appends() {
    let h = PostgresHarness::new().await;
    let store = Arc::new(h.open_with(h.options(options()).max_connections(10)).await);
    println!("idle followers 0:");
    measure(&store).await;

    // 1,000 followers on another handle, each on a stream of its own that
    // nobody appends to: they wait, and their handle listens.
    let other = h.open_with(h.options(options())).await;
    let mut follows = Vec::new();
    for i in 0..1_000 {
        let id = other
            .store_event(&format!("idle-{i}"), NewEvent::new(b"x"))
            .await
            .unwrap();
        follows.push(
            other
                .follow_events_after(&id.to_string(), FollowOptions::default())
                .await
                .unwrap(),
        );
    }
    let waiting: Vec<_> = follows
        .into_iter()
        .map(|mut follow| tokio::spawn(async move { follow.events.next().await.is_some() }))
        .collect();
    println!("idle followers 1000 (another handle):");
    measure(&store).await;
    for task in waiting {
        task.abort();
    }
    other.close().await;
    Arc::into_inner(store).unwrap().close().await;
    h.teardown().await;
}

async fn measure(store: &Arc<PostgresStore>) {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RUN {
        store
            .store_event("single", NewEvent::new(&[0u8; 200]))
            .await
            .unwrap();
        n += 1;
    }
    println!(
        "  1 writer:   {:>7.0} events/s",
        n as f64 / start.elapsed().as_secs_f64()
    );

    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let writers: Vec<_> = (0..32)
        .map(|w| {
            let (store, count, stop) = (store.clone(), count.clone(), stop.clone());
            tokio::spawn(async move {
                let stream = format!("writer-{w}");
                while !stop.load(Ordering::Relaxed) {
                    store
                        .store_event(&stream, NewEvent::new(&[0u8; 200]))
                        .await
                        .unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    println!(
        "  32 writers: {:>7.0} events/s",
        count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    );
}

async fn latency() {
    let h = PostgresHarness::new().await;
    let writer = h.open(options()).await;
    let reader = h.open(options()).await;
    for (what, follower) in [("same handle", &writer), ("other handle", &reader)] {
        let start = writer
            .store_event("latency", NewEvent::new(b"start"))
            .await
            .unwrap();
        let mut follow = follower
            .follow_events_after(&start.to_string(), FollowOptions::default())
            .await
            .unwrap();
        let mut samples = Vec::with_capacity(1_000);
        for _ in 0..1_000 {
            let id = writer
                .store_event("latency", NewEvent::new(b"x"))
                .await
                .unwrap();
            let appended = Instant::now();
            let event = follow.events.next().await.unwrap().unwrap();
            samples.push(appended.elapsed());
            assert_eq!(event.id, id);
        }
        samples.sort();
        println!(
            "{what}: median {:?}, p99 {:?}",
            samples[samples.len() / 2],
            samples[samples.len() * 99 / 100]
        );
    }
    writer.close().await;
    reader.close().await;
    h.teardown().await;
}

async fn instances() {
    let h = PostgresHarness::new().await;
    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(Arc::new(
            h.open_with(h.options(options()).max_connections(4)).await,
        ));
    }
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut writers = Vec::new();
    for (i, store) in handles.iter().enumerate() {
        for w in 0..4 {
            let (store, count, stop) = (store.clone(), count.clone(), stop.clone());
            writers.push(tokio::spawn(async move {
                let stream = format!("instance-{i}-writer-{w}");
                while !stop.load(Ordering::Relaxed) {
                    store
                        .store_event(&stream, NewEvent::new(&[0u8; 200]))
                        .await
                        .unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    println!(
        "8 handles x 4 writers: {:>7.0} events/s",
        count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    );
    for store in handles {
        Arc::into_inner(store).unwrap().close().await;
    }
    h.teardown().await;
}
