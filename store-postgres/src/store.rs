//! [`PostgresStore`]: connecting, closing, accessors, and the event job's
//! trait impl, which hands each call to the file for its job (sessions and
//! tasks implement theirs in their own files).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool};

use mcp_event_store_core::backend::{BackendHandle, EventBackend, StreamKey};
#[cfg(doc)]
use mcp_event_store_core::{Error, EventStore, SessionStore};
use mcp_event_store_core::{
    EventId, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result, StoreOptions,
    StoreStats, StreamCursor, StreamPage,
};

use crate::append::{Batcher, Limits, Writer};
use crate::batches::Batched;
use crate::creates::{self, Creates};
use crate::error::NAME;
use crate::follow::{Follows, Listeners, Notifier, channel};
use crate::options::{MAX_PAGE_SIZE, PostgresOptions, Vacuum, quote_schema};
use crate::sql::{Sql, render};
use crate::state::Inner;
use crate::steps::Applies;
use crate::tasks::Reads;
use crate::{append, follow, inspect, purge, replay, setup};

/// An [`EventStore`] and [`SessionStore`] on PostgreSQL.
///
/// Cheap to clone: clones share one pool. Every instance opened on the same
/// database and schema shares the same events, sessions and stream key.
/// See the [crate docs](crate) for the schema and the ordering scheme.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use mcp_event_store_core::{EventStore, NewEvent};
/// use mcp_event_store_postgres::PostgresStore;
///
/// let store = PostgresStore::connect("postgres://app@db.internal/app").await?;
/// let id = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
/// # let _ = id; Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .field("pool_size", &self.inner.pool.size())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects with default options: schema `mcp_event_store`, created and
    /// migrated if needed, a pool of 10 connections; the URL's parameters
    /// apply (see [`PostgresOptions::from_url`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects with these options. The URL is anything sqlx's
    /// `PgConnectOptions` parses (`postgres://user:pass@host:port/db?...`),
    /// plus this crate's own parameters; every parameter it gives
    /// overrides the matching field of `options` (see
    /// [`PostgresOptions::from_url`], which also lists the parameters it
    /// takes: any other is [`Error::Config`]).
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self> {
        let (options, connect) = options.apply_url(url)?;
        options.validate()?;
        let connect = setup::connect_options(connect, &options);
        let key = setup::prepare(&connect, &options).await?;
        let pool = setup::pool(connect.clone(), &options);
        Self::build(pool, connect, key, options)
    }

    /// A store on an existing pool, for applications that share one pool
    /// between the store and their own queries. The store schema-qualifies
    /// every statement, so the pool needs no `search_path`; migrations run on
    /// a separate connection made with the pool's connect options.
    /// `options.max_connections`, `acquire_timeout` and `application_name`
    /// are ignored: the pool's own settings apply. Following opens its one
    /// listening connection (see the crate docs, "Following") with the
    /// pool's connect options, outside the pool.
    pub async fn from_pool(pool: PgPool, options: PostgresOptions) -> Result<Self> {
        options.validate()?;
        let connect = pool.connect_options();
        let key = setup::prepare(&connect, &options).await?;
        let listener_connect = (*connect).clone();
        Self::build(pool, listener_connect, key, options)
    }

    fn build(
        pool: PgPool,
        listener_connect: PgConnectOptions,
        key: StreamKey,
        options: PostgresOptions,
    ) -> Result<Self> {
        let page_size = options.store.page_size.min(MAX_PAGE_SIZE) as i64;
        let channel = channel(&options.schema);
        let sql = Sql::new(&quote_schema(&options.schema), &channel);
        let listeners = Listeners::new(channel);
        let notifier = Notifier::start(pool.clone(), sql.notify.clone(), listeners.clone());
        let heartbeats = setup::side_pool(listener_connect.clone(), &pool);
        let follows = Follows::new(
            listeners,
            listener_connect,
            pool.options().get_acquire_timeout(),
            options.follow_recheck,
        );
        let batcher = Batcher::start(Writer {
            pool: pool.clone(),
            batch: sql.append.clone(),
            one: sql.append_one.clone(),
            limits: Limits::new(options.store.retention),
            notifier: notifier.clone(),
        });
        let schema = quote_schema(&options.schema);
        let creates = Batched::start(Creates {
            pool: pool.clone(),
            one: render(creates::CREATE, &schema),
            batch: render(creates::CREATE_BATCH, &schema),
        });
        let reads = Batched::start(Reads::new(pool.clone(), &schema));
        let applies = Batched::start(Applies::new(
            pool.clone(),
            &schema,
            notifier.clone(),
            follows.tasks().clone(),
        ));
        Ok(Self {
            inner: Arc::new(Inner {
                sql,
                batcher,
                creates,
                reads,
                applies,
                pool,
                key,
                page_size,
                schema: options.schema,
                options: options.store,
                vacuum: options.vacuum,
                deleted_since_vacuum: AtomicU64::new(0),
                follows,
                notifier,
                heartbeats,
            }),
        })
    }

    /// Closes the store: stops the follow listener (closing its
    /// connection), then closes the pool, waiting for calls in flight.
    /// Closing again does nothing. Later calls, on this handle and its
    /// clones, fail with [`Error::Closed`]; open follows end with that
    /// error at their next read.
    pub async fn close(&self) {
        self.inner.follows.close().await;
        self.inner.pool.close().await;
        self.inner.heartbeats.close().await;
        // Task watchers re-read, find the store closed, and end.
        self.inner.follows.tasks().wake_all();
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema holding the store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The shared store options this handle applies.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// Whether this handle's purges vacuum the store's tables.
    pub fn vacuum(&self) -> Vacuum {
        self.inner.vacuum
    }

    /// The `LISTEN`/`NOTIFY` channel of this store's appends:
    /// `mcp_event_store.<schema>` (hashed to fit 63 bytes for long schema
    /// names). See the crate docs, "Following".
    pub fn notify_channel(&self) -> &str {
        self.inner.follows.channel()
    }
}

impl BackendHandle for PostgresStore {
    const NAME: &'static str = NAME;

    fn store_options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// The pool is closed by [`close`](PostgresStore::close) (or by its
    /// owner, for a store [`from_pool`](PostgresStore::from_pool)).
    fn is_closed(&self) -> bool {
        self.inner.pool.is_closed()
    }
}

#[async_trait]
impl EventBackend for PostgresStore {
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
