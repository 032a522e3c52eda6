//! The whole conformance suite against a Redis Cluster of three masters that
//! this test binary starts from `redis-server` on free loopback ports (and
//! kills when it exits), plus checks that streams spread over every master
//! and that purging reaches all of them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_conformance::events::{append, test_clock, test_options};
use mcp_event_store_core::{EventStore, NewEvent, Retention, SessionStore};
use mcp_event_store_redis::testing::RedisHarness;
use mcp_event_store_redis::{RedisOptions, RedisStore};

async fn cluster_harness() -> RedisHarness {
    let (url, _) = tokio::task::spawn_blocking(crate::common::shared_cluster)
        .await
        .expect("cluster start-up");
    RedisHarness::with_url(url).await
}

mcp_event_store_conformance::event_suite!(cluster_harness(), persistent);

/// Which node (by URL) holds each key of the harness's prefix.
fn keys_by_node(node_urls: &[String], prefix: &str) -> HashMap<String, String> {
    let mut found = HashMap::new();
    for url in node_urls {
        let keys: Vec<String> =
            crate::common::command(url, redis::cmd("KEYS").arg(format!("{prefix}:*")))
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
    let (_, node_urls) = tokio::task::spawn_blocking(crate::common::shared_cluster)
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
    mcp_event_store_conformance::events::Harness::teardown(harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cluster_url_form_connects() {
    let (url, node_urls) = tokio::task::spawn_blocking(crate::common::shared_cluster)
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

/// On a cluster, `WAIT` goes to the master holding the stream, in the same
/// pipeline as the append: with one master's replica frozen (SIGSTOP),
/// exactly the appends to streams on that master fail, saying why, and the
/// others succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_waits_on_the_streams_own_master() {
    let cluster = tokio::task::spawn_blocking(|| crate::common::Cluster::start_with_replicas(1))
        .await
        .expect("cluster start-up");
    let seed = cluster.node_urls()[0].clone();
    let topology: String =
        crate::common::command(&seed, redis::cmd("CLUSTER").arg("NODES")).expect("CLUSTER NODES");
    // <id> <ip:port@bus> <flags> <master id> ...
    let lines: Vec<Vec<&str>> = topology
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let port_of = |fields: &Vec<&str>| -> u16 {
        fields[1]
            .split(['@', ','])
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .expect("node address")
    };
    let masters: Vec<u16> = lines
        .iter()
        .filter(|f| f[2].contains("master"))
        .map(port_of)
        .collect();
    assert_eq!(masters.len(), 3, "{topology}");
    let replica = lines
        .iter()
        .find(|f| f[2].contains("slave"))
        .expect("a replica");
    let frozen_master = lines
        .iter()
        .find(|f| f[0] == replica[3])
        .map(port_of)
        .expect("the replica's master");
    let replica_port = port_of(replica);

    let prefix = mcp_event_store_redis::testing::random_prefix();
    let store = RedisStore::connect(&format!(
        "{}?prefix={prefix}&wait_replicas=1&wait_timeout_ms=100",
        cluster.url()
    ))
    .await
    .unwrap();
    let frozen = cluster
        .nodes()
        .iter()
        .find(|n| n.port() == replica_port)
        .expect("the replica's process");
    frozen.signal(libc::SIGSTOP);

    let results = futures_util::future::join_all((0..30).map(|i| {
        let store = store.clone();
        async move {
            let stream = format!("s-{i}");
            let result = store.store_event(&stream, NewEvent::new(b"x")).await;
            (stream, result)
        }
    }))
    .await;
    frozen.signal(libc::SIGCONT);

    let master_urls: Vec<String> = masters
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let placement = keys_by_node(&master_urls, &prefix);
    // Which master holds each stream, failed appends included: their events
    // are on the primary all the same.
    let mut node_of_stream = HashMap::new();
    for (key, node) in &placement {
        if key.ends_with(":meta") {
            let sid: String =
                crate::common::command(node, redis::cmd("HGET").arg(key).arg("sid")).expect("sid");
            node_of_stream.insert(sid, node.clone());
        }
    }
    let frozen_url = format!("redis://127.0.0.1:{frozen_master}");
    let (mut failed, mut succeeded) = (0, 0);
    for (stream, result) in results {
        let on_frozen = node_of_stream.get(&stream) == Some(&frozen_url);
        match result {
            Ok(_) => {
                succeeded += 1;
                assert!(
                    !on_frozen,
                    "{stream} succeeded although its master's replica is frozen"
                );
            }
            Err(e) => {
                failed += 1;
                assert!(e.to_string().contains("may not survive a failover"), "{e}");
                assert!(
                    on_frozen,
                    "{stream} failed on a master with a live replica: {e}"
                );
            }
        }
    }
    assert!(
        failed > 0 && succeeded > 0,
        "{failed} failed, {succeeded} succeeded"
    );
    drop(cluster);
}

/// A follow on a cluster gets what another handle appends, on streams of
/// every master: the handle's watcher polls the followed streams (one
/// blocking `XREAD` cannot span slots), and the followers' own re-read is
/// an hour away, so nothing else could deliver it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_on_a_cluster_gets_other_handles_appends() {
    use futures_util::StreamExt;
    use mcp_event_store_core::FollowOptions;

    let harness = cluster_harness().await;
    let options = harness
        .options(mcp_event_store_core::StoreOptions::default())
        .follow_recheck(Duration::from_secs(3600));
    let reader = RedisStore::connect_with(harness.url(), options.clone())
        .await
        .unwrap();
    let writer = RedisStore::connect_with(harness.url(), options)
        .await
        .unwrap();
    assert!(reader.is_cluster());
    let mut follows = Vec::new();
    for s in 0..12 {
        let stream = format!("s-{s}");
        let start = append(&writer, &stream, b"start").await;
        let follow = reader
            .follow_events_after(&start.to_string(), FollowOptions::default())
            .await
            .unwrap();
        follows.push((stream, follow));
    }
    assert_eq!(reader.open_follows(), 12);
    for round in 0..3u8 {
        for (stream, follow) in &mut follows {
            let id = append(&writer, stream, &[round]).await;
            let event = tokio::time::timeout(Duration::from_secs(30), follow.events.next())
                .await
                .expect("delivered within 30 s")
                .expect("the follow goes on")
                .unwrap();
            assert_eq!(event.id, id, "{stream}");
        }
    }
    drop(follows);
    assert_eq!(reader.open_follows(), 0);
    drop((reader, writer));
    mcp_event_store_conformance::events::Harness::teardown(harness).await;
}

/// C15 on a cluster: the check reads every master and reports settings
/// they share once; listings and totals reach the streams of every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_listings_reach_every_master() {
    use mcp_event_store_core::{StreamCursor, Verdict};

    let harness = cluster_harness().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(report.backend, "redis");
    // The test cluster runs without persistence.
    let appendonly: Vec<_> = report
        .settings
        .iter()
        .filter(|s| s.name == "appendonly")
        .collect();
    assert_eq!(appendonly.len(), 1, "{report:?}");
    assert_eq!(appendonly[0].value, "no on all 3 masters");
    assert!(matches!(appendonly[0].verdict, Verdict::Warn { .. }));
    assert!(!report.healthy());

    for s in 0..40 {
        append(&store, &format!("s-{s}"), b"12").await;
    }
    let mut seen = std::collections::HashSet::new();
    let mut after: Option<StreamCursor> = None;
    loop {
        let page = store.list_streams(after.as_ref(), 3).await.unwrap();
        assert!(page.streams.len() <= 3);
        for info in page.streams {
            assert!(seen.insert(info.stream_id.clone()), "{info:?} twice");
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 40);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.streams, stats.events, stats.bytes), (40, 40, 80));
    drop(store);
    mcp_event_store_conformance::events::Harness::teardown(harness).await;
}

/// The shared task suite (T1 to T23) on the cluster: each task's key in its
/// digest's slot, the instance keys in theirs, change messages published
/// on one node and heard on another.
mod tasks {
    use super::cluster_harness;

    mcp_event_store_conformance::task_suite!(cluster_harness(), persistent);
}
