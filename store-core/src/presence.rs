//! Which server instance writes which stream, and whether it is still
//! alive: so that a resume on one instance stops waiting for a stream whose
//! writer died on another.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::id::StreamToken;
use crate::store::SessionStore;
use crate::task::InstanceId;

/// How long an instance counts as alive after its latest renewal, by
/// default. It renews every third of that.
pub const DEFAULT_PRESENCE_LEASE: Duration = Duration::from_secs(30);

/// How long a stream's writer is remembered by default: one hour, the
/// default retention's maximum age, so a resume finds it as long as it
/// finds the stream's events.
pub const DEFAULT_PRODUCER_TTL: Duration = Duration::from_secs(60 * 60);

/// The prefix of the session-store keys of instances' presence.
const INSTANCE_PREFIX: &str = "mcp-presence/";
/// The prefix of the session-store keys naming a stream's writer.
const PRODUCER_PREFIX: &str = "mcp-producer/";

/// This server instance's presence in a shared store, and the streams it
/// writes.
///
/// A client that resumes a stream on instance B while the tool call behind
/// it runs on instance A gets a *follow* (C13): the stored events, then
/// each new one as A appends it. If A died, nothing more will come, and the
/// follow would wait out its whole hold. With a presence, A renews a key of
/// its own in the session store (`mcp-presence/<instance>`, expiring one
/// [lease](DEFAULT_PRESENCE_LEASE) after its latest renewal) and names
/// itself as the writer of each stream it starts
/// ([`produces`](Self::produces), `mcp-producer/<stream token>`); B's
/// follow ends ([`producer_lost`](Self::producer_lost)) once A's presence
/// has lapsed, right after it delivered what A stored, so the client learns
/// within about a lease that it must call again.
///
/// The cost: one session-store write per instance every third of a lease,
/// one per stream started, and, on a follower, a read every third of a
/// lease. A stream with no recorded writer (written before this existed,
/// or by an instance without a presence) is followed for its whole hold,
/// as before.
///
/// Cheap to clone; the renewal stops with the last clone, or at
/// [`close`](Self::close), which also removes the presence at once (a
/// graceful shutdown ends the follows of this instance's streams
/// everywhere without waiting for the lease).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use mcp_event_store_core::backend::StreamKey;
/// use mcp_event_store_core::{MemoryStore, Presence};
///
/// let store = Arc::new(MemoryStore::new());
/// let presence = Presence::start(store.clone(), Duration::from_millis(300)).await?;
/// let stream = StreamKey::generate()?.token("a request stream");
/// presence.produces(&stream).await?;
/// let lost = presence.producer_lost(stream);
/// presence.close().await; // gone: a follower's `lost` resolves
/// lost.await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Presence {
    inner: Arc<Inner>,
    producer_ttl: Duration,
}

struct Inner {
    store: Arc<dyn SessionStore>,
    instance: InstanceId,
    lease: Duration,
    renewal: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(renewal) = self
            .renewal
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            renewal.abort();
        }
    }
}

impl fmt::Debug for Presence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Presence")
            .field("instance", &self.inner.instance)
            .field("lease", &self.inner.lease)
            .field("producer_ttl", &self.producer_ttl)
            .finish_non_exhaustive()
    }
}

impl Presence {
    /// Registers a fresh instance in `store` for `lease` and renews it every
    /// third of that until the last clone is dropped or
    /// [`closed`](Self::close). Needs a tokio runtime. A lease under 3 ms
    /// is [`Error::Config`].
    pub async fn start(store: Arc<dyn SessionStore>, lease: Duration) -> Result<Self> {
        let presence = Self::register(store, lease).await?;
        let renewal = tokio::spawn(renew_while_alive(Arc::downgrade(&presence.inner)));
        *presence
            .inner
            .renewal
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(renewal);
        Ok(presence)
    }

    /// Registers a fresh instance like [`start`](Self::start), without
    /// renewing it: for an application that runs its own maintenance loop
    /// and calls [`renew`](Self::renew) at least every third of the lease.
    pub async fn register(store: Arc<dyn SessionStore>, lease: Duration) -> Result<Self> {
        if lease < Duration::from_millis(3) {
            return Err(Error::Config(format!(
                "a presence lease must be at least 3 ms, got {lease:?}"
            )));
        }
        let inner = Arc::new(Inner {
            store,
            instance: InstanceId::generate()?,
            lease,
            renewal: Mutex::new(None),
        });
        inner.renew().await?;
        Ok(Self {
            inner,
            producer_ttl: DEFAULT_PRODUCER_TTL,
        })
    }

    /// Renews this instance's presence for one more lease (one
    /// session-store write). [`start`](Self::start) calls it every third of
    /// the lease; after [`close`](Self::close) it registers the instance
    /// again.
    pub async fn renew(&self) -> Result<()> {
        self.inner.renew().await
    }

    /// Remembers each stream's writer this long (default
    /// [`DEFAULT_PRODUCER_TTL`]); keep it at least as long as events are
    /// retained.
    pub fn with_producer_ttl(mut self, ttl: Duration) -> Self {
        self.producer_ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// This instance.
    pub fn instance(&self) -> InstanceId {
        self.inner.instance
    }

    /// How long this instance counts as alive after a renewal.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// Records this instance as the writer of `stream`: call it once, when
    /// the stream starts (one session-store write).
    pub async fn produces(&self, stream: &StreamToken) -> Result<()> {
        let instance = self.inner.instance.to_string();
        self.inner
            .store
            .put_session(
                &producer_key(stream),
                instance.as_bytes(),
                self.producer_ttl,
            )
            .await
    }

    /// Resolves once the recorded writer of `stream` is known gone: its
    /// presence lapsed or was closed. Never resolves while the writer is
    /// alive, nor for a stream with no recorded writer. Checks at once,
    /// then every third of a lease; a failed check is logged and counts as
    /// alive. Holds no connection between checks.
    pub fn producer_lost(&self, stream: StreamToken) -> impl Future<Output = ()> + Send + 'static {
        let store = self.inner.store.clone();
        let every = self.inner.lease / 3;
        async move {
            loop {
                match writer_gone(&*store, &stream).await {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, stream = %stream, "cannot check whether a stream's writer is alive; taking it as alive");
                    }
                }
                tokio::time::sleep(every).await;
            }
        }
    }

    /// Stops renewing and removes this instance's presence, so followers
    /// of its streams elsewhere end at their next check rather than a lease
    /// later. For a graceful shutdown; clones stop renewing too.
    pub async fn close(&self) {
        if let Some(renewal) = self
            .inner
            .renewal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            renewal.abort();
        }
        if let Err(error) = self.inner.store.delete_session(&self.inner.key()).await {
            tracing::warn!(%error, "cannot remove this instance's presence; it lapses with its lease");
        }
    }
}

impl Inner {
    fn key(&self) -> String {
        instance_key(&self.instance.to_string())
    }

    async fn renew(&self) -> Result<()> {
        self.store.put_session(&self.key(), b"", self.lease).await
    }
}

async fn renew_while_alive(inner: Weak<Inner>) {
    let Some(every) = inner.upgrade().map(|inner| inner.lease / 3) else {
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else { return };
        if let Err(error) = inner.renew().await {
            tracing::warn!(instance = %inner.instance, %error, "cannot renew this instance's presence");
        }
    }
}

/// Whether the recorded writer of `stream` is gone; `false` when none is
/// recorded.
async fn writer_gone(store: &dyn SessionStore, stream: &StreamToken) -> Result<bool> {
    let Some(writer) = store.get_session(&producer_key(stream)).await? else {
        return Ok(false);
    };
    let Ok(writer) = std::str::from_utf8(&writer) else {
        return Ok(false);
    };
    Ok(store.get_session(&instance_key(writer)).await?.is_none())
}

fn instance_key(instance: &str) -> String {
    format!("{INSTANCE_PREFIX}{instance}")
}

fn producer_key(stream: &StreamToken) -> String {
    format!("{PRODUCER_PREFIX}{stream}")
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::MemoryStore;
    use crate::backend::StreamKey;

    const EVENTUALLY: Duration = Duration::from_secs(30);

    fn stream(name: &str) -> StreamToken {
        StreamKey::generate().unwrap().token(name)
    }

    #[tokio::test]
    async fn a_live_writer_is_never_lost_and_a_closed_one_is() {
        let store = Arc::new(MemoryStore::new());
        let presence = Presence::start(store.clone(), Duration::from_millis(60))
            .await
            .unwrap();
        let s = stream("s");
        presence.produces(&s).await.unwrap();
        let mut lost = Box::pin(presence.producer_lost(s));
        // Several renewals and checks later, still alive.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!((&mut lost).now_or_never().is_none());
        presence.close().await;
        tokio::time::timeout(EVENTUALLY, lost)
            .await
            .expect("a closed writer is lost");
    }

    #[tokio::test]
    async fn a_writer_that_stops_renewing_is_lost_once_its_lease_lapses() {
        let store = Arc::new(MemoryStore::new());
        let watcher = Presence::start(store.clone(), Duration::from_millis(60))
            .await
            .unwrap();
        let writer = Presence::start(store.clone(), Duration::from_millis(60))
            .await
            .unwrap();
        let s = stream("s");
        writer.produces(&s).await.unwrap();
        drop(writer); // killed: no renewal, no removal
        tokio::time::timeout(EVENTUALLY, watcher.producer_lost(s))
            .await
            .expect("a writer whose lease lapsed is lost");
    }

    #[tokio::test]
    async fn a_stream_with_no_recorded_writer_is_never_lost() {
        let store = Arc::new(MemoryStore::new());
        let presence = Presence::start(store.clone(), Duration::from_millis(30))
            .await
            .unwrap();
        let mut lost = Box::pin(presence.producer_lost(stream("unknown")));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!((&mut lost).now_or_never().is_none());
    }

    #[tokio::test]
    async fn a_lease_under_three_milliseconds_is_refused() {
        let store = Arc::new(MemoryStore::new());
        let refused = Presence::start(store, Duration::from_millis(2)).await;
        assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
    }
}
