//! How a sled store is opened: durability, cache, follow re-check, and the
//! `sled://` URL's parameters; the limits on each.

use std::path::PathBuf;
use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

/// Default sled page cache: enough to keep recent streams in memory without
/// sled's default of 1 GiB.
pub const DEFAULT_CACHE_CAPACITY: u64 = 256 * 1024 * 1024;

/// How often an idle follower re-reads its stream by default, whatever it
/// was told (see [`SledOptions::follow_recheck`]).
pub const DEFAULT_FOLLOW_RECHECK: Duration = Duration::from_secs(5);

/// The longest accepted follow re-check interval.
pub const MAX_FOLLOW_RECHECK: Duration = Duration::from_secs(60 * 60);

/// The longest accepted flush interval: beyond it the loss window stops
/// being a window.
pub const MAX_FLUSH_INTERVAL: Duration = Duration::from_secs(60 * 60);

/// When `store_event` returns, relative to the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Return after the event is flushed (fsync). Concurrent appends share
    /// one flush. Nothing acknowledged is lost on a crash.
    #[default]
    Flush,
    /// Return once written to memory; flush at this interval (1 ms to one
    /// hour). A crash loses what was acknowledged in the last interval; ids
    /// are never reused afterwards (see the crate docs).
    Interval(Duration),
}

impl Durability {
    pub(crate) fn validate(self) -> Result<()> {
        match self {
            Durability::Flush => Ok(()),
            Durability::Interval(d) if d >= Duration::from_millis(1) && d <= MAX_FLUSH_INTERVAL => {
                Ok(())
            }
            Durability::Interval(d) => Err(Error::Config(format!(
                "the flush interval must be between 1 ms and one hour, got {d:?}"
            ))),
        }
    }
}

fn validate_recheck(recheck: Duration) -> Result<()> {
    if recheck >= Duration::from_millis(1) && recheck <= MAX_FOLLOW_RECHECK {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "the follow re-check interval must be between 1 ms and one hour, got {recheck:?}"
        )))
    }
}

/// How to open a [`SledStore`](crate::SledStore).
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::{Retention, StoreOptions};
/// use mcp_event_store_sled::{Durability, SledOptions};
///
/// let options = SledOptions::default()
///     .store(StoreOptions::default().retention(Retention::default().max_events_per_stream(1_000)))
///     .durability(Durability::Interval(Duration::from_millis(50)));
/// options.validate()?;
/// # Ok::<(), mcp_event_store_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SledOptions {
    /// Retention, limits, paging and clock, as every backend takes them.
    pub store: StoreOptions,
    /// When appends return; [`Durability::Flush`] by default.
    pub durability: Durability,
    /// sled's page cache size in bytes ([`DEFAULT_CACHE_CAPACITY`]). Applies
    /// when the database is first opened in the process.
    pub cache_capacity: u64,
    /// How often a follower with nothing to deliver re-reads its stream
    /// anyway, between 1 ms and one hour ([`DEFAULT_FOLLOW_RECHECK`]). Only
    /// a safety net: every append wakes its followers (see the crate docs
    /// on following). URL parameter `follow_recheck_ms`.
    pub follow_recheck: Duration,
}

impl Default for SledOptions {
    fn default() -> Self {
        Self {
            store: StoreOptions::default(),
            durability: Durability::Flush,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
            follow_recheck: DEFAULT_FOLLOW_RECHECK,
        }
    }
}

impl SledOptions {
    /// Sets the shared store options.
    pub fn store(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Sets the durability.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets sled's page cache size in bytes.
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.cache_capacity = bytes;
        self
    }

    /// Sets how often an idle follower re-reads its stream (the safety net
    /// behind wake-ups; see [`SledOptions::follow_recheck`]).
    pub fn follow_recheck(mut self, every: Duration) -> Self {
        self.follow_recheck = every;
        self
    }

    /// The options a `sled://` URL's parameters give, over the defaults:
    ///
    /// * `durability=flush` ([`Durability::Flush`], the default);
    /// * `flush_interval_ms=N` ([`Durability::Interval`], 1 ms to one hour);
    /// * `follow_recheck_ms=N` ([`SledOptions::follow_recheck`], 1 ms to
    ///   one hour).
    ///
    /// Parameters combine with `&`. An unknown parameter, one given twice,
    /// or both durability parameters at once is [`Error::Config`] naming
    /// it. The URL's location, `sled:///absolute/dir` or
    /// `sled://relative/dir` (taken literally, no percent-decoding), is the
    /// database directory, which [`SledStore::connect`](crate::SledStore::connect)
    /// opens; it must name one, but is not part of the options.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mcp_event_store_sled::{Durability, SledOptions};
    ///
    /// let options = SledOptions::from_url("sled:///var/lib/app/events?flush_interval_ms=50")?;
    /// assert_eq!(options.durability, Durability::Interval(Duration::from_millis(50)));
    /// assert!(SledOptions::from_url("sled:///x?cache=1").is_err());
    /// assert!(SledOptions::from_url("sled:///x?follow_recheck_ms=5&follow_recheck_ms=6").is_err());
    /// # Ok::<(), mcp_event_store_core::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        Ok(SledUrl::parse(url)?.apply(Self::default()))
    }

    /// Checks every option: the shared [`StoreOptions`], the flush interval
    /// and the follow re-check interval (each 1 ms to one hour).
    /// [`SledStore::open`](crate::SledStore::open) checks them too.
    pub fn validate(&self) -> Result<()> {
        self.store.validate()?;
        self.durability.validate()?;
        validate_recheck(self.follow_recheck)
    }
}

/// What a `sled://` URL says: the directory, and the parameters it gives.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SledUrl {
    pub(crate) path: PathBuf,
    durability: Option<Durability>,
    follow_recheck: Option<Duration>,
}

impl SledUrl {
    /// Splits a `sled://` URL into its path and parameters, checking each.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let rest = url.strip_prefix("sled://").ok_or_else(|| {
            Error::Config(format!(
                "not a sled URL (expected sled:///absolute/path or sled://relative/path): {url:?}"
            ))
        })?;
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        if path.is_empty() || path == "/" {
            return Err(Error::Config(format!(
                "the sled URL {url:?} names no directory"
            )));
        }
        let millis = |name: &str, ms: &str| -> Result<Duration> {
            ms.parse().map(Duration::from_millis).map_err(|_| {
                Error::Config(format!(
                    "{name} must be a number of milliseconds, got {ms:?}"
                ))
            })
        };
        let mut parsed = SledUrl {
            path: PathBuf::from(path),
            durability: None,
            follow_recheck: None,
        };
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            // Both durability parameters set one thing: the second of them,
            // like a repeated parameter, would silently win.
            let already = match name {
                "durability" | "flush_interval_ms" => parsed.durability.is_some(),
                "follow_recheck_ms" => parsed.follow_recheck.is_some(),
                _ => false,
            };
            if already {
                return Err(Error::Config(format!(
                    "the sled URL parameter {pair:?} repeats a setting given before it \
                     (durability=flush and flush_interval_ms=N both set the durability)"
                )));
            }
            match (name, value) {
                ("durability", "flush") => parsed.durability = Some(Durability::Flush),
                ("flush_interval_ms", ms) => {
                    let durability = Durability::Interval(millis(name, ms)?);
                    durability.validate()?;
                    parsed.durability = Some(durability);
                }
                ("follow_recheck_ms", ms) => {
                    let recheck = millis(name, ms)?;
                    validate_recheck(recheck)?;
                    parsed.follow_recheck = Some(recheck);
                }
                _ => {
                    return Err(Error::Config(format!(
                        "unknown sled URL parameter {pair:?} (known: durability=flush, \
                         flush_interval_ms=N, follow_recheck_ms=N)"
                    )));
                }
            }
        }
        Ok(parsed)
    }

    /// `options` with the parameters this URL gives applied over them.
    pub(crate) fn apply(&self, mut options: SledOptions) -> SledOptions {
        if let Some(durability) = self.durability {
            options.durability = durability;
        }
        if let Some(recheck) = self.follow_recheck {
            options.follow_recheck = recheck;
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let url = SledUrl::parse("sled:///var/lib/events").unwrap();
        assert_eq!(
            url,
            SledUrl {
                path: PathBuf::from("/var/lib/events"),
                durability: None,
                follow_recheck: None,
            }
        );
        let url = SledUrl::parse("sled://data/events?flush_interval_ms=50").unwrap();
        assert_eq!(url.path, PathBuf::from("data/events"));
        assert_eq!(
            url.durability,
            Some(Durability::Interval(Duration::from_millis(50)))
        );
        let url = SledUrl::parse("sled://x?durability=flush").unwrap();
        assert_eq!(url.durability, Some(Durability::Flush));
        let url = SledUrl::parse("sled://x?follow_recheck_ms=250&flush_interval_ms=5").unwrap();
        assert_eq!(url.follow_recheck, Some(Duration::from_millis(250)));
        assert_eq!(
            url.durability,
            Some(Durability::Interval(Duration::from_millis(5)))
        );
        for bad in [
            "sqlite://x",
            "sled://",
            "sled:///",
            "sled://x?flush_interval_ms=abc",
            "sled://x?flush_interval_ms=0",
            "sled://x?flush_interval_ms=999999999999",
            "sled://x?durability=never",
            "sled://x?cache=1",
            "sled://x?follow_recheck_ms=0",
            "sled://x?follow_recheck_ms=-5",
            "sled://x?follow_recheck_ms=999999999999",
            "sled://x?follow_recheck_ms=5&follow_recheck_ms=5",
            "sled://x?flush_interval_ms=5&flush_interval_ms=6",
            "sled://x?durability=flush&flush_interval_ms=5",
            "sled://x?flush_interval_ms=5&durability=flush",
        ] {
            assert!(
                matches!(SledUrl::parse(bad), Err(Error::Config(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn follow_recheck_bounds() {
        assert!(validate_recheck(Duration::from_millis(1)).is_ok());
        assert!(validate_recheck(DEFAULT_FOLLOW_RECHECK).is_ok());
        assert!(validate_recheck(MAX_FOLLOW_RECHECK).is_ok());
        assert!(validate_recheck(Duration::ZERO).is_err());
        assert!(validate_recheck(MAX_FOLLOW_RECHECK * 2).is_err());
    }

    #[test]
    fn durability_bounds() {
        assert!(Durability::Flush.validate().is_ok());
        assert!(
            Durability::Interval(Duration::from_millis(1))
                .validate()
                .is_ok()
        );
        assert!(Durability::Interval(MAX_FLUSH_INTERVAL).validate().is_ok());
        assert!(Durability::Interval(Duration::ZERO).validate().is_err());
        assert!(
            Durability::Interval(MAX_FLUSH_INTERVAL * 2)
                .validate()
                .is_err()
        );
    }

    /// A parameter the URL gives wins over the options; the others stay.
    #[test]
    fn url_parameters_apply_over_options() {
        let options = SledOptions::default()
            .durability(Durability::Interval(Duration::from_millis(7)))
            .follow_recheck(Duration::from_millis(9))
            .cache_capacity(1 << 20);
        let url = SledUrl::parse("sled://x?follow_recheck_ms=250").unwrap();
        let applied = url.apply(options.clone());
        assert_eq!(applied.follow_recheck, Duration::from_millis(250));
        assert_eq!(applied.durability, options.durability);
        assert_eq!(applied.cache_capacity, 1 << 20);
        let url = SledUrl::parse("sled://x?durability=flush").unwrap();
        assert_eq!(url.apply(options).durability, Durability::Flush);
        let defaults = SledOptions::from_url("sled://x").unwrap();
        assert_eq!(defaults.durability, Durability::Flush);
        assert_eq!(defaults.follow_recheck, DEFAULT_FOLLOW_RECHECK);
    }

    #[test]
    fn validate_checks_every_option() {
        assert!(SledOptions::default().validate().is_ok());
        let bad_interval = SledOptions::default().durability(Durability::Interval(Duration::ZERO));
        assert!(matches!(bad_interval.validate(), Err(Error::Config(_))));
        let bad_recheck = SledOptions::default().follow_recheck(MAX_FOLLOW_RECHECK * 2);
        assert!(matches!(bad_recheck.validate(), Err(Error::Config(_))));
        let bad_store = SledOptions::default().store(StoreOptions::default().page_size(0));
        assert!(matches!(bad_store.validate(), Err(Error::Config(_))));
    }
}
