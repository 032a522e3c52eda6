//! Opening a database: the process-wide registry that gives every handle on
//! one directory the same [`Shared`], sled's directory lock, the metadata
//! checks (a foreign database, the format version, C12), the migration from
//! format 1, and the stream secret, generated once and kept in the
//! metadata.
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
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamKey, StreamToken};
use mcp_event_store_core::{Error, Result};

use crate::FORMAT_VERSION;
use crate::error::backend;
use crate::flusher::Flusher;
use crate::keys::{
    self, META_CREATED_BY, META_ERA, META_FLOOR, META_FORMAT, META_LOOSEST, META_MIGRATED,
    META_RELAXED, META_STREAM_KEY, META_TASK_FORMAT, TASK_FORMAT, TREE_EVENTS, TREE_META,
    TREE_REDEEM_EXPIRY, TREE_REDEEMED, TREE_SESSION_EXPIRY, TREE_SESSIONS, TREE_STREAM_AGE,
    TREE_STREAMS, TREE_STREAMS_V1, TREE_TASK_INSTANCES, TREE_TASK_PURGE, TREE_TASKS,
};
use crate::shared::{CloseSignal, Closer, Incarnations, Shared, lock};
use crate::slot::SlotMap;

/// Every tree this crate has ever written.
const OUR_TREES: [&str; 12] = [
    TREE_META,
    TREE_EVENTS,
    TREE_STREAMS,
    TREE_STREAMS_V1,
    TREE_STREAM_AGE,
    TREE_SESSIONS,
    TREE_SESSION_EXPIRY,
    TREE_TASKS,
    TREE_TASK_PURGE,
    TREE_TASK_INSTANCES,
    TREE_REDEEMED,
    TREE_REDEEM_EXPIRY,
];
const SLED_DEFAULT_TREE: &[u8] = b"__sled__default";

/// Format 1's era jump: after a lost relaxed session, a stream's next
/// append jumped its sequence numbers to `era << 40` + 1, so every
/// sequence number format 1 issued is below `(era + 1) << 40`.
const FORMAT_1_ERA_SHIFT: u32 = 40;

/// How long a reopen in the process that closed the database retries
/// sled's lock: sled 0.34's background threads hold the directory lock a
/// moment after the last `sled::Db` is dropped (seen here as a reopen right
/// after `close` failing with "could not acquire lock" in about 5% of runs
/// on a loaded machine).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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
                    closed: shared.closer.0.clone(),
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
        check_task_format(&meta)?;
        let tree = |name: &str| db.open_tree(name).map_err(backend);
        let relaxed = Arc::new(AtomicBool::new(false));
        let wakeups = Arc::new(Wakeups::default());
        let flusher = Flusher::start(db.clone(), meta.clone(), relaxed.clone(), wakeups.clone())
            .map_err(backend)?;
        Ok(Arc::new(Self {
            flusher,
            wakeups,
            task_wakeups: Arc::new(Wakeups::default()),
            path: path.to_owned(),
            key,
            incarnations,
            slots: Mutex::new(SlotMap::new()),
            session_lock: Mutex::new(()),
            loosest: Mutex::new(loosest),
            relaxed,
            relaxed_lock: Mutex::new(()),
            events: tree(TREE_EVENTS)?,
            streams: tree(TREE_STREAMS)?,
            stream_age: tree(TREE_STREAM_AGE)?,
            sessions: tree(TREE_SESSIONS)?,
            session_expiry: tree(TREE_SESSION_EXPIRY)?,
            tasks: tree(TREE_TASKS)?,
            task_purge: tree(TREE_TASK_PURGE)?,
            task_instances: tree(TREE_TASK_INSTANCES)?,
            redeemed: tree(TREE_REDEEMED)?,
            redeem_expiry: tree(TREE_REDEEM_EXPIRY)?,
            meta,
            db,
            closer: Closer(Arc::default()),
        }))
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

/// Refuses a database whose tasks a newer release wrote in a newer task
/// format ([`TASK_FORMAT`]), changing nothing; records the task format in
/// a database that has none yet. The event format is not involved: a
/// release without tasks ignores this record and the task trees.
fn check_task_format(meta: &sled::Tree) -> Result<()> {
    match meta.get(META_TASK_FORMAT).map_err(backend)? {
        Some(raw) => {
            let version = <[u8; 4]>::try_from(&raw[..])
                .map(u32::from_be_bytes)
                .map_err(|_| Error::Corrupt("task format record is malformed".into()))?;
            if version > TASK_FORMAT {
                return Err(Error::IncompatibleFormat(format!(
                    "this sled database stores tasks in task format {version}; \
                     mcp-event-store-sled {} reads task format {TASK_FORMAT} only. Upgrade \
                     mcp-event-store-sled, or point it at another directory",
                    env!("CARGO_PKG_VERSION")
                )));
            }
        }
        None => {
            meta.insert(META_TASK_FORMAT, &TASK_FORMAT.to_be_bytes())
                .map_err(backend)?;
        }
    }
    Ok(())
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

/// Records `version` as the format of the database at `path`, in the
/// metadata tree's format record, where a release writing that format
/// keeps it: for the harness's format check (C12). Blocking; the database
/// must not be open in this process.
///
/// Opened with sled directly, under the registry's lock, retrying sled's
/// lock for a moment after a close here ([`RELEASE_WAIT`]); afterwards the
/// registry notes the close, so the next open here retries the same way.
#[cfg(feature = "conformance")]
pub(crate) fn write_format_version(path: &Path, version: u32) -> Result<()> {
    write_meta_version(path, META_FORMAT, version)
}

/// Records `version` as the task format of the database at `path`, as
/// [`write_format_version`] does the format: for the harness's task format
/// check (T12).
#[cfg(feature = "conformance")]
pub(crate) fn write_task_format(path: &Path, version: u32) -> Result<()> {
    write_meta_version(path, META_TASK_FORMAT, version)
}

/// Writes one version record of the metadata tree; see
/// [`write_format_version`].
#[cfg(feature = "conformance")]
fn write_meta_version(path: &Path, key: &str, version: u32) -> Result<()> {
    let canonical = std::fs::canonicalize(path).map_err(backend)?;
    let mut registry = lock(&REGISTRY);
    if registry
        .get(&canonical)
        .is_some_and(|entry| entry.shared.strong_count() > 0)
    {
        return Err(Error::Config(format!(
            "{} is open in this process; close it before rewriting its format",
            canonical.display()
        )));
    }
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    let db = loop {
        match sled::Config::new().path(&canonical).open() {
            Ok(db) => break db,
            Err(e) if is_lock_error(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => return Err(backend(e)),
        }
    };
    let written = open_meta(&db, &canonical).and_then(|meta| {
        meta.insert(key, &version.to_be_bytes()).map_err(backend)?;
        db.flush().map_err(backend)
    });
    drop(db);
    let closed = CloseSignal::default();
    closed.signal();
    registry.insert(
        canonical,
        RegEntry {
            shared: Weak::new(),
            closed: Arc::new(closed),
        },
    );
    written.map(drop)
}
