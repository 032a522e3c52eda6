//! Each stream's in-memory state ([`Slot`]): the authority for sequence
//! numbers and for what readers may see, loaded from disk once and then
//! kept in the database's [`SlotMap`]. The flusher publishes to it what a
//! flush made durable.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mcp_event_store_core::backend::StreamToken;

/// Slots are swept (idle ones dropped) when the map grows past this.
const SLOT_CACHE: usize = 65_536;

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

    /// Just loaded from disk: everything up to `last_seq` is durable.
    pub(crate) fn loaded(&self, last_seq: u64) {
        self.durable.store(last_seq, Ordering::Release);
    }

    /// Makes everything up to `seq` visible to readers.
    pub(crate) fn publish(&self, seq: u64) {
        self.durable.fetch_max(seq, Ordering::AcqRel);
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

pub(crate) struct SlotMap {
    map: HashMap<StreamToken, Arc<Slot>>,
    sweep_at: usize,
}

impl SlotMap {
    /// No slots yet.
    pub(crate) fn new() -> Self {
        Self {
            map: HashMap::new(),
            sweep_at: SLOT_CACHE,
        }
    }

    /// The slot of `token`, created (unloaded) if missing.
    pub(crate) fn slot(&mut self, token: StreamToken) -> Arc<Slot> {
        if let Some(slot) = self.map.get(&token) {
            return slot.clone();
        }
        if self.map.len() >= self.sweep_at {
            self.sweep();
        }
        let slot = Arc::new(Slot::new());
        self.map.insert(token, slot.clone());
        slot
    }

    /// Marks `slot` dead and forgets it, unless another slot has taken its
    /// place already.
    pub(crate) fn kill(&mut self, token: StreamToken, slot: &Arc<Slot>) {
        slot.dead.store(true, Ordering::SeqCst);
        if self.map.get(&token).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            self.map.remove(&token);
        }
    }

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
