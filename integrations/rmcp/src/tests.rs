//! The adapter against every message shape rmcp can send, and against the
//! in-memory store.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rmcp::model::*;
use rmcp::transport::streamable_http_server::session::{
    EventStore as _, ServerSseMessage, SessionState, SessionStore as _,
};
use serde_json::{Value, json};

use super::*;
use mcp_event_store_core::{EventId, EventStore, MemoryStore, NewEvent, SessionStore, StoredEvent};

/// The adapter with plain replays, which end at the newest stored event:
/// what these tests collect.
fn replaying<S: EventStore + ?Sized>(store: Arc<S>) -> Arc<RmcpEventStore<S>> {
    Arc::new(RmcpEventStore::new(store).without_follow())
}

/// The bytes rmcp writes for a message on a live stream.
fn wire(message: &ServerJsonRpcMessage) -> String {
    serde_json::to_string(message).unwrap()
}

/// Appends `message` through the adapter and replays it; the replayed frame
/// must be the live one, byte for byte.
async fn assert_replays_exactly(name: &str, message: ServerJsonRpcMessage) {
    let store = Arc::new(MemoryStore::new());
    let rmcp_store = replaying(store.clone());
    let live = wire(&message);
    let cursor = rmcp_store
        .store_event("s", &ServerSseMessage::retry(Duration::from_secs(1)))
        .await
        .unwrap();
    let id = rmcp_store
        .store_event("s", &ServerSseMessage::from_message(message))
        .await
        .unwrap();
    let replayed: Vec<ServerSseMessage> = rmcp_store
        .replay_events_after(&cursor)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(replayed.len(), 1, "{name}");
    assert_eq!(replayed[0].event_id.as_deref(), Some(id.as_str()), "{name}");
    let again = wire(replayed[0].message.as_deref().expect("a message"));
    assert_eq!(
        again, live,
        "{name}: replayed frame differs from the live one"
    );
    assert!(replays_exactly(live.as_bytes()), "{name}");
}

fn response(result: ServerResult) -> ServerJsonRpcMessage {
    ServerJsonRpcMessage::response(result, RequestId::Number(7))
}

/// A result variant built from JSON into its own type (not through the
/// untagged union, which is what a replay does), so shadowing shows.
fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

macro_rules! result_cases {
    ($($name:literal => $variant:ident($value:expr),)*) => {
        vec![$(($name, ServerResult::$variant($value)),)*]
    };
}

fn results() -> Vec<(&'static str, ServerResult)> {
    result_cases![
        "empty result (ping)" => EmptyResult(EmptyObject {}),
        "initialize" => InitializeResult(typed(json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {"listChanged": true}},
            "serverInfo": {"name": "s", "version": "1"},
            "instructions": "be nice"
        }))),
        "complete, default" => CompleteResult(CompleteResult::default()),
        "complete, legacy" => CompleteResult(typed(json!({"completion": {"values": ["a"], "hasMore": false}}))),
        "get prompt" => GetPromptResult(typed(json!({
            "description": "d",
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]
        }))),
        "list prompts, default" => ListPromptsResult(ListPromptsResult::default()),
        "list prompts, legacy empty" => ListPromptsResult(typed(json!({"prompts": []}))),
        "list resources, default" => ListResourcesResult(ListResourcesResult::default()),
        "list resources, legacy empty" => ListResourcesResult(typed(json!({"resources": []}))),
        "list resources, one" => ListResourcesResult(typed(json!({
            "resources": [{"uri": "file:///a", "name": "a"}], "nextCursor": "c"
        }))),
        "list resource templates, default" => ListResourceTemplatesResult(ListResourceTemplatesResult::default()),
        "list resource templates, legacy empty" => ListResourceTemplatesResult(typed(json!({"resourceTemplates": []}))),
        "read resource" => ReadResourceResult(typed(json!({
            "contents": [{"uri": "file:///a", "mimeType": "text/plain", "text": "x"}]
        }))),
        "read resource, empty" => ReadResourceResult(typed(json!({"contents": []}))),
        "list tools, default" => ListToolsResult(ListToolsResult::default()),
        "list tools, legacy empty" => ListToolsResult(typed(json!({"tools": []}))),
        "list tools, one" => ListToolsResult(typed(json!({"tools": [{
            "name": "slow", "description": "d",
            "inputSchema": {"type": "object", "properties": {"count": {"type": "integer"}}}
        }]}))),
        "list skills, default" => ListSkillsResult(ListSkillsResult::default()),
        "elicit" => ElicitResult(typed(json!({"action": "accept", "content": {"b": 1, "a": 2}}))),
        "elicit, decline" => ElicitResult(typed(json!({"action": "decline"}))),
        "call tool, text" => CallToolResult(CallToolResult::success(vec![ContentBlock::text("done")])),
        "call tool, error" => CallToolResult(CallToolResult::error(vec![ContentBlock::text("no")])),
        "call tool, empty content" => CallToolResult(CallToolResult::success(vec![])),
        "call tool, legacy" => CallToolResult(typed(json!({"content": [{"type": "text", "text": "x"}]}))),
        "call tool, structured" => CallToolResult(CallToolResult::structured(json!({"z": 1, "a": [1.5, -0.0, 1e300]}))),
        "call tool, structured null" => CallToolResult(typed(json!({"content": [], "structuredContent": null}))),
        "call tool, image" => CallToolResult(CallToolResult::success(vec![ContentBlock::image("aGk=", "image/png")])),
        "task ack" => TaskAckResult(TaskAckResult::new()),
        "input required" => InputRequiredResult(typed(json!({
            "resultType": "input_required", "requestState": "opaque"
        }))),
        "create task" => CreateTaskResult(typed(json!({
            "resultType": "task", "taskId": "t1", "status": "working",
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
            "ttlMs": 60000, "pollIntervalMs": 500
        }))),
        "get task" => GetTaskResult(typed(json!({
            "resultType": "complete", "taskId": "t1", "status": "working",
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
            "ttlMs": 60000
        }))),
        "discover" => DiscoverResult(typed(json!({
            "resultType": "complete", "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}}, "ttlMs": 1000, "cacheScope": "public"
        }))),
        "subscriptions listen" => SubscriptionsListenResult(typed(json!({
            "resultType": "complete",
            "_meta": {"io.modelcontextprotocol/subscriptionId": 5}
        }))),
        "call tool, with meta" => CallToolResult(typed(json!({
            "content": [{"type": "text", "text": "x"}], "_meta": {"z": 1, "a": {"y": 2, "b": 3}}
        }))),
        "custom result, object" => CustomResult(CustomResult(json!({"anything": [1, 2, {"nested": true}]}))),
        "custom result, scalar" => CustomResult(CustomResult(json!(42))),
    ]
}

#[tokio::test]
async fn every_result_variant_replays_byte_for_byte() {
    let mut failures = Vec::new();
    for (name, result) in results() {
        let message = response(result);
        let live = wire(&message);
        if !replays_exactly(live.as_bytes()) {
            let again = serde_json::to_string(
                &serde_json::from_str::<ServerJsonRpcMessage>(&live).unwrap(),
            )
            .unwrap();
            failures.push(format!("{name}:\n  live   {live}\n  replay {again}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn notification(value: Value) -> ServerJsonRpcMessage {
    let notification: ServerNotification = serde_json::from_value(value).unwrap();
    ServerJsonRpcMessage::notification(notification)
}

fn notifications() -> Vec<(&'static str, ServerJsonRpcMessage)> {
    vec![
        (
            "progress",
            ServerJsonRpcMessage::notification(ServerNotification::ProgressNotification(typed(
                json!({"method": "notifications/progress", "params": {
                    "progressToken": "tok", "progress": 3.0, "total": 10.0, "message": "3 of 10"
                }}),
            ))),
        ),
        (
            "progress, numeric token, fractional",
            ServerJsonRpcMessage::notification(ServerNotification::ProgressNotification(typed(
                json!({"method": "notifications/progress", "params": {
                    "progressToken": 99, "progress": 0.1
                }}),
            ))),
        ),
        (
            "cancelled",
            ServerJsonRpcMessage::notification(ServerNotification::CancelledNotification(typed(
                json!({"method": "notifications/cancelled", "params": {"requestId": 4, "reason": "x"}}),
            ))),
        ),
        (
            "logging",
            ServerJsonRpcMessage::notification(ServerNotification::LoggingMessageNotification(
                typed(json!({"method": "notifications/message", "params": {
                    "level": "info", "logger": "l", "data": {"k": "v", "emoji": "\u{1F980}\n\"q\""}
                }})),
            )),
        ),
        (
            "resource updated",
            ServerJsonRpcMessage::notification(ServerNotification::ResourceUpdatedNotification(
                typed(
                    json!({"method": "notifications/resources/updated", "params": {"uri": "file:///a"}}),
                ),
            )),
        ),
        (
            "resource list changed",
            ServerJsonRpcMessage::notification(
                ServerNotification::ResourceListChangedNotification(typed(
                    json!({"method": "notifications/resources/list_changed"}),
                )),
            ),
        ),
        (
            "tool list changed",
            ServerJsonRpcMessage::notification(ServerNotification::ToolListChangedNotification(
                typed(json!({"method": "notifications/tools/list_changed"})),
            )),
        ),
        (
            "prompt list changed",
            ServerJsonRpcMessage::notification(ServerNotification::PromptListChangedNotification(
                typed(json!({"method": "notifications/prompts/list_changed"})),
            )),
        ),
        (
            "custom notification",
            ServerJsonRpcMessage::notification(ServerNotification::CustomNotification(typed(
                json!({"method": "x/custom", "params": {"b": [true, null], "a": 1}}),
            ))),
        ),
        (
            "custom notification, no params",
            notification(json!({"method": "x/bare"})),
        ),
    ]
}

fn requests() -> Vec<(&'static str, ServerJsonRpcMessage)> {
    let request =
        |request: ServerRequest, id: RequestId| ServerJsonRpcMessage::request(request, id);
    vec![
        (
            "ping request",
            request(
                ServerRequest::PingRequest(typed(json!({"method": "ping"}))),
                RequestId::Number(1),
            ),
        ),
        (
            "create message",
            request(
                ServerRequest::CreateMessageRequest(typed(json!({
                    "method": "sampling/createMessage",
                    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                               "maxTokens": 10}
                }))),
                RequestId::String("req-\u{e9}".into()),
            ),
        ),
        (
            "list roots",
            request(
                ServerRequest::ListRootsRequest(typed(json!({"method": "roots/list"}))),
                RequestId::Number(-3),
            ),
        ),
        (
            "elicit",
            request(
                ServerRequest::ElicitRequest(typed(json!({
                    "method": "elicitation/create",
                    "params": {"message": "name?", "requestedSchema": {"type": "object", "properties": {
                        "name": {"type": "string"}}}}
                }))),
                RequestId::Number(i64::MAX),
            ),
        ),
        (
            "custom request",
            request(
                ServerRequest::CustomRequest(typed(json!({"method": "x/ask", "params": {"q": 1}}))),
                RequestId::Number(0),
            ),
        ),
    ]
}

fn errors() -> Vec<(&'static str, ServerJsonRpcMessage)> {
    vec![
        (
            "error",
            ServerJsonRpcMessage::error(
                ErrorData::new(ErrorCode::INVALID_PARAMS, "bad count", None),
                Some(RequestId::Number(7)),
            ),
        ),
        (
            "error with data",
            ServerJsonRpcMessage::error(
                ErrorData::new(
                    ErrorCode::INTERNAL_ERROR,
                    "boom",
                    Some(json!({"z": [1, 2], "a": "b"})),
                ),
                Some(RequestId::String("s".into())),
            ),
        ),
        (
            "error without id",
            ServerJsonRpcMessage::error(ErrorData::new(ErrorCode::PARSE_ERROR, "?", None), None),
        ),
    ]
}

#[tokio::test]
async fn every_message_kind_replays_byte_for_byte_through_a_store() {
    let all = results()
        .into_iter()
        .map(|(name, result)| (name, response(result)))
        .chain(notifications())
        .chain(requests())
        .chain(errors());
    for (name, message) in all {
        assert_replays_exactly(name, message).await;
    }
}

/// Custom messages shaped like known ones: rmcp's untagged enums read them
/// as the known type and drop the extra fields; the decoder notices and
/// replays them as the custom variant they were.
#[tokio::test]
async fn custom_messages_that_look_like_known_ones_replay_byte_for_byte() {
    let cases = vec![
        (
            "custom result shaped like tools/list",
            response(ServerResult::CustomResult(CustomResult(
                json!({"tools": [], "extra": 1}),
            ))),
        ),
        (
            "custom result shaped like a tool result",
            response(ServerResult::CustomResult(CustomResult(
                json!({"content": [], "isError": false, "extra": {"deep": [1]}}),
            ))),
        ),
        (
            "custom notification named like progress",
            ServerJsonRpcMessage::notification(ServerNotification::CustomNotification(
                CustomNotification::new(
                    "notifications/progress",
                    Some(json!({"progressToken": 1, "progress": 1.0, "extra": true})),
                ),
            )),
        ),
        (
            "custom notification named like list_changed, with params",
            ServerJsonRpcMessage::notification(ServerNotification::CustomNotification(
                CustomNotification::new("notifications/tools/list_changed", Some(json!({"x": 1}))),
            )),
        ),
        (
            "custom request named ping, with params",
            ServerJsonRpcMessage::request(
                ServerRequest::CustomRequest(CustomRequest::new("ping", Some(json!({"x": 1})))),
                RequestId::Number(1),
            ),
        ),
    ];
    for (name, message) in cases {
        let live = wire(&message);
        let naive = wire(&serde_json::from_str::<ServerJsonRpcMessage>(&live).unwrap());
        assert_ne!(
            naive, live,
            "{name}: rmcp's plain parse should lose fields here"
        );
        assert_replays_exactly(name, message).await;
    }
}

fn text_notification(n: u32) -> ServerSseMessage {
    ServerSseMessage::from_message(ServerJsonRpcMessage::notification(
        ServerNotification::LoggingMessageNotification(typed(json!({
            "method": "notifications/message",
            "params": {"level": "info", "data": n}
        }))),
    ))
}

/// The event ids a replay after `cursor` yields, in order.
async fn replayed_ids(
    store: &impl rmcp::transport::streamable_http_server::session::EventStore,
    cursor: &str,
) -> Vec<String> {
    store
        .replay_events_after(cursor)
        .await
        .unwrap()
        .map(|m| m.event_id.unwrap())
        .collect()
        .await
}

#[tokio::test]
async fn priming_events_and_retry_hints_round_trip() {
    let store = replaying(Arc::new(MemoryStore::new()));
    let cursor = store.store_event("s", &text_notification(0)).await.unwrap();
    let priming = store
        .store_event("s", &ServerSseMessage::retry(Duration::from_millis(2500)))
        .await
        .unwrap();
    let mut with_retry = text_notification(1);
    with_retry.retry = Some(Duration::from_secs(7));
    let hinted = store.store_event("s", &with_retry).await.unwrap();
    let bare = store
        .store_event("s", &ServerSseMessage::default())
        .await
        .unwrap();
    // The id rmcp may have put on a message is not what gets stored.
    let mut stale = text_notification(2);
    stale.event_id = Some("0/3".into());
    let last = store.store_event("s", &stale).await.unwrap();

    let replayed: Vec<ServerSseMessage> = store
        .replay_events_after(&cursor)
        .await
        .unwrap()
        .collect()
        .await;
    let ids: Vec<_> = replayed
        .iter()
        .map(|m| m.event_id.clone().unwrap())
        .collect();
    assert_eq!(ids, [priming, hinted, bare, last.clone()]);
    assert!(replayed[0].message.is_none());
    assert_eq!(replayed[0].retry, Some(Duration::from_millis(2500)));
    assert!(replayed[1].message.is_some());
    assert_eq!(replayed[1].retry, Some(Duration::from_secs(7)));
    assert!(replayed[2].message.is_none());
    assert_eq!(replayed[2].retry, None);
    assert_eq!(replayed[3].event_id.as_deref(), Some(last.as_str()));
    assert_eq!(
        wire(replayed[3].message.as_deref().unwrap()),
        wire(stale.message.as_deref().unwrap())
    );
}

#[tokio::test]
async fn resuming_from_any_replayed_id_gives_the_rest() {
    let store = replaying(Arc::new(MemoryStore::new()));
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(store.store_event("s", &text_notification(n)).await.unwrap());
    }
    store
        .store_event("other", &text_notification(99))
        .await
        .unwrap();
    for (at, id) in ids.iter().enumerate() {
        let replayed = replayed_ids(&*store, id).await;
        assert_eq!(replayed, ids[at + 1..]);
    }
}

#[tokio::test]
async fn refused_ids_are_errors_that_keep_the_store_error() {
    let store = Arc::new(MemoryStore::new());
    let rmcp_store = store.clone().into_rmcp();
    let id = rmcp_store
        .store_event("s", &text_notification(0))
        .await
        .unwrap();
    let truncated = &id[..id.len() - 1];
    for bad in [
        "",
        "garbage",
        "0/1",
        truncated,
        "v1.0123456789abcdefghijklmn.1",
    ] {
        let Err(err) = rmcp_store.replay_events_after(bad).await else {
            panic!("{bad:?} must be refused");
        };
        let adapter = err
            .downcast_ref::<AdapterError>()
            .expect("an adapter error");
        assert!(matches!(
            adapter,
            AdapterError::Store {
                operation: "replay",
                ..
            }
        ));
        let source = std::error::Error::source(adapter)
            .and_then(|s| s.downcast_ref::<mcp_event_store_core::Error>())
            .expect("the store's error is the source");
        assert!(
            matches!(source, mcp_event_store_core::Error::UnknownEventId { .. }),
            "{bad:?}: {source}"
        );
    }
}

/// A store whose replay yields two events, then fails, then would yield more.
struct BreaksMidReplay(MemoryStore);

#[async_trait::async_trait]
impl EventStore for BreaksMidReplay {
    async fn store_event(
        &self,
        stream_id: &str,
        event: NewEvent<'_>,
    ) -> mcp_event_store_core::Result<EventId> {
        self.0.store_event(stream_id, event).await
    }
    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> mcp_event_store_core::Result<mcp_event_store_core::Replay> {
        let mut replay = self.0.replay_events_after(last_event_id).await?;
        let events: Vec<_> = replay.events.collect().await;
        let mut broken: Vec<mcp_event_store_core::Result<StoredEvent>> =
            events.into_iter().take(2).collect();
        broken.push(Err(mcp_event_store_core::Error::events_purged(
            last_event_id,
        )));
        broken.push(Ok(StoredEvent {
            id: last_event_id.parse().unwrap(),
            data: bytes::Bytes::new(),
            retry: None,
        }));
        replay.events = mcp_event_store_core::ReplayEvents::new(futures_util::stream::iter(broken));
        Ok(replay)
    }
    async fn get_stream_id_for_event_id(
        &self,
        event_id: &str,
    ) -> mcp_event_store_core::Result<Option<String>> {
        self.0.get_stream_id_for_event_id(event_id).await
    }
    async fn delete_stream(&self, stream_id: &str) -> mcp_event_store_core::Result<u64> {
        self.0.delete_stream(stream_id).await
    }
    async fn purge_expired(
        &self,
    ) -> mcp_event_store_core::Result<mcp_event_store_core::PurgeReport> {
        self.0.purge_expired().await
    }
    async fn follow_events_after(
        &self,
        last_event_id: &str,
        _: mcp_event_store_core::FollowOptions,
    ) -> mcp_event_store_core::Result<mcp_event_store_core::Replay> {
        self.replay_events_after(last_event_id).await
    }
    fn open_follows(&self) -> usize {
        0
    }
    fn retention(&self) -> mcp_event_store_core::Retention {
        mcp_event_store_core::Retention::default()
    }
    async fn stats(&self) -> mcp_event_store_core::Result<mcp_event_store_core::StoreStats> {
        self.0.stats().await
    }
    async fn list_streams(
        &self,
        after: Option<&mcp_event_store_core::StreamCursor>,
        limit: usize,
    ) -> mcp_event_store_core::Result<mcp_event_store_core::StreamPage> {
        self.0.list_streams(after, limit).await
    }
    async fn check(&self) -> mcp_event_store_core::Result<mcp_event_store_core::HealthReport> {
        self.0.check().await
    }
}

#[tokio::test]
async fn an_error_mid_replay_ends_the_stream_after_what_was_read() {
    let store = Arc::new(BreaksMidReplay(MemoryStore::new())).into_rmcp();
    let cursor = store.store_event("s", &text_notification(0)).await.unwrap();
    let mut ids = Vec::new();
    for n in 1..5 {
        ids.push(store.store_event("s", &text_notification(n)).await.unwrap());
    }
    let replayed = replayed_ids(&*store, &cursor).await;
    assert_eq!(replayed, ids[..2], "the two good events, then the end");
}

#[tokio::test]
async fn an_unreadable_payload_ends_the_replay_before_it() {
    let store = Arc::new(MemoryStore::new());
    let rmcp_store = store.clone().into_rmcp();
    let cursor = rmcp_store
        .store_event("s", &text_notification(0))
        .await
        .unwrap();
    let good = rmcp_store
        .store_event("s", &text_notification(1))
        .await
        .unwrap();
    store
        .store_event("s", NewEvent::new(b"{not json"))
        .await
        .unwrap();
    rmcp_store
        .store_event("s", &text_notification(3))
        .await
        .unwrap();
    let replayed = replayed_ids(&*rmcp_store, &cursor).await;
    assert_eq!(replayed, [good]);
}

#[test]
fn adapters_are_what_rmcp_needs_for_any_store() {
    fn rmcp_event_store<T: rmcp::transport::streamable_http_server::session::EventStore>() {}
    fn rmcp_session_store<T: rmcp::transport::streamable_http_server::session::SessionStore>() {}
    rmcp_event_store::<RmcpEventStore<MemoryStore>>();
    rmcp_event_store::<RmcpEventStore<dyn mcp_event_store_core::Store>>();
    rmcp_event_store::<RmcpEventStore<dyn EventStore>>();
    rmcp_session_store::<RmcpSessionStore<dyn mcp_event_store_core::Store>>();
    rmcp_session_store::<RmcpSessionStore<dyn mcp_event_store_core::SessionStore>>();

    let dyn_store: Arc<dyn mcp_event_store_core::Store> = Arc::new(MemoryStore::new());
    let _events: Arc<dyn rmcp::transport::streamable_http_server::session::EventStore> =
        dyn_store.clone().into_rmcp();
    let _sessions: Arc<dyn rmcp::transport::streamable_http_server::session::SessionStore> =
        dyn_store.into_rmcp_sessions();
}

fn session_state(client: &str) -> SessionState {
    SessionState::new(typed(json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": client, "version": "1.0"}
    })))
}

#[tokio::test]
async fn sessions_round_trip_and_are_deleted() {
    let store = Arc::new(MemoryStore::new());
    let sessions = store.clone().into_rmcp_sessions();
    assert!(sessions.load("s1").await.unwrap().is_none());
    sessions.store("s1", &session_state("a")).await.unwrap();
    sessions.store("s2", &session_state("b")).await.unwrap();
    let loaded = sessions.load("s1").await.unwrap().expect("stored");
    assert_eq!(loaded.initialize_params.client_info.name, "a");
    assert_eq!(
        serde_json::to_value(&loaded).unwrap(),
        serde_json::to_value(session_state("a")).unwrap()
    );
    // Kept under the prefix, so other users of the store are not disturbed.
    assert!(store.get_session("rmcp/s1").await.unwrap().is_some());
    assert!(store.get_session("s1").await.unwrap().is_none());
    sessions.delete("s1").await.unwrap();
    sessions.delete("s1").await.unwrap();
    assert!(sessions.load("s1").await.unwrap().is_none());
    assert!(sessions.load("s2").await.unwrap().is_some());
}

#[tokio::test]
async fn session_ids_no_store_could_hold_are_unknown_not_errors() {
    let store = Arc::new(MemoryStore::new());
    let sessions = RmcpSessionStore::new(store).with_key_prefix("");
    let huge = "x".repeat(5000);
    for id in ["", huge.as_str()] {
        assert!(sessions.load(id).await.unwrap().is_none());
        sessions.delete(id).await.unwrap();
    }
    let err = sessions
        .store(&huge, &session_state("a"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("session"), "{err}");
}

#[tokio::test]
async fn sessions_expire_after_their_ttl_and_loads_refresh_it() {
    let clock = Arc::new(mcp_event_store_core::ManualClock::new(1_000_000));
    let store = Arc::new(MemoryStore::with_options(
        mcp_event_store_core::StoreOptions::default().clock(clock.clone()),
    ));
    let sessions = RmcpSessionStore::new(store.clone()).with_ttl(Duration::from_secs(60));
    let fixed = RmcpSessionStore::new(store)
        .with_ttl(Duration::from_secs(60))
        .with_key_prefix("fixed/")
        .refresh_on_load(false);
    sessions.store("s", &session_state("a")).await.unwrap();
    fixed.store("s", &session_state("a")).await.unwrap();

    clock.advance(Duration::from_secs(45));
    assert!(sessions.load("s").await.unwrap().is_some());
    assert!(fixed.load("s").await.unwrap().is_some());
    clock.advance(Duration::from_secs(45));
    assert!(
        sessions.load("s").await.unwrap().is_some(),
        "refreshed at 45 s"
    );
    assert!(fixed.load("s").await.unwrap().is_none(), "expired at 60 s");
    clock.advance(Duration::from_secs(61));
    assert!(sessions.load("s").await.unwrap().is_none());
}

#[tokio::test]
async fn unreadable_session_state_is_an_error_with_its_source() {
    let store = Arc::new(MemoryStore::new());
    store
        .put_session_as(
            &mcp_event_store_core::task::Owner::Anonymous,
            "rmcp/s",
            b"{}",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let err = store.into_rmcp_sessions().load("s").await.unwrap_err();
    let adapter = err.downcast_ref::<AdapterError>().unwrap();
    assert!(matches!(adapter, AdapterError::SessionState { .. }));
    assert!(std::error::Error::source(adapter).is_some());
}

/// An rmcp response answering request 7 on stream `s`.
fn answer() -> ServerSseMessage {
    ServerSseMessage::from_message(response(ServerResult::EmptyResult(EmptyObject {})))
}

#[tokio::test]
async fn a_resume_mid_call_follows_the_stream_to_its_answer() {
    let store = Arc::new(MemoryStore::new()).into_rmcp();
    let cursor = store
        .store_event("s:1", &text_notification(0))
        .await
        .unwrap();
    let stored = store
        .store_event("s:1", &text_notification(1))
        .await
        .unwrap();
    let mut resumed = store.replay_events_after(&cursor).await.unwrap();
    let first = resumed.next().await.unwrap();
    assert_eq!(first.event_id.as_deref(), Some(stored.as_str()));
    // The call goes on after the resume: progress, then its answer, then
    // (on a misbehaving server) more; the resume ends with the answer.
    let live = store
        .store_event("s:1", &text_notification(2))
        .await
        .unwrap();
    let answered = store.store_event("s:1", &answer()).await.unwrap();
    store
        .store_event("s:1", &text_notification(3))
        .await
        .unwrap();
    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(30), resumed.collect::<Vec<_>>())
        .await
        .expect("the resume ends after the answer");
    let ids: Vec<_> = rest.iter().map(|m| m.event_id.clone().unwrap()).collect();
    assert_eq!(ids, [live, answered]);
    assert_eq!(store.inner().open_follows(), 0);
}

#[tokio::test]
async fn a_resume_of_an_answered_call_ends_after_the_stored_answer() {
    let store = Arc::new(MemoryStore::new()).into_rmcp();
    let cursor = store
        .store_event("s:1", &text_notification(0))
        .await
        .unwrap();
    let answered = store.store_event("s:1", &answer()).await.unwrap();
    let replayed = tokio::time::timeout(Duration::from_secs(30), replayed_ids(&*store, &cursor))
        .await
        .expect("no wait for what is stored");
    assert_eq!(replayed, [answered]);
}

#[tokio::test]
async fn the_standalone_stream_is_followed_until_the_hold() {
    let store = Arc::new(
        RmcpEventStore::new(Arc::new(MemoryStore::new()))
            .with_follow_hold(Duration::from_millis(300)),
    );
    let cursor = store
        .store_event("session:common", &text_notification(0))
        .await
        .unwrap();
    let mut resumed = store.replay_events_after(&cursor).await.unwrap();
    // An answer-shaped message does not end the standalone stream.
    let live = store
        .store_event("session:common", &answer())
        .await
        .unwrap();
    let next = store
        .store_event("session:common", &text_notification(1))
        .await
        .unwrap();
    assert_eq!(resumed.next().await.unwrap().event_id, Some(live));
    assert_eq!(resumed.next().await.unwrap().event_id, Some(next));
    let end = tokio::time::timeout(Duration::from_secs(30), resumed.next())
        .await
        .expect("the hold ends the follow");
    assert!(end.is_none());
}

#[tokio::test]
async fn without_follow_a_resume_ends_with_what_is_stored() {
    let store = replaying(Arc::new(MemoryStore::new()));
    let cursor = store
        .store_event("s:1", &text_notification(0))
        .await
        .unwrap();
    let stored = store
        .store_event("s:1", &text_notification(1))
        .await
        .unwrap();
    let replayed = tokio::time::timeout(Duration::from_secs(30), replayed_ids(&*store, &cursor))
        .await
        .expect("a plain replay ends");
    assert_eq!(replayed, [stored]);
    assert_eq!(store.follow_hold(), None);
}
