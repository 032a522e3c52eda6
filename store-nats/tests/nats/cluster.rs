//! The event and task suites on a cluster of three `nats-server`s that
//! this test binary starts on free loopback ports (every stream and bucket
//! with three replicas), and a cluster that loses a node.

use futures_util::TryStreamExt;
use mcp_event_store_conformance::events::{test_clock, test_options};
use mcp_event_store_core::{EventStore, NewEvent};
use mcp_event_store_nats::testing::NatsHarness;
use mcp_event_store_nats::{NatsOptions, NatsStore};

use crate::common::{Cluster, shared_cluster};

async fn cluster_harness() -> NatsHarness {
    let url = tokio::task::spawn_blocking(shared_cluster)
        .await
        .expect("cluster start-up");
    NatsHarness::with_url(format!("{url}?replicas=3")).await
}

mod events {
    mcp_event_store_conformance::event_suite!(super::cluster_harness(), persistent);
}

mod tasks {
    mcp_event_store_conformance::task_suite!(super::cluster_harness(), persistent);
}

/// Events acknowledged on three replicas survive SIGKILL of the events
/// stream's leader: a replay through the two nodes left sees every one,
/// and appends go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_losing_the_leader() {
    let mut cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .expect("cluster start-up");
    let clock = test_clock();
    let options = NatsOptions::default()
        .store(test_options(&clock))
        .prefix("mes-failover")
        .replicas(3);
    let store = NatsStore::connect_with(&cluster.url(), options.clone())
        .await
        .expect("connect to the cluster");
    let mut ids = Vec::new();
    for i in 0..200u32 {
        let id = store
            .store_event("s", NewEvent::new(&i.to_be_bytes()))
            .await
            .expect("append");
        ids.push(id);
    }
    let leader = store.events_leader().await.expect("the stream's leader");
    store.close().await;
    let doomed = cluster
        .nodes
        .iter_mut()
        .find(|node| node.name == leader)
        .expect("the leader is one of the nodes");
    doomed.kill();
    let survivors: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.name != leader)
        .map(|node| format!("127.0.0.1:{}", node.port))
        .collect();
    let url = format!("nats://{}", survivors.join(","));
    // A new leader is elected within a few seconds; until then, calls fail.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let (store, replayed) = loop {
        let attempt = async {
            let store = NatsStore::connect_with(&url, options.clone()).await?;
            let replay = store.replay_stream("s").await?;
            let events: Vec<_> = replay.events.try_collect().await?;
            Ok::<_, mcp_event_store_core::Error>((store, events))
        };
        match attempt.await {
            Ok(done) => break done,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no replay through the survivors within 60 s: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    };
    assert_eq!(
        replayed.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids,
        "every acknowledged event, in order"
    );
    let next = store
        .store_event("s", NewEvent::new(b"after"))
        .await
        .expect("appends go on with two of three nodes");
    let after = store
        .replay_events_after(&ids[199].to_string())
        .await
        .unwrap();
    let after: Vec<_> = after.events.try_collect().await.unwrap();
    assert_eq!(after.iter().map(|e| e.id).collect::<Vec<_>>(), vec![next]);
    store.destroy().await.expect("remove the store");
}

/// What the store builds its claims on (T17): of concurrent
/// compare-and-set writes to one key of a replicated bucket, exactly one
/// succeeds. Servers before 2.9.21 let them all through (nats-server issue
/// 4320), which is why the store refuses them in a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_is_exclusive_on_the_cluster() {
    let url = tokio::task::spawn_blocking(shared_cluster).await.unwrap();
    let (servers, _) = NatsOptions::default().servers(&url).unwrap();
    let client = async_nats::connect(servers.as_slice()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let bucket = format!(
        "cas-{}",
        mcp_event_store_conformance::testkit::random_suffix()
    );
    js.create_stream(async_nats::jetstream::stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        num_replicas: 3,
        allow_rollup: true,
        deny_delete: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let kv = js.get_key_value(&bucket).await.unwrap();
    for round in 0..10 {
        let rev = kv.put("k", "0".into()).await.unwrap();
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let kv = kv.clone();
                tokio::spawn(
                    async move { kv.update("k", format!("{i}").into(), rev).await.is_ok() },
                )
            })
            .collect();
        let mut wins = 0;
        for racer in racers {
            wins += usize::from(racer.await.unwrap());
        }
        assert_eq!(wins, 1, "round {round}: {wins} of 8 racing updates won");
    }
    js.delete_stream(format!("KV_{bucket}")).await.unwrap();
}
