//! sled-specific task checks: the task trees leave the event format alone,
//! tasks survive reopening and a SIGKILL of the process that wrote them, a
//! newer task format is refused, and a change through one handle wakes a
//! watch on another at once.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, TaskStatus, TaskStore, WorkerChange,
};
use mcp_event_store_core::{Error, EventStore, NewEvent};
use mcp_event_store_sled::{FORMAT_VERSION, SledOptions, SledStore};

const META: &str = "mcp-event-store/meta";
const TASK_TREES: [&str; 3] = [
    "mcp-event-store/t1/tasks",
    "mcp-event-store/t1/task_purge",
    "mcp-event-store/t1/instances",
];
const LOCK_RELEASE: Duration = Duration::from_secs(10);

/// Opens the store, retrying while a raw `sled::Db` still releases the lock.
async fn open(
    dir: &std::path::Path,
    options: SledOptions,
) -> mcp_event_store_core::Result<SledStore> {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match SledStore::open(dir, options.clone()).await {
            Err(e)
                if e.to_string().contains("locked by another process")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            opened => return opened,
        }
    }
}

/// Opens the database with sled directly, retrying while the store is
/// still releasing the directory's lock.
fn raw_open(dir: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match sled::open(dir) {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            opened => return opened.unwrap(),
        }
    }
}

/// A key and its value.
type Entry = (Vec<u8>, Vec<u8>);

/// Every tree's name and contents, except the task trees: what a release
/// without tasks reads.
fn event_side(dir: &std::path::Path) -> Vec<(Vec<u8>, Vec<Entry>)> {
    let db = raw_open(dir);
    let mut trees = Vec::new();
    for name in db.tree_names() {
        if TASK_TREES.iter().any(|t| t.as_bytes() == &name[..]) {
            continue;
        }
        let tree = db.open_tree(&name).unwrap();
        let mut entries: Vec<Entry> = tree
            .iter()
            .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();
        if &name[..] == META.as_bytes() {
            // The task format record is the one key tasks add to the
            // metadata; releases without tasks read only their own keys.
            entries.retain(|(k, _)| k != b"task_format");
        }
        trees.push((name.to_vec(), entries));
    }
    trees
}

async fn a_finished_task(store: &SledStore) -> (String, Owner) {
    let me = InstanceId::generate().unwrap();
    assert!(
        store
            .heartbeat(me, Duration::from_secs(3600))
            .await
            .unwrap()
    );
    let owner = Owner::principal(b"alice").unwrap();
    let (id, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
    let ask = WorkerChange::RequestInput {
        key: "k",
        request: b"{\"q\":1}",
    };
    assert!(matches!(
        store.apply(&id, me, ask).await.unwrap(),
        Applied::Changed { .. }
    ));
    let text = id.to_string();
    store
        .answer(&text, &owner, &[("k", b"{\"a\":2}")])
        .await
        .unwrap();
    let done = WorkerChange::Finish(Finish::Completed(b"{\"content\":[]}"));
    assert!(matches!(
        store.apply(&id, me, done).await.unwrap(),
        Applied::Changed { .. }
    ));
    (text, owner)
}

/// A release without tasks reads the format record and the event trees
/// only: tasks change neither, so it keeps serving the same events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_leave_what_an_older_release_reads_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SledOptions::default()).await.unwrap();
    let first = store.store_event("s", NewEvent::new(b"1")).await.unwrap();
    store.close().await.unwrap();
    let before = event_side(dir.path());

    let store = open(dir.path(), SledOptions::default()).await.unwrap();
    a_finished_task(&store).await;
    store.purge_expired_tasks().await.unwrap();
    store.close().await.unwrap();
    assert_eq!(
        event_side(dir.path()),
        before,
        "tasks touched the event side"
    );
    {
        let db = raw_open(dir.path());
        let meta = db.open_tree(META).unwrap();
        let format = meta.get("format_version").unwrap().unwrap();
        assert_eq!(&format[..], &FORMAT_VERSION.to_be_bytes()[..]);
        for tree in TASK_TREES {
            assert!(db.tree_names().iter().any(|n| &n[..] == tree.as_bytes()));
        }
        assert!(!db.open_tree(TASK_TREES[0]).unwrap().is_empty());
    }

    let store = open(dir.path(), SledOptions::default()).await.unwrap();
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    assert_eq!(replay.stream_id, "s");
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    assert!(events.is_empty());
    store.close().await.unwrap();
}

/// A finished task, its outcome and its spent keys survive a close and a
/// reopen from disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SledOptions::default()).await.unwrap();
    let (id, owner) = a_finished_task(&store).await;
    let seen = store.get(&id, &owner).await.unwrap().unwrap();
    store.close().await.unwrap();

    let store = open(dir.path(), SledOptions::default()).await.unwrap();
    let again = store.get(&id, &owner).await.unwrap().unwrap();
    assert_eq!(again, seen);
    assert_eq!(again.status, TaskStatus::Completed);
    assert_eq!(again.outcome.as_deref(), Some(&b"{\"content\":[]}"[..]));
    assert!(store.get(&id, &Owner::Anonymous).await.unwrap().is_none());
    store.close().await.unwrap();
}

/// A database whose tasks a newer release wrote is refused, unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_task_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), SledOptions::default()).await.unwrap();
    store.close().await.unwrap();
    {
        let db = raw_open(dir.path());
        let meta = db.open_tree(META).unwrap();
        let ours = meta.get("task_format").unwrap().unwrap();
        assert_eq!(&ours[..], &1u32.to_be_bytes()[..]);
        meta.insert("task_format", &2u32.to_be_bytes()).unwrap();
        db.flush().unwrap();
    }
    match open(dir.path(), SledOptions::default()).await {
        Err(Error::IncompatibleFormat(message)) => {
            assert!(message.contains("task format 2"), "{message}");
        }
        other => panic!("opened a newer task format: {other:?}"),
    }
    let db = raw_open(dir.path());
    let meta = db.open_tree(META).unwrap();
    assert_eq!(
        &meta.get("task_format").unwrap().unwrap()[..],
        &2u32.to_be_bytes()[..]
    );
}

/// A change through one handle wakes a watch on another through the hub
/// they share, long before the watch's re-check (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_on_one_handle_wakes_a_watch_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let options = SledOptions::default().follow_recheck(Duration::from_secs(3600));
    let a = open(dir.path(), options.clone()).await.unwrap();
    let b = open(dir.path(), options).await.unwrap();
    let me = InstanceId::generate().unwrap();
    assert!(a.heartbeat(me, Duration::from_secs(3600)).await.unwrap());
    let owner = Owner::Anonymous;
    let (id, created) = a.create(NewTask::new(&owner, me)).await.unwrap();
    let text = id.to_string();
    let watch = {
        let a = a.clone();
        let text = text.clone();
        tokio::spawn(async move {
            a.watch(
                &text,
                &Owner::Anonymous,
                created.rev,
                Duration::from_secs(3600),
            )
            .await
            .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A task watcher is not a follower of events.
    assert_eq!(a.open_follows(), 0);
    let changed = b
        .apply(&id, me, WorkerChange::SetMessage(Some("half way")))
        .await
        .unwrap();
    let Applied::Changed { rev, .. } = changed else {
        panic!("{changed:?}");
    };
    // Its re-check and max_wait are an hour away: only the hub can end it
    // within this guard.
    let seen = tokio::time::timeout(Duration::from_secs(30), watch)
        .await
        .expect("the watch was not woken")
        .unwrap();
    let seen = seen.unwrap();
    assert_eq!(seen.rev, rev);
    assert_eq!(seen.message.as_deref(), Some("half way"));
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Where [`task_crash_child`] works: the database directory.
const TASK_CRASH_DIR_ENV: &str = "MCP_EVENT_STORE_SLED_TASK_CRASH_DIR";

/// T1, T12: a child process creates tasks (each asks for input; every
/// other one also completes with a result) and prints each once every step
/// is acknowledged; it is killed with SIGKILL mid-flight. Reopened here,
/// every acknowledged task is there with its input and its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_tasks_survive_sigkill() {
    use std::io::BufRead;

    use mcp_event_store_conformance::testkit::{ChildGuard, test_child, test_path};

    let dir = tempfile::tempdir().unwrap();
    let mut command = test_child(&test_path(module_path!(), "task_crash_child")).unwrap();
    command
        .env(TASK_CRASH_DIR_ENV, dir.path())
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

    let store = open(dir.path(), SledOptions::default()).await.unwrap();
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
    store.close().await.unwrap();
}

/// The child of [`acknowledged_tasks_survive_sigkill`]; without its
/// variable (`cargo test -- --ignored`), it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of acknowledged_tasks_survive_sigkill"]
async fn task_crash_child() {
    use std::io::Write;

    let Some(dir) = std::env::var_os(TASK_CRASH_DIR_ENV) else {
        return;
    };
    let store = SledStore::open(dir, SledOptions::default()).await.unwrap();
    let me = InstanceId::generate().unwrap();
    assert!(
        store
            .heartbeat(me, Duration::from_secs(3600))
            .await
            .unwrap()
    );
    let owner = Owner::principal(b"crash").unwrap();
    let started = std::time::Instant::now();
    for n in 0u64.. {
        // A child nobody kills ends on its own.
        if started.elapsed() > Duration::from_secs(60) {
            return;
        }
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

/// A purge larger than one step (500 tasks) goes in several steps and
/// still ends and deletes everything, with every count right, leaving no
/// purge index entry behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_many_tasks_goes_in_steps_and_misses_none() {
    use mcp_event_store_conformance::events::{test_clock, test_options};

    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    // Interval durability: 1300 tasks without an fsync each.
    let options = SledOptions::default()
        .store(test_options(&clock))
        .durability(mcp_event_store_sled::Durability::Interval(
            Duration::from_millis(50),
        ));
    let store = open(dir.path(), options).await.unwrap();
    let (expiring, lost) = (700u64, 600u64);
    let long = InstanceId::generate().unwrap();
    assert!(
        store
            .heartbeat(long, Duration::from_secs(3600))
            .await
            .unwrap()
    );
    let short = InstanceId::generate().unwrap();
    assert!(
        store
            .heartbeat(short, Duration::from_secs(30))
            .await
            .unwrap()
    );
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
    store.close().await.unwrap();
    let db = raw_open(dir.path());
    assert!(db.open_tree(TASK_TREES[0]).unwrap().is_empty());
    assert!(db.open_tree(TASK_TREES[1]).unwrap().is_empty());
}
