//! The conformance-suite harness for SQLite (feature `conformance`), and
//! probes this crate's own tests use.
//!
//! SQLite needs no server: each harness owns a fresh temporary directory
//! holding one database file, removed by [`teardown`](Harness::teardown)
//! and, when a test panics first, when the harness is dropped. The
//! [`PersistentHarness`] locator is the file's path, so another process
//! (the SIGKILL case's child) [attaches](PersistentHarness::attach) to it.

use std::path::PathBuf;

use async_trait::async_trait;
use mcp_event_store_conformance::events::{Harness, PersistentHarness, UrlHarness};
use mcp_event_store_conformance::tasks::{NO_RECHECK, PersistentTaskHarness, TaskHarness};
use mcp_event_store_core::{Result, StoreOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::{FORMAT_VERSION, SqliteOptions, SqliteStore};

/// One database file in a temporary directory of its own, deleted with the
/// harness; or, [attached](PersistentHarness::attach), another harness's
/// file, left alone.
#[derive(Debug)]
pub struct SqliteHarness {
    path: PathBuf,
    /// The directory this harness owns; `None` when attached.
    dir: Option<tempfile::TempDir>,
}

impl SqliteHarness {
    /// A harness on a fresh temporary directory.
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        Self {
            path: dir.path().join("events.db"),
            dir: Some(dir),
        }
    }

    /// The database file every `open` uses.
    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The options every `open` uses: this file, these shared options, the
    /// defaults otherwise.
    pub fn options(&self, store: StoreOptions) -> SqliteOptions {
        SqliteOptions::new(&self.path).store(store)
    }

    /// A connection of its own on the file, outside any store, to change
    /// what a store would not.
    async fn raw(&self) -> SqliteConnection {
        SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&self.path))
            .await
            .unwrap_or_else(|e| panic!("open {} directly: {e}", self.path.display()))
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    type Store = SqliteStore;

    async fn open(&self, options: StoreOptions) -> SqliteStore {
        SqliteStore::open_with(self.options(options))
            .await
            .expect("open the sqlite store")
    }

    async fn close(&self, store: SqliteStore) {
        store.close().await;
    }

    async fn teardown(self) {
        if let Some(dir) = self.dir {
            let shown = dir.path().display().to_string();
            dir.close()
                .unwrap_or_else(|e| panic!("removing the test directory {shown}: {e}"));
        }
    }
}

/// `sqlite://<the database file>`; removing it removes the temporary
/// directory.
#[async_trait]
impl UrlHarness for SqliteHarness {
    fn url(&self) -> String {
        format!("sqlite://{}", self.locator())
    }

    async fn remove(self: Box<Self>) {
        Harness::teardown(*self).await;
    }
}

#[async_trait]
impl PersistentHarness for SqliteHarness {
    fn locator(&self) -> String {
        self.path
            .to_str()
            .expect("a temporary path in UTF-8")
            .to_owned()
    }

    async fn attach(locator: &str) -> Self {
        Self {
            path: PathBuf::from(locator),
            dir: None,
        }
    }

    async fn try_open(&self, options: StoreOptions) -> Result<SqliteStore> {
        SqliteStore::open_with(self.options(options)).await
    }

    fn format_version(&self) -> u64 {
        FORMAT_VERSION as u64
    }

    /// Writes what a release of format `version` leaves: its migrations in
    /// `mes_migrations` (a row for each migration past this release's, one
    /// per format version past [`FORMAT_VERSION`]; none past this release's
    /// for the current format) and `mes_meta.format_version`.
    ///
    /// # Panics
    ///
    /// For a version older than [`FORMAT_VERSION`]: an older format is a
    /// different schema, not just another marker (the format 1 upgrade is
    /// tested with a database built by format 1's own migration).
    async fn set_format_version(&self, version: u64) {
        let current = FORMAT_VERSION as u64;
        assert!(
            version >= current,
            "the SQLite harness can mark a database with format {current} or newer, not {version}"
        );
        let known = sqlx::migrate!("./migrations")
            .iter()
            .map(|migration| migration.version)
            .max()
            .unwrap_or(0);
        let newer = i64::try_from(version - current).expect("a format version SQLite can hold");
        let mut conn = self.raw().await;
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("DELETE FROM mes_migrations WHERE version > ?1")
            .bind(known)
            .execute(&mut *tx)
            .await
            .expect("remove migrations past this release's");
        for migration in known + 1..=known + newer {
            sqlx::query(
                "INSERT INTO mes_migrations \
                     (version, description, success, checksum, execution_time) \
                 VALUES (?1, ?2, TRUE, X'00', 0)",
            )
            .bind(migration)
            .bind(format!("a newer release's migration {migration} (test)"))
            .execute(&mut *tx)
            .await
            .expect("record a newer release's migration");
        }
        let updated = sqlx::query("UPDATE mes_meta SET value = ?1 WHERE key = 'format_version'")
            .bind(i64::try_from(version).expect("a format version SQLite can hold"))
            .execute(&mut *tx)
            .await
            .expect("set the format version")
            .rows_affected();
        assert_eq!(updated, 1, "the database has no format version record");
        tx.commit().await.expect("commit");
        conn.close().await.expect("close");
    }

    /// The bytes of every file in the database's directory (the database,
    /// its write-ahead log), as they are on disk now.
    async fn stored_bytes(&self) -> Vec<u8> {
        let dir = self
            .path
            .parent()
            .expect("the database file has a directory");
        let mut bytes = Vec::new();
        for entry in std::fs::read_dir(dir).expect("list the database's directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_file() {
                bytes.extend(std::fs::read(&path).expect("read a database file"));
            }
        }
        bytes
    }
}

/// The task suite's harness: every `open` is a new handle on this
/// harness's file, and [`raw_rows`](TaskHarness::raw_rows) dumps the task
/// tables through a connection of its own.
#[async_trait]
impl TaskHarness for SqliteHarness {
    type Store = SqliteStore;

    async fn open(&self, options: StoreOptions) -> SqliteStore {
        Harness::open(self, options).await
    }

    /// A handle whose watches re-read only when woken (the safety-net
    /// re-read an hour away): by this handle's writer, or by its watcher
    /// when `PRAGMA data_version` shows another connection wrote.
    async fn open_without_recheck(&self, options: StoreOptions) -> SqliteStore {
        SqliteStore::open_with(self.options(options).follow_recheck(NO_RECHECK))
            .await
            .expect("open the sqlite store")
    }

    async fn close(&self, store: SqliteStore) {
        store.close().await;
    }

    /// The store's own rewriter: a SQLite store is an event store.
    fn rewriter<'s>(
        &self,
        store: &'s Self::Store,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }

    /// Every row of `mes_tasks`, `mes_task_inputs` and `mes_instances`,
    /// each column as the bytes SQLite holds, joined by `|`.
    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        const TABLES: [(&str, &str); 3] = [
            (
                "mes_tasks",
                "digest, owner, status, rev, message, created_at, updated_at, expires_at, \
                 purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq",
            ),
            (
                "mes_task_inputs",
                "digest, key, seq, state, request, response",
            ),
            ("mes_instances", "id, alive_until"),
        ];
        let mut conn = self.raw().await;
        let mut rows = Vec::new();
        for (table, columns) in TABLES {
            let select = columns
                .split(", ")
                .map(|column| format!("CAST({} AS BLOB)", column.trim()))
                .collect::<Vec<_>>()
                .join(", ");
            let query = format!("SELECT {select} FROM {table}");
            for row in sqlx::query(AssertSqlSafe(query))
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("dump {table}: {e}"))
            {
                let mut raw = Vec::new();
                for column in 0..row.len() {
                    let value: Option<Vec<u8>> = row.try_get(column).expect("a column as bytes");
                    raw.extend(value.unwrap_or_default());
                    raw.push(b'|');
                }
                rows.push(raw);
            }
        }
        conn.close().await.expect("close");
        Some(rows)
    }

    async fn teardown(self) {
        Harness::teardown(self).await;
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

/// How many of the follow watcher's checks on `store` have seen another
/// connection's commit (another handle's or process's) so far: the
/// handle's own commits never count, and only such checks keep its file
/// notifier on.
pub fn foreign_commits_seen(store: &SqliteStore) -> u64 {
    store.inner.watcher.foreign_commits_seen()
}

/// Whether the follow watcher on `store` has its file notifier on: from
/// its start, off once only this handle's own commits prompted its checks
/// for a while, on again when another connection's commit is seen.
pub fn file_notifier_on(store: &SqliteStore) -> bool {
    store.inner.watcher.notifying()
}

/// Connections the read pool holds now (idle or in use); never more than
/// [`SqliteOptions::read_connections`].
pub fn read_connections(store: &SqliteStore) -> u32 {
    store.inner.readers.size()
}

/// The task format is the newest task migration (`migrations/tasks`),
/// recorded in `mes_task_migrations`, which a release checks on open.
#[async_trait]
impl PersistentTaskHarness for SqliteHarness {
    fn task_format_version(&self) -> u64 {
        newest_task_migration() as u64
    }

    /// Records a newer release's task migration (a row past this release's
    /// newest), or takes every such row away for this release's format.
    async fn set_task_format_version(&self, version: u64) {
        let newest = newest_task_migration();
        let version = i64::try_from(version).expect("a task migration version within INTEGER");
        let table = crate::setup::TASK_MIGRATIONS;
        let mut conn = self.raw().await;
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE version > ?1"
        )))
        .bind(newest)
        .execute(&mut conn)
        .await
        .expect("take newer task migrations away");
        if version > newest {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (version, description, success, checksum, execution_time) \
                 VALUES (?1, 'a newer release (test)', TRUE, X'00', 0)"
            )))
            .bind(version)
            .execute(&mut conn)
            .await
            .expect("record a newer task migration");
        }
        conn.close().await.expect("close the raw connection");
    }
}

/// The newest task migration this release runs.
fn newest_task_migration() -> i64 {
    crate::setup::task_migrator()
        .iter()
        .map(|migration| migration.version)
        .max()
        .expect("the task migrations")
}
