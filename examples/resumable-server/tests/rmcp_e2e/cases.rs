//! The end-to-end cases, each run on every backend the macro in `main.rs`
//! expands them for.

// The default backend (SQLite) runs every case; without it
// (`--no-default-features`, or another backend alone) the restart or shared
// cases may have no backend to run on.
#![cfg_attr(
    not(any(feature = "default-backend", feature = "full")),
    allow(dead_code)
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::HeaderValue;
use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::NotificationContext;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::FixedInterval;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use crate::harness::{ChildServer, Fixture, Mode, RETRY, Server};
use crate::server;
use crate::wire::{Client, Event};

/// Steps of the slow tool in the drop-and-resume cases.
const COUNT: u64 = 8;
/// Milliseconds between steps.
const INTERVAL_MS: u64 = 60;
/// Progress notifications read before the connection is dropped.
const DROP_AFTER: u64 = 3;
/// The JSON-RPC id of the tool call.
const CALL: u64 = 2;

/// Starts a tool call, reads it until `DROP_AFTER` progress notifications
/// arrived, and drops the connection. Returns the id of the last event read.
async fn call_and_drop(client: &Client) -> String {
    call_and_drop_every(client, INTERVAL_MS).await
}

/// [`call_and_drop`] with `interval_ms` between the tool's steps.
async fn call_and_drop_every(client: &Client, interval_ms: u64) -> String {
    let mut sse = client.call_slow_count(CALL, COUNT, interval_ms).await;
    let first = sse.next().await.expect("a priming event");
    assert!(first.data.is_empty(), "priming first: {first:?}");
    assert!(first.id.is_some() && first.retry.is_some(), "{first:?}");
    let mut last_id = first.id.unwrap();
    let mut seen = 0;
    while seen < DROP_AFTER {
        let event = sse.next().await.expect("progress before the drop");
        seen += 1;
        assert_eq!(event.progress(), Some(seen), "{event:?}");
        last_id = event.id.expect("every stored event has an id");
    }
    drop(sse);
    last_id
}

/// Polls as a SEP-1699 client does: `GET` with the newest `Last-Event-ID`
/// until the response to the call arrives. Returns every event, in order.
async fn poll_until_result(client: &Client, from: &str) -> Vec<Event> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last_id = from.to_owned();
    let mut received = Vec::new();
    loop {
        let events = client.resume(&last_id).await.collect_all().await;
        for event in events {
            if let Some(id) = &event.id {
                last_id.clone_from(id);
            }
            received.push(event);
        }
        if received.iter().any(|e| e.is_response_to(CALL)) {
            return received;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no result after 30 s of polling; got {received:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The events after progress `DROP_AFTER` must be exactly the remaining
/// progress notifications, then the result, each once, in order, each with
/// an id. Returns their ids.
fn assert_exact_tail(events: &[Event]) -> Vec<String> {
    let messages: Vec<&Event> = events.iter().filter(|e| !e.data.is_empty()).collect();
    let expected = (COUNT - DROP_AFTER + 1) as usize;
    assert_eq!(
        messages.len(),
        expected,
        "{expected} missed messages, got {events:#?}"
    );
    for (at, step) in (DROP_AFTER + 1..=COUNT).enumerate() {
        assert_eq!(messages[at].progress(), Some(step), "{:?}", messages[at]);
    }
    let last = messages.last().unwrap();
    assert!(last.is_response_to(CALL), "the result comes last: {last:?}");
    let text = &last.message().unwrap()["result"]["content"][0]["text"];
    assert_eq!(text, &format!("counted to {COUNT}"));
    let ids: Vec<String> = messages
        .iter()
        .map(|e| e.id.clone().expect("an id"))
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "ids are unique: {ids:?}");
    ids
}

fn stateless_flag(mode: Mode, args: &mut Vec<String>) {
    if mode == Mode::Stateless {
        args.push("--stateless".into());
    }
}

/// A tool call streams progress; the client drops the connection half way;
/// `GET` + `Last-Event-ID` returns exactly what was missed, then the result.
pub async fn resume_after_drop(fixture: &Fixture, mode: Mode) {
    let server = Server::start(fixture.url(), mode, None).await;
    let mut client = Client::new(&server.url);
    if mode == Mode::Sessions {
        client.initialize().await;
    }
    let dropped_at = call_and_drop(&client).await;
    let polled = poll_until_result(&client, &dropped_at).await;
    let polled_ids = assert_exact_tail(&polled);
    // Now that the call is over, one resume from the same place has it all,
    // with the ids the events had the first time.
    let again = client.resume(&dropped_at).await.collect_all().await;
    assert_eq!(assert_exact_tail(&again), polled_ids);
    server.stop().await;
}

/// The same across a restart of the server process (`SIGKILL`), the store
/// reopened from disk; with sessions, the new process restores the session
/// from the store.
pub async fn resume_after_restart(fixture: &Fixture, mode: Mode) {
    let mut args = vec![
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--retry-ms".into(),
        RETRY.as_millis().to_string(),
    ];
    stateless_flag(mode, &mut args);
    let first = ChildServer::spawn(&args);
    let mut client = Client::new(&first.url);
    if mode == Mode::Sessions {
        client.initialize().await;
    }
    let dropped_at = call_and_drop(&client).await;
    // Wait for the call to finish (its events are all stored), then kill.
    let before_ids = assert_exact_tail(&poll_until_result(&client, &dropped_at).await);
    first.kill();

    let second = ChildServer::spawn(&args);
    let client = client.on(&second.url);
    let after = client.resume(&dropped_at).await.collect_all().await;
    assert_eq!(assert_exact_tail(&after), before_ids);
    if mode == Mode::Sessions {
        // The restored session serves new calls too.
        let events = client.call_slow_count(3, 2, 1).await.collect_all().await;
        assert!(events.iter().any(|e| e.is_response_to(3)), "{events:?}");
    }
}

/// Two servers on one store: a stream begun on A is resumed on B. With
/// sessions, B restores A's session from the session store.
pub async fn resume_on_another_instance(fixture: &Fixture, mode: Mode) {
    let a = Server::start(fixture.url(), mode, None).await;
    let b = Server::start(fixture.url(), mode, None).await;
    let mut on_a = Client::new(&a.url);
    if mode == Mode::Sessions {
        on_a.initialize().await;
    }
    let on_b = on_a.on(&b.url);
    let dropped_at = call_and_drop(&on_a).await;
    let polled = poll_until_result(&on_b, &dropped_at).await;
    let ids = assert_exact_tail(&polled);
    let again = on_b.resume(&dropped_at).await.collect_all().await;
    assert_eq!(assert_exact_tail(&again), ids);
    if mode == Mode::Sessions {
        let events = on_b.call_slow_count(3, 2, 1).await.collect_all().await;
        assert!(events.iter().any(|e| e.is_response_to(3)), "{events:?}");
    }
    a.stop().await;
    b.stop().await;
}

/// The lease of the servers in the killed-writer case: short, so that
/// the case ends soon after the kill.
const SHORT_LEASE: Duration = Duration::from_millis(1500);
/// The follow hold in the killed-writer case: far beyond the test, so a
/// resume that ends did not wait out its hold.
const HOUR: Duration = Duration::from_secs(3600);
/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(60);

/// A call runs on A; the client drops the connection mid-call, and A is
/// killed (SIGKILL); the client resumes on B, whose follow hold is an hour.
/// B sends what A stored after the client's cursor, each event once, and
/// ends the response once A's lease has lapsed: nothing more will come, and
/// the client may call again. (Without A recorded as the stream's writer,
/// and its lease, B held the response for its whole hold.)
pub async fn resume_of_a_killed_writers_stream_ends(fixture: &Fixture, mode: Mode) {
    let mut args = vec![
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--retry-ms".into(),
        RETRY.as_millis().to_string(),
        "--task-lease-ms".into(),
        SHORT_LEASE.as_millis().to_string(),
    ];
    stateless_flag(mode, &mut args);
    let a = ChildServer::spawn(&args);
    let b = Server::start_with(server::Options {
        store: fixture.url().to_owned(),
        stateless: mode == Mode::Stateless,
        retry: RETRY,
        follow_hold: Some(HOUR),
        task_lease: SHORT_LEASE,
        ..server::Options::default()
    })
    .await;
    let mut on_a = Client::new(&a.url);
    if mode == Mode::Sessions {
        on_a.initialize().await;
    }
    let on_b = on_a.on(&b.url);
    // A hundred steps of 100 ms: far from done when A dies.
    let mut sse = on_a.call_slow_count(CALL, 100, 100).await;
    let priming = sse.next().await.expect("a priming event");
    let cursor = priming.id.expect("the priming event has an id");
    for step in 1..=2 {
        let event = sse.next().await.expect("progress before the kill");
        assert_eq!(event.progress(), Some(step), "{event:?}");
    }
    drop(sse);
    a.kill();

    let resumed = tokio::time::timeout(EVENTUALLY, async {
        on_b.resume(&cursor).await.collect_all().await
    })
    .await
    .expect("the resume on B still waits for a writer that was killed");
    assert!(
        !resumed.iter().any(|e| e.is_response_to(CALL)),
        "the killed call never answered: {resumed:?}"
    );
    // Everything A stored after the cursor, in order, each once: at least
    // the two steps the client saw before the kill.
    let steps: Vec<u64> = resumed.iter().filter_map(|e| e.progress()).collect();
    let stored: Vec<u64> = (1..=steps.len() as u64).collect();
    assert!(steps.len() >= 2 && steps == stored, "{steps:?}");
    b.stop().await;
}

/// Milliseconds between steps in the live-resume cases: the five steps
/// left after the drop take a second, so the resume lands mid-call.
const LIVE_INTERVAL_MS: u64 = 200;

/// C13 over HTTP: the client drops the connection half way through a tool
/// call and resumes once, while the call is still running: that one
/// response carries the rest of the progress as it is produced, then the
/// result, and ends.
pub async fn one_resume_mid_call_streams_the_rest(fixture: &Fixture, mode: Mode) {
    let server = Server::start(fixture.url(), mode, None).await;
    let mut client = Client::new(&server.url);
    if mode == Mode::Sessions {
        client.initialize().await;
    }
    let dropped_at = call_and_drop_every(&client, LIVE_INTERVAL_MS).await;
    let resumed = client.resume(&dropped_at).await.collect_all().await;
    assert_exact_tail(&resumed);
    assert_eq!(server.resumes(), 1, "one resume got it all");
    server.stop().await;
}

/// The same across instances: the call runs on A, the client resumes on B
/// mid-call, and B streams what A goes on producing.
pub async fn one_resume_on_another_instance_streams_the_rest(fixture: &Fixture, mode: Mode) {
    let a = Server::start(fixture.url(), mode, None).await;
    let b = Server::start(fixture.url(), mode, None).await;
    let mut on_a = Client::new(&a.url);
    if mode == Mode::Sessions {
        on_a.initialize().await;
    }
    let on_b = on_a.on(&b.url);
    let dropped_at = call_and_drop_every(&on_a, LIVE_INTERVAL_MS).await;
    let resumed = on_b.resume(&dropped_at).await.collect_all().await;
    assert_exact_tail(&resumed);
    assert_eq!(b.resumes(), 1, "one resume on B got it all");
    a.stop().await;
    b.stop().await;
}

/// rmcp's own client: the server cuts the call's live response after two
/// messages; the client resumes once, mid-call, and that resume delivers
/// every remaining progress notification and the result.
pub async fn rmcp_client_resumes_once_mid_call(fixture: &Fixture, mode: Mode) {
    let server = Server::start_cutting_posts(fixture.url(), mode, 2).await;
    rmcp_client_call(&server, 8, 100).await;
    assert_eq!(
        server.resumes(),
        1,
        "one resume carried the rest of the call"
    );
    server.stop().await;
}

/// Every id of a finished tool call's stream.
async fn finished_call(client: &Client, id: u64) -> Vec<String> {
    let events = client.call_slow_count(id, 3, 1).await.collect_all().await;
    assert!(events.iter().any(|e| e.is_response_to(id)), "{events:?}");
    events.into_iter().filter_map(|e| e.id).collect()
}

/// Reads whatever a resume answers within a second: status, and events
/// carrying a message (priming events and retry hints are not messages).
async fn try_resume(client: &Client, last_event_id: HeaderValue) -> (u16, Vec<Event>) {
    let response = client.get_with_last_event_id(last_event_id).await;
    let status = response.status().as_u16();
    let (events, _) = crate::wire::Sse::new(response)
        .collect_for(Duration::from_secs(1))
        .await;
    let messages = events.into_iter().filter(|e| !e.data.is_empty()).collect();
    (status, messages)
}

/// Ids a client could make up from what it has seen of its own streams.
fn forgeries(own: &str) -> Vec<String> {
    let (token, position) = own
        .strip_prefix("v1.")
        .and_then(|rest| rest.split_once('.'))
        .expect("a v1 id");
    let flip = |c: char| if c == '0' { '1' } else { '0' };
    let mut flipped_first = token.to_owned();
    let first = flipped_first.remove(0);
    flipped_first.insert(0, flip(first));
    let mut flipped_last = token.to_owned();
    let last = flipped_last.pop().unwrap();
    flipped_last.push(flip(last));
    vec![
        // truncated
        own[..own.len() - 1].to_owned(),
        own[..own.len() / 2].to_owned(),
        format!("v1.{token}"),
        format!("v1.{token}."),
        format!("v1.{}", &token[..token.len() - 1]) + "." + position,
        // forged
        format!("v1.{flipped_first}.{position}"),
        format!("v1.{flipped_last}.{position}"),
        format!("v2.{token}.{position}"),
        format!("V1.{token}.{position}"),
        format!("v1.{}.{position}", token.to_uppercase()),
        format!("v1.{token}.ffffffff"),
        format!("v1.{token}.0{position}"),
        // extended
        format!("{own}0"),
        format!("{own}.1"),
        format!("{own}-0"),
        format!("x{own}"),
    ]
}

/// Junk a client might send as `Last-Event-ID`.
fn garbage() -> Vec<HeaderValue> {
    let mut values: Vec<HeaderValue> = [
        "",
        " ",
        "garbage",
        "0",
        "0/0",
        "1/0",
        "18446744073709551616/1",
        "../../etc/passwd",
        "' OR 1=1 --",
        "%00",
        "v1..",
        "v1.....",
        "{\"id\":1}",
    ]
    .into_iter()
    .map(HeaderValue::from_static)
    .collect();
    values.push(HeaderValue::from_str(&format!("v1.{}", "a".repeat(4000))).unwrap());
    values.push(HeaderValue::from_bytes("v1.\u{1F4A5}.1".as_bytes()).unwrap());
    values.push(HeaderValue::from_bytes(b"\xff\xfe").unwrap());
    values
}

/// A `Last-Event-ID` of another stream replays that stream only; one of
/// another session, a forged or truncated one, and garbage replay nothing,
/// and none of them is answered with a server error.
pub async fn foreign_ids_yield_nothing(fixture: &Fixture, mode: Mode) {
    let server = Server::start(fixture.url(), mode, None).await;
    let mut alice = Client::new(&server.url);
    let mut bob = Client::new(&server.url);
    if mode == Mode::Sessions {
        alice.initialize().await;
        bob.initialize().await;
    }
    let alice_x = finished_call(&alice, 2).await;
    let alice_y = finished_call(&alice, 3).await;
    let bob_z = finished_call(&bob, 4).await;

    // Another stream of one's own: exactly that stream's later events.
    let (status, events) = try_resume(&alice, HeaderValue::from_str(&alice_y[0]).unwrap()).await;
    assert_eq!(status, 200);
    let ids: Vec<String> = events.iter().filter_map(|e| e.id.clone()).collect();
    assert_eq!(ids, alice_y[1..], "only stream y, from where it was left");
    for event in &events {
        assert!(!alice_x.contains(event.id.as_ref().unwrap()));
    }

    if mode == Mode::Sessions {
        // Another session's stream: nothing, though the id is genuine.
        for id in &bob_z {
            let (status, events) = try_resume(&alice, HeaderValue::from_str(id).unwrap()).await;
            assert_eq!(status, 200, "{id}");
            assert!(events.is_empty(), "alice got bob's events: {events:?}");
        }
        // Bob's token with alice's positions: still nothing.
        let bob_token = bob_z[0].split('.').nth(1).unwrap();
        for own in &alice_x {
            let position = own.rsplit('.').next().unwrap();
            let mixed = format!("v1.{bob_token}.{position}");
            let (status, events) = try_resume(&alice, HeaderValue::from_str(&mixed).unwrap()).await;
            assert!(status < 500, "{mixed}: {status}");
            assert!(events.is_empty(), "{mixed}: {events:?}");
        }
    }

    for forged in alice_x.iter().flat_map(|id| forgeries(id)) {
        let (status, events) = try_resume(&alice, HeaderValue::from_str(&forged).unwrap()).await;
        assert!(status < 500, "{forged:?}: {status}");
        assert!(events.is_empty(), "{forged:?} replayed {events:?}");
    }
    for junk in garbage() {
        let (status, events) = try_resume(&alice, junk.clone()).await;
        assert!(status < 500, "{junk:?}: {status}");
        assert!(events.is_empty(), "{junk:?} replayed {events:?}");
    }
    server.stop().await;
}

/// Calls `slow_count` with `steps` steps `interval_ms` apart through rmcp's
/// own client (with its automatic reconnection) against `server`, and
/// checks the result and that every progress notification arrived exactly
/// once. rmcp hands each notification to the handler in a task of its own,
/// so they may land in any order and just after the result: this waits for
/// them. (The wire cases check the order.)
async fn rmcp_client_call(server: &Server, steps: u64, interval_ms: u64) {
    let mut config = StreamableHttpClientTransportConfig::with_uri(server.url.as_str());
    let mut retry = FixedInterval::default();
    retry.duration = RETRY;
    config.retry_config = Arc::new(retry);
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let progress = ProgressLog::default();
    let client = progress.clone().serve(transport).await.expect("connect");
    let mut arguments = serde_json::Map::new();
    arguments.insert("count".into(), steps.into());
    arguments.insert("interval_ms".into(), interval_ms.into());
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        client.call_tool(CallToolRequestParams::new("slow_count").with_arguments(arguments)),
    )
    .await
    .expect("the call completes within a minute")
    .expect("the call succeeds");
    let text = result.content[0]
        .as_text()
        .unwrap_or_else(|| panic!("a text result: {result:?}"));
    assert_eq!(text.text, format!("counted to {steps}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while progress.0.lock().unwrap().len() < steps as usize
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut received = progress.0.lock().unwrap().clone();
    received.sort_by(f64::total_cmp);
    let expected: Vec<f64> = (1..=steps).map(|n| n as f64).collect();
    assert_eq!(
        received, expected,
        "every progress notification, exactly once"
    );
    client.cancel().await.expect("close the client");
}

/// Records the progress a client receives.
#[derive(Clone, Default)]
struct ProgressLog(Arc<Mutex<Vec<f64>>>);

impl ClientHandler for ProgressLog {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(params.progress);
    }
}

/// rmcp's own client, with its automatic reconnection, completes a long tool
/// call while the server closes the SSE stream every two messages
/// (SEP-1699): it comes back with `Last-Event-ID` after each close.
pub async fn rmcp_client_polls_through(fixture: &Fixture, mode: Mode) {
    const STEPS: u64 = 12;
    let server = Server::start(fixture.url(), mode, Some(2)).await;
    rmcp_client_call(&server, STEPS, 20).await;
    assert!(
        server.resumes() >= (STEPS / 2) as usize,
        "the client resumed after the server's closes ({} resumes)",
        server.resumes()
    );
    server.stop().await;
}

/// The session-store key binding the stream of `event_id` to its session
/// (`SessionScoped`'s default prefix).
fn binding_key(event_id: &str) -> String {
    let id = mcp_event_store::EventId::parse(event_id).expect("one of our ids");
    format!(
        "{}{}",
        mcp_event_store::rmcp::DEFAULT_BINDING_KEY_PREFIX,
        id.token
    )
}

/// Three servers on one store. A session begun on A and restored on B is
/// deleted (`DELETE`) on A: from then on B, A and a third server C all
/// answer 404 for it, and the bindings of its streams on A and on B are
/// gone from the store.
pub async fn deleted_session_is_gone_everywhere(fixture: &Fixture, mode: Mode) {
    assert_eq!(mode, Mode::Sessions, "sessions only");
    let options = server::Options {
        store: fixture.url().to_owned(),
        retry: RETRY,
        // Look the session up on every request, so B's first request after
        // the DELETE sees it; the default (1 s) only delays that.
        session_check: Duration::ZERO,
        ..server::Options::default()
    };
    let a = Server::start_with(options.clone()).await;
    let b = Server::start_with(options.clone()).await;
    let c = Server::start_with(options.clone()).await;
    let mut on_a = Client::new(&a.url);
    on_a.initialize().await;
    let on_b = on_a.on(&b.url);
    let on_c = on_a.on(&c.url);

    // B restores the session from the store and serves it from memory.
    let streamed_on_b = finished_call(&on_b, 2).await;
    let streamed_on_a = finished_call(&on_a, 3).await;
    assert_eq!(on_b.call_status(4).await, 200, "B serves the session");

    assert_eq!(on_a.delete().await, 202, "DELETE on A");
    assert_eq!(
        on_b.call_status(5).await,
        404,
        "B must forget a deleted session"
    );
    let resume = on_b
        .get_with_last_event_id(HeaderValue::from_str(&streamed_on_b[0]).unwrap())
        .await;
    assert_eq!(resume.status(), 404, "nor resume its streams");
    assert_eq!(on_a.call_status(6).await, 404, "A");
    assert_eq!(on_c.call_status(7).await, 404, "C");
    assert_eq!(on_b.call_status(8).await, 404, "B, again");

    // Its bindings go: A's at once (its session store is linked), B's when
    // B found the session gone. Both are removed in the background.
    let store = mcp_event_store::connect(fixture.url()).await.expect("open");
    for event_id in [&streamed_on_a[0], &streamed_on_b[0]] {
        let key = binding_key(event_id);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while store.get_session(&key).await.expect("read").is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key} still in the store 20 s after the DELETE"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for server in [a, b, c] {
        server.stop().await;
    }
}
