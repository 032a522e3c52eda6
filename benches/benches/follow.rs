//! Following (C13): how soon a follower on one handle gets an event
//! appended through another, and what idle followers cost the append path.
//!
//! * `follow/<backend>/latency`: `store_event` returns on handle A, then the
//!   time until the event is in the hands of a follower on handle B (for
//!   memory, A and B are one handle; for sled, two handles in one process,
//!   as sled allows). Besides criterion's estimate, 1,000 single deliveries
//!   are timed and their median and 99th percentile written to
//!   `<criterion dir>/follow/<backend>/latency/percentiles.json` (printed
//!   too), for the performance report's table and chart
//!   (docs/performance.md).
//! * `follow/<backend>/append/idle_followers/{0,1000}`: appends to one
//!   stream of a store holding 1,000 other streams, with no follower, then
//!   (on fresh storage with the same streams) with a follower waiting on
//!   each of them. The 0 case is the baseline: the ratio is what idle
//!   followers cost.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench follow
//! cargo bench -p mcp-event-store-benches --bench follow -- postgres/
//! ```

use mcp_event_store_benches as common;

use std::time::{Duration, Instant};

use common::{Delivery, two_handles};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;
use mcp_event_store::{DynStore, EventId, FollowOptions, NewEvent, Replay};

async fn follow(store: &DynStore, after: &EventId) -> Replay {
    store
        .follow_events_after(&after.to_string(), FollowOptions::default())
        .await
        .expect("follow")
}

/// Appends on `writer`, then waits until `follower` yields that event.
struct Following {
    writer: DynStore,
    follower: Replay,
    data: Vec<u8>,
}

impl Delivery for Following {
    /// The time from the append's return to the delivery.
    async fn one(&mut self) -> Duration {
        let id = self
            .writer
            .store_event("followed", NewEvent::new(&self.data))
            .await
            .expect("append");
        let appended = Instant::now();
        let event = tokio::time::timeout(Duration::from_secs(30), self.follower.events.next())
            .await
            .expect("delivered within 30 s")
            .expect("the follow goes on")
            .expect("no error");
        assert_eq!(event.id, id, "the follower got another event");
        appended.elapsed()
    }
}

fn latency(c: &mut Criterion) {
    let rt = common::runtime();
    for backend in common::selected() {
        let (writer, reader, cleanup) = rt.block_on(two_handles(backend));
        let data = common::payload();
        let start = rt.block_on(async {
            writer
                .store_event("followed", NewEvent::new(&data))
                .await
                .expect("append")
        });
        let follower = rt.block_on(follow(&reader, &start));
        let mut following = Following {
            writer,
            follower,
            data,
        };
        let group = format!("follow/{}", backend.name);
        common::deliveries(c, &rt, backend, &group, &mut following);
        drop(following);
        drop(reader);
        rt.block_on(cleanup);
    }
}

fn idle_followers(c: &mut Criterion) {
    let rt = common::runtime();
    let data = common::payload();
    let idle = if common::quick() { 10 } else { 1_000 };
    for backend in common::selected() {
        let mut group = c.benchmark_group(format!("follow/{}/append", backend.name));
        group.throughput(Throughput::Elements(1));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(5));
        // Each case on fresh storage holding the same `idle` streams, so
        // the only difference is whether each has a follower waiting on it.
        for followers in [0, idle] {
            let (store, other, cleanup) = rt.block_on(two_handles(backend));
            drop(other);
            // Each idle follower is driven by a task of its own, waiting as
            // an SSE response would (with its periodic re-check).
            let tasks: Vec<tokio::task::JoinHandle<()>> = rt.block_on(async {
                let mut tasks = Vec::with_capacity(followers);
                for i in 0..idle {
                    let id = store
                        .store_event(&format!("idle-{i}"), NewEvent::new(&data))
                        .await
                        .expect("append");
                    if i < followers {
                        let mut follower = follow(&store, &id).await;
                        tasks.push(tokio::spawn(async move {
                            while let Some(event) = follower.events.next().await {
                                event.expect("an idle follower fails");
                            }
                        }));
                    }
                }
                tasks
            });
            assert_eq!(store.open_follows(), followers);
            group.bench_with_input(
                BenchmarkId::new("idle_followers", followers),
                &followers,
                |b, _| {
                    b.to_async(&rt).iter(|| async {
                        store
                            .store_event("appended", NewEvent::new(&data))
                            .await
                            .expect("append")
                    })
                },
            );
            for task in &tasks {
                task.abort();
            }
            rt.block_on(async {
                for task in tasks {
                    let _ = task.await;
                }
            });
            drop(store);
            rt.block_on(cleanup);
        }
        group.finish();
    }
}

criterion_group!(benches, latency, idle_followers);
criterion_main!(benches);
