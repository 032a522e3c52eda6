//! HTTP load: the example server (`resumable-server`, rmcp's Streamable
//! HTTP transport over the store) under many MCP sessions at once, what it
//! costs the server per message, and how that compares with rmcp alone.
//!
//! Every session calls `slow_count` (20 progress notifications 50 ms apart,
//! then the result) again and again; 30% of the calls have their SSE
//! response cut after a few events and resumed at once with `GET` and
//! `Last-Event-ID`, as a client whose connection dropped. The server runs in
//! a process of its own (this bench started again with
//! `MES_HTTP_LOAD_SERVE` set), so its CPU time, read from `/proc`, is the
//! server's alone. Reported over the measured window:
//!
//! * **server CPU per message** (user + system time over the messages the
//!   server produced: 21 per completed call) and per call, and the share of
//!   one core;
//! * **call time**, from the `POST` to the result, p50 and p99 (the ideal
//!   is 20 × 50 ms = 1.0 s);
//! * **every progress step arrived exactly once** per call, resumed or not
//!   (the bench fails otherwise, as it does when no call completes in the
//!   measured window).
//!
//! # The baseline: rmcp alone
//!
//! The store's cost is the durable server's CPU per message over that of
//! the same tool served by rmcp alone, under the same load. The baseline
//! (store `rmcp-memory`) is a server process of the same kind serving the
//! same handler (`resumable_server::SlowCounter`) and the same rmcp
//! configuration as far as rmcp alone has it (its defaults, the priming
//! events' `retry` hint, behind the same `authenticate` layer), with rmcp's
//! own `LocalSessionManager::default()`: no event store, no session store,
//! no `Durable` wiring (no session scoping, no caller scoping, no
//! cross-instance listening).
//!
//! | | durable server (`sqlite`, ...) | baseline (`rmcp-memory`) |
//! |---|---|---|
//! | sessions | `LocalSessionManager` + event store, in `SessionScoped`; `initialize` in the session store | `LocalSessionManager::default()`, in memory |
//! | each SSE event | appended to the store before it is sent | kept in the request stream's in-memory ring (16 events) |
//! | `GET` + `Last-Event-ID` | replayed from the store, then followed live | replayed from the ring of the live session on this one instance, then live |
//! | handler | `SlowCounter` on the `Durable`'s tasks | `SlowCounter` on tasks of an idle in-memory runtime (below) |
//!
//! rmcp alone does resume a cut stream within a live session: without an
//! event store, `LocalSessionManager::resume` parses the event id
//! (`<index>/<http request id>`), swaps a new channel into that request
//! stream and sends what its ring still holds from that index on; the
//! bench's resumes come at once, so the ring always holds them. But it
//! starts *with* the event the `Last-Event-ID` names, which the client has
//! already (rmcp 3.11; modelcontextprotocol/rust-sdk pull request 1165
//! fixes it). So for the baseline only, the client drops the first event
//! of a resumed stream when it carries that very id, and counts it (the
//! report's "sent again" figure, `resent` in its JSON); every progress step
//! must still arrive exactly once after that, and any other repeat fails
//! the bench. From a durable server that repeat fails the bench too, and
//! from either, so does a resumed stream that ends before its first event.
//! What rmcp alone cannot do at all is what the store is for: resume once
//! the ring has moved on (a call's stream is dropped from it when its
//! result is sent), on another instance, or after a restart.
//!
//! The handler type needs a `DurableTasks` to be built, so the baseline
//! gives it one on a `memory://` runtime that no request reaches
//! (`slow_count` called without the tasks extension, as here, never
//! touches it), with its claim loop and purges turned off; only its lease
//! renewal, an in-memory write every 10 s, runs.
//!
//! Not a criterion bench: one long run is the measurement. By default it
//! runs the SQLite server, then the baseline, one after the other, prints
//! each one's figures and writes them to
//! `<criterion dir>/http_load/<label>.json` (`sqlite.json`,
//! `rmcp-memory.json`), then prints the ratio of CPU per message and per
//! call (durable / rmcp alone) for every store run beside the baseline.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench http                  # 200 sessions, 60 s: SQLite, then rmcp alone
//! MES_HTTP_LOAD_SESSIONS=50 MES_HTTP_LOAD_SECONDS=20 cargo bench -p mcp-event-store-benches --bench http
//! MES_HTTP_LOAD_STORE=rmcp-memory cargo bench -p mcp-event-store-benches --bench http   # the baseline alone
//! MES_HTTP_LOAD_STORE=redis://127.0.0.1:6379/?prefix=load cargo bench -p mcp-event-store-benches --bench http
//! MES_HTTP_LOAD_STORE=redis://127.0.0.1:6379/?prefix=load,rmcp-memory cargo bench -p mcp-event-store-benches --bench http
//! ```
//!
//! `MES_HTTP_LOAD_STORE` is a comma-separated list of store URLs (or
//! `rmcp-memory`), run in that order (default: a temporary SQLite file,
//! then `rmcp-memory`). Each report is named by its store's scheme
//! (`sqlite`, `redis`, `rmcp-memory`), or by `MES_HTTP_LOAD_LABEL`, a
//! comma-separated list with a name for each store.
//!
//! `MES_HTTP_LOAD_URL` (the endpoint) with `MES_HTTP_LOAD_PID` (its process)
//! loads one server started by hand instead, another build of it say;
//! `MES_HTTP_LOAD_LABEL` names the report (default: the scheme of the
//! first `MES_HTTP_LOAD_STORE`, else `sqlite`).
//!
//! `--test` (as `cargo bench -- --test` passes it) or
//! `MCP_EVENT_STORE_BENCH_QUICK=1` runs 8 sessions for 2 s, each store as
//! above (both by default), and writes no report.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use mcp_event_store_benches as common;
use serde_json::{Value, json};

/// Set in the server's environment: the server's command-line options.
const SERVE: &str = "MES_HTTP_LOAD_SERVE";
/// The store name of the baseline: rmcp's own in-memory session manager,
/// no store.
const BASELINE: &str = "rmcp-memory";
/// Progress steps per call, and the time between them.
const STEPS: u64 = 20;
const INTERVAL_MS: u64 = 50;
/// Messages the server produces per call: the progress notifications and
/// the result.
const MESSAGES_PER_CALL: u64 = STEPS + 1;
/// Calls out of ten whose response is cut and resumed.
const CUT_PER_TEN: u64 = 3;
/// The protocol revision the sessions speak.
const PROTOCOL: &str = "2025-11-25";
/// How long one read may wait before the bench fails.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    if let Ok(args) = std::env::var(SERVE) {
        serve(&args);
        return;
    }
    let test = std::env::args().any(|a| a == "--test") || common::quick();
    let plan = Plan::from_env(test);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let stores: Vec<String> = match std::env::var("MES_HTTP_LOAD_STORE") {
        Ok(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        Err(_) => vec![
            format!(
                "sqlite://{}",
                dir.path().join("load.db").to_str().expect("a UTF-8 path")
            ),
            BASELINE.to_owned(),
        ],
    };
    assert!(!stores.is_empty(), "MES_HTTP_LOAD_STORE: no store named");
    let targets: Vec<Target> = match (
        std::env::var("MES_HTTP_LOAD_URL"),
        std::env::var("MES_HTTP_LOAD_PID"),
    ) {
        (Ok(url), Ok(pid)) => vec![Target {
            store: None,
            baseline: false,
            url: Some((url, pid.parse().expect("MES_HTTP_LOAD_PID: a process id"))),
            label: scheme(&stores[0]).to_owned(),
        }],
        (Err(_), Err(_)) => stores
            .iter()
            .map(|store| Target {
                baseline: store == BASELINE,
                label: scheme(store).to_owned(),
                store: Some(store.clone()),
                url: None,
            })
            .collect(),
        _ => panic!("MES_HTTP_LOAD_URL and MES_HTTP_LOAD_PID go together"),
    };
    let mut targets = targets;
    if let Ok(labels) = std::env::var("MES_HTTP_LOAD_LABEL") {
        let labels: Vec<&str> = labels.split(',').map(str::trim).collect();
        assert_eq!(
            labels.len(),
            targets.len(),
            "MES_HTTP_LOAD_LABEL: one name for each server run ({:?})",
            targets.iter().map(|t| &t.label).collect::<Vec<_>>()
        );
        for (target, label) in targets.iter_mut().zip(labels) {
            target.label = label.to_owned();
        }
    }
    let runtime = common::runtime();
    let mut reports = Vec::new();
    for target in targets {
        // One server at a time: the one measured has the machine.
        let server = match (&target.url, &target.store) {
            (Some((url, pid)), _) => Server {
                child: None,
                pid: *pid,
                url: url.clone(),
            },
            (None, Some(store)) => Server::start(store),
            (None, None) => unreachable!("a target has a store or a URL"),
        };
        // For a profiler to attach to (`perf record -g -p <pid>`).
        eprintln!(
            "http_load/{}: server pid {}, {}",
            target.label, server.pid, server.url
        );
        let report = runtime.block_on(run(&plan, &server, target.baseline));
        drop(server);
        report.print(&plan, &target.label);
        if !test {
            report.save(&target.label);
        }
        reports.push((target, report));
    }
    // The store's cost: each store's figures over the baseline's.
    if let Some((baseline, base)) = reports.iter().find(|(t, _)| t.baseline) {
        for (target, report) in reports.iter().filter(|(t, _)| !t.baseline) {
            print_ratio(&target.label, report, &baseline.label, base);
        }
    }
}

/// A server the bench loads: one it starts on `store`, or one already
/// running at `url` (with its process id).
struct Target {
    store: Option<String>,
    url: Option<(String, u32)>,
    /// rmcp alone (`BASELINE`), the denominator of the ratios.
    baseline: bool,
    label: String,
}

/// A report's default name: the store URL's scheme (`rmcp-memory` for the
/// baseline).
fn scheme(store: &str) -> &str {
    store.split(':').next().unwrap_or("store")
}

/// The ratios of CPU per message and per call, `durable` over `baseline`.
fn print_ratio(label: &str, durable: &Report, base_label: &str, baseline: &Report) {
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "http_load: {label} / {base_label}: CPU per message {:.1} us / {:.1} us = {:.2}x, \
         per call {:.2} ms / {:.2} ms = {:.2}x",
        durable.cpu_per_message().as_secs_f64() * 1e6,
        baseline.cpu_per_message().as_secs_f64() * 1e6,
        ratio(durable.cpu_per_message(), baseline.cpu_per_message()),
        durable.cpu_per_call().as_secs_f64() * 1e3,
        baseline.cpu_per_call().as_secs_f64() * 1e3,
        ratio(durable.cpu_per_call(), baseline.cpu_per_call()),
    );
}

/// The server side: serve on a loopback port of the system's choosing, say
/// which on stdout, and stop when stdin closes (the bench ended or died).
/// `--store rmcp-memory` serves the baseline ([`serve_rmcp_alone`]).
fn serve(args: &str) {
    let mut options =
        resumable_server::Options::try_parse(args.split_whitespace().map(str::to_owned))
            .unwrap_or_else(|e| e.exit());
    options.bind = SocketAddr::from(([127, 0, 0, 1], 0));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(options.bind)
            .await
            .expect("a loopback port");
        println!("listening {}", listener.local_addr().expect("an address"));
        let stdin_closed = async {
            // Blocking read on a thread of its own: EOF when the bench goes.
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = String::new();
                while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            })
            .await;
        };
        let served = if options.store == BASELINE {
            serve_rmcp_alone(options, listener, stdin_closed).await
        } else {
            resumable_server::serve(options, listener, stdin_closed).await
        };
        if let Err(error) = served {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    });
}

/// The baseline: `resumable-server`'s handler served by rmcp alone, with
/// rmcp's own in-memory `LocalSessionManager` and no store, until
/// `shutdown`.
async fn serve_rmcp_alone(
    options: resumable_server::Options,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use mcp_event_store::rmcp::{DurableTasks, Runtime};
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    // `SlowCounter` needs tasks to be built: an in-memory runtime that
    // `slow_count` without the tasks extension never reaches, claiming
    // nothing and purging nothing.
    let idle = Runtime::builder(mcp_event_store::connect("memory://").await?)
        .claim_every(Duration::from_secs(24 * 3600))
        .purge_every(None)
        .start()
        .await?;
    let handler =
        resumable_server::SlowCounter::new(DurableTasks::builder().build(&idle), &options);
    // What the durable server's config has that rmcp alone has too: rmcp's
    // defaults, the priming events' retry hint, the `Host` check.
    let mut config = StreamableHttpServerConfig::default().with_sse_retry(Some(options.retry));
    if let Some(hosts) = resumable_server::allowed_hosts(&options) {
        config = config.with_allowed_hosts(hosts);
    }
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.sse_retry = Some(options.retry);
    let service =
        StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(sessions), config);
    let app =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::map_request(|request| {
                std::future::ready(resumable_server::authenticate(request))
            }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// How many sessions, for how long.
struct Plan {
    sessions: usize,
    warm_up: Duration,
    measure: Duration,
}

impl Plan {
    fn from_env(test: bool) -> Self {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|v| {
                    v.parse()
                        .unwrap_or_else(|_| panic!("{name}: not a number: {v:?}"))
                })
                .unwrap_or(default)
        };
        if test {
            return Self {
                sessions: 8,
                warm_up: Duration::from_millis(500),
                measure: Duration::from_secs(2),
            };
        }
        Self {
            sessions: number("MES_HTTP_LOAD_SESSIONS", 200) as usize,
            warm_up: Duration::from_secs(number("MES_HTTP_LOAD_WARM_UP_SECONDS", 5)),
            measure: Duration::from_secs(number("MES_HTTP_LOAD_SECONDS", 60)),
        }
    }
}

/// The server process: started by the bench and killed by pid when
/// dropped (also when the bench panics), or one already running.
struct Server {
    child: Option<Child>,
    pid: u32,
    url: String,
}

impl Server {
    /// Starts this bench again as the server on `store` (a store URL, or
    /// [`BASELINE`]).
    fn start(store: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this executable"))
            .env(SERVE, format!("--store {store}"))
            .env("RUST_LOG", "warn,rmcp=error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server");
        let mut stdout = BufReader::new(child.stdout.take().expect("its stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the server's address");
        let Some(address) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            panic!("the server did not start: {line:?}");
        };
        Self {
            url: format!("http://{address}/mcp"),
            pid: child.id(),
            child: Some(child),
        }
    }

    /// The server's CPU time so far (user + system, every thread).
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .expect("the server's /proc/<pid>/stat");
        // Fields after the command name (which may hold spaces); utime and
        // stime are the 14th and 15th fields, in clock ticks (USER_HZ, 100
        // on Linux).
        let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        Duration::from_millis(ticks * 10)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What every session adds up.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    resumed: AtomicU64,
    /// Events rmcp alone sent again on a resume (see [`Session::call`]).
    resent: AtomicU64,
    /// Resumed calls, in the window or not.
    resumed_in_all: AtomicU64,
    received: AtomicU64,
    call_times: std::sync::Mutex<Vec<Duration>>,
}

/// Loads `server` as `plan` says. `baseline`: the server is rmcp alone,
/// which sends the event a resume names again ([`Session::call`]).
async fn run(plan: &Plan, server: &Server, baseline: bool) -> Report {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.sessions * 2)
        .build()
        .expect("an HTTP client");
    let tally = Arc::new(Tally::default());
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut sessions = Vec::new();
    for n in 0..plan.sessions {
        let session = Session::open(http.clone(), server.url.clone(), baseline)
            .await
            .unwrap_or_else(|e| panic!("session {n}: {e}"));
        let (tally, measuring, stop) = (tally.clone(), measuring.clone(), stop.clone());
        sessions.push(tokio::spawn(async move {
            session
                .call_until(n as u64, &tally, &measuring, &stop)
                .await
        }));
    }
    tokio::time::sleep(plan.warm_up).await;
    let (cpu_before, started) = (server.cpu(), Instant::now());
    measuring.store(true, Ordering::SeqCst);
    tokio::time::sleep(plan.measure).await;
    measuring.store(false, Ordering::SeqCst);
    let (cpu, elapsed) = (server.cpu() - cpu_before, started.elapsed());
    stop.store(true, Ordering::SeqCst);
    for session in sessions {
        session
            .await
            .expect("a session task")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let mut call_times = std::mem::take(&mut *tally.call_times.lock().unwrap());
    call_times.sort();
    // Figures over nothing, or a load that never resumed, measure nothing:
    // fail rather than report them.
    assert!(
        !call_times.is_empty(),
        "no call completed in the measured window ({:?})",
        plan.measure
    );
    assert!(
        tally.resumed_in_all.load(Ordering::SeqCst) > 0,
        "no call was cut and resumed"
    );
    Report {
        cpu,
        elapsed,
        calls: tally.calls.load(Ordering::SeqCst),
        resumed: tally.resumed.load(Ordering::SeqCst),
        received: tally.received.load(Ordering::SeqCst),
        resent: tally.resent.load(Ordering::SeqCst),
        baseline,
        call_times,
    }
}

/// One MCP session speaking the wire protocol.
struct Session {
    http: reqwest::Client,
    url: String,
    id: String,
    /// The server sends the event a resume names again (rmcp alone).
    resends: bool,
}

impl Session {
    async fn open(http: reqwest::Client, url: String, resends: bool) -> Result<Self, String> {
        let response = http
            .post(&url)
            .header("MCP-Protocol-Version", PROTOCOL)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": PROTOCOL, "capabilities": {},
                    "clientInfo": {"name": "http-load", "version": "1"}}})
                .to_string(),
            )
            .send()
            .await
            .map_err(|e| format!("initialize: {e}"))?;
        let id = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .ok_or("initialize: no session id")?
            .to_owned();
        let mut events = Events::new(response);
        while events.next().await?.is_some() {}
        let session = Self {
            http,
            url,
            id,
            resends,
        };
        let status = session
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?
            .status();
        if status != reqwest::StatusCode::ACCEPTED {
            return Err(format!("notifications/initialized: HTTP {status}"));
        }
        Ok(session)
    }

    async fn post(&self, message: Value) -> Result<reqwest::Response, String> {
        self.http
            .post(&self.url)
            .header("MCP-Protocol-Version", PROTOCOL)
            .header("Mcp-Session-Id", &self.id)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(message.to_string())
            .send()
            .await
            .map_err(|e| format!("POST: {e}"))
    }

    async fn resume(&self, last_event_id: &str) -> Result<Events, String> {
        let response = self
            .http
            .get(&self.url)
            .header("MCP-Protocol-Version", PROTOCOL)
            .header("Mcp-Session-Id", &self.id)
            .header("Accept", "text/event-stream")
            .header("Last-Event-ID", last_event_id)
            .send()
            .await
            .map_err(|e| format!("GET: {e}"))?;
        match response.status() {
            reqwest::StatusCode::OK => Ok(Events::new(response)),
            status => Err(format!("resume after {last_event_id}: HTTP {status}")),
        }
    }

    /// Calls `slow_count` until `stop`; counts what lands in the measured
    /// window.
    async fn call_until(
        &self,
        session: u64,
        tally: &Tally,
        measuring: &AtomicBool,
        stop: &AtomicBool,
    ) -> Result<(), String> {
        let mut call = 0u64;
        while !stop.load(Ordering::SeqCst) {
            call += 1;
            // Which calls are cut, and after how many progress steps, is
            // spread evenly over sessions and calls.
            let turn = session * 7 + call;
            let cut_after = (turn % 10 < CUT_PER_TEN).then_some(1 + turn % (STEPS - 1));
            let started = Instant::now();
            let in_window = measuring.load(Ordering::SeqCst);
            let (received, resent) = self
                .call(call, cut_after)
                .await
                .map_err(|e| format!("session {session}, call {call}: {e}"))?;
            tally
                .resumed_in_all
                .fetch_add(cut_after.is_some() as u64, Ordering::Relaxed);
            if in_window && measuring.load(Ordering::SeqCst) {
                tally.calls.fetch_add(1, Ordering::Relaxed);
                tally
                    .resumed
                    .fetch_add(cut_after.is_some() as u64, Ordering::Relaxed);
                tally.received.fetch_add(received, Ordering::Relaxed);
                tally.resent.fetch_add(resent, Ordering::Relaxed);
                tally.call_times.lock().unwrap().push(started.elapsed());
            }
        }
        Ok(())
    }

    /// One call, cut after `cut_after` progress steps and resumed if asked;
    /// the messages received, and the events the server sent again. Fails
    /// unless every step arrives exactly once and the result last, and when
    /// a resumed stream ends before its first event.
    ///
    /// rmcp alone (3.11, `LocalSessionManager` without an event store)
    /// starts a resume *with* the event its `Last-Event-ID` names, which
    /// the client already has (the fix is modelcontextprotocol/rust-sdk pull
    /// request 1165). For the baseline (`self.resends`), that one event,
    /// the resumed stream's first and with that very id, is dropped and
    /// counted; any other repeat still fails. From any other server it
    /// fails the call.
    async fn call(&self, id: u64, cut_after: Option<u64>) -> Result<(u64, u64), String> {
        let response = self
            .post(
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "slow_count",
                "arguments": {"count": STEPS, "interval_ms": INTERVAL_MS},
                "_meta": {"progressToken": id}}}),
            )
            .await?;
        let mut events = Events::new(response);
        let mut seen = 0u64;
        let mut received = 0u64;
        let mut last_id: Option<String> = None;
        // The `Last-Event-ID` of the stream read, until its first event.
        let mut resumed_from: Option<String> = None;
        let mut resent = 0u64;
        loop {
            let Some(event) = events.next().await? else {
                if let Some(from) = &resumed_from {
                    return Err(format!("the resume after {from} ended with no event"));
                }
                let last = last_id.clone().ok_or("the stream ended before any event")?;
                events = self.resume(&last).await?;
                resumed_from = Some(last);
                continue;
            };
            if let Some(from) = resumed_from.take()
                && event.id.as_deref() == Some(from.as_str())
            {
                if !self.resends {
                    return Err(format!("the resume after {from} sent {from} again"));
                }
                resent += 1;
                continue;
            }
            if event.id.is_some() {
                last_id = event.id;
            }
            let Some(message) = event.message else {
                continue;
            };
            received += 1;
            if message["id"] == json!(id) {
                if message.get("result").is_none() || seen != STEPS {
                    return Err(format!("answered after {seen} steps: {message}"));
                }
                return Ok((received, resent));
            }
            if message["method"] == "notifications/progress" {
                let step = message["params"]["progress"].as_f64().unwrap_or(-1.0) as u64;
                if step != seen + 1 {
                    return Err(format!("step {step} after step {seen}"));
                }
                seen = step;
                if cut_after == Some(seen) {
                    let last = last_id.clone().ok_or("no event id to resume from")?;
                    events = self.resume(&last).await?;
                    resumed_from = Some(last);
                }
            }
        }
    }
}

/// One SSE event: its id, and its JSON-RPC message if it has one.
struct Event {
    id: Option<String>,
    message: Option<Value>,
}

/// An SSE response body, read event by event.
struct Events {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Events {
    fn new(response: reqwest::Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            buffer: Vec::new(),
        }
    }

    /// The next event with any field; `None` when the body ends.
    async fn next(&mut self) -> Result<Option<Event>, String> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = std::str::from_utf8(&block).map_err(|e| format!("SSE: {e}"))?;
                let (mut id, mut data) = (None, String::new());
                for line in text.lines().filter(|l| !l.starts_with(':')) {
                    match line.split_once(':') {
                        Some(("id", value)) => id = Some(value.trim_start().to_owned()),
                        Some(("data", value)) => data.push_str(value.trim_start()),
                        _ => {}
                    }
                }
                if id.is_none() && data.is_empty() {
                    continue;
                }
                let message = if data.is_empty() {
                    None
                } else {
                    Some(serde_json::from_str(&data).map_err(|e| format!("SSE data: {e}"))?)
                };
                return Ok(Some(Event { id, message }));
            }
            match tokio::time::timeout(READ_TIMEOUT, self.body.next()).await {
                Err(_) => return Err(format!("no SSE event within {READ_TIMEOUT:?}")),
                Ok(Some(Ok(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Some(Err(e))) => return Err(format!("reading SSE: {e}")),
                Ok(None) => return Ok(None),
            }
        }
    }
}

/// The figures of one run.
struct Report {
    cpu: Duration,
    elapsed: Duration,
    calls: u64,
    resumed: u64,
    received: u64,
    /// Events the server sent again on a resume, dropped (rmcp alone).
    resent: u64,
    baseline: bool,
    call_times: Vec<Duration>,
}

impl Report {
    fn percentile(&self, p: f64) -> Duration {
        if self.call_times.is_empty() {
            return Duration::ZERO;
        }
        let at = ((self.call_times.len() - 1) as f64 * p).round() as usize;
        self.call_times[at]
    }

    fn messages(&self) -> u64 {
        self.calls * MESSAGES_PER_CALL
    }

    fn cpu_per_message(&self) -> Duration {
        self.cpu / self.messages().max(1) as u32
    }

    fn cpu_per_call(&self) -> Duration {
        self.cpu / self.calls.max(1) as u32
    }

    fn print(&self, plan: &Plan, label: &str) {
        println!(
            "http_load/{label}: {} sessions, {:.1} s: {} calls ({} cut and resumed), \
             {} messages received",
            plan.sessions,
            self.elapsed.as_secs_f64(),
            self.calls,
            self.resumed,
            self.received
        );
        println!(
            "  server CPU {:.2} s ({:.0}% of a core): {:.1} us per message, {:.2} ms per call",
            self.cpu.as_secs_f64(),
            100.0 * self.cpu.as_secs_f64() / self.elapsed.as_secs_f64(),
            self.cpu_per_message().as_secs_f64() * 1e6,
            self.cpu_per_call().as_secs_f64() * 1e3
        );
        println!(
            "  call time p50 {:.3} s, p99 {:.3} s (ideal {:.3} s)",
            self.percentile(0.5).as_secs_f64(),
            self.percentile(0.99).as_secs_f64(),
            (STEPS * INTERVAL_MS) as f64 / 1e3
        );
        if self.baseline {
            println!(
                "  rmcp alone sent the event named by Last-Event-ID again on {} of {} resumes \
                 (dropped by the client, not counted as received)",
                self.resent, self.resumed
            );
        }
    }

    fn save(&self, label: &str) {
        let dir = common::criterion_dir().join("http_load");
        std::fs::create_dir_all(&dir).expect("the report directory");
        let figures = json!({
            "seconds": self.elapsed.as_secs_f64(),
            "calls": self.calls,
            "resumed": self.resumed,
            "received": self.received,
            "resent": self.resent,
            "server_cpu_s": self.cpu.as_secs_f64(),
            "cpu_per_message_us": self.cpu_per_message().as_secs_f64() * 1e6,
            "cpu_per_call_ms": self.cpu_per_call().as_secs_f64() * 1e3,
            "call_p50_s": self.percentile(0.5).as_secs_f64(),
            "call_p99_s": self.percentile(0.99).as_secs_f64(),
        });
        std::fs::write(dir.join(format!("{label}.json")), format!("{figures}\n"))
            .expect("write the report");
    }
}
