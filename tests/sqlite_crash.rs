//! C10 on SQLite: a child process appends as fast as it can and reports each
//! acknowledged id; it is killed with SIGKILL mid-flight; the database,
//! reopened, replays every acknowledged event in order.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store::sqlite::SqliteStore;
use mcp_event_store::{EventId, EventStore, NewEvent};

const CHILD_ENV: &str = "MCP_EVENT_STORE_CRASH_CHILD_DB";
const STREAMS: usize = 8;
/// Acknowledgements to wait for before the kill.
const ACKS_BEFORE_KILL: usize = 3_000;

/// Kills the child by pid when dropped, even if the test panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child: appends to several streams concurrently and prints
/// `START <stream> <id>` and `ACK <stream> <n> <id>` once each append returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of sqlite_survives_sigkill; it needs the parent's database"]
async fn crash_child_appender() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = SqliteStore::open(&path)
        .await
        .expect("child opens the store");
    let tasks: Vec<_> = (0..STREAMS)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let stream = format!("stream-{s}");
                let start = store
                    .store_event(&stream, NewEvent::new(b"start"))
                    .await
                    .expect("append");
                println!("START {stream} {start}");
                for n in 0u64.. {
                    let id = store
                        .store_event(&stream, NewEvent::new(format!("{stream}/{n}").as_bytes()))
                        .await
                        .expect("append");
                    // One write per line: the parent may only count an id once
                    // the whole line is out.
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {stream} {n} {id}").expect("stdout");
                    out.flush().expect("stdout");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("appender");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child_appender",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &db)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let mut child = KillOnDrop(child);

    let stdout = child.0.stdout.take().unwrap();
    let (lines_tx, lines) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut starts: HashMap<String, EventId> = HashMap::new();
    let mut acked: HashMap<String, Vec<(u64, EventId)>> = HashMap::new();
    let mut total = 0;
    let mut record = |line: &str| {
        // The test harness may have left "test crash_child_appender ... " at
        // the start of the child's first line.
        let line = ["START ", "ACK "]
            .iter()
            .filter_map(|tag| line.find(tag).map(|at| &line[at..]))
            .next()
            .unwrap_or(line);
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["START", stream, id] => {
                starts.insert(stream.to_string(), id.parse().unwrap());
            }
            ["ACK", stream, n, id] => {
                acked
                    .entry(stream.to_string())
                    .or_default()
                    .push((n.parse().unwrap(), id.parse().unwrap()));
                return true;
            }
            _ => {}
        }
        false
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while total < ACKS_BEFORE_KILL {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the child stopped acknowledging appends");
        if record(&line) {
            total += 1;
        }
    }

    child.0.kill().expect("SIGKILL the child");
    let status = child.0.wait().unwrap();
    assert!(!status.success(), "the child must die by the signal");
    // Acknowledgements already in the pipe count too: each was printed only
    // after its append returned.
    for line in lines.iter() {
        if record(&line) {
            total += 1;
        }
    }
    reader.join().unwrap();
    assert!(total >= ACKS_BEFORE_KILL);

    let store = SqliteStore::open(&db)
        .await
        .expect("reopen after the crash");
    for (stream, acks) in &acked {
        let start = starts[stream];
        let replay = store
            .replay_events_after(&start.to_string())
            .await
            .unwrap_or_else(|e| panic!("replay {stream}: {e}"));
        assert_eq!(&replay.stream_id, stream);
        let events: Vec<_> = replay.events.try_collect().await.unwrap();
        assert!(
            events.len() >= acks.len(),
            "{stream}: {} acknowledged, {} replayed",
            acks.len(),
            events.len()
        );
        for (event, (n, id)) in events.iter().zip(acks) {
            assert_eq!(
                event.id, *id,
                "{stream}: acknowledged event {n} replays in order"
            );
            assert_eq!(event.data, format!("{stream}/{n}").as_bytes());
        }
    }
    store.close().await;
}
