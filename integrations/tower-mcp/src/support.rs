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

/// `ms` since the epoch as the ISO 8601 timestamps tower-mcp's task
/// objects carry: `2026-11-23T11:20:55.084Z`.
pub(crate) fn iso8601(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let of_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1_000 % 60,
        of_day % 1_000
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01: counted in eras
/// of 400 years (146,097 days each) from 0000-03-01, so that the leap day
/// falls last in each year of the count.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
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
    fn iso8601_spells_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(1_795_432_855_084), "2026-11-23T11:20:55.084Z");
        assert_eq!(iso8601(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(iso8601(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn iso8601_agrees_with_a_day_by_day_count() {
        // Walk the calendar a day at a time from 1970 across four
        // centuries, leap years by the Gregorian rule.
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let (mut y, mut m, mut d) = (1970i64, 1u32, 1u32);
        for days in 0..(400 * 366) {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    #[test]
    fn millis_round_trip_both_sides_of_the_epoch() {
        for ms in [0, 1, -1, 1_795_432_855_084, -86_400_001] {
            assert_eq!(millis_of(time_of(ms)), ms);
        }
    }
}
