//! SQLite-specific task behaviour beyond the shared task suite
//! (`task_suite.rs`): the task tables are additive, so a release that knows
//! only the event migrations keeps serving events from a file that holds
//! tasks; a release of task format 1 keeps serving events and tasks from a
//! file whose tasks have contexts, and what it writes leaves a context as it
//! is; a newer task format, or task context format, is refused and changes
//! nothing; tasks survive
//! a restart and a SIGKILL of the process that wrote them (T1, T12); a
//! closed handle refuses task calls; task watches share the handle's one
//! watcher, which stops when the last watch goes.

use std::borrow::Cow;
use std::time::Duration;

use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, TaskStatus, TaskStore, WorkerChange,
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

/// A task migration of a newer release is refused, naming it, and the
/// refusal changes nothing: events and tasks read as before once the
/// marker is gone.
#[tokio::test]
async fn a_newer_task_format_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let (id, owner) = file_with_a_task(&path).await;
    let newest: i64 = sqlx::migrate!("./migrations/tasks")
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    let mut conn = raw(&path).await;
    sqlx::query(
        "INSERT INTO mes_task_migrations (version, description, success, checksum, execution_time) \
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
            if m.contains(&format!("task version {}", newest + 1))),
        "{err}"
    );
    let mut conn = raw(&path).await;
    sqlx::query("DELETE FROM mes_task_migrations WHERE version = ?1")
        .bind(newest + 1)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    let task = store.get(&id, &owner).await.unwrap().expect("the task");
    assert_eq!(task.status, TaskStatus::InputRequired);
    assert_eq!(store.stats().await.unwrap().events, 1);
    store.close().await;
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

/// A task, its outcome and its inputs survive closing and reopening the
/// file, and a fresh handle's worker can finish it once.
#[tokio::test]
async fn tasks_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::Anonymous;
    let (asking, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    let request = WorkerChange::RequestInput {
        key: "q",
        request: b"{\"ask\":1}",
    };
    store.apply(&asking, me, request).await.unwrap();
    let (done, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    let finish = WorkerChange::Finish(Finish::Completed(b"{\"content\":[]}"));
    store.apply(&done, me, finish).await.unwrap();
    store.close().await;

    let store = SqliteStore::open(&path).await.unwrap();
    let seen = store
        .get(&asking.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.status, TaskStatus::InputRequired);
    assert_eq!(
        seen.outstanding,
        vec![("q".to_owned(), b"{\"ask\":1}".to_vec().into())]
    );
    let seen = store.get(&done.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(seen.status, TaskStatus::Completed);
    assert_eq!(seen.outcome.as_deref(), Some(&b"{\"content\":[]}"[..]));
    assert_eq!(
        store.apply(&done, me, finish).await.unwrap(),
        Applied::AlreadyTerminal(TaskStatus::Completed)
    );
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

/// Where [`task_crash_child`] works: the database file.
const TASK_CRASH_PATH_ENV: &str = "MCP_EVENT_STORE_TASK_CRASH_PATH";

/// T1, T12: a child process creates tasks (each asks for input; every
/// other one also completes with a result) and prints each once every step
/// is acknowledged; it is killed with SIGKILL mid-flight. Reopened here,
/// every acknowledged task is there with its inputs and its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_tasks_survive_sigkill() {
    use std::io::BufRead;

    use mcp_event_store_conformance::testkit::{ChildGuard, test_child, test_path};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let mut command = test_child(&test_path(module_path!(), "task_crash_child")).unwrap();
    command
        .env(TASK_CRASH_PATH_ENV, &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let mut child = ChildGuard::spawn(&mut command).expect("start the child");
    let stdout = child.take_stdout().unwrap();
    let (lines, mut received) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            // Whole lines only: a line cut by the kill was never printed.
            if line.ends_with('\n') && lines.send(std::mem::take(&mut line)).is_err() {
                return;
            }
            line.clear();
        }
    });
    let parse = |line: &str| -> Option<(String, u64)> {
        // libtest may print "test <name> ... " before the first line.
        let rest = &line[line.find("TASK ")? + 5..];
        let (id, n) = rest.trim_end().split_once(' ')?;
        Some((id.to_owned(), n.parse().ok()?))
    };
    let mut acked = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while acked.len() < 100 {
        match tokio::time::timeout_at(deadline, received.recv()).await {
            Ok(Some(line)) => acked.extend(parse(&line)),
            Ok(None) => panic!("the child ended after {} tasks", acked.len()),
            Err(_) => panic!("the child acknowledged {} tasks in 120 s", acked.len()),
        }
    }
    child.kill();
    while let Some(line) = received.recv().await {
        acked.extend(parse(&line));
    }

    let store = SqliteStore::open(&path).await.unwrap();
    let owner = Owner::principal(b"crash").unwrap();
    for (id, n) in &acked {
        let task = store
            .get(id, &owner)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged task {n} is gone"));
        let request = format!("{{\"n\":{n}}}").into_bytes();
        if n % 2 == 0 {
            assert_eq!(task.status, TaskStatus::Completed, "task {n}");
            assert_eq!(task.outcome.as_deref(), Some(&request[..]), "task {n}");
        } else {
            assert_eq!(task.status, TaskStatus::InputRequired, "task {n}");
            assert_eq!(
                task.outstanding,
                vec![(format!("k{n}"), request.into())],
                "task {n}"
            );
        }
    }
    store.close().await;
}

/// The child of [`acknowledged_tasks_survive_sigkill`]; without its
/// variable (`cargo test -- --ignored`), it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of acknowledged_tasks_survive_sigkill"]
async fn task_crash_child() {
    use std::io::Write;

    let Some(path) = std::env::var_os(TASK_CRASH_PATH_ENV) else {
        return;
    };
    let store = SqliteStore::open(path).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store
        .heartbeat(me, Duration::from_secs(3600))
        .await
        .unwrap();
    let owner = Owner::principal(b"crash").unwrap();
    for n in 0u64.. {
        let (id, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
        let request = format!("{{\"n\":{n}}}");
        let key = format!("k{n}");
        let asked = store
            .apply(
                &id,
                me,
                WorkerChange::RequestInput {
                    key: &key,
                    request: request.as_bytes(),
                },
            )
            .await
            .unwrap();
        assert!(matches!(asked, Applied::Changed { .. }));
        if n % 2 == 0 {
            let done = WorkerChange::Finish(Finish::Completed(request.as_bytes()));
            assert!(matches!(
                store.apply(&id, me, done).await.unwrap(),
                Applied::Changed { .. }
            ));
        }
        let mut out = std::io::stdout().lock();
        // One write per line, so a kill never leaves a whole wrong line.
        out.write_all(format!("TASK {id} {n}\n").as_bytes())
            .and_then(|()| out.flush())
            .unwrap();
    }
}

/// A purge larger than one step (500 tasks) goes in several transactions
/// and still ends and deletes everything, with every count right; lapsed
/// instances are forgotten only once their tasks are all ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_many_tasks_goes_in_steps_and_misses_none() {
    use mcp_event_store_conformance::events::{test_clock, test_options};
    use mcp_event_store_sqlite::SqliteOptions;

    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let options = SqliteOptions::new(dir.path().join("e.db")).store(test_options(&clock));
    let store = SqliteStore::open_with(options).await.unwrap();
    let (expiring, lost) = (700u64, 600u64);
    let long = InstanceId::generate().unwrap();
    store
        .heartbeat(long, Duration::from_secs(3600))
        .await
        .unwrap();
    let short = InstanceId::generate().unwrap();
    store
        .heartbeat(short, Duration::from_secs(30))
        .await
        .unwrap();
    let owner = Owner::Anonymous;
    let ttl = Duration::from_secs(60);
    let mut ids = Vec::new();
    for n in 0..expiring + lost {
        let me = if n < expiring { long } else { short };
        let (id, _) = store
            .create(NewTask::new(&owner, me).ttl(ttl))
            .await
            .unwrap();
        let key = format!("k{n}");
        let request = WorkerChange::RequestInput {
            key: &key,
            request: b"{}",
        };
        store.apply(&id, me, request).await.unwrap();
        ids.push(id.to_string());
    }
    // The short instance lapses at 30 s, the ttl ends at 60 s.
    clock.advance(Duration::from_secs(60));
    let report = store.purge_expired_tasks().await.unwrap();
    assert_eq!(
        (
            report.expired,
            report.orphaned,
            report.deleted,
            report.instances
        ),
        (expiring, lost, 0, 1)
    );
    for id in [&ids[0], &ids[ids.len() - 1]] {
        let task = store.get(id, &owner).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Failed);
        assert!(task.outstanding.is_empty());
    }
    // Past the grace (one ttl) every task goes, with its inputs.
    clock.advance(ttl);
    let report = store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.deleted, expiring + lost);
    let report = store.purge_expired_tasks().await.unwrap();
    assert_eq!(report, Default::default());
    let mut conn = raw(&dir.path().join("e.db")).await;
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM mes_tasks), (SELECT COUNT(*) FROM mes_task_inputs)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, (0, 0));
    conn.close().await.unwrap();
    store.close().await;
}
