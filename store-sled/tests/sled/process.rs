//! Tests with a second process: the database lock (one process at a
//! time), and what the shared SIGKILL case (`acknowledged_events_survive_sigkill`
//! in `event_suite.rs`, C10) does not cover: one stream written by
//! many writers at once and streams deleted and started again all along,
//! killed under `Flush` durability, where no id is ever acknowledged twice
//! (C2) and numbering goes on after everything acknowledged; and under
//! `Interval` durability, where acknowledged events may be lost by design
//! but their ids are never reissued.
//!
//! The child processes are this test binary run again on an ignored helper
//! test ([`test_child`]), told what to do through environment variables.
//! Each is owned by a [`ChildGuard`] that kills it (SIGKILL) and reaps it
//! when dropped, so a failing test never leaves one behind; every child
//! also exits on its own after a minute.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store_conformance::testkit::{ChildGuard, test_child, test_path};
use mcp_event_store_core::backend::dense::position;
use mcp_event_store_core::{Error, EventId, EventStore, NewEvent};
use mcp_event_store_sled::{Durability, SledOptions, SledStore};

const CHILD_DIR: &str = "MCP_EVENT_STORE_SLED_TEST_DIR";
const CHILD_INTERVAL_MS: &str = "MCP_EVENT_STORE_SLED_TEST_INTERVAL_MS";
/// A child never outlives this, even if nobody kills it.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);
/// One stream shared by many writers, and streams deleted and started
/// again every [`CHURN_LIFE`] events.
const HOT_WRITERS: usize = 8;
const CHURN_STREAMS: usize = 2;
const CHURN_LIFE: u64 = 3;
/// Acknowledgements to see before pulling the plug.
const KILL_AFTER_ACKS: usize = 400;
/// What a child prints before each acknowledged id.
const ACK: &str = "ACK ";

/// A child process and the lines it prints; killed and reaped on drop.
struct Child {
    process: ChildGuard,
    lines: mpsc::Receiver<String>,
}

impl Child {
    /// Runs the ignored helper test `name` in a new process.
    fn spawn(name: &str, dir: &Path, env: &[(&str, String)]) -> Self {
        let mut command = test_child(&test_path(module_path!(), name)).expect("test binary path");
        command
            .env(CHILD_DIR, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut process = ChildGuard::spawn(&mut command).expect("spawn the child process");
        let stdout = process.take_stdout().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { process, lines }
    }

    /// The next line the child printed, or `None` on EOF or timeout.
    fn next_line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Waits for a line ending in `want`.
    fn expect_line(&self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.next_line(left) {
                // libtest may have printed `test <name> ... ` on the same line.
                Some(line) if line.ends_with(want) => return,
                Some(_) => {}
                None => break,
            }
        }
        panic!("the child never printed {want:?}");
    }

    /// SIGKILLs the child and waits for it to be gone.
    fn kill(&mut self) {
        self.process.kill();
    }

    /// Every line still in the pipe, to EOF (call after [`kill`](Self::kill)).
    fn drain(&self) -> Vec<String> {
        let mut rest = Vec::new();
        while let Some(line) = self.next_line(Duration::from_secs(10)) {
            rest.push(line);
        }
        rest
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The directory a child was given, or `None` when run as a normal test.
fn child_dir() -> Option<std::path::PathBuf> {
    std::env::var_os(CHILD_DIR).map(Into::into)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Child: opens the database, says READY and holds it until killed.
#[test]
#[ignore = "helper: run as a child process by another_process_holding_the_database_is_a_clear_error"]
fn child_holds_the_database() {
    let Some(dir) = child_dir() else { return };
    runtime().block_on(async {
        let _store = SledStore::open(&dir, SledOptions::default())
            .await
            .expect("child opens the database");
        say("READY");
        tokio::time::sleep(CHILD_LIFETIME).await;
    });
}

/// Child: appends as fast as it can from several tasks (all of the `hot`
/// ones to one stream) and prints every acknowledged id as
/// `ACK <stream> <id> <payload>`. The `churn-*` writers
/// delete their stream after every [`CHURN_LIFE`] events, so it starts new
/// lives all along.
#[test]
#[ignore = "helper: run as a child process by the crash tests"]
fn child_appends_until_killed() {
    let Some(dir) = child_dir() else { return };
    let durability = match std::env::var(CHILD_INTERVAL_MS) {
        Ok(ms) => Durability::Interval(Duration::from_millis(ms.parse().expect("interval"))),
        Err(_) => Durability::Flush,
    };
    runtime().block_on(async move {
        let store = SledStore::open(&dir, SledOptions::default().durability(durability))
            .await
            .expect("child opens the database");
        let mut writers = Vec::new();
        let streams = (0..HOT_WRITERS)
            .map(|_| "hot".to_string())
            .chain((0..CHURN_STREAMS).map(|s| format!("churn-{s}")));
        for (w, stream) in streams.enumerate() {
            let store = store.clone();
            writers.push(tokio::spawn(async move {
                for i in 0u64.. {
                    let payload = format!("{w}-{i}");
                    let id = store
                        .store_event(&stream, NewEvent::new(payload.as_bytes()))
                        .await
                        .expect("append");
                    say(&format!("{ACK}{stream} {id} {payload}"));
                    if stream.starts_with("churn") && i % CHURN_LIFE == CHURN_LIFE - 1 {
                        store.delete_stream(&stream).await.expect("delete");
                    }
                }
            }));
        }
        tokio::time::sleep(CHILD_LIFETIME).await;
    });
}

#[test]
fn another_process_holding_the_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child::spawn("child_holds_the_database", dir.path(), &[]);
    child.expect_line("READY", Duration::from_secs(60));

    let rt = runtime();
    let opened = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            SledStore::open(dir.path(), SledOptions::default()),
        )
        .await
        .expect("opening a locked database must fail at once, not hang")
    });
    match opened {
        Err(err @ Error::Backend { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains("locked by another process"),
                "unclear message: {message}"
            );
            let source = std::error::Error::source(&err).expect("the source is kept");
            assert!(
                std::error::Error::source(source).is_some(),
                "the sled error is kept under it"
            );
        }
        Err(other) => panic!("expected a backend error, got {other:?}"),
        Ok(_) => panic!("opened a database another process holds"),
    }

    // Once the holder is gone, the database opens normally.
    child.kill();
    rt.block_on(async {
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .expect("open after the other process died");
        store.close().await.unwrap();
    });
}

/// Acknowledged ids per stream, in acknowledgement order, with payloads.
type Acks = BTreeMap<String, Vec<(EventId, String)>>;

/// Runs the appending child until it acknowledged `KILL_AFTER_ACKS` events,
/// SIGKILLs it, and returns everything it acknowledged.
fn append_then_kill(dir: &Path, env: &[(&str, String)]) -> Acks {
    let mut child = Child::spawn("child_appends_until_killed", dir, env);
    let mut lines = Vec::new();
    // The churn streams whose writer deleted them at least once, so that
    // they started again before the kill: counted, not hoped for, since
    // on a loaded machine the hot writers may get most of the turns.
    let mut restarted = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines.len() < KILL_AFTER_ACKS || restarted.len() < CHURN_STREAMS {
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("the child acknowledged too little within a minute");
        match child.next_line(left) {
            Some(line) if line.contains(ACK) => {
                let (_, ack) = line.split_once(ACK).expect("just checked");
                let mut parts = ack.split(' ');
                if let (Some(stream), Some(_), Some(payload)) =
                    (parts.next(), parts.next(), parts.next())
                {
                    let i = payload
                        .rsplit('-')
                        .next()
                        .and_then(|i| i.parse::<u64>().ok());
                    if stream.starts_with("churn") && i.is_some_and(|i| i >= CHURN_LIFE) {
                        restarted.insert(stream.to_owned());
                    }
                }
                lines.push(line);
            }
            Some(_) => {}
            None => panic!("the child stopped after {} acknowledgements", lines.len()),
        }
    }
    child.kill();
    // Whatever reached the pipe before the kill was acknowledged too.
    lines.extend(child.drain().into_iter().filter(|l| l.contains(ACK)));

    let mut acks = Acks::new();
    let mut seen = HashSet::new();
    for line in lines {
        // libtest may have printed `test <name> ... ` before the first one.
        let (_, ack) = line.split_once(ACK).expect("filtered above");
        let mut parts = ack.splitn(3, ' ');
        let (Some(stream), Some(id), Some(payload)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("malformed child line {line:?}");
        };
        let id: EventId = id.parse().expect("the child printed a valid id");
        // C2: not even a deleted stream started again gets an id twice.
        assert!(seen.insert(id), "{id} was acknowledged twice ({stream})");
        acks.entry(stream.to_owned())
            .or_default()
            .push((id, payload.to_owned()));
    }
    assert_eq!(
        acks.len(),
        1 + CHURN_STREAMS,
        "expected every stream, got {acks:?}"
    );
    acks
}

/// Replays a stream of one life whole: its first event `<life>-1` is
/// checked by lookup (a replay starts after its cursor), the rest replayed.
async fn replay_whole(
    store: &SledStore,
    stream: &str,
    any_id: &EventId,
) -> (EventId, Vec<(EventId, String)>) {
    let first = EventId::new(any_id.token, position(any_id.position.major, 1));
    let found = store
        .get_stream_id_for_event_id(&first.to_string())
        .await
        .unwrap();
    assert_eq!(found.as_deref(), Some(stream), "{first} after restart");
    let replay = store
        .replay_events_after(&first.to_string())
        .await
        .unwrap_or_else(|e| panic!("replay of {first} after restart: {e}"));
    let events: Vec<_> = replay.events.try_collect().await.expect("replay");
    let events = events
        .into_iter()
        .map(|e| (e.id, String::from_utf8(e.data.to_vec()).unwrap()))
        .collect();
    (first, events)
}

/// Appends after the restart and checks the new id was never issued: it
/// sorts after every id acknowledged before the kill. Returns it.
async fn append_after_restart(
    store: &SledStore,
    stream: &str,
    acked: &[(EventId, String)],
) -> EventId {
    let next = store
        .store_event(stream, NewEvent::new(b"after restart"))
        .await
        .unwrap();
    for (id, _) in acked {
        assert!(
            next.position > id.position,
            "{stream}: new event {next} does not come after acknowledged {id}"
        );
    }
    next
}

/// Under `Flush` durability: every event acknowledged on a stream many
/// writers share survives SIGKILL, numbered densely in one life that goes
/// on after them; streams deleted and started again all along number their
/// next life after every id acknowledged; and no id was acknowledged twice
/// (checked in [`append_then_kill`]). The shared case checks one writer per
/// stream.
#[test]
fn a_shared_stream_and_restarted_streams_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let acks = append_then_kill(dir.path(), &[]);

    runtime().block_on(async {
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .expect("reopen after SIGKILL");
        for (stream, acked) in &acks {
            if stream.starts_with("churn") {
                // Earlier lives were deleted; numbering never goes back.
                append_after_restart(&store, stream, acked).await;
                continue;
            }
            let life = acked[0].0.position.major;
            assert!(
                acked.iter().all(|(id, _)| id.position.major == life),
                "{stream}: one life"
            );
            let (first, replayed) = replay_whole(&store, stream, &acked[0].0).await;
            // Dense, in order, from 1.
            for (i, (id, _)) in replayed.iter().enumerate() {
                assert_eq!(id.position, position(life, i as u64 + 2), "{stream}");
            }
            let by_id: HashMap<EventId, &String> =
                replayed.iter().map(|(id, p)| (*id, p)).collect();
            for (id, payload) in acked.iter().filter(|(id, _)| *id != first) {
                assert_eq!(
                    by_id.get(id).copied(),
                    Some(payload),
                    "{stream}: acknowledged {id} is missing or changed after SIGKILL"
                );
            }
            // Numbering continues after everything acknowledged, in this life.
            let next = append_after_restart(&store, stream, acked).await;
            assert_eq!(next.position.major, life, "{stream}: {next}");
        }
        store.close().await.unwrap();
    });
}

#[test]
fn interval_mode_never_reissues_an_acknowledged_id_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let acks = append_then_kill(dir.path(), &[(CHILD_INTERVAL_MS, "200".into())]);

    runtime().block_on(async {
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .expect("reopen after SIGKILL");
        for (stream, acked) in &acks {
            if stream.starts_with("churn") {
                let lives: HashSet<u64> = acked.iter().map(|(id, _)| id.position.major).collect();
                assert!(
                    lives.len() > 1,
                    "{stream}: the child never started it again"
                );
            }
            // Every stream starts a new life, past every incarnation handed
            // out before the kill, lost ones included.
            let fresh = append_after_restart(&store, stream, acked).await;
            assert_eq!(
                fresh.position.minor, 1,
                "{stream}: the unclean relaxed shutdown was not detected ({fresh})"
            );
            for (id, _) in acked {
                // From any acknowledged id, a client either gets a replay
                // that includes the new event, or is told to start over.
                match store.replay_events_after(&id.to_string()).await {
                    Ok(replay) => {
                        let events: Vec<_> = replay.events.try_collect().await.unwrap();
                        assert!(
                            events.iter().any(|e| e.id == fresh),
                            "{stream}: replay after {id} silently skips {fresh}"
                        );
                    }
                    Err(Error::EventsPurged { .. } | Error::UnknownEventId { .. }) => {}
                    Err(other) => panic!("replay after {id}: {other}"),
                }
            }
        }
        store.close().await.unwrap();
    });
}
