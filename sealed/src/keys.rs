//! The key ring: numbered keys, one current for writes, older ones still
//! read.

use std::fmt;
use std::str::FromStr;

use chacha20poly1305::{KeyInit, XChaCha20Poly1305};
use mcp_event_store_core::{Error, Result};
use zeroize::Zeroizing;

/// The length of a key: 32 bytes (256 bits) of random data.
pub const KEY_BYTES: usize = 32;

/// The environment variable [`KeyRing::from_env`] reads by convention
/// (and the CLI's `keys --verify` reads).
pub const KEYS_ENV: &str = "MCP_EVENT_STORE_SEALED_KEYS";

/// A key's number, written into every value sealed under it so that a
/// reader finds the key again: `1`, `2`, ... (any `u32`). Numbers, not
/// names, so that the envelope has one size whatever the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub u32);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for KeyId {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        text.trim().parse().map(KeyId).map_err(|_| {
            Error::Config(format!(
                "a key id is a number from 0 to {}, got {:?}",
                u32::MAX,
                shorten(text)
            ))
        })
    }
}

/// The keys a [`Sealed`](crate::Sealed) store seals and opens values with:
/// one **current** key, which seals every value written, and any number of
/// older keys, which only open values sealed before a rotation.
///
/// Keys are 32 random bytes each ([`KeyRing::generate_key`] makes one).
/// The ring holds them only inside the ciphers, which wipe them when
/// dropped; the text and bytes they were read from are wiped after
/// parsing. `Debug` shows the key ids, never a key.
///
/// The text form, for an environment variable or a secret manager, is a
/// comma-separated list of `id:base64-key`, the **first entry the current
/// key**:
///
/// ```
/// use mcp_event_store_sealed::{KeyId, KeyRing};
///
/// let two = KeyRing::generate_key()?;
/// let one = KeyRing::generate_key()?;
/// let ring: KeyRing = format!("2:{},1:{}", *two, *one).parse()?;
/// assert_eq!(ring.current(), KeyId(2));
/// assert_eq!(ring.ids(), [KeyId(1), KeyId(2)]);
/// assert_eq!(format!("{ring:?}"), "KeyRing { current: 2, ids: [1, 2] }");
/// # Ok::<(), mcp_event_store_core::Error>(())
/// ```
pub struct KeyRing {
    current: KeyId,
    /// Sorted by id, each id once.
    keys: Vec<(KeyId, XChaCha20Poly1305)>,
}

impl KeyRing {
    /// A ring with one key, `id`, current. `key` must be [`KEY_BYTES`]
    /// long, else [`Error::Config`].
    pub fn new(id: KeyId, key: &[u8]) -> Result<Self> {
        Ok(Self {
            current: id,
            keys: vec![(id, cipher(id, key)?)],
        })
    }

    /// Adds an older key, read only: values sealed under `id` open again,
    /// none is sealed under it. A second key under one id is
    /// [`Error::Config`].
    pub fn with_old_key(mut self, id: KeyId, key: &[u8]) -> Result<Self> {
        let cipher = cipher(id, key)?;
        match self.keys.binary_search_by_key(&id, |(k, _)| *k) {
            Ok(_) => Err(Error::Config(format!(
                "key id {id} appears twice in the key ring"
            ))),
            Err(at) => {
                self.keys.insert(at, (id, cipher));
                Ok(self)
            }
        }
    }

    /// Reads the text form (see the [type docs](Self)): `id:base64-key`
    /// entries separated by commas, the first one current; spaces around
    /// entries are ignored, padding of the base64 is optional. Errors name
    /// the entry, never its key.
    pub fn parse(text: &str) -> Result<Self> {
        let mut ring: Option<Self> = None;
        for (at, entry) in text.split(',').enumerate() {
            let entry = entry.trim();
            let Some((id, key)) = entry.split_once(':') else {
                return Err(Error::Config(format!(
                    "key ring entry {} is not `id:base64-key`",
                    at + 1
                )));
            };
            let id: KeyId = id.parse()?;
            let key = decode_key(id, key.trim())?;
            ring = Some(match ring {
                None => Self::new(id, &key)?,
                Some(ring) => ring.with_old_key(id, &key)?,
            });
        }
        ring.ok_or_else(|| Error::Config("the key ring is empty".into()))
    }

    /// Reads the text form from the environment variable `var` (by
    /// convention [`KEYS_ENV`]); a missing variable is [`Error::Config`]
    /// naming it.
    pub fn from_env(var: &str) -> Result<Self> {
        let text = Zeroizing::new(std::env::var(var).map_err(|e| {
            Error::Config(format!("the key ring's environment variable {var}: {e}"))
        })?);
        Self::parse(&text)
    }

    /// A fresh key from the operating system's random source, in base64,
    /// ready for the text form; wiped when dropped.
    pub fn generate_key() -> Result<Zeroizing<String>> {
        let mut key = Zeroizing::new([0u8; KEY_BYTES]);
        getrandom::fill(&mut key[..])
            .map_err(|e| Error::Config(format!("the random source failed: {e}")))?;
        Ok(Zeroizing::new(data_encoding::BASE64.encode(&key[..])))
    }

    /// The key every value is sealed under.
    pub fn current(&self) -> KeyId {
        self.current
    }

    /// Every key id in the ring, in order.
    pub fn ids(&self) -> Vec<KeyId> {
        self.keys.iter().map(|(id, _)| *id).collect()
    }

    /// Whether the ring holds key `id`.
    pub fn contains(&self, id: KeyId) -> bool {
        self.cipher(id).is_some()
    }

    /// The current key's cipher.
    pub(crate) fn current_cipher(&self) -> &XChaCha20Poly1305 {
        self.cipher(self.current)
            .expect("the current key is always in the ring")
    }

    /// The cipher of key `id`, if the ring holds it.
    pub(crate) fn cipher(&self, id: KeyId) -> Option<&XChaCha20Poly1305> {
        self.keys
            .binary_search_by_key(&id, |(k, _)| *k)
            .ok()
            .map(|at| &self.keys[at].1)
    }
}

impl FromStr for KeyRing {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Ids<'a>(&'a KeyRing);
        impl fmt::Debug for Ids<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(self.0.keys.iter().map(|(id, _)| id.0))
                    .finish()
            }
        }
        f.debug_struct("KeyRing")
            .field("current", &self.current.0)
            .field("ids", &Ids(self))
            .finish()
    }
}

fn cipher(id: KeyId, key: &[u8]) -> Result<XChaCha20Poly1305> {
    if key.len() != KEY_BYTES {
        return Err(Error::Config(format!(
            "key {id} is {} bytes; a key is {KEY_BYTES} bytes (256 bits) of random data",
            key.len()
        )));
    }
    XChaCha20Poly1305::new_from_slice(key)
        .map_err(|_| Error::Config(format!("key {id} is not a valid key")))
}

fn decode_key(id: KeyId, text: &str) -> Result<Zeroizing<Vec<u8>>> {
    let text = text.trim_end_matches('=');
    let mut out = Zeroizing::new(vec![
        0u8;
        data_encoding::BASE64_NOPAD
            .decode_len(text.len())
            .map_err(|_| bad_base64(id))?
    ]);
    let len = data_encoding::BASE64_NOPAD
        .decode_mut(text.as_bytes(), &mut out)
        .map_err(|_| bad_base64(id))?;
    out.truncate(len);
    Ok(out)
}

fn bad_base64(id: KeyId) -> Error {
    Error::Config(format!("key {id} is not valid base64"))
}

/// Input quoted back in an error, shortened: it may be a mistyped key.
fn shorten(text: &str) -> String {
    let mut end = text.len().min(12);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end < text.len() {
        format!("{}...", &text[..end])
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> String {
        data_encoding::BASE64.encode(&[byte; KEY_BYTES])
    }

    #[test]
    fn the_text_form_names_the_current_key_first() {
        let ring = KeyRing::parse(&format!(" 7:{} , 3:{}", key(1), key(2))).unwrap();
        assert_eq!(ring.current(), KeyId(7));
        assert_eq!(ring.ids(), [KeyId(3), KeyId(7)]);
        assert!(ring.contains(KeyId(3)) && !ring.contains(KeyId(4)));
        // Padding is optional.
        let unpadded = key(1).trim_end_matches('=').to_owned();
        assert_eq!(
            KeyRing::parse(&format!("1:{unpadded}")).unwrap().ids(),
            [KeyId(1)]
        );
    }

    #[test]
    fn bad_rings_are_config_errors_that_never_quote_a_key() {
        let secret = key(9);
        for (text, says) in [
            (String::new(), "entry 1"),
            (format!("1:{secret},1:{secret}"), "twice"),
            (format!("x:{secret}"), "key id"),
            ("1:not*base64".to_owned(), "base64"),
            (
                format!("1:{}", data_encoding::BASE64.encode(&[0; 16])),
                "16 bytes",
            ),
            (secret.clone(), "not `id:base64-key`"),
        ] {
            let error = KeyRing::parse(&text).unwrap_err();
            let message = error.to_string();
            assert_eq!(error.kind(), "config", "{message}");
            assert!(message.contains(says), "{text:?}: {message}");
            assert!(!message.contains(&secret[..12]), "{message}");
        }
    }

    #[test]
    fn debug_shows_ids_only() {
        let ring = KeyRing::new(KeyId(1), &[0x41; KEY_BYTES])
            .unwrap()
            .with_old_key(KeyId(0), &[0x42; KEY_BYTES])
            .unwrap();
        let shown = format!("{ring:?} {ring:#?}");
        assert!(
            !shown.contains("AAAA") && !shown.contains("65, 65"),
            "{shown}"
        );
        assert!(shown.starts_with("KeyRing { current: 1, ids: [0, 1] }"));
    }

    #[test]
    fn generated_keys_are_fresh_and_parse() {
        let (a, b) = (
            KeyRing::generate_key().unwrap(),
            KeyRing::generate_key().unwrap(),
        );
        assert_ne!(*a, *b);
        assert!(KeyRing::parse(&format!("1:{}", *a)).is_ok());
    }
}
