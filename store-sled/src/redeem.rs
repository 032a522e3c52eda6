//! Redemptions (C21): a redeemed nonce's digest in `r1/redeemed`, set by
//! compare-and-swap from absent, with an entry in `r1/redeem_expiry` the
//! purge walks to forget it once its time has passed.

use async_trait::async_trait;
use mcp_event_store_core::Result;
use mcp_event_store_core::backend::{RedeemBackend, RedeemKey};

use crate::SledStore;
use crate::error::backend;
use crate::keys::{self, REDEEM_KEY_LEN};
use crate::purge::PURGE_BATCH;
use crate::shared::{Shared, blocking};

#[async_trait]
impl RedeemBackend for SledStore {
    /// The compare-and-swap on the blocking pool; when it stored the
    /// record, waits for the flush the handle's durability asks for before
    /// answering.
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
        let shared = self.shared()?;
        let key = *key.as_bytes();
        let forget_at = keys::encode_time(forget_at);
        let redeemed = blocking({
            let shared = shared.clone();
            move || shared.redeem(&key, forget_at)
        })
        .await?;
        if redeemed {
            self.settle(self.flush_after_write(&shared)).await?;
        }
        Ok(redeemed)
    }
}

impl Shared {
    /// Stores `key` unless it is there (a read refuses one that is, with no
    /// write): its expiry entry first, so a crash
    /// never leaves a record the purge cannot find, then the record by
    /// compare-and-swap from absent, which of racing calls exactly one
    /// wins. A loser removes the expiry entry it added, unless it is the
    /// winner's too (the same time).
    pub(crate) fn redeem(&self, key: &[u8; REDEEM_KEY_LEN], forget_at: u64) -> Result<bool> {
        // A nonce redeemed before is refused by a read, with no write; the
        // compare-and-swap below still decides any race.
        if self.redeemed.contains_key(key).map_err(backend)? {
            return Ok(false);
        }
        let entry = keys::redeem_expiry_key(forget_at, key);
        self.redeem_expiry.insert(entry, &[]).map_err(backend)?;
        let stored = self
            .redeemed
            .compare_and_swap(key, None::<&[u8]>, Some(&forget_at.to_be_bytes()[..]))
            .map_err(backend)?;
        match stored {
            Ok(()) => Ok(true),
            Err(current) => {
                let theirs = current.current.as_deref().map(keys::redeem_forget_at);
                if !matches!(theirs, Some(Ok(at)) if at == forget_at) {
                    self.redeem_expiry.remove(entry).map_err(backend)?;
                }
                Ok(false)
            }
        }
    }

    /// Forgets redemptions whose time is at or before `now`, in batches:
    /// each expiry entry goes, with its record if the record still names
    /// that time.
    pub(crate) fn purge_redeemed(&self, now: u64) -> Result<u64> {
        let end = now.saturating_add(1).to_be_bytes();
        let mut removed = 0;
        loop {
            let batch: Vec<sled::IVec> = self
                .redeem_expiry
                .range(..end.to_vec())
                .keys()
                .take(PURGE_BATCH)
                .collect::<Result<_, _>>()
                .map_err(backend)?;
            if batch.is_empty() {
                return Ok(removed);
            }
            for entry in batch {
                let (forget_at, key) = keys::parse_redeem_expiry_key(&entry)?;
                let record = forget_at.to_be_bytes();
                let gone = self
                    .redeemed
                    .compare_and_swap(key, Some(&record[..]), None::<&[u8]>)
                    .map_err(backend)?;
                if gone.is_ok() {
                    removed += 1;
                }
                self.redeem_expiry.remove(&entry).map_err(backend)?;
            }
        }
    }
}
