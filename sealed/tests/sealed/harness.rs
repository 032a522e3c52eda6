//! The conformance harnesses of a sealed store: any backend's harness,
//! each handle it opens wrapped in [`Sealed`] under one fixed test key
//! ring, opened with [`headroom`] so callers keep the payload limits the
//! suites set.

use std::sync::Arc;

use async_trait::async_trait;
use mcp_event_store_conformance::events::{Harness, PersistentHarness};
use mcp_event_store_conformance::tasks::{PersistentTaskHarness, TaskHarness};
use mcp_event_store_core::{Result, Store, StoreOptions};
use mcp_event_store_sealed::{KEY_BYTES, KeyId, KeyRing, Sealed, headroom};

/// The test ring: key 2 current, key 1 old. Fixed, so that a child
/// process (the SIGKILL cases') and a reopen read what was written.
pub fn keys() -> KeyRing {
    KeyRing::new(KeyId(2), &[2; KEY_BYTES])
        .unwrap()
        .with_old_key(KeyId(1), &[1; KEY_BYTES])
        .unwrap()
}

/// `H`'s storage, every handle sealed.
pub struct SealedHarness<H> {
    pub inner: H,
}

impl<H> SealedHarness<H> {
    pub async fn new(inner: impl std::future::Future<Output = H>) -> Self {
        Self { inner: inner.await }
    }
}

fn seal<S>(store: S) -> Sealed<S> {
    Sealed::new(Arc::new(store), keys())
}

/// The store underneath, when no other handle of it is left (a bus made
/// over the sealed store may hold one: then it is dropped, not closed).
fn unseal<S>(store: Sealed<S>) -> Option<S> {
    Arc::try_unwrap(store.into_inner()).ok()
}

#[async_trait]
impl<H: Harness> Harness for SealedHarness<H> {
    type Store = Sealed<H::Store>;

    async fn open(&self, options: StoreOptions) -> Self::Store {
        seal(self.inner.open(headroom(options)).await)
    }

    async fn close(&self, store: Self::Store) {
        if let Some(store) = unseal(store) {
            self.inner.close(store).await;
        }
    }

    async fn lose_data(&self) -> bool {
        self.inner.lose_data().await
    }

    fn forgets_redemptions_itself(&self) -> bool {
        self.inner.forgets_redemptions_itself()
    }

    async fn teardown(self) {
        self.inner.teardown().await;
    }
}

#[async_trait]
impl<H: PersistentHarness> PersistentHarness for SealedHarness<H> {
    fn locator(&self) -> String {
        self.inner.locator()
    }

    async fn attach(locator: &str) -> Self {
        Self {
            inner: H::attach(locator).await,
        }
    }

    async fn try_open(&self, options: StoreOptions) -> Result<Self::Store> {
        Ok(seal(self.inner.try_open(headroom(options)).await?))
    }

    fn format_version(&self) -> u64 {
        self.inner.format_version()
    }

    async fn set_format_version(&self, version: u64) {
        self.inner.set_format_version(version).await;
    }

    async fn stored_bytes(&self) -> Vec<u8> {
        self.inner.stored_bytes().await
    }
}

#[async_trait]
impl<H> TaskHarness for SealedHarness<H>
where
    H: TaskHarness + Harness,
    <H as TaskHarness>::Store: Store,
{
    type Store = Sealed<<H as TaskHarness>::Store>;

    async fn open(&self, options: StoreOptions) -> Self::Store {
        seal(TaskHarness::open(&self.inner, headroom(options)).await)
    }

    async fn open_without_recheck(&self, options: StoreOptions) -> Self::Store {
        seal(self.inner.open_without_recheck(headroom(options)).await)
    }

    async fn close(&self, store: Self::Store) {
        if let Some(store) = unseal(store) {
            TaskHarness::close(&self.inner, store).await;
        }
    }

    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        self.inner.raw_rows().await
    }

    /// The store underneath's, on the sealed bytes.
    fn rewriter<'s>(
        &self,
        store: &'s Self::Store,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }

    async fn teardown(self) {
        TaskHarness::teardown(self.inner).await;
    }
}

#[async_trait]
impl<H> PersistentTaskHarness for SealedHarness<H>
where
    H: PersistentTaskHarness,
    <H as TaskHarness>::Store: Store,
{
    fn task_format_version(&self) -> u64 {
        self.inner.task_format_version()
    }

    async fn set_task_format_version(&self, version: u64) {
        self.inner.set_task_format_version(version).await;
    }
}
