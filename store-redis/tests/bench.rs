//! A quick measurement, run by hand (no timing assertions):
//!
//! ```text
//! cargo test -p mcp-event-store-redis --release --test bench -- --ignored --nocapture
//! ```
//!
//! Store operations beside the same work done by hand with raw `XADD` /
//! `XRANGE` through the same client library and connection settings.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store_core::conformance::{Harness, test_clock, test_options};
use mcp_event_store_core::{EventId, EventStore, NewEvent};
use mcp_event_store_redis::RedisStore;
use mcp_event_store_redis::testing::RedisHarness;
use redis::aio::ConnectionManager;

const PAYLOAD: usize = 200;
const ROUNDS: usize = 7;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

async fn raw_conn(url: &str) -> ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    ConnectionManager::new_with_config(redis::Client::open(url).unwrap(), config)
        .await
        .unwrap()
}

/// Appends/s with `streams` concurrent writers, `per_stream` events each.
async fn store_appends(store: &Arc<RedisStore>, round: usize, streams: usize, per: usize) -> f64 {
    let payload = vec![b'x'; PAYLOAD];
    let start = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let (store, payload) = (store.clone(), payload.clone());
            tokio::spawn(async move {
                let stream = format!("bench-{round}-{s}");
                for _ in 0..per {
                    store
                        .store_event(&stream, NewEvent::new(&payload))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (streams * per) as f64 / start.elapsed().as_secs_f64()
}

async fn raw_appends(
    conn: &ConnectionManager,
    prefix: &str,
    round: usize,
    streams: usize,
    per: usize,
) -> f64 {
    let payload = vec![b'x'; PAYLOAD];
    let start = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let (mut conn, payload) = (conn.clone(), payload.clone());
            let key = format!("{prefix}:raw:{round}-{s}");
            tokio::spawn(async move {
                for _ in 0..per {
                    let _: String = redis::cmd("XADD")
                        .arg(&key)
                        .arg("*")
                        .arg("d")
                        .arg(&payload)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (streams * per) as f64 / start.elapsed().as_secs_f64()
}

/// Appends/s through `EVALSHA` of a one-line `XADD` script: the floor any
/// script-based append pays.
async fn lua_appends(
    conn: &ConnectionManager,
    prefix: &str,
    round: usize,
    streams: usize,
    per: usize,
) -> f64 {
    let script = Arc::new(redis::Script::new(
        "return redis.call('XADD', KEYS[1], '*', 'd', ARGV[1])",
    ));
    let payload = vec![b'x'; PAYLOAD];
    let start = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let (mut conn, payload, script) = (conn.clone(), payload.clone(), script.clone());
            let key = format!("{prefix}:lua:{round}-{s}");
            tokio::spawn(async move {
                for _ in 0..per {
                    let _: String = script
                        .key(&key)
                        .arg(&payload)
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (streams * per) as f64 / start.elapsed().as_secs_f64()
}

/// Raw paged replay: exclusive XRANGE pages of `page` after `start`.
async fn raw_replay(conn: &ConnectionManager, key: &str, start: &str, page: usize) -> usize {
    let mut conn = conn.clone();
    let mut after = format!("({start}");
    let mut total = 0;
    loop {
        let entries: Vec<redis::Value> = redis::cmd("XRANGE")
            .arg(key)
            .arg(&after)
            .arg("+")
            .arg("COUNT")
            .arg(page)
            .query_async(&mut conn)
            .await
            .unwrap();
        total += entries.len();
        match entries.last() {
            Some(redis::Value::Array(entry)) if entries.len() == page => match &entry[0] {
                redis::Value::BulkString(id) => {
                    after = format!("({}", String::from_utf8_lossy(id));
                }
                other => panic!("unexpected entry id {other:?}"),
            },
            _ => return total,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand with --release"]
async fn measure() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = Arc::new(
        RedisStore::connect_with(h.url(), h.options(test_options(&clock)))
            .await
            .unwrap(),
    );
    let conn = raw_conn(h.url()).await;
    println!(
        "server {}, payload {PAYLOAD} B, median of {ROUNDS} rounds",
        h.url()
    );

    for (streams, per) in [(1usize, 5_000usize), (32, 300)] {
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        let mut lua = Vec::new();
        for round in 0..ROUNDS {
            let round = round + streams * 100;
            ours.push(store_appends(&store, round, streams, per).await);
            raw.push(raw_appends(&conn, h.prefix(), round, streams, per).await);
            lua.push(lua_appends(&conn, h.prefix(), round, streams, per).await);
        }
        println!(
            "appends, {streams:>2} stream(s): store {:>9.0}/s   raw XADD {:>9.0}/s   raw EVALSHA(XADD) {:>9.0}/s",
            median(ours),
            median(raw),
            median(lua)
        );
    }

    // A 100,000-event stream, and the same entries copied for raw reads.
    let total = 100_000usize;
    let payload = vec![b'y'; PAYLOAD];
    let ids: Vec<EventId> = {
        let mut ids = Vec::with_capacity(total);
        for chunk in 0..total / 1000 {
            let batch: Vec<_> = (0..1000)
                .map(|_| {
                    let (store, payload) = (store.clone(), payload.clone());
                    tokio::spawn(async move {
                        store
                            .store_event("long", NewEvent::new(&payload))
                            .await
                            .unwrap()
                    })
                })
                .collect();
            let mut got = Vec::new();
            for t in batch {
                got.push(t.await.unwrap());
            }
            got.sort_by_key(|id| id.position);
            ids.extend(got);
            let _ = chunk;
        }
        ids
    };
    let events_key = format!("{}:v1:{{{}}}:events", h.prefix(), ids[0].token);
    let page = store.options().store.page_size;
    for (n, iterations) in [(100usize, 200usize), (10_000, 20)] {
        let cursor = ids[total - n - 1];
        let text = cursor.to_string();
        let redis_id = format!("{}-{}", cursor.position.major, cursor.position.minor);
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        let mut raw_one = Vec::new();
        for _ in 0..iterations {
            let start = Instant::now();
            let replay = store.replay_events_after(&text).await.unwrap();
            let events: Vec<_> = replay.events.try_collect().await.unwrap();
            ours.push(start.elapsed().as_secs_f64() * 1e6);
            assert_eq!(events.len(), n);

            let start = Instant::now();
            assert_eq!(raw_replay(&conn, &events_key, &redis_id, page).await, n);
            raw.push(start.elapsed().as_secs_f64() * 1e6);

            let start = Instant::now();
            assert_eq!(raw_replay(&conn, &events_key, &redis_id, n + 1).await, n);
            raw_one.push(start.elapsed().as_secs_f64() * 1e6);
        }
        println!(
            "replay {n:>6} of {total}: store {:>9.0} us   raw XRANGE pages of {page} {:>9.0} us   raw one XRANGE {:>9.0} us",
            median(ours),
            median(raw),
            median(raw_one)
        );
    }
    drop(store);
    h.teardown().await;
}
