//! The task bench's baselines: task rows written by hand ([`TaskOps`]), a
//! raw claim ([`RawClaim`]) and a raw wake-up ([`RawWake`]), and what they
//! share with the store's calls (the tasks' ttl, message and result).

use std::future::Future;
use std::time::Duration;

use mcp_event_store_core::backend::task::TaskMachine;
use mcp_event_store_core::backend::task::codec::{self, StoredTask};
use mcp_event_store_core::task::{InstanceId, NewTask, Owner, TaskId, TaskOptions, TaskRecord};

use super::now_millis;

/// The tasks' ttl.
pub const TTL: Duration = Duration::from_secs(3600);
/// The tasks' first status message.
pub const MESSAGE: &str = "working on it";
/// The result a task finishes with: a small `CallToolResult`.
pub const RESULT: &[u8] = br#"{"content":[{"type":"text","text":"done"}],"isError":false}"#;
/// The longest a watch or a raw wake-up waits; longer fails the bench.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// Whose the benches' tasks are, and the instance they run on.
pub struct TaskSubject {
    /// Their owner (a principal).
    pub owner: Owner,
    /// The instance, heartbeating for the whole run.
    pub me: InstanceId,
}

impl TaskSubject {
    /// The owner's digest, as rows store it.
    pub fn owner_digest(&self) -> [u8; 16] {
        *self.owner.digest().expect("a principal")
    }

    /// The length of the store's encoding of a fresh task like the
    /// benches' (sled and Redis store this one value per task).
    pub fn value_len(&self) -> usize {
        let task = NewTask::new(&self.owner, self.me).ttl(TTL).message(MESSAGE);
        let record = TaskRecord::created(&task, now_millis(), &TaskOptions::default());
        codec::encode(&StoredTask::new(&self.owner, *self.me.as_bytes(), record)).len()
    }
}

/// A fresh key, drawn as the store draws one (a random id, then its
/// SHA-256 digest).
pub fn fresh_key() -> [u8; 16] {
    *TaskId::generate().expect("a task id").digest().as_bytes()
}

/// When a task created at `now` expires and is purged (the default
/// options: a grace of an hour, T21).
pub fn lifetime(now: i64) -> (i64, i64) {
    let lifetime = TaskOptions::default().lifetime(now, Some(TTL));
    (lifetime.expires_at, lifetime.purge_at)
}

/// The three calls the task bench measures, by the store or by hand.
pub trait TaskOps {
    /// What names one task (or row).
    type Key;

    /// Creates a working task; returns its key.
    fn create(&self) -> impl Future<Output = Self::Key>;

    /// Reads the task.
    fn get(&self, key: &Self::Key) -> impl Future<Output = ()>;

    /// Finishes the working task as completed.
    fn finish(&self, key: &Self::Key) -> impl Future<Output = ()>;

    /// Releases what the baseline holds (a pool), once the cases are done.
    fn close(self) -> impl Future<Output = ()>
    where
        Self: Sized,
    {
        async {}
    }
}

/// A raw claim: the least work the database does to hand one waiting task
/// to a worker, on the store's own rows.
pub trait RawClaim {
    /// Claims one waiting task for `worker`; panics if none waits.
    fn claim(&self, worker: InstanceId) -> impl Future<Output = ()>;
}

/// A raw wake-up: a message from one connection until another has it, with
/// the driver's own mechanism (`NOTIFY`, `PUBLISH`).
pub trait RawWake {
    /// Sends message `n` and waits until the other side has it: the time
    /// the case measures.
    fn round_trip(&mut self, n: u64) -> impl Future<Output = Duration>;

    /// Closes its connections.
    fn close(self) -> impl Future<Output = ()>
    where
        Self: Sized,
    {
        async {}
    }
}

/// No raw claim (the store's claim is the map or tree scan itself).
pub enum NoClaim {}

impl RawClaim for NoClaim {
    async fn claim(&self, _: InstanceId) {
        match *self {}
    }
}

/// No raw wake-up (the backend's wake-up is in-process).
pub enum NoWake {}

impl RawWake for NoWake {
    async fn round_trip(&mut self, _: u64) -> Duration {
        match *self {}
    }
}

/// A backend's task baselines.
pub struct TaskRaw<O, C, W> {
    /// `raw_create`, `raw_get`, `raw_finish`.
    pub ops: O,
    /// Further finish baselines, each timed as `raw_finish` is, under its
    /// id (PostgreSQL: `raw_finish_notify`).
    pub finishes: Vec<(&'static str, O)>,
    /// `raw_claim`, if the database has one.
    pub claim: Option<C>,
    /// `raw_wake`, if the driver has one.
    pub wake: Option<W>,
    /// How long the `watch_wake` case lets a watch settle (untimed) before
    /// the change: long enough for the watch to read the task and wait.
    pub settle: Duration,
}

impl<O: TaskOps, C, W: RawWake> TaskRaw<O, C, W> {
    /// Closes the wake-up's connections and the baselines' pools.
    pub async fn close(self) {
        if let Some(wake) = self.wake {
            wake.close().await;
        }
        for (_, ops) in self.finishes {
            ops.close().await;
        }
        self.ops.close().await;
    }
}
