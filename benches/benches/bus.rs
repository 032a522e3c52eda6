//! The bus (C17 to C19): how soon a message published through one handle
//! reaches a subscriber on another, beside the database's own primitive
//! doing the same, and what fan-out to many subscribers costs.
//!
//! * `bus/<backend>/store/latency`: `StoreBus::publish` called on handle
//!   A, then the time until a subscription on handle B has the message
//!   (from the call, so the publish itself counts, as it does in the raw
//!   cases). For memory, A and B are one handle; for sled, two handles in
//!   one process.
//! * The same by hand, from the call until another connection has it:
//!   `bus/postgres/notify/latency` (`SELECT pg_notify(..)` on a pool,
//!   heard by sqlx's `PgListener` on a connection of its own),
//!   `bus/redis/publish/latency` (`PUBLISH`, heard by a `SUBSCRIBE`
//!   connection) and `bus/redis/xadd/latency` (`XADD`, heard by a task
//!   blocked in `XREAD BLOCK` on another connection). SQLite, sled and
//!   memory have no such primitive: their bus is their following (C13).
//! * Besides criterion's estimates, 1,000 single deliveries of each are
//!   timed and their median and 99th percentile written to
//!   `<criterion dir>/<id>/percentiles.json` (printed too).
//! * `bus/<backend>/fanout/{1,1000}`: one publish on A, then the time until
//!   every one of N subscriptions to its topic on B has it (each driven by a
//!   task of its own, each its own subscription). The 1 case is the
//!   baseline: the ratio is what each further subscriber costs.
//! * `bus/<backend>/listeners/{1,1000}`: the same through the runtime
//!   (`Runtime::notify` on A, N `Runtime::notifications` listeners on B,
//!   as N `subscriptions/listen` requests hold): they share one
//!   subscription, so the store is read once per message.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench bus
//! cargo bench -p mcp-event-store-benches --bench bus -- postgres/
//! ```

use mcp_event_store_benches as common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{Backend, Delivery, two_handles};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures_util::StreamExt;
use mcp_event_store::DynStore;
use mcp_event_store::bus::{Bus, Start, StoreBus, Subscription, Topic};
use mcp_event_store::runtime::{Audience, Heard, Runtime};
use tokio::sync::mpsc;

/// How long one delivery may take before the bench fails.
const GUARD: Duration = Duration::from_secs(30);

/// Waits at most [`GUARD`] for `next`.
async fn within_guard<T>(next: impl Future<Output = Option<T>>) -> T {
    tokio::time::timeout(GUARD, next)
        .await
        .expect("delivered within the guard")
        .expect("the subscription goes on")
}

/// The store's bus: publish on A's, a subscription on B's.
struct ThroughStore {
    publisher: StoreBus,
    topic: Topic,
    subscription: Subscription,
    data: Vec<u8>,
}

impl ThroughStore {
    async fn new(a: DynStore, b: DynStore) -> Self {
        let topic = Topic::new("bench/latency").expect("a topic");
        let subscription = StoreBus::new(b)
            .subscribe(&topic, Start::Now)
            .await
            .expect("subscribe");
        Self {
            publisher: StoreBus::new(a),
            topic,
            subscription,
            data: common::payload(),
        }
    }
}

impl Delivery for ThroughStore {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        let cursor = self
            .publisher
            .publish(&self.topic, &self.data)
            .await
            .expect("publish");
        let message = within_guard(self.subscription.next())
            .await
            .expect("no error");
        let took = called.elapsed();
        assert_eq!(message.cursor, cursor, "the subscriber got another message");
        took
    }
}

/// PostgreSQL's own: `pg_notify` on a pool, heard by a `PgListener`.
struct Notify {
    pool: sqlx::PgPool,
    listener: sqlx::postgres::PgListener,
    channel: String,
    data: String,
}

impl Notify {
    async fn new() -> Self {
        let url = mcp_event_store_postgres::testing::server_url().await;
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
            data: String::from_utf8(common::payload()).expect("a text payload"),
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

/// Redis's own pub/sub: `PUBLISH`, heard by a `SUBSCRIBE` connection.
struct Publish {
    conn: redis::aio::MultiplexedConnection,
    messages: futures_util::stream::BoxStream<'static, redis::Msg>,
    channel: String,
    data: Vec<u8>,
}

impl Publish {
    async fn new() -> Self {
        let url = mcp_event_store_redis::testing::server_url().await;
        let channel = format!("{}bus", mcp_event_store_redis::testing::random_prefix());
        let mut pubsub = redis::Client::open(url.as_str())
            .expect("redis url")
            .get_async_pubsub()
            .await
            .expect("a subscribing connection");
        pubsub.subscribe(&channel).await.expect("SUBSCRIBE");
        Self {
            conn: common::redis::raw_connection(&url).await,
            messages: pubsub.into_on_message().boxed(),
            channel,
            data: common::payload(),
        }
    }
}

impl Delivery for Publish {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(&self.data)
            .query_async(&mut self.conn)
            .await
            .expect("PUBLISH");
        let message = within_guard(self.messages.next()).await;
        let took = called.elapsed();
        assert_eq!(message.get_payload_bytes(), self.data);
        took
    }
}

/// Redis Streams by hand: `XADD`, heard by a task blocked in `XREAD BLOCK`
/// on a connection of its own (what a store's follow does, without the
/// store).
struct Xadd {
    conn: redis::aio::MultiplexedConnection,
    key: String,
    heard: mpsc::UnboundedReceiver<String>,
    reader: tokio::task::JoinHandle<()>,
    data: Vec<u8>,
}

impl Xadd {
    async fn new() -> Self {
        let url = mcp_event_store_redis::testing::server_url().await;
        let key = format!("{}bus", mcp_event_store_redis::testing::random_prefix());
        let mut blocked = common::redis::raw_connection(&url).await;
        let (tell, heard) = mpsc::unbounded_channel();
        let read_key = key.clone();
        let reader = tokio::spawn(async move {
            let mut last = "$".to_owned();
            loop {
                // Blocks a second at most: under the connection's response
                // timeout.
                // Nil when the block ran out; else per key its entries, each
                // an id and its fields.
                type Read = Option<Vec<(String, Vec<(String, Vec<Vec<u8>>)>)>>;
                let read: Read = redis::cmd("XREAD")
                    .arg("BLOCK")
                    .arg(1_000)
                    .arg("STREAMS")
                    .arg(&read_key)
                    .arg(&last)
                    .query_async(&mut blocked)
                    .await
                    .expect("XREAD");
                let entries = read.into_iter().flatten().flat_map(|(_, entries)| entries);
                for (id, _) in entries {
                    last = id.clone();
                    if tell.send(id).is_err() {
                        return;
                    }
                }
            }
        });
        Self {
            conn: common::redis::raw_connection(&url).await,
            key,
            heard,
            reader,
            data: common::payload(),
        }
    }
}

impl Delivery for Xadd {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        let id: String = redis::cmd("XADD")
            .arg(&self.key)
            .arg("*")
            .arg("d")
            .arg(&self.data)
            .query_async(&mut self.conn)
            .await
            .expect("XADD");
        let heard = within_guard(self.heard.recv()).await;
        let took = called.elapsed();
        assert_eq!(heard, id, "the reader got another entry");
        took
    }
}

impl Drop for Xadd {
    fn drop(&mut self) {
        self.reader.abort();
        let (mut conn, key) = (self.conn.clone(), self.key.clone());
        tokio::spawn(async move {
            let _: redis::RedisResult<i64> =
                redis::cmd("DEL").arg(key).query_async(&mut conn).await;
        });
    }
}

fn latency(c: &mut Criterion) {
    let rt = common::runtime();
    for backend in common::selected() {
        let (a, b, cleanup) = rt.block_on(two_handles(backend));
        let mut store = rt.block_on(ThroughStore::new(a, b));
        common::deliveries(
            c,
            &rt,
            backend,
            &format!("bus/{}/store", backend.name()),
            &mut store,
        );
        // What the handles and connections spawn as they close needs the
        // runtime: each is dropped inside it.
        rt.block_on(async { drop(store) });
        match backend {
            Backend::Postgres => {
                let mut notify = rt.block_on(Notify::new());
                common::deliveries(
                    c,
                    &rt,
                    backend,
                    &format!("bus/{}/notify", backend.name()),
                    &mut notify,
                );
                rt.block_on(async { drop(notify) });
            }
            Backend::Redis => {
                let mut publish = rt.block_on(Publish::new());
                common::deliveries(
                    c,
                    &rt,
                    backend,
                    &format!("bus/{}/publish", backend.name()),
                    &mut publish,
                );
                rt.block_on(async { drop(publish) });
                let mut xadd = rt.block_on(Xadd::new());
                common::deliveries(
                    c,
                    &rt,
                    backend,
                    &format!("bus/{}/xadd", backend.name()),
                    &mut xadd,
                );
                rt.block_on(async { drop(xadd) });
            }
            Backend::Memory | Backend::Sqlite | Backend::Sled => {}
        }
        rt.block_on(cleanup);
    }
}

/// Where a fan-out case publishes: the bus itself, or the runtime
/// (`Runtime::notify`, heard by `Runtime::notifications` listeners).
enum Publisher {
    Bus(StoreBus, Topic),
    Runtime(Runtime),
}

impl Publisher {
    async fn publish(&self, data: &[u8]) {
        match self {
            Self::Bus(bus, topic) => bus.publish(topic, data).await.map(drop),
            Self::Runtime(runtime) => runtime.notify(&Audience::All, data).await,
        }
        .expect("publish")
    }
}

/// One publish on A, heard by `subscribers` subscriptions or listeners on
/// B, each driven by a task of its own that reports what it hears.
struct Fanout {
    publisher: Publisher,
    /// B's runtime, when listeners are the runtime's.
    listening: Option<Runtime>,
    subscribers: usize,
    heard: mpsc::UnboundedReceiver<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    data: Vec<u8>,
}

impl Fanout {
    /// `subscribers` subscriptions of B's bus, each its own.
    async fn subscriptions(a: DynStore, b: DynStore, subscribers: usize) -> Self {
        let topic = Topic::new("bench/fanout").expect("a topic");
        let bus = StoreBus::new(b);
        let mut streams = Vec::with_capacity(subscribers);
        for _ in 0..subscribers {
            let subscription = bus.subscribe(&topic, Start::Now).await.expect("subscribe");
            // Heard, or failed (none is read once the case is over and its
            // store closes).
            streams.push(subscription.map(|message| message.is_ok()).boxed());
        }
        Self::over(Publisher::Bus(StoreBus::new(a), topic), None, streams)
    }

    /// `subscribers` notification listeners of B's runtime, which share one
    /// subscription.
    async fn listeners(a: DynStore, b: DynStore, subscribers: usize) -> Self {
        let start = |store: DynStore| async move {
            Runtime::builder(store)
                .purge_every(None)
                .start()
                .await
                .expect("a runtime")
        };
        let (a, b) = (start(a).await, start(b).await);
        let mut streams = Vec::with_capacity(subscribers);
        for _ in 0..subscribers {
            let listener = b.notifications().await.expect("listen");
            streams.push(
                listener
                    .map(|heard| matches!(heard, Heard::Message(_)))
                    .boxed(),
            );
        }
        Self::over(Publisher::Runtime(a), Some(b), streams)
    }

    fn over(
        publisher: Publisher,
        listening: Option<Runtime>,
        streams: Vec<futures_util::stream::BoxStream<'static, bool>>,
    ) -> Self {
        let (tell, heard) = mpsc::unbounded_channel();
        let subscribers = streams.len();
        let tasks = streams
            .into_iter()
            .map(|mut stream| {
                let tell = tell.clone();
                tokio::spawn(async move {
                    while let Some(heard) = stream.next().await {
                        if tell.send(heard).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Self {
            publisher,
            listening,
            subscribers,
            heard,
            tasks,
            data: common::payload(),
        }
    }

    /// Publishes once; the time until every subscriber has it.
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        self.publisher.publish(&self.data).await;
        for _ in 0..self.subscribers {
            let heard = tokio::time::timeout(GUARD, self.heard.recv())
                .await
                .expect("every subscriber within the guard")
                .expect("the subscribers go on");
            assert!(heard, "a subscriber failed or missed the message");
        }
        called.elapsed()
    }

    /// Stops what it started.
    async fn close(self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Publisher::Runtime(runtime) = &self.publisher {
            runtime.shutdown().await;
        }
        if let Some(runtime) = &self.listening {
            runtime.shutdown().await;
        }
    }
}

fn fanout(c: &mut Criterion) {
    let rt = common::runtime();
    let many = if common::quick() { 10 } else { 1_000 };
    for backend in common::selected() {
        // Subscriptions of the bus, each its own; then the runtime's
        // notification listeners, sharing one.
        for shared in [false, true] {
            let variant = if shared { "listeners" } else { "fanout" };
            let mut group = c.benchmark_group(format!("bus/{}/{variant}", backend.name()));
            group.sample_size(20);
            group.measurement_time(Duration::from_secs(5));
            for subscribers in [1, many] {
                let (a, b, cleanup) = rt.block_on(two_handles(backend));
                let mut fanout = rt.block_on(async {
                    match shared {
                        false => Fanout::subscriptions(a, b, subscribers).await,
                        true => Fanout::listeners(a, b, subscribers).await,
                    }
                });
                group.bench_with_input(
                    BenchmarkId::from_parameter(subscribers),
                    &subscribers,
                    |bench, _| {
                        bench.iter_custom(|iters| {
                            rt.block_on(async {
                                let mut total = Duration::ZERO;
                                for _ in 0..iters {
                                    total += fanout.one().await;
                                }
                                total
                            })
                        })
                    },
                );
                rt.block_on(fanout.close());
                rt.block_on(cleanup);
            }
            group.finish();
        }
    }
}

criterion_group!(benches, latency, fanout);
criterion_main!(benches);
