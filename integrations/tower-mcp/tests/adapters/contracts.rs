//! tower-mcp's own contract suites for external stores
//! (`tower_mcp::testing::store_contracts`), run against the adapters over
//! every store: memory (as a `DynStore`, `Arc<dyn Store>`), and each
//! backend compiled in as its concrete type (its kit's harness's store,
//! through `mcp_event_store::for_each_backend!`: no list here).
//!
//! The suites call a synchronous `make()` once per check and want an empty,
//! isolated store each time. Each test opens one piece of private storage
//! through the backend's test harness (its own schema, key prefix, file or
//! directory, found as the test kit finds servers: never skipped), and
//! `make()` hands out an adapter over it with a fresh namespace (events,
//! sessions) or a fresh adapter (tasks: its list is its own process's
//! tasks, and task ids are unique store-wide). The suites need real time,
//! so the stores keep the system clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::{Store, StoreOptions};
use mcp_event_store_tower_mcp::{Runtime, TowerEventStore, TowerSessionStore, TowerTaskStore};
use tower_mcp::testing::store_contracts::{
    event_store_contract, session_store_contract, task_store_contract, task_store_optional_contract,
};

/// A fresh namespace per call, so each check of a suite starts empty.
fn namespaces() -> impl Fn() -> String {
    let next = AtomicU64::new(0);
    move || format!("contract-{}/", next.fetch_add(1, Ordering::Relaxed))
}

async fn events<S: Store + ?Sized>(store: Arc<S>) {
    let namespace = namespaces();
    event_store_contract(|| TowerEventStore::new(store.clone()).with_namespace(namespace())).await;
}

async fn sessions<S: Store + ?Sized>(store: Arc<S>) {
    let namespace = namespaces();
    session_store_contract(|| TowerSessionStore::new(store.clone()).with_namespace(namespace()))
        .await;
}

/// One runtime for the suite (one process), a fresh adapter per check.
async fn runtime(store: Arc<dyn Store>) -> Runtime {
    Runtime::builder(store)
        .start()
        .await
        .expect("the default settings are valid")
}

fn tasks_of(runtime: &Runtime) -> TowerTaskStore {
    TowerTaskStore::builder(runtime.clone())
        .build()
        .expect("the default settings are valid")
}

async fn tasks(store: Arc<dyn Store>) {
    let runtime = runtime(store).await;
    task_store_contract(|| tasks_of(&runtime)).await;
}

async fn optional_tasks(store: Arc<dyn Store>) {
    let runtime = runtime(store).await;
    task_store_optional_contract(|| tasks_of(&runtime)).await;
}

/// The four suites on one backend, each a test of its own with its own
/// storage, the adapters over `Arc<$store>`.
macro_rules! contracts {
    ($backend:ident, $harness:expr, $store:ty) => {
        mod $backend {
            use super::*;

            async fn run<F, Fut>(suite: F)
            where
                F: FnOnce(Arc<$store>) -> Fut,
                Fut: std::future::Future<Output = ()>,
            {
                let harness = $harness.await;
                let store = harness.open(StoreOptions::default()).await;
                suite(Arc::new(store)).await;
                Harness::teardown(harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn event_store_contract() {
                run(events::<$store>).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn session_store_contract() {
                run(sessions::<$store>).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn task_store_contract() {
                run(|store: Arc<$store>| tasks(store)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn task_store_optional_contract() {
                run(|store: Arc<$store>| optional_tasks(store)).await;
            }
        }
    };
}

// The `DynStore` that `connect` returns.
contracts!(
    memory,
    mcp_event_store_conformance::events::MemoryHarness::new(),
    dyn Store
);

/// The concrete store type of each backend compiled in.
macro_rules! backend_contracts {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        contracts!(
            $backend,
            <$kit as mcp_event_store_conformance::bench::Kit>::harness(),
            <<$kit as mcp_event_store_conformance::bench::Kit>::Harness as Harness>::Store
        );
    };
}

mcp_event_store::for_each_backend!(backend_contracts);
