//! Key layout (contract C12) and the checks that keep client input out of
//! hash tags.
//!
//! ```text
//! <prefix>:format                 "1"   format marker (unversioned name, so a
//!                                       newer layout can refuse this one)
//! <prefix>:v1:stream-key          32 random bytes keying stream tokens
//! <prefix>:v1:{<token>}:events    the Redis Stream of one event stream
//! <prefix>:v1:{<token>}:meta      hash: sid, base, last, purged, bytes, head_t
//! <prefix>:v1:{<sessiontoken>}:session   hash: id, d, exp
//! <prefix>:t1:{<digest hex>}:task        hash: v (the task), rev (durable tasks),
//!                                        c (its context), s (its swaps, C22)
//! <prefix>:t1:instance:{<instance hex>}  a task instance's heartbeat deadline
//! <prefix>:t1:changes                    pub/sub channel (not a key): task changes
//! <prefix>:t1:takeover                   set: digests (hex) of tasks that may be
//!                                        taken over, the claim's candidates
//! <prefix>:r1:{<redeem key hex>}         a redeemed nonce (C21): its expiry plus
//!                                        the grace (ms), expiring then (PXAT)
//! ```
//!
//! `<token>` is the stream's 24-character token (`[0-9a-v]`), the same text as
//! in its event ids, so an id finds its keys with no lookup. The prefix may
//! not contain `{` or `}`, so the token is always the first hash tag: both
//! keys of a stream share one cluster slot, and a stream id (which only ever
//! enters a key through its keyed hash) can neither choose the slot nor
//! collide with another stream.

#[cfg(test)]
use mcp_event_store_core::backend::task::stored_instance;
use mcp_event_store_core::backend::task::{TaskDigest, stored_digest};
use mcp_event_store_core::backend::{RedeemKey, StreamKey, StreamToken};
use mcp_event_store_core::task::InstanceId;
use mcp_event_store_core::{Error, Result};

/// Longest accepted key prefix, in bytes.
pub(crate) const MAX_KEY_PREFIX_LEN: usize = 128;
/// The layout version written into every data key's name.
const LAYOUT: &str = "v1";
/// The tasks' layout version, in the name of every task key (a family of
/// its own: releases without tasks never touch it).
const TASK_LAYOUT: &str = "t1";
/// The redemptions' layout version, in the name of every redemption key
/// (a family of its own, like the tasks': releases without redemptions
/// never touch it).
const REDEEM_LAYOUT: &str = "r1";
/// Domain separation between stream tokens and session tokens.
const SESSION_DOMAIN: &str = "mcp-event-store/session\0";

/// Checks a key prefix: 1 to 128 bytes of `[A-Za-z0-9._:/-]`.
///
/// No `{`/`}` so the stream token is always the key's hash tag, and no glob
/// characters so `SCAN MATCH <prefix>:...` matches only this store's keys.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.len() > MAX_KEY_PREFIX_LEN {
        return Err(Error::Config(format!(
            "key_prefix must be 1 to {MAX_KEY_PREFIX_LEN} bytes, got {}",
            prefix.len()
        )));
    }
    if let Some(bad) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
    {
        return Err(Error::Config(format!(
            "key_prefix may only contain [A-Za-z0-9._:/-] (no hash tags or glob characters), found {bad:?}"
        )));
    }
    Ok(())
}

/// Builds every key name of one store (one prefix).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

/// The two keys of one event stream; both hash to the token's slot.
#[derive(Clone, Debug)]
pub struct StreamKeys {
    /// The Redis Stream holding the events.
    pub events: String,
    /// The hash holding the stream's metadata.
    pub meta: String,
    /// A deleted stream's newest id, kept for a while so a stream re-created
    /// under the same id issues only later ids (a string, so `SCAN ... TYPE
    /// hash` never visits it).
    pub gone: String,
}

impl Keys {
    /// Key names under a (validated) prefix.
    pub fn new(prefix: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// The configured prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The format marker.
    pub fn format(&self) -> String {
        format!("{}:format", self.prefix)
    }

    /// Where the stream-token secret lives.
    pub fn secret(&self) -> String {
        format!("{}:{LAYOUT}:stream-key", self.prefix)
    }

    /// The keys of the stream whose token is `token`.
    ///
    /// Built by hand rather than with `format!`: every append names them, and
    /// the formatting machinery and its regrowing buffers were a tenth of an
    /// append's client side.
    pub fn stream(&self, token: &StreamToken) -> StreamKeys {
        let token = token.to_text();
        let key = |suffix: &str| {
            let mut key = String::with_capacity(
                self.prefix.len() + LAYOUT.len() + token.len() + suffix.len() + 5,
            );
            key.push_str(&self.prefix);
            key.push(':');
            key.push_str(LAYOUT);
            key.push_str(":{");
            key.push_str(&token);
            key.push_str("}:");
            key.push_str(suffix);
            key
        };
        StreamKeys {
            events: key("events"),
            meta: key("meta"),
            gone: key("gone"),
        }
    }

    /// The stream keys belonging to a metadata key found by `SCAN`.
    pub fn stream_of_meta(&self, meta: &str) -> Option<StreamKeys> {
        let base = meta.strip_suffix("meta")?;
        Some(StreamKeys {
            events: format!("{base}events"),
            meta: meta.to_owned(),
            gone: format!("{base}gone"),
        })
    }

    /// The key of a session. Keyed with the stream secret, so session keys
    /// are no more guessable than stream keys and the id never picks a slot.
    pub fn session(&self, key: &StreamKey, session_id: &str) -> String {
        let mut input = String::with_capacity(SESSION_DOMAIN.len() + session_id.len());
        input.push_str(SESSION_DOMAIN);
        input.push_str(session_id);
        format!(
            "{}:{LAYOUT}:{{{}}}:session",
            self.prefix,
            key.token(&input).to_text()
        )
    }

    /// `SCAN MATCH` pattern for this store's metadata and session hashes.
    pub fn scan_pattern(&self) -> String {
        format!("{}:{LAYOUT}:{{{}}}:*", self.prefix, "?".repeat(24))
    }

    /// `SCAN MATCH` pattern for this store's session hashes only, for the
    /// listing of stored values (C22).
    pub fn session_pattern(&self) -> String {
        format!("{}:{LAYOUT}:{{{}}}:session", self.prefix, "?".repeat(24))
    }

    /// `SCAN MATCH` pattern for this store's stream metadata hashes only
    /// (one per stream), for statistics and listings.
    pub fn meta_pattern(&self) -> String {
        format!("{}:{LAYOUT}:{{{}}}:meta", self.prefix, "?".repeat(24))
    }

    /// The stream token of a metadata key found by `SCAN`, if it is one.
    pub fn token_of_meta(&self, key: &[u8]) -> Option<StreamToken> {
        let key = std::str::from_utf8(key).ok()?;
        let token = key
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":")?
            .strip_prefix(LAYOUT)?
            .strip_prefix(":{")?
            .strip_suffix("}:meta")?;
        StreamToken::parse(token)
    }

    /// The hash of the task whose digest is `digest`; the digest (in hex)
    /// is the hash tag, never the task id (T2).
    pub fn task(&self, digest: &TaskDigest) -> String {
        format!(
            "{}:{TASK_LAYOUT}:{{{}}}:task",
            self.prefix,
            hex(digest.as_bytes())
        )
    }

    /// `SCAN MATCH` pattern for this store's task hashes.
    pub fn task_pattern(&self) -> String {
        format!("{}:{TASK_LAYOUT}:{{{}}}:task", self.prefix, "?".repeat(32))
    }

    /// The digest of a task key found by `SCAN`, if it is one.
    pub fn digest_of_task(&self, key: &[u8]) -> Option<TaskDigest> {
        let hex = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":")?
            .strip_prefix(TASK_LAYOUT)?
            .strip_prefix(":{")?
            .strip_suffix("}:task")?;
        digest_of_hex(hex.as_bytes())
    }

    /// The key holding instance `id`'s heartbeat deadline (T11), in a slot
    /// of its own.
    pub fn instance(&self, id: &InstanceId) -> String {
        format!("{}:{TASK_LAYOUT}:instance:{{{id}}}", self.prefix)
    }

    /// The instance an instance key names, or `None` for another key.
    pub fn instance_of(&self, key: &[u8]) -> Option<InstanceId> {
        let key = std::str::from_utf8(key).ok()?;
        let id = key
            .strip_prefix(&format!("{}:{TASK_LAYOUT}:instance:{{", self.prefix))?
            .strip_suffix('}')?;
        InstanceId::parse(id)
    }

    /// `SCAN MATCH` pattern for this store's instance keys.
    pub fn instance_pattern(&self) -> String {
        format!(
            "{}:{TASK_LAYOUT}:instance:{{{}}}",
            self.prefix,
            "?".repeat(32)
        )
    }

    /// The set of the digests (in hex) of tasks that may be taken over
    /// (T16): where a claim looks for tasks, in a slot of its own.
    pub fn takeover_index(&self) -> String {
        format!("{}:{TASK_LAYOUT}:takeover", self.prefix)
    }

    /// The pub/sub channel task changes are published on (the digest in
    /// hex as the message).
    pub fn task_channel(&self) -> String {
        format!("{}:{TASK_LAYOUT}:changes", self.prefix)
    }

    /// The key of a redeemed nonce (C21): its digest (in hex) is the hash
    /// tag, so each lives in a slot of its own and the nonce never reaches
    /// a key.
    pub fn redeemed(&self, key: &RedeemKey) -> String {
        format!("{}:{REDEEM_LAYOUT}:{{{}}}", self.prefix, key.to_hex())
    }

    /// `SCAN MATCH` pattern for every key of this prefix (test teardown).
    pub fn all_pattern(&self) -> String {
        format!("{}:*", self.prefix)
    }
}

/// A task digest spelled in lowercase hex (32 characters), as in task keys
/// and change messages.
pub fn digest_of_hex(hex: &[u8]) -> Option<TaskDigest> {
    if hex.len() != 32 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut digest = [0u8; 16];
    for (byte, pair) in digest.iter_mut().zip(hex.chunks(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    stored_digest(&digest).ok()
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_with_hash_tags_or_globs_are_refused() {
        for bad in [
            "", "a{b", "a}b", "{x}", "a*", "a?", "a[b]", "a\\b", "a b", "é",
        ] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
        assert!(validate_prefix(&"x".repeat(129)).is_err());
        for good in ["mcp-event-store", "app:prod/events", "A.b_c-1"] {
            validate_prefix(good).unwrap();
        }
    }

    #[test]
    fn stream_keys_share_one_hash_tag_from_the_token() {
        let key = StreamKey::generate().unwrap();
        let keys = Keys::new("p").unwrap();
        for stream in ["{x}", "}{", "{a}:{b}", "plain"] {
            let token = key.token(stream);
            let k = keys.stream(&token);
            let tag = format!("{{{}}}", token.to_text());
            assert!(k.events.starts_with(&format!("p:v1:{tag}:")));
            assert!(k.meta.starts_with(&format!("p:v1:{tag}:")));
            assert_eq!(k.events, format!("p:v1:{tag}:events"));
            assert_eq!(k.meta, format!("p:v1:{tag}:meta"));
            assert_eq!(k.gone, format!("p:v1:{tag}:gone"));
            assert_eq!(hash_tag(&k.events), hash_tag(&k.meta));
            assert_eq!(hash_tag(&k.events), Some(token.to_text().as_str()));
            assert_eq!(keys.stream_of_meta(&k.meta).unwrap().events, k.events);
            assert_eq!(keys.token_of_meta(k.meta.as_bytes()), Some(token));
            assert_eq!(keys.token_of_meta(k.events.as_bytes()), None);
        }
        let session = keys.session(&key, "{evil}");
        assert!(!session.contains("evil"));
        assert_eq!(hash_tag(&session).map(str::len), Some(24));
    }

    #[test]
    fn task_keys_are_tagged_by_the_digest() {
        let keys = Keys::new("p").unwrap();
        let digest = stored_digest(&[0xab; 16]).unwrap();
        let key = keys.task(&digest);
        assert_eq!(key, format!("p:t1:{{{}}}:task", "ab".repeat(16)));
        assert_eq!(hash_tag(&key).map(str::len), Some(32));
        assert_eq!(keys.digest_of_task(key.as_bytes()), Some(digest));
        assert_eq!(keys.digest_of_task(b"p:t1:{zz}:task"), None);
        let instance = stored_instance(&[1; 16]).unwrap();
        let key = keys.instance(&instance);
        assert_eq!(hash_tag(&key), Some("01".repeat(16).as_str()));
        assert_eq!(keys.instance_of(key.as_bytes()), Some(instance));
        assert_eq!(keys.instance_of(b"p:t1:instance:{zz}"), None);
        assert!(!keys.scan_pattern().contains("t1"));
    }

    /// The part of a key Redis Cluster hashes, per the cluster spec.
    fn hash_tag(key: &str) -> Option<&str> {
        let open = key.find('{')?;
        let close = key[open + 1..].find('}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    }
}
