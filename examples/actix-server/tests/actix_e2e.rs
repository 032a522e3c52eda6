//! The actix-web server end to end, over real HTTP on loopback: two
//! instances in this process on one SQLite file, driven by
//! resumable-server's wire-level client (its `tests/rmcp_e2e/wire.rs`).
//!
//! A call streams progress from A; the client drops the connection after a
//! few events; B, started only then on the same store, restores the session
//! and resumes the stream (`GET` + `Last-Event-ID` + `Mcp-Session-Id`):
//! every missed event once, in order, then the result. No timing is
//! asserted: each wait is bounded only so that a failure ends the test.

use std::sync::mpsc;
use std::time::Duration;

use reqwest::StatusCode;
use resumable_server::Options;
use tokio::sync::oneshot;

#[allow(dead_code)]
#[path = "../../resumable-server/tests/rmcp_e2e/wire.rs"]
mod wire;

use wire::{Client, Event};

/// Steps of the slow tool.
const COUNT: u64 = 8;
/// Milliseconds between steps.
const INTERVAL_MS: u64 = 60;
/// Progress notifications read before the connection is dropped.
const DROP_AFTER: u64 = 3;
/// The JSON-RPC id of the tool call.
const CALL: u64 = 2;
/// The caller the client authenticates as (the example's stand-in:
/// its `Authorization` header).
const ALICE: &str = "Bearer alice";
/// "Must happen eventually" guard for the whole test; never a latency
/// bound.
const EVENTUALLY: Duration = Duration::from_secs(120);

/// The actix-web server (the library's `serve`, as the command runs it)
/// on a free loopback port, in a thread and a tokio runtime of its own, as
/// another process would be; shut down when dropped.
struct ActixServer {
    url: String,
    base: String,
    /// Resolves the server's `shutdown` when sent or dropped.
    stop: Option<oneshot::Sender<()>>,
    /// What `serve` returned, once it has.
    served: mpsc::Receiver<Result<(), String>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ActixServer {
    fn start(store: &str) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let options = Options {
            store: store.to_owned(),
            retry: Duration::from_millis(100),
            ..Options::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (done, served) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a tokio runtime");
            let shutdown = async move {
                let _ = stopped.await;
            };
            let result = runtime
                .block_on(actix_mcp_server::serve(options, listener, shutdown))
                .map_err(|e| e.to_string());
            let _ = done.send(result);
        });
        Self {
            url: format!("{base}/mcp"),
            base,
            stop: Some(stop),
            served,
            thread: Some(thread),
        }
    }

    /// Shuts the server down and waits (at most [`EVENTUALLY`]) until it
    /// has: what `serve` returned, `None` the second time.
    fn shut_down(&mut self) -> Option<Result<(), String>> {
        let thread = self.thread.take()?;
        drop(self.stop.take());
        let served = self
            .served
            .recv_timeout(EVENTUALLY)
            .unwrap_or_else(|e| Err(format!("the server did not stop: {e}")));
        if served.is_ok() {
            let _ = thread.join();
        }
        Some(served)
    }

    /// Stops the server; it must have served and stopped cleanly.
    fn stop(mut self) {
        let served = tokio::task::block_in_place(|| self.shut_down());
        served
            .expect("running")
            .expect("the server served and stopped cleanly");
    }
}

impl Drop for ActixServer {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

/// Starts the call, reads the priming event and `DROP_AFTER` progress
/// notifications, and drops the connection; the id of the last event read.
async fn call_and_drop(client: &Client) -> String {
    let mut sse = client.call_slow_count(CALL, COUNT, INTERVAL_MS).await;
    let priming = sse.next().await.expect("a priming event");
    assert!(priming.data.is_empty(), "priming first: {priming:?}");
    let mut last_id = priming.id.expect("the priming event has an id");
    for step in 1..=DROP_AFTER {
        let event = sse.next().await.expect("progress before the drop");
        assert_eq!(event.progress(), Some(step), "{event:?}");
        last_id = event.id.expect("every stored event has an id");
    }
    drop(sse);
    last_id
}

/// The events after progress `DROP_AFTER`: exactly the remaining progress
/// notifications, then the result, each once, in order, each with an id of
/// its own.
fn assert_exact_tail(events: &[Event]) {
    let messages: Vec<&Event> = events.iter().filter(|e| !e.data.is_empty()).collect();
    let progress: Vec<Option<u64>> = messages.iter().map(|e| e.progress()).collect();
    let mut expected: Vec<Option<u64>> = (DROP_AFTER + 1..=COUNT).map(Some).collect();
    expected.push(None);
    assert_eq!(progress, expected, "the missed messages: {events:#?}");
    let last = messages.last().expect("a result");
    assert!(last.is_response_to(CALL), "the result comes last: {last:?}");
    let text = &last.message().expect("JSON")["result"]["content"][0]["text"];
    assert_eq!(text, &format!("counted to {COUNT}"));
    let mut ids: Vec<&str> = messages
        .iter()
        .map(|e| e.id.as_deref().expect("every message has an id"))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), messages.len(), "ids are unique: {messages:?}");
}

async fn get(url: &str) -> (StatusCode, String) {
    let response = reqwest::get(url).await.expect("GET");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_on_one_actix_server_resumes_on_another() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = format!("sqlite://{}", dir.path().join("store.db").display());
    tokio::time::timeout(EVENTUALLY, async {
        let a = ActixServer::start(&store);
        assert_eq!(
            get(&format!("{}/healthz", a.base)).await,
            (StatusCode::OK, "ok\n".into())
        );
        assert_eq!(
            get(&format!("{}/readyz", a.base)).await,
            (StatusCode::OK, "ready\n".into())
        );

        let mut on_a = Client::new(&a.url).as_caller(Some(ALICE));
        on_a.initialize().await;
        let session = on_a.session.clone().expect("a session id");
        let dropped_at = call_and_drop(&on_a).await;

        // Only now does B start, on the same store.
        let b = ActixServer::start(&store);
        let on_b = on_a.on(&b.url);
        let resumed = on_b.resume(&dropped_at).await;
        assert!(
            resumed
                .headers
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")),
            "the resume is an SSE stream"
        );
        assert_exact_tail(&resumed.collect_all().await);

        // B restored the session: it serves new calls in it.
        let events = on_b.call_slow_count(3, 2, 1).await.collect_all().await;
        assert!(events.iter().any(|e| e.is_response_to(3)), "{events:?}");

        // An unknown session is 404, on either server; so is Alice's
        // session to another caller, or to none.
        let unknown = Client::new(&b.url).in_session("no-such-session");
        assert_eq!(unknown.call_status(4).await, StatusCode::NOT_FOUND);
        assert_eq!(
            unknown.on(&a.url).call_status(5).await,
            StatusCode::NOT_FOUND
        );
        for caller in [Some("Bearer mallory"), None] {
            let other = on_b.as_caller(caller);
            assert_eq!(
                other.call_status(6).await,
                StatusCode::NOT_FOUND,
                "{caller:?}"
            );
        }
        assert_eq!(
            on_b.in_session(&session).call_status(7).await,
            StatusCode::OK
        );

        b.stop();
        a.stop();
    })
    .await
    .expect("the test finishes");
}
