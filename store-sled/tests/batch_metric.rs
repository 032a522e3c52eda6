//! The group flush's batch-size metric. Its own test binary: the metrics
//! recorder is process-wide, so no other test may flush meanwhile.

use std::time::Duration;

use mcp_event_store_conformance::events::{install_test_recorder, recorded_metric};
use mcp_event_store_core::backend::observe::names::APPEND_BATCH_SIZE;
use mcp_event_store_core::{EventStore, NewEvent};
use mcp_event_store_sled::{Durability, SledOptions, SledStore};

/// Concurrent appends share flushes, and each flush records how many
/// appends it made durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_flushes_record_their_batch_size() {
    install_test_recorder();
    let labels = [("backend", "sled")];
    let before = recorded_metric(APPEND_BATCH_SIZE, &labels);
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), SledOptions::default())
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..8 {
        let store = store.clone();
        tasks.spawn(async move {
            for _ in 0..10 {
                store
                    .store_event(&format!("w{writer}"), NewEvent::new(b"x"))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let flushes = recorded_metric(APPEND_BATCH_SIZE, &labels) - before;
    // One per flush that made appends durable: at least one, at most one
    // per append, fewer when flushes were shared.
    assert!(
        (1.0..=80.0).contains(&flushes),
        "{flushes} batch sizes recorded for 80 appends"
    );
    // Interval handles' appends wait for no flush and form no batch.
    let relaxed = SledStore::open(
        dir.path(),
        SledOptions::default().durability(Durability::Interval(Duration::from_millis(5))),
    )
    .await
    .unwrap();
    let during = recorded_metric(APPEND_BATCH_SIZE, &labels);
    relaxed.store_event("r", NewEvent::new(b"x")).await.unwrap();
    relaxed.flush().await.unwrap();
    assert_eq!(recorded_metric(APPEND_BATCH_SIZE, &labels), during);
    relaxed.close().await.unwrap();
    store.close().await.unwrap();
}
