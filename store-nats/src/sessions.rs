//! Sessions in the key-value bucket `<prefix>-sessions`: one key per
//! session, named by a keyed hash of its id (so any session id is a valid
//! key), holding the expiry, the id and the state (or, for a state too
//! large for one message, its reference in the spill stream).

use std::time::Duration;

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use mcp_event_store_core::backend::SessionBackend;
use mcp_event_store_core::{Error, Result};

use crate::NatsStore;
use crate::error::backend;
use crate::spill::{SpillRef, drop_spilled, inline_limit, spill, unspill};
use crate::tasks::{forget, keys_of};

#[async_trait]
impl SessionBackend for NatsStore {
    async fn session_put(
        &self,
        session_id: &str,
        state: &[u8],
        _ttl: Duration,
        expires_at: i64,
    ) -> Result<()> {
        let key = session_key(self, session_id);
        let (value, _) = encode(self, &key, expires_at, session_id.as_bytes(), state).await?;
        self.inner.sessions.put(key, value).await.map_err(backend)?;
        Ok(())
    }

    async fn session_get(&self, session_id: &str) -> Result<Option<Bytes>> {
        let key = session_key(self, session_id);
        let now = self.now();
        Ok(read_session(self, &key, session_id)
            .await?
            .filter(|(expires_at, _)| *expires_at > now)
            .map(|(_, state)| state))
    }

    async fn session_delete(&self, session_id: &str) -> Result<bool> {
        let key = session_key(self, session_id);
        let live = read_session(self, &key, session_id)
            .await?
            .is_some_and(|(expires_at, _)| expires_at > self.now());
        forget_key(self, &key).await?;
        drop_spilled(self, &format!("s{key}"), None).await?;
        Ok(live)
    }
}

/// The bucket key of the session core names `session_id` (its digest's
/// key, `s1.` and 64 hex digits).
pub(crate) fn session_key(store: &NatsStore, session_id: &str) -> String {
    // A domain of its own, so a session's key is never a stream's token.
    format!(
        "s{}",
        store.token(&format!("session\u{0}{session_id}")).to_text()
    )
}

/// The state and expiry under a session's key, if it belongs to
/// `session_id`.
async fn read_session(
    store: &NatsStore,
    key: &str,
    session_id: &str,
) -> Result<Option<(i64, Bytes)>> {
    let Some(value) = store.inner.sessions.get(key).await.map_err(backend)? else {
        return Ok(None);
    };
    let (expires_at, id, state) = decode(&value)?;
    if id != session_id.as_bytes() {
        return Err(Error::Corrupt(
            "a session key holds another session id".into(),
        ));
    }
    let state = match state {
        State::Inline(state) => state,
        State::Spilled(spilled) => unspill(store, &format!("s{key}"), &spilled).await?,
    };
    Ok(Some((expires_at, state)))
}

/// A session's value under `key`: the expiry, the id and the state,
/// inline, or spilled first when one message cannot hold it (then with
/// the reference written, so that a write that does not land can drop
/// its chunks).
pub(crate) async fn encode(
    store: &NatsStore,
    key: &str,
    expires_at: i64,
    session_id: &[u8],
    state: &[u8],
) -> Result<(Bytes, Option<SpillRef>)> {
    let mut value = BytesMut::with_capacity(11 + session_id.len() + state.len());
    value.put_i64_le(expires_at);
    value.put_u16_le(session_id.len() as u16);
    value.put_slice(session_id);
    let spilled = if state.len() > inline_limit(store, 11 + session_id.len()) {
        let spilled = spill(store, &format!("s{key}"), state).await?;
        value.put_u8(SPILLED);
        spilled.encode(&mut value);
        Some(spilled)
    } else {
        value.put_u8(INLINE);
        value.put_slice(state);
        None
    };
    Ok((value.freeze(), spilled))
}

/// The id of the spilled state the session under `key` refers to.
pub(crate) async fn spilled_session(store: &NatsStore, key: &str) -> Result<Option<String>> {
    let Some(value) = store.inner.sessions.get(key).await.map_err(backend)? else {
        return Ok(None);
    };
    Ok(match decode(&value)?.2 {
        State::Spilled(spilled) => Some(spilled.id),
        State::Inline(_) => None,
    })
}

/// Removes a key's messages from the bucket's stream, leaving no
/// delete marker behind (a marker per deleted key would grow without
/// bound).
async fn forget_key(store: &NatsStore, key: &str) -> Result<()> {
    forget(&store.inner.sessions, key).await
}

/// Removes every expired session; how many.
pub(crate) async fn purge_sessions(store: &NatsStore) -> Result<u64> {
    let now = store.now();
    let keys = keys_of(&store.inner.sessions).await?;
    let mut removed = 0;
    for key in keys {
        let Some(value) = store.inner.sessions.get(&key).await.map_err(backend)? else {
            continue;
        };
        if decode(&value)?.0 <= now {
            forget_key(store, &key).await?;
            drop_spilled(store, &format!("s{key}"), None).await?;
            removed += 1;
        }
    }
    Ok(removed)
}

const INLINE: u8 = 0;
const SPILLED: u8 = 1;

/// A session's state as its value holds it.
pub(crate) enum State {
    Inline(Bytes),
    Spilled(SpillRef),
}

/// A session's value: (expiry, id, state).
pub(crate) fn decode(value: &Bytes) -> Result<(i64, Bytes, State)> {
    let corrupt = || Error::Corrupt("a session value is malformed".into());
    if value.len() < 11 {
        return Err(corrupt());
    }
    let expires_at = i64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
    let id_len = usize::from(u16::from_le_bytes([value[8], value[9]]));
    if value.len() < 11 + id_len {
        return Err(corrupt());
    }
    let state = value.slice(11 + id_len..);
    let state = match value[10 + id_len] {
        INLINE => State::Inline(state),
        SPILLED => State::Spilled(SpillRef::decode(&state)?),
        _ => return Err(corrupt()),
    };
    Ok((expires_at, value.slice(10..10 + id_len), state))
}
