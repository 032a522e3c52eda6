//! A small MCP Streamable HTTP client that speaks the wire protocol itself:
//! JSON-RPC over `POST`, SSE read frame by frame, `GET` with
//! `Last-Event-ID` to resume.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

/// The protocol revision the client speaks (with sessions and resumption).
pub const PROTOCOL: &str = "2025-11-25";
/// How long any single read may wait before the test fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// One SSE event as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

impl Event {
    /// The JSON-RPC message, if the event carries one.
    pub fn message(&self) -> Option<Value> {
        (!self.data.is_empty())
            .then(|| serde_json::from_str(&self.data).expect("event data is JSON"))
    }

    /// The progress count, if this is a progress notification.
    pub fn progress(&self) -> Option<u64> {
        let message = self.message()?;
        (message["method"] == "notifications/progress")
            .then(|| message["params"]["progress"].as_f64().expect("a number") as u64)
    }

    /// Whether this is the response to request `id`.
    pub fn is_response_to(&self, id: u64) -> bool {
        self.message()
            .is_some_and(|m| m["id"] == json!(id) && m.get("result").is_some())
    }
}

/// An SSE response body, read event by event.
pub struct Sse {
    pub headers: HeaderMap,
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    buffer: Vec<u8>,
    ended: bool,
}

impl Sse {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            headers: response.headers().clone(),
            body: response.bytes_stream().boxed(),
            buffer: Vec::new(),
            ended: false,
        }
    }

    /// The next event, `None` at the end of the stream, `Err` on timeout.
    /// Comment-only blocks (keep-alives) are skipped.
    pub async fn next_within(&mut self, limit: Duration) -> Result<Option<Event>, ()> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(end) = find_block_end(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end.1).collect();
                let text = String::from_utf8(block[..end.0].to_vec()).expect("SSE is UTF-8");
                match parse_block(&text) {
                    Some(event) => return Ok(Some(event)),
                    None => continue,
                }
            }
            if self.ended {
                return Ok(None);
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return Err(()),
                Ok(Some(Ok(chunk))) => self.buffer.extend_from_slice(&chunk),
                Ok(Some(Err(error))) => panic!("reading the SSE body failed: {error}"),
                Ok(None) => self.ended = true,
            }
        }
    }

    /// The next event; the test fails if none comes within [`READ_TIMEOUT`].
    pub async fn next(&mut self) -> Option<Event> {
        self.next_within(READ_TIMEOUT)
            .await
            .expect("timed out waiting for an SSE event")
    }

    /// Every event up to the end of the stream.
    pub async fn collect_all(mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }

    /// Every event that arrives within `limit`, and whether the stream ended.
    pub async fn collect_for(mut self, limit: Duration) -> (Vec<Event>, bool) {
        let deadline = tokio::time::Instant::now() + limit;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_within(left).await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => return (events, true),
                Err(()) => return (events, false),
            }
        }
    }
}

/// Where the first event block ends: (end of its text, end of its separator).
fn find_block_end(buffer: &[u8]) -> Option<(usize, usize)> {
    buffer
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|at| (at, at + 2))
}

fn parse_block(block: &str) -> Option<Event> {
    let mut event = Event {
        id: None,
        data: String::new(),
        retry: None,
    };
    let mut fields = 0;
    let mut data_lines = Vec::new();
    for line in block.lines() {
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        fields += 1;
        match field {
            "id" => event.id = Some(value.to_owned()),
            "data" => data_lines.push(value),
            "retry" => event.retry = value.parse().ok(),
            _ => {}
        }
    }
    event.data = data_lines.join("\n");
    (fields > 0).then_some(event)
}

/// A client of one MCP endpoint, in one session (or none, when stateless).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    pub url: String,
    pub session: Option<String>,
    /// Sent as `Authorization`: the example server's caller.
    authorization: Option<String>,
}

impl Client {
    pub fn new(url: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client"),
            url: url.to_owned(),
            session: None,
            authorization: None,
        }
    }

    /// The same client (and session) sending `Authorization: <value>`, or
    /// none: another caller of the example server.
    pub fn as_caller(&self, value: Option<&str>) -> Self {
        Self {
            authorization: value.map(str::to_owned),
            ..self.clone()
        }
    }

    /// The same client (and caller) in session `session`.
    pub fn in_session(&self, session: &str) -> Self {
        Self {
            session: Some(session.to_owned()),
            ..self.clone()
        }
    }

    /// The same client (and session) talking to another server.
    pub fn on(&self, url: &str) -> Self {
        Self {
            url: url.to_owned(),
            ..self.clone()
        }
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("MCP-Protocol-Version", HeaderValue::from_static(PROTOCOL));
        if let Some(session) = &self.session {
            headers.insert(
                "Mcp-Session-Id",
                HeaderValue::from_str(session).expect("a header-safe session id"),
            );
        }
        if let Some(authorization) = &self.authorization {
            headers.insert(
                "Authorization",
                HeaderValue::from_str(authorization).expect("a header-safe value"),
            );
        }
        headers
    }

    /// `POST`s one JSON-RPC message.
    pub async fn post(&self, message: Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .headers(self.headers())
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(message.to_string())
            .send()
            .await
            .expect("POST")
    }

    /// The `initialize` handshake; remembers the session id.
    pub async fn initialize(&mut self) {
        let response = self
            .post(json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL, "capabilities": {},
                    "clientInfo": {"name": "wire-test", "version": "1"}
                }
            }))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "initialize");
        let session = response
            .headers()
            .get("mcp-session-id")
            .expect("a session id")
            .to_str()
            .unwrap()
            .to_owned();
        let events = Sse::new(response).collect_all().await;
        assert!(events.iter().any(|e| e.is_response_to(1)), "{events:?}");
        self.session = Some(session);
        let response = self
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "initialized");
    }

    /// Calls `slow_count` with a progress token; the open SSE response.
    pub async fn call_slow_count(&self, id: u64, count: u64, interval_ms: u64) -> Sse {
        let response = self
            .post(json!({
                "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {
                    "name": "slow_count",
                    "arguments": {"count": count, "interval_ms": interval_ms},
                    "_meta": {"progressToken": format!("progress-{id}")}
                }
            }))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "tools/call");
        let sse = Sse::new(response);
        assert!(
            sse.headers
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")),
            "tools/call answers with SSE"
        );
        sse
    }

    /// `GET` with a raw `Last-Event-ID` header value.
    pub async fn get_with_last_event_id(&self, last_event_id: HeaderValue) -> reqwest::Response {
        self.http
            .get(&self.url)
            .headers(self.headers())
            .header("Accept", "text/event-stream")
            .header("Last-Event-ID", last_event_id)
            .send()
            .await
            .expect("GET")
    }

    /// Opens the session's standalone stream (`GET`, no `Last-Event-ID`):
    /// where notifications not tied to a request arrive.
    pub async fn listen(&self) -> Sse {
        let response = self
            .http
            .get(&self.url)
            .headers(self.headers())
            .header("Accept", "text/event-stream")
            .send()
            .await
            .expect("GET");
        assert_eq!(response.status(), StatusCode::OK, "the standalone stream");
        Sse::new(response)
    }

    /// Resumes after `last_event_id`; the response must be an SSE stream.
    pub async fn resume(&self, last_event_id: &str) -> Sse {
        let response = self
            .get_with_last_event_id(HeaderValue::from_str(last_event_id).expect("header-safe"))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "resume");
        Sse::new(response)
    }
}

impl Client {
    /// `DELETE`: ends the session; the status.
    pub async fn delete(&self) -> StatusCode {
        self.http
            .delete(&self.url)
            .headers(self.headers())
            .send()
            .await
            .expect("DELETE")
            .status()
    }

    /// Calls `slow_count` (1 step); only the status, the body is dropped.
    pub async fn call_status(&self, id: u64) -> StatusCode {
        self.post(json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "slow_count", "arguments": {"count": 1, "interval_ms": 0}}
        }))
        .await
        .status()
    }
}

/// The protocol revision of the tasks extension (SEP-2663): no
/// `initialize`, no session; every request carries its protocol version
/// and the client's capabilities in `_meta`, and SEP-2243's `Mcp-Method` and
/// `Mcp-Name` headers.
pub const TASKS_PROTOCOL: &str = "2026-07-28";

/// A 2026-07-28 client of one endpoint: it declares the tasks extension (or
/// not) on every request, and sends an `Authorization` header (or none).
#[derive(Clone)]
pub struct TaskClient {
    http: reqwest::Client,
    pub url: String,
    authorization: Option<String>,
    declare_tasks: bool,
}

impl TaskClient {
    /// A client declaring the tasks extension, without `Authorization`.
    pub fn new(url: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client"),
            url: url.to_owned(),
            authorization: None,
            declare_tasks: true,
        }
    }

    /// The same client talking to another server.
    pub fn on(&self, url: &str) -> Self {
        Self {
            url: url.to_owned(),
            ..self.clone()
        }
    }

    /// The same client sending `Authorization: <value>`.
    pub fn authorized(&self, value: &str) -> Self {
        Self {
            authorization: Some(value.to_owned()),
            ..self.clone()
        }
    }

    /// The same client without the tasks extension in its capabilities.
    pub fn without_tasks(&self) -> Self {
        Self {
            declare_tasks: false,
            ..self.clone()
        }
    }

    /// Sends request `method` with `params` (its `_meta` added) and returns
    /// the JSON-RPC response to it (`result` or `error`), read from a JSON
    /// body or from the SSE stream the server answers with.
    pub async fn request(&self, id: u64, method: &str, name: &str, params: Value) -> Value {
        let response = self.send(id, method, name, params).await;
        let is_sse = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if !is_sse {
            let status = response.status();
            let body = response.text().await.expect("a body");
            return serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("{method}: HTTP {status}, not JSON ({e}): {body}"));
        }
        let mut sse = Sse::new(response);
        while let Some(event) = sse.next().await {
            if let Some(message) = event.message()
                && message["id"] == json!(id)
            {
                return message;
            }
        }
        panic!("{method}: the stream ended without a response to {id}");
    }

    /// `subscriptions/listen` for `notifications` (a filter, e.g.
    /// `{"toolsListChanged": true}`): the stream the server answers with.
    pub async fn listen(&self, id: u64, notifications: Value) -> Sse {
        let response = self
            .send(
                id,
                "subscriptions/listen",
                "",
                json!({"notifications": notifications}),
            )
            .await;
        assert_eq!(response.status(), 200, "subscriptions/listen");
        Sse::new(response)
    }

    /// POSTs request `method` with `params` (its `_meta` added), naming
    /// `name` in `Mcp-Name` unless it is empty (a method that names
    /// nothing).
    async fn send(
        &self,
        id: u64,
        method: &str,
        name: &str,
        mut params: Value,
    ) -> reqwest::Response {
        let capabilities = if self.declare_tasks {
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        } else {
            json!({})
        };
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": TASKS_PROTOCOL,
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        });
        let mut request = self
            .http
            .post(&self.url)
            .header("MCP-Protocol-Version", TASKS_PROTOCOL)
            .header("Mcp-Method", method)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
            );
        if !name.is_empty() {
            request = request.header("Mcp-Name", name);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header("Authorization", authorization);
        }
        request.send().await.expect("POST")
    }

    /// `tools/call`; the response.
    pub async fn call_tool(&self, id: u64, tool: &str, arguments: Value) -> Value {
        self.request(
            id,
            "tools/call",
            tool,
            json!({"name": tool, "arguments": arguments}),
        )
        .await
    }

    /// `tools/call` that must answer with a task; its id.
    pub async fn create_task(&self, id: u64, tool: &str, arguments: Value) -> String {
        let response = self.call_tool(id, tool, arguments).await;
        let result = &response["result"];
        assert_eq!(result["resultType"], "task", "{response}");
        result["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("a task id: {response}"))
            .to_owned()
    }

    /// `tasks/get`; the response.
    pub async fn get_task(&self, id: u64, task: &str) -> Value {
        self.request(id, "tasks/get", task, json!({"taskId": task}))
            .await
    }

    /// `tasks/update` with `responses`; the response.
    pub async fn update_task(&self, id: u64, task: &str, responses: Value) -> Value {
        self.request(
            id,
            "tasks/update",
            task,
            json!({"taskId": task, "inputResponses": responses}),
        )
        .await
    }

    /// `tasks/cancel`; the response.
    pub async fn cancel_task(&self, id: u64, task: &str) -> Value {
        self.request(id, "tasks/cancel", task, json!({"taskId": task}))
            .await
    }

    /// Polls `tasks/get` until `done` holds for the task (the `result` of
    /// the response), for at most `limit`; the task.
    pub async fn until(&self, task: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        let mut last = Value::Null;
        let mut id = 1_000;
        while tokio::time::Instant::now() < deadline {
            id += 1;
            let response = self.get_task(id, task).await;
            let result = response
                .get("result")
                .unwrap_or_else(|| panic!("tasks/get {task} failed: {response}"));
            if done(result) {
                return result.clone();
            }
            last = result.clone();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("task {task} did not reach the expected state within {limit:?}; last seen: {last}");
    }
}
