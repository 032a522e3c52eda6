//! Following (C13) on a Redis server this binary starts for itself, so the
//! server's client list holds only this test's connections: what 1,000 idle
//! followers cost in connections, and that a follower survives its
//! watcher's connection being killed.
//!
//! Every store here re-reads only once an hour on its own, so an event
//! from another handle that arrives in time came through the watcher.

use std::time::Duration;

use futures_util::StreamExt;
use mcp_event_store_core::{
    Error, EventId, EventStore, FollowOptions, NewEvent, Replay, StoredEvent,
};
use mcp_event_store_redis::testing::random_prefix;
use mcp_event_store_redis::{RedisOptions, RedisStore, WATCHER_CLIENT_NAME};

/// "Must arrive eventually" guard; never a latency threshold.
const EVENTUALLY: Duration = Duration::from_secs(30);
const NO_RECHECK: Duration = Duration::from_secs(3600);

struct Server {
    process: crate::common::RedisProcess,
    _dir: tempfile::TempDir,
}

fn start_server() -> Server {
    let dir = tempfile::tempdir().expect("temporary directory");
    let process = crate::common::RedisProcess::start(
        dir.path(),
        crate::common::free_port(),
        &["--appendonly", "no"],
    );
    Server { process, _dir: dir }
}

async fn open(url: &str, prefix: &str) -> RedisStore {
    RedisStore::connect_with(
        url,
        RedisOptions::default()
            .key_prefix(prefix)
            .follow_recheck(NO_RECHECK),
    )
    .await
    .expect("connect")
}

async fn append(store: &RedisStore, stream: &str, data: &[u8]) -> EventId {
    store
        .store_event(stream, NewEvent::new(data))
        .await
        .expect("append")
}

async fn follow(store: &RedisStore, after: &EventId) -> Replay {
    store
        .follow_events_after(&after.to_string(), FollowOptions::default())
        .await
        .expect("follow")
}

async fn next(follow: &mut Replay) -> StoredEvent {
    match tokio::time::timeout(EVENTUALLY, follow.events.next()).await {
        Ok(Some(event)) => event.expect("a delivered event"),
        Ok(None) => panic!("the follow ended"),
        Err(_) => panic!("no event within {EVENTUALLY:?}"),
    }
}

/// `CLIENT LIST`, one line per connection, through `conn`.
async fn clients(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines().map(str::to_owned).collect()
}

/// The ids of the watcher connections.
async fn watchers(conn: &mut redis::aio::MultiplexedConnection) -> Vec<i64> {
    let name = format!("name={WATCHER_CLIENT_NAME} ");
    clients(conn)
        .await
        .iter()
        .filter(|line| line.contains(&name))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix("id="))
                .and_then(|id| id.parse().ok())
        })
        .collect()
}

/// Waits until `check` holds for the client list, failing after 30 s.
async fn eventually<F>(conn: &mut redis::aio::MultiplexedConnection, what: &str, check: F)
where
    F: Fn(&[String]) -> bool,
{
    let deadline = tokio::time::Instant::now() + EVENTUALLY;
    loop {
        let list = clients(conn).await;
        if check(&list) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {EVENTUALLY:?}; clients:\n{}",
            list.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_followers_add_at_most_one_connection() {
    const FOLLOWERS: usize = 1_000;
    let server = tokio::task::spawn_blocking(start_server).await.unwrap();
    let url = server.process.url();
    let prefix = random_prefix();
    let reader = open(&url, &prefix).await;
    let writer = open(&url, &prefix).await;
    let mut admin = raw(&url).await;

    let starts: Vec<EventId> = futures_util::stream::iter(0..FOLLOWERS)
        .map(|i| {
            let writer = writer.clone();
            async move { append(&writer, &format!("stream-{i}"), b"start").await }
        })
        .buffered(64)
        .collect()
        .await;
    let before = clients(&mut admin).await.len();

    // One follower per stream: the watcher's XREAD names 1,000 keys.
    let mut follows = Vec::with_capacity(FOLLOWERS);
    for start in &starts {
        follows.push(follow(&reader, start).await);
    }
    assert_eq!(reader.open_follows(), FOLLOWERS);
    // Every follower gets what another handle appends: the watcher covers
    // every stream (the re-check is an hour away).
    let live: Vec<EventId> = futures_util::stream::iter(0..FOLLOWERS)
        .map(|i| {
            let writer = writer.clone();
            async move { append(&writer, &format!("stream-{i}"), b"live").await }
        })
        .buffered(64)
        .collect()
        .await;
    let delivered: Vec<EventId> = futures_util::stream::iter(follows.iter_mut())
        .map(|follow| async move { next(follow).await.id })
        .buffered(FOLLOWERS)
        .collect()
        .await;
    assert_eq!(delivered, live);

    let after = clients(&mut admin).await;
    assert!(
        after.len() <= before + 1,
        "{FOLLOWERS} idle followers added {} connections:\n{}",
        after.len() - before,
        after.join("\n")
    );
    assert_eq!(
        watchers(&mut admin).await.len(),
        1,
        "one watcher per handle"
    );

    // With nobody following, the watcher ends and its connection goes.
    drop(follows);
    assert_eq!(reader.open_follows(), 0);
    let name = format!("name={WATCHER_CLIENT_NAME} ");
    eventually(&mut admin, "the watcher's end", |list| {
        list.len() == before && !list.iter().any(|l| l.contains(&name))
    })
    .await;
    reader.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_still_receives_after_its_watcher_connection_is_killed() {
    let server = tokio::task::spawn_blocking(start_server).await.unwrap();
    let url = server.process.url();
    let prefix = random_prefix();
    let reader = open(&url, &prefix).await;
    let writer = open(&url, &prefix).await;
    let mut admin = raw(&url).await;

    let start = append(&writer, "s", b"start").await;
    let mut follow = follow(&reader, &start).await;
    let first = append(&writer, "s", b"1").await;
    assert_eq!(next(&mut follow).await.id, first);

    let killed = watchers(&mut admin).await;
    assert_eq!(killed.len(), 1, "one watcher");
    let n: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(killed[0])
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(n, 1);

    // Appended while the watcher may still be reconnecting: found by the
    // XREAD from the last id it saw once it is back.
    let mut ids = Vec::new();
    for i in 2..5u8 {
        ids.push(append(&writer, "s", &[b'0' + i]).await);
    }
    let mut got = Vec::new();
    for _ in 0..ids.len() {
        got.push(next(&mut follow).await.id);
    }
    assert_eq!(got, ids);
    // They may have come through a wake-up the old watcher left pending
    // (its first read of a stream wakes the stream's followers once), so
    // the new watcher is awaited, not assumed to be there already.
    let name = format!("name={WATCHER_CLIENT_NAME} ");
    eventually(&mut admin, "the watcher's reconnection", |list| {
        list.iter().filter(|l| l.contains(&name)).count() == 1
    })
    .await;
    let now = watchers(&mut admin).await;
    assert_eq!(now.len(), 1, "one watcher again");
    assert_ne!(now[0], killed[0], "the watcher connected again");
    let more = append(&writer, "s", b"more").await;
    assert_eq!(next(&mut follow).await.id, more);

    // The handle dropped with its follower: the watcher goes with it.
    drop(follow);
    drop(reader);
    eventually(&mut admin, "the watcher's end", |list| {
        !list.iter().any(|l| l.contains(&name))
    })
    .await;
    writer.destroy().await.unwrap();
}

/// A follow opened while the watcher already blocks on other streams is
/// covered too (its `XREAD` is interrupted and issued again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_started_while_the_watcher_blocks_is_covered() {
    let server = tokio::task::spawn_blocking(start_server).await.unwrap();
    let url = server.process.url();
    let prefix = random_prefix();
    let reader = open(&url, &prefix).await;
    let writer = open(&url, &prefix).await;
    let a = append(&writer, "a", b"a0").await;
    let mut follow_a = follow(&reader, &a).await;
    let a1 = append(&writer, "a", b"a1").await;
    assert_eq!(next(&mut follow_a).await.id, a1);
    // The watcher now blocks on `a` alone.
    for round in 0..5u8 {
        let stream = format!("b{round}");
        let b = append(&writer, &stream, b"b0").await;
        let mut follow_b = follow(&reader, &b).await;
        let b1 = append(&writer, &stream, b"b1").await;
        assert_eq!(next(&mut follow_b).await.id, b1);
    }
    let a2 = append(&writer, "a", b"a2").await;
    assert_eq!(next(&mut follow_a).await.id, a2);
    writer.destroy().await.unwrap();
}

/// `close` stops the handle's watcher (its connection goes) while a follow
/// is open, and the follow ends at once with `Error::Closed` (its re-check
/// is an hour away, so only the close can have woken it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_stops_the_watcher_and_ends_open_follows() {
    let server = tokio::task::spawn_blocking(start_server).await.unwrap();
    let url = server.process.url();
    let prefix = random_prefix();
    let reader = open(&url, &prefix).await;
    let writer = open(&url, &prefix).await;
    let mut admin = raw(&url).await;

    let start = append(&writer, "s", b"start").await;
    let mut follow = follow(&reader, &start).await;
    let first = append(&writer, "s", b"1").await;
    assert_eq!(next(&mut follow).await.id, first);
    assert_eq!(watchers(&mut admin).await.len(), 1, "one watcher");

    reader.close().await;
    match tokio::time::timeout(EVENTUALLY, follow.events.next()).await {
        Ok(Some(Err(Error::Closed))) => {}
        Ok(other) => panic!("expected the follow to end with Closed, got {other:?}"),
        Err(_) => panic!("the follow did not end within {EVENTUALLY:?} of the close"),
    }
    let name = format!("name={WATCHER_CLIENT_NAME} ");
    eventually(&mut admin, "the watcher's end", |list| {
        !list.iter().any(|l| l.contains(&name))
    })
    .await;
    assert!(matches!(
        reader
            .follow_events_after(&start.to_string(), FollowOptions::default())
            .await,
        Err(Error::Closed)
    ));
    // The follow is still held, yet no watcher comes back.
    append(&writer, "s", b"2").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(watchers(&mut admin).await.is_empty());
    drop(follow);
    writer.destroy().await.unwrap();
}
