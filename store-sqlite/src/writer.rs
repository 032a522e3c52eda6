//! The one task that writes: group commit for appends, bounded purges.
//!
//! SQLite allows one writer at a time, and every commit under
//! `synchronous=FULL` costs an fsync. Funnelling all writes through one task
//! that owns one connection lets appends that arrive together share one
//! transaction and one fsync: the writer takes everything queued, runs it in
//! a single `BEGIN IMMEDIATE ... COMMIT`, and only then answers each caller.
//! Consecutive appends in a group become one multi-row `INSERT` (a statement
//! is a round trip to sqlx's SQLite thread, which is what bounds the rate
//! when a commit costs no fsync). A token collision fails only its own
//! append; a database error rolls the group back and each write is retried
//! alone, so one bad write cannot sink its neighbours.
//!
//! Purges run here too, in small transactions interleaved with append
//! groups, so retention never stalls appends for long.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamToken, dense, observe};
use mcp_event_store_core::{Error, Position, PurgeReport, Result, Retention};
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::{mpsc, oneshot};

use crate::{NAME, to_incarnation};

/// Rows one purge transaction deletes at most.
const PURGE_BATCH: i64 = 500;
/// Streams one limit-enforcement step visits at most.
const LIMIT_SCAN_BATCH: i64 = 100;

pub(crate) fn db_error(e: sqlx::Error) -> Error {
    match e {
        // The read pool is closed only by `SqliteStore::close`.
        sqlx::Error::PoolClosed => Error::Closed,
        e => Error::backend(NAME, e),
    }
}

/// A write for the writer task, and where its answer goes.
pub(crate) enum Command {
    Write(Write, Reply),
    Purge {
        now: i64,
        reply: oneshot::Sender<Result<PurgeReport>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// The data of a write; kept until the answer is sent, so a group that
/// failed can be replayed one write at a time.
pub(crate) enum Write {
    Append(Append),
    DeleteStream {
        token: StreamToken,
    },
    PutSession {
        session_id: String,
        state: Vec<u8>,
        expires_at: i64,
    },
    DeleteSession {
        session_id: String,
        now: i64,
    },
}

/// One event to append.
pub(crate) struct Append {
    pub token: StreamToken,
    pub stream_id: String,
    pub data: Vec<u8>,
    pub retry_ms: Option<i64>,
    pub now: i64,
}

/// The caller waiting for a write.
pub(crate) enum Reply {
    Position(oneshot::Sender<Result<Position>>),
    Count(oneshot::Sender<Result<u64>>),
    Unit(oneshot::Sender<Result<()>>),
    Flag(oneshot::Sender<Result<bool>>),
}

/// What a write produced.
enum Answer {
    Position(Position),
    Count(u64),
    Unit,
    Flag(bool),
}

impl Reply {
    fn send(self, answer: Result<Answer>) {
        match (self, answer) {
            (Reply::Position(tx), Ok(Answer::Position(p))) => drop(tx.send(Ok(p))),
            (Reply::Count(tx), Ok(Answer::Count(n))) => drop(tx.send(Ok(n))),
            (Reply::Unit(tx), Ok(Answer::Unit)) => drop(tx.send(Ok(()))),
            (Reply::Flag(tx), Ok(Answer::Flag(flag))) => drop(tx.send(Ok(flag))),
            (reply, Ok(_)) => reply.fail(Error::Corrupt("writer answered the wrong kind".into())),
            (reply, Err(e)) => reply.fail(e),
        }
    }

    fn fail(self, e: Error) {
        match self {
            Reply::Position(tx) => drop(tx.send(Err(e))),
            Reply::Count(tx) => drop(tx.send(Err(e))),
            Reply::Unit(tx) => drop(tx.send(Err(e))),
            Reply::Flag(tx) => drop(tx.send(Err(e))),
        }
    }
}

/// Where a purge in progress has got to.
enum PurgePhase {
    Age,
    Sessions,
    Limits { after_token: Vec<u8> },
}

struct PurgeJob {
    now: i64,
    phase: PurgePhase,
    report: PurgeReport,
    replies: Vec<oneshot::Sender<Result<PurgeReport>>>,
}

/// Streams this writer remembers at most (see [`Known`]).
const KNOWN_STREAMS_LIMIT: usize = 65_536;

/// A stream this writer has already matched to its stream id: the
/// incarnation it saw, and the byte count it last saw. Both may be stale
/// (another process may have written, or deleted the stream and started it
/// again), so the incarnation is checked by the append itself, and the byte
/// count is only a hint for when to look at the real one.
#[derive(Clone, Copy)]
struct Known {
    incarnation: i64,
    bytes: i64,
}

pub(crate) struct Writer {
    conn: SqliteConnection,
    retention: Retention,
    max_batch: usize,
    purge: Option<PurgeJob>,
    known: HashMap<StreamToken, Known>,
    /// The handle's followers, woken after each commit that touched their
    /// stream.
    wakeups: Arc<Wakeups>,
}

impl Writer {
    pub(crate) fn new(
        conn: SqliteConnection,
        retention: Retention,
        max_batch: usize,
        wakeups: Arc<Wakeups>,
    ) -> Self {
        Self {
            conn,
            retention,
            max_batch,
            purge: None,
            known: HashMap::new(),
            wakeups,
        }
    }

    /// Wakes the followers of the stream a committed write changed (an
    /// append, or a delete, which a follower must hear of to end with
    /// `EventsPurged`). Called after the commit, before the caller is
    /// answered.
    fn wake(&self, write: &Write, answer: &Result<Answer>) {
        if answer.is_err() {
            return;
        }
        match write {
            Write::Append(Append { token, .. }) | Write::DeleteStream { token } => {
                self.wakeups.wake(token);
            }
            Write::PutSession { .. } | Write::DeleteSession { .. } => {}
        }
    }

    /// Serves commands until every sender is gone or `Close` arrives.
    pub(crate) async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut closing = None;
        loop {
            let mut batch = Vec::new();
            if self.purge.is_none() {
                match commands.recv().await {
                    Some(command) => batch.push(command),
                    None => break,
                }
            }
            while batch.len() < self.max_batch {
                match commands.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            let mut group = Vec::with_capacity(batch.len());
            for command in batch {
                match command {
                    Command::Write(write, reply) => group.push((write, reply)),
                    Command::Purge { now, reply } => match &mut self.purge {
                        Some(job) => job.replies.push(reply),
                        None => {
                            self.purge = Some(PurgeJob {
                                now,
                                phase: PurgePhase::Age,
                                report: PurgeReport::default(),
                                replies: vec![reply],
                            })
                        }
                    },
                    Command::Close { reply } => closing = Some(reply),
                }
            }
            self.commit_group(group).await;
            if closing.is_some() {
                break;
            }
            if let Some(mut job) = self.purge.take() {
                let streams_before = job.report.streams;
                let step = self.purge_step(&mut job).await;
                if job.report.streams != streams_before {
                    // Whole streams expired: their followers end with
                    // `EventsPurged` now rather than at their re-check.
                    self.wakeups.wake_all();
                }
                match step {
                    Ok(true) => {
                        for reply in job.replies {
                            let _ = reply.send(Ok(job.report));
                        }
                    }
                    Ok(false) => self.purge = Some(job),
                    Err(e) => {
                        let e = Arc::new(e);
                        for reply in job.replies {
                            let _ = reply.send(Err(Error::backend(NAME, e.clone())));
                        }
                    }
                }
            }
        }
        if let Some(job) = self.purge.take() {
            for reply in job.replies {
                let _ = reply.send(Err(Error::Closed));
            }
        }
        if let Err(e) = self.conn.close().await {
            tracing::warn!(error = %e, "closing the sqlite writer connection failed");
        }
        if let Some(reply) = closing {
            let _ = reply.send(());
        }
    }

    /// Runs a group of writes in one transaction and answers them after the
    /// commit. A lone write runs without an explicit transaction (its main
    /// statement commits by itself). If the database fails part-way, the
    /// group is rolled back and each write retried alone, so one bad write
    /// cannot sink its neighbours.
    async fn commit_group(&mut self, group: Vec<(Write, Reply)>) {
        match group.len() {
            0 => return,
            1 => {
                let (write, reply) = group.into_iter().next().expect("one write");
                let answer = self.apply(&write, false).await;
                record_batch(std::iter::once((&write, &answer)));
                self.wake(&write, &answer);
                reply.send(answer);
                return;
            }
            _ => {}
        }
        if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut self.conn).await {
            let e = Arc::new(e);
            for (_, reply) in group {
                reply.fail(Error::backend(NAME, e.clone()));
            }
            return;
        }
        let mut answers = Vec::with_capacity(group.len());
        let mut broken = false;
        let mut next = 0;
        while next < group.len() {
            let run: Vec<&Append> = group[next..]
                .iter()
                .map_while(|(write, _)| match write {
                    Write::Append(append) => Some(append),
                    _ => None,
                })
                .collect();
            let checked = answers.len();
            if run.len() >= 2 {
                answers.extend(self.append_run(&run).await);
                next += run.len();
            } else {
                answers.push(self.apply(&group[next].0, true).await);
                next += 1;
            }
            if answers[checked..]
                .iter()
                .any(|answer| matches!(answer, Err(Error::Backend { .. })))
            {
                broken = true;
                break;
            }
        }
        if !broken {
            match sqlx::query("COMMIT").execute(&mut self.conn).await {
                Ok(_) => {
                    record_batch(group.iter().map(|(write, _)| write).zip(&answers));
                    for ((write, reply), answer) in group.into_iter().zip(answers) {
                        self.wake(&write, &answer);
                        reply.send(answer);
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "group commit failed; retrying writes one by one")
                }
            }
        }
        let _ = sqlx::query("ROLLBACK").execute(&mut self.conn).await;
        // Byte hints may count rolled-back appends.
        self.known.clear();
        for (write, reply) in group {
            let answer = self.apply(&write, false).await;
            record_batch(std::iter::once((&write, &answer)));
            self.wake(&write, &answer);
            reply.send(answer);
        }
    }

    async fn apply(&mut self, write: &Write, in_transaction: bool) -> Result<Answer> {
        match write {
            Write::Append(append) => self
                .append(append, in_transaction)
                .await
                .map(Answer::Position),
            Write::DeleteStream { token } => self
                .delete_stream(*token, in_transaction)
                .await
                .map(Answer::Count),
            Write::PutSession {
                session_id,
                state,
                expires_at,
            } => self
                .put_session(session_id, state, *expires_at)
                .await
                .map(|()| Answer::Unit),
            Write::DeleteSession { session_id, now } => self
                .delete_session(session_id, *now)
                .await
                .map(Answer::Flag),
        }
    }

    /// Makes sure the stream's row exists and belongs to `stream_id`, and
    /// returns what this writer now knows of it. A new row takes the next
    /// incarnation of the store-wide counter; the counter moves in the same
    /// statement (a trigger), under SQLite's write lock, so two writers,
    /// even in two processes, never take the same one.
    async fn ensure_stream(
        &mut self,
        token: StreamToken,
        stream_id: &str,
        now: i64,
    ) -> Result<Known> {
        let row = sqlx::query(
            "INSERT INTO mes_streams (token, stream_id, incarnation, last_seq, bytes, updated_at) \
             VALUES (?1, ?2, (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                 0, 0, ?3) \
             ON CONFLICT (token) DO UPDATE SET token = excluded.token \
             RETURNING stream_id, incarnation, bytes",
        )
        .bind(&token.as_bytes()[..])
        .bind(stream_id)
        .bind(now)
        .fetch_one(&mut self.conn)
        .await
        .map_err(db_error)?;
        let stored_stream: &str = row.try_get(0).map_err(db_error)?;
        if stored_stream != stream_id {
            return Err(Error::Corrupt(format!(
                "stream token collision between {stored_stream:?} and {stream_id:?}"
            )));
        }
        let known = Known {
            incarnation: row.try_get(1).map_err(db_error)?,
            bytes: row.try_get(2).map_err(db_error)?,
        };
        self.remember(token, known);
        Ok(known)
    }

    fn remember(&mut self, token: StreamToken, known: Known) {
        if self.known.len() >= KNOWN_STREAMS_LIMIT {
            self.known.clear();
        }
        self.known.insert(token, known);
    }

    /// Appends one event. In the steady state this is one statement: the
    /// sequence number comes from the stream row (if it is still the
    /// incarnation this writer knows), and a trigger moves the row along.
    async fn append(&mut self, append: &Append, in_transaction: bool) -> Result<Position> {
        let Append {
            token,
            ref stream_id,
            ref data,
            retry_ms,
            now,
        } = *append;
        let mut known = match self.known.get(&token) {
            Some(known) => *known,
            None => self.ensure_stream(token, stream_id, now).await?,
        };
        let mut seq = self
            .insert_event(token, known.incarnation, data, retry_ms, now)
            .await?;
        if seq.is_none() {
            // The row went away (deleted or expired, perhaps by another
            // process, and perhaps started again under a new incarnation)
            // since this writer last saw it.
            self.known.remove(&token);
            known = self.ensure_stream(token, stream_id, now).await?;
            seq = self
                .insert_event(token, known.incarnation, data, retry_ms, now)
                .await?;
        }
        let seq =
            seq.ok_or_else(|| Error::Corrupt("stream row vanished during an append".into()))?;
        known.bytes += data.len() as i64;
        self.remember(token, known);
        match trim_stream(
            &mut self.conn,
            &token.as_bytes()[..],
            seq,
            known.bytes,
            self.retention,
        )
        .await
        {
            Ok((_, Some(bytes))) => self.remember(token, Known { bytes, ..known }),
            Ok((_, None)) => {}
            Err(e) if in_transaction => return Err(e),
            // The event is committed; trimming is retried by the next
            // append or purge.
            Err(e) => tracing::warn!(error = %e, "trimming a stream after an append failed"),
        }
        position(known.incarnation, seq)
    }

    /// Appends a run of events inside the group's transaction with a
    /// constant number of statements, however many there are: one read of
    /// the streams' state, one multi-row insert per [`MAX_ROWS`] events, and
    /// the trims. Under the write lock nobody else can move the streams, so
    /// sequence numbers are assigned here, in arrival order. Returns one
    /// answer per write; a token collision fails only its own write, while a
    /// database error fails them all (and the caller rolls the group back).
    async fn append_run(&mut self, appends: &[&Append]) -> Vec<Result<Answer>> {
        match self.try_append_run(appends).await {
            Ok(answers) => answers,
            Err(e) => {
                let e = Arc::new(e);
                appends
                    .iter()
                    .map(|_| Err(Error::backend(NAME, e.clone())))
                    .collect()
            }
        }
    }

    async fn try_append_run(
        &mut self,
        appends: &[&Append],
    ) -> std::result::Result<Vec<Result<Answer>>, Error> {
        let mut streams: HashMap<StreamToken, RunStream> = HashMap::new();
        let tokens: Vec<StreamToken> = {
            let mut seen = HashSet::new();
            appends
                .iter()
                .map(|a| a.token)
                .filter(|t| seen.insert(*t))
                .collect()
        };
        for chunk in tokens.chunks(MAX_ROWS) {
            let sql = select_streams_sql(chunk.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for i in 0..padded(chunk.len()) {
                query = query.bind(chunk.get(i).map(|t| &t.as_bytes()[..]));
            }
            for row in query.fetch_all(&mut self.conn).await.map_err(db_error)? {
                let token: Vec<u8> = row.try_get(0).map_err(db_error)?;
                let token = chunk
                    .iter()
                    .find(|t| t.as_bytes()[..] == token[..])
                    .copied()
                    .ok_or_else(|| Error::Corrupt("a stream row the run did not ask for".into()))?;
                streams.insert(
                    token,
                    RunStream {
                        stream_id: row.try_get(1).map_err(db_error)?,
                        incarnation: row.try_get(2).map_err(db_error)?,
                        last_seq: row.try_get(3).map_err(db_error)?,
                        bytes: row.try_get(4).map_err(db_error)?,
                    },
                );
            }
        }

        // Assign sequence numbers in arrival order; new streams get a row
        // and an incarnation first (rare: once per stream's life).
        let mut answers = Vec::with_capacity(appends.len());
        let mut rows: Vec<(StreamToken, i64, &Append)> = Vec::with_capacity(appends.len());
        for append in appends {
            let stream = match streams.entry(append.token) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(new) => {
                    let incarnation: i64 = sqlx::query_scalar(
                        "INSERT INTO mes_streams \
                             (token, stream_id, incarnation, last_seq, bytes, updated_at) \
                         VALUES (?1, ?2, \
                             (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                             0, 0, ?3) \
                         RETURNING incarnation",
                    )
                    .bind(&append.token.as_bytes()[..])
                    .bind(&append.stream_id[..])
                    .bind(append.now)
                    .fetch_one(&mut self.conn)
                    .await
                    .map_err(db_error)?;
                    new.insert(RunStream {
                        stream_id: append.stream_id.to_owned(),
                        incarnation,
                        last_seq: 0,
                        bytes: 0,
                    })
                }
            };
            if stream.stream_id != append.stream_id {
                answers.push(Err(Error::Corrupt(format!(
                    "stream token collision between {:?} and {:?}",
                    stream.stream_id, append.stream_id
                ))));
                continue;
            }
            stream.last_seq += 1;
            stream.bytes += append.data.len() as i64;
            rows.push((append.token, stream.last_seq, append));
            answers.push(position(stream.incarnation, stream.last_seq).map(Answer::Position));
        }

        for chunk in rows.chunks(MAX_ROWS) {
            let sql = insert_events_sql(chunk.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for i in 0..padded(chunk.len()) {
                let row = chunk.get(i);
                query = query
                    .bind(row.map(|(token, _, _)| &token.as_bytes()[..]))
                    .bind(row.map(|(_, seq, _)| *seq))
                    .bind(row.map(|(_, _, a)| a.now))
                    .bind(row.and_then(|(_, _, a)| a.retry_ms))
                    .bind(row.map(|(_, _, a)| &a.data[..]));
            }
            let inserted = query
                .execute(&mut self.conn)
                .await
                .map_err(db_error)?
                .rows_affected();
            if inserted != chunk.len() as u64 {
                return Err(Error::Corrupt(format!(
                    "inserted {inserted} of {} events",
                    chunk.len()
                )));
            }
        }

        for token in tokens {
            let Some(stream) = streams.get(&token) else {
                continue;
            };
            let (_, bytes) = trim_stream(
                &mut self.conn,
                &token.as_bytes()[..],
                stream.last_seq,
                stream.bytes,
                self.retention,
            )
            .await?;
            self.remember(
                token,
                Known {
                    incarnation: stream.incarnation,
                    bytes: bytes.unwrap_or(stream.bytes),
                },
            );
        }
        Ok(answers)
    }

    /// Inserts an event after the stream's newest, if the stream row is
    /// still in `incarnation`; `None` if it is not (or is gone).
    async fn insert_event(
        &mut self,
        token: StreamToken,
        incarnation: i64,
        data: &[u8],
        retry_ms: Option<i64>,
        now: i64,
    ) -> Result<Option<i64>> {
        sqlx::query_scalar(
            "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
             SELECT token, last_seq + 1, ?3, ?4, ?5 FROM mes_streams \
             WHERE token = ?1 AND incarnation = ?2 \
             RETURNING seq",
        )
        .bind(&token.as_bytes()[..])
        .bind(incarnation)
        .bind(now)
        .bind(retry_ms)
        .bind(data)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(db_error)
    }

    /// Deletes a stream's row and events together (in the group's
    /// transaction, or in one of its own): a row without its events is
    /// fine, but events without their row would collide with the next life
    /// of the stream.
    async fn delete_stream(&mut self, token: StreamToken, in_transaction: bool) -> Result<u64> {
        self.known.remove(&token);
        if in_transaction {
            return delete_stream_rows(&mut self.conn, token).await;
        }
        let mut tx = self
            .conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)?;
        let deleted = delete_stream_rows(&mut tx, token).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(deleted)
    }

    async fn put_session(&mut self, session_id: &str, state: &[u8], expires_at: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO mes_sessions (session_id, state, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (session_id) DO UPDATE SET state = excluded.state, \
                 expires_at = excluded.expires_at",
        )
        .bind(session_id)
        .bind(state)
        .bind(expires_at)
        .execute(&mut self.conn)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn delete_session(&mut self, session_id: &str, now: i64) -> Result<bool> {
        let expires_at: Option<i64> = sqlx::query_scalar(
            "DELETE FROM mes_sessions WHERE session_id = ?1 RETURNING expires_at",
        )
        .bind(session_id)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(db_error)?;
        Ok(expires_at.is_some_and(|at| at > now))
    }

    /// One bounded transaction of purge work; `true` when the purge is done.
    async fn purge_step(&mut self, job: &mut PurgeJob) -> Result<bool> {
        // Purging changes byte counts behind the hints' back.
        self.known.clear();
        let mut tx = self
            .conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db_error)?;
        let done_with_phase = match &mut job.phase {
            PurgePhase::Age => match self.retention.expiry_cutoff_millis(job.now) {
                None => true,
                Some(cutoff) => {
                    let (events, streams) = purge_aged_events(&mut tx, cutoff).await?;
                    job.report.events += events;
                    job.report.streams += streams;
                    events < PURGE_BATCH as u64
                }
            },
            PurgePhase::Sessions => {
                let removed = sqlx::query(
                    "DELETE FROM mes_sessions WHERE rowid IN \
                     (SELECT rowid FROM mes_sessions WHERE expires_at <= ?1 LIMIT ?2)",
                )
                .bind(job.now)
                .bind(PURGE_BATCH)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?
                .rows_affected();
                job.report.sessions += removed;
                removed < PURGE_BATCH as u64
            }
            PurgePhase::Limits { after_token } => {
                let (events, next) = enforce_limits(&mut tx, after_token, self.retention).await?;
                job.report.events += events;
                match next {
                    Some(next) => {
                        *after_token = next;
                        false
                    }
                    None => true,
                }
            }
        };
        tx.commit().await.map_err(db_error)?;
        if done_with_phase {
            job.phase = match job.phase {
                PurgePhase::Age => PurgePhase::Sessions,
                PurgePhase::Sessions => PurgePhase::Limits {
                    after_token: Vec::new(),
                },
                PurgePhase::Limits { .. } => return Ok(true),
            };
        }
        Ok(false)
    }
}

/// Records how many appends one commit made durable together (the
/// `append_batch_size` histogram), if it made any: 1 for an append
/// committed alone.
fn record_batch<'a>(writes: impl Iterator<Item = (&'a Write, &'a Result<Answer>)>) {
    let appended = writes
        .filter(|(write, answer)| matches!(write, Write::Append(_)) && answer.is_ok())
        .count();
    if appended > 0 {
        observe::batch(NAME, appended);
    }
}

/// Events one multi-row insert carries at most (5 parameters each).
const MAX_ROWS: usize = 128;

/// A stream's state while a run is assigned sequence numbers.
struct RunStream {
    stream_id: String,
    incarnation: i64,
    last_seq: i64,
    bytes: i64,
}

/// Rows a statement is written for: the next power of two, so that a few
/// statement texts (and cached prepared statements) serve every run size.
/// The spare rows are bound to NULL and match nothing.
pub(crate) fn padded(rows: usize) -> usize {
    rows.next_power_of_two().max(2)
}

fn select_streams_sql(tokens: usize) -> String {
    let marks = vec!["?"; padded(tokens)].join(", ");
    format!(
        "SELECT token, stream_id, incarnation, last_seq, bytes FROM mes_streams \
         WHERE token IN ({marks})"
    )
}

fn insert_events_sql(rows: usize) -> String {
    let values = vec!["(?, ?, ?, ?, ?)"; padded(rows)].join(", ");
    // `column1` is the token: padding rows are all NULL and are skipped.
    format!(
        "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
         SELECT column1, column2, column3, column4, column5 FROM (VALUES {values}) \
         WHERE column1 IS NOT NULL"
    )
}

/// The id position of event `seq` of a stream in `incarnation`, both as
/// stored.
fn position(incarnation: i64, seq: i64) -> Result<Position> {
    let seq = u64::try_from(seq).map_err(|_| Error::Corrupt(format!("negative sequence {seq}")))?;
    Ok(dense::position(to_incarnation(incarnation)?, seq))
}

/// Deletes a stream's row, then its events (so the delete trigger has no
/// counters left to update); the caller holds a transaction.
async fn delete_stream_rows(conn: &mut SqliteConnection, token: StreamToken) -> Result<u64> {
    sqlx::query("DELETE FROM mes_streams WHERE token = ?1")
        .bind(&token.as_bytes()[..])
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    Ok(sqlx::query("DELETE FROM mes_events WHERE token = ?1")
        .bind(&token.as_bytes()[..])
        .execute(&mut *conn)
        .await
        .map_err(db_error)?
        .rows_affected())
}

/// Deletes up to one batch of events older than `cutoff` (the delete trigger
/// keeps byte counts right) and removes streams left with no events.
async fn purge_aged_events(conn: &mut SqliteConnection, cutoff: i64) -> Result<(u64, u64)> {
    let tokens: Vec<Vec<u8>> = sqlx::query_scalar(
        "DELETE FROM mes_events WHERE rowid IN \
         (SELECT rowid FROM mes_events WHERE stored_at < ?1 ORDER BY stored_at LIMIT ?2) \
         RETURNING token",
    )
    .bind(cutoff)
    .bind(PURGE_BATCH)
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let events = tokens.len() as u64;
    let touched: HashSet<Vec<u8>> = tokens.into_iter().collect();
    let mut streams = 0;
    for token in touched {
        streams += sqlx::query(
            "DELETE FROM mes_streams WHERE token = ?1 \
             AND NOT EXISTS (SELECT 1 FROM mes_events WHERE token = ?1)",
        )
        .bind(&token)
        .execute(&mut *conn)
        .await
        .map_err(db_error)?
        .rows_affected();
    }
    Ok((events, streams))
}

/// Trims every stream over the count or byte limit, a batch of streams at a
/// time in token order. Returns the events removed and where to continue.
async fn enforce_limits(
    conn: &mut SqliteConnection,
    after_token: &[u8],
    retention: Retention,
) -> Result<(u64, Option<Vec<u8>>)> {
    if retention.max_events_per_stream.is_none() && retention.max_bytes_per_stream.is_none() {
        return Ok((0, None));
    }
    let rows = sqlx::query(
        "SELECT token, last_seq, bytes FROM mes_streams WHERE token > ?1 ORDER BY token LIMIT ?2",
    )
    .bind(after_token)
    .bind(LIMIT_SCAN_BATCH)
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let mut removed = 0;
    let mut last = None;
    for row in &rows {
        let token: Vec<u8> = row.try_get(0).map_err(db_error)?;
        let last_seq: i64 = row.try_get(1).map_err(db_error)?;
        let bytes: i64 = row.try_get(2).map_err(db_error)?;
        removed += trim_stream(conn, &token, last_seq, bytes, retention)
            .await?
            .0;
        last = Some(token);
    }
    let more = rows.len() as i64 == LIMIT_SCAN_BATCH;
    Ok((removed, if more { last } else { None }))
}

/// Removes a stream's oldest events until it is within the count and byte
/// limits, never removing the newest event (`last_seq`). `bytes_hint` is what
/// the caller believes the stream holds; the real count is read before any
/// byte-limit deletion. Returns the events removed and, if it was read, the
/// stream's real byte count afterwards.
pub(crate) async fn trim_stream(
    conn: &mut SqliteConnection,
    token: &[u8],
    last_seq: i64,
    bytes_hint: i64,
    retention: Retention,
) -> Result<(u64, Option<i64>)> {
    let mut removed = 0;
    if let Some(max) = retention.max_events_per_stream {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        if last_seq > max {
            removed += delete_through(conn, token, last_seq - max).await?;
        }
    }
    let Some(max) = retention.max_bytes_per_stream else {
        return Ok((removed, None));
    };
    let max = i64::try_from(max).unwrap_or(i64::MAX);
    if bytes_hint <= max {
        return Ok((removed, None));
    }
    loop {
        let bytes: i64 = sqlx::query_scalar("SELECT bytes FROM mes_streams WHERE token = ?1")
            .bind(token)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_error)?
            .unwrap_or(0);
        if bytes <= max {
            return Ok((removed, Some(bytes)));
        }
        let sizes = sqlx::query(
            "SELECT seq, length(payload) FROM mes_events WHERE token = ?1 AND seq < ?2 \
             ORDER BY seq LIMIT 256",
        )
        .bind(token)
        .bind(last_seq)
        .fetch_all(&mut *conn)
        .await
        .map_err(db_error)?;
        let mut cut = None;
        let mut excess = bytes - max;
        for row in &sizes {
            if excess <= 0 {
                break;
            }
            let seq: i64 = row.try_get(0).map_err(db_error)?;
            let len: i64 = row.try_get(1).map_err(db_error)?;
            excess -= len;
            cut = Some(seq);
        }
        let Some(cut) = cut else {
            // Only the newest event is left; it stays.
            return Ok((removed, Some(bytes)));
        };
        removed += delete_through(conn, token, cut).await?;
    }
}

/// Deletes a stream's events up to and including `seq` (the delete trigger
/// keeps its byte count right). Returns how many went.
async fn delete_through(conn: &mut SqliteConnection, token: &[u8], seq: i64) -> Result<u64> {
    Ok(
        sqlx::query("DELETE FROM mes_events WHERE token = ?1 AND seq <= ?2")
            .bind(token)
            .bind(seq)
            .execute(&mut *conn)
            .await
            .map_err(db_error)?
            .rows_affected(),
    )
}
