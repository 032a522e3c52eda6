//! tower-mcp's `SessionStore` over any store: see [`TowerSessionStore`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use mcp_event_store_core::{Error, SessionStore, Store};
use tower_mcp::session_store::{Result, SessionRecord, SessionStoreError};

use crate::DEFAULT_NAMESPACE;
use crate::support::session_error;

/// How many fresh ids `create` draws when the one it was given is taken.
const CREATE_ATTEMPTS: usize = 8;

/// Any store as tower-mcp's [`SessionStore`](tower_mcp::session_store::SessionStore),
/// so that a session created on one instance is served by another.
///
/// Each session is one record of the store's session store, keyed
/// `<namespace><session id>` (which the store keeps as a digest, C20):
/// tower-mcp's [`SessionRecord`] as JSON without its id, kept
/// until the record's `expires_at` (each `save` sets the time to live
/// again; tower-mcp saves on every request). A record read after its
/// `expires_at` is never returned, whatever the store's clock says.
///
/// `create` keeps the id it is given unless a live session has it, and then
/// draws a fresh UUID. The check and the write are two steps: two creates
/// racing under one id could both write it, the later one winning.
/// tower-mcp never races itself so (it draws a random UUID for every
/// session), and this project's session store has no insert-if-absent to
/// close the window.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use mcp_event_store_core::MemoryStore;
/// use mcp_event_store_tower_mcp::TowerSessionStore;
/// use tower_mcp::session_store::{SessionRecord, SessionStore};
///
/// let sessions = TowerSessionStore::new(Arc::new(MemoryStore::new()));
/// let mut record = SessionRecord::new("s-1", "2025-11-25", Duration::from_secs(60));
/// sessions.create(&mut record).await?;
/// let loaded = sessions.load("s-1").await?.expect("stored");
/// assert_eq!(loaded.protocol_version, "2025-11-25");
/// sessions.delete("s-1").await?;
/// assert!(sessions.load("s-1").await?.is_none());
/// # Ok(()) }
/// ```
pub struct TowerSessionStore<S: ?Sized = dyn Store> {
    store: Arc<S>,
    namespace: String,
    across_instances: bool,
}

impl<S: ?Sized> Clone for TowerSessionStore<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            namespace: self.namespace.clone(),
            across_instances: self.across_instances,
        }
    }
}

impl<S: ?Sized> fmt::Debug for TowerSessionStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerSessionStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<S: SessionStore + ?Sized> TowerSessionStore<S> {
    /// tower-mcp's session store over `store`, its records keyed under
    /// [`DEFAULT_NAMESPACE`].
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            across_instances: false,
        }
    }

    /// The same for instances wired with [`Across`](crate::Across), whose
    /// [`layer`](crate::Across::layer) layer is on the router:
    /// a delete that is neither a client's `DELETE` nor a session ended on
    /// another instance (that is, tower-mcp's idle cleanup, which sees only
    /// this instance's use of a session) leaves a record another
    /// instance's `save` keeps live, so a session idle here but served
    /// elsewhere is not deleted under it.
    ///
    /// Without that layer every `DELETE` would look like idle cleanup: do
    /// not set this alone.
    pub fn across_instances(mut self) -> Self {
        self.across_instances = true;
        self
    }

    /// The same over another namespace: the prefix of every session key it
    /// writes, so that two applications (or tests) share a store apart.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    fn key(&self, session_id: &str) -> String {
        format!("{}{session_id}", self.namespace)
    }

    /// The record under `session_id`, if it is there and live.
    async fn read(&self, session_id: &str) -> Result<Option<SessionRecord>> {
        let state = match self.store.get_session(&self.key(session_id)).await {
            Ok(state) => state,
            // An id no session can have: no such session.
            Err(Error::InvalidSessionId { .. }) => return Ok(None),
            Err(e) => return Err(session_error(e)),
        };
        let Some(state) = state else {
            return Ok(None);
        };
        let mut record: SessionRecord = serde_json::from_slice(&state)
            .map_err(|e| SessionStoreError::Decode(format!("a stored session record: {e}")))?;
        // Stored without its id (C20): it is the key's.
        record.id = session_id.to_owned();
        Ok((!record.is_expired()).then_some(record))
    }

    /// Stores `record` until its `expires_at`; one already past it is
    /// removed instead, so it can never be loaded.
    async fn write(&self, record: &SessionRecord) -> Result<()> {
        let key = self.key(&record.id);
        let ttl = record
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if ttl.is_zero() {
            return self
                .store
                .delete_session(&key)
                .await
                .map(drop)
                .map_err(session_error);
        }
        // The id is a live credential: the store keeps its digest as the
        // key (C20) and the record without it.
        let mut stored = record.clone();
        stored.id = String::new();
        let state = serde_json::to_vec(&stored)
            .map_err(|e| SessionStoreError::Encode(format!("a session record: {e}")))?;
        self.store
            .put_session(&key, &state, ttl)
            .await
            .map_err(session_error)
    }
}

#[async_trait]
impl<S: SessionStore + ?Sized> tower_mcp::session_store::SessionStore for TowerSessionStore<S> {
    async fn create(&self, record: &mut SessionRecord) -> Result<()> {
        for _ in 0..CREATE_ATTEMPTS {
            if self.read(&record.id).await?.is_none() {
                return self.write(record).await;
            }
            record.id = uuid::Uuid::new_v4().to_string();
        }
        Err(SessionStoreError::Backend(format!(
            "{CREATE_ATTEMPTS} session ids in a row were taken"
        )))
    }

    async fn save(&self, record: &SessionRecord) -> Result<()> {
        self.write(record).await
    }

    async fn load(&self, id: &str) -> Result<Option<SessionRecord>> {
        self.read(id).await
    }

    async fn delete(&self, id: &str) -> Result<()> {
        if self.across_instances
            && !crate::across::ending_on_purpose()
            && self.read(id).await?.is_some()
        {
            tracing::debug!(
                session_id = %id,
                "spared a session idle on this instance that another served within its time to live"
            );
            return Ok(());
        }
        match self.store.delete_session(&self.key(id)).await {
            Ok(_) | Err(Error::InvalidSessionId { .. }) => Ok(()),
            Err(e) => Err(session_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use mcp_event_store_core::MemoryStore;
    use tower_mcp::session_store::SessionStore as _;

    use super::*;

    #[tokio::test]
    async fn a_record_past_its_expiry_is_neither_written_nor_loaded() {
        let store = Arc::new(MemoryStore::new());
        let sessions = TowerSessionStore::new(store.clone());
        let mut record = SessionRecord::new("old", "2025-11-25", Duration::from_secs(60));
        sessions.save(&record).await.unwrap();
        record.expires_at = SystemTime::now() - Duration::from_secs(1);
        sessions.save(&record).await.unwrap();
        assert!(sessions.load("old").await.unwrap().is_none());
        assert_eq!(store.get_session("tower-mcp/old").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_record_is_kept_without_its_id_and_loads_with_it() {
        let store = Arc::new(MemoryStore::new());
        let sessions = TowerSessionStore::new(store.clone());
        let id = "5b0c7f6e-9d1c-4f5e-8a61-2f3c4d5e6f70";
        let mut record = SessionRecord::new(id, "2025-11-25", Duration::from_secs(60));
        record.principal = Some("alice".into());
        sessions.create(&mut record).await.unwrap();
        let kept = store
            .get_session(&format!("tower-mcp/{id}"))
            .await
            .unwrap()
            .expect("kept");
        assert!(!kept.windows(8).any(|w| w == &id.as_bytes()[..8]), "C20");
        let loaded = sessions.load(id).await.unwrap().expect("loaded");
        assert_eq!(loaded.id, id);
        assert_eq!(loaded.principal.as_deref(), Some("alice"));
    }

    #[tokio::test]
    async fn bad_ids_and_bad_records_are_clear_errors_or_absent() {
        let store = Arc::new(MemoryStore::new());
        let sessions = TowerSessionStore::new(store.clone()).with_namespace("");
        assert!(sessions.load("").await.unwrap().is_none());
        sessions.delete("").await.unwrap();
        let mut empty = SessionRecord::new("", "2025-11-25", Duration::from_secs(60));
        assert!(matches!(
            sessions.save(&empty).await,
            Err(SessionStoreError::Encode(_))
        ));
        assert!(sessions.create(&mut empty).await.is_err());
        store
            .put_session("garbled", b"{not json", Duration::from_secs(60))
            .await
            .unwrap();
        assert!(matches!(
            sessions.load("garbled").await,
            Err(SessionStoreError::Decode(_))
        ));
    }
}
