//! Options of the Redis backend.

use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

use crate::keys::{DEFAULT_KEY_PREFIX, validate_prefix};

/// Default time to wait for a reply. Generous on purpose: the redis crate's
/// own default (500 ms) fails large replay pages and 8 MiB appends on a busy
/// server, and a timed-out append leaves the caller not knowing whether it
/// was stored.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time to wait for a TCP (and TLS) connection to a node.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time an append waits for its replicas (`WAIT`) when
/// [`RedisOptions::wait_replicas`] is above zero.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default interval of a follower's periodic re-read, the safety net behind
/// the wake-ups (see [`RedisOptions::follow_recheck`]).
pub const DEFAULT_FOLLOW_RECHECK: Duration = Duration::from_secs(5);
/// Default interval at which, on a Redis Cluster, a handle's watcher reads
/// the newest id of every followed stream (see
/// [`RedisOptions::cluster_follow_poll`]).
pub const DEFAULT_CLUSTER_FOLLOW_POLL: Duration = Duration::from_millis(100);

/// The URL query parameters this crate reads itself and removes before the
/// redis crate parses the URL (every other parameter goes to the redis
/// crate unchanged):
///
/// * `prefix=<key prefix>` sets [`RedisOptions::key_prefix`];
/// * `cluster=true|false` chooses Redis Cluster for a `redis://` URL;
/// * `wait_replicas=<n>` sets [`RedisOptions::wait_replicas`];
/// * `wait_timeout_ms=<ms>` sets [`RedisOptions::wait_timeout`];
/// * `follow_recheck_ms=<ms>` sets [`RedisOptions::follow_recheck`];
/// * `cluster_follow_poll_ms=<ms>` sets [`RedisOptions::cluster_follow_poll`].
///
/// A parameter in the URL overrides the same setting in the options passed
/// to [`connect_with`](crate::RedisStore::connect_with).
pub const URL_PARAMETERS: &[&str] = &[
    "prefix",
    "cluster",
    "wait_replicas",
    "wait_timeout_ms",
    "follow_recheck_ms",
    "cluster_follow_poll_ms",
];

/// Everything [`RedisStore::connect_with`](crate::RedisStore::connect_with)
/// accepts beside the URL.
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::{Retention, StoreOptions};
/// use mcp_event_store_redis::RedisOptions;
///
/// let options = RedisOptions {
///     store: StoreOptions::default().retention(Retention::default().max_events_per_stream(1_000)),
///     key_prefix: "my-app:events".into(),
///     ..RedisOptions::default()
/// }
/// .response_timeout(Duration::from_secs(10));
/// assert_eq!(options.connect_timeout, Duration::from_secs(5));
/// ```
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Retention, payload limit, replay page size and clock (shared by every
    /// backend). The page size is the `COUNT` of each `XRANGE`.
    pub store: StoreOptions,
    /// Every key this store writes starts with `<key_prefix>:`, so several
    /// stores (or applications) can share one Redis. 1 to 128 bytes of
    /// `[A-Za-z0-9._:/-]`. Default `mcp-event-store`.
    pub key_prefix: String,
    /// How long to wait for any one reply. Default 30 s.
    pub response_timeout: Duration,
    /// How long to wait for a connection to a node. Default 5 s.
    pub connect_timeout: Duration,
    /// How many replicas must hold an event before `store_event` returns:
    /// after the append, in the same round trip on the same connection,
    /// the store sends `WAIT <wait_replicas> <wait_timeout>` to the
    /// stream's primary. An acknowledged event then survives the primary
    /// being killed and one of those replicas promoted. If fewer replicas
    /// acknowledge within [`wait_timeout`](Self::wait_timeout), the append
    /// fails with an error saying the event was stored on the primary but
    /// may not survive a failover. Default 0: no waiting (Redis replication
    /// is asynchronous, and a failover can lose the newest acknowledged
    /// events). URL parameter `wait_replicas`.
    pub wait_replicas: u32,
    /// How long an append waits for [`wait_replicas`](Self::wait_replicas)
    /// replicas. Above zero and below the response timeout. Default 1 s.
    /// URL parameter `wait_timeout_ms`.
    pub wait_timeout: Duration,
    /// How often a follower re-reads its stream even without a wake-up: the
    /// safety net for a wake-up lost while the watcher connection was down.
    /// Wake-ups normally come at once (see the [crate docs](crate#following)),
    /// so this only bounds the delay in the worst case. Above zero. Default
    /// 5 s. URL parameter `follow_recheck_ms`.
    pub follow_recheck: Duration,
    /// On a Redis Cluster, how often the handle's watcher reads the newest
    /// id of every followed stream (one `HGET` per stream per poll) to wake
    /// followers for other handles' appends; a blocking `XREAD` cannot span
    /// slots there. Bounds the cross-handle follow latency on a cluster.
    /// Unused on a standalone server. Above zero. Default 100 ms. URL
    /// parameter `cluster_follow_poll_ms`.
    pub cluster_follow_poll: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            store: StoreOptions::default(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            follow_recheck: DEFAULT_FOLLOW_RECHECK,
            cluster_follow_poll: DEFAULT_CLUSTER_FOLLOW_POLL,
        }
    }
}

impl RedisOptions {
    /// Sets the options every backend shares.
    pub fn store(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the reply timeout.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how many replicas each append waits for (0: none).
    pub fn wait_replicas(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// Sets how long an append waits for its replicas.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }

    /// Sets how often a follower re-reads without a wake-up.
    pub fn follow_recheck(mut self, interval: Duration) -> Self {
        self.follow_recheck = interval;
        self
    }

    /// Sets how often a cluster handle's watcher polls the followed streams.
    pub fn cluster_follow_poll(mut self, interval: Duration) -> Self {
        self.cluster_follow_poll = interval;
        self
    }

    /// Checks the options; `connect_with` calls this first.
    pub fn validate(&self) -> Result<()> {
        self.store.validate()?;
        validate_prefix(&self.key_prefix)?;
        if self.response_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::Config(
                "response_timeout and connect_timeout must be above zero".into(),
            ));
        }
        if self.follow_recheck.is_zero() || self.cluster_follow_poll.is_zero() {
            return Err(Error::Config(
                "follow_recheck and cluster_follow_poll must be above zero".into(),
            ));
        }
        if self.wait_replicas > 0 {
            // `WAIT n 0` would block forever, and a wait the response
            // timeout cuts short reports a timeout instead of saying how
            // many replicas acknowledged.
            if self.wait_timeout.is_zero() || self.wait_timeout >= self.response_timeout {
                return Err(Error::Config(format!(
                    "wait_timeout must be above zero and below response_timeout ({:?}), got {:?}",
                    self.response_timeout, self.wait_timeout
                )));
            }
        }
        Ok(())
    }

    /// The `WAIT` timeout argument, in whole milliseconds (at least 1).
    pub(crate) fn wait_timeout_ms(&self) -> u64 {
        u64::try_from(self.wait_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Takes this crate's parameters ([`URL_PARAMETERS`] except `cluster`,
    /// which [`conn::parse_url`](crate::conn::parse_url) reads) out of
    /// `url`, applies them over these options, and returns the options and
    /// the URL without them. Errors never quote the URL, which may hold a
    /// password.
    pub(crate) fn apply_url(mut self, url: &str) -> Result<(Self, String)> {
        let (rest, fragment) = match url.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (url, None),
        };
        let Some((base, query)) = rest.split_once('?') else {
            return Ok((self, url.to_owned()));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "prefix" => self.key_prefix = percent_decode(value, "prefix")?,
                "wait_replicas" => {
                    self.wait_replicas = parse_number(value, "wait_replicas")?;
                }
                "wait_timeout_ms" => {
                    self.wait_timeout =
                        Duration::from_millis(parse_number(value, "wait_timeout_ms")?);
                }
                "follow_recheck_ms" => {
                    self.follow_recheck =
                        Duration::from_millis(parse_number(value, "follow_recheck_ms")?);
                }
                "cluster_follow_poll_ms" => {
                    self.cluster_follow_poll =
                        Duration::from_millis(parse_number(value, "cluster_follow_poll_ms")?);
                }
                _ => kept.push(pair),
            }
        }
        let mut url = base.to_owned();
        if !kept.is_empty() {
            url.push('?');
            url.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            url.push('#');
            url.push_str(fragment);
        }
        Ok((self, url))
    }
}

/// A decimal URL parameter.
fn parse_number<T: std::str::FromStr>(value: &str, name: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::Config(format!(
            "the Redis URL parameter `{name}` must be a whole number, got {value:?}"
        ))
    })
}

/// Decodes `%XX` escapes (and `+` as a space, which `validate_prefix` then
/// refuses) in a URL parameter.
fn percent_decode(value: &str, name: &str) -> Result<String> {
    let bad = || {
        Error::Config(format!(
            "the Redis URL parameter `{name}` is not valid UTF-8 percent-encoding"
        ))
    };
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = value.get(i + 1..i + 3).ok_or_else(bad)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_url_parameters_are_taken_out() {
        let (options, url) = RedisOptions::default()
            .apply_url("redis://:pw@h:1/2?prefix=app%3Aprod&protocol=resp3&wait_replicas=2&wait_timeout_ms=250&follow_recheck_ms=1500&cluster_follow_poll_ms=20#insecure")
            .unwrap();
        assert_eq!(url, "redis://:pw@h:1/2?protocol=resp3#insecure");
        assert_eq!(options.follow_recheck, Duration::from_millis(1500));
        assert_eq!(options.cluster_follow_poll, Duration::from_millis(20));
        assert_eq!(options.key_prefix, "app:prod");
        assert_eq!(options.wait_replicas, 2);
        assert_eq!(options.wait_timeout, Duration::from_millis(250));
        let (options, url) = RedisOptions::default()
            .key_prefix("from-options")
            .apply_url("redis+cluster://a:1,b:2?prefix=p&cluster=true")
            .unwrap();
        assert_eq!(url, "redis+cluster://a:1,b:2?cluster=true");
        assert_eq!(options.key_prefix, "p");
        let (options, url) = RedisOptions::default().apply_url("redis://h").unwrap();
        assert_eq!(url, "redis://h");
        assert_eq!(options.key_prefix, DEFAULT_KEY_PREFIX);
    }

    #[test]
    fn bad_parameters_are_config_errors_without_the_password() {
        for url in [
            "redis://u:hunter2@h?wait_replicas=many",
            "redis://u:hunter2@h?wait_timeout_ms=-1",
            "redis://u:hunter2@h?prefix=%zz",
            "redis://u:hunter2@h?prefix=%ff",
            "redis://u:hunter2@h?follow_recheck_ms=soon",
        ] {
            let err = RedisOptions::default().apply_url(url).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn follow_intervals_must_be_above_zero() {
        RedisOptions::default().validate().unwrap();
        for options in [
            RedisOptions::default().follow_recheck(Duration::ZERO),
            RedisOptions::default().cluster_follow_poll(Duration::ZERO),
        ] {
            assert!(matches!(options.validate(), Err(Error::Config(_))));
        }
    }

    #[test]
    fn wait_needs_a_timeout_below_the_response_timeout() {
        let options = RedisOptions::default().wait_replicas(1);
        options.validate().unwrap();
        assert_eq!(options.wait_timeout_ms(), 1000);
        assert!(
            options
                .clone()
                .wait_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            options
                .clone()
                .wait_timeout(DEFAULT_RESPONSE_TIMEOUT)
                .validate()
                .is_err()
        );
        RedisOptions::default()
            .wait_timeout(Duration::ZERO)
            .validate()
            .unwrap();
    }
}
