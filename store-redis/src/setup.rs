//! Opening a store: the connection and the server version check, the format
//! marker (C12) and the stream secret, and how every handle sharing a
//! prefix keeps agreeing on both (C14), also after the server lost its
//! data.
//!
//! The marker and the secret live in plain string keys, created by
//! whichever handle comes first with `SET NX` and read back with `GET`. A
//! handle caches the secret, so a Redis that restarts without persistence
//! (or is emptied by hand) would leave older handles with a secret that a
//! handle connecting afterwards replaces with a fresh one: one stream id,
//! two tokens. To prevent that a handle runs [`settle`] again whenever it
//! may be out of date: when one of its writes *created* a stream or a
//! session (see the scripts module on `pending`), and when a name it looked
//! up was missing. `settle` puts its cached secret (and the format marker)
//! back if the keys are gone, or reports the one another handle stored,
//! which the handle then adopts. Appends to existing streams never pay for
//! it.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;

use crate::conn::{self, Conn, Target, Wait, check_replicas};
use crate::error::{NAME, backend};
use crate::follow::{Follow, Source};
use crate::keys::Keys;
use crate::options::{MIN_REDIS_VERSION, SECRET_ATTEMPTS};
use crate::state::{Inner, Secret};
use crate::tasks::TaskWakeups;
use crate::{FORMAT_VERSION, RedisOptions, RedisStore};

/// Opens a store on `url` with `options` under it: the URL's parameters
/// applied over the options, the options checked, the connection opened
/// and the server version checked, the format marker checked (or created)
/// and the stream secret loaded (or created).
pub(crate) async fn open(url: &str, options: RedisOptions) -> Result<Inner> {
    let (options, target) = options.with_url(url)?;
    options.validate()?;
    let keys = Keys::new(&options.key_prefix)?;
    let conn = connect(&target, options.response_timeout, options.connect_timeout).await?;
    let key = settle(&conn, &keys, &StreamKey::generate()?, options.wait()).await?;
    warn_without_persistence(&conn).await;
    let source = match &target {
        Target::Standalone(url) => Source::Standalone {
            client: redis::Client::open(url.as_str()).map_err(backend)?,
            main: conn.clone(),
            connect_timeout: options.connect_timeout,
            response_timeout: options.response_timeout,
        },
        Target::Cluster(_) => Source::Cluster {
            conn: conn.clone(),
            poll: options.cluster_follow_poll,
        },
    };
    let follow = Follow::new(keys.clone(), source);
    let subscribe_to = match &target {
        Target::Standalone(url) => vec![url.clone()],
        Target::Cluster(nodes) => nodes.clone(),
    };
    let tasks = TaskWakeups::new(subscribe_to, keys.task_channel(), options.connect_timeout);
    Ok(Inner {
        conn,
        keys,
        secret: Secret::new(key),
        options,
        follow,
        tasks,
        closed: AtomicBool::new(false),
    })
}

/// Opens the connection and checks the server version.
pub(crate) async fn connect(
    target: &Target,
    response_timeout: Duration,
    connect_timeout: Duration,
) -> Result<Conn> {
    let conn = match target {
        Target::Standalone(url) => {
            let client = redis::Client::open(url.as_str()).map_err(backend)?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(response_timeout))
                .set_connection_timeout(Some(connect_timeout))
                .set_max_delay(Duration::from_secs(2));
            Conn::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(backend)?,
            )
        }
        Target::Cluster(nodes) => {
            let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                .connection_timeout(connect_timeout)
                .response_timeout(response_timeout)
                .build()
                .map_err(backend)?;
            Conn::Cluster(client.get_async_connection().await.map_err(backend)?)
        }
    };
    for node in conn::nodes(&conn).await? {
        let info: String = node.query(&conn, redis::cmd("INFO").arg("server")).await?;
        check_version(&info)?;
    }
    Ok(conn)
}

/// Refuses servers older than [`MIN_REDIS_VERSION`], from `INFO server`.
fn check_version(info: &str) -> Result<()> {
    let version = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))
        .ok_or_else(|| Error::Config("the server's INFO has no redis_version".into()))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_REDIS_VERSION {
        return Err(Error::Config(format!(
            "Redis {version} is too old: this store needs Redis {}.{} or newer (exclusive XRANGE ranges)",
            MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1
        )));
    }
    Ok(())
}

/// Says once per process, at connect, when the server would lose events on
/// restart, since C1 and C10 then hold only as long as the server runs.
async fn warn_without_persistence(conn: &Conn) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Ok(nodes) = conn::nodes(conn).await else {
        return;
    };
    for node in nodes {
        let info: Result<String> = node
            .query(conn, redis::cmd("INFO").arg("persistence"))
            .await;
        if let Ok(info) = info {
            let aof = info.lines().any(|l| l.trim() == "aof_enabled:1");
            if !aof && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "Redis has no append-only file: acknowledged events are lost if the server restarts"
                );
                return;
            }
        }
    }
}

/// Makes sure the format marker and the secret exist, putting back ours
/// (`candidate`) if the secret is gone, and returns the stored secret. The
/// two keys are in different cluster slots, so they are two pipelines,
/// sent at once: one round trip. Refuses a format other than ours.
pub(crate) async fn settle(
    conn: &Conn,
    keys: &Keys,
    candidate: &StreamKey,
    wait: Wait,
) -> Result<StreamKey> {
    let version = FORMAT_VERSION.to_string();
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
            FORMAT_VERSION
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

impl RedisStore {
    /// Checks that `key`, the secret a call just used, is still the stored
    /// one, putting it (and the format marker) back if the backend lost
    /// them. `false`: another handle stored a different secret after a
    /// loss; this handle now uses that one, and the call must be made again.
    pub(crate) async fn secret_holds(&self, key: &StreamKey) -> Result<bool> {
        let stored = settle(&self.inner.conn, &self.inner.keys, key, self.wait()).await?;
        if stored.as_bytes() == key.as_bytes() {
            return Ok(true);
        }
        tracing::warn!(
            key_prefix = self.inner.keys.prefix(),
            "the stream secret in Redis is not the one this handle used: the server lost its \
             data (a restart without persistence?) and another handle stored a new secret; \
             adopting it"
        );
        self.inner.secret.adopt(stored);
        Ok(false)
    }
}

/// A write found the stream secret changed again and again: the backend
/// keeps losing its data under it.
pub(crate) fn secret_kept_changing() -> Error {
    Error::backend(
        NAME,
        format!(
            "the stream secret in Redis changed {SECRET_ATTEMPTS} times during one call; \
             is something emptying the server?"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_servers_are_refused() {
        check_version("# Server\r\nredis_version:7.0.15\r\n").unwrap();
        check_version("redis_version:6.2.0").unwrap();
        let err = check_version("redis_version:6.0.9").unwrap_err();
        assert!(err.to_string().contains("6.2"), "{err}");
        assert!(check_version("nothing").is_err());
    }
}
