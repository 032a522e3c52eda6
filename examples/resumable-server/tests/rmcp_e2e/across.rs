//! Two server processes on one store behind a round-robin proxy with no
//! session affinity (the test kit's `RoundRobin`): every request goes to
//! the other instance than the one before, so a client's answer to a
//! server's request lands, half the time, where nobody sent it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mcp_event_store_conformance::testkit::RoundRobin;
use rmcp::model::{CallToolRequestParams, ClientConfig, ElicitRequestParams, ElicitResult};
#[allow(deprecated)] // sampling is 2025-era, as this client is
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult};
use rmcp::service::RequestContext;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::FixedInterval;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};

use crate::harness::{ChildServer, Fixture, RETRY};
use crate::wire::{Client, TaskClient};

/// A client that answers sampling with "teal" and every elicitation with
/// `{"sure": true}`, speaking the 2025-era protocol (the last with
/// server-to-client requests).
#[derive(Clone)]
struct Answers;

impl ClientHandler for Answers {
    fn get_info(&self) -> ClientConfig {
        serde_json::from_value(serde_json::json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}, "elicitation": {"form": {}}},
            "clientInfo": {"name": "round-robin-e2e", "version": "0"}
        }))
        .expect("a valid client config")
    }

    #[allow(deprecated)] // sampling is 2025-era, as this client is
    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Ok(serde_json::from_value(serde_json::json!({
            "role": "assistant",
            "content": {"type": "text", "text": "teal"},
            "model": "e2e"
        }))
        .expect("a valid sampling result"))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(serde_json::from_value(serde_json::json!({
            "action": "accept",
            "content": {"sure": true}
        }))
        .expect("a valid elicitation result"))
    }
}

fn address(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Two server processes, the proxy in front of them.
fn servers(fixture: &Fixture) -> [ChildServer; 2] {
    let args = [
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--retry-ms".to_owned(),
        RETRY.as_millis().to_string(),
    ];
    [ChildServer::spawn(&args), ChildServer::spawn(&args)]
}

/// A tool's sampling and elicitation requests complete, call after call,
/// although the client's answers reach both instances in turn: each
/// answer is routed to the instance whose request waits for it.
pub async fn server_requests_complete_behind_a_round_robin_proxy(fixture: &Fixture) {
    let [a, b] = servers(fixture);
    let proxy = RoundRobin::start(vec![address(&a.url), address(&b.url)])
        .await
        .expect("the proxy listens");
    let mut config = StreamableHttpClientTransportConfig::with_uri(proxy.url("/mcp"));
    let mut retry = FixedInterval::default();
    retry.duration = RETRY;
    config.retry_config = Arc::new(retry);
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let client = Answers.serve(transport).await.expect("connect");
    for call in 0..4 {
        let result = tokio::time::timeout(
            Duration::from_secs(60),
            client.call_tool(CallToolRequestParams::new("ask_client")),
        )
        .await
        .unwrap_or_else(|_| panic!("call {call}: no answer within a minute"))
        .unwrap_or_else(|e| panic!("call {call}: {e}"));
        let text = result.content[0]
            .as_text()
            .unwrap_or_else(|| panic!("a text result: {result:?}"));
        assert_eq!(
            text.text, "sampled teal; elicitation \"accept\" {\"sure\":true}",
            "call {call}"
        );
    }
    let served = proxy.served();
    assert!(
        served.iter().all(|n| *n >= 4),
        "both instances served: {served:?}"
    );
    client.cancel().await.expect("close the client");
}

/// A `DELETE` on one instance ends the session on the other at once: a
/// call in flight there ends, and its next request is 404, although that
/// instance would look the session up in the store only ten minutes later.
pub async fn a_delete_on_one_instance_ends_the_session_on_the_other(fixture: &Fixture) {
    let args = [
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--retry-ms".to_owned(),
        RETRY.as_millis().to_string(),
        "--session-check-ms".to_owned(),
        "600000".to_owned(),
    ];
    let [a, b] = [ChildServer::spawn(&args), ChildServer::spawn(&args)];
    let mut on_a = Client::new(&a.url);
    on_a.initialize().await;
    let on_b = on_a.on(&b.url);
    assert_eq!(
        on_b.call_status(2).await,
        200,
        "B restores and serves the session"
    );
    // A call on B that would run for ten minutes.
    let in_flight = on_b.call_slow_count(3, 600, 1_000).await;
    assert_eq!(on_a.delete().await, 202, "DELETE on A");
    let (_, ended) = in_flight.collect_for(Duration::from_secs(30)).await;
    assert!(ended, "the call in flight on B ends with its session");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut id = 4;
    while on_b.call_status(id).await != 404 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B still serves a session deleted on A"
        );
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session is its caller's on every instance (C20): another caller (or
/// an anonymous one) holding its id gets exactly what a client of an
/// unknown session gets, on the instance that holds it and on the one that
/// would restore it: a `POST` and a resume are 404, and a `DELETE` leaves
/// it alone. Its owner goes on using it on both.
pub async fn a_session_is_its_callers_on_every_instance(fixture: &Fixture) {
    let [a, b] = servers(fixture);
    let mut alice = Client::new(&a.url).as_caller(Some("Bearer alice"));
    alice.initialize().await;
    let session = alice.session.clone().expect("a session");
    let mut call = alice.call_slow_count(2, 2, 10).await;
    let mut cursor = None;
    while let Some(event) = call.next().await {
        cursor = event.id.clone().or(cursor);
    }
    let cursor = cursor.expect("the call's events have ids");
    let unknown = Client::new(&a.url)
        .as_caller(Some("Bearer alice"))
        .in_session("00000000-0000-4000-8000-000000000000");
    let mut id = 10;
    for url in [&a.url, &b.url] {
        for other in [Some("Bearer mallory"), None] {
            let other = alice.as_caller(other).on(url);
            let unknown = unknown.on(url);
            id += 1;
            let call = serde_json::json!({
                "jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}
            });
            let (theirs, none) = (other.post(call.clone()).await, unknown.post(call).await);
            assert_eq!(theirs.status(), 404, "another caller's POST on {url}");
            assert_eq!(theirs.status(), none.status());
            assert_eq!(theirs.text().await.unwrap(), none.text().await.unwrap());
            let header = reqwest::header::HeaderValue::from_str(&cursor).unwrap();
            let (theirs, none) = (
                other.get_with_last_event_id(header.clone()).await,
                unknown.get_with_last_event_id(header).await,
            );
            assert_eq!(theirs.status(), 404, "another caller's resume on {url}");
            assert_eq!(theirs.status(), none.status());
            assert_eq!(
                other.delete().await,
                unknown.delete().await,
                "DELETE on {url}"
            );
        }
    }
    // Nothing the others did touched it: its owner restores it on B, and
    // goes on on A.
    for url in [&b.url, &a.url] {
        id += 1;
        assert_eq!(alice.on(url).call_status(id).await, 200, "alice on {url}");
    }
    assert_eq!(alice.session.as_deref(), Some(session.as_str()));
    // And resumes its stream there (`resume` asserts the 200).
    drop(alice.on(&b.url).resume(&cursor).await);
}

/// A notification raised once on A reaches every listener: a session's
/// standalone stream on A and another session's on B, each once, with an
/// event id (it is stored, so a resume finds it too).
pub async fn a_notification_raised_on_one_instance_reaches_listeners_on_every_instance(
    fixture: &Fixture,
) {
    let [a, b] = servers(fixture);
    let mut first = Client::new(&a.url);
    first.initialize().await;
    let mut second = Client::new(&b.url);
    second.initialize().await;
    let mut on_a = first.listen().await;
    let mut on_b = second.listen().await;
    // A listener is registered once its stream is open: give the GETs a
    // moment to be served before raising (the test retries, never times).
    let mut announced = 0;
    let mut heard = [false, false];
    let mut seen = [
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while heard != [true, true] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the announcement never reached both listeners: {heard:?}"
        );
        announced += 1;
        let text = format!("hello {announced}");
        let result = first
            .post(serde_json::json!({
                "jsonrpc": "2.0", "id": 100 + announced, "method": "tools/call",
                "params": {"name": "announce", "arguments": {"text": text}}
            }))
            .await;
        assert_eq!(result.status(), 200, "announce");
        for (i, stream) in [&mut on_a, &mut on_b].into_iter().enumerate() {
            while let Ok(Some(event)) = stream.next_within(Duration::from_millis(500)).await {
                let Some(message) = event.message() else {
                    continue;
                };
                if message["method"] == "notifications/message" {
                    assert!(event.id.is_some(), "a stored notification has an id");
                    let data = message["params"]["data"].to_string();
                    assert!(seen[i].insert(data), "listener {i} heard {message} twice");
                    if message["params"]["data"] == text.as_str() {
                        heard[i] = true;
                    }
                }
            }
        }
    }
}

/// A tool list change raised once on A (the `tools_changed` tool, through
/// `Durable::notify`) reaches 2026-07-28 `subscriptions/listen` requests
/// served by A and by B (`Durable::listen`), each stamped with its own
/// subscription's id.
pub async fn a_change_raised_on_one_instance_reaches_subscriptions_on_every_instance(
    fixture: &Fixture,
) {
    let [a, b] = servers(fixture);
    let client = TaskClient::new(&a.url);
    let mut on_a = client
        .listen(1, serde_json::json!({"toolsListChanged": true}))
        .await;
    let mut on_b = client
        .on(&b.url)
        .listen(2, serde_json::json!({"toolsListChanged": true}))
        .await;
    // A listen request hears the bus once its handler runs, just after the
    // acknowledgment: raise until both heard one (the test retries, never
    // times).
    let mut heard = [false, false];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut raised = 0;
    while heard != [true, true] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change never reached both subscriptions: {heard:?}"
        );
        raised += 1;
        let result = client
            .call_tool(100 + raised, "tools_changed", serde_json::json!({}))
            .await;
        assert!(result.get("result").is_some(), "tools_changed: {result}");
        for (i, stream) in [&mut on_a, &mut on_b].into_iter().enumerate() {
            while let Ok(Some(event)) = stream.next_within(Duration::from_millis(500)).await {
                let Some(message) = event.message() else {
                    continue;
                };
                if message["method"] == "notifications/tools/list_changed" {
                    let subscription =
                        &message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"];
                    assert_eq!(subscription, &serde_json::json!(i + 1), "{message}");
                    heard[i] = true;
                }
            }
        }
    }
}

/// The next request the server sends the client on `stream`.
async fn next_request(stream: &mut crate::wire::Sse) -> serde_json::Value {
    loop {
        let event = stream.next().await.expect("the call's stream goes on");
        if let Some(message) = event.message()
            && message.get("method").is_some()
            && message.get("id").is_some()
        {
            return message;
        }
    }
}

/// A forged answer (the id of a request that session V waits for, posted
/// in another session F, on either instance) is dropped where it lands,
/// never delivered to V: V's tool hears only V's own client's answer.
pub async fn a_forged_answer_from_another_session_never_reaches_the_waiting_one(fixture: &Fixture) {
    use crate::wire::Sse;
    use serde_json::json;

    let [a, b] = servers(fixture);
    let mut victim = Client::new(&a.url);
    victim.initialize().await;
    let mut forger = Client::new(&b.url);
    forger.initialize().await;
    let call = victim
        .post(json!({
            "jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "ask_client", "arguments": {}}
        }))
        .await;
    let mut stream = Sse::new(call);
    let asked = next_request(&mut stream).await;
    assert_eq!(asked["method"], "sampling/createMessage", "{asked}");
    let answer = |text: &str| {
        json!({
            "jsonrpc": "2.0", "id": asked["id"],
            "result": {"role": "assistant", "model": "m", "content": {"type": "text", "text": text}}
        })
    };
    for forged in [forger.clone(), forger.on(&a.url)] {
        forged.post(answer("forged")).await;
    }
    // Time for a misrouted answer to arrive, were it routed (not a bound
    // on anything that passes): the call must still wait.
    match stream.next_within(Duration::from_secs(2)).await {
        Err(()) => {}
        Ok(event) => panic!("the call went on after forged answers: {event:?}"),
    }
    let posted = victim.on(&b.url).post(answer("teal")).await;
    assert!(
        posted.status().is_success(),
        "the answer: {}",
        posted.status()
    );
    let asked = next_request(&mut stream).await;
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert_eq!(asked["params"]["message"], "Is teal right?", "{asked}");
    let posted = victim
        .post(json!({
            "jsonrpc": "2.0", "id": asked["id"],
            "result": {"action": "accept", "content": {"sure": true}}
        }))
        .await;
    assert!(
        posted.status().is_success(),
        "the answer: {}",
        posted.status()
    );
    loop {
        let event = stream.next().await.expect("the call's result");
        if event.is_response_to(7) {
            let result = event.message().expect("JSON");
            let text = result["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default();
            assert!(text.starts_with("sampled teal"), "{result}");
            return;
        }
    }
}
