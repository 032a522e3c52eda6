//! Re-sealing a store under the ring's current key while servers run: the
//! rewrite half of a key rotation (the CLI's `keys --rewrite`).
//!
//! [`reseal`] walks the store underneath a [`Sealed`](crate::Sealed) (the
//! sealed bytes, through its [`rewriter`](EventStore::rewriter), C22) a
//! bounded page at a time: sessions, tasks (context, outcome, checkpoint,
//! input requests and responses) and, where the backend rewrites events
//! in place, every stream's events. Each value sealed under a key other
//! than the current one is opened, sealed again under the current key at
//! the same place, and swapped in only if the store still holds the bytes
//! read. A server that wrote the value in between wins: its value is
//! already sealed under the current key (once every instance runs the new
//! ring), and the swap leaves it alone ([`Counts::changed`]). Nothing is
//! locked and no server waits: each swap is one atomic step of the
//! database.
//!
//! A value that does not open (a key the ring lacks, damage) is counted
//! and left as it is; a value that is no envelope (written without the
//! decorator, or the fixed errors the store writes itself on expired and
//! lost tasks) too. Redis and NATS keep events in append-only logs: there
//! the run counts the events still under older keys
//! ([`RotateReport::events_left`]); they leave with retention.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use mcp_event_store_core::{MemoryStore, SessionStore};
//! use mcp_event_store_sealed::rotate::{RotateOptions, reseal};
//! use mcp_event_store_sealed::{KeyId, KeyRing, Sealed};
//!
//! let plain = Arc::new(MemoryStore::new());
//! let one = KeyRing::generate_key()?;
//! let old = Sealed::new(plain.clone(), format!("1:{}", *one).parse()?);
//! old.put_session("s-1", b"state", Duration::from_secs(60)).await?;
//!
//! // Key 2 becomes current on every instance; then the rewrite.
//! let two = KeyRing::generate_key()?;
//! let ring: KeyRing = format!("2:{},1:{}", *two, *one).parse()?;
//! let report = reseal(&*plain, &ring, &RotateOptions::default()).await?;
//! assert_eq!(report.sessions.resealed, 1);
//!
//! // Key 1 can leave the ring: the session opens under key 2 alone.
//! let only_two = Sealed::new(plain.clone(), format!("2:{}", *two).parse()?);
//! assert_eq!(only_two.get_session("s-1").await?.as_deref(), Some(&b"state"[..]));
//! # Ok(()) }
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use mcp_event_store_core::rewrite::{RewriteStore, Swap, TaskField};
use mcp_event_store_core::task::TaskDigest;
use mcp_event_store_core::{Error, EventStore, MAX_LIST_PAGE, Result, StreamCursor};

use crate::envelope::{Field, Place, Shape, open, seal, shape};
use crate::keys::KeyRing;

/// How [`reseal`] walks the store.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RotateOptions {
    /// Values (sessions, tasks, streams) per page, at most
    /// [`MAX_LIST_PAGE`]. Default: 100.
    pub batch: usize,
    /// A pause after each page, to leave the store to the servers.
    /// Default: none.
    pub pause: Duration,
}

impl Default for RotateOptions {
    fn default() -> Self {
        Self {
            batch: 100,
            pause: Duration::ZERO,
        }
    }
}

impl RotateOptions {
    /// Sets the values per page.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// Sets the pause after each page.
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }
}

/// What [`reseal`] did with one kind of value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Values read.
    pub read: u64,
    /// Values already sealed under the current key.
    pub current: u64,
    /// Values sealed again under the current key and swapped in.
    pub resealed: u64,
    /// Values a server wrote or removed between the read and the swap:
    /// left to the server's write.
    pub changed: u64,
    /// Envelopes that did not open with the ring (a key it lacks, damage),
    /// left as they are.
    pub unreadable: u64,
    /// Values that are no envelope of this format (written without the
    /// decorator, the fixed errors of expired and lost tasks, truncated,
    /// or a later format), left as they are.
    pub not_sealed: u64,
}

/// What [`reseal`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RotateReport {
    /// Sessions.
    pub sessions: Counts,
    /// Task values (context, outcome, checkpoint, inputs).
    pub tasks: Counts,
    /// Events.
    pub events: Counts,
    /// Whether the backend rewrites events in place; when not, events are
    /// only read and counted.
    pub events_in_place: bool,
    /// Events still sealed under an older key on a backend that cannot
    /// rewrite them (counted from their headers, not opened): they leave
    /// with retention.
    pub events_left: u64,
    /// Streams whose retention removed events while they were read.
    pub interrupted: u64,
}

/// Re-seals every value of `store` (the store underneath a
/// [`Sealed`](crate::Sealed)) under `keys`' current key; see the
/// [module docs](self).
///
/// # Errors
///
/// [`Error::Config`] when the store hands out no rewriter (a wrapper that
/// forwards none); the store's errors as they come (the run stops there,
/// and running it again goes on: values already re-sealed count as
/// current).
pub async fn reseal<S: EventStore + ?Sized>(
    store: &S,
    keys: &KeyRing,
    options: &RotateOptions,
) -> Result<RotateReport> {
    let rewriter = store.rewriter().ok_or_else(|| {
        Error::Config(
            "this store hands out no rewriter (EventStore::rewriter): a wrapper that does not \
             forward it, so its values cannot be re-sealed"
                .into(),
        )
    })?;
    let batch = options.batch.clamp(1, MAX_LIST_PAGE);
    let mut report = RotateReport {
        events_in_place: rewriter.rewrites_events(),
        ..RotateReport::default()
    };
    let mut run = Run {
        rewriter,
        keys,
        pause: options.pause,
    };
    run.sessions(batch, &mut report.sessions).await?;
    run.tasks(batch, &mut report.tasks).await?;
    run.events(store, batch, &mut report).await?;
    Ok(report)
}

/// One value's fate.
enum Outcome {
    Current,
    Resealed,
    Changed,
    Unreadable,
    NotSealed,
}

impl Counts {
    fn count(&mut self, outcome: Outcome) {
        self.read += 1;
        match outcome {
            Outcome::Current => self.current += 1,
            Outcome::Resealed => self.resealed += 1,
            Outcome::Changed => self.changed += 1,
            Outcome::Unreadable => self.unreadable += 1,
            Outcome::NotSealed => self.not_sealed += 1,
        }
    }
}

struct Run<'a> {
    rewriter: &'a dyn RewriteStore,
    keys: &'a KeyRing,
    pause: Duration,
}

/// The value sealed again under the current key, or why not.
enum Resealed {
    Done(Vec<u8>),
    Skip(Outcome),
}

impl Run<'_> {
    fn reseal(&self, place: &Place<'_>, stored: &[u8]) -> Result<Resealed> {
        match shape(stored) {
            Shape::Sealed(key) if key == self.keys.current() => {
                Ok(Resealed::Skip(Outcome::Current))
            }
            Shape::Sealed(_) => match open(self.keys, place, stored) {
                Ok(plaintext) => Ok(Resealed::Done(seal(self.keys, place, &plaintext)?)),
                Err(_) => Ok(Resealed::Skip(Outcome::Unreadable)),
            },
            Shape::NotSealed | Shape::Truncated | Shape::Newer(_) => {
                Ok(Resealed::Skip(Outcome::NotSealed))
            }
        }
    }

    async fn rest(&self) {
        if !self.pause.is_zero() {
            tokio::time::sleep(self.pause).await;
        }
    }

    async fn sessions(&mut self, batch: usize, counts: &mut Counts) -> Result<()> {
        let mut after = None;
        loop {
            let page = self.rewriter.session_values(after.as_ref(), batch).await?;
            for session in &page.sessions {
                let place = Place::Session {
                    digest: &session.digest,
                };
                let outcome = match self.reseal(&place, &session.state)? {
                    Resealed::Skip(outcome) => outcome,
                    Resealed::Done(new) => swapped(
                        self.rewriter
                            .swap_session(&session.digest, &session.state, &new)
                            .await?,
                    ),
                };
                counts.count(outcome);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
            self.rest().await;
        }
    }

    async fn tasks(&mut self, batch: usize, counts: &mut Counts) -> Result<()> {
        let mut after: Option<TaskDigest> = None;
        loop {
            let page = self.rewriter.task_values(after.as_ref(), batch).await?;
            for task in &page.tasks {
                for value in &task.values {
                    let Some(place) = task_place(&task.digest, &value.field) else {
                        counts.count(Outcome::Unreadable);
                        continue;
                    };
                    let outcome = match self.reseal(&place, &value.bytes)? {
                        Resealed::Skip(outcome) => outcome,
                        Resealed::Done(new) => swapped(
                            self.rewriter
                                .swap_task(&task.digest, &value.field, &value.bytes, &new)
                                .await?,
                        ),
                    };
                    counts.count(outcome);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
            self.rest().await;
        }
    }

    async fn events<S: EventStore + ?Sized>(
        &mut self,
        store: &S,
        batch: usize,
        report: &mut RotateReport,
    ) -> Result<()> {
        let mut after: Option<StreamCursor> = None;
        loop {
            let page = store.list_streams(after.as_ref(), batch).await?;
            for info in &page.streams {
                let mut events = self.rewriter.event_values(&info.stream_id).await?.events;
                let place = Place::Event {
                    stream_id: &info.stream_id,
                };
                while let Some(event) = events.next().await {
                    let event = match event {
                        Ok(event) => event,
                        Err(Error::EventsPurged { .. }) => {
                            report.interrupted += 1;
                            break;
                        }
                        Err(error) => return Err(error),
                    };
                    if !report.events_in_place
                        && matches!(shape(&event.data), Shape::Sealed(key) if key != self.keys.current())
                    {
                        // Left for retention: counted from the header, never
                        // opened, since nothing could be written back.
                        report.events.read += 1;
                        report.events_left += 1;
                        continue;
                    }
                    let outcome = match self.reseal(&place, &event.data)? {
                        Resealed::Skip(outcome) => outcome,
                        Resealed::Done(new) => swapped(
                            self.rewriter
                                .swap_event(&info.stream_id, &event.id, &event.data, &new)
                                .await?,
                        ),
                    };
                    report.events.count(outcome);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
            self.rest().await;
        }
    }
}

fn swapped(swap: Swap) -> Outcome {
    match swap {
        Swap::Swapped => Outcome::Resealed,
        Swap::Changed => Outcome::Changed,
    }
}

/// Where a task's value is sealed: its digest, field and input key;
/// `None` for a field this release does not seal (one a later core lists),
/// which the run leaves as it is.
pub(crate) fn task_place<'a>(digest: &'a TaskDigest, field: &'a TaskField) -> Option<Place<'a>> {
    Some(match field {
        TaskField::Context => Place::task(digest, Field::Context),
        TaskField::Outcome => Place::task(digest, Field::Outcome),
        TaskField::Checkpoint => Place::task(digest, Field::Checkpoint),
        TaskField::Request(key) => Place::input(digest, Field::Request, key),
        TaskField::Response(key) => Place::input(digest, Field::Answer, key),
        _ => return None,
    })
}
