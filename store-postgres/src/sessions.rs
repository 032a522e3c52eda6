//! The session store: opaque state by session id (stored as BYTEA, like
//! stream ids), with an expiry time; expired sessions read as absent and
//! go in `purge_expired`.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::Executor;

use mcp_event_store_core::Result;
use mcp_event_store_core::backend::SessionBackend;

use crate::PostgresStore;
use crate::error::backend;

#[async_trait]
impl SessionBackend for PostgresStore {
    /// Stores `state` under `session_id` until `expires_at`
    /// (`put_session`).
    async fn session_put(
        &self,
        session_id: &str,
        state: &[u8],
        _ttl: Duration,
        expires_at: i64,
    ) -> Result<()> {
        self.pool()
            .execute(
                sqlx::query(self.sql().put_session.clone())
                    .bind(session_id.as_bytes())
                    .bind(state)
                    .bind(expires_at),
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// The live state of `session_id`, if any (`get_session`).
    async fn session_get(&self, session_id: &str) -> Result<Option<Bytes>> {
        let state: Option<Vec<u8>> = sqlx::query_scalar(self.sql().get_session.clone())
            .bind(session_id.as_bytes())
            .bind(self.now())
            .fetch_optional(self.pool())
            .await
            .map_err(backend)?;
        Ok(state.map(Bytes::from))
    }

    /// Deletes `session_id`; whether it was live (`delete_session`).
    async fn session_delete(&self, session_id: &str) -> Result<bool> {
        let live: Option<bool> = sqlx::query_scalar(self.sql().delete_session.clone())
            .bind(session_id.as_bytes())
            .bind(self.now())
            .fetch_optional(self.pool())
            .await
            .map_err(backend)?;
        Ok(live.unwrap_or(false))
    }
}
