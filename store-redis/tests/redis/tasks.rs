//! Redis-specific task checks: what 1,000 idle watches cost in connections
//! (on a server this binary starts, so its client list holds only this
//! test's connections) and that `PUBLISH` wakes them all, also after the
//! subscriber's connection was killed; that tasks leave
//! an older release's keys alone; a purge of more than one `SCAN` batch;
//! a task value of a newer format or garbled, refused clearly; and a task's
//! context kept in a field of its own, which a release from before
//! contexts reads past and leaves alone.

use std::time::Duration;

use mcp_event_store_conformance::events::{test_clock, test_options};
use mcp_event_store_core::backend::task::TaskDigest;
use mcp_event_store_core::task::{
    Applied, DEFAULT_GRACE, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskId, TaskStatus,
    TaskStore, WorkerChange,
};
use mcp_event_store_core::{Error, EventStore, NewEvent, SessionStore};
use mcp_event_store_redis::testing::{RedisHarness, random_prefix};
use mcp_event_store_redis::{RedisOptions, RedisStore};

const NO_RECHECK: Duration = Duration::from_secs(3600);
/// "Must arrive eventually" guard; never a latency threshold. Far below
/// the watches' `max_wait` and rechecks, so a watch that returns within it
/// was woken by the change.
const EVENTUALLY: Duration = Duration::from_secs(30);

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

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn clients(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines().map(str::to_owned).collect()
}

/// Every key under `prefix` with its `DUMP`, sorted.
async fn snapshot(
    conn: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> Vec<(String, Vec<u8>)> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(conn)
        .await
        .unwrap();
    let mut dumped = Vec::new();
    for key in keys {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(conn)
            .await
            .unwrap();
        dumped.push((key, dump));
    }
    dumped.sort();
    dumped
}

/// With rechecks an hour apart, a change through handle B reaches 1,000
/// watches on handle A only through `PUBLISH` and A's one subscriber; while
/// they wait, they hold no connection of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_watches_add_no_connections_and_one_publish_wakes_them() {
    const WATCHES: usize = 1_000;
    let server = tokio::task::spawn_blocking(start_server).await.unwrap();
    let url = server.process.url();
    let prefix = random_prefix();
    let open = || {
        RedisStore::connect_with(
            &url,
            RedisOptions::default()
                .key_prefix(prefix.clone())
                .follow_recheck(NO_RECHECK),
        )
    };
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let mut admin = raw(&url).await;
    let me = InstanceId::generate().unwrap();
    assert!(b.heartbeat(me, Duration::from_secs(600)).await.unwrap());
    let owner = Owner::Anonymous;
    let (id, created) = b.create(NewTask::new(&owner, me)).await.unwrap();
    let text = id.to_string();

    // The first watch starts A's subscriber: one connection per handle.
    let before = clients(&mut admin).await.len();
    let first = {
        let (a, text) = (a.clone(), text.clone());
        tokio::spawn(async move { a.watch(&text, &owner, created.rev, NO_RECHECK).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let with_one = clients(&mut admin).await;
    assert_eq!(
        with_one.len(),
        before + 1,
        "the first watch: the handle's subscriber only"
    );
    assert_eq!(
        with_one.iter().filter(|c| c.contains(" sub=1 ")).count(),
        1,
        "{with_one:?}"
    );
    let mut watches: Vec<_> = (1..WATCHES)
        .map(|_| {
            let (a, text) = (a.clone(), text.clone());
            tokio::spawn(async move { a.watch(&text, &owner, created.rev, NO_RECHECK).await })
        })
        .collect();
    watches.push(first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        clients(&mut admin).await.len(),
        before + 1,
        "{WATCHES} idle watches added connections"
    );
    assert!(watches.iter().all(|w| !w.is_finished()));

    let applied = b
        .apply(&id, me, WorkerChange::SetMessage(Some("half way")))
        .await
        .unwrap();
    let Applied::Changed { rev, .. } = applied else {
        panic!("{applied:?}");
    };
    for watch in watches {
        let seen = tokio::time::timeout(EVENTUALLY, watch)
            .await
            .expect("a watch was not woken: the publish was lost")
            .unwrap()
            .unwrap()
            .expect("the task");
        assert_eq!(seen.rev, rev);
        assert_eq!(seen.message.as_deref(), Some("half way"));
    }

    a.close().await;
    b.close().await;
    drop((a, b));
    let mut gone = false;
    for _ in 0..100 {
        if clients(&mut admin).await.len() == 1 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "closing the handles left connections");
}

/// Tasks add keys of their own family (`<prefix>:t1:...`): the event keys,
/// sessions, marker and secret an older release reads are byte for byte
/// what they were, and its event views see no tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_leave_an_older_releases_keys_alone() {
    let harness = RedisHarness::new().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    let id = store.store_event("s1", NewEvent::new(b"{}")).await.unwrap();
    store
        .put_session("session-1", b"state", Duration::from_secs(3600))
        .await
        .unwrap();
    let mut admin = raw(harness.url()).await;
    let older = format!("{}:[fv]*", harness.prefix());
    let before = snapshot(&mut admin, &older).await;
    assert!(before.len() >= 5, "{before:?}");
    let stats = store.stats().await.unwrap();

    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, Duration::from_secs(30)).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    for _ in 0..3 {
        let (task, text) = {
            let (task, _) = store
                .create(NewTask::new(&owner, me).ttl(Duration::from_secs(60)))
                .await
                .unwrap();
            (task, task.to_string())
        };
        store
            .apply(
                &task,
                me,
                WorkerChange::RequestInput {
                    key: "k",
                    request: b"{}",
                },
            )
            .await
            .unwrap();
        store.answer(&text, &owner, &[("k", b"1")]).await.unwrap();
    }
    // Events' purge leaves tasks alone, and tasks' purge leaves events.
    store.purge_expired().await.unwrap();
    clock.advance(Duration::from_secs(60) + DEFAULT_GRACE);
    let report = store.purge_expired_tasks().await.unwrap();
    assert_eq!((report.deleted, report.instances), (3, 1));

    assert_eq!(snapshot(&mut admin, &older).await, before);
    assert_eq!(store.stats().await.unwrap(), stats);
    let replay = store.replay_events_after(&id.to_string()).await.unwrap();
    assert_eq!(replay.stream_id, "s1");
    store.close().await;
    mcp_event_store_conformance::events::Harness::teardown(harness).await;
}

/// A task stored by a newer release (another value version) is refused
/// with `IncompatibleFormat`, and a garbled one with `Corrupt`, never a
/// panic or a wrong task; the worker's calls are refused the same way and
/// change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_or_garbled_task_values_are_refused() {
    let harness = RedisHarness::new().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, Duration::from_secs(30)).await.unwrap());
    let owner = Owner::Anonymous;
    let (task, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    let text = task.to_string();
    let key = format!(
        "{}:t1:{{{}}}:task",
        harness.prefix(),
        TaskDigest::of(&text)
            .unwrap()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let mut admin = raw(harness.url()).await;
    let value: Vec<u8> = redis::cmd("HGET")
        .arg(&key)
        .arg("v")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(value[0], 1, "task format 1");

    let newest = mcp_event_store_core::backend::task::codec::VALUE_VERSION;
    let mut newer = value.clone();
    newer[0] = newest + 1;
    let mut garbled = value.clone();
    garbled.truncate(value.len() / 2);
    for (bytes, newer_format) in [(newer, true), (garbled, false)] {
        let () = redis::cmd("HSET")
            .arg(&key)
            .arg("v")
            .arg(&bytes)
            .query_async(&mut admin)
            .await
            .unwrap();
        let refused = |e: Error| match e {
            Error::IncompatibleFormat(message) if newer_format => {
                assert!(
                    message.contains(&format!("task format {}", newest + 1)),
                    "{message}"
                );
            }
            Error::Corrupt(_) if !newer_format => {}
            other => panic!("{other:?}"),
        };
        refused(store.get(&text, &owner).await.unwrap_err());
        refused(
            store
                .apply(&task, me, WorkerChange::Finish(Finish::Cancelled))
                .await
                .unwrap_err(),
        );
        let stored: Vec<u8> = redis::cmd("HGET")
            .arg(&key)
            .arg("v")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(stored, bytes, "a refused step changed the value");
    }
    // Another task is untouched by the bad one.
    let (other, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    assert_eq!(
        store
            .get(&other.to_string(), &owner)
            .await
            .unwrap()
            .map(|t| t.status),
        Some(TaskStatus::Working)
    );
    let unknown = TaskId::generate().unwrap();
    assert_eq!(
        store
            .apply(&unknown, me, WorkerChange::SetMessage(None))
            .await
            .unwrap(),
        Applied::Unknown
    );
    store.close().await;
    mcp_event_store_conformance::events::Harness::teardown(harness).await;
}

/// A task's context (T13) is the hash field `c`, beside the value `v`
/// (core's encoding, the released task format 1, without the context) and
/// `rev`: a release from before contexts decodes `v` as always, and its
/// write (`HSET v … rev …`) leaves the context as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_is_a_field_a_release_without_contexts_leaves_alone() {
    let harness = RedisHarness::new().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, Duration::from_secs(30)).await.unwrap());
    let owner = Owner::Anonymous;
    let (task, _) = store
        .create(NewTask::new(&owner, me).context(b"ctx\0"))
        .await
        .unwrap();
    let text = task.to_string();
    let key = format!(
        "{}:t1:{{{}}}:task",
        harness.prefix(),
        TaskDigest::of(&text)
            .unwrap()
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let mut admin = raw(harness.url()).await;
    let (value, context, rev): (Vec<u8>, Vec<u8>, u64) = redis::cmd("HMGET")
        .arg(&key)
        .arg(&["v", "c", "rev"])
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(context, b"ctx\0");
    let decoded = mcp_event_store_core::backend::task::codec::decode(&value).unwrap();
    assert_eq!(decoded.record.context, None, "v holds no context");
    // The released script's write: only `v` and `rev`.
    let mut ended = decoded.clone();
    ended.record.status = TaskStatus::Failed;
    ended.record.rev += 1;
    let () = redis::cmd("HSET")
        .arg(&key)
        .arg("v")
        .arg(mcp_event_store_core::backend::task::codec::encode(&ended))
        .arg("rev")
        .arg(rev + 1)
        .query_async(&mut admin)
        .await
        .unwrap();
    let seen = store.get(&text, &owner).await.unwrap().expect("the task");
    assert_eq!(seen.status, TaskStatus::Failed);
    assert_eq!(seen.context.as_deref(), Some(&b"ctx\0"[..]));
    // A change of this release writes `c` only when the context changed.
    let applied = store
        .apply(&task, me, WorkerChange::SetContext(b"second"))
        .await
        .unwrap();
    assert_eq!(applied, Applied::AlreadyTerminal(TaskStatus::Failed));
    let (other, _) = store
        .create(NewTask::new(&owner, me).context(b"first"))
        .await
        .unwrap();
    store
        .apply(&other, me, WorkerChange::SetContext(b"second"))
        .await
        .unwrap();
    let seen = store
        .get(&other.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.context.as_deref(), Some(&b"second"[..]));
    store.close().await;
    mcp_event_store_conformance::events::Harness::teardown(harness).await;
}

/// When the subscriber's connection is killed, it connects and subscribes
/// again by itself, and a change made afterwards still wakes a watch that
/// was waiting all along (rechecks an hour apart, so only a message can).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_its_subscriber_being_killed() {
    let server = tokio::task::spawn_blocking(start_server).await.unwrap();
    let url = server.process.url();
    let prefix = random_prefix();
    let open = || {
        RedisStore::connect_with(
            &url,
            RedisOptions::default()
                .key_prefix(prefix.clone())
                .follow_recheck(NO_RECHECK),
        )
    };
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let mut admin = raw(&url).await;
    let me = InstanceId::generate().unwrap();
    assert!(b.heartbeat(me, Duration::from_secs(600)).await.unwrap());
    let owner = Owner::Anonymous;
    let (id, created) = b.create(NewTask::new(&owner, me)).await.unwrap();
    let watch = {
        let (a, text) = (a.clone(), id.to_string());
        tokio::spawn(async move { a.watch(&text, &owner, created.rev, NO_RECHECK).await })
    };
    let subscribers = |list: &[String]| list.iter().filter(|c| c.contains(" sub=1 ")).count();
    let deadline = tokio::time::Instant::now() + EVENTUALLY;
    while subscribers(&clients(&mut admin).await) != 1 {
        assert!(tokio::time::Instant::now() < deadline, "no subscriber");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // Subscribed again: a new connection in the subscribe state.
    let deadline = tokio::time::Instant::now() + EVENTUALLY;
    while subscribers(&clients(&mut admin).await) != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not subscribed again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!watch.is_finished(), "the watch ended without a change");
    let applied = b
        .apply(&id, me, WorkerChange::SetMessage(Some("after the kill")))
        .await
        .unwrap();
    let Applied::Changed { rev, .. } = applied else {
        panic!("{applied:?}");
    };
    let seen = tokio::time::timeout(EVENTUALLY, watch)
        .await
        .expect("the watch was not woken after the subscriber came back")
        .unwrap()
        .unwrap()
        .expect("the task");
    assert_eq!(seen.rev, rev);
    a.close().await;
    b.close().await;
}
