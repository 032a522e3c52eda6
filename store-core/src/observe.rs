//! Tracing for the three operations an operator cares about: append, replay
//! and purge. Backends wrap their work in these so every store reports the
//! same span names and fields.
//!
//! Spans: `mcp_event_store.append` (backend, stream_id, bytes),
//! `mcp_event_store.replay` (backend, event_id) and `mcp_event_store.purge`
//! (backend). Each ends with a `debug` event carrying `elapsed_us` and the
//! outcome; a replay also reports `events` and `bytes` when its stream ends.

use std::future::Future;
use std::time::Instant;

use futures_util::StreamExt;
use tracing::{Instrument, Span};

use crate::error::Result;
use crate::id::EventId;
use crate::options::PurgeReport;
use crate::store::Replay;

/// Client input as a span field: at most 80 bytes, cut on a char boundary.
fn clip(input: &str) -> &str {
    let mut end = input.len().min(80);
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    &input[..end]
}

fn elapsed_us(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Runs an append inside its span and reports how it went.
pub async fn append<F>(
    backend: &'static str,
    stream_id: &str,
    bytes: usize,
    work: F,
) -> Result<EventId>
where
    F: Future<Output = Result<EventId>>,
{
    let span = tracing::debug_span!("mcp_event_store.append", backend, stream_id, bytes);
    async move {
        let start = Instant::now();
        let result = work.await;
        match &result {
            Ok(id) => tracing::debug!(event_id = %id, elapsed_us = elapsed_us(start), "stored"),
            Err(e) => tracing::warn!(error = %e, elapsed_us = elapsed_us(start), "append failed"),
        }
        result
    }
    .instrument(span)
    .await
}

/// Runs a replay's setup inside its span, and reports the event count and
/// bytes when the returned stream finishes.
pub async fn replay<F>(backend: &'static str, event_id: &str, work: F) -> Result<Replay>
where
    F: Future<Output = Result<Replay>>,
{
    let span = tracing::debug_span!(
        "mcp_event_store.replay",
        backend,
        event_id = clip(event_id),
        stream_id = tracing::field::Empty,
    );
    let start = Instant::now();
    let result = work.instrument(span.clone()).await;
    match result {
        Ok(replay) => {
            span.record("stream_id", replay.stream_id.as_str());
            Ok(count_replay(replay, span, start))
        }
        Err(e) => {
            span.in_scope(
                || tracing::debug!(error = %e, elapsed_us = elapsed_us(start), "replay refused"),
            );
            Err(e)
        }
    }
}

fn count_replay(replay: Replay, span: Span, start: Instant) -> Replay {
    struct Tally {
        span: Span,
        start: Instant,
        events: u64,
        bytes: u64,
    }
    impl Drop for Tally {
        fn drop(&mut self) {
            self.span.in_scope(|| {
                tracing::debug!(
                    events = self.events,
                    bytes = self.bytes,
                    elapsed_us = elapsed_us(self.start),
                    "replay finished"
                );
            });
        }
    }
    let mut tally = Tally {
        span,
        start,
        events: 0,
        bytes: 0,
    };
    let events = replay
        .events
        .inspect(move |event| {
            // Borrow the whole tally so the closure owns it (and its Drop),
            // rather than copies of its counters.
            let tally = &mut tally;
            if let Ok(event) = event {
                tally.events += 1;
                tally.bytes += event.data.len() as u64;
            }
        })
        .boxed();
    Replay {
        stream_id: replay.stream_id,
        events,
    }
}

/// Runs a purge inside its span and reports what it removed.
pub async fn purge<F>(backend: &'static str, work: F) -> Result<PurgeReport>
where
    F: Future<Output = Result<PurgeReport>>,
{
    let span = tracing::debug_span!("mcp_event_store.purge", backend);
    async move {
        let start = Instant::now();
        let result = work.await;
        match &result {
            Ok(report) => tracing::debug!(
                events = report.events,
                streams = report.streams,
                sessions = report.sessions,
                elapsed_us = elapsed_us(start),
                "purged"
            ),
            Err(e) => tracing::warn!(error = %e, elapsed_us = elapsed_us(start), "purge failed"),
        }
        result
    }
    .instrument(span)
    .await
}
