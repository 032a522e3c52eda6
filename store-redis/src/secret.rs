//! The format marker and the stream secret, and how every handle sharing a
//! prefix keeps agreeing on them (C12, C14), also after the server lost its
//! data.
//!
//! Both live in plain string keys, created by whichever handle comes first
//! with `SET NX` and read back with `GET`. A handle caches the secret, so a
//! Redis that restarts without persistence (or is emptied by hand) would
//! leave older handles with a secret that a handle connecting afterwards
//! replaces with a fresh one: one stream id, two tokens. To prevent that a
//! handle runs [`settle`] again whenever it may be out of date: when one of
//! its writes *created* a stream or a session (see the scripts module on
//! `pending`), and when a name it looked up was missing. `settle` puts its
//! cached secret (and the format marker) back if the keys are gone, or
//! reports the one another handle stored, which the handle then adopts.
//! Appends to existing streams never pay for it.

use std::sync::RwLock;

use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::{Error, Result};

use crate::conn::{Conn, backend};
use crate::keys::Keys;

/// The stream secret a handle currently uses; replaced when the stored one
/// turns out to differ.
pub struct Secret(RwLock<StreamKey>);

impl Secret {
    /// Holds `key`.
    pub fn new(key: StreamKey) -> Self {
        Self(RwLock::new(key))
    }

    /// The secret in use now.
    pub fn current(&self) -> StreamKey {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Uses `key` from now on.
    pub fn adopt(&self, key: StreamKey) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = key;
    }
}

/// `WAIT` arguments for writes that must reach replicas: (replicas, ms).
pub type Wait = Option<(u32, u64)>;

/// Makes sure the format marker and the secret exist, putting back ours
/// (`candidate`) if the secret is gone, and returns the stored secret. The
/// two keys are in different cluster slots, so they are two pipelines,
/// sent at once: one round trip. Refuses a format other than ours.
pub async fn settle(
    conn: &Conn,
    keys: &Keys,
    candidate: &StreamKey,
    wait: Wait,
) -> Result<StreamKey> {
    let version = crate::FORMAT_VERSION.to_string();
    let (format, stored) = futures_util::future::try_join(
        first_value_wins(
            conn,
            &keys.format(),
            version.as_bytes(),
            "format marker",
            wait,
        ),
        first_value_wins(
            conn,
            &keys.secret(),
            &candidate.as_bytes()[..],
            "stream key",
            wait,
        ),
    )
    .await?;
    if format != version.as_bytes() {
        return Err(Error::IncompatibleFormat(format!(
            "keys under {:?} are in format {:?}; this release reads format {}",
            keys.prefix(),
            String::from_utf8_lossy(&format),
            crate::FORMAT_VERSION
        )));
    }
    StreamKey::from_bytes(&stored)
}

/// Sets `key` to `value` unless it is set, and returns what it holds, in one
/// pipeline (`SET .. NX GET` would need Redis 7). With `wait`, a value this
/// call wrote must reach the replicas, like an event: then, and only then
/// (a `WAIT` blocks the connection it is sent on), `WAIT` follows, in a
/// pipeline behind a `GET` of the key so that on a cluster it goes to the
/// key's master, on the connection that wrote.
async fn first_value_wins(
    conn: &Conn,
    key: &str,
    value: &[u8],
    what: &str,
    wait: Wait,
) -> Result<Vec<u8>> {
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg(key).arg(value).arg("NX");
    pipe.cmd("GET").arg(key);
    let (written, stored): (Option<String>, Option<Vec<u8>>) =
        pipe.query_async(&mut conn.clone()).await.map_err(backend)?;
    if let (Some(_), Some((replicas, ms))) = (written, wait) {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(key).ignore();
        pipe.cmd("WAIT").arg(replicas).arg(ms);
        let (acked,): (u32,) = pipe.query_async(&mut conn.clone()).await.map_err(backend)?;
        check_replicas(acked, replicas, ms, &format!("the {what}"))?;
    }
    stored.ok_or_else(|| Error::Corrupt(format!("the {what} {key} vanished while being set")))
}

/// The error when `WAIT` saw fewer replicas than asked for.
pub fn check_replicas(acked: u32, replicas: u32, ms: u64, what: &str) -> Result<()> {
    if acked >= replicas {
        return Ok(());
    }
    Err(Error::backend(
        crate::NAME,
        format!(
            "{what} was stored on the Redis primary, but only {acked} of {replicas} replicas \
             acknowledged it within {ms} ms (WAIT): it may not survive a failover"
        ),
    ))
}
