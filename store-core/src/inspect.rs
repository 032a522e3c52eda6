//! What an operator asks of a store (C15 Inspect): how much it holds, which
//! streams, and whether its backend is configured to keep what it
//! acknowledges and to stay bounded.

use std::fmt;

use crate::error::{Error, Result};
use crate::options::Retention;

/// The most streams one [`list_streams`](crate::EventStore::list_streams)
/// page holds; larger limits are cut to this, so a page stays small in
/// memory however many streams the store has.
pub const MAX_LIST_PAGE: usize = 1_000;

/// Store-wide totals, from [`EventStore::stats`](crate::EventStore::stats).
///
/// Times are milliseconds since the Unix epoch, as the store's clock gave
/// them when the events were appended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Streams with at least one retained event.
    pub streams: u64,
    /// Events retained.
    pub events: u64,
    /// Payload bytes retained (the events' data, not the backend's overhead).
    pub bytes: u64,
    /// When the oldest retained event was appended.
    pub oldest_millis: Option<i64>,
    /// When the newest retained event was appended.
    pub newest_millis: Option<i64>,
}

/// One stream in a [`StreamPage`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamInfo {
    /// The stream id.
    pub stream_id: String,
    /// Events retained.
    pub events: u64,
    /// Payload bytes retained.
    pub bytes: u64,
    /// When its oldest retained event was appended (ms since the epoch).
    pub oldest_millis: Option<i64>,
    /// When its newest retained event was appended (ms since the epoch).
    pub newest_millis: Option<i64>,
}

impl StreamInfo {
    /// A stream's entry (for backends building pages).
    pub fn new(
        stream_id: impl Into<String>,
        events: u64,
        bytes: u64,
        oldest_millis: Option<i64>,
        newest_millis: Option<i64>,
    ) -> Self {
        Self {
            stream_id: stream_id.into(),
            events,
            bytes,
            oldest_millis,
            newest_millis,
        }
    }
}

/// Where the next [`list_streams`](crate::EventStore::list_streams) page
/// starts: opaque, meaningful only to the store that returned it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StreamCursor(String);

impl StreamCursor {
    /// A cursor from a backend's own position text.
    pub fn new(position: impl Into<String>) -> Self {
        Self(position.into())
    }

    /// The backend's position text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for StreamCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamCursor({:?})", self.0)
    }
}

/// One page of streams; `next` is `None` on the last page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamPage {
    /// The streams, in the backend's listing order.
    pub streams: Vec<StreamInfo>,
    /// Where the next page starts, or `None` if this is the last.
    pub next: Option<StreamCursor>,
}

impl StreamPage {
    /// A page (for backends).
    pub fn new(streams: Vec<StreamInfo>, next: Option<StreamCursor>) -> Self {
        Self { streams, next }
    }
}

/// Checks a page limit: zero is a [`Error::Config`]; anything above
/// [`MAX_LIST_PAGE`] is cut to it.
pub fn check_list_limit(limit: usize) -> Result<usize> {
    if limit == 0 {
        return Err(Error::Config(
            "a listing needs a limit of at least 1".into(),
        ));
    }
    Ok(limit.min(MAX_LIST_PAGE))
}

/// Whether a setting is safe.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The setting keeps acknowledged events and the store bounded.
    Ok,
    /// The setting risks losing acknowledged events or unbounded growth;
    /// `remedy` says what to change.
    Warn {
        /// What to change, in a sentence.
        remedy: String,
    },
}

/// One setting that decides durability or boundedness, as the backend
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Setting {
    /// The setting's name as the backend spells it (`appendfsync`,
    /// `synchronous_commit`, `journal_mode`, ...).
    pub name: String,
    /// Its current value.
    pub value: String,
    /// Whether it is safe.
    pub verdict: Verdict,
}

impl Setting {
    /// A safe setting.
    pub fn ok(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            verdict: Verdict::Ok,
        }
    }

    /// The store's retention limits (C8): ok with a maximum age, a warning
    /// without one, since then no stream is ever removed whole and the
    /// store grows with every new stream.
    ///
    /// ```
    /// use mcp_event_store_core::{Retention, Setting, Verdict};
    ///
    /// assert_eq!(Setting::retention(&Retention::default()).verdict, Verdict::Ok);
    /// assert_ne!(Setting::retention(&Retention::unbounded()).verdict, Verdict::Ok);
    /// ```
    pub fn retention(retention: &Retention) -> Self {
        let limit = |name: &str, value: Option<String>| {
            format!("{name}={}", value.as_deref().unwrap_or("none"))
        };
        let value = [
            limit("max_age", retention.max_age.map(|d| format!("{d:?}"))),
            limit(
                "max_events_per_stream",
                retention.max_events_per_stream.map(|n| n.to_string()),
            ),
            limit(
                "max_bytes_per_stream",
                retention.max_bytes_per_stream.map(|n| n.to_string()),
            ),
        ]
        .join(" ");
        if retention.max_age.is_some() {
            Self::ok("retention", value)
        } else {
            Self::warn(
                "retention",
                value,
                "without a maximum age no stream is ever removed, so the store grows with \
                 every new stream: set retention.max_age and run purge_expired periodically \
                 (PurgeTask)",
            )
        }
    }

    /// A risky setting, with its remedy.
    pub fn warn(
        name: impl Into<String>,
        value: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            verdict: Verdict::Warn {
                remedy: remedy.into(),
            },
        }
    }
}

/// What [`EventStore::check`](crate::EventStore::check) found.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use mcp_event_store_core::{EventStore, MemoryStore};
///
/// let report = MemoryStore::new().check().await?;
/// assert_eq!(report.backend, "memory");
/// // Nothing survives the process: the memory store warns about it.
/// assert!(!report.healthy());
/// for setting in &report.settings {
///     println!("{} = {}: {:?}", setting.name, setting.value, setting.verdict);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthReport {
    /// The backend's name (`"sqlite"`, `"postgres"`, ...).
    pub backend: &'static str,
    /// The storage format version the store found (and uses).
    pub format_version: u32,
    /// The settings that decide durability and boundedness.
    pub settings: Vec<Setting>,
}

impl HealthReport {
    /// A report (for backends).
    pub fn new(backend: &'static str, format_version: u32, settings: Vec<Setting>) -> Self {
        Self {
            backend,
            format_version,
            settings,
        }
    }

    /// `true` when no setting warns.
    pub fn healthy(&self) -> bool {
        self.settings.iter().all(|s| s.verdict == Verdict::Ok)
    }
}
