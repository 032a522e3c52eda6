//! PostgreSQL: the data set inserted by hand in the store's layout, in a
//! random schema; the raw baseline is sqlx's keyset range read on the same
//! table.

use std::sync::Arc;

use bytes::Bytes;
use mcp_event_store::Position;
use mcp_event_store_postgres::{PostgresOptions, PostgresStore};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::{
    Loaded, RAW_PAGE, RawEvent, StreamKey, StreamPlan, StreamToken, dense, dense_positions,
    now_millis, payload, unbounded,
};

/// The store, the server's URL and the schema the data set lives in.
pub struct Storage {
    store: PostgresStore,
    url: String,
    schema: String,
}

/// The server's URL, a fresh schema's name, and a store opened in it with
/// `options`.
async fn open_store(options: mcp_event_store::StoreOptions) -> (String, String, PostgresStore) {
    let url = mcp_event_store_postgres::testing::server_url().await;
    let schema = mcp_event_store_postgres::testing::random_schema();
    let store = PostgresStore::connect_with(
        &url,
        PostgresOptions::default()
            .schema(schema.clone())
            .store(options),
    )
    .await
    .expect("open postgres");
    (url, schema, store)
}

/// Opens the store in a random schema, then inserts the stream rows and
/// events by hand in the store's layout (first/last/clean seq, running byte
/// counts), interleaved in schedule order, and `VACUUM ANALYZE`s them.
pub async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
    let (url, schema, store) = open_store(unbounded()).await;
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
        storage: Storage { store, url, schema },
    }
}

/// The raw baseline: the same keyset query as the store's, on the store's
/// schema, until a short page.
pub struct Raw {
    pool: sqlx::PgPool,
    sql: Arc<str>,
    token: Vec<u8>,
}

/// A pool of its own on the store's schema.
pub async fn raw(storage: &Storage, token: StreamToken, _probe: &StreamPlan) -> Raw {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .test_before_acquire(false)
        .connect(&storage.url)
        .await
        .expect("raw postgres pool");
    let sql: Arc<str> = format!(
        "SELECT seq, retry_ms, data FROM \"{}\".events \
         WHERE token = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        storage.schema
    )
    .into();
    Raw {
        pool,
        sql,
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
            let rows = sqlx::query(AssertSqlSafe(self.sql.clone()))
                .bind(&self.token[..])
                .bind(after)
                .bind(RAW_PAGE as i64)
                .fetch_all(&self.pool)
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
}

/// Closes the store and drops its schema.
pub async fn cleanup(storage: Storage) {
    storage.store.close().await;
    mcp_event_store_postgres::testing::drop_schema(&storage.url, &storage.schema)
        .await
        .expect("drop the bench schema");
}

/// What the append benches start from: a store at the default options in
/// a fresh schema, a raw pool of its own on the same server, and the raw
/// baseline's table in that schema (`raw_events`: a `BIGSERIAL` key, the
/// stream and the payload).
pub struct AppendSetup {
    /// The server.
    pub url: String,
    /// The schema; drop it with `testing::drop_schema` when done.
    pub schema: String,
    /// The store.
    pub store: PostgresStore,
    /// The raw pool, of the size asked for.
    pub pool: sqlx::PgPool,
    /// The raw insert: `$1` the stream, `$2` the payload.
    pub insert: Arc<str>,
}

/// Opens [`AppendSetup`] with a raw pool of `connections`.
pub async fn append_setup(connections: u32) -> AppendSetup {
    let (url, schema, store) = open_store(mcp_event_store::StoreOptions::default()).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .test_before_acquire(false)
        .connect(&url)
        .await
        .expect("raw postgres pool");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE \"{schema}\".raw_events \
         (id BIGSERIAL PRIMARY KEY, stream BYTEA NOT NULL, data BYTEA NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("raw table");
    let insert =
        format!("INSERT INTO \"{schema}\".raw_events (stream, data) VALUES ($1, $2)").into();
    AppendSetup {
        url,
        schema,
        store,
        pool,
        insert,
    }
}
