//! A client that speaks MCP's Streamable HTTP itself, so the tests see
//! exactly what goes over the wire: 2025-11-25 sessions with their SSE
//! streams, and 2026-07-28 requests.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};

/// The revision with sessions and resumable SSE streams.
pub const LEGACY: &str = "2025-11-25";
/// The revision with durable tasks.
pub const FINAL: &str = "2026-07-28";
/// "Must happen eventually" guard; never a latency bound.
pub const EVENTUALLY: Duration = Duration::from_secs(60);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client")
}

/// The JSON-RPC message answering request `id` in a response body: plain
/// JSON, or the `data` of an SSE event.
fn answer_in(body: &str, id: i64) -> Option<Value> {
    let answers = |value: &Value| value.get("id") == Some(&json!(id));
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return answers(&value).then_some(value);
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(answers)
}

/// A 2025-11-25 session on one server (another server serves it by id).
#[derive(Clone)]
pub struct Session {
    pub id: String,
    /// Sent as `Authorization`: the example server's caller.
    pub caller: Option<String>,
}

impl Session {
    /// The same session id, sent by `caller` (`None`: anonymously).
    pub fn as_caller(&self, caller: Option<&str>) -> Self {
        Self {
            id: self.id.clone(),
            caller: caller.map(str::to_owned),
        }
    }
}

/// `request` with the session's headers: its id, and its caller's
/// `Authorization` if any.
fn in_session(mut request: reqwest::RequestBuilder, session: &Session) -> reqwest::RequestBuilder {
    request = request.header("Mcp-Session-Id", &session.id);
    match &session.caller {
        Some(caller) => request.header("Authorization", caller),
        None => request,
    }
}

/// What a POST answered: its HTTP status and the JSON-RPC answer, if any.
pub struct Posted {
    pub status: reqwest::StatusCode,
    pub answer: Option<Value>,
}

/// A 2025-11-25 POST of `body` to `url`, in `session` if any.
fn legacy_post(url: &str, session: Option<&Session>, body: &Value) -> reqwest::RequestBuilder {
    let mut request = client()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", LEGACY);
    if let Some(session) = session {
        request = in_session(request, session);
    }
    request.body(body.to_string())
}

/// A POST of `body` to `url`, in `session` if any.
pub async fn post(url: &str, session: Option<&Session>, body: Value) -> Posted {
    let id = body.get("id").and_then(Value::as_i64);
    let response = legacy_post(url, session, &body)
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let text = response.text().await.expect("a body");
    Posted {
        status,
        answer: id.and_then(|id| answer_in(&text, id)),
    }
}

/// Starts a session on `url` (`initialize`, then `notifications/initialized`).
pub async fn initialize(url: &str) -> Session {
    initialize_with(url, json!({})).await
}

/// Starts a session on `url` whose client declares `capabilities`.
pub async fn initialize_with(url: &str, capabilities: Value) -> Session {
    initialize_as(url, None, capabilities).await
}

/// Starts a session on `url` as `caller` (its `Authorization`), whose
/// client declares `capabilities`.
pub async fn initialize_as(url: &str, caller: Option<&str>, capabilities: Value) -> Session {
    let mut request = client().post(url);
    if let Some(caller) = caller {
        request = request.header("Authorization", caller);
    }
    let response = request
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(
            json!({
                "jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {
                    "protocolVersion": LEGACY,
                    "capabilities": capabilities,
                    "clientInfo": {"name": "tower-e2e", "version": "1"}
                }
            })
            .to_string(),
        )
        .send()
        .await
        .expect("the server answers initialize");
    assert!(
        response.status().is_success(),
        "initialize: {}",
        response.status()
    );
    let id = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .expect("a session id")
        .to_owned();
    let text = response.text().await.unwrap();
    let answer = answer_in(&text, 1).expect("the initialize result");
    assert_eq!(answer["result"]["protocolVersion"], LEGACY, "{answer}");
    let session = Session {
        id,
        caller: caller.map(str::to_owned),
    };
    let done = post(
        url,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert!(done.status.is_success(), "initialized: {}", done.status);
    session
}

/// `DELETE`s a session; the HTTP status.
pub async fn delete(url: &str, session: &Session) -> reqwest::StatusCode {
    in_session(client().delete(url), session)
        .header("MCP-Protocol-Version", LEGACY)
        .send()
        .await
        .expect("the server answers DELETE")
        .status()
}

/// The status of a `GET` in `session` resuming after `cursor`.
pub async fn resume_status(url: &str, session: &Session, cursor: &str) -> reqwest::StatusCode {
    in_session(client().get(url), session)
        .header("Accept", "text/event-stream")
        .header("MCP-Protocol-Version", LEGACY)
        .header("Last-Event-ID", cursor)
        .send()
        .await
        .expect("the server answers GET")
        .status()
}

/// One SSE event: its id and data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: Option<String>,
    pub data: String,
}

/// An SSE stream read event by event: a session's GET stream, or the
/// response of a POST the server answered with one.
pub struct Stream {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
}

impl Stream {
    /// Opens the session's GET stream on `url`, resuming after
    /// `last_event_id` if given.
    pub async fn open(url: &str, session: &Session, last_event_id: Option<&str>) -> Self {
        let mut request = in_session(client().get(url), session)
            .header("Accept", "text/event-stream")
            .header("MCP-Protocol-Version", LEGACY);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.expect("the server answers GET");
        assert!(
            response.status().is_success(),
            "GET stream: {}",
            response.status()
        );
        Self::of(response)
    }

    /// POSTs `body` to `url` in `session` and reads the SSE stream the
    /// server answers with (it must answer with one).
    pub async fn post(url: &str, session: &Session, body: Value) -> Self {
        let response = legacy_post(url, Some(session), &body)
            .send()
            .await
            .expect("the server answers");
        assert!(
            response.status().is_success(),
            "POST: {}",
            response.status()
        );
        let kind = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            kind.starts_with("text/event-stream"),
            "a POST answered with an SSE stream, not {kind:?}"
        );
        Self::of(response)
    }

    fn of(response: reqwest::Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
        }
    }

    /// The next event with data (keep-alive comments skipped), waiting
    /// at most [`EVENTUALLY`].
    pub async fn next(&mut self) -> Event {
        tokio::time::timeout(EVENTUALLY, async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let block: String = self.buffer.drain(..end + 2).collect();
                    let mut event = Event {
                        id: None,
                        data: String::new(),
                    };
                    for line in block.lines() {
                        if let Some(id) = line.strip_prefix("id:") {
                            event.id = Some(id.trim().to_owned());
                        } else if let Some(data) = line.strip_prefix("data:") {
                            event.data.push_str(data.strip_prefix(' ').unwrap_or(data));
                        }
                    }
                    if !event.data.is_empty() {
                        return event;
                    }
                    continue;
                }
                let chunk = self
                    .body
                    .next()
                    .await
                    .expect("the stream stays open")
                    .expect("the stream reads");
                self.buffer
                    .push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
            }
        })
        .await
        .expect("an event within the guard")
    }
}

impl Stream {
    /// Waits (at most [`EVENTUALLY`]) for the server to end the stream,
    /// skipping what it sends first.
    pub async fn ends(mut self) {
        tokio::time::timeout(EVENTUALLY, async {
            while let Some(chunk) = self.body.next().await {
                if chunk.is_err() {
                    return;
                }
            }
        })
        .await
        .expect("the server ends the stream within the guard");
    }

    /// The next event whose JSON-RPC method is `method`, skipping others.
    pub async fn next_with_method(&mut self, method: &str) -> Value {
        loop {
            let message = self.next_message().await;
            if message["method"] == method {
                return message;
            }
        }
    }

    /// The next event that answers request `id` (a JSON-RPC response, no
    /// method), skipping others.
    pub async fn next_answer(&mut self, id: i64) -> Value {
        loop {
            let message = self.next_message().await;
            if message.get("method").is_none() && message["id"] == id {
                return message;
            }
        }
    }

    async fn next_message(&mut self) -> Value {
        let event = self.next().await;
        serde_json::from_str(&event.data).expect("a JSON-RPC message")
    }
}

/// The `_meta` every 2026-07-28 request carries: its revision, and the
/// client's capabilities, declaring the tasks extension.
fn final_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": FINAL,
        "io.modelcontextprotocol/clientInfo": {"name": "tower-e2e", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        }
    })
}

/// A 2026-07-28 request: `method` with `params` (plus `_meta`), `name` in
/// the `Mcp-Name` header; the JSON-RPC answer.
pub async fn request(url: &str, method: &str, name: &str, params: Value) -> Value {
    request_as(url, None, method, name, params).await
}

/// [`request`] as `caller` (its `Authorization`; `None`: anonymously).
pub async fn request_as(
    url: &str,
    caller: Option<&str>,
    method: &str,
    name: &str,
    params: Value,
) -> Value {
    let mut request = final_post(url, method, name, params);
    if let Some(caller) = caller {
        request = request.header("Authorization", caller);
    }
    let response = request.send().await.expect("the server answers");
    let text = response.text().await.expect("a body");
    answer_in(&text, 7).unwrap_or_else(|| panic!("no answer to {method} in {text}"))
}

/// A 2026-07-28 request (id 7) of `method` with `params` (plus `_meta`),
/// `name` in the `Mcp-Name` header (none if empty), ready to send.
fn final_post(url: &str, method: &str, name: &str, mut params: Value) -> reqwest::RequestBuilder {
    params["_meta"] = final_meta();
    let request = client()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", FINAL)
        .header("Mcp-Method", method)
        .body(json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string());
    match name {
        "" => request,
        name => request.header("Mcp-Name", name),
    }
}

/// `subscriptions/listen` for the status of `tasks`: the stream the
/// server answers with.
pub async fn listen_to_tasks(url: &str, tasks: &[&str]) -> Stream {
    let params = json!({"notifications": {"taskIds": tasks}});
    let response = final_post(url, "subscriptions/listen", "", params)
        .send()
        .await
        .expect("the server answers");
    assert!(
        response.status().is_success(),
        "subscriptions/listen: {}",
        response.status()
    );
    Stream::of(response)
}

/// `tools/call` of `tool` as a task; the task's id.
pub async fn start_task(url: &str, tool: &str, arguments: Value) -> String {
    let answer = request(
        url,
        "tools/call",
        tool,
        json!({"name": tool, "arguments": arguments}),
    )
    .await;
    assert_eq!(answer["result"]["resultType"], "task", "{answer}");
    answer["result"]["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned()
}

/// `tasks/get`: the task's result object.
pub async fn get_task(url: &str, task: &str) -> Value {
    let answer = request(url, "tasks/get", task, json!({"taskId": task})).await;
    answer
        .get("result")
        .cloned()
        .unwrap_or_else(|| panic!("tasks/get {task}: {answer}"))
}

/// `tasks/get` until `done` says so, at most [`EVENTUALLY`]; the task.
pub async fn task_until(url: &str, task: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    tokio::time::timeout(EVENTUALLY, async {
        loop {
            let seen = get_task(url, task).await;
            if done(&seen) {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("task {task} never became {what}"))
}

/// How many counts run on the server at `url` now (`running_counts`).
pub async fn running_counts(url: &str) -> u64 {
    let answer = request(
        url,
        "tools/call",
        "running_counts",
        json!({"name": "running_counts", "arguments": {}}),
    )
    .await;
    answer["result"]["content"][0]["text"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("running_counts: {answer}"))
}

/// `running_counts` on `url` until it is `want`, at most [`EVENTUALLY`].
pub async fn counts_until(url: &str, want: u64) {
    tokio::time::timeout(EVENTUALLY, async {
        while running_counts(url).await != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{url} never ran {want} counts"));
}
