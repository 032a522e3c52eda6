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
        SqliteStore::open_with(SqliteOptions::new(self.path()).store_options(options))
            .await
            .expect("open the sqlite store")
    }

    async fn close(&self, store: SqliteStore) {
        store.close().await;
    }
}
