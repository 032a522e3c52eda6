//! Values redeemed once (C21): a nonce that must be consumed at most once,
//! across every instance sharing the store.
//!
//! The 2026-07-28 MCP revision's multi-round-trip requests (SEP-2322) hand
//! the client a `requestState` that it echoes back on its retry. A server
//! that signs the state (rmcp's `RequestStateCodec`) knows it made it, but
//! not that it was not used before: "servers for which a given
//! `requestState` must be consumed at most once MUST enforce that invariant
//! server-side". Behind a load balancer, that memory has to be shared.
//! [`RedeemStore::redeem`] is it: the first redemption of a nonce wins, on
//! whichever instance, and every later one is refused.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::{Duration, SystemTime};
//! use mcp_event_store_core::task::Owner;
//! use mcp_event_store_core::{MemoryStore, RedeemStore, Redemption, Store};
//!
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
//! let redeemer = store.redeemer().expect("every store of this project redeems");
//! let alice = Owner::principal(b"alice")?;
//! // The nonce and its expiry travel inside the signed state.
//! let (nonce, expires_at) = (b"7f3a9c0e5d1b", SystemTime::now() + Duration::from_secs(300));
//! assert_eq!(redeemer.redeem(nonce, expires_at, &alice).await?, Redemption::Redeemed);
//! // The same state replayed, to this instance or any other: refused.
//! assert_eq!(redeemer.redeem(nonce, expires_at, &alice).await?, Redemption::AlreadyRedeemed);
//! // Another principal's nonce space is its own.
//! let bob = Owner::principal(b"bob")?;
//! assert!(redeemer.redeem(nonce, expires_at, &bob).await?.is_first());
//! # Ok(()) }
//! ```
//!
//! # Choices
//!
//! * **An absolute expiry, not a ttl.** The nonce must be remembered until
//!   the state that carries it stops being accepted, which is a time fixed
//!   when the state was sealed (and sealed inside it), not a time relative
//!   to whenever the redemption happens to run. With an absolute time a
//!   retried redemption asks for the same thing as the first, and a state
//!   already past it is refused without a write.
//! * **A past expiry is refused, [`Redemption::Expired`].** So forgetting a
//!   nonce once its expiry passed (what keeps the storage bounded) can
//!   never make it redeemable again: every later redemption of it is past
//!   its expiry too. The expiry must therefore be the nonce's own, sealed
//!   beside it; a caller that made up a fresh expiry for an old nonce would
//!   defeat this.
//! * **Forgotten a grace after the expiry.** A record is kept until
//!   [`REDEEM_GRACE`] after its expiry, so instances whose clocks disagree
//!   by up to that much still agree that it is gone only once every one of
//!   them refuses it as expired.
//! * **Keyed per principal, by digest.** A nonce is a bearer value: the
//!   store keeps only the SHA-256 of the principal's digest and the nonce
//!   (under a domain of its own), never the nonce. And one caller cannot
//!   burn another's nonce: the same nonce under two principals is two
//!   redemptions.
//! * **Refusals a client causes are answers; mistakes are errors.** An
//!   already redeemed or expired nonce is an [`Ok`] answer the server turns
//!   into one refusal; an empty or oversized nonce, or an expiry beyond
//!   [`MAX_REDEEM_HORIZON`], is [`Error::Config`](crate::Error::Config): the
//!   server built the state wrongly.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::Result;
use crate::task::Owner;

/// The longest nonce, in bytes. A nonce is 1 to 256 bytes; 16 random bytes
/// are plenty.
pub const MAX_NONCE_BYTES: usize = 256;

/// How far in the future an expiry may be: 24 hours. An expiry beyond it is
/// [`Error::Config`](crate::Error::Config). It bounds how long a record can
/// be kept, and on a backend without a ttl per key (NATS) it is how long
/// every record is kept.
pub const MAX_REDEEM_HORIZON: Duration = Duration::from_secs(24 * 60 * 60);

/// How long after its expiry a record is still kept: 5 minutes, the clock
/// skew between instances the store tolerates (see the module docs).
pub const REDEEM_GRACE: Duration = Duration::from_secs(5 * 60);

/// What [`RedeemStore::redeem`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "only `Redeemed` lets the request through"]
pub enum Redemption {
    /// This call redeemed the nonce: the first, and the only one.
    Redeemed,
    /// The nonce was redeemed before (by this handle or any other sharing
    /// the storage): refuse the request.
    AlreadyRedeemed,
    /// The expiry is not in the future by the store's clock: refused, and
    /// nothing was stored.
    Expired,
}

impl Redemption {
    /// Whether this call redeemed the nonce ([`Redemption::Redeemed`]):
    /// the only answer that lets the request through.
    pub fn is_first(self) -> bool {
        self == Redemption::Redeemed
    }
}

/// Single use of a nonce, shared by every handle and process on the
/// storage (C21).
///
/// Every store of this project implements it, and an
/// `Arc<dyn `[`Store`](crate::Store)`>` reaches it through
/// [`EventStore::redeemer`](crate::EventStore::redeemer). The trait is
/// object safe: hold it as `Arc<dyn RedeemStore>`.
#[async_trait]
pub trait RedeemStore: Send + Sync + 'static {
    /// Redeems `nonce` for `principal`, once: [`Redemption::Redeemed`] for
    /// the first call on the storage, [`Redemption::AlreadyRedeemed`] for
    /// every later one, from any handle or process, until the record is
    /// forgotten ([`REDEEM_GRACE`] after `expires_at`, by which time every
    /// call is refused as [`Redemption::Expired`]).
    ///
    /// `expires_at` is the nonce's own expiry (sealed with it): at or
    /// before now, by the store's clock, the answer is
    /// [`Redemption::Expired`] and nothing is stored.
    ///
    /// # Errors
    ///
    /// [`Error::Config`](crate::Error::Config) for an empty nonce, one over
    /// [`MAX_NONCE_BYTES`], or an expiry more than [`MAX_REDEEM_HORIZON`]
    /// ahead, with nothing stored; [`Error::Closed`](crate::Error::Closed)
    /// once the store is closed; a backend error when the storage could not
    /// say (the nonce may or may not be redeemed then: refuse the request).
    async fn redeem(
        &self,
        nonce: &[u8],
        expires_at: SystemTime,
        principal: &Owner,
    ) -> Result<Redemption>;
}
