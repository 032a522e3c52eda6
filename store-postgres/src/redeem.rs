//! Redemptions (C21): a row per redeemed nonce in the schema's `redeemed`
//! table, keyed by its digest and inserted if absent; rows past their time
//! go in `purge_expired` (see [`crate::purge`]).

use async_trait::async_trait;
use sqlx::Executor;

use mcp_event_store_core::Result;
use mcp_event_store_core::backend::{RedeemBackend, RedeemKey};

use crate::PostgresStore;
use crate::error::backend;

#[async_trait]
impl RedeemBackend for PostgresStore {
    /// One `INSERT ... ON CONFLICT DO NOTHING`, committed before it
    /// answers: whether it inserted the row.
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
        let done = self
            .pool()
            .execute(
                sqlx::query(self.sql().redeem.clone())
                    .bind(&key.as_bytes()[..])
                    .bind(forget_at),
            )
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() == 1)
    }
}
