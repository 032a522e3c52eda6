//! tower-mcp's `EventStore` over any store: see [`TowerEventStore`].

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::StreamExt;
use mcp_event_store_core::{Error, EventStore, NewEvent, SessionDigest, Store};
use tower_mcp::event_store::{EventRecord, EventStoreError, Result};

use crate::DEFAULT_NAMESPACE;
use crate::support::{event_error, millis_of, time_of};

/// The first byte of every stored event: the envelope's version.
const ENVELOPE_VERSION: u8 = 1;
/// Version, tower-mcp's event id, the timestamp.
const HEADER_LEN: usize = 1 + 8 + 8;
/// How often a replay starts over when retention removes a session's
/// oldest events under it.
const REPLAY_ATTEMPTS: usize = 3;

/// Any store as tower-mcp's [`EventStore`](tower_mcp::event_store::EventStore),
/// for resumable SSE streams (protocol 2025-11-25 and before).
///
/// tower-mcp numbers a session's events itself (a `u64` per session,
/// counted by the transport) and replays by session and number, where this
/// project's stores assign their own ids (C2) and replay by id. So each
/// session is one stream of the store, named `<namespace><digest>` (the
/// session id's [`SessionDigest`] in hex, so the store names no live
/// session, C20),
/// and each event is stored in an envelope of this adapter's: a version
/// byte, tower-mcp's id and its timestamp (big-endian), then the data.
/// [`replay_after`](tower_mcp::event_store::EventStore::replay_after)
/// reads the session's stream from its oldest retained event (C16) and
/// keeps the events numbered after the cursor, in the order they were
/// stored. What the store promises holds for them: durable before
/// `append` returns (C1), shared by every instance (C11), bounded by the
/// store's retention (C8; tower-mcp's own memory store keeps 1,000 per
/// session).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use mcp_event_store_core::MemoryStore;
/// use mcp_event_store_tower_mcp::TowerEventStore;
/// use tower_mcp::event_store::{EventRecord, EventStore};
///
/// let events = TowerEventStore::new(Arc::new(MemoryStore::new()));
/// events.append("session-1", EventRecord::new(7, "{\"jsonrpc\":\"2.0\"}")).await?;
/// events.append("session-1", EventRecord::new(8, "")).await?;
/// let missed = events.replay_after("session-1", 7).await?;
/// assert_eq!(missed.len(), 1);
/// assert_eq!(missed[0].id, 8);
/// # Ok(()) }
/// ```
pub struct TowerEventStore<S: ?Sized = dyn Store> {
    store: Arc<S>,
    namespace: String,
    across_instances: bool,
}

impl<S: ?Sized> Clone for TowerEventStore<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            namespace: self.namespace.clone(),
            across_instances: self.across_instances,
        }
    }
}

impl<S: ?Sized> fmt::Debug for TowerEventStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerEventStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<S: EventStore + ?Sized> TowerEventStore<S> {
    /// tower-mcp's event store over `store`, its sessions' streams named
    /// under [`DEFAULT_NAMESPACE`].
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            across_instances: false,
        }
    }

    /// The same for instances wired with [`Across`](crate::Across), whose
    /// [`layer`](crate::Across::layer) layer is on the router:
    /// only a client's `DELETE` (or a session ended on another instance)
    /// purges a session's events. tower-mcp's idle cleanup, which sees only
    /// this instance's use of a session, leaves them to the store's
    /// retention (C8), as another instance may still be serving it.
    ///
    /// Without that layer no `DELETE` would purge: do not set this alone.
    pub fn across_instances(mut self) -> Self {
        self.across_instances = true;
        self
    }

    /// The same over another namespace: the prefix of every stream id it
    /// writes, so that two applications (or tests) share a store apart.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The store's stream id for a tower-mcp session: the namespace and
    /// the session id's digest in hex (C20), so no stream id in the store
    /// names a live session.
    pub fn stream_id(&self, session_id: &str) -> String {
        format!("{}{}", self.namespace, SessionDigest::of(session_id).hex())
    }
}

/// An event in this adapter's envelope.
fn encode(event: &EventRecord) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + event.data.len());
    bytes.push(ENVELOPE_VERSION);
    bytes.extend_from_slice(&event.id.to_be_bytes());
    bytes.extend_from_slice(&millis_of(event.timestamp).to_be_bytes());
    bytes.extend_from_slice(event.data.as_bytes());
    bytes
}

/// The event an envelope holds.
fn decode(bytes: &[u8]) -> Result<EventRecord> {
    let malformed = || EventStoreError::Decode("a stored event is not a tower-mcp event".into());
    let (&version, rest) = bytes.split_first().ok_or_else(malformed)?;
    if version != ENVELOPE_VERSION {
        return Err(EventStoreError::Decode(format!(
            "a stored event is in envelope version {version}; this release reads version \
             {ENVELOPE_VERSION} only"
        )));
    }
    if rest.len() < HEADER_LEN - 1 {
        return Err(malformed());
    }
    let (id, rest) = rest.split_at(8);
    let (timestamp, data) = rest.split_at(8);
    let id = u64::from_be_bytes(id.try_into().map_err(|_| malformed())?);
    let timestamp = i64::from_be_bytes(timestamp.try_into().map_err(|_| malformed())?);
    let data = String::from_utf8(data.to_vec()).map_err(|_| malformed())?;
    let mut event = EventRecord::new(id, data);
    event.timestamp = time_of(timestamp);
    Ok(event)
}

#[async_trait]
impl<S: EventStore + ?Sized> tower_mcp::event_store::EventStore for TowerEventStore<S> {
    async fn append(&self, session_id: &str, event: EventRecord) -> Result<()> {
        self.store
            .store_event(&self.stream_id(session_id), NewEvent::new(&encode(&event)))
            .await
            .map(drop)
            .map_err(event_error)
    }

    /// Reads the session's stream whole, from its oldest retained event,
    /// and keeps the events numbered after `after_id`, in store order. If
    /// retention removes events the replay has not reached yet, it starts
    /// over (at most three times).
    async fn replay_after(&self, session_id: &str, after_id: u64) -> Result<Vec<EventRecord>> {
        let stream = self.stream_id(session_id);
        for _ in 0..REPLAY_ATTEMPTS {
            let mut events = match self.store.replay_stream(&stream).await {
                Ok(replay) => replay.events,
                // A session id no stream can have: a session with no events.
                Err(Error::InvalidStreamId { .. }) => return Ok(Vec::new()),
                Err(e) => return Err(event_error(e)),
            };
            let mut after = Vec::new();
            let mut overtaken = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        let event = decode(&event.data)?;
                        if event.id > after_id {
                            after.push(event);
                        }
                    }
                    Err(Error::EventsPurged { .. }) => {
                        overtaken = true;
                        break;
                    }
                    Err(e) => return Err(event_error(e)),
                }
            }
            if !overtaken {
                return Ok(after);
            }
        }
        Err(EventStoreError::Backend(format!(
            "retention removed events of session {session_id:?} under {REPLAY_ATTEMPTS} replays \
             in a row"
        )))
    }

    async fn purge_session(&self, session_id: &str) -> Result<()> {
        if self.across_instances && !crate::across::ending_on_purpose() {
            tracing::debug!(
                session_id = %session_id,
                "left a session idle on this instance to retention: another may serve it"
            );
            return Ok(());
        }
        match self.store.delete_stream(&self.stream_id(session_id)).await {
            Ok(_) | Err(Error::InvalidStreamId { .. }) => Ok(()),
            Err(e) => Err(event_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use mcp_event_store_core::MemoryStore;
    use tower_mcp::event_store::EventStore as _;

    use super::*;

    #[test]
    fn envelopes_round_trip_and_refuse_what_they_did_not_write() {
        let mut event = EventRecord::new(u64::MAX, "two\nlines 😀");
        event.timestamp = UNIX_EPOCH + Duration::from_millis(1_795_432_855_084);
        let back = decode(&encode(&event)).unwrap();
        assert_eq!((back.id, &back.data[..]), (u64::MAX, "two\nlines 😀"));
        assert_eq!(back.timestamp, event.timestamp);
        let empty = decode(&encode(&EventRecord::new(0, ""))).unwrap();
        assert_eq!((empty.id, &empty.data[..]), (0, ""));
        for bad in [&b""[..], b"\x01short", b"{\"jsonrpc\":\"2.0\"}"] {
            assert!(matches!(decode(bad), Err(EventStoreError::Decode(_))));
        }
        let mut newer = encode(&event);
        newer[0] = 2;
        assert!(
            matches!(decode(&newer), Err(EventStoreError::Decode(m)) if m.contains("version 2"))
        );
        let mut not_utf8 = encode(&EventRecord::new(1, "x"));
        not_utf8.push(0xff);
        assert!(matches!(decode(&not_utf8), Err(EventStoreError::Decode(_))));
    }

    #[tokio::test]
    async fn sessions_are_streams_of_their_namespace() {
        let store = Arc::new(MemoryStore::new());
        let a = TowerEventStore::new(store.clone()).with_namespace("a/");
        let b = TowerEventStore::new(store.clone()).with_namespace("b/");
        a.append("s", EventRecord::new(1, "from a")).await.unwrap();
        assert!(b.replay_after("s", 0).await.unwrap().is_empty());
        assert_eq!(
            a.stream_id("s"),
            format!("a/{}", SessionDigest::of("s").hex())
        );
        let raw = store.replay_stream(&a.stream_id("s")).await.unwrap();
        assert_eq!(raw.events.count().await, 1);
        // The store's stream id names no session (C20), so a session id of
        // any length has one.
        let long = "s".repeat(2_000);
        a.append(&long, EventRecord::new(1, "x")).await.unwrap();
        assert_eq!(a.replay_after(&long, 0).await.unwrap().len(), 1);
        a.purge_session(&long).await.unwrap();
        assert!(a.replay_after(&long, 0).await.unwrap().is_empty());
    }
}
