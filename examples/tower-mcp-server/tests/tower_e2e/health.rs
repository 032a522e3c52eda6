//! The probes, on a server process: `GET /healthz` answers 200 without
//! the store, `GET /readyz` answers 200 while the store answers and the
//! runtime's lease is current, and 503 with the failed check once the
//! store hangs (the server reaches it through a [`Gate`] the test closes),
//! then the lease lapses too; 200 again once the store is back. Neither
//! needs an MCP session, an `Authorization` header or a loopback `Host`.
//!
//! No assertion bounds a latency: each polls, under a generous guard, for
//! what must happen eventually.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{ChildServer, Fixture};

/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(90);

/// `/healthz` and `/readyz` on each backend two server processes can
/// share (the harness's), and, where the store is a server the test can put
/// a [`Gate`] before, `/readyz` as it hangs and comes back.
macro_rules! health_tests {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = no) => {};
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = yes) => {
        mod $backend {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn healthz_and_readyz_answer_200_on_a_healthy_store() {
                let fixture = $crate::harness::Fixture::on(stringify!($backend)).await;
                super::healthy(&fixture).await;
                fixture.teardown().await;
            }

            health_tests!(@gated $backend);
        }
    };
    (@gated postgres) => { health_tests!(@gated_case postgres); };
    (@gated redis) => { health_tests!(@gated_case redis); };
    (@gated nats) => { health_tests!(@gated_case nats); };
    (@gated $other:ident) => {};
    (@gated_case $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn readyz_answers_503_while_the_store_hangs_and_200_once_it_is_back() {
            let fixture = $crate::harness::Fixture::on(stringify!($backend)).await;
            super::store_hangs_then_comes_back(&fixture).await;
            fixture.teardown().await;
        }
    };
}

mcp_event_store::for_each_backend!(health_tests);

/// A healthy server: `/healthz` says `ok`, `/readyz` (soon) `ready`,
/// whatever `Host` and with no MCP headers.
pub async fn healthy(fixture: &Fixture) {
    let server = ChildServer::start(fixture.url());
    let probe = Probe::of(&server.url);
    let (status, body) = probe.get("/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    probe
        .until("/readyz", "ready on a healthy store", |status, body| {
            status == 200 && body == "ready\n"
        })
        .await;
    // Not a loopback `Host` (the kubelet sends the pod's address): `/mcp`
    // would refuse it, the probes do not look.
    let pod = probe.as_host("10.1.2.3:8000");
    let (status, body) = pod.get("/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    pod.until("/readyz", "ready, whatever the Host", |status, _| {
        status == 200
    })
    .await;
    server.kill();
}

/// A server whose store hangs: `/readyz` answers 503 naming the store
/// (it does not hang with it), and, once no renewal reached the store for
/// a lease, the lease too, while `/healthz` still answers 200; once the
/// store is back, `/readyz` answers 200 again.
pub async fn store_hangs_then_comes_back(fixture: &Fixture) {
    let gate = Gate::before(fixture.url());
    let server = ChildServer::start(&gate.url);
    let probe = Probe::of(&server.url);
    probe
        .until("/readyz", "ready through the open gate", |status, _| {
            status == 200
        })
        .await;

    gate.close();
    let (_, body) = probe
        .until("/readyz", "503 naming the store", |status, body| {
            status == 503 && body.contains("store: no answer")
        })
        .await;
    assert!(body.starts_with("not ready\n"), "{body}");
    let (status, body) = probe.get("/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"), "alive all the same");
    probe
        .until("/readyz", "503 naming the lapsed lease", |status, body| {
            status == 503 && body.contains("lease: not current")
        })
        .await;

    gate.open();
    probe
        .until("/readyz", "ready once the store is back", |status, _| {
            status == 200
        })
        .await;
    server.kill();
}

/// GETs on a server's probes.
#[derive(Clone)]
struct Probe {
    /// `http://host:port`, without `/mcp`.
    base: String,
    /// The `Host` header sent, if not the URL's.
    host: Option<String>,
    client: reqwest::Client,
}

impl Probe {
    /// The probes of the server whose MCP endpoint is `mcp_url`.
    fn of(mcp_url: &str) -> Self {
        let base = mcp_url
            .strip_suffix("/mcp")
            .unwrap_or_else(|| panic!("an MCP endpoint at /mcp: {mcp_url}"))
            .to_owned();
        // The timeout guards against a probe that hangs with its store
        // (what `/readyz` must not do); never a latency bound.
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        Self {
            base,
            host: None,
            client,
        }
    }

    /// The same probes, sent with `Host: host`.
    fn as_host(&self, host: &str) -> Self {
        Self {
            host: Some(host.to_owned()),
            ..self.clone()
        }
    }

    /// `GET path`: the status and the body.
    async fn get(&self, path: &str) -> (u16, String) {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(host) = &self.host {
            request = request.header("Host", host);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path} of {} answers: {e}", self.base));
        let status = response.status().as_u16();
        (status, response.text().await.expect("a text body"))
    }

    /// Polls `GET path` until `done` holds for its status and body; that
    /// answer.
    async fn until(
        &self,
        path: &str,
        what: &str,
        done: impl Fn(u16, &str) -> bool,
    ) -> (u16, String) {
        let deadline = Instant::now() + EVENTUALLY;
        loop {
            let (status, body) = self.get(path).await;
            if done(status, &body) {
                return (status, body);
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {EVENTUALLY:?}; {path} last answered {status}: {body:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A TCP forwarder on loopback between a server process and its store's
/// server, which the test closes and opens again. Closed, it forwards
/// nothing either way on any connection, old or new (what it reads is
/// held): the store hangs, as a database behind a broken network does.
/// Opened again, what it held goes on. Dropping it cuts every connection.
struct Gate {
    /// The store's URL through the gate.
    url: String,
    open: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl Gate {
    /// An open gate before the server `store_url` names (a URL with a
    /// host, a port or the scheme's usual one, and no other host).
    fn before(store_url: &str) -> Self {
        let (scheme, rest) = store_url.split_once("://").expect("a URL");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let (userinfo, host_port) = match authority.rfind('@') {
            Some(at) => authority.split_at(at + 1),
            None => ("", authority),
        };
        assert!(!host_port.contains(','), "one host: {store_url}");
        let usual = match scheme {
            "postgres" | "postgresql" => 5432,
            "redis" => 6379,
            "nats" => 4222,
            other => panic!("no usual port for {other}"),
        };
        let (host, port) = match host_port.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                (host, port.parse().expect("a port number"))
            }
            _ => (host_port, usual),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let upstream = (host, port)
            .to_socket_addrs()
            .expect("the store's address")
            .next()
            .expect("an address of the store");
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        listener
            .set_nonblocking(true)
            .expect("a nonblocking listener");
        let addr = listener.local_addr().expect("the gate's address");
        let gate = Self {
            url: format!("{scheme}://{userinfo}{addr}{path}"),
            open: Arc::new(AtomicBool::new(true)),
            stop: Arc::new(AtomicBool::new(false)),
            sockets: Arc::default(),
        };
        let (open, stop, sockets) = (gate.open.clone(), gate.stop.clone(), gate.sockets.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let ends = [&client, &server].map(|end| {
                    let _ = end.set_nonblocking(false);
                    let _ = end.set_nodelay(true);
                    end.try_clone()
                });
                let [Ok(client_end), Ok(server_end)] = ends else {
                    continue;
                };
                {
                    let mut sockets = sockets.lock().unwrap_or_else(|p| p.into_inner());
                    sockets.extend(
                        [client_end.try_clone(), server_end.try_clone()]
                            .into_iter()
                            .flatten(),
                    );
                }
                forward(client, server_end, open.clone(), stop.clone());
                forward(server, client_end, open.clone(), stop.clone());
            }
        });
        gate
    }

    /// From now on, nothing goes through.
    fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }

    /// From now on, everything goes through again, what was held first.
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        for socket in sockets.iter() {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to` on a thread of its own while the gate is open,
/// holding what it read while it is closed.
fn forward(mut from: TcpStream, mut to: TcpStream, open: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let read = match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            while !open.load(Ordering::SeqCst) {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if to.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
