//! The append path, per backend, at the default durability: one writer,
//! and 32 concurrent writers on 32 streams, beside raw single inserts or
//! `XADD`s with the same driver. For SQLite and sled also one fsync per
//! event against group commit.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench append              # every backend
//! cargo bench -p mcp-event-store-benches --bench append -- sled/     # one backend
//! ```
//!
//! Benchmark ids (`append/<backend>/...`), throughput in events:
//!
//! | id | what |
//! |---|---|
//! | `store_1_writer` | `store_event` on one stream, one at a time |
//! | `raw_1_writer` | the raw single insert / `XADD`, one at a time |
//! | `store_32_writers` | 32 tasks, each appending to its own stream |
//! | `raw_32_writers` | 32 tasks doing raw single inserts (SQLite: through a pool of one connection; PostgreSQL: 32 connections, each committing its own insert) |
//! | sqlite `direct_1_writer` | the store's own append statements (its insert, and its trim past 10,000 events) through SQLite itself (rusqlite, no async driver) on a file the store made, on the calling thread: the ceiling |
//! | sqlite `direct_hop_1_writer` | as `direct_1_writer`, on a thread of its own that the caller awaits: the ceiling of any async store, which must make one hop |
//! | sqlite `direct_hop_32_writers` | 32 tasks sending their appends to that one thread, each committing by itself (as `raw_32_writers`, without sqlx) |
//! | sqlite `direct_grouped_32_writers` | 32 tasks sending their appends to one thread that, as the store's writer does, commits together whatever is queued when it looks (`BEGIN IMMEDIATE`, the store's statements for each, `COMMIT`): SQLite's own group commit, the ceiling of `store_32_writers` |
//! | sqlite `raw_indexed_32_writers` | as `raw_32_writers`, into a table laid out like the store's (the same columns, `UNIQUE (stream, seq)` and the `stored_at` index), so each insert does the store's index work |
//! | sqlite `raw_full_*` | raw inserts under `synchronous=FULL`: one fsync per event |
//! | sqlite `store_power_loss_*` | the store under `Durability::PowerLoss` (`synchronous=FULL`): one fsync per group commit |
//! | redis `store_*` | as above, but each writer moves to a new stream every 5,000 appends, so no stream reaches the default count limit (10,000) and every append is measured in the same state, whatever the machine's speed |
//! | redis `store_1_writer_at_cap` | `store_event` on a stream already at the count limit: each append also removes the oldest event |
//! | redis `raw_maxlen_1_writer` | raw `XADD MAXLEN = 10000` on a stream already at that length: the same removal by hand |
//! | redis `raw_lua_xadd_{1_writer,32_writers}` | `EVALSHA` of a script that only does the `XADD`: the floor of any script-based append |
//! | sled `raw_flush_each_*` | raw sled insert, then `flush()`, per event (32 writers: 32 concurrent `flush()` calls, which sled shares) |
//! | `observe/append_wrapper` | what every backend's append adds for tracing and metrics (`observe::append` around a ready future), with no subscriber and no metrics recorder installed, as in an application that installs neither |
//! | `observe/bare` | the same ready future alone: the baseline |
//! | `disk/overwrite_4k_fdatasync` | the disk's own price of durability: one 4 KiB write over the same block and `fdatasync`, in the temporary directory the SQLite and sled benches use |
//! | `disk/append_4k_fdatasync` | the same, each write growing the file (as a WAL grows) |

use mcp_event_store_benches as common;

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use mcp_event_store_conformance::bench::append::{AppendFn, PER_WRITER, WRITERS};
use mcp_event_store_conformance::bench::{Kit, Visitor};
use tokio::runtime::Runtime;

/// Times one append at a time from one writer.
fn one_writer(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, f: &AppendFn) {
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| b.to_async(rt).iter(|| f(0)));
}

/// Times `WRITERS` spawned tasks making `PER_WRITER` appends each.
fn many_writers(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, f: &AppendFn) {
    group.throughput(Throughput::Elements((WRITERS * PER_WRITER) as u64));
    group.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..WRITERS {
                let f = f.clone();
                tasks.spawn(async move {
                    for _ in 0..PER_WRITER {
                        f(w).await;
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("writer task");
            }
        })
    });
}

fn group<'a>(c: &'a mut Criterion, backend: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(format!("append/{backend}"));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    group
}

fn append(c: &mut Criterion) {
    let rt = common::runtime();
    for backend in common::selected() {
        common::visit(
            backend,
            Appends {
                c: &mut *c,
                rt: &rt,
            },
        );
    }
}

/// The append cases of one backend (its kit's), in its order.
struct Appends<'a> {
    c: &'a mut Criterion,
    rt: &'a Runtime,
}

impl Visitor for Appends<'_> {
    type Output = ();

    fn visit<K: Kit>(self) {
        let Appends { c, rt } = self;
        let bench = rt.block_on(K::append());
        let mut group = group(c, K::BACKEND.name);
        for case in &bench.cases {
            if let Some(n) = case.sample_size {
                group.sample_size(n);
            }
            if case.writers == 1 {
                one_writer(&mut group, rt, &case.id, &case.append);
            } else {
                assert_eq!(case.writers, WRITERS, "{}", case.id);
                many_writers(&mut group, rt, &case.id, &case.append);
            }
        }
        group.finish();
        drop(bench.cases);
        rt.block_on(bench.teardown);
    }
}

/// The cost of the tracing span and metrics every append goes through,
/// when the application installed neither a subscriber nor a recorder.
fn observe_overhead(c: &mut Criterion) {
    let rt = common::runtime();
    let id: mcp_event_store::EventId = "v1.0123456789abcdefghijklmn.1-1".parse().expect("an id");
    let mut group = c.benchmark_group("append/observe");
    group.throughput(Throughput::Elements(1));
    group.bench_function("bare", |b| {
        b.to_async(&rt).iter(|| async {
            std::hint::black_box(async { Ok::<_, mcp_event_store::Error>(id) }.await)
        })
    });
    group.bench_function("append_wrapper", |b| {
        b.to_async(&rt).iter(|| async {
            std::hint::black_box(
                mcp_event_store_core::backend::observe::append("bench", "stream", 200, async {
                    Ok(id)
                })
                .await,
            )
        })
    });
    group.finish();
}

/// What the disk itself charges for durability, to read the durable
/// figures against: a 4 KiB write and `fdatasync` in a file beside the
/// benches' SQLite and sled files (the temporary directory), as a WAL
/// commit or a sled flush does at the least. `overwrite_4k` writes the same
/// block each time (no metadata to journal); `append_4k` grows the file,
/// as a WAL does until it is reset (truncated every 1,024 writes).
fn disk(c: &mut Criterion) {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().expect("a temporary directory");
    let block = [0x5a_u8; 4096];
    let mut group = c.benchmark_group("append/disk");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    group.throughput(Throughput::Elements(1));
    let mut file = std::fs::File::create(dir.path().join("overwrite")).expect("a file");
    file.write_all(&block).expect("the first block");
    file.sync_all().expect("fsync");
    group.bench_function("overwrite_4k_fdatasync", |b| {
        b.iter(|| {
            file.seek(SeekFrom::Start(0)).expect("seek");
            file.write_all(&block).expect("write");
            file.sync_data().expect("fdatasync");
        })
    });
    let mut file = std::fs::File::create(dir.path().join("append")).expect("a file");
    let mut written = 0u32;
    group.bench_function("append_4k_fdatasync", |b| {
        b.iter(|| {
            if written == 1024 {
                file.set_len(0).expect("truncate");
                file.seek(SeekFrom::Start(0)).expect("seek");
                written = 0;
            }
            file.write_all(&block).expect("write");
            file.sync_data().expect("fdatasync");
            written += 1;
        })
    });
    group.finish();
}

criterion_group!(benches, append, observe_overhead, disk);
criterion_main!(benches);
