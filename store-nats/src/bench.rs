//! This backend's bench baselines and test hooks (feature `bench`):
//! [`NatsKit`], the [`Kit`] the benchmarks (`mcp-event-store-benches`) and
//! the facade's test support reach it through. Each finds its server as
//! the tests do ([`server_url`]) and works under a prefix of its own that
//! it removes at the end.
//!
//! * Replay: the data set appended through the store; the raw baseline
//!   reads the probe stream's subject of the store's own events stream by
//!   hand, one direct get by subject per event (what JetStream offers for
//!   "the messages of one subject after a sequence"), decoding each
//!   message's header as the store does.
//! * Append: a JetStream publish awaited until acknowledged, to a stream of
//!   its own with the store's storage and replicas, one subject per writer.
//! * Tasks: the task's value by hand in a key-value bucket of its own
//!   (create, read with the instance's lease, compare-and-set on the
//!   revision); core NATS publish and subscribe as the raw wake-up.
//! * Bus: a core NATS publish heard by a subscription.
//! * Redemptions: the bucket's `create` (a publish expecting no message on
//!   the key's subject yet) in a key-value bucket of its own ([`Redeem`]).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use mcp_event_store_conformance::bench::append::{
    AppendBench, AppendCase, AppendFn, WRITERS, store_append,
};
use mcp_event_store_conformance::bench::bus::{Delivery, DeliveryCases, within_guard};
use mcp_event_store_conformance::bench::redeem::RawRedeem;
use mcp_event_store_conformance::bench::tasks::{
    MAX_WAIT, NoClaim, RESULT, RawWake, TaskOps, TaskRaw, TaskSubject, fresh_key,
};
use mcp_event_store_conformance::bench::{
    Kit, Loaded, RawEvent, RawRead, StreamPlan, append_plan, payload, unbounded,
};
use mcp_event_store_conformance::testkit;
use mcp_event_store_core::backend::{RedeemKey, StreamToken};
use mcp_event_store_core::task::TaskStatus;
use mcp_event_store_core::{Backend, Position};

use crate::testing::{NatsHarness, TEST_PREFIX, remove_prefix, server_url};
use crate::wire::{self, Body};
use crate::{NatsOptions, NatsStore};

/// What the facade's `for_each_backend!` passes on for this backend: its
/// kit, and what its storage allows: `restart` (a new process opens it
/// again) and `shared` (several processes at once, as its harness's
/// `shared_across_processes` says).
#[doc(hidden)]
#[macro_export]
macro_rules! test_kit {
    ($callback:ident!($($args:tt)*)) => {
        $callback!($($args)* kit = $crate::bench::NatsKit, restart = yes, shared = yes);
    };
}

/// The NATS backend's [`Kit`].
pub struct NatsKit;

/// A fresh prefix of the bench's own.
fn bench_prefix() -> String {
    format!("{TEST_PREFIX}{}", testkit::random_suffix())
}

/// A plain client and JetStream context on the test server.
async fn raw_client() -> (async_nats::Client, jetstream::Context) {
    let url = server_url().await;
    let (servers, _) = NatsOptions::default()
        .servers(&url)
        .expect("the test server's URL");
    let client = async_nats::connect(servers.as_slice())
        .await
        .expect("connect to NATS");
    let js = jetstream::new(client.clone());
    (client, js)
}

/// A loaded data set: the store, the server and the prefix.
pub struct Storage {
    store: NatsStore,
    url: String,
    prefix: String,
}

/// The raw baseline: direct gets by subject on the store's events stream,
/// each message's header decoded as the store does.
pub struct Raw {
    events: stream::Stream,
    subject: String,
}

impl RawRead for Raw {
    /// Every event after `after`, one direct get each.
    async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        let mut out = Vec::new();
        let mut from = after.minor + 1;
        loop {
            let message = match self
                .events
                .direct_get_next_for_subject(self.subject.as_str(), Some(from))
                .await
            {
                Ok(message) => message,
                Err(e) if e.kind() == stream::DirectGetErrorKind::NotFound => return out,
                Err(e) => panic!("raw direct get: {e}"),
            };
            let (header, _, body) =
                wire::decode(message.sequence, message.payload).expect("an event message");
            let Body::Inline(data) = body else {
                panic!("the bench's events fit one message")
            };
            out.push((
                Position::new(header.base, message.sequence),
                data,
                header.retry.map(|r| r.as_millis() as i64),
            ));
            from = message.sequence + 1;
        }
    }
}

/// Raw tasks: each task's value in a bucket of its own, as the store keeps
/// it (the store's encoded length), with the instance's lease beside it.
pub struct Tasks {
    tasks: kv::Store,
    instances: kv::Store,
    instance: String,
    value_len: usize,
    js: jetstream::Context,
    prefix: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl TaskOps for Tasks {
    type Key = String;

    async fn create(&self) -> String {
        let key = hex(&fresh_key());
        let mut value = vec![0u8; self.value_len];
        value[1..9].copy_from_slice(&1u64.to_be_bytes());
        self.tasks
            .create(&key, value.into())
            .await
            .expect("raw create");
        key
    }

    async fn get(&self, key: &String) {
        let value = self.tasks.entry(key).await.expect("raw get");
        let alive = self.instances.entry(&self.instance).await.expect("raw get");
        black_box((value.expect("the task is there"), alive));
    }

    async fn finish(&self, key: &String) {
        let old = self
            .tasks
            .entry(key)
            .await
            .expect("raw get")
            .expect("the task is there");
        assert_eq!(old.value[0], 0, "the task is working");
        let rev = u64::from_be_bytes(old.value[1..9].try_into().expect("8 bytes"));
        let mut new = old.value.to_vec();
        new[0] = TaskStatus::Completed.as_u8();
        new[1..9].copy_from_slice(&(rev + 1).to_be_bytes());
        new.extend_from_slice(RESULT);
        self.tasks
            .update(key, new.into(), old.revision)
            .await
            .expect("raw compare-and-set");
    }

    async fn close(self) {
        for bucket in ["tasks", "instances"] {
            let _ = self
                .js
                .delete_stream(format!("KV_{}-raw-{bucket}", self.prefix))
                .await;
        }
    }
}

/// A bucket of the raw baselines: the store's layout (one value per key),
/// on one server.
async fn raw_bucket(js: &jetstream::Context, name: String) -> kv::Store {
    js.create_stream(stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .expect("a raw bucket");
    js.get_key_value(name).await.expect("the raw bucket")
}

/// Core NATS publish and subscribe: the wake-up a change sends.
pub struct Wake {
    client: async_nats::Client,
    subject: String,
    messages: async_nats::Subscriber,
}

impl Wake {
    async fn new() -> Self {
        let (client, _) = raw_client().await;
        let subject = format!("{}.wake", bench_prefix());
        let messages = client.subscribe(subject.clone()).await.expect("subscribe");
        client.flush().await.expect("flush the subscription");
        Self {
            client,
            subject,
            messages,
        }
    }
}

impl RawWake for Wake {
    async fn round_trip(&mut self, n: u64) -> Duration {
        let payload = Bytes::from(n.to_string());
        let start = Instant::now();
        self.client
            .publish(self.subject.clone(), payload.clone())
            .await
            .expect("raw publish");
        loop {
            let message = tokio::time::timeout(MAX_WAIT, self.messages.next())
                .await
                .expect("the message within 30 s")
                .expect("the subscription goes on");
            if message.payload == payload {
                return start.elapsed();
            }
        }
    }
}

/// NATS's own pub/sub: a core publish, heard by a subscription on another
/// connection.
struct Publish {
    client: async_nats::Client,
    subject: String,
    messages: async_nats::Subscriber,
    data: Bytes,
}

impl Publish {
    async fn new() -> Self {
        let (client, _) = raw_client().await;
        let (listener, _) = raw_client().await;
        let subject = format!("{}.bus", bench_prefix());
        let messages = listener
            .subscribe(subject.clone())
            .await
            .expect("subscribe");
        listener.flush().await.expect("flush the subscription");
        Self {
            client,
            subject,
            messages,
            data: payload().into(),
        }
    }
}

impl Delivery for Publish {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        self.client
            .publish(self.subject.clone(), self.data.clone())
            .await
            .expect("publish");
        let message = within_guard(self.messages.next()).await;
        let took = called.elapsed();
        assert_eq!(message.payload, self.data);
        took
    }
}

/// The raw redemption: `create` of the key in a key-value bucket of its
/// own, the value the time it may go; an existing key is refused.
pub struct Redeem {
    bucket: kv::Store,
    js: jetstream::Context,
    name: String,
}

impl RawRedeem for Redeem {
    async fn redeem(&self, key: &RedeemKey, forget_at: i64) -> bool {
        let value = Bytes::copy_from_slice(&forget_at.to_le_bytes());
        match self.bucket.create(key.to_hex(), value).await {
            Ok(_) => true,
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => false,
            Err(e) => panic!("raw redeem: {e}"),
        }
    }

    async fn close(self) {
        let _ = self.js.delete_stream(format!("KV_{}", self.name)).await;
    }
}

impl Kit for NatsKit {
    const BACKEND: &'static Backend = &crate::BACKEND;

    type Harness = NatsHarness;
    type TaskHarness = NatsHarness;

    async fn harness() -> NatsHarness {
        NatsHarness::new().await
    }

    type RawRedeem = Redeem;

    async fn raw_redeem(_: &NatsHarness) -> Redeem {
        let (_, js) = raw_client().await;
        let name = format!("{}-raw-redeemed", bench_prefix());
        Redeem {
            bucket: raw_bucket(&js, name.clone()).await,
            js,
            name,
        }
    }

    async fn task_harness() -> NatsHarness {
        NatsHarness::new().await
    }

    type Storage = Storage;
    type Raw = Raw;

    /// Appends every event through the store, hundreds in flight at once
    /// on its connection, in schedule order.
    async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
        let url = server_url().await;
        let prefix = bench_prefix();
        let store = NatsStore::connect_with(
            &url,
            NatsOptions::default()
                .prefix(prefix.clone())
                .store(unbounded()),
        )
        .await
        .expect("open nats");
        let ids = append_plan(&store, plan, 256).await;
        Loaded {
            store: Arc::new(store.clone()),
            token: ids[0].token,
            positions: ids.iter().map(|id| id.position).collect(),
            storage: Storage { store, url, prefix },
        }
    }

    /// A connection of its own on the store's events stream.
    async fn raw(storage: &Storage, token: StreamToken, _: &StreamPlan) -> Raw {
        let (_, js) = raw_client().await;
        let events = js
            .get_stream(format!("{}-events", storage.prefix))
            .await
            .expect("the store's events stream");
        let subject = format!("{}.ev.{}", storage.prefix, token.to_text());
        Raw { events, subject }
    }

    /// Closes the store and deletes its streams and buckets.
    async fn cleanup(storage: Storage) {
        storage.store.close().await;
        remove_prefix(&storage.url, &storage.prefix)
            .await
            .expect("remove the bench's store");
    }

    /// The store beside a JetStream publish awaited until acknowledged,
    /// one writer and 32, each on a subject of its own.
    async fn append() -> AppendBench {
        let url = server_url().await;
        let prefix = bench_prefix();
        let store = NatsStore::connect_with(&url, NatsOptions::default().prefix(prefix.clone()))
            .await
            .expect("open nats");
        let (_, js) = raw_client().await;
        let raw_stream = format!("{prefix}-raw");
        js.create_stream(stream::Config {
            name: raw_stream.clone(),
            subjects: vec![format!("{prefix}.raw.*")],
            ..Default::default()
        })
        .await
        .expect("the raw stream");
        let subjects: Arc<Vec<String>> =
            Arc::new((0..WRITERS).map(|w| format!("{prefix}.raw.{w}")).collect());
        let data = Bytes::from(payload());
        let raw_js = js.clone();
        let raw: AppendFn = Arc::new(move |writer| {
            let (js, subjects, data) = (raw_js.clone(), subjects.clone(), data.clone());
            Box::pin(async move {
                js.publish(subjects[writer].clone(), data)
                    .await
                    .expect("raw publish")
                    .await
                    .expect("raw acknowledgement");
            })
        });
        let appends = store_append(Arc::new(store.clone()));
        AppendBench::new(
            vec![
                AppendCase::one("store_1_writer", &appends),
                AppendCase::one("raw_publish_ack_1_writer", &raw),
                AppendCase::many("store_32_writers", &appends),
                AppendCase::many("raw_publish_ack_32_writers", &raw),
            ],
            async move {
                store.close().await;
                let _ = js.delete_stream(raw_stream).await;
                remove_prefix(&url, &prefix)
                    .await
                    .expect("remove the bench's store");
            },
        )
    }

    type TaskOps = Tasks;
    type Claim = NoClaim;
    type Wake = Wake;

    async fn task_raw(_: &NatsHarness, subject: &TaskSubject) -> TaskRaw<Tasks, NoClaim, Wake> {
        let (_, js) = raw_client().await;
        let prefix = bench_prefix();
        let tasks = raw_bucket(&js, format!("{prefix}-raw-tasks")).await;
        let instances = raw_bucket(&js, format!("{prefix}-raw-instances")).await;
        let instance = hex(subject.me.as_bytes());
        instances
            .put(&instance, Bytes::copy_from_slice(&i64::MAX.to_be_bytes()))
            .await
            .expect("raw instance");
        TaskRaw {
            ops: Tasks {
                tasks,
                instances,
                instance,
                value_len: subject.value_len(),
                js,
                prefix,
            },
            finishes: Vec::new(),
            claim: None,
            wake: Some(Wake::new().await),
            settle: Duration::from_millis(2),
        }
    }

    fn bus(rt: &tokio::runtime::Runtime, cases: &mut impl DeliveryCases) {
        let mut publish = rt.block_on(Publish::new());
        cases.case("publish", &mut publish);
        rt.block_on(async { drop(publish) });
    }
}
