//! What the clones of one [`SledStore`] share ([`Handle`]: its options, and
//! the database until it is closed), and the plumbing the job files reach it
//! through. The database itself, shared by every handle on it in this
//! process, is [`Shared`].

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

use crate::SledStore;
use crate::flusher::{FlushResult, wait_flushed};
use crate::options::Durability;
use crate::shared::Shared;

/// One handle, shared by its clones: its options, and the database until
/// [`SledStore::close`].
pub(crate) struct Handle {
    /// `None` once closed.
    pub(crate) shared: RwLock<Option<Arc<Shared>>>,
    /// The database directory (canonical).
    pub(crate) path: PathBuf,
    pub(crate) store: StoreOptions,
    pub(crate) durability: Durability,
    pub(crate) follow_recheck: Duration,
    /// Whether this handle's limits are recorded (see `Shared::note_limits`).
    pub(crate) limits_noted: AtomicBool,
}

impl SledStore {
    /// The database, or [`Error::Closed`] once this handle is closed.
    pub(crate) fn shared(&self) -> Result<Arc<Shared>> {
        self.handle
            .shared
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed)
    }

    /// Waits for durability if this handle's setting asks for it.
    pub(crate) async fn settle(
        &self,
        wait: Option<tokio::sync::oneshot::Receiver<FlushResult>>,
    ) -> Result<()> {
        match wait {
            Some(wait) => wait_flushed(wait).await,
            None => Ok(()),
        }
    }

    pub(crate) fn relaxed(&self) -> bool {
        matches!(self.handle.durability, Durability::Interval(_))
    }

    /// A flush to wait for after a write other than an append, in `Flush` mode.
    pub(crate) fn flush_after_write(
        &self,
        shared: &Shared,
    ) -> Option<tokio::sync::oneshot::Receiver<FlushResult>> {
        if self.relaxed() {
            shared.flusher.mark_dirty();
            None
        } else {
            Some(shared.flusher.request(None))
        }
    }

    pub(crate) fn now(&self) -> i64 {
        self.handle.store.clock.now_millis()
    }
}
