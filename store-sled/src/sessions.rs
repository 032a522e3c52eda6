//! Sessions: opaque state by session id with an expiry, and an expiry
//! index the purge walks. Session writes touch two trees, under one lock.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::Result;
use mcp_event_store_core::backend::SessionBackend;

use crate::SledStore;
use crate::error::backend;
use crate::keys;
use crate::purge::PURGE_BATCH;
use crate::shared::{Shared, blocking, lock};

#[async_trait]
impl SessionBackend for SledStore {
    async fn session_put(
        &self,
        session_id: &str,
        state: &[u8],
        _ttl: Duration,
        expires_at: i64,
    ) -> Result<()> {
        let shared = self.shared()?;
        let expires = keys::encode_time(expires_at);
        let session_id = session_id.to_owned();
        let state = state.to_vec();
        blocking({
            let shared = shared.clone();
            move || shared.put_session(&session_id, expires, &state)
        })
        .await?;
        self.settle(self.flush_after_write(&shared)).await
    }

    async fn session_get(&self, session_id: &str) -> Result<Option<Bytes>> {
        let shared = self.shared()?;
        let now = keys::encode_time(self.now());
        let session_id = session_id.to_owned();
        blocking(move || shared.get_session(&session_id, now)).await
    }

    async fn session_delete(&self, session_id: &str) -> Result<bool> {
        let shared = self.shared()?;
        let now = keys::encode_time(self.now());
        let session_id = session_id.to_owned();
        let existed = blocking({
            let shared = shared.clone();
            move || shared.delete_session(&session_id, now)
        })
        .await?;
        self.settle(self.flush_after_write(&shared)).await?;
        Ok(existed)
    }
}

impl Shared {
    /// Removes sessions that expired at or before `now`, in batches.
    pub(crate) fn purge_sessions(&self, now: u64) -> Result<u64> {
        let end = now.saturating_add(1).to_be_bytes();
        let mut removed = 0;
        loop {
            let _guard = lock(&self.session_lock);
            let batch: Vec<sled::IVec> = self
                .session_expiry
                .range(..end.to_vec())
                .keys()
                .take(PURGE_BATCH)
                .collect::<Result<_, _>>()
                .map_err(backend)?;
            if batch.is_empty() {
                return Ok(removed);
            }
            for key in batch {
                let (expires, session_id) = keys::parse_expiry_key(&key)?;
                let current = self.sessions.get(session_id).map_err(backend)?;
                if let Some(current) = current
                    && keys::session_expires(&current)? == expires
                {
                    self.sessions.remove(session_id).map_err(backend)?;
                    removed += 1;
                }
                self.session_expiry.remove(&key).map_err(backend)?;
            }
        }
    }

    /// Stores a session (expiry entry first, so a crash never leaves a
    /// session the purge cannot find).
    pub(crate) fn put_session(&self, session_id: &str, expires: u64, state: &[u8]) -> Result<()> {
        let _guard = lock(&self.session_lock);
        let id = session_id.as_bytes();
        let old = self.sessions.get(id).map_err(backend)?;
        self.session_expiry
            .insert(keys::expiry_key(expires, id), &[])
            .map_err(backend)?;
        self.sessions
            .insert(id, keys::encode_session(expires, state))
            .map_err(backend)?;
        if let Some(old) = old {
            let old_expires = keys::session_expires(&old)?;
            if old_expires != expires {
                self.session_expiry
                    .remove(keys::expiry_key(old_expires, id))
                    .map_err(backend)?;
            }
        }
        Ok(())
    }

    /// A session's state if it has not expired by `now`.
    pub(crate) fn get_session(&self, session_id: &str, now: u64) -> Result<Option<Bytes>> {
        let Some(value) = self.sessions.get(session_id.as_bytes()).map_err(backend)? else {
            return Ok(None);
        };
        if keys::session_expires(&value)? <= now {
            return Ok(None);
        }
        Ok(Some(Bytes::copy_from_slice(&value[8..])))
    }

    /// Removes a session; `true` if it existed and had not expired.
    pub(crate) fn delete_session(&self, session_id: &str, now: u64) -> Result<bool> {
        let _guard = lock(&self.session_lock);
        let id = session_id.as_bytes();
        let Some(old) = self.sessions.remove(id).map_err(backend)? else {
            return Ok(false);
        };
        let expires = keys::session_expires(&old)?;
        self.session_expiry
            .remove(keys::expiry_key(expires, id))
            .map_err(backend)?;
        Ok(expires > now)
    }
}
