//! Options every backend shares: retention, limits, paging and the clock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::task::TaskOptions;

/// Shortest accepted stream id, in bytes.
pub const MIN_STREAM_ID_LEN: usize = 1;
/// Longest accepted stream id, in bytes.
pub const MAX_STREAM_ID_LEN: usize = 1024;
/// Default payload limit: 8 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 8 * 1024 * 1024;
/// Default number of events a replay reads per backend round trip.
///
/// 1000: a replay of up to 1000 events then costs one round trip (plus one
/// to learn there is nothing more, where the backend cannot tell from the
/// page), which the replay benchmarks show is what keeps the store level
/// with a raw range read by hand (with 256, a 1000-event replay took four
/// round trips and ran at 0.6 of the raw read on PostgreSQL and Redis). It
/// is also the largest page PostgreSQL 15 still serves with an index scan.
/// A page is held in memory whole: 1000 events of a few hundred bytes each
/// is a few hundred KiB; stores with very large payloads can lower it.
pub const DEFAULT_PAGE_SIZE: usize = 1_000;

/// How long and how much each stream keeps (contract C8).
///
/// Retention removes the *oldest* events of a stream first, so what remains is
/// always an unbroken tail; a client whose cursor falls before that tail gets
/// [`Error::EventsPurged`] rather than a replay with a hole in it.
///
/// The newest event of a stream is never removed by the count or byte limits,
/// so a stream always replays at least its latest event until it ages out.
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::Retention;
///
/// let retention = Retention::default()
///     .max_age(Duration::from_secs(15 * 60))
///     .max_events_per_stream(5_000);
/// assert_eq!(retention.max_bytes_per_stream, Some(64 * 1024 * 1024));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Events older than this are purged; a stream with no event newer than
    /// this disappears entirely. Default: one hour.
    pub max_age: Option<Duration>,
    /// At most this many events are kept per stream. Default: 10,000.
    pub max_events_per_stream: Option<u64>,
    /// At most this many payload bytes are kept per stream. Default: 64 MiB.
    pub max_bytes_per_stream: Option<u64>,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: Some(Duration::from_secs(60 * 60)),
            max_events_per_stream: Some(10_000),
            max_bytes_per_stream: Some(64 * 1024 * 1024),
        }
    }
}

impl Retention {
    /// No limits at all. Only for tests and short-lived tools: a long-running
    /// server with this grows without bound.
    pub const fn unbounded() -> Self {
        Self {
            max_age: None,
            max_events_per_stream: None,
            max_bytes_per_stream: None,
        }
    }

    /// Sets the maximum age.
    pub const fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// Sets the maximum number of events per stream.
    pub const fn max_events_per_stream(mut self, events: u64) -> Self {
        self.max_events_per_stream = Some(events);
        self
    }

    /// Sets the maximum payload bytes per stream.
    pub const fn max_bytes_per_stream(mut self, bytes: u64) -> Self {
        self.max_bytes_per_stream = Some(bytes);
        self
    }

    /// The cut-off time in milliseconds since the epoch: events stored before
    /// it have expired. `None` when there is no age limit.
    pub fn expiry_cutoff_millis(&self, now_millis: i64) -> Option<i64> {
        self.max_age.map(|age| {
            now_millis.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
        })
    }
}

/// What a purge removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Events removed.
    pub events: u64,
    /// Streams that became empty and were removed.
    pub streams: u64,
    /// Expired sessions removed.
    pub sessions: u64,
    /// Redemption records past their expiry removed (C21), where the
    /// backend removes them in the purge; a backend with a ttl per key
    /// forgets them by itself and counts none here.
    pub redemptions: u64,
}

impl PurgeReport {
    /// Adds another report's counts to this one.
    pub fn add(&mut self, other: PurgeReport) {
        self.events += other.events;
        self.streams += other.streams;
        self.sessions += other.sessions;
        self.redemptions += other.redemptions;
    }
}

/// The time source for retention and session expiry.
///
/// Stores read wall-clock time through this, so tests can move time forward
/// with [`ManualClock`] instead of sleeping.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> i64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; for tests.
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now_millis(), 3_000);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock showing `millis` since the epoch.
    pub fn new(millis: u64) -> Self {
        Self(AtomicU64::new(millis))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        i64::try_from(self.0.load(Ordering::SeqCst)).unwrap_or(i64::MAX)
    }
}

/// Options every backend accepts; each backend's own configuration embeds one.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Retention limits.
    pub retention: Retention,
    /// Largest accepted payload, in bytes. Default 8 MiB.
    pub max_payload_bytes: usize,
    /// Events read per backend round trip during replay. Default 1000
    /// ([`DEFAULT_PAGE_SIZE`]).
    pub page_size: usize,
    /// The time source for retention and expiry.
    pub clock: Arc<dyn Clock>,
    /// How long tasks live, and how long an expired one still reads
    /// expired (T8, T21).
    pub tasks: TaskOptions,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            retention: Retention::default(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            page_size: DEFAULT_PAGE_SIZE,
            clock: Arc::new(SystemClock),
            tasks: TaskOptions::default(),
        }
    }
}

impl StoreOptions {
    /// Sets the retention limits.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the payload limit.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Sets the replay page size (at least 1).
    pub fn page_size(mut self, events: usize) -> Self {
        self.page_size = events;
        self
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets how long tasks live and are kept after they expire (T8, T21).
    pub fn tasks(mut self, tasks: TaskOptions) -> Self {
        self.tasks = tasks;
        self
    }

    /// Checks the options themselves; backends call this when opening.
    pub fn validate(&self) -> Result<()> {
        if self.page_size == 0 || self.page_size > 10_000 {
            return Err(Error::Config(format!(
                "page_size must be between 1 and 10000, got {}",
                self.page_size
            )));
        }
        if self.retention.max_events_per_stream == Some(0) {
            return Err(Error::Config(
                "max_events_per_stream must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Checks an append's inputs against the contract (C9) before any backend
    /// work is done.
    pub fn check_append(&self, stream_id: &str, payload_len: usize) -> Result<()> {
        validate_stream_id(stream_id)?;
        if payload_len > self.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                size: payload_len,
                max: self.max_payload_bytes,
            });
        }
        Ok(())
    }
}

impl StoreOptions {
    /// Checks a session write (id and state size) before any backend work,
    /// and returns when the session expires, in milliseconds since the epoch
    /// by this store's clock.
    pub fn check_session_put(
        &self,
        session_id: &str,
        state_len: usize,
        ttl: Duration,
    ) -> Result<i64> {
        validate_session_id(session_id)?;
        if state_len > self.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                size: state_len,
                max: self.max_payload_bytes,
            });
        }
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Ok(self.clock.now_millis().saturating_add(ttl))
    }
}

/// Checks that a session id is 1 to 1024 bytes, like a stream id.
pub fn validate_session_id(session_id: &str) -> Result<()> {
    let len = session_id.len();
    if !(MIN_STREAM_ID_LEN..=MAX_STREAM_ID_LEN).contains(&len) {
        return Err(Error::InvalidSessionId {
            reason: format!("session id is {len} bytes, it must be 1 to {MAX_STREAM_ID_LEN}"),
        });
    }
    Ok(())
}

/// Checks that a stream id is 1 to 1024 bytes of UTF-8. Every other byte
/// sequence is accepted and treated as data.
pub fn validate_stream_id(stream_id: &str) -> Result<()> {
    let len = stream_id.len();
    if len < MIN_STREAM_ID_LEN {
        return Err(Error::InvalidStreamId {
            reason: "stream id is empty".into(),
        });
    }
    if len > MAX_STREAM_ID_LEN {
        return Err(Error::InvalidStreamId {
            reason: format!("stream id is {len} bytes, the limit is {MAX_STREAM_ID_LEN}"),
        });
    }
    Ok(())
}
