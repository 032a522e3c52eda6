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

use mcp_event_store_core::{Error, Result, StreamKey, StreamToken};

use crate::flusher::Flusher;
use crate::keys::{self, StreamRecord};

/// The backend name in errors and traces.
pub(crate) const BACKEND: &str = "sled";

/// The storage format this release writes and reads (C12).
pub const FORMAT_VERSION: u32 = 1;

pub(crate) const TREE_META: &str = "mcp-event-store/meta";
pub(crate) const TREE_EVENTS: &str = "mcp-event-store/v1/events";
pub(crate) const TREE_STREAMS: &str = "mcp-event-store/v1/streams";
pub(crate) const TREE_STREAM_AGE: &str = "mcp-event-store/v1/stream_age";
pub(crate) const TREE_SESSIONS: &str = "mcp-event-store/v1/sessions";
pub(crate) const TREE_SESSION_EXPIRY: &str = "mcp-event-store/v1/session_expiry";
const OUR_TREES: [&str; 6] = [
    TREE_META,
    TREE_EVENTS,
    TREE_STREAMS,
    TREE_STREAM_AGE,
    TREE_SESSIONS,
    TREE_SESSION_EXPIRY,
];
const SLED_DEFAULT_TREE: &[u8] = b"__sled__default";

pub(crate) const META_FORMAT: &str = "format_version";
pub(crate) const META_STREAM_KEY: &str = "stream_key";
pub(crate) const META_CREATED_BY: &str = "created_by";
/// Bumped after a relaxed session ended without a clean close.
pub(crate) const META_ERA: &str = "era";
/// Present while a handle with interval durability has the database open.
pub(crate) const META_RELAXED: &str = "relaxed_open";
/// The loosest count and byte limits any append has trimmed with.
pub(crate) const META_LOOSEST: &str = "loosest_limits";

/// How far a stream's numbering jumps in a new era: well beyond anything one
/// stream can append within one flush interval (at most an hour), and
/// leaving room for 2^24 eras.
pub(crate) const ERA_SHIFT: u32 = 40;

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
    Error::backend(BACKEND, e)
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
    pub era: u64,
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
    pub(crate) path: PathBuf,
    pub(crate) key: StreamKey,
    /// The current era (see the crate docs on crashes in interval mode).
    pub(crate) era: u64,
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
            .field("era", &self.era)
            .finish_non_exhaustive()
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
        let Loaded { key, era, loosest } = load_meta(&db, &meta)?;
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let relaxed = Arc::new(AtomicBool::new(false));
        let flusher = Flusher::start(db.clone(), meta.clone(), relaxed.clone()).map_err(backend)?;
        Ok(Arc::new(Self {
            flusher,
            path: path.to_owned(),
            key,
            era,
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
    pub(crate) fn kill(&self, token: StreamToken, slot: &Arc<Slot>) {
        slot.dead.store(true, Ordering::SeqCst);
        let mut slots = lock(&self.slots);
        if slots.map.get(&token).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.map.remove(&token);
        }
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
            era: record.era,
            age: record.age,
            first_seq: keys::event_key_seq(&first_key)?,
            last_seq: keys::event_key_seq(&last_key)?,
            bytes,
            last_cum: last_header.cum_bytes,
        }))
    }

    /// Writes a stream's record.
    pub(crate) fn put_record(&self, token: &StreamToken, meta: &StreamMeta) -> Result<()> {
        let record = StreamRecord {
            era: meta.era,
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
    era: u64,
    loosest: (u64, u64),
}

/// Checks the format version (initializing a new database) and loads the
/// stream key, era and loosest limits.
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
                     mcp-event-store-sled {} reads format {FORMAT_VERSION} only. Upgrade \
                     mcp-event-store-sled, or point it at another directory",
                    env!("CARGO_PKG_VERSION")
                )));
            }
            if version == 0 {
                return Err(Error::Corrupt("format version 0 was never written".into()));
            }
            // Older formats would be migrated here; format 1 is the first.
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
    let mut era = read_u64(meta, META_ERA)?.unwrap_or(0);
    if meta.get(META_RELAXED).map_err(backend)?.is_some() {
        // A handle with interval durability had the database open and the
        // process ended without closing it: acknowledged events may be lost,
        // so no stream may reuse their numbers (see the crate docs).
        era += 1;
        if era >= 1 << (64 - ERA_SHIFT) {
            return Err(Error::Corrupt("the era counter is exhausted".into()));
        }
        meta.insert(META_ERA, &era.to_be_bytes()).map_err(backend)?;
        meta.remove(META_RELAXED).map_err(backend)?;
        db.flush().map_err(backend)?;
        tracing::warn!(
            era,
            "the sled database was not closed cleanly while using interval durability; \
             streams continue with new sequence numbers"
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
    Ok(Loaded { key, era, loosest })
}
