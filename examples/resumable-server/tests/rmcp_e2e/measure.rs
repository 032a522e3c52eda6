//! What `SessionScoped`'s session check costs a request, on each backend:
//! `has_session` for a session held in memory, with the check answered
//! from the last look-up (the default, one look-up per second) and with a
//! look-up on every request (`with_session_check_interval(ZERO)`), beside
//! rmcp's `LocalSessionManager::has_session` alone; on every backend
//! compiled in (`mcp_event_store::backends()`).
//!
//! Not a test: it prints the figures the rmcp crate docs give (`SessionScoped`),
//! and runs only when asked:
//!
//! ```text
//! cargo test --release -p resumable-server --all-features --test rmcp_e2e -- --ignored --nocapture measure_session_check
//! ```

use std::time::{Duration, Instant};

use mcp_event_store::DynStore;
use mcp_event_store::rmcp::{IntoRmcp, SessionScoped};
use rmcp::transport::streamable_http_server::session::{SessionId, SessionManager, SessionState};

use crate::harness::Fixture;

/// Requests timed per figure.
const REQUESTS: u32 = 20_000;

async fn per_request<F, Fut>(mut request: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..REQUESTS / 10 {
        assert!(request().await);
    }
    let started = Instant::now();
    for _ in 0..REQUESTS {
        assert!(request().await);
    }
    started.elapsed() / REQUESTS
}

async fn measure(name: &str, fixture: Fixture) {
    let store: DynStore = mcp_event_store::connect(fixture.url())
        .await
        .expect("open the store");
    let sessions = store.clone().into_rmcp_sessions();
    let state: SessionState = serde_json::from_value(serde_json::json!({
        "initialize_params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "measure", "version": "1"}
        }
    }))
    .unwrap();
    let mut figures = Vec::new();
    for every in [
        mcp_event_store::rmcp::DEFAULT_SESSION_CHECK_INTERVAL,
        Duration::ZERO,
    ] {
        let manager = SessionScoped::local(store.clone())
            .with_session_store(&sessions)
            .with_session_check_interval(every);
        let (id, _transport) = manager.create_session().await.unwrap();
        rmcp::transport::streamable_http_server::session::SessionStore::store(
            &*sessions, &id, &state,
        )
        .await
        .unwrap();
        let id: SessionId = id;
        let scoped = per_request(|| async { manager.has_session(&id).await.unwrap() }).await;
        let alone = per_request(|| async { manager.inner().has_session(&id).await.unwrap() }).await;
        figures.push((every, scoped, alone));
        manager.close_session(&id).await.unwrap();
    }
    for (every, scoped, alone) in figures {
        println!(
            "{name:8} check every {every:>6?}: has_session {scoped:>10.2?} per request \
             (LocalSessionManager alone {alone:.2?})"
        );
    }
    drop(store);
    fixture.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test: prints what the session check costs"]
async fn measure_session_check() {
    for backend in mcp_event_store::backends() {
        measure(backend.name, Fixture::on(backend.name).await).await;
    }
}
