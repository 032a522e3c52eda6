//! How an event is laid out in its JetStream message: a fixed binary
//! header before the payload.
//!
//! ```text
//! version u8 = 1 | flags u8 (bit 0: retry present, bit 1: spilled)
//! at i64      the append time, ms since the epoch by the store's clock
//! base u64    the sequence of the first event of this life of the stream
//!             (0: this event is the first, its own sequence is the base)
//! prev u64    the sequence of the event before it in this life (0: none)
//! total u64   payload bytes of this life up to and including this event
//! [retry u64] the SSE retry hint in ms, when flag bit 0 is set
//! sid_len u16 the stream id's length in bytes, then the stream id
//! payload     or, when spilled, the reference to it (see `spill`)
//! ```
//!
//! All integers little-endian. `prev` chains a stream's events: a reader
//! that finds an event whose `prev` is not the event it read before knows
//! something between was removed (C5). `total` makes a stream's retained
//! bytes two reads away (its first and newest events), whatever its length.
//! The stream id in every event makes any one event enough to name its
//! stream: a lookup is one read, and the store keeps no record per stream
//! that could outlive it.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use mcp_event_store_core::{Error, Result};

use crate::spill::{REF_LEN, SpillRef};

const VERSION: u8 = 1;
const FIXED: usize = 2 + 8 * 4;
const HAS_RETRY: u8 = 1;
const SPILLED: u8 = 2;

/// An event's payload as its message holds it.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    /// The payload itself.
    Inline(Bytes),
    /// A reference to the payload, spilled for its size.
    Spilled(SpillRef),
}

impl Body {
    /// The payload's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Body::Inline(data) => data.len() as u64,
            Body::Spilled(spilled) => spilled.len,
        }
    }
}

/// The header of one event as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) at: i64,
    pub(crate) base: u64,
    pub(crate) prev: u64,
    pub(crate) total: u64,
    pub(crate) retry: Option<Duration>,
}

/// The bytes a header adds to a payload, at most.
pub(crate) const MAX_OVERHEAD: usize = FIXED + 8 + 2 + 1024;

/// One event's message body.
pub(crate) fn encode(header: &Header, stream_id: &str, data: &[u8]) -> Bytes {
    encode_with(header, stream_id, 0, |out| out.put_slice(data), data.len())
}

/// One event's message body with its payload spilled.
pub(crate) fn encode_spilled(header: &Header, stream_id: &str, spilled: &SpillRef) -> Bytes {
    encode_with(
        header,
        stream_id,
        SPILLED,
        |out| spilled.encode(out),
        REF_LEN,
    )
}

fn encode_with(
    header: &Header,
    stream_id: &str,
    flags: u8,
    body: impl FnOnce(&mut BytesMut),
    body_len: usize,
) -> Bytes {
    let mut out = BytesMut::with_capacity(FIXED + 10 + stream_id.len() + body_len);
    out.put_u8(VERSION);
    out.put_u8(flags | if header.retry.is_some() { HAS_RETRY } else { 0 });
    out.put_i64_le(header.at);
    out.put_u64_le(header.base);
    out.put_u64_le(header.prev);
    out.put_u64_le(header.total);
    if let Some(retry) = header.retry {
        out.put_u64_le(u64::try_from(retry.as_millis()).unwrap_or(u64::MAX));
    }
    // Stream ids are at most 1024 bytes (C9), checked before any append.
    out.put_u16_le(stream_id.len() as u16);
    out.put_slice(stream_id.as_bytes());
    body(&mut out);
    out.freeze()
}

/// An event read back: its header (with `base` resolved against its own
/// sequence), its stream id and its payload, sharing the message's buffer.
pub(crate) fn decode(seq: u64, body: Bytes) -> Result<(Header, Bytes, Body)> {
    let corrupt = || Error::Corrupt(format!("event message {seq} has no valid header"));
    if body.len() < FIXED {
        return Err(corrupt());
    }
    if body[0] != VERSION {
        return Err(Error::IncompatibleFormat(format!(
            "event message {seq} has header version {}; this release reads {VERSION}",
            body[0]
        )));
    }
    let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
    let flags = body[1];
    let mut header = Header {
        at: word(2) as i64,
        base: word(10),
        prev: word(18),
        total: word(26),
        retry: None,
    };
    let mut start = FIXED;
    if flags & HAS_RETRY != 0 {
        if body.len() < FIXED + 8 {
            return Err(corrupt());
        }
        header.retry = Some(Duration::from_millis(word(FIXED)));
        start += 8;
    }
    if header.base == 0 {
        header.base = seq;
    }
    if header.base > seq || header.prev >= seq || body.len() < start + 2 {
        return Err(corrupt());
    }
    let sid_len = usize::from(u16::from_le_bytes([body[start], body[start + 1]]));
    start += 2;
    if body.len() < start + sid_len {
        return Err(corrupt());
    }
    let stream_id = body.slice(start..start + sid_len);
    let rest = body.slice(start + sid_len..);
    let payload = if flags & SPILLED != 0 {
        Body::Spilled(SpillRef::decode(&rest)?)
    } else {
        Body::Inline(rest)
    };
    Ok((header, stream_id, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_resolve_their_base() {
        let header = Header {
            at: 1_700_000_000_000,
            base: 0,
            prev: 0,
            total: 3,
            retry: Some(Duration::from_millis(1500)),
        };
        let (read, sid, data) = decode(7, encode(&header, "s:1", b"abc")).unwrap();
        assert_eq!(read.base, 7, "a first event is its own base");
        assert_eq!(&sid[..], b"s:1");
        assert_eq!(read.retry, header.retry);
        assert!(matches!(data, Body::Inline(data) if &data[..] == b"abc"));
        let later = Header {
            base: 7,
            prev: 7,
            retry: None,
            ..header
        };
        let (read, _, data) = decode(9, encode(&later, "s:1", b"")).unwrap();
        assert_eq!(read, later);
        assert_eq!(data.len(), 0);
    }

    #[test]
    fn damaged_bodies_are_errors() {
        assert!(decode(1, Bytes::from_static(b"short")).is_err());
        let mut newer = encode(
            &Header {
                at: 0,
                base: 0,
                prev: 0,
                total: 0,
                retry: None,
            },
            "s",
            b"",
        )
        .to_vec();
        newer[0] = 9;
        assert!(matches!(
            decode(1, newer.into()),
            Err(Error::IncompatibleFormat(_))
        ));
        let forward = encode(
            &Header {
                at: 0,
                base: 5,
                prev: 0,
                total: 0,
                retry: None,
            },
            "s",
            b"",
        );
        assert!(
            decode(3, forward).is_err(),
            "a base after the event is corrupt"
        );
    }
}
