//! The envelope a sealed value is stored in, and the place it is bound to.

use bytes::Bytes;
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{Tag, XNonce};
use mcp_event_store_core::task::TaskDigest;
use mcp_event_store_core::{Error, Result, SessionDigest};

use crate::keys::{KeyId, KeyRing};

/// The first byte of every envelope this release writes: format 1,
/// XChaCha20-Poly1305. `0xF1` never starts UTF-8 text (nor JSON), so a
/// value stored without sealing is told from an envelope.
pub const VERSION: u8 = 0xF1;
/// Bytes `0xF2` to `0xFF`: envelope formats of later releases, refused as
/// [`Error::IncompatibleFormat`].
const NEWER_VERSIONS: std::ops::RangeInclusive<u8> = 0xF2..=0xFF;
/// Version byte and key id.
pub const HEADER_BYTES: usize = 1 + 4;
/// XChaCha20's nonce: 192 random bits per value.
pub const NONCE_BYTES: usize = 24;
/// Poly1305's tag.
pub const TAG_BYTES: usize = 16;
/// What sealing adds to every value, whatever its size: 45 bytes (version
/// 1, key id 4, nonce 24, tag 16). An empty value seals to exactly this.
pub const OVERHEAD: usize = HEADER_BYTES + NONCE_BYTES + TAG_BYTES;

/// Domain separation of the associated data: no other use of these keys
/// can produce a valid value for this one.
const DOMAIN: &[u8] = b"mcp-event-store/sealed/1";

/// What a stored value looks like from its first bytes, without a key
/// ([`shape`]): what an operator's scan counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Shape {
    /// An envelope of this release's format, sealed under this key.
    Sealed(KeyId),
    /// Not an envelope: a value written without the decorator (plaintext).
    NotSealed,
    /// Starts like an envelope but is shorter than the smallest one.
    Truncated,
    /// An envelope of a later format (its version byte).
    Newer(u8),
}

/// The shape of a stored value, read from its header alone (no key
/// needed): which key sealed it, or why it is no envelope of this
/// release.
///
/// ```
/// use mcp_event_store_sealed::{KeyId, Shape, shape};
///
/// assert_eq!(shape(br#"{"jsonrpc":"2.0"}"#), Shape::NotSealed);
/// assert_eq!(shape(&[0xF1, 0, 0, 0, 7]), Shape::Truncated);
/// let mut sealed = vec![0xF1, 0, 0, 0, 7];
/// sealed.resize(45, 0);
/// assert_eq!(shape(&sealed), Shape::Sealed(KeyId(7)));
/// ```
pub fn shape(value: &[u8]) -> Shape {
    match value.first() {
        Some(&VERSION) if value.len() >= OVERHEAD => Shape::Sealed(KeyId(u32::from_be_bytes([
            value[1], value[2], value[3], value[4],
        ]))),
        Some(&VERSION) => Shape::Truncated,
        Some(v) if NEWER_VERSIONS.contains(v) => Shape::Newer(*v),
        _ => Shape::NotSealed,
    }
}

/// Which part of a task a value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Context = 1,
    Outcome = 2,
    Checkpoint = 3,
    Request = 4,
    Answer = 5,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Context => "context",
            Field::Outcome => "outcome",
            Field::Checkpoint => "checkpoint",
            Field::Request => "input request",
            Field::Answer => "input response",
        }
    }
}

/// Where a value lives: what its associated data binds it to, so that a
/// value copied anywhere else fails to open.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place<'a> {
    /// An event's data (and a bus message's: a topic is a stream).
    Event { stream_id: &'a str },
    /// A session's state, bound to the digest the store keeps it under
    /// (C20), so a rotation that reads only digests can seal it again.
    Session { digest: &'a SessionDigest },
    /// A task's field; requests and responses also name their input key.
    Task {
        task: &'a TaskDigest,
        field: Field,
        key: Option<&'a str>,
    },
}

impl Place<'_> {
    pub(crate) fn task<'a>(task: &'a TaskDigest, field: Field) -> Place<'a> {
        Place::Task {
            task,
            field,
            key: None,
        }
    }

    pub(crate) fn input<'a>(task: &'a TaskDigest, field: Field, key: &'a str) -> Place<'a> {
        Place::Task {
            task,
            field,
            key: Some(key),
        }
    }

    /// The associated data: the domain, the envelope's header, then the
    /// place, each variable part length-prefixed so no two places share
    /// an encoding.
    fn associated_data(&self, header: &[u8]) -> Vec<u8> {
        let mut ad = Vec::with_capacity(DOMAIN.len() + header.len() + 64);
        ad.extend_from_slice(DOMAIN);
        ad.extend_from_slice(header);
        let mut part = |bytes: &[u8]| {
            ad.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
            ad.extend_from_slice(bytes);
        };
        match *self {
            Place::Event { stream_id } => {
                part(b"event");
                part(stream_id.as_bytes());
            }
            Place::Session { digest } => {
                part(b"session");
                part(digest.as_bytes());
            }
            Place::Task { task, field, key } => {
                part(b"task");
                part(task.as_bytes());
                part(&[field as u8]);
                if let Some(key) = key {
                    part(key.as_bytes());
                }
            }
        }
        ad
    }

    /// What the place is, for an error message: never an id (a session id
    /// is a credential), never a value.
    fn describe(&self) -> String {
        match self {
            Place::Event { stream_id } if stream_id.starts_with("\u{1}bus/") => {
                "a bus message".into()
            }
            Place::Event { .. } => "an event".into(),
            Place::Session { .. } => "a session's state".into(),
            Place::Task { field, .. } => format!("a task's {}", field.name()),
        }
    }
}

/// Seals `plaintext` for `place` under the ring's current key, with a
/// fresh random nonce.
pub(crate) fn seal(ring: &KeyRing, place: &Place<'_>, plaintext: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(OVERHEAD + plaintext.len());
    out.push(VERSION);
    out.extend_from_slice(&ring.current().0.to_be_bytes());
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::fill(&mut nonce)
        .map_err(|e| Error::Config(format!("the random source failed: {e}")))?;
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plaintext);
    let ad = place.associated_data(&out[..HEADER_BYTES]);
    let start = HEADER_BYTES + NONCE_BYTES;
    let tag = ring
        .current_cipher()
        .encrypt_in_place_detached(XNonce::from_slice(&nonce), &ad, &mut out[start..])
        .map_err(|_| Error::Corrupt("sealing a value failed".into()))?;
    out.extend_from_slice(&tag);
    Ok(out)
}

/// Opens a value stored at `place`: its plaintext, or an error saying
/// what is wrong (never a panic, whatever the bytes).
pub(crate) fn open(ring: &KeyRing, place: &Place<'_>, stored: &[u8]) -> Result<Bytes> {
    let key = match shape(stored) {
        Shape::Sealed(key) => key,
        Shape::NotSealed => {
            return Err(Error::Corrupt(format!(
                "{} read through the sealing decorator is not sealed (it does not start \
                 with the envelope's version byte 0xF1): it was written without the \
                 decorator, or damaged",
                place.describe()
            )));
        }
        Shape::Truncated => {
            return Err(Error::Corrupt(format!(
                "{} is a truncated sealed value: {} bytes, the smallest envelope is {OVERHEAD}",
                place.describe(),
                stored.len()
            )));
        }
        Shape::Newer(version) => {
            return Err(Error::IncompatibleFormat(format!(
                "{} is sealed in envelope format {version:#04x}, newer than this release \
                 reads ({VERSION:#04x})",
                place.describe()
            )));
        }
    };
    let Some(cipher) = ring.cipher(key) else {
        return Err(Error::Config(format!(
            "{} is sealed under key id {key}, which the key ring does not hold \
             (it holds {:?}): add that key to the ring",
            place.describe(),
            ring.ids().iter().map(|k| k.0).collect::<Vec<_>>()
        )));
    };
    let ad = place.associated_data(&stored[..HEADER_BYTES]);
    let nonce = XNonce::from_slice(&stored[HEADER_BYTES..HEADER_BYTES + NONCE_BYTES]);
    let body = HEADER_BYTES + NONCE_BYTES..stored.len() - TAG_BYTES;
    let tag = Tag::from_slice(&stored[body.end..]);
    let mut plaintext = stored[body].to_vec();
    cipher
        .decrypt_in_place_detached(nonce, &ad, &mut plaintext, tag)
        .map_err(|_| {
            Error::Corrupt(format!(
                "{} fails authentication under key id {key}: its bytes were altered, it was \
                 sealed under another key with that id, or it was moved here from another \
                 place (stream, session, task, field or input key)",
                place.describe()
            ))
        })?;
    Ok(Bytes::from(plaintext))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KEY_BYTES;
    use mcp_event_store_core::task::TaskId;

    fn ring(id: u32, byte: u8) -> KeyRing {
        KeyRing::new(KeyId(id), &[byte; KEY_BYTES]).unwrap()
    }

    const HERE: Place<'static> = Place::Event { stream_id: "s" };

    #[test]
    fn a_value_round_trips_with_a_fixed_overhead() {
        let ring = ring(3, 1);
        for plaintext in [&b""[..], b"x", &[0xF1; 1000]] {
            let sealed = seal(&ring, &HERE, plaintext).unwrap();
            assert_eq!(sealed.len(), plaintext.len() + OVERHEAD);
            assert_eq!(shape(&sealed), Shape::Sealed(KeyId(3)));
            assert_eq!(&open(&ring, &HERE, &sealed).unwrap()[..], plaintext);
        }
        // Random nonces: the same value seals differently each time.
        assert_ne!(
            seal(&ring, &HERE, b"x").unwrap(),
            seal(&ring, &HERE, b"x").unwrap()
        );
    }

    #[test]
    fn every_damage_is_a_clear_error_never_a_panic() {
        let ring = ring(1, 1);
        let sealed = seal(&ring, &HERE, b"secret").unwrap();
        let kind = |stored: &[u8]| {
            let error = open(&ring, &HERE, stored).unwrap_err();
            (error.kind(), error.to_string())
        };
        // Every single-bit flip anywhere.
        for at in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[at] ^= 0x01;
            let (kind, message) = kind(&bad);
            assert!(
                ["corrupt", "config", "incompatible_format"].contains(&kind),
                "{at}: {message}"
            );
        }
        // Every truncation.
        for len in 0..sealed.len() {
            let (kind, message) = kind(&sealed[..len]);
            assert_eq!(kind, "corrupt", "{len}: {message}");
        }
        let (_, message) = kind(&sealed[..10]);
        assert!(message.contains("truncated"), "{message}");
        let (_, message) = kind(b"{\"plain\":true}");
        assert!(message.contains("not sealed"), "{message}");
        let mut newer = sealed.clone();
        newer[0] = 0xF2;
        assert_eq!(kind(&newer).0, "incompatible_format");
        // Another key under the same id, and an id the ring lacks.
        let (kind_wrong, message) = {
            let error = open(&self::ring(1, 2), &HERE, &sealed).unwrap_err();
            (error.kind(), error.to_string())
        };
        assert_eq!(kind_wrong, "corrupt");
        assert!(message.contains("authentication"), "{message}");
        let error = open(&self::ring(2, 1), &HERE, &sealed).unwrap_err();
        assert_eq!(error.kind(), "config");
        assert!(error.to_string().contains("key id 1"), "{error}");
    }

    #[test]
    fn a_value_moved_to_another_place_is_refused() {
        let ring = ring(1, 1);
        let (a, b) = (
            TaskId::generate().unwrap().digest(),
            TaskId::generate().unwrap().digest(),
        );
        let (s, t) = (SessionDigest::of("s"), SessionDigest::of("t"));
        let places = [
            Place::Event { stream_id: "s" },
            Place::Event { stream_id: "t" },
            Place::Event {
                stream_id: "\u{1}bus/s",
            },
            Place::Session { digest: &s },
            Place::Session { digest: &t },
            Place::task(&a, Field::Context),
            Place::task(&b, Field::Context),
            Place::task(&a, Field::Outcome),
            Place::task(&a, Field::Checkpoint),
            Place::input(&a, Field::Request, "k"),
            Place::input(&a, Field::Answer, "k"),
            Place::input(&a, Field::Request, "j"),
            Place::input(&b, Field::Request, "k"),
        ];
        for (i, from) in places.iter().enumerate() {
            let sealed = seal(&ring, from, b"value").unwrap();
            for (j, to) in places.iter().enumerate() {
                let opened = open(&ring, to, &sealed);
                assert_eq!(opened.is_ok(), i == j, "{from:?} read at {to:?}");
            }
        }
    }
}
