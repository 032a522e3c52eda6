//! The store: connecting, closing, accessors, and the trait impls, which
//! delegate to the files named for each job.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
#[cfg(doc)]
use mcp_event_store_core::Error;
use mcp_event_store_core::backend::observe;
use mcp_event_store_core::{
    EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result,
    Retention, SessionStore, StoreStats, StreamCursor, StreamPage,
};

use crate::conn::Conn;
use crate::error::NAME;
use crate::state::Inner;
use crate::{RedisOptions, purge, setup};

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
        self.ensure_open()?;
        purge::unlink_matching(&self.inner.conn, &self.inner.keys.all_pattern()).await
    }
}

#[async_trait]
impl EventStore for RedisStore {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        self.ensure_open()?;
        let id = observe::append(
            NAME,
            stream_id,
            event.data.len(),
            self.append(stream_id, event),
        )
        .await?;
        // The script returned: the event is visible to every reader now.
        self.inner.follow.hub().wake(&id.token);
        Ok(id)
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        self.ensure_open()?;
        observe::replay(NAME, last_event_id, self.open_replay(last_event_id)).await
    }

    async fn replay_stream(&self, stream_id: &str) -> Result<Replay> {
        self.ensure_open()?;
        observe::replay(NAME, stream_id, self.open_stream_replay(stream_id)).await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        self.ensure_open()?;
        self.lookup(event_id).await
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        self.ensure_open()?;
        self.delete(stream_id).await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        self.ensure_open()?;
        observe::purge(NAME, self.purge()).await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        self.ensure_open()?;
        self.open_follow(last_event_id, options).await
    }

    fn open_follows(&self) -> usize {
        self.inner.follow.hub().followers()
    }

    fn retention(&self) -> Retention {
        self.inner.options.store.retention
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.ensure_open()?;
        self.inspect_stats().await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        self.ensure_open()?;
        self.inspect_list(after, limit).await
    }

    async fn check(&self) -> Result<HealthReport> {
        self.ensure_open()?;
        self.inspect_check().await
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        self.ensure_open()?;
        self.session_put(session_id, state, ttl).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        self.ensure_open()?;
        self.session_get(session_id).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        self.ensure_open()?;
        self.session_delete(session_id).await
    }
}
