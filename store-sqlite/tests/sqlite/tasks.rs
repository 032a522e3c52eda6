//! SQLite-specific task behaviour beyond the shared task suite
//! (`task_suite.rs`, whose `persistent` cases reopen the file, SIGKILL a
//! writer and refuse a newer task migration): the task tables are additive,
//! so a release that knows only the event migrations keeps serving events
//! from a file that holds tasks; a release of task format 1 keeps serving
//! events and tasks from a file whose tasks have contexts, and what it
//! writes leaves a context as it is; a newer task context format is refused
//! and changes nothing; a closed handle refuses task calls; task watches
//! share the handle's one watcher, which stops when the last watch goes.

use std::borrow::Cow;
use std::time::Duration;

use mcp_event_store_core::task::{
    Applied, InstanceId, NewTask, Owner, RuntimeStore, TaskStatus, TaskStore, WorkerChange,
};
use mcp_event_store_core::{Error, EventStore, NewEvent};
use mcp_event_store_sqlite::{FORMAT_VERSION, SqliteOptions, SqliteStore};
use sqlx::{Connection, SqliteConnection};

async fn raw(path: &std::path::Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// A file with events and a task, written by this release.
async fn file_with_a_task(path: &std::path::Path) -> (String, Owner) {
    let store = SqliteStore::open(path).await.unwrap();
    store.store_event("s", NewEvent::new(b"e")).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(30)).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let (id, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    let applied = store
        .apply(
            &id,
            me,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{}",
            },
        )
        .await
        .unwrap();
    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
    store.close().await;
    (id.to_string(), owner)
}

/// What a release of event format 2 that knows no tasks does on open (its
/// embedded migrations 1 and 2 checked against `mes_migrations`, then the
/// format record) succeeds on a file holding tasks: the task migration is
/// recorded elsewhere, and the format record is unchanged.
#[tokio::test]
async fn a_release_without_tasks_still_opens_a_file_with_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    file_with_a_task(&path).await;

    let mut older = sqlx::migrate!("./migrations");
    older.migrations = Cow::Owned(
        older
            .iter()
            .filter(|migration| migration.version <= 2)
            .cloned()
            .collect(),
    );
    assert_eq!(older.iter().count(), 2, "format 2's event migrations");
    older.dangerous_set_table_name("mes_migrations");
    let mut conn = raw(&path).await;
    older
        .run_direct(None, &mut conn, false)
        .await
        .expect("a format 2 release's migration check passes");
    let format: i64 = sqlx::query_scalar(
        "SELECT CAST(value AS INTEGER) FROM mes_meta WHERE key = 'format_version'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(format, 2);
    assert_eq!(
        FORMAT_VERSION, 2,
        "the task tables leave the event format alone"
    );
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM mes_tasks")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(tasks, 1);
    conn.close().await.unwrap();
}

/// What a release of task format 1 does (its task migration check against
/// `mes_task_migrations`, and its statements, which name their columns)
/// succeeds on a file whose tasks carry contexts and leaves them as they
/// are: the context column's migration is recorded in a table of its own.
#[tokio::test]
async fn a_release_without_contexts_still_serves_tasks_with_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(30)).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let (id, _) = store
        .create(NewTask::new(&owner, me).context(b"{\"tool\":\"t\"}"))
        .await
        .unwrap();
    store.close().await;

    let mut format_1 = sqlx::migrate!("./migrations/tasks");
    format_1.dangerous_set_table_name("mes_task_migrations");
    let mut conn = raw(&path).await;
    format_1
        .run_direct(None, &mut conn, false)
        .await
        .expect("task format 1's migration check passes");
    let contexts: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM mes_task_context_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(contexts, [1]);
    // Task format 1's write-back of a task names its columns.
    let written = sqlx::query(
        "UPDATE mes_tasks SET status = 3, rev = rev + 1, message = NULL, \
                updated_at = updated_at, ttl_ms = ttl_ms, expires_at = expires_at, \
                purge_at = purge_at, poll_ms = poll_ms, cancel = cancel, outcome = X'7b7d', \
                instance = instance, next_seq = next_seq \
         WHERE digest = ?1",
    )
    .bind(&id.digest().as_bytes()[..])
    .execute(&mut conn)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(written, 1);
    conn.close().await.unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    let task = store
        .get(&id.to_string(), &owner)
        .await
        .unwrap()
        .expect("the task");
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.context.as_deref(), Some(&b"{\"tool\":\"t\"}"[..]));
    store.close().await;
}

/// A task context migration of a newer release is refused, naming it, and
/// the refusal changes nothing.
#[tokio::test]
async fn a_newer_task_context_format_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let (id, owner) = file_with_a_task(&path).await;
    let newest: i64 = sqlx::migrate!("./migrations/task_context")
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    let mut conn = raw(&path).await;
    sqlx::query(
        "INSERT INTO mes_task_context_migrations \
             (version, description, success, checksum, execution_time) \
         VALUES (?1, 'a newer release (test)', TRUE, X'00', 0)",
    )
    .bind(newest + 1)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(&err, Error::IncompatibleFormat(m)
            if m.contains(&format!("task context version {}", newest + 1))),
        "{err}"
    );
    let mut conn = raw(&path).await;
    sqlx::query("DELETE FROM mes_task_context_migrations WHERE version = ?1")
        .bind(newest + 1)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    let task = store.get(&id, &owner).await.unwrap().expect("the task");
    assert_eq!(task.status, TaskStatus::InputRequired);
    store.close().await;
}

fn closed<T>(result: Result<T, Error>) -> bool {
    matches!(result, Err(Error::Closed))
}

#[tokio::test]
async fn a_closed_store_refuses_task_calls() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("e.db")).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let (id, _) = store
        .create(NewTask::new(&Owner::Anonymous, me))
        .await
        .unwrap();
    let text = id.to_string();
    store.close().await;
    assert!(closed(store.get(&text, &Owner::Anonymous).await));
    assert!(closed(
        store
            .watch(&text, &Owner::Anonymous, 0, Duration::from_secs(5))
            .await
    ));
    assert!(closed(
        store
            .apply(&id, me, WorkerChange::SetMessage(Some("x")))
            .await
    ));
    assert!(closed(store.heartbeat(me, Duration::from_secs(1)).await));
    assert!(closed(store.purge_expired_tasks().await));
}

/// A task watch starts the handle's watcher (which finds other handles'
/// commits), another handle's change wakes it (the watching handle's
/// re-check and the watch's `max_wait` are an hour away: only the watcher
/// can end it within the 30 s guard), and dropping the last watch stops
/// the watcher and closes its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_watches_share_the_watcher_which_stops_without_them() {
    use mcp_event_store_sqlite::testing::watcher;

    const HOUR: Duration = Duration::from_secs(3600);
    const EVENTUALLY: Duration = Duration::from_secs(30);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open_with(SqliteOptions::new(&path).follow_recheck(HOUR))
        .await
        .unwrap();
    let me = InstanceId::generate().unwrap();
    a.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::Anonymous;
    let (id, task) = a.create(NewTask::new(&owner, me)).await.unwrap();
    let text = id.to_string();
    assert!(!watcher(&b).is_running(), "nobody watches yet");

    let watching = {
        let (b, text, owner) = (b.clone(), text.clone(), owner);
        tokio::spawn(async move { b.watch(&text, &owner, task.rev, HOUR).await })
    };
    tokio::time::timeout(EVENTUALLY, async {
        while !watcher(&b).is_running() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("no watcher started");
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.apply(&id, me, WorkerChange::SetMessage(Some("moved")))
        .await
        .unwrap();
    let seen = tokio::time::timeout(EVENTUALLY, watching)
        .await
        .expect("the watcher never woke the watch")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(seen.message.as_deref(), Some("moved"));

    // A watch dropped while waiting unregisters; the watcher then stops.
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        b.watch(&text, &owner, seen.rev, HOUR),
    )
    .await;
    assert!(
        dropped.is_err(),
        "nothing changed, so the watch was waiting"
    );
    tokio::time::timeout(EVENTUALLY, async {
        while watcher(&b).is_running() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the watcher outlived its last watch");
    a.close().await;
    b.close().await;
}

/// Another handle's task changes wake a watch with the watching handle's
/// poll, its re-check and the watch's `max_wait` all an hour away: only the
/// file notification of each change's commit prompts the watcher's check.
/// A second watch, on a task nobody changes, keeps the watcher running
/// through every round, so its checks must not back off however many
/// changes come: every one of them may be a watched task's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_notifications_wake_task_watches_without_a_poll() {
    use mcp_event_store_sqlite::testing::watcher;

    const HOUR: Duration = Duration::from_secs(3600);
    const EVENTUALLY: Duration = Duration::from_secs(30);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let a = SqliteStore::open(&path).await.unwrap();
    let b = SqliteStore::open_with(
        SqliteOptions::new(&path)
            .follow_poll_interval(HOUR)
            .follow_recheck(HOUR),
    )
    .await
    .unwrap();
    let me = InstanceId::generate().unwrap();
    a.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::Anonymous;
    let (id, mut task) = a.create(NewTask::new(&owner, me)).await.unwrap();
    let (quiet_id, quiet) = a.create(NewTask::new(&owner, me)).await.unwrap();
    let text = id.to_string();
    let keeping = {
        let (b, text, rev) = (b.clone(), quiet_id.to_string(), quiet.rev);
        tokio::spawn(async move { b.watch(&text, &owner, rev, HOUR).await })
    };
    tokio::time::timeout(EVENTUALLY, async {
        while !watcher(&b).is_running() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("no watcher started");
    let running = watcher(&b);
    for round in 0..20 {
        let watching = {
            let (b, text, rev) = (b.clone(), text.clone(), task.rev);
            tokio::spawn(async move { b.watch(&text, &owner, rev, HOUR).await })
        };
        // Past the watch's first read (and, the first time, the watcher's
        // first check, which would find a change made before it).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let message = format!("moved {round}");
        a.apply(&id, me, WorkerChange::SetMessage(Some(&message)))
            .await
            .unwrap();
        task = tokio::time::timeout(EVENTUALLY, watching)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the change elsewhere never woke the watch"))
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(task.message.as_deref(), Some(message.as_str()));
    }
    assert!(running.is_running(), "the watcher ran through every round");
    keeping.abort();
    a.close().await;
    b.close().await;
}
