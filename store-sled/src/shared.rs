//! One open sled database, shared by every handle on it in this process
//! ([`Shared`], opened in `setup`): its trees, its flusher and follower hub,
//! and each stream's in-memory state (its [`Slot`], kept in a [`SlotMap`]),
//! the authority for sequence numbers and for what readers may see; and the
//! close signal an opener waits for ([`Closer`]). Also how the crate calls
//! sled: [`blocking`], on tokio's blocking pool, never on a worker.
//!
//! Writes are single-key sled operations, ordered so that a crash between
//! any two leaves something harmless (an extra index entry, an old event
//! not yet trimmed), never a stream that loses track of itself. sled's
//! `apply_batch` and transactions are avoided on purpose: in sled 0.34 they
//! take a process-wide write lock, and once one has run, every later sled
//! call (flushes included, for their whole fsync) takes that lock's read
//! side, so appends and replays would stall behind every flush.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamKey, StreamToken};
use mcp_event_store_core::{Error, Result};

use crate::error::{NAME, backend};
use crate::flusher::Flusher;
use crate::keys::{self, META_LOOSEST, META_RELAXED, StreamRecord};
use crate::slot::{Slot, SlotMap, SlotState, StreamMeta};

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
    /// ([`META_FLOOR`](crate::keys::META_FLOOR)).
    pub(crate) floor: u64,
}

impl Incarnations {
    /// What new lives' incarnations add to sled's generated ids (which
    /// start at 0): above every migrated incarnation.
    fn base(&self) -> u64 {
        self.migrated.map_or(1, |m| m + 1)
    }

    /// The incarnation after `generated`, a value of sled's id generator.
    pub(crate) fn drawn(&self, generated: u64) -> Result<u64> {
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

/// Locks a mutex, recovering from poisoning: every critical section in this
/// crate leaves its data consistent before anything that could panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs sled work on the blocking pool.
///
/// Measured here (sled 0.34.7, 2 cores, ext4, a flush running alongside):
/// inserting a 200-byte value takes 1 us at the median but 0.2 ms at p99.9
/// and up to 7 to 21 ms at worst, and 64 KiB values reach 1 to 2 ms at p99.
/// Stalls like that must not land on an executor worker, so every sled call,
/// reads included, goes through here.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T>
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

/// Wakes openers waiting for this database to finish closing.
#[derive(Default)]
pub(crate) struct CloseSignal {
    /// When the database finished closing.
    closed: Mutex<Option<std::time::Instant>>,
    cv: Condvar,
}

impl CloseSignal {
    pub(crate) fn wait(&self) {
        let mut closed = lock(&self.closed);
        while closed.is_none() {
            closed = self
                .cv
                .wait(closed)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    pub(crate) fn closed_at(&self) -> Option<std::time::Instant> {
        *lock(&self.closed)
    }

    /// Records that the database finished closing, and wakes the openers
    /// waiting for it.
    pub(crate) fn signal(&self) {
        *lock(&self.closed) = Some(std::time::Instant::now());
        self.cv.notify_all();
    }
}

/// The last field of [`Shared`]: fields drop in order, so by the time this
/// signals, the flusher is joined and every sled handle is dropped.
pub(crate) struct Closer(pub(crate) Arc<CloseSignal>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.signal();
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
    /// Wakes watchers of a task once a change to it is flushed: one hub
    /// for every handle on this database in the process, apart from the
    /// followers' so that [`open_follows`](mcp_event_store_core::EventStore::open_follows)
    /// counts followers only.
    pub(crate) task_wakeups: Arc<Wakeups>,
    pub(crate) path: PathBuf,
    pub(crate) key: StreamKey,
    /// The incarnation floor and the migrated incarnation.
    pub(crate) incarnations: Incarnations,
    pub(crate) slots: Mutex<SlotMap>,
    /// Serializes session writes, which touch two trees.
    pub(crate) session_lock: Mutex<()>,
    /// The loosest (events, bytes) limits appends have used ([`META_LOOSEST`]).
    pub(crate) loosest: Mutex<(u64, u64)>,
    /// Whether this process wrote the relaxed marker (shared with the flusher).
    pub(crate) relaxed: Arc<AtomicBool>,
    pub(crate) relaxed_lock: Mutex<()>,
    pub(crate) events: sled::Tree,
    pub(crate) streams: sled::Tree,
    pub(crate) stream_age: sled::Tree,
    pub(crate) sessions: sled::Tree,
    pub(crate) session_expiry: sled::Tree,
    pub(crate) tasks: sled::Tree,
    pub(crate) task_purge: sled::Tree,
    pub(crate) task_instances: sled::Tree,
    /// Redemptions (C21), see [`crate::redeem`].
    pub(crate) redeemed: sled::Tree,
    pub(crate) redeem_expiry: sled::Tree,
    pub(crate) meta: sled::Tree,
    pub(crate) db: sled::Db,
    pub(crate) closer: Closer,
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
        self.task_wakeups.wake_all();
    }
}

impl Shared {
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

    /// Marks `slot` dead and forgets it. Call with its state locked.
    /// Followers of the stream wake up and find their life ended.
    pub(crate) fn kill(&self, token: StreamToken, slot: &Arc<Slot>) {
        lock(&self.slots).kill(token, slot);
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
            let slot = lock(&self.slots).slot(token);
            let mut state = lock(&slot.state);
            if slot.is_dead() {
                continue;
            }
            if matches!(*state, SlotState::Unloaded) {
                let meta = self.load_stream(&token)?;
                // Nothing of this stream was written through a live slot
                // before this load, so everything on disk is durable.
                slot.loaded(meta.as_ref().map_or(0, |m| m.last_seq));
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

    /// Up to `n` stream tokens after `after` (from the first with `None`),
    /// in key order: one batch of a walk over every stream.
    pub(crate) fn stream_tokens_after(
        &self,
        after: Option<StreamToken>,
        n: usize,
    ) -> Result<Vec<StreamToken>> {
        let start: Vec<u8> = match after {
            Some(token) => [&token.as_bytes()[..], &[0]].concat(),
            None => Vec::new(),
        };
        self.streams
            .range(start..)
            .keys()
            .take(n)
            .map(|key| {
                let key = key.map_err(backend)?;
                StreamToken::from_bytes(&key)
                    .ok_or_else(|| Error::Corrupt("malformed stream key".into()))
            })
            .collect()
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

/// A retention's count and byte limits, `u64::MAX` for none.
fn limits(retention: &mcp_event_store_core::Retention) -> (u64, u64) {
    (
        retention.max_events_per_stream.unwrap_or(u64::MAX),
        retention.max_bytes_per_stream.unwrap_or(u64::MAX),
    )
}
