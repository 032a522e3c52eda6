//! Test support: the conformance harness for this backend.
//!
//! ```ignore
//! use mcp_event_store_sled::testing::SledHarness;
//! mcp_event_store_conformance::event_suite!(SledHarness::new(), persistent);
//! mcp_event_store_conformance::task_suite!(SledHarness::new());
//! ```

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use mcp_event_store_conformance::events::{Harness, PersistentHarness, UrlHarness};
use mcp_event_store_conformance::tasks::{NO_RECHECK, PersistentTaskHarness, TaskHarness};
use mcp_event_store_core::{Result, StoreOptions};

use crate::shared::blocking;
use crate::{FORMAT_VERSION, SledOptions, SledStore};

/// Runs the conformance suite on a sled database in its own temporary
/// directory, removed with the harness.
///
/// Every [`open`](Harness::open) opens that directory again; while another
/// handle is open the process-wide registry hands out the same database,
/// and after [`close`](Harness::close) of the last one it is really reopened
/// from disk. The harness itself never holds the database open, so another
/// process can [`attach`](PersistentHarness::attach) to it (its
/// [`locator`](PersistentHarness::locator) is the directory) while this one
/// has no handle open: sled lets one process at a time open a database.
#[derive(Debug)]
pub struct SledHarness {
    dir: Dir,
}

/// The harness's directory: its own, or another harness's.
#[derive(Debug)]
enum Dir {
    /// Removed with the harness.
    Owned(tempfile::TempDir),
    /// Another harness's (another process's), left alone.
    Attached(PathBuf),
}

impl SledHarness {
    /// A harness with a fresh, empty directory.
    ///
    /// # Panics
    ///
    /// If no temporary directory can be created (test support only).
    pub async fn new() -> Self {
        Self {
            dir: Dir::Owned(
                tempfile::Builder::new()
                    .prefix("mcp-event-store-sled-")
                    .tempdir()
                    .expect("create a temporary directory"),
            ),
        }
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        match &self.dir {
            Dir::Owned(dir) => dir.path(),
            Dir::Attached(path) => path,
        }
    }
}

#[async_trait]
impl Harness for SledHarness {
    type Store = SledStore;

    async fn open(&self, options: StoreOptions) -> SledStore {
        self.try_open(options)
            .await
            .unwrap_or_else(|e| panic!("open the sled store at {:?}: {e}", self.path()))
    }

    async fn close(&self, store: SledStore) {
        store
            .close()
            .await
            .unwrap_or_else(|e| panic!("close the sled store: {e}"));
    }
}

/// `sled://<the database directory>`, usable by one process at a time;
/// removing it removes the temporary directory.
#[async_trait]
impl UrlHarness for SledHarness {
    fn url(&self) -> String {
        format!("sled://{}", self.locator())
    }

    fn shared_across_processes(&self) -> bool {
        false
    }

    async fn remove(self: Box<Self>) {
        Harness::teardown(*self).await;
    }
}

#[async_trait]
impl PersistentHarness for SledHarness {
    /// The database directory.
    fn locator(&self) -> String {
        self.path()
            .to_str()
            .expect("the temporary directory's path is UTF-8")
            .to_owned()
    }

    async fn attach(locator: &str) -> Self {
        Self {
            dir: Dir::Attached(PathBuf::from(locator)),
        }
    }

    async fn try_open(&self, options: StoreOptions) -> Result<SledStore> {
        SledStore::open(self.path(), SledOptions::default().store(options)).await
    }

    fn format_version(&self) -> u64 {
        u64::from(FORMAT_VERSION)
    }

    /// Rewrites the metadata tree's format record, with sled directly.
    ///
    /// # Panics
    ///
    /// If the database is open in this process, or cannot be written.
    async fn set_format_version(&self, version: u64) {
        let version = u32::try_from(version).expect("sled format versions are u32");
        let path = self.path().to_owned();
        blocking(move || crate::setup::write_format_version(&path, version))
            .await
            .unwrap_or_else(|e| panic!("set the format of {:?} to {version}: {e}", self.path()));
    }

    /// The bytes of every file under the database's directory, as they are
    /// on disk now.
    async fn stored_bytes(&self) -> Vec<u8> {
        fn read_all(dir: &Path, bytes: &mut Vec<u8>) {
            for entry in std::fs::read_dir(dir).expect("list the database's directory") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    read_all(&path, bytes);
                } else {
                    bytes.extend(std::fs::read(&path).expect("read a database file"));
                }
            }
        }
        let mut bytes = Vec::new();
        read_all(self.path(), &mut bytes);
        bytes
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

/// The task suite on the harness's directory: every
/// [`open`](TaskHarness::open) is another handle on the one database (the
/// process-wide registry shares it), and
/// [`raw_rows`](TaskHarness::raw_rows) dumps the task trees.
#[async_trait]
impl TaskHarness for SledHarness {
    type Store = SledStore;

    async fn open(&self, options: StoreOptions) -> SledStore {
        Harness::open(self, options).await
    }

    /// A handle whose watches re-read only when woken (the safety-net
    /// re-read an hour away).
    async fn open_without_recheck(&self, options: StoreOptions) -> SledStore {
        let options = SledOptions::default()
            .store(options)
            .follow_recheck(NO_RECHECK);
        SledStore::open(self.path(), options)
            .await
            .unwrap_or_else(|e| panic!("open the sled store at {:?}: {e}", self.path()))
    }

    async fn close(&self, store: SledStore) {
        Harness::close(self, store).await;
    }

    /// The store's own rewriter (C22): every backend store hands one out.
    fn rewriter<'s>(
        &self,
        store: &'s SledStore,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }

    /// Every key and value of the task trees, each as `key | value`. Read
    /// through an open handle (sled lets one process open the directory).
    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        let store = Harness::open(self, StoreOptions::default()).await;
        let shared = store.shared().expect("just opened");
        let rows = blocking(move || {
            let mut rows = Vec::new();
            for tree in [&shared.tasks, &shared.task_purge, &shared.task_instances] {
                for entry in tree.iter() {
                    let (key, value) = entry.map_err(crate::error::backend)?;
                    let mut row = key.to_vec();
                    row.push(b'|');
                    row.extend_from_slice(&value);
                    rows.push(row);
                }
            }
            Ok(rows)
        })
        .await
        .expect("read the task trees");
        Harness::close(self, store).await;
        Some(rows)
    }

    async fn teardown(self) {
        Harness::teardown(self).await;
    }
}

/// The task format is the metadata tree's `task_format` record, which a
/// release checks on open.
#[async_trait]
impl PersistentTaskHarness for SledHarness {
    fn task_format_version(&self) -> u64 {
        u64::from(crate::keys::TASK_FORMAT)
    }

    /// Rewrites the `task_format` record, with sled directly.
    ///
    /// # Panics
    ///
    /// If the database is open in this process, or cannot be written.
    async fn set_task_format_version(&self, version: u64) {
        let version = u32::try_from(version).expect("sled task formats are u32");
        let path = self.path().to_owned();
        blocking(move || crate::setup::write_task_format(&path, version))
            .await
            .unwrap_or_else(|e| {
                panic!("set the task format of {:?} to {version}: {e}", self.path())
            });
    }
}
