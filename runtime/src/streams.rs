//! Which instance writes which stream, read against the one lease: so that
//! a resume on one instance stops waiting for a stream whose writer died on
//! another.

use std::future::Future;
use std::time::Duration;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::task::InstanceId;
use mcp_event_store_core::{Result, Store};

use crate::Runtime;

/// How long a stream's writer is remembered by default: one hour, the
/// default retention's maximum age, so a resume finds it as long as it
/// finds the stream's events.
pub const DEFAULT_PRODUCER_TTL: Duration = Duration::from_secs(60 * 60);

/// The prefix of the session-store keys naming a stream's writer.
const PRODUCER_PREFIX: &str = "mcp-producer/";
/// The prefix of the session-store keys of an earlier release's separate
/// presence, still read so that its streams are not taken for lost while
/// its instances run beside this release's.
const LEGACY_PRESENCE_PREFIX: &str = "mcp-presence/";

impl Runtime {
    /// Records this instance as the writer of `stream`: call it once, when
    /// the stream starts (one session-store write, kept for the
    /// [producer ttl](crate::RuntimeBuilder::producer_ttl)).
    ///
    /// A client that resumes the stream on another instance gets a follow
    /// (C13) there, which ends, right after what is stored, once this
    /// instance's lease is known lapsed ([`producer_lost`](Self::producer_lost)):
    /// about one lease after this process died, or at once after a
    /// graceful [`shutdown`](Self::shutdown).
    pub async fn produces(&self, stream: &StreamToken) -> Result<()> {
        let instance = self.instance().to_string();
        self.store()
            .put_session(
                &producer_key(stream),
                instance.as_bytes(),
                self.inner.settings.producer_ttl,
            )
            .await
    }

    /// Resolves once the recorded writer of `stream` is known gone: its
    /// lease lapsed or ended. Never resolves while the writer is alive, nor
    /// for a stream with no recorded writer. Checks at once, then every
    /// third of a lease; a failed check is logged and counts as alive.
    /// Holds no connection between checks.
    ///
    /// An instance that lapsed after a stall registers afresh, so the
    /// streams it recorded before read as lost: their resumes end after
    /// what is stored, and the client resumes again.
    pub fn producer_lost(&self, stream: StreamToken) -> impl Future<Output = ()> + Send + 'static {
        let store = self.store().clone();
        let every = self.lease() / 3;
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
}

/// Whether the recorded writer of `stream` is gone; `false` when none is
/// recorded.
async fn writer_gone(store: &dyn Store, stream: &StreamToken) -> Result<bool> {
    let Some(writer) = store.get_session(&producer_key(stream)).await? else {
        return Ok(false);
    };
    let Some(writer) = std::str::from_utf8(&writer)
        .ok()
        .and_then(InstanceId::parse)
    else {
        return Ok(false);
    };
    if store.task_runtime().is_alive(writer).await? {
        return Ok(false);
    }
    let legacy = format!("{LEGACY_PRESENCE_PREFIX}{writer}");
    Ok(store.get_session(&legacy).await?.is_none())
}

fn producer_key(stream: &StreamToken) -> String {
    format!("{PRODUCER_PREFIX}{stream}")
}
