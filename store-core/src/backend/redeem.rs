//! The redemption side of a backend (C21): what
//! [`RedeemStore`] needs from the database, one
//! insert-if-absent.
//!
//! [`RedeemStore::redeem`] is written once, here, over
//! [`RedeemBackend::redeem_once`]: the closed check, the nonce and expiry
//! checks, the digest that keys the record, and the span and metrics. A
//! backend receives only the record's [`RedeemKey`] and the time it may
//! forget it, and inserts the key unless it is there, atomically across
//! every handle and process on the storage.
//!
//! ```
//! # use std::collections::HashMap;
//! # use std::sync::Mutex;
//! # use std::time::{Duration, SystemTime};
//! use async_trait::async_trait;
//! use mcp_event_store_core::backend::{BackendHandle, RedeemBackend, RedeemKey};
//! use mcp_event_store_core::task::Owner;
//! use mcp_event_store_core::{RedeemStore, Redemption, Result, StoreOptions};
//!
//! /// Redemptions in a map: the backend's part is the insert-if-absent.
//! struct InMap(StoreOptions, Mutex<HashMap<RedeemKey, i64>>);
//!
//! impl BackendHandle for InMap {
//!     const NAME: &'static str = "in-map";
//!     fn store_options(&self) -> &StoreOptions { &self.0 }
//!     fn is_closed(&self) -> bool { false }
//! }
//!
//! #[async_trait]
//! impl RedeemBackend for InMap {
//!     async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
//!         let mut map = self.1.lock().unwrap();
//!         Ok(map.insert(*key, forget_at).is_none())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let store = InMap(StoreOptions::default(), Mutex::default());
//! let soon = SystemTime::now() + Duration::from_secs(60);
//! assert!(store.redeem(b"n-1", soon, &Owner::Anonymous).await?.is_first());
//! // The checks come from core: an empty nonce never reaches the backend.
//! assert!(store.redeem(b"", soon, &Owner::Anonymous).await.is_err());
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use data_encoding::HEXLOWER;
use sha2::{Digest, Sha256};

use crate::backend::jobs::{BackendHandle, ensure_open};
use crate::backend::observe;
use crate::error::{Error, Result};
use crate::redeem::{MAX_NONCE_BYTES, MAX_REDEEM_HORIZON, REDEEM_GRACE, RedeemStore, Redemption};
use crate::task::Owner;

/// What the digest of a redemption starts with, so that it never equals a
/// digest of another domain (a task's, an owner's, a session's).
const REDEEM_DOMAIN: &[u8] = b"mcp-event-store/redeem\0";

/// The key a redemption is stored under (C21): SHA-256 of the principal
/// and the nonce under a domain of their own, so the store never holds the
/// nonce (a bearer value) and one principal's nonce never collides with
/// another's.
///
/// The digest is of the domain, a byte saying whether a principal follows
/// (0 for [`Owner::Anonymous`], 1 for a principal), the principal's
/// 16-byte digest if any, and the nonce: each part's length is known from
/// the part before it, so no two (principal, nonce) pairs share an input.
///
/// ```
/// use mcp_event_store_core::backend::RedeemKey;
/// use mcp_event_store_core::task::Owner;
///
/// let alice = Owner::principal(b"alice").unwrap();
/// let key = RedeemKey::of(b"nonce", &alice);
/// assert_eq!(key, RedeemKey::of(b"nonce", &alice));
/// assert_ne!(key, RedeemKey::of(b"nonce", &Owner::Anonymous));
/// assert_eq!(key.to_hex().len(), 64);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RedeemKey([u8; 32]);

impl RedeemKey {
    /// The key of `nonce` redeemed by `principal`.
    pub fn of(nonce: &[u8], principal: &Owner) -> Self {
        let mut hash = Sha256::new().chain_update(REDEEM_DOMAIN);
        match principal.digest() {
            None => hash.update([0]),
            Some(digest) => {
                hash.update([1]);
                hash.update(digest);
            }
        }
        Self(hash.chain_update(nonce).finalize().into())
    }

    /// The digest's 32 bytes, as binary stores keep it.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest as 64 lowercase hex digits, as text stores (key names,
    /// subjects) keep it.
    pub fn to_hex(&self) -> String {
        HEXLOWER.encode(&self.0)
    }
}

impl fmt::Debug for RedeemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedeemKey({}…)", HEXLOWER.encode(&self.0[..4]))
    }
}

/// The redemption side of a backend (C21). Every input is checked before
/// [`redeem_once`](Self::redeem_once) is called (see the [module
/// docs](self)).
#[async_trait]
pub trait RedeemBackend: BackendHandle {
    /// Stores `key` unless it is stored, atomically across every handle
    /// and process on the storage, durably under the store's durability
    /// setting before it returns; `true` when this call stored it.
    ///
    /// The record may be forgotten once `forget_at` (milliseconds since
    /// the epoch by the store's clock: the expiry plus [`REDEEM_GRACE`])
    /// has passed, and must be kept until then. A backend with a ttl per
    /// key hands it that; one without removes records in
    /// [`purge_expired`](crate::EventStore::purge_expired), counting them
    /// in [`PurgeReport::redemptions`](crate::PurgeReport::redemptions).
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool>;
}

/// Milliseconds since the epoch of `at`; a time before the epoch is
/// negative, so it is in the past for every clock.
fn millis(at: SystemTime) -> i64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The checks of a redemption, against the store's clock `now`: the
/// record's key and when it may be forgotten, or `None` when the expiry
/// has passed.
///
/// # Errors
///
/// [`Error::Config`] for an empty or oversized nonce, or an expiry beyond
/// [`MAX_REDEEM_HORIZON`].
pub fn check_redeem(
    nonce: &[u8],
    expires_at: SystemTime,
    principal: &Owner,
    now: i64,
) -> Result<Option<(RedeemKey, i64)>> {
    if nonce.is_empty() || nonce.len() > MAX_NONCE_BYTES {
        return Err(Error::Config(format!(
            "a nonce to redeem is 1 to {MAX_NONCE_BYTES} bytes, got {}",
            nonce.len()
        )));
    }
    let expires_at = millis(expires_at);
    if expires_at <= now {
        return Ok(None);
    }
    let horizon = i64::try_from(MAX_REDEEM_HORIZON.as_millis()).unwrap_or(i64::MAX);
    if expires_at - now > horizon {
        return Err(Error::Config(format!(
            "a nonce's expiry is at most {} s ahead (MAX_REDEEM_HORIZON), got {} s",
            MAX_REDEEM_HORIZON.as_secs(),
            (expires_at - now) / 1000
        )));
    }
    let grace = i64::try_from(REDEEM_GRACE.as_millis()).unwrap_or(i64::MAX);
    Ok(Some((
        RedeemKey::of(nonce, principal),
        expires_at.saturating_add(grace),
    )))
}

#[async_trait]
impl<B: RedeemBackend> RedeemStore for B {
    async fn redeem(
        &self,
        nonce: &[u8],
        expires_at: SystemTime,
        principal: &Owner,
    ) -> Result<Redemption> {
        observe::redeem(B::NAME, async {
            ensure_open(self)?;
            let Some((key, forget_at)) =
                check_redeem(nonce, expires_at, principal, self.now_millis())?
            else {
                return Ok(Redemption::Expired);
            };
            Ok(if self.redeem_once(&key, forget_at).await? {
                Redemption::Redeemed
            } else {
                Redemption::AlreadyRedeemed
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_key_is_the_documented_digest() {
        let alice = Owner::principal(b"alice").unwrap();
        let mut expected = Sha256::new();
        expected.update(REDEEM_DOMAIN);
        expected.update([1]);
        expected.update(alice.digest().unwrap());
        expected.update(b"n");
        assert_eq!(
            RedeemKey::of(b"n", &alice).as_bytes()[..],
            expected.finalize()[..]
        );
        let anonymous = Sha256::new()
            .chain_update(REDEEM_DOMAIN)
            .chain_update([0])
            .chain_update(b"n")
            .finalize();
        assert_eq!(
            RedeemKey::of(b"n", &Owner::Anonymous).as_bytes()[..],
            anonymous[..]
        );
    }

    #[test]
    fn the_checks_refuse_and_bound() {
        let now = 1_000_000_000;
        let at = |ms: i64| UNIX_EPOCH + Duration::from_millis(ms as u64);
        let who = Owner::Anonymous;
        assert!(matches!(
            check_redeem(b"", at(now + 1), &who, now),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            check_redeem(&[0; MAX_NONCE_BYTES + 1], at(now + 1), &who, now),
            Err(Error::Config(_))
        ));
        assert!(
            check_redeem(&[0; MAX_NONCE_BYTES], at(now + 1), &who, now)
                .unwrap()
                .is_some()
        );
        assert_eq!(check_redeem(b"n", at(now), &who, now).unwrap(), None);
        assert_eq!(
            check_redeem(b"n", UNIX_EPOCH - Duration::from_secs(1), &who, now).unwrap(),
            None
        );
        let horizon = MAX_REDEEM_HORIZON.as_millis() as i64;
        let (_, forget_at) = check_redeem(b"n", at(now + horizon), &who, now)
            .unwrap()
            .unwrap();
        assert_eq!(forget_at, now + horizon + REDEEM_GRACE.as_millis() as i64);
        assert!(matches!(
            check_redeem(b"n", at(now + horizon + 1), &who, now),
            Err(Error::Config(_))
        ));
    }
}
