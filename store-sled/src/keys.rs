//! Key and value layouts (format version 2).
//!
//! Every integer is big-endian, so sled's byte order is numeric order and a
//! stream's events form one contiguous key range:
//!
//! | tree | key | value |
//! |---|---|---|
//! | `v1/events` | token (15) ++ seq (8) | [`EventHeader`] (24) ++ payload |
//! | `v2/streams` | token (15) | incarnation (8) ++ age (8) ++ stream id (UTF-8) |
//! | `v1/stream_age` | age (8) ++ token (15) | empty |
//! | `v1/sessions` | session id | expires (8) ++ state |
//! | `v1/session_expiry` | expires (8) ++ session id | empty |
//! | `r1/redeemed` | redeem key (32) | forget at (8) |
//! | `r1/redeem_expiry` | forget at (8) ++ redeem key (32) | empty |
//! | `meta` | a `META_*` name | format version (4), stream key, ... |
//!
//! A tree's name carries the format its layout first appeared in. Format 2
//! changed only the stream record: format 1 kept it in `v1/streams` with the
//! era the stream last appended in where the incarnation is now (see
//! `setup::migrate_format_1`).
//!
//! An event's id is `<incarnation>-<seq>` (see
//! [`dense`](mcp_event_store_core::backend::dense)): the key holds the sequence
//! number, the stream record the incarnation. A stream holds the events of
//! one incarnation only: a new one starts after every event of the old one
//! is removed, with the sequence numbers from 1 again.
//!
//! Times are milliseconds since the epoch, stored with the sign bit flipped
//! ([`encode_time`]) so that they sort correctly even if a clock reports a
//! time before 1970.

use std::time::Duration;

use mcp_event_store_core::backend::{StreamToken, retry_from_millis, retry_to_millis};
use mcp_event_store_core::{Error, Result};

/// Length of a stream token in bytes.
pub(crate) const TOKEN_LEN: usize = 15;
/// Length of an event key.
pub(crate) const EVENT_KEY_LEN: usize = TOKEN_LEN + 8;
/// Length of the fixed header in front of every event payload.
pub(crate) const EVENT_HEADER_LEN: usize = 24;
/// Where the cumulative byte count sits in an event value; the appender
/// patches it in once it holds the stream's lock.
pub(crate) const CUM_OFFSET: usize = 16;
/// Marks "no retry hint" (retry hints saturate at `i64::MAX`, so it is free).
const NO_RETRY: u64 = u64::MAX;

// The trees, named for the format their layout first appeared in, and the
// metadata tree's keys.

pub(crate) const TREE_META: &str = "mcp-event-store/meta";
pub(crate) const TREE_EVENTS: &str = "mcp-event-store/v1/events";
/// Stream records of format 2 (with their incarnation).
pub(crate) const TREE_STREAMS: &str = "mcp-event-store/v2/streams";
/// Stream records of format 1 (with their era); emptied by the migration.
pub(crate) const TREE_STREAMS_V1: &str = "mcp-event-store/v1/streams";
pub(crate) const TREE_STREAM_AGE: &str = "mcp-event-store/v1/stream_age";
pub(crate) const TREE_SESSIONS: &str = "mcp-event-store/v1/sessions";
pub(crate) const TREE_SESSION_EXPIRY: &str = "mcp-event-store/v1/session_expiry";

/// Tasks (SEP-2663), added without a new `FORMAT_VERSION`: releases
/// before tasks never open these trees.
pub(crate) const TREE_TASKS: &str = "mcp-event-store/t1/tasks";
/// `purge_at ++ digest` for every task.
pub(crate) const TREE_TASK_PURGE: &str = "mcp-event-store/t1/task_purge";
/// Instance id -> heartbeat deadline.
pub(crate) const TREE_TASK_INSTANCES: &str = "mcp-event-store/t1/instances";
/// Redemptions (C21), added without a new `FORMAT_VERSION`: releases
/// before them never open these trees. A redeemed nonce's digest -> the
/// time it may be forgotten ([`encode_time`]).
pub(crate) const TREE_REDEEMED: &str = "mcp-event-store/r1/redeemed";
/// `forget_at ++ digest` for every redemption: what the purge walks.
pub(crate) const TREE_REDEEM_EXPIRY: &str = "mcp-event-store/r1/redeem_expiry";
pub(crate) const META_FORMAT: &str = "format_version";
pub(crate) const META_STREAM_KEY: &str = "stream_key";
pub(crate) const META_CREATED_BY: &str = "created_by";
/// Format 1 only: bumped after a relaxed session ended without a clean
/// close. Read by the migration, then removed.
pub(crate) const META_ERA: &str = "era";
/// Streams whose incarnation is below this start a new life at their next
/// append; raised after a relaxed session ended without a clean close.
/// Absent: [`Incarnations::floor`](crate::shared::Incarnations::floor)'s
/// default.
pub(crate) const META_FLOOR: &str = "incarnation_floor";
/// The incarnation streams migrated from format 1 went on in; absent in a
/// database created in format 2.
pub(crate) const META_MIGRATED: &str = "format_1_incarnation";
/// Present while a handle with interval durability has the database open.
pub(crate) const META_RELAXED: &str = "relaxed_open";
/// The loosest count and byte limits any append has trimmed with.
pub(crate) const META_LOOSEST: &str = "loosest_limits";
/// The tasks' own format, in the metadata under [`META_TASK_FORMAT`]
/// (the event format, `FORMAT_VERSION`, is unchanged by tasks).
pub(crate) const TASK_FORMAT: u32 = 1;
/// The metadata key of [`TASK_FORMAT`].
pub(crate) const META_TASK_FORMAT: &str = "task_format";

fn token_bytes(token: &StreamToken) -> &[u8; TOKEN_LEN] {
    // A compile error here means the core changed the token length.
    token.as_bytes()
}

/// Milliseconds since the epoch as an order-preserving `u64`.
pub(crate) fn encode_time(millis: i64) -> u64 {
    (millis as u64) ^ (1 << 63)
}

/// The inverse of [`encode_time`].
pub(crate) fn decode_time(encoded: u64) -> i64 {
    (encoded ^ (1 << 63)) as i64
}

fn be_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let raw: [u8; 8] = bytes.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(raw))
}

fn corrupt(what: &str) -> Error {
    Error::Corrupt(format!("malformed {what} in the sled database"))
}

/// The key of event `seq` in the stream `token`.
pub(crate) fn event_key(token: &StreamToken, seq: u64) -> [u8; EVENT_KEY_LEN] {
    let mut key = [0u8; EVENT_KEY_LEN];
    key[..TOKEN_LEN].copy_from_slice(token_bytes(token));
    key[TOKEN_LEN..].copy_from_slice(&seq.to_be_bytes());
    key
}

/// The sequence number in an event key.
pub(crate) fn event_key_seq(key: &[u8]) -> Result<u64> {
    if key.len() != EVENT_KEY_LEN {
        return Err(corrupt("event key"));
    }
    be_u64(key, TOKEN_LEN).ok_or_else(|| corrupt("event key"))
}

/// The key of an entry in the stream age index.
pub(crate) fn age_key(age: u64, token: &StreamToken) -> [u8; 8 + TOKEN_LEN] {
    let mut key = [0u8; 8 + TOKEN_LEN];
    key[..8].copy_from_slice(&age.to_be_bytes());
    key[8..].copy_from_slice(token_bytes(token));
    key
}

/// Splits an age index key into its age and token.
pub(crate) fn parse_age_key(key: &[u8]) -> Result<(u64, StreamToken)> {
    if key.len() != 8 + TOKEN_LEN {
        return Err(corrupt("stream age key"));
    }
    let age = be_u64(key, 0).ok_or_else(|| corrupt("stream age key"))?;
    let token = StreamToken::from_bytes(&key[8..]).ok_or_else(|| corrupt("stream age key"))?;
    Ok((age, token))
}

/// The fixed part of an event value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EventHeader {
    /// When it was stored ([`encode_time`]).
    pub stored_at: u64,
    /// The SSE retry hint.
    pub retry: Option<Duration>,
    /// Payload bytes of the stream up to and including this event, since the
    /// stream was created. Lets a stream's retained byte count be rebuilt
    /// from its first and last events alone.
    pub cum_bytes: u64,
}

/// Builds an event value: header then payload, with `cum_bytes` left at 0
/// for the appender to patch ([`set_cum_bytes`]).
pub(crate) fn encode_event(stored_at: u64, retry: Option<Duration>, data: &[u8]) -> Vec<u8> {
    let retry = retry_to_millis(retry).map_or(NO_RETRY, |ms| ms as u64);
    let mut value = Vec::with_capacity(EVENT_HEADER_LEN + data.len());
    value.extend_from_slice(&stored_at.to_be_bytes());
    value.extend_from_slice(&retry.to_be_bytes());
    value.extend_from_slice(&0u64.to_be_bytes());
    value.extend_from_slice(data);
    value
}

/// Writes the cumulative byte count into an encoded event value.
pub(crate) fn set_cum_bytes(value: &mut [u8], cum_bytes: u64) {
    value[CUM_OFFSET..CUM_OFFSET + 8].copy_from_slice(&cum_bytes.to_be_bytes());
}

/// Reads the header of an event value.
pub(crate) fn decode_event(value: &[u8]) -> Result<EventHeader> {
    let field = |at| be_u64(value, at).ok_or_else(|| corrupt("event value"));
    let retry = field(8)?;
    Ok(EventHeader {
        stored_at: field(0)?,
        retry: if retry == NO_RETRY {
            None
        } else {
            retry_from_millis(i64::try_from(retry).ok())
        },
        cum_bytes: field(CUM_OFFSET)?,
    })
}

/// Payload length of an event value.
pub(crate) fn payload_len(value: &[u8]) -> Result<u64> {
    value
        .len()
        .checked_sub(EVENT_HEADER_LEN)
        .map(|len| len as u64)
        .ok_or_else(|| corrupt("event value"))
}

/// A stream's persistent record. The per-stream counters (first and last
/// sequence, bytes) are not stored here: they are rebuilt from the stream's
/// first and last events, so an append writes only its event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamRecord {
    /// This life of the stream, in every id it issues (see the crate docs).
    pub incarnation: u64,
    /// The age this stream is filed under in the `stream_age` index: a lower
    /// bound on its oldest event's `stored_at`.
    pub age: u64,
    /// The stream id, as given by the application.
    pub stream_id: String,
}

pub(crate) fn encode_record(record: &StreamRecord) -> Vec<u8> {
    let mut value = Vec::with_capacity(16 + record.stream_id.len());
    value.extend_from_slice(&record.incarnation.to_be_bytes());
    value.extend_from_slice(&record.age.to_be_bytes());
    value.extend_from_slice(record.stream_id.as_bytes());
    value
}

/// Reads a stream record. Format 1's records have the same shape, with the
/// era in place of the incarnation.
pub(crate) fn decode_record(value: &[u8]) -> Result<StreamRecord> {
    let incarnation = be_u64(value, 0).ok_or_else(|| corrupt("stream record"))?;
    let age = be_u64(value, 8).ok_or_else(|| corrupt("stream record"))?;
    let stream_id = std::str::from_utf8(&value[16..])
        .map_err(|_| corrupt("stream record"))?
        .to_owned();
    Ok(StreamRecord {
        incarnation,
        age,
        stream_id,
    })
}

/// A session value: expiry then state.
pub(crate) fn encode_session(expires: u64, state: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(8 + state.len());
    value.extend_from_slice(&expires.to_be_bytes());
    value.extend_from_slice(state);
    value
}

/// The expiry of a session value.
pub(crate) fn session_expires(value: &[u8]) -> Result<u64> {
    be_u64(value, 0).ok_or_else(|| corrupt("session value"))
}

/// The key of a session's entry in the expiry index.
pub(crate) fn expiry_key(expires: u64, session_id: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + session_id.len());
    key.extend_from_slice(&expires.to_be_bytes());
    key.extend_from_slice(session_id);
    key
}

/// Splits an expiry index key into expiry and session id.
pub(crate) fn parse_expiry_key(key: &[u8]) -> Result<(u64, &[u8])> {
    let expires = be_u64(key, 0).ok_or_else(|| corrupt("session expiry key"))?;
    Ok((expires, &key[8..]))
}

/// Length of a redemption's key (its digest, C21).
pub(crate) const REDEEM_KEY_LEN: usize = 32;

/// The expiry entry of a redemption: `forget_at ++ key`.
pub(crate) fn redeem_expiry_key(
    forget_at: u64,
    key: &[u8; REDEEM_KEY_LEN],
) -> [u8; 8 + REDEEM_KEY_LEN] {
    let mut entry = [0u8; 8 + REDEEM_KEY_LEN];
    entry[..8].copy_from_slice(&forget_at.to_be_bytes());
    entry[8..].copy_from_slice(key);
    entry
}

/// The time and key of a redemption's expiry entry.
pub(crate) fn parse_redeem_expiry_key(entry: &[u8]) -> Result<(u64, &[u8])> {
    if entry.len() != 8 + REDEEM_KEY_LEN {
        return Err(corrupt("redemption expiry entry"));
    }
    Ok((be_u64(entry, 0).expect("length checked"), &entry[8..]))
}

/// The time a redemption record may be forgotten.
pub(crate) fn redeem_forget_at(record: &[u8]) -> Result<u64> {
    if record.len() != 8 {
        return Err(corrupt("redemption record"));
    }
    Ok(be_u64(record, 0).expect("length checked"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_event_store_core::backend::StreamKey;

    #[test]
    fn times_sort_like_numbers() {
        let times = [i64::MIN, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        for pair in times.windows(2) {
            assert!(encode_time(pair[0]) < encode_time(pair[1]));
            assert!(encode_time(pair[0]).to_be_bytes() < encode_time(pair[1]).to_be_bytes());
        }
        for t in times {
            assert_eq!(decode_time(encode_time(t)), t);
        }
    }

    #[test]
    fn event_keys_order_by_stream_then_seq() {
        let key = StreamKey::generate().unwrap();
        let token = key.token("s");
        assert!(event_key(&token, 255) < event_key(&token, 256));
        assert!(event_key(&token, 1) < event_key(&token, u64::MAX));
        assert_eq!(event_key_seq(&event_key(&token, 42)).unwrap(), 42);
        assert!(event_key_seq(b"short").is_err());
    }

    #[test]
    fn event_values_round_trip() {
        for retry in [
            None,
            Some(Duration::ZERO),
            Some(Duration::from_millis(1)),
            Some(Duration::from_secs(86_400)),
            Some(Duration::MAX),
        ] {
            let mut value = encode_event(encode_time(1234), retry, b"payload");
            set_cum_bytes(&mut value, 99);
            let header = decode_event(&value).unwrap();
            assert_eq!(header.stored_at, encode_time(1234));
            assert_eq!(header.cum_bytes, 99);
            let want = retry.map(|r| {
                Duration::from_millis(
                    u64::try_from(r.as_millis())
                        .unwrap_or(u64::MAX)
                        .min(i64::MAX as u64),
                )
            });
            assert_eq!(header.retry, want);
            assert_eq!(payload_len(&value).unwrap(), 7);
            assert_eq!(&value[EVENT_HEADER_LEN..], b"payload");
        }
        assert!(decode_event(&[0; 23]).is_err());
        assert!(payload_len(&[0; 3]).is_err());
    }

    #[test]
    fn records_and_index_keys_round_trip() {
        let record = StreamRecord {
            incarnation: 3,
            age: encode_time(5),
            stream_id: "Δ-漢字-🚀".into(),
        };
        assert_eq!(decode_record(&encode_record(&record)).unwrap(), record);
        assert!(decode_record(&[0; 15]).is_err());
        assert!(decode_record(&[&[0u8; 16][..], &[0xff]].concat()).is_err());

        let token = StreamKey::generate().unwrap().token("s");
        assert_eq!(parse_age_key(&age_key(7, &token)).unwrap(), (7, token));
        assert!(parse_age_key(b"x").is_err());

        let key = expiry_key(9, b"sess");
        assert_eq!(parse_expiry_key(&key).unwrap(), (9, &b"sess"[..]));
        assert_eq!(session_expires(&encode_session(9, b"state")).unwrap(), 9);
        assert!(session_expires(b"x").is_err());
    }
}
