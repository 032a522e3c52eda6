//! Test support: the conformance harness for this backend.
//!
//! ```ignore
//! use mcp_event_store_sled::testing::SledHarness;
//! mcp_event_store_core::conformance_tests!(SledHarness::new(), persistent);
//! ```

use std::path::Path;

use async_trait::async_trait;
use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::conformance::Harness;

use crate::{SledOptions, SledStore};

/// Runs the conformance suite on a sled database in its own temporary
/// directory, removed with the harness.
///
/// Every [`open`](Harness::open) opens that directory again; while another
/// handle is open the process-wide registry hands out the same database,
/// and after [`close`](Harness::close) of the last one it is really reopened
/// from disk.
#[derive(Debug)]
pub struct SledHarness {
    dir: tempfile::TempDir,
}

impl SledHarness {
    /// A harness with a fresh, empty directory.
    ///
    /// # Panics
    ///
    /// If no temporary directory can be created (test support only).
    pub async fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("mcp-event-store-sled-")
                .tempdir()
                .expect("create a temporary directory"),
        }
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

#[async_trait]
impl Harness for SledHarness {
    type Store = SledStore;

    async fn open(&self, options: StoreOptions) -> SledStore {
        SledStore::open(self.dir.path(), SledOptions::default().store(options))
            .await
            .unwrap_or_else(|e| panic!("open the sled store at {:?}: {e}", self.dir.path()))
    }

    async fn close(&self, store: SledStore) {
        store
            .close()
            .await
            .unwrap_or_else(|e| panic!("close the sled store: {e}"));
    }
}

/// How many streams have a follower on `store`'s database in this process:
/// the entries of the wake-up hub that every handle on the database shares.
/// An entry goes with its stream's last follower. None once `store` is
/// closed.
pub fn followed_streams(store: &SledStore) -> usize {
    store
        .shared()
        .map_or(0, |shared| shared.wakeups.followed().len())
}
