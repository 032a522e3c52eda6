//! Redemptions (C21): a row per redeemed nonce in `mes_redeemed`, keyed by
//! its digest, inserted if absent by the writer thread; expired rows go in
//! `purge_expired` (see [`crate::purge`]).

use async_trait::async_trait;
use mcp_event_store_core::Result;
use mcp_event_store_core::backend::{RedeemBackend, RedeemKey};
use rusqlite::params;

use crate::SqliteStore;
use crate::writer::{Writer, execute};

#[async_trait]
impl RedeemBackend for SqliteStore {
    /// One `INSERT ... ON CONFLICT DO NOTHING` on the writer's connection:
    /// SQLite's write lock orders the handles and processes on the file, so
    /// of racing inserts of one key exactly one changes a row. It commits
    /// with the writer's group, durable under the store's setting before
    /// the answer.
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
        let key = *key.as_bytes();
        self.inner
            .writer
            .run(move |writer: &mut Writer, _: bool| {
                execute(
                    &writer.conn,
                    "INSERT INTO mes_redeemed (key, forget_at) VALUES (?1, ?2) \
                     ON CONFLICT (key) DO NOTHING",
                    params![&key[..], forget_at],
                )
                .map(|inserted| inserted == 1)
            })
            .await
    }
}
