//! Concurrent first opens (C6, C11): several processes, or several handles
//! in one process, opening one new database file at the same moment all
//! succeed, agree on the stream secret, and see each other's events. The
//! migration runs once, under SQLite's write lock; the others wait for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_conformance::testkit::{ChildGuard, test_child, test_path};
use mcp_event_store_core::{EventId, EventStore, NewEvent, Retention, StoreOptions};
use mcp_event_store_sqlite::{SqliteOptions, SqliteStore};

/// Set in a child process: `<database>|<name>|<go file>|<ids file>`.
const CHILD_ENV: &str = "MCP_EVENT_STORE_SQLITE_FIRST_OPEN_CHILD";
const PROCESSES: usize = 6;
const ROUNDS: usize = 4;
const EVENTS_EACH: usize = 20;

fn options(path: &Path) -> SqliteOptions {
    SqliteOptions::new(path).store(StoreOptions::default().retention(Retention::unbounded()))
}

/// Opens, appends `EVENTS_EACH` events to `shared` and to the handle's own
/// stream, and checks they can all be read back through this handle.
/// Returns the `shared` ids.
async fn open_append_and_check(path: &Path, name: &str) -> Vec<EventId> {
    let store = SqliteStore::open_with(options(path))
        .await
        .unwrap_or_else(|e| panic!("{name}: opening the new database failed: {e}"));
    let own = format!("own-{name}");
    let mut shared = Vec::new();
    let mut mine = Vec::new();
    for i in 0..EVENTS_EACH {
        let data = format!("{name}-{i}");
        shared.push(
            store
                .store_event("shared", NewEvent::new(data.as_bytes()))
                .await
                .unwrap_or_else(|e| panic!("{name}: append to shared: {e}")),
        );
        mine.push(
            store
                .store_event(&own, NewEvent::new(data.as_bytes()))
                .await
                .unwrap_or_else(|e| panic!("{name}: append to {own}: {e}")),
        );
    }
    for id in &shared {
        let found = store.get_stream_id_for_event_id(&id.to_string()).await;
        assert_eq!(found.unwrap().as_deref(), Some("shared"), "{name}: {id}");
    }
    let replay = store
        .replay_events_after(&mine[0].to_string())
        .await
        .unwrap();
    assert_eq!(replay.stream_id, own);
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    let ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    assert_eq!(ids, mine[1..], "{name}: its own stream replays whole");
    store.close().await;
    shared
}

/// Checks, through a fresh handle, that `shared` holds exactly `expected`
/// and every `own-<name>` stream all its events.
async fn check_everything(path: &Path, names: &[String], mut expected: Vec<EventId>) {
    let store = SqliteStore::open_with(options(path)).await.unwrap();
    let first = *expected.iter().min_by_key(|id| id.position).unwrap();
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let mut seen: Vec<EventId> = replay.events.map_ok(|e| e.id).try_collect().await.unwrap();
    seen.push(first);
    seen.sort_by_key(|id| id.position);
    expected.sort_by_key(|id| id.position);
    assert_eq!(seen, expected, "shared holds every acknowledged event once");
    for name in names {
        let id = store
            .store_event(&format!("own-{name}"), NewEvent::new(b"last"))
            .await
            .unwrap();
        let (_, seq) = mcp_event_store_core::backend::dense::parts(id.position).unwrap();
        assert_eq!(seq as usize, EVENTS_EACH + 1, "own-{name}");
    }
    store.close().await;
}

/// A child process opening the file (killed by pid if the test fails
/// first), with where it writes its ids and its log.
struct Opener {
    child: ChildGuard,
    ids: PathBuf,
    log: PathBuf,
}

impl Opener {
    fn spawn(db: &Path, name: &str, go: &Path) -> Self {
        let dir = db.parent().unwrap();
        let ids = dir.join(format!("{name}.ids"));
        let log = dir.join(format!("{name}.log"));
        // The child's libtest report goes to a log, shown only if it fails.
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut command = test_child(&test_path(module_path!(), "first_open_child"))
            .expect("this test binary's path");
        command
            .env(
                CHILD_ENV,
                format!("{}|{name}|{}|{}", db.display(), go.display(), ids.display()),
            )
            .stdout(out)
            .stderr(err);
        let child = ChildGuard::spawn(&mut command).expect("re-executing the test binary");
        Self { child, ids, log }
    }

    /// Waits for the child; its ids, or its log if it failed.
    fn finish(mut self) -> Result<Vec<EventId>, String> {
        let status = self.child.wait().unwrap();
        if !status.success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("child failed ({status}):\n{log}"));
        }
        let ids = std::fs::read_to_string(&self.ids).unwrap();
        Ok(ids.lines().map(|line| line.parse().unwrap()).collect())
    }
}

/// The child's side, run by `processes_opening_a_new_file_at_once_all_succeed`
/// with `CHILD_ENV` set (without it, it has nothing to do): wait for the go
/// file, open, append, check, and write the acknowledged `shared` ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of processes_opening_a_new_file_at_once_all_succeed"]
async fn first_open_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(4, '|');
    let (db, name, go, out) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    // Every child is started before any opens: they open together.
    while !Path::new(go).exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let ids = open_append_and_check(Path::new(db), name).await;
    let lines: String = ids.iter().map(|id| format!("{id}\n")).collect();
    std::fs::write(out, lines).unwrap();
}

/// Several processes open one new file at the same moment, in several
/// rounds (a fresh file each): every one of them opens, appends and reads
/// back, and everything they acknowledged is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_a_new_file_at_once_all_succeed() {
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("events.db");
        let go = dir.path().join("go");
        let names: Vec<String> = (0..PROCESSES).map(|p| format!("p{p}")).collect();
        let children: Vec<Opener> = names
            .iter()
            .map(|name| Opener::spawn(&db, name, &go))
            .collect();
        std::fs::write(&go, b"go").unwrap();
        let results = tokio::task::spawn_blocking(move || {
            children.into_iter().map(Opener::finish).collect::<Vec<_>>()
        })
        .await
        .unwrap();
        let mut acknowledged = Vec::new();
        for (name, result) in names.iter().zip(results) {
            match result {
                Ok(ids) => acknowledged.extend(ids),
                Err(log) => failures.push(format!("round {round}, {name}: {log}")),
            }
        }
        if failures.is_empty() {
            assert_eq!(acknowledged.len(), PROCESSES * EVENTS_EACH);
            check_everything(&db, &names, acknowledged).await;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} first opens by concurrent processes failed:\n{}",
        failures.len(),
        ROUNDS * PROCESSES,
        failures.join("\n")
    );
}

/// Many handles in one process open one new file at once: all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_opening_a_new_file_at_once_all_succeed() {
    const HANDLES: usize = 12;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let db: Arc<Path> = dir.path().join("events.db").into();
        let start = Arc::new(tokio::sync::Barrier::new(HANDLES));
        let names: Vec<String> = (0..HANDLES).map(|h| format!("h{h}")).collect();
        let tasks: Vec<_> = names
            .iter()
            .map(|name| {
                let (db, start, name) = (db.clone(), start.clone(), name.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    open_append_and_check(&db, &name).await
                })
            })
            .collect();
        let mut acknowledged = Vec::new();
        for (name, task) in names.iter().zip(tasks) {
            match task.await {
                Ok(ids) => acknowledged.extend(ids),
                Err(e) => failures.push(format!("round {round}, {name}: {e}")),
            }
        }
        if failures.is_empty() {
            check_everything(&db, &names, acknowledged).await;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} concurrent first opens failed:\n{}",
        failures.len(),
        ROUNDS * HANDLES,
        failures.join("\n")
    );
}
