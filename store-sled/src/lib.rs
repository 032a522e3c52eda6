//! The [sled](https://docs.rs/sled/0.34.7) backend of **mcp-event-store**:
//! durable, bounded event storage for resumable MCP Streamable HTTP streams,
//! embedded in the server process.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_sled::{SledOptions, SledStore};
//!
//! let store = SledStore::open("/var/lib/my-server/events", SledOptions::default()).await?;
//! let id = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
//! // `id` is durable: send it to the client as the SSE `id:`.
//! store.close().await?;
//! # Ok(()) }
//! ```
//!
//! # Is sled the right choice?
//!
//! sled 0.34 is **beta** software, and its own README says "if reliability
//! is your primary constraint, use SQLite". Its on-disk format is not
//! promised to stay readable (sled 1.0, still in alpha, is a rewrite with a
//! new format), it trades memory and disk space for speed, and a database
//! can be opened by **one process at a time**. This crate pins the stable
//! 0.34.7 line. Choose it when you want
//! a pure-Rust store without a C toolchain and fast replays (a replay is a
//! range scan over memory-resident pages). For most embedded deployments
//! SQLite (`mcp-event-store-sqlite`) is the safer choice: a file format
//! stable for decades, several processes on one file, and mature tooling.
//! To share events between server instances, use PostgreSQL or Redis.
//!
//! # Event ids
//!
//! An event's id is `v1.<token>.<incarnation>-<seq>` in hex (the
//! contract's [`EventId`] scheme, positions as in
//! [`mcp_event_store_core::backend::dense`]): `seq` numbers the stream's events 1, 2,
//! 3, ... and `incarnation` names one life of the stream. When a stream is
//! deleted, or expires whole, and an event is later appended under the same
//! stream id, it starts a new life at `seq` 1 under a new incarnation. No id
//! is ever issued twice in the lifetime of a database, whatever was purged
//! or deleted, and a cursor from an earlier life resumes nothing: replay
//! refuses it with [`Error::UnknownEventId`] (or [`Error::EventsPurged`] for
//! a replay under way when the life ended), and lookup finds nothing.
//!
//! Incarnations come from sled's id generator (`Db::generate_id`), one
//! counter for the whole database: monotonic across restarts and crashes
//! (after a crash it skips past every value it may have handed out
//! unflushed), under either durability setting, and without a flush of its
//! own. Nothing is kept per deleted stream. (Each open of a database that
//! was used before moves the generator on by two million, sled's
//! safety margin, so incarnations grow by that much per restart; a `u64`
//! does not run out.)
//!
//! # Layout
//!
//! A stream's events live in one tree under the key `token ++ seq`, both
//! big-endian (the 15-byte stream token from the contract's id scheme, and
//! the sequence number), so a replay is one ordered range scan, read a page
//! at a time, however many other streams the database holds. Each stream's
//! record (its incarnation, age and stream id), an age index, sessions and
//! a session expiry index are separate trees; the metadata tree keeps the
//! format version ([`FORMAT_VERSION`], checked on open) and the secret
//! stream key, generated once so ids stay valid across restarts.
//!
//! # Upgrading from format 1
//!
//! Format 2 (this release) added the incarnation. The first open of a
//! database written by the previous release (format 1) migrates it: each
//! stream record gets an incarnation (one read of the record and one key
//! read per stream; events, indexes and sessions are kept as they are), and
//! then the format version changes. A crash part way repeats the migration
//! at the next open.
//!
//! Every stream keeps its events and goes on in the same life, under one
//! incarnation above every sequence number format 1 issued, so within a
//! stream the new ids sort after the old ones, and a stream format 1
//! deleted starts again with ids after any it ever had. Ids that release
//! issued (`v1.<token>.<seq>`) still resume and look up their events, which
//! come back under ids of this format. (A stream that format 1 would have
//! jumped to a new era at its next append, after a lost relaxed session,
//! starts a new life then instead.) There is no way back: the previous
//! release refuses a format 2 database, as this one refuses a newer format,
//! with [`Error::IncompatibleFormat`].
//!
//! Writes are single-key operations ordered so that a crash between two of
//! them leaves only harmless leftovers. sled's batches and transactions are
//! avoided: in sled 0.34 they switch the whole process to a global lock that
//! every later operation, and every flush for its whole fsync, then takes.
//!
//! # Durability
//!
//! [`Durability::Flush`] (the default): `store_event` returns only after the
//! event is flushed to disk (C1). One flush runs at a time. An append with
//! no other under way flushes itself on its blocking-pool thread, so a lone
//! writer pays what a raw insert and `flush()` cost; concurrent appends, and
//! those arriving during a flush, share the next flush, which one flusher
//! thread per database runs on behalf of everyone waiting (group flush), so
//! 32 concurrent writers cost about as many fsyncs as one. (Calling sled's
//! `flush_async` from many tasks instead deadlocks in 0.34.7 with eight or
//! more callers.)
//!
//! [`Durability::Interval`]: `store_event` returns once the event is written
//! to sled's in-memory log, and the flusher thread flushes at the given
//! interval. **Loss window:** on a crash (power loss, SIGKILL, panic=abort)
//! events acknowledged within the last interval, plus the time one flush
//! takes, may be lost. A clean close or drop flushes everything.
//!
//! # Never reissuing an id after a crash
//!
//! The trap: sled makes a write visible to readers before it is on disk.
//! If a replay could hand out event 7 before it was flushed, and the process
//! then died, the restarted store would number its next event 7 again; the
//! client holding id 7 would resume *after* the new event 7 and silently
//! miss it.
//!
//! * With `Flush`, readers only see durable events. Each stream has a
//!   durable watermark in memory, moved (by whoever flushed) only after a
//!   flush covering the write succeeded; replays, lookups and cursor checks
//!   never look past it. Every id a client can ever hold, whether returned
//!   by `store_event` or read in a replay, is therefore on disk, and after a
//!   restart numbering resumes after it. (Events written but never
//!   acknowledged may or may not survive a crash; either way nobody saw
//!   their ids.) Sequence numbers are allocated under a per-stream lock in
//!   the one process that can open the database, and the watermark only
//!   moves forward over numbers already written, so no event ever appears
//!   behind a reader's cursor (C6).
//! * With `Interval`, acknowledged ids can be lost by design, so the store
//!   makes sure they are never reused instead. While a relaxed handle is
//!   open, a marker in the metadata says so; a clean close removes it. If
//!   the next open finds it, the previous process died with unflushed,
//!   acknowledged events, so each stream's next sequence numbers may have
//!   been handed out already. The open records an incarnation floor, above
//!   every incarnation issued so far, lost ones included; each stream below
//!   it ends its life at its next append (its events are dropped) and
//!   starts a new one. A client resuming from any id of the old life gets
//!   [`Error::UnknownEventId`] and starts over, instead of silently missing
//!   events. A stream created in the lost session is below the floor too if
//!   it reached the disk; if it did not, its next append starts a new life
//!   anyway, under an incarnation the id generator never handed out before.
//!
//! # One process, many handles
//!
//! sled locks the database directory for the process that opens it.
//! Opening a directory another process holds fails at once with
//! [`Error::Backend`], saying so. Within one process, every [`SledStore::open`] of the same directory
//! (compared by canonical path) shares one underlying `sled::Db`, found in
//! a process-wide registry, so handles see each other's events as soon as
//! `store_event` returns (C11). [`SledStore::handle_with_options`] gives a
//! handle with other options directly. The database closes when the last
//! handle and replay stream are gone: dropping the last handle flushes and
//! closes on the dropping thread (briefly blocking it), so in async code
//! prefer [`SledStore::close`], which does that on the blocking pool.
//!
//! # Blocking
//!
//! Every sled call runs on tokio's blocking thread pool
//! (`spawn_blocking`), never on an executor worker: sled calls can block on
//! I/O (a page not in cache, a full log buffer). Measured here, a 200-byte
//! insert takes 1 us at the median but up to tens of milliseconds at worst
//! while a flush runs. The store therefore needs a tokio runtime; outside
//! one, calls fail with [`Error::Config`].
//!
//! # Retention
//!
//! Count and byte limits are applied inline on every append (removing the
//! oldest events, never the newest). [`EventStore::purge_expired`] applies
//! the age limit by walking an index of streams ordered by their oldest
//! event, so its cost follows what expired, not the database size. It
//! re-applies the count and byte limits to every stream only when some
//! append trimmed with looser limits than the purging handle's (the loosest
//! limits ever used are kept in the metadata), and removes expired sessions
//! through an expiry index. All scans run in bounded batches.
//!
//! # Following
//!
//! [`EventStore::follow_events_after`] replays the events after a cursor,
//! then stays open and yields each event appended to that stream
//! afterwards, in order, each once (C13), until it is dropped, its
//! [`FollowOptions::max_hold`] passes, or an error ends it.
//!
//! **Wake-ups.** Every handle on one directory in this process shares one
//! wake-up hub ([`Wakeups`](mcp_event_store_core::backend::follow::Wakeups)), kept
//! with the shared database like its stream slots. sled lets one process
//! at a time open the directory, so every append any handle can see goes
//! through this process and this hub: there is no other process to hear
//! from, and no listener, thread or connection of any kind. An append wakes
//! its stream's followers right after it becomes visible to readers, never
//! before. A wake-up carries nothing: the follower re-reads by cursor.
//!
//! * With [`Durability::Flush`] that is after the flush covering the event
//!   succeeded, when whoever flushed moves the stream's durable watermark:
//!   a follower never gets an event that is not on disk. This follows the
//!   rule that makes replays safe (see "Never reissuing an id after a
//!   crash"): delivering on write would hand a client an id that a crash
//!   could reissue, and an event whose `store_event` could still fail. The
//!   wake-up comes just before the flusher answers the writer, so a
//!   follower may see an event a few microseconds before `store_event`
//!   returns, but never before it is durable, which is what returning
//!   means.
//! * With [`Durability::Interval`] that is right after the write, as
//!   `store_event` returns: followers get events as early as their writers
//!   are answered, with the same loss window.
//! * Deleting a stream, expiring it whole, or its new life after a lost
//!   relaxed session wakes its followers too: they end with
//!   [`Error::EventsPurged`], as a replay under way does, and never see the
//!   next life. Retention overtaking a slow follower also ends it with
//!   `EventsPurged`, after the events it could still deliver in order.
//!
//! **Latency.** The same through any handle, since the hub is shared:
//! measured here in a debug build on a loaded 2-core machine, from
//! `store_event` returning to the event reaching the follower, a median of
//! 55 to 105 us (the follower's task being scheduled and one read on the
//! blocking pool) and a p99 of about 1 to 3 ms (`cargo test -p
//! mcp-event-store-sled --test follow -- --ignored --nocapture figures`).
//!
//! **What an idle follower costs.** No task, thread, connection or
//! listener: its own stream (polled by whoever consumes it), a receiver in
//! the hub (one entry per followed stream, removed with its last
//! follower), a reference to its stream's in-memory state, and a timer for
//! the re-check while it is polled; about 0.9 KB of memory each (10,000
//! idle followers, measured as above). An append costs one more lock and
//! hash lookup for the wake-up; 1,000 idle followers of other streams
//! made no measurable difference to the append rate. A wake-up or re-check
//! that finds nothing new costs an atomic load, with no blocking call.
//! [`EventStore::open_follows`] counts every follower on the database in
//! this process, whichever handle opened it.
//!
//! An idle follower holds the database only weakly: closing or dropping the
//! last handle still closes the database (and unlocks the directory), and
//! its followers end at once with [`Error::Closed`]. A follow still
//! delivering stored events keeps it open until it has read them, as a
//! replay does.
//!
//! **Re-check.** Correctness never depends on a wake-up: a follower also
//! re-reads every [`SledOptions::follow_recheck`] (default
//! [`DEFAULT_FOLLOW_RECHECK`], 5 s; URL parameter `follow_recheck_ms=N`,
//! from 1 ms to one hour). Since every append wakes its followers, this is
//! only a safety net; it is each handle's own, and applies to the follows
//! opened through it.
//!
//! # Inspecting
//!
//! [`EventStore::check`] touches the database (it reads the format version
//! recorded there) and reports backend `sled`, that format version
//! ([`FORMAT_VERSION`]), and three settings, each `ok` or a warning with
//! its remedy:
//!
//! | setting | value | warns when |
//! |---|---|---|
//! | `durability` | this handle's: `flush` or `flush_interval_ms=N` | an interval: a crash loses the events acknowledged in the last interval |
//! | `database_durability` | `flush`, or the shortest `flush_interval_ms=N` of any handle that used the database since this process opened it | an interval: after a crash every stream drops its events at its next append, whichever handle acknowledged them (see "Never reissuing an id after a crash"); it clears once the database is closed and reopened by `flush` handles only |
//! | `retention` | this handle's `max_age`, `max_events_per_stream` and `max_bytes_per_stream` (`none` when unset) | no `max_age`: nothing ever removes a stream, so the database grows with every new stream (the per-stream limits bound each stream, not how many there are) |
//!
//! sled has no settings of its own that weaken durability: when data
//! reaches the disk is this crate's choice, the `durability` above.
//!
//! [`EventStore::stats`] and [`EventStore::list_streams`] never read a
//! stream's events one by one: a stream's count, bytes and ages come from
//! its first and last retained events (sequence numbers are dense and every
//! event carries the stream's cumulative byte count), the same two reads
//! that load its in-memory state. Both walk the stream records in batches
//! of 256, so their memory stays bounded however many streams there are
//! (and a listing page's by its limit), and count only what a replay can
//! see: an append still waiting for its flush is not counted yet. Listings
//! come in stream token order (a keyed hash of the stream id: stable, not
//! alphabetical); the cursor is the last listed stream's token.
//!
//! Metrics: besides what every backend reports, each group flush records in
//! `mcp_event_store_append_batch_size` how many appends it made durable
//! together. Appends of interval handles wait for no flush and record no
//! batch.
//!
//! # Features
//!
//! * `conformance`: `testing::SledHarness`, the harness that runs the
//!   shared conformance suite against this backend.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod flusher;
mod inspect;
mod keys;
mod ops;
mod shared;

#[cfg(feature = "conformance")]
pub mod testing;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::{
    Page, StreamToken, check_list_limit, follow, observe, paged_replay, validate_session_id,
    validate_stream_id,
};
use mcp_event_store_core::{
    Backend, Error, EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport,
    Replay, Result, SessionStore, Setting, Store, StoreOptions, StoreStats, StreamCursor,
    StreamPage,
};

use crate::flusher::{Ack, FlushResult};
use crate::shared::{NAME, Shared};

pub use crate::shared::FORMAT_VERSION;

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// scheme `sled`, facade feature `sled`. Its `connect` reads the URL with
/// [`SledStore::connect_with`] (the directory, `durability` and
/// `flush_interval_ms`) and applies the shared
/// [`StoreOptions`].
///
/// ```
/// assert!(mcp_event_store_sled::BACKEND.opens("sled:///var/lib/app/events"));
/// ```
pub const BACKEND: Backend = Backend {
    name: NAME,
    schemes: &["sled"],
    feature: "sled",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = SledOptions::default().store(options);
            Ok(Arc::new(SledStore::connect_with(&url, options).await?) as Arc<dyn Store>)
        })
    },
};

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
    fn validate(self) -> Result<()> {
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

/// Default sled page cache: enough to keep recent streams in memory without
/// sled's default of 1 GiB.
pub const DEFAULT_CACHE_CAPACITY: u64 = 256 * 1024 * 1024;

/// How often an idle follower re-reads its stream by default, whatever it
/// was told (see [`SledOptions::follow_recheck`]).
pub const DEFAULT_FOLLOW_RECHECK: Duration = Duration::from_secs(5);

/// The longest accepted follow re-check interval.
pub const MAX_FOLLOW_RECHECK: Duration = Duration::from_secs(60 * 60);

fn validate_recheck(recheck: Duration) -> Result<()> {
    if recheck >= Duration::from_millis(1) && recheck <= MAX_FOLLOW_RECHECK {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "the follow re-check interval must be between 1 ms and one hour, got {recheck:?}"
        )))
    }
}

/// How to open a [`SledStore`].
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::{Retention, StoreOptions};
/// use mcp_event_store_sled::{Durability, SledOptions};
///
/// let options = SledOptions::default()
///     .store(StoreOptions::default().retention(Retention::default().max_events_per_stream(1_000)))
///     .durability(Durability::Interval(Duration::from_millis(50)));
/// # let _ = options;
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
}

/// An [`EventStore`] and [`SessionStore`] in a sled database.
///
/// Cheap to clone; clones share the database and options. See the crate
/// docs for durability, crash behaviour and the one-process rule.
#[derive(Clone)]
pub struct SledStore {
    shared: Arc<Shared>,
    handle: Arc<HandleOptions>,
}

struct HandleOptions {
    store: StoreOptions,
    durability: Durability,
    follow_recheck: Duration,
    /// Whether this handle's limits are recorded (see `Shared::note_limits`).
    limits_noted: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.shared.path)
            .field("durability", &self.handle.durability)
            .finish_non_exhaustive()
    }
}

/// Runs sled work on the blocking pool.
///
/// Measured here (sled 0.34.7, 2 cores, ext4, a flush running alongside):
/// inserting a 200-byte value takes 1 us at the median but 0.2 ms at p99.9
/// and up to 7 to 21 ms at worst, and 64 KiB values reach 1 to 2 ms at p99.
/// Stalls like that must not land on an executor worker, so every sled call,
/// reads included, goes through here.
async fn blocking<T, F>(work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        Error::Config("mcp-event-store-sled must be used inside a tokio runtime".into())
    })?;
    match runtime.spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(Error::backend(NAME, e)),
    }
}

async fn wait_flushed(wait: tokio::sync::oneshot::Receiver<FlushResult>) -> Result<()> {
    flushed(wait.await)
}

fn flushed(
    outcome: std::result::Result<FlushResult, tokio::sync::oneshot::error::RecvError>,
) -> Result<()> {
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::backend(NAME, e)),
        Err(_) => Err(Error::backend(
            NAME,
            "the sled flush this write waited for was abandoned (the flusher stopped)",
        )),
    }
}

impl SledStore {
    /// Opens (creating if needed) the database in directory `path`.
    ///
    /// If this process already has it open, the new handle shares that
    /// database (with its own options). Fails with `Error::Backend` if
    /// another process holds it, and `Error::IncompatibleFormat` if a newer
    /// incompatible release wrote it, or it is not an event store.
    pub async fn open(path: impl AsRef<Path>, options: SledOptions) -> Result<Self> {
        options.store.validate()?;
        options.durability.validate()?;
        validate_recheck(options.follow_recheck)?;
        let path = path.as_ref().to_owned();
        let cache = options.cache_capacity;
        let shared = blocking(move || Shared::open(&path, cache)).await?;
        Self::with_shared(
            shared,
            options.store,
            options.durability,
            options.follow_recheck,
        )
        .await
    }

    /// Opens the database a `sled://` URL names: `sled:///absolute/path` or
    /// `sled://relative/path`, with default options. The query
    /// `?flush_interval_ms=N` selects [`Durability::Interval`];
    /// `?durability=flush` is the default. `?follow_recheck_ms=N` sets
    /// [`SledOptions::follow_recheck`]. Parameters combine with `&`. The
    /// path is taken literally (no percent-decoding).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, SledOptions::default()).await
    }

    /// [`connect`](Self::connect) with options; durability and re-check
    /// interval given in the URL override those in `options`.
    pub async fn connect_with(url: &str, options: SledOptions) -> Result<Self> {
        let url = parse_url(url)?;
        let mut options = match url.durability {
            Some(durability) => options.durability(durability),
            None => options,
        };
        if let Some(recheck) = url.follow_recheck {
            options.follow_recheck = recheck;
        }
        Self::open(url.path, options).await
    }

    /// Another handle on the same database, with other store options (and
    /// this handle's durability and follow re-check interval).
    pub async fn handle_with_options(&self, options: StoreOptions) -> Result<Self> {
        options.validate()?;
        Self::with_shared(
            self.shared.clone(),
            options,
            self.handle.durability,
            self.handle.follow_recheck,
        )
        .await
    }

    async fn with_shared(
        shared: Arc<Shared>,
        store: StoreOptions,
        durability: Durability,
        follow_recheck: Duration,
    ) -> Result<Self> {
        if let Durability::Interval(interval) = durability {
            let shared = shared.clone();
            blocking(move || shared.enter_relaxed(interval)).await?;
        }
        Ok(Self {
            shared,
            handle: Arc::new(HandleOptions {
                store,
                durability,
                follow_recheck,
                limits_noted: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The database directory (canonical).
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// This handle's durability.
    pub fn durability(&self) -> Durability {
        self.handle.durability
    }

    /// This handle's store options.
    pub fn options(&self) -> &StoreOptions {
        &self.handle.store
    }

    /// How often this handle's idle followers re-read their stream.
    pub fn follow_recheck(&self) -> Duration {
        self.handle.follow_recheck
    }

    /// Flushes everything written so far to disk (through the group
    /// flusher). Useful with [`Durability::Interval`] before a planned stop.
    pub async fn flush(&self) -> Result<()> {
        wait_flushed(self.shared.flusher.request(None)).await
    }

    /// Flushes and releases this handle. When it was the last one (and no
    /// replay stream is still open) the database closes, on the blocking
    /// pool, before this returns; until then the directory stays locked.
    pub async fn close(self) -> Result<()> {
        let flushed = self.flush().await;
        blocking(move || {
            drop(self);
            Ok(())
        })
        .await?;
        flushed
    }

    /// Waits for durability if this handle's setting asks for it.
    async fn settle(
        &self,
        wait: Option<tokio::sync::oneshot::Receiver<FlushResult>>,
    ) -> Result<()> {
        match wait {
            Some(wait) => wait_flushed(wait).await,
            None => Ok(()),
        }
    }

    fn relaxed(&self) -> bool {
        matches!(self.handle.durability, Durability::Interval(_))
    }

    /// A flush to wait for after a write other than an append, in `Flush` mode.
    fn flush_after_write(&self) -> Option<tokio::sync::oneshot::Receiver<FlushResult>> {
        if self.relaxed() {
            self.shared.flusher.mark_dirty();
            None
        } else {
            Some(self.shared.flusher.request(None))
        }
    }

    fn now(&self) -> i64 {
        self.handle.store.clock.now_millis()
    }

    /// What [`EventStore::check`] reports, given the database-wide flush
    /// interval of relaxed handles (see the crate docs, "Inspecting").
    fn settings(&self, database_interval: Option<Duration>) -> Vec<Setting> {
        let interval = |d: Duration| format!("flush_interval_ms={}", d.as_millis());
        let durability = match self.handle.durability {
            Durability::Flush => Setting::ok("durability", "flush"),
            Durability::Interval(d) => Setting::warn(
                "durability",
                interval(d),
                "this handle acknowledges events before they are flushed, so a crash loses \
                 those of the last interval: open it with durability=flush (the default; drop \
                 flush_interval_ms from the URL) if acknowledged events must survive a crash",
            ),
        };
        let database = match database_interval {
            None => Setting::ok("database_durability", "flush"),
            Some(d) => Setting::warn(
                "database_durability",
                interval(d),
                "a handle with interval durability has used this database since this process \
                 opened it, so after a crash every stream drops its events at its next append, \
                 even those acknowledged with durability=flush: open every handle on it with \
                 durability=flush",
            ),
        };
        let retention = self.handle.store.retention;
        let retention = Setting::retention(&retention);
        vec![durability, database, retention]
    }

    /// A follow woken through `hub`: the database's own, except in tests
    /// that lose every wake-up on purpose.
    async fn follow_on(
        &self,
        hub: &Arc<mcp_event_store_core::backend::follow::Wakeups>,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        observe::replay(NAME, last_event_id, async {
            let cursor: EventId = last_event_id.parse()?;
            // Subscribed before the first read, so an append published in
            // between wakes this follower.
            let subscription = hub.subscribe(cursor.token);
            let (stream_id, reader, after, first) =
                self.start_replay(last_event_id, cursor).await?;
            let first = Replay {
                stream_id: stream_id.clone(),
                events: reader.clone().stream(after, Some(first)),
            };
            let follower = Follower {
                shared: Arc::downgrade(&self.shared),
                slot: reader.slot.clone(),
                token: reader.token,
                incarnation: reader.incarnation,
                limit: reader.limit,
                stream_id,
            };
            drop(reader);
            Ok(follow::follow(
                NAME,
                first,
                subscription,
                last_event_id.to_owned(),
                self.handle.follow_recheck,
                options,
                move |cursor| std::future::ready(follower.reread(cursor)),
            ))
        })
        .await
    }

    /// Checks a replay's cursor and reads its first page, in one blocking
    /// call (most resumes miss only a few events). Returns the stream id,
    /// the reader for the rest, the sequence number read after, and the
    /// first page.
    async fn start_replay(
        &self,
        last_event_id: &str,
        cursor: EventId,
    ) -> Result<(String, Arc<PageReader>, u64, Page)> {
        let limit = self.handle.store.page_size;
        let shared = self.shared.clone();
        let raw: Arc<str> = last_event_id.into();
        let (stream_id, incarnation, after, slot, first) = blocking({
            let raw = raw.clone();
            move || {
                let (stream_id, incarnation, after, slot) = shared.replay_start(&raw, &cursor)?;
                let first =
                    shared.read_page(&raw, &cursor.token, &slot, incarnation, after, limit)?;
                Ok((stream_id, incarnation, after, slot, first))
            }
        })
        .await?;
        let reader = Arc::new(PageReader {
            shared: self.shared.clone(),
            slot,
            token: cursor.token,
            incarnation,
            raw,
            limit,
        });
        Ok((stream_id, reader, after, first))
    }
}

/// What a follow keeps between reads: the life of the stream it follows
/// (its slot), and the database only weakly, so idle followers never keep
/// a closed store open.
struct Follower {
    shared: std::sync::Weak<Shared>,
    slot: Arc<shared::Slot>,
    token: mcp_event_store_core::backend::StreamToken,
    incarnation: u64,
    limit: usize,
    stream_id: String,
}

impl Follower {
    /// The replay after `cursor`, the newest id this follow delivered (or
    /// the id it opened with). Without a blocking call when nothing new is
    /// visible, which is what most wake-ups of a busy database and every
    /// idle re-check find.
    fn reread(&self, cursor: String) -> Result<Replay> {
        let shared = self.shared.upgrade().ok_or(Error::Closed)?;
        let id: EventId = cursor.parse()?;
        let position = ops::position_in(id.position, self.incarnation, &shared.incarnations);
        if position.major != self.incarnation {
            // Every id a follow delivers, and the cursor it opened with
            // once checked, is of the life it follows.
            return Err(Error::unknown_event_id(&cursor));
        }
        let after = position.minor;
        let nothing_new = !self.slot.is_dead() && self.slot.durable() <= after;
        let reader = Arc::new(PageReader {
            shared,
            slot: self.slot.clone(),
            token: self.token,
            incarnation: self.incarnation,
            raw: cursor.into(),
            limit: self.limit,
        });
        let first = nothing_new.then(|| Page {
            events: Vec::new(),
            last: true,
        });
        Ok(Replay {
            stream_id: self.stream_id.clone(),
            events: reader.stream(after, first),
        })
    }
}

/// Reads one replay's pages. While the caller consumes a page, the next one
/// is already being read on the blocking pool, so at most two pages are in
/// memory and the hop to the blocking pool is hidden behind the caller's work.
struct PageReader {
    shared: Arc<Shared>,
    slot: Arc<shared::Slot>,
    token: mcp_event_store_core::backend::StreamToken,
    /// The life of the stream this replay reads.
    incarnation: u64,
    raw: Arc<str>,
    limit: usize,
}

/// A page being read ahead: the position it reads after, and the read.
type Ahead = Arc<std::sync::Mutex<Option<(u64, tokio::task::JoinHandle<Result<Page>>)>>>;

impl PageReader {
    fn read(self: &Arc<Self>, after: u64) -> impl FnOnce() -> Result<Page> + Send + 'static {
        let reader = self.clone();
        move || {
            reader.shared.read_page(
                &reader.raw,
                &reader.token,
                &reader.slot,
                reader.incarnation,
                after,
                reader.limit,
            )
        }
    }

    /// The events after `after`, starting with `first` if it was read
    /// already (the page after `after`).
    fn stream(
        self: Arc<Self>,
        after: u64,
        first: Option<Page>,
    ) -> futures_core::stream::BoxStream<'static, Result<mcp_event_store_core::StoredEvent>> {
        let mut first = first.map(|page| (after, page));
        let ahead: Ahead = Arc::default();
        paged_replay(
            mcp_event_store_core::backend::dense::position(self.incarnation, after),
            move |position| {
                let after = position.minor;
                let ready = first
                    .take()
                    .filter(|(at, _)| *at == after)
                    .map(|(_, page)| page);
                let pending = shared::lock(&ahead).take();
                let (reader, ahead) = (self.clone(), ahead.clone());
                async move {
                    let page = match (ready, pending) {
                        (Some(page), _) => page,
                        (None, Some((at, read))) if at == after => match read.await {
                            Ok(page) => page?,
                            Err(e) => return Err(Error::backend(NAME, e)),
                        },
                        (None, _) => blocking(reader.read(after)).await?,
                    };
                    if let (false, Some(last), Ok(runtime)) = (
                        page.last,
                        page.events.last(),
                        tokio::runtime::Handle::try_current(),
                    ) {
                        let next = last.id.position.minor;
                        let read = runtime.spawn_blocking(reader.read(next));
                        *shared::lock(&ahead) = Some((next, read));
                    }
                    Ok(page)
                }
            },
        )
    }
}

/// What a `sled://` URL says.
#[derive(Debug, PartialEq, Eq)]
struct SledUrl {
    path: PathBuf,
    durability: Option<Durability>,
    follow_recheck: Option<Duration>,
}

/// Splits a `sled://` URL into its path and parameters.
fn parse_url(url: &str) -> Result<SledUrl> {
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

#[async_trait]
impl EventStore for SledStore {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        observe::append(NAME, stream_id, event.data.len(), async {
            self.handle
                .store
                .check_append(stream_id, event.data.len())?;
            let token = self.shared.key.token(stream_id);
            let now = keys::encode_time(self.now());
            // The one copy of the payload: the blocking task needs to own it.
            let value = keys::encode_event(now, event.retry, event.data);
            let shared = self.shared.clone();
            let stream_id = stream_id.to_owned();
            let retention = self.handle.store.retention;
            let relaxed = self.relaxed();
            // The blocking task runs to the end even if this future is
            // dropped, and whoever flushes publishes the event regardless.
            // With `Flush`, an append with no other under way flushes
            // itself, so a lone writer never waits on another thread.
            let handle = self.handle.clone();
            let _appending = (!relaxed).then(|| self.shared.flusher.appending());
            let (id, ack) = blocking(move || {
                if !handle
                    .limits_noted
                    .load(std::sync::atomic::Ordering::Acquire)
                {
                    shared.note_limits(&retention)?;
                    handle
                        .limits_noted
                        .store(true, std::sync::atomic::Ordering::Release);
                }
                shared.append(&stream_id, token, value, now, retention, relaxed)
            })
            .await?;
            match ack {
                None => {}
                Some(Ack::Flushed(outcome)) => flushed(Ok(outcome))?,
                Some(Ack::Queued(wait)) => wait_flushed(wait).await?,
            }
            Ok(id)
        })
        .await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(NAME, last_event_id, async {
            let cursor: EventId = last_event_id.parse()?;
            let (stream_id, reader, after, first) =
                self.start_replay(last_event_id, cursor).await?;
            Ok(Replay {
                stream_id,
                events: reader.stream(after, Some(first)),
            })
        })
        .await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        self.follow_on(&self.shared.wakeups, last_event_id, options)
            .await
    }

    fn open_follows(&self) -> usize {
        self.shared.wakeups.followers()
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        let Some(id) = EventId::parse(event_id) else {
            return Ok(None);
        };
        let shared = self.shared.clone();
        blocking(move || shared.lookup(&id)).await
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        validate_stream_id(stream_id)?;
        let token = self.shared.key.token(stream_id);
        let shared = self.shared.clone();
        let removed = blocking(move || shared.delete_stream(token)).await?;
        if removed > 0 {
            self.settle(self.flush_after_write()).await?;
        }
        Ok(removed)
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        observe::purge(NAME, async {
            let shared = self.shared.clone();
            let retention = self.handle.store.retention;
            let now = self.now();
            let report = blocking(move || shared.purge(&retention, now)).await?;
            if report != PurgeReport::default() {
                self.settle(self.flush_after_write()).await?;
            }
            Ok(report)
        })
        .await
    }

    async fn stats(&self) -> Result<StoreStats> {
        let shared = self.shared.clone();
        blocking(move || shared.stats()).await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        let limit = check_list_limit(limit)?;
        let after = after
            .map(|cursor| {
                StreamToken::parse(cursor.as_str()).ok_or_else(|| {
                    Error::Config(format!("not a stream cursor of this store: {cursor:?}"))
                })
            })
            .transpose()?;
        let shared = self.shared.clone();
        let (streams, last) = blocking(move || shared.list_streams(after, limit)).await?;
        Ok(StreamPage::new(
            streams,
            last.map(|token| StreamCursor::new(token.to_text())),
        ))
    }

    async fn check(&self) -> Result<HealthReport> {
        let shared = self.shared.clone();
        let (format_version, database_interval) =
            blocking(move || Ok((shared.format_version()?, shared.relaxed_interval()))).await?;
        Ok(HealthReport::new(
            NAME,
            format_version,
            self.settings(database_interval),
        ))
    }
}

#[async_trait]
impl SessionStore for SledStore {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        validate_session_id(session_id)?;
        let max = self.handle.store.max_payload_bytes;
        if state.len() > max {
            return Err(Error::PayloadTooLarge {
                size: state.len(),
                max,
            });
        }
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let expires = keys::encode_time(self.now().saturating_add(ttl));
        let shared = self.shared.clone();
        let session_id = session_id.to_owned();
        let state = state.to_vec();
        blocking(move || shared.put_session(&session_id, expires, &state)).await?;
        self.settle(self.flush_after_write()).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        if validate_session_id(session_id).is_err() {
            return Ok(None);
        }
        let now = keys::encode_time(self.now());
        let shared = self.shared.clone();
        let session_id = session_id.to_owned();
        blocking(move || shared.get_session(&session_id, now)).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        if validate_session_id(session_id).is_err() {
            return Ok(false);
        }
        let now = keys::encode_time(self.now());
        let shared = self.shared.clone();
        let session_id = session_id.to_owned();
        let existed = blocking(move || shared.delete_session(&session_id, now)).await?;
        self.settle(self.flush_after_write()).await?;
        Ok(existed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::TryStreamExt;

    async fn replayed_after(store: &SledStore, id: &EventId) -> Result<Vec<EventId>> {
        let replay = store.replay_events_after(&id.to_string()).await?;
        let events: Vec<_> = replay.events.try_collect().await?;
        Ok(events.into_iter().map(|e| e.id).collect())
    }

    /// The crash-reissue trap: an event that is written but not yet flushed
    /// must be invisible to every reader, and become visible once flushed,
    /// even if the task that appended it was cancelled meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_never_see_an_unflushed_event() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let first = store.store_event("s", NewEvent::new(b"1")).await.unwrap();

        for cancel in [false, true] {
            store.shared.flusher.pause(true);
            let written = store.shared.events.len() + 1;
            let pending = tokio::spawn({
                let store = store.clone();
                async move { store.store_event("s", NewEvent::new(b"next")).await }
            });
            while store.shared.events.len() < written {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let next = EventId::new(
                first.token,
                mcp_event_store_core::backend::dense::position(
                    first.position.major,
                    written as u64,
                ),
            );
            assert!(!pending.is_finished(), "returned before the flush");
            let visible = replayed_after(&store, &first).await.unwrap();
            assert_eq!(
                visible.len(),
                written - 2,
                "an unflushed event was replayed"
            );
            assert_eq!(
                store
                    .get_stream_id_for_event_id(&next.to_string())
                    .await
                    .unwrap(),
                None
            );
            assert!(matches!(
                replayed_after(&store, &next).await,
                Err(Error::UnknownEventId { .. })
            ));
            if cancel {
                pending.abort();
            }
            store.shared.flusher.pause(false);
            if cancel {
                // Whoever flushes publishes it although nobody waits any more.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while store
                    .get_stream_id_for_event_id(&next.to_string())
                    .await
                    .unwrap()
                    .is_none()
                {
                    assert!(std::time::Instant::now() < deadline, "never published");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            } else {
                assert_eq!(pending.await.unwrap().unwrap(), next);
            }
            assert_eq!(
                replayed_after(&store, &first).await.unwrap().last(),
                Some(&next)
            );
        }
        store.close().await.unwrap();
    }

    /// Totals and listings count what replays may see: an event written
    /// but not yet flushed is in neither until its flush, nor is a stream
    /// whose only event is unflushed; a stream record a crash left without
    /// events is no stream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspection_counts_only_durable_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        store.store_event("s", NewEvent::new(b"12")).await.unwrap();
        // A record without events, as a crash between writing a new
        // stream's record and its first event leaves it.
        let token = store.shared.key.token("leftover");
        let record = keys::StreamRecord {
            incarnation: 1,
            age: keys::encode_time(0),
            stream_id: "leftover".into(),
        };
        store
            .shared
            .streams
            .insert(token.as_bytes(), keys::encode_record(&record))
            .unwrap();
        let totals = |stats: StoreStats| (stats.streams, stats.events, stats.bytes);
        assert_eq!(totals(store.stats().await.unwrap()), (1, 1, 2));

        struct Unpause<'a>(&'a flusher::Flusher);
        impl Drop for Unpause<'_> {
            fn drop(&mut self) {
                self.0.pause(false);
            }
        }
        store.shared.flusher.pause(true);
        let unpause = Unpause(&store.shared.flusher);
        let written = store.shared.events.len() + 2;
        let pending: Vec<_> = [("s", &b"345"[..]), ("new", &b"6789"[..])]
            .into_iter()
            .map(|(stream, data)| {
                let store = store.clone();
                tokio::spawn(async move { store.store_event(stream, NewEvent::new(data)).await })
            })
            .collect();
        until(|| store.shared.events.len() >= written).await;
        assert_eq!(totals(store.stats().await.unwrap()), (1, 1, 2));
        let page = store.list_streams(None, 10).await.unwrap();
        let listed: Vec<_> = page
            .streams
            .iter()
            .map(|s| (&s.stream_id[..], s.events))
            .collect();
        assert_eq!(listed, [("s", 1)]);
        assert_eq!(page.next, None);

        drop(unpause);
        for append in pending {
            append.await.unwrap().unwrap();
        }
        assert_eq!(totals(store.stats().await.unwrap()), (2, 3, 9));
        let page = store.list_streams(None, 10).await.unwrap();
        let mut listed: Vec<_> = page
            .streams
            .iter()
            .map(|s| (&s.stream_id[..], s.events, s.bytes))
            .collect();
        listed.sort();
        assert_eq!(listed, [("new", 1, 4), ("s", 2, 5)]);
        store.close().await.unwrap();
    }

    /// Waits (up to ten seconds) until `done` holds.
    async fn until(mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Leader/follower: with no flush running, an append flushes on its own
    /// blocking thread and is visible when it returns, without the flusher
    /// thread (which would cost two more thread hand-offs per append).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_append_flushes_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let first = store.store_event("s", NewEvent::new(b"0")).await.unwrap();
        let flusher = &store.shared.flusher;
        flusher.stall_thread(true);
        let before = flusher.stats();
        for n in 1..=20u64 {
            let id = tokio::time::timeout(
                Duration::from_secs(10),
                store.store_event("s", NewEvent::new(b"x")),
            )
            .await
            .expect("the append waited for the stalled flusher thread")
            .unwrap();
            assert_eq!(id.position.minor, n + 1);
            assert_eq!(
                replayed_after(&store, &first).await.unwrap().last(),
                Some(&id)
            );
        }
        let after = flusher.stats();
        assert_eq!(after.flushes - before.flushes, 20);
        assert_eq!(after.thread_flushes, before.thread_flushes);
        flusher.stall_thread(false);
        store.close().await.unwrap();
    }

    /// An append arriving while another leads a flush neither starts a
    /// second flush alongside it nor returns or becomes visible early: it
    /// waits for the next flush, which the flusher thread runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_during_a_flush_wait_for_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let a0 = store.store_event("a", NewEvent::new(b"0")).await.unwrap();
        let b0 = store.store_event("b", NewEvent::new(b"0")).await.unwrap();
        let flusher = &store.shared.flusher;
        let before = flusher.stats();
        assert_eq!((before.queued, before.flushing), (0, false));
        /// Releases the flushes even if an assertion fails, so the held
        /// blocking task lets the runtime shut down.
        struct Unpause<'a>(&'a flusher::Flusher);
        impl Drop for Unpause<'_> {
            fn drop(&mut self) {
                self.0.pause(false);
            }
        }
        flusher.pause(true);
        let unpause = Unpause(flusher);
        let append = |stream: &'static str| {
            let store = store.clone();
            tokio::spawn(async move { store.store_event(stream, NewEvent::new(b"1")).await })
        };
        let written = store.shared.events.len();
        let leader = append("a");
        until(|| store.shared.events.len() > written).await;
        until(|| flusher.stats().flushing).await;
        assert_eq!(flusher.stats().queued, 0, "the append did not lead");
        let follower = append("b");
        until(|| flusher.stats().queued == 1).await;
        // Time for a wrong second flush to start and publish.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!leader.is_finished() && !follower.is_finished());
        assert_eq!(flusher.stats().flushes, before.flushes + 1);
        assert_eq!(replayed_after(&store, &a0).await.unwrap(), []);
        assert_eq!(replayed_after(&store, &b0).await.unwrap(), []);

        drop(unpause);
        let a1 = leader.await.unwrap().unwrap();
        let b1 = follower.await.unwrap().unwrap();
        assert_eq!(replayed_after(&store, &a0).await.unwrap(), [a1]);
        assert_eq!(replayed_after(&store, &b0).await.unwrap(), [b1]);
        let after = flusher.stats();
        assert_eq!(after.flushes, before.flushes + 2);
        assert_eq!(after.thread_flushes, before.thread_flushes + 1);
        assert_eq!((after.queued, after.flushing), (0, false));
        store.close().await.unwrap();
    }

    /// Under concurrency, whether an append led a flush or waited for one,
    /// its event is durable and visible the moment it returns, and groups
    /// still share flushes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_are_visible_when_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let before = store.shared.flusher.stats();
        let mut tasks = tokio::task::JoinSet::new();
        for writer in 0..16 {
            let store = store.clone();
            tasks.spawn(async move {
                // Two writers per stream, so streams see interleaved appends.
                let stream = format!("s{}", writer / 2);
                for _ in 0..25 {
                    let id = store
                        .store_event(&stream, NewEvent::new(b"x"))
                        .await
                        .unwrap();
                    let found = store
                        .get_stream_id_for_event_id(&id.to_string())
                        .await
                        .unwrap();
                    assert_eq!(found.as_deref(), Some(&stream[..]), "{id} not visible");
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let after = store.shared.flusher.stats();
        assert!(
            after.flushes - before.flushes < 400,
            "no flush was shared: {before:?} {after:?}"
        );
        store.close().await.unwrap();
    }

    /// The safety net: a follower that never gets a wake-up (subscribed to
    /// a hub nobody wakes) still gets every event, through the re-check,
    /// appended through this handle or another, then ends when the
    /// database closes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_recheck_finds_what_lost_wakeups_announced() {
        use futures_util::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let options = SledOptions::default().follow_recheck(Duration::from_millis(10));
        let store = SledStore::open(dir.path(), options.clone()).await.unwrap();
        let other = SledStore::open(dir.path(), options).await.unwrap();
        let head = store.store_event("s", NewEvent::new(b"h")).await.unwrap();
        let deaf = Arc::new(mcp_event_store_core::backend::follow::Wakeups::default());
        let mut follow = store
            .follow_on(&deaf, &head.to_string(), FollowOptions::default())
            .await
            .unwrap();
        assert_eq!(deaf.followers(), 1);
        assert_eq!(store.open_follows(), 0, "not on the database's hub");
        for (n, writer) in [&store, &other, &store].into_iter().enumerate() {
            let id = writer
                .store_event("s", NewEvent::new(&[n as u8]))
                .await
                .unwrap();
            let event = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
                .await
                .expect("the re-check never found it")
                .unwrap()
                .unwrap();
            assert_eq!(event.id, id);
        }
        other.close().await.unwrap();
        store.close().await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
            .await
            .expect("the re-check never found the database closed");
        assert!(matches!(end, Some(Err(Error::Closed))));
        drop(follow);
        assert_eq!(deaf.followers(), 0);
    }

    /// With `Flush`, a follower gets an event only once it is flushed, the
    /// moment it is published to readers, never from the unflushed write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn followers_never_get_an_unflushed_event() {
        use futures_util::StreamExt;
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let head = store.store_event("s", NewEvent::new(b"h")).await.unwrap();
        let mut follow = store
            .follow_events_after(&head.to_string(), FollowOptions::default())
            .await
            .unwrap();
        struct Unpause<'a>(&'a flusher::Flusher);
        impl Drop for Unpause<'_> {
            fn drop(&mut self) {
                self.0.pause(false);
            }
        }
        store.shared.flusher.pause(true);
        let unpause = Unpause(&store.shared.flusher);
        let written = store.shared.events.len() + 1;
        let pending = tokio::spawn({
            let store = store.clone();
            async move { store.store_event("s", NewEvent::new(b"next")).await }
        });
        until(|| store.shared.events.len() >= written).await;
        // Time for a wrong delivery to happen.
        let early = tokio::time::timeout(Duration::from_millis(100), follow.events.next()).await;
        assert!(early.is_err(), "a follower got an unflushed event");
        assert!(!pending.is_finished());
        drop(unpause);
        let event = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
            .await
            .expect("never delivered after the flush")
            .unwrap()
            .unwrap();
        assert_eq!(pending.await.unwrap().unwrap(), event.id);
        drop(follow);
        store.close().await.unwrap();
    }

    #[test]
    fn urls() {
        let url = parse_url("sled:///var/lib/events").unwrap();
        assert_eq!(
            url,
            SledUrl {
                path: PathBuf::from("/var/lib/events"),
                durability: None,
                follow_recheck: None,
            }
        );
        let url = parse_url("sled://data/events?flush_interval_ms=50").unwrap();
        assert_eq!(url.path, PathBuf::from("data/events"));
        assert_eq!(
            url.durability,
            Some(Durability::Interval(Duration::from_millis(50)))
        );
        let url = parse_url("sled://x?durability=flush").unwrap();
        assert_eq!(url.durability, Some(Durability::Flush));
        let url = parse_url("sled://x?follow_recheck_ms=250&flush_interval_ms=5").unwrap();
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
        ] {
            assert!(matches!(parse_url(bad), Err(Error::Config(_))), "{bad}");
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
}
