//! `ServerSseMessage` to and from our events.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CustomNotification, CustomRequest, CustomResult, JsonRpcMessage, ServerJsonRpcMessage,
    ServerNotification, ServerRequest, ServerResult,
};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use serde_json::Value;

use mcp_event_store_core::StoredEvent;

/// The payload and retry hint to store for an rmcp SSE message.
///
/// The payload is the JSON-RPC message serialized exactly as rmcp writes it
/// to the wire, or empty when the message carries none (a priming event or a
/// bare retry hint). The message's `event_id` is not stored: the store
/// assigns ids.
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_rmcp::encode;
/// use rmcp::transport::streamable_http_server::session::ServerSseMessage;
///
/// let (payload, retry) = encode(&ServerSseMessage::retry(Duration::from_secs(3))).unwrap();
/// assert!(payload.is_empty());
/// assert_eq!(retry, Some(Duration::from_secs(3)));
/// ```
pub fn encode(message: &ServerSseMessage) -> serde_json::Result<(Vec<u8>, Option<Duration>)> {
    let payload = match &message.message {
        Some(json_rpc) => serde_json::to_vec(json_rpc.as_ref())?,
        None => Vec::new(),
    };
    Ok((payload, message.retry))
}

/// A stored payload that does not parse as a server JSON-RPC message.
#[derive(Debug, thiserror::Error)]
#[error("stored event {event_id} is not a server JSON-RPC message: {source}")]
pub struct DecodeError {
    /// The event's id.
    pub event_id: String,
    /// What the JSON parser said.
    #[source]
    pub source: serde_json::Error,
}

/// The rmcp SSE message a stored event replays as: its original id, its
/// retry hint and, unless the payload is empty, its JSON-RPC message.
///
/// The message is parsed into rmcp's typed `ServerJsonRpcMessage`, then
/// checked: serializing it again (as rmcp will, to write the SSE frame) must
/// give back the stored bytes. rmcp's message enums are untagged, so a
/// *custom* message that happens to look like a known one (a custom result
/// `{"tools":[],"extra":1}`, a custom notification named
/// `notifications/progress` with extra parameters) parses as the known type
/// and would lose its extra fields. When the check fails, the message is
/// rebuilt as the custom variant it must have been (`CustomResult`,
/// `CustomNotification`, `CustomRequest`, which keep every field) and checked
/// again. The check writes into a comparator, not a buffer: no allocation.
///
/// ```
/// use bytes::Bytes;
/// use mcp_event_store_rmcp::decode;
/// use mcp_event_store_core::{EventId, StoredEvent};
///
/// let id: EventId = "v1.0123456789abcdefghijklmn.2a".parse().unwrap();
/// let event = StoredEvent {
///     id,
///     data: Bytes::from_static(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#),
///     retry: None,
/// };
/// let message = decode(&event).unwrap();
/// assert_eq!(message.event_id.as_deref(), Some("v1.0123456789abcdefghijklmn.2a"));
/// assert!(message.message.is_some());
/// ```
pub fn decode(event: &StoredEvent) -> Result<ServerSseMessage, DecodeError> {
    let mut message = ServerSseMessage::default();
    message.event_id = Some(event.id.to_string());
    message.retry = event.retry;
    if !event.data.is_empty() {
        let json_rpc = decode_payload(&event.data).map_err(|source| DecodeError {
            event_id: event.id.to_string(),
            source,
        })?;
        message.message = Some(Arc::new(json_rpc));
    }
    Ok(message)
}

/// Parses a non-empty payload into the message that serializes back to it.
fn decode_payload(payload: &[u8]) -> serde_json::Result<ServerJsonRpcMessage> {
    let typed: ServerJsonRpcMessage = serde_json::from_slice(payload)?;
    if serializes_to(&typed, payload) {
        return Ok(typed);
    }
    let custom = as_custom(typed.clone(), serde_json::from_slice(payload)?);
    if let Some(custom) = custom
        && serializes_to(&custom, payload)
    {
        return Ok(custom);
    }
    tracing::debug!(
        bytes = payload.len(),
        "a stored message does not replay byte for byte; sending rmcp's reading of it"
    );
    Ok(typed)
}

/// The same message as the custom variant of its kind, carrying every field
/// of the stored JSON.
fn as_custom(typed: ServerJsonRpcMessage, mut raw: Value) -> Option<ServerJsonRpcMessage> {
    let method = |raw: &Value| raw.get("method").and_then(Value::as_str).map(str::to_owned);
    let params = |raw: &mut Value| raw.get_mut("params").map(Value::take);
    match typed {
        JsonRpcMessage::Response(mut response) => {
            response.result =
                ServerResult::CustomResult(CustomResult(raw.get_mut("result")?.take()));
            Some(JsonRpcMessage::Response(response))
        }
        JsonRpcMessage::Notification(mut notification) => {
            let method = method(&raw)?;
            notification.notification = ServerNotification::CustomNotification(
                CustomNotification::new(method, params(&mut raw)),
            );
            Some(JsonRpcMessage::Notification(notification))
        }
        JsonRpcMessage::Request(mut request) => {
            let method = method(&raw)?;
            request.request =
                ServerRequest::CustomRequest(CustomRequest::new(method, params(&mut raw)));
            Some(JsonRpcMessage::Request(request))
        }
        JsonRpcMessage::Error(_) => None,
    }
}

/// Whether `message` serializes to exactly `expected`, checked as it is
/// written, without a buffer, stopping at the first difference.
fn serializes_to(message: &ServerJsonRpcMessage, expected: &[u8]) -> bool {
    struct Compare<'a> {
        rest: &'a [u8],
    }
    impl io::Write for Compare<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            match self.rest.strip_prefix(buf) {
                Some(rest) => {
                    self.rest = rest;
                    Ok(buf.len())
                }
                None => Err(io::Error::other("differs")),
            }
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut compare = Compare { rest: expected };
    serde_json::to_writer(&mut compare, message).is_ok() && compare.rest.is_empty()
}

/// `true` if `payload` replays as exactly these bytes: the message
/// [`decode`] makes of it serializes, as rmcp will write it, to the same
/// bytes (an empty payload, a priming event, always does).
///
/// A diagnostic: [`decode`] already does its best for every payload.
///
/// ```
/// use mcp_event_store_rmcp::replays_exactly;
///
/// assert!(replays_exactly(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
/// assert!(replays_exactly(b""));
/// assert!(!replays_exactly(b"not json"));
/// ```
pub fn replays_exactly(payload: &[u8]) -> bool {
    if payload.is_empty() {
        return true;
    }
    decode_payload(payload).is_ok_and(|message| serializes_to(&message, payload))
}
