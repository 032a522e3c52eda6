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

/// A token as a notification's payload names it: lowercase hex.
fn hex(id: &EventId) -> String {
    id.token
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How many of the sessions `pids` hold a store's listener lock (the
/// shared advisory lock of class `"mes!"` that each listening handle
/// takes, see `Listeners` in the crate).
async fn registered(url: &str, pids: &[i32]) -> i64 {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let n = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
            AND objsubid = 2 AND classid = x'6d657321'::int4::oid AND pid = ANY($1)",
    )
    .bind(pids)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    n
}

/// The server's clock, as text.
async fn server_now(url: &str) -> String {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let now = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    now
}

/// Waits until a connection named `name` has finished reading who listens
/// (its notifier's `pg_locks` read) in a statement started after `since`.
async fn read_who_listens_since(url: &str, name: &str, since: &str) {
    eventually("the writer's reading of who listens", || async {
        let mut conn = PgConnection::connect(url).await.unwrap();
        let done: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
              WHERE application_name = $1 AND state = 'idle' \
                AND query LIKE '%pg_catalog.pg_locks%' AND query_start >= $2::timestamptz)",
        )
        .bind(name)
        .bind(since)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        done.then_some(())
    })
    .await;
}

/// A handle announces its appends only while another handle listens: an
/// unregistered listener (a bare `LISTEN` on the channel) hears nothing of
/// an append made while no handle followed, before one did or after it
/// left, and hears appends made while one follows. Notifications from one
/// handle arrive in the order it sent them, so once a later append's has
/// arrived, the earlier one's would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_announced_only_while_another_handle_listens() {
    let h = PostgresHarness::new().await;
    let options = h
        .options(unbounded())
        .follow_recheck(Duration::from_secs(3600));
    let name = format!("announce-{}", h.schema());
    let writer = h
        .open_with(options.clone().application_name(name.clone()))
        .await;
    let channel = writer.notify_channel().to_owned();
    let mut overheard = sqlx::postgres::PgListener::connect(h.url()).await.unwrap();
    overheard.listen(&channel).await.unwrap();

    // What the bare listener hears up to (and including) the first
    // announcement of `loud`, appending to it until one comes.
    async fn heard_until(
        overheard: &mut sqlx::postgres::PgListener,
        writer: &PostgresStore,
        loud: &str,
    ) -> Vec<String> {
        let start = Instant::now();
        let mut heard = Vec::new();
        loop {
            let id = writer.store_event(loud, NewEvent::new(b"l")).await.unwrap();
            let wait = Duration::from_millis(200);
            while let Ok(got) = tokio::time::timeout(wait, overheard.recv()).await {
                let payload = got.unwrap().payload().to_owned();
                let done = payload == hex(&id);
                heard.push(payload);
                if done {
                    return heard;
                }
            }
            assert!(
                start.elapsed() < EVENTUALLY,
                "no announcement of {loud} within {EVENTUALLY:?}"
            );
        }
    }

    // Nobody follows yet. Wait until the writer has decided about its
    // append (its first reading of who listens), then start a follower.
    let bare = listeners(h.url(), &channel).await;
    assert_eq!(bare.len(), 1, "only the bare listener listens");
    assert_eq!(registered(h.url(), &bare).await, 0);
    let since = server_now(h.url()).await;
    let quiet = writer
        .store_event("quiet", NewEvent::new(b"q"))
        .await
        .unwrap();
    read_who_listens_since(h.url(), &name, &since).await;

    let reader = h.open_with(options.clone()).await;
    let start = writer
        .store_event("loud", NewEvent::new(b"0"))
        .await
        .unwrap();
    let mut first = follow(&reader, &start).await;
    let reading = listeners(h.url(), &channel).await;
    assert_eq!(
        registered(h.url(), &reading).await,
        1,
        "the reader's listener holds the listener lock"
    );
    let heard = heard_until(&mut overheard, &writer, "loud").await;
    assert!(
        !heard.contains(&hex(&quiet)),
        "an append made while nobody followed was announced: {heard:?}"
    );
    let got = next_id(&mut first, "the reader follows").await;
    assert_eq!(got.token, start.token);

    // The reader goes. Once its session (and lock) is gone and the
    // writer's last reading is stale (older than it keeps one), the
    // writer's appends go unannounced again.
    drop(first);
    h.close(reader).await;
    eventually("the reader's listener to go", || async {
        let now = listeners(h.url(), &channel).await;
        (registered(h.url(), &now).await == 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let since = server_now(h.url()).await;
    let quiet_again = writer
        .store_event("quiet", NewEvent::new(b"q"))
        .await
        .unwrap();
    read_who_listens_since(h.url(), &name, &since).await;
    let reader = h.open_with(options).await;
    let start = writer
        .store_event("loud-2", NewEvent::new(b"0"))
        .await
        .unwrap();
    let second = follow(&reader, &start).await;
    let heard = heard_until(&mut overheard, &writer, "loud-2").await;
    assert!(
        !heard.contains(&hex(&quiet_again)),
        "an append made after the last follower left was announced: {heard:?}"
    );
    drop(second);
    overheard.unlisten_all().await.unwrap();
    drop(overheard);
    h.close(reader).await;
    h.close(writer).await;
    h.teardown().await;
}

/// A handle that read "nobody listens" just before another handle's
/// listener started does not announce an append made right after: the
/// new listener wakes its followers again once that reading is stale, so
/// the follower gets the append although its recheck is an hour away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_that_starts_between_reading_and_appending_gets_the_append() {
    let h = PostgresHarness::new().await;
    let options = h
        .options(unbounded())
        .follow_recheck(Duration::from_secs(3600));
    let writer = h.open_with(options.clone()).await;
    let reader = h.open_with(options).await;
    // The writer reads that nobody listens as it announces this one.
    let start = writer.store_event("s", NewEvent::new(b"0")).await.unwrap();
    let mut follow = follow(&reader, &start).await;
    // Most likely within the writer's fresh reading: unannounced.
    let id = writer.store_event("s", NewEvent::new(b"1")).await.unwrap();
    assert_eq!(
        next_id(&mut follow, "the append after the follow").await,
        id
    );
    drop(follow);
    h.close(reader).await;
    h.close(writer).await;
    h.teardown().await;
}
