//! Redis-specific checks of values swapped in place (C22), beyond what the
//! shared cases can see: a swapped session or task keeps its key's TTL
//! (`PTTL`) and every other field; a worker stepping a task while its
//! values are swapped never writes back bytes a swap replaced (the swap
//! stamp `s`); and on a cluster, the listings find the sessions and tasks
//! of every master, each once, in digest order.

use std::collections::HashSet;
use std::time::Duration;

use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::rewrite::{RewriteStore, SessionValue, Swap, TaskField, TaskValues};
use mcp_event_store_core::task::{
    Applied, InstanceId, NewTask, Owner, RuntimeStore, TaskDigest, TaskStore, WorkerChange,
};
use mcp_event_store_core::{EventStore, SessionDigest, SessionStore};
use mcp_event_store_redis::RedisStore;
use mcp_event_store_redis::testing::RedisHarness;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn flipped(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().map(|b| b ^ 0x5a).collect()
}

fn rewriter(store: &RedisStore) -> &dyn RewriteStore {
    store.rewriter().expect("the Redis store rewrites")
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The one key matching `pattern` on the standalone server.
async fn only_key(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> String {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{pattern}: {keys:?}");
    keys.remove(0)
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn hget(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    field: &str,
) -> Option<Vec<u8>> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(conn)
        .await
        .unwrap()
}

/// Every page of a listing read `limit` at a time.
async fn all_sessions(rewriter: &dyn RewriteStore, limit: usize) -> Vec<SessionValue> {
    let (mut all, mut after) = (Vec::new(), None);
    loop {
        let page = rewriter
            .session_values(after.as_ref(), limit)
            .await
            .unwrap();
        all.extend(page.sessions);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

async fn all_tasks(rewriter: &dyn RewriteStore, limit: usize) -> Vec<TaskValues> {
    let (mut all, mut after) = (Vec::new(), None);
    loop {
        let page = rewriter.task_values(after.as_ref(), limit).await.unwrap();
        all.extend(page.tasks);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

fn value(task: &TaskValues, field: &TaskField) -> Vec<u8> {
    task.values
        .iter()
        .find(|v| v.field == *field)
        .unwrap_or_else(|| panic!("{field:?} not listed"))
        .bytes
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_keeps_the_keys_ttl_and_every_other_field() {
    let harness = RedisHarness::new().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    let mut conn = raw(harness.url()).await;
    let prefix = harness.prefix().to_owned();

    // A session: `d` swapped, `exp`, `id` and the key's TTL kept.
    store
        .put_session("session", b"sealed state", Duration::from_secs(600))
        .await
        .unwrap();
    let session = only_key(&mut conn, &format!("{prefix}:v1:*:session")).await;
    let ttl_before = pttl(&mut conn, &session).await;
    let exp_before = hget(&mut conn, &session, "exp").await;
    assert!(ttl_before > 590_000, "{ttl_before}");
    let digest = SessionDigest::of("session");
    assert_eq!(
        rewriter(&store)
            .swap_session(&digest, b"sealed state", &flipped(b"sealed state"))
            .await
            .unwrap(),
        Swap::Swapped
    );
    let ttl_after = pttl(&mut conn, &session).await;
    assert!(
        ttl_after <= ttl_before && ttl_after > ttl_before - 10_000,
        "the session's TTL moved: {ttl_before} then {ttl_after}"
    );
    assert_eq!(hget(&mut conn, &session, "exp").await, exp_before);
    assert_eq!(
        hget(&mut conn, &session, "d").await.as_deref(),
        Some(&flipped(b"sealed state")[..])
    );

    // A task: its context (`c`) and a request inside `v` swapped; `rev`
    // and the TTL kept, the swap stamp counting the swaps.
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let (task, _) = store
        .create(NewTask::new(&owner, me).context(b"{\"tool\":\"t\"}"))
        .await
        .unwrap();
    let applied = store
        .apply(
            &task,
            me,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{\"q\":1}",
            },
        )
        .await
        .unwrap();
    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
    let key = only_key(&mut conn, &format!("{prefix}:t1:*:task")).await;
    let ttl_before = pttl(&mut conn, &key).await;
    let rev_before = hget(&mut conn, &key, "rev").await;
    assert!(ttl_before > 0, "{ttl_before}");
    assert_eq!(hget(&mut conn, &key, "s").await, None);
    let rewriter = rewriter(&store);
    for (field, old) in [
        (TaskField::Context, &b"{\"tool\":\"t\"}"[..]),
        (TaskField::Request("k".into()), &b"{\"q\":1}"[..]),
    ] {
        assert_eq!(
            rewriter
                .swap_task(&task.digest(), &field, old, &flipped(old))
                .await
                .unwrap(),
            Swap::Swapped,
            "{field:?}"
        );
    }
    let ttl_after = pttl(&mut conn, &key).await;
    assert!(
        ttl_after <= ttl_before && ttl_after > ttl_before - 10_000,
        "the task's TTL moved: {ttl_before} then {ttl_after}"
    );
    assert_eq!(hget(&mut conn, &key, "rev").await, rev_before);
    assert_eq!(hget(&mut conn, &key, "s").await.as_deref(), Some(&b"2"[..]));
    assert_eq!(
        hget(&mut conn, &key, "c").await.as_deref(),
        Some(&flipped(b"{\"tool\":\"t\"}")[..])
    );

    store.close().await;
    Harness::teardown(harness).await;
}

/// A worker stepping a task (each step reads, then writes over the `rev`
/// read) while its checkpoint is swapped back and forth: no step writes
/// back the bytes a swap replaced, so every swap over the bytes the
/// previous one wrote finds them. Without the swap stamp a step that read
/// before a swap passes the `rev` check and undoes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_never_writes_back_what_a_swap_replaced() {
    let harness = RedisHarness::new().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let (task, _) = store
        .create(NewTask::new(&owner, me).takeover(3))
        .await
        .unwrap();
    let applied = store
        .apply(&task, me, WorkerChange::Checkpoint(b"{\"step\":1}"))
        .await
        .unwrap();
    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");

    let worker = async {
        for i in 0..300 {
            let message = format!("step {i}");
            let applied = store
                .apply(&task, me, WorkerChange::SetMessage(Some(&message)))
                .await
                .unwrap();
            assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
        }
    };
    let swapper = async {
        let rewriter = rewriter(&store);
        let mut current = b"{\"step\":1}".to_vec();
        for i in 0..300 {
            let new = flipped(&current);
            assert_eq!(
                rewriter
                    .swap_task(&task.digest(), &TaskField::Checkpoint, &current, &new)
                    .await
                    .unwrap(),
                Swap::Swapped,
                "swap {i}: a step wrote back the bytes an earlier swap replaced"
            );
            current = new;
        }
        current
    };
    let ((), last) = tokio::join!(worker, swapper);
    let listed = all_tasks(rewriter(&store), 10).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(value(&listed[0], &TaskField::Checkpoint), last);
    store.close().await;
    Harness::teardown(harness).await;
}

/// On a cluster the listings walk every master: sessions and tasks spread
/// over the three are each listed once, ascending, a small page at a
/// time, and swapped where they live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_listings_find_the_values_of_every_master() {
    let (url, node_urls) = tokio::task::spawn_blocking(crate::common::shared_cluster)
        .await
        .expect("cluster start-up");
    let harness = RedisHarness::with_url(url).await;
    let clock = test_clock();
    let store = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    assert!(store.is_cluster());

    let mut sessions = Vec::new();
    for n in 0..40 {
        let id = format!("session-{n}");
        store
            .put_session(&id, id.as_bytes(), Duration::from_secs(600))
            .await
            .unwrap();
        sessions.push(SessionDigest::of(&id));
    }
    sessions.sort();
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let mut tasks: Vec<TaskDigest> = Vec::new();
    for n in 0..20 {
        let context = format!("context {n}");
        let (task, _) = store
            .create(NewTask::new(&owner, me).context(context.as_bytes()))
            .await
            .unwrap();
        tasks.push(task.digest());
    }
    tasks.sort();

    // Both kinds of key on every master.
    for suffix in ["session", "task"] {
        let mut nodes = 0;
        for node in &node_urls {
            let keys: Vec<String> = crate::common::command(
                node,
                redis::cmd("KEYS").arg(format!("{}:*:{suffix}", harness.prefix())),
            )
            .expect("KEYS on one node");
            nodes += usize::from(!keys.is_empty());
        }
        assert_eq!(nodes, 3, "{suffix} keys did not spread over the masters");
    }

    let rewriter = rewriter(&store);
    let listed = all_sessions(rewriter, 7).await;
    let digests: Vec<SessionDigest> = listed.iter().map(|s| s.digest).collect();
    assert_eq!(digests, sessions, "each session once, ascending");
    let listed_tasks = all_tasks(rewriter, 3).await;
    let digests: Vec<TaskDigest> = listed_tasks.iter().map(|t| t.digest).collect();
    assert_eq!(digests, tasks, "each task once, ascending");
    assert_eq!(
        digests.iter().collect::<HashSet<_>>().len(),
        20,
        "a task listed twice"
    );

    for session in &listed {
        assert_eq!(
            rewriter
                .swap_session(&session.digest, &session.state, &flipped(&session.state))
                .await
                .unwrap(),
            Swap::Swapped
        );
    }
    for task in &listed_tasks {
        let old = value(task, &TaskField::Context);
        assert_eq!(
            rewriter
                .swap_task(&task.digest, &TaskField::Context, &old, &flipped(&old))
                .await
                .unwrap(),
            Swap::Swapped
        );
    }
    assert_eq!(
        store.get_session("session-3").await.unwrap().as_deref(),
        Some(&flipped(b"session-3")[..])
    );
    store.close().await;
    Harness::teardown(harness).await;
}
