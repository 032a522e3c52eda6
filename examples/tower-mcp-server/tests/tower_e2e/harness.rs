//! Stores to run against, and server processes to run on them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_event_store::testing::UrlHarness;

/// A store URL for one test, and what to clean up after it.
pub struct Fixture {
    url: String,
    storage: Box<dyn UrlHarness>,
}

impl Fixture {
    /// Private storage on the backend named `name`, from the facade's
    /// test list (`mcp_event_store::testing::storage`): a temporary file,
    /// or a schema or key prefix of its own on the test server, removed
    /// afterwards.
    pub async fn on(name: &str) -> Self {
        let storage = mcp_event_store::testing::storage(name)
            .await
            .unwrap_or_else(|| panic!("no test storage for {name}: is its feature on?"));
        assert!(
            storage.shared_across_processes(),
            "{name} cannot be shared by two server processes"
        );
        Self {
            url: storage.url(),
            storage,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Removes what the test stored. (If the test panicked first, the
    /// storage's guard removes it when dropped.)
    pub async fn teardown(self) {
        self.storage.remove().await;
    }
}

/// The environment variable that makes this test binary a server process.
pub const CHILD_ENV: &str = "TOWER_MCP_SERVER_E2E_ARGS";

/// How long a test server's lease keeps it alive: short, so the case
/// of a killed server ends soon.
pub const TEST_LEASE_MS: u64 = 1_500;

/// The most lines of a server's log kept to print when a case fails.
const LOG_LINES: usize = 400;

/// The server in a child process (this test binary, re-executed to run
/// `child_server`) on a free loopback port, killed by its pid when
/// dropped. Its log (stderr) is kept, and printed if the case fails.
pub struct ChildServer {
    child: Child,
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl ChildServer {
    /// A server on `store_url`.
    pub fn start(store_url: &str) -> Self {
        Self::spawn(&[
            "--store".to_owned(),
            store_url.to_owned(),
            "--task-lease-ms".to_owned(),
            TEST_LEASE_MS.to_string(),
        ])
    }

    /// A server on `store_url` with `extra` arguments.
    pub fn start_with(store_url: &str, extra: &[&str]) -> Self {
        let mut args = vec![
            "--store".to_owned(),
            store_url.to_owned(),
            "--task-lease-ms".to_owned(),
            TEST_LEASE_MS.to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        Self::spawn(&args)
    }

    fn spawn(args: &[String]) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "child_server",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, args.join("\u{1f}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the server process");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let keeping = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut kept = keeping.lock().unwrap_or_else(|p| p.into_inner());
                if kept.len() == LOG_LINES {
                    kept.remove(0);
                }
                kept.push(line);
            }
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (found, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("LISTENING ") {
                    let _ = found.send(line[at + "LISTENING ".len()..].trim().to_owned());
                }
            }
        });
        let mut server = Self {
            child,
            url: String::new(),
            log,
        };
        server.url = url
            .recv_timeout(Duration::from_secs(60))
            .expect("the server process reports its address");
        server
    }

    /// Waits (at most [`EVENTUALLY`](crate::wire::EVENTUALLY)) until the
    /// server has logged a line containing every one of `needles`.
    pub async fn logs(&self, needles: &[&str]) {
        let found = || {
            let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            log.iter()
                .any(|line| needles.iter().all(|needle| line.contains(needle)))
        };
        tokio::time::timeout(crate::wire::EVENTUALLY, async {
            while !found() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server at {} never logged {needles:?}", self.url));
    }

    /// `SIGKILL`s the server and waits for it to die.
    pub fn kill(mut self) {
        self.child.kill().expect("kill the server process");
        let status = self.child.wait().expect("wait for the server process");
        assert!(!status.success(), "killed, not exited");
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            eprintln!(
                "--- log of the server at {} (pid {}), last {} lines:\n{}",
                self.url,
                self.child.id(),
                log.len(),
                log.join("\n")
            );
        }
    }
}
