//! Options of the Redis backend: [`RedisOptions`], every URL parameter
//! ([`RedisOptions::from_url`]), and the backend's defaults and limits.

use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

use crate::conn::{Target, Wait};
use crate::keys::validate_prefix;

/// Every URL scheme [`RedisStore::connect`](crate::RedisStore::connect)
/// accepts. The `+cluster` forms open a Redis Cluster; `redis+unix`,
/// `valkey+unix` and `unix` a unix socket; `rediss` and `valkeys` TLS (when
/// the redis crate is built with a TLS feature).
pub const URL_SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "valkey",
    "valkeys",
    "valkey+unix",
    "valkey+cluster",
    "valkeys+cluster",
];

/// Oldest server accepted: exclusive `XRANGE` bounds (`(id`) came in 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);
/// The prefix used when none is configured.
pub const DEFAULT_KEY_PREFIX: &str = "mcp-event-store";
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

/// Most entries one append removes by retention; more are left to the next
/// appends and to `purge_expired`, so one append never stalls the server.
pub(crate) const APPEND_TRIM_BUDGET: u32 = 256;
/// How long `delete_stream` (and a purge that empties a stream) remembers
/// the stream's newest id. Ids are
/// server milliseconds, so a re-created stream only needs it for as long as
/// the server clock might lag behind the old ids; an hour is ample.
pub(crate) const GONE_MARKER_TTL: Duration = Duration::from_secs(60 * 60);
/// Most entries one purge script call removes before yielding the server.
pub(crate) const PURGE_TRIM_BUDGET: u32 = 1_000;
/// `SCAN COUNT` during purges.
pub(crate) const SCAN_BATCH: u32 = 500;
/// Streams purged at once during `purge_expired`.
pub(crate) const PURGE_CONCURRENCY: usize = 16;
/// The most an idle stream's keys outlive `max_age` in real time: the
/// append script gives them the TTL plus up to this much (1/16 of the TTL
/// when that is less), and sets it again only once less than the TTL is
/// left, rather than on every append.
pub(crate) const TTL_SLACK_MAX: Duration = Duration::from_secs(1);
/// TTLs beyond this (about 30 years) are not set: nothing would expire anyway.
pub(crate) const MAX_PEXPIRE_MS: u64 = 1 << 40;
/// How many times one call writes again after finding that the stream
/// secret changed under it (each time means the backend lost its data
/// again while the call ran).
pub(crate) const SECRET_ATTEMPTS: usize = 4;

/// The URL query parameters this crate reads itself and removes before the
/// redis crate parses the URL:
///
/// * `prefix=<key prefix>` sets [`RedisOptions::key_prefix`];
/// * `cluster=true|false` chooses Redis Cluster for a `redis://` URL;
/// * `wait_replicas=<n>` sets [`RedisOptions::wait_replicas`];
/// * `wait_timeout_ms=<ms>` sets [`RedisOptions::wait_timeout`];
/// * `follow_recheck_ms=<ms>` sets [`RedisOptions::follow_recheck`];
/// * `cluster_follow_poll_ms=<ms>` sets [`RedisOptions::cluster_follow_poll`].
///
/// The redis crate's own parameters ([`DRIVER_URL_PARAMETERS`]) are passed
/// on to it. Any other parameter, and any parameter given twice, is an
/// [`Error::Config`] naming it. A parameter in the URL overrides the same
/// setting in the options passed to
/// [`connect_with`](crate::RedisStore::connect_with).
pub const URL_PARAMETERS: &[&str] = &[
    "prefix",
    "cluster",
    "wait_replicas",
    "wait_timeout_ms",
    "follow_recheck_ms",
    "cluster_follow_poll_ms",
];

/// The redis crate's URL parameters, passed on to it unchanged:
/// `protocol=resp2|resp3` on every URL, and on unix-socket URLs (which
/// have no other place for them) `db=<n>`, `user=<name>` and `pass=<password>`.
/// A TCP URL names its database in the path (`redis://host/2`) and its
/// user in the authority (`redis://user:pass@host`); `db`, `user` or `pass`
/// in its query would be ignored by the redis crate, so they are refused.
pub const DRIVER_URL_PARAMETERS: &[&str] = &["protocol", "db", "user", "pass"];

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

    /// `WAIT` arguments from these options: (replicas, timeout ms), or
    /// none when appends do not wait for replicas.
    pub(crate) fn wait(&self) -> Wait {
        (self.wait_replicas > 0).then(|| (self.wait_replicas, self.wait_timeout_ms()))
    }

    /// The options a store URL describes: [`RedisOptions::default`] with
    /// every parameter of the URL applied. This is where every URL
    /// parameter of this backend is read ([`URL_PARAMETERS`], and the redis
    /// crate's own [`DRIVER_URL_PARAMETERS`], checked and left for it); an
    /// unknown parameter, one given twice, or a bad value is an
    /// [`Error::Config`] naming it (never quoting the URL, which may hold a
    /// password). The location (scheme, hosts, database, credentials) is not
    /// part of the options: [`connect_with`](crate::RedisStore::connect_with)
    /// takes it from the URL it is given.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mcp_event_store_redis::RedisOptions;
    ///
    /// let options = RedisOptions::from_url("redis://127.0.0.1/2?prefix=app:events&wait_replicas=1")?;
    /// assert_eq!(options.key_prefix, "app:events");
    /// assert_eq!(options.wait_replicas, 1);
    /// assert_eq!(options.wait_timeout, Duration::from_secs(1));
    /// assert!(RedisOptions::from_url("redis://127.0.0.1?prefx=typo").is_err());
    /// # Ok::<(), mcp_event_store_core::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let (options, _) = Self::default().with_url(url)?;
        Ok(options)
    }

    /// Applies the parameters of `url` over these options (a parameter in
    /// the URL wins) and returns the options and where to connect: the
    /// URL's location with the redis crate's parameters left in it.
    pub(crate) fn with_url(mut self, url: &str) -> Result<(Self, Target)> {
        let (scheme, _) = url.split_once("://").ok_or_else(|| {
            Error::Config("Redis URL has no scheme (expected redis://...)".into())
        })?;
        if !URL_SCHEMES.contains(&scheme) {
            return Err(Error::Config(format!(
                "unsupported Redis URL scheme {scheme:?}; use one of {}",
                URL_SCHEMES.join("://, ") + "://"
            )));
        }
        let unix = scheme.contains("unix");
        let (rest, fragment) = match url.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (url, None),
        };
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut seen = Vec::new();
        let mut cluster = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if seen.contains(&name) {
                return Err(Error::Config(format!(
                    "the Redis URL parameter `{name}` is given more than once"
                )));
            }
            seen.push(name);
            match name {
                "prefix" => self.key_prefix = percent_decode(value, "prefix")?,
                "cluster" => cluster = Some(parse_cluster(value)?),
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
                "protocol" => kept.push(pair),
                "db" | "user" | "pass" if unix => kept.push(pair),
                "db" | "user" | "pass" => {
                    return Err(Error::Config(format!(
                        "the Redis URL parameter `{name}` is only read on unix-socket URLs; \
                         a {scheme}:// URL names the database in its path (/2) and the \
                         user and password before the host (user:pass@host)"
                    )));
                }
                _ => {
                    return Err(Error::Config(format!(
                        "unknown Redis URL parameter `{name}`; this backend reads {} and passes \
                         protocol (and db, user, pass on unix sockets) to the redis crate",
                        URL_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        let mut location = base.to_owned();
        if !kept.is_empty() {
            location.push('?');
            location.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            location.push('#');
            location.push_str(fragment);
        }
        let target = crate::conn::target(&location, cluster)?;
        Ok((self, target))
    }
}

/// The `cluster` URL parameter (a bare `cluster` means true).
fn parse_cluster(value: &str) -> Result<bool> {
    match value {
        "true" | "1" | "yes" | "" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(Error::Config(
            "the Redis URL parameter `cluster` must be true or false".into(),
        )),
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

    /// The options and where to connect, for a URL.
    fn parse(url: &str) -> Result<(RedisOptions, Target)> {
        RedisOptions::default().with_url(url)
    }

    #[test]
    fn our_url_parameters_are_taken_out() {
        let (options, target) = parse("redis://:pw@h:1/2?prefix=app%3Aprod&protocol=resp3&wait_replicas=2&wait_timeout_ms=250&follow_recheck_ms=1500&cluster_follow_poll_ms=20#insecure")
            .unwrap();
        assert_eq!(
            target,
            Target::Standalone("redis://:pw@h:1/2?protocol=resp3#insecure".into())
        );
        assert_eq!(options.follow_recheck, Duration::from_millis(1500));
        assert_eq!(options.cluster_follow_poll, Duration::from_millis(20));
        assert_eq!(options.key_prefix, "app:prod");
        assert_eq!(options.wait_replicas, 2);
        assert_eq!(options.wait_timeout, Duration::from_millis(250));
        let (options, target) = RedisOptions::default()
            .key_prefix("from-options")
            .with_url("redis+cluster://a:1,b:2?prefix=p&cluster=true")
            .unwrap();
        assert_eq!(
            target,
            Target::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert_eq!(options.key_prefix, "p");
        let (options, target) = parse("redis://h").unwrap();
        assert_eq!(target, Target::Standalone("redis://h".into()));
        assert_eq!(options.key_prefix, DEFAULT_KEY_PREFIX);
        assert_eq!(
            RedisOptions::from_url("redis://h?prefix=q")
                .unwrap()
                .key_prefix,
            "q"
        );
    }

    #[test]
    fn bad_parameters_are_config_errors_without_the_password() {
        for (url, named) in [
            ("redis://u:hunter2@h?wait_replicas=many", "wait_replicas"),
            ("redis://u:hunter2@h?wait_timeout_ms=-1", "wait_timeout_ms"),
            ("redis://u:hunter2@h?prefix=%zz", "prefix"),
            ("redis://u:hunter2@h?prefix=%ff", "prefix"),
            (
                "redis://u:hunter2@h?follow_recheck_ms=soon",
                "follow_recheck_ms",
            ),
            ("redis://u:hunter2@h?prefx=typo", "prefx"),
            ("redis://u:hunter2@h?prefix=a&prefix=b", "prefix"),
            (
                "redis://u:hunter2@h?protocol=resp3&protocol=resp2",
                "protocol",
            ),
            ("redis://u:hunter2@h?db=2", "db"),
            ("rediss+cluster://u:hunter2@a:1?pass=x", "pass"),
        ] {
            let err = RedisOptions::from_url(url).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
            assert!(
                err.to_string().contains(&format!("`{named}`")),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn the_redis_crates_parameters_are_passed_on() {
        assert_eq!(
            parse("redis+unix:///run/redis.sock?db=2&user=u&pass=p&protocol=resp3")
                .unwrap()
                .1,
            Target::Standalone(
                "redis+unix:///run/redis.sock?db=2&user=u&pass=p&protocol=resp3".into()
            )
        );
        assert_eq!(
            parse("redis://h?protocol=resp3&cluster=false").unwrap().1,
            Target::Standalone("redis://h?protocol=resp3".into())
        );
    }

    #[test]
    fn standalone_urls_pass_through() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://:secret@host/2",
            "rediss://host:6380",
            "redis+unix:///run/redis.sock",
        ] {
            assert_eq!(parse(url).unwrap().1, Target::Standalone(url.into()));
        }
        assert_eq!(
            parse("redis+cluster://a:1?cluster=false").unwrap().1,
            Target::Standalone("redis://a:1".into())
        );
    }

    #[test]
    fn cluster_urls_name_every_seed() {
        let want = Target::Cluster(vec!["redis://u:p@a:1/0".into(), "redis://u:p@b:2/0".into()]);
        assert_eq!(parse("redis+cluster://u:p@a:1,b:2/0").unwrap().1, want);
        assert_eq!(parse("redis://u:p@a:1,b:2/0?cluster=true").unwrap().1, want);
        assert_eq!(
            parse("rediss+cluster://a:1?protocol=resp3").unwrap().1,
            Target::Cluster(vec!["rediss://a:1?protocol=resp3".into()])
        );
        assert_eq!(
            parse("rediss+cluster://a:1,b:2#insecure").unwrap().1,
            Target::Cluster(vec![
                "rediss://a:1#insecure".into(),
                "rediss://b:2#insecure".into()
            ])
        );
    }

    #[test]
    fn every_listed_scheme_parses() {
        for scheme in URL_SCHEMES {
            let url = if scheme.contains("unix") {
                format!("{scheme}:///run/redis.sock")
            } else {
                format!("{scheme}://127.0.0.1:6379")
            };
            let (_, target) = parse(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                matches!(target, Target::Cluster(_)),
                scheme.ends_with("+cluster"),
                "{url}"
            );
        }
    }

    #[test]
    fn bad_urls_are_config_errors_without_the_password() {
        for url in [
            "127.0.0.1:6379",
            "http://user:hunter2@host",
            "redis://user:hunter2@a,b",
            "redis+cluster://user:hunter2@",
            "redis://h?cluster=maybe",
            "redis+unix:///x?cluster=true",
        ] {
            let err = parse(url).unwrap_err();
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
        assert_eq!(options.wait(), Some((1, 1000)));
        assert_eq!(RedisOptions::default().wait(), None);
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
