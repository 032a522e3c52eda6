//! The session store: opaque state by session id (stored as BYTEA, like
//! stream ids), with an expiry time; expired sessions read as absent and
//! go in `purge_expired`.

use std::time::Duration;

use bytes::Bytes;
use sqlx::Executor;

use mcp_event_store_core::Result;
use mcp_event_store_core::backend::validate_session_id;

use crate::PostgresStore;
use crate::error::backend;

/// Stores `state` under `session_id` until `ttl` has passed
/// (`put_session`).
pub(crate) async fn put(
    store: &PostgresStore,
    session_id: &str,
    state: &[u8],
    ttl: Duration,
) -> Result<()> {
    let expires_at = store
        .options()
        .check_session_put(session_id, state.len(), ttl)?;
    store
        .pool()
        .execute(
            sqlx::query(store.sql().put_session.clone())
                .bind(session_id.as_bytes())
                .bind(state)
                .bind(expires_at),
        )
        .await
        .map_err(backend)?;
    Ok(())
}

/// The live state of `session_id`, if any (`get_session`).
pub(crate) async fn get(store: &PostgresStore, session_id: &str) -> Result<Option<Bytes>> {
    if validate_session_id(session_id).is_err() {
        return Ok(None);
    }
    let state: Option<Vec<u8>> = sqlx::query_scalar(store.sql().get_session.clone())
        .bind(session_id.as_bytes())
        .bind(store.now())
        .fetch_optional(store.pool())
        .await
        .map_err(backend)?;
    Ok(state.map(Bytes::from))
}

/// Deletes `session_id`; whether it was live (`delete_session`).
pub(crate) async fn delete(store: &PostgresStore, session_id: &str) -> Result<bool> {
    if validate_session_id(session_id).is_err() {
        return Ok(false);
    }
    let live: Option<bool> = sqlx::query_scalar(store.sql().delete_session.clone())
        .bind(session_id.as_bytes())
        .bind(store.now())
        .fetch_optional(store.pool())
        .await
        .map_err(backend)?;
    Ok(live.unwrap_or(false))
}
