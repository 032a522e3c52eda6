//! The whole conformance suite against a Redis Cluster of three masters that
//! this test binary starts from `redis-server` on free loopback ports (and
//! kills when it exits), plus checks that streams spread over every master
//! and that purging reaches all of them.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::conformance::{append, test_clock, test_options};
use mcp_event_store_core::{EventStore, Retention, SessionStore};
use mcp_event_store_redis::testing::RedisHarness;
use mcp_event_store_redis::{RedisOptions, RedisStore};

async fn cluster_harness() -> RedisHarness {
    let (url, _) = tokio::task::spawn_blocking(common::shared_cluster)
        .await
        .expect("cluster start-up");
    RedisHarness::with_url(url).await
}

mcp_event_store_core::conformance_tests!(cluster_harness(), persistent);

/// Which node (by URL) holds each key of the harness's prefix.
fn keys_by_node(node_urls: &[String], prefix: &str) -> HashMap<String, String> {
    let mut found = HashMap::new();
    for url in node_urls {
        let keys: Vec<String> = common::command(url, redis::cmd("KEYS").arg(format!("{prefix}:*")))
            .expect("KEYS on one node");
        for key in keys {
            found.insert(key, url.clone());
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_spread_over_every_master_with_both_keys_on_one_node() {
    let harness = cluster_harness().await;
    let (_, node_urls) = tokio::task::spawn_blocking(common::shared_cluster)
        .await
        .unwrap();
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    assert!(store.is_cluster());
    let mut firsts = Vec::new();
    for s in 0..60 {
        let stream = format!("{{tag}}-{s}");
        let first = append(&store, &stream, b"0").await;
        append(&store, &stream, b"1").await;
        firsts.push((stream, first));
    }
    for (stream, first) in &firsts {
        let replay = store.replay_events_after(&first.to_string()).await.unwrap();
        assert_eq!(&replay.stream_id, stream);
        let events: Vec<_> = replay.events.try_collect().await.unwrap();
        assert_eq!(events.len(), 1);
    }

    let placement = keys_by_node(&node_urls, harness.prefix());
    let mut streams_per_node: HashMap<&str, usize> = HashMap::new();
    for (key, node) in &placement {
        if let Some(base) = key.strip_suffix(":events") {
            assert_eq!(
                placement.get(&format!("{base}:meta")),
                Some(node),
                "{key}: events and meta on different nodes"
            );
            *streams_per_node.entry(node).or_default() += 1;
        }
    }
    assert_eq!(streams_per_node.values().sum::<usize>(), 60);
    assert_eq!(
        streams_per_node.len(),
        3,
        "streams did not spread over all three masters: {streams_per_node:?}"
    );

    // Age retention must SCAN every master, not just one.
    store
        .put_session("s", b"x", Duration::from_secs(10))
        .await
        .unwrap();
    let aging = RedisStore::connect_with(
        harness.url(),
        harness.options(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        ),
    )
    .await
    .unwrap();
    clock.advance(Duration::from_secs(61));
    let report = aging.purge_expired().await.unwrap();
    assert_eq!(report.streams, 60, "{report:?}");
    assert_eq!(report.events, 120, "{report:?}");
    assert_eq!(report.sessions, 1, "{report:?}");
    drop((store, aging));
    mcp_event_store_core::conformance::Harness::teardown(harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_url_form_connects() {
    let (url, node_urls) = tokio::task::spawn_blocking(common::shared_cluster)
        .await
        .unwrap();
    let prefix = mcp_event_store_redis::testing::random_prefix();
    let one_seed = node_urls[1].replace("redis://", "redis+cluster://");
    let parameter = format!("{}?cluster=true", node_urls[2]);
    let mut ids = Vec::new();
    for url in [&url, &one_seed, &parameter] {
        let store = RedisStore::connect_with(url, RedisOptions::default().key_prefix(&prefix))
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(store.is_cluster(), "{url}");
        ids.push(append(&store, "s", b"x").await);
    }
    assert!(ids.windows(2).all(|w| w[0].token == w[1].token));
    let store = Arc::new(
        RedisStore::connect_with(&url, RedisOptions::default().key_prefix(&prefix))
            .await
            .unwrap(),
    );
    assert_eq!(
        store.destroy().await.unwrap(),
        4,
        "marker, secret, events, meta"
    );
}
