//! Session ids as the store keeps them: digests (C20).

use std::fmt;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::task::Owner;

/// What the digest of a session id starts with, so that one domain's
/// digests never equal another's (a task's, an owner's).
const SESSION_DOMAIN: &[u8] = b"mcp-event-store/session\0";

/// The prefix of a session key in the store: `s1.` and the digest's 64
/// lowercase hex digits. The `1` names the scheme, so a later one can live
/// beside it.
const KEY_PREFIX: &str = "s1.";

/// The digest of a session id: what a store keeps in its place (C20).
///
/// A session id is a bearer value: whoever holds a live one can restore the
/// session on any instance. Stores therefore key sessions by this digest
/// (SHA-256 of the id under a domain of its own), never by the id, so a
/// dump of the store's tables or keys hands out no live session. Session
/// ids are random (an MCP server issues them), so the digest cannot be
/// walked back to the id. Integrations use the same digest wherever a
/// session id would otherwise reach the store: in a stream id that names a
/// session, in a message on the bus.
///
/// ```
/// use mcp_event_store_core::SessionDigest;
///
/// let digest = SessionDigest::of("0b5c4a9e-1b9f-4c55-9f43-7a3c6f0d2e11");
/// assert_eq!(digest, SessionDigest::of("0b5c4a9e-1b9f-4c55-9f43-7a3c6f0d2e11"));
/// assert_ne!(digest, SessionDigest::of("another session"));
/// // What the store keys by: no trace of the id.
/// let key = digest.key();
/// assert!(key.starts_with("s1.") && !key.contains("0b5c4a9e"));
/// assert_eq!(SessionDigest::from_key(&key), Some(digest));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionDigest([u8; 32]);

impl SessionDigest {
    /// The digest of `session_id`.
    pub fn of(session_id: &str) -> Self {
        let hash = Sha256::new()
            .chain_update(SESSION_DOMAIN)
            .chain_update(session_id.as_bytes())
            .finalize();
        Self(hash.into())
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest as 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        data_encoding::HEXLOWER.encode(&self.0)
    }

    /// The key a store keeps the session under: `s1.` and [`hex`](Self::hex),
    /// 67 ASCII bytes, valid in every backend's key syntax.
    pub fn key(&self) -> String {
        format!("{KEY_PREFIX}{}", self.hex())
    }

    /// The digest a [`key`](Self::key) names; `None` for anything else.
    pub fn from_key(key: &str) -> Option<Self> {
        Self::from_hex(key.strip_prefix(KEY_PREFIX)?)
    }

    /// The digest 64 lowercase hex digits name; `None` for anything else.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 || hex.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let bytes = data_encoding::HEXLOWER.decode(hex.as_bytes()).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }
}

impl fmt::Debug for SessionDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionDigest({})", &self.hex()[..12])
    }
}

impl fmt::Display for SessionDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// The first byte of a session value bound to its owner: the binding's
/// version, then `0` (anonymous) or `1` and the owner's 16-byte digest.
const BOUND_V1: u8 = 0xB1;

/// `state` bound to `owner`, as [`SessionStore::put_session_as`](crate::SessionStore::put_session_as)
/// stores it.
pub(crate) fn bind(owner: &Owner, state: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(18 + state.len());
    value.push(BOUND_V1);
    match owner.digest() {
        None => value.push(0),
        Some(digest) => {
            value.push(1);
            value.extend_from_slice(digest);
        }
    }
    value.extend_from_slice(state);
    value
}

/// The state of a value [`bind`] wrote, if `owner` is the one it names;
/// `None` for another owner, and for a value no binding wrote.
pub(crate) fn unbind(owner: &Owner, value: Bytes) -> Option<Bytes> {
    let (&version, rest) = value.split_first()?;
    if version != BOUND_V1 {
        return None;
    }
    let start = match (rest.first()?, owner.digest()) {
        (0, None) => 2,
        (1, Some(digest)) if rest.get(1..17) == Some(&digest[..]) => 18,
        _ => return None,
    };
    Some(value.slice(start..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fixed_and_domain_separated() {
        let digest = SessionDigest::of("session");
        // SHA-256 over the domain and the id, as documented: a digest some
        // other code of this project computes must stay equal to it.
        let expected = Sha256::new()
            .chain_update(b"mcp-event-store/session\0session")
            .finalize();
        assert_eq!(digest.as_bytes()[..], expected[..]);
        assert_eq!(digest.key().len(), 67);
        assert_eq!(SessionDigest::from_hex(&digest.hex()), Some(digest));
        assert_eq!(SessionDigest::from_key(&digest.hex()), None);
        assert_eq!(SessionDigest::from_hex(&digest.hex().to_uppercase()), None);
        assert_eq!(SessionDigest::from_hex("zz"), None);
    }

    #[test]
    fn a_bound_value_opens_for_its_owner_only() {
        let alice = Owner::principal(b"alice").unwrap();
        let bob = Owner::principal(b"bob").unwrap();
        for (owner, others) in [
            (Owner::Anonymous, [alice, bob]),
            (alice, [Owner::Anonymous, bob]),
        ] {
            let value = Bytes::from(bind(&owner, b"state"));
            assert_eq!(
                unbind(&owner, value.clone()).as_deref(),
                Some(&b"state"[..])
            );
            for other in others {
                assert_eq!(unbind(&other, value.clone()), None);
            }
            // Cut anywhere inside the binding: refused, never a panic.
            let binding = if owner == Owner::Anonymous { 2 } else { 18 };
            for len in 0..binding {
                assert_eq!(unbind(&owner, value.slice(..len)), None, "{len}");
            }
        }
        assert_eq!(
            unbind(&Owner::Anonymous, Bytes::from_static(b"plain")),
            None
        );
        assert_eq!(unbind(&Owner::Anonymous, Bytes::new()), None);
    }
}
