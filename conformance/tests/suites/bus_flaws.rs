//! The bus cases (C17 to C19) must fail buses that break the contract:
//! each test runs a case on a deliberately flawed bus, the kinds people
//! write by hand, and expects it to panic.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures_util::{FutureExt, StreamExt};
use mcp_event_store_conformance::events::{
    self as conformance, BusHarness, Harness, MemoryHarness,
};
use mcp_event_store_core::bus::{Bus, Cursor, Message, Start, StoreBus, Subscription, Topic};
use mcp_event_store_core::{Error, EventStore, NewEvent, Result, StoreOptions};
use tokio::sync::{broadcast, mpsc};

#[derive(Clone, Copy, Debug)]
enum Flaw {
    /// An in-process broadcast per handle: nothing crosses handles.
    LocalOnly,
    /// Each message delivered twice.
    Duplicates,
    /// A topic is the stream of the same name: topics and event streams
    /// share one namespace.
    SharedNamespace,
    /// A cursor retention overtook quietly resumes from now.
    SkipsTheGap,
    /// A background task reads every message into memory for the
    /// subscriber, however slow it is.
    BuffersEverything,
}

/// A flawed bus over the store's bus (and, for [`Flaw::LocalOnly`], a
/// broadcast channel of its handle's own).
struct Flawed {
    inner: StoreBus,
    store: Arc<dyn EventStore>,
    flaw: Flaw,
    local: Mutex<HashMap<Topic, broadcast::Sender<Message>>>,
}

impl Flawed {
    fn local(&self, topic: &Topic) -> broadcast::Sender<Message> {
        let mut local = self.local.lock().unwrap();
        local
            .entry(topic.clone())
            .or_insert_with(|| broadcast::channel(1024).0)
            .clone()
    }
}

#[async_trait]
impl Bus for Flawed {
    async fn publish(&self, topic: &Topic, message: &[u8]) -> Result<Cursor> {
        match self.flaw {
            Flaw::SharedNamespace => {
                let id = self
                    .store
                    .store_event(topic.as_str(), NewEvent::new(message))
                    .await?;
                Cursor::parse(&id.to_string())
            }
            Flaw::LocalOnly => {
                let cursor = self.inner.publish(topic, message).await?;
                let _ = self.local(topic).send(Message {
                    cursor,
                    payload: message.to_vec().into(),
                });
                Ok(cursor)
            }
            _ => self.inner.publish(topic, message).await,
        }
    }

    async fn subscribe(&self, topic: &Topic, start: Start) -> Result<Subscription> {
        let topic = topic.clone();
        match self.flaw {
            Flaw::LocalOnly => {
                let receiver = self.local(&topic).subscribe();
                let messages = futures_util::stream::unfold(receiver, |mut receiver| async move {
                    let message = receiver.recv().await.ok()?;
                    Some((Ok(message), receiver))
                });
                Ok(Subscription::new(topic, messages.boxed()))
            }
            Flaw::Duplicates => {
                let messages = self.inner.subscribe(&topic, start).await?.flat_map(|item| {
                    let copies = match item {
                        Ok(message) => vec![Ok(message.clone()), Ok(message)],
                        Err(error) => vec![Err(error)],
                    };
                    futures_util::stream::iter(copies)
                });
                Ok(Subscription::new(topic, messages.boxed()))
            }
            Flaw::SharedNamespace => {
                let primed = self
                    .store
                    .store_event(
                        topic.as_str(),
                        NewEvent::priming(std::time::Duration::from_secs(1)),
                    )
                    .await?;
                let follow = self
                    .store
                    .follow_events_after(&primed.to_string(), Default::default())
                    .await?;
                let messages = follow.events.filter_map(|event| async move {
                    match event {
                        Ok(event) if event.retry.is_some() => None,
                        Ok(event) => Some(Ok(Message {
                            cursor: Cursor::parse(&event.id.to_string()).unwrap(),
                            payload: event.data,
                        })),
                        Err(error) => Some(Err(error)),
                    }
                });
                Ok(Subscription::new(topic, messages.boxed()))
            }
            Flaw::SkipsTheGap => match self.inner.subscribe(&topic, start).await {
                Err(Error::FellBehind { .. }) => self.inner.subscribe(&topic, Start::Now).await,
                other => other,
            },
            Flaw::BuffersEverything => {
                let mut inner = self.inner.subscribe(&topic, start).await?;
                let (buffer, buffered) = mpsc::unbounded_channel();
                tokio::spawn(async move {
                    while let Some(item) = inner.next().await {
                        if buffer.send(item).is_err() {
                            break;
                        }
                    }
                });
                let messages = futures_util::stream::unfold(buffered, |mut buffered| async move {
                    let item = buffered.recv().await?;
                    Some((item, buffered))
                });
                Ok(Subscription::new(topic, messages.boxed()))
            }
        }
    }
}

struct FlawedBuses {
    flaw: Flaw,
    storage: MemoryHarness,
}

#[async_trait]
impl BusHarness for FlawedBuses {
    type Bus = Flawed;

    async fn open_bus(&self, options: StoreOptions) -> (Flawed, Arc<dyn EventStore>) {
        let store: Arc<dyn EventStore> = Arc::new(self.storage.open(options).await);
        let bus = Flawed {
            inner: StoreBus::new(store.clone()),
            store: store.clone(),
            flaw: self.flaw,
            local: Mutex::default(),
        };
        (bus, store)
    }
}

async fn assert_case_fails<F, Fut>(flaw: Flaw, case: F)
where
    F: FnOnce(FlawedBuses) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let harness = FlawedBuses {
        flaw,
        storage: MemoryHarness::new().await,
    };
    let outcome = AssertUnwindSafe(case(harness)).catch_unwind().await;
    assert!(outcome.is_err(), "the bus cases let {flaw:?} through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_local_to_its_handle_fails() {
    assert_case_fails(Flaw::LocalOnly, |h| async move {
        conformance::a_message_reaches_every_subscriber_on_every_handle(&h).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_delivers_twice_fails() {
    assert_case_fails(Flaw::Duplicates, |h| async move {
        conformance::a_message_reaches_every_subscriber_on_every_handle(&h).await
    })
    .await;
    assert_case_fails(Flaw::Duplicates, |h| async move {
        conformance::every_subscriber_receives_one_order_from_concurrent_publishers(&h).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_sharing_the_streams_namespace_fails() {
    assert_case_fails(Flaw::SharedNamespace, |h| async move {
        conformance::a_subscription_never_receives_another_topic_or_a_stream(&h).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_skips_a_gap_fails() {
    assert_case_fails(Flaw::SkipsTheGap, |h| async move {
        conformance::a_cursor_retention_overtook_is_fell_behind(&h).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_buffers_for_a_slow_subscriber_fails() {
    assert_case_fails(Flaw::BuffersEverything, |h| async move {
        conformance::a_slow_subscriber_overtaken_is_told_and_holds_nothing(&h).await
    })
    .await;
}

/// Every bus case passes on the store's bus over the memory store, so the
/// failures above are the flaws' doing (the backends run them all too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cases_pass_on_the_store_bus() {
    let h = MemoryHarness::new().await;
    conformance::a_message_reaches_every_subscriber_on_every_handle(&h).await;
    conformance::every_subscriber_receives_one_order_from_concurrent_publishers(&h).await;
    conformance::a_subscription_never_receives_another_topic_or_a_stream(&h).await;
    let h = MemoryHarness::new().await;
    conformance::a_cursor_retention_overtook_is_fell_behind(&h).await;
    let h = MemoryHarness::new().await;
    conformance::a_slow_subscriber_overtaken_is_told_and_holds_nothing(&h).await;
}
