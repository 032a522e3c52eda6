//! Which keys a store's values are sealed under: what an operator asks
//! before an old key leaves the ring (the CLI's `keys` command).
//!
//! [`key_usage`] reads the store underneath (not the decorator: it needs
//! the sealed bytes), stream by stream through the store's listing and
//! [`replay_stream`](EventStore::replay_stream), a page at a time, so its
//! memory stays bounded however large the store; it reads only the
//! envelopes' headers unless asked to [verify](ScanOptions::verify) that
//! each value opens. Sessions and task values come through the store's
//! rewriter (C22). It writes nothing: [`rotate::reseal`](crate::rotate::reseal)
//! re-seals what it finds (see the [crate docs](crate#keys-and-rotation)).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use mcp_event_store_core::{EventStore, MemoryStore, NewEvent};
//! use mcp_event_store_sealed::scan::{ScanOptions, key_usage};
//! use mcp_event_store_sealed::{KeyId, KeyRing, Sealed};
//!
//! let plain = Arc::new(MemoryStore::new());
//! let one = KeyRing::generate_key()?;
//! let old = Sealed::new(plain.clone(), format!("1:{}", *one).parse()?);
//! old.store_event("a", NewEvent::new(b"x")).await?;
//! let two = KeyRing::generate_key()?;
//! let new = Sealed::new(plain.clone(), format!("2:{},1:{}", *two, *one).parse()?);
//! new.store_event("a", NewEvent::new(b"y")).await?;
//! new.store_event("b", NewEvent::new(b"z")).await?;
//!
//! let usage = key_usage(&*plain, &ScanOptions::default()).await?;
//! assert_eq!(usage.keys[&KeyId(1)].events, 1);
//! assert_eq!(usage.keys[&KeyId(2)].events, 2);
//! assert_eq!(usage.keys[&KeyId(2)].streams, 2);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use mcp_event_store_core::rewrite::{RewriteStore, TaskField};
use mcp_event_store_core::task::{EXPIRED_ERROR, INSTANCE_LOST_ERROR};
use mcp_event_store_core::{EventStore, MAX_LIST_PAGE, Result, StreamCursor};

use crate::envelope::{Place, Shape, open, shape};
use crate::keys::{KeyId, KeyRing};

/// How [`key_usage`] reads the store.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ScanOptions<'a> {
    /// Streams per page of the listing (at most [`MAX_LIST_PAGE`]).
    /// Default: 100.
    pub batch: usize,
    /// A pause after each page of streams, to leave the store to the
    /// servers running on it. Default: none.
    pub pause: Duration,
    /// Open every event with this ring, counting those that do not open
    /// ([`KeyUsage::unreadable`]); `None` (the default) reads headers only.
    pub verify: Option<&'a KeyRing>,
}

impl Default for ScanOptions<'_> {
    fn default() -> Self {
        Self {
            batch: 100,
            pause: Duration::ZERO,
            verify: None,
        }
    }
}

impl<'a> ScanOptions<'a> {
    /// Sets the streams per page.
    pub fn batch(mut self, streams: usize) -> Self {
        self.batch = streams;
        self
    }

    /// Sets the pause after each page.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// Opens every event with `keys`.
    pub fn verify(mut self, keys: &'a KeyRing) -> Self {
        self.verify = Some(keys);
        self
    }
}

/// What [`key_usage`] found under one key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyCount {
    /// Events sealed under the key.
    pub events: u64,
    /// Sessions sealed under the key.
    pub sessions: u64,
    /// Task values (contexts, outcomes, checkpoints, inputs) sealed under
    /// the key.
    pub task_values: u64,
    /// Streams holding at least one of them.
    pub streams: u64,
    /// The newest event time of those streams, in milliseconds since the
    /// epoch: every event under the key is at most this recent, so it ages
    /// out at the latest the store's `max_age` after it.
    pub newest_millis: Option<i64>,
}

/// What [`key_usage`] found: values per key id, and those under none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyUsage {
    /// Streams read.
    pub streams: u64,
    /// Events read.
    pub events: u64,
    /// Sessions read.
    pub sessions: u64,
    /// Task values read.
    pub task_values: u64,
    /// Events per key id that sealed them.
    pub keys: BTreeMap<KeyId, KeyCount>,
    /// Values that are no envelope: written without the decorator (and the
    /// fixed errors the store writes itself on expired and lost tasks).
    pub not_sealed: u64,
    /// Values shorter than an envelope.
    pub truncated: u64,
    /// Values in a later envelope format.
    pub newer: u64,
    /// With [`ScanOptions::verify`]: envelopes that did not open (a key the
    /// ring lacks, altered bytes, a value moved from another stream).
    pub unreadable: u64,
    /// Streams whose retention removed events while they were read: their
    /// counts stop there.
    pub interrupted: u64,
}

/// Counts the events of every stream of `store` (the store underneath a
/// [`Sealed`](crate::Sealed)), its sessions and its tasks' values by the
/// key that sealed them; see the [module docs](self). Sessions and tasks
/// are read through the store's [`rewriter`](EventStore::rewriter) (C22),
/// and not counted for a wrapper that hands out none.
pub async fn key_usage<S: EventStore + ?Sized>(
    store: &S,
    options: &ScanOptions<'_>,
) -> Result<KeyUsage> {
    let batch = options.batch.clamp(1, MAX_LIST_PAGE);
    let mut usage = KeyUsage::default();
    let mut after: Option<StreamCursor> = None;
    loop {
        let page = store.list_streams(after.as_ref(), batch).await?;
        for info in &page.streams {
            usage.streams += 1;
            let mut seen: BTreeMap<KeyId, u64> = BTreeMap::new();
            let mut replay = store.replay_stream(&info.stream_id).await?;
            let place = Place::Event {
                stream_id: &info.stream_id,
            };
            while let Some(event) = replay.events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(mcp_event_store_core::Error::EventsPurged { .. }) => {
                        usage.interrupted += 1;
                        break;
                    }
                    Err(error) => return Err(error),
                };
                usage.events += 1;
                match shape(&event.data) {
                    Shape::Sealed(key) => {
                        *seen.entry(key).or_default() += 1;
                        if let Some(ring) = options.verify
                            && open(ring, &place, &event.data).is_err()
                        {
                            usage.unreadable += 1;
                        }
                    }
                    Shape::NotSealed => usage.not_sealed += 1,
                    Shape::Truncated => usage.truncated += 1,
                    Shape::Newer(_) => usage.newer += 1,
                }
            }
            for (key, events) in seen {
                let count = usage.keys.entry(key).or_default();
                count.events += events;
                count.streams += 1;
                count.newest_millis = count.newest_millis.max(info.newest_millis);
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        rest(options).await;
    }
    if let Some(rewriter) = store.rewriter() {
        sessions(rewriter, batch, options, &mut usage).await?;
        task_values(rewriter, batch, options, &mut usage).await?;
    }
    Ok(usage)
}

async fn rest(options: &ScanOptions<'_>) {
    if !options.pause.is_zero() {
        tokio::time::sleep(options.pause).await;
    }
}

/// Counts one stored value that is not an event: the key that sealed it,
/// or what it is instead; `count` picks the key's counter.
fn tally(
    usage: &mut KeyUsage,
    options: &ScanOptions<'_>,
    place: &Place<'_>,
    stored: &[u8],
    count: fn(&mut KeyCount) -> &mut u64,
) {
    match shape(stored) {
        Shape::Sealed(key) => {
            *count(usage.keys.entry(key).or_default()) += 1;
            if let Some(ring) = options.verify
                && open(ring, place, stored).is_err()
            {
                usage.unreadable += 1;
            }
        }
        Shape::NotSealed => usage.not_sealed += 1,
        Shape::Truncated => usage.truncated += 1,
        Shape::Newer(_) => usage.newer += 1,
    }
}

async fn sessions(
    rewriter: &dyn RewriteStore,
    batch: usize,
    options: &ScanOptions<'_>,
    usage: &mut KeyUsage,
) -> Result<()> {
    let mut after = None;
    loop {
        let page = rewriter.session_values(after.as_ref(), batch).await?;
        for session in &page.sessions {
            usage.sessions += 1;
            let place = Place::Session {
                digest: &session.digest,
            };
            tally(usage, options, &place, &session.state, |c| &mut c.sessions);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
        rest(options).await;
    }
}

async fn task_values(
    rewriter: &dyn RewriteStore,
    batch: usize,
    options: &ScanOptions<'_>,
    usage: &mut KeyUsage,
) -> Result<()> {
    let mut after = None;
    loop {
        let page = rewriter.task_values(after.as_ref(), batch).await?;
        for task in &page.tasks {
            for value in &task.values {
                if value.field == TaskField::Outcome && written_by_the_store(&value.bytes) {
                    // The fixed error of an expired or lost task, which the
                    // store writes itself and the decorator accepts.
                    continue;
                }
                usage.task_values += 1;
                match crate::rotate::task_place(&task.digest, &value.field) {
                    Some(place) => {
                        tally(usage, options, &place, &value.bytes, |c| &mut c.task_values)
                    }
                    None => usage.newer += 1,
                }
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
        rest(options).await;
    }
}

/// Whether a task outcome is one the store writes itself, unsealed.
fn written_by_the_store(outcome: &[u8]) -> bool {
    outcome == EXPIRED_ERROR || outcome == INSTANCE_LOST_ERROR
}
