//! sled-specific task checks beyond the shared task suite (`task_suite.rs`,
//! whose `persistent` cases reopen the database, SIGKILL a writer and
//! refuse a newer task format): the task trees leave the event format
//! alone, and a change through one handle wakes a watch on another at once.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskStore, WorkerChange,
};
use mcp_event_store_core::{EventStore, NewEvent};
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
