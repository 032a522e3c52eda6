//! A bus between the instances sharing a store (C17 to C19).
//!
//! Whatever an instance holds only in memory (a request waiting for its
//! answer, the listeners connected to it, the sessions it serves) is out of
//! reach of the other instances behind a load balancer. A [`Bus`] carries
//! what they must tell each other: a message published to a [`Topic`] on
//! any handle reaches every [`Subscription`] to that topic on every handle
//! sharing the store.
//!
//! [`StoreBus`] is the bus every backend gets, written once over the
//! store's own streams and following (C3, C5, C11, C13): a topic is a
//! stream in a namespace of its own, a message is an event, a cursor is an
//! event id. So it is as durable and as shared as the events are, and a
//! backend has nothing to write for it. Its latency is the backend's
//! follow latency: `LISTEN`/`NOTIFY` on PostgreSQL, `XREAD BLOCK` on Redis,
//! in-process wake-ups on SQLite and sled (with `PRAGMA data_version` polls
//! across SQLite processes).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use futures_util::StreamExt;
//! use mcp_event_store_core::MemoryStore;
//! use mcp_event_store_core::bus::{Bus, Start, StoreBus, Topic};
//!
//! let bus = StoreBus::new(Arc::new(MemoryStore::new()));
//! let topic = Topic::new("sessions/ended")?;
//! let mut ended = bus.subscribe(&topic, Start::Now).await?;
//! bus.publish(&topic, b"session-1").await?;
//! let message = ended.next().await.unwrap()?;
//! assert_eq!(&message.payload[..], b"session-1");
//! // A subscriber that reconnects resumes after the last message it saw.
//! let mut again = bus.subscribe(&topic, Start::After(message.cursor)).await?;
//! bus.publish(&topic, b"session-2").await?;
//! assert_eq!(&again.next().await.unwrap()?.payload[..], b"session-2");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_core::Stream;
use futures_core::stream::BoxStream;
use futures_util::StreamExt;

use crate::error::{Error, Result};
use crate::event::NewEvent;
use crate::id::EventId;
use crate::store::{EventStore, FollowOptions};

/// The longest topic, in bytes.
pub const MAX_TOPIC_LEN: usize = 256;

/// Where topics live among the store's streams. No MCP framework names a
/// stream with a control character, so no stream of theirs is a topic.
const TOPIC_STREAM_PREFIX: &str = "\u{1}bus/";

/// The retry hint that marks a subscription's priming event (C7), where a
/// subscription from now starts: a message is stored without one.
const PRIMING_RETRY: Duration = Duration::from_secs(1);

/// A topic's name: 1 to [`MAX_TOPIC_LEN`] bytes of visible ASCII (`!` to
/// `~`), so that a session id (visible ASCII by the MCP spec) or an
/// instance id fits in one, and nothing that could be mistaken for another
/// topic or mangled in a log does.
///
/// ```
/// use mcp_event_store_core::bus::Topic;
///
/// assert_eq!(Topic::new("session/abc-123/replies").unwrap().as_str(), "session/abc-123/replies");
/// assert!(Topic::new("").is_err());
/// assert!(Topic::new("two words").is_err());
/// assert!(Topic::new("x".repeat(257)).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Topic(String);

impl Topic {
    /// Checks `name` and makes it a topic; anything else is
    /// [`Error::InvalidTopic`] saying what is wrong.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let invalid = |reason: String| Err(Error::InvalidTopic { reason });
        if name.is_empty() {
            return invalid("a topic is 1 or more bytes; this one is empty".into());
        }
        if name.len() > MAX_TOPIC_LEN {
            return invalid(format!(
                "a topic is at most {MAX_TOPIC_LEN} bytes; this one is {}",
                name.len()
            ));
        }
        if let Some(at) = name.bytes().position(|b| !b.is_ascii_graphic()) {
            return invalid(format!(
                "a topic is visible ASCII ('!' to '~'); byte {at} is {:#04x}",
                name.as_bytes()[at]
            ));
        }
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The store stream that holds this topic's messages.
    fn stream_id(&self) -> String {
        format!("{TOPIC_STREAM_PREFIX}{}", self.0)
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Topic({:?})", self.0)
    }
}

/// A message's place in its topic: resume a subscription after it
/// ([`Start::After`]). Its text is SSE-safe and may be kept anywhere.
///
/// ```
/// use mcp_event_store_core::bus::Cursor;
///
/// assert!(Cursor::parse("not a cursor").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cursor(EventId);

impl Cursor {
    /// A cursor from its text; malformed text is
    /// [`Error::UnknownEventId`].
    pub fn parse(text: &str) -> Result<Self> {
        text.parse().map(Self)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cursor({})", self.0)
    }
}

/// A message as a subscriber receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Where it is in its topic: a subscription resumed after it receives
    /// what was published after it.
    pub cursor: Cursor,
    /// The bytes published, as published.
    pub payload: Bytes,
}

/// Where a subscription starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// With the first message published after the subscription is made.
    Now,
    /// With the first message after this one: a subscriber resuming.
    After(Cursor),
}

/// Messages of one topic, in publish order, each once, until dropped or
/// until an error ends it (C17, C18). It reads from the store only as it
/// is polled, so a slow subscriber holds one page at most (C19): the store
/// is the queue.
pub struct Subscription {
    topic: Topic,
    messages: BoxStream<'static, Result<Message>>,
}

impl Subscription {
    /// A subscription to `topic` yielding `messages`: for a [`Bus`] that
    /// is not a [`StoreBus`].
    pub fn new(topic: Topic, messages: BoxStream<'static, Result<Message>>) -> Self {
        Self { topic, messages }
    }

    /// The topic subscribed to.
    pub fn topic(&self) -> &Topic {
        &self.topic
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl Stream for Subscription {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.messages.poll_next_unpin(cx)
    }
}

/// Publish and subscribe between the handles sharing a store (C17 to C19).
#[async_trait]
pub trait Bus: Send + Sync {
    /// Publishes `message` to `topic`: once this returns, the message is
    /// durable and every subscription to the topic, on any handle, will
    /// receive it. A message over the store's payload limit is
    /// [`Error::PayloadTooLarge`].
    async fn publish(&self, topic: &Topic, message: &[u8]) -> Result<Cursor>;

    /// Subscribes to `topic` from `start`. A cursor whose successors the
    /// store no longer holds (purged by retention, or never this topic's)
    /// is [`Error::FellBehind`], now or when the subscription reaches it:
    /// never a silent gap.
    async fn subscribe(&self, topic: &Topic, start: Start) -> Result<Subscription>;
}

/// The bus over a store's streams, for every backend (see the
/// [module docs](self)). Cheap to clone.
#[derive(Clone)]
pub struct StoreBus {
    store: Arc<dyn EventStore>,
}

impl StoreBus {
    /// The bus of the handles sharing `store`'s storage. Its messages are
    /// kept under the store's [`Retention`](crate::Retention), and its
    /// topics are listed among the store's streams (their ids start with
    /// `\u{1}bus/`).
    pub fn new(store: Arc<dyn EventStore>) -> Self {
        Self { store }
    }
}

impl fmt::Debug for StoreBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreBus").finish_non_exhaustive()
    }
}

#[async_trait]
impl Bus for StoreBus {
    async fn publish(&self, topic: &Topic, message: &[u8]) -> Result<Cursor> {
        let id = self
            .store
            .store_event(&topic.stream_id(), NewEvent::new(message))
            .await?;
        Ok(Cursor(id))
    }

    async fn subscribe(&self, topic: &Topic, start: Start) -> Result<Subscription> {
        let stream_id = topic.stream_id();
        let after = match start {
            Start::After(cursor) => cursor,
            // Whatever is published once this is stored comes after it.
            Start::Now => Cursor(
                self.store
                    .store_event(&stream_id, NewEvent::priming(PRIMING_RETRY))
                    .await?,
            ),
        };
        let (name, cursor) = (topic.to_string(), after.to_string());
        let behind = move || Error::FellBehind {
            topic: name.clone(),
            cursor: cursor.clone(),
        };
        let replay = match self
            .store
            .follow_events_after(&after.to_string(), FollowOptions::default())
            .await
        {
            Ok(replay) => replay,
            Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {
                return Err(behind());
            }
            Err(error) => return Err(error),
        };
        if replay.stream_id != stream_id {
            // A cursor of another topic (or an event stream) reads nothing
            // of this one.
            return Err(behind());
        }
        let messages = replay
            .events
            .filter_map(move |event| {
                std::future::ready(match event {
                    // A priming event: where a subscription from now began.
                    Ok(event) if event.retry.is_some() => None,
                    Ok(event) => Some(Ok(Message {
                        cursor: Cursor(event.id),
                        payload: event.data,
                    })),
                    Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {
                        Some(Err(behind()))
                    }
                    Err(error) => Some(Err(error)),
                })
            })
            // The first error ends the subscription.
            .scan(false, |ended, item| {
                std::future::ready((!*ended).then(|| {
                    *ended = item.is_err();
                    item
                }))
            });
        Ok(Subscription::new(topic.clone(), messages.boxed()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_visible_ascii_of_bounded_length() {
        assert!(Topic::new("a").is_ok());
        assert!(Topic::new("~".repeat(MAX_TOPIC_LEN)).is_ok());
        for hostile in ["", " ", "a b", "a\u{0}", "\u{1}bus/a", "ü", "a\nb"] {
            let error = Topic::new(hostile).unwrap_err();
            assert_eq!(error.kind(), "invalid_topic", "{hostile:?}: {error}");
        }
        let error = Topic::new("x".repeat(MAX_TOPIC_LEN + 1)).unwrap_err();
        assert!(error.to_string().contains("257"), "{error}");
    }
}
