//! [`SqliteStore`]: opening and closing a handle, and the trait
//! implementations, which hand each call to the file for its job.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
#[cfg(doc)]
use mcp_event_store_core::Error;
use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Owner, Rev, RuntimeStore,
    TaskDigest, TaskId, TaskPurgeReport, TaskRecord, TaskStore, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{
    EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result,
    Retention, SessionStore, StoreStats, StreamCursor, StreamPage,
};
use tokio::sync::{mpsc, oneshot};

use crate::options::{SqliteOptions, WRITER_QUEUE};
use crate::pages::PageReaders;
use crate::state::Inner;
use crate::watcher::Watcher;
use crate::writer::{Command, Writer};
use crate::{append, follow, inspect, purge, replay, sessions, setup, tasks};

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
        let (sender, receiver) = mpsc::channel(WRITER_QUEUE);
        let writer = Writer::new(
            opened.writer,
            options.store.retention,
            options.max_batch,
            wakeups.clone(),
            task_wakeups.clone(),
            options.store.tasks,
        );
        writer.spawn(receiver)?;
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
                writer: sender,
                watcher: Watcher::new(
                    opened.connect,
                    options.follow_poll_interval,
                    wakeups.clone(),
                    task_wakeups.clone(),
                ),
                wakeups,
                task_wakeups,
                task_recheck: options.follow_recheck,
                follow_recheck: options.follow_recheck,
                durability: options.durability,
            }),
        })
    }

    /// Finishes queued writes, then closes the writer (its thread answers
    /// once its connection is closed), the read pool, the replay page
    /// threads (waiting for them) and the follow watcher. Later calls on any clone fail with [`Error::Closed`];
    /// open follows end with it. Closing again does nothing.
    pub async fn close(&self) {
        let (reply, done) = oneshot::channel();
        if self
            .inner
            .writer
            .send(Command::Close { reply })
            .await
            .is_ok()
        {
            let _ = done.await;
        }
        self.inner.readers.close().await;
        self.inner.pages.close().await;
        self.inner.watcher.close();
        // Followers and task watchers re-read, find the store closed, and
        // end.
        self.inner.wakeups.wake_all();
        self.inner.task_wakeups.wake_all();
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        append::store_event(self, stream_id, event).await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        replay::replay_events_after(self, last_event_id).await
    }

    async fn replay_stream(&self, stream_id: &str) -> Result<Replay> {
        replay::replay_stream(self, stream_id).await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        replay::get_stream_id_for_event_id(self, event_id).await
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        purge::delete_stream(self, stream_id).await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        purge::purge_expired(self).await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        follow::follow_events_after(self, last_event_id, options).await
    }

    fn open_follows(&self) -> usize {
        follow::open_follows(self)
    }

    fn retention(&self) -> Retention {
        self.inner.options.retention
    }

    async fn stats(&self) -> Result<StoreStats> {
        inspect::stats(self).await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        inspect::list_streams(self, after, limit).await
    }

    async fn check(&self) -> Result<HealthReport> {
        inspect::check(self).await
    }
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        sessions::put_session(self, session_id, state, ttl).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        sessions::get_session(self, session_id).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        sessions::delete_session(self, session_id).await
    }
}

/// Durable tasks in `mes_tasks`, `mes_task_inputs` and `mes_instances`; see
/// the crate's "Tasks" section.
#[async_trait]
impl TaskStore for SqliteStore {
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> Result<Option<TaskRecord>> {
        tasks::try_create(self, id, task).await
    }

    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
        tasks::get(self, id, who).await
    }

    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        tasks::answer(self, id, who, responses).await
    }

    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        tasks::request_cancel(self, id, who, mode, reason).await
    }

    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        tasks::watch(self, id, who, after, max_wait).await
    }

    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
        tasks::purge_expired_tasks(self).await
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        tasks::delete(self, id).await
    }
}

#[async_trait]
impl RuntimeStore for SqliteStore {
    async fn apply_claimed(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        tasks::apply(self, task, by, change).await
    }

    async fn watch_claimed(
        &self,
        task: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        tasks::watch_claimed(self, task, after, max_wait).await
    }

    async fn claim(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        tasks::claim(self, by, limit).await
    }

    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        tasks::heartbeat(self, me, lease).await
    }

    async fn is_alive(&self, id: InstanceId) -> Result<bool> {
        tasks::is_alive(self, id).await
    }

    async fn instances(&self) -> Result<Vec<InstanceLease>> {
        tasks::instances(self).await
    }

    async fn view_claimed(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        tasks::view(self, task).await
    }
}
