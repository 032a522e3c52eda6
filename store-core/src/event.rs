//! What goes into a store and what comes back out.

use std::time::Duration;

use bytes::Bytes;

use crate::id::EventId;

/// An event to append: payload bytes and an optional SSE `retry` hint.
///
/// The payload is usually a serialized JSON-RPC message; a *priming event*
/// (SEP-1699) has an empty payload and a retry hint.
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::NewEvent;
///
/// let message = NewEvent::new(br#"{"jsonrpc":"2.0","method":"ping"}"#);
/// let priming = NewEvent::priming(Duration::from_secs(2));
/// assert!(priming.data.is_empty());
/// assert_eq!(message.with_retry(Duration::from_millis(500)).retry, Some(Duration::from_millis(500)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewEvent<'a> {
    /// The payload, stored and replayed byte for byte.
    pub data: &'a [u8],
    /// The SSE `retry` hint to send with the event, if any.
    pub retry: Option<Duration>,
}

impl<'a> NewEvent<'a> {
    /// An event with this payload and no retry hint.
    pub const fn new(data: &'a [u8]) -> Self {
        Self { data, retry: None }
    }

    /// A priming event: no payload, only a retry hint.
    pub const fn priming(retry: Duration) -> NewEvent<'static> {
        NewEvent {
            data: &[],
            retry: Some(retry),
        }
    }

    /// The same event with a retry hint.
    pub const fn with_retry(mut self, retry: Duration) -> Self {
        self.retry = Some(retry);
        self
    }
}

/// An event as replayed: its id, payload and retry hint, exactly as stored.
///
/// Stores keep retry hints with millisecond precision, the unit SSE uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// The id `store_event` returned for it.
    pub id: EventId,
    /// The payload bytes (shared, not copied, where the backend allows).
    pub data: Bytes,
    /// The SSE `retry` hint, if one was stored.
    pub retry: Option<Duration>,
}

/// Converts a retry hint to whole milliseconds for storage, saturating.
pub fn retry_to_millis(retry: Option<Duration>) -> Option<i64> {
    retry.map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX))
}

/// Converts stored milliseconds back to a retry hint. Negative values, which
/// no store writes, read as no hint.
pub fn retry_from_millis(millis: Option<i64>) -> Option<Duration> {
    millis
        .and_then(|m| u64::try_from(m).ok())
        .map(Duration::from_millis)
}
