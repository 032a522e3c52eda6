//! Scale: replay the last 100 events of one stream while the store holds
//! 1,000, 100,000 and 1,000,000 events over 1,000 streams (written
//! interleaved, as a server receives them). The cost must stay flat.
//!
//! Beside the memory store runs a reference with the replay strategy of
//! rmcp's test in-memory event store: one `Vec` of every event in the
//! store, the cursor found by a linear scan and the stream's later events
//! picked out by filtering the rest (`scale/memory/rmcp_linear_vec/<size>`).
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench scale                 # every backend
//! cargo bench -p mcp-event-store-benches --bench scale -- postgres/    # one backend
//! ```
//!
//! Benchmark ids: `scale/<backend>/store/<events in the store>`.

use mcp_event_store_benches as common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::TryStreamExt;
use mcp_event_store::MemoryStore;
use mcp_event_store_conformance::bench::{Kit, Visitor};
use tokio::runtime::Runtime;

/// The rmcp-style reference: every event of every stream in one `Vec`,
/// in arrival order.
struct LinearVecStore {
    events: Vec<LinearEvent>,
}

struct LinearEvent {
    event_id: String,
    stream_id: Arc<str>,
    data: Bytes,
}

impl LinearVecStore {
    fn build(plan: &[common::StreamPlan]) -> Self {
        let data = Bytes::from(common::payload());
        let ids: Vec<Arc<str>> = plan.iter().map(|s| s.stream_id.as_str().into()).collect();
        let mut seqs = vec![0u64; plan.len()];
        let events = common::schedule(plan)
            .into_iter()
            .map(|i| {
                let i = i as usize;
                seqs[i] += 1;
                LinearEvent {
                    event_id: format!("{}/{}", plan[i].stream_id, seqs[i]),
                    stream_id: ids[i].clone(),
                    data: data.clone(),
                }
            })
            .collect();
        Self { events }
    }

    /// Finds the cursor by scanning, then filters the rest by stream.
    fn replay_after(&self, event_id: &str) -> Vec<(String, Bytes)> {
        let Some(at) = self.events.iter().position(|e| e.event_id == event_id) else {
            return Vec::new();
        };
        let stream = &self.events[at].stream_id;
        self.events[at + 1..]
            .iter()
            .filter(|e| &e.stream_id == stream)
            .map(|e| (e.event_id.clone(), e.data.clone()))
            .collect()
    }
}

fn label(total: u64) -> String {
    match total {
        t if t >= 1_000_000 => format!("{}M", t / 1_000_000),
        t if t >= 1_000 => format!("{}k", t / 1_000),
        t => t.to_string(),
    }
}

fn scale(c: &mut Criterion) {
    let rt = common::runtime();
    let sizes: &[u64] = if common::quick() {
        &[1_000, 10_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    for backend in common::selected() {
        common::visit(
            backend,
            Scale {
                c: &mut *c,
                rt: &rt,
                sizes,
            },
        );
    }
}

/// The scale cases on one backend.
struct Scale<'a> {
    c: &'a mut Criterion,
    rt: &'a Runtime,
    sizes: &'a [u64],
}

impl Visitor for Scale<'_> {
    type Output = ();

    fn visit<K: Kit>(self) {
        const LAST: usize = 100;
        let Scale { c, rt, sizes } = self;
        let name = K::BACKEND.name;
        let mut group = c.benchmark_group(format!("scale/{name}"));
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        group.sample_size(30);
        group.throughput(Throughput::Elements(LAST as u64));
        for &size in sizes {
            let plan = common::scale_plan(size);
            let loaded = rt.block_on(K::load(&plan));
            let cursor = loaded.cursor_for_last(LAST);
            let check = rt.block_on(async {
                let replay = loaded.store.replay_events_after(&cursor).await?;
                replay.events.try_collect::<Vec<_>>().await
            });
            assert_eq!(check.expect("replay").len(), LAST, "{name} at {size}");
            let store = &loaded.store;
            group.bench_with_input(
                BenchmarkId::new("store", label(size)),
                &cursor,
                |b, cursor| {
                    b.to_async(rt).iter(|| async {
                        let replay = store.replay_events_after(cursor).await.expect("replay");
                        let events: Vec<_> = replay.events.try_collect().await.expect("events");
                        black_box(events)
                    })
                },
            );
            rt.block_on(loaded.cleanup::<K>());
            // The reference runs beside the memory store.
            if name == MemoryStore::BACKEND.name {
                let reference = LinearVecStore::build(&plan);
                let probe = &plan[plan.len() - 1];
                let cursor = format!("{}/{}", probe.stream_id, probe.len - LAST as u64);
                assert_eq!(reference.replay_after(&cursor).len(), LAST);
                group.bench_with_input(
                    BenchmarkId::new("rmcp_linear_vec", label(size)),
                    &cursor,
                    |b, cursor| b.iter(|| black_box(reference.replay_after(cursor))),
                );
            }
        }
        group.finish();
    }
}

criterion_group!(benches, scale);
criterion_main!(benches);
