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

use std::time::{Duration, Instant};

use common::{Delivery, two_handles};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures_util::StreamExt;
use mcp_event_store::bus::{Bus, Start, StoreBus, Subscription, Topic};
use mcp_event_store::runtime::{Audience, Heard, Runtime};
use mcp_event_store::{Backend, DynStore};
use mcp_event_store_conformance::bench::bus::{DeliveryCases, GUARD, within_guard};
use mcp_event_store_conformance::bench::{Kit, Visitor};
use tokio::sync::mpsc;

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

fn latency(c: &mut Criterion) {
    let rt = common::runtime();
    for backend in common::selected() {
        let (a, b, cleanup) = rt.block_on(two_handles(backend));
        let mut store = rt.block_on(ThroughStore::new(a, b));
        common::deliveries(
            c,
            &rt,
            backend,
            &format!("bus/{}/store", backend.name),
            &mut store,
        );
        // What the handles and connections spawn as they close needs the
        // runtime: each is dropped inside it.
        rt.block_on(async { drop(store) });
        // The database's own primitive, where it has one (the backend's
        // kit: `pg_notify`, `PUBLISH`, `XADD`).
        common::visit(
            backend,
            Raw {
                c: &mut *c,
                rt: &rt,
                backend,
            },
        );
        rt.block_on(cleanup);
    }
}

/// The raw deliveries of one backend.
struct Raw<'a> {
    c: &'a mut Criterion,
    rt: &'a tokio::runtime::Runtime,
    backend: &'static Backend,
}

impl Visitor for Raw<'_> {
    type Output = ();

    fn visit<K: Kit>(mut self) {
        let rt = self.rt;
        K::bus(rt, &mut self);
    }
}

impl DeliveryCases for Raw<'_> {
    fn case(&mut self, id: &str, delivery: &mut impl Delivery) {
        let group = format!("bus/{}/{id}", self.backend.name);
        common::deliveries(self.c, self.rt, self.backend, &group, delivery);
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
            let mut group = c.benchmark_group(format!("bus/{}/{variant}", backend.name));
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
