//! PostgreSQL-specific task behaviour beyond the shared task suite
//! (`task_suite.rs`, whose `persistent` cases reopen the schema, SIGKILL a
//! writer and refuse a newer task migration): the task tables are
//! additive, so a release that knows only the event migrations keeps
//! serving events from a schema that holds tasks; a release of task format
//! 1 keeps serving events and tasks from a schema whose tasks have
//! contexts, and what it writes leaves a context as it is; a newer task
//! migration is refused by a handle that may not migrate too, and a newer
//! task context format is refused and changes nothing; a change through one
//! handle wakes a watch on another through `NOTIFY`, and 1,000 idle watches
//! hold no connections; a burst of task calls on one handle (creates,
//! steps and reads, which then batch) each get their own answer.

use std::borrow::Cow;
use std::time::Duration;

use mcp_event_store_conformance::events::Harness;
use mcp_event_store_conformance::tasks::PersistentTaskHarness;
use mcp_event_store_core::task::{
    Applied, InstanceId, NewTask, Owner, RuntimeStore, TaskStatus, TaskStore, WorkerChange,
};
use mcp_event_store_core::{Error, EventStore, NewEvent, StoreOptions};
use mcp_event_store_postgres::testing::PostgresHarness;
use mcp_event_store_postgres::{FORMAT_VERSION, PostgresStore};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};

/// A connection of its own with `search_path` on the harness's schema, as
/// a release's migration check runs.
async fn raw(harness: &PostgresHarness) -> PgConnection {
    let mut conn = PgConnection::connect(harness.url()).await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SET search_path TO \"{}\"",
        harness.schema()
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

async fn open(harness: &PostgresHarness) -> PostgresStore {
    harness
        .open_with(harness.options(StoreOptions::default()))
        .await
}

/// A schema with an event and a task waiting for input, written by this
/// release.
async fn schema_with_a_task(harness: &PostgresHarness) -> (String, Owner, InstanceId) {
    let store = open(harness).await;
    store.store_event("s", NewEvent::new(b"e")).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let (id, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    let applied = store
        .apply(
            &id,
            me,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{\"q\":1}",
            },
        )
        .await
        .unwrap();
    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
    store.close().await;
    (id.to_string(), owner, me)
}

/// What a release of event format 2 that knows no tasks does on open (its
/// embedded migrations 1 and 2 checked against `_sqlx_migrations`, which
/// refuses any row it does not know) succeeds on a schema holding tasks:
/// the task migration is recorded in `_mes_task_migrations`.
#[tokio::test]
async fn a_release_without_tasks_still_opens_a_schema_with_tasks() {
    let harness = PostgresHarness::new().await;
    schema_with_a_task(&harness).await;

    let mut older = sqlx::migrate!("./migrations");
    older.migrations = Cow::Owned(
        older
            .iter()
            .filter(|migration| migration.version <= 2)
            .cloned()
            .collect(),
    );
    assert_eq!(older.iter().count(), 2, "format 2's event migrations");
    assert_eq!(
        FORMAT_VERSION, 2,
        "the task tables leave the event format alone"
    );
    let mut conn = raw(&harness).await;
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(versions, [1, 2], "no task row among the event migrations");
    older
        .run_direct(None, &mut conn, false)
        .await
        .expect("a format 2 release's migration check passes");
    let task_versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _mes_task_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(task_versions, [1]);
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(tasks, 1);
    conn.close().await.unwrap();

    // Events are served as before.
    let store = open(&harness).await;
    assert_eq!(store.stats().await.unwrap().events, 1);
    store.close().await;
    Harness::teardown(harness).await;
}

/// A handle that may not migrate (`run_migrations(false)`) refuses a newer
/// release's task migration too, naming it, and a handle of this release
/// that may not migrate serves the tasks once it is gone. (The shared
/// `persistent` case checks a handle that migrates.)
#[tokio::test]
async fn a_newer_task_migration_is_refused_without_migrating_too() {
    let harness = PostgresHarness::new().await;
    let (id, owner, _) = schema_with_a_task(&harness).await;
    let current = harness.task_format_version();
    let newer = current + 1;
    harness.set_task_format_version(newer).await;
    let err = PostgresStore::connect_with(
        harness.url(),
        harness
            .options(StoreOptions::default())
            .run_migrations(false),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::IncompatibleFormat(m)
            if m.contains(&format!("task migration {newer}"))),
        "{err}"
    );
    harness.set_task_format_version(current).await;
    let store = harness
        .open_with(
            harness
                .options(StoreOptions::default())
                .run_migrations(false),
        )
        .await;
    let task = store.get(&id, &owner).await.unwrap().expect("the task");
    assert_eq!(task.status, TaskStatus::InputRequired);
    store.close().await;
    Harness::teardown(harness).await;
}

/// What a release of task format 1 does (its task migration check against
/// `_mes_task_migrations`, and its statements, which name their columns)
/// succeeds on a schema whose tasks carry contexts, and leaves them as they
/// are: the context column's migration is recorded in a table of its own.
#[tokio::test]
async fn a_release_without_contexts_still_serves_tasks_with_contexts() {
    let harness = PostgresHarness::new().await;
    let store = open(&harness).await;
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let (id, _) = store
        .create(NewTask::new(&owner, me).context(b"{\"tool\":\"t\"}"))
        .await
        .unwrap();
    store.close().await;

    let mut format_1 = sqlx::migrate!("./migrations/tasks");
    format_1.migrations = Cow::Owned(
        format_1
            .iter()
            .filter(|migration| migration.version <= 1)
            .cloned()
            .collect(),
    );
    format_1.dangerous_set_table_name("_mes_task_migrations");
    let mut conn = raw(&harness).await;
    format_1
        .run_direct(None, &mut conn, false)
        .await
        .expect("task format 1's migration check passes");
    let contexts: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _mes_task_context_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(contexts, [1]);
    // Task format 1's write-back of a task names its columns (this is its
    // statement, less the notification).
    let written = sqlx::query(
        "UPDATE tasks SET status = 3, rev = rev + 1, message = NULL, updated_at = updated_at, \
         ttl_ms = ttl_ms, expires_at = expires_at, purge_at = purge_at, poll_ms = poll_ms, \
         cancel = cancel, outcome = '\\x7b7d', instance = instance, next_seq = next_seq \
         WHERE digest = $1",
    )
    .bind(&id.digest().as_bytes()[..])
    .execute(&mut conn)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(written, 1);
    conn.close().await.unwrap();
    let store = open(&harness).await;
    let task = store
        .get(&id.to_string(), &owner)
        .await
        .unwrap()
        .expect("the task");
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.context.as_deref(), Some(&b"{\"tool\":\"t\"}"[..]));
    store.close().await;
    Harness::teardown(harness).await;
}

/// A task context migration of a newer release is refused, naming it, by
/// a handle that migrates and by one that may not, and changes nothing.
#[tokio::test]
async fn a_newer_task_context_format_is_refused_and_changes_nothing() {
    let harness = PostgresHarness::new().await;
    let (id, owner, _) = schema_with_a_task(&harness).await;
    let newest: i64 = sqlx::migrate!("./migrations/task_context")
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    let mut conn = raw(&harness).await;
    sqlx::query(
        "INSERT INTO _mes_task_context_migrations (version, description, success, checksum, \
         execution_time) VALUES ($1, 'a newer release (test)', TRUE, '\\x00', 0)",
    )
    .bind(newest + 1)
    .execute(&mut conn)
    .await
    .unwrap();
    for run_migrations in [true, false] {
        let err = PostgresStore::connect_with(
            harness.url(),
            harness
                .options(StoreOptions::default())
                .run_migrations(run_migrations),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, Error::IncompatibleFormat(m)
                if m.contains(&format!("task context migration {}", newest + 1))),
            "{err}"
        );
    }
    sqlx::query("DELETE FROM _mes_task_context_migrations WHERE version = $1")
        .bind(newest + 1)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let store = open(&harness).await;
    let task = store.get(&id, &owner).await.unwrap().expect("the task");
    assert_eq!(task.status, TaskStatus::InputRequired);
    store.close().await;
    Harness::teardown(harness).await;
}

/// Connections on the server with this `application_name`.
async fn connections(harness: &PostgresHarness, name: &str) -> i64 {
    let mut conn = PgConnection::connect(harness.url()).await.unwrap();
    let n = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    n
}

/// Far longer than the test: a watch that returns before it was woken by
/// the change, not by its `max_wait` or a recheck.
const NO_RECHECK: Duration = Duration::from_secs(3600);
/// "Must arrive eventually" guard; never a latency threshold. Far below
/// the watches' `max_wait` and rechecks, so a watch that returns within it
/// was woken by `NOTIFY`.
const EVENTUALLY: Duration = Duration::from_secs(30);

/// With rechecks and `max_wait` an hour away, a change through handle B
/// reaches 1,000 watches on handle A only through `NOTIFY` on A's one
/// listening connection: a lost notification leaves the watches waiting
/// for an hour, and the test fails at its 30 s guard. While they wait, A
/// holds at most its pool and that one listener (`pg_stat_activity`), and
/// the watches hold none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_a_thousand_watches_on_another_handle_which_hold_no_connections() {
    const WATCHES: usize = 1_000;
    let harness = PostgresHarness::new().await;
    let name = format!("mes_watch_{}", harness.schema());
    let a = harness
        .open_with(
            harness
                .options(StoreOptions::default())
                .application_name(name.clone())
                .max_connections(4)
                .follow_recheck(NO_RECHECK),
        )
        .await;
    let b = open(&harness).await;
    let me = InstanceId::generate().unwrap();
    b.heartbeat(me, Duration::from_secs(600)).await.unwrap();
    let owner = Owner::Anonymous;
    let (id, created) = b.create(NewTask::new(&owner, me)).await.unwrap();
    let text = id.to_string();

    let watches: Vec<_> = (0..WATCHES)
        .map(|_| {
            let (a, text, owner) = (a.clone(), text.clone(), owner);
            tokio::spawn(async move { a.watch(&text, &owner, created.rev, NO_RECHECK).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let held = connections(&harness, &name).await;
    assert!(
        (1..=5).contains(&held),
        "{WATCHES} idle watches: {held} connections (pool of 4 and one listener)"
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
            .expect("a watch was not woken: the notification was lost")
            .unwrap()
            .unwrap()
            .expect("the task");
        assert_eq!(seen.rev, rev);
        assert_eq!(seen.message.as_deref(), Some("half way"));
    }
    let held = connections(&harness, &name).await;
    assert!(
        (1..=5).contains(&held),
        "after the wake-up: {held} connections (pool of 4 and one listener)"
    );
    a.close().await;
    b.close().await;
    Harness::teardown(harness).await;
}

/// T11: a heartbeat never waits behind the calls that fill the pool. With
/// every pooled connection of a handle blocked on a task row another
/// session holds locked, and more changes queued for the pool behind them
/// (acquire timeout two minutes), the handle still renews its instance at
/// once on its own connection; the queued changes all go through once the
/// lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_never_waits_behind_a_full_pool() {
    let harness = PostgresHarness::new().await;
    let name = format!("mes_beat_{}", harness.schema());
    let store = harness
        .open_with(
            harness
                .options(StoreOptions::default())
                .application_name(name.clone())
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(120)),
        )
        .await;
    let me = InstanceId::generate().unwrap();
    let lease = Duration::from_secs(600);
    assert!(store.heartbeat(me, lease).await.unwrap());
    let (id, _) = store
        .create(NewTask::new(&Owner::Anonymous, me))
        .await
        .unwrap();

    let mut locker = raw(&harness).await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("SELECT 1 FROM tasks FOR UPDATE")
        .execute(&mut locker)
        .await
        .unwrap();
    let changes: Vec<_> = (0..10)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let message = format!("change {n}");
                store
                    .apply(&id, me, WorkerChange::SetMessage(Some(&message)))
                    .await
            })
        })
        .collect();
    // Both pooled connections are waiting on the row lock (the other eight
    // changes wait for one of them).
    tokio::time::timeout(EVENTUALLY, async {
        loop {
            let mut conn = PgConnection::connect(harness.url()).await.unwrap();
            let blocked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND wait_event_type = 'Lock'",
            )
            .bind(&name)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            conn.close().await.unwrap();
            if blocked == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the pool's two connections never blocked on the locked row");

    let renewed = tokio::time::timeout(EVENTUALLY, store.heartbeat(me, lease))
        .await
        .expect("the heartbeat waited for the full pool")
        .unwrap();
    assert!(renewed, "a live instance is renewed");

    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    for change in changes {
        let applied = change.await.unwrap().unwrap();
        assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
    }
    store.close().await;
    Harness::teardown(harness).await;
}

/// 300 task calls at once on one handle, each creating its task, finishing
/// it and reading it back: the calls queued behind others go in batches
/// (one insert for many creates, one transaction for many steps, one
/// statement for many reads), and each still gets its own task's answer.
#[tokio::test]
async fn a_burst_of_task_calls_on_one_handle_each_get_their_own_answer() {
    let harness = PostgresHarness::new().await;
    let store = open(&harness).await;
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let calls = (0..300).map(|i| {
        let (store, owner) = (&store, &owner);
        async move {
            let message = format!("task {i}");
            let (id, task) = store
                .create(NewTask::new(owner, me).message(&message))
                .await
                .unwrap();
            assert_eq!(task.status, TaskStatus::Working);
            assert_eq!(task.message.as_deref(), Some(&message[..]));
            let result = message.as_bytes();
            let applied = store
                .apply(
                    &id,
                    me,
                    WorkerChange::Finish(mcp_event_store_core::task::Finish::Completed(result)),
                )
                .await
                .unwrap();
            assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
            let task = store.get(&id.to_string(), owner).await.unwrap().unwrap();
            assert_eq!(task.status, TaskStatus::Completed);
            id
        }
    });
    let ids = futures_util::future::join_all(calls).await;
    assert_eq!(
        ids.iter().collect::<std::collections::HashSet<_>>().len(),
        300
    );
    store.close().await;
    Harness::teardown(harness).await;
}
