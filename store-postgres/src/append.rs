//! Appends (C1, C6): one statement per append, and batches, in which
//! concurrent appends from many streams share one statement and one
//! commit.
//!
//! Each commit waits for a WAL flush, so appends committed one by one are
//! bound by how many commits the server can flush. The append statement,
//! [`crate::sql::APPEND`], takes its events as arrays. A lone append runs
//! at once, as [`crate::sql::APPEND_ONE`], the same statement for one event
//! with plain parameters (cheaper for the server); appends that arrive
//! while others are in flight queue for the batcher task, which sends
//! everything queued, at most one event per stream, in one call. One batch
//! runs at a time as a rule, and the queue fills while it does, so the
//! busier the store, the larger each batch. Another starts beside it only
//! when a full batch is waiting or the running one has taken longer than
//! [`APPEND_BATCH_STALL`] (a lock wait, a slow commit), at most
//! [`APPEND_BATCHES_IN_FLIGHT`] at once. Starting whatever was queued as
//! soon as a slot was free split the appenders into many small batches: the
//! callers of a batch that just committed append again one by one, and the
//! first few each took a slot and a WAL flush of their own while the rest
//! queued behind them (counted with `pg_waldump` under 32 writers: 14 to
//! 17% of the events committed alone, 4.5 to 5.3 events per commit; one
//! batch at a time: 97 to 99% in batches of 17 to 32). For the same reason
//! a batch that starts right after one finished first lets that batch's
//! callers come back (while they keep arriving).
//!
//! With every writer in the running batch, batches follow each other, and
//! a batch's time is the rate: under 32 writers on two cores a batch of 32
//! took 0.76 to 0.82 ms from the caller's side, of which about 0.3 ms
//! executing on one server core (`auto_explain`: the stream upserts 0.21,
//! the event inserts 0.10) and about 0.25 ms the WAL flush (the same runs
//! with `synchronous_commit` off: 0.54 to 0.59 ms), with 0.08 ms between
//! batches; the cores were a third idle. Two half batches at once, to use
//! the idle core, were slower: 0.93 to 1.09 ms for each batch of 16, as
//! their commits, out of step, each waited for the other's flush.
//!
//! The statement that commits announces its streams to other handles
//! (see [`crate::follow::Notifier`]), all of a batch's at once, before its
//! callers are answered. When each caller announced its own stream as it
//! woke, the notifier's task woke on the first and sent a `NOTIFY` for the
//! few announced so far, then another for the rest: under 32 writers 4,213
//! `NOTIFY` transactions beside 3,079 append statements (counted with
//! `log_min_duration_statement`), each a pooled connection, a round trip
//! and server CPU taken beside the next batch. On two cores that cost
//! about 0.1 ms of each 0.8 ms batch (appends without any announcement
//! ran batches of 32 in 0.69 to 0.73 ms against 0.81).
//!
//! Ordering (C6) is the stream row's lock, exactly as for single appends:
//! a batch locks its streams' rows in token order, as purges do, so
//! batches never deadlock each other or a purge.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use mcp_event_store_core::backend::dense;
use mcp_event_store_core::backend::{StreamToken, observe, retry_to_millis};
use mcp_event_store_core::{Error, EventId, NewEvent, Result, Retention};
use sqlx::postgres::PgPool;
use sqlx::{Row, SqlStr};
use tokio::sync::{mpsc, oneshot};

use crate::PostgresStore;
use crate::batches::Leave;
use crate::error::{NAME, backend};
use crate::follow::Notifier;
use crate::options::{
    APPEND_BATCH_BYTES, APPEND_BATCH_EVENTS, APPEND_BATCH_STALL, APPEND_BATCHES_IN_FLIGHT,
};
use crate::replay::stored_number;

/// Appends one event to `stream_id` (`store_event`): alone or batched with
/// concurrent appends (the statement announces it to other handles once
/// committed), then wakes this handle's followers of the stream.
pub(crate) async fn append(
    store: &PostgresStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    let token = store.key().token(stream_id);
    let appended = store
        .batcher()
        .append(AppendRequest {
            token,
            stream_id: Bytes::copy_from_slice(stream_id.as_bytes()),
            data: Bytes::copy_from_slice(event.data),
            retry_ms: retry_to_millis(event.retry),
            now: store.now(),
        })
        .await?;
    if appended.is_some() {
        // Committed: the followers' re-read will see it.
        store.follows().hub().wake(&token);
    }
    let Some((incarnation, seq)) = appended else {
        // The stream row's stored id differs from ours: two stream ids
        // share a 120-bit token. Never mix their events.
        return Err(Error::Corrupt(format!(
            "stream token {token} already belongs to another stream id; \
             refusing to mix two streams"
        )));
    };
    Ok(EventId::new(
        token,
        dense::position(stored_number(incarnation)?, stored_number(seq)?),
    ))
}

/// One append: everything the statement binds.
pub(crate) struct AppendRequest {
    pub token: StreamToken,
    pub stream_id: Bytes,
    pub data: Bytes,
    pub retry_ms: Option<i64>,
    pub now: i64,
}

/// Where an appended event went: its stream's incarnation and its sequence
/// number; `None` when the token belongs to another stream id.
pub(crate) type Appended = Option<(i64, i64)>;

/// What an append statement binds besides the event: the retention limits.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    max_events: Option<i64>,
    max_bytes: Option<i64>,
}

impl Limits {
    pub(crate) fn new(retention: Retention) -> Self {
        // Saturate into PostgreSQL's `bigint`.
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Self {
            max_events: retention.max_events_per_stream.map(clamp),
            max_bytes: retention.max_bytes_per_stream.map(clamp),
        }
    }
}

type Waiting = (AppendRequest, oneshot::Sender<Result<Appended>>);

/// The handle appends use: decides between running alone and joining a
/// batch, and owns the queue to the batcher task.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Waiting>,
    in_flight: AtomicUsize,
    writer: Writer,
}

/// What every append statement runs with, the handle's lone appends and
/// the batcher task's batches alike.
#[derive(Clone)]
pub(crate) struct Writer {
    pub pool: PgPool,
    /// [`crate::sql::APPEND`], for a batch.
    pub batch: SqlStr,
    /// [`crate::sql::APPEND_ONE`], for an event alone.
    pub one: SqlStr,
    pub limits: Limits,
    /// Announces committed streams to other handles.
    pub notifier: Notifier,
}

impl Batcher {
    /// Starts the batcher task on the current tokio runtime. It ends when
    /// the `Batcher` is dropped and the queue has drained.
    pub(crate) fn start(writer: Writer) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(run(requests, writer.clone()));
        Self {
            queue,
            in_flight: AtomicUsize::new(0),
            writer,
        }
    }

    /// Appends one event.
    pub(crate) async fn append(&self, request: AppendRequest) -> Result<Appended> {
        let alone = self.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        let _done = Leave(&self.in_flight);
        if alone {
            let seqs = run_statement(&self.writer, &[&request]).await;
            return Ok(seqs.map_err(backend)?[0]);
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((request, reply))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }
}

async fn run(mut requests: mpsc::UnboundedReceiver<Waiting>, writer: Writer) {
    // Batches report here when they finish (with the appends they
    // carried), also when their task panics.
    let (finished_tx, mut finished) = mpsc::unbounded_channel::<usize>();
    let mut waiting = VecDeque::new();
    let mut open = true;
    // Batches running, and when the newest of them started.
    let mut running = 0;
    let mut newest = Instant::now();
    // Appends whose batches finished since the last batch started: their
    // callers may be about to append again.
    let mut returning = 0;
    loop {
        while let Ok(carried) = finished.try_recv() {
            running -= 1;
            returning += carried;
        }
        while open {
            match requests.try_recv() {
                Ok(request) => waiting.push_back(request),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        let stalled = newest.elapsed() >= APPEND_BATCH_STALL;
        let start = !waiting.is_empty()
            && running < APPEND_BATCHES_IN_FLIGHT
            && (running == 0 || stalled || full(&waiting));
        if !start {
            if !open && waiting.is_empty() {
                // Running batches answer their callers by themselves.
                break;
            }
            let stall_timer =
                running > 0 && running < APPEND_BATCHES_IN_FLIGHT && !waiting.is_empty();
            tokio::select! {
                request = requests.recv(), if open => match request {
                    Some(request) => waiting.push_back(request),
                    None => open = false,
                },
                Some(carried) = finished.recv() => {
                    running -= 1;
                    returning += carried;
                }
                () = tokio::time::sleep_until((newest + APPEND_BATCH_STALL).into()), if stall_timer => {}
            }
            continue;
        }
        // The callers of a batch that just finished append again a moment
        // later; let them join this batch rather than start one alone.
        let mut idle_yields = 0;
        while open && waiting.len() < returning && idle_yields < 2 {
            tokio::task::yield_now().await;
            let before = waiting.len();
            while let Ok(request) = requests.try_recv() {
                waiting.push_back(request);
            }
            if waiting.len() == before {
                idle_yields += 1;
            }
        }
        returning = 0;
        let batch = take_batch(&mut waiting);
        running += 1;
        newest = Instant::now();
        let writer = writer.clone();
        let done = Finished(finished_tx.clone(), batch.len());
        tokio::spawn(async move {
            run_batch(&writer, batch).await;
            drop(done);
        });
    }
}

/// Whether the queue holds a full batch. Asked at every wake-up while a
/// batch runs, so a queue too short to fill one is answered without
/// counting its streams.
fn full(waiting: &VecDeque<Waiting>) -> bool {
    if waiting.len() < APPEND_BATCH_EVENTS
        && waiting
            .iter()
            .map(|(request, _)| request.data.len())
            .sum::<usize>()
            < APPEND_BATCH_BYTES
    {
        return false;
    }
    let mut streams = HashSet::new();
    let mut bytes = 0;
    for (request, _) in waiting {
        if streams.insert(request.token) {
            bytes += request.data.len();
            if streams.len() >= APPEND_BATCH_EVENTS || bytes >= APPEND_BATCH_BYTES {
                return true;
            }
        }
    }
    false
}

/// Reports a batch finished when dropped, however its task ends.
struct Finished(mpsc::UnboundedSender<usize>, usize);

impl Drop for Finished {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

/// Takes the next batch off the queue: in arrival order, at most one event
/// per stream (one statement can move a stream row only once), within the
/// size limits. What is left keeps its order for the next batch.
fn take_batch(waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
    let mut batch = Vec::new();
    let mut streams = HashSet::new();
    let mut bytes = 0;
    let mut rest = VecDeque::new();
    while let Some(request) = waiting.pop_front() {
        let size = request.0.data.len();
        let fits = batch.is_empty()
            || (batch.len() < APPEND_BATCH_EVENTS && bytes + size <= APPEND_BATCH_BYTES);
        if fits && streams.insert(request.0.token) {
            bytes += size;
            batch.push(request);
        } else {
            rest.push_back(request);
        }
    }
    *waiting = rest;
    batch
}

async fn run_batch(writer: &Writer, batch: Vec<Waiting>) {
    if batch.len() > 1 {
        let requests: Vec<&AppendRequest> = batch.iter().map(|(request, _)| request).collect();
        match run_statement(writer, &requests).await {
            Ok(seqs) => {
                for ((_, reply), seq) in batch.into_iter().zip(seqs) {
                    let _ = reply.send(Ok(seq));
                }
                return;
            }
            // The server refused the statement, so its transaction rolled
            // back and nothing of the batch is stored. Retrying each event
            // alone gives every caller its own answer (a deadlock with a
            // purge, say, then costs nobody their append).
            Err(e @ sqlx::Error::Database(_)) => tracing::warn!(error = %e, events = batch.len(),
                "a batched append failed; retrying its events one by one"),
            // Otherwise the outcome is unknown (the connection may have died
            // after the commit), and a retry could store events twice: every
            // caller gets the error, as a lone append would.
            Err(e) => {
                let closed = matches!(e, sqlx::Error::PoolClosed);
                let e = Arc::new(e);
                for (_, reply) in batch {
                    let _ = reply.send(Err(if closed {
                        Error::Closed
                    } else {
                        Error::backend(NAME, e.clone())
                    }));
                }
                return;
            }
        }
    }
    for (request, reply) in batch {
        let seq = run_statement(writer, &[&request]).await;
        let _ = reply.send(seq.map(|seqs| seqs[0]).map_err(backend));
    }
}

/// Runs the append statement for events of distinct streams (the
/// one-event statement for one); where each event went, in order.
async fn run_statement(
    writer: &Writer,
    requests: &[&AppendRequest],
) -> sqlx::Result<Vec<Appended>> {
    let requests = || requests.iter();
    let tokens: Vec<&[u8]> = requests().map(|r| &r.token.as_bytes()[..]).collect();
    let query = if let [one] = requests().as_slice() {
        sqlx::query(writer.one.clone())
            .bind(tokens[0])
            .bind(&one.stream_id[..])
            .bind(one.data.len() as i64)
            .bind(one.now)
            .bind(one.retry_ms)
            .bind(&one.data[..])
    } else {
        let stream_ids: Vec<&[u8]> = requests().map(|r| &r.stream_id[..]).collect();
        let lengths: Vec<i64> = requests().map(|r| r.data.len() as i64).collect();
        let stored_at: Vec<i64> = requests().map(|r| r.now).collect();
        let retry_ms: Vec<Option<i64>> = requests().map(|r| r.retry_ms).collect();
        let data: Vec<&[u8]> = requests().map(|r| &r.data[..]).collect();
        sqlx::query(writer.batch.clone())
            .bind(&tokens)
            .bind(stream_ids)
            .bind(lengths)
            .bind(stored_at)
            .bind(retry_ms)
            .bind(data)
    };
    let rows = query
        .bind(writer.limits.max_events)
        .bind(writer.limits.max_bytes)
        .fetch_all(&writer.pool)
        .await?;
    // Committed: these events shared one transaction and one WAL flush.
    observe::batch(NAME, requests().len());
    let mut seqs = vec![None; tokens.len()];
    for row in rows {
        let token: Vec<u8> = row.try_get(0)?;
        let incarnation: i64 = row.try_get(1)?;
        let seq: i64 = row.try_get(2)?;
        let at = tokens
            .iter()
            .position(|t| *t == &token[..])
            .ok_or_else(|| {
                sqlx::Error::Protocol("a batched append returned a stream it did not send".into())
            })?;
        seqs[at] = Some((incarnation, seq));
    }
    // Committed: one announcement for every stream of the statement.
    writer.notifier.announce(
        requests()
            .zip(&seqs)
            .filter(|(_, seq)| seq.is_some())
            .map(|(request, _)| request.token),
    );
    Ok(seqs)
}
