//! The group flusher: `sled::Db::flush` on behalf of every appender waiting
//! for durability, one flush at a time.
//!
//! Why one flush at a time: an fsync costs the same for one event as for a
//! thousand, so appends that arrive while a flush runs all wait for the next
//! one and share it (group commit). And sled 0.34.7's `flush_async`
//! deadlocks with eight or more concurrent callers, so nothing in this crate
//! calls it; only the flushes below run while the database is in use.
//!
//! Who flushes (leader/follower): an append that finds no flush running,
//! nothing queued and no other append under way flushes itself, on the
//! blocking-pool thread that just wrote the event
//! ([`Flusher::flush_or_queue`]). Every other append queues up and is served
//! by the next flush, which the flusher thread (one per database) runs as
//! soon as the current one ends. A lone append thus costs what a raw insert
//! plus `flush()` does: measured here (2 cores), handing every append to the
//! flusher thread and waking the appender from there cost 15 to 25 us of a
//! lone append's 120 to 160 us, most of its gap to a raw insert plus flush.
//! Concurrent appends go through the thread as before, so groups stay as
//! large. The thread also runs the periodic flush of relaxed handles,
//! explicit flushes, and the final flush on close.
//!
//! Whoever flushes also publishes durability: an appender hands over its
//! stream slot and sequence number, and only after a flush that started
//! after the write succeeds does the slot's durable watermark move, which is
//! what makes the event visible to readers. Queued watermarks are published
//! by whoever flushes next, so an appender whose future is dropped while
//! waiting still gets its event published; a leading appender's blocking
//! task runs to the end whether or not anyone awaits it.

use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamToken, observe};
use mcp_event_store_core::{Error, Result as StoreResult};
use tokio::sync::oneshot;

use crate::error::NAME;
use crate::keys::META_RELAXED;
use crate::slot::Slot;

/// The outcome of one flush, shared by everyone who waited on it.
pub(crate) type FlushResult = Result<(), FlushError>;

/// A failed flush, shared between its waiters; the sled error is kept as
/// the source.
#[derive(Clone, Debug)]
pub(crate) struct FlushError(Arc<sled::Error>);

impl fmt::Display for FlushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "flushing the sled database failed: {}", self.0)
    }
}

impl StdError for FlushError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// Waits for a flush requested with [`Flusher::request`], as the store's
/// result.
pub(crate) async fn wait_flushed(wait: oneshot::Receiver<FlushResult>) -> StoreResult<()> {
    flushed(wait.await)
}

/// A flush's outcome as the store's result: a failed flush, or one
/// abandoned because the flusher stopped, is a backend error.
pub(crate) fn flushed(outcome: Result<FlushResult, oneshot::error::RecvError>) -> StoreResult<()> {
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::backend(NAME, e)),
        Err(_) => Err(Error::backend(
            NAME,
            "the sled flush this write waited for was abandoned (the flusher stopped)",
        )),
    }
}

/// A stream slot's watermark to move once a flush covering the write
/// succeeds, and the stream whose followers to wake then.
pub(crate) type Publish = (Arc<Slot>, StreamToken, u64);

/// What appenders queued for the next flush.
#[derive(Default)]
struct Queue {
    /// Watermarks to publish once the flush succeeds.
    publish: Vec<Publish>,
    /// Everyone waiting for the flush.
    waiters: Vec<oneshot::Sender<FlushResult>>,
    /// Periodic flush for relaxed ([`Durability::Interval`](crate::Durability)) handles.
    interval: Option<Duration>,
    /// Whether a flush is running, on the flusher thread or an appender's
    /// thread. Whoever sets it owns the flush; nobody else starts one.
    flushing: bool,
    stop: bool,
}

impl Queue {
    fn has_work(&self) -> bool {
        !self.waiters.is_empty() || !self.publish.is_empty()
    }
}

/// What [`Flusher::stats`] reports.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlushStats {
    /// Flushes started so far, by anyone.
    pub(crate) flushes: u64,
    /// Of those, the ones the flusher thread ran.
    pub(crate) thread_flushes: u64,
    /// Waiters queued for the next flush.
    pub(crate) queued: usize,
    /// Whether a flush is claimed (running, or held by `pause`).
    pub(crate) flushing: bool,
}

/// How an appender learns that its write is durable.
pub(crate) enum Ack {
    /// It led the flush itself: the outcome.
    Flushed(FlushResult),
    /// It waits for the next flush.
    Queued(oneshot::Receiver<FlushResult>),
}

struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// The database's follower hub, woken for each published watermark.
    followers: Arc<Wakeups>,
    /// Set by relaxed appends that did not wait for a flush.
    dirty: AtomicBool,
    /// Appends waiting for durability, from the call until acknowledged.
    appending: AtomicUsize,
    /// Holds back every flush once claimed (by the thread or a leading
    /// appender), so tests can look at unflushed writes.
    #[cfg(test)]
    paused: AtomicBool,
    /// Keeps the flusher thread from claiming any flush, so tests can tell
    /// who flushed.
    #[cfg(test)]
    thread_stalled: AtomicBool,
    /// Flushes claimed so far (thread and leaders), and by the thread alone.
    #[cfg(test)]
    flushes: std::sync::atomic::AtomicU64,
    #[cfg(test)]
    thread_flushes: std::sync::atomic::AtomicU64,
}

impl Inner {
    /// The queue, recovering from poisoning: every critical section leaves
    /// it consistent before anything that could panic.
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Flushes for a claimed batch (`flushing` set by the caller), then
    /// publishes its watermarks and answers its waiters. Returns the outcome
    /// and, on failure, the watermarks to keep for the next flush.
    fn flush(
        &self,
        db: &sled::Db,
        publish: Vec<Publish>,
        waiters: Vec<oneshot::Sender<FlushResult>>,
    ) -> (FlushResult, Vec<Publish>) {
        #[cfg(test)]
        self.flushes.fetch_add(1, Ordering::SeqCst);
        #[cfg(test)]
        while self.paused.load(Ordering::SeqCst) && !self.queue().stop {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Cleared before the flush: a write after this point sets it again
        // and is picked up next time.
        self.dirty.store(false, Ordering::Release);
        let (outcome, kept) = match db.flush() {
            Ok(_) => {
                if !publish.is_empty() {
                    // The appends this flush made durable together.
                    observe::batch(NAME, publish.len());
                }
                // Visible first, then wake: the re-read a wake-up prompts
                // must see the event. Before the waiters are answered, but
                // after the flush: a follower never gets an event its
                // writer could still see fail.
                for (slot, _, seq) in &publish {
                    slot.publish(*seq);
                }
                for (_, token, _) in &publish {
                    self.followers.wake(token);
                }
                (Ok(()), Vec::new())
            }
            Err(e) => {
                tracing::error!(error = %e, "flushing the sled database failed");
                // Keep the watermarks for the next successful flush, so
                // whatever did reach the disk becomes visible eventually.
                (Err(FlushError(Arc::new(e))), publish)
            }
        };
        for waiter in waiters {
            // A waiter that went away (its future was dropped) is fine.
            let _ = waiter.send(outcome.clone());
        }
        (outcome, kept)
    }
}

/// An append under way, for [`Flusher::flush_or_queue`]; see
/// [`Flusher::appending`].
pub(crate) struct Appending<'a>(&'a Inner);

impl Drop for Appending<'_> {
    fn drop(&mut self) {
        self.0.appending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A flush claimed by a leading appender. Dropping it, after the flush or
/// while unwinding from a panic in it, ends the claim: otherwise nobody
/// would ever flush again.
struct Claim<'a> {
    inner: &'a Inner,
    /// Watermarks of a failed flush, for the next one.
    kept: Vec<Publish>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut queue = self.inner.queue();
        queue.flushing = false;
        queue.publish.append(&mut self.kept);
        // Appends that arrived during this flush wait for the next one, which
        // the flusher thread runs; so may a relaxed handle's periodic flush.
        let wake = queue.has_work() || queue.interval.is_some();
        drop(queue);
        if wake {
            self.inner.wake.notify_one();
        }
    }
}

/// Owns the flusher thread; dropping it flushes one last time and joins.
pub(crate) struct Flusher {
    inner: Arc<Inner>,
    /// For flushes led by appenders.
    db: sled::Db,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread. `relaxed` tells it, at shutdown, whether to clear
    /// the relaxed-session marker after the final flush; `followers` is
    /// woken for every watermark a flush publishes.
    pub(crate) fn start(
        db: sled::Db,
        meta: sled::Tree,
        relaxed: Arc<AtomicBool>,
        followers: Arc<Wakeups>,
    ) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            queue: Mutex::default(),
            wake: Condvar::new(),
            followers,
            dirty: AtomicBool::new(false),
            appending: AtomicUsize::new(0),
            #[cfg(test)]
            paused: AtomicBool::new(false),
            #[cfg(test)]
            thread_stalled: AtomicBool::new(false),
            #[cfg(test)]
            flushes: Default::default(),
            #[cfg(test)]
            thread_flushes: Default::default(),
        });
        let thread = std::thread::Builder::new()
            .name("mcp-event-store-sled-flush".into())
            .spawn({
                let (inner, db) = (inner.clone(), db.clone());
                move || run(&inner, &db, &meta, &relaxed)
            })?;
        Ok(Self {
            inner,
            db,
            thread: Some(thread),
        })
    }

    /// Makes an applied write durable, then publishes `publish`: flushes on
    /// this thread if no flush is running or queued and no other append is
    /// under way ([`Flusher::appending`]), or queues for the next flush
    /// otherwise. Blocking: call it on the blocking pool, and never with a
    /// stream's lock held (a flush takes milliseconds at worst).
    ///
    /// Why only a lone append leads: under concurrency a leader flushes at
    /// once, for the few writes already made, while the flusher thread's
    /// wake-up lets more join its group. Measured with 32 writers, leading
    /// whenever no flush ran made groups smaller and less even.
    pub(crate) fn flush_or_queue(&self, publish: Option<Publish>) -> Ack {
        let mut queue = self.inner.queue();
        let alone = self.inner.appending.load(Ordering::Acquire) <= 1;
        if queue.flushing || queue.stop || !alone || queue.has_work() {
            drop(queue);
            return Ack::Queued(self.request(publish));
        }
        queue.flushing = true;
        drop(queue);
        let mut claim = Claim {
            inner: &self.inner,
            kept: Vec::new(),
        };
        let (outcome, kept) = self
            .inner
            .flush(&self.db, publish.into_iter().collect(), Vec::new());
        claim.kept = kept;
        drop(claim);
        Ack::Flushed(outcome)
    }

    /// Queues a wait for the next flush (run by the flusher thread, or by an
    /// appender that leads it), optionally publishing `slot`'s watermark at
    /// `seq` once it succeeds. The write being waited for must already be
    /// applied: any flush that starts after this call covers it.
    pub(crate) fn request(&self, publish: Option<Publish>) -> oneshot::Receiver<FlushResult> {
        let (tx, rx) = oneshot::channel();
        let mut queue = self.inner.queue();
        queue.publish.extend(publish);
        queue.waiters.push(tx);
        drop(queue);
        self.inner.wake.notify_one();
        rx
    }

    /// Counts an append waiting for durability until the guard drops
    /// (acknowledged, failed or cancelled).
    pub(crate) fn appending(&self) -> Appending<'_> {
        self.inner.appending.fetch_add(1, Ordering::AcqRel);
        Appending(&self.inner)
    }

    /// Notes an unflushed write for the periodic flush.
    pub(crate) fn mark_dirty(&self) {
        self.inner.dirty.store(true, Ordering::Release);
    }

    /// Holds back (or releases) flushes; for tests.
    #[cfg(test)]
    pub(crate) fn pause(&self, paused: bool) {
        self.inner.paused.store(paused, Ordering::SeqCst);
    }

    /// Keeps the flusher thread from starting flushes (or lets it again);
    /// for tests.
    #[cfg(test)]
    pub(crate) fn stall_thread(&self, stalled: bool) {
        self.inner.thread_stalled.store(stalled, Ordering::SeqCst);
        self.inner.wake.notify_one();
    }

    /// What the flusher has done and holds; for tests.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> FlushStats {
        let queue = self.inner.queue();
        FlushStats {
            flushes: self.inner.flushes.load(Ordering::SeqCst),
            thread_flushes: self.inner.thread_flushes.load(Ordering::SeqCst),
            queued: queue.waiters.len(),
            flushing: queue.flushing,
        }
    }

    /// The interval of the periodic flush, if a relaxed handle asked for
    /// one: the shortest asked for.
    pub(crate) fn interval(&self) -> Option<Duration> {
        self.inner.queue().interval
    }

    /// Makes the thread flush at least every `interval` while there are
    /// unflushed writes.
    pub(crate) fn flush_every(&self, interval: Duration) {
        let mut queue = self.inner.queue();
        queue.interval = Some(queue.interval.map_or(interval, |old| old.min(interval)));
        drop(queue);
        self.inner.wake.notify_one();
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.inner.queue().stop = true;
        self.inner.wake.notify_one();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the sled flusher thread panicked");
        }
    }
}

fn run(inner: &Inner, db: &sled::Db, meta: &sled::Tree, relaxed: &AtomicBool) {
    let mut last_flush = Instant::now();
    loop {
        let (publish, waiters, stopping) = {
            let mut queue = inner.queue();
            loop {
                #[cfg(test)]
                if inner.thread_stalled.load(Ordering::SeqCst) && !queue.stop {
                    queue = inner
                        .wake
                        .wait_timeout(queue, Duration::from_millis(1))
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0;
                    continue;
                }
                if queue.flushing {
                    // An appender leads a flush; it wakes us when it is done.
                    queue = inner
                        .wake
                        .wait(queue)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    continue;
                }
                if queue.stop || queue.has_work() {
                    break;
                }
                match queue.interval {
                    None => {
                        queue = inner
                            .wake
                            .wait(queue)
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                    }
                    Some(interval) => {
                        let since = last_flush.elapsed();
                        if since >= interval {
                            if inner.dirty.load(Ordering::Acquire) {
                                break;
                            }
                            last_flush = Instant::now();
                            continue;
                        }
                        queue = inner
                            .wake
                            .wait_timeout(queue, interval - since)
                            .unwrap_or_else(|poisoned| poisoned.into_inner())
                            .0;
                    }
                }
            }
            queue.flushing = true;
            (
                std::mem::take(&mut queue.publish),
                std::mem::take(&mut queue.waiters),
                queue.stop,
            )
        };
        #[cfg(test)]
        inner.thread_flushes.fetch_add(1, Ordering::SeqCst);
        let (outcome, kept) = inner.flush(db, publish, waiters);
        last_flush = Instant::now();
        {
            let mut queue = inner.queue();
            queue.flushing = false;
            queue.publish.extend(kept);
        }
        if stopping {
            if outcome.is_ok() && relaxed.load(Ordering::Acquire) {
                // Everything is on disk: the relaxed session ended cleanly,
                // so the next open need not assume acknowledged events were lost.
                let cleared = meta.remove(META_RELAXED).and_then(|_| db.flush());
                if let Err(e) = cleared {
                    tracing::warn!(error = %e, "could not clear the relaxed-durability marker");
                }
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mcp_event_store_core::{EventStore, NewEvent};

    use crate::test_support::{Unpause, replayed_after, until};
    use crate::{SledOptions, SledStore};

    /// Leader/follower: with no flush running, an append flushes on its own
    /// blocking thread and is visible when it returns, without the flusher
    /// thread (which would cost two more thread hand-offs per append).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_append_flushes_itself() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let db = store.shared().unwrap();
        let first = store.store_event("s", NewEvent::new(b"0")).await.unwrap();
        let flusher = &db.flusher;
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
        drop(db);
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
        let db = store.shared().unwrap();
        let a0 = store.store_event("a", NewEvent::new(b"0")).await.unwrap();
        let b0 = store.store_event("b", NewEvent::new(b"0")).await.unwrap();
        let flusher = &db.flusher;
        let before = flusher.stats();
        assert_eq!((before.queued, before.flushing), (0, false));
        flusher.pause(true);
        let unpause = Unpause(flusher);
        let append = |stream: &'static str| {
            let store = store.clone();
            tokio::spawn(async move { store.store_event(stream, NewEvent::new(b"1")).await })
        };
        let written = db.events.len();
        let leader = append("a");
        until(|| db.events.len() > written).await;
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
        // The flusher thread answers its waiters before it ends its claim.
        until(|| !flusher.stats().flushing).await;
        let after = flusher.stats();
        assert_eq!(after.flushes, before.flushes + 2);
        assert_eq!(after.thread_flushes, before.thread_flushes + 1);
        assert_eq!((after.queued, after.flushing), (0, false));
        drop(db);
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
        let db = store.shared().unwrap();
        let before = db.flusher.stats();
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
        let after = db.flusher.stats();
        assert!(
            after.flushes - before.flushes < 400,
            "no flush was shared: {before:?} {after:?}"
        );
        drop(db);
        store.close().await.unwrap();
    }
}
