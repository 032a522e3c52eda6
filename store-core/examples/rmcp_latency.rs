//! What the rmcp adapter adds per event: turning rmcp's `ServerSseMessage`
//! into our payload on the way in (`encode`) and back on replay (`decode`,
//! which parses the JSON-RPC message and checks it serializes back to the
//! stored bytes).
//!
//! ```text
//! cargo run --release -p mcp-event-store-core --features rmcp --example rmcp_latency
//! ```
//!
//! Prints the median, over many batches, of the time per event for a
//! progress notification, a tool result, a priming event and a 16 KiB
//! result; and, for comparison, a plain `serde_json` parse of the same
//! payload (what any replay into rmcp's typed message costs, check or not).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mcp_event_store_core::rmcp::{decode, encode};
use mcp_event_store_core::{EventId, StoredEvent};
use rmcp::model::{
    CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken, ServerJsonRpcMessage,
    ServerNotification, ServerResult,
};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;

const BATCH: u32 = 1_000;
const BATCHES: usize = 300;

fn median_ns_per_event(mut run_batch: impl FnMut()) -> f64 {
    for _ in 0..20 {
        run_batch(); // warm up
    }
    let mut samples: Vec<Duration> = (0..BATCHES)
        .map(|_| {
            let start = Instant::now();
            run_batch();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples[BATCHES / 2].as_nanos() as f64 / f64::from(BATCH)
}

fn progress() -> ServerSseMessage {
    let mut notification: rmcp::model::ProgressNotification = serde_json::from_value(
        serde_json::json!({"method": "notifications/progress", "params": {
            "progressToken": "t", "progress": 0.0}}),
    )
    .unwrap();
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

fn main() {
    let id: EventId = "v1.0123456789abcdefghijklmn.2a".parse().unwrap();
    let cases = [
        ("progress notification", progress()),
        ("tool result", tool_result("counted to 100".into())),
        (
            "priming event",
            ServerSseMessage::retry(Duration::from_secs(3)),
        ),
        ("16 KiB tool result", tool_result("x".repeat(16 * 1024))),
    ];
    println!("median ns per event ({BATCHES} batches of {BATCH}), release build:\n");
    println!(
        "{:<24} {:>8} {:>10} {:>10} {:>14} {:>16}",
        "message", "bytes", "encode", "decode", "encode+decode", "plain parse"
    );
    for (name, message) in cases {
        let (payload, retry) = encode(&message).unwrap();
        let stored = StoredEvent {
            id,
            data: Bytes::from(payload.clone()),
            retry,
        };
        let encode_ns = median_ns_per_event(|| {
            for _ in 0..BATCH {
                black_box(encode(black_box(&message)).unwrap());
            }
        });
        let decode_ns = median_ns_per_event(|| {
            for _ in 0..BATCH {
                black_box(decode(black_box(&stored)).unwrap());
            }
        });
        let parse_ns = if payload.is_empty() {
            0.0
        } else {
            median_ns_per_event(|| {
                for _ in 0..BATCH {
                    let parsed: ServerJsonRpcMessage =
                        serde_json::from_slice(black_box(&payload)).unwrap();
                    black_box(Arc::new(parsed));
                }
            })
        };
        println!(
            "{:<24} {:>8} {:>10.0} {:>10.0} {:>14.0} {:>16.0}",
            name,
            payload.len(),
            encode_ns,
            decode_ns,
            encode_ns + decode_ns,
            parse_ns
        );
    }
}
