//! SQLite backend for **mcp-event-store**: an embedded, durable store for
//! resumable MCP Streamable HTTP streams.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_sqlite::SqliteStore;
//!
//! let store = SqliteStore::open("events.db").await?;
//! let id = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
//! let replay = store.replay_events_after(&id.to_string()).await?;
//! # drop(replay);
//! store.close().await;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! * **WAL mode**, one **writer task** owning one connection, and a pool of
//!   read connections. Appends from every stream queue at the writer, which
//!   commits whatever is waiting in one transaction (group commit) and
//!   answers each caller only after the commit: under
//!   [`Durability::PowerLoss`] many appends share one fsync instead of paying
//!   one each.
//! * **Event ids** are `v1.<stream token>.<incarnation>-<seq>` (see
//!   [`dense`]). Each stream has a dense sequence (1, 2, 3, ...) assigned
//!   inside the writer's transaction, so sequence order is commit order and
//!   a reader can never see an event appear behind its cursor (C6). Its
//!   **incarnation** names one life of the stream: a stream deleted, or
//!   expired whole, and then written again starts at sequence 1 under a new
//!   incarnation, taken from a store-wide counter
//!   (`mes_meta.last_incarnation`) that only goes up, in the statement that
//!   creates the stream's row. So no id is ever issued twice, by any
//!   process, and an id of an earlier life is refused with
//!   [`Error::UnknownEventId`] rather than resuming into the new one. The
//!   steady-state append is still one statement: the incarnation is drawn
//!   only when a stream's row is created. Several processes may share one
//!   file: SQLite's write lock serializes their writers, and `busy_timeout`
//!   makes them wait rather than fail.
//! * Replay is one indexed seek plus a range read per page on the
//!   `(token, seq)` index; each page is read in one statement with the
//!   stream's row, so a replay whose stream is deleted and started again
//!   under it ends in [`Error::EventsPurged`], never in events of the new
//!   life.
//! * Retention: count and byte limits are applied inline on every append;
//!   age, sessions and anything left over go in [`EventStore::purge_expired`],
//!   in transactions of at most 500 rows interleaved with appends.
//! * **Format version** (C12): the schema is created by embedded migrations
//!   recorded in the `mes_migrations` table, and `mes_meta.format_version`
//!   names the format ([`FORMAT_VERSION`]). A database migrated by a newer,
//!   unknown release is refused with [`Error::IncompatibleFormat`].
//! * **Opening** is safe from any number of handles and processes at once,
//!   on a new file or an existing one. The busy timeout is in force from the
//!   first statement; the switch of a new file to WAL is retried while
//!   another connection makes it; the migrations and the creation of the
//!   stream secret happen once, under one write lock (`BEGIN IMMEDIATE`),
//!   and every other opener waits for it (up to
//!   [`SqliteOptions::busy_timeout`]), then finds the work done.
//! * **Format 2** (this release) added incarnations. Opening a format 1
//!   database migrates it in place: every stream and event is kept, and each
//!   stream gets an incarnation above every sequence number format 1 issued,
//!   so its new ids sort after its old ones. Format 1 ids (`<seq>`, no
//!   incarnation) are refused with [`Error::UnknownEventId`] from then on,
//!   never misread. Stop every process of the older release before opening the file with
//!   this one: an older writer still running can append under ids this
//!   release refuses (it cannot create streams: the new schema refuses rows
//!   without an incarnation).
//!
//! # Durability
//!
//! The default, [`Durability::Process`], survives the process being killed
//! at any moment (including `SIGKILL`) with nothing acknowledged lost; a
//! power loss may lose the newest commits. [`Durability::PowerLoss`] also
//! survives power loss, at the cost of an fsync per group commit.
//!
//! # Following
//!
//! [`EventStore::follow_events_after`] replays the events after a cursor,
//! then keeps the stream open and delivers each event appended to it
//! afterwards, by this handle, another handle or another process on the
//! same file (C13). Wake-ups carry no data: they only make a follower
//! re-read its stream after its newest delivered id, with the same indexed
//! read as a replay, so events arrive in order, each once, and nothing
//! queues up per follower.
//!
//! * **Appends through this handle** (or a clone of it) wake their stream's
//!   followers from the writer task, right after the commit that made them
//!   visible and before `store_event` returns. Expect a follower to have the
//!   event within about a millisecond of `store_event` returning (one read
//!   on the read pool).
//! * **Appends by another handle or process** are found by this handle's
//!   *watcher*: one task with one dedicated connection that reads
//!   `PRAGMA data_version` every [`SqliteOptions::follow_poll_interval`]
//!   (default 50 ms, URL `?follow_poll_ms=`). Its value changes when another
//!   connection committed; then the watcher reads the rows of the streams
//!   being followed and wakes those that moved. Expect the event within one
//!   poll interval of its commit (about half of one on average), plus a
//!   read. A shorter interval costs one cheap statement more per poll.
//! * **The safety net**: every follower also re-reads its stream every
//!   [`SqliteOptions::follow_recheck`] (default 5 s, URL
//!   `?follow_recheck_ms=`) whatever it was told, so a missed wake-up (the
//!   watcher's connection failing, say) delays an event, never loses it.
//!
//! **What an idle follower costs:** no connection and no task of its own:
//! a registration in the handle's wake-up hub and its suspended stream,
//! plus one indexed read per re-check interval. A thousand idle followers
//! share the read pool ([`SqliteOptions::read_connections`]) and one
//! watcher. The watcher runs only while the handle has at least one
//! follower: the first follow starts it, and it ends (closing its
//! connection) at its first poll after the last follower is dropped, or at
//! once when the handle is closed or dropped. An idle store pays nothing.
//! A follow keeps its handle alive while it is open;
//! [`SqliteStore::close`] ends every open follow with [`Error::Closed`].
//!
//! # Inspecting
//!
//! [`EventStore::stats`] and [`EventStore::list_streams`] read the stream
//! rows, never every event: a stream's count comes from its dense sequence
//! numbers (one index seek for its first retained event), its bytes from
//! the running total its row keeps, its ages from its first and last
//! events, and the store's ages from the two ends of the `stored_at` index.
//! Totals are summed 512 stream rows per statement; listings go in stream
//! token order with the last token as the cursor, one statement per page.
//! Both use the read pool and never wait for the writer.
//!
//! [`EventStore::check`] reports the format version the file holds and:
//!
//! | setting | ok | warns, and what to do |
//! |---|---|---|
//! | `journal_mode` | `wal` | anything else: put the file back in WAL mode |
//! | `synchronous` | at least what the durability needs (`NORMAL` for `process`, `FULL` for `power_loss`) | below it: open the store through this crate, which sets it on every connection |
//! | `durability` | `power_loss` | `process` (the default): a power loss or OS crash can lose the newest acknowledged events; use `?durability=power_loss` if they must survive one |
//! | `wal_autocheckpoint` | above 0 pages | 0: the WAL file grows without bound; leave it at its default (1000) |
//!
//! Each group commit records how many appends it made durable in the
//! `mcp_event_store_append_batch_size` histogram (1 for an append committed
//! alone); the other metrics are those of
//! [`mcp_event_store_core::backend::observe`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod inspect;
mod options;
mod watcher;
mod writer;

#[cfg(feature = "conformance")]
pub mod testing;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::dense::{self, DenseStream};
use mcp_event_store_core::backend::follow::{self, Wakeups};
use mcp_event_store_core::backend::{
    Page, StreamKey, StreamToken, observe, paged_replay, retry_from_millis, retry_to_millis,
    validate_stream_id,
};
use mcp_event_store_core::{
    Backend, Error, EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport,
    Replay, Result, SessionStore, Store, StoreOptions, StoreStats, StoredEvent, StreamCursor,
    StreamPage,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow,
};
use sqlx::{Connection, Row};
use tokio::sync::{mpsc, oneshot};

pub use options::{Durability, SqliteOptions};
use watcher::Watcher;
use writer::{Append, Command, Reply, Write, Writer, db_error};

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// scheme `sqlite`, facade feature `sqlite`. Its `connect` reads the URL
/// with [`SqliteOptions::from_url`] (the path and `durability`) and applies
/// the shared [`StoreOptions`].
///
/// ```
/// assert!(mcp_event_store_sqlite::BACKEND.opens("sqlite://events.db"));
/// ```
pub const BACKEND: Backend = Backend {
    name: NAME,
    schemes: &["sqlite"],
    feature: "sqlite",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = SqliteOptions::from_url(&url)?.store_options(options);
            Ok(Arc::new(SqliteStore::open_with(options).await?) as Arc<dyn Store>)
        })
    },
};

/// The backend name in errors and traces.
const NAME: &str = "sqlite";
/// The storage format this release reads and writes.
pub const FORMAT_VERSION: i64 = 2;
/// Commands that may wait for the writer before callers are held back.
const WRITER_QUEUE: usize = 4096;

/// An event store (and session store) in one SQLite database file.
///
/// Cheap to clone; clones share the writer and the read pool. Call
/// [`close`](SqliteStore::close) for a clean shutdown; dropping every clone
/// also stops the writer once queued writes are done.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    key: StreamKey,
    options: StoreOptions,
    readers: SqlitePool,
    writer: mpsc::Sender<Command>,
    /// This handle's followers; the writer wakes them after its commits.
    wakeups: Arc<Wakeups>,
    /// Finds other handles' and processes' writes while anyone follows.
    watcher: Watcher,
    /// How often a follower re-reads without a wake-up.
    follow_recheck: Duration,
    /// What the store was opened to survive, for the health check.
    durability: Durability,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with default options.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(SqliteOptions::new(path.as_ref())).await
    }

    /// Opens the database a `sqlite://` URL names; see [`SqliteOptions::from_url`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::open_with(SqliteOptions::from_url(url)?).await
    }

    /// Opens with explicit options: creates the file if missing, runs the
    /// embedded migrations, checks the format version and starts the writer.
    ///
    /// Any number of handles and processes may open one file at once, new
    /// or not: they wait for each other (up to
    /// [`SqliteOptions::busy_timeout`]) and the migrations run once.
    pub async fn open_with(options: SqliteOptions) -> Result<Self> {
        options.validate()?;
        // sqlx sets the busy timeout when it opens a connection, before its
        // first statement, so every statement waits for a lock held by
        // another handle or process rather than failing with "database is
        // locked". The journal mode is left alone here: switching a new
        // file to WAL is done once, below, by `switch_to_wal`.
        let connect = SqliteConnectOptions::new()
            .filename(&options.path)
            .create_if_missing(true)
            .synchronous(options.durability.synchronous())
            .busy_timeout(options.busy_timeout)
            .foreign_keys(false);

        let mut conn = SqliteConnection::connect_with(&connect)
            .await
            .map_err(db_error)?;
        switch_to_wal(&mut conn, options.busy_timeout).await?;
        let key = prepare(&mut conn).await?;

        let readers = SqlitePoolOptions::new()
            .max_connections(options.read_connections)
            .min_connections(0)
            .test_before_acquire(false)
            .connect_with(connect.clone())
            .await
            .map_err(db_error)?;

        let wakeups = Arc::new(Wakeups::default());
        let (sender, receiver) = mpsc::channel(WRITER_QUEUE);
        let writer = Writer::new(
            conn,
            options.store.retention,
            options.max_batch,
            wakeups.clone(),
        );
        tokio::spawn(writer.run(receiver));
        Ok(Self {
            inner: Arc::new(Inner {
                key,
                options: options.store,
                readers,
                writer: sender,
                watcher: Watcher::new(connect, options.follow_poll_interval, wakeups.clone()),
                wakeups,
                follow_recheck: options.follow_recheck,
                durability: options.durability,
            }),
        })
    }

    /// Finishes queued writes, then closes the writer, the read pool and the
    /// follow watcher. Later calls on any clone fail with [`Error::Closed`];
    /// open follows end with it.
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
        self.inner.watcher.close();
        // Followers re-read, find the store closed, and end.
        self.inner.wakeups.wake_all();
    }

    /// Queues a write for the writer task and waits for its answer, which
    /// comes only after the write is committed.
    async fn write<T>(
        &self,
        reply: impl FnOnce(oneshot::Sender<Result<T>>) -> Reply,
        write: Write,
    ) -> Result<T> {
        let (sender, answer) = oneshot::channel();
        self.inner
            .writer
            .send(Command::Write(write, reply(sender)))
            .await
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    fn now(&self) -> i64 {
        self.inner.options.clock.now_millis()
    }

    /// One page of a stream's events after sequence number `after`, read in
    /// one statement (so one snapshot) with the stream's row: its id and
    /// state, for the cursor and gap checks. The events are named under
    /// `incarnation`, the cursor's; they are only used when the row says
    /// that is the stream's current incarnation (every event of a token
    /// belongs to the current row: a stream's events go before or with its
    /// row). `None` for the row: no such stream.
    async fn page_with_stream(
        &self,
        token: StreamToken,
        incarnation: u64,
        after: i64,
    ) -> Result<(Option<(String, DenseStream)>, Vec<StoredEvent>)> {
        let rows = sqlx::query(
            "SELECT * FROM (SELECT seq, retry_ms, payload, NULL, NULL, NULL, NULL \
                 FROM mes_events WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3) \
             UNION ALL \
             SELECT NULL, NULL, NULL, stream_id, incarnation, last_seq, \
                 (SELECT MIN(seq) FROM mes_events WHERE token = ?1) \
             FROM mes_streams WHERE token = ?1",
        )
        .bind(&token.as_bytes()[..])
        .bind(after)
        .bind(self.inner.options.page_size as i64)
        .fetch_all(&self.inner.readers)
        .await
        .map_err(db_error)?;
        let mut stream = None;
        let mut events = Vec::with_capacity(rows.len());
        for row in rows {
            let stream_id: Option<String> = row.try_get(3).map_err(db_error)?;
            match stream_id {
                Some(stream_id) => {
                    let incarnation: i64 = row.try_get(4).map_err(db_error)?;
                    let last_seq: i64 = row.try_get(5).map_err(db_error)?;
                    let first_retained: Option<i64> = row.try_get(6).map_err(db_error)?;
                    stream = Some((
                        stream_id,
                        DenseStream {
                            incarnation: to_incarnation(incarnation)?,
                            last_seq: to_seq(last_seq)?,
                            first_retained: first_retained.map(to_seq).transpose()?,
                        },
                    ));
                }
                None => events.push(event_from_row(token, incarnation, &row)?),
            }
        }
        Ok((stream, events))
    }

    /// A replay page after the first, checked for gaps (C5) against the
    /// stream's row as of the same snapshot. A stream that is gone, or that
    /// was deleted and started again under a new incarnation, lost the
    /// events after the cursor: [`Error::EventsPurged`], never events of
    /// its new life.
    async fn checked_page(
        &self,
        raw: &str,
        token: StreamToken,
        incarnation: u64,
        after: u64,
    ) -> Result<Page> {
        let (stream, events) = self
            .page_with_stream(token, incarnation, from_seq(after)?)
            .await?;
        let Some((_, state)) = stream.filter(|(_, state)| state.incarnation == incarnation) else {
            // The rows read, if any, are the new life's.
            return Err(Error::events_purged(raw));
        };
        let first = events.first().map(|e| e.id.position.minor);
        dense::check_page(raw, after, first, Some(state.last_seq))?;
        Ok(self.page(events, Some(state.last_seq)))
    }

    /// A checked page; the last when it is short or reaches the stream's
    /// newest event as of its snapshot (later events reach a client live).
    fn page(&self, events: Vec<StoredEvent>, last_seq: Option<u64>) -> Page {
        let reached_end = events
            .last()
            .zip(last_seq)
            .is_some_and(|(event, last_seq)| event.id.position.minor >= last_seq);
        Page {
            last: reached_end || events.len() < self.inner.options.page_size,
            events,
        }
    }
}

/// An event of incarnation `incarnation` from a row whose first columns are
/// `seq, retry_ms, payload`.
fn event_from_row(token: StreamToken, incarnation: u64, row: &SqliteRow) -> Result<StoredEvent> {
    let seq: i64 = row.try_get(0).map_err(db_error)?;
    let retry: Option<i64> = row.try_get(1).map_err(db_error)?;
    let payload: Vec<u8> = row.try_get(2).map_err(db_error)?;
    Ok(StoredEvent {
        id: EventId::new(token, dense::position(incarnation, to_seq(seq)?)),
        data: Bytes::from(payload),
        retry: retry_from_millis(retry),
    })
}

fn to_seq(value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("negative sequence number {value}")))
}

/// A stored incarnation; they start at 1, so 0 or less is damage.
pub(crate) fn to_incarnation(value: i64) -> Result<u64> {
    u64::try_from(value)
        .ok()
        .filter(|&incarnation| incarnation != 0)
        .ok_or_else(|| Error::Corrupt(format!("stream incarnation {value} is not positive")))
}

fn from_seq(value: u64) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| Error::Corrupt(format!("sequence number {value} out of range")))
}

/// Puts the database in WAL mode (a no-op once it is: the mode is stored in
/// the file). Two connections switching a new file at once can make SQLite
/// answer "database is locked" at once, without waiting: each holds a read
/// lock the other's switch must wait out, so SQLite refuses rather than
/// deadlock, and the busy timeout never applies. Such a refusal is retried
/// until `busy_timeout` has passed; the other connection's switch has
/// usually finished by the first retry.
async fn switch_to_wal(conn: &mut SqliteConnection, busy_timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + busy_timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        let mode: std::result::Result<String, sqlx::Error> =
            sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(&mut *conn)
                .await;
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(Error::Config(format!(
                    "SQLite kept the database in journal mode {mode:?} instead of WAL \
                     (an in-memory database, or a file system without shared memory?)"
                )));
            }
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(db_error(e)),
        }
    }
}

/// Whether SQLite said busy (`SQLITE_BUSY` or one of its extended codes).
fn is_busy(e: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    e.as_database_error()
        .and_then(|e| e.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == SQLITE_BUSY)
}

/// Brings the database to this release's format and returns its stream
/// secret, all under one write lock (`BEGIN IMMEDIATE`, which waits for the
/// lock up to the busy timeout): handles and processes opening the file at
/// once take turns, and each re-reads what is applied only once it holds
/// the lock, so the migrations and the secret are created exactly once.
/// On any error nothing is changed.
async fn prepare(conn: &mut SqliteConnection) -> Result<StreamKey> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(db_error)?;
    migrate(&mut tx).await?;
    let key = load_stream_key(&mut tx).await?;
    tx.commit().await.map_err(db_error)?;
    Ok(key)
}

/// Runs the embedded migrations, refusing a database from a newer release.
/// The caller holds the write lock; sqlx nests each migration's own
/// transaction as a savepoint.
async fn migrate(conn: &mut SqliteConnection) -> Result<()> {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name("mes_migrations");
    // `run_direct` is sqlx's own way around `Acquire`'s lifetime limits for a
    // bare connection inside a `Send` future.
    migrator
        .run_direct(None, &mut *conn, false)
        .await
        .map_err(|e| match e {
            sqlx::migrate::MigrateError::VersionMissing(version) => {
                Error::IncompatibleFormat(format!(
                    "the database was migrated to version {version} by a newer release of \
             mcp-event-store-sqlite; this release knows versions up to {}",
                    migrator.iter().map(|m| m.version).max().unwrap_or(0)
                ))
            }
            sqlx::migrate::MigrateError::VersionMismatch(version) => {
                Error::IncompatibleFormat(format!(
                    "migration {version} in the database differs from this release's; \
             it was written by an incompatible release"
                ))
            }
            other => Error::backend(NAME, other),
        })?;
    let format: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(value AS INTEGER) FROM mes_meta WHERE key = 'format_version'",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db_error)?;
    match format {
        Some(FORMAT_VERSION) => Ok(()),
        Some(other) => Err(Error::IncompatibleFormat(format!(
            "the database has format version {other}; this release reads version {FORMAT_VERSION}"
        ))),
        None => Err(Error::Corrupt(
            "the format version record is missing".into(),
        )),
    }
}

/// Loads the secret that keys stream tokens, creating it on first open.
async fn load_stream_key(conn: &mut SqliteConnection) -> Result<StreamKey> {
    let fresh = StreamKey::generate()?;
    sqlx::query("INSERT OR IGNORE INTO mes_meta (key, value) VALUES ('stream_key', ?1)")
        .bind(&fresh.as_bytes()[..])
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    let stored: Vec<u8> = sqlx::query_scalar("SELECT value FROM mes_meta WHERE key = 'stream_key'")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
    StreamKey::from_bytes(&stored)
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        observe::append(NAME, stream_id, event.data.len(), async {
            self.inner
                .options
                .check_append(stream_id, event.data.len())?;
            let token = self.inner.key.token(stream_id);
            let position = self
                .write(
                    Reply::Position,
                    Write::Append(Append {
                        token,
                        stream_id: stream_id.to_owned(),
                        data: event.data.to_vec(),
                        retry_ms: retry_to_millis(event.retry),
                        now: self.now(),
                    }),
                )
                .await?;
            Ok(EventId::new(token, position))
        })
        .await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(NAME, last_event_id, async {
            let cursor: EventId = last_event_id.parse()?;
            let (incarnation, after) = dense::cursor_parts(last_event_id, cursor.position)?;
            // SQLite integers stop at i64::MAX: beyond it, never issued.
            let after_sql =
                i64::try_from(after).map_err(|_| Error::unknown_event_id(last_event_id))?;
            let (stream, first_page) = self
                .page_with_stream(cursor.token, incarnation, after_sql)
                .await?;
            let (stream_id, state) =
                stream.ok_or_else(|| Error::unknown_event_id(last_event_id))?;
            // Another incarnation (an earlier life of the stream), a zero
            // part or a sequence number beyond the newest: never issued.
            dense::check_cursor(last_event_id, &cursor, state)?;
            let first = first_page.first().map(|e| e.id.position.minor);
            dense::check_page(last_event_id, after, first, Some(state.last_seq))?;
            let mut first_page = Some(self.page(first_page, Some(state.last_seq)));
            let store = self.clone();
            let raw: Arc<str> = last_event_id.into();
            let token = cursor.token;
            let events = paged_replay(dense::position(incarnation, after), move |after| {
                let first_page = first_page.take();
                let store = store.clone();
                let raw = raw.clone();
                async move {
                    match first_page {
                        Some(page) => Ok(page),
                        None => {
                            store
                                .checked_page(&raw, token, incarnation, after.minor)
                                .await
                        }
                    }
                }
            });
            Ok(Replay { stream_id, events })
        })
        .await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        let Some(id) = EventId::parse(event_id) else {
            return Ok(None);
        };
        // A zero part was never issued; neither was anything SQLite cannot
        // hold.
        let Some((Ok(incarnation), Ok(seq))) = dense::parts(id.position)
            .map(|(incarnation, seq)| (i64::try_from(incarnation), i64::try_from(seq)))
        else {
            return Ok(None);
        };
        // The event is retained in the stream's current incarnation: an id
        // of an earlier life of the stream finds nothing.
        sqlx::query_scalar(
            "SELECT s.stream_id FROM mes_events e JOIN mes_streams s ON s.token = e.token \
             WHERE e.token = ?1 AND e.seq = ?2 AND s.incarnation = ?3",
        )
        .bind(&id.token.as_bytes()[..])
        .bind(seq)
        .bind(incarnation)
        .fetch_optional(&self.inner.readers)
        .await
        .map_err(db_error)
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        validate_stream_id(stream_id)?;
        let token = self.inner.key.token(stream_id);
        self.write(Reply::Count, Write::DeleteStream { token })
            .await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        observe::purge(NAME, async {
            let now = self.now();
            let (reply, answer) = oneshot::channel();
            self.inner
                .writer
                .send(Command::Purge { now, reply })
                .await
                .map_err(|_| Error::Closed)?;
            answer.await.map_err(|_| Error::Closed)?
        })
        .await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        let cursor: EventId = last_event_id.parse()?;
        // Subscribe before the first read, so no append falls in between;
        // the watcher, started after the read, wakes a stream it has not
        // seen before at its first poll that finds anything written.
        let subscription = self.inner.wakeups.subscribe(cursor.token);
        let first = self.replay_events_after(last_event_id).await?;
        self.inner.watcher.ensure();
        let store = self.clone();
        Ok(follow::follow(
            NAME,
            first,
            subscription,
            last_event_id.to_owned(),
            self.inner.follow_recheck,
            options,
            move |cursor| {
                let store = store.clone();
                async move {
                    match store.replay_events_after(&cursor).await {
                        // The cursor was delivered, so it was issued: the
                        // stream was deleted or expired whole (perhaps
                        // started again) under the follower.
                        Err(Error::UnknownEventId { .. }) => Err(Error::events_purged(&cursor)),
                        other => other,
                    }
                }
            },
        ))
    }

    fn open_follows(&self) -> usize {
        self.inner.wakeups.followers()
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.inspect_stats().await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        self.inspect_list_streams(after, limit).await
    }

    async fn check(&self) -> Result<HealthReport> {
        self.inspect_check().await
    }
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        let expires_at = self
            .inner
            .options
            .check_session_put(session_id, state.len(), ttl)?;
        self.write(
            Reply::Unit,
            Write::PutSession {
                session_id: session_id.to_owned(),
                state: state.to_vec(),
                expires_at,
            },
        )
        .await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        let state: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT state FROM mes_sessions WHERE session_id = ?1 AND expires_at > ?2",
        )
        .bind(session_id)
        .bind(self.now())
        .fetch_optional(&self.inner.readers)
        .await
        .map_err(db_error)?;
        Ok(state.map(Bytes::from))
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        let now = self.now();
        self.write(
            Reply::Flag,
            Write::DeleteSession {
                session_id: session_id.to_owned(),
                now,
            },
        )
        .await
    }
}
