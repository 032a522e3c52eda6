//! Redis server processes for the tests that need their own: fault tests
//! (SIGKILL, client kills, slow replies) and a three-master cluster.
//!
//! Each process is owned by a [`RedisProcess`] on a
//! [`ChildGuard`](mcp_event_store_conformance::testkit::ChildGuard), which kills it
//! by pid on drop, also when the test panics. The shared cluster lives for
//! the whole test binary and is torn down by an `atexit` hook, since statics
//! are never dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mcp_event_store_conformance::testkit::ChildGuard;

/// One `redis-server` process, killed (SIGKILL, by pid) when dropped.
pub struct RedisProcess {
    child: Option<ChildGuard>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisProcess {
    /// Starts `redis-server` on `port`, with its files in `dir`, no RDB
    /// snapshots, and `extra` arguments; waits until it answers.
    pub fn start(dir: &Path, port: u16, extra: &[&str]) -> Self {
        let mut process = Self {
            child: None,
            port,
            dir: dir.to_owned(),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        let log = self.dir.join(format!("redis-{}.log", self.port));
        let child = ChildGuard::spawn(
            Command::new("redis-server")
                .arg("--port")
                .arg(self.port.to_string())
                .args([
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--protected-mode",
                    "no",
                ])
                .arg("--dir")
                .arg(&self.dir)
                .arg("--logfile")
                .arg(&log)
                .args(&self.extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("redis-server must be on PATH for these tests");
        self.child = Some(child);
        self.wait_ready(&log);
    }

    fn wait_ready(&mut self, log: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ping(&self.url()).is_ok() {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && !child.is_running()
            {
                let status = child
                    .wait()
                    .map_or_else(|e| e.to_string(), |status| status.to_string());
                panic!(
                    "redis-server on port {} exited with {status}; log:\n{}",
                    self.port,
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends `signal` to the server (by pid): `SIGSTOP` freezes it, as a
    /// partitioned or stalled node, until `SIGCONT`.
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("the server is running");
        let pid = i32::try_from(child.pid()).expect("pid fits an i32");
        // SAFETY: kill(2) on the pid of our own child. Its guard reaps it
        // only when killed (which takes the guard out of `self.child`) or
        // when `is_running` finds it exited, which `wait_ready` turns into a
        // panic before `start` returns; so it has not been reaped and the
        // pid cannot belong to another process.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal}) failed");
    }

    /// SIGKILLs the server (by pid) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Starts the server again with the same port, directory and arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

/// `PING` through a plain synchronous connection.
pub fn ping(url: &str) -> redis::RedisResult<String> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    redis::cmd("PING").query(&mut conn)
}

/// Runs one command on the server at `url` through a fresh connection.
pub fn command<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    cmd.query(&mut conn)
}

/// Waits until the primary at `url` streams writes to at least one replica
/// that acknowledges them: a write, then `WAIT 1 100`, until it counts one.
/// (A replica is "online" before that: Redis 7 starts streaming to a replica
/// synchronised without disk only after its first `REPLCONF ACK`, which
/// may take a second.) On a cluster node, the probe key is one of the keys
/// that node owns.
pub fn wait_replica_acknowledges(url: &str) {
    let client = redis::Client::open(url).expect("primary URL");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("a connection to the primary");
    let key = (0..10_000)
        .map(|i| format!("replica-probe-{i}"))
        .find(|key| {
            redis::cmd("SET")
                .arg(key)
                .arg(1)
                .query::<()>(&mut conn)
                .is_ok()
        })
        .expect("a key this node owns");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .query(&mut conn)
            .expect("SET");
        let acked: u64 = redis::cmd("WAIT")
            .arg(1)
            .arg(100)
            .query(&mut conn)
            .expect("WAIT");
        if acked >= 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no replica of {url} acknowledged a write within 30 s"
        );
    }
}

/// A loopback port that is free now, and whose cluster bus port (+10000) is
/// free too.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if port > 55_000 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A cluster of three masters on loopback ports, slots split evenly.
pub struct Cluster {
    nodes: Vec<RedisProcess>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts three `redis-server --cluster-enabled yes` processes, joins them
    /// with `redis-cli --cluster create`, and waits for `cluster_state:ok` on
    /// every node.
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// Starts three masters with `replicas` replicas each (placed by
    /// `redis-cli --cluster create --cluster-replicas`), and waits until
    /// every replica is in sync.
    pub fn start_with_replicas(replicas: usize) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut nodes = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            let port = free_port();
            let conf = dir.path().join(format!("nodes-{port}.conf"));
            let conf = conf.to_str().expect("UTF-8 temp path").to_owned();
            nodes.push(RedisProcess::start(
                dir.path(),
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "5000",
                    "--appendonly",
                    "no",
                    // Replicas sync at once (the default waits 5 s for more).
                    "--repl-diskless-sync-delay",
                    "0",
                ],
            ));
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be on PATH for the cluster tests");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Self { nodes, _dir: dir };
        cluster.wait_ok();
        if replicas > 0 {
            for url in cluster.master_urls() {
                wait_replica_acknowledges(&url);
            }
        }
        cluster
    }

    /// The masters' plain URLs, from `CLUSTER NODES`.
    pub fn master_urls(&self) -> Vec<String> {
        let topology: String = command(&self.nodes[0].url(), redis::cmd("CLUSTER").arg("NODES"))
            .expect("CLUSTER NODES");
        topology
            .lines()
            .filter(|line| {
                line.split_whitespace()
                    .nth(2)
                    .is_some_and(|f| f.contains("master"))
            })
            .filter_map(|line| {
                let address = line.split_whitespace().nth(1)?;
                let port = address.split(['@', ',']).next()?.rsplit(':').next()?;
                Some(format!("redis://127.0.0.1:{port}"))
            })
            .collect()
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        for node in &self.nodes {
            loop {
                let info: String =
                    command(&node.url(), redis::cmd("CLUSTER").arg("INFO")).unwrap_or_default();
                let replication: String =
                    command(&node.url(), redis::cmd("INFO").arg("replication")).unwrap_or_default();
                let synced = replication.contains("role:master")
                    || replication.contains("master_link_status:up");
                // Every node sees all the replicas as replicas.
                let topology: String =
                    command(&node.url(), redis::cmd("CLUSTER").arg("NODES")).unwrap_or_default();
                let replicas = topology.lines().filter(|l| l.contains("slave")).count();
                let placed = replicas == self.nodes.len() - 3;
                if info.contains("cluster_state:ok") && info.contains(&known) && synced && placed {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster did not reach cluster_state:ok within 30 s: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Each node's plain URL (for inspecting what it holds).
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisProcess::url).collect()
    }

    /// The node processes, in start order.
    pub fn nodes(&self) -> &[RedisProcess] {
        &self.nodes
    }
}

static CLUSTER: OnceLock<Mutex<Option<Cluster>>> = OnceLock::new();

extern "C" fn stop_shared_cluster() {
    if let Some(cluster) = CLUSTER.get() {
        let taken = match cluster.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(taken);
    }
}

/// The cluster shared by every test of this binary: started on first use,
/// killed (and its directory removed) when the test process exits.
pub fn shared_cluster() -> (String, Vec<String>) {
    let cell = CLUSTER.get_or_init(|| {
        let cluster = Cluster::start();
        // SAFETY: registers a plain `extern "C" fn` with no arguments; it only
        // locks a static mutex and kills child processes.
        let registered = unsafe { libc::atexit(stop_shared_cluster) };
        assert_eq!(registered, 0, "atexit registration failed");
        Mutex::new(Some(cluster))
    });
    let guard = cell.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = guard.as_ref().expect("the cluster is running until exit");
    (cluster.url(), cluster.node_urls())
}
