//! Task ids, their digests, owners and instance ids (T2, T3, T11).

use std::fmt;

use data_encoding::{BASE32_DNSSEC, HEXLOWER};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

use super::MAX_PRINCIPAL_BYTES;

const PREFIX: &str = "t1.";
const ID_BYTES: usize = 16;
/// 128 bits in base32hex: 26 characters, the last carrying 3 bits.
const ID_TEXT_LEN: usize = 26;
const TASK_DOMAIN: &[u8] = b"mcp-event-store/task\0";
const OWNER_DOMAIN: &[u8] = b"mcp-event-store/owner\0";

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| Error::Config(format!("no OS randomness: {e}")))?;
    Ok(bytes)
}

fn digest16(domain: &[u8], data: &[u8]) -> [u8; 16] {
    let hash = Sha256::new()
        .chain_update(domain)
        .chain_update(data)
        .finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&hash[..16]);
    out
}

/// A task id (T2): `t1.` and 26 lowercase base32hex characters, 128 bits
/// from the OS CSPRNG, 29 bytes in all and safe in an `Mcp-Name` header.
///
/// The id is the client's bearer token for the task, so stores never keep
/// it: they key the task by its [`digest`](Self::digest), and a dump of the
/// backend hands out no id.
///
/// ```
/// use mcp_event_store_core::task::TaskId;
///
/// let id = TaskId::generate().unwrap();
/// let text = id.to_string();
/// assert_eq!(text.len(), 29);
/// assert_eq!(TaskId::parse(&text), Some(id));
/// assert_eq!(TaskId::parse("t1.nope"), None);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId([u8; ID_BYTES]);

impl TaskId {
    /// A fresh id from the operating system's CSPRNG.
    pub fn generate() -> Result<Self> {
        random().map(Self)
    }

    /// The id `text` spells, or `None` unless it is exactly an id's one
    /// spelling (no upper case, no stray bits in the last character).
    pub fn parse(text: &str) -> Option<Self> {
        let body = text.strip_prefix(PREFIX)?;
        if body.len() != ID_TEXT_LEN
            || !body.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'v'))
        {
            return None;
        }
        let bytes: [u8; ID_BYTES] = BASE32_DNSSEC
            .decode(body.as_bytes())
            .ok()?
            .try_into()
            .ok()?;
        // The last character carries 2 unused bits; only the spelling with
        // them zero is the id.
        (BASE32_DNSSEC.encode(&bytes) == body).then_some(Self(bytes))
    }

    /// The key a store files the task under:
    /// `SHA-256("mcp-event-store/task\0" ‖ id)[..16]`, over the id's text.
    pub fn digest(&self) -> TaskDigest {
        TaskDigest(digest16(TASK_DOMAIN, self.to_string().as_bytes()))
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", BASE32_DNSSEC.encode(&self.0))
    }
}

impl fmt::Debug for TaskId {
    /// Only a prefix: the id is a bearer token and has no place in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({}…)", &self.to_string()[..7])
    }
}

/// The 16 bytes a store keys a task by; see [`TaskId::digest`].
///
/// Made only from an id ([`TaskId::digest`], [`TaskDigest::of`]) or read
/// back from a store ([`backend::task::stored_digest`](crate::backend::task::stored_digest)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskDigest([u8; 16]);

impl TaskDigest {
    /// The digest of a client-supplied id, or `None` if it is malformed:
    /// a malformed id never reaches the backend (T2).
    pub fn of(id: &str) -> Option<Self> {
        TaskId::parse(id).map(|id| id.digest())
    }

    /// The digest a store holds as these bytes (for backends).
    pub(crate) fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The digest `text` spells ([`Display`](fmt::Display): 32 lowercase
    /// hex digits), or `None` for anything else: how an operator names a
    /// task (T22), whose id no store keeps.
    pub fn parse(text: &str) -> Option<Self> {
        hex16(text).map(Self)
    }
}

/// The 16 bytes 32 lowercase hex digits spell, or `None` for anything
/// else: how digests and instance ids are written out.
fn hex16(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 || text.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    HEXLOWER.decode(text.as_bytes()).ok()?.try_into().ok()
}

impl fmt::Display for TaskDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&HEXLOWER.encode(&self.0))
    }
}

/// Who may see a task (T3): nobody in particular, or one principal.
///
/// Principals are kept only as a 16-byte digest. Matching is equality, so
/// an anonymous caller never sees a principal's task and a principal never
/// sees an anonymous one.
///
/// ```
/// use mcp_event_store_core::task::Owner;
///
/// let alice = Owner::principal(b"alice").unwrap();
/// assert_eq!(alice, Owner::principal(b"alice").unwrap());
/// assert_ne!(alice, Owner::Anonymous);
/// assert!(Owner::principal(&[0; 257]).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// No authenticated principal: the id is the only credential.
    Anonymous,
    /// The digest of a principal's bytes.
    Principal([u8; 16]),
}

impl Owner {
    /// The owner for principal bytes (a subject, a client id), 1 to 256
    /// bytes; longer or empty is [`Error::Config`], a wiring mistake.
    pub fn principal(bytes: &[u8]) -> Result<Self> {
        if bytes.is_empty() || bytes.len() > MAX_PRINCIPAL_BYTES {
            return Err(Error::Config(format!(
                "a principal is 1 to {MAX_PRINCIPAL_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Self::Principal(digest16(OWNER_DOMAIN, bytes)))
    }

    /// The stored digest, `None` for [`Owner::Anonymous`].
    pub fn digest(&self) -> Option<&[u8; 16]> {
        match self {
            Owner::Anonymous => None,
            Owner::Principal(digest) => Some(digest),
        }
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Anonymous => f.write_str("Anonymous"),
            Owner::Principal(d) => write!(f, "Principal({}…)", HEXLOWER.encode(&d[..4])),
        }
    }
}

/// One running server instance (T11): it heartbeats, and the tasks it runs
/// record it, so they read as lost when it stops.
///
/// Made fresh ([`generate`](Self::generate)), or read back as written:
/// [`parse`](Self::parse) takes its text (32 lowercase hex digits), and a
/// backend reads its stored bytes with
/// [`backend::task::stored_instance`](crate::backend::task::stored_instance).
///
/// ```
/// use mcp_event_store_core::task::InstanceId;
///
/// let me = InstanceId::generate().unwrap();
/// assert_eq!(InstanceId::parse(&me.to_string()), Some(me));
/// assert_eq!(InstanceId::parse("not an instance"), None);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId([u8; 16]);

impl InstanceId {
    /// A fresh instance id from the OS CSPRNG.
    pub fn generate() -> Result<Self> {
        random().map(Self)
    }

    /// The instance `text` spells ([`Display`](fmt::Display): 32
    /// lowercase hex digits), or `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        hex16(text).map(Self)
    }

    /// The raw bytes, as backends store them.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The instance a store holds as these bytes (for backends).
    pub(crate) fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&HEXLOWER.encode(&self.0))
    }
}

impl fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InstanceId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips_and_only_its_spelling_parses() {
        let id = TaskId::generate().unwrap();
        let text = id.to_string();
        assert_eq!(TaskId::parse(&text), Some(id));
        assert_eq!(TaskId::parse(&text.to_uppercase()), None);
        assert_eq!(TaskId::parse(&format!("{text} ")), None);
        assert_eq!(TaskId::parse(&text[..28]), None);
        // A stray bit in the last character's two unused ones.
        let alphabet = b"0123456789abcdefghijklmnopqrstuv";
        let mut stray = text.clone().into_bytes();
        let value = alphabet.iter().position(|&c| c == stray[28]).unwrap();
        assert_eq!(value & 3, 0, "the unused bits are zero");
        stray[28] = alphabet[value | 1];
        assert_eq!(TaskId::parse(std::str::from_utf8(&stray).unwrap()), None);
    }

    #[test]
    fn digest_is_the_documented_hash() {
        let id = TaskId([0; 16]);
        let text = id.to_string();
        assert_eq!(text, "t1.00000000000000000000000000");
        let mut hasher = Sha256::new();
        hasher.update(b"mcp-event-store/task\0t1.00000000000000000000000000");
        assert_eq!(id.digest().0[..], hasher.finalize()[..16]);
        assert!(!format!("{id:?}").contains(&text[7..]));
    }

    #[test]
    fn a_digest_round_trips_through_its_hex_and_nothing_else_parses() {
        let digest = TaskId::generate().unwrap().digest();
        let text = digest.to_string();
        assert_eq!(text.len(), 32);
        assert_eq!(TaskDigest::parse(&text), Some(digest));
        for bad in [&text.to_uppercase()[..], &text[..31], "t1.0000", ""] {
            assert_eq!(TaskDigest::parse(bad), None, "{bad:?}");
        }
    }
}
