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
//! * Each stream has a dense sequence (1, 2, 3, ...) assigned inside the
//!   writer's transaction, so sequence order is commit order and a reader can
//!   never see an event appear behind its cursor (C6). Several processes may
//!   share one file: SQLite's write lock serializes their writers, and
//!   `busy_timeout` makes them wait rather than fail.
//! * Replay is one indexed seek plus a range read per page on the
//!   `(token, seq)` index.
//! * Retention: count and byte limits are applied inline on every append;
//!   age, sessions and anything left over go in [`EventStore::purge_expired`],
//!   in transactions of at most 500 rows interleaved with appends.
//! * **Format version** (C12): the schema is created by embedded migrations
//!   recorded in the `mes_migrations` table. A database migrated by a newer,
//!   unknown release is refused with [`Error::IncompatibleFormat`].
//!
//! # Durability
//!
//! The default, [`Durability::Process`], survives the process being killed
//! at any moment (including `SIGKILL`) with nothing acknowledged lost; a
//! power loss may lose the newest commits. [`Durability::PowerLoss`] also
//! survives power loss, at the cost of an fsync per group commit.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod options;
mod writer;

#[cfg(feature = "conformance")]
pub mod testing;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::dense::{self, DenseStream};
use mcp_event_store_core::{
    Error, EventId, EventStore, NewEvent, Page, Position, PurgeReport, Replay, Result,
    SessionStore, StoreOptions, StoredEvent, StreamKey, StreamToken, observe, paged_replay,
    retry_from_millis, retry_to_millis, validate_stream_id,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow,
};
use sqlx::{Connection, Row};
use tokio::sync::{mpsc, oneshot};

pub use options::{Durability, SqliteOptions};
use writer::{Append, Command, Reply, Write, Writer, db_error};

const BACKEND: &str = "sqlite";
/// The storage format this release reads and writes.
pub const FORMAT_VERSION: i64 = 1;
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
    pub async fn open_with(options: SqliteOptions) -> Result<Self> {
        options.validate()?;
        let connect = SqliteConnectOptions::new()
            .filename(&options.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(options.durability.synchronous())
            .busy_timeout(options.busy_timeout)
            .foreign_keys(false);

        let mut conn = SqliteConnection::connect_with(&connect)
            .await
            .map_err(db_error)?;
        migrate(&mut conn).await?;
        let key = load_stream_key(&mut conn).await?;

        let readers = SqlitePoolOptions::new()
            .max_connections(options.read_connections)
            .min_connections(0)
            .test_before_acquire(false)
            .connect_with(connect)
            .await
            .map_err(db_error)?;

        let (sender, receiver) = mpsc::channel(WRITER_QUEUE);
        let writer = Writer::new(conn, options.store.retention, options.max_batch);
        tokio::spawn(writer.run(receiver));
        Ok(Self {
            inner: Arc::new(Inner {
                key,
                options: options.store,
                readers,
                writer: sender,
            }),
        })
    }

    /// Finishes queued writes, then closes the writer and the read pool.
    /// Later calls on any clone fail with [`Error::Closed`].
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

    /// The cursor's stream: its id, newest sequence and oldest retained one.
    async fn stream_state(&self, token: &StreamToken) -> Result<Option<(String, DenseStream)>> {
        let row = sqlx::query(
            "SELECT stream_id, last_seq, \
                 (SELECT MIN(seq) FROM mes_events WHERE token = ?1) \
             FROM mes_streams WHERE token = ?1",
        )
        .bind(&token.as_bytes()[..])
        .fetch_optional(&self.inner.readers)
        .await
        .map_err(db_error)?;
        let Some(row) = row else { return Ok(None) };
        let stream_id: String = row.try_get(0).map_err(db_error)?;
        let last_seq: i64 = row.try_get(1).map_err(db_error)?;
        let first_retained: Option<i64> = row.try_get(2).map_err(db_error)?;
        Ok(Some((
            stream_id,
            DenseStream {
                last_seq: to_seq(last_seq)?,
                first_retained: first_retained.map(to_seq).transpose()?,
            },
        )))
    }

    /// The start of a replay in one statement, so one snapshot: the
    /// stream's id and state (for the cursor checks) and the first page
    /// after `after`. `None`: no such stream.
    async fn first_page(
        &self,
        token: StreamToken,
        after: u64,
    ) -> Result<Option<(String, DenseStream, Vec<StoredEvent>)>> {
        let Ok(after) = i64::try_from(after) else {
            // Never issued; the cursor check says so.
            return Ok(self
                .stream_state(&token)
                .await?
                .map(|(id, state)| (id, state, Vec::new())));
        };
        let rows = sqlx::query(
            "SELECT * FROM (SELECT seq, retry_ms, payload, NULL, NULL, NULL FROM mes_events \
                 WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3) \
             UNION ALL \
             SELECT NULL, NULL, NULL, stream_id, last_seq, \
                 (SELECT MIN(seq) FROM mes_events WHERE token = ?1) \
             FROM mes_streams WHERE token = ?1",
        )
        .bind(&token.as_bytes()[..])
        .bind(after)
        .bind(self.inner.options.page_size as i64)
        .fetch_all(&self.inner.readers)
        .await
        .map_err(db_error)?;
        let mut header = None;
        let mut events = Vec::with_capacity(rows.len());
        for row in rows {
            let stream_id: Option<String> = row.try_get(3).map_err(db_error)?;
            match stream_id {
                Some(stream_id) => {
                    let last_seq: i64 = row.try_get(4).map_err(db_error)?;
                    let first_retained: Option<i64> = row.try_get(5).map_err(db_error)?;
                    header = Some((
                        stream_id,
                        DenseStream {
                            last_seq: to_seq(last_seq)?,
                            first_retained: first_retained.map(to_seq).transpose()?,
                        },
                    ));
                }
                None => events.push(event_from_row(token, &row)?),
            }
        }
        Ok(header.map(|(stream_id, state)| (stream_id, state, events)))
    }

    async fn read_page(&self, token: StreamToken, after: u64) -> Result<Vec<StoredEvent>> {
        let rows = sqlx::query(
            "SELECT seq, retry_ms, payload FROM mes_events \
             WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .bind(&token.as_bytes()[..])
        .bind(from_seq(after)?)
        .bind(self.inner.options.page_size as i64)
        .fetch_all(&self.inner.readers)
        .await
        .map_err(db_error)?;
        rows.iter().map(|row| event_from_row(token, row)).collect()
    }

    /// One replay page, checked for gaps (C5). A page read and the stream's
    /// newest sequence come from separate statements, so an empty page that
    /// disagrees with the sequence is read once more before it counts as a
    /// purge: an append that committed in between must not look like a gap.
    async fn checked_page(&self, raw: &str, token: StreamToken, after: u64) -> Result<Page> {
        let limit = self.inner.options.page_size;
        let mut events = self.read_page(token, after).await?;
        if events.is_empty() {
            let last_seq = self.stream_state(&token).await?.map(|(_, s)| s.last_seq);
            if last_seq.is_some_and(|last| last > after) {
                events = self.read_page(token, after).await?;
            }
            let first = events.first().map(|e| e.id.position.major);
            dense::check_page(raw, after, first, last_seq)?;
        } else {
            let first = events.first().map(|e| e.id.position.major);
            dense::check_page(raw, after, first, None)?;
        }
        Ok(Page {
            last: events.len() < limit,
            events,
        })
    }
}

/// An event from a row whose first columns are `seq, retry_ms, payload`.
fn event_from_row(token: StreamToken, row: &SqliteRow) -> Result<StoredEvent> {
    let seq: i64 = row.try_get(0).map_err(db_error)?;
    let retry: Option<i64> = row.try_get(1).map_err(db_error)?;
    let payload: Vec<u8> = row.try_get(2).map_err(db_error)?;
    Ok(StoredEvent {
        id: EventId::new(token, Position::seq(to_seq(seq)?)),
        data: Bytes::from(payload),
        retry: retry_from_millis(retry),
    })
}

fn to_seq(value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("negative sequence number {value}")))
}

fn from_seq(value: u64) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| Error::Corrupt(format!("sequence number {value} out of range")))
}

/// Runs the embedded migrations, refusing a database from a newer release.
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
            other => Error::backend(BACKEND, other),
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
        observe::append(BACKEND, stream_id, event.data.len(), async {
            self.inner
                .options
                .check_append(stream_id, event.data.len())?;
            let token = self.inner.key.token(stream_id);
            let seq = self
                .write(
                    Reply::Count,
                    Write::Append(Append {
                        token,
                        stream_id: stream_id.to_owned(),
                        data: event.data.to_vec(),
                        retry_ms: retry_to_millis(event.retry),
                        now: self.now(),
                    }),
                )
                .await?;
            Ok(EventId::new(token, Position::seq(seq)))
        })
        .await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(BACKEND, last_event_id, async {
            let cursor: EventId = last_event_id.parse()?;
            let after = dense::dense_seq(last_event_id, cursor.position)?;
            let (stream_id, state, first_page) = self
                .first_page(cursor.token, after)
                .await?
                .ok_or_else(|| Error::unknown_event_id(last_event_id))?;
            dense::check_cursor(last_event_id, &cursor, state)?;
            let first = first_page.first().map(|e| e.id.position.major);
            dense::check_page(last_event_id, after, first, Some(state.last_seq))?;
            // A page that reaches the stream's newest event (as of its
            // snapshot) is the last: later events reach the client live.
            let reached_end = first_page
                .last()
                .is_some_and(|e| e.id.position.major >= state.last_seq);
            let mut first_page = Some(Page {
                last: reached_end || first_page.len() < self.inner.options.page_size,
                events: first_page,
            });
            let store = self.clone();
            let raw: Arc<str> = last_event_id.into();
            let token = cursor.token;
            let events = paged_replay(Position::seq(after), move |after| {
                let first_page = first_page.take();
                let store = store.clone();
                let raw = raw.clone();
                async move {
                    match first_page {
                        Some(page) => Ok(page),
                        None => store.checked_page(&raw, token, after.major).await,
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
        let (Ok(seq), 0) = (i64::try_from(id.position.major), id.position.minor) else {
            return Ok(None);
        };
        sqlx::query_scalar(
            "SELECT s.stream_id FROM mes_events e JOIN mes_streams s ON s.token = e.token \
             WHERE e.token = ?1 AND e.seq = ?2",
        )
        .bind(&id.token.as_bytes()[..])
        .bind(seq)
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
        observe::purge(BACKEND, async {
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
