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
//! | `burst_1000` | 1,000 `create` calls started at once on one handle (a burst of task calls on one instance): the time until the last returned. Beside it each call's own time, from its start to its return, is printed as a median and 99th percentile over every call of the run (`tasks/<backend>/burst_1000/per_call`, written to `percentiles.json` in that case's criterion directory) |
//! | `burst_1000_call` | the same burst, each call what a task call does to its task: `create`, `apply(Finish::Completed)` of a small result, then `get` of the result; per call as for `burst_1000` (`.../burst_1000_call/per_call`) |
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

use std::sync::Mutex;

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use futures_util::future::join_all;
use mcp_event_store::{ManualClock, StoreOptions};
use mcp_event_store_conformance::bench::tasks::{
    MAX_WAIT, MESSAGE, RESULT, RawClaim, RawWake, TTL, TaskOps, TaskSubject,
};
use mcp_event_store_conformance::bench::{Kit, Visitor};
use mcp_event_store_conformance::tasks::TaskHarness;
use mcp_event_store_core::Backend;
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskId, TaskStatus, TaskStore,
    WorkerChange,
};
use tokio::runtime::Runtime;

/// Creates in flight at once in the concurrent variant.
const CONCURRENT: usize = 32;

/// Calls started at once in the burst cases.
const BURST: usize = 1_000;

/// The store's calls on one handle.
struct StoreOps<S> {
    store: Arc<S>,
    owner: Owner,
    me: InstanceId,
}

impl<S> Clone for StoreOps<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            owner: self.owner,
            me: self.me,
        }
    }
}

impl<S: RuntimeStore> StoreOps<S> {
    /// One call of a burst, timed: `create`, and with `whole_call` then
    /// `apply(Finish::Completed)` and `get` (the store's calls made here,
    /// so that the future is `Send` and runs on its own tokio task).
    async fn call(self, whole_call: bool) -> Duration {
        let begun = Instant::now();
        let (id, task) = self
            .store
            .create(NewTask::new(&self.owner, self.me).ttl(TTL).message(MESSAGE))
            .await
            .expect("create");
        assert_eq!(task.status, TaskStatus::Working);
        if whole_call {
            let applied = self
                .store
                .apply(
                    &id,
                    self.me,
                    WorkerChange::Finish(Finish::Completed(RESULT)),
                )
                .await
                .expect("finish");
            assert!(
                matches!(applied, Applied::Changed { .. }),
                "finish: {applied:?}"
            );
            let task = self
                .store
                .get(&id.to_string(), &self.owner)
                .await
                .expect("get")
                .expect("the task is there");
            assert_eq!(task.status, TaskStatus::Completed);
        }
        begun.elapsed()
    }
}

impl<S: RuntimeStore> TaskOps for StoreOps<S> {
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

fn group<'a>(c: &'a mut Criterion, backend: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(format!("tasks/{backend}"));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    group
}

/// `create`, `get` and `finish` (and 32 creates at once) by the store,
/// each beside the same by hand.
fn crud<S: TaskOps, R: TaskOps>(
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
fn finish<O: TaskOps>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, ops: &O) {
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

/// `burst_1000` and `burst_1000_call`: [`BURST`] calls started at once
/// (each its own tokio task, as a server's requests are), timed until the
/// last returned; every call's own time is kept, and their median and 99th
/// percentile printed once the case ran.
fn burst<S: RuntimeStore>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    backend: &Backend,
    ops: &StoreOps<S>,
) {
    group.throughput(Throughput::Elements(BURST as u64));
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    for (name, whole_call) in [("burst_1000", false), ("burst_1000_call", true)] {
        let per_call = Arc::new(Mutex::new(Vec::new()));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        let calls: Vec<_> = (0..BURST)
                            .map(|_| {
                                let ops = ops.clone();
                                tokio::spawn(async move { ops.call(whole_call).await })
                            })
                            .collect();
                        let times: Vec<Duration> = join_all(calls)
                            .await
                            .into_iter()
                            .map(|time| time.expect("a burst call"))
                            .collect();
                        total += start.elapsed();
                        per_call.lock().expect("the call times").extend(times);
                    }
                    total
                })
            })
        });
        let mut times = std::mem::take(&mut *per_call.lock().expect("the call times"));
        if !times.is_empty() {
            common::report_percentiles(
                backend,
                &format!("tasks/{}/{name}/per_call", backend.name),
                &mut times,
            );
        }
    }
    group.sampling_mode(SamplingMode::Auto);
    group.sample_size(20);
}

/// `watch_wake`: a watch on `a`, a change on `b`; and `raw_wake`.
fn watch_wake<S: RuntimeStore>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    a: &Arc<S>,
    b: &Arc<S>,
    ops: &StoreOps<S>,
    settle: Duration,
    raw: Option<&mut impl RawWake>,
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
        common::visit(
            backend,
            Tasks {
                c: &mut *c,
                rt: &rt,
            },
        );
    }
}

/// The task cases of one backend, beside its kit's baselines.
struct Tasks<'a> {
    c: &'a mut Criterion,
    rt: &'a Runtime,
}

impl Visitor for Tasks<'_> {
    type Output = ();

    fn visit<K: Kit>(self) {
        let Tasks { c, rt } = self;
        let harness = rt.block_on(K::task_harness());
        let (a, b, ops) = rt.block_on(open(&harness));
        let subject = TaskSubject {
            owner: ops.owner,
            me: ops.me,
        };
        let mut raw = rt.block_on(K::task_raw(&harness, &subject));
        let mut group = group(c, K::BACKEND.name);
        crud(&mut group, rt, &ops, &raw.ops);
        burst(&mut group, rt, K::BACKEND, &ops);
        takeover(&mut group, rt, &harness, &ops, raw.claim.as_ref());
        for (id, ops) in &raw.finishes {
            finish(&mut group, rt, id, ops);
        }
        watch_wake(&mut group, rt, &a, &b, &ops, raw.settle, raw.wake.as_mut());
        group.finish();
        rt.block_on(async {
            raw.close().await;
            close(harness, a, b, ops).await;
        });
    }
}

// ------------------------------------------------------------ takeover

/// The lease of an instance the takeover bench lets lapse (on a manual
/// clock, so it lapses when the bench says).
const LAPSING_LEASE: Duration = Duration::from_secs(1);

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
    raw: Option<&impl RawClaim>,
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
