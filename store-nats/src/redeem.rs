//! Redemptions (C21) in the key-value bucket `<prefix>-redeemed`: one key
//! per redeemed nonce, its digest in hex, created only if absent. NATS 2.9
//! has no ttl per key: the bucket's age limit (the horizon plus the grace,
//! `setup::REDEEM_MAX_AGE`) removes every record that long after its
//! write, which bounds the bucket and never forgets a record before its
//! time; `purge_expired` has nothing to do.

use async_nats::jetstream::kv;
use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::Result;
use mcp_event_store_core::backend::{RedeemBackend, RedeemKey};

use crate::NatsStore;
use crate::error::{backend, is_conflict};

#[async_trait]
impl RedeemBackend for NatsStore {
    /// The bucket's `create`: a publish that expects the key's subject to
    /// have no message yet (`Nats-Expected-Last-Subject-Sequence: 0`),
    /// which of racing creates exactly one passes (JetStream orders them on
    /// the stream's leader; a cluster needs 2.9.21, as the crate requires).
    /// The value is the time the record may be forgotten. Acknowledged by
    /// JetStream (a quorum with replicas) before it answers.
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
        let value = Bytes::copy_from_slice(&forget_at.to_le_bytes());
        match self.inner.redeemed.create(key.to_hex(), value).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || is_conflict(&e) => {
                Ok(false)
            }
            Err(e) => Err(backend(e)),
        }
    }
}
