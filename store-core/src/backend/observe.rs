//! Tracing and metrics for what an operator cares about: append, replay,
//! follow and purge. Backends wrap their work in these so every store
//! reports the same span names, fields and metrics.
//!
//! Spans: `mcp_event_store.append` (backend, stream_id, bytes),
//! `mcp_event_store.replay` (backend, event_id), `mcp_event_store.purge`
//! (backend) and `mcp_event_store.redeem` (backend). Each ends with a `debug` event carrying `elapsed_us` and the
//! outcome; a replay also reports `events` and `bytes` when its stream ends.
//!
//! The metric names and what they count are in
//! [`observe`](crate::observe); this module records them.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::{Instrument, Span};

use crate::error::Result;
use crate::id::EventId;
use crate::options::PurgeReport;
use crate::redeem::Redemption;
use crate::store::Replay;

pub use crate::observe::names;

/// Client input as a span field: at most 80 bytes, cut on a char boundary.
fn clip(input: &str) -> &str {
    let mut end = input.len().min(80);
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    &input[..end]
}

fn error(backend: &'static str, operation: &'static str, e: &crate::Error) {
    metrics::counter!(names::ERRORS_TOTAL, "backend" => backend, "operation" => operation, "kind" => e.kind())
        .increment(1);
}

/// Records how many events a backend committed together (one group commit,
/// one batch transaction, one pipeline).
pub fn batch(backend: &'static str, events: usize) {
    metrics::histogram!(names::APPEND_BATCH_SIZE, "backend" => backend).record(events as f64);
}

/// Counts an open follow until dropped (the `follows_active` gauge).
#[derive(Debug)]
pub struct FollowGauge {
    backend: &'static str,
}

impl FollowGauge {
    /// Counts one more follow of `backend`, until the gauge drops.
    pub fn open(backend: &'static str) -> Self {
        metrics::gauge!(names::FOLLOWS_ACTIVE, "backend" => backend).increment(1.0);
        Self { backend }
    }
}

impl Drop for FollowGauge {
    fn drop(&mut self) {
        metrics::gauge!(names::FOLLOWS_ACTIVE, "backend" => self.backend).decrement(1.0);
    }
}

/// Records the time from a follower's wake-up to an event in its hands.
pub fn follow_delivered(backend: &'static str, after_wakeup: Duration) {
    metrics::histogram!(names::FOLLOW_DELIVERY_SECONDS, "backend" => backend)
        .record(after_wakeup.as_secs_f64());
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
        metrics::histogram!(names::APPEND_DURATION_SECONDS, "backend" => backend)
            .record(start.elapsed().as_secs_f64());
        match &result {
            Ok(id) => {
                metrics::counter!(names::APPENDS_TOTAL, "backend" => backend, "outcome" => "ok")
                    .increment(1);
                tracing::debug!(event_id = %id, elapsed_us = elapsed_us(start), "stored")
            }
            Err(e) => {
                metrics::counter!(names::APPENDS_TOTAL, "backend" => backend, "outcome" => "error")
                    .increment(1);
                error(backend, "append", e);
                tracing::warn!(error = %e, elapsed_us = elapsed_us(start), "append failed")
            }
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
    metrics::histogram!(names::REPLAY_OPEN_DURATION_SECONDS, "backend" => backend)
        .record(start.elapsed().as_secs_f64());
    match result {
        Ok(replay) => {
            metrics::counter!(names::REPLAYS_TOTAL, "backend" => backend, "outcome" => "ok")
                .increment(1);
            span.record("stream_id", replay.stream_id.as_str());
            Ok(count_replay(backend, replay, span, start))
        }
        Err(e) => {
            metrics::counter!(names::REPLAYS_TOTAL, "backend" => backend, "outcome" => "refused")
                .increment(1);
            error(backend, "replay", &e);
            span.in_scope(
                || tracing::debug!(error = %e, elapsed_us = elapsed_us(start), "replay refused"),
            );
            Err(e)
        }
    }
}

/// What a replay handed out, reported when its events are dropped: the
/// `replayed_events_total` counter and the span's closing event. Fed a
/// page at a time by [`ReplayEvents`](crate::ReplayEvents), never per event.
pub(crate) struct Tally {
    backend: &'static str,
    span: Span,
    start: Instant,
    events: u64,
    bytes: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, events: u64, bytes: u64) {
        self.events += events;
        self.bytes += bytes;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        metrics::counter!(names::REPLAYED_EVENTS_TOTAL, "backend" => self.backend)
            .increment(self.events);
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

fn count_replay(backend: &'static str, replay: Replay, span: Span, start: Instant) -> Replay {
    let tally = Tally {
        backend,
        span,
        start,
        events: 0,
        bytes: 0,
    };
    Replay {
        stream_id: replay.stream_id,
        events: replay.events.observed(tally),
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
        metrics::histogram!(names::PURGE_DURATION_SECONDS, "backend" => backend)
            .record(start.elapsed().as_secs_f64());
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(names::PURGES_TOTAL, "backend" => backend, "outcome" => outcome)
            .increment(1);
        match &result {
            Ok(report) => {
                metrics::counter!(names::PURGED_EVENTS_TOTAL, "backend" => backend)
                    .increment(report.events);
                metrics::counter!(names::PURGED_STREAMS_TOTAL, "backend" => backend)
                    .increment(report.streams);
                metrics::counter!(names::PURGED_REDEMPTIONS_TOTAL, "backend" => backend)
                    .increment(report.redemptions);
                tracing::debug!(
                    events = report.events,
                    streams = report.streams,
                    sessions = report.sessions,
                    redemptions = report.redemptions,
                    elapsed_us = elapsed_us(start),
                    "purged"
                )
            }
            Err(e) => {
                error(backend, "purge", e);
                tracing::warn!(error = %e, elapsed_us = elapsed_us(start), "purge failed")
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// Runs a redemption (C21) inside its span and reports its answer.
pub async fn redeem<F>(backend: &'static str, work: F) -> Result<Redemption>
where
    F: Future<Output = Result<Redemption>>,
{
    let span = tracing::debug_span!("mcp_event_store.redeem", backend);
    async move {
        let start = Instant::now();
        let result = work.await;
        metrics::histogram!(names::REDEEM_DURATION_SECONDS, "backend" => backend)
            .record(start.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(Redemption::Redeemed) => "redeemed",
            Ok(Redemption::AlreadyRedeemed) => "already_redeemed",
            Ok(Redemption::Expired) => "expired",
            Err(_) => "error",
        };
        metrics::counter!(names::REDEMPTIONS_TOTAL, "backend" => backend, "outcome" => outcome)
            .increment(1);
        match &result {
            Ok(_) => tracing::debug!(outcome, elapsed_us = elapsed_us(start), "redeemed"),
            Err(e) => {
                error(backend, "redeem", e);
                tracing::warn!(error = %e, elapsed_us = elapsed_us(start), "redeem failed")
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// Counts a created task: `queued` when it waits for a claim (created for
/// a worker), `held` when its creator runs it.
pub fn task_created(backend: &'static str, queued: bool) {
    let mode = if queued { "queued" } else { "held" };
    metrics::counter!(names::TASKS_CREATED_TOTAL, "backend" => backend, "mode" => mode)
        .increment(1);
}

/// Counts the tasks a claim took (queued, released by their worker, or
/// taken over after their instance lapsed), and how long each taken over
/// had waited since its instance lapsed.
pub fn tasks_claimed(backend: &'static str, claimed: &[crate::task::Claimed]) {
    metrics::counter!(names::TASK_CLAIMS_TOTAL, "backend" => backend)
        .increment(claimed.len() as u64);
    for waited in claimed.iter().filter_map(|c| c.lapsed_for) {
        metrics::histogram!(names::TASK_TAKEOVER_DELAY_SECONDS, "backend" => backend)
            .record(waited.as_secs_f64());
    }
}

/// Counts the tasks a purge persisted `failed` with no run left.
pub fn tasks_purged(backend: &'static str, report: &crate::task::TaskPurgeReport) {
    if report.exhausted > 0 {
        metrics::counter!(names::TASKS_EXHAUSTED_TOTAL, "backend" => backend)
            .increment(report.exhausted);
    }
}

/// Counts an operator's requeue (T23).
pub fn task_requeued(backend: &'static str) {
    metrics::counter!(names::TASKS_REQUEUED_TOTAL, "backend" => backend).increment(1);
}

/// What a worker's change was, kept before the change is handed to the
/// backend, to count what it did once it is applied.
#[derive(Clone, Copy, Debug)]
pub enum ChangeKind {
    /// Input requests, this many.
    Requests(usize),
    /// An answer taken.
    Take,
    /// A finish with this status.
    Finish(&'static str),
    /// Anything else.
    Other,
}

impl ChangeKind {
    /// The kind of `change`.
    pub fn of(change: &crate::task::WorkerChange<'_>) -> Self {
        use crate::task::WorkerChange;
        match change {
            WorkerChange::RequestInput { .. } => Self::Requests(1),
            WorkerChange::ReplaceInputs { requests, .. } => Self::Requests(requests.len()),
            WorkerChange::TakeAnswer { .. } => Self::Take,
            WorkerChange::Finish(finish) => Self::Finish(finish.status().as_str()),
            _ => Self::Other,
        }
    }
}

/// Counts what a worker's change did: refused under a stale claim, inputs
/// requested, an answer taken, a task finished.
pub fn task_applied(backend: &'static str, kind: ChangeKind, applied: &crate::task::Applied) {
    use crate::task::Applied;
    match (kind, applied) {
        (_, Applied::Fenced) => {
            metrics::counter!(names::TASK_FENCED_WRITES_TOTAL, "backend" => backend).increment(1);
        }
        (ChangeKind::Requests(n), Applied::Changed { .. }) => {
            metrics::counter!(names::TASK_INPUTS_REQUESTED_TOTAL, "backend" => backend)
                .increment(n as u64);
        }
        (
            ChangeKind::Take,
            Applied::Changed {
                answer: Some(_), ..
            },
        ) => {
            metrics::counter!(names::TASK_INPUTS_TAKEN_TOTAL, "backend" => backend).increment(1);
        }
        (ChangeKind::Finish(status), Applied::Changed { .. }) => {
            metrics::counter!(names::TASKS_FINISHED_TOTAL, "backend" => backend, "status" => status)
                .increment(1);
        }
        _ => {}
    }
}
