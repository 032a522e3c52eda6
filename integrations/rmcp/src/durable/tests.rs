//! [`Durable`](crate::Durable): what it reads from the store, and its one
//! lease.

use std::sync::Arc;
use std::time::Duration;

use mcp_event_store_core::{MemoryStore, Retention, Store, StoreOptions};

use crate::{DEFAULT_FOLLOW_HOLD, DEFAULT_SSE_RETRY, Durable};

#[tokio::test]
async fn the_store_alone_decides_what_guards_a_stream() {
    let options =
        StoreOptions::default().retention(Retention::default().max_age(Duration::from_secs(900)));
    let store = Arc::new(MemoryStore::with_options(options));
    let durable = Durable::builder(store)
        .session_check_interval(Duration::from_millis(250))
        .start()
        .await
        .unwrap();
    let manager = durable.session_manager();
    assert_eq!(manager.binding_ttl(), Duration::from_secs(900));
    assert_eq!(manager.session_check_interval(), Duration::from_millis(250));
    assert!(
        Arc::ptr_eq(&manager, &durable.session_manager()),
        "one manager"
    );
    let config = durable.config();
    assert!(config.session_store.is_some());
    assert_eq!(config.sse_retry, Some(DEFAULT_SSE_RETRY));
    assert!(!durable.stateless_config().legacy_session_mode);
    assert_eq!(durable.events().follow_hold(), Some(DEFAULT_FOLLOW_HOLD));
    durable.shutdown().await;
}

/// Events, sessions and tasks of one `Durable` register one lease in
/// the store, and keep it while anything serving lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_holds_one_lease_while_it_serves() {
    let store = Arc::new(MemoryStore::new());
    let lease = Duration::from_millis(60);
    let durable = Durable::builder(store.clone())
        .runtime(|r| r.lease(lease))
        .start()
        .await
        .unwrap();
    let leases = store.task_runtime().instances().await.unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].instance, durable.tasks().instance());
    let manager = durable.session_manager();
    drop(durable);
    tokio::time::sleep(lease * 10).await;
    let leases = store.task_runtime().instances().await.unwrap();
    assert!(leases.iter().all(|l| l.alive) && leases.len() == 1);
    drop(manager);
    tokio::time::timeout(Duration::from_secs(30), async {
        while store.task_runtime().instances().await.unwrap()[0].alive {
            tokio::time::sleep(lease).await;
        }
    })
    .await
    .expect("nothing serves any more: the lease lapses");
}

/// `as_caller` serves a future (one that is not `Send` too) as the caller
/// the builder's callers read from the extensions given, as `scoped` serves
/// each request of a tower service; outside it, nobody.
#[tokio::test]
async fn as_caller_serves_a_future_as_the_callers_principal() {
    let store = Arc::new(MemoryStore::new());
    let durable = Durable::builder(store)
        .callers(crate::Callers::from_extension(|principal: &String| {
            principal.clone()
        }))
        .start()
        .await
        .unwrap();
    let mut alice = http::Extensions::new();
    alice.insert("alice".to_owned());
    let not_send = std::rc::Rc::new(());
    let seen = durable
        .as_caller(&alice, async move {
            tokio::task::yield_now().await;
            let _still_here = &not_send;
            crate::callers::caller(true)
        })
        .await;
    assert_eq!(seen, Some(mcp_event_store_runtime::owner_of(Some("alice"))));
    let anonymous = durable
        .as_caller(&http::Extensions::new(), async {
            crate::callers::caller(true)
        })
        .await;
    assert_eq!(
        anonymous,
        Some(mcp_event_store_core::task::Owner::Anonymous)
    );
    assert_eq!(crate::callers::caller(true), None, "outside: nobody");
    durable.shutdown().await;
}
