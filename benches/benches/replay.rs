//! The replay hot path: replay the last K events of a 100,000-event stream
//! (K = 1, 10, 100, 1000, 10,000), per backend, beside the raw baseline: the
//! same range read done by hand with the same driver (see `Raw` in this
//! package's library, one module per backend).
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
//! | `raw/<K>` | the same range read by hand with the backend's driver (`Raw` in this package's library) |
//! | memory `raw_stream/<K>` | the raw range into a `Vec`, then handed out one event at a time through a boxed stream and collected, as the `Replay` stream every store returns is: the floor of that API over an in-memory read |
//! | sled `raw_hop/<K>` | the raw read on tokio's blocking pool, as the store reads (it keeps every sled call off the executor's workers): what the thread hop alone costs |
//! | sqlite `direct/<K>` | the raw read through SQLite itself (rusqlite, no async driver) on the store's file, on the calling thread: the ceiling |
//! | sqlite `direct_hop/<K>` | as `direct`, on a thread of its own, the caller awaiting the answer: the ceiling of any async store, which must make one hop |

use mcp_event_store_benches as common;

use std::hint::black_box;
use std::time::Duration;

use common::{Storage, StreamPlan};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store::EventId;

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
        let loaded = rt.block_on(common::load(backend, &plan));
        let raw = rt.block_on(common::raw(&loaded, &plan));
        // SQLite's ceiling: the same read with no async driver, here and
        // behind one thread hop.
        let direct = match &loaded.storage {
            Storage::Sqlite(storage) => Some((
                common::sqlite::direct(storage, loaded.token),
                common::sqlite::SqliteThread::spawn(
                    common::sqlite::direct(storage, loaded.token).into_parts().0,
                ),
                std::sync::Arc::<[u8]>::from(&loaded.token.as_bytes()[..]),
            )),
            _ => None,
        };
        let mut group = c.benchmark_group(format!("replay/{}", backend.name()));
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        for &k in ks {
            group.throughput(Throughput::Elements(k as u64));
            group.sample_size(if k >= 10_000 { 10 } else { 30 });
            let cursor = loaded.cursor_for_last(k);
            let after = cursor.parse::<EventId>().expect("a cursor").position;
            // Prove both sides read the same events before timing them.
            rt.block_on(async {
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
                assert_eq!(events.len(), k, "{backend:?} store replay of {k}");
                assert_eq!(raw_events.len(), k, "{backend:?} raw read of {k}");
                assert_eq!(events[0].data, raw_events[0].1);
                if let Some((direct, _, _)) = &direct {
                    let direct_events = direct.read_after(after);
                    assert_eq!(direct_events.len(), k, "{backend:?} direct read of {k}");
                    assert_eq!(direct_events[0].1, raw_events[0].1);
                }
            });
            let store = &loaded.store;
            group.bench_with_input(BenchmarkId::new("store", k), &cursor, |b, cursor| {
                b.to_async(&rt).iter(|| async {
                    let replay = store.replay_events_after(cursor).await.expect("replay");
                    let events: Vec<_> = replay.events.try_collect().await.expect("events");
                    black_box(events)
                })
            });
            group.bench_with_input(BenchmarkId::new("raw", k), &after, |b, &after| {
                b.to_async(&rt)
                    .iter(|| async { black_box(raw.read_after(after).await) })
            });
            if let common::Raw::Memory(raw) = &raw {
                group.bench_with_input(BenchmarkId::new("raw_stream", k), &after, |b, &after| {
                    b.to_async(&rt).iter(|| async {
                        let page = raw.read_after(after).await;
                        let events: Vec<_> = futures_util::stream::iter(
                            page.into_iter().map(Ok::<_, mcp_event_store::Error>),
                        )
                        .boxed()
                        .try_collect()
                        .await
                        .expect("events");
                        black_box(events)
                    })
                });
            }
            if let common::Raw::Sled(raw) = &raw {
                group.bench_with_input(BenchmarkId::new("raw_hop", k), &after, |b, &after| {
                    b.to_async(&rt)
                        .iter(|| async { black_box(raw.read_after_on_blocking_pool(after).await) })
                });
            }
            if let Some((direct, thread, token)) = &direct {
                group.bench_with_input(BenchmarkId::new("direct", k), &after, |b, &after| {
                    b.iter(|| black_box(direct.read_after(after)))
                });
                group.bench_with_input(BenchmarkId::new("direct_hop", k), &after, |b, &after| {
                    b.to_async(&rt).iter(|| async {
                        let token = token.clone();
                        black_box(
                            thread
                                .run(move |conn| {
                                    common::sqlite::direct_read_after(conn, &token, after)
                                })
                                .await,
                        )
                    })
                });
            }
        }
        group.finish();
        drop(raw);
        drop(direct);
        rt.block_on(loaded.cleanup());
    }
}

// The rmcp adapter's per-event cost lives in `benches/rmcp.rs`: it is codec
// work, not a backend read.
criterion_group!(benches, replay_hot_path);
criterion_main!(benches);
