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

use std::sync::Arc;
use std::time::Duration;

use common::Backend;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use mcp_event_store::{DynStore, EventStore, NewEvent, Retention, StoreOptions};
use mcp_event_store_sled::{SledOptions, SledStore};
use mcp_event_store_sqlite::{Durability as SqliteDurability, SqliteOptions, SqliteStore};
use sqlx::AssertSqlSafe;
use tokio::runtime::Runtime;

/// Concurrent writers, each on its own stream.
const WRITERS: usize = 32;
/// Appends each writer makes per iteration of a 32-writer benchmark.
const PER_WRITER: usize = 4;

/// One append, as a boxed future factory: the store, or a raw driver call.
type AppendFn = Arc<dyn Fn(usize) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

fn store_append(store: DynStore) -> AppendFn {
    let data: Arc<[u8]> = common::payload().into();
    let streams: Arc<Vec<String>> = Arc::new((0..WRITERS).map(|w| format!("writer-{w}")).collect());
    Arc::new(move |writer| {
        let (store, data, streams) = (store.clone(), data.clone(), streams.clone());
        Box::pin(async move {
            store
                .store_event(&streams[writer], NewEvent::new(&data))
                .await
                .expect("append");
        })
    })
}

/// Appends each writer makes to one stream before it moves to a new one,
/// in the Redis store cases: half the default count limit, so no stream
/// reaches it.
const REDIS_STREAM_EVENTS: u64 = 5_000;

/// As [`store_append`], but each writer moves to a new stream every
/// [`REDIS_STREAM_EVENTS`] appends. A Redis stream at its count limit
/// costs the server about four times as much per append (each append then
/// also removes the oldest event), so a run whose stream crosses the limit
/// part way measures a mix that depends on how fast the machine is.
fn store_append_below_limit(store: DynStore) -> AppendFn {
    let data: Arc<[u8]> = common::payload().into();
    let counts: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| Default::default()).collect());
    Arc::new(move |writer| {
        let (store, data, counts) = (store.clone(), data.clone(), counts.clone());
        Box::pin(async move {
            let n = counts[writer].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let stream = format!("writer-{writer}-{}", n / REDIS_STREAM_EVENTS);
            store
                .store_event(&stream, NewEvent::new(&data))
                .await
                .expect("append");
        })
    })
}

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
        match backend {
            Backend::Memory => memory(c, &rt),
            Backend::Sqlite => sqlite(c, &rt),
            Backend::Postgres => postgres(c, &rt),
            Backend::Redis => redis_backend(c, &rt),
            Backend::Sled => sled_backend(c, &rt),
        }
    }
}

fn memory(c: &mut Criterion, rt: &Runtime) {
    let mut group = group(c, "memory");
    let store: DynStore = Arc::new(mcp_event_store::MemoryStore::new());
    let f = store_append(store);
    // The raw baseline: a `BTreeMap` keyed by (stream, seq) behind a mutex.
    type RawMap = std::collections::BTreeMap<(usize, u64), Vec<u8>>;
    let raw: Arc<std::sync::Mutex<RawMap>> = Arc::default();
    let data = common::payload();
    let raw_f: AppendFn = Arc::new(move |writer| {
        let (raw, data) = (raw.clone(), data.clone());
        Box::pin(async move {
            let mut map = raw.lock().expect("raw map");
            let next = map
                .range((writer, 0)..(writer, u64::MAX))
                .next_back()
                .map_or(1, |((_, seq), _)| seq + 1);
            map.insert((writer, next), data);
        })
    });
    one_writer(&mut group, rt, "store_1_writer", &f);
    one_writer(&mut group, rt, "raw_1_writer", &raw_f);
    many_writers(&mut group, rt, "store_32_writers", &f);
    many_writers(&mut group, rt, "raw_32_writers", &raw_f);
    group.finish();
}

/// Raw SQLite appends: a plain single-row insert through a pool of one
/// connection, each insert committing by itself.
/// Raw SQLite inserts through a pool of one connection. `indexed`: into a
/// table with the store's indexes rather than a bare heap.
async fn sqlite_raw(path: &std::path::Path, full: bool, indexed: bool) -> AppendFn {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(if full {
            sqlx::sqlite::SqliteSynchronous::Full
        } else {
            sqlx::sqlite::SqliteSynchronous::Normal
        });
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .expect("raw sqlite pool");
    let table = if indexed {
        "CREATE TABLE raw_events (stream INTEGER NOT NULL, seq INTEGER NOT NULL, \
             stored_at INTEGER NOT NULL DEFAULT 0, retry_ms INTEGER, payload BLOB NOT NULL, \
             UNIQUE (stream, seq)); \
         CREATE INDEX raw_events_stored_at ON raw_events (stored_at)"
    } else {
        "CREATE TABLE raw_events \
         (stream INTEGER NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL)"
    };
    sqlx::raw_sql(table)
        .execute(&pool)
        .await
        .expect("raw table");
    let data: Arc<[u8]> = common::payload().into();
    let seqs: Arc<Vec<std::sync::atomic::AtomicI64>> =
        Arc::new((0..WRITERS).map(|_| Default::default()).collect());
    Arc::new(move |writer| {
        let (pool, data, seqs) = (pool.clone(), data.clone(), seqs.clone());
        Box::pin(async move {
            let seq = seqs[writer].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            sqlx::query("INSERT INTO raw_events (stream, seq, payload) VALUES (?1, ?2, ?3)")
                .bind(writer as i64)
                .bind(seq)
                .bind(&data[..])
                .execute(&pool)
                .await
                .expect("raw insert");
        })
    })
}

/// Direct SQLite appends (rusqlite, no async driver) on a file the store
/// made, with the writers' stream rows made by the store: `(on the calling
/// thread, behind one thread hop, behind one thread hop with group
/// commit)`. Each append is the store's own statements; the first two
/// commit each by itself.
async fn sqlite_direct(path: &std::path::Path) -> (AppendFn, AppendFn, AppendFn) {
    let store = SqliteStore::open(path).await.expect("open sqlite");
    let data = common::payload();
    let mut streams = Vec::with_capacity(WRITERS);
    for w in 0..WRITERS {
        let id = store
            .store_event(&format!("writer-{w}"), NewEvent::new(&data))
            .await
            .expect("the stream row");
        streams.push((id.token.as_bytes().to_vec(), id.position.major as i64));
    }
    store.close().await;
    let streams: Arc<Vec<(Vec<u8>, i64)>> = Arc::new(streams);
    let data: Arc<[u8]> = data.into();
    let max_events = StoreOptions::default()
        .retention
        .max_events_per_stream
        .expect("a default limit") as i64;
    let conn = Arc::new(std::sync::Mutex::new(common::sqlite::direct_connection(
        path,
    )));
    let (d_streams, d_data) = (streams.clone(), data.clone());
    let direct: AppendFn = Arc::new(move |writer| {
        let (conn, streams, data) = (conn.clone(), d_streams.clone(), d_data.clone());
        Box::pin(async move {
            let (token, incarnation) = &streams[writer];
            let conn = conn.lock().expect("the direct connection");
            common::sqlite::direct_append(
                &conn,
                token,
                *incarnation,
                &data,
                common::now_millis(),
                max_events,
            );
        })
    });
    let behind = |thread: common::sqlite::SqliteThread| -> AppendFn {
        let (thread, streams, data) = (Arc::new(thread), streams.clone(), data.clone());
        Arc::new(move |writer| {
            let (thread, streams, data) = (thread.clone(), streams.clone(), data.clone());
            Box::pin(async move {
                thread
                    .run(move |conn| {
                        let (token, incarnation) = &streams[writer];
                        common::sqlite::direct_append(
                            conn,
                            token,
                            *incarnation,
                            &data,
                            common::now_millis(),
                            max_events,
                        );
                    })
                    .await;
            })
        })
    };
    let hop = behind(common::sqlite::SqliteThread::spawn(
        common::sqlite::direct_connection(path),
    ));
    let grouped = behind(common::sqlite::SqliteThread::spawn_grouped(
        common::sqlite::direct_connection(path),
    ));
    (direct, hop, grouped)
}

fn sqlite(c: &mut Criterion, rt: &Runtime) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (process, power_loss, raw_normal, raw_indexed, raw_full, (direct, direct_hop, grouped)) =
        rt.block_on(async {
            let process = SqliteStore::open(dir.path().join("process.db"))
                .await
                .expect("open sqlite");
            let power_loss = SqliteStore::open_with(
                SqliteOptions::new(dir.path().join("power_loss.db"))
                    .durability(SqliteDurability::PowerLoss),
            )
            .await
            .expect("open sqlite");
            (
                process,
                power_loss,
                sqlite_raw(&dir.path().join("raw_normal.db"), false, false).await,
                sqlite_raw(&dir.path().join("raw_indexed.db"), false, true).await,
                sqlite_raw(&dir.path().join("raw_full.db"), true, false).await,
                sqlite_direct(&dir.path().join("direct.db")).await,
            )
        });
    let mut group = group(c, "sqlite");
    let f = store_append(Arc::new(process.clone()));
    one_writer(&mut group, rt, "store_1_writer", &f);
    one_writer(&mut group, rt, "raw_1_writer", &raw_normal);
    one_writer(&mut group, rt, "direct_1_writer", &direct);
    one_writer(&mut group, rt, "direct_hop_1_writer", &direct_hop);
    many_writers(&mut group, rt, "store_32_writers", &f);
    many_writers(&mut group, rt, "raw_32_writers", &raw_normal);
    many_writers(&mut group, rt, "direct_hop_32_writers", &direct_hop);
    many_writers(&mut group, rt, "direct_grouped_32_writers", &grouped);
    many_writers(&mut group, rt, "raw_indexed_32_writers", &raw_indexed);
    let f = store_append(Arc::new(power_loss.clone()));
    group.sample_size(10);
    one_writer(&mut group, rt, "store_power_loss_1_writer", &f);
    one_writer(&mut group, rt, "raw_full_1_writer", &raw_full);
    many_writers(&mut group, rt, "store_power_loss_32_writers", &f);
    many_writers(&mut group, rt, "raw_full_32_writers", &raw_full);
    group.finish();
    rt.block_on(async {
        process.close().await;
        power_loss.close().await;
    });
}

fn postgres(c: &mut Criterion, rt: &Runtime) {
    let (url, schema, store, raw) = rt.block_on(async {
        // 32 connections: each raw writer commits its own insert.
        let common::postgres::AppendSetup {
            url,
            schema,
            store,
            pool,
            insert: sql,
        } = common::postgres::append_setup(WRITERS as u32).await;
        let data: Arc<[u8]> = common::payload().into();
        let raw: AppendFn = Arc::new(move |writer| {
            let (pool, sql, data) = (pool.clone(), sql.clone(), data.clone());
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(format!("writer-{writer}").into_bytes())
                    .bind(&data[..])
                    .execute(&pool)
                    .await
                    .expect("raw insert");
            })
        });
        (url, schema, store, raw)
    });
    let mut group = group(c, "postgres");
    let f = store_append(Arc::new(store.clone()));
    one_writer(&mut group, rt, "store_1_writer", &f);
    one_writer(&mut group, rt, "raw_1_writer", &raw);
    many_writers(&mut group, rt, "store_32_writers", &f);
    many_writers(&mut group, rt, "raw_32_writers", &raw);
    group.finish();
    rt.block_on(async {
        store.close().await;
        mcp_event_store_postgres::testing::drop_schema(&url, &schema)
            .await
            .expect("drop the bench schema");
    });
}

/// The stream the Redis `store_1_writer_at_cap` case appends to.
const AT_CAP_STREAM: &str = "at-cap";

fn redis_backend(c: &mut Criterion, rt: &Runtime) {
    let (store, raw, lua, raw_maxlen) = rt.block_on(async {
        let (store, conn, prefix) = common::redis::store_and_raw().await;
        // Under the store's prefix, so `destroy` removes them too.
        let keys: Arc<Vec<String>> =
            Arc::new((0..WRITERS).map(|w| format!("{prefix}:raw:{w}")).collect());
        let data: Arc<[u8]> = common::payload().into();
        let (raw_conn, raw_keys, raw_data) = (conn.clone(), keys.clone(), data.clone());
        let raw: AppendFn = Arc::new(move |writer| {
            let (mut conn, keys, data) = (raw_conn.clone(), raw_keys.clone(), raw_data.clone());
            Box::pin(async move {
                let _: String = redis::cmd("XADD")
                    .arg(&keys[writer])
                    .arg("*")
                    .arg("d")
                    .arg(&data[..])
                    .query_async(&mut conn)
                    .await
                    .expect("raw XADD");
            })
        });
        // The floor of any script-based append: `EVALSHA` of a one-line
        // script that only does the `XADD`.
        let script = Arc::new(redis::Script::new(common::redis::XADD_SCRIPT));
        let (lua_conn, lua_keys, lua_data) = (conn.clone(), keys.clone(), data.clone());
        let lua: AppendFn = Arc::new(move |writer| {
            let (mut conn, keys, data, script) = (
                lua_conn.clone(),
                lua_keys.clone(),
                lua_data.clone(),
                script.clone(),
            );
            Box::pin(async move {
                let _: String = script
                    .key(&keys[writer])
                    .arg(&data[..])
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA XADD");
            })
        });
        // Both streams of the `_at_cap` cases start at the count limit.
        let limit = Retention::default()
            .max_events_per_stream
            .expect("a default count limit");
        for _ in 0..limit {
            store
                .store_event(AT_CAP_STREAM, NewEvent::new(&data))
                .await
                .expect("fill the stream at the limit");
        }
        let maxlen_key = Arc::new(format!("{prefix}:raw:maxlen"));
        for _ in 0..limit / 1_000 {
            let mut fill = redis::pipe();
            for _ in 0..1_000 {
                fill.cmd("XADD")
                    .arg(maxlen_key.as_str())
                    .arg("*")
                    .arg("d")
                    .arg(&data[..])
                    .ignore();
            }
            let () = fill
                .query_async(&mut conn.clone())
                .await
                .expect("fill the raw stream");
        }
        let (maxlen_conn, maxlen_data) = (conn.clone(), data.clone());
        let raw_maxlen: AppendFn = Arc::new(move |_| {
            let (mut conn, key, data) =
                (maxlen_conn.clone(), maxlen_key.clone(), maxlen_data.clone());
            Box::pin(async move {
                let _: String = redis::cmd("XADD")
                    .arg(key.as_str())
                    .arg("MAXLEN")
                    .arg("=")
                    .arg(limit)
                    .arg("*")
                    .arg("d")
                    .arg(&data[..])
                    .query_async(&mut conn)
                    .await
                    .expect("raw XADD MAXLEN");
            })
        });
        (store, raw, lua, raw_maxlen)
    });
    let mut group = group(c, "redis");
    let f = store_append_below_limit(Arc::new(store.clone()));
    let at_cap: AppendFn = {
        let (store, data): (DynStore, Arc<[u8]>) =
            (Arc::new(store.clone()), common::payload().into());
        Arc::new(move |_| {
            let (store, data) = (store.clone(), data.clone());
            Box::pin(async move {
                store
                    .store_event(AT_CAP_STREAM, NewEvent::new(&data))
                    .await
                    .expect("append at the limit");
            })
        })
    };
    one_writer(&mut group, rt, "store_1_writer", &f);
    one_writer(&mut group, rt, "raw_1_writer", &raw);
    one_writer(&mut group, rt, "raw_lua_xadd_1_writer", &lua);
    one_writer(&mut group, rt, "store_1_writer_at_cap", &at_cap);
    one_writer(&mut group, rt, "raw_maxlen_1_writer", &raw_maxlen);
    many_writers(&mut group, rt, "store_32_writers", &f);
    many_writers(&mut group, rt, "raw_32_writers", &raw);
    many_writers(&mut group, rt, "raw_lua_xadd_32_writers", &lua);
    group.finish();
    rt.block_on(async {
        store.destroy().await.expect("remove the bench key prefix");
    });
}

/// Raw sled: insert, then `flush()`, per event, on the blocking pool.
fn sled_raw(db: sled::Db) -> AppendFn {
    let tree = db.open_tree("events").expect("raw tree");
    let data: Arc<[u8]> = common::payload().into();
    let seqs: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| Default::default()).collect());
    Arc::new(move |writer| {
        let (db, tree, data, seqs) = (db.clone(), tree.clone(), data.clone(), seqs.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let seq = seqs[writer].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut key = (writer as u64).to_be_bytes().to_vec();
                key.extend_from_slice(&seq.to_be_bytes());
                tree.insert(key, &data[..]).expect("raw insert");
                db.flush().expect("raw flush");
            })
            .await
            .expect("raw sled task");
        })
    })
}

fn sled_backend(c: &mut Criterion, rt: &Runtime) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let raw_dir = tempfile::tempdir().expect("a temporary directory");
    let store = rt.block_on(async {
        SledStore::open(dir.path(), SledOptions::default())
            .await
            .expect("open sled")
    });
    let db = sled::Config::new()
        .path(raw_dir.path())
        .cache_capacity(mcp_event_store_sled::DEFAULT_CACHE_CAPACITY)
        .open()
        .expect("raw sled");
    let raw = sled_raw(db);
    let mut group = group(c, "sled");
    let f = store_append(Arc::new(store.clone()));
    one_writer(&mut group, rt, "store_1_writer", &f);
    one_writer(&mut group, rt, "raw_flush_each_1_writer", &raw);
    many_writers(&mut group, rt, "store_32_writers", &f);
    many_writers(&mut group, rt, "raw_flush_each_32_writers", &raw);
    group.finish();
    rt.block_on(async { store.close().await.expect("close sled") });
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
