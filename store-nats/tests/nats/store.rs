//! What is the NATS backend's own: its URL, values larger than one NATS
//! message (spilled, and removed once nothing refers to them), and its
//! health report.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_conformance::events::{Harness, append, replay_data, test_clock, test_options};
use mcp_event_store_core::{EventStore, NewEvent, Retention, SessionStore, Verdict};
use mcp_event_store_nats::testing::{NatsHarness, server_url};
use mcp_event_store_nats::{NatsOptions, NatsStore, Storage};

#[test]
fn urls_name_servers_and_parameters() {
    let (servers, options) = NatsOptions::default()
        .servers("nats://u:p@h1:4222,h2:4223,h3?prefix=app_1&replicas=3&storage=memory&request_timeout_ms=2500&follow_recheck_ms=100")
        .unwrap();
    assert_eq!(
        servers,
        ["nats://u:p@h1:4222", "nats://u:p@h2:4223", "nats://u:p@h3"],
        "every seed gets the credentials"
    );
    assert_eq!(options.prefix, "app_1");
    assert_eq!(options.replicas, 3);
    assert_eq!(options.storage, Storage::Memory);
    assert_eq!(options.request_timeout, Duration::from_millis(2500));
    assert_eq!(options.follow_recheck, Duration::from_millis(100));
    for bad in [
        "nats://h?prefx=typo",
        "nats://h?replicas=1&replicas=3",
        "nats://h?replicas=three",
        "nats://h?storage=tape",
        "nats://h?prefix=a.b",
        "nats://h?replicas=6",
        "redis://h",
        "h:4222",
    ] {
        let refused = NatsOptions::default()
            .servers(bad)
            .and_then(|(_, options)| options.validate());
        assert!(refused.is_err(), "{bad} was accepted");
    }
    let secret = NatsOptions::from_url("nats://user:hunter2@h?prefx=1").unwrap_err();
    assert!(
        !secret.to_string().contains("hunter2"),
        "errors never quote the URL: {secret}"
    );
}

/// How many spilled values the store under `prefix` holds.
async fn spilled(url: &str, prefix: &str) -> usize {
    let (servers, _) = NatsOptions::default().servers(url).unwrap();
    let client = async_nats::connect(servers.as_slice()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream(format!("{prefix}-spill")).await.unwrap();
    let subjects: Vec<_> = stream
        .info_with_subjects(format!("{prefix}.sp.>"))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    subjects.len()
}

/// An event larger than one NATS message round-trips; once JetStream's
/// count limit removed it, its spilled payload goes with a purge after the
/// grace period, and the newest event's stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_payloads_go_when_their_event_does() {
    let harness = NatsHarness::new().await;
    let clock = test_clock();
    let store = harness
        .open(test_options(&clock).retention(Retention::unbounded().max_events_per_stream(1)))
        .await;
    let big = |byte: u8| vec![byte; 3 * 1024 * 1024 + 7];
    let first = append(&store, "s", &big(1)).await;
    let second = append(&store, "s", &big(2)).await;
    assert_eq!(spilled(harness.url(), harness.prefix()).await, 2);
    assert!(replay_data(&store, &second).await.is_empty());
    let whole: Vec<_> = store
        .replay_stream("s")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(whole.len(), 1, "the count limit kept the newest");
    assert_eq!(whole[0].data, big(2));
    assert!(
        store
            .get_stream_id_for_event_id(&first.to_string())
            .await
            .unwrap()
            .is_none()
    );
    store.purge_expired().await.unwrap();
    assert_eq!(
        spilled(harness.url(), harness.prefix()).await,
        2,
        "a value younger than the grace period stays (its append may be under way)"
    );
    clock.advance(Duration::from_secs(6 * 60));
    store.purge_expired().await.unwrap();
    assert_eq!(spilled(harness.url(), harness.prefix()).await, 1);
    let whole: Vec<_> = store
        .replay_stream("s")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(whole[0].data, big(2), "the newest event's payload stays");
    assert_eq!(store.delete_stream("s").await.unwrap(), 1);
    assert_eq!(spilled(harness.url(), harness.prefix()).await, 0);
    harness.close(store).await;
    harness.teardown().await;
}

/// A session state larger than one NATS message round-trips; writing it
/// again leaves the old one for the purge, and a delete takes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_sessions_are_replaced_and_removed() {
    let harness = NatsHarness::new().await;
    let clock = test_clock();
    let store = harness.open(test_options(&clock)).await;
    let ttl = Duration::from_secs(3600);
    let state = vec![9u8; 2 * 1024 * 1024];
    store.put_session("sess", &state, ttl).await.unwrap();
    assert_eq!(store.get_session("sess").await.unwrap().unwrap(), state);
    store.put_session("sess", b"small", ttl).await.unwrap();
    assert_eq!(
        &store.get_session("sess").await.unwrap().unwrap()[..],
        b"small"
    );
    clock.advance(Duration::from_secs(6 * 60));
    store.purge_expired().await.unwrap();
    assert_eq!(spilled(harness.url(), harness.prefix()).await, 0);
    store.put_session("sess", &state, ttl).await.unwrap();
    assert!(store.delete_session("sess").await.unwrap());
    assert_eq!(spilled(harness.url(), harness.prefix()).await, 0);
    assert!(store.get_session("sess").await.unwrap().is_none());
    harness.close(store).await;
    harness.teardown().await;
}

/// The health report names storage, replicas and the server's message
/// size beside the retention, and warns where they are unsafe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_storage_replicas_and_message_size() {
    let harness = NatsHarness::new().await;
    let clock = test_clock();
    let url = format!(
        "{}?prefix={}&storage=memory",
        server_url().await,
        harness.prefix()
    );
    let store = NatsStore::connect_with(&url, NatsOptions::default().store(test_options(&clock)))
        .await
        .unwrap();
    store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    let report = store.check().await.unwrap();
    let setting = |name: &str| {
        report
            .settings
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} in {report:?}"))
            .clone()
    };
    assert_eq!(setting("storage").value, "memory");
    assert!(matches!(setting("storage").verdict, Verdict::Warn { .. }));
    assert_eq!(setting("replicas").value, "1");
    assert_eq!(
        setting("max_payload").verdict,
        Verdict::Ok,
        "values above it are spilled"
    );
    store.close().await;
    harness.teardown().await;
}
