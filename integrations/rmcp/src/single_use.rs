//! MRTR request states accepted once across every instance (C21).
//!
//! rmcp's `RequestStateCodec` signs a `requestState` with a key ring the
//! replicas share, so any instance can open what any other sealed; it does
//! not remember what it opened. SEP-2322: "servers for which a given
//! `requestState` must be consumed at most once MUST enforce that invariant
//! server-side". [`SingleUseStates`] does, over the store the instances
//! share: it seals a fresh nonce and the state's expiry in with the
//! payload, and opening a state redeems that nonce in the store
//! ([`RedeemStore`](mcp_event_store_core::RedeemStore)), so the first
//! instance to open a state gets its payload and every later open, on any
//! instance, is refused.
//!
//! # What the sealed payload holds
//!
//! The codec's sealed body is its own expiry and the payload it is given,
//! with no nonce and no way to read the expiry back, so the payload this
//! type hands the codec is an envelope of its own, authenticated with the
//! rest: a version byte (`1`), 16 bytes from the OS CSPRNG (the nonce), the
//! expiry (milliseconds since the epoch, big-endian), then the
//! application's payload. The codec gets the same time to live, so it
//! refuses an expired state before the store is asked. A state sealed by
//! the codec directly (not through this type) opens as
//! [`SingleUseError::NotSingleUse`]: it carries no nonce to redeem.
//!
//! The nonce is redeemed under the caller's [`Owner`], so one principal
//! cannot burn another's state (bind the state to its principal with the
//! associated data too, as the codec recommends), and the store keeps only
//! a digest of it. A state's time to live is at most
//! [`MAX_REDEEM_HORIZON`] (24 hours).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_event_store_core::task::Owner;
use mcp_event_store_core::{EventStore, MAX_REDEEM_HORIZON, Redemption, Store};
use rmcp::ErrorData;
use rmcp::model::{RequestStateCodec, RequestStateError, SealOptions};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The envelope's version byte.
const ENVELOPE_VERSION: u8 = 1;
/// The nonce's length: 128 bits from the OS CSPRNG.
const NONCE_LEN: usize = 16;
/// Version, nonce, expiry.
const HEADER_LEN: usize = 1 + NONCE_LEN + 8;

/// Why a state was not opened, or not sealed.
///
/// Every refusal a client can cause ([`is_refusal`](Self::is_refusal):
/// forged, altered, expired, already used, not single-use) must reach the
/// client as one error, as rmcp's codec asks; `From<SingleUseError> for
/// ErrorData` does that (`invalid_params`, one message), and a store
/// failure becomes an internal error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SingleUseError {
    /// The codec refused the state: malformed, forged, altered, sealed for
    /// other associated data or under an unknown key, expired; or the JSON
    /// payload did not (de)serialize.
    #[error("request state refused: {0}")]
    Invalid(#[from] RequestStateError),
    /// The state opened but was not sealed by [`SingleUseStates`]: it
    /// carries no nonce.
    #[error("request state is not a single-use state")]
    NotSingleUse,
    /// The state was opened before, on this instance or another.
    #[error("request state was already used")]
    AlreadyRedeemed,
    /// The state's expiry has passed by the store's clock.
    #[error("request state has expired")]
    Expired,
    /// The time to live asked for at sealing is zero or over
    /// [`MAX_REDEEM_HORIZON`].
    #[error("a single-use state lives 1 ms to {max} s, not {0:?}", max = MAX_REDEEM_HORIZON.as_secs())]
    Lifetime(Duration),
    /// The store failed, or offers no redemptions (a wrapper that does not
    /// forward [`EventStore::redeemer`]): the state may or may not be spent;
    /// it was not accepted.
    #[error("the store could not redeem the request state: {0}")]
    Store(#[from] mcp_event_store_core::Error),
}

impl SingleUseError {
    /// Whether the client caused it (anything but [`Store`](Self::Store)
    /// and [`Lifetime`](Self::Lifetime)): answer it as an invalid request.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Store(_) | Self::Lifetime(_))
    }
}

impl From<SingleUseError> for ErrorData {
    fn from(e: SingleUseError) -> Self {
        if e.is_refusal() {
            tracing::debug!(error = %e, "request state refused");
            ErrorData::invalid_params("invalid or already used request state", None)
        } else {
            tracing::warn!(error = %e, "request state could not be handled");
            ErrorData::internal_error("request state could not be handled", None)
        }
    }
}

/// Request states that are accepted once, across every instance sharing
/// the store: rmcp's `RequestStateCodec` (the key ring every replica has)
/// beside the store's redemptions (C21).
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn mcp_event_store_core::Store>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use mcp_event_store_core::task::Owner;
/// use mcp_event_store_rmcp::SingleUseStates;
/// use rmcp::model::{InputRequiredResult, RequestStateCodec};
///
/// // let store = mcp_event_store::connect("postgres://app@db/app").await?;
/// let codec = RequestStateCodec::try_new(b"the-32-byte-key-every-replica-has".to_vec())?;
/// let states = SingleUseStates::new(codec, store);
///
/// // Round one, on any instance: ask for input, with the state sealed.
/// let alice = Owner::principal(b"alice")?;
/// let state = states.seal(b"transfer 100 to bob", Duration::from_secs(300), b"alice|pay")?;
/// let _ = InputRequiredResult::from_request_state(state.clone());
///
/// // Round two, on whichever instance the retry reaches: the payload, once.
/// let payload = states.open(&state, b"alice|pay", &alice).await?;
/// assert_eq!(payload, b"transfer 100 to bob");
/// // The same state again, here or anywhere: refused.
/// assert!(states.open(&state, b"alice|pay", &alice).await.is_err());
/// # Ok(()) }
/// ```
pub struct SingleUseStates<S: ?Sized = dyn Store> {
    codec: RequestStateCodec,
    store: Arc<S>,
}

impl<S: ?Sized> Clone for SingleUseStates<S> {
    fn clone(&self) -> Self {
        Self {
            codec: self.codec.clone(),
            store: self.store.clone(),
        }
    }
}

impl<S: ?Sized> std::fmt::Debug for SingleUseStates<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SingleUseStates")
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

impl<S: EventStore + ?Sized> SingleUseStates<S> {
    /// States sealed and opened with `codec`, redeemed in `store` (any of
    /// ours, an `Arc<dyn Store>` from `connect` included).
    pub fn new(codec: RequestStateCodec, store: Arc<S>) -> Self {
        Self { codec, store }
    }

    /// The codec, for states that need not be single-use.
    pub fn codec(&self) -> &RequestStateCodec {
        &self.codec
    }

    /// Seals `payload` into a `requestState` that [`open`](Self::open)
    /// accepts once, for `ttl`, bound to `associated_data` (the codec's:
    /// the principal and a digest of the request, say; `b""` for none).
    ///
    /// # Errors
    ///
    /// [`SingleUseError::Lifetime`] for a `ttl` of zero or over
    /// [`MAX_REDEEM_HORIZON`]; [`SingleUseError::Store`] if the OS has no
    /// randomness to give.
    pub fn seal(
        &self,
        payload: &[u8],
        ttl: Duration,
        associated_data: &[u8],
    ) -> Result<String, SingleUseError> {
        if ttl.is_zero() || ttl > MAX_REDEEM_HORIZON {
            return Err(SingleUseError::Lifetime(ttl));
        }
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| {
            SingleUseError::Store(mcp_event_store_core::Error::Config(format!(
                "no OS randomness: {e}"
            )))
        })?;
        let expires_at = SystemTime::now() + ttl;
        let millis = expires_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut envelope = Vec::with_capacity(HEADER_LEN + payload.len());
        envelope.push(ENVELOPE_VERSION);
        envelope.extend_from_slice(&nonce);
        envelope.extend_from_slice(&millis.to_be_bytes());
        envelope.extend_from_slice(payload);
        let options = SealOptions::new().associated_data(associated_data).ttl(ttl);
        Ok(self.codec.seal_with(&envelope, &options))
    }

    /// [`seal`](Self::seal) of `value` as JSON.
    ///
    /// # Errors
    ///
    /// As [`seal`](Self::seal), and [`SingleUseError::Invalid`] if `value`
    /// does not serialize.
    pub fn seal_json<T: Serialize>(
        &self,
        value: &T,
        ttl: Duration,
        associated_data: &[u8],
    ) -> Result<String, SingleUseError> {
        let payload = serde_json::to_vec(value).map_err(RequestStateError::Serialization)?;
        self.seal(&payload, ttl, associated_data)
    }

    /// Opens `sealed` (checked by the codec against `associated_data`) and
    /// redeems its nonce for `principal`: the payload the first time, on
    /// whichever instance; [`SingleUseError::AlreadyRedeemed`] every time
    /// after, on every instance sharing the store.
    ///
    /// # Errors
    ///
    /// [`SingleUseError::Invalid`] when the codec refuses the state,
    /// [`SingleUseError::NotSingleUse`] for a state not sealed by
    /// [`seal`](Self::seal), [`SingleUseError::AlreadyRedeemed`] and
    /// [`SingleUseError::Expired`] (all refusals: answer them as one), and
    /// [`SingleUseError::Store`] when the store could not say.
    pub async fn open(
        &self,
        sealed: &str,
        associated_data: &[u8],
        principal: &Owner,
    ) -> Result<Vec<u8>, SingleUseError> {
        let mut envelope = self.codec.open_with(sealed, associated_data)?;
        if envelope.len() < HEADER_LEN || envelope[0] != ENVELOPE_VERSION {
            return Err(SingleUseError::NotSingleUse);
        }
        let nonce = &envelope[1..1 + NONCE_LEN];
        let millis = u64::from_be_bytes(
            envelope[1 + NONCE_LEN..HEADER_LEN]
                .try_into()
                .expect("eight bytes"),
        );
        let expires_at = UNIX_EPOCH + Duration::from_millis(millis);
        let redeemer = self.store.redeemer().ok_or_else(|| {
            mcp_event_store_core::Error::Config(
                "the store offers no redemptions (EventStore::redeemer is None)".into(),
            )
        })?;
        match redeemer.redeem(nonce, expires_at, principal).await? {
            Redemption::Redeemed => {
                envelope.drain(..HEADER_LEN);
                Ok(envelope)
            }
            Redemption::AlreadyRedeemed => Err(SingleUseError::AlreadyRedeemed),
            Redemption::Expired => Err(SingleUseError::Expired),
        }
    }

    /// [`open`](Self::open), then the payload as JSON.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), and [`SingleUseError::Invalid`] if the
    /// payload is not `T` (the state is spent then all the same).
    pub async fn open_json<T: DeserializeOwned>(
        &self,
        sealed: &str,
        associated_data: &[u8],
        principal: &Owner,
    ) -> Result<T, SingleUseError> {
        let payload = self.open(sealed, associated_data, principal).await?;
        serde_json::from_slice(&payload)
            .map_err(|e| SingleUseError::Invalid(RequestStateError::Deserialization(e)))
    }
}

#[cfg(test)]
mod tests;
