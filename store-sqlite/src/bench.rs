//! This backend's bench baselines and test hooks (feature `bench`):
//! [`SqliteKit`], the [`Kit`] the benchmarks (`mcp-event-store-benches`)
//! and the facade's test support reach it through.
//!
//! * Replay: the data set written by hand in the store's own tables,
//!   through its triggers; the raw baseline is sqlx's keyset range read on
//!   the same file and table. The `direct` baseline ([`Direct`],
//!   [`SqliteThread`]) is the same work through SQLite itself (rusqlite, no
//!   async driver): the distance from the store to it is what the async
//!   driver and the store add, the distance from `raw` to it what sqlx
//!   alone adds.
//! * Append: raw single-row inserts through a pool of one connection
//!   (`synchronous=NORMAL` and `FULL`, into a bare table and one indexed as
//!   the store's), and the store's own statements through rusqlite, on the
//!   calling thread, behind one thread hop, and committed in groups.
//! * Tasks: the store's statements on its own tables, through a pool of
//!   one connection on the same file, and a raw claim.
//! * Redemptions: the store's `INSERT ... ON CONFLICT DO NOTHING` into its
//!   own table, through rusqlite behind one thread hop ([`Redeem`]), as the
//!   store's writer runs it.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mcp_event_store_conformance::bench::append::{
    AppendBench, AppendCase, AppendFn, WRITERS, store_append,
};
use mcp_event_store_conformance::bench::redeem::RawRedeem;
use mcp_event_store_conformance::bench::tasks::{
    MESSAGE, NoWake, RESULT, RawClaim, TTL, TaskOps, TaskRaw, TaskSubject, fresh_key, lifetime,
};
use mcp_event_store_conformance::bench::{
    Kit, Loaded, RAW_PAGE, RawEvent, RawRead, ReadCases, StreamPlan, dense_positions, now_millis,
    payload, unbounded,
};
use mcp_event_store_core::backend::{RedeemKey, StreamKey, StreamToken, dense};
use mcp_event_store_core::task::{InstanceId, TaskStatus};
use mcp_event_store_core::{Backend, EventStore, NewEvent, Position, StoreOptions};
use sqlx::{Connection, Row};

use crate::testing::SqliteHarness;
use crate::{Durability, SqliteOptions, SqliteStore};

/// What the facade's `for_each_backend!` passes on for this backend: its
/// kit, and what its storage allows: `restart` (a new process opens it
/// again) and `shared` (several processes at once, as its harness's
/// `shared_across_processes` says).
#[doc(hidden)]
#[macro_export]
macro_rules! test_kit {
    ($callback:ident!($($args:tt)*)) => {
        $callback!($($args)* kit = $crate::bench::SqliteKit, restart = yes, shared = yes);
    };
}

/// The SQLite backend's [`Kit`].
pub struct SqliteKit;

/// A loaded data set: the store and its file, in a temporary directory.
pub struct Storage {
    store: SqliteStore,
    path: PathBuf,
    dir: tempfile::TempDir,
}

/// The SQL of the raw and direct range reads: one keyset page.
const PAGE_SQL: &str = "SELECT seq, retry_ms, payload FROM mes_events \
     WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";

/// The store's own single append (this crate's `insert_event`): the
/// sequence number from the stream row, which a trigger moves along.
pub const APPEND_SQL: &str = "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
     SELECT token, last_seq + 1, ?3, ?4, ?5 FROM mes_streams \
     WHERE token = ?1 AND incarnation = ?2 \
     RETURNING seq";

/// The store's trim to `max_events_per_stream` after an append.
pub const TRIM_SQL: &str = "DELETE FROM mes_events WHERE token = ?1 AND seq <= ?2";

/// The raw baseline: `SELECT .. WHERE token = ? AND seq > ? ORDER BY seq
/// LIMIT 1000` on the store's own file and table, until a short page;
/// with it, the direct baseline on the same file, on the calling thread
/// and on a thread of its own.
pub struct Raw {
    pool: sqlx::SqlitePool,
    token: Vec<u8>,
    direct: Direct,
    thread: SqliteThread,
    shared_token: Arc<[u8]>,
}

impl RawRead for Raw {
    /// Every event after `after`, page by page.
    async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        let incarnation = after.major;
        let mut out = Vec::new();
        let mut after = after.minor as i64;
        loop {
            let rows = sqlx::query(PAGE_SQL)
                .bind(&self.token[..])
                .bind(after)
                .bind(RAW_PAGE as i64)
                .fetch_all(&self.pool)
                .await
                .expect("raw sqlite read");
            let n = rows.len();
            for row in rows {
                let seq: i64 = row.get(0);
                let retry: Option<i64> = row.get(1);
                let data: Vec<u8> = row.get(2);
                after = seq;
                out.push((
                    dense::position(incarnation, seq as u64),
                    Bytes::from(data),
                    retry,
                ));
            }
            if n < RAW_PAGE {
                return out;
            }
        }
    }
}

/// A rusqlite connection on a store's file, set up as the store sets up
/// its connections for [`Durability::Process`]: WAL (the file's own mode),
/// `synchronous = NORMAL`, a busy timeout.
pub fn direct_connection(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("direct sqlite connection");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
    conn.execute_batch("PRAGMA synchronous = NORMAL")
        .expect("synchronous");
    // As the store's page threads: cached statements are not planned again
    // each time a parameter is bound anew (the page's `LIMIT` is one).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .expect("query planner stability guarantee");
    conn
}

/// One append as the store makes it, on a direct connection: the store's
/// insert, then its trim when the stream holds more than `max_events`.
/// Autocommit, like the store's lone append. Returns the sequence number.
pub fn direct_append(
    conn: &rusqlite::Connection,
    token: &[u8],
    incarnation: i64,
    data: &[u8],
    now: i64,
    max_events: i64,
) -> i64 {
    let seq: i64 = conn
        .prepare_cached(APPEND_SQL)
        .expect("prepare append")
        .query_row(
            rusqlite::params![token, incarnation, now, None::<i64>, data],
            |row| row.get(0),
        )
        .expect("direct append");
    if seq > max_events {
        conn.prepare_cached(TRIM_SQL)
            .expect("prepare trim")
            .execute(rusqlite::params![token, seq - max_events])
            .expect("direct trim");
    }
    seq
}

/// The direct baseline of a replay: the raw range read through rusqlite on
/// the store's file, on the calling thread.
pub struct Direct {
    conn: rusqlite::Connection,
    token: Vec<u8>,
}

impl Direct {
    /// A direct connection of its own on the store's file at `path`.
    pub fn new(path: &Path, token: StreamToken) -> Self {
        Self {
            conn: direct_connection(path),
            token: token.as_bytes().to_vec(),
        }
    }

    /// Every event after `after`, page by page, as [`Raw::read_after`].
    pub fn read_after(&self, after: Position) -> Vec<RawEvent> {
        direct_read_after(&self.conn, &self.token, after)
    }

    /// As [`read_after`](Self::read_after), each page read as the store
    /// must read it to check the cursor and the gaps (C5): in one read
    /// transaction with the stream's row (its id, incarnation, newest
    /// and oldest retained sequence numbers), the store's own statement.
    pub fn read_checked_after(&self, after: Position) -> Vec<RawEvent> {
        let incarnation = after.major;
        let mut out = Vec::new();
        let mut after = after.minor as i64;
        let conn = &self.conn;
        loop {
            conn.prepare_cached("BEGIN")
                .and_then(|mut begin| begin.execute([]))
                .expect("begin a read");
            let row: (String, i64, i64, Option<i64>) = conn
                .prepare_cached(crate::replay::STREAM_ROW)
                .and_then(|mut statement| {
                    statement.query_row([&self.token[..]], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                    })
                })
                .expect("the stream's row");
            std::hint::black_box(row);
            let n = direct_page(conn, &self.token, incarnation, &mut after, &mut out);
            conn.prepare_cached("COMMIT")
                .and_then(|mut commit| commit.execute([]))
                .expect("end the read");
            if n < RAW_PAGE {
                return out;
            }
        }
    }
}

/// Every event of `token` after `after`, through `conn`, page by page.
pub fn direct_read_after(
    conn: &rusqlite::Connection,
    token: &[u8],
    after: Position,
) -> Vec<RawEvent> {
    let incarnation = after.major;
    let mut out = Vec::new();
    let mut after = after.minor as i64;
    while direct_page(conn, token, incarnation, &mut after, &mut out) == RAW_PAGE {}
    out
}

/// One page of [`RAW_PAGE`] events after `after` into `out`, moving
/// `after` to its newest; how many it read.
fn direct_page(
    conn: &rusqlite::Connection,
    token: &[u8],
    incarnation: u64,
    after: &mut i64,
    out: &mut Vec<RawEvent>,
) -> usize {
    let mut statement = conn.prepare_cached(PAGE_SQL).expect("prepare read");
    let mut rows = statement
        .query(rusqlite::params![token, *after, RAW_PAGE as i64])
        .expect("direct sqlite read");
    let mut n = 0;
    while let Some(row) = rows.next().expect("a row") {
        let seq: i64 = row.get(0).expect("seq");
        let retry: Option<i64> = row.get(1).expect("retry_ms");
        let data: Vec<u8> = row.get(2).expect("payload");
        *after = seq;
        n += 1;
        out.push((
            dense::position(incarnation, seq as u64),
            Bytes::from(data),
            retry,
        ));
    }
    n
}

/// A rusqlite connection on a thread of its own: the direct baseline
/// behind one thread hop, as an async store must make one (a job in over
/// a channel, the answer back over a oneshot). Dropping it ends the thread.
pub struct SqliteThread {
    jobs: std::sync::mpsc::Sender<Job>,
}

/// A job: runs on the connection and returns what delivers its answer.
type Job = Box<dyn FnOnce(&mut rusqlite::Connection) -> Deliver + Send>;
type Deliver = Box<dyn FnOnce() + Send>;

impl SqliteThread {
    /// Moves `conn` onto a new thread that runs each job by itself and
    /// answers it at once.
    pub fn spawn(conn: rusqlite::Connection) -> SqliteThread {
        Self::start(conn, "bench-sqlite-direct", 1)
    }

    /// Moves `conn` onto a new thread that commits jobs together, as the
    /// store's writer does: the direct baseline of group commit. It takes
    /// one job, then every job already waiting (up to the store's default
    /// [`SqliteOptions::max_batch`]), runs them in one `BEGIN IMMEDIATE
    /// ... COMMIT` (a lone job commits by itself), and answers each once
    /// the group has committed.
    pub fn spawn_grouped(conn: rusqlite::Connection) -> SqliteThread {
        Self::start(
            conn,
            "bench-sqlite-grouped",
            SqliteOptions::new("").max_batch,
        )
    }

    fn start(mut conn: rusqlite::Connection, name: &str, max_batch: usize) -> SqliteThread {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(first) = queue.recv() {
                    let mut group = vec![first];
                    while group.len() < max_batch {
                        match queue.try_recv() {
                            Ok(job) => group.push(job),
                            Err(_) => break,
                        }
                    }
                    let together = group.len() > 1;
                    if together {
                        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
                    }
                    let answers: Vec<Deliver> =
                        group.into_iter().map(|job| job(&mut conn)).collect();
                    if together {
                        conn.execute_batch("COMMIT").expect("commit");
                    }
                    answers.into_iter().for_each(|deliver| deliver());
                }
            })
            .expect("a thread");
        SqliteThread { jobs }
    }

    /// Runs `f` on the thread; waits for its answer.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut rusqlite::Connection) -> T + Send + 'static,
    ) -> T {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move |conn| {
                let value = f(conn);
                Box::new(move || {
                    let _ = answer.send(value);
                })
            }))
            .expect("the direct sqlite thread is running");
        answered.await.expect("the direct sqlite thread answers")
    }
}

/// Raw SQLite inserts through a pool of one connection, each insert
/// committing by itself. `full`: under `synchronous=FULL`; `indexed`: into
/// a table with the store's indexes rather than a bare heap.
async fn raw_append(path: &Path, full: bool, indexed: bool) -> AppendFn {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(if full {
            sqlx::sqlite::SqliteSynchronous::Full
        } else {
            sqlx::sqlite::SqliteSynchronous::Normal
        });
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .expect("raw sqlite pool");
    let table = if indexed {
        "CREATE TABLE raw_events (stream INTEGER NOT NULL, seq INTEGER NOT NULL, \
             stored_at INTEGER NOT NULL DEFAULT 0, retry_ms INTEGER, payload BLOB NOT NULL, \
             UNIQUE (stream, seq)); \
         CREATE INDEX raw_events_stored_at ON raw_events (stored_at)"
    } else {
        "CREATE TABLE raw_events \
         (stream INTEGER NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL)"
    };
    sqlx::raw_sql(table)
        .execute(&pool)
        .await
        .expect("raw table");
    let data: Arc<[u8]> = payload().into();
    let seqs: Arc<Vec<std::sync::atomic::AtomicI64>> =
        Arc::new((0..WRITERS).map(|_| Default::default()).collect());
    Arc::new(move |writer| {
        let (pool, data, seqs) = (pool.clone(), data.clone(), seqs.clone());
        Box::pin(async move {
            let seq = seqs[writer].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            sqlx::query("INSERT INTO raw_events (stream, seq, payload) VALUES (?1, ?2, ?3)")
                .bind(writer as i64)
                .bind(seq)
                .bind(&data[..])
                .execute(&pool)
                .await
                .expect("raw insert");
        })
    })
}

/// Direct SQLite appends (rusqlite, no async driver) on a file the store
/// made, with the writers' stream rows made by the store: `(on the calling
/// thread, behind one thread hop, behind one thread hop with group
/// commit)`. Each append is the store's own statements; the first two
/// commit each by itself.
async fn direct_appends(path: &Path) -> (AppendFn, AppendFn, AppendFn) {
    let store = SqliteStore::open(path).await.expect("open sqlite");
    let data = payload();
    let mut streams = Vec::with_capacity(WRITERS);
    for w in 0..WRITERS {
        let id = store
            .store_event(&format!("writer-{w}"), NewEvent::new(&data))
            .await
            .expect("the stream row");
        streams.push((id.token.as_bytes().to_vec(), id.position.major as i64));
    }
    store.close().await;
    let streams: Arc<Vec<(Vec<u8>, i64)>> = Arc::new(streams);
    let data: Arc<[u8]> = data.into();
    let max_events = StoreOptions::default()
        .retention
        .max_events_per_stream
        .expect("a default limit") as i64;
    let conn = Arc::new(std::sync::Mutex::new(direct_connection(path)));
    let (d_streams, d_data) = (streams.clone(), data.clone());
    let direct: AppendFn = Arc::new(move |writer| {
        let (conn, streams, data) = (conn.clone(), d_streams.clone(), d_data.clone());
        Box::pin(async move {
            let (token, incarnation) = &streams[writer];
            let conn = conn.lock().expect("the direct connection");
            direct_append(&conn, token, *incarnation, &data, now_millis(), max_events);
        })
    });
    let behind = |thread: SqliteThread| -> AppendFn {
        let (thread, streams, data) = (Arc::new(thread), streams.clone(), data.clone());
        Arc::new(move |writer| {
            let (thread, streams, data) = (thread.clone(), streams.clone(), data.clone());
            Box::pin(async move {
                thread
                    .run(move |conn| {
                        let (token, incarnation) = &streams[writer];
                        direct_append(conn, token, *incarnation, &data, now_millis(), max_events);
                    })
                    .await;
            })
        })
    };
    let hop = behind(SqliteThread::spawn(direct_connection(path)));
    let grouped = behind(SqliteThread::spawn_grouped(direct_connection(path)));
    (direct, hop, grouped)
}

/// Raw tasks: the store's statements on its own tables, through a pool of
/// one connection on the same file.
pub struct Tasks {
    pool: sqlx::SqlitePool,
    owner: [u8; 16],
    instance: [u8; 16],
}

impl TaskOps for Tasks {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let key = fresh_key();
        let now = now_millis();
        let (expires_at, purge_at) = lifetime(now);
        let inserted = sqlx::query(
            "INSERT INTO mes_tasks (digest, owner, status, rev, message, created_at, updated_at, \
                     expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, FALSE, ?12, NULL, 0) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&key[..])
        .bind(&self.owner[..])
        .bind(0i64)
        .bind(1i64)
        .bind(MESSAGE)
        .bind(now)
        .bind(now)
        .bind(expires_at)
        .bind(purge_at)
        .bind(TTL.as_millis() as i64)
        .bind(None::<i64>)
        .bind(&self.instance[..])
        .execute(&self.pool)
        .await
        .expect("raw insert")
        .rows_affected();
        assert_eq!(inserted, 1, "a key drawn twice");
        key
    }

    async fn get(&self, key: &[u8; 16]) {
        let row = sqlx::query(
            "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                    expires_at, purge_at, poll_ms, cancel, outcome, next_seq \
             FROM mes_tasks WHERE digest = ?1",
        )
        .bind(&key[..])
        .fetch_one(&self.pool)
        .await
        .expect("raw select");
        let rev: i64 = row.try_get(3).expect("rev");
        let message: Option<String> = row.try_get(4).expect("message");
        black_box((rev, message));
    }

    async fn finish(&self, key: &[u8; 16]) {
        let mut conn = self.pool.acquire().await.expect("the raw connection");
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .expect("begin");
        let row = sqlx::query("SELECT status, rev FROM mes_tasks WHERE digest = ?1")
            .bind(&key[..])
            .fetch_one(&mut *conn)
            .await
            .expect("raw select");
        let (status, rev): (i64, i64) = (row.get(0), row.get(1));
        assert!(status < 2, "the row is working");
        let updated = sqlx::query(
            "UPDATE mes_tasks SET status = ?1, rev = ?2, updated_at = ?3, outcome = ?4, \
                    instance = ?5 \
             WHERE digest = ?6 AND rev = ?7",
        )
        .bind(i64::from(TaskStatus::Completed.as_u8()))
        .bind(rev + 1)
        .bind(now_millis())
        .bind(RESULT)
        .bind(&self.instance[..])
        .bind(&key[..])
        .bind(rev)
        .execute(&mut *conn)
        .await
        .expect("raw update")
        .rows_affected();
        assert_eq!(updated, 1, "the row changed under the write lock");
        sqlx::query("COMMIT")
            .execute(&mut *conn)
            .await
            .expect("commit");
    }

    async fn close(self) {
        self.pool.close().await;
    }
}

/// The raw claim: one `UPDATE … WHERE digest = (SELECT … LIMIT 1)
/// RETURNING digest` on a pool of one connection.
pub struct Claim(sqlx::SqlitePool);

impl RawClaim for Claim {
    async fn claim(&self, worker: InstanceId) {
        let claimed = sqlx::query(
            "UPDATE mes_tasks SET epoch = epoch + 1, released = 0, instance = ?1, \
                    rev = rev + 1, updated_at = ?2 \
             WHERE digest = (SELECT digest FROM mes_tasks \
                              WHERE max_attempts IS NOT NULL AND status = 0 AND released \
                              ORDER BY updated_at, digest LIMIT 1) \
             RETURNING digest",
        )
        .bind(&worker.as_bytes()[..])
        .bind(now_millis())
        .fetch_optional(&self.0)
        .await
        .expect("raw claim")
        .is_some();
        assert!(claimed, "a queued task waits");
    }
}

/// The raw redemption: the store's statement on its own table, on a
/// rusqlite connection behind one thread hop (as the store's writer),
/// `synchronous=NORMAL` as the store, each insert committing by itself.
pub struct Redeem(SqliteThread);

impl RawRedeem for Redeem {
    async fn redeem(&self, key: &RedeemKey, forget_at: i64) -> bool {
        let key = *key.as_bytes();
        self.0
            .run(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO mes_redeemed (key, forget_at) VALUES (?1, ?2) \
                     ON CONFLICT (key) DO NOTHING",
                )
                .and_then(|mut statement| statement.execute(rusqlite::params![&key[..], forget_at]))
                .expect("raw redeem")
                    == 1
            })
            .await
    }
}

impl Kit for SqliteKit {
    const BACKEND: &'static Backend = &crate::BACKEND;

    type Harness = SqliteHarness;
    type TaskHarness = SqliteHarness;

    async fn harness() -> SqliteHarness {
        SqliteHarness::new().await
    }

    type RawRedeem = Redeem;

    async fn raw_redeem(harness: &SqliteHarness) -> Redeem {
        Redeem(SqliteThread::spawn(direct_connection(&harness.path())))
    }

    async fn task_harness() -> SqliteHarness {
        SqliteHarness::new().await
    }

    type Storage = Storage;
    type Raw = Raw;

    /// Opens the store (migrations, stream key), then writes the rows by
    /// hand in one transaction, in schedule order: the stream rows first,
    /// then every event through the store's own triggers, which keep
    /// `last_seq` and the byte counts right.
    async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("events.db");
        let store = SqliteStore::open_with(SqliteOptions::new(&path).store(unbounded()))
            .await
            .expect("open sqlite");
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("raw sqlite connection");
        let key: Vec<u8> =
            sqlx::query_scalar("SELECT value FROM mes_meta WHERE key = 'stream_key'")
                .fetch_one(&mut conn)
                .await
                .expect("stream key");
        let key = StreamKey::from_bytes(&key).expect("a stream key");
        let now = now_millis();
        let data = payload();
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("CREATE TEMP TABLE bench_plan (token BLOB NOT NULL, len INTEGER NOT NULL)")
            .execute(&mut *tx)
            .await
            .expect("plan table");
        for stream in plan {
            let token = key.token(&stream.stream_id);
            // Each row takes the next incarnation; the store's trigger moves
            // the counter.
            sqlx::query(
                "INSERT INTO mes_streams (token, stream_id, incarnation, last_seq, bytes, updated_at) \
                 VALUES (?1, ?2, (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                         0, 0, ?3)",
            )
            .bind(&token.as_bytes()[..])
            .bind(&stream.stream_id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .expect("stream row");
            sqlx::query("INSERT INTO bench_plan (token, len) VALUES (?1, ?2)")
                .bind(&token.as_bytes()[..])
                .bind(stream.len as i64)
                .execute(&mut *tx)
                .await
                .expect("plan row");
        }
        sqlx::query(
            "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s \
                 WHERE n < (SELECT MAX(len) FROM bench_plan)) \
             INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
             SELECT p.token, s.n, ?1, NULL, ?2 FROM s JOIN bench_plan p ON s.n <= p.len \
             ORDER BY CAST(s.n AS REAL) / p.len, p.token",
        )
        .bind(now)
        .bind(&data)
        .execute(&mut *tx)
        .await
        .expect("bulk events");
        sqlx::query("DROP TABLE bench_plan")
            .execute(&mut *tx)
            .await
            .expect("drop plan");
        tx.commit().await.expect("commit");
        sqlx::query("ANALYZE")
            .execute(&mut conn)
            .await
            .expect("analyze");
        let probe = &plan[plan.len() - 1];
        let incarnation: i64 =
            sqlx::query_scalar("SELECT incarnation FROM mes_streams WHERE token = ?1")
                .bind(&key.token(&probe.stream_id).as_bytes()[..])
                .fetch_one(&mut conn)
                .await
                .expect("the probe's incarnation");
        conn.close().await.expect("close");
        Loaded {
            store: Arc::new(store.clone()),
            token: key.token(&probe.stream_id),
            positions: dense_positions(incarnation as u64, probe.len),
            storage: Storage { store, path, dir },
        }
    }

    /// A pool of its own on the store's file, and the direct connections.
    async fn raw(storage: &Storage, token: StreamToken, _: &StreamPlan) -> Raw {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(
                sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&storage.path)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal),
            )
            .await
            .expect("raw sqlite pool");
        Raw {
            pool,
            token: token.as_bytes().to_vec(),
            direct: Direct::new(&storage.path, token),
            thread: SqliteThread::spawn(direct_connection(&storage.path)),
            shared_token: Arc::from(&token.as_bytes()[..]),
        }
    }

    /// SQLite's ceiling: `direct`, the raw read through SQLite itself
    /// (rusqlite, no async driver) on the store's file, on the calling
    /// thread; `direct_hop`, the same on a thread of its own, the caller
    /// awaiting the answer: the ceiling of any async store, which must make
    /// one hop.
    fn read_cases(raw: &Raw, cases: &mut impl ReadCases) {
        cases.on_thread("direct", |after| raw.direct.read_after(after));
        cases.on_thread("direct_checked", |after| {
            raw.direct.read_checked_after(after)
        });
        cases.awaited("direct_hop", |after| {
            let token = raw.shared_token.clone();
            raw.thread
                .run(move |conn| direct_read_after(conn, &token, after))
        });
    }

    /// Closes the store and removes its directory.
    async fn cleanup(storage: Storage) {
        storage.store.close().await;
        drop(storage.dir);
    }

    /// The store at the default durability and under
    /// `Durability::PowerLoss`, beside raw inserts (`NORMAL`, indexed,
    /// `FULL`) and the direct baselines.
    async fn append() -> AppendBench {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let process = SqliteStore::open(dir.path().join("process.db"))
            .await
            .expect("open sqlite");
        let power_loss = SqliteStore::open_with(
            SqliteOptions::new(dir.path().join("power_loss.db")).durability(Durability::PowerLoss),
        )
        .await
        .expect("open sqlite");
        let raw_normal = raw_append(&dir.path().join("raw_normal.db"), false, false).await;
        let raw_indexed = raw_append(&dir.path().join("raw_indexed.db"), false, true).await;
        let raw_full = raw_append(&dir.path().join("raw_full.db"), true, false).await;
        let (direct, direct_hop, grouped) = direct_appends(&dir.path().join("direct.db")).await;
        let store = store_append(Arc::new(process.clone()));
        let durable = store_append(Arc::new(power_loss.clone()));
        AppendBench::new(
            vec![
                AppendCase::one("store_1_writer", &store),
                AppendCase::one("raw_1_writer", &raw_normal),
                AppendCase::one("direct_1_writer", &direct),
                AppendCase::one("direct_hop_1_writer", &direct_hop),
                AppendCase::many("store_32_writers", &store),
                AppendCase::many("raw_32_writers", &raw_normal),
                AppendCase::many("direct_hop_32_writers", &direct_hop),
                AppendCase::many("direct_grouped_32_writers", &grouped),
                AppendCase::many("raw_indexed_32_writers", &raw_indexed),
                AppendCase::one("store_power_loss_1_writer", &durable).sample_size(10),
                AppendCase::one("raw_full_1_writer", &raw_full),
                AppendCase::many("store_power_loss_32_writers", &durable),
                AppendCase::many("raw_full_32_writers", &raw_full),
            ],
            async move {
                process.close().await;
                power_loss.close().await;
                drop(dir);
            },
        )
    }

    type TaskOps = Tasks;
    type Claim = Claim;
    type Wake = NoWake;

    /// A pool of one connection on the harness's file, set up as the
    /// store's (`synchronous=NORMAL`).
    async fn task_raw(
        harness: &SqliteHarness,
        subject: &TaskSubject,
    ) -> TaskRaw<Tasks, Claim, NoWake> {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(harness.path())
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .expect("raw sqlite pool");
        TaskRaw {
            claim: Some(Claim(pool.clone())),
            ops: Tasks {
                pool,
                owner: subject.owner_digest(),
                instance: *subject.me.as_bytes(),
            },
            finishes: Vec::new(),
            wake: None,
            settle: Duration::from_millis(2),
        }
    }
}
