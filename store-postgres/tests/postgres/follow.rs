//! Following on PostgreSQL (C13): the one listening connection per handle,
//! what happens when it is killed, what 1,000 idle followers hold, and that
//! nothing is left once the handle is gone. Each test owns a random schema,
//! hence its own notification channel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::{
    Error, EventId, EventStore, FollowOptions, NewEvent, Replay, Retention, StoreOptions,
};
use mcp_event_store_postgres::PostgresStore;
use mcp_event_store_postgres::testing::PostgresHarness;
use sqlx::{Connection, PgConnection};

/// How long anything that must happen may take before the test fails: far
/// above what it takes, so a miss is a failure, not a slow machine.
const EVENTUALLY: Duration = Duration::from_secs(30);

fn unbounded() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

/// The server processes listening on `channel`: a listener's last
/// statement is its `LISTEN`.
async fn listeners(url: &str, channel: &str) -> Vec<i32> {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let pids = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
          WHERE query LIKE 'LISTEN %' AND position($1 in query) > 0 ORDER BY pid",
    )
    .bind(format!("\"{channel}\""))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    pids
}

/// Server connections whose `application_name` is `name`.
async fn connections_named(url: &str, name: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let n = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    n
}

/// Polls `check` until it holds, failing after [`EVENTUALLY`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < EVENTUALLY,
            "{what}: not within {EVENTUALLY:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn next_id(follow: &mut Replay, what: &str) -> EventId {
    match tokio::time::timeout(EVENTUALLY, follow.events.next()).await {
        Ok(Some(Ok(event))) => event.id,
        Ok(Some(Err(e))) => panic!("{what}: the follow failed: {e}"),
        Ok(None) => panic!("{what}: the follow ended"),
        Err(_) => panic!("{what}: nothing within {EVENTUALLY:?}"),
    }
}

async fn follow(store: &PostgresStore, after: &EventId) -> Replay {
    store
        .follow_events_after(&after.to_string(), FollowOptions::default())
        .await
        .unwrap()
}

/// The listener's connection is killed (`pg_terminate_backend`, as a
/// failover or an operator would): it reconnects, listens again, and the
/// follower keeps receiving another handle's appends, including those
/// committed while nobody listened. The recheck is an hour, so only the
/// listener can have delivered them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_keeps_receiving_after_its_listener_is_killed() {
    let h = PostgresHarness::new().await;
    let options = h
        .options(unbounded())
        .follow_recheck(Duration::from_secs(3600));
    let reader = h.open_with(options.clone()).await;
    let writer = h.open_with(options).await;
    let channel = reader.notify_channel().to_owned();
    assert_eq!(writer.notify_channel(), channel);

    let start = writer
        .store_event("s", NewEvent::new(b"start"))
        .await
        .unwrap();
    let mut follow = follow(&reader, &start).await;
    let id = writer.store_event("s", NewEvent::new(b"1")).await.unwrap();
    assert_eq!(next_id(&mut follow, "before the kill").await, id);

    // Only the reader followed, so only it listens.
    let old = listeners(h.url(), &channel).await;
    assert_eq!(
        old.len(),
        1,
        "one listening connection per following handle"
    );
    let mut admin = PgConnection::connect(h.url()).await.unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old[0])
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(killed);
    // Appended right away: likely while the listener is reconnecting.
    let during = writer.store_event("s", NewEvent::new(b"2")).await.unwrap();
    assert_eq!(next_id(&mut follow, "during the reconnect").await, during);

    let new = eventually("a new listening connection", || async {
        let now = listeners(h.url(), &channel).await;
        (now.len() == 1 && now != old).then_some(now)
    })
    .await;
    assert_ne!(new, old);
    for i in 3..6u8 {
        let id = writer.store_event("s", NewEvent::new(&[i])).await.unwrap();
        assert_eq!(next_id(&mut follow, "after the reconnect").await, id);
    }
    admin.close().await.unwrap();
    drop(follow);
    h.close(reader).await;
    h.close(writer).await;
    h.teardown().await;
}

/// 1,000 idle followers on one handle hold no connection each: the
/// handle's connections (as `pg_stat_activity` counts them by their
/// `application_name`) stay within its pool plus one listener, and exactly
/// one of them listens. The followers are live: an append wakes its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_followers_hold_the_pool_and_one_listener_at_most() {
    const FOLLOWERS: usize = 1_000;
    const POOL: u32 = 4;
    let h = PostgresHarness::new().await;
    let name = format!("follow-idle-{}", h.schema());
    let store = Arc::new(
        h.open_with(
            h.options(unbounded())
                .max_connections(POOL)
                .application_name(name.clone()),
        )
        .await,
    );
    let mut ids = Vec::with_capacity(FOLLOWERS);
    for chunk in (0..FOLLOWERS).collect::<Vec<_>>().chunks(50) {
        let appends = chunk.iter().map(|i| {
            let store = store.clone();
            async move {
                store
                    .store_event(&format!("idle-{i}"), NewEvent::new(b"x"))
                    .await
                    .unwrap()
            }
        });
        ids.extend(futures_util::future::join_all(appends).await);
    }
    let (delivered, mut deliveries) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::with_capacity(FOLLOWERS);
    for (i, id) in ids.iter().enumerate() {
        let mut follow = follow(&store, id).await;
        let delivered = delivered.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(event) = follow.events.next().await {
                let _ = delivered.send((i, event.map(|e| e.id)));
            }
        }));
    }
    assert_eq!(store.open_follows(), FOLLOWERS);

    let held = connections_named(h.url(), &name).await;
    assert!(
        held <= i64::from(POOL) + 1,
        "{FOLLOWERS} idle followers hold {held} connections; the pool has {POOL}"
    );
    assert_eq!(listeners(h.url(), store.notify_channel()).await.len(), 1);

    let id = store
        .store_event("idle-500", NewEvent::new(b"wake"))
        .await
        .unwrap();
    let (i, got) = tokio::time::timeout(EVENTUALLY, deliveries.recv())
        .await
        .expect("the follower of idle-500 woke")
        .unwrap();
    assert_eq!((i, got.unwrap()), (500, id));

    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    assert_eq!(store.open_follows(), 0);
    h.close(Arc::into_inner(store).unwrap()).await;
    h.teardown().await;
}

/// The listener lives as long as the handle: dropping the handle (and its
/// follows) ends it and its connection; so does `close`, after which
/// follows are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_ends_with_its_handle() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded()).await;
    let channel = store.notify_channel().to_owned();
    let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    assert!(
        listeners(h.url(), &channel).await.is_empty(),
        "no follow yet"
    );
    let follow_1 = follow(&store, &id).await;
    assert_eq!(listeners(h.url(), &channel).await.len(), 1);
    drop(follow_1);
    drop(store);
    eventually("the dropped handle's listener to go", || async {
        listeners(h.url(), &channel).await.is_empty().then_some(())
    })
    .await;

    let store = h.open(unbounded()).await;
    let follow_2 = follow(&store, &id).await;
    assert_eq!(listeners(h.url(), &channel).await.len(), 1);
    store.close().await;
    eventually("the closed handle's listener to go", || async {
        listeners(h.url(), &channel).await.is_empty().then_some(())
    })
    .await;
    match store
        .follow_events_after(&id.to_string(), FollowOptions::default())
        .await
    {
        Err(Error::Closed) => {}
        Err(other) => panic!("expected Closed, got {other}"),
        Ok(_) => panic!("a closed store accepted a follow"),
    }
    drop(follow_2);
    h.teardown().await;
}
