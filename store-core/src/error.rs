//! One error type for every store, with variants named for what went wrong.

use std::error::Error as StdError;

/// The result type of every store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The boxed source error a backend keeps.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Longest piece of client input quoted back in an error message.
const QUOTE_LIMIT: usize = 80;

/// Everything a store can refuse or fail with.
///
/// The enum is `#[non_exhaustive]`: match the variants you act on and keep a
/// catch-all arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The event id is malformed, was never issued by this store, or its
    /// stream no longer exists. Resuming from it is impossible.
    #[error("unknown event id {event_id:?}")]
    UnknownEventId {
        /// The id as received (shortened if very long).
        event_id: String,
    },

    /// Some events after this id were removed by retention or deletion, so a
    /// replay would have a gap. The client must start over.
    #[error("events after {event_id:?} were purged; replay would have a gap")]
    EventsPurged {
        /// The id as received.
        event_id: String,
    },

    /// The stream id is outside the contract (empty, or over 1024 bytes).
    #[error("invalid stream id: {reason}")]
    InvalidStreamId {
        /// What is wrong with it.
        reason: String,
    },

    /// The session id is outside the contract (empty, or over 1024 bytes).
    #[error("invalid session id: {reason}")]
    InvalidSessionId {
        /// What is wrong with it.
        reason: String,
    },

    /// The event's payload is larger than the store's configured maximum.
    #[error("payload of {size} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// Payload size in bytes.
        size: usize,
        /// The configured maximum.
        max: usize,
    },

    /// The stored data was written in a format this release cannot read
    /// (for example by a newer, incompatible release).
    #[error("incompatible storage format: {0}")]
    IncompatibleFormat(String),

    /// Stored data failed a consistency check.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),

    /// The store was configured wrongly (bad URL, option out of range, ...).
    #[error("configuration error: {0}")]
    Config(String),

    /// `connect` was given a URL whose backend is not compiled in.
    #[error("the {scheme}:// backend is not compiled in; enable the `{feature}` cargo feature")]
    BackendNotEnabled {
        /// The URL scheme.
        scheme: String,
        /// The cargo feature that provides it.
        feature: &'static str,
    },

    /// The store has been closed, or the runtime over it shut down; no
    /// further operations are possible through it.
    #[error("the store is closed, or the runtime over it shut down")]
    Closed,

    /// A task was to be created under a runtime instance the store does
    /// not count alive (its heartbeat lapsed, or it never registered): the
    /// task would read `failed` from birth (T11), so nothing was created.
    /// Register a fresh instance and create again.
    #[error("task instance {instance} is not alive: its heartbeat lapsed or it never registered")]
    InstanceLapsed {
        /// The instance, in hex.
        instance: String,
    },

    /// A bus topic is outside the contract (C19): empty, over
    /// [`MAX_TOPIC_LEN`](crate::bus::MAX_TOPIC_LEN) bytes, or not visible
    /// ASCII.
    #[error("invalid topic: {reason}")]
    InvalidTopic {
        /// What is wrong with it.
        reason: String,
    },

    /// A bus subscriber's cursor is behind what the store still holds
    /// (C18): messages after it were purged unread (or it was never one of
    /// the topic's). Nothing more can be delivered in order; subscribe
    /// again from now, and catch up on what was missed from the source of
    /// truth.
    #[error(
        "the subscriber to topic {topic:?} fell behind after {cursor:?}: messages were purged unread"
    )]
    FellBehind {
        /// The topic.
        topic: String,
        /// The cursor the subscriber resumed after.
        cursor: String,
    },

    /// The backend failed (I/O, connection, server error). The original error
    /// is kept as the source.
    #[error("{backend} backend error: {source}")]
    Backend {
        /// Which backend (`"sqlite"`, `"postgres"`, ...).
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// A short, stable name for the kind of error, for metrics and logs:
    /// `unknown_event_id`, `events_purged`, `invalid_stream_id`,
    /// `invalid_session_id`, `payload_too_large`, `incompatible_format`,
    /// `corrupt`, `config`, `backend_not_enabled`, `closed`,
    /// `instance_lapsed`, `invalid_topic`, `fell_behind` or `backend`.
    ///
    /// ```
    /// use mcp_event_store_core::Error;
    ///
    /// assert_eq!(Error::unknown_event_id("x").kind(), "unknown_event_id");
    /// assert_eq!(Error::Closed.kind(), "closed");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Error::UnknownEventId { .. } => "unknown_event_id",
            Error::EventsPurged { .. } => "events_purged",
            Error::InvalidStreamId { .. } => "invalid_stream_id",
            Error::InvalidSessionId { .. } => "invalid_session_id",
            Error::PayloadTooLarge { .. } => "payload_too_large",
            Error::IncompatibleFormat(_) => "incompatible_format",
            Error::Corrupt(_) => "corrupt",
            Error::Config(_) => "config",
            Error::BackendNotEnabled { .. } => "backend_not_enabled",
            Error::Closed => "closed",
            Error::InstanceLapsed { .. } => "instance_lapsed",
            Error::InvalidTopic { .. } => "invalid_topic",
            Error::FellBehind { .. } => "fell_behind",
            Error::Backend { .. } => "backend",
        }
    }

    /// An [`Error::UnknownEventId`] quoting `event_id` safely.
    pub fn unknown_event_id(event_id: &str) -> Self {
        Self::UnknownEventId {
            event_id: quote(event_id),
        }
    }

    /// An [`Error::InstanceLapsed`] naming `instance`.
    pub fn instance_lapsed(instance: &crate::task::InstanceId) -> Self {
        Self::InstanceLapsed {
            instance: instance.to_string(),
        }
    }

    /// An [`Error::EventsPurged`] quoting `event_id` safely.
    pub fn events_purged(event_id: &str) -> Self {
        Self::EventsPurged {
            event_id: quote(event_id),
        }
    }

    /// An [`Error::Backend`] keeping `source`.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            backend,
            source: source.into(),
        }
    }
}

/// Shortens client input so a hostile megabyte-long id cannot flood logs.
fn quote(input: &str) -> String {
    if input.len() <= QUOTE_LIMIT {
        return input.to_owned();
    }
    let mut end = QUOTE_LIMIT;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &input[..end], input.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_input_is_shortened_on_a_char_boundary() {
        let err = Error::unknown_event_id(&"é".repeat(1000));
        let Error::UnknownEventId { event_id } = err else {
            unreachable!()
        };
        assert!(event_id.len() < 120);
        assert!(event_id.ends_with("(2000 bytes)"));
    }

    #[test]
    fn backend_error_keeps_source() {
        let io = std::io::Error::other("disk on fire");
        let err = Error::backend("sqlite", io);
        assert_eq!(err.source().unwrap().to_string(), "disk on fire");
    }
}
