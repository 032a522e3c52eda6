//! Running `purge_expired` on an interval, so retention happens without the
//! application having to remember it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::EventStore;

/// A background task that calls [`EventStore::purge_expired`] every
/// `interval` until stopped or dropped.
///
/// A failed purge is logged and retried at the next tick; it never stops the
/// task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::{sync::Arc, time::Duration};
/// use mcp_event_store_core::{MemoryStore, PurgeTask};
///
/// let store = Arc::new(MemoryStore::new());
/// let purger = PurgeTask::spawn(store.clone(), Duration::from_secs(30));
/// // ... serve requests ...
/// purger.stop().await;
/// # }
/// ```
#[derive(Debug)]
pub struct PurgeTask {
    stop: watch::Sender<bool>,
    handle: Option<JoinHandle<()>>,
}

impl PurgeTask {
    /// Starts purging `store` every `interval` (the first purge runs after one
    /// interval). Must be called inside a tokio runtime.
    pub fn spawn<S>(store: Arc<S>, interval: Duration) -> Self
    where
        S: EventStore + ?Sized,
    {
        let (stop, mut stopped) = watch::channel(false);
        let handle = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = ticks.tick() => {
                        if let Err(e) = store.purge_expired().await {
                            tracing::warn!(error = %e, "scheduled purge failed; retrying next interval");
                        }
                    }
                }
            }
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops the task, waiting for a purge in progress to finish.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(handle) = self.handle.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventStore, ManualClock, MemoryStore, NewEvent, Retention, StoreOptions};

    #[tokio::test(start_paused = true)]
    async fn purges_on_each_tick_and_stops() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = Arc::new(MemoryStore::with_options(
            StoreOptions::default()
                .retention(Retention::unbounded().max_age(Duration::from_secs(10)))
                .clock(clock.clone()),
        ));
        let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
        let task = PurgeTask::spawn(store.clone(), Duration::from_secs(5));
        clock.advance(Duration::from_secs(11));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            store
                .get_stream_id_for_event_id(&id.to_string())
                .await
                .unwrap(),
            None
        );
        task.stop().await;
    }
}
