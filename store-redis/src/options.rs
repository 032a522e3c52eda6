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
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            store: StoreOptions::default(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
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

    /// Checks the options; `connect_with` calls this first.
    pub fn validate(&self) -> Result<()> {
        self.store.validate()?;
        validate_prefix(&self.key_prefix)?;
        if self.response_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::Config(
                "response_timeout and connect_timeout must be above zero".into(),
            ));
        }
        Ok(())
    }
}
