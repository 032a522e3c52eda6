//! This backend's bench baselines and test hooks (feature `bench`):
//! [`SledKit`], the [`Kit`] the benchmarks (`mcp-event-store-benches`) and
//! the facade's test support reach it through.
//!
//! * Replay: the data set appended through the store's API (its records
//!   and indexes are the store's business); the raw baseline is a sled
//!   range over a copy of the probe stream in the store's key and value
//!   layout, in a database of its own (sled lets one process open a
//!   directory once), and the same read on tokio's blocking pool
//!   (`raw_hop`).
//! * Append: raw sled insert, then `flush()`, per event.
//! * Tasks: the store's trees in a database of their own, each change
//!   flushed before it returns, on the blocking pool.
//! * Redemptions: `compare_and_swap(None → forget_at)` on a tree of a
//!   database of its own, then `flush()`, on the blocking pool
//!   ([`Redeem`]).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mcp_event_store_conformance::bench::append::{
    AppendBench, AppendCase, AppendFn, WRITERS, store_append,
};
use mcp_event_store_conformance::bench::redeem::RawRedeem;
use mcp_event_store_conformance::bench::tasks::{
    NoClaim, NoWake, RESULT, TaskOps, TaskRaw, TaskSubject, fresh_key, lifetime,
};
use mcp_event_store_conformance::bench::{
    Kit, Loaded, RawEvent, RawRead, ReadCases, StreamPlan, append_plan, dense_positions,
    now_millis, payload, unbounded,
};
use mcp_event_store_core::backend::{RedeemKey, StreamToken, dense};
use mcp_event_store_core::task::TaskStatus;
use mcp_event_store_core::{Backend, Position};

use crate::testing::SledHarness;
use crate::{DEFAULT_CACHE_CAPACITY, Durability, SledOptions, SledStore};

/// What the facade's `for_each_backend!` passes on for this backend: its
/// kit, and what its storage allows: `restart` (a new process opens it
/// again) and `shared` (several processes at once: no, sled locks its
/// directory to one process, as its harness's `shared_across_processes`
/// says).
#[doc(hidden)]
#[macro_export]
macro_rules! test_kit {
    ($callback:ident!($($args:tt)*)) => {
        $callback!($($args)* kit = $crate::bench::SledKit, restart = yes, shared = no);
    };
}

/// The sled backend's [`Kit`].
pub struct SledKit;

/// A loaded data set: the store and its directory.
pub struct Storage {
    store: SledStore,
    dir: tempfile::TempDir,
}

/// The raw baseline: a sled range over `token ++ seq` keys holding the
/// store's value layout (24-byte header, then the payload). Dropping it
/// removes its database.
pub struct Raw {
    tree: sled::Tree,
    token: Vec<u8>,
    // After the tree: the directory goes once the database is closed.
    _dir: tempfile::TempDir,
}

impl RawRead for Raw {
    /// Every event after `after`: one range.
    async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        read_range(&self.tree, &self.token, after)
    }
}

impl Raw {
    /// As [`read_after`](RawRead::read_after), on tokio's blocking pool, as
    /// the store reads (it keeps every sled call off the executor's
    /// workers): the raw read behind the same thread hop.
    pub async fn read_after_on_blocking_pool(&self, after: Position) -> Vec<RawEvent> {
        let (tree, token) = (self.tree.clone(), self.token.clone());
        tokio::task::spawn_blocking(move || read_range(&tree, &token, after))
            .await
            .expect("raw sled read task")
    }
}

/// Every event of `token` after `after`: one range.
fn read_range(tree: &sled::Tree, token: &[u8], after: Position) -> Vec<RawEvent> {
    let mut start = token.to_vec();
    start.extend_from_slice(&(after.minor + 1).to_be_bytes());
    let mut end = token.to_vec();
    end.extend_from_slice(&u64::MAX.to_be_bytes());
    tree.range(start..end)
        .map(|entry| {
            let (key, value) = entry.expect("raw sled read");
            let seq = u64::from_be_bytes(key[15..23].try_into().expect("key"));
            let retry = u64::from_be_bytes(value[8..16].try_into().expect("header"));
            (
                dense::position(after.major, seq),
                Bytes::copy_from_slice(&value[24..]),
                (retry != u64::MAX).then_some(retry as i64),
            )
        })
        .collect()
}

/// A raw database in a directory of its own, with the store's cache size.
fn raw_db(dir: &tempfile::TempDir) -> sled::Db {
    sled::Config::new()
        .path(dir.path())
        .cache_capacity(DEFAULT_CACHE_CAPACITY)
        .open()
        .expect("raw sled")
}

/// Raw sled appends: insert, then `flush()`, per event, on the blocking
/// pool.
fn raw_append(db: sled::Db) -> AppendFn {
    let tree = db.open_tree("events").expect("raw tree");
    let data: Arc<[u8]> = payload().into();
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

/// Raw tasks: the store's trees in a database of their own, each change
/// flushed before it returns, on the blocking pool.
pub struct Tasks(Arc<TaskTrees>);

/// What [`Tasks`] works on.
struct TaskTrees {
    db: sled::Db,
    tasks: sled::Tree,
    purge: sled::Tree,
    instances: sled::Tree,
    instance: [u8; 16],
    /// The length of the store's encoding of a fresh task.
    value_len: usize,
    // After the database: the directory goes once it is closed.
    _dir: tempfile::TempDir,
}

impl TaskOps for Tasks {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let raw = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let key = fresh_key();
            assert!(
                raw.tasks.get(key).expect("raw get").is_none(),
                "a key drawn twice"
            );
            let (_, purge_at) = lifetime(now_millis());
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
        let (raw, key) = (self.0.clone(), *key);
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
        let (raw, key) = (self.0.clone(), *key);
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

/// The raw redemption: a compare-and-swap from absent on a tree of a
/// database of its own (sled lets one process open a directory once), then
/// `flush()` when it stored the key, as the store waits for its flush; on
/// the blocking pool.
pub struct Redeem {
    tree: sled::Tree,
    db: sled::Db,
    _dir: tempfile::TempDir,
}

impl RawRedeem for Redeem {
    async fn redeem(&self, key: &RedeemKey, forget_at: i64) -> bool {
        let (tree, db, key) = (self.tree.clone(), self.db.clone(), *key.as_bytes());
        tokio::task::spawn_blocking(move || {
            let stored = tree
                .compare_and_swap(key, None::<&[u8]>, Some(&forget_at.to_be_bytes()[..]))
                .expect("raw swap")
                .is_ok();
            if stored {
                db.flush().expect("raw flush");
            }
            stored
        })
        .await
        .expect("raw sled task")
    }
}

impl Kit for SledKit {
    const BACKEND: &'static Backend = &crate::BACKEND;

    type Harness = SledHarness;
    type TaskHarness = SledHarness;

    async fn harness() -> SledHarness {
        SledHarness::new().await
    }

    type RawRedeem = Redeem;

    async fn raw_redeem(_: &SledHarness) -> Redeem {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = raw_db(&dir);
        Redeem {
            tree: db.open_tree("r1/redeemed").expect("raw tree"),
            db,
            _dir: dir,
        }
    }

    async fn task_harness() -> SledHarness {
        SledHarness::new().await
    }

    type Storage = Storage;
    type Raw = Raw;

    /// Writes the data set through a handle in interval mode, so the build
    /// does not wait for a flush per group; then closes it and reopens the
    /// store with the default durability, which is what the benches
    /// measure.
    async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let builder = SledStore::open(
            dir.path(),
            SledOptions::default()
                .store(unbounded())
                .durability(Durability::Interval(Duration::from_millis(100))),
        )
        .await
        .expect("open sled");
        let probes = append_plan(&builder, plan, 64).await;
        builder.close().await.expect("close the builder");
        let store = SledStore::open(dir.path(), SledOptions::default().store(unbounded()))
            .await
            .expect("reopen sled");
        Loaded {
            store: Arc::new(store.clone()),
            token: probes[0].token,
            positions: dense_positions(probes[0].position.major, plan[plan.len() - 1].len),
            storage: Storage { store, dir },
        }
    }

    /// A database of its own holding a copy of the probe stream.
    async fn raw(_: &Storage, token: StreamToken, probe: &StreamPlan) -> Raw {
        let token = token.as_bytes().to_vec();
        let data = payload();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = raw_db(&dir);
        let tree = db.open_tree("events").expect("raw sled tree");
        let now = (now_millis() as u64) ^ (1 << 63);
        // Plain inserts: sled 0.34's batches switch the whole process to a
        // global lock that the store's operations would then take.
        let mut cum = 0u64;
        for seq in 1..=probe.len {
            let mut key = token.clone();
            key.extend_from_slice(&seq.to_be_bytes());
            let mut value = Vec::with_capacity(24 + data.len());
            value.extend_from_slice(&now.to_be_bytes());
            value.extend_from_slice(&u64::MAX.to_be_bytes());
            value.extend_from_slice(&cum.to_be_bytes());
            value.extend_from_slice(&data);
            cum += data.len() as u64;
            tree.insert(key, value).expect("raw sled insert");
        }
        db.flush().expect("raw sled flush");
        Raw {
            tree,
            token,
            _dir: dir,
        }
    }

    /// `raw_hop`: the raw read on tokio's blocking pool, as the store
    /// reads: what the thread hop alone costs.
    fn read_cases(raw: &Raw, cases: &mut impl ReadCases) {
        cases.awaited("raw_hop", |after| raw.read_after_on_blocking_pool(after));
    }

    /// Closes the store and removes its directory.
    async fn cleanup(storage: Storage) {
        storage.store.close().await.expect("close sled");
        drop(storage.dir);
    }

    /// The store at the default durability beside raw inserts flushed one
    /// by one (32 writers: 32 concurrent `flush()` calls, which sled
    /// shares).
    async fn append() -> AppendBench {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let raw_dir = tempfile::tempdir().expect("a temporary directory");
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .expect("open sled");
        let raw = raw_append(raw_db(&raw_dir));
        let appends = store_append(Arc::new(store.clone()));
        AppendBench::new(
            vec![
                AppendCase::one("store_1_writer", &appends),
                AppendCase::one("raw_flush_each_1_writer", &raw),
                AppendCase::many("store_32_writers", &appends),
                AppendCase::many("raw_flush_each_32_writers", &raw),
            ],
            async move {
                store.close().await.expect("close sled");
                drop((dir, raw_dir));
            },
        )
    }

    type TaskOps = Tasks;
    type Claim = NoClaim;
    type Wake = NoWake;

    async fn task_raw(_: &SledHarness, subject: &TaskSubject) -> TaskRaw<Tasks, NoClaim, NoWake> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = raw_db(&dir);
        let instances = db.open_tree("t1/instances").expect("raw tree");
        instances
            .insert(*subject.me.as_bytes(), &i64::MAX.to_be_bytes())
            .expect("raw instance");
        let ops = Tasks(Arc::new(TaskTrees {
            tasks: db.open_tree("t1/tasks").expect("raw tree"),
            purge: db.open_tree("t1/task_purge").expect("raw tree"),
            instances,
            instance: *subject.me.as_bytes(),
            value_len: subject.value_len(),
            db,
            _dir: dir,
        }));
        TaskRaw {
            ops,
            finishes: Vec::new(),
            claim: None,
            wake: None,
            settle: Duration::from_micros(300),
        }
    }
}
