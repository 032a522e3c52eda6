//! The group flusher: one thread per open database calls `sled::Db::flush`
//! on behalf of every appender waiting for durability.
//!
//! Why one thread: an fsync costs the same for one event as for a thousand,
//! so appends that arrive while a flush runs all wait for the next one and
//! share it (group commit). And sled 0.34.7's `flush_async` deadlocks with
//! eight or more concurrent callers, so nothing else in this crate flushes
//! while the database is in use.
//!
//! The flusher also publishes durability: an appender hands over its stream
//! slot and sequence number, and only after the flush that covers the write
//! succeeds does the slot's durable watermark move, which is what makes the
//! event visible to readers. Because the flusher does this, an appender
//! whose future is dropped while waiting still gets its event published.

use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::shared::{META_RELAXED, Slot, lock};

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

/// What appenders queued for the next flush.
#[derive(Default)]
struct Queue {
    /// Watermarks to publish once the flush succeeds.
    publish: Vec<(Arc<Slot>, u64)>,
    /// Everyone waiting for the flush.
    waiters: Vec<oneshot::Sender<FlushResult>>,
    /// Periodic flush for relaxed ([`Durability::Interval`](crate::Durability)) handles.
    interval: Option<Duration>,
    stop: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Set by relaxed appends that did not wait for a flush.
    dirty: AtomicBool,
    /// Holds flushes back, so tests can look at unflushed writes.
    #[cfg(test)]
    paused: AtomicBool,
}

/// Owns the flusher thread; dropping it flushes one last time and joins.
pub(crate) struct Flusher {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread. `relaxed` tells it, at shutdown, whether to clear
    /// the relaxed-session marker after the final flush.
    pub(crate) fn start(
        db: sled::Db,
        meta: sled::Tree,
        relaxed: Arc<AtomicBool>,
    ) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            queue: Mutex::default(),
            wake: Condvar::new(),
            dirty: AtomicBool::new(false),
            #[cfg(test)]
            paused: AtomicBool::new(false),
        });
        let thread = std::thread::Builder::new()
            .name("mcp-event-store-sled-flush".into())
            .spawn({
                let inner = inner.clone();
                move || run(&inner, &db, &meta, &relaxed)
            })?;
        Ok(Self {
            inner,
            thread: Some(thread),
        })
    }

    /// Queues a wait for the next flush, optionally publishing `slot`'s
    /// watermark at `seq` once it succeeds. The write being waited for must
    /// already be applied: any flush that starts after this call covers it.
    pub(crate) fn request(
        &self,
        publish: Option<(Arc<Slot>, u64)>,
    ) -> oneshot::Receiver<FlushResult> {
        let (tx, rx) = oneshot::channel();
        let mut queue = lock(&self.inner.queue);
        queue.publish.extend(publish);
        queue.waiters.push(tx);
        drop(queue);
        self.inner.wake.notify_one();
        rx
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

    /// Makes the thread flush at least every `interval` while there are
    /// unflushed writes.
    pub(crate) fn flush_every(&self, interval: Duration) {
        let mut queue = lock(&self.inner.queue);
        queue.interval = Some(queue.interval.map_or(interval, |old| old.min(interval)));
        drop(queue);
        self.inner.wake.notify_one();
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        lock(&self.inner.queue).stop = true;
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
            let mut queue = lock(&inner.queue);
            loop {
                if queue.stop || !queue.waiters.is_empty() || !queue.publish.is_empty() {
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
            (
                std::mem::take(&mut queue.publish),
                std::mem::take(&mut queue.waiters),
                queue.stop,
            )
        };
        #[cfg(test)]
        while inner.paused.load(Ordering::SeqCst) && !lock(&inner.queue).stop {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Cleared before the flush: a write after this point sets it again
        // and is picked up next time.
        inner.dirty.store(false, Ordering::Release);
        let result = db.flush();
        last_flush = Instant::now();
        let outcome = match result {
            Ok(_) => {
                for (slot, seq) in publish {
                    slot.publish(seq);
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "flushing the sled database failed");
                // Keep the watermarks for the next successful flush, so
                // whatever did reach the disk becomes visible eventually.
                lock(&inner.queue).publish.extend(publish);
                Err(FlushError(Arc::new(e)))
            }
        };
        let ok = outcome.is_ok();
        for waiter in waiters {
            // A waiter that went away (its future was dropped) is fine.
            let _ = waiter.send(outcome.clone());
        }
        if stopping {
            if ok && relaxed.load(Ordering::Acquire) {
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
