//! The `mcp-event-store` binary run as a process, as an operator runs it:
//! exit codes, what it prints, and its failure paths.
//!
//! The memory tests always run. Each persistent backend compiled in runs one
//! scenario (seeded through the facade, then stats, streams, replay, tail,
//! purge, delete-stream and check through the binary) on its test storage
//! (`mcp_event_store::for_each_backend!` and `testing::storage`: no list
//! here); the server-backed ones find their server as the backends' own
//! tests do.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command as StdCommand, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

/// Longest any one command may take before the test fails instead of
/// hanging.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

fn cli() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcp-event-store"));
    cmd.timeout(COMMAND_TIMEOUT);
    cmd
}

/// What one run gave: exit code, stdout and stderr as text.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn run(args: &[&str]) -> Run {
    run_with_stdin(args, "")
}

fn run_with_stdin(args: &[&str], stdin: &str) -> Run {
    cli()
        .args(args)
        .write_stdin(stdin)
        .output()
        .expect("the binary runs")
        .into()
}

/// Runs a command that must succeed (exit 0 with nothing on stderr).
fn ok(args: &[&str]) -> String {
    let run = run(args);
    assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
    assert!(run.stderr.is_empty(), "{args:?}: {run:?}");
    run.stdout
}

/// The lines of JSON-lines output, parsed.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect()
}

/// A failure as the CLI must report one: exit 2, nothing on stdout, one
/// `error:` line on stderr mentioning `needle`, no panic or Debug dump.
fn assert_error_line(run: &Run, needle: &str) {
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert!(run.stderr.starts_with("error: "), "{run:?}");
    assert!(run.stderr.contains(needle), "wanted {needle:?}: {run:?}");
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    assert!(!run.stderr.contains(" { "), "a Debug dump: {run:?}");
}

// ---------------------------------------------------------------- memory

#[test]
fn check_on_memory_warns_with_the_remedy_and_exits_1() {
    let text = run(&["check", "memory://"]);
    assert_eq!(text.code, Some(1), "{text:?}");
    assert!(text.stdout.contains("backend:        memory"), "{text:?}");
    assert!(
        text.stdout
            .contains("warn  persistence = none (process memory)"),
        "{text:?}"
    );
    assert!(
        text.stdout.contains("      remedy: use sqlite://"),
        "{text:?}"
    );
    assert!(text.stdout.ends_with("1 warning\n"), "{text:?}");

    let json = run(&["check", "memory://", "--json"]);
    assert_eq!(json.code, Some(1), "{json:?}");
    let report: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["backend"], "memory");
    assert_eq!(report["healthy"], false);
    assert_eq!(report["settings"][0]["name"], "persistence");
    assert_eq!(report["settings"][0]["verdict"], "warn");
    assert!(report["settings"][0]["remedy"].is_string());
}

#[test]
fn stats_on_an_empty_store() {
    let text = ok(&["stats", "memory://"]);
    assert_eq!(
        text,
        "streams: 0\nevents:  0\nbytes:   0 (0 B)\noldest:  -\nnewest:  -\n"
    );
    let json: Value = serde_json::from_str(&ok(&["stats", "memory://", "--json"])).unwrap();
    assert_eq!(json["streams"], 0);
    assert_eq!(json["events"], 0);
    assert_eq!(json["bytes"], 0);
    assert!(json["oldest"].is_null() && json["newest"].is_null());
}

#[test]
fn streams_on_an_empty_store() {
    let table = ok(&["streams", "memory://"]);
    assert_eq!(table.lines().count(), 1, "only the header: {table:?}");
    assert!(table.contains("EVENTS") && table.contains("STREAM"));
    assert_eq!(
        ok(&["streams", "memory://", "--json", "--sort", "size"]),
        ""
    );
    let zero = run(&["streams", "memory://", "--limit", "0"]);
    assert_eq!(zero.code, Some(2), "{zero:?}");
}

#[test]
fn purge_on_an_empty_store() {
    assert_eq!(
        ok(&["purge", "memory://"]),
        "purged 0 events, 0 streams and 0 sessions\n\
         tasks: 0 expired and 0 orphaned (0 with no run left) marked failed, 0 deleted, 0 lapsed instances forgotten\n"
    );
}

#[test]
fn a_malformed_event_id_is_one_error_line() {
    for command in ["replay", "tail"] {
        let run = run(&[command, "memory://", "not-an-event-id"]);
        assert_error_line(&run, "unknown event id \"not-an-event-id\"");
    }
    let long = "x".repeat(10_000);
    assert_error_line(&run(&["replay", "memory://", &long]), "unknown event id");
}

#[test]
fn an_unknown_scheme_or_no_url_is_one_error_line() {
    assert_error_line(&run(&["stats", "nosuch://x"]), "\"nosuch\"");
    assert_error_line(&run(&["check", "events.db"]), "no scheme");
}

/// A URL whose backend is not compiled in says which feature to enable
/// (each scheme `connect` knows whose backend this build lacks).
#[test]
fn a_backend_not_compiled_in_names_its_feature() {
    let compiled: Vec<&str> = mcp_event_store::backends()
        .iter()
        .map(|backend| backend.feature)
        .collect();
    for (scheme, feature) in mcp_event_store::KNOWN_SCHEMES {
        if !compiled.contains(feature) {
            let run = run(&["stats", &format!("{scheme}://127.0.0.1:1/x")]);
            assert_error_line(&run, &format!("enable the `{feature}` cargo feature"));
        }
    }
}

#[test]
fn delete_stream_without_yes_refuses_anything_but_yes() {
    for answer in ["n\n", "\n", "", "nope\n", "yess\n"] {
        let run = run_with_stdin(&["delete-stream", "memory://", "s"], answer);
        assert_eq!(run.code, Some(1), "answer {answer:?}: {run:?}");
        assert!(run.stdout.is_empty(), "{run:?}");
        assert!(
            run.stderr
                .starts_with("delete stream \"s\" and its 0 events? [y/N] "),
            "{run:?}"
        );
        assert!(run.stderr.ends_with("not deleted\n"), "{run:?}");
    }
    for answer in ["y\n", "YES\n"] {
        let run = run_with_stdin(&["delete-stream", "memory://", "s"], answer);
        assert_eq!(run.code, Some(0), "answer {answer:?}: {run:?}");
        assert_eq!(run.stdout, "deleted stream \"s\" (0 events)\n");
    }
}

/// A reader that has gone before anything is written (`| head -0`): the
/// command still ends quietly, without an error line or a panic.
#[test]
fn a_reader_that_went_away_gets_no_error() {
    let mut child = StdCommand::new(env!("CARGO_BIN_EXE_mcp-event-store"))
        .args(["stats", "memory://"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");
}

// ------------------------------------------------- persistent backends
//
// Everything below needs a backend feature; the scenario is shared.

/// A `tail` process, killed (by pid, through `Child::kill`) when dropped so
/// a failing test leaves nothing running; its stdout lines arrive on a
/// channel so the test can wait for them with a deadline.
#[allow(dead_code)]
struct TailProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

#[allow(dead_code)]
impl TailProcess {
    fn start(args: &[&str]) -> Self {
        let mut child = StdCommand::new(env!("CARGO_BIN_EXE_mcp-event-store"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("tail printed a line within 30 s")
    }

    /// Sends SIGINT (what Ctrl-C sends) by pid and waits for the exit.
    fn interrupt(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = StdCommand::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -INT {pid}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "tail did not exit within 20 s of SIGINT"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TailProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(dead_code)]
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// What `seed` stored: the ids of stream `big`, and when `old` was written.
#[allow(dead_code)]
struct Seeded {
    big: [String; 3],
    old_millis: i64,
}

/// Stores, through the facade, with one handle and a manual clock:
/// `old` (2 events of 1 byte, two hours ago), then `big` (a two-line
/// message, a priming event with `retry` 2 s, 3 bytes that are not UTF-8:
/// 20 bytes), `mid` (11 bytes) and `small` (1 byte), now. Closes the store
/// (its runtime too) before returning, so the binary is its only user.
#[allow(dead_code)]
fn seed(url: &str) -> Seeded {
    use mcp_event_store::{ManualClock, NewEvent, StoreOptions};
    use std::sync::Arc;

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let two_hours = Duration::from_secs(2 * 60 * 60);
    let old_millis = (now - two_hours).as_millis() as i64;
    let clock = Arc::new(ManualClock::new(old_millis as u64));
    block_on(async {
        let store =
            mcp_event_store::connect_with(url, StoreOptions::default().clock(clock.clone()))
                .await
                .unwrap_or_else(|e| panic!("seeding {url}: {e}"));
        for _ in 0..2 {
            store.store_event("old", NewEvent::new(b"o")).await.unwrap();
        }
        clock.advance(two_hours);
        let mut big = Vec::new();
        for event in [
            NewEvent::new(b"line one\nline two"),
            NewEvent::priming(Duration::from_secs(2)),
            NewEvent::new(&[0xff, 0xfe, b'a']),
        ] {
            big.push(store.store_event("big", event).await.unwrap().to_string());
        }
        store
            .store_event("mid", NewEvent::new(b"hello"))
            .await
            .unwrap();
        store
            .store_event("mid", NewEvent::new(b"world!"))
            .await
            .unwrap();
        store
            .store_event("small", NewEvent::new(b"x"))
            .await
            .unwrap();
        drop(store);
        Seeded {
            big: big.try_into().unwrap(),
            old_millis,
        }
    })
}

/// Appends one event to `big` through a new handle (while `tail` runs).
#[allow(dead_code)]
fn append_live(url: &str) {
    use mcp_event_store::NewEvent;
    block_on(async {
        let store = mcp_event_store::connect(url).await.unwrap();
        store
            .store_event("big", NewEvent::new(b"live"))
            .await
            .unwrap();
    });
}

/// `keys` on a store written through the sealing decorator under key 1,
/// then under key 2 (key 1 kept to read), with one event written around
/// the decorator.
#[allow(dead_code)]
fn keys_scenario(url: &str) {
    use mcp_event_store::{EventStore, NewEvent, SessionStore};
    use mcp_event_store_sealed::{KEYS_ENV, KeyRing, Sealed};

    let (one, two) = (
        KeyRing::generate_key().unwrap(),
        KeyRing::generate_key().unwrap(),
    );
    let old_ring = format!("1:{}", *one);
    let new_ring = format!("2:{},1:{}", *two, *one);
    block_on(async {
        let plain = mcp_event_store::connect(url).await.unwrap();
        let old = Sealed::new(plain.clone(), old_ring.parse().unwrap());
        for data in [&b"one"[..], b"two"] {
            old.store_event("a", NewEvent::new(data)).await.unwrap();
        }
        let new = Sealed::new(plain.clone(), new_ring.parse().unwrap());
        new.store_event("a", NewEvent::new(b"three")).await.unwrap();
        new.store_event("b", NewEvent::priming(Duration::from_secs(1)))
            .await
            .unwrap();
        plain
            .store_event("plain", NewEvent::new(b"{}"))
            .await
            .unwrap();
        old.put_session("session-1", b"state", Duration::from_secs(3600))
            .await
            .unwrap();
    });

    // An event written around the decorator: reported, exit 1.
    let run_json = run(&["keys", url, "--json"]);
    assert_eq!(run_json.code, Some(1), "{run_json:?}");
    let report: Value = serde_json::from_str(&run_json.stdout).unwrap();
    assert_eq!(
        (report["streams"].as_u64(), report["events"].as_u64()),
        (Some(3), Some(5))
    );
    assert_eq!(report["not_sealed"], 1, "{report}");
    assert_eq!(report["unreadable"], Value::Null, "{report}");
    let keys = report["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{report}");
    assert_eq!(
        (keys[0]["key"].as_u64(), keys[0]["events"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(
        (keys[1]["key"].as_u64(), keys[1]["events"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(keys[1]["streams"], 2, "{report}");
    // The default retention's hour after the newest stream time.
    let newest = keys[1]["newest_millis"].as_i64().unwrap();
    assert_eq!(
        keys[1]["ages_out_by_millis"].as_i64(),
        Some(newest + 3_600_000)
    );

    ok(&["delete-stream", url, "plain", "--yes"]);
    let text = ok(&["keys", url, "--batch", "1"]);
    assert!(
        text.starts_with(
            "4 events in 2 streams, 1 session, 0 task values\nkey 1: 2 events in 1 stream, "
        ),
        "{text}"
    );
    assert!(text.contains("\nkey 2: 2 events in 2 streams, "), "{text}");
    assert!(text.contains("ages out by 20"), "{text}");
    assert!(text.contains("\nnot sealed: 0\n"), "{text}");

    // --verify opens every event with the ring in the environment.
    let verify = |ring: &str| -> Run {
        cli()
            .args(["keys", url, "--verify", "--json"])
            .env(KEYS_ENV, ring)
            .output()
            .expect("the binary runs")
            .into()
    };
    let whole = verify(&new_ring);
    assert_eq!(whole.code, Some(0), "{whole:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&whole.stdout).unwrap()["unreadable"],
        0
    );
    let without_one = verify(&format!("2:{}", *two));
    assert_eq!(without_one.code, Some(1), "{without_one:?}");
    // Key 1's two events and its session.
    assert_eq!(
        serde_json::from_str::<Value>(&without_one.stdout).unwrap()["unreadable"],
        3
    );
    let missing = run(&[
        "keys",
        url,
        "--verify",
        "--keys-env",
        "MCP_EVENT_STORE_NO_SUCH_VAR",
    ]);
    assert_error_line(&missing, "MCP_EVENT_STORE_NO_SUCH_VAR");

    // --rewrite re-seals what key 1 sealed under key 2, while the store is
    // open; then the ring without key 1 opens every session, and every
    // event where the backend rewrites events in place.
    let rewrite = cli()
        .args(["keys", url, "--rewrite", "--json", "--batch", "1"])
        .env(KEYS_ENV, &new_ring)
        .output()
        .expect("the binary runs");
    let rewrite = Run::from(rewrite);
    assert_eq!(rewrite.code, Some(0), "{rewrite:?}");
    let report: Value = serde_json::from_str(&rewrite.stdout).unwrap();
    let done = &report["rewrite"];
    assert_eq!(done["sessions"]["resealed"], 1, "{report}");
    let in_place = done["events_in_place"].as_bool().unwrap();
    if in_place {
        assert_eq!(done["events"]["resealed"], 2, "{report}");
    } else {
        assert_eq!(done["events_left"], 2, "{report}");
    }
    let keys = report["keys"].as_array().unwrap();
    assert_eq!(keys.last().unwrap()["key"], 2, "{report}");
    assert_eq!(keys.last().unwrap()["sessions"], 1, "{report}");
    let after = verify(&format!("2:{}", *two));
    let unreadable = if in_place { 0 } else { 2 };
    assert_eq!(
        serde_json::from_str::<Value>(&after.stdout).unwrap()["unreadable"],
        unreadable,
        "{after:?}"
    );
    let text = Run::from(
        cli()
            .args(["keys", url, "--rewrite"])
            .env(KEYS_ENV, &new_ring)
            .output()
            .expect("the binary runs"),
    );
    assert!(
        text.stdout
            .starts_with("rewrite, sessions: 1 read, 0 re-sealed, 1 already current"),
        "{text:?}"
    );
}

/// The whole scenario on a persistent store at `url`. `backend` is the name
/// `check` reports; `shared` says whether other processes may write while
/// `tail` holds the store open (not sled, which locks its directory).
/// The digests of the tasks `tasks_scenario` seeds, by name.
#[allow(dead_code)]
struct SeededTasks {
    /// Alice's `deploy`, on the live instance, two runs.
    deploy: String,
    /// Bob's `report`, waiting for input `ok`.
    asking: String,
    /// An anonymous `deploy` on the lapsed instance, its one run lost.
    lost: String,
    /// Alice's `sync` on the lapsed instance, waiting for a claim.
    waiting: String,
    /// A completed `report`.
    done: String,
    /// `deploy`'s id, which a command takes too.
    deploy_id: String,
    live: String,
    gone: String,
}

/// Seeds tasks on two instances, one retired (lapsed at once), and the
/// live one's card, through the facade; closes the store.
#[allow(dead_code)]
fn seed_tasks(url: &str) -> SeededTasks {
    use mcp_event_store::runtime::{InstanceCard, TaskCall};
    use mcp_event_store::task::{Finish, InstanceId, NewTask, Owner, WorkerChange};

    block_on(async {
        let store = mcp_event_store::connect(url).await.unwrap();
        let runtime = store.task_runtime();
        let (live, gone) = (
            InstanceId::generate().unwrap(),
            InstanceId::generate().unwrap(),
        );
        runtime
            .heartbeat(live, Duration::from_secs(86_400))
            .await
            .unwrap();
        runtime
            .heartbeat(gone, Duration::from_secs(600))
            .await
            .unwrap();
        InstanceCard::new(live, "test-server 9.9", 1_000)
            .announce(&*store)
            .await
            .unwrap();
        let alice = Owner::principal(b"alice").unwrap();
        let bob = Owner::principal(b"bob").unwrap();
        let call = |tool: &str| TaskCall::new(tool, serde_json::json!({})).encode();
        let (deploy, report, sync) = (call("deploy"), call("report"), call("sync"));
        let deploy_task = store
            .create(NewTask::new(&alice, live).context(&deploy).takeover(2))
            .await
            .unwrap()
            .0;
        let asking = store
            .create(NewTask::new(&bob, live).context(&report))
            .await
            .unwrap()
            .0;
        runtime
            .apply(
                &asking,
                live,
                WorkerChange::RequestInput {
                    key: "ok",
                    request: b"{}",
                },
            )
            .await
            .unwrap();
        let lost = store
            .create(
                NewTask::new(&Owner::Anonymous, gone)
                    .context(&deploy)
                    .takeover(1),
            )
            .await
            .unwrap()
            .0;
        let waiting = store
            .create(NewTask::new(&alice, gone).context(&sync).takeover(3))
            .await
            .unwrap()
            .0;
        let done = store
            .create(NewTask::new(&bob, live).context(&report))
            .await
            .unwrap()
            .0;
        runtime
            .apply(&done, live, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await
            .unwrap();
        assert!(runtime.retire(gone).await.unwrap());
        drop(store);
        SeededTasks {
            deploy: deploy_task.digest().to_string(),
            asking: asking.digest().to_string(),
            lost: lost.digest().to_string(),
            waiting: waiting.digest().to_string(),
            done: done.digest().to_string(),
            deploy_id: deploy_task.to_string(),
            live: live.to_string(),
            gone: gone.to_string(),
        }
    })
}

/// The `task` field of each JSON line, sorted.
#[allow(dead_code)]
fn tasks_in(text: &str) -> Vec<String> {
    let mut tasks: Vec<String> = json_lines(text)
        .iter()
        .map(|line| line["task"].as_str().unwrap().to_owned())
        .collect();
    tasks.sort();
    tasks
}

#[allow(dead_code)]
fn sorted(mut names: Vec<&String>) -> Vec<String> {
    names.sort();
    names.into_iter().cloned().collect()
}

/// What an operator asks of tasks and instances, through the binary:
/// listing by status, tool, owner and instance, one task whole, the stuck
/// report, a requeue and its refusal, a cancel and its confirmation, and
/// the instances with their tasks and version.
#[allow(dead_code)]
fn tasks_scenario(url: &str) {
    let t = seed_tasks(url);
    let all = ok(&["tasks", url, "--json"]);
    assert_eq!(
        tasks_in(&all),
        sorted(vec![&t.deploy, &t.asking, &t.lost, &t.waiting, &t.done])
    );
    let line = |text: &str, task: &str| {
        json_lines(text)
            .into_iter()
            .find(|line| line["task"] == task)
            .unwrap_or_else(|| panic!("{task} in {text}"))
    };
    let lost = line(&all, &t.lost);
    assert_eq!(lost["status"], "failed");
    assert_eq!(lost["owner"], "anonymous");
    assert_eq!(lost["tool"], "deploy");
    assert_eq!(lost["instance"], t.gone.as_str());
    assert_eq!(lost["instance_alive"], false);
    assert_eq!(line(&all, &t.asking)["outstanding"][0], "ok");

    let working = ok(&["tasks", url, "--status", "working", "--json"]);
    assert_eq!(tasks_in(&working), sorted(vec![&t.deploy, &t.waiting]));
    let deploys = ok(&["tasks", url, "--tool", "deploy", "--json"]);
    assert_eq!(tasks_in(&deploys), sorted(vec![&t.deploy, &t.lost]));
    let alice = ok(&["tasks", url, "--owner", "alice", "--json"]);
    assert_eq!(tasks_in(&alice), sorted(vec![&t.deploy, &t.waiting]));
    let on_gone = ok(&["tasks", url, "--instance", &t.gone, "--json"]);
    assert_eq!(tasks_in(&on_gone), sorted(vec![&t.lost, &t.waiting]));
    let table = ok(&["tasks", url, "--status", "input-required"]);
    assert!(table.starts_with("TASK"), "{table}");
    assert!(
        table.contains(&t.asking) && table.contains("report"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 2, "{table}");

    let shown: Value = serde_json::from_str(&ok(&["task", url, &t.waiting, "--json"])).unwrap();
    assert_eq!(shown["takeover"]["attempt"], 1);
    assert_eq!(shown["takeover"]["max_attempts"], 3);
    assert_eq!(shown["instance_alive"], false);
    let text = ok(&["task", url, &t.deploy_id]);
    assert!(text.contains(&format!("task:      {}", t.deploy)), "{text}");
    assert!(text.contains("attempt 1 of 2"), "{text}");

    let quiet = run(&["stuck", url, "--json"]);
    assert_eq!(quiet.code, Some(0), "nothing waits long yet: {quiet:?}");
    let stuck = run(&[
        "stuck",
        url,
        "--claim-after",
        "0",
        "--input-after",
        "0",
        "--json",
    ]);
    assert_eq!(stuck.code, Some(1), "{stuck:?}");
    assert_eq!(tasks_in(&stuck.stdout), sorted(vec![&t.asking, &t.waiting]));
    let waiting = line(&stuck.stdout, &t.waiting);
    assert!(
        waiting["stuck"][0]
            .as_str()
            .unwrap()
            .starts_with("waiting for a claim"),
        "{waiting}"
    );

    let refused = run(&["requeue", url, &t.done]);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stdout.contains("the task is completed, not failed"),
        "{refused:?}"
    );
    let requeued = ok(&["requeue", url, &t.lost]);
    assert!(requeued.contains("requeued"), "{requeued}");
    let back: Value = serde_json::from_str(&ok(&["task", url, &t.lost, "--json"])).unwrap();
    assert_eq!(back["status"], "working");
    assert_eq!(back["takeover"]["released"], true);

    let asked = run_with_stdin(&["cancel", url, &t.asking], "n\n");
    assert_eq!(asked.code, Some(1), "{asked:?}");
    assert!(asked.stderr.ends_with("not cancelled\n"), "{asked:?}");
    let cancelled = ok(&["cancel", url, &t.asking, "--reason", "maintenance", "--yes"]);
    assert!(cancelled.contains("cancelled"), "{cancelled}");
    let ended: Value = serde_json::from_str(&ok(&["task", url, &t.asking, "--json"])).unwrap();
    assert_eq!(ended["status"], "cancelled");
    assert_eq!(ended["cancel_reason"], "maintenance");

    let instances = json_lines(&ok(&["instances", url, "--json"]));
    let of = |id: &str| {
        instances
            .iter()
            .find(|line| line["instance"] == id)
            .unwrap_or_else(|| panic!("{id} in {instances:?}"))
    };
    assert_eq!(of(&t.live)["alive"], true);
    assert_eq!(of(&t.live)["version"], "test-server 9.9");
    assert_eq!(of(&t.live)["tasks"], 1, "deploy runs there");
    assert_eq!(of(&t.gone)["alive"], false);
    assert_eq!(
        of(&t.gone)["tasks"],
        2,
        "the requeued task and the waiting one"
    );
    assert!(of(&t.gone)["version"].is_null());

    assert_error_line(&run(&["task", url, "t1.nonsense"]), "names no task");
}

#[allow(dead_code)]
fn scenario(url: &str, backend: &str, shared: bool) {
    let seeded = seed(url);
    let [big1, big2, big3] = &seeded.big;

    // stats
    let stats: Value = serde_json::from_str(&ok(&["stats", url, "--json"])).unwrap();
    assert_eq!(stats["streams"], 4, "{stats}");
    assert_eq!(stats["events"], 8, "{stats}");
    assert_eq!(stats["bytes"], 34, "{stats}");
    assert_eq!(stats["oldest_millis"], seeded.old_millis, "{stats}");
    let newest = stats["newest_millis"].as_i64().unwrap();
    assert!(newest >= seeded.old_millis + 2 * 60 * 60 * 1000, "{stats}");
    let text = ok(&["stats", url]);
    assert!(text.starts_with("streams: 4\nevents:  8\nbytes:   34 (34 B)\noldest:  "));
    assert!(text.contains("Z\nnewest:  "), "{text}");

    // streams: sorted and bounded, unsorted and bounded, everything
    let by_size = json_lines(&ok(&[
        "streams", url, "--sort", "size", "--limit", "2", "--json",
    ]));
    let ids: Vec<_> = by_size.iter().map(|s| s["stream_id"].clone()).collect();
    assert_eq!(ids, ["big", "mid"]);
    assert_eq!(by_size[0]["events"], 3);
    assert_eq!(by_size[0]["bytes"], 20);
    let table = ok(&["streams", url, "--sort", "size", "--limit", "2"]);
    let rows: Vec<_> = table.lines().collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(
        rows[1].ends_with("  big") && rows[2].ends_with("  mid"),
        "{table}"
    );
    let by_age = json_lines(&ok(&[
        "streams", url, "--sort", "age", "--limit", "1", "--json",
    ]));
    assert_eq!(by_age.len(), 1);
    assert_eq!(by_age[0]["stream_id"], "old");
    assert_eq!(by_age[0]["oldest_millis"], seeded.old_millis);
    let mut all: Vec<_> = json_lines(&ok(&["streams", url, "--json"]))
        .into_iter()
        .map(|s| s["stream_id"].as_str().unwrap().to_owned())
        .collect();
    all.sort();
    assert_eq!(all, ["big", "mid", "old", "small"]);
    assert_eq!(ok(&["streams", url, "--limit", "3"]).lines().count(), 4);

    // replay: SSE text, then JSON lines
    assert_eq!(
        ok(&["replay", url, big1]),
        format!("id: {big2}\nretry: 2000\ndata:\n\nid: {big3}\ndata: \u{fffd}\u{fffd}a\n\n")
    );
    // Compared as JSON: the key order is serde_json's, which keeps
    // insertion order when a package built beside it turns on its
    // `preserve_order` (tower-mcp does).
    assert_eq!(
        json_lines(&ok(&["replay", url, big1.as_str(), "--json"])),
        [
            serde_json::json!({"data": "", "id": big2.to_string(), "retry_ms": 2000}),
            serde_json::json!({"data_base64": "//5h", "id": big3.to_string(), "retry_ms": null}),
        ]
    );
    assert_eq!(ok(&["replay", url, big3]), "", "nothing after the newest");
    assert_error_line(&run(&["replay", url, "nope"]), "unknown event id");

    // tail: the stored events, a live one where another process can write,
    // then Ctrl-C ends it cleanly.
    let tail = TailProcess::start(&["tail", url, big1, "--json"]);
    assert_eq!(json_lines(&tail.next_line())[0]["id"], big2.as_str());
    assert_eq!(json_lines(&tail.next_line())[0]["id"], big3.as_str());
    if shared {
        append_live(url);
        assert_eq!(json_lines(&tail.next_line())[0]["data"], "live");
    }
    let status = tail.interrupt();
    assert!(status.success(), "tail after SIGINT: {status}");
    let live = u64::from(shared);

    // purge: `old` is past the default one-hour max age
    let purged = ok(&["purge", url]);
    assert!(
        purged.starts_with("purged 2 events, 1 stream and "),
        "{purged}"
    );
    let stats: Value = serde_json::from_str(&ok(&["stats", url, "--json"])).unwrap();
    assert_eq!(stats["streams"], 3, "{stats}");
    assert_eq!(stats["events"], 6 + live, "{stats}");

    // delete-stream, with --yes and with a confirmation
    assert_eq!(
        ok(&["delete-stream", url, "small", "--yes"]),
        "deleted stream \"small\" (1 event)\n"
    );
    let refused = run_with_stdin(&["delete-stream", url, "mid"], "n\n");
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("and its 2 events? [y/N]"),
        "{refused:?}"
    );
    let confirmed = run_with_stdin(&["delete-stream", url, "mid"], "y\n");
    assert_eq!(confirmed.code, Some(0), "{confirmed:?}");
    assert_eq!(confirmed.stdout, "deleted stream \"mid\" (2 events)\n");
    let left = json_lines(&ok(&["streams", url, "--json"]));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["stream_id"], "big");
    assert_eq!(left[0]["events"], 3 + live);

    // check: the exit code agrees with the report, every warning has a remedy
    let check = run(&["check", url, "--json"]);
    assert!(matches!(check.code, Some(0 | 1)), "{check:?}");
    let report: Value = serde_json::from_str(&check.stdout).unwrap();
    assert_eq!(report["backend"], backend, "{report}");
    assert!(report["format_version"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["healthy"], check.code == Some(0), "{report}");
    for setting in report["settings"].as_array().unwrap() {
        if setting["verdict"] == "warn" {
            assert!(!setting["remedy"].as_str().unwrap().is_empty(), "{setting}");
        }
    }
}

/// The scenario on each backend compiled in, on its test storage, and a
/// closed pipe. `shared`: whether another process may write while `tail`
/// holds the store open (its crate says; not sled, which locks its
/// directory).
#[allow(unused_macros)] // with no backend compiled in
macro_rules! backend_tests {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        mod $backend {
            use super::*;

            /// Private storage on this backend, removed when done.
            fn storage() -> Box<dyn mcp_event_store::testing::UrlHarness> {
                block_on(mcp_event_store::testing::storage(stringify!($backend)))
                    .expect("the backend is compiled in")
            }

            #[test]
            fn every_command() {
                let storage = storage();
                scenario(&storage.url(), stringify!($backend), backend_tests!(@$shared));
                block_on(storage.remove());
            }

            /// A reader that stops early (`| head`) ends the command
            /// quietly: the payload is larger than a pipe's buffer, so the
            /// write after the reader has gone fails with EPIPE.
            #[test]
            fn a_closed_pipe_exits_quietly() {
                use mcp_event_store::NewEvent;
                let storage = storage();
                let url = storage.url();
                let first = block_on(async {
                    let store = mcp_event_store::connect(&url).await.unwrap();
                    let first = store.store_event("s", NewEvent::new(b"a")).await.unwrap();
                    let big = vec![b'x'; 512 * 1024];
                    store.store_event("s", NewEvent::new(&big)).await.unwrap();
                    first.to_string()
                });
                let mut child = StdCommand::new(env!("CARGO_BIN_EXE_mcp-event-store"))
                    .args(["replay", &url, &first])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                drop(child.stdout.take());
                let output = child.wait_with_output().unwrap();
                assert_eq!(output.status.code(), Some(0), "{output:?}");
                assert!(output.stderr.is_empty(), "{output:?}");
                block_on(storage.remove());
            }

            #[test]
            fn tasks_and_instances_answer_an_operator() {
                let storage = storage();
                tasks_scenario(&storage.url());
                block_on(storage.remove());
            }

            #[test]
            fn keys_counts_events_by_the_key_that_sealed_them() {
                let storage = storage();
                keys_scenario(&storage.url());
                block_on(storage.remove());
            }

            backend_tests!(@server $backend);
        }
    };
    (@yes) => { true };
    (@no) => { false };
    // A server nothing listens on: one error line, within the connect
    // timeout.
    (@server postgres) => {
        #[test]
        fn an_unreachable_server_is_one_error_line() {
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
            let run = run(&["stats", &url, "--connect-timeout", "10"]);
            assert_error_line(&run, "");
        }
    };
    (@server redis) => {
        #[test]
        fn an_unreachable_server_is_one_error_line() {
            let url = format!("redis://127.0.0.1:{}", free_port());
            let run = run(&["stats", &url, "--connect-timeout", "10"]);
            assert_error_line(&run, "");
        }

        redis_server_tests!();
    };
    (@server $other:ident) => {};
}

/// A loopback port nothing listens on now.
#[allow(dead_code)]
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// The `check` of a `redis-server` of the test's own, with and without
/// persistence (where the Redis backend is compiled in, in its module).
#[allow(unused_macros)] // without the Redis backend
macro_rules! redis_server_tests {
    () => {
        use std::io::{Read, Write};
        use std::net::TcpStream;
        use std::time::Instant;

        /// A `redis-server` of our own on a free loopback port, killed (SIGKILL,
        /// by pid) when dropped, also when the test panics. The shape of
        /// the Redis backend's test `RedisProcess`, cut to what `check`
        /// needs.
        struct RedisServer {
            child: Child,
            port: u16,
            _dir: tempfile::TempDir,
        }

        impl RedisServer {
            /// Starts a server with no RDB snapshots and `extra` arguments, and
            /// waits until it answers `PING`.
            fn start(extra: &[&str]) -> Self {
                let dir = tempfile::tempdir().unwrap();
                let port = free_port();
                let child = StdCommand::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--protected-mode", "no"])
                    .arg("--dir")
                    .arg(dir.path())
                    .args(extra)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server must be on PATH for these tests");
                let mut server = Self {
                    child,
                    port,
                    _dir: dir,
                };
                server.wait_ready();
                server
            }

            fn wait_ready(&mut self) {
                let deadline = Instant::now() + Duration::from_secs(20);
                while !pings(self.port) {
                    if let Ok(Some(status)) = self.child.try_wait() {
                        panic!("redis-server on port {} exited with {status}", self.port);
                    }
                    assert!(Instant::now() < deadline, "redis-server did not answer");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }

            fn url(&self) -> String {
                format!("redis://127.0.0.1:{}", self.port)
            }
        }

        impl Drop for RedisServer {
            fn drop(&mut self) {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }

        /// `PING` over a plain socket, in RESP.
        fn pings(port: u16) -> bool {
            let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
                return false;
            };
            let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
            let mut reply = [0u8; 7];
            conn.write_all(b"PING\r\n").is_ok()
                && conn.read_exact(&mut reply).is_ok()
                && &reply == b"+PONG\r\n"
        }

        /// Settings named for persistence (`appendonly`, `appendfsync`, ...).
        fn persistence_warnings(report: &Value) -> Vec<Value> {
            report["settings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["verdict"] == "warn")
                .filter(|s| {
                    let name = s["name"].as_str().unwrap_or_default();
                    name.contains("append") || name.contains("persist") || name.contains("save")
                })
                .cloned()
                .collect()
        }

        #[test]
        fn check_warns_on_a_redis_without_persistence() {
            let server = RedisServer::start(&["--appendonly", "no"]);
            let run = run(&["check", &server.url(), "--json"]);
            assert_eq!(run.code, Some(1), "{run:?}");
            let report: Value = serde_json::from_str(&run.stdout).unwrap();
            assert_eq!(report["backend"], "redis");
            assert!(!persistence_warnings(&report).is_empty(), "{report}");
            let text = super::run(&["check", &server.url()]);
            assert_eq!(text.code, Some(1), "{text:?}");
            assert!(text.stdout.contains("remedy: "), "{text:?}");
        }

        #[test]
        fn check_gives_a_clean_bill_with_appendfsync_always() {
            let server = RedisServer::start(&[
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--maxmemory-policy",
                "noeviction",
            ]);
            let run = run(&["check", &server.url(), "--json"]);
            let report: Value = serde_json::from_str(&run.stdout).unwrap();
            assert!(persistence_warnings(&report).is_empty(), "{report}");
            assert_eq!(run.code, Some(0), "{run:?}");
            assert_eq!(report["healthy"], true, "{report}");
        }
    };
}

mcp_event_store::for_each_backend!(backend_tests);
