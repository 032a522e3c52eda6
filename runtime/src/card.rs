//! What an instance tells operators of itself: its version and when it
//! started ([`InstanceCard`]), beside the lease the store keeps.
//!
//! A lease holds only an instance's id and deadline (T11), the same on
//! every backend. The card goes where every store keeps bytes already: one
//! event per card on a stream of its own ([`CARDS_STREAM`], outside the
//! ids clients use, as the bus's topics are), appended when the instance
//! registers and again every [`CARD_EVERY`], so the store's retention
//! bounds the stream and the newest card of each instance lasts. `mcp-event-store
//! instances` reads them back ([`InstanceCard::read_all`]).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::task::InstanceId;
use mcp_event_store_core::{EventStore, NewEvent, Result};
use serde_json::{Value, json};

/// The stream instance cards are appended to.
pub const CARDS_STREAM: &str = "\u{1}instances";

/// How often a running instance appends its card again, so that the newest
/// outlives a retention `max_age` longer than this.
pub const CARD_EVERY: Duration = Duration::from_secs(600);

/// An instance as it describes itself ([`RuntimeBuilder::version`](crate::RuntimeBuilder::version)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceCard {
    /// The instance.
    pub instance: InstanceId,
    /// The version the server gave its runtime.
    pub version: String,
    /// When the instance registered (ms since the epoch, its own clock).
    pub started_millis: i64,
}

impl InstanceCard {
    /// A card (for the runtime, and tests).
    pub fn new(instance: InstanceId, version: impl Into<String>, started_millis: i64) -> Self {
        Self {
            instance,
            version: version.into(),
            started_millis,
        }
    }

    /// Appends this card to [`CARDS_STREAM`] (the runtime does, when it
    /// registers and every [`CARD_EVERY`]).
    pub async fn announce(&self, store: &dyn EventStore) -> Result<()> {
        let card = json!({
            "instance": self.instance.to_string(),
            "version": self.version,
            "started": self.started_millis,
        });
        store
            .store_event(CARDS_STREAM, NewEvent::new(card.to_string().as_bytes()))
            .await
            .map(drop)
    }

    /// The newest card of each instance the stream still holds. Events that
    /// are not cards (a store read without the key ring that sealed them)
    /// are passed over.
    ///
    /// # Errors
    ///
    /// The store's, when it cannot be read.
    pub async fn read_all(store: &dyn EventStore) -> Result<HashMap<InstanceId, InstanceCard>> {
        let mut cards = HashMap::new();
        let mut events = store.replay_stream(CARDS_STREAM).await?.events;
        while let Some(event) = events.try_next().await? {
            if let Some(card) = Self::decode(&event.data) {
                cards.insert(card.instance, card);
            }
        }
        Ok(cards)
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let value: Value = serde_json::from_slice(bytes).ok()?;
        Some(Self {
            instance: InstanceId::parse(value.get("instance")?.as_str()?)?,
            version: value.get("version")?.as_str()?.to_owned(),
            started_millis: value.get("started")?.as_i64()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_event_store_core::MemoryStore;

    #[tokio::test]
    async fn the_newest_card_of_each_instance_is_read_back() {
        let store = MemoryStore::new();
        let (a, b) = (
            InstanceId::generate().unwrap(),
            InstanceId::generate().unwrap(),
        );
        InstanceCard::new(a, "server 1.0", 10)
            .announce(&store)
            .await
            .unwrap();
        InstanceCard::new(b, "server 1.1", 20)
            .announce(&store)
            .await
            .unwrap();
        InstanceCard::new(a, "server 1.0", 10)
            .announce(&store)
            .await
            .unwrap();
        store
            .store_event(CARDS_STREAM, NewEvent::new(b"not a card"))
            .await
            .unwrap();
        let cards = InstanceCard::read_all(&store).await.unwrap();
        assert_eq!(cards.len(), 2);
        assert_eq!(cards[&a], InstanceCard::new(a, "server 1.0", 10));
        assert_eq!(cards[&b].version, "server 1.1");
    }

    #[tokio::test]
    async fn a_runtime_announces_its_card_when_it_starts() {
        let store = std::sync::Arc::new(MemoryStore::new());
        let runtime = crate::Runtime::builder(store.clone())
            .version("my-server 2.0")
            .start()
            .await
            .unwrap();
        let me = runtime.instance();
        // A guard against a card never appended, not a latency bound.
        let card = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(card) = InstanceCard::read_all(&*store).await.unwrap().remove(&me) {
                    return card;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the card is appended at the start");
        assert_eq!(card.version, "my-server 2.0");
        assert!(card.started_millis > 0);
        runtime.shutdown().await;
    }
}
