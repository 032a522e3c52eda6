//! What the three adapters share: error mapping and time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_event_store_core::Error;
use tower_mcp::async_task::{TaskRetentionLimitKind, TaskStoreError};
use tower_mcp::event_store::EventStoreError;
use tower_mcp::session_store::SessionStoreError;

/// Milliseconds since the epoch now, by the system clock: the clock the
/// stores keep by default, and tower-mcp's.
pub(crate) fn now_millis() -> i64 {
    millis_of(SystemTime::now())
}

/// `time` as milliseconds since the epoch (negative before it).
pub(crate) fn millis_of(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The time `ms` milliseconds after the epoch.
pub(crate) fn time_of(ms: i64) -> SystemTime {
    let magnitude = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// A store error as tower-mcp's event store error: what the input made
/// impossible is `Encode`, what was read back wrong `Decode`, the rest
/// `Backend`.
pub(crate) fn event_error(e: Error) -> EventStoreError {
    match e {
        Error::PayloadTooLarge { .. } | Error::InvalidStreamId { .. } => {
            EventStoreError::Encode(e.to_string())
        }
        Error::Corrupt(_) | Error::IncompatibleFormat(_) => EventStoreError::Decode(e.to_string()),
        other => EventStoreError::Backend(other.to_string()),
    }
}

/// A store error as tower-mcp's session store error, on the same lines.
pub(crate) fn session_error(e: Error) -> SessionStoreError {
    match e {
        Error::PayloadTooLarge { .. } | Error::InvalidSessionId { .. } => {
            SessionStoreError::Encode(e.to_string())
        }
        Error::Corrupt(_) | Error::IncompatibleFormat(_) => {
            SessionStoreError::Decode(e.to_string())
        }
        other => SessionStoreError::Backend(other.to_string()),
    }
}

/// A store error as tower-mcp's task store error: a payload over a limit
/// is its `RetentionLimitExceeded` (one payload's bytes); a limit on input
/// keys (their length, how many are outstanding) is `InvalidTransition`,
/// deterministic as its docs ask; what was read back wrong is `Decode`.
pub(crate) fn task_error(e: Error) -> TaskStoreError {
    match e {
        Error::PayloadTooLarge { max, .. } => TaskStoreError::RetentionLimitExceeded {
            kind: TaskRetentionLimitKind::PayloadBytes,
            limit: max,
        },
        Error::Config(message) => TaskStoreError::InvalidTransition(message),
        Error::Corrupt(_) | Error::IncompatibleFormat(_) => TaskStoreError::Decode(e.to_string()),
        other => TaskStoreError::Backend(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_trip_both_sides_of_the_epoch() {
        for ms in [0, 1, -1, 1_795_432_855_084, -86_400_001] {
            assert_eq!(millis_of(time_of(ms)), ms);
        }
    }
}
