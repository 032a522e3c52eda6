//! SQLite: the data set written by hand in the store's own tables, through
//! its triggers; the raw baseline is sqlx's keyset range read on the same
//! file and table. The `direct` baseline ([`Direct`], [`SqliteThread`]) is
//! the same work through SQLite itself (rusqlite, no async driver): the
//! distance from the store to it is what the async driver and the store
//! add, the distance from `raw` to it what sqlx alone adds.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use mcp_event_store::Position;
use mcp_event_store_sqlite::{SqliteOptions, SqliteStore};
use sqlx::{Connection, Row};

use crate::{
    Loaded, RAW_PAGE, RawEvent, StreamKey, StreamPlan, StreamToken, dense, dense_positions,
    now_millis, payload, unbounded,
};

/// The store and its file, in a temporary directory.
pub struct Storage {
    store: SqliteStore,
    path: PathBuf,
    dir: tempfile::TempDir,
}

/// Opens the store (migrations, stream key), then writes the rows by hand
/// in one transaction, in schedule order: the stream rows first, then every
/// event through the store's own triggers, which keep `last_seq` and the
/// byte counts right.
pub async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open_with(SqliteOptions::new(&path).store(unbounded()))
        .await
        .expect("open sqlite");
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("raw sqlite connection");
    let key: Vec<u8> = sqlx::query_scalar("SELECT value FROM mes_meta WHERE key = 'stream_key'")
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

/// The raw baseline: `SELECT .. WHERE token = ? AND seq > ? ORDER BY seq
/// LIMIT 1000` on the store's own file and table, until a short page.
pub struct Raw {
    pool: sqlx::SqlitePool,
    token: Vec<u8>,
}

/// A pool of its own on the store's file.
pub async fn raw(storage: &Storage, token: StreamToken, _probe: &StreamPlan) -> Raw {
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
    }
}

impl Raw {
    /// Every event after `after`, page by page.
    pub async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        let incarnation = after.major;
        let mut out = Vec::new();
        let mut after = after.minor as i64;
        loop {
            let rows = sqlx::query(
                "SELECT seq, retry_ms, payload FROM mes_events \
                 WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )
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

/// The SQL of the raw and direct range reads: one keyset page.
const PAGE_SQL: &str = "SELECT seq, retry_ms, payload FROM mes_events \
     WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";

/// The store's own single append (`store-sqlite`'s `insert_event`): the
/// sequence number from the stream row, which a trigger moves along.
pub const APPEND_SQL: &str = "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
     SELECT token, last_seq + 1, ?3, ?4, ?5 FROM mes_streams \
     WHERE token = ?1 AND incarnation = ?2 \
     RETURNING seq";

/// The store's trim to `max_events_per_stream` after an append.
pub const TRIM_SQL: &str = "DELETE FROM mes_events WHERE token = ?1 AND seq <= ?2";

/// A rusqlite connection on a store's file, set up as the store sets up
/// its connections for [`Durability::Process`](mcp_event_store_sqlite::Durability):
/// WAL (the file's own mode), `synchronous = NORMAL`, a busy timeout.
pub fn direct_connection(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("direct sqlite connection");
    conn.busy_timeout(std::time::Duration::from_secs(5))
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

/// A direct connection of its own on the store's file.
pub fn direct(storage: &Storage, token: StreamToken) -> Direct {
    Direct {
        conn: direct_connection(&storage.path),
        token: token.as_bytes().to_vec(),
    }
}

impl Direct {
    /// Every event after `after`, page by page, as [`Raw::read_after`].
    pub fn read_after(&self, after: Position) -> Vec<RawEvent> {
        direct_read_after(&self.conn, &self.token, after)
    }

    /// The connection, to move onto a [`SqliteThread`].
    pub fn into_parts(self) -> (rusqlite::Connection, Vec<u8>) {
        (self.conn, self.token)
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
    let mut statement = conn.prepare_cached(PAGE_SQL).expect("prepare read");
    loop {
        let mut rows = statement
            .query(rusqlite::params![token, after, RAW_PAGE as i64])
            .expect("direct sqlite read");
        let mut n = 0;
        while let Some(row) = rows.next().expect("a row") {
            let seq: i64 = row.get(0).expect("seq");
            let retry: Option<i64> = row.get(1).expect("retry_ms");
            let data: Vec<u8> = row.get(2).expect("payload");
            after = seq;
            n += 1;
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

/// Closes the store and removes its directory.
pub async fn cleanup(storage: Storage) {
    storage.store.close().await;
    drop(storage.dir);
}
