//! A first tour of mcp-event-store, on SQLite by default.
//!
//! ```text
//! cargo run --example quickstart                      # sqlite://mcp-event-store-quickstart.db
//! cargo run --example quickstart -- memory://         # any store URL
//! RUST_LOG=mcp_event_store=debug cargo run --example quickstart   # with the store's spans
//! ```
//!
//! It stores events on two streams (as an MCP server does for a tool call and
//! for a session's standalone GET stream), replays one from the middle as a
//! reconnecting client would, shows that an unknown id is refused, and runs
//! retention.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store::{Error, NewEvent, Retention, StoreOptions, connect_with};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();

    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://mcp-event-store-quickstart.db".into());
    // Events older than two seconds expire, so the tour can show a purge.
    let options =
        StoreOptions::default().retention(Retention::default().max_age(Duration::from_secs(2)));
    let store = connect_with(&url, options).await?;
    println!("Opened {url}");

    let tool_call = "3f1c1a52-request-stream";
    let standalone = "session-42:common";
    for stream in [tool_call, standalone] {
        store.delete_stream(stream).await?; // start the tour from scratch
    }

    // A priming event first (SEP-1699): no data, only a retry hint.
    let priming = store
        .store_event(tool_call, NewEvent::priming(Duration::from_millis(1500)))
        .await?;
    println!("\nStored a priming event on {tool_call:?}: id {priming}");
    let mut ids = Vec::new();
    for step in 1..=4 {
        let message = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progress":{step},"total":4}}}}"#
        );
        let id = store
            .store_event(tool_call, NewEvent::new(message.as_bytes()))
            .await?;
        println!("Stored progress {step}/4 on {tool_call:?}: id {id}");
        ids.push(id);
    }
    let other = store
        .store_event(
            standalone,
            NewEvent::new(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#),
        )
        .await?;
    println!("Stored a notification on {standalone:?}: id {other}");

    let cursor = ids[1];
    println!("\nThe client saw up to {cursor} and reconnects with Last-Event-ID: {cursor}");
    let replay = store.replay_events_after(&cursor.to_string()).await?;
    println!("It resumes stream {:?} and receives:", replay.stream_id);
    let missed: Vec<_> = replay.events.try_collect().await?;
    for event in &missed {
        println!(
            "  id: {}\n  data: {}",
            event.id,
            String::from_utf8_lossy(&event.data)
        );
    }
    println!(
        "({} events, none from {standalone:?}: the id alone locates the stream)",
        missed.len()
    );

    let forged = "v1.0123456789abcdefghijklmn.2";
    match store.replay_events_after(forged).await {
        Err(Error::UnknownEventId { .. }) => {
            println!("\nA forged Last-Event-ID {forged:?} is refused: it was never issued here.")
        }
        other => println!("\nUnexpected answer to a forged id: {other:?}"),
    }

    println!("\nWaiting for the events to pass their 2 s max age...");
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let report = store.purge_expired().await?;
    println!(
        "Purged {} events and {} streams.",
        report.events, report.streams
    );
    match store.replay_events_after(&cursor.to_string()).await {
        Err(e) => println!("Resuming from {cursor} now fails clearly: {e}"),
        Ok(_) => println!("Resuming from {cursor} still works (nothing expired?)"),
    }
    Ok(())
}
