//! What sealing costs (`mcp-event-store-sealed`): appends and replays of
//! 200-byte events through the decorator, beside the same through the
//! plain store, on one handle per backend (XChaCha20-Poly1305, a random
//! nonce per event; the store opened with `headroom`).
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench sealed -- --warm-up-time 1 --measurement-time 2
//! MCP_EVENT_STORE_BENCH_BACKENDS=memory,sqlite cargo bench -p mcp-event-store-benches --bench sealed
//! ```
//!
//! Benchmark ids (`sealed/<backend>/...`):
//!
//! | id | what |
//! |---|---|
//! | `plain_append` | `store_event` of a 200-byte event through the store itself, one at a time (throughput: 1 event) |
//! | `sealed_append` | the same through the decorator: sealed, then stored (45 bytes more) |
//! | `plain_replay_100` | `replay_events_after` the first of 101 events, the 100 others collected (throughput: 100 events) |
//! | `sealed_replay_100` | the same through the decorator: every event opened |
//!
//! Criterion measures the cases one after another, so a store whose speed
//! drifts (a growing file, a group commit's luck) can make the second look
//! dearer than it is. After them, each backend's plain and sealed appends
//! (1,000 each) and replays of 100 (200 each) are timed in interleaved
//! rounds, and their medians and ratios printed (`interleaved:` lines):
//! the figures to read the decorator's cost from.
//! | `seal_only` / `open_only` | sealing and opening one 200-byte value, no store (memory's group only): the floor of the two above |

use mcp_event_store_benches as common;

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::TryStreamExt;
use mcp_event_store::{DynStore, NewEvent};
use mcp_event_store_sealed::{KEY_BYTES, KeyId, KeyRing, Sealed, headroom};

fn ring() -> KeyRing {
    KeyRing::new(KeyId(1), &[7; KEY_BYTES]).expect("a key")
}

/// Appends 101 events to `stream` and returns the first one's id.
async fn fill(store: &DynStore, stream: &str, payload: &[u8]) -> String {
    let first = store
        .store_event(stream, NewEvent::new(payload))
        .await
        .expect("append");
    for _ in 0..100 {
        store
            .store_event(stream, NewEvent::new(payload))
            .await
            .expect("append");
    }
    first.to_string()
}

async fn replay_100(store: &DynStore, after: &str) {
    let events: Vec<_> = store
        .replay_events_after(after)
        .await
        .expect("replay")
        .events
        .try_collect()
        .await
        .expect("events");
    assert_eq!(events.len(), 100);
    std::hint::black_box(events);
}

/// Plain and sealed appends, then replays of 100, in alternating rounds;
/// prints the medians (µs) and the ratios.
async fn interleaved(backend: &str, plain: &DynStore, sealed: &DynStore, payload: &[u8]) {
    let (appends, replays) = if common::quick() {
        (20, 5)
    } else {
        (1_000, 200)
    };
    let mut times: [Vec<Duration>; 4] = Default::default();
    for round in 0..appends {
        for (at, store) in [(0, plain), (1, sealed)] {
            let start = std::time::Instant::now();
            store
                .store_event(
                    &format!("pairs-{at}-{}", round / 100),
                    NewEvent::new(payload),
                )
                .await
                .expect("append");
            times[at].push(start.elapsed());
        }
    }
    let plain_after = fill(plain, "pairs-replay-plain", payload).await;
    let sealed_after = fill(sealed, "pairs-replay-sealed", payload).await;
    for _ in 0..replays {
        for (at, store, after) in [(2, plain, &plain_after), (3, sealed, &sealed_after)] {
            let start = std::time::Instant::now();
            replay_100(store, after).await;
            times[at].push(start.elapsed());
        }
    }
    let [a, b, c, d] = times.each_mut().map(|t| common::median_us(t));
    println!(
        "interleaved: {backend}: append plain {a:.1} µs, sealed {b:.1} µs ({:.2}x, +{:.1} µs); \
         replay of 100 plain {c:.1} µs, sealed {d:.1} µs ({:.2}x, +{:.2} µs per event)",
        b / a,
        b - a,
        d / c,
        (d - c) / 100.0
    );
}

fn sealed(c: &mut Criterion) {
    let rt = common::runtime();
    // The benches' progress notification (199 bytes), one byte longer in
    // its message: 200 bytes, still JSON.
    let mut payload = common::payload();
    payload.insert(payload.len() - 3, b'x');
    assert_eq!(payload.len(), 200);
    for backend in common::selected() {
        let (plain, teardown) =
            rt.block_on(common::one_handle(backend, headroom(common::unbounded())));
        let sealed: DynStore = Arc::new(Sealed::new(plain.clone(), ring()));
        let mut group = c.benchmark_group(format!("sealed/{}", backend.name));
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        group.sample_size(20);

        group.throughput(Throughput::Elements(1));
        for (id, store) in [("plain_append", &plain), ("sealed_append", &sealed)] {
            let stream = format!("append-{id}");
            group.bench_function(id, |b| {
                b.to_async(&rt).iter(|| async {
                    store
                        .store_event(&stream, NewEvent::new(&payload))
                        .await
                        .expect("append")
                })
            });
        }

        group.throughput(Throughput::Elements(100));
        for (id, store) in [("plain_replay_100", &plain), ("sealed_replay_100", &sealed)] {
            let after = rt.block_on(fill(store, &format!("replay-{id}"), &payload));
            group.bench_function(id, |b| b.to_async(&rt).iter(|| replay_100(store, &after)));
        }

        group.finish();
        rt.block_on(interleaved(backend.name, &plain, &sealed, &payload));
        drop((plain, sealed));
        rt.block_on(teardown);
    }
}

criterion_group!(benches, sealed);
criterion_main!(benches);
