//! The redemption bench's baseline (C21): the database's own
//! insert-if-absent, done by hand with the raw driver ([`RawRedeem`]), and
//! what it shares with the store's calls (the nonces, their principal and
//! expiry).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use mcp_event_store_core::REDEEM_GRACE;
use mcp_event_store_core::backend::RedeemKey;
use mcp_event_store_core::task::Owner;

use super::now_millis;

/// How long the benches' nonces live: 5 minutes, an MRTR round's time.
pub const LIFETIME: Duration = Duration::from_secs(300);

/// Draws the benches' nonces: 24 bytes, a random prefix for the run and a
/// counter, so no two calls (store or raw, this run or an earlier one on
/// the same storage) share one.
#[derive(Debug)]
pub struct Nonces {
    run: [u8; 16],
    next: AtomicU64,
}

impl Nonces {
    /// A source for one run.
    pub fn new() -> Self {
        let run = *mcp_event_store_core::task::TaskId::generate()
            .expect("OS randomness")
            .digest()
            .as_bytes();
        Self {
            run,
            next: AtomicU64::new(0),
        }
    }

    /// The next nonce.
    pub fn next(&self) -> [u8; 24] {
        let mut nonce = [0u8; 24];
        nonce[..16].copy_from_slice(&self.run);
        nonce[16..].copy_from_slice(&self.next.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        nonce
    }
}

impl Default for Nonces {
    fn default() -> Self {
        Self::new()
    }
}

/// The principal the benches redeem for.
pub fn principal() -> Owner {
    Owner::principal(b"bench").expect("a principal")
}

/// A nonce's expiry, as the store is handed it: [`LIFETIME`] from now.
pub fn expires_at() -> SystemTime {
    SystemTime::now() + LIFETIME
}

/// What a raw redemption stores beside its key, as the store does: the
/// time the record may go (the expiry plus the grace), in milliseconds.
pub fn forget_at() -> i64 {
    now_millis() + (LIFETIME + REDEEM_GRACE).as_millis() as i64
}

/// The key of `nonce` as the store computes it (SHA-256 of the
/// principal's digest and the nonce), so a raw redemption pays for the
/// same hash.
pub fn key(nonce: &[u8], principal: &Owner) -> RedeemKey {
    RedeemKey::of(nonce, principal)
}

/// A raw redemption: the database's own insert-if-absent of one key, by
/// hand with the driver, durable as the store's is at its default setting.
pub trait RawRedeem: Send + Sync {
    /// Stores `key` unless it is there, with `forget_at` beside it (and
    /// the database's own expiry where it has one); whether this call
    /// stored it.
    fn redeem(&self, key: &RedeemKey, forget_at: i64) -> impl Future<Output = bool> + Send;

    /// Releases what the baseline holds (a pool), once the cases are done.
    fn close(self) -> impl Future<Output = ()>
    where
        Self: Sized,
    {
        async {}
    }
}
