//! The session store: session state by id with a deadline, written by the
//! writer thread and read from the read pool.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::Result;
use mcp_event_store_core::backend::SessionBackend;
use rusqlite::{OptionalExtension, params};

use crate::SqliteStore;
use crate::error::{db_error, sqlite_error};
use crate::writer::{Writer, execute};

#[async_trait]
impl SessionBackend for SqliteStore {
    /// One statement on the writer's connection.
    async fn session_put(
        &self,
        session_id: &str,
        state: &[u8],
        _ttl: Duration,
        expires_at: i64,
    ) -> Result<()> {
        let (session_id, state) = (session_id.to_owned(), state.to_vec());
        self.inner
            .writer
            .run(move |writer: &mut Writer, _: bool| {
                execute(
                    &writer.conn,
                    "INSERT INTO mes_sessions (session_id, state, expires_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (session_id) DO UPDATE SET state = excluded.state, \
                         expires_at = excluded.expires_at",
                    params![session_id, state, expires_at],
                )
                .map(drop)
            })
            .await
    }

    async fn session_get(&self, session_id: &str) -> Result<Option<Bytes>> {
        let state: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT state FROM mes_sessions WHERE session_id = ?1 AND expires_at > ?2",
        )
        .bind(session_id)
        .bind(self.now())
        .fetch_optional(&self.inner.readers)
        .await
        .map_err(db_error)?;
        Ok(state.map(Bytes::from))
    }

    /// One statement on the writer's connection: whether a live session
    /// was there.
    async fn session_delete(&self, session_id: &str) -> Result<bool> {
        let (session_id, now) = (session_id.to_owned(), self.now());
        self.inner
            .writer
            .run(move |writer: &mut Writer, _: bool| {
                let expires_at: Option<i64> = writer
                    .conn
                    .prepare_cached(
                        "DELETE FROM mes_sessions WHERE session_id = ?1 RETURNING expires_at",
                    )
                    .and_then(|mut statement| {
                        statement
                            .query_row([&session_id], |row| row.get(0))
                            .optional()
                    })
                    .map_err(sqlite_error)?;
                Ok(expires_at.is_some_and(|at| at > now))
            })
            .await
    }
}
