//! C17 to C19, the bus: publish and subscribe between the handles sharing
//! a store, with catch-up from a cursor and bounds on what it takes.
//!
//! The cases run on a [`BusHarness`]: every [`Harness`] is one, with the
//! [`StoreBus`] over a new handle, so every backend runs them; a bus of
//! another kind (the flawed ones the suite must catch) brings its own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;

use super::{Harness, append, test_clock, test_options};
use mcp_event_store_core::bus::{Bus, Cursor, MAX_TOPIC_LEN, Message, Start, StoreBus, Topic};
use mcp_event_store_core::{Error, EventStore, Result, Retention, StoreOptions};

/// How long a case waits for a message that must come; far above any
/// backend's follow latency, so a miss is a failure, not a slow machine.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the bus cases run on.
#[async_trait]
pub trait BusHarness: Send + Sync + 'static {
    /// The bus under test.
    type Bus: Bus + 'static;

    /// A bus on a new handle of this harness's storage, opened with
    /// `options`, and that handle as a store (the cases purge through it).
    async fn open_bus(&self, options: StoreOptions) -> (Self::Bus, Arc<dyn EventStore>);
}

#[async_trait]
impl<H: Harness> BusHarness for H
where
    H::Store: 'static,
{
    type Bus = StoreBus;

    async fn open_bus(&self, options: StoreOptions) -> (StoreBus, Arc<dyn EventStore>) {
        let store: Arc<dyn EventStore> = Arc::new(self.open(options).await);
        (StoreBus::new(store.clone()), store)
    }
}

/// Two buses on two handles of one storage, no retention.
async fn two_buses<H: BusHarness>(h: &H) -> [(H::Bus, Arc<dyn EventStore>); 2] {
    let clock = test_clock();
    [
        h.open_bus(test_options(&clock)).await,
        h.open_bus(test_options(&clock)).await,
    ]
}

fn topic(name: &str) -> Topic {
    Topic::new(name).unwrap()
}

async fn publish<B: Bus + ?Sized>(bus: &B, topic: &Topic, message: &[u8]) -> Cursor {
    bus.publish(topic, message)
        .await
        .unwrap_or_else(|e| panic!("publish to {topic}: {e}"))
}

/// The next item of a subscription, failing the case if none comes in time
/// or the subscription ends.
async fn next(
    subscription: &mut mcp_event_store_core::bus::Subscription,
    what: &str,
) -> Result<Message> {
    match tokio::time::timeout(DELIVERY_TIMEOUT, subscription.next()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("the subscription ended while waiting for {what}"),
        Err(_) => panic!("nothing within {DELIVERY_TIMEOUT:?} while waiting for {what}"),
    }
}

/// The next `n` payloads, in the order delivered.
async fn payloads(
    subscription: &mut mcp_event_store_core::bus::Subscription,
    n: usize,
    what: &str,
) -> Vec<Vec<u8>> {
    let mut payloads = Vec::with_capacity(n);
    for i in 0..n {
        let message = next(subscription, what)
            .await
            .unwrap_or_else(|e| panic!("{what}: message {i} failed: {e}"));
        payloads.push(message.payload.to_vec());
    }
    payloads
}

/// Whether the subscription yields nothing for a moment: what a case
/// checks after the last message that may come.
async fn quiet(subscription: &mut mcp_event_store_core::bus::Subscription) -> bool {
    tokio::time::timeout(Duration::from_millis(300), subscription.next())
        .await
        .is_err()
}

/// C17, C11: a message published on one handle reaches every subscription
/// to its topic, on that handle and on another, each once.
pub async fn a_message_reaches_every_subscriber_on_every_handle<H: BusHarness>(h: &H) {
    let [(a, _), (b, _)] = two_buses(h).await;
    let t = topic("notify/all");
    let mut subscribers = [
        a.subscribe(&t, Start::Now).await.unwrap(),
        a.subscribe(&t, Start::Now).await.unwrap(),
        b.subscribe(&t, Start::Now).await.unwrap(),
        b.subscribe(&t, Start::Now).await.unwrap(),
    ];
    let from_a = publish(&a, &t, b"from a").await;
    let from_b = publish(&b, &t, b"from b").await;
    for (i, subscriber) in subscribers.iter_mut().enumerate() {
        let first = next(subscriber, "the message from a").await.unwrap();
        assert_eq!(
            (first.cursor, &first.payload[..]),
            (from_a, &b"from a"[..]),
            "subscriber {i}"
        );
        let second = next(subscriber, "the message from b").await.unwrap();
        assert_eq!(
            (second.cursor, &second.payload[..]),
            (from_b, &b"from b"[..]),
            "subscriber {i}"
        );
        assert!(
            quiet(subscriber).await,
            "subscriber {i} got a message twice"
        );
    }
}

/// C17, C6: publishers on two handles at once; every subscriber, on
/// either handle, receives every message once, each publisher's in the
/// order published, all of them in one order (the topic's).
pub async fn every_subscriber_receives_one_order_from_concurrent_publishers<H: BusHarness>(h: &H) {
    const EACH: usize = 40;
    let [(a, _), (b, _)] = two_buses(h).await;
    let (a, b) = (Arc::new(a), Arc::new(b));
    let t = topic("order");
    let mut on_a = a.subscribe(&t, Start::Now).await.unwrap();
    let mut on_b = b.subscribe(&t, Start::Now).await.unwrap();
    let publishers = [("a", a.clone()), ("b", b.clone())].map(|(name, bus)| {
        let t = t.clone();
        tokio::spawn(async move {
            for i in 0..EACH {
                publish(&*bus, &t, format!("{name}-{i:03}").as_bytes()).await;
            }
        })
    });
    for publisher in publishers {
        publisher.await.unwrap();
    }
    let seen_a = payloads(&mut on_a, 2 * EACH, "every message, on a").await;
    let seen_b = payloads(&mut on_b, 2 * EACH, "every message, on b").await;
    assert_eq!(seen_a, seen_b, "two subscribers saw two orders");
    let unique: HashSet<_> = seen_a.iter().collect();
    assert_eq!(unique.len(), 2 * EACH, "a message came twice");
    for name in ["a", "b"] {
        let own: Vec<_> = seen_a
            .iter()
            .filter(|p| p.starts_with(name.as_bytes()))
            .collect();
        let mut sorted = own.clone();
        sorted.sort();
        assert_eq!(own, sorted, "publisher {name}'s messages out of order");
    }
    assert!(quiet(&mut on_a).await && quiet(&mut on_b).await);
}

/// C17, C3: a subscription never receives a message of another topic,
/// however alike their names, nor an event of a stream named as the topic.
pub async fn a_subscription_never_receives_another_topic_or_a_stream<H: BusHarness>(h: &H) {
    let [(bus, store), _] = two_buses(h).await;
    let t = topic("a");
    let mut subscription = bus.subscribe(&t, Start::Now).await.unwrap();
    for other in ["a/b", "a:", "A", "ab", "b"] {
        publish(&bus, &topic(other), other.as_bytes()).await;
    }
    append(&*store, "a", b"an event of stream a").await;
    let own = publish(&bus, &t, b"own").await;
    let message = next(&mut subscription, "the topic's own message")
        .await
        .unwrap();
    assert_eq!(
        (message.cursor, &message.payload[..]),
        (own, &b"own"[..]),
        "the subscription to a received another topic's message"
    );
    assert!(quiet(&mut subscription).await);
}

/// C17: a subscription from now starts after what was published before it.
pub async fn a_subscription_from_now_starts_after_what_was_published<H: BusHarness>(h: &H) {
    let [(a, _), (b, _)] = two_buses(h).await;
    let t = topic("later");
    publish(&a, &t, b"before").await;
    let mut subscription = b.subscribe(&t, Start::Now).await.unwrap();
    publish(&a, &t, b"after").await;
    assert_eq!(
        payloads(&mut subscription, 1, "the message published after").await,
        [b"after".to_vec()]
    );
    assert!(quiet(&mut subscription).await);
}

/// C18, C11: a subscriber that reconnects, on any handle, resumes after
/// the last message it received: it gets everything published since, in
/// order, and nothing it had.
pub async fn a_resumed_subscription_receives_everything_after_its_cursor<H: BusHarness>(h: &H) {
    let [(a, _), (b, _)] = two_buses(h).await;
    let t = topic("resume");
    let mut first = a.subscribe(&t, Start::Now).await.unwrap();
    publish(&a, &t, b"1").await;
    publish(&a, &t, b"2").await;
    next(&mut first, "message 1").await.unwrap();
    let seen = next(&mut first, "message 2").await.unwrap();
    drop(first);
    for i in 3..=5u8 {
        publish(&a, &t, &[b'0' + i]).await;
    }
    let mut resumed = b.subscribe(&t, Start::After(seen.cursor)).await.unwrap();
    assert_eq!(
        payloads(&mut resumed, 3, "what was published while away").await,
        [b"3".to_vec(), b"4".to_vec(), b"5".to_vec()]
    );
    publish(&a, &t, b"6").await;
    assert_eq!(
        payloads(&mut resumed, 1, "what is published next").await,
        [b"6".to_vec()]
    );
    // Its text round-trips: a subscriber may keep it anywhere.
    let text = seen.cursor.to_string();
    assert_eq!(Cursor::parse(&text).unwrap(), seen.cursor);
}

/// C18: a cursor retention overtook is `FellBehind`, and so is another
/// topic's cursor: never a silent gap, never another topic's messages.
pub async fn a_cursor_retention_overtook_is_fell_behind<H: BusHarness>(h: &H) {
    let clock = test_clock();
    let options =
        test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60)));
    let (bus, store) = h.open_bus(options).await;
    let t = topic("old");
    let old = publish(&bus, &t, b"old").await;
    publish(&bus, &t, b"also old").await;
    clock.advance(Duration::from_secs(120));
    publish(&bus, &t, b"new").await;
    store.purge_expired().await.unwrap();
    assert_fell_behind(bus.subscribe(&t, Start::After(old)).await, &t);

    let other = publish(&bus, &topic("other"), b"other").await;
    publish(&bus, &topic("other"), b"other's next").await;
    match bus.subscribe(&t, Start::After(other)).await {
        Err(Error::FellBehind { .. }) => {}
        Err(error) => panic!("another topic's cursor: expected FellBehind, got {error}"),
        Ok(mut subscription) => match next(&mut subscription, "FellBehind").await {
            Err(Error::FellBehind { .. }) => {}
            Err(error) => panic!("another topic's cursor: expected FellBehind, got {error}"),
            Ok(message) => panic!("another topic's cursor delivered {message:?}"),
        },
    }
}

fn assert_fell_behind(subscribed: Result<mcp_event_store_core::bus::Subscription>, t: &Topic) {
    match subscribed {
        Err(Error::FellBehind { topic, .. }) => assert_eq!(topic, t.as_str()),
        Err(error) => panic!("expected FellBehind, got {error}"),
        Ok(_) => panic!("a purged cursor was accepted"),
    }
}

/// C18, C19: a subscriber that stops reading holds nothing back in memory:
/// when retention overtakes it, its next read is `FellBehind` (it was not
/// holding the purged messages), and the subscription ends.
pub async fn a_slow_subscriber_overtaken_is_told_and_holds_nothing<H: BusHarness>(h: &H) {
    let clock = test_clock();
    let options = test_options(&clock).retention(Retention::unbounded().max_events_per_stream(5));
    let (bus, store) = h.open_bus(options).await;
    let t = topic("slow");
    let mut slow = bus.subscribe(&t, Start::Now).await.unwrap();
    // The subscriber reads nothing while 30 messages come, one at a time
    // over a while, and all but the newest five are purged.
    for i in 0..30u8 {
        publish(&bus, &t, &[i]).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.purge_expired().await.unwrap();
    match next(&mut slow, "FellBehind").await {
        Err(Error::FellBehind { topic, .. }) => assert_eq!(topic, t.as_str()),
        Err(error) => panic!("expected FellBehind, got {error}"),
        Ok(message) => panic!(
            "the overtaken subscriber received {:?}: purged messages were held for it",
            message.payload
        ),
    }
    let after = tokio::time::timeout(DELIVERY_TIMEOUT, slow.next()).await;
    assert!(
        matches!(after, Ok(None)),
        "the subscription went on after FellBehind"
    );
}

/// C19: hostile topics and oversized messages are refused clearly and
/// store nothing; the topics around them are unharmed.
pub async fn hostile_topics_and_oversized_messages_are_refused<H: BusHarness>(h: &H) {
    const LIMIT: usize = 1024;
    let clock = test_clock();
    let (bus, store) = h
        .open_bus(test_options(&clock).max_payload_bytes(LIMIT))
        .await;
    let too_long = "t".repeat(MAX_TOPIC_LEN + 1);
    for hostile in [
        "",
        " ",
        "a b",
        "a\nb",
        "\u{0}",
        "\u{1}bus/a",
        "ünï",
        &too_long,
    ] {
        match Topic::new(hostile) {
            Err(Error::InvalidTopic { reason }) => assert!(!reason.is_empty()),
            Err(error) => panic!("{hostile:?}: expected InvalidTopic, got {error}"),
            Ok(topic) => panic!("{hostile:?} was accepted as {topic:?}"),
        }
    }
    let longest = topic(&"t".repeat(MAX_TOPIC_LEN));
    let t = topic("sized");
    let mut subscription = bus.subscribe(&t, Start::Now).await.unwrap();
    let fits = publish(&bus, &t, &[7; LIMIT]).await;
    match bus.publish(&t, &[8; LIMIT + 1]).await {
        Err(Error::PayloadTooLarge { size, max }) => {
            assert_eq!((size, max), (LIMIT + 1, LIMIT));
        }
        Err(error) => panic!("expected PayloadTooLarge, got {error}"),
        Ok(cursor) => panic!("an oversized message was published at {cursor}"),
    }
    publish(&bus, &longest, b"the longest topic").await;
    let after = publish(&bus, &t, b"after").await;
    let first = next(&mut subscription, "the message that fits")
        .await
        .unwrap();
    assert_eq!((first.cursor, first.payload.len()), (fits, LIMIT));
    let second = next(&mut subscription, "the message after").await.unwrap();
    assert_eq!(second.cursor, after, "the refused message was stored");
    drop(store);
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_bus {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            a_message_reaches_every_subscriber_on_every_handle,
            every_subscriber_receives_one_order_from_concurrent_publishers,
            a_subscription_never_receives_another_topic_or_a_stream,
            a_subscription_from_now_starts_after_what_was_published,
            a_resumed_subscription_receives_everything_after_its_cursor,
            a_cursor_retention_overtook_is_fell_behind,
            a_slow_subscriber_overtaken_is_told_and_holds_nothing,
            hostile_topics_and_oversized_messages_are_refused
        );
    };
}
