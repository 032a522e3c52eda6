//! The rmcp adapter's cost per event: `encode` (rmcp's `ServerSseMessage`
//! into our payload) and `decode` (back into rmcp's types on replay, with
//! the byte-exact check), beside the raw baseline of plain `serde_json`
//! serialization and parsing of the same message.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench rmcp
//! ```

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcp_event_store::rmcp::{decode, encode};
use mcp_event_store::{EventId, StoredEvent};
use rmcp::model::{
    CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken, ServerJsonRpcMessage,
    ServerNotification, ServerResult,
};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;

fn progress() -> ServerSseMessage {
    let mut notification: rmcp::model::ProgressNotification = serde_json::from_value(
        serde_json::json!({"method": "notifications/progress", "params": {
            "progressToken": "t", "progress": 0.0}}),
    )
    .expect("a progress notification");
    notification.params =
        ProgressNotificationParam::new(ProgressToken(rmcp::model::NumberOrString::Number(7)), 41.0)
            .with_total(100.0)
            .with_message("step 41 of 100");
    ServerSseMessage::from_message(ServerJsonRpcMessage::notification(
        ServerNotification::ProgressNotification(notification),
    ))
}

fn tool_result(text: String) -> ServerSseMessage {
    ServerSseMessage::from_message(ServerJsonRpcMessage::response(
        ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::text(text)])),
        rmcp::model::RequestId::Number(2),
    ))
}

fn rmcp_adapter(c: &mut Criterion) {
    let id: EventId = "v1.0123456789abcdefghijklmn.2a".parse().expect("an id");
    let cases = [
        ("progress", progress()),
        ("tool_result", tool_result("counted to 100".into())),
        ("priming", ServerSseMessage::retry(Duration::from_secs(3))),
        ("tool_result_16k", tool_result("x".repeat(16 * 1024))),
    ];
    let mut group = c.benchmark_group("rmcp_adapter");
    group.throughput(Throughput::Elements(1));
    for (name, message) in &cases {
        let (payload, retry) = encode(message).expect("encodes");
        let stored = StoredEvent {
            id,
            data: Bytes::from(payload.clone()),
            retry,
        };
        group.bench_with_input(BenchmarkId::new("encode", name), message, |b, m| {
            b.iter(|| encode(black_box(m)).expect("encodes"))
        });
        group.bench_with_input(BenchmarkId::new("decode", name), &stored, |b, e| {
            b.iter(|| decode(black_box(e)).expect("decodes"))
        });
        if let Some(inner) = &message.message {
            let inner: &ServerJsonRpcMessage = inner;
            group.bench_with_input(BenchmarkId::new("raw_serialize", name), inner, |b, m| {
                b.iter(|| serde_json::to_vec(black_box(m)).expect("serializes"))
            });
            group.bench_with_input(BenchmarkId::new("raw_parse", name), &payload, |b, p| {
                b.iter(|| {
                    serde_json::from_slice::<ServerJsonRpcMessage>(black_box(p)).expect("parses")
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, rmcp_adapter);
criterion_main!(benches);
