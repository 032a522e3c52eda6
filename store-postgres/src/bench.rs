//! This backend's bench baselines and test hooks (feature `bench`):
//! [`PostgresKit`], the [`Kit`] the benchmarks (`mcp-event-store-benches`)
//! and the facade's test support reach it through. Each finds its server
//! as the tests do ([`server_url`]) and works in a random schema that it
//! drops at the end.
//!
//! * Replay: the data set inserted by hand in the store's layout; the raw
//!   baseline is sqlx's keyset range read on the same table.
//! * Append: a raw single insert (`BIGSERIAL` key, the stream, the
//!   payload), each writer committing its own, through 32 connections.
//! * Tasks: the store's statements on its own tables, through a pool of
//!   its own on the same schema; a raw claim (`FOR UPDATE SKIP LOCKED`);
//!   `pg_notify` heard by a `PgListener` as the raw wake-up.
//! * Bus: `pg_notify` on a pool, heard by a `PgListener`.
//! * Redemptions: the store's `INSERT ... ON CONFLICT DO NOTHING` into its
//!   own table, through a pool of its own on the same schema ([`Redeem`]).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mcp_event_store_conformance::bench::append::{
    AppendBench, AppendCase, AppendFn, WRITERS, store_append,
};
use mcp_event_store_conformance::bench::bus::{Delivery, DeliveryCases, GUARD};
use mcp_event_store_conformance::bench::redeem::RawRedeem;
use mcp_event_store_conformance::bench::tasks::{
    MAX_WAIT, MESSAGE, RESULT, RawClaim, RawWake, TTL, TaskOps, TaskRaw, TaskSubject, fresh_key,
    lifetime,
};
use mcp_event_store_conformance::bench::{
    Kit, Loaded, RAW_PAGE, RawEvent, RawRead, StreamPlan, dense_positions, median_us, now_millis,
    payload, process_cpu_ns, unbounded,
};
use mcp_event_store_core::backend::{RedeemKey, StreamKey, StreamToken, dense};
use mcp_event_store_core::task::{InstanceId, TaskStatus};
use mcp_event_store_core::{Backend, EventStore, NewEvent, Position, StoreOptions};
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::testing::{PostgresHarness, drop_schema, random_schema, server_url};
use crate::{PostgresOptions, PostgresStore};

/// What the facade's `for_each_backend!` passes on for this backend: its
/// kit, and what its storage allows: `restart` (a new process opens it
/// again) and `shared` (several processes at once, as its harness's
/// `shared_across_processes` says).
#[doc(hidden)]
#[macro_export]
macro_rules! test_kit {
    ($callback:ident!($($args:tt)*)) => {
        $callback!($($args)* kit = $crate::bench::PostgresKit, restart = yes, shared = yes);
    };
}

/// The PostgreSQL backend's [`Kit`].
pub struct PostgresKit;

/// A loaded data set: the store, the server's URL and the schema the data
/// set lives in.
pub struct Storage {
    store: PostgresStore,
    url: String,
    schema: String,
}

/// The server's URL, a fresh schema's name, and a store opened in it with
/// `options`.
async fn open_store(options: StoreOptions) -> (String, String, PostgresStore) {
    let url = server_url().await;
    let schema = random_schema();
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

/// The raw baseline: the same keyset query as the store's, on the store's
/// schema, until a short page.
pub struct Raw {
    pool: sqlx::PgPool,
    sql: Arc<str>,
    token: Vec<u8>,
}

impl RawRead for Raw {
    /// Every event after `after`, page by page.
    async fn read_after(&self, after: Position) -> Vec<RawEvent> {
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

/// What the append cases start from: a store at the default options in a
/// fresh schema, a raw pool of its own on the same server, and the raw
/// baseline's table in that schema (`raw_events`: a `BIGSERIAL` key, the
/// stream and the payload).
struct AppendSetup {
    url: String,
    schema: String,
    store: PostgresStore,
    pool: sqlx::PgPool,
    /// The raw insert: `$1` the stream, `$2` the payload.
    insert: Arc<str>,
}

/// Opens [`AppendSetup`] with a raw pool of `connections`.
async fn append_setup(connections: u32) -> AppendSetup {
    let (url, schema, store) = open_store(StoreOptions::default()).await;
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

/// Appends of one kind in a row, before the other kind's, in
/// [`PostgresKit::append_pairs`]: the store announces each append with a
/// `NOTIFY` that runs after it returns, so an insert timed right after an
/// append would pay for part of that announcement. In blocks, only the
/// first insert of each block can.
const PAIRS_BLOCK: usize = 50;

/// Raw tasks: the store's statements on its own tables, through a pool of
/// its own on the same schema.
#[derive(Clone)]
pub struct Tasks {
    pool: sqlx::PgPool,
    owner: [u8; 16],
    instance: [u8; 16],
    insert: String,
    select: String,
    lock: String,
    update: String,
    /// The channel `raw_finish_notify` notifies on, `None` for `raw_finish`.
    notify: Option<String>,
}

impl Tasks {
    fn new(pool: sqlx::PgPool, schema: &str, owner: [u8; 16], instance: [u8; 16]) -> Self {
        let s = format!("\"{schema}\"");
        Tasks {
            pool,
            owner,
            instance,
            insert: format!(
                "INSERT INTO {s}.tasks (digest, owner, status, rev, message, created_at, \
                        updated_at, expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, \
                        outcome, next_seq) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, FALSE, $12, NULL, 0) \
                 ON CONFLICT (digest) DO NOTHING"
            ),
            select: format!(
                "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                        expires_at, purge_at, poll_ms, cancel, outcome, next_seq \
                 FROM {s}.tasks WHERE digest = $1"
            ),
            lock: format!("SELECT status, rev FROM {s}.tasks WHERE digest = $1 FOR UPDATE"),
            update: format!(
                "UPDATE {s}.tasks SET status = $1, rev = $2, updated_at = $3, outcome = $4, \
                        instance = $5 \
                 WHERE digest = $6 AND rev = $7"
            ),
            notify: None,
        }
    }
}

impl TaskOps for Tasks {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let key = fresh_key();
        let now = now_millis();
        let (expires_at, purge_at) = lifetime(now);
        let inserted = sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(&key[..])
            .bind(&self.owner[..])
            .bind(0i16)
            .bind(1i64)
            .bind(MESSAGE.as_bytes())
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
        let row = sqlx::query(AssertSqlSafe(self.select.clone()))
            .bind(&key[..])
            .fetch_one(&self.pool)
            .await
            .expect("raw select");
        let rev: i64 = row.try_get(3).expect("rev");
        let message: Option<Vec<u8>> = row.try_get(4).expect("message");
        black_box((rev, message));
    }

    async fn finish(&self, key: &[u8; 16]) {
        let mut tx = self.pool.begin().await.expect("begin");
        let row = sqlx::query(AssertSqlSafe(self.lock.clone()))
            .bind(&key[..])
            .fetch_one(&mut *tx)
            .await
            .expect("raw select for update");
        let (status, rev): (i16, i64) = (row.get(0), row.get(1));
        assert!(status < 2, "the row is working");
        let updated = sqlx::query(AssertSqlSafe(self.update.clone()))
            .bind(i16::from(TaskStatus::Completed.as_u8()))
            .bind(rev + 1)
            .bind(now_millis())
            .bind(RESULT)
            .bind(&self.instance[..])
            .bind(&key[..])
            .bind(rev)
            .execute(&mut *tx)
            .await
            .expect("raw update")
            .rows_affected();
        assert_eq!(updated, 1, "the row changed under its lock");
        if let Some(channel) = &self.notify {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel.as_str())
                .bind("raw")
                .execute(&mut *tx)
                .await
                .expect("raw notify");
        }
        tx.commit().await.expect("commit");
    }

    async fn close(self) {
        self.pool.close().await;
    }
}

/// The raw claim: one `UPDATE … WHERE digest = (SELECT … LIMIT 1 FOR
/// UPDATE SKIP LOCKED) RETURNING digest` on the store's rows.
pub struct Claim {
    pool: sqlx::PgPool,
    schema: String,
}

impl RawClaim for Claim {
    async fn claim(&self, worker: InstanceId) {
        let schema = &self.schema;
        let claimed = sqlx::query(AssertSqlSafe(format!(
            "UPDATE \"{schema}\".tasks SET epoch = epoch + 1, released = FALSE, \
                    instance = $1, rev = rev + 1, updated_at = $2 \
             WHERE digest = (SELECT digest FROM \"{schema}\".tasks \
                              WHERE max_attempts IS NOT NULL AND status = 0 AND released \
                              ORDER BY updated_at, digest LIMIT 1 FOR UPDATE SKIP LOCKED) \
             RETURNING digest"
        )))
        .bind(&worker.as_bytes()[..])
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await
        .expect("raw claim")
        .is_some();
        assert!(claimed, "a queued task waits");
    }
}

/// The raw wake-up: a `pg_notify` on the pool until the listener has it.
pub struct Wake {
    pool: sqlx::PgPool,
    listener: sqlx::postgres::PgListener,
    channel: String,
}

impl RawWake for Wake {
    async fn round_trip(&mut self, n: u64) -> Duration {
        let payload = n.to_string();
        let start = Instant::now();
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(self.channel.as_str())
            .bind(payload.as_str())
            .execute(&self.pool)
            .await
            .expect("raw notify");
        loop {
            let note = tokio::time::timeout(MAX_WAIT, self.listener.recv())
                .await
                .expect("the notification within 30 s")
                .expect("the listener goes on");
            if note.payload() == payload {
                return start.elapsed();
            }
        }
    }

    async fn close(self) {
        drop(self.listener);
        self.pool.close().await;
    }
}

/// PostgreSQL's own bus: `pg_notify` on a pool, heard by a `PgListener`.
struct Notify {
    pool: sqlx::PgPool,
    listener: sqlx::postgres::PgListener,
    channel: String,
    data: String,
}

impl Notify {
    async fn new() -> Self {
        let url = server_url().await;
        let channel = format!("bench_bus_{}", std::process::id());
        let mut listener = sqlx::postgres::PgListener::connect(&url)
            .await
            .expect("a listening connection");
        listener.listen(&channel).await.expect("LISTEN");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("raw postgres pool");
        Self {
            pool,
            listener,
            channel,
            data: String::from_utf8(payload()).expect("a text payload"),
        }
    }
}

impl Delivery for Notify {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.channel)
            .bind(&self.data)
            .execute(&self.pool)
            .await
            .expect("NOTIFY");
        let heard = tokio::time::timeout(GUARD, self.listener.recv())
            .await
            .expect("heard within the guard")
            .expect("LISTEN goes on");
        let took = called.elapsed();
        assert_eq!(heard.payload(), self.data);
        took
    }
}

/// The raw redemption: the store's statement on its own table, through a
/// pool of 8 connections of its own (as the harness gives the store),
/// each insert committing by itself.
pub struct Redeem {
    pool: sqlx::PgPool,
    insert: String,
}

impl RawRedeem for Redeem {
    async fn redeem(&self, key: &RedeemKey, forget_at: i64) -> bool {
        sqlx::query(AssertSqlSafe(self.insert.clone()))
            .bind(&key.as_bytes()[..])
            .bind(forget_at)
            .execute(&self.pool)
            .await
            .expect("raw redeem")
            .rows_affected()
            == 1
    }

    async fn close(self) {
        self.pool.close().await;
    }
}

impl Kit for PostgresKit {
    const BACKEND: &'static Backend = &crate::BACKEND;

    type Harness = PostgresHarness;
    type TaskHarness = PostgresHarness;

    async fn harness() -> PostgresHarness {
        PostgresHarness::new().await
    }

    type RawRedeem = Redeem;

    async fn raw_redeem(harness: &PostgresHarness) -> Redeem {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .connect(harness.url())
            .await
            .expect("raw postgres pool");
        Redeem {
            pool,
            insert: format!(
                "INSERT INTO \"{}\".redeemed (key, forget_at) VALUES ($1, $2) \
                 ON CONFLICT (key) DO NOTHING",
                harness.schema()
            ),
        }
    }

    async fn task_harness() -> PostgresHarness {
        PostgresHarness::new().await
    }

    type Storage = Storage;
    type Raw = Raw;

    /// Opens the store in a random schema, then inserts the stream rows
    /// and events by hand in the store's layout (first/last/clean seq,
    /// running byte counts), interleaved in schedule order, and `VACUUM
    /// ANALYZE`s them.
    async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
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

    /// A pool of its own on the store's schema.
    async fn raw(storage: &Storage, token: StreamToken, _: &StreamPlan) -> Raw {
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

    /// Closes the store and drops its schema.
    async fn cleanup(storage: Storage) {
        storage.store.close().await;
        drop_schema(&storage.url, &storage.schema)
            .await
            .expect("drop the bench schema");
    }

    /// The store beside raw inserts through 32 connections (each raw
    /// writer commits its own insert).
    async fn append() -> AppendBench {
        let AppendSetup {
            url,
            schema,
            store,
            pool,
            insert: sql,
        } = append_setup(WRITERS as u32).await;
        let data: Arc<[u8]> = payload().into();
        let raw: AppendFn = Arc::new(move |writer| {
            let (pool, sql, data) = (pool.clone(), sql.clone(), data.clone());
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(format!("writer-{writer}").into_bytes())
                    .bind(&data[..])
                    .execute(&pool)
                    .await
                    .expect("raw insert");
            })
        });
        let appends = store_append(Arc::new(store.clone()));
        AppendBench::new(
            vec![
                AppendCase::one("store_1_writer", &appends),
                AppendCase::one("raw_1_writer", &raw),
                AppendCase::many("store_32_writers", &appends),
                AppendCase::many("raw_32_writers", &raw),
            ],
            async move {
                store.close().await;
                drop_schema(&url, &schema)
                    .await
                    .expect("drop the bench schema");
            },
        )
    }

    /// The store's append beside a raw insert, timed in interleaved rounds:
    /// each round makes 50 appends of each kind (`PAIRS_BLOCK`), one kind
    /// after the other, so both see the same machine (one of each,
    /// alternated, would charge the raw insert with the store's `NOTIFY`,
    /// which runs after the append returns). A durable commit waits for a
    /// WAL flush, whose time on a shared machine moves by more than the
    /// store's own work; the criterion cases (`append/postgres/*_1_writer`),
    /// run one after another, each see whatever state the disk was in
    /// during theirs.
    ///
    /// Prints the median of each kind and their ratio, then the process's
    /// own CPU per append of each kind (user and system time, from
    /// `/proc/self/stat`; Linux only), over runs of one kind at a time:
    /// what the client side costs, apart from the server and the disk. The
    /// store appends to one stream at the default limits; the raw insert is
    /// the criterion case's (`INSERT` of the stream and payload into a
    /// table with a `BIGSERIAL` key, through a sqlx pool).
    async fn append_pairs(rounds: usize) -> bool {
        let AppendSetup {
            url,
            schema,
            store,
            pool,
            insert,
        } = append_setup(1).await;
        let data = payload();
        let raw_insert = || async {
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(&b"writer-0"[..])
                .bind(&data[..])
                .execute(&pool)
                .await
                .expect("raw insert");
        };
        let append = || async {
            store
                .store_event("writer-0", NewEvent::new(&data))
                .await
                .expect("append");
        };
        let mut times: Vec<Vec<Duration>> = (0..2).map(|_| Vec::with_capacity(rounds)).collect();
        for block in 0..rounds.div_ceil(PAIRS_BLOCK) {
            let size = PAIRS_BLOCK.min(rounds - block * PAIRS_BLOCK);
            for _ in 0..size {
                let start = Instant::now();
                raw_insert().await;
                times[0].push(start.elapsed());
            }
            for _ in 0..size {
                let start = Instant::now();
                append().await;
                times[1].push(start.elapsed());
            }
        }
        let [raw, appended] = [0, 1].map(|i| median_us(&mut times[i]));
        println!(
            "{rounds} rounds, medians: raw insert {raw:.1} us; store {appended:.1} us ({:.2}x of raw)",
            raw / appended
        );
        let per_op = |before: Option<u64>| {
            process_cpu_ns()
                .zip(before)
                .map(|(after, before)| (after - before) as f64 / rounds as f64 / 1e3)
        };
        let before = process_cpu_ns();
        for _ in 0..rounds {
            raw_insert().await;
        }
        let raw_cpu = per_op(before);
        let before = process_cpu_ns();
        for _ in 0..rounds {
            append().await;
        }
        if let (Some(raw_cpu), Some(store_cpu)) = (raw_cpu, per_op(before)) {
            println!(
                "this process's CPU per append: raw insert {raw_cpu:.1} us; store {store_cpu:.1} us"
            );
        }
        store.close().await;
        pool.close().await;
        drop_schema(&url, &schema).await.expect("drop the schema");
        true
    }

    type TaskOps = Tasks;
    type Claim = Claim;
    type Wake = Wake;

    /// A pool of 8 connections on the harness's schema (as many as the
    /// harness gives the store's pool); `raw_finish_notify`, the finish
    /// plus the `pg_notify` the store queues in the same transaction, on a
    /// channel nobody listens to (the cost of queueing it); the raw
    /// wake-up's listener.
    async fn task_raw(
        harness: &PostgresHarness,
        subject: &TaskSubject,
    ) -> TaskRaw<Tasks, Claim, Wake> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .connect(harness.url())
            .await
            .expect("raw postgres pool");
        let ops = Tasks::new(
            pool.clone(),
            harness.schema(),
            subject.owner_digest(),
            *subject.me.as_bytes(),
        );
        let channel = format!("{}_raw_wake", harness.schema());
        let mut listener = sqlx::postgres::PgListener::connect(harness.url())
            .await
            .expect("raw listener");
        listener.listen(&channel).await.expect("LISTEN");
        let notifying = Tasks {
            notify: Some(format!("{}_raw_finish", harness.schema())),
            ..ops.clone()
        };
        TaskRaw {
            ops,
            finishes: vec![("raw_finish_notify", notifying)],
            claim: Some(Claim {
                pool: pool.clone(),
                schema: harness.schema().to_owned(),
            }),
            wake: Some(Wake {
                pool,
                listener,
                channel,
            }),
            settle: Duration::from_millis(2),
        }
    }

    /// `notify`: `pg_notify` on a pool, heard by sqlx's `PgListener` on a
    /// connection of its own.
    fn bus(rt: &tokio::runtime::Runtime, cases: &mut impl DeliveryCases) {
        let mut notify = rt.block_on(Notify::new());
        cases.case("notify", &mut notify);
        // What the connections spawn as they close needs the runtime.
        rt.block_on(async { drop(notify) });
    }
}
