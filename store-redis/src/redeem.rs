//! Redemptions (C21): one string key per redeemed nonce, named by its
//! digest, set if absent with Redis's own expiry (`SET key v NX PXAT`), so
//! the server forgets it by itself and `purge_expired` has nothing to do.

use async_trait::async_trait;
use mcp_event_store_core::Result;
use mcp_event_store_core::backend::{RedeemBackend, RedeemKey};
use redis::Value;

use crate::RedisStore;
use crate::error::backend;

#[async_trait]
impl RedeemBackend for RedisStore {
    /// `SET <prefix>:r1:{<digest>} <forget_at> NX PXAT <forget_at>`: one
    /// key, so one slot on a cluster, and one command, atomic on its
    /// master; `OK` when this call set it, nil when it was there. Followed
    /// in the same round trip by `WAIT` when appends wait for replicas, and
    /// refused as they are when too few acknowledged (the nonce then reads
    /// as redeemed to a retry: at most once, never twice). Never retried:
    /// a lost reply leaves the nonce redeemed or not, and the caller
    /// refuses either way.
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
        let name = self.inner.keys.redeemed(key);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&name)
            .arg(forget_at)
            .arg("NX")
            .arg("PXAT")
            .arg(forget_at);
        let mut conn = self.conn();
        let set = match self.wait() {
            Some((replicas, ms)) => {
                pipe.cmd("WAIT").arg(replicas).arg(ms);
                let (set, acked): (Value, u32) =
                    pipe.query_async(&mut conn).await.map_err(backend)?;
                self.check_wait(Some(acked), "the redemption")?;
                set
            }
            None => {
                let (set,): (Value,) = pipe.query_async(&mut conn).await.map_err(backend)?;
                set
            }
        };
        Ok(!matches!(set, Value::Nil))
    }
}
