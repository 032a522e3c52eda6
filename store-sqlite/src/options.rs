//! How a SQLite store is opened: the file, its durability, its connections,
//! the `sqlite://` URL and every parameter it takes, and this backend's
//! defaults and limits.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

/// Default [`SqliteOptions::busy_timeout`].
pub(crate) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`SqliteOptions::read_connections`].
pub(crate) const DEFAULT_READ_CONNECTIONS: u32 = 4;
/// Default [`SqliteOptions::max_batch`].
pub(crate) const DEFAULT_MAX_BATCH: usize = 512;
/// Default [`SqliteOptions::follow_poll_interval`].
pub(crate) const DEFAULT_FOLLOW_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Default [`SqliteOptions::follow_recheck`].
pub(crate) const DEFAULT_FOLLOW_RECHECK: Duration = Duration::from_secs(5);
/// The shortest follow poll interval and re-check interval accepted.
pub(crate) const MIN_FOLLOW_INTERVAL: Duration = Duration::from_millis(1);
/// Commands that may wait for the writer before callers are held back.
pub(crate) const WRITER_QUEUE: usize = 4096;

/// The parameters a `sqlite://` URL may carry, for error messages.
const KNOWN_PARAMETERS: &str =
    "durability=process|power_loss, follow_poll_ms=<ms>, follow_recheck_ms=<ms>";

/// What a returned `store_event` survives.
///
/// Both modes use SQLite's write-ahead log; they differ in when SQLite calls
/// `fsync`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous = NORMAL`: a committed event survives the process being
    /// killed (even with `SIGKILL`), because it is in the WAL file the
    /// operating system holds. A power loss or kernel crash can lose the last
    /// commits before the next checkpoint. The default: it is what a server
    /// restart, a crash or a deploy needs, at about twice the append rate.
    #[default]
    Process,
    /// `synchronous = FULL`: the WAL is fsynced at every commit, so a
    /// committed event also survives power loss. Group commit shares each
    /// fsync among all appends waiting at that moment.
    PowerLoss,
}

impl Durability {
    pub(crate) fn synchronous(self) -> sqlx::sqlite::SqliteSynchronous {
        match self {
            Durability::Process => sqlx::sqlite::SqliteSynchronous::Normal,
            Durability::PowerLoss => sqlx::sqlite::SqliteSynchronous::Full,
        }
    }

    /// The same, as the value of `PRAGMA synchronous` (the writer's
    /// connection).
    pub(crate) fn synchronous_pragma(self) -> &'static str {
        match self {
            Durability::Process => "NORMAL",
            Durability::PowerLoss => "FULL",
        }
    }
}

/// Everything [`SqliteStore::open_with`](crate::SqliteStore::open_with) and
/// [`SqliteStore::connect_with`](crate::SqliteStore::connect_with) take.
///
/// [`Default`] has every default but no file: give one with
/// [`new`](Self::new) or a URL ([`from_url`](Self::from_url),
/// [`connect_with`](crate::SqliteStore::connect_with)).
///
/// ```
/// use mcp_event_store_core::{Retention, StoreOptions};
/// use mcp_event_store_sqlite::{Durability, SqliteOptions};
///
/// let options = SqliteOptions::new("events.db")
///     .durability(Durability::PowerLoss)
///     .store(StoreOptions::default().retention(Retention::unbounded()));
/// assert_eq!(options.path().to_str(), Some("events.db"));
/// assert!(options.validate().is_ok());
/// assert!(SqliteOptions::default().validate().is_err(), "no file");
/// ```
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    pub(crate) path: PathBuf,
    /// Options every backend shares (retention, payload limit, page size, clock).
    pub store: StoreOptions,
    /// When `store_event` may return; see [`Durability`]. URL:
    /// `?durability=process|power_loss`.
    pub durability: Durability,
    /// How long a write, or an open, waits for another handle or process
    /// holding a lock on the file (the write lock, a first open's migration).
    /// Default 5 s.
    pub busy_timeout: Duration,
    /// Connections in the read pool (lookups, sessions, inspection), and
    /// the most threads reading replay pages and tasks, each with a
    /// connection of its own. Default 4.
    pub read_connections: u32,
    /// Most appends committed in one transaction. Default 512.
    pub max_batch: usize,
    /// How often a handle with followers checks whether another handle or
    /// process wrote to the file (`PRAGMA data_version` on one dedicated
    /// connection): the bound on the follow latency for appends made
    /// elsewhere. Appends through this handle wake its followers at once.
    /// Default 50 ms; at least 1 ms. URL: `?follow_poll_ms=`.
    pub follow_poll_interval: Duration,
    /// How often every follower re-reads its stream even without a
    /// wake-up: the safety net should a wake-up be missed. Default 5 s; at
    /// least 1 ms. URL: `?follow_recheck_ms=`.
    pub follow_recheck: Duration,
}

impl Default for SqliteOptions {
    /// Every default, and no file yet (which [`validate`](Self::validate)
    /// refuses).
    fn default() -> Self {
        Self {
            path: PathBuf::new(),
            store: StoreOptions::default(),
            durability: Durability::default(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            read_connections: DEFAULT_READ_CONNECTIONS,
            max_batch: DEFAULT_MAX_BATCH,
            follow_poll_interval: DEFAULT_FOLLOW_POLL_INTERVAL,
            follow_recheck: DEFAULT_FOLLOW_RECHECK,
        }
    }
}

impl SqliteOptions {
    /// Options for the database file at `path` (created if missing).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }

    /// Parses a `sqlite://` URL: `sqlite://events.db` (relative),
    /// `sqlite:///var/lib/app/events.db` (absolute), with optional
    /// parameters joined by `&`:
    ///
    /// * `durability=process|power_loss` ([`SqliteOptions::durability`]);
    /// * `follow_poll_ms=<ms>` ([`SqliteOptions::follow_poll_interval`]);
    /// * `follow_recheck_ms=<ms>` ([`SqliteOptions::follow_recheck`]).
    ///
    /// Everything else is the default. An unknown parameter, or one given
    /// twice, is [`Error::Config`] naming it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mcp_event_store_sqlite::{Durability, SqliteOptions};
    ///
    /// let options = SqliteOptions::from_url(
    ///     "sqlite:///tmp/e.db?durability=power_loss&follow_poll_ms=20&follow_recheck_ms=2000",
    /// )
    /// .unwrap();
    /// assert_eq!(options.path().to_str(), Some("/tmp/e.db"));
    /// assert_eq!(options.durability, Durability::PowerLoss);
    /// assert_eq!(options.follow_poll_interval, Duration::from_millis(20));
    /// assert_eq!(options.follow_recheck, Duration::from_secs(2));
    /// assert!(SqliteOptions::from_url("sqlite://").is_err());
    /// assert!(SqliteOptions::from_url("sqlite://e.db?follow_poll_ms=0").is_err());
    /// assert!(SqliteOptions::from_url("sqlite://e.db?follow_poll_ms=soon").is_err());
    /// assert!(SqliteOptions::from_url("sqlite://e.db?colour=blue").is_err());
    /// assert!(SqliteOptions::from_url("sqlite://e.db?durability=process&durability=power_loss").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        Self::default().apply_url(url)
    }

    /// These options with the file and the parameters `url` names applied
    /// over them (see [`from_url`](Self::from_url)), validated.
    pub(crate) fn apply_url(mut self, url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| Error::Config(format!("not a sqlite:// URL: {url:?}")))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(Error::Config(
                "sqlite:// URL has no file path (try sqlite://events.db)".into(),
            ));
        }
        self.path = PathBuf::from(path);
        let mut seen = HashSet::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !seen.insert(key) {
                return Err(Error::Config(format!(
                    "sqlite URL parameter {key:?} is given more than once"
                )));
            }
            match (key, value) {
                ("durability", "process") => self.durability = Durability::Process,
                ("durability", "power_loss") => self.durability = Durability::PowerLoss,
                ("durability", _) => {
                    return Err(Error::Config(format!(
                        "sqlite URL parameter {pair:?}: durability is process or power_loss"
                    )));
                }
                ("follow_poll_ms", value) => self.follow_poll_interval = millis(pair, value)?,
                ("follow_recheck_ms", value) => self.follow_recheck = millis(pair, value)?,
                _ => {
                    return Err(Error::Config(format!(
                        "unknown sqlite URL parameter {pair:?} (known: {KNOWN_PARAMETERS})"
                    )));
                }
            }
        }
        self.validate()?;
        Ok(self)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the options every backend shares.
    pub fn store(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Sets the durability mode.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the busy timeout.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets the number of read connections.
    pub fn read_connections(mut self, connections: u32) -> Self {
        self.read_connections = connections;
        self
    }

    /// Sets the most appends committed in one transaction.
    pub fn max_batch(mut self, appends: usize) -> Self {
        self.max_batch = appends;
        self
    }

    /// Sets how often a handle with followers looks for other handles' and
    /// processes' writes.
    pub fn follow_poll_interval(mut self, interval: Duration) -> Self {
        self.follow_poll_interval = interval;
        self
    }

    /// Sets how often a follower re-reads its stream without a wake-up.
    pub fn follow_recheck(mut self, recheck: Duration) -> Self {
        self.follow_recheck = recheck;
        self
    }

    /// Checks the options as opening does: a file is named, the shared
    /// options are valid ([`StoreOptions::validate`]), there is at least one
    /// read connection and one append per batch, and the follow intervals
    /// are at least 1 ms. Otherwise [`Error::Config`].
    pub fn validate(&self) -> Result<()> {
        if self.path.as_os_str().is_empty() {
            return Err(Error::Config(
                "no SQLite database file given (SqliteOptions::new(path) or a sqlite:// URL)"
                    .into(),
            ));
        }
        self.store.validate()?;
        if self.read_connections == 0 {
            return Err(Error::Config("read_connections must be at least 1".into()));
        }
        if self.max_batch == 0 {
            return Err(Error::Config("max_batch must be at least 1".into()));
        }
        if self.follow_poll_interval < MIN_FOLLOW_INTERVAL {
            return Err(Error::Config(
                "follow_poll_interval must be at least 1 ms".into(),
            ));
        }
        if self.follow_recheck < MIN_FOLLOW_INTERVAL {
            return Err(Error::Config("follow_recheck must be at least 1 ms".into()));
        }
        Ok(())
    }
}

/// A URL parameter's value in milliseconds.
fn millis(pair: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            Error::Config(format!(
                "sqlite URL parameter {pair:?} is not a number of milliseconds"
            ))
        })
}
