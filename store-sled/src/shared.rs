//! One open sled database, shared by every handle on it in this process.
//!
//! sled locks its directory for the process that opens it, and a second
//! `sled::open` of the same directory in the same process fails as well. So
//! every [`SledStore`](crate::SledStore) opened on one path shares one
//! [`Shared`], found in a process-wide registry keyed by the canonical path.
//! The registry holds only weak references: the database closes when its
//! last handle (or replay stream) goes.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Weak};

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamKey, StreamToken};
use mcp_event_store_core::{Error, Result};

use crate::flusher::Flusher;
use crate::keys::{self, StreamRecord};

/// The backend name in errors and traces.
pub(crate) const NAME: &str = "sled";

/// The storage format this release writes and reads (C12).
///
/// * 1: the first format. A stream that was deleted or expired whole and
///   then written again numbered its events from 1 again, reissuing ids.
/// * 2: every stream record carries an incarnation, and ids are
///   `<incarnation>-<seq>`. Opening a format 1 database migrates it once
///   (see the crate docs); a database of a newer format is refused.
pub const FORMAT_VERSION: u32 = 2;

pub(crate) const TREE_META: &str = "mcp-event-store/meta";
pub(crate) const TREE_EVENTS: &str = "mcp-event-store/v1/events";
/// Stream records of format 2 (with their incarnation).
pub(crate) const TREE_STREAMS: &str = "mcp-event-store/v2/streams";
/// Stream records of format 1 (with their era); emptied by the migration.
pub(crate) const TREE_STREAMS_V1: &str = "mcp-event-store/v1/streams";
pub(crate) const TREE_STREAM_AGE: &str = "mcp-event-store/v1/stream_age";
pub(crate) const TREE_SESSIONS: &str = "mcp-event-store/v1/sessions";
pub(crate) const TREE_SESSION_EXPIRY: &str = "mcp-event-store/v1/session_expiry";
const OUR_TREES: [&str; 7] = [
    TREE_META,
    TREE_EVENTS,
    TREE_STREAMS,
    TREE_STREAMS_V1,
    TREE_STREAM_AGE,
    TREE_SESSIONS,
    TREE_SESSION_EXPIRY,
];
const SLED_DEFAULT_TREE: &[u8] = b"__sled__default";

pub(crate) const META_FORMAT: &str = "format_version";
pub(crate) const META_STREAM_KEY: &str = "stream_key";
pub(crate) const META_CREATED_BY: &str = "created_by";
/// Format 1 only: bumped after a relaxed session ended without a clean
/// close. Read by the migration, then removed.
const META_ERA: &str = "era";
/// Streams whose incarnation is below this start a new life at their next
/// append; raised after a relaxed session ended without a clean close.
/// Absent: [`Incarnations::floor`]'s default.
pub(crate) const META_FLOOR: &str = "incarnation_floor";
/// The incarnation streams migrated from format 1 went on in; absent in a
/// database created in format 2.
const META_MIGRATED: &str = "format_1_incarnation";
/// Present while a handle with interval durability has the database open.
pub(crate) const META_RELAXED: &str = "relaxed_open";
/// The loosest count and byte limits any append has trimmed with.
pub(crate) const META_LOOSEST: &str = "loosest_limits";

/// Format 1's era jump: after a lost relaxed session, a stream's next
/// append jumped its sequence numbers to `era << 40` + 1, so every
/// sequence number format 1 issued is below `(era + 1) << 40`.
const FORMAT_1_ERA_SHIFT: u32 = 40;

/// How a database hands out and judges incarnations (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Incarnations {
    /// The incarnation streams migrated from format 1 went on in, `None` in
    /// a database created in format 2. It is above every sequence number
    /// format 1 issued, so within a stream ids of format 2 sort after the
    /// ids format 1 spelled `<seq>`. Streams that format 1 would have
    /// jumped to a new era at their next append got the one below it, under
    /// the floor.
    pub(crate) migrated: Option<u64>,
    /// Streams of a lower incarnation start a new life at their next append
    /// ([`META_FLOOR`]).
    pub(crate) floor: u64,
}

impl Incarnations {
    /// What new lives' incarnations add to sled's generated ids (which
    /// start at 0): above every migrated incarnation.
    fn base(&self) -> u64 {
        self.migrated.map_or(1, |m| m + 1)
    }

    /// The incarnation after `generated`, a value of sled's id generator.
    fn drawn(&self, generated: u64) -> Result<u64> {
        generated
            .checked_add(self.base())
            .ok_or_else(|| Error::Corrupt("the incarnation counter is exhausted".into()))
    }

    /// Whether `incarnation` is a life migrated from format 1, whose ids
    /// that format spelled `<seq>`.
    pub(crate) fn is_migrated(&self, incarnation: u64) -> bool {
        self.migrated
            .is_some_and(|m| incarnation == m || incarnation.checked_add(1) == Some(m))
    }
}

/// How long a reopen in the process that closed the database retries
/// sled's lock: sled 0.34's background threads hold the directory lock a
/// moment after the last `sled::Db` is dropped (seen here as a reopen right
/// after `close` failing with "could not acquire lock" in about 5% of runs
/// on a loaded machine).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Slots are swept (idle ones dropped) when the map grows past this.
const SLOT_CACHE: usize = 65_536;

/// Locks a mutex, recovering from poisoning: every critical section in this
/// crate leaves its data consistent before anything that could panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A sled error as the contract's backend error, source kept.
pub(crate) fn backend(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Error {
    Error::backend(NAME, e)
}

/// The in-memory state of one stream: the authority for sequence numbers
/// and for what readers may see.
pub(crate) struct Slot {
    pub(crate) state: Mutex<SlotState>,
    /// The highest sequence number known durable. Readers never look past
    /// it; it moves only after the flush covering the write succeeded.
    durable: AtomicU64,
    /// Set (under `state`'s lock) when the stream is deleted or the slot is
    /// dropped from the map; a holder that sees it must fetch a new slot.
    dead: AtomicBool,
}

/// Whether a slot has read its stream from disk yet.
pub(crate) enum SlotState {
    Unloaded,
    Loaded(Option<StreamMeta>),
}

/// A live stream's counters, rebuilt from disk on load.
#[derive(Clone, Debug)]
pub(crate) struct StreamMeta {
    pub stream_id: Arc<str>,
    /// This life of the stream (see the crate docs on ids).
    pub incarnation: u64,
    /// What the `stream_age` index files it under.
    pub age: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Retained payload bytes.
    pub bytes: u64,
    /// `cum_bytes` of the last event.
    pub last_cum: u64,
}

impl StreamMeta {
    pub(crate) fn count(&self) -> u64 {
        self.last_seq - self.first_seq + 1
    }
}

impl Slot {
    fn new() -> Self {
        Self {
            state: Mutex::new(SlotState::Unloaded),
            durable: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        }
    }

    pub(crate) fn durable(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    /// Makes everything up to `seq` visible to readers.
    pub(crate) fn publish(&self, seq: u64) {
        self.durable.fetch_max(seq, Ordering::AcqRel);
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

struct SlotMap {
    map: HashMap<StreamToken, Arc<Slot>>,
    sweep_at: usize,
}

impl SlotMap {
    /// Drops slots nobody holds whose writes are all published: reloading
    /// them from disk later gives the same state.
    fn sweep(&mut self) {
        self.map.retain(|_, slot| {
            if Arc::strong_count(slot) > 1 {
                return true;
            }
            let Ok(state) = slot.state.try_lock() else {
                return true;
            };
            match &*state {
                SlotState::Loaded(Some(meta)) => slot.durable() < meta.last_seq,
                _ => false,
            }
        });
        self.sweep_at = SLOT_CACHE.max(self.map.len() * 2);
    }
}

/// Wakes openers waiting for this database to finish closing.
#[derive(Default)]
struct CloseSignal {
    /// When the database finished closing.
    closed: Mutex<Option<std::time::Instant>>,
    cv: Condvar,
}

impl CloseSignal {
    fn wait(&self) {
        let mut closed = lock(&self.closed);
        while closed.is_none() {
            closed = self
                .cv
                .wait(closed)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    fn closed_at(&self) -> Option<std::time::Instant> {
        *lock(&self.closed)
    }
}

/// The last field of [`Shared`]: fields drop in order, so by the time this
/// signals, the flusher is joined and every sled handle is dropped.
struct Closer(Arc<CloseSignal>);

impl Drop for Closer {
    fn drop(&mut self) {
        *lock(&self.0.closed) = Some(std::time::Instant::now());
        self.0.cv.notify_all();
    }
}

/// One open database. Field order matters for drop: the flusher's final
/// flush first, the sled handles next, the close signal last.
pub(crate) struct Shared {
    pub(crate) flusher: Flusher,
    /// Wakes followers of a stream once its appends are visible to readers:
    /// one hub for every handle on this database in the process (the
    /// flusher holds it too, to wake after publishing).
    pub(crate) wakeups: Arc<Wakeups>,
    pub(crate) path: PathBuf,
    pub(crate) key: StreamKey,
    /// The incarnation floor and the migrated incarnation.
    pub(crate) incarnations: Incarnations,
    slots: Mutex<SlotMap>,
    /// Serializes session writes, which touch two trees.
    pub(crate) session_lock: Mutex<()>,
    /// The loosest (events, bytes) limits appends have used ([`META_LOOSEST`]).
    loosest: Mutex<(u64, u64)>,
    /// Whether this process wrote the relaxed marker (shared with the flusher).
    relaxed: Arc<AtomicBool>,
    relaxed_lock: Mutex<()>,
    pub(crate) events: sled::Tree,
    pub(crate) streams: sled::Tree,
    pub(crate) stream_age: sled::Tree,
    pub(crate) sessions: sled::Tree,
    pub(crate) session_expiry: sled::Tree,
    pub(crate) meta: sled::Tree,
    pub(crate) db: sled::Db,
    _closer: Closer,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("path", &self.path)
            .field("incarnations", &self.incarnations)
            .finish_non_exhaustive()
    }
}

impl Drop for Shared {
    /// Followers hold the database only weakly while they wait: wake them
    /// all, so each finds it closed at once and ends with
    /// [`Error::Closed`] instead of at its next re-check.
    fn drop(&mut self) {
        self.wakeups.wake_all();
    }
}

struct RegEntry {
    shared: Weak<Shared>,
    closed: Arc<CloseSignal>,
}

static REGISTRY: LazyLock<Mutex<HashMap<PathBuf, RegEntry>>> = LazyLock::new(Mutex::default);

/// The error for a database directory another process holds.
#[derive(Debug)]
pub(crate) struct Locked {
    path: PathBuf,
    source: sled::Error,
}

impl fmt::Display for Locked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the sled database at {} is locked by another process (sled allows one process \
             per database; serve it from one process, or use the SQLite or PostgreSQL backend \
             to share events between processes)",
            self.path.display()
        )
    }
}

impl StdError for Locked {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().starts_with("could not acquire lock"))
}

impl Shared {
    /// The shared database at `path`, opening it if this process has not.
    /// Blocking.
    pub(crate) fn open(path: &Path, cache_capacity: u64) -> Result<Arc<Self>> {
        std::fs::create_dir_all(path).map_err(backend)?;
        let canonical = std::fs::canonicalize(path).map_err(backend)?;
        // When this process last closed the database, if it did: a lock
        // error soon after is sled's background threads, which outlive the
        // `sled::Db` by a moment, not another process.
        let mut closed_here: Option<std::time::Instant> = None;
        loop {
            let mut registry = lock(&REGISTRY);
            if let Some(entry) = registry.get(&canonical) {
                if let Some(shared) = entry.shared.upgrade() {
                    return Ok(shared);
                }
                let Some(closed_at) = entry.closed.closed_at() else {
                    // The last handle is dropping right now; sled still holds
                    // the directory lock until it finishes.
                    let closing = entry.closed.clone();
                    drop(registry);
                    closing.wait();
                    continue;
                };
                closed_here = Some(closed_at);
            }
            // Opened under the registry lock, so two tasks of this process
            // never race to open one directory.
            let db = match sled::Config::new()
                .path(&canonical)
                .cache_capacity(cache_capacity)
                .open()
            {
                Ok(db) => db,
                Err(e)
                    if is_lock_error(&e)
                        && closed_here.is_some_and(|at| at.elapsed() < RELEASE_WAIT) =>
                {
                    drop(registry);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    continue;
                }
                Err(e) if is_lock_error(&e) => {
                    return Err(backend(Locked {
                        path: canonical,
                        source: e,
                    }));
                }
                Err(e) => return Err(backend(e)),
            };
            let shared = Self::open_new(&canonical, db)?;
            // Closed entries stay a while, for the retry above.
            registry.retain(|_, entry| {
                entry.shared.strong_count() > 0
                    || entry
                        .closed
                        .closed_at()
                        .is_none_or(|at| at.elapsed() < RELEASE_WAIT)
            });
            registry.insert(
                canonical,
                RegEntry {
                    shared: Arc::downgrade(&shared),
                    closed: shared._closer.0.clone(),
                },
            );
            return Ok(shared);
        }
    }

    fn open_new(path: &Path, db: sled::Db) -> Result<Arc<Self>> {
        let meta = open_meta(&db, path)?;
        let Loaded {
            key,
            incarnations,
            loosest,
        } = load_meta(&db, &meta)?;
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let relaxed = Arc::new(AtomicBool::new(false));
        let wakeups = Arc::new(Wakeups::default());
        let flusher = Flusher::start(db.clone(), meta.clone(), relaxed.clone(), wakeups.clone())
            .map_err(backend)?;
        Ok(Arc::new(Self {
            flusher,
            wakeups,
            path: path.to_owned(),
            key,
            incarnations,
            slots: Mutex::new(SlotMap {
                map: HashMap::new(),
                sweep_at: SLOT_CACHE,
            }),
            session_lock: Mutex::new(()),
            loosest: Mutex::new(loosest),
            relaxed,
            relaxed_lock: Mutex::new(()),
            events: tree(TREE_EVENTS)?,
            streams: tree(TREE_STREAMS)?,
            stream_age: tree(TREE_STREAM_AGE)?,
            sessions: tree(TREE_SESSIONS)?,
            session_expiry: tree(TREE_SESSION_EXPIRY)?,
            meta,
            db,
            _closer: Closer(Arc::default()),
        }))
    }

    /// Records, durably and before the first relaxed append, that a handle
    /// with interval durability is in use. Blocking.
    pub(crate) fn enter_relaxed(&self, interval: std::time::Duration) -> Result<()> {
        let _guard = lock(&self.relaxed_lock);
        if !self.relaxed.load(Ordering::Acquire) {
            self.meta.insert(META_RELAXED, &[1u8]).map_err(backend)?;
            self.db.flush().map_err(backend)?;
            self.relaxed.store(true, Ordering::Release);
        }
        self.flusher.flush_every(interval);
        Ok(())
    }

    /// The shortest flush interval of the handles with interval durability
    /// that have used this database since this process opened it, if any.
    /// Until the database closes cleanly, a crash then makes every stream
    /// start a new life (see the crate docs), whichever handle acknowledged
    /// its events.
    pub(crate) fn relaxed_interval(&self) -> Option<std::time::Duration> {
        // Only `enter_relaxed` sets an interval, after writing the marker.
        self.flusher.interval()
    }

    /// Records that appends trim with these limits, before the first such
    /// append. Streams can only exceed a limit tighter than every limit
    /// recorded here, so the purge skips its full scan otherwise.
    /// Blocking.
    pub(crate) fn note_limits(&self, retention: &mcp_event_store_core::Retention) -> Result<()> {
        let wanted = limits(retention);
        let mut loosest = lock(&self.loosest);
        let merged = (loosest.0.max(wanted.0), loosest.1.max(wanted.1));
        if merged != *loosest {
            // Written before the handle's first append, so sled's ordered
            // recovery never keeps those events without this record.
            let mut value = [0u8; 16];
            value[..8].copy_from_slice(&merged.0.to_be_bytes());
            value[8..].copy_from_slice(&merged.1.to_be_bytes());
            self.meta.insert(META_LOOSEST, &value).map_err(backend)?;
            *loosest = merged;
        }
        Ok(())
    }

    /// Whether some stream may exceed these limits.
    pub(crate) fn limits_may_be_exceeded(
        &self,
        retention: &mcp_event_store_core::Retention,
    ) -> bool {
        let (events, bytes) = limits(retention);
        let loosest = *lock(&self.loosest);
        loosest.0 > events || loosest.1 > bytes
    }

    /// The slot of `token`, created (unloaded) if missing.
    fn slot(&self, token: StreamToken) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.map.get(&token) {
            return slot.clone();
        }
        if slots.map.len() >= slots.sweep_at {
            slots.sweep();
        }
        let slot = Arc::new(Slot::new());
        slots.map.insert(token, slot.clone());
        slot
    }

    /// Marks `slot` dead and forgets it. Call with its state locked.
    /// Followers of the stream wake up and find their life ended.
    pub(crate) fn kill(&self, token: StreamToken, slot: &Arc<Slot>) {
        slot.dead.store(true, Ordering::SeqCst);
        {
            let mut slots = lock(&self.slots);
            if slots.map.get(&token).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                slots.map.remove(&token);
            }
        }
        self.wakeups.wake(&token);
    }

    /// Runs `f` on the stream's live slot with its state locked and loaded.
    /// Every change to a stream goes through here, so its slot is the one
    /// place its sequence numbers come from. Blocking.
    pub(crate) fn with_stream<T>(
        &self,
        token: StreamToken,
        f: impl FnOnce(&Arc<Slot>, &mut Option<StreamMeta>) -> Result<T>,
    ) -> Result<T> {
        loop {
            let slot = self.slot(token);
            let mut state = lock(&slot.state);
            if slot.is_dead() {
                continue;
            }
            if matches!(*state, SlotState::Unloaded) {
                let meta = self.load_stream(&token)?;
                // Nothing of this stream was written through a live slot
                // before this load, so everything on disk is durable.
                slot.durable
                    .store(meta.as_ref().map_or(0, |m| m.last_seq), Ordering::Release);
                *state = SlotState::Loaded(meta);
            }
            let SlotState::Loaded(meta) = &mut *state else {
                unreachable!("loaded just above");
            };
            return f(&slot, meta);
        }
    }

    /// Reads a stream's record and its first and last events.
    fn load_stream(&self, token: &StreamToken) -> Result<Option<StreamMeta>> {
        let Some(record) = self.streams.get(token.as_bytes()).map_err(backend)? else {
            return Ok(None);
        };
        let record = keys::decode_record(&record)?;
        let range = keys::event_key(token, 0)..=keys::event_key(token, u64::MAX);
        let Some(first) = self.events.range(range.clone()).next() else {
            // A record without events: left by a delete or a create that a
            // crash interrupted. The stream does not exist.
            return Ok(None);
        };
        let (first_key, first_value) = first.map_err(backend)?;
        let (last_key, last_value) = match self.events.range(range).next_back() {
            Some(last) => last.map_err(backend)?,
            None => (first_key.clone(), first_value.clone()),
        };
        let first_header = keys::decode_event(&first_value)?;
        let last_header = keys::decode_event(&last_value)?;
        let bytes = last_header
            .cum_bytes
            .checked_sub(first_header.cum_bytes)
            .and_then(|b| b.checked_add(keys::payload_len(&first_value).ok()?))
            .ok_or_else(|| Error::Corrupt("stream byte counts are inconsistent".into()))?;
        Ok(Some(StreamMeta {
            stream_id: record.stream_id.into(),
            incarnation: record.incarnation,
            age: record.age,
            first_seq: keys::event_key_seq(&first_key)?,
            last_seq: keys::event_key_seq(&last_key)?,
            bytes,
            last_cum: last_header.cum_bytes,
        }))
    }

    /// An incarnation for a new life of a stream, never handed out before
    /// in this database: sled's generated ids are monotonic across
    /// restarts, crashes included (a restart skips past every id that may
    /// have been handed out unflushed), so this holds under every
    /// durability setting, with no flush of its own.
    pub(crate) fn next_incarnation(&self) -> Result<u64> {
        self.incarnations
            .drawn(self.db.generate_id().map_err(backend)?)
    }

    /// Writes a stream's record.
    pub(crate) fn put_record(&self, token: &StreamToken, meta: &StreamMeta) -> Result<()> {
        let record = StreamRecord {
            incarnation: meta.incarnation,
            age: meta.age,
            stream_id: meta.stream_id.to_string(),
        };
        self.streams
            .insert(token.as_bytes(), keys::encode_record(&record))
            .map_err(backend)?;
        Ok(())
    }
}

/// Opens the metadata tree, refusing databases that are not ours.
fn open_meta(db: &sled::Db, path: &Path) -> Result<sled::Tree> {
    let names = db.tree_names();
    if !names.iter().any(|n| &n[..] == TREE_META.as_bytes()) {
        // Not (yet) an event store: only accept an empty database, so a
        // wrong path never gets our trees written into someone else's data.
        let foreign = !db.is_empty()
            || names.iter().any(|n| {
                &n[..] != SLED_DEFAULT_TREE
                    && !OUR_TREES.iter().any(|ours| &n[..] == ours.as_bytes())
                    && db.open_tree(n).map(|t| !t.is_empty()).unwrap_or(true)
            });
        if foreign {
            return Err(Error::IncompatibleFormat(format!(
                "{} holds a sled database that mcp-event-store-sled did not write; refusing to \
                 use it",
                path.display()
            )));
        }
    }
    db.open_tree(TREE_META).map_err(backend)
}

fn read_u64(meta: &sled::Tree, key: &str) -> Result<Option<u64>> {
    match meta.get(key).map_err(backend)? {
        None => Ok(None),
        Some(v) => {
            let raw: [u8; 8] = v[..]
                .try_into()
                .map_err(|_| Error::Corrupt(format!("metadata {key:?} is malformed")))?;
            Ok(Some(u64::from_be_bytes(raw)))
        }
    }
}

/// A retention's count and byte limits, `u64::MAX` for none.
fn limits(retention: &mcp_event_store_core::Retention) -> (u64, u64) {
    (
        retention.max_events_per_stream.unwrap_or(u64::MAX),
        retention.max_bytes_per_stream.unwrap_or(u64::MAX),
    )
}

/// What the metadata tree holds, once checked.
struct Loaded {
    key: StreamKey,
    incarnations: Incarnations,
    loosest: (u64, u64),
}

/// Checks the format version (initializing a new database, migrating an
/// older one) and loads the stream key, incarnation floor and loosest
/// limits.
fn load_meta(db: &sled::Db, meta: &sled::Tree) -> Result<Loaded> {
    match meta.get(META_FORMAT).map_err(backend)? {
        Some(raw) => {
            let version = <[u8; 4]>::try_from(&raw[..])
                .map(u32::from_be_bytes)
                .map_err(|_| Error::Corrupt("format version record is malformed".into()))?;
            if version > FORMAT_VERSION {
                let writer = meta
                    .get(META_CREATED_BY)
                    .ok()
                    .flatten()
                    .map(|v| String::from_utf8_lossy(&v).into_owned())
                    .unwrap_or_else(|| "an unknown release".into());
                return Err(Error::IncompatibleFormat(format!(
                    "this sled database uses storage format {version} (created by {writer}); \
                     mcp-event-store-sled {} reads formats 1 to {FORMAT_VERSION} only. Upgrade \
                     mcp-event-store-sled, or point it at another directory",
                    env!("CARGO_PKG_VERSION")
                )));
            }
            if version == 0 {
                return Err(Error::Corrupt("format version 0 was never written".into()));
            }
            if version == 1 {
                migrate_format_1(db, meta)?;
            }
            clear_format_1_records(db)?;
        }
        None => {
            let key = StreamKey::generate()?;
            // The key and creator before the version: the version marks the
            // database as initialized.
            meta.insert(META_STREAM_KEY, &key.as_bytes()[..])
                .map_err(backend)?;
            meta.insert(
                META_CREATED_BY,
                concat!("mcp-event-store-sled ", env!("CARGO_PKG_VERSION")).as_bytes(),
            )
            .map_err(backend)?;
            meta.insert(META_FORMAT, &FORMAT_VERSION.to_be_bytes())
                .map_err(backend)?;
            db.flush().map_err(backend)?;
        }
    }
    let key = meta
        .get(META_STREAM_KEY)
        .map_err(backend)?
        .ok_or_else(|| Error::Corrupt("the stream key is missing".into()))?;
    let key = StreamKey::from_bytes(&key)?;
    let migrated = read_u64(meta, META_MIGRATED)?;
    let mut incarnations = Incarnations {
        migrated,
        floor: read_u64(meta, META_FLOOR)?.unwrap_or(migrated.unwrap_or(0)),
    };
    if meta.get(META_RELAXED).map_err(backend)?.is_some() {
        // A handle with interval durability had the database open and the
        // process ended without closing it: acknowledged events may be lost,
        // so no stream may reuse their sequence numbers (see the crate
        // docs). Every incarnation handed out so far, lost ones included,
        // is below a freshly generated one.
        let floor = incarnations.drawn(db.generate_id().map_err(backend)?)?;
        incarnations.floor = floor;
        meta.insert(META_FLOOR, &floor.to_be_bytes())
            .map_err(backend)?;
        meta.remove(META_RELAXED).map_err(backend)?;
        db.flush().map_err(backend)?;
        tracing::warn!(
            floor,
            "the sled database was not closed cleanly while using interval durability; \
             each stream starts a new life, with new ids, at its next append"
        );
    }
    let loosest = match meta.get(META_LOOSEST).map_err(backend)? {
        None => (0, 0),
        Some(v) if v.len() == 16 => {
            let half = |at: usize| {
                let mut raw = [0u8; 8];
                raw.copy_from_slice(&v[at..at + 8]);
                u64::from_be_bytes(raw)
            };
            (half(0), half(8))
        }
        Some(_) => return Err(Error::Corrupt("the recorded limits are malformed".into())),
    };
    Ok(Loaded {
        key,
        incarnations,
        loosest,
    })
}

/// Migrates a format 1 database to format 2, at open, before any handle
/// can use it: every stream record gets an incarnation and moves to
/// [`TREE_STREAMS`]. Events, indexes and sessions keep their layout, so
/// this reads one record and one event key per stream.
///
/// A migrated stream keeps its events and sequence numbers, and goes on in
/// incarnation [`Incarnations::migrated`], `(era + 1) << 40`: above every
/// sequence number format 1 issued, to this stream id or to any other. A
/// stream format 1 would have jumped to a new era at its next append (it
/// had not appended since the database last lost a relaxed session) gets
/// the incarnation below, under the floor: it starts a new life then
/// instead.
///
/// Crash-safe: the new records go to their own tree, and the format version
/// changes only once they are all on disk, so an interrupted migration
/// starts over at the next open.
fn migrate_format_1(db: &sled::Db, meta: &sled::Tree) -> Result<()> {
    let era = read_u64(meta, META_ERA)?.unwrap_or(0);
    // Format 1 numbered events appended in era `era` from `era_base` + 1 on.
    let out_of_range = || Error::Corrupt(format!("the format 1 era {era} is out of range"));
    let era_base =
        u64::try_from(u128::from(era) << FORMAT_1_ERA_SHIFT).map_err(|_| out_of_range())?;
    let migrated =
        u64::try_from((u128::from(era) + 1) << FORMAT_1_ERA_SHIFT).map_err(|_| out_of_range())?;
    let old = db.open_tree(TREE_STREAMS_V1).map_err(backend)?;
    let new = db.open_tree(TREE_STREAMS).map_err(backend)?;
    let events = db.open_tree(TREE_EVENTS).map_err(backend)?;
    // Whatever an interrupted migration wrote.
    new.clear().map_err(backend)?;
    let (mut streams, mut stale) = (0u64, 0u64);
    for item in old.iter() {
        let (key, value) = item.map_err(backend)?;
        let token = StreamToken::from_bytes(&key)
            .ok_or_else(|| Error::Corrupt("malformed stream key".into()))?;
        let mut record = keys::decode_record(&value)?;
        let range = keys::event_key(&token, 0)..=keys::event_key(&token, u64::MAX);
        let Some(last) = events.range(range).keys().next_back() else {
            // A record without events is no stream, in either format.
            continue;
        };
        record.incarnation = if keys::event_key_seq(&last.map_err(backend)?)? > era_base {
            migrated
        } else {
            stale += 1;
            migrated - 1
        };
        new.insert(&key, keys::encode_record(&record))
            .map_err(backend)?;
        streams += 1;
    }
    meta.insert(META_MIGRATED, &migrated.to_be_bytes())
        .map_err(backend)?;
    db.flush().map_err(backend)?;
    meta.insert(META_FORMAT, &FORMAT_VERSION.to_be_bytes())
        .map_err(backend)?;
    meta.remove(META_ERA).map_err(backend)?;
    db.flush().map_err(backend)?;
    tracing::info!(
        streams,
        stale,
        "migrated the sled database from storage format 1 to {FORMAT_VERSION}"
    );
    Ok(())
}

/// Empties format 1's stream records once the migration is on disk (right
/// after it, or at a later open if a crash came first). Nothing reads them.
fn clear_format_1_records(db: &sled::Db) -> Result<()> {
    let name = TREE_STREAMS_V1.as_bytes();
    if !db.tree_names().iter().any(|n| &n[..] == name) {
        return Ok(());
    }
    db.open_tree(name)
        .map_err(backend)?
        .clear()
        .map_err(backend)
}
