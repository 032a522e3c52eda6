//! Options of the NATS backend: [`NatsOptions`], every URL parameter
//! ([`NatsOptions::from_url`]), and the backend's defaults.

use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

/// The URL schemes this backend opens: `nats://` (add `?tls=true` to
/// require TLS).
pub const URL_SCHEMES: &[&str] = &["nats"];

/// The parameters [`NatsOptions::from_url`] reads from a store URL.
pub const URL_PARAMETERS: &[&str] = &[
    "prefix",
    "tls",
    "replicas",
    "storage",
    "request_timeout_ms",
    "follow_recheck_ms",
];

/// The default name prefix of every stream, bucket and subject.
pub const DEFAULT_PREFIX: &str = "mcp-event-store";
/// The default wait for any one reply from the server.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The default wait for a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default interval a follower re-reads without a wake-up.
pub const DEFAULT_FOLLOW_RECHECK: Duration = Duration::from_secs(5);
/// The oldest NATS server this backend runs on (direct get, per-subject
/// expected sequences).
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 9);

/// The oldest NATS server this backend runs on in a cluster: older ones
/// let concurrent compare-and-set writes to one subject all succeed
/// (nats-server issue 4320, fixed in 2.9.21).
pub const MIN_CLUSTER_VERSION: (u64, u64, u64) = (2, 9, 21);

const MAX_PREFIX_LEN: usize = 48;

/// Where JetStream keeps this store's streams and buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Storage {
    /// On disk: an acknowledged event survives a server restart (default).
    #[default]
    File,
    /// In memory: fast, and lost when the server (or, with replicas, every
    /// replica) restarts. For tests and caches only.
    Memory,
}

impl Storage {
    fn parse(value: &str) -> Result<Self> {
        match value {
            "file" => Ok(Self::File),
            "memory" => Ok(Self::Memory),
            other => Err(Error::Config(format!(
                "the NATS URL parameter `storage` is `file` or `memory`, not {other:?}"
            ))),
        }
    }

    pub(crate) fn js(self) -> async_nats::jetstream::stream::StorageType {
        match self {
            Self::File => async_nats::jetstream::stream::StorageType::File,
            Self::Memory => async_nats::jetstream::stream::StorageType::Memory,
        }
    }

    /// The setting's name as the server spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Memory => "memory",
        }
    }
}

/// Options of a [`NatsStore`](crate::NatsStore).
///
/// ```
/// use mcp_event_store_nats::{NatsOptions, Storage};
///
/// let options = NatsOptions::from_url("nats://127.0.0.1:4222?prefix=app&replicas=3")?;
/// assert_eq!(options.prefix, "app");
/// assert_eq!(options.replicas, 3);
/// assert_eq!(options.storage, Storage::File);
/// assert!(NatsOptions::from_url("nats://127.0.0.1?prefx=typo").is_err());
/// # Ok::<(), mcp_event_store_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct NatsOptions {
    /// Retention, payload limit, replay page size and clock (shared by every
    /// backend).
    pub store: StoreOptions,
    /// Names every stream (`<prefix>-events`), bucket (`<prefix>-tasks`,
    /// ...) and subject (`<prefix>.ev.<token>`) of this store, so several
    /// stores share one server. 1 to 48 bytes of `[A-Za-z0-9_-]`. Default
    /// `mcp-event-store`. URL parameter `prefix`.
    pub prefix: String,
    /// How many servers of a cluster hold each stream and bucket (1 to 5;
    /// 3 survives losing one). Used when the store creates them. Default 1.
    /// URL parameter `replicas`.
    pub replicas: usize,
    /// File (default) or memory storage. URL parameter `storage`.
    pub storage: Storage,
    /// How long to wait for any one reply. Default 10 s. URL parameter
    /// `request_timeout_ms`.
    pub request_timeout: Duration,
    /// How long to wait for a connection. Default 5 s.
    pub connect_timeout: Duration,
    /// How often a follower re-reads its stream without a wake-up (the
    /// safety net for a lost one). Default 5 s. URL parameter
    /// `follow_recheck_ms`.
    pub follow_recheck: Duration,
    /// Refuse to talk to a server without TLS. Default off (the client
    /// still uses TLS where the server asks for it). URL parameter `tls`
    /// (`true` or `false`).
    pub require_tls: bool,
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            store: StoreOptions::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            replicas: 1,
            storage: Storage::File,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            follow_recheck: DEFAULT_FOLLOW_RECHECK,
            require_tls: false,
        }
    }
}

impl NatsOptions {
    /// Sets the options every backend shares.
    pub fn store(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Sets the name prefix.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the replica count of the streams and buckets the store creates.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// Sets the storage of the streams and buckets the store creates.
    pub fn storage(mut self, storage: Storage) -> Self {
        self.storage = storage;
        self
    }

    /// Sets the reply timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets how often a follower re-reads without a wake-up.
    pub fn follow_recheck(mut self, interval: Duration) -> Self {
        self.follow_recheck = interval;
        self
    }

    /// Checks the options; `connect_with` calls this first.
    pub fn validate(&self) -> Result<()> {
        self.store.validate()?;
        validate_prefix(&self.prefix)?;
        if !(1..=5).contains(&self.replicas) {
            return Err(Error::Config(format!(
                "replicas must be 1 to 5, got {}",
                self.replicas
            )));
        }
        if self.request_timeout.is_zero()
            || self.connect_timeout.is_zero()
            || self.follow_recheck.is_zero()
        {
            return Err(Error::Config(
                "request_timeout, connect_timeout and follow_recheck must be above zero".into(),
            ));
        }
        Ok(())
    }

    /// The options a store URL describes: [`NatsOptions::default`] with
    /// every parameter of the URL applied ([`URL_PARAMETERS`]); an
    /// unknown parameter, one given twice, or a bad value is an
    /// [`Error::Config`] naming it (never quoting the URL, which may hold a
    /// password).
    pub fn from_url(url: &str) -> Result<Self> {
        Ok(Self::default().with_url(url)?.0)
    }

    /// The servers `url` names, each as a URL of its own, and these
    /// options with the URL's parameters applied: what
    /// [`connect_with`](crate::NatsStore::connect_with) connects to.
    ///
    /// ```
    /// use mcp_event_store_nats::NatsOptions;
    ///
    /// let (servers, _) = NatsOptions::default().servers("nats://h1:4222,h2:4223?replicas=3")?;
    /// assert_eq!(servers, ["nats://h1:4222", "nats://h2:4223"]);
    /// # Ok::<(), mcp_event_store_core::Error>(())
    /// ```
    pub fn servers(self, url: &str) -> Result<(Vec<String>, Self)> {
        let (options, servers) = self.with_url(url)?;
        Ok((servers, options))
    }

    /// Applies the parameters of `url` over these options (a parameter in
    /// the URL wins); returns them and the servers to connect to (the URL
    /// without its parameters).
    pub(crate) fn with_url(mut self, url: &str) -> Result<(Self, Vec<String>)> {
        let (scheme, _) = url
            .split_once("://")
            .ok_or_else(|| Error::Config("NATS URL has no scheme (expected nats://...)".into()))?;
        if !URL_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
            return Err(Error::Config(format!(
                "unsupported NATS URL scheme {scheme:?}; use nats:// (with ?tls=true to require TLS)"
            )));
        }
        let (servers, query) = url.split_once('?').unwrap_or((url, ""));
        let mut seen = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if seen.contains(&name) {
                return Err(Error::Config(format!(
                    "the NATS URL parameter `{name}` is given more than once"
                )));
            }
            seen.push(name);
            match name {
                "prefix" => self.prefix = value.to_owned(),
                "replicas" => self.replicas = number(value, name)?,
                "storage" => self.storage = Storage::parse(value)?,
                "tls" => {
                    self.require_tls = match value {
                        "true" | "1" | "" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(Error::Config(format!(
                                "the NATS URL parameter `tls` is `true` or `false`, not {other:?}"
                            )));
                        }
                    }
                }
                "request_timeout_ms" => {
                    self.request_timeout = Duration::from_millis(number(value, name)?);
                }
                "follow_recheck_ms" => {
                    self.follow_recheck = Duration::from_millis(number(value, name)?);
                }
                _ => {
                    return Err(Error::Config(format!(
                        "unknown NATS URL parameter `{name}`; this backend reads {}",
                        URL_PARAMETERS.join(", ")
                    )));
                }
            }
        }
        let servers = server_list(&scheme.to_ascii_lowercase(), servers);
        if servers.is_empty() {
            return Err(Error::Config("the NATS URL names no server".into()));
        }
        Ok((self, servers))
    }
}

/// The servers of a URL as the client takes them: `nats://u:p@h1:4222,h2`
/// becomes `nats://u:p@h1:4222` and `nats://u:p@h2` (each seed a URL of its
/// own, with the credentials given before the first).
fn server_list(scheme: &str, servers: &str) -> Vec<String> {
    let rest = servers.split_once("://").map_or(servers, |(_, rest)| rest);
    let (credentials, hosts) = match rest.split_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), rest),
    };
    hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}://{credentials}{host}"))
        .collect()
}

fn number<T: std::str::FromStr>(value: &str, name: &str) -> Result<T> {
    value.parse().map_err(|_| {
        Error::Config(format!(
            "the NATS URL parameter `{name}` must be a whole number, got {value:?}"
        ))
    })
}

/// Checks a name prefix: 1 to 48 bytes of `[A-Za-z0-9_-]`, what stream,
/// bucket and subject names all accept.
///
/// ```
/// assert!(mcp_event_store_nats::validate_prefix("app_1-events").is_ok());
/// assert!(mcp_event_store_nats::validate_prefix("app.events").is_err());
/// ```
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX_LEN
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "the NATS prefix must be 1 to {MAX_PREFIX_LEN} bytes of [A-Za-z0-9_-], got {prefix:?}"
        )))
    }
}
