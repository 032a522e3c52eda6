//! The store: connecting, closing, accessors, and the event job's trait
//! impl, which hands each call to the file for its job (sessions and tasks
//! implement theirs in their own files).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use mcp_event_store_core::backend::{BackendHandle, EventBackend};
use mcp_event_store_core::{
    Error, EventId, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result,
    StoreOptions, StoreStats, StreamCursor, StreamPage,
};
#[cfg(doc)]
use mcp_event_store_core::{EventStore, SessionStore};

use crate::conn::Conn;
use crate::error::NAME;
use crate::state::Inner;
use crate::{RedisOptions, append, follow, inspect, purge, replay, setup};

/// An [`EventStore`] and [`SessionStore`] on Redis Streams.
///
/// Cheap to clone; clones share one connection (or one set of cluster node
/// connections), which reconnects by itself after the connection is lost.
/// Calls in flight when a connection drops may fail; later calls go through
/// once the server answers again.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("key_prefix", &self.inner.keys.prefix())
            .field("cluster", &self.is_cluster())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects with default options; see [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the server or cluster `url` names (see the
    /// [crate docs](crate#connecting) for the forms and the parameters this
    /// crate reads from the URL, which override the same settings in
    /// `options`), checks the server version and the format marker, and
    /// loads (or creates) the stream-token secret.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        Ok(Self {
            inner: Arc::new(setup::open(url, options).await?),
        })
    }

    /// Closes this handle and its clones: stops the follow watcher and the
    /// task subscriber (closing their connections) and wakes every open
    /// follow and task watch, which then end with [`Error::Closed`]; every later call fails with [`Error::Closed`],
    /// as do further pages of replays already open. Calls in flight finish.
    /// Closing again does nothing. The shared connection itself closes when
    /// the last clone of the handle is dropped.
    pub async fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.follow.close();
        self.inner.tasks.close();
    }

    /// The key prefix every key of this store starts with.
    pub fn key_prefix(&self) -> &str {
        self.inner.keys.prefix()
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    /// Removes every key under this store's prefix: all streams, sessions, the
    /// secret and the format marker. For tests and for decommissioning. Handles
    /// still open on the prefix go on as after a server restart without
    /// persistence (see the [crate docs](crate#restart-without-persistence)).
    pub async fn destroy(&self) -> Result<u64> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        purge::unlink_matching(&self.inner.conn, &self.inner.keys.all_pattern()).await
    }
}

impl BackendHandle for RedisStore {
    const NAME: &'static str = NAME;

    fn store_options(&self) -> &StoreOptions {
        &self.inner.options.store
    }

    fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl EventBackend for RedisStore {
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
