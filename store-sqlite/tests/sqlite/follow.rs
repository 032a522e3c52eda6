//! Following on SQLite beyond the conformance suite: which path delivers
//! what (the writer's in-process wake-ups, the `data_version` watcher for
//! other handles and processes, prompted by file notifications and by its
//! poll), and that the watcher holds nothing once nobody follows.
//!
//! Re-checks are set to an hour here, so an event that arrives was brought
//! by the path under test, never by the safety net; so is the watcher's
//! poll where only its file notifications may deliver. The 30 s timeouts
//! are only "must arrive eventually" guards.

use std::path::Path;
use std::time::Duration;

use futures_util::StreamExt;
use mcp_event_store_conformance::testkit::{ChildGuard, test_child, test_path};
use mcp_event_store_core::{Error, EventId, EventStore, FollowOptions, NewEvent, Replay};
use mcp_event_store_sqlite::testing::{
    file_notifier_on, foreign_commits_seen, read_connections, watcher,
};
use mcp_event_store_sqlite::{SqliteOptions, SqliteStore};

const GUARD: Duration = Duration::from_secs(30);
const HOUR: Duration = Duration::from_secs(3600);
/// Set in the environment of the child process of
/// `appends_from_another_process_reach_a_follower`.
const CHILD_DB: &str = "MES_SQLITE_FOLLOW_CHILD_DB";

async fn open(path: &Path, poll: Duration) -> SqliteStore {
    SqliteStore::open_with(
        SqliteOptions::new(path)
            .follow_poll_interval(poll)
            .follow_recheck(HOUR),
    )
    .await
    .unwrap()
}

async fn append(store: &SqliteStore, stream: &str, data: &[u8]) -> EventId {
    store
        .store_event(stream, NewEvent::new(data))
        .await
        .unwrap()
}

async fn follow(store: &SqliteStore, after: &EventId) -> Replay {
    store
        .follow_events_after(&after.to_string(), FollowOptions::default())
        .await
        .unwrap()
}

async fn next(follow: &mut Replay) -> EventId {
    match tokio::time::timeout(GUARD, follow.events.next()).await {
        Ok(Some(Ok(event))) => event.id,
        Ok(Some(Err(e))) => panic!("the follow failed: {e}"),
        Ok(None) => panic!("the follow ended"),
        Err(_) => panic!("no event within {GUARD:?}"),
    }
}

/// Waits (up to the guard) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + GUARD;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {GUARD:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn appends_through_the_same_handle_wake_followers_directly() {
    let dir = tempfile::tempdir().unwrap();
    // Neither the watcher nor the re-check would deliver within the guard:
    // only the writer's wake-up after its commit can.
    let store = open(&dir.path().join("e.db"), HOUR).await;
    let start = append(&store, "s", b"start").await;
    let mut follow = follow(&store, &start).await;
    for i in 0..5u8 {
        let id = append(&store, "s", &[i]).await;
        assert_eq!(next(&mut follow).await, id);
    }
    drop(follow);
    store.close().await;
}

#[tokio::test]
async fn appends_through_another_handle_reach_a_follower() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let reader = open(&path, Duration::from_millis(10)).await;
    // A second handle on the file: its own writer connection and pool,
    // like another process; its writer wakes only its own followers.
    let writer = open(&path, HOUR).await;
    let start = append(&writer, "s", b"start").await;
    let mut follow = follow(&reader, &start).await;
    assert!(watcher(&reader).is_running());
    assert!(
        !watcher(&writer).is_running(),
        "a handle nobody follows on watches"
    );
    for i in 0..5u8 {
        let id = append(&writer, "s", &[i]).await;
        assert_eq!(next(&mut follow).await, id);
    }
    drop(follow);
    reader.close().await;
    writer.close().await;
}

/// Another handle's commits reach a follower with its watcher's poll (and
/// its re-check) an hour away: the file notification on the database's
/// `-wal` prompts the watcher's check. Each append after the first can only
/// be delivered that way (the watcher's first check, at its start, may
/// find the first).
#[tokio::test]
async fn file_notifications_bring_another_handles_appends_without_a_poll() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let reader = open(&path, HOUR).await;
    let writer = open(&path, HOUR).await;
    let start = append(&writer, "s", b"start").await;
    let mut first = follow(&reader, &start).await;
    assert!(watcher(&reader).is_running());
    for i in 0..5u8 {
        let id = append(&writer, "s", &[i]).await;
        assert_eq!(next(&mut first).await, id);
    }
    // A follower that joins the running watcher, on another stream.
    let other = append(&writer, "t", b"start").await;
    let mut joined = follow(&reader, &other).await;
    for i in 0..3u8 {
        let id = append(&writer, "t", &[i]).await;
        assert_eq!(next(&mut joined).await, id);
    }
    drop((first, joined));
    reader.close().await;
    writer.close().await;
}

/// The watcher tells this handle's own commits from another handle's: only
/// the latter keep its file notifier on. A handle that follows and appends
/// alone sees none, however many checks its commits prompt, and its
/// notifier goes off; one commit through another handle is seen, whether
/// this handle's writer is idle (the watcher's own test) or busy (the
/// writer's `data_version`), and turns it back on.
#[tokio::test]
async fn only_another_handles_commits_count_as_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = open(&path, Duration::from_millis(2)).await;
    let start = append(&store, "s", b"start").await;
    let mut follow = follow(&store, &start).await;
    for i in 0..40u8 {
        let id = append(&store, "s", &[i]).await;
        append(&store, "unfollowed", &[i]).await;
        assert_eq!(next(&mut follow).await, id);
        if i % 8 == 0 {
            // Let polls and notified checks run between the commits.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut i = 0u32;
    while file_notifier_on(&store) {
        // Checks prompted by its own commits turn the notifier off.
        i += 1;
        assert!(i < 10_000, "the notifier stayed on for its own commits");
        let id = append(&store, "s", &i.to_be_bytes()).await;
        assert_eq!(next(&mut follow).await, id);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(watcher(&store).is_running());
    assert_eq!(foreign_commits_seen(&store), 0);

    // Another handle commits while this one's writer is idle.
    let other = open(&path, HOUR).await;
    let id = append(&other, "s", b"elsewhere").await;
    assert_eq!(next(&mut follow).await, id);
    eventually("the watcher sees another handle's commit", || {
        foreign_commits_seen(&store) >= 1
    })
    .await;
    assert!(file_notifier_on(&store));

    // And while this handle's writer is busy: its own appends to another
    // stream, each racing the other handle's.
    let seen = foreign_commits_seen(&store);
    for i in 0..20u8 {
        let data = [i];
        let (theirs, _) = tokio::join!(
            append(&other, "s", &data),
            append(&store, "unfollowed", &data)
        );
        assert_eq!(next(&mut follow).await, theirs);
    }
    eventually("the watcher sees the other handle's commits", || {
        foreign_commits_seen(&store) > seen
    })
    .await;
    drop(follow);
    other.close().await;
    store.close().await;
}

/// Run as a child process by `appends_from_another_process_reach_a_follower`
/// and `file_notifications_bring_another_processes_appends_without_a_poll`
/// (which set `CHILD_DB`); does nothing otherwise.
#[tokio::test]
#[ignore = "the child process of the cross-process follow tests"]
async fn child_process_appends() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&path)).await.unwrap();
    for i in 0..3u8 {
        let id = append(&store, "s", &[i]).await;
        println!("appended {id}");
    }
    store.close().await;
}

#[tokio::test]
async fn appends_from_another_process_reach_a_follower() {
    from_another_process(Duration::from_millis(10)).await;
}

/// The same with the follower's poll (and re-check) an hour away: only the
/// file notifications of the child's commits can deliver its appends.
#[tokio::test]
async fn file_notifications_bring_another_processes_appends_without_a_poll() {
    from_another_process(HOUR).await;
}

/// A child process appends three events; a follower here, whose watcher
/// polls every `poll`, gets each of them.
async fn from_another_process(poll: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = open(&path, poll).await;
    let start = append(&store, "s", b"start").await;
    let mut follow = follow(&store, &start).await;

    let mut command = test_child(&test_path(module_path!(), "child_process_appends"))
        .expect("this test binary's path");
    command
        .env(CHILD_DB, &path)
        .stdout(std::process::Stdio::piped());
    let mut child = ChildGuard::spawn(&mut command).expect("re-executing the test binary");
    let mut stdout = child.take_stdout().expect("the child's stdout");
    let output = tokio::task::spawn_blocking(move || {
        let mut output = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut output).map(|_| output)
    });
    let mut delivered = Vec::new();
    for _ in 0..3 {
        delivered.push(next(&mut follow).await.to_string());
    }
    let output = output.await.unwrap().unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the child process failed:\n{output}");
    // libtest may have put "test child_process_appends ... " before the
    // child's first line.
    let appended: Vec<String> = output
        .lines()
        .filter_map(|line| {
            line.find("appended ")
                .map(|at| &line[at + "appended ".len()..])
        })
        .map(str::to_owned)
        .collect();
    assert_eq!(delivered, appended);
    drop(follow);
    store.close().await;
}

#[tokio::test]
async fn the_watcher_runs_only_while_someone_follows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = open(&path, Duration::from_millis(10)).await;
    let other = open(&path, HOUR).await;
    let start = append(&store, "s", b"start").await;
    assert!(!watcher(&store).is_running(), "an idle store watches");

    let first = follow(&store, &start).await;
    let mut second = follow(&store, &start).await;
    let probe = watcher(&store);
    assert!(probe.is_running());
    assert_eq!(store.open_follows(), 2);

    // One follower left: the same watcher goes on and still delivers.
    drop(first);
    let id = append(&other, "s", b"1").await;
    assert_eq!(next(&mut second).await, id);
    assert!(probe.is_running());

    // The last follower gone: the watcher ends, closing its connection.
    drop(second);
    assert_eq!(store.open_follows(), 0);
    eventually("the watcher ending", || !probe.is_running()).await;
    assert!(!watcher(&store).is_running());

    // The next follow starts a new one.
    let mut again = follow(&store, &id).await;
    let probe = watcher(&store);
    assert!(probe.is_running());
    let id = append(&other, "s", b"2").await;
    assert_eq!(next(&mut again).await, id);
    drop(again);
    eventually("the new watcher ending", || !probe.is_running()).await;
    store.close().await;
    other.close().await;
}

#[tokio::test]
async fn the_watcher_ends_when_the_store_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    // A poll interval no test waits out: the watcher must end because the
    // handle went, not at its next poll.
    let store = open(&dir.path().join("e.db"), HOUR).await;
    let start = append(&store, "s", b"start").await;
    let follow = follow(&store, &start).await;
    let probe = watcher(&store);
    assert!(probe.is_running());
    // A follow keeps its handle alive; both gone, the handle is dropped.
    drop(store);
    assert!(probe.is_running());
    drop(follow);
    eventually("the watcher ending with its handle", || !probe.is_running()).await;
}

#[tokio::test]
async fn closing_the_store_ends_its_follows_and_its_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("e.db"), HOUR).await;
    let start = append(&store, "s", b"start").await;
    let mut follow = follow(&store, &start).await;
    let probe = watcher(&store);
    assert!(probe.is_running());
    store.close().await;
    match tokio::time::timeout(GUARD, follow.events.next()).await {
        Ok(Some(Err(Error::Closed))) => {}
        Ok(other) => panic!("expected Closed, got {:?}", other.map(|e| e.map(|e| e.id))),
        Err(_) => panic!("the follow outlived its store by {GUARD:?}"),
    }
    assert!(
        matches!(
            tokio::time::timeout(GUARD, follow.events.next()).await,
            Ok(None)
        ),
        "the follow went on after Closed"
    );
    eventually("the watcher ending on close", || !probe.is_running()).await;
    drop(follow);
    assert_eq!(store.open_follows(), 0);
    assert!(matches!(
        store
            .follow_events_after(&start.to_string(), FollowOptions::default())
            .await,
        Err(Error::Closed)
    ));
    assert!(!watcher(&store).is_running());
}

#[tokio::test]
async fn a_thousand_idle_followers_share_the_pool_and_one_watcher() {
    const FOLLOWERS: usize = 1_000;
    const STREAMS: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = open(&path, Duration::from_millis(10)).await;
    let other = open(&path, HOUR).await;
    let mut starts = Vec::with_capacity(STREAMS);
    for s in 0..STREAMS {
        starts.push(append(&store, &format!("s{s}"), b"start").await);
    }
    let mut follows = Vec::with_capacity(FOLLOWERS);
    for f in 0..FOLLOWERS {
        follows.push(follow(&store, &starts[f % STREAMS]).await);
    }
    assert_eq!(store.open_follows(), FOLLOWERS);
    let probe = watcher(&store);
    assert!(probe.is_running());
    // Idle followers hold no connection: the pool never grows past its
    // limit (4), and one watcher (one connection) serves them all.
    assert!(
        read_connections(&store) <= 4,
        "{}",
        read_connections(&store)
    );

    // Another handle appends to one stream: each of its followers gets it.
    let id = append(&other, "s7", b"live").await;
    for f in (7..FOLLOWERS).step_by(STREAMS) {
        assert_eq!(next(&mut follows[f]).await, id);
    }
    assert!(
        read_connections(&store) <= 4,
        "{}",
        read_connections(&store)
    );
    assert!(probe.is_running());
    drop(follows);
    assert_eq!(store.open_follows(), 0);
    eventually("the watcher ending", || !probe.is_running()).await;
    store.close().await;
    other.close().await;
}

#[tokio::test]
async fn follow_intervals_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    for options in [
        SqliteOptions::new(&path).follow_poll_interval(Duration::ZERO),
        SqliteOptions::new(&path).follow_recheck(Duration::from_micros(10)),
    ] {
        match SqliteStore::open_with(options).await {
            Err(Error::Config(_)) => {}
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("an interval under 1 ms was accepted"),
        }
    }
    let url = format!(
        "sqlite://{}?follow_poll_ms=5&follow_recheck_ms=250",
        path.display()
    );
    let options = SqliteOptions::from_url(&url).unwrap();
    assert_eq!(options.follow_poll_interval, Duration::from_millis(5));
    assert_eq!(options.follow_recheck, Duration::from_millis(250));
    for bad in [
        "follow_poll_ms=0",
        "follow_recheck_ms=-1",
        "follow_poll_ms=",
    ] {
        let url = format!("sqlite://{}?{bad}", path.display());
        assert!(
            matches!(SqliteOptions::from_url(&url), Err(Error::Config(_))),
            "{bad} was accepted"
        );
    }
}

#[tokio::test]
async fn a_deleted_stream_ends_its_followers_with_events_purged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = open(&path, Duration::from_millis(10)).await;
    let other = open(&path, HOUR).await;
    let mut start = append(&store, "s", b"start").await;
    // Deleted through the follower's own handle (the writer wakes it), and
    // through another handle (the watcher sees the row go).
    for deleter in [&store, &other] {
        let mut follow = follow(&store, &start).await;
        deleter.delete_stream("s").await.unwrap();
        match tokio::time::timeout(GUARD, follow.events.next()).await {
            Ok(Some(Err(Error::EventsPurged { .. }))) => {}
            Ok(other) => panic!(
                "expected EventsPurged, got {:?}",
                other.map(|e| e.map(|e| e.id))
            ),
            Err(_) => panic!("the follower of a deleted stream waited {GUARD:?}"),
        }
        drop(follow);
        // Started again under a new incarnation, for the next round.
        let restarted = append(&store, "s", b"again").await;
        assert_ne!(restarted.position.major, start.position.major);
        start = restarted;
    }
    store.close().await;
    other.close().await;
}
