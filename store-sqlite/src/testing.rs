//! The conformance-suite harness for SQLite (feature `conformance`).

use async_trait::async_trait;
use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::conformance::Harness;

use crate::{SqliteOptions, SqliteStore};

/// One temporary database file per harness, deleted with it.
#[derive(Debug)]
pub struct SqliteHarness {
    dir: tempfile::TempDir,
}

impl SqliteHarness {
    /// A harness on a fresh temporary directory.
    pub async fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("create a temporary directory"),
        }
    }

    /// The database file every `open` uses.
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("events.db")
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    type Store = SqliteStore;

    async fn open(&self, options: StoreOptions) -> SqliteStore {
        SqliteStore::open_with(SqliteOptions::new(self.path()).store(options))
            .await
            .expect("open the sqlite store")
    }

    async fn close(&self, store: SqliteStore) {
        store.close().await;
    }
}

/// Whether a handle's follow watcher (its task and its one connection) is
/// running, observed from outside: see [`watcher`].
#[derive(Debug)]
pub struct WatcherProbe(Option<std::sync::Weak<crate::watcher::Running>>);

impl WatcherProbe {
    /// Whether the watcher this probe saw is still running. It stays
    /// observable after the store is dropped.
    pub fn is_running(&self) -> bool {
        self.0.as_ref().is_some_and(|task| task.strong_count() > 0)
    }
}

/// The follow watcher running on `store` now, if any.
pub fn watcher(store: &SqliteStore) -> WatcherProbe {
    WatcherProbe(store.inner.watcher.running())
}

/// Connections the read pool holds now (idle or in use); never more than
/// [`SqliteOptions::read_connections`].
pub fn read_connections(store: &SqliteStore) -> u32 {
    store.inner.readers.size()
}
