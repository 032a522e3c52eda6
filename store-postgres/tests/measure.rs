//! A quick measurement, run by hand (it asserts nothing about time):
//!
//! ```text
//! cargo test -p mcp-event-store-postgres --release --test measure -- --ignored --nocapture
//! ```
//!
//! Each number is printed beside the store's own statement run by hand
//! through sqlx on a pool with the same settings, so the difference is the
//! store's overhead (token HMAC, checks, tracing, paging).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store_core::conformance::Harness;
use mcp_event_store_core::{EventStore, NewEvent, Retention, StoreOptions, StreamKey};
use mcp_event_store_postgres::PostgresStore;
use mcp_event_store_postgres::testing::{PostgresHarness, append_statement, page_statement};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};

const ROUNDS: usize = 5;
const APPENDS_PER_ROUND: usize = 1_000;
const WRITERS: usize = 32;
const APPENDS_PER_WRITER: usize = 100;
const STREAM_LEN: i64 = 100_000;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn payload() -> Vec<u8> {
    let mut p = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1,"message":""#.to_vec();
    p.resize(196, b'x');
    p.extend_from_slice(br#""}}"#);
    p
}

async fn raw_pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .test_before_acquire(false)
        .connect(url)
        .await
        .unwrap()
}

struct Raw {
    pool: PgPool,
    append: Arc<str>,
    page: Arc<str>,
    options: StoreOptions,
}

impl Raw {
    async fn append(&self, token: &[u8], stream_id: &str, data: &[u8], incarnation: i64) -> i64 {
        let retention = self.options.retention;
        sqlx::query(AssertSqlSafe(self.append.clone()))
            .bind(token)
            .bind(stream_id.as_bytes())
            .bind(data.len() as i64)
            .bind(self.options.clock.now_millis())
            .bind(None::<i64>)
            .bind(retention.max_events_per_stream.map(|n| n as i64))
            .bind(retention.max_bytes_per_stream.map(|n| n as i64))
            .bind(data)
            .bind(incarnation)
            .fetch_one(&self.pool)
            .await
            .unwrap()
            .get(0)
    }

    /// Replays after `after` with the page statement, page by page.
    async fn replay(&self, token: &[u8], mut after: i64, limit: i64) -> usize {
        let mut total = 0;
        let mut first = true;
        loop {
            let rows = sqlx::query(AssertSqlSafe(self.page.clone()))
                .bind(token)
                .bind(after)
                .bind(limit)
                .bind(first)
                .fetch_all(&self.pool)
                .await
                .unwrap();
            first = false;
            let mut n = 0;
            let mut last_seq = i64::MAX;
            for row in rows {
                match row.get::<Option<i64>, _>(0) {
                    Some(seq) => {
                        let _data: Vec<u8> = row.get(2);
                        after = after.max(seq);
                        n += 1;
                    }
                    None => last_seq = row.get(4),
                }
            }
            total += n;
            if n < limit as usize || after >= last_seq {
                return total;
            }
        }
    }
}

/// The DESIGN baseline's shape: a plain one-row INSERT, one commit each,
/// to calibrate the numbers against the machine's load at the time.
async fn plain_insert(pool: &PgPool, schema: &str, data: &[u8]) {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".plain_baseline (data) VALUES ($1)"
    )))
    .bind(data)
    .execute(pool)
    .await
    .unwrap();
}

async fn plain_one_writer(pool: &PgPool, schema: &str, data: &[u8]) -> f64 {
    let start = Instant::now();
    for _ in 0..APPENDS_PER_ROUND {
        plain_insert(pool, schema, data).await;
    }
    APPENDS_PER_ROUND as f64 / start.elapsed().as_secs_f64()
}

async fn plain_many_writers(pool: &PgPool, schema: &str, data: &[u8]) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (pool, schema, data) = (pool.clone(), schema.to_owned(), data.to_vec());
            tokio::spawn(async move {
                for _ in 0..APPENDS_PER_WRITER {
                    plain_insert(&pool, &schema, &data).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (WRITERS * APPENDS_PER_WRITER) as f64 / start.elapsed().as_secs_f64()
}

async fn appends_one_writer_store(store: &PostgresStore, data: &[u8]) -> f64 {
    let start = Instant::now();
    for _ in 0..APPENDS_PER_ROUND {
        store
            .store_event("one-writer", NewEvent::new(data))
            .await
            .unwrap();
    }
    APPENDS_PER_ROUND as f64 / start.elapsed().as_secs_f64()
}

async fn appends_one_writer_raw(raw: &Raw, data: &[u8]) -> f64 {
    let token = [1u8; 15];
    let start = Instant::now();
    for _ in 0..APPENDS_PER_ROUND {
        raw.append(&token, "raw-one-writer", data, 1).await;
    }
    APPENDS_PER_ROUND as f64 / start.elapsed().as_secs_f64()
}

async fn appends_many_writers_store(store: &PostgresStore, data: &[u8], round: usize) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            let data = data.to_vec();
            tokio::spawn(async move {
                let stream = format!("writer-{round}-{w}");
                for _ in 0..APPENDS_PER_WRITER {
                    store
                        .store_event(&stream, NewEvent::new(&data))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (WRITERS * APPENDS_PER_WRITER) as f64 / start.elapsed().as_secs_f64()
}

async fn appends_many_writers_raw(raw: &Arc<Raw>, data: &[u8], round: usize) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let raw = raw.clone();
            let data = data.to_vec();
            tokio::spawn(async move {
                let stream = format!("raw-writer-{round}-{w}");
                let mut token = [2u8; 15];
                token[0] = round as u8;
                token[1] = w as u8;
                for _ in 0..APPENDS_PER_WRITER {
                    raw.append(&token, &stream, &data, 1).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (WRITERS * APPENDS_PER_WRITER) as f64 / start.elapsed().as_secs_f64()
}

/// Loads a stream of `STREAM_LEN` events in bulk (as appends would have
/// left it) and returns its token.
async fn seed_long_stream(h: &PostgresHarness, pool: &PgPool, stream_id: &str) -> Vec<u8> {
    let schema = h.schema();
    let key: Vec<u8> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM \"{schema}\".meta WHERE key = 'stream_key'"
    )))
    .fetch_one(pool)
    .await
    .unwrap();
    let token = StreamKey::from_bytes(&key).unwrap().token(stream_id);
    let token = token.as_bytes().to_vec();
    let data = payload();
    let len = data.len() as i64;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".streams \
         (token, stream_id, incarnation, first_seq, last_seq, clean_seq, total_bytes, last_stored_at) \
         VALUES ($1, $2, 7, 1, $3, 1, $3 * $4, 0)"
    )))
    .bind(&token)
    .bind(stream_id.as_bytes())
    .bind(STREAM_LEN)
    .bind(len)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".events (token, seq, stored_at, cum_bytes, retry_ms, data) \
         SELECT $1, s, 0, (s - 1) * $2, NULL, $3 FROM generate_series(1, $4::int8) s"
    )))
    .bind(&token)
    .bind(len)
    .bind(&data)
    .bind(STREAM_LEN)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!("ANALYZE \"{schema}\".events")))
        .execute(pool)
        .await
        .unwrap();
    token
}

async fn time_store_replay(store: &PostgresStore, cursor: &str, expect: usize) -> Duration {
    let start = Instant::now();
    let replay = store.replay_events_after(cursor).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(events.len(), expect);
    elapsed
}

fn us(d: Vec<Duration>) -> f64 {
    median(d.into_iter().map(|d| d.as_secs_f64() * 1e6).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement to run by hand with --release; asserts nothing about time"]
async fn measure_appends_and_replays() {
    let h = PostgresHarness::new().await;
    let options = StoreOptions::default().retention(Retention::default());
    let store = h
        .open_with(h.options(options.clone()).max_connections(WRITERS as u32))
        .await;
    let raw = Arc::new(Raw {
        pool: raw_pool(h.url(), WRITERS as u32).await,
        append: append_statement(h.schema()).into(),
        page: page_statement(h.schema()).into(),
        options,
    });
    let data = payload();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE \"{}\".plain_baseline (id BIGSERIAL PRIMARY KEY, data BYTEA NOT NULL)",
        h.schema()
    )))
    .execute(&raw.pool)
    .await
    .unwrap();

    // Warm up both pools and statement caches.
    for _ in 0..50 {
        store
            .store_event("warm", NewEvent::new(&data))
            .await
            .unwrap();
        raw.append(&[9u8; 15], "raw-warm", &data, 1).await;
    }

    let (mut s1, mut r1, mut p1, mut s32, mut r32, mut p32) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        s1.push(appends_one_writer_store(&store, &data).await);
        r1.push(appends_one_writer_raw(&raw, &data).await);
        p1.push(plain_one_writer(&raw.pool, h.schema(), &data).await);
        s32.push(appends_many_writers_store(&store, &data, round).await);
        r32.push(appends_many_writers_raw(&raw, &data, round).await);
        p32.push(plain_many_writers(&raw.pool, h.schema(), &data).await);
    }

    let token = seed_long_stream(&h, &raw.pool, "long").await;
    let key_token = mcp_event_store_core::StreamToken::from_bytes(&token).unwrap();
    let cursor = |seq: i64| {
        mcp_event_store_core::EventId::new(
            key_token,
            mcp_event_store_core::Position::seq(seq as u64),
        )
        .to_string()
    };
    let paged_1000 = h
        .open_with(
            h.options(StoreOptions::default().page_size(1_000))
                .max_connections(4),
        )
        .await;

    let (mut st100, mut rw100, mut st10k, mut st10k_256, mut rw10k) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..200 {
        let after = STREAM_LEN - 100;
        st100.push(time_store_replay(&store, &cursor(after), 100).await);
        let start = Instant::now();
        assert_eq!(raw.replay(&token, after, 256).await, 100);
        rw100.push(start.elapsed());
        if i % 10 == 0 {
            let after = STREAM_LEN - 10_000;
            st10k.push(time_store_replay(&paged_1000, &cursor(after), 10_000).await);
            st10k_256.push(time_store_replay(&store, &cursor(after), 10_000).await);
            let start = Instant::now();
            assert_eq!(raw.replay(&token, after, 1_000).await, 10_000);
            rw10k.push(start.elapsed());
        }
    }

    println!();
    println!(
        "| measurement (median) | store | same SQL by hand through sqlx | plain INSERT baseline |"
    );
    println!("|---|---|---|---|");
    println!(
        "| appends/s, 1 writer ({ROUNDS} rounds of {APPENDS_PER_ROUND}) | {:.0} | {:.0} | {:.0} |",
        median(s1),
        median(r1),
        median(p1)
    );
    println!(
        "| appends/s, {WRITERS} writers on {WRITERS} streams ({ROUNDS} rounds of {}) | {:.0} | {:.0} | {:.0} |",
        WRITERS * APPENDS_PER_WRITER,
        median(s32),
        median(r32),
        median(p32)
    );
    println!(
        "| replay 100 of a {STREAM_LEN}-event stream (200 calls), us | {:.0} | {:.0} |",
        us(st100),
        us(rw100)
    );
    println!(
        "| replay 10,000, pages of 1000 (20 calls), us | {:.0} | {:.0} |",
        us(st10k),
        us(rw10k)
    );
    println!(
        "| replay 10,000, default pages of 256 (20 calls), us | {:.0} | |",
        us(st10k_256)
    );
    h.close(store).await;
    h.close(paged_1000).await;
    raw.pool.close().await;
    h.teardown().await;
}
