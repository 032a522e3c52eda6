//! Tests of what is particular to the PostgreSQL backend: format checks,
//! schema names, token collisions, batched retention, sharing between pools
//! and processes, and recovery from lost connections. Each test owns a
//! random schema (see `mcp_event_store_postgres::testing`).

use std::collections::HashSet;
use std::io::Read;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_conformance::events::{
    Harness, PersistentHarness, replay_all, test_clock, test_options,
};
use mcp_event_store_conformance::testkit::{self, ChildGuard};
use mcp_event_store_core::backend::{StreamKey, dense};
use mcp_event_store_core::{
    Error, EventId, EventStore, NewEvent, Position, Retention, SessionStore, StoreOptions,
};
use mcp_event_store_postgres::testing::{PostgresHarness, terminate_connections};
use mcp_event_store_postgres::{PostgresOptions, PostgresStore, Vacuum};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

async fn admin(h: &PostgresHarness) -> PgConnection {
    PgConnection::connect(h.url())
        .await
        .expect("admin connection")
}

async fn count_rows(h: &PostgresHarness, table: &str) -> i64 {
    let mut conn = admin(h).await;
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".{table}",
        h.schema()
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

/// Rewrites every stream row's stored id, as a 120-bit token collision with
/// `owner` would look to the store.
async fn hand_every_stream_to(h: &PostgresHarness, owner: &str) {
    let mut conn = admin(h).await;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".streams SET stream_id = convert_to($1, 'UTF8')",
        h.schema()
    )))
    .bind(owner)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
}

fn unbounded() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

/// C12 with `run_migrations` off: a missing schema is refused before
/// anything is created; an up-to-date one opens and reads as before; one
/// that is behind (lacks a migration of this release) or ahead (a newer
/// release migrated it, named with the schema) is refused. The shared
/// case `newer_format_is_refused_and_changes_nothing` covers a newer
/// format with migrations on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_without_migrations_needs_a_schema_at_this_format() {
    let h = PostgresHarness::new().await;
    let err = PostgresStore::connect_with(h.url(), h.options(unbounded()).run_migrations(false))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");

    let store = h.open(unbounded()).await;
    let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    h.close(store).await;

    // Up to date: opening without migrations works and sees the data.
    let store = h
        .open_with(h.options(unbounded()).run_migrations(false))
        .await;
    assert_eq!(
        store
            .get_stream_id_for_event_id(&id.to_string())
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    h.close(store).await;

    let current = h.format_version();
    for (version, says) in [
        (current - 1, "lacks migration"),
        (current + 1, "newer release"),
    ] {
        h.set_format_version(version).await;
        let err =
            PostgresStore::connect_with(h.url(), h.options(unbounded()).run_migrations(false))
                .await
                .unwrap_err();
        match &err {
            Error::IncompatibleFormat(message) => {
                assert!(message.contains(says), "format {version}: {message}");
                assert!(message.contains(h.schema()), "format {version}: {message}");
            }
            other => panic!("format {version}: expected IncompatibleFormat, got {other}"),
        }
    }
    h.set_format_version(current).await;
    let store = h
        .open_with(h.options(unbounded()).run_migrations(false))
        .await;
    h.close(store).await;
    h.teardown().await;
}

/// C12: a migration that failed part way (its row says `success =
/// false`) is refused, with migrations on or off, and nothing is changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_applied_migration_is_refused() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded()).await;
    let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    h.close(store).await;

    let mut conn = admin(&h).await;
    let set_success = |success: bool| {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE \"{}\"._sqlx_migrations SET success = $1 WHERE version = 1",
            h.schema()
        )))
        .bind(success)
    };
    set_success(false).execute(&mut conn).await.unwrap();
    for run_migrations in [true, false] {
        let err = PostgresStore::connect_with(
            h.url(),
            h.options(unbounded()).run_migrations(run_migrations),
        )
        .await
        .unwrap_err();
        match &err {
            Error::IncompatibleFormat(message) => {
                assert!(message.contains("failed part way"), "{message}")
            }
            other => panic!("expected IncompatibleFormat, got {other}"),
        }
    }
    set_success(true).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    let store = h.open(unbounded()).await;
    assert_eq!(
        store
            .get_stream_id_for_event_id(&id.to_string())
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    h.close(store).await;
    h.teardown().await;
}

/// `close` is idempotent; afterwards every call, on the handle and its
/// clones, fails with `Error::Closed`, and another handle carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_close_fail_with_closed() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded()).await;
    let other = h.open(unbounded()).await;
    let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    let clone = store.clone();
    store.close().await;
    store.close().await;
    let closed = |what: &str, result: Result<(), Error>| match result {
        Err(Error::Closed) => {}
        other => panic!("{what} after close: expected Error::Closed, got {other:?}"),
    };
    let raw = id.to_string();
    for handle in [&store, &clone] {
        closed(
            "store_event",
            handle.store_event("s", NewEvent::new(b"y")).await.map(drop),
        );
        closed("replay", handle.replay_events_after(&raw).await.map(drop));
        closed(
            "lookup",
            handle.get_stream_id_for_event_id(&raw).await.map(drop),
        );
        closed(
            "follow",
            handle
                .follow_events_after(&raw, Default::default())
                .await
                .map(drop),
        );
        closed("delete_stream", handle.delete_stream("s").await.map(drop));
        closed("purge_expired", handle.purge_expired().await.map(drop));
        closed("stats", handle.stats().await.map(drop));
        closed(
            "put_session",
            handle
                .put_session("sess", b"state", Duration::from_secs(60))
                .await,
        );
        closed("get_session", handle.get_session("sess").await.map(drop));
    }
    assert_eq!(
        other
            .get_stream_id_for_event_id(&raw)
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    h.close(other).await;
    h.teardown().await;
}

/// Schema names are identifiers, checked before any connection is made.
#[tokio::test]
async fn bad_schema_names_are_refused_before_connecting() {
    for schema in ["", "Public", "a\"; DROP SCHEMA public CASCADE; --", "a-b"] {
        // Port 1 on loopback: nothing listens, so reaching the server would
        // fail differently.
        let err = PostgresStore::connect_with(
            "postgres://postgres@127.0.0.1:1/postgres",
            PostgresOptions::default().schema(schema),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{schema:?}: {err}");
    }
    let err = PostgresStore::connect_with(
        "postgres://postgres@127.0.0.1:1/postgres",
        PostgresOptions::default(),
    )
    .await
    .unwrap_err();
    match err {
        Error::Backend { backend, source } => {
            assert_eq!(backend, "postgres");
            assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source}");
        }
        other => panic!("expected a backend error, got {other}"),
    }
}

/// Two stores on one schema derive the same tokens (the key is shared), and
/// `from_pool` works on a plain pool with no `search_path`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_the_stream_key_and_from_pool_works() {
    let h = PostgresHarness::new().await;
    let (one, two) = tokio::join!(h.open(unbounded()), h.open(unbounded()));
    let a = one.store_event("s", NewEvent::new(b"1")).await.unwrap();
    let b = two.store_event("s", NewEvent::new(b"2")).await.unwrap();
    assert_eq!(a.token, b.token);
    let pool = sqlx::PgPool::connect(h.url()).await.unwrap();
    let three = PostgresStore::from_pool(
        pool,
        PostgresOptions::default()
            .schema(h.schema())
            .store(unbounded()),
    )
    .await
    .unwrap();
    let c = three.store_event("s", NewEvent::new(b"3")).await.unwrap();
    assert_eq!(c.token, a.token);
    let (_, events) = replay_all(&three, &a.to_string()).await.unwrap();
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), [b, c]);
    for store in [one, two, three] {
        h.close(store).await;
    }
    h.teardown().await;
}

/// A stream id with a NUL byte is data (stored as BYTEA), distinct from its
/// neighbours; so is a session id with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_bytes_in_ids_are_data() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded()).await;
    let mut firsts = Vec::new();
    for stream in ["a", "a\0", "a\0b", "\0"] {
        firsts.push(
            store
                .store_event(stream, NewEvent::new(stream.as_bytes()))
                .await
                .unwrap(),
        );
        store
            .store_event(stream, NewEvent::new(b"next"))
            .await
            .unwrap();
    }
    for (first, stream) in firsts.iter().zip(["a", "a\0", "a\0b", "\0"]) {
        let (replayed, events) = replay_all(&store, &first.to_string()).await.unwrap();
        assert_eq!(replayed, stream);
        assert_eq!(events.len(), 1);
    }
    assert_eq!(store.delete_stream("a\0").await.unwrap(), 2);
    assert_eq!(
        store
            .get_stream_id_for_event_id(&firsts[0].to_string())
            .await
            .unwrap()
            .as_deref(),
        Some("a")
    );
    let ttl = Duration::from_secs(60);
    store.put_session("s\0x", b"nul", ttl).await.unwrap();
    store.put_session("s", b"plain", ttl).await.unwrap();
    assert_eq!(
        store.get_session("s\0x").await.unwrap().as_deref(),
        Some(&b"nul"[..])
    );
    assert_eq!(
        store.get_session("s").await.unwrap().as_deref(),
        Some(&b"plain"[..])
    );
    h.close(store).await;
    h.teardown().await;
}

/// If a stream's row holds another stream id under the same token (a
/// 120-bit collision, simulated here), appends are refused and neither
/// stream changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_collision_is_an_error_not_a_mix() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded()).await;
    let first = store
        .store_event("victim", NewEvent::new(b"v"))
        .await
        .unwrap();
    hand_every_stream_to(&h, "impostor").await;
    let err = store
        .store_event("victim", NewEvent::new(b"x"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert_eq!(count_rows(&h, "events").await, 1);
    // delete_stream checks the stored id too: it removes nothing.
    assert_eq!(store.delete_stream("victim").await.unwrap(), 0);
    let (_, events) = replay_all(&store, &first.to_string()).await.unwrap();
    assert!(events.is_empty());
    h.close(store).await;
    h.teardown().await;
}

/// C8: count trimming happens at append (logically: trimmed ids are gone at
/// once), rows go in `purge_expired` in batches; age and byte limits and
/// `delete_stream` clear thousands of rows; nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_rows_in_batches() {
    let h = PostgresHarness::new().await;
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_events_per_stream(10)))
        .await;
    // Seed 2,500 events through a second, unbounded handle, then let the
    // bounded one trim on its next append.
    let seeder = h.open(test_options(&clock)).await;
    let first = seeder
        .store_event("big", NewEvent::new(b"0"))
        .await
        .unwrap();
    seed_stream(&seeder, "big", 2_499).await;
    let kept_before = store
        .store_event("big", NewEvent::new(b"last"))
        .await
        .unwrap();
    assert_eq!(kept_before.position.minor, 2_501);
    assert_eq!(
        store
            .get_stream_id_for_event_id(&first.to_string())
            .await
            .unwrap(),
        None,
        "trimmed at append, before any purge"
    );
    assert_eq!(count_rows(&h, "events").await, 2_501);
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 2_491, "{report:?}");
    assert_eq!(count_rows(&h, "events").await, 10);

    // Age: everything expires, the stream row goes too.
    let aging = h
        .open(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        )
        .await;
    seed_stream(&seeder, "old", 2_345).await;
    clock.advance(Duration::from_secs(61));
    let fresh = seeder
        .store_event("fresh", NewEvent::new(b"f"))
        .await
        .unwrap();
    let report = aging.purge_expired().await.unwrap();
    assert_eq!(report.events, 2_345 + 10, "{report:?}");
    assert_eq!(report.streams, 2, "{report:?}");
    assert_eq!(count_rows(&h, "events").await, 1);
    assert_eq!(count_rows(&h, "streams").await, 1);
    assert!(
        aging
            .get_stream_id_for_event_id(&fresh.to_string())
            .await
            .unwrap()
            .is_some()
    );

    // Bytes: 1,500 events of 100 bytes under a 10,000-byte limit keep 100.
    let bytes = h
        .open(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(10_000)))
        .await;
    for _ in 0..3 {
        let payload = [7u8; 100];
        let ids = futures_util::future::try_join_all(
            (0..500).map(|_| seeder.store_event("wide", NewEvent::new(&payload))),
        )
        .await
        .unwrap();
        assert_eq!(ids.len(), 500);
    }
    bytes
        .store_event("wide", NewEvent::new(&[7u8; 100]))
        .await
        .unwrap();
    let report = bytes.purge_expired().await.unwrap();
    assert_eq!(report.events, 1_401, "{report:?}");
    assert_eq!(count_rows(&h, "events").await, 1 + 100);

    // delete_stream of a long stream removes every row and the stream row.
    seed_stream(&seeder, "doomed", 3_210).await;
    assert_eq!(seeder.delete_stream("doomed").await.unwrap(), 3_210);
    assert_eq!(count_rows(&h, "events").await, 1 + 100);
    assert_eq!(count_rows(&h, "streams").await, 2);
    for s in [store, seeder, aging, bytes] {
        h.close(s).await;
    }
    h.teardown().await;
}

async fn seed_stream(store: &PostgresStore, stream: &str, n: usize) {
    let stored = AtomicUsize::new(0);
    futures_util::stream::iter(0..n)
        .map(Ok::<_, Error>)
        .try_for_each_concurrent(8, |i| {
            let stored = &stored;
            async move {
                store
                    .store_event(stream, NewEvent::new(&(i as u32).to_be_bytes()))
                    .await?;
                stored.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        })
        .await
        .unwrap();
    assert_eq!(stored.load(Ordering::Relaxed), n);
}

/// C3: page sizes above the cap still replay everything, in pages the
/// planner serves from the primary key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_page_size_is_capped_and_replays_everything() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded().page_size(10_000)).await;
    let first = store
        .store_event("s", NewEvent::new(b"start"))
        .await
        .unwrap();
    seed_stream(&store, "s", 2_345).await;
    let (_, events) = replay_all(&store, &first.to_string()).await.unwrap();
    assert_eq!(events.len(), 2_345);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.id.position.minor, i as u64 + 2);
    }
    h.close(store).await;
    h.teardown().await;
}

/// Follows `stream` from `start`, checking every replay only moves forward,
/// until `done` is set; returns the ids seen.
async fn follow(store: Arc<PostgresStore>, start: EventId, done: Arc<AtomicBool>) -> Vec<EventId> {
    let mut cursor = start;
    let mut seen = Vec::new();
    loop {
        let finished = done.load(Ordering::SeqCst);
        let replay = store
            .replay_events_after(&cursor.to_string())
            .await
            .unwrap();
        let events: Vec<_> = replay.events.try_collect().await.unwrap();
        for event in events {
            assert_eq!(event.id.token, cursor.token);
            assert_eq!(
                event.id.position.minor,
                cursor.position.minor + 1,
                "replay skipped or repeated"
            );
            cursor = event.id;
            seen.push(event.id);
        }
        if finished {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Checks that `acknowledged` ids are all distinct and that `seen` is
/// exactly them in order (nothing lost, duplicated or out of order).
fn check_all_seen(mut acknowledged: Vec<EventId>, seen: &[EventId]) {
    let unique: HashSet<_> = acknowledged.iter().collect();
    assert_eq!(
        unique.len(),
        acknowledged.len(),
        "duplicate ids acknowledged"
    );
    acknowledged.sort_by_key(|id| id.position);
    assert_eq!(seen.len(), acknowledged.len(), "the reader missed events");
    assert_eq!(seen, &acknowledged[..]);
}

/// C6, C11: two pools append to one shared stream and to their own streams
/// at once while a third follows the shared stream by cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_append_while_a_third_replays() {
    const PER_TASK: usize = 60;
    let h = PostgresHarness::new().await;
    let one = Arc::new(h.open(unbounded()).await);
    let two = Arc::new(h.open(unbounded()).await);
    let reader = Arc::new(h.open(unbounded()).await);
    let start = one
        .store_event("shared", NewEvent::new(b"start"))
        .await
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let follower = tokio::spawn(follow(reader.clone(), start, done.clone()));

    let mut tasks = Vec::new();
    for (p, store) in [one.clone(), two.clone()].into_iter().enumerate() {
        for t in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let own = format!("own-{p}-{t}");
                let mut shared = Vec::new();
                let mut mine = Vec::new();
                for i in 0..PER_TASK {
                    let data = format!("{p}-{t}-{i}");
                    shared.push(
                        store
                            .store_event("shared", NewEvent::new(data.as_bytes()))
                            .await
                            .unwrap(),
                    );
                    mine.push(
                        store
                            .store_event(&own, NewEvent::new(data.as_bytes()))
                            .await
                            .unwrap(),
                    );
                }
                (own, shared, mine)
            }));
        }
    }
    let mut acknowledged = Vec::new();
    for task in tasks {
        let (own, shared, mine) = task.await.unwrap();
        acknowledged.extend(shared);
        // Each own stream: exactly its events, 1..=PER_TASK.
        let positions: Vec<u64> = mine.iter().map(|id| id.position.minor).collect();
        assert_eq!(
            positions,
            (1..=PER_TASK as u64).collect::<Vec<_>>(),
            "{own}"
        );
        let (stream, events) = replay_all(&*reader, &mine[0].to_string()).await.unwrap();
        assert_eq!(stream, own);
        assert_eq!(events.len(), PER_TASK - 1);
    }
    done.store(true, Ordering::SeqCst);
    let seen = follower.await.unwrap();
    check_all_seen(acknowledged, &seen);
    for store in [one, two, reader] {
        h.close(Arc::into_inner(store).unwrap()).await;
    }
    h.teardown().await;
}

/// Tells [`shared_stream_child_appender`] which schema to append to (a
/// harness locator) and its name: `<name> <locator>`.
const CHILD_ENV: &str = "MCP_EVENT_STORE_POSTGRES_TEST_CHILD";
const CHILD_EVENTS: usize = 150;
/// How a child reports an acknowledged append to the shared stream.
const SHARED_ACK: &str = "SHARED ";

/// Starts [`shared_stream_child_appender`] as a child process (this test
/// binary), owned by a [`ChildGuard`], with its stdout piped.
fn spawn_child(h: &PostgresHarness, name: &str) -> ChildGuard {
    let mut command = testkit::test_child(&testkit::test_path(
        module_path!(),
        "shared_stream_child_appender",
    ))
    .unwrap();
    command
        .env(CHILD_ENV, format!("{name} {}", h.locator()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    ChildGuard::spawn(&mut command).expect("re-executing the test binary")
}

/// Waits for the child to succeed and returns the shared-stream ids it
/// acknowledged.
fn finish(mut child: ChildGuard) -> Vec<EventId> {
    let mut out = String::new();
    child
        .take_stdout()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "child process failed: {status}\n{out}");
    // A line may follow libtest's `test ... ` prefix: find the marker.
    out.lines()
        .filter_map(|line| line.split_once(SHARED_ACK))
        .map(|(_, id)| id.trim().parse().unwrap())
        .collect()
}

/// The child's side of [`two_processes_append_while_a_third_replays`]:
/// appends to the shared stream and to its own, printing every
/// acknowledged shared id. Without [`CHILD_ENV`] it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of two_processes_append_while_a_third_replays"]
async fn shared_stream_child_appender() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (name, locator) = spec.split_once(' ').unwrap();
    let h = PostgresHarness::attach(locator).await;
    let store = h.open_with(h.options(unbounded()).max_connections(4)).await;
    let own = format!("own-{name}");
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            let own = own.clone();
            tokio::spawn(async move {
                let mut shared = Vec::new();
                for i in 0..CHILD_EVENTS / 4 {
                    let data = format!("{t}-{i}");
                    shared.push(
                        store
                            .store_event("shared", NewEvent::new(data.as_bytes()))
                            .await
                            .unwrap(),
                    );
                    store
                        .store_event(&own, NewEvent::new(data.as_bytes()))
                        .await
                        .unwrap();
                }
                shared
            })
        })
        .collect();
    let mut lines = String::new();
    for task in tasks {
        for id in task.await.unwrap() {
            lines.push_str(&format!("\n{SHARED_ACK}{id}"));
        }
    }
    println!("{lines}");
    h.close(store).await;
}

/// C6, C11: two OS processes append to one stream (and to their own) while
/// this one appends too and follows the shared stream by cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_append_while_a_third_replays() {
    let h = PostgresHarness::new().await;
    let store = Arc::new(h.open(unbounded()).await);
    let start = store
        .store_event("shared", NewEvent::new(b"start"))
        .await
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let follower = tokio::spawn(follow(store.clone(), start, done.clone()));
    let children = [spawn_child(&h, "a"), spawn_child(&h, "b")];
    let mut acknowledged = Vec::new();
    for i in 0..100u32 {
        acknowledged.push(
            store
                .store_event("shared", NewEvent::new(&i.to_be_bytes()))
                .await
                .unwrap(),
        );
    }
    let [a, b] = children;
    let (a, b) = tokio::task::spawn_blocking(move || (finish(a), finish(b)))
        .await
        .unwrap();
    assert_eq!(a.len(), CHILD_EVENTS / 4 * 4);
    assert_eq!(b.len(), CHILD_EVENTS / 4 * 4);
    acknowledged.extend(a);
    acknowledged.extend(b);
    done.store(true, Ordering::SeqCst);
    let seen = follower.await.unwrap();
    check_all_seen(acknowledged, &seen);
    for name in ["a", "b"] {
        let mut conn = admin(&h).await;
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT last_seq FROM \"{}\".streams WHERE stream_id = $1",
            h.schema()
        )))
        .bind(format!("own-{name}").into_bytes())
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(n as usize, CHILD_EVENTS / 4 * 4, "own-{name}");
    }
    h.close(Arc::into_inner(store).unwrap()).await;
    h.teardown().await;
}

/// Connection loss: the store's server connections are terminated in the
/// middle of a run. Calls in flight fail with a postgres backend error, the
/// store recovers by itself, and every acknowledged event is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_recovers_when_its_connections_are_terminated() {
    let h = PostgresHarness::new().await;
    let app = format!("mcp-test-{}", h.schema());
    let store = Arc::new(
        h.open_with(
            h.options(unbounded())
                .application_name(&app)
                .max_connections(4),
        )
        .await,
    );
    let start = store
        .store_event("s", NewEvent::new(b"start"))
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (store, stop, acked) = (store.clone(), stop.clone(), acked.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                let mut errors = 0usize;
                let mut i = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let data = format!("{w}-{i}");
                    match store.store_event("s", NewEvent::new(data.as_bytes())).await {
                        Ok(id) => {
                            ids.push(id);
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::Backend {
                            backend: "postgres",
                            ..
                        }) => errors += 1,
                        Err(other) => panic!("unexpected error: {other}"),
                    }
                }
                (ids, errors)
            })
        })
        .collect();
    let replayer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut errors = 0usize;
            while !stop.load(Ordering::SeqCst) {
                match replay_all(&*store, &start.to_string()).await {
                    Ok(_) => {}
                    Err(Error::Backend {
                        backend: "postgres",
                        ..
                    }) => errors += 1,
                    Err(other) => panic!("unexpected replay error: {other}"),
                }
            }
            errors
        })
    };

    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < 200 {
        assert!(Instant::now() < deadline, "writers made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut ended = 0;
    for _ in 0..3 {
        ended += terminate_connections(h.url(), &app).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ended >= 1, "no connection to terminate");
    let after_loss = acked.load(Ordering::SeqCst);
    while acked.load(Ordering::SeqCst) < after_loss + 300 {
        assert!(Instant::now() < deadline, "the store did not recover");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut acknowledged = Vec::new();
    let mut errors = replayer.await.unwrap();
    for writer in writers {
        let (ids, e) = writer.await.unwrap();
        acknowledged.extend(ids);
        errors += e;
    }
    assert!(
        errors >= 1,
        "terminating {ended} connections failed no call"
    );

    // Every acknowledged event is there; the stream is dense and in order
    // (an append that failed may still have committed: that is allowed).
    let (_, events) = replay_all(&*store, &start.to_string()).await.unwrap();
    let replayed: HashSet<_> = events.iter().map(|e| e.id).collect();
    for id in &acknowledged {
        assert!(replayed.contains(id), "acknowledged {id} was lost");
    }
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.id.position.minor, i as u64 + 2);
    }
    eprintln!(
        "terminated {ended} connections; {errors} calls failed; {} acknowledged, {} stored",
        acknowledged.len(),
        events.len()
    );
    h.close(Arc::into_inner(store).unwrap()).await;
    h.teardown().await;
}

/// C6 with C8: purges running beside appenders on a stream that the count
/// limit trims never open a gap for a reader following it, and leave
/// exactly the limit behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_beside_appends_never_open_a_gap() {
    const LIMIT: u64 = 1_000;
    let h = PostgresHarness::new().await;
    let clock = test_clock();
    let store = Arc::new(
        h.open(test_options(&clock).retention(Retention::unbounded().max_events_per_stream(LIMIT)))
            .await,
    );
    let start = store
        .store_event("hot", NewEvent::new(b"start"))
        .await
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let follower = tokio::spawn(follow(store.clone(), start, done.clone()));
    let purger = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let mut removed = 0;
            while !done.load(Ordering::SeqCst) {
                removed += store.purge_expired().await.unwrap().events;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            removed
        })
    };
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..400u32 {
                    let data = format!("{w}-{i}");
                    ids.push(
                        store
                            .store_event("hot", NewEvent::new(data.as_bytes()))
                            .await
                            .unwrap(),
                    );
                }
                ids
            })
        })
        .collect();
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    done.store(true, Ordering::SeqCst);
    let seen = follower.await.unwrap();
    let removed_while_running = purger.await.unwrap();
    check_all_seen(acknowledged, &seen);
    let report = store.purge_expired().await.unwrap();
    assert_eq!(removed_while_running + report.events, 1_601 - LIMIT);
    assert_eq!(count_rows(&h, "events").await, LIMIT as i64);
    h.close(Arc::into_inner(store).unwrap()).await;
    h.teardown().await;
}

/// Appends that arrive together share one statement (see the crate's
/// `batch` module); a token collision among them must fail only the
/// colliding appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collision_in_a_batch_fails_only_its_own_appends() {
    let h = PostgresHarness::new().await;
    let store = Arc::new(h.open(unbounded()).await);
    store
        .store_event("victim", NewEvent::new(b"v"))
        .await
        .unwrap();
    hand_every_stream_to(&h, "impostor").await;

    let mut tasks = tokio::task::JoinSet::new();
    for round in 0..8 {
        for stream in ["a", "victim", "b", "c", "d", "e", "f", "g"] {
            let store = store.clone();
            tasks.spawn(async move {
                let payload = format!("{stream}-{round}");
                let result = store
                    .store_event(stream, NewEvent::new(payload.as_bytes()))
                    .await;
                (stream, result)
            });
        }
    }
    let mut stored: std::collections::HashMap<&str, Vec<EventId>> = Default::default();
    while let Some(joined) = tasks.join_next().await {
        let (stream, result) = joined.unwrap();
        if stream == "victim" {
            assert!(matches!(result, Err(Error::Corrupt(_))), "{result:?}");
        } else {
            stored.entry(stream).or_default().push(result.unwrap());
        }
    }
    assert_eq!(stored.len(), 7);
    for (stream, mut ids) in stored {
        ids.sort_by_key(|id| id.position);
        let seqs: Vec<u64> = ids.iter().map(|id| id.position.minor).collect();
        assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "stream {stream}");
        let (replayed_stream, events) = replay_all(&*store, &ids[0].to_string()).await.unwrap();
        assert_eq!(replayed_stream, stream);
        assert_eq!(events.len(), 7);
    }
    // The victim's row and event are untouched.
    assert_eq!(count_rows(&h, "events").await, 1 + 7 * 8);
    store.close().await;
    h.teardown().await;
}

/// An append applies the byte limit at once (before any purge), exactly
/// where its bytes first cross it: the statement skips reading the oldest
/// event while the stream's lifetime bytes are within the limit, and must
/// stop skipping at the first byte over it, alone or batched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_apply_the_byte_limit_at_its_first_crossing() {
    /// One event of `len` bytes to each stream, all at once (so the busy
    /// streams' appends batch).
    async fn round(store: &PostgresStore, streams: &[String], len: usize) -> Vec<EventId> {
        let payload = vec![7u8; len];
        futures_util::future::try_join_all(
            streams
                .iter()
                .map(|s| store.store_event(s, NewEvent::new(&payload))),
        )
        .await
        .unwrap()
    }
    let h = PostgresHarness::new().await;
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(1_000)))
        .await;
    let busy: Vec<String> = (0..16).map(|i| format!("busy-{i}")).collect();
    let alone = vec!["alone".to_owned()];
    let mut ids: Vec<Vec<EventId>> = vec![Vec::new(); busy.len() + 1];
    let mut append = async |len: usize| {
        // The lone stream first, by itself: one statement per event.
        let mut appended = round(&store, &alone, len).await;
        appended.extend(round(&store, &busy, len).await);
        for (ids, id) in ids.iter_mut().zip(appended) {
            ids.push(id);
        }
    };
    for _ in 0..10 {
        append(100).await;
    }
    append(1).await;
    let streams = alone.iter().chain(&busy);
    for (stream, ids) in streams.zip(&ids) {
        let replay = store.replay_stream(stream).await.unwrap();
        let retained: Vec<EventId> = replay.events.map_ok(|e| e.id).try_collect().await.unwrap();
        assert_eq!(
            retained,
            ids[1..],
            "{stream}: one byte over the limit drops the oldest event at once, and only it"
        );
    }
    h.close(store).await;
    h.teardown().await;
}

/// Batched appends apply the count and byte limits exactly as single
/// appends do: streams written concurrently (batched) retain the same tail
/// as a stream written alone (one statement per event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_appends_retain_what_single_appends_retain() {
    const EVENTS: usize = 30;
    let payload = |i: usize| vec![b'x'; 40 + (i * 37) % 90];
    for retention in [
        Retention::unbounded().max_events_per_stream(5),
        Retention::unbounded().max_bytes_per_stream(300),
    ] {
        let h = PostgresHarness::new().await;
        let store = Arc::new(h.open(StoreOptions::default().retention(retention)).await);
        let mut reference = Vec::new();
        for i in 0..EVENTS {
            let id = store
                .store_event("alone", NewEvent::new(&payload(i)))
                .await
                .unwrap();
            reference.push(id);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for stream in 0..16 {
            let store = store.clone();
            tasks.spawn(async move {
                let mut ids = Vec::new();
                for i in 0..EVENTS {
                    let id = store
                        .store_event(&format!("busy-{stream}"), NewEvent::new(&payload(i)))
                        .await
                        .unwrap();
                    ids.push(id);
                }
                ids
            });
        }
        let retained = |ids: Vec<EventId>| {
            let store = store.clone();
            async move {
                let mut sizes = Vec::new();
                for id in ids {
                    match replay_all(&*store, &id.to_string()).await {
                        Ok((_, events)) => sizes.push(Some(events.len())),
                        Err(Error::EventsPurged { .. }) => sizes.push(None),
                        Err(e) => panic!("{e}"),
                    }
                }
                sizes
            }
        };
        let expected = retained(reference).await;
        assert!(expected.iter().any(Option::is_none), "the limit never bit");
        while let Some(ids) = tasks.join_next().await {
            assert_eq!(retained(ids.unwrap()).await, expected, "{retention:?}");
        }
        store.close().await;
        h.teardown().await;
    }
}

/// The replay page statement keeps PostgreSQL's cached generic plan (see
/// the `PAGE` statement in `src/sql.rs`). With statistics that show a long
/// stream, a replay near its end reads few rows, and a statement whose
/// values the planner could see was planned afresh on every call (each
/// custom plan looked cheaper than the generic one), at several times the
/// cost of executing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_page_statement_keeps_its_generic_plan() {
    const REPLAYS: i64 = 12;
    const LONG: u64 = 20_000;
    let h = PostgresHarness::new().await;
    // One connection, so every replay runs the one prepared statement that
    // pg_prepared_statements then describes.
    let store = h.open_with(h.options(unbounded()).max_connections(1)).await;
    let first = store.store_event("s", NewEvent::new(b"1")).await.unwrap();
    // The rest of a long stream, written directly (the store would take a
    // while), then the statistics autovacuum would gather.
    let mut conn = admin(&h).await;
    for statement in [
        "INSERT INTO {s}.events (token, seq, stored_at, cum_bytes, data) \
         SELECT token, g, last_stored_at, g - 1, '\\x01' \
           FROM {s}.streams, generate_series(2, $1) g",
        "UPDATE {s}.streams SET last_seq = $1, total_bytes = $1",
        "ANALYZE {s}.events, {s}.streams",
    ] {
        let statement = statement.replace("{s}", &format!("\"{}\"", h.schema()));
        let binds = statement.contains("$1");
        let query = sqlx::query(AssertSqlSafe(statement));
        let query = if binds {
            query.bind(LONG as i64)
        } else {
            query
        };
        query.execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    for i in 0..REPLAYS as u64 {
        let near_the_end = EventId::new(
            first.token,
            dense::position(first.position.major, LONG - 20 + i),
        );
        let (_, events) = replay_all(&store, &near_the_end.to_string()).await.unwrap();
        assert_eq!(events.len() as u64, 20 - i);
    }
    let (generic, custom): (i64, i64) = sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
          WHERE statement LIKE '%UNION ALL%' AND statement LIKE '%' || $1 || '%'",
    )
    .bind(h.schema())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(generic + custom, REPLAYS, "one page per replay");
    assert!(
        custom <= 5 && generic >= REPLAYS - 5,
        "the page statement was planned afresh: {custom} custom plans, {generic} generic"
    );
    h.close(store).await;
    h.teardown().await;
}

/// Adds `params` to a URL that may already have a query.
fn with_params(url: &str, params: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

/// `connect` honours this crate's own URL parameters (`schema=`,
/// `vacuum=`), which sqlx would ignore, and still hands the driver the
/// rest (`application_name=` here); a parameter the URL gives wins over
/// the options, and an unknown or repeated one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_honours_the_url_parameters_of_this_crate() {
    let h = PostgresHarness::new().await;
    let app = format!("mcp-test-{}", h.schema());
    let url = with_params(
        h.url(),
        &format!("application_name={app}&schema={}&vacuum=auto", h.schema()),
    );
    let store = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(store.schema(), h.schema());
    assert_eq!(store.vacuum(), Vacuum::Auto);
    store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    // The event went to the schema the URL named.
    assert_eq!(count_rows(&h, "events").await, 1);
    let mut conn = admin(&h).await;
    let named: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    conn.close().await.unwrap();
    assert!(named >= 1, "the driver never saw application_name");
    store.close().await;

    // The URL overrides the options it names.
    let store = PostgresStore::connect_with(
        &with_params(h.url(), &format!("schema={}", h.schema())),
        PostgresOptions::default()
            .schema("not_this_one")
            .vacuum(Vacuum::Auto),
    )
    .await
    .unwrap();
    assert_eq!(store.schema(), h.schema());
    assert_eq!(store.vacuum(), Vacuum::Auto, "not named in the URL");
    store.close().await;

    // The URL's application_name wins over the options' too.
    let from_url = format!("{app}-url");
    let store = PostgresStore::connect_with(
        &with_params(
            h.url(),
            &format!("schema={}&application_name={from_url}", h.schema()),
        ),
        PostgresOptions::default().application_name(format!("{app}-options")),
    )
    .await
    .unwrap();
    store.store_event("s", NewEvent::new(b"y")).await.unwrap();
    let mut conn = admin(&h).await;
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE $1",
    )
    .bind(format!("{app}-%"))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    assert_eq!(names, [from_url]);
    store.close().await;

    // Bad values, unknown and repeated parameters are refused before
    // anything connects (port 1: nothing listens there).
    for params in [
        "schema=Bad",
        "vacuum=sometimes",
        "schema=a&schema=b",
        "sslmod=disable",
        "sslmode=disable&sslmode=disable",
    ] {
        let err = PostgresStore::connect(&with_params(
            "postgres://postgres@127.0.0.1:1/postgres",
            params,
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{params}: {err}");
    }
    h.teardown().await;
}

/// C2, C5: a replay paging through a stream that is deleted under it and
/// started again ends with `EventsPurged` at its next page, never with
/// events of the new life: both when the new life continues the emptied
/// row (an append that came between `delete_stream` marking the row empty
/// and removing it; simulated here by marking it as that step does) and
/// when it starts a new incarnation (the row was removed first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_never_pages_into_a_new_life_of_its_stream() {
    let h = PostgresHarness::new().await;
    let store = h.open(unbounded().page_size(2)).await;
    for row_removed in [false, true] {
        let stream = format!("s-{row_removed}");
        let mut old = Vec::new();
        for i in 0..10u8 {
            old.push(
                store
                    .store_event(&stream, NewEvent::new(&[i]))
                    .await
                    .unwrap(),
            );
        }
        let mut replay = store
            .replay_events_after(&old[0].to_string())
            .await
            .unwrap()
            .events;
        // The first page (two events) is read.
        for expected in &old[1..3] {
            assert_eq!(replay.next().await.unwrap().unwrap().id, *expected);
        }
        if row_removed {
            assert_eq!(store.delete_stream(&stream).await.unwrap(), 10);
        } else {
            let mut conn = admin(&h).await;
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE \"{}\".streams SET first_seq = last_seq + 1 WHERE stream_id = $1",
                h.schema()
            )))
            .bind(stream.as_bytes())
            .execute(&mut conn)
            .await
            .unwrap();
            conn.close().await.unwrap();
        }
        let mut new = Vec::new();
        for i in 0..10u8 {
            new.push(
                store
                    .store_event(&stream, NewEvent::new(&[100 + i]))
                    .await
                    .unwrap(),
            );
        }
        assert!(new[0].position > old[9].position);
        assert_eq!(
            new[0].position.major != old[0].position.major,
            row_removed,
            "a new incarnation exactly when the row was removed first"
        );
        match replay.next().await {
            Some(Err(Error::EventsPurged { .. })) => {}
            Some(Ok(event)) => panic!(
                "the replay after {} went on into the new life with {} ({:?})",
                old[0], event.id, event.data
            ),
            other => panic!("expected EventsPurged, got {other:?}"),
        }
        assert!(
            replay.next().await.is_none(),
            "the replay ends at its error"
        );
    }
    h.close(store).await;
    h.teardown().await;
}

/// C12, C2: a schema written at format 1, whose streams have random
/// incarnations (zero and negative ones included), migrates to format 2:
/// every stream gets a positive incarnation below all drawn later, appends
/// continue each stream's sequence, ids of format 1 are refused as unknown,
/// and a stream started again afterwards gets a new incarnation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_1_schema_migrates_to_incarnations_from_a_sequence() {
    let h = PostgresHarness::new().await;
    let key = StreamKey::from_bytes(&[9u8; 32]).unwrap();
    let mut conn = admin(&h).await;
    let schema = format!("\"{}\"", h.schema());
    for statement in [
        format!("CREATE SCHEMA {schema}"),
        format!("SET search_path TO {schema}"),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let migrations = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"));
    let format_1 = sqlx::migrate::Migrator::new(migrations).await.unwrap();
    format_1.run_to(1, &mut conn).await.unwrap();
    sqlx::query("INSERT INTO meta (key, value) VALUES ('stream_key', $1)")
        .bind(&key.as_bytes()[..])
        .execute(&mut conn)
        .await
        .unwrap();
    // Three events each, as format 1 stored them.
    let streams = [("a", -5_i64), ("b", 0), ("c", i64::MAX)];
    for (stream, incarnation) in streams {
        let token = key.token(stream);
        sqlx::query(
            "INSERT INTO streams (token, stream_id, incarnation, first_seq, last_seq, \
             clean_seq, total_bytes, last_stored_at) VALUES ($1, $2, $3, 1, 3, 1, 3, 0)",
        )
        .bind(&token.as_bytes()[..])
        .bind(stream.as_bytes())
        .bind(incarnation)
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO events (token, seq, stored_at, cum_bytes, data) \
             SELECT $1, g, 0, g - 1, '\\x01' FROM generate_series(1, 3) g",
        )
        .bind(&token.as_bytes()[..])
        .execute(&mut conn)
        .await
        .unwrap();
    }
    conn.close().await.unwrap();

    let store = h.open(unbounded()).await;
    let mut incarnations = Vec::new();
    for (stream, _) in streams {
        let token = key.token(stream);
        // A format-1 id: no incarnation.
        let old = EventId::new(token, Position::seq(1)).to_string();
        assert!(matches!(
            replay_all(&store, &old).await,
            Err(Error::UnknownEventId { .. })
        ));
        assert_eq!(store.get_stream_id_for_event_id(&old).await.unwrap(), None);
        let next = store
            .store_event(stream, NewEvent::new(b"4"))
            .await
            .unwrap();
        assert_eq!(next.token, token, "the stream key was kept");
        assert_eq!(next.position.minor, 4, "{stream} continues its sequence");
        let incarnation = next.position.major;
        assert!((1..=3).contains(&incarnation), "{stream}: {incarnation}");
        incarnations.push(incarnation);
        let first = EventId::new(token, dense::position(incarnation, 1));
        let (replayed, events) = replay_all(&store, &first.to_string()).await.unwrap();
        assert_eq!(replayed, stream);
        assert_eq!(events.len(), 3);
    }
    incarnations.sort_unstable();
    incarnations.dedup();
    assert_eq!(incarnations.len(), 3, "distinct incarnations");
    assert_eq!(store.delete_stream("a").await.unwrap(), 4);
    let again = store.store_event("a", NewEvent::new(b"new")).await.unwrap();
    // Above every incarnation the migration gave (the sequence also moved
    // on with each append since).
    assert!(
        again.position.major > 3 && again.position.minor == 1,
        "{again}"
    );
    h.close(store).await;
    h.teardown().await;
}
