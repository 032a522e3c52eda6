//! What both frameworks write the same way: task timestamps, the status
//! message a client is shown, and the JSON-RPC error a task fails with
//! when its operation cannot end it.

use mcp_event_store_core::task::{TaskRecord, TaskStatus};

/// `ms` milliseconds since the epoch as the ISO 8601 timestamps task
/// objects carry (`createdAt`, `lastUpdatedAt`), in UTC to the millisecond.
///
/// ```
/// use mcp_event_store_runtime::iso8601;
///
/// assert_eq!(iso8601(1_795_432_855_084), "2026-11-23T11:20:55.084Z");
/// assert_eq!(iso8601(-1), "1969-12-31T23:59:59.999Z");
/// ```
pub fn iso8601(ms: i64) -> String {
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

/// The JSON-RPC internal error (-32603) with `message`, serialized: what a
/// task fails with when its operation cannot end it (a panic, an outcome
/// over the store's limit, a call that cannot be read).
///
/// ```
/// use mcp_event_store_runtime::internal_error;
///
/// let error: serde_json::Value = serde_json::from_slice(&internal_error("boom \"x\"")).unwrap();
/// assert_eq!(error, serde_json::json!({"code": -32603, "message": "boom \"x\""}));
/// ```
pub fn internal_error(message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "code": -32603, "message": message }))
        .unwrap_or_else(|_| br#"{"code":-32603,"message":"task failed"}"#.to_vec())
}

/// The status message a client is shown for `record` (`statusMessage`):
/// a task cancelled with a reason (T20) shows `Cancelled: <reason>`, as
/// tower-mcp's own store does, whatever message its worker left; any other
/// task its message.
///
/// ```
/// use mcp_event_store_core::task::{TaskStatus, TaskRecord};
/// use mcp_event_store_runtime::status_message;
/// # fn record() -> TaskRecord {
/// #     TaskRecord { status: TaskStatus::Working, rev: 1, message: None, created_at: 0,
/// #         updated_at: 0, ttl_ms: None, expires_at: 1, purge_at: 2, poll_interval_ms: None,
/// #         cancel_requested: false, cancel_reason: None, outcome: None,
/// #         outstanding: vec![], answered: vec![], context: None, takeover: None }
/// # }
/// let mut task = record();
/// task.message = Some("stopping".into());
/// task.cancel_reason = Some("deployment shutdown".into());
/// assert_eq!(status_message(&task).as_deref(), Some("stopping"));
/// task.status = TaskStatus::Cancelled;
/// assert_eq!(status_message(&task).as_deref(), Some("Cancelled: deployment shutdown"));
/// ```
pub fn status_message(record: &TaskRecord) -> Option<String> {
    match (&record.cancel_reason, record.status) {
        (Some(reason), TaskStatus::Cancelled) => Some(format!("Cancelled: {reason}")),
        _ => record.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_spells_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
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
}
