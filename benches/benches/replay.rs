//! The replay hot path: replay the last K events of a 100,000-event stream
//! (K = 1, 10, 100, 1000, 10,000), per backend, beside the raw baseline: the
//! same range read done by hand with the same driver (`RawRead`, in each
//! backend crate's kit: `mcp_event_store_conformance::bench::Kit`).
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench replay              # every backend
//! cargo bench -p mcp-event-store-benches --bench replay -- sqlite/   # one backend (name filter)
//! MCP_EVENT_STORE_BENCH_BACKENDS=redis cargo bench -p mcp-event-store-benches --bench replay
//! ```
//!
//! Benchmark ids (`replay/<backend>/...`), throughput in events:
//!
//! | id | what |
//! |---|---|
//! | `store/<K>` | `replay_events_after`, every event collected |
//! | `raw/<K>` | the same range read by hand with the backend's driver (its kit's `Raw`) |
//! | memory `raw_stream/<K>` | the raw range into a `Vec`, then handed out one event at a time through a boxed stream and collected, as the `Replay` stream every store returns is: the floor of that API over an in-memory read |
//! | sled `raw_hop/<K>` | the raw read on tokio's blocking pool, as the store reads (it keeps every sled call off the executor's workers): what the thread hop alone costs |
//! | sqlite `direct/<K>` | the raw read through SQLite itself (rusqlite, no async driver) on the store's file, on the calling thread: the ceiling |
//! | sqlite `direct_checked/<K>` | as `direct`, each page read as the store must read it for its cursor and gap checks (C5): in one read transaction with the stream's row, the store's own statement: the ceiling of a store that checks |
//! | sqlite `direct_hop/<K>` | as `direct`, on a thread of its own, the caller awaiting the answer: the ceiling of any async store, which must make one hop |

use mcp_event_store_benches as common;

use std::hint::black_box;
use std::time::Duration;

use common::StreamPlan;
use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use futures_util::TryStreamExt;
use mcp_event_store::{EventId, Position};
use mcp_event_store_conformance::bench::{Kit, RawEvent, RawRead, ReadCases, Visitor};
use tokio::runtime::Runtime;

fn replay_hot_path(c: &mut Criterion) {
    let rt = common::runtime();
    let (len, ks): (u64, &[usize]) = if common::quick() {
        (10_000, &[1, 10, 100, 1_000])
    } else {
        (100_000, &[1, 10, 100, 1_000, 10_000])
    };
    let plan = [StreamPlan {
        stream_id: "replay-probe".into(),
        len,
    }];
    for backend in common::selected() {
        common::visit(
            backend,
            Replay {
                c: &mut *c,
                rt: &rt,
                plan: &plan,
                ks,
            },
        );
    }
}

/// The replay cases on one backend.
struct Replay<'a> {
    c: &'a mut Criterion,
    rt: &'a Runtime,
    plan: &'a [StreamPlan],
    ks: &'a [usize],
}

impl Visitor for Replay<'_> {
    type Output = ();

    fn visit<K: Kit>(self) {
        let Replay { c, rt, plan, ks } = self;
        let name = K::BACKEND.name;
        let loaded = rt.block_on(K::load(plan));
        let raw = rt.block_on(K::raw(&loaded.storage, loaded.token, &plan[plan.len() - 1]));
        let mut group = c.benchmark_group(format!("replay/{name}"));
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        for &k in ks {
            group.throughput(Throughput::Elements(k as u64));
            group.sample_size(if k >= 10_000 { 10 } else { 30 });
            let cursor = loaded.cursor_for_last(k);
            let after = cursor.parse::<EventId>().expect("a cursor").position;
            // Prove both sides read the same events before timing them.
            let first = rt.block_on(async {
                let events: Vec<_> = loaded
                    .store
                    .replay_events_after(&cursor)
                    .await
                    .expect("replay")
                    .events
                    .try_collect()
                    .await
                    .expect("replay events");
                let raw_events = raw.read_after(after).await;
                assert_eq!(events.len(), k, "{name} store replay of {k}");
                assert_eq!(raw_events.len(), k, "{name} raw read of {k}");
                assert_eq!(events[0].data, raw_events[0].1);
                raw_events[0].1.clone()
            });
            let store = &loaded.store;
            group.bench_with_input(BenchmarkId::new("store", k), &cursor, |b, cursor| {
                b.to_async(rt).iter(|| async {
                    let replay = store.replay_events_after(cursor).await.expect("replay");
                    let events: Vec<_> = replay.events.try_collect().await.expect("events");
                    black_box(events)
                })
            });
            group.bench_with_input(BenchmarkId::new("raw", k), &after, |b, &after| {
                b.to_async(rt)
                    .iter(|| async { black_box(raw.read_after(after).await) })
            });
            K::read_cases(
                &raw,
                &mut Cases {
                    group: &mut group,
                    rt,
                    name,
                    k,
                    after,
                    first: &first,
                },
            );
        }
        group.finish();
        drop(raw);
        rt.block_on(loaded.cleanup::<K>());
    }
}

/// A backend's further replay baselines, at one K: each checked to read
/// the same events, then timed.
struct Cases<'a, 'g> {
    group: &'a mut BenchmarkGroup<'g, WallTime>,
    rt: &'a Runtime,
    name: &'static str,
    k: usize,
    after: Position,
    /// The first event's payload, as the store and the raw read gave it.
    first: &'a bytes::Bytes,
}

impl Cases<'_, '_> {
    fn check(&self, id: &str, events: Vec<RawEvent>) {
        let (name, k) = (self.name, self.k);
        assert_eq!(events.len(), k, "{name} {id} read of {k}");
        assert_eq!(&events[0].1, self.first, "{name} {id} read of {k}");
    }
}

impl ReadCases for Cases<'_, '_> {
    fn on_thread(&mut self, id: &str, read: impl Fn(Position) -> Vec<RawEvent>) {
        self.check(id, read(self.after));
        self.group
            .bench_with_input(BenchmarkId::new(id, self.k), &self.after, |b, &after| {
                b.iter(|| black_box(read(after)))
            });
    }

    fn awaited<F: std::future::Future<Output = Vec<RawEvent>>>(
        &mut self,
        id: &str,
        read: impl Fn(Position) -> F,
    ) {
        self.check(id, self.rt.block_on(read(self.after)));
        let rt = self.rt;
        self.group
            .bench_with_input(BenchmarkId::new(id, self.k), &self.after, |b, &after| {
                b.to_async(rt)
                    .iter(|| async { black_box(read(after).await) })
            });
    }
}

// The rmcp adapter's per-event cost lives in `benches/rmcp.rs`: it is codec
// work, not a backend read.
criterion_group!(benches, replay_hot_path);
criterion_main!(benches);
