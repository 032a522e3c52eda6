//! The group commit's batch-size metric. Its own test binary: the metrics
//! recorder is process-wide, so no other test may commit meanwhile.

use mcp_event_store_conformance::events::{install_test_recorder, recorded_metric};
use mcp_event_store_core::backend::observe::names::APPEND_BATCH_SIZE;
use mcp_event_store_core::{EventStore, NewEvent};
use mcp_event_store_sqlite::{SqliteOptions, SqliteStore};

/// Appends made at once share commits, and each commit records how many
/// appends it made durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_are_grouped_into_fewer_commits() {
    install_test_recorder();
    let labels = [("backend", "sqlite")];
    let before = recorded_metric(APPEND_BATCH_SIZE, &labels);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_with(SqliteOptions::new(dir.path().join("e.db")))
        .await
        .unwrap();
    const APPENDS: usize = 1_100;
    let tasks: Vec<_> = (0..APPENDS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .store_event(&format!("stream-{i}"), NewEvent::new(b"x"))
                    .await
                    .unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let commits = recorded_metric(APPEND_BATCH_SIZE, &labels) - before;
    assert!(
        commits >= 1.0 && commits < APPENDS as f64,
        "{APPENDS} concurrent appends in {commits} commits"
    );
    store.close().await;
}
