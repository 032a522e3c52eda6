//! What the clones of one [`SqliteStore`] share ([`Inner`]: the stream key,
//! the read pool, the writer's queue, the wake-ups and the watcher), and the
//! plumbing the job files reach it through.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::backend::follow::Wakeups;
use sqlx::sqlite::SqlitePool;

use crate::SqliteStore;
use crate::options::Durability;
use crate::pages::PageReaders;
use crate::watcher::Watcher;
use crate::writer::Queue;

/// What the clones of one handle share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) key: StreamKey,
    pub(crate) options: StoreOptions,
    pub(crate) readers: SqlitePool,
    /// Replay pages, read through SQLite itself on threads of their own.
    pub(crate) pages: PageReaders,
    /// The writer thread's queue: every write goes through it.
    pub(crate) writer: Queue,
    /// This handle's followers; the writer wakes them after its commits.
    pub(crate) wakeups: Arc<Wakeups>,
    /// This handle's task watchers; the writer wakes them after its
    /// commits.
    pub(crate) task_wakeups: Arc<Wakeups>,
    /// How often a task watcher re-reads its task without a wake-up: the
    /// safety net should a wake-up be missed.
    pub(crate) task_recheck: Duration,
    /// Finds other handles' and processes' writes while anyone follows.
    pub(crate) watcher: Watcher,
    /// How often a follower re-reads without a wake-up.
    pub(crate) follow_recheck: Duration,
    /// What the store was opened to survive, for the health check.
    pub(crate) durability: Durability,
    /// Set by [`SqliteStore::close`].
    pub(crate) closed: AtomicBool,
}

impl SqliteStore {
    /// The store clock's time, in milliseconds.
    pub(crate) fn now(&self) -> i64 {
        self.inner.options.clock.now_millis()
    }
}
