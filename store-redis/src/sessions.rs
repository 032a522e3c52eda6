//! Sessions: hashes named by a keyed hash of the session id, with the
//! expiry by the store's clock and a `PEXPIRE` backstop; a new session
//! checks the stream secret as a new stream does (C14).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::SessionBackend;
use mcp_event_store_core::{Error, Result};
use redis::FromRedisValue;

use crate::RedisStore;
use crate::error::NAME;
use crate::options::SECRET_ATTEMPTS;
use crate::scripts::{SCRIPTS, ttl_arg};
use crate::setup::secret_kept_changing;

#[async_trait]
impl SessionBackend for RedisStore {
    /// Stores a session's state until `expires_at`, with a `PEXPIRE`
    /// backstop of `ttl` (`put_session`).
    async fn session_put(
        &self,
        session_id: &str,
        state: &[u8],
        ttl: Duration,
        expires_at: i64,
    ) -> Result<()> {
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, session_id);
            let call = SCRIPTS
                .session_put
                .call()
                .key(&session)
                .arg(session_id)
                .arg(state)
                .arg(expires_at)
                .arg(ttl_arg(Some(ttl)));
            let (reply, acked) = self.run(&call, true).await?;
            let check = i64::from_redis_value(reply).map_err(|e| Error::backend(NAME, e))?;
            self.check_wait(acked, "the session")?;
            if check == 0 {
                return Ok(());
            }
            // A new session (or one still pending): as for a new stream, the
            // secret that named it must be the stored one.
            if self.secret_holds(&key).await? {
                let confirmed: i64 = self
                    .invoke(SCRIPTS.session_confirm.call().key(&session).arg(session_id))
                    .await?;
                if confirmed == 1 {
                    return Ok(());
                }
            } else {
                let _: i64 = self
                    .invoke(SCRIPTS.session_discard.call().key(&session).arg(session_id))
                    .await?;
            }
        }
        Err(secret_kept_changing())
    }

    /// A session's state, unless missing or expired (`get_session`).
    async fn session_get(&self, session_id: &str) -> Result<Option<Bytes>> {
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, session_id);
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET").arg(&session).arg(&["id", "d", "exp"]);
            let (row,): (SessionRow,) = self.read(&pipe).await?;
            let (id, data, expires_at) = row;
            let (Some(id), Some(data), Some(expires_at)) = (id, data, expires_at) else {
                // Missing: unless this handle's secret is out of date (then
                // the session lives under another key), there is none.
                if self.secret_holds(&key).await? {
                    return Ok(None);
                }
                continue;
            };
            if id != session_id {
                return Err(Error::Corrupt(
                    "session token already belongs to another session id".into(),
                ));
            }
            return Ok((expires_at > self.now()).then(|| Bytes::from(data)));
        }
        Err(secret_kept_changing())
    }

    /// Deletes a session (`delete_session`); whether it existed.
    async fn session_delete(&self, session_id: &str) -> Result<bool> {
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, session_id);
            let outcome: i64 = self
                .invoke(
                    SCRIPTS
                        .session_delete
                        .call()
                        .key(&session)
                        .arg(session_id)
                        .arg(self.now()),
                )
                .await?;
            if outcome >= 0 || self.secret_holds(&key).await? {
                return Ok(outcome == 1);
            }
        }
        Err(secret_kept_changing())
    }
}

/// `HMGET session id d exp`.
type SessionRow = (Option<String>, Option<Vec<u8>>, Option<i64>);
