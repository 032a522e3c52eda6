//! Text forms of what stores return: times, byte counts, events as SSE and
//! as JSON. Pure functions, so they are tested here rather than through the
//! binary.

use std::fmt::Write as _;

use mcp_event_store::{StoredEvent, StreamInfo};
use serde_json::{Value, json};

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds
/// (`2025-06-01T12:00:00.250Z`): the runtime's `iso8601`, the form task
/// objects carry.
pub use mcp_event_store::runtime::iso8601 as rfc3339;

/// `rfc3339` of an optional time, `-` for none (an empty store).
pub fn time_or_dash(millis: Option<i64>) -> String {
    millis.map_or_else(|| "-".to_owned(), rfc3339)
}

/// A byte count for people: `512 B`, `1.5 KiB`, `3.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A stream id for a table cell: arbitrary UTF-8 (C9) may hold newlines or
/// escape sequences that would break the table or the terminal, so control
/// characters are escaped; everything else is shown as it is.
pub fn display_id(stream_id: &str) -> String {
    if stream_id.chars().any(char::is_control) {
        stream_id
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        stream_id.to_owned()
    }
}

/// One event as an SSE frame, the way a server would have sent it:
/// `id:`, `retry:` when stored, one `data:` line per line of the payload,
/// and a blank line. SSE is UTF-8 text, so invalid bytes are replaced
/// (`--json` keeps them exactly, as base64).
pub fn sse_frame(event: &StoredEvent) -> String {
    let mut frame = format!("id: {}\n", event.id);
    if let Some(retry) = event.retry {
        let _ = writeln!(frame, "retry: {}", retry.as_millis());
    }
    let text = String::from_utf8_lossy(&event.data).replace("\r\n", "\n");
    for line in text.split(['\n', '\r']) {
        if line.is_empty() {
            frame.push_str("data:\n");
        } else {
            let _ = writeln!(frame, "data: {line}");
        }
    }
    frame.push('\n');
    frame
}

/// One event as a JSON object: `id`, `retry_ms` (null when none), and the
/// payload as `data` when it is UTF-8, else as `data_base64`, so every byte
/// survives the trip.
pub fn event_json(event: &StoredEvent) -> Value {
    let retry_ms = event
        .retry
        .map(|r| u64::try_from(r.as_millis()).unwrap_or(u64::MAX));
    match std::str::from_utf8(&event.data) {
        Ok(text) => json!({"id": event.id.to_string(), "data": text, "retry_ms": retry_ms}),
        Err(_) => json!({
            "id": event.id.to_string(),
            "data_base64": data_encoding::BASE64.encode(&event.data),
            "retry_ms": retry_ms,
        }),
    }
}

/// One stream as a JSON object: raw numbers for scripts, times both as
/// RFC 3339 and as epoch milliseconds.
pub fn stream_json(info: &StreamInfo) -> Value {
    json!({
        "stream_id": info.stream_id,
        "events": info.events,
        "bytes": info.bytes,
        "oldest": info.oldest_millis.map(rfc3339),
        "newest": info.newest_millis.map(rfc3339),
        "oldest_millis": info.oldest_millis,
        "newest_millis": info.newest_millis,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mcp_event_store::{EventId, Position};
    use mcp_event_store_core::backend::{STREAM_KEY_LEN, StreamKey};

    use super::*;

    fn event(data: &'static [u8], retry: Option<Duration>) -> StoredEvent {
        let token = StreamKey::from_bytes(&[7; STREAM_KEY_LEN])
            .unwrap()
            .token("s");
        StoredEvent {
            id: EventId::new(token, Position::seq(5)),
            data: data.into(),
            retry,
        }
    }

    #[test]
    fn sse_frame_splits_lines_and_keeps_retry() {
        let message = event(b"one\r\ntwo\nthree", None);
        let id = message.id.to_string();
        assert_eq!(
            sse_frame(&message),
            format!("id: {id}\ndata: one\ndata: two\ndata: three\n\n")
        );
        let priming = event(b"", Some(Duration::from_millis(2500)));
        assert_eq!(
            sse_frame(&priming),
            format!("id: {id}\nretry: 2500\ndata:\n\n")
        );
    }

    #[test]
    fn event_json_uses_base64_only_for_bytes_that_are_not_utf8() {
        let text = event_json(&event("héllo".as_bytes(), Some(Duration::from_secs(1))));
        assert_eq!(text["data"], "héllo");
        assert_eq!(text["retry_ms"], 1000);
        assert!(text.get("data_base64").is_none());
        let bytes = event_json(&event(&[0xff, 0xfe, b'a'], None));
        assert_eq!(bytes["data_base64"], "//5h");
        assert!(bytes["retry_ms"].is_null());
        assert!(bytes.get("data").is_none());
    }

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(4_102_444_799_000), "2099-12-31T23:59:59.000Z");
    }

    #[test]
    fn human_bytes_picks_a_unit() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn display_id_escapes_control_characters_only() {
        assert_eq!(display_id("sess:common 🙂"), "sess:common 🙂");
        assert_eq!(display_id("a\nb\u{1b}"), "a\\nb\\u{1b}");
    }
}
