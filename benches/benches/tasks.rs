//! Durable tasks (issue 15), per backend at the default durability: the
//! store's `TaskStore` calls beside the same work done by hand with the raw
//! driver, and how soon a watcher on one handle sees a change made through
//! another.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench tasks              # every backend
//! cargo bench -p mcp-event-store-benches --bench tasks -- sqlite/   # one backend
//! ```
//!
//! Every backend's storage comes from its test harness (`TaskHarness`: two
//! handles on one fresh file, directory, schema or key prefix, removed at
//! the end). The tasks have an owner (a principal), a 1 h ttl and a 13-byte
//! status message, and run on an instance heartbeating for the whole run.
//! The raw baselines draw their keys as the store does (`TaskId::generate`,
//! then its digest), so both pay for the random id and its SHA-256. They
//! work on the store's own tables (SQLite, PostgreSQL: a pool of their own
//! on the same file or schema); on hashes of their own under the harness's
//! prefix (Redis); or on the same trees in a database of their own (sled,
//! which lets one process open a directory once). sled, Redis and memory
//! hold values of the size of the store's encoding of such a task.
//!
//! Benchmark ids (`tasks/<backend>/...`), throughput in tasks:
//!
//! | id | what |
//! |---|---|
//! | `create` | `TaskStore::create`: a fresh id, insert-if-absent, durable on return |
//! | `raw_create` | SQLite, PostgreSQL: the store's `INSERT … ON CONFLICT (digest) DO NOTHING` of the same row into the same table (so the same index work: primary key, `purge_at`, the partial running-instance index), through a pool of its own (SQLite: one connection, `synchronous=NORMAL` as the store; PostgreSQL: 8 connections, as the harness gives the store); Redis: `EVALSHA` of a script like the store's (`EXISTS`, `HSET v rev`, `PEXPIRE`) on a multiplexed connection; sled: `get` (absent?), the purge-index `insert`, `compare_and_swap(None → value)`, then `flush()`, on the blocking pool; memory: a `HashMap` insert-if-absent behind a mutex |
//! | `create_32_concurrent` | 32 `create` calls in flight at once |
//! | `raw_create_32_concurrent` | 32 `raw_create` in flight at once |
//! | `get` | `TaskStore::get` of one task by its id and owner |
//! | `raw_get` | one read by key: SQLite, PostgreSQL: `SELECT` of the task row's columns by digest (the store also reads the task's inputs and its instance's deadline: in one read transaction on SQLite, one statement on PostgreSQL); Redis: `HGET` of the value (the store also `GET`s the instance's deadline, a second round trip); sled: `get` of the task and of its instance; memory: a clone of the value under the mutex |
//! | `finish` | `apply(Finish::Completed)` of a small result on a working task (created untimed before) |
//! | `raw_finish` | the read and the update conditioned on `rev`: SQLite: `BEGIN IMMEDIATE`, `SELECT status, rev`, `UPDATE … WHERE digest AND rev`, `COMMIT`; PostgreSQL: the same with `SELECT … FOR UPDATE`; Redis: `HMGET v rev`, then `EVALSHA` of a compare-and-set script like the store's (`HGET rev`, `HSET`, `PEXPIRE`, `PUBLISH`; the store also reads the instance's deadline first); sled: `get`, `compare_and_swap(old → new)`, `flush()`; memory: under the mutex |
//! | postgres `raw_finish_notify` | `raw_finish` plus the `pg_notify` the store queues in the same transaction |
//! | `watch_wake` | a `watch` on handle A of a task; once it waits, `apply(SetMessage)` on handle B: the time from the start of the change until A's watch returns (the change's own cost included). sqlite: A finds B's commit through its `data_version` poll (every 50 ms by default); postgres: `NOTIFY` to A's listener; redis: `PUBLISH` to A's subscriber; memory, sled: an in-process wake-up |
//! | postgres `raw_wake` | a `pg_notify` on one connection until a `PgListener` on another has it |
//! | redis `raw_wake` | a `PUBLISH` on one connection until a `SUBSCRIBE`d connection has it |
//! | `claim` | `RuntimeStore::claim(instance, 1)` of one queued task (T17), the queue filled untimed, the claimed tasks finished untimed after each sample |
//! | `raw_claim` | SQLite, PostgreSQL: one `UPDATE … SET epoch = epoch + 1, released = FALSE, instance, rev = rev + 1 WHERE digest = (SELECT … WHERE released ORDER BY updated_at LIMIT 1 [FOR UPDATE SKIP LOCKED]) RETURNING digest` on the store's rows (the store also reads the row with its inputs and its instance, decides in Rust, and checks the claimant's liveness); Redis: one script, `SPOP` of the store's takeover set and `HINCRBY rev` of the task (the store `SSCAN`s, reads the task and its instance, then writes it conditioned on `rev`). Memory and sled: none (the store's claim is the map or tree scan itself) |
//! | `lapse_to_first_step` | on a manual clock: a task that may be taken over, created under an instance whose 1 s lease then runs out; from the lapse until another instance's `claim` returned it and its re-run's first write (`SetMessage`) did. A runtime adds its claim interval to this |
//!
//! Memory, SQLite and sled have no `raw_wake`: their wake-up is in-process
//! (SQLite across handles: a poll), with no driver mechanism to compare
//! with.

use mcp_event_store_benches as common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Backend;
use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use futures_util::StreamExt;
use futures_util::future::join_all;
use mcp_event_store::{ManualClock, StoreOptions};
use mcp_event_store_conformance::tasks::{MemoryTaskHarness, TaskHarness};
use mcp_event_store_core::backend::task::TaskMachine;
use mcp_event_store_core::backend::task::codec::{self, StoredTask};
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskId, TaskOptions, TaskRecord,
    TaskStatus, TaskStore, WorkerChange,
};
use mcp_event_store_postgres::testing::PostgresHarness;
use mcp_event_store_redis::testing::RedisHarness;
use mcp_event_store_sled::testing::SledHarness;
use mcp_event_store_sqlite::testing::SqliteHarness;
use sqlx::{AssertSqlSafe, Row};
use tokio::runtime::Runtime;

/// The tasks' ttl.
const TTL: Duration = Duration::from_secs(3600);
/// The tasks' first status message.
const MESSAGE: &str = "working on it";
/// The result a task finishes with: a small `CallToolResult`.
const RESULT: &[u8] = br#"{"content":[{"type":"text","text":"done"}],"isError":false}"#;
/// Creates in flight at once in the concurrent variant.
const CONCURRENT: usize = 32;
/// The longest a watch waits; a watch that times out fails the bench.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// The three calls measured, by the store or by hand.
trait Ops {
    /// What names one task (or row).
    type Key;
    /// Creates a working task; returns its key.
    async fn create(&self) -> Self::Key;
    /// Reads the task.
    async fn get(&self, key: &Self::Key);
    /// Finishes the working task as completed.
    async fn finish(&self, key: &Self::Key);
}

/// The store's calls on one handle.
struct StoreOps<S> {
    store: Arc<S>,
    owner: Owner,
    me: InstanceId,
}

impl<S: RuntimeStore> Ops for StoreOps<S> {
    type Key = (TaskId, String);

    async fn create(&self) -> Self::Key {
        let (id, task) = self
            .store
            .create(NewTask::new(&self.owner, self.me).ttl(TTL).message(MESSAGE))
            .await
            .expect("create");
        assert_eq!(task.status, TaskStatus::Working);
        (id, id.to_string())
    }

    async fn get(&self, (_, text): &Self::Key) {
        let task = self
            .store
            .get(text, &self.owner)
            .await
            .expect("get")
            .expect("the task is there");
        black_box(task);
    }

    async fn finish(&self, (id, _): &Self::Key) {
        let applied = self
            .store
            .apply(id, self.me, WorkerChange::Finish(Finish::Completed(RESULT)))
            .await
            .expect("finish");
        assert!(
            matches!(applied, Applied::Changed { .. }),
            "finish: {applied:?}"
        );
    }
}

/// A fresh key, drawn as the store draws one.
fn fresh_key() -> [u8; 16] {
    *TaskId::generate().expect("a task id").digest().as_bytes()
}

/// The length of the store's encoding of a fresh task like the benches'
/// (sled and Redis store this one value per task).
fn store_value_len<S>(ops: &StoreOps<S>) -> usize {
    let task = NewTask::new(&ops.owner, ops.me).ttl(TTL).message(MESSAGE);
    let record = TaskRecord::created(&task, common::now_millis(), &TaskOptions::default());
    codec::encode(&StoredTask::new(&ops.owner, *ops.me.as_bytes(), record)).len()
}

/// When a task created now expires and is purged (the default options: a
/// grace of an hour, T21).
fn lifetime(now: i64) -> (i64, i64) {
    let lifetime = TaskOptions::default().lifetime(now, Some(TTL));
    (lifetime.expires_at, lifetime.purge_at)
}

fn group<'a>(c: &'a mut Criterion, backend: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(format!("tasks/{backend}"));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    group
}

/// `create`, `get` and `finish` (and 32 creates at once) by the store,
/// each beside the same by hand.
fn crud<S: Ops, R: Ops>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    store: &S,
    raw: &R,
) {
    group.throughput(Throughput::Elements(1));
    group.bench_function("create", |b| b.to_async(rt).iter(|| store.create()));
    group.bench_function("raw_create", |b| b.to_async(rt).iter(|| raw.create()));
    group.throughput(Throughput::Elements(CONCURRENT as u64));
    group.bench_function("create_32_concurrent", |b| {
        b.to_async(rt)
            .iter(|| join_all((0..CONCURRENT).map(|_| store.create())))
    });
    group.bench_function("raw_create_32_concurrent", |b| {
        b.to_async(rt)
            .iter(|| join_all((0..CONCURRENT).map(|_| raw.create())))
    });
    group.throughput(Throughput::Elements(1));
    let (key, raw_key) = rt.block_on(async { (store.create().await, raw.create().await) });
    group.bench_function("get", |b| b.to_async(rt).iter(|| store.get(&key)));
    group.bench_function("raw_get", |b| b.to_async(rt).iter(|| raw.get(&raw_key)));
    finish(group, rt, "finish", store);
    finish(group, rt, "raw_finish", raw);
}

/// Times finishing `iters` working tasks, created (untimed) just before.
fn finish<O: Ops>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, ops: &O) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut keys = Vec::with_capacity(iters as usize);
                for _ in 0..iters {
                    keys.push(ops.create().await);
                }
                let start = Instant::now();
                for key in &keys {
                    ops.finish(key).await;
                }
                start.elapsed()
            })
        })
    });
}

/// A raw wake-up baseline, where the backend's driver has one.
enum RawWake {
    /// A `pg_notify` on the pool until the listener has it.
    Postgres {
        pool: sqlx::PgPool,
        listener: sqlx::postgres::PgListener,
        channel: String,
    },
    /// A `PUBLISH` on a multiplexed connection until a subscriber
    /// connection has it.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        messages: std::pin::Pin<Box<redis::aio::PubSubStream>>,
        channel: String,
    },
}

impl RawWake {
    async fn round_trip(&mut self, n: u64) -> Duration {
        match self {
            RawWake::Postgres {
                pool,
                listener,
                channel,
            } => {
                let payload = n.to_string();
                let start = Instant::now();
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(channel.as_str())
                    .bind(payload.as_str())
                    .execute(&*pool)
                    .await
                    .expect("raw notify");
                loop {
                    let note = tokio::time::timeout(MAX_WAIT, listener.recv())
                        .await
                        .expect("the notification within 30 s")
                        .expect("the listener goes on");
                    if note.payload() == payload {
                        return start.elapsed();
                    }
                }
            }
            RawWake::Redis {
                conn,
                messages,
                channel,
            } => {
                let payload = n.to_string();
                let start = Instant::now();
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(channel.as_str())
                    .arg(payload.as_str())
                    .query_async(conn)
                    .await
                    .expect("raw publish");
                loop {
                    let message = tokio::time::timeout(MAX_WAIT, messages.next())
                        .await
                        .expect("the message within 30 s")
                        .expect("the subscriber goes on");
                    if message.get_payload_bytes() == payload.as_bytes() {
                        return start.elapsed();
                    }
                }
            }
        }
    }

    async fn close(self) {
        match self {
            RawWake::Postgres { pool, listener, .. } => {
                drop(listener);
                pool.close().await;
            }
            RawWake::Redis { .. } => {}
        }
    }
}

/// `watch_wake`: a watch on `a`, a change on `b`; and `raw_wake`.
fn watch_wake<S: RuntimeStore>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    a: &Arc<S>,
    b: &Arc<S>,
    ops: &StoreOps<S>,
    settle: Duration,
    raw: Option<&mut RawWake>,
) {
    let (id, text) = rt.block_on(ops.create());
    let owner = ops.owner;
    let me = ops.me;
    let mut rev = rt.block_on(async {
        a.get(&text, &owner)
            .await
            .expect("get")
            .expect("the task")
            .rev
    });
    let mut step = 0u64;
    group.throughput(Throughput::Elements(1));
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.bench_function("watch_wake", |bench| {
        bench.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let watcher = {
                        let (a, text) = (a.clone(), text.clone());
                        tokio::spawn(async move { a.watch(&text, &owner, rev, MAX_WAIT).await })
                    };
                    // Untimed: the watch reads the task and waits.
                    std::thread::sleep(settle);
                    step += 1;
                    let message = format!("step {step}");
                    let start = Instant::now();
                    let applied = b
                        .apply(&id, me, WorkerChange::SetMessage(Some(&message)))
                        .await
                        .expect("set the message");
                    let seen = watcher
                        .await
                        .expect("the watch task")
                        .expect("watch")
                        .expect("the task is there");
                    total += start.elapsed();
                    let Applied::Changed { rev: changed, .. } = applied else {
                        panic!("set the message: {applied:?}");
                    };
                    assert!(
                        seen.rev >= changed,
                        "the watch returned rev {} before the change to {changed}",
                        seen.rev
                    );
                    rev = changed;
                }
                total
            })
        })
    });
    if let Some(raw) = raw {
        let mut n = 0u64;
        group.bench_function("raw_wake", |bench| {
            bench.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        n += 1;
                        total += raw.round_trip(n).await;
                    }
                    total
                })
            })
        });
    }
}

/// Two handles on the harness's storage, an instance heartbeating on them,
/// and the store's calls on the first.
async fn open<H: TaskHarness>(harness: &H) -> (Arc<H::Store>, Arc<H::Store>, StoreOps<H::Store>) {
    let a = Arc::new(harness.open(StoreOptions::default()).await);
    let b = Arc::new(harness.open(StoreOptions::default()).await);
    let me = InstanceId::generate().expect("an instance id");
    assert!(
        a.heartbeat(me, Duration::from_secs(24 * 3600))
            .await
            .expect("heartbeat")
    );
    let ops = StoreOps {
        store: a.clone(),
        owner: Owner::principal(b"bench-user").expect("a principal"),
        me,
    };
    (a, b, ops)
}

/// Closes the handles, then removes the storage.
async fn close<H: TaskHarness>(
    harness: H,
    a: Arc<H::Store>,
    b: Arc<H::Store>,
    ops: StoreOps<H::Store>,
) {
    drop(ops);
    for store in [a, b] {
        let store = Arc::into_inner(store).expect("no other owner of the handle");
        harness.close(store).await;
    }
    harness.teardown().await;
}

fn tasks(c: &mut Criterion) {
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

// ------------------------------------------------------------ memory

/// Raw memory: task-sized values in a `HashMap` behind a mutex.
struct MemoryRaw {
    map: std::sync::Mutex<std::collections::HashMap<[u8; 16], Vec<u8>>>,
    /// The length of the store's encoding of a fresh task.
    value_len: usize,
}

impl Ops for MemoryRaw {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let key = fresh_key();
        let mut value = vec![0u8; self.value_len];
        value[1..9].copy_from_slice(&1u64.to_be_bytes());
        let mut map = self.map.lock().expect("raw map");
        match map.entry(key) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(value);
            }
            std::collections::hash_map::Entry::Occupied(_) => panic!("a key drawn twice"),
        }
        key
    }

    async fn get(&self, key: &[u8; 16]) {
        let value = self.map.lock().expect("raw map").get(key).cloned();
        black_box(value.expect("the row is there"));
    }

    async fn finish(&self, key: &[u8; 16]) {
        let mut map = self.map.lock().expect("raw map");
        let value = map.get_mut(key).expect("the row is there");
        assert_eq!(value[0], 0, "the row is working");
        let rev = u64::from_be_bytes(value[1..9].try_into().expect("8 bytes"));
        value[0] = TaskStatus::Completed.as_u8();
        value[1..9].copy_from_slice(&(rev + 1).to_be_bytes());
        value.extend_from_slice(RESULT);
    }
}

fn memory(c: &mut Criterion, rt: &Runtime) {
    let harness = rt.block_on(MemoryTaskHarness::new());
    let (a, b, ops) = rt.block_on(open(&harness));
    let raw = MemoryRaw {
        map: Default::default(),
        value_len: store_value_len(&ops),
    };
    let mut group = group(c, "memory");
    crud(&mut group, rt, &ops, &raw);
    takeover(&mut group, rt, &harness, &ops, None);
    watch_wake(
        &mut group,
        rt,
        &a,
        &b,
        &ops,
        Duration::from_micros(100),
        None,
    );
    group.finish();
    rt.block_on(close(harness, a, b, ops));
}

// ------------------------------------------------------------ SQLite

/// Raw SQLite: the store's statements on its own tables, through a pool of
/// one connection on the same file.
struct SqliteRaw {
    pool: sqlx::SqlitePool,
    owner: [u8; 16],
    instance: [u8; 16],
}

impl Ops for SqliteRaw {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let key = fresh_key();
        let now = common::now_millis();
        let (expires_at, purge_at) = lifetime(now);
        let inserted = sqlx::query(
            "INSERT INTO mes_tasks (digest, owner, status, rev, message, created_at, updated_at, \
                     expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, FALSE, ?12, NULL, 0) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&key[..])
        .bind(&self.owner[..])
        .bind(0i64)
        .bind(1i64)
        .bind(MESSAGE)
        .bind(now)
        .bind(now)
        .bind(expires_at)
        .bind(purge_at)
        .bind(TTL.as_millis() as i64)
        .bind(None::<i64>)
        .bind(&self.instance[..])
        .execute(&self.pool)
        .await
        .expect("raw insert")
        .rows_affected();
        assert_eq!(inserted, 1, "a key drawn twice");
        key
    }

    async fn get(&self, key: &[u8; 16]) {
        let row = sqlx::query(
            "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                    expires_at, purge_at, poll_ms, cancel, outcome, next_seq \
             FROM mes_tasks WHERE digest = ?1",
        )
        .bind(&key[..])
        .fetch_one(&self.pool)
        .await
        .expect("raw select");
        let rev: i64 = row.try_get(3).expect("rev");
        let message: Option<String> = row.try_get(4).expect("message");
        black_box((rev, message));
    }

    async fn finish(&self, key: &[u8; 16]) {
        let mut conn = self.pool.acquire().await.expect("the raw connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("begin");
        let row = sqlx::query("SELECT status, rev FROM mes_tasks WHERE digest = ?1")
            .bind(&key[..])
            .fetch_one(&mut *conn)
            .await
            .expect("raw select");
        let (status, rev): (i64, i64) = (row.get(0), row.get(1));
        assert!(status < 2, "the row is working");
        let updated = sqlx::query(
            "UPDATE mes_tasks SET status = ?1, rev = ?2, updated_at = ?3, outcome = ?4, \
                    instance = ?5 \
             WHERE digest = ?6 AND rev = ?7",
        )
        .bind(i64::from(TaskStatus::Completed.as_u8()))
        .bind(rev + 1)
        .bind(common::now_millis())
        .bind(RESULT)
        .bind(&self.instance[..])
        .bind(&key[..])
        .bind(rev)
        .execute(&mut *conn)
        .await
        .expect("raw update")
        .rows_affected();
        assert_eq!(updated, 1, "the row changed under the write lock");
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }
}

fn sqlite(c: &mut Criterion, rt: &Runtime) {
    let harness = rt.block_on(SqliteHarness::new());
    let (a, b, ops) = rt.block_on(open(&harness));
    let raw = rt.block_on(async {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(harness.path())
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .expect("raw sqlite pool");
        SqliteRaw {
            pool,
            owner: *ops.owner.digest().expect("a principal"),
            instance: *ops.me.as_bytes(),
        }
    });
    let mut group = group(c, "sqlite");
    crud(&mut group, rt, &ops, &raw);
    let raw_claim = RawClaim::Sqlite(raw.pool.clone());
    takeover(&mut group, rt, &harness, &ops, Some(&raw_claim));
    watch_wake(&mut group, rt, &a, &b, &ops, Duration::from_millis(2), None);
    group.finish();
    rt.block_on(async {
        raw.pool.close().await;
        close(harness, a, b, ops).await;
    });
}

// ------------------------------------------------------------ PostgreSQL

/// Raw PostgreSQL: the store's statements on its own tables, through a
/// pool of its own on the same schema.
struct PostgresRaw {
    pool: sqlx::PgPool,
    owner: [u8; 16],
    instance: [u8; 16],
    insert: String,
    select: String,
    lock: String,
    update: String,
    /// The channel `raw_finish_notify` notifies on, `None` for `raw_finish`.
    notify: Option<String>,
}

impl PostgresRaw {
    fn new(pool: sqlx::PgPool, schema: &str, owner: [u8; 16], instance: [u8; 16]) -> Self {
        let s = format!("\"{schema}\"");
        PostgresRaw {
            pool,
            owner,
            instance,
            insert: format!(
                "INSERT INTO {s}.tasks (digest, owner, status, rev, message, created_at, \
                        updated_at, expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, \
                        outcome, next_seq) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, FALSE, $12, NULL, 0) \
                 ON CONFLICT (digest) DO NOTHING"
            ),
            select: format!(
                "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                        expires_at, purge_at, poll_ms, cancel, outcome, next_seq \
                 FROM {s}.tasks WHERE digest = $1"
            ),
            lock: format!("SELECT status, rev FROM {s}.tasks WHERE digest = $1 FOR UPDATE"),
            update: format!(
                "UPDATE {s}.tasks SET status = $1, rev = $2, updated_at = $3, outcome = $4, \
                        instance = $5 \
                 WHERE digest = $6 AND rev = $7"
            ),
            notify: None,
        }
    }
}

impl Ops for PostgresRaw {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let key = fresh_key();
        let now = common::now_millis();
        let (expires_at, purge_at) = lifetime(now);
        let inserted = sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(&key[..])
            .bind(&self.owner[..])
            .bind(0i16)
            .bind(1i64)
            .bind(MESSAGE.as_bytes())
            .bind(now)
            .bind(now)
            .bind(expires_at)
            .bind(purge_at)
            .bind(TTL.as_millis() as i64)
            .bind(None::<i64>)
            .bind(&self.instance[..])
            .execute(&self.pool)
            .await
            .expect("raw insert")
            .rows_affected();
        assert_eq!(inserted, 1, "a key drawn twice");
        key
    }

    async fn get(&self, key: &[u8; 16]) {
        let row = sqlx::query(AssertSqlSafe(self.select.clone()))
            .bind(&key[..])
            .fetch_one(&self.pool)
            .await
            .expect("raw select");
        let rev: i64 = row.try_get(3).expect("rev");
        let message: Option<Vec<u8>> = row.try_get(4).expect("message");
        black_box((rev, message));
    }

    async fn finish(&self, key: &[u8; 16]) {
        let mut tx = self.pool.begin().await.expect("begin");
        let row = sqlx::query(AssertSqlSafe(self.lock.clone()))
            .bind(&key[..])
            .fetch_one(&mut *tx)
            .await
            .expect("raw select for update");
        let (status, rev): (i16, i64) = (row.get(0), row.get(1));
        assert!(status < 2, "the row is working");
        let updated = sqlx::query(AssertSqlSafe(self.update.clone()))
            .bind(i16::from(TaskStatus::Completed.as_u8()))
            .bind(rev + 1)
            .bind(common::now_millis())
            .bind(RESULT)
            .bind(&self.instance[..])
            .bind(&key[..])
            .bind(rev)
            .execute(&mut *tx)
            .await
            .expect("raw update")
            .rows_affected();
        assert_eq!(updated, 1, "the row changed under its lock");
        if let Some(channel) = &self.notify {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel.as_str())
                .bind("raw")
                .execute(&mut *tx)
                .await
                .expect("raw notify");
        }
        tx.commit().await.expect("commit");
    }
}

fn postgres(c: &mut Criterion, rt: &Runtime) {
    let harness = rt.block_on(PostgresHarness::new());
    let (a, b, ops) = rt.block_on(open(&harness));
    let (mut raw, mut wake) = rt.block_on(async {
        // As many connections as the harness gives the store's pool.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .connect(harness.url())
            .await
            .expect("raw postgres pool");
        let raw = PostgresRaw::new(
            pool.clone(),
            harness.schema(),
            *ops.owner.digest().expect("a principal"),
            *ops.me.as_bytes(),
        );
        let channel = format!("{}_raw_wake", harness.schema());
        let mut listener = sqlx::postgres::PgListener::connect(harness.url())
            .await
            .expect("raw listener");
        listener.listen(&channel).await.expect("LISTEN");
        (
            raw,
            RawWake::Postgres {
                pool,
                listener,
                channel,
            },
        )
    });
    let mut group = group(c, "postgres");
    crud(&mut group, rt, &ops, &raw);
    let raw_claim = RawClaim::Postgres {
        pool: raw.pool.clone(),
        schema: harness.schema().to_owned(),
    };
    takeover(&mut group, rt, &harness, &ops, Some(&raw_claim));
    // Notified on a channel nobody listens to: the cost of queueing it.
    raw.notify = Some(format!("{}_raw_finish", harness.schema()));
    finish(&mut group, rt, "raw_finish_notify", &raw);
    watch_wake(
        &mut group,
        rt,
        &a,
        &b,
        &ops,
        Duration::from_millis(2),
        Some(&mut wake),
    );
    group.finish();
    rt.block_on(async {
        wake.close().await;
        raw.pool.close().await;
        close(harness, a, b, ops).await;
    });
}

// ------------------------------------------------------------ Redis

/// Creates a task hash if absent, as the store's script does.
const RAW_REDIS_CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'rev', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#;

/// Writes a task hash if its `rev` is still the one read, and publishes
/// the change, as the store's script does.
const RAW_REDIS_WRITE: &str = r#"
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'rev', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"#;

/// Raw Redis: one hash per task under the harness's prefix (so its
/// teardown removes them), written by scripts like the store's.
struct RedisRaw {
    conn: redis::aio::MultiplexedConnection,
    prefix: String,
    /// A value of the store's encoded size.
    value: Vec<u8>,
    create: redis::Script,
    write: redis::Script,
    channel: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The backstop TTL the store gives a fresh task: past its purge, plus a
/// day.
fn backstop_ms() -> i64 {
    let (_, purge_at) = lifetime(0);
    purge_at + 24 * 3_600_000
}

impl Ops for RedisRaw {
    type Key = ([u8; 16], String);

    async fn create(&self) -> Self::Key {
        let digest = fresh_key();
        let key = format!("{}:raw:{{{}}}:task", self.prefix, hex(&digest));
        let created: i64 = self
            .create
            .key(&key)
            .arg(&self.value[..])
            .arg(1)
            .arg(backstop_ms())
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("raw create");
        assert_eq!(created, 1, "a key drawn twice");
        (digest, key)
    }

    async fn get(&self, (_, key): &Self::Key) {
        let value: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(key)
            .arg("v")
            .query_async(&mut self.conn.clone())
            .await
            .expect("raw get");
        black_box(value.expect("the task is there"));
    }

    async fn finish(&self, (digest, key): &Self::Key) {
        let (value, rev): (Option<Vec<u8>>, Option<u64>) = redis::cmd("HMGET")
            .arg(key)
            .arg("v")
            .arg("rev")
            .query_async(&mut self.conn.clone())
            .await
            .expect("raw read");
        let (mut value, rev) = (
            value.expect("the task is there"),
            rev.expect("the task's rev"),
        );
        value.extend_from_slice(RESULT);
        let written: i64 = self
            .write
            .key(key)
            .arg(rev)
            .arg(value)
            .arg(rev + 1)
            .arg(backstop_ms())
            .arg(&self.channel)
            .arg(hex(digest))
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("raw write");
        assert_eq!(written, 1, "the task changed under the compare-and-set");
    }
}

fn redis_backend(c: &mut Criterion, rt: &Runtime) {
    let harness = rt.block_on(RedisHarness::new());
    let (a, b, ops) = rt.block_on(open(&harness));
    let (raw, mut wake) = rt.block_on(async {
        let client = redis::Client::open(harness.url()).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("raw redis connection");
        let channel = format!("{}:raw:changes", harness.prefix());
        let mut pubsub = client.get_async_pubsub().await.expect("raw subscriber");
        pubsub.subscribe(&channel).await.expect("SUBSCRIBE");
        let raw = RedisRaw {
            conn: conn.clone(),
            prefix: harness.prefix().to_owned(),
            value: vec![0; store_value_len(&ops)],
            create: redis::Script::new(RAW_REDIS_CREATE),
            write: redis::Script::new(RAW_REDIS_WRITE),
            channel: channel.clone(),
        };
        let wake = RawWake::Redis {
            conn,
            messages: Box::pin(pubsub.into_on_message()),
            channel,
        };
        (raw, wake)
    });
    let mut group = group(c, "redis");
    crud(&mut group, rt, &ops, &raw);
    let raw_claim = RawClaim::Redis {
        conn: raw.conn.clone(),
        index: format!("{}:t1:takeover", harness.prefix()),
        prefix: harness.prefix().to_owned(),
        script: redis::Script::new(RAW_REDIS_CLAIM),
    };
    takeover(&mut group, rt, &harness, &ops, Some(&raw_claim));
    watch_wake(
        &mut group,
        rt,
        &a,
        &b,
        &ops,
        Duration::from_millis(2),
        Some(&mut wake),
    );
    group.finish();
    drop(raw);
    rt.block_on(async {
        wake.close().await;
        close(harness, a, b, ops).await;
    });
}

// ------------------------------------------------------------ sled

/// Raw sled: the store's trees in a database of their own, each change
/// flushed before it returns, on the blocking pool.
struct SledRaw {
    db: sled::Db,
    tasks: sled::Tree,
    purge: sled::Tree,
    instances: sled::Tree,
    instance: [u8; 16],
    /// The length of the store's encoding of a fresh task.
    value_len: usize,
}

impl Ops for Arc<SledRaw> {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let raw = self.clone();
        tokio::task::spawn_blocking(move || {
            let key = fresh_key();
            assert!(
                raw.tasks.get(key).expect("raw get").is_none(),
                "a key drawn twice"
            );
            let (_, purge_at) = lifetime(common::now_millis());
            let mut purge_key = purge_at.to_be_bytes().to_vec();
            purge_key.extend_from_slice(&key);
            raw.purge.insert(purge_key, &[]).expect("raw index insert");
            let mut value = vec![0u8; raw.value_len];
            value[1..9].copy_from_slice(&1u64.to_be_bytes());
            raw.tasks
                .compare_and_swap(key, None::<&[u8]>, Some(value))
                .expect("raw swap")
                .expect("the key was free");
            raw.db.flush().expect("raw flush");
            key
        })
        .await
        .expect("raw sled task")
    }

    async fn get(&self, key: &[u8; 16]) {
        let (raw, key) = (self.clone(), *key);
        tokio::task::spawn_blocking(move || {
            let value = raw
                .tasks
                .get(key)
                .expect("raw get")
                .expect("the task is there");
            let alive = raw.instances.get(raw.instance).expect("raw get");
            black_box((value, alive));
        })
        .await
        .expect("raw sled task")
    }

    async fn finish(&self, key: &[u8; 16]) {
        let (raw, key) = (self.clone(), *key);
        tokio::task::spawn_blocking(move || {
            let old = raw
                .tasks
                .get(key)
                .expect("raw get")
                .expect("the task is there");
            assert_eq!(old[0], 0, "the task is working");
            let rev = u64::from_be_bytes(old[1..9].try_into().expect("8 bytes"));
            let mut new = old.to_vec();
            new[0] = TaskStatus::Completed.as_u8();
            new[1..9].copy_from_slice(&(rev + 1).to_be_bytes());
            new.extend_from_slice(RESULT);
            raw.tasks
                .compare_and_swap(key, Some(old), Some(new))
                .expect("raw swap")
                .expect("the task changed under the swap");
            raw.db.flush().expect("raw flush");
        })
        .await
        .expect("raw sled task")
    }
}

fn sled_backend(c: &mut Criterion, rt: &Runtime) {
    let harness = rt.block_on(SledHarness::new());
    let (a, b, ops) = rt.block_on(open(&harness));
    let value_len = store_value_len(&ops);
    let raw_dir = tempfile::tempdir().expect("a temporary directory");
    let db = sled::Config::new()
        .path(raw_dir.path())
        .cache_capacity(mcp_event_store_sled::DEFAULT_CACHE_CAPACITY)
        .open()
        .expect("raw sled");
    let instances = db.open_tree("t1/instances").expect("raw tree");
    instances
        .insert(*ops.me.as_bytes(), &i64::MAX.to_be_bytes())
        .expect("raw instance");
    let raw = Arc::new(SledRaw {
        tasks: db.open_tree("t1/tasks").expect("raw tree"),
        purge: db.open_tree("t1/task_purge").expect("raw tree"),
        instances,
        instance: *ops.me.as_bytes(),
        value_len,
        db,
    });
    let mut group = group(c, "sled");
    crud(&mut group, rt, &ops, &raw);
    takeover(&mut group, rt, &harness, &ops, None);
    watch_wake(
        &mut group,
        rt,
        &a,
        &b,
        &ops,
        Duration::from_micros(300),
        None,
    );
    group.finish();
    drop(raw);
    drop(raw_dir);
    rt.block_on(close(harness, a, b, ops));
}

// ------------------------------------------------------------ takeover

/// The lease of an instance the takeover bench lets lapse (on a manual
/// clock, so it lapses when the bench says).
const LAPSING_LEASE: Duration = Duration::from_secs(1);

/// A raw claim: the least work the database does to hand one waiting
/// task to a worker, on the store's own rows.
enum RawClaim {
    /// One `UPDATE … WHERE digest = (SELECT … LIMIT 1) RETURNING digest`
    /// on a pool of one connection.
    Sqlite(sqlx::SqlitePool),
    /// The same with `FOR UPDATE SKIP LOCKED` in the sub-select.
    Postgres { pool: sqlx::PgPool, schema: String },
    /// One script: `SPOP` of the store's takeover set, `HINCRBY rev` of the
    /// task (a set used as a queue; standalone Redis only).
    Redis {
        conn: redis::aio::MultiplexedConnection,
        index: String,
        prefix: String,
        script: redis::Script,
    },
}

/// The [`RawClaim::Redis`] script. KEYS: the takeover set. ARGV: the
/// prefix.
const RAW_REDIS_CLAIM: &str = r#"
local d = redis.call('SPOP', KEYS[1])
if not d then return 0 end
redis.call('HINCRBY', ARGV[1] .. ':t1:{' .. d .. '}:task', 'rev', 1)
return 1
"#;

impl RawClaim {
    /// Claims one waiting task for `worker`; panics if none waits.
    async fn claim(&self, worker: InstanceId) {
        let now = common::now_millis();
        let claimed = match self {
            RawClaim::Sqlite(pool) => sqlx::query(
                "UPDATE mes_tasks SET epoch = epoch + 1, released = 0, instance = ?1, \
                        rev = rev + 1, updated_at = ?2 \
                 WHERE digest = (SELECT digest FROM mes_tasks \
                                  WHERE max_attempts IS NOT NULL AND status = 0 AND released \
                                  ORDER BY updated_at, digest LIMIT 1) \
                 RETURNING digest",
            )
            .bind(&worker.as_bytes()[..])
            .bind(now)
            .fetch_optional(pool)
            .await
            .expect("raw claim")
            .is_some(),
            RawClaim::Postgres { pool, schema } => sqlx::query(AssertSqlSafe(format!(
                "UPDATE \"{schema}\".tasks SET epoch = epoch + 1, released = FALSE, \
                        instance = $1, rev = rev + 1, updated_at = $2 \
                 WHERE digest = (SELECT digest FROM \"{schema}\".tasks \
                                  WHERE max_attempts IS NOT NULL AND status = 0 AND released \
                                  ORDER BY updated_at, digest LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 RETURNING digest"
            )))
            .bind(&worker.as_bytes()[..])
            .bind(now)
            .fetch_optional(pool)
            .await
            .expect("raw claim")
            .is_some(),
            RawClaim::Redis {
                conn,
                index,
                prefix,
                script,
            } => {
                let n: i64 = script
                    .key(index)
                    .arg(prefix)
                    .invoke_async(&mut conn.clone())
                    .await
                    .expect("raw claim");
                n == 1
            }
        };
        assert!(claimed, "a queued task waits");
    }
}

/// `claim` (and `raw_claim`) in tasks per second: `iters` queued tasks are
/// created untimed, then claimed one `claim(worker, 1)` at a time; the
/// claimed tasks are then finished, untimed. `lapse_to_first_step`: on a
/// handle with a manual clock, a task that may be taken over is created
/// under an instance whose lease then runs out (the clock moves); timed
/// from there until another instance claimed it and its re-run's first
/// write (`SetMessage`) returned: what a takeover costs beyond the claim
/// loop's interval.
fn takeover<H: TaskHarness>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    harness: &H,
    ops: &StoreOps<H::Store>,
    raw: Option<&RawClaim>,
) {
    let store = &ops.store;
    let worker = InstanceId::generate().expect("an instance id");
    let day = Duration::from_secs(24 * 3600);
    assert!(
        rt.block_on(store.heartbeat(worker, day))
            .expect("heartbeat")
    );
    let queue = |n: u64| async move {
        for _ in 0..n {
            store
                .create(NewTask::new(&ops.owner, ops.me).ttl(TTL).queued())
                .await
                .expect("create a queued task");
        }
    };
    group.throughput(Throughput::Elements(1));
    group.bench_function("claim", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                queue(iters).await;
                let mut claimed = Vec::with_capacity(iters as usize);
                let start = Instant::now();
                for _ in 0..iters {
                    let mut one = store.claim(worker, 1).await.expect("claim");
                    claimed.push(one.pop().expect("a queued task waits"));
                }
                let elapsed = start.elapsed();
                for claim in claimed {
                    let done = WorkerChange::Finish(Finish::Completed(RESULT));
                    let applied = store
                        .apply_claimed(&claim.task, claim.worker, done)
                        .await
                        .expect("finish");
                    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
                }
                elapsed
            })
        })
    });
    if let Some(raw) = raw {
        group.bench_function("raw_claim", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    queue(iters).await;
                    let start = Instant::now();
                    for _ in 0..iters {
                        raw.claim(worker).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    let clock = Arc::new(ManualClock::new(common::now_millis() as u64));
    let manual = rt.block_on(harness.open(StoreOptions::default().clock(clock.clone())));
    let next = InstanceId::generate().expect("an instance id");
    assert!(rt.block_on(manual.heartbeat(next, day)).expect("heartbeat"));
    group.bench_function("lapse_to_first_step", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    // The clock moves a lease per iteration: keep the
                    // claimant alive (untimed).
                    assert!(manual.heartbeat(next, day).await.expect("heartbeat"));
                    let gone = InstanceId::generate().expect("an instance id");
                    assert!(
                        manual
                            .heartbeat(gone, LAPSING_LEASE)
                            .await
                            .expect("heartbeat")
                    );
                    manual
                        .create(NewTask::new(&ops.owner, gone).ttl(TTL).takeover(3))
                        .await
                        .expect("create");
                    clock.advance(LAPSING_LEASE);
                    let start = Instant::now();
                    let claim = manual
                        .claim(next, 1)
                        .await
                        .expect("claim")
                        .pop()
                        .expect("the lapsed task waits");
                    let step = WorkerChange::SetMessage(Some("run 2"));
                    let applied = manual
                        .apply_claimed(&claim.task, claim.worker, step)
                        .await
                        .expect("first step");
                    total += start.elapsed();
                    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
                    let done = WorkerChange::Finish(Finish::Completed(RESULT));
                    manual
                        .apply_claimed(&claim.task, claim.worker, done)
                        .await
                        .expect("finish");
                }
                total
            })
        })
    });
    rt.block_on(harness.close(manual));
}

criterion_group!(benches, tasks);
criterion_main!(benches);
