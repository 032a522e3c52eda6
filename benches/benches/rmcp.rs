//! The rmcp adapter: its cost per event, and the delivery latency it adds
//! to every message.
//!
//! * `rmcp_adapter/{encode,decode}/<message>`: `encode` (rmcp's
//!   `ServerSseMessage` into our payload) and `decode` (back into rmcp's
//!   types on replay, with the byte-exact check), beside the raw baseline
//!   `rmcp_adapter/{raw_serialize,raw_parse}/<message>` of plain
//!   `serde_json` serialization and parsing of the same message.
//! * `rmcp_delivery/<backend>/...`: `store_event` as rmcp calls it (rmcp's
//!   `EventStore` trait, implemented by `RmcpEventStore`, on a store opened
//!   with default options): in session mode each message waits for this
//!   call before it is sent, so its latency is delivery latency. Throughput
//!   in messages.
//!
//! | id | what |
//! |---|---|
//! | `adapter_1_writer` | one writer, one progress notification at a time |
//! | `store_1_writer` | the baseline: the store's own `store_event` of the same payload, already encoded |
//! | `adapter_32_writers` | 32 tasks, each on its own stream (a request stream of its own session), one message at a time each |
//! | `store_32_writers` | the baseline of that |
//!
//! Criterion's estimate is of the time per message (per round of 32 for
//! 32 writers); besides it, a fixed number of calls (2,000 for one writer,
//! 32 x 200 for 32, the adapter and its baseline in alternating rounds of a
//! tenth each) is timed call by call before each pair of cases and its
//! median and 99th percentile printed and written to
//! `<criterion dir>/rmcp_delivery/<backend>/<id>/percentiles.json`.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench rmcp
//! cargo bench -p mcp-event-store-benches --bench rmcp -- rmcp_delivery/sqlite/
//! ```

use mcp_event_store_benches as common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mcp_event_store::rmcp::{RmcpEventStore, decode, encode};
use mcp_event_store::{DynStore, EventId, NewEvent, StoreOptions, StoredEvent};
use rmcp::model::{
    CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken, ServerJsonRpcMessage,
    ServerNotification, ServerResult,
};
use rmcp::transport::streamable_http_server::session::EventStore as RmcpEventStoreTrait;
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

/// One message stored, as rmcp stores it or as the store alone does.
#[derive(Clone)]
enum Sink {
    Adapter(
        Arc<RmcpEventStore<dyn mcp_event_store::Store>>,
        Arc<ServerSseMessage>,
    ),
    Store(DynStore, Arc<[u8]>),
}

impl Sink {
    async fn store(&self, stream_id: &str) {
        match self {
            Sink::Adapter(adapter, message) => {
                black_box(
                    adapter
                        .store_event(stream_id, message)
                        .await
                        .expect("store_event through the adapter"),
                );
            }
            Sink::Store(store, payload) => {
                black_box(
                    store
                        .store_event(stream_id, NewEvent::new(payload))
                        .await
                        .expect("store_event"),
                );
            }
        }
    }
}

/// `writers` tasks, each storing `calls` messages one at a time on its own
/// stream; returns the wall time and every call's duration.
async fn deliver(
    sink: &Sink,
    streams: &Arc<Vec<String>>,
    writers: usize,
    calls: u64,
) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (sink, streams) = (sink.clone(), streams.clone());
        tasks.spawn(async move {
            let mut times = Vec::with_capacity(calls as usize);
            for _ in 0..calls {
                let call = Instant::now();
                sink.store(&streams[w]).await;
                times.push(call.elapsed());
            }
            times
        });
    }
    let mut times = Vec::with_capacity(writers * calls as usize);
    while let Some(done) = tasks.join_next().await {
        times.extend(done.expect("writer task"));
    }
    (started.elapsed(), times)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

fn delivery(c: &mut Criterion) {
    let rt = common::runtime();
    let message = progress();
    let (payload, _) = encode(&message).expect("encodes");
    let message = Arc::new(message);
    let payload: Arc<[u8]> = payload.into();
    let streams: Arc<Vec<String>> = Arc::new((0..32).map(|w| format!("session-{w}:1")).collect());
    for backend in common::selected() {
        let (store, teardown) = rt.block_on(common::one_handle(backend, StoreOptions::default()));
        let adapter = Arc::new(RmcpEventStore::new(store.clone()));
        let mut group = c.benchmark_group(format!("rmcp_delivery/{}", backend.name));
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        group.sample_size(20);
        for writers in [1, 32] {
            group.throughput(Throughput::Elements(writers as u64));
            let sinks = [
                ("adapter", Sink::Adapter(adapter.clone(), message.clone())),
                ("store", Sink::Store(store.clone(), payload.clone())),
            ];
            let ids = sinks.each_ref().map(|(kind, _)| {
                format!(
                    "{kind}_{writers}_writer{}",
                    if writers > 1 { "s" } else { "" }
                )
            });
            // Call by call, for the median and the tail: the adapter and
            // its baseline in alternating rounds, so that both see the same
            // machine (and the same growth of the storage).
            let (rounds, calls) = match (common::quick(), writers) {
                (true, _) => (1, 10),
                (false, 1) => (10, 200),
                (false, _) => (10, 20),
            };
            let mut times: [Vec<Duration>; 2] = Default::default();
            for _ in 0..rounds {
                for ((_, sink), times) in sinks.iter().zip(&mut times) {
                    times.extend(rt.block_on(deliver(sink, &streams, writers, calls)).1);
                }
            }
            for (id, mut times) in ids.iter().zip(times) {
                times.sort();
                let (median, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
                println!(
                    "rmcp_delivery/{}/{id}: p50 {:.1} us, p99 {:.1} us over {} calls",
                    backend.name,
                    median.as_secs_f64() * 1e6,
                    p99.as_secs_f64() * 1e6,
                    times.len(),
                );
                if !common::quick() {
                    let dir = common::criterion_dir()
                        .join("rmcp_delivery")
                        .join(backend.name)
                        .join(id);
                    std::fs::create_dir_all(&dir).expect("the criterion directory");
                    let json = format!(
                        "{{\"backend\":\"{}\",\"writers\":{writers},\"calls\":{},\"p50_ns\":{},\"p99_ns\":{}}}\n",
                        backend.name,
                        times.len(),
                        median.as_nanos(),
                        p99.as_nanos()
                    );
                    std::fs::write(dir.join("percentiles.json"), json).expect("write percentiles");
                }
            }
            for ((_, sink), id) in sinks.iter().zip(&ids) {
                group.bench_function(id.as_str(), |b| {
                    b.iter_custom(|iters| rt.block_on(deliver(sink, &streams, writers, iters)).0)
                });
            }
        }
        group.finish();
        drop(adapter);
        drop(store);
        rt.block_on(teardown);
    }
}

criterion_group!(benches, rmcp_adapter, delivery);
criterion_main!(benches);
