//! Shared setup for the criterion benches: backend selection, quick mode,
//! data sets built in bulk (honouring each store's id scheme), the raw
//! baselines, and clean-up.
//!
//! * `MCP_EVENT_STORE_BENCH_BACKENDS=sqlite,redis` runs only those backends
//!   (names: memory, sqlite, postgres, redis, sled; default: all).
//! * `MCP_EVENT_STORE_BENCH_QUICK=1` shrinks the data sets so that
//!   `cargo bench -- --test` (each benchmark once, nothing measured) proves
//!   the benches still work in a few minutes.
//!
//! Server-backed benches find their server as the tests do
//! (`testing::server_url()`), work in a random schema or key prefix, and
//! remove it at the end.
#![allow(dead_code)] // each bench file uses a different part of this module

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use mcp_event_store::dense;
use mcp_event_store::{
    DynStore, EventId, EventStore, MemoryStore, NewEvent, Position, Retention, StoreOptions,
    StreamKey, StreamToken,
};
use mcp_event_store_postgres::{PostgresOptions, PostgresStore};
use mcp_event_store_redis::{RedisOptions, RedisStore};
use mcp_event_store_sled::{Durability as SledDurability, SledOptions, SledStore};
use mcp_event_store_sqlite::{SqliteOptions, SqliteStore};
use sqlx::{AssertSqlSafe, Connection, Row};

/// Rows a raw range read asks for at a time: the largest page that keeps
/// PostgreSQL on the index scan (see DESIGN.md, "Traps").
pub const RAW_PAGE: usize = 1_000;
/// Streams in the scale data sets.
pub const SCALE_STREAMS: u64 = 1_000;
/// Events of the probe stream in the scale data sets; replays read its
/// last 100.
pub const PROBE_LEN: u64 = 200;

/// The backends, in the order the benches run them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Sqlite,
    Postgres,
    Redis,
    Sled,
}

impl Backend {
    pub const ALL: [Backend; 5] = [
        Backend::Memory,
        Backend::Sqlite,
        Backend::Postgres,
        Backend::Redis,
        Backend::Sled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::Sled => "sled",
        }
    }
}

/// The backends `MCP_EVENT_STORE_BENCH_BACKENDS` selects (all if unset).
/// An unknown name is an error, not a silent skip.
pub fn selected() -> Vec<Backend> {
    let Ok(list) = std::env::var("MCP_EVENT_STORE_BENCH_BACKENDS") else {
        return Backend::ALL.to_vec();
    };
    if list.trim().is_empty() {
        return Backend::ALL.to_vec();
    }
    let mut chosen = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let backend = Backend::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(name))
            .unwrap_or_else(|| {
                panic!(
                    "MCP_EVENT_STORE_BENCH_BACKENDS: unknown backend {name:?} \
                     (known: memory, sqlite, postgres, redis, sled)"
                )
            });
        if !chosen.contains(&backend) {
            chosen.push(backend);
        }
    }
    Backend::ALL
        .into_iter()
        .filter(|b| chosen.contains(b))
        .collect()
}

/// Whether `MCP_EVENT_STORE_BENCH_QUICK` asks for small data sets.
pub fn quick() -> bool {
    std::env::var("MCP_EVENT_STORE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The runtime every bench runs on: multi-threaded, two workers (the
/// machines these numbers come from have two cores).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A 200-byte JSON-RPC progress notification, the typical SSE event.
pub fn payload() -> Vec<u8> {
    let mut p = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1,"message":""#.to_vec();
    p.resize(196, b'x');
    p.extend_from_slice(br#""}}"#);
    p
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Store options for data sets that hold more than the default 10,000
/// events per stream: nothing is trimmed, everything else is default.
pub fn unbounded() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

/// One stream of a data set: its id and how many events it gets.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    pub stream_id: String,
    pub len: u64,
}

/// The scale data set: `SCALE_STREAMS - 1` background streams sharing
/// about `total - PROBE_LEN` events, plus the probe stream (the last plan)
/// of `PROBE_LEN` events.
pub fn scale_plan(total: u64) -> Vec<StreamPlan> {
    let background = SCALE_STREAMS - 1;
    let per = (total.saturating_sub(PROBE_LEN) / background).max(1);
    let mut plan: Vec<StreamPlan> = (0..background)
        .map(|i| StreamPlan {
            stream_id: format!("background-{i}"),
            len: per,
        })
        .collect();
    plan.push(StreamPlan {
        stream_id: "probe".into(),
        len: PROBE_LEN,
    });
    plan
}

pub fn plan_total(plan: &[StreamPlan]) -> u64 {
    plan.iter().map(|s| s.len).sum()
}

/// The order events are written in: streams interleaved in time, the way
/// they arrive at a server (event `seq` of a stream of `len` events is
/// written at time `seq / len`). Returns stream indexes.
pub fn schedule(plan: &[StreamPlan]) -> Vec<u32> {
    let mut order: Vec<(f64, u32)> = Vec::with_capacity(plan_total(plan) as usize);
    for (i, stream) in plan.iter().enumerate() {
        for seq in 1..=stream.len {
            order.push((seq as f64 / stream.len as f64, i as u32));
        }
    }
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    order.into_iter().map(|(_, i)| i).collect()
}

/// A raw baseline: the same range read as a replay, done by hand with the
/// backend's driver, decoding each event into (position, payload, retry)
/// as the store does. No cursor check, no gap check, no id formatting.
pub enum Raw {
    /// A `BTreeMap` range over one stream's events.
    Memory(BTreeMap<u64, (Bytes, Option<Duration>)>),
    /// sqlx: `SELECT .. WHERE token = ? AND seq > ? ORDER BY seq LIMIT 1000`
    /// on the store's own file and table, until a short page.
    Sqlite {
        pool: sqlx::SqlitePool,
        token: Vec<u8>,
    },
    /// sqlx: the same keyset query on the store's schema.
    Postgres {
        pool: sqlx::PgPool,
        sql: Arc<str>,
        token: Vec<u8>,
    },
    /// `XRANGE key (<id> + COUNT 1000` on the store's own events key.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        key: String,
    },
    /// A sled range over `token ++ seq` keys holding the store's value
    /// layout (24-byte header, then the payload), in a database of its own
    /// (sled lets one process open a directory once).
    Sled { tree: sled::Tree, token: Vec<u8> },
}

/// What a raw read decodes per event.
pub type RawEvent = (Position, Bytes, Option<i64>);

impl Raw {
    /// Reads every event after `after`; returns them.
    pub async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        match self {
            Raw::Memory(events) => events
                .range(after.minor + 1..)
                .map(|(seq, (data, retry))| {
                    (
                        dense::position(after.major, *seq),
                        data.clone(),
                        retry.map(|r| r.as_millis() as i64),
                    )
                })
                .collect(),
            Raw::Sqlite { pool, token } => {
                let incarnation = after.major;
                let mut out = Vec::new();
                let mut after = after.minor as i64;
                loop {
                    let rows = sqlx::query(
                        "SELECT seq, retry_ms, payload FROM mes_events \
                         WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                    )
                    .bind(&token[..])
                    .bind(after)
                    .bind(RAW_PAGE as i64)
                    .fetch_all(pool)
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
            Raw::Postgres { pool, sql, token } => {
                let incarnation = after.major;
                let mut out = Vec::new();
                let mut after = after.minor as i64;
                loop {
                    let rows = sqlx::query(AssertSqlSafe(sql.clone()))
                        .bind(&token[..])
                        .bind(after)
                        .bind(RAW_PAGE as i64)
                        .fetch_all(pool)
                        .await
                        .expect("raw postgres read");
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
            Raw::Redis { conn, key } => {
                let mut conn = conn.clone();
                let mut out = Vec::new();
                let mut after = after;
                loop {
                    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                        .arg(key)
                        .arg(format!("({}-{}", after.major, after.minor))
                        .arg("+")
                        .arg("COUNT")
                        .arg(RAW_PAGE)
                        .query_async(&mut conn)
                        .await
                        .expect("raw XRANGE");
                    let n = entries.len();
                    for (id, fields) in entries {
                        let (major, minor) = id.split_once('-').expect("a stream entry id");
                        after = Position {
                            major: major.parse().expect("ms"),
                            minor: minor.parse().expect("seq"),
                        };
                        let mut data = Bytes::new();
                        let mut retry = None;
                        for pair in fields.chunks(2) {
                            match (&pair[0][..], pair.get(1)) {
                                (b"d", Some(v)) => data = Bytes::from(v.clone()),
                                (b"r", Some(v)) => {
                                    retry = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok())
                                }
                                _ => {}
                            }
                        }
                        out.push((after, data, retry));
                    }
                    if n < RAW_PAGE {
                        return out;
                    }
                }
            }
            Raw::Sled { tree, token } => {
                let mut start = token.clone();
                start.extend_from_slice(&(after.minor + 1).to_be_bytes());
                let mut end = token.clone();
                end.extend_from_slice(&u64::MAX.to_be_bytes());
                tree.range(start..end)
                    .map(|entry| {
                        let (key, value) = entry.expect("raw sled read");
                        let seq = u64::from_be_bytes(key[15..23].try_into().expect("key"));
                        let retry = u64::from_be_bytes(value[8..16].try_into().expect("header"));
                        (
                            dense::position(after.major, seq),
                            Bytes::copy_from_slice(&value[24..]),
                            (retry != u64::MAX).then_some(retry as i64),
                        )
                    })
                    .collect()
            }
        }
    }
}

/// What must be undone after a bench: schemas, key prefixes, files.
pub enum Cleanup {
    Memory,
    Sqlite(SqliteStore, tempfile::TempDir),
    Postgres(PostgresStore, String, String),
    Redis(RedisStore),
    Sled(SledStore, tempfile::TempDir),
}

impl Cleanup {
    pub async fn run(self) {
        match self {
            Cleanup::Memory => {}
            Cleanup::Sqlite(store, dir) => {
                store.close().await;
                drop(dir);
            }
            Cleanup::Postgres(store, url, schema) => {
                store.close().await;
                mcp_event_store_postgres::testing::drop_schema(&url, &schema)
                    .await
                    .expect("drop the bench schema");
            }
            Cleanup::Redis(store) => {
                store.destroy().await.expect("remove the bench key prefix");
            }
            Cleanup::Sled(store, dir) => {
                store.close().await.expect("close sled");
                drop(dir);
            }
        }
    }
}

/// A store holding a data set, with the probe stream's positions.
pub struct Loaded {
    pub store: DynStore,
    /// The probe stream's token and its event positions, oldest first.
    pub token: StreamToken,
    pub positions: Vec<Position>,
    pub cleanup: Cleanup,
    /// Kept for raw baselines that need them.
    pub sqlite_path: Option<std::path::PathBuf>,
    pub pg: Option<(String, String)>,
    pub redis_events_key: Option<String>,
    pub redis_url: Option<String>,
}

impl Loaded {
    /// The id to resume from so that the replay yields the last `k` events.
    pub fn cursor_for_last(&self, k: usize) -> String {
        let at = self.positions.len() - k - 1;
        EventId::new(self.token, self.positions[at]).to_string()
    }
}

/// Builds `plan` (the probe stream last) in a fresh store of `backend`.
pub async fn load(backend: Backend, plan: &[StreamPlan]) -> Loaded {
    match backend {
        Backend::Memory => load_memory(plan).await,
        Backend::Sqlite => load_sqlite(plan).await,
        Backend::Postgres => load_postgres(plan).await,
        Backend::Redis => load_redis(plan).await,
        Backend::Sled => load_sled(plan).await,
    }
}

/// The positions of a stream of `len` events in its life `incarnation`.
fn dense_positions(incarnation: u64, len: u64) -> Vec<Position> {
    (1..=len)
        .map(|seq| dense::position(incarnation, seq))
        .collect()
}

async fn load_memory(plan: &[StreamPlan]) -> Loaded {
    let store = MemoryStore::with_options(unbounded());
    let data = payload();
    let mut probe = None;
    for i in schedule(plan) {
        let id = store
            .store_event(&plan[i as usize].stream_id, NewEvent::new(&data))
            .await
            .expect("append");
        if i as usize == plan.len() - 1 {
            probe = Some(id);
        }
    }
    let probe = probe.expect("a probe stream");
    Loaded {
        store: Arc::new(store),
        token: probe.token,
        positions: dense_positions(probe.position.major, plan[plan.len() - 1].len),
        cleanup: Cleanup::Memory,
        sqlite_path: None,
        pg: None,
        redis_events_key: None,
        redis_url: None,
    }
}

/// SQLite: open the store (migrations, stream key), then write the rows by
/// hand in one transaction, in schedule order: the stream rows first, then
/// every event through the store's own triggers, which keep `last_seq` and
/// the byte counts right.
async fn load_sqlite(plan: &[StreamPlan]) -> Loaded {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open_with(SqliteOptions::new(&path).store_options(unbounded()))
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
        cleanup: Cleanup::Sqlite(store, dir),
        sqlite_path: Some(path),
        pg: None,
        redis_events_key: None,
        redis_url: None,
    }
}

/// PostgreSQL: open the store in a random schema, then insert the stream
/// rows and events by hand in the store's layout (first/last/clean seq,
/// running byte counts), interleaved in schedule order, and `ANALYZE`.
async fn load_postgres(plan: &[StreamPlan]) -> Loaded {
    let url = mcp_event_store_postgres::testing::server_url().await;
    let schema = mcp_event_store_postgres::testing::random_schema();
    let store = PostgresStore::connect_with(
        &url,
        PostgresOptions::default()
            .schema(schema.clone())
            .store(unbounded()),
    )
    .await
    .expect("open postgres");
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("raw postgres connection");
    let key: Vec<u8> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM \"{schema}\".meta WHERE key = 'stream_key'"
    )))
    .fetch_one(&mut conn)
    .await
    .expect("stream key");
    let key = StreamKey::from_bytes(&key).expect("a stream key");
    let data = payload();
    let plen = data.len() as i64;
    let now = now_millis();
    let tokens: Vec<Vec<u8>> = plan
        .iter()
        .map(|s| key.token(&s.stream_id).as_bytes().to_vec())
        .collect();
    let ids: Vec<Vec<u8>> = plan
        .iter()
        .map(|s| s.stream_id.as_bytes().to_vec())
        .collect();
    let lens: Vec<i64> = plan.iter().map(|s| s.len as i64).collect();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".streams \
         (token, stream_id, incarnation, first_seq, last_seq, clean_seq, total_bytes, last_stored_at) \
         SELECT t, i, nextval('\"{schema}\".incarnations'), 1, l, 1, l * $4, $5 \
           FROM unnest($1::bytea[], $2::bytea[], $3::int8[]) AS u(t, i, l)"
    )))
    .bind(&tokens)
    .bind(&ids)
    .bind(&lens)
    .bind(plen)
    .bind(now)
    .execute(&mut conn)
    .await
    .expect("stream rows");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".events (token, seq, stored_at, cum_bytes, retry_ms, data) \
         SELECT u.t, g, $3, (g - 1) * $4, NULL, $5 \
           FROM unnest($1::bytea[], $2::int8[]) AS u(t, l) \
           CROSS JOIN LATERAL generate_series(1, u.l) AS g \
          ORDER BY g::float8 / u.l, u.t"
    )))
    .bind(&tokens)
    .bind(&lens)
    .bind(now)
    .bind(plen)
    .bind(&data)
    .execute(&mut conn)
    .await
    .expect("bulk events");
    for table in ["streams", "events"] {
        sqlx::query(AssertSqlSafe(format!(
            "VACUUM ANALYZE \"{schema}\".{table}"
        )))
        .execute(&mut conn)
        .await
        .expect("vacuum analyze");
    }
    let probe = &plan[plan.len() - 1];
    let incarnation: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT incarnation FROM \"{schema}\".streams WHERE token = $1"
    )))
    .bind(key.token(&probe.stream_id).as_bytes().to_vec())
    .fetch_one(&mut conn)
    .await
    .expect("the probe's incarnation");
    conn.close().await.expect("close");
    Loaded {
        store: Arc::new(store.clone()),
        token: key.token(&probe.stream_id),
        positions: dense_positions(incarnation as u64, probe.len),
        cleanup: Cleanup::Postgres(store, url.clone(), schema.clone()),
        sqlite_path: None,
        pg: Some((url, schema)),
        redis_events_key: None,
        redis_url: None,
    }
}

/// Redis: entry ids are the server's, so the data goes in through the
/// store's own append script, hundreds of appends in flight at once on the
/// multiplexed connection.
async fn load_redis(plan: &[StreamPlan]) -> Loaded {
    let url = mcp_event_store_redis::testing::server_url().await;
    let prefix = mcp_event_store_redis::testing::random_prefix();
    let store = RedisStore::connect_with(
        &url,
        RedisOptions::default()
            .key_prefix(prefix.clone())
            .store(unbounded()),
    )
    .await
    .expect("open redis");
    let probe = plan.len() as u32 - 1;
    let data = payload();
    let mut ids: Vec<EventId> = futures_util::stream::iter(schedule(plan))
        .map(|i| {
            let store = &store;
            let data = &data;
            async move {
                let id = store
                    .store_event(&plan[i as usize].stream_id, NewEvent::new(data))
                    .await
                    .expect("append");
                (i == probe).then_some(id)
            }
        })
        .buffer_unordered(256)
        .filter_map(|id| async move { id })
        .collect()
        .await;
    ids.sort_by_key(|id| id.position);
    let token = ids[0].token;
    Loaded {
        store: Arc::new(store.clone()),
        token,
        positions: ids.iter().map(|id| id.position).collect(),
        cleanup: Cleanup::Redis(store),
        sqlite_path: None,
        pg: None,
        redis_events_key: Some(format!("{prefix}:v1:{{{}}}:events", token.to_text())),
        redis_url: Some(url),
    }
}

/// sled: written through the store's API (its records and indexes are the
/// store's business) by a handle in interval mode, so the build does not
/// wait for a flush per group; then closed and reopened with the default
/// durability, which is what the benches measure.
async fn load_sled(plan: &[StreamPlan]) -> Loaded {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let builder = SledStore::open(
        dir.path(),
        SledOptions::default()
            .store(unbounded())
            .durability(SledDurability::Interval(Duration::from_millis(100))),
    )
    .await
    .expect("open sled");
    let probe = plan.len() as u32 - 1;
    let data = payload();
    let probes: Vec<EventId> = futures_util::stream::iter(schedule(plan))
        .map(|i| {
            let store = &builder;
            let data = &data;
            async move {
                let id = store
                    .store_event(&plan[i as usize].stream_id, NewEvent::new(data))
                    .await
                    .expect("append");
                (i == probe).then_some(id)
            }
        })
        .buffer_unordered(64)
        .filter_map(|id| async move { id })
        .collect()
        .await;
    builder.close().await.expect("close the builder");
    let store = SledStore::open(dir.path(), SledOptions::default().store(unbounded()))
        .await
        .expect("reopen sled");
    Loaded {
        store: Arc::new(store.clone()),
        token: probes[0].token,
        positions: dense_positions(probes[0].position.major, plan[plan.len() - 1].len),
        cleanup: Cleanup::Sled(store, dir),
        sqlite_path: None,
        pg: None,
        redis_events_key: None,
        redis_url: None,
    }
}

/// The raw baseline for the probe stream of a loaded data set, and what
/// must be removed with it (the sled copy's directory).
pub async fn raw_for(
    backend: Backend,
    loaded: &Loaded,
    plan: &[StreamPlan],
) -> (Raw, Option<tempfile::TempDir>) {
    let token = loaded.token.as_bytes().to_vec();
    let probe = &plan[plan.len() - 1];
    let data = payload();
    match backend {
        Backend::Memory => (
            Raw::Memory(
                (1..=probe.len)
                    .map(|seq| (seq, (Bytes::copy_from_slice(&data), None)))
                    .collect(),
            ),
            None,
        ),
        Backend::Sqlite => {
            let path = loaded.sqlite_path.as_ref().expect("sqlite path");
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(4)
                .test_before_acquire(false)
                .connect_with(
                    sqlx::sqlite::SqliteConnectOptions::new()
                        .filename(path)
                        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal),
                )
                .await
                .expect("raw sqlite pool");
            (Raw::Sqlite { pool, token }, None)
        }
        Backend::Postgres => {
            let (url, schema) = loaded.pg.as_ref().expect("postgres schema");
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(10)
                .test_before_acquire(false)
                .connect(url)
                .await
                .expect("raw postgres pool");
            let sql: Arc<str> = format!(
                "SELECT seq, retry_ms, data FROM \"{schema}\".events \
                 WHERE token = $1 AND seq > $2 ORDER BY seq LIMIT $3"
            )
            .into();
            (Raw::Postgres { pool, sql, token }, None)
        }
        Backend::Redis => {
            let client = redis::Client::open(loaded.redis_url.as_deref().expect("redis url"))
                .expect("redis url");
            let config = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_secs(30)))
                .set_connection_timeout(Some(Duration::from_secs(5)));
            let conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("raw redis connection");
            let key = loaded.redis_events_key.clone().expect("events key");
            (Raw::Redis { conn, key }, None)
        }
        Backend::Sled => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let db = sled::Config::new()
                .path(dir.path())
                .cache_capacity(mcp_event_store_sled::DEFAULT_CACHE_CAPACITY)
                .open()
                .expect("raw sled");
            let tree = db.open_tree("events").expect("raw sled tree");
            let now = (now_millis() as u64) ^ (1 << 63);
            // Plain inserts: sled 0.34's batches switch the whole process
            // to a global lock that the store's operations would then take.
            let mut cum = 0u64;
            for seq in 1..=probe.len {
                let mut key = token.clone();
                key.extend_from_slice(&seq.to_be_bytes());
                let mut value = Vec::with_capacity(24 + data.len());
                value.extend_from_slice(&now.to_be_bytes());
                value.extend_from_slice(&u64::MAX.to_be_bytes());
                value.extend_from_slice(&cum.to_be_bytes());
                value.extend_from_slice(&data);
                cum += data.len() as u64;
                tree.insert(key, value).expect("raw sled insert");
            }
            db.flush().expect("raw sled flush");
            (Raw::Sled { tree, token }, Some(dir))
        }
    }
}
