//! [`PostgresStore`]: the event store and session store.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Row};

use mcp_event_store_core::backend::dense::{self, DenseStream};
use mcp_event_store_core::backend::follow;
use mcp_event_store_core::backend::{
    Page, StreamKey, StreamToken, observe, paged_replay, retry_from_millis, retry_to_millis,
    validate_session_id, validate_stream_id,
};
use mcp_event_store_core::{
    Error, EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Result,
    SessionStore, StoreOptions, StoreStats, StoredEvent, StreamCursor, StreamPage,
};

use crate::batch::{AppendRequest, Batcher, Limits};
use crate::follow::{Follows, Notifier, channel};
use crate::options::{
    DEFAULT_APPLICATION_NAME, MAX_PAGE_SIZE, PostgresOptions, VACUUM_MIN_ROWS, Vacuum, quote_schema,
};
use crate::sql::Sql;
use crate::{NAME, backend, inspect, purge, setup};

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
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    sql: Sql,
    key: StreamKey,
    options: StoreOptions,
    schema: String,
    page_size: i64,
    /// Whether purges vacuum the store's tables.
    vacuum: Vacuum,
    /// Rows this handle's purges deleted since it last vacuumed.
    deleted_since_vacuum: AtomicU64,
    /// Runs appends alone or batched with concurrent ones.
    batcher: Batcher,
    /// The wake-up hub and the listener of this handle's follows.
    follows: Follows,
    /// Announces this handle's appends to other handles.
    notifier: Notifier,
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
    /// migrated if needed, a pool of 10 connections; the URL's `schema=` and
    /// `vacuum=` parameters apply (see
    /// [`PostgresOptions::with_url_parameters`]).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PostgresOptions::default()).await
    }

    /// Connects with these options. The URL is anything sqlx's
    /// `PgConnectOptions` parses (`postgres://user:pass@host:port/db?...`),
    /// plus this crate's own parameters `schema=name` and `vacuum=off|auto`,
    /// which override the matching fields of `options` and are taken out
    /// before sqlx sees the URL (see
    /// [`PostgresOptions::with_url_parameters`]).
    pub async fn connect_with(url: &str, options: PostgresOptions) -> Result<Self> {
        let (options, url) = options.with_url_parameters(url)?;
        options.validate()?;
        let mut connect = PgConnectOptions::from_str(&url)
            .map_err(|e| Error::Config(format!("invalid PostgreSQL URL: {e}")))?;
        match &options.application_name {
            Some(name) => connect = connect.application_name(name),
            None if connect.get_application_name().is_none() => {
                connect = connect.application_name(DEFAULT_APPLICATION_NAME);
            }
            None => {}
        }
        let key = setup::prepare(&connect, &options).await?;
        let listener_connect = connect.clone();
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            // sqlx pings before every acquire by default: a round trip that
            // cost 7% of append throughput here. A dead connection instead
            // fails its one call and the pool replaces it.
            .test_before_acquire(false)
            .connect_lazy_with(connect);
        Self::build(pool, listener_connect, key, options)
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
        let notifier = Notifier::start(pool.clone(), sql.notify.clone());
        let follows = Follows::new(
            channel,
            listener_connect,
            pool.options().get_acquire_timeout(),
            options.follow_recheck,
        );
        let batcher = Batcher::start(
            pool.clone(),
            sql.append.clone(),
            Limits::new(options.store.retention),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                sql,
                batcher,
                pool,
                key,
                page_size,
                schema: options.schema,
                options: options.store,
                vacuum: options.vacuum,
                deleted_since_vacuum: AtomicU64::new(0),
                follows,
                notifier,
            }),
        })
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

    /// Closes the store: stops the follow listener (closing its
    /// connection), then closes the pool, waiting for calls in flight.
    /// Later calls fail; open follows end with an error at their next
    /// read.
    pub async fn close(&self) {
        self.inner.follows.close().await;
        self.inner.pool.close().await;
    }

    pub(crate) fn sql(&self) -> &Sql {
        &self.inner.sql
    }

    /// Counts rows a purge deleted and says whether, under
    /// [`Vacuum::Auto`], enough have gone since the last vacuum to weigh
    /// one (see [`purge::vacuum_if_due`]).
    pub(crate) fn add_deleted(&self, rows: u64) -> Option<u64> {
        let total = self
            .inner
            .deleted_since_vacuum
            .fetch_add(rows, Ordering::Relaxed)
            .saturating_add(rows);
        (self.inner.vacuum == Vacuum::Auto && total >= VACUUM_MIN_ROWS).then_some(total)
    }

    /// Starts counting afresh after a vacuum that covered `rows` deletions.
    pub(crate) fn vacuumed(&self, rows: u64) {
        // Deletions that raced with the vacuum stay counted.
        let _ = self.inner.deleted_since_vacuum.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |n| Some(n.saturating_sub(rows)),
        );
    }

    pub(crate) fn now(&self) -> i64 {
        self.inner.options.clock.now_millis()
    }

    async fn append(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        self.inner
            .options
            .check_append(stream_id, event.data.len())?;
        let token = self.inner.key.token(stream_id);
        let appended = self
            .inner
            .batcher
            .append(AppendRequest {
                token,
                stream_id: Bytes::copy_from_slice(stream_id.as_bytes()),
                data: Bytes::copy_from_slice(event.data),
                retry_ms: retry_to_millis(event.retry),
                now: self.now(),
            })
            .await?;
        if appended.is_some() {
            // Committed: the followers' re-read will see it.
            self.inner.follows.hub().wake(&token);
            self.inner.notifier.announce(token);
        }
        let Some((incarnation, seq)) = appended else {
            // The stream row's stored id differs from ours: two stream ids
            // share a 120-bit token. Never mix their events.
            return Err(Error::Corrupt(format!(
                "stream token {token} already belongs to another stream id; \
                 refusing to mix two streams"
            )));
        };
        Ok(EventId::new(
            token,
            dense::position(stored_number(incarnation)?, stored_number(seq)?),
        ))
    }

    async fn open_replay(&self, raw: &str) -> Result<Replay> {
        let cursor: EventId = raw.parse()?;
        let (incarnation, after) = dense::cursor_parts(raw, cursor.position)?;
        // Stored numbers are positive BIGINTs: a larger one was never issued.
        if i64::try_from(incarnation).is_err() || i64::try_from(after).is_err() {
            return Err(Error::unknown_event_id(raw));
        }
        let at = PageAt {
            token: cursor.token,
            incarnation,
            after,
        };
        let mut page = fetch_page(
            self.inner.pool.clone(),
            self.inner.sql.page.clone(),
            at,
            self.inner.page_size,
            true,
        )
        .await?;
        let Some(mut header) = page.header.take() else {
            return Err(Error::unknown_event_id(raw));
        };
        let stream_id = header
            .stream_id
            .take()
            .ok_or_else(|| Error::Corrupt("stream row without a stream id".into()))?;
        // Another incarnation (an earlier life of the stream, or a forgery),
        // a sequence number beyond the newest: never issued, unknown.
        dense::check_cursor(raw, &cursor, header.dense())?;
        page.header = Some(header);
        let first = page.into_page(raw, at, self.inner.page_size)?;

        let pool = self.inner.pool.clone();
        let sql = self.inner.sql.page.clone();
        let limit = self.inner.page_size;
        let raw = raw.to_owned();
        let mut first = Some(first);
        let events = paged_replay(dense::position(incarnation, after), move |position| {
            let prefetched = first.take();
            let pool = pool.clone();
            let sql = sql.clone();
            let raw = raw.clone();
            async move {
                if let Some(page) = prefetched {
                    return Ok(page);
                }
                let at = PageAt {
                    after: position.minor,
                    ..at
                };
                fetch_page(pool, sql, at, limit, false)
                    .await?
                    .into_page(&raw, at, limit)
            }
        });
        Ok(Replay { stream_id, events })
    }
}

/// A stored incarnation or sequence number as the `u64` an id carries;
/// the schema keeps them positive.
fn stored_number(n: i64) -> Result<u64> {
    u64::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::Corrupt(format!("stored incarnation or sequence number {n}")))
}

/// Decodes a stored stream or session id.
pub(crate) fn decode_id(bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Corrupt("stored stream id is not UTF-8".into()))
}

/// Where a page starts: after sequence number `after` of the stream's
/// incarnation `incarnation`.
#[derive(Clone, Copy)]
struct PageAt {
    token: StreamToken,
    incarnation: u64,
    after: u64,
}

/// The stream's row, as the page statement read it.
struct Header {
    incarnation: u64,
    first_seq: u64,
    last_seq: u64,
    stream_id: Option<String>,
}

impl Header {
    fn dense(&self) -> DenseStream {
        DenseStream {
            incarnation: self.incarnation,
            last_seq: self.last_seq,
            first_retained: (self.first_seq <= self.last_seq).then_some(self.first_seq),
        }
    }
}

/// The rows of one page query, before the gap checks.
struct RawPage {
    header: Option<Header>,
    events: Vec<(u64, Option<i64>, Bytes)>,
}

impl RawPage {
    /// Orders the page (the query's branches are not ordered against each
    /// other) and applies the gap check (C5). A stream that is gone, or is
    /// in another incarnation (deleted or expired under the replay, perhaps
    /// started again), is [`Error::EventsPurged`]: the rest of the replay's
    /// stream is lost, and nothing of the new life belongs to it.
    fn into_page(mut self, raw: &str, at: PageAt, limit: i64) -> Result<Page> {
        let PageAt {
            token,
            incarnation,
            after,
        } = at;
        if self
            .header
            .as_ref()
            .is_none_or(|h| h.incarnation != incarnation)
        {
            return Err(Error::events_purged(raw));
        }
        self.events.sort_unstable_by_key(|(seq, _, _)| *seq);
        let first = self.events.first().map(|(seq, _, _)| *seq);
        dense::check_page(raw, after, first, self.header.as_ref().map(|h| h.last_seq))?;
        // Dense numbering: a hole inside a page would be corruption.
        for (offset, (seq, _, _)) in self.events.iter().enumerate() {
            if *seq != after + 1 + offset as u64 {
                return Err(Error::Corrupt(format!(
                    "event {seq} of stream {token} is out of sequence"
                )));
            }
        }
        // Short page, or the stream's newest event: no need to ask again.
        let last = (self.events.len() as i64) < limit
            || self.header.as_ref().is_some_and(|h| {
                self.events
                    .last()
                    .is_some_and(|(seq, _, _)| *seq >= h.last_seq)
            });
        let events = self
            .events
            .into_iter()
            .map(|(seq, retry, data)| StoredEvent {
                id: EventId::new(token, dense::position(incarnation, seq)),
                data,
                retry: retry_from_millis(retry),
            })
            .collect();
        Ok(Page { events, last })
    }
}

/// Runs the page statement. `at`'s numbers fit a BIGINT (checked when the
/// replay opened; later cursors come from stored rows).
async fn fetch_page(
    pool: PgPool,
    sql: sqlx::SqlStr,
    at: PageAt,
    limit: i64,
    with_stream_id: bool,
) -> Result<RawPage> {
    let rows: Vec<PgRow> = sqlx::query(sql)
        .bind(&at.token.as_bytes()[..])
        .bind(at.after as i64)
        .bind(limit)
        .bind(with_stream_id)
        .bind(at.incarnation as i64)
        .fetch_all(&pool)
        .await
        .map_err(backend)?;
    let mut page = RawPage {
        header: None,
        events: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        let seq: Option<i64> = row.try_get(0).map_err(backend)?;
        match seq {
            Some(seq) => {
                let retry: Option<i64> = row.try_get(1).map_err(backend)?;
                let data: Vec<u8> = row.try_get(2).map_err(backend)?;
                page.events.push((seq as u64, retry, Bytes::from(data)));
            }
            None => {
                let incarnation: i64 = row.try_get(3).map_err(backend)?;
                let first_seq: i64 = row.try_get(4).map_err(backend)?;
                let last_seq: i64 = row.try_get(5).map_err(backend)?;
                let stream_id: Option<Vec<u8>> = row.try_get(6).map_err(backend)?;
                page.header = Some(Header {
                    incarnation: stored_number(incarnation)?,
                    first_seq: first_seq as u64,
                    last_seq: last_seq as u64,
                    stream_id: stream_id.map(decode_id).transpose()?,
                });
            }
        }
    }
    Ok(page)
}

#[async_trait]
impl EventStore for PostgresStore {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        observe::append(
            NAME,
            stream_id,
            event.data.len(),
            self.append(stream_id, event),
        )
        .await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(NAME, last_event_id, self.open_replay(last_event_id)).await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        let Some(id) = EventId::parse(event_id) else {
            return Ok(None);
        };
        if dense::parts(id.position).is_none() {
            // A zero part: never issued, no need to ask.
            return Ok(None);
        }
        let row: Option<PgRow> = sqlx::query(self.inner.sql.lookup.clone())
            .bind(&id.token.as_bytes()[..])
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(backend)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let stream_id: Vec<u8> = row.try_get(0).map_err(backend)?;
        let incarnation: i64 = row.try_get(1).map_err(backend)?;
        let first_seq: i64 = row.try_get(2).map_err(backend)?;
        let last_seq: i64 = row.try_get(3).map_err(backend)?;
        let stream = Header {
            incarnation: stored_number(incarnation)?,
            first_seq: first_seq as u64,
            last_seq: last_seq as u64,
            stream_id: None,
        };
        if stream.dense().retains(id.position) {
            decode_id(stream_id).map(Some)
        } else {
            Ok(None)
        }
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        validate_stream_id(stream_id)?;
        let token = self.inner.key.token(stream_id);
        purge::delete_stream(self, token, stream_id).await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        observe::purge(NAME, purge::purge(self)).await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        let cursor: EventId = last_event_id.parse()?;
        let follows = &self.inner.follows;
        // Listening, and subscribed, before the first read: an append
        // committed after that read is announced, by the listener or by
        // this handle's own append.
        follows.listen().await?;
        let subscription = follows.hub().subscribe(cursor.token);
        let first = self.replay_events_after(last_event_id).await?;
        let store = self.clone();
        Ok(follow::follow(
            NAME,
            first,
            subscription,
            last_event_id.to_owned(),
            follows.recheck(),
            options,
            follow::reread(store),
        ))
    }

    fn open_follows(&self) -> usize {
        self.inner.follows.hub().followers()
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
impl SessionStore for PostgresStore {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        let expires_at = self
            .inner
            .options
            .check_session_put(session_id, state.len(), ttl)?;
        self.inner
            .pool
            .execute(
                sqlx::query(self.inner.sql.put_session.clone())
                    .bind(session_id.as_bytes())
                    .bind(state)
                    .bind(expires_at),
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        if validate_session_id(session_id).is_err() {
            return Ok(None);
        }
        let state: Option<Vec<u8>> = sqlx::query_scalar(self.inner.sql.get_session.clone())
            .bind(session_id.as_bytes())
            .bind(self.now())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(backend)?;
        Ok(state.map(Bytes::from))
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        if validate_session_id(session_id).is_err() {
            return Ok(false);
        }
        let live: Option<bool> = sqlx::query_scalar(self.inner.sql.delete_session.clone())
            .bind(session_id.as_bytes())
            .bind(self.now())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(backend)?;
        Ok(live.unwrap_or(false))
    }
}
