//! The store: a handle on a shared sled database, how it is opened and
//! closed, its accessors, and the event job's trait impl, which hands each
//! call to the file for its job (sessions and tasks implement theirs in
//! their own files).

use std::fmt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use mcp_event_store_core::backend::{BackendHandle, EventBackend};
#[cfg(doc)]
use mcp_event_store_core::{Error, EventStore, SessionStore};
use mcp_event_store_core::{
    EventId, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result, StoreOptions,
    StoreStats, StreamCursor, StreamPage,
};

use crate::error::NAME;
use crate::flusher::wait_flushed;
use crate::options::{Durability, SledOptions, SledUrl};
use crate::shared::{Shared, blocking};
use crate::state::Handle;
use crate::{append, follow, inspect, purge, replay};

/// An [`EventStore`] and [`SessionStore`] in a sled database.
///
/// Cheap to clone; clones share the database, the options and
/// [`close`](Self::close). See the crate docs for durability, crash
/// behaviour and the one-process rule.
#[derive(Clone)]
pub struct SledStore {
    pub(crate) handle: Arc<Handle>,
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.handle.path)
            .field("durability", &self.handle.durability)
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens the database a `sled://` URL names: `sled:///absolute/path` or
    /// `sled://relative/path`, with default options and the URL's
    /// parameters (see [`SledOptions::from_url`]): `?flush_interval_ms=N`
    /// selects [`Durability::Interval`], `?durability=flush` is the
    /// default, `?follow_recheck_ms=N` sets
    /// [`SledOptions::follow_recheck`]. The path is taken literally (no
    /// percent-decoding).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SledOptions::default()).await
    }

    /// [`connect`](Self::connect) with options: the URL names the
    /// directory, and a parameter it gives (durability, re-check interval)
    /// wins over the same setting in `options`.
    pub async fn connect_with(url: &str, options: SledOptions) -> Result<Self> {
        let url = SledUrl::parse(url)?;
        let options = url.apply(options);
        Self::open(url.path, options).await
    }

    /// Opens (creating if needed) the database in directory `path`.
    ///
    /// If this process already has it open, the new handle shares that
    /// database (with its own options). Fails with `Error::Config` if the
    /// options are invalid ([`SledOptions::validate`]), `Error::Backend` if
    /// another process holds the directory, and `Error::IncompatibleFormat`
    /// if a newer incompatible release wrote it, or it is not an event
    /// store.
    pub async fn open(path: impl AsRef<Path>, options: SledOptions) -> Result<Self> {
        options.validate()?;
        let path = path.as_ref().to_owned();
        let cache = options.cache_capacity;
        let shared = blocking(move || Shared::open(&path, cache)).await?;
        Self::with_shared(
            shared,
            options.store,
            options.durability,
            options.follow_recheck,
        )
        .await
    }

    /// Another handle on the same database, with other store options (and
    /// this handle's durability and follow re-check interval). It has a
    /// [`close`](Self::close) of its own.
    pub async fn handle_with_options(&self, options: StoreOptions) -> Result<Self> {
        options.validate()?;
        Self::with_shared(
            self.shared()?,
            options,
            self.handle.durability,
            self.handle.follow_recheck,
        )
        .await
    }

    async fn with_shared(
        shared: Arc<Shared>,
        store: StoreOptions,
        durability: Durability,
        follow_recheck: Duration,
    ) -> Result<Self> {
        if let Durability::Interval(interval) = durability {
            let shared = shared.clone();
            blocking(move || shared.enter_relaxed(interval)).await?;
        }
        Ok(Self {
            handle: Arc::new(Handle {
                path: shared.path.clone(),
                shared: RwLock::new(Some(shared)),
                store,
                durability,
                follow_recheck,
                limits_noted: AtomicBool::new(false),
            }),
        })
    }

    /// Flushes everything written so far and closes this handle and its
    /// clones: afterwards every call through them fails with
    /// [`Error::Closed`]. When it was the last handle on the database in
    /// this process (and no replay stream is still reading), the database
    /// closes too, on the blocking pool, before this returns, and unlocks
    /// its directory; until then the directory stays locked. Other handles
    /// on the directory ([`open`](Self::open) again,
    /// [`handle_with_options`](Self::handle_with_options)) stay open.
    ///
    /// Idempotent: closing a closed handle returns `Ok(())` at once.
    ///
    /// # Errors
    ///
    /// The flush's failure, as [`Error::Backend`]: the handle is closed all
    /// the same, but what it acknowledged with [`Durability::Interval`]
    /// since the last successful flush may not be on disk. (Dropping the
    /// last clone instead also flushes and closes, on the dropping thread,
    /// but nobody learns whether that flush failed.)
    pub async fn close(&self) -> Result<()> {
        let taken = self
            .handle
            .shared
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(shared) = taken else {
            return Ok(());
        };
        let flushed = wait_flushed(shared.flusher.request(None)).await;
        blocking(move || {
            drop(shared);
            Ok(())
        })
        .await?;
        flushed
    }

    /// The database directory (canonical).
    pub fn path(&self) -> &Path {
        &self.handle.path
    }

    /// This handle's durability.
    pub fn durability(&self) -> Durability {
        self.handle.durability
    }

    /// This handle's store options.
    pub fn options(&self) -> &StoreOptions {
        &self.handle.store
    }

    /// How often this handle's idle followers re-read their stream.
    pub fn follow_recheck(&self) -> Duration {
        self.handle.follow_recheck
    }

    /// Flushes everything written so far to disk (through the group
    /// flusher). Useful with [`Durability::Interval`] before a planned stop.
    pub async fn flush(&self) -> Result<()> {
        wait_flushed(self.shared()?.flusher.request(None)).await
    }
}

impl BackendHandle for SledStore {
    const NAME: &'static str = NAME;

    fn store_options(&self) -> &StoreOptions {
        &self.handle.store
    }

    fn is_closed(&self) -> bool {
        self.handle
            .shared
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

#[async_trait]
impl EventBackend for SledStore {
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
