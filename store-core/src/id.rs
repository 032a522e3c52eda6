//! The event-id scheme (contract C2), parsed and formatted here and nowhere else.
//!
//! An event id has three dot-separated parts:
//!
//! ```text
//! v1.<stream token>.<position>
//! ```
//!
//! * `v1` is the scheme version, so a future scheme can be told apart.
//! * The **stream token** is 24 characters of lowercase base32hex
//!   (`0-9a-v`): 120 bits of HMAC-SHA256 over the stream id, keyed with a
//!   secret that lives in the backend. It locates the stream without a scan,
//!   and since the key never leaves the backend, knowing every id of one stream
//!   gives no way to build a valid id of another.
//! * The **position** orders events within the stream: lowercase hex without
//!   leading zeros, either `<major>` or `<major>-<minor>`. Backends that number
//!   a stream densely write `<incarnation>-<seq>` (see [`dense`](crate::backend::dense)):
//!   a new life of a stream id never reissues an id of an old one. Redis
//!   Streams writes its native entry id `<ms>-<seq>`.
//!
//! Every character is in `[0-9A-Za-z._-]` and an id is at most 61 bytes, so it
//! is safe in an SSE `id:` field and in a `Last-Event-ID` header.
//!
//! Parsing never panics: anything that is not exactly a canonical id is
//! [`Error::UnknownEventId`](crate::Error::UnknownEventId).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use data_encoding::BASE32_DNSSEC;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::Error;

/// Length of the stream token in bytes (120 bits).
pub const STREAM_TOKEN_LEN: usize = 15;
/// Length of the stream token in its text form.
const TOKEN_TEXT_LEN: usize = 24;
/// Longest possible event id, in bytes.
pub const MAX_EVENT_ID_LEN: usize = 3 + TOKEN_TEXT_LEN + 1 + 16 + 1 + 16;
/// Length of the secret that keys stream tokens.
pub const STREAM_KEY_LEN: usize = 32;
const SCHEME_PREFIX: &str = "v1.";
/// Domain separation, so the key could never be confused with another use.
const TOKEN_DOMAIN: &[u8] = b"mcp-event-store/v1/stream-token\0";

/// The secret that turns a stream id into its [`StreamToken`].
///
/// Each store keeps one in its backend (a metadata row, a key), created at
/// random the first time the store is opened, so every instance sharing the
/// backend derives the same tokens and nobody without the backend can.
#[derive(Clone)]
pub struct StreamKey([u8; STREAM_KEY_LEN]);

impl StreamKey {
    /// A fresh key from the operating system's CSPRNG.
    pub fn generate() -> crate::Result<Self> {
        let mut bytes = [0u8; STREAM_KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| Error::Config(format!("no OS randomness: {e}")))?;
        Ok(Self(bytes))
    }

    /// A key from stored bytes; they must be exactly [`STREAM_KEY_LEN`] long.
    pub fn from_bytes(bytes: &[u8]) -> crate::Result<Self> {
        let bytes: [u8; STREAM_KEY_LEN] = bytes.try_into().map_err(|_| {
            Error::Corrupt(format!(
                "stream key is {} bytes, expected {STREAM_KEY_LEN}",
                bytes.len()
            ))
        })?;
        Ok(Self(bytes))
    }

    /// The raw bytes, for the backend to persist.
    pub fn as_bytes(&self) -> &[u8; STREAM_KEY_LEN] {
        &self.0
    }

    /// The token of `stream_id` under this key.
    pub fn token(&self, stream_id: &str) -> StreamToken {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .expect("HMAC accepts keys of any length");
        mac.update(TOKEN_DOMAIN);
        mac.update(stream_id.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut token = [0u8; STREAM_TOKEN_LEN];
        token.copy_from_slice(&digest[..STREAM_TOKEN_LEN]);
        StreamToken(token)
    }
}

impl fmt::Debug for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StreamKey(..)")
    }
}

/// The unguessable, fixed-size name of one stream inside a store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamToken([u8; STREAM_TOKEN_LEN]);

impl StreamToken {
    /// The raw bytes, as backends index them.
    pub fn as_bytes(&self) -> &[u8; STREAM_TOKEN_LEN] {
        &self.0
    }

    /// A token from stored bytes; `None` if the length is wrong.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The 24-character text form (lowercase base32hex), as used in ids and
    /// in Redis key hash tags.
    pub fn to_text(&self) -> String {
        BASE32_DNSSEC.encode(&self.0)
    }

    /// A token from its text form (see [`to_text`](Self::to_text)); `None`
    /// unless `text` is exactly a token's one spelling.
    pub fn parse(text: &str) -> Option<Self> {
        Self::parse_text(text)
    }

    fn parse_text(text: &str) -> Option<Self> {
        // The decoder also takes upper case; only the lower-case spelling is
        // an id, so that every token has exactly one text.
        if text.len() != TOKEN_TEXT_LEN
            || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'v'))
        {
            return None;
        }
        // 24 base32 characters carry exactly 120 bits, so every string of
        // the right alphabet and length is canonical.
        let bytes = BASE32_DNSSEC.decode(text.as_bytes()).ok()?;
        Self::from_bytes(&bytes)
    }
}

impl fmt::Debug for StreamToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamToken({})", self.to_text())
    }
}

impl fmt::Display for StreamToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Where an event sits in its stream. Ordered by `(major, minor)`.
///
/// Backends with a per-stream sequence put the stream's incarnation in
/// `major` and the sequence number in `minor` (see [`dense`](crate::backend::dense));
/// Redis Streams maps its `<ms>-<seq>` entry ids onto both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Position {
    /// The primary order: an incarnation or a millisecond timestamp.
    pub major: u64,
    /// The order within `major`: a sequence number (0 for single-part
    /// positions).
    pub minor: u64,
}

impl Position {
    /// A position from its two parts.
    pub const fn new(major: u64, minor: u64) -> Self {
        Self { major, minor }
    }

    /// A single-part position: `major` alone, `minor` 0.
    pub const fn seq(seq: u64) -> Self {
        Self {
            major: seq,
            minor: 0,
        }
    }

    /// The position before the first event of any stream.
    pub const ZERO: Self = Self::seq(0);
}

impl Ord for Position {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor).cmp(&(other.major, other.minor))
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.minor == 0 {
            write!(f, "{:x}", self.major)
        } else {
            write!(f, "{:x}-{:x}", self.major, self.minor)
        }
    }
}

fn parse_hex_u64(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.len() <= 16
        && (text == "0" || !text.starts_with('0'))
        && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !canonical {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

impl Position {
    fn parse_text(text: &str) -> Option<Self> {
        match text.split_once('-') {
            None => Some(Self::seq(parse_hex_u64(text)?)),
            Some((major, minor)) => {
                let minor = parse_hex_u64(minor)?;
                // `5-0` is spelled `5`: exactly one text per position.
                (minor != 0).then_some(())?;
                Some(Self {
                    major: parse_hex_u64(major)?,
                    minor,
                })
            }
        }
    }
}

/// A parsed event id: the stream's token and the event's position in it.
///
/// ```
/// use mcp_event_store_core::backend::StreamKey;
/// use mcp_event_store_core::{EventId, Position};
///
/// let key = StreamKey::generate().unwrap();
/// let id = EventId::new(key.token("session-1:common"), Position::seq(42));
/// let text = id.to_string();
/// assert!(text.starts_with("v1.") && text.ends_with(".2a"));
/// assert_eq!(text.parse::<EventId>().unwrap(), id);
/// assert!("v1.not-an-id".parse::<EventId>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId {
    /// The stream the event belongs to.
    pub token: StreamToken,
    /// Its place in that stream.
    pub position: Position,
}

impl EventId {
    /// An id from its parts.
    pub const fn new(token: StreamToken, position: Position) -> Self {
        Self { token, position }
    }

    /// Parses an id received from a client. Never panics; anything that is not
    /// exactly a canonical id gives `None`.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() > MAX_EVENT_ID_LEN {
            return None;
        }
        let rest = text.strip_prefix(SCHEME_PREFIX)?;
        let (token, position) = rest.split_once('.')?;
        Some(Self {
            token: StreamToken::parse_text(token)?,
            position: Position::parse_text(position)?,
        })
    }
}

impl FromStr for EventId {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Self::parse(text).ok_or_else(|| Error::unknown_event_id(text))
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME_PREFIX}{}.{}", self.token, self.position)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StreamKey {
        StreamKey::from_bytes(&[7u8; STREAM_KEY_LEN]).unwrap()
    }

    #[test]
    fn round_trips_both_position_forms() {
        let token = key().token("a");
        for position in [
            Position::ZERO,
            Position::seq(1),
            Position::seq(u64::MAX),
            Position {
                major: 1_700_000_000_000,
                minor: 3,
            },
            Position {
                major: u64::MAX,
                minor: u64::MAX,
            },
        ] {
            let id = EventId::new(token, position);
            let text = id.to_string();
            assert!(text.len() <= MAX_EVENT_ID_LEN, "{text}");
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            );
            assert_eq!(EventId::parse(&text), Some(id), "{text}");
        }
    }

    #[test]
    fn rejects_non_canonical_and_garbage() {
        let good = EventId::new(key().token("a"), Position::seq(26)).to_string();
        let (head, _) = good.rsplit_once('.').unwrap();
        for bad in [
            String::new(),
            "v1.".into(),
            "v1..1".into(),
            format!("{head}."),
            format!("{head}.01a"),
            format!("{head}.1A"),
            format!("{head}.1a-0"),
            format!("{head}.1a-"),
            format!("{head}.-1"),
            format!("{head}.1a-1-1"),
            format!("{head}.11111111111111111"),
            format!("{good}.0"),
            format!("{good}-"),
            good[..good.len() - 1].to_string() + "g",
            good.to_uppercase(),
            format!("v1.{}.1a", head[3..].to_uppercase()),
            good.replacen("v1", "v2", 1),
            format!("{head}x.1a"),
            good[..10].to_string(),
            "v1.ééééééééééééééééééééééé.1".into(),
            "'; DROP TABLE events; --".into(),
            "x".repeat(100_000),
        ] {
            assert_eq!(EventId::parse(&bad), None, "{bad:?}");
        }
        assert!(EventId::parse(&good).is_some());
    }

    #[test]
    fn positions_order_by_major_then_minor() {
        let a = Position { major: 1, minor: 9 };
        let b = Position { major: 2, minor: 0 };
        assert!(a < b);
        assert!(Position::seq(1) < Position { major: 1, minor: 1 });
    }

    #[test]
    fn tokens_depend_on_key_and_stream() {
        let other = StreamKey::from_bytes(&[8u8; STREAM_KEY_LEN]).unwrap();
        assert_eq!(key().token("a"), key().token("a"));
        assert_ne!(key().token("a"), key().token("b"));
        assert_ne!(key().token("a"), other.token("a"));
    }
}
