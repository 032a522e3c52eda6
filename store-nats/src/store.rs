//! The store: connecting, closing, accessors, and the event job's trait
//! impl, which hands each call to the file for its job (sessions and tasks
//! implement theirs in their own files).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
#[cfg(doc)]
use mcp_event_store_core::Error;
use mcp_event_store_core::backend::{BackendHandle, EventBackend};
use mcp_event_store_core::{
    EventId, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result, StoreOptions,
    StoreStats, StreamCursor, StreamPage,
};

use crate::error::{NAME, backend};
use crate::state::{Inner, stream_names};
use crate::{NatsOptions, append, follow, inspect, purge, replay, setup};

/// An [`EventStore`](mcp_event_store_core::EventStore) and
/// [`SessionStore`](mcp_event_store_core::SessionStore) on NATS JetStream.
///
/// Cheap to clone; clones share one connection, which reconnects by
/// itself after it is lost. Calls in flight when it drops may fail; later
/// calls go through once a server answers again.
#[derive(Clone)]
pub struct NatsStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for NatsStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsStore")
            .field("prefix", &self.inner.names.prefix)
            .finish_non_exhaustive()
    }
}

impl NatsStore {
    /// Connects with default options; see [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, NatsOptions::default()).await
    }

    /// Connects to the server or cluster `url` names (see the
    /// [crate docs](crate#connecting); a parameter in the URL wins over the
    /// same setting in `options`), creates the streams and buckets that are
    /// missing, checks the format marker and loads (or creates) the
    /// stream-token secret.
    pub async fn connect_with(url: &str, options: NatsOptions) -> Result<Self> {
        Ok(Self {
            inner: Arc::new(setup::open(url, options).await?),
        })
    }

    /// Closes this handle and its clones: stops the wake-up watcher and
    /// wakes every open follow, which then ends with [`Error::Closed`];
    /// every later call fails with [`Error::Closed`], as do further pages
    /// of replays already open. Calls in flight finish. Closing again does
    /// nothing. The connection closes when the last clone is dropped.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.stop_watchers();
        self.inner.wakeups.wake_all();
        self.inner.task_wakeups.wake_all();
    }

    /// The prefix every stream, bucket and subject of this store is named
    /// with.
    pub fn prefix(&self) -> &str {
        &self.inner.names.prefix
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &NatsOptions {
        &self.inner.options
    }

    /// The name of the server that leads the events stream now (on a
    /// cluster; the one server otherwise): for operators and failover
    /// tests.
    pub async fn events_leader(&self) -> Result<String> {
        let mut events = self.inner.events.clone();
        let info = events.info().await.map_err(backend)?;
        Ok(info
            .cluster
            .as_ref()
            .and_then(|cluster| cluster.leader.clone())
            .unwrap_or_default())
    }

    /// Deletes this store's streams and buckets: every event, session and
    /// the secret. For tests and decommissioning; handles still open on
    /// the prefix fail until the store is opened again.
    pub async fn destroy(&self) -> Result<()> {
        let js = &self.inner.js;
        for stream in stream_names(&self.inner.names.prefix) {
            match js.delete_stream(&stream).await {
                Ok(_) => {}
                Err(e) if e.to_string().contains("not found") => {}
                Err(e) => return Err(backend(e)),
            }
        }
        Ok(())
    }
}

impl BackendHandle for NatsStore {
    const NAME: &'static str = NAME;

    fn store_options(&self) -> &StoreOptions {
        &self.inner.options.store
    }

    fn is_closed(&self) -> bool {
        self.is_closed_now()
    }
}

#[async_trait]
impl EventBackend for NatsStore {
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
