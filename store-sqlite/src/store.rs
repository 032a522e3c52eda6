//! [`SqliteStore`]: opening and closing a handle, and the event job's
//! trait implementation, which hands each call to the file for its job
//! (sessions and tasks implement theirs in their own files).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
#[cfg(doc)]
use mcp_event_store_core::Error;
use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{BackendHandle, EventBackend};
use mcp_event_store_core::{
    EventId, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result, StoreOptions,
    StoreStats, StreamCursor, StreamPage,
};

use crate::error::NAME;
use crate::options::{SqliteOptions, WRITER_QUEUE};
use crate::pages::PageReaders;
use crate::state::Inner;
use crate::watcher::{OwnCommits, Watcher};
use crate::writer::Writer;
use crate::{append, follow, inspect, purge, replay, setup};

/// An event store (and session store) in one SQLite database file.
///
/// Cheap to clone; clones share the writer and the read pool. Call
/// [`close`](SqliteStore::close) for a clean shutdown; dropping every clone
/// also stops the writer once queued writes are done.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

impl SqliteStore {
    /// Opens the database a `sqlite://` URL names, with default options
    /// otherwise; see [`SqliteOptions::from_url`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SqliteOptions::default()).await
    }

    /// Opens the database a `sqlite://` URL names, with `options` for
    /// everything the URL does not say: the URL's file and its parameters
    /// (see [`SqliteOptions::from_url`]) are applied over `options`, so a
    /// parameter given in the URL wins.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// use std::time::Duration;
    /// use mcp_event_store_sqlite::{Durability, SqliteOptions, SqliteStore};
    ///
    /// let defaults = SqliteOptions::default()
    ///     .durability(Durability::PowerLoss)
    ///     .busy_timeout(Duration::from_secs(10));
    /// // Durability `process`, from the URL; a busy timeout of 10 s.
    /// let store = SqliteStore::connect_with("sqlite://events.db?durability=process", defaults).await?;
    /// # store.close().await;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(url: &str, options: SqliteOptions) -> Result<Self> {
        Self::open_with(options.apply_url(url)?).await
    }

    /// Opens (creating if needed) the database at `path` with default options.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(SqliteOptions::new(path.as_ref())).await
    }

    /// Opens with explicit options: creates the file if missing, runs the
    /// embedded migrations, checks the format version and starts the writer.
    ///
    /// Any number of handles and processes may open one file at once, new
    /// or not: they wait for each other (up to
    /// [`SqliteOptions::busy_timeout`]) and the migrations run once.
    pub async fn open_with(options: SqliteOptions) -> Result<Self> {
        options.validate()?;
        let opened = setup::open(&options).await?;
        let wakeups = Arc::new(Wakeups::default());
        let task_wakeups = Arc::new(Wakeups::default());
        let own = Arc::new(OwnCommits::default());
        let writer = Writer::new(
            opened.writer,
            options.store.retention,
            options.max_batch,
            wakeups.clone(),
            own.clone(),
        )
        .spawn(WRITER_QUEUE)?;
        Ok(Self {
            inner: Arc::new(Inner {
                key: opened.key,
                options: options.store,
                readers: opened.readers,
                pages: PageReaders::new(
                    &options.path,
                    options.busy_timeout,
                    usize::try_from(options.read_connections).unwrap_or(usize::MAX),
                ),
                writer,
                watcher: Watcher::new(
                    opened.connect,
                    options.follow_poll_interval,
                    own,
                    wakeups.clone(),
                    task_wakeups.clone(),
                ),
                wakeups,
                task_wakeups,
                task_recheck: options.follow_recheck,
                follow_recheck: options.follow_recheck,
                durability: options.durability,
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Finishes queued writes, then closes the writer (its thread answers
    /// once its connection is closed), the read pool, the replay page
    /// threads (waiting for them) and the follow watcher. Later calls on any clone fail with [`Error::Closed`];
    /// open follows end with it. Closing again does nothing.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.writer.close().await;
        self.inner.readers.close().await;
        self.inner.pages.close().await;
        self.inner.watcher.close();
        // Followers and task watchers re-read, find the store closed, and
        // end.
        self.inner.wakeups.wake_all();
        self.inner.task_wakeups.wake_all();
    }
}

impl BackendHandle for SqliteStore {
    const NAME: &'static str = NAME;

    fn store_options(&self) -> &StoreOptions {
        &self.inner.options
    }

    fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

#[async_trait]
impl EventBackend for SqliteStore {
    async fn append(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        append::append(self, stream_id, event).await
    }

    async fn replay_after(&self, raw: &str, cursor: EventId) -> Result<Replay> {
        replay::replay_after(self, raw, cursor).await
    }

    async fn replay_whole(&self, stream_id: &str) -> Result<Replay> {
        replay::replay_whole(self, stream_id).await
    }

    async fn follow_after(
        &self,
        raw: &str,
        cursor: EventId,
        options: FollowOptions,
    ) -> Result<Replay> {
        follow::follow_after(self, raw, cursor, options).await
    }

    fn follows_open(&self) -> usize {
        follow::follows_open(self)
    }

    async fn stream_of(&self, id: EventId) -> Result<Option<String>> {
        replay::stream_of(self, id).await
    }

    async fn remove_stream(&self, stream_id: &str) -> Result<u64> {
        purge::remove_stream(self, stream_id).await
    }

    async fn purge(&self) -> Result<PurgeReport> {
        purge::purge(self).await
    }

    async fn inspect_stats(&self) -> Result<StoreStats> {
        inspect::stats(self).await
    }

    async fn inspect_streams(
        &self,
        after: Option<&StreamCursor>,
        limit: usize,
    ) -> Result<StreamPage> {
        inspect::streams(self, after, limit).await
    }

    async fn inspect_check(&self) -> Result<HealthReport> {
        inspect::check(self).await
    }
}
