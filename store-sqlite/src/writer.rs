//! The one task that writes: group commit for appends, bounded purges.
//!
//! SQLite allows one writer at a time, and every commit under
//! `synchronous=FULL` costs an fsync. Funnelling all writes through one task
//! that owns one connection lets appends that arrive together share one
//! transaction and one fsync: the writer takes everything queued, runs it in
//! a single `BEGIN IMMEDIATE ... COMMIT`, and only then answers each caller.
//! Each command runs under its own savepoint, so one failing command (a
//! token collision, say) does not undo its neighbours.
//!
//! Purges run here too, in small transactions interleaved with append
//! groups, so retention never stalls appends for long.

use std::collections::HashMap;
use std::sync::Arc;

use mcp_event_store_core::{Error, PurgeReport, Result, Retention, StreamToken};
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row};
use tokio::sync::{mpsc, oneshot};

use crate::BACKEND;

/// Rows one purge transaction deletes at most.
const PURGE_BATCH: i64 = 500;
/// Streams one limit-enforcement step visits at most.
const LIMIT_SCAN_BATCH: i64 = 100;

pub(crate) fn db_error(e: sqlx::Error) -> Error {
    Error::backend(BACKEND, e)
}

/// A write for the writer task.
pub(crate) enum Command {
    Append {
        token: StreamToken,
        stream_id: String,
        data: Vec<u8>,
        retry_ms: Option<i64>,
        now: i64,
        reply: oneshot::Sender<Result<u64>>,
    },
    DeleteStream {
        token: StreamToken,
        reply: oneshot::Sender<Result<u64>>,
    },
    PutSession {
        session_id: String,
        state: Vec<u8>,
        expires_at: i64,
        reply: oneshot::Sender<Result<()>>,
    },
    DeleteSession {
        session_id: String,
        now: i64,
        reply: oneshot::Sender<Result<bool>>,
    },
    Purge {
        now: i64,
        reply: oneshot::Sender<Result<PurgeReport>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// A command's result, held until its transaction commits.
enum Outcome {
    Count(oneshot::Sender<Result<u64>>, Result<u64>),
    Unit(oneshot::Sender<Result<()>>, Result<()>),
    Flag(oneshot::Sender<Result<bool>>, Result<bool>),
}

impl Outcome {
    /// Answers the caller; a failed commit turns every success into that
    /// failure, since nothing of the group was written.
    fn finish(self, commit: &Result<(), Arc<sqlx::Error>>) {
        fn settle<T>(result: Result<T>, commit: &Result<(), Arc<sqlx::Error>>) -> Result<T> {
            match (result, commit) {
                (Ok(_), Err(e)) => Err(Error::backend(BACKEND, e.clone())),
                (result, _) => result,
            }
        }
        match self {
            Outcome::Count(reply, r) => drop(reply.send(settle(r, commit))),
            Outcome::Unit(reply, r) => drop(reply.send(settle(r, commit))),
            Outcome::Flag(reply, r) => drop(reply.send(settle(r, commit))),
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

pub(crate) struct Writer {
    conn: SqliteConnection,
    retention: Retention,
    max_batch: usize,
    purge: Option<PurgeJob>,
}

impl Writer {
    pub(crate) fn new(conn: SqliteConnection, retention: Retention, max_batch: usize) -> Self {
        Self {
            conn,
            retention,
            max_batch,
            purge: None,
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
                    other => group.push(other),
                }
            }
            self.commit_group(group).await;
            if closing.is_some() {
                break;
            }
            if let Some(mut job) = self.purge.take() {
                match self.purge_step(&mut job).await {
                    Ok(true) => {
                        for reply in job.replies {
                            let _ = reply.send(Ok(job.report));
                        }
                    }
                    Ok(false) => self.purge = Some(job),
                    Err(e) => {
                        let e = Arc::new(e);
                        for reply in job.replies {
                            let _ = reply.send(Err(Error::backend(BACKEND, e.clone())));
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

    /// Runs a group of commands in one transaction and answers them after
    /// the commit.
    async fn commit_group(&mut self, group: Vec<Command>) {
        if group.is_empty() {
            return;
        }
        if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut self.conn).await {
            let e = Arc::new(e);
            for command in group {
                fail(command, &e);
            }
            return;
        }
        let mut outcomes = Vec::with_capacity(group.len());
        for command in group {
            outcomes.push(self.apply_in_savepoint(command).await);
        }
        let commit = match sqlx::query("COMMIT").execute(&mut self.conn).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut self.conn).await;
                Err(Arc::new(e))
            }
        };
        for outcome in outcomes {
            outcome.finish(&commit);
        }
    }

    async fn apply_in_savepoint(&mut self, command: Command) -> Outcome {
        if let Err(e) = sqlx::query("SAVEPOINT item").execute(&mut self.conn).await {
            let e = db_error(e);
            return match command {
                Command::Append { reply, .. } | Command::DeleteStream { reply, .. } => {
                    Outcome::Count(reply, Err(e))
                }
                Command::PutSession { reply, .. } => Outcome::Unit(reply, Err(e)),
                Command::DeleteSession { reply, .. } => Outcome::Flag(reply, Err(e)),
                Command::Purge { .. } | Command::Close { .. } => {
                    unreachable!("purge and close never join a group")
                }
            };
        }
        let outcome = match command {
            Command::Append {
                token,
                stream_id,
                data,
                retry_ms,
                now,
                reply,
            } => Outcome::Count(
                reply,
                self.append(token, &stream_id, &data, retry_ms, now).await,
            ),
            Command::DeleteStream { token, reply } => {
                Outcome::Count(reply, self.delete_stream(token).await)
            }
            Command::PutSession {
                session_id,
                state,
                expires_at,
                reply,
            } => Outcome::Unit(
                reply,
                self.put_session(&session_id, &state, expires_at).await,
            ),
            Command::DeleteSession {
                session_id,
                now,
                reply,
            } => Outcome::Flag(reply, self.delete_session(&session_id, now).await),
            Command::Purge { .. } | Command::Close { .. } => {
                unreachable!("purge and close never join a group")
            }
        };
        let failed = matches!(
            &outcome,
            Outcome::Count(_, Err(_)) | Outcome::Unit(_, Err(_)) | Outcome::Flag(_, Err(_))
        );
        if failed {
            let _ = sqlx::query("ROLLBACK TO item")
                .execute(&mut self.conn)
                .await;
        }
        let _ = sqlx::query("RELEASE item").execute(&mut self.conn).await;
        outcome
    }

    async fn append(
        &mut self,
        token: StreamToken,
        stream_id: &str,
        data: &[u8],
        retry_ms: Option<i64>,
        now: i64,
    ) -> Result<u64> {
        let row = sqlx::query(
            "INSERT INTO mes_streams (token, stream_id, last_seq, bytes, updated_at) \
             VALUES (?1, ?2, 1, ?3, ?4) \
             ON CONFLICT (token) DO UPDATE SET last_seq = last_seq + 1, \
                 bytes = bytes + excluded.bytes, updated_at = excluded.updated_at \
             RETURNING last_seq, stream_id, bytes",
        )
        .bind(&token.as_bytes()[..])
        .bind(stream_id)
        .bind(data.len() as i64)
        .bind(now)
        .fetch_one(&mut self.conn)
        .await
        .map_err(db_error)?;
        let seq: i64 = row.try_get(0).map_err(db_error)?;
        let stored_stream: &str = row.try_get(1).map_err(db_error)?;
        if stored_stream != stream_id {
            return Err(Error::Corrupt(format!(
                "stream token collision between {stored_stream:?} and {stream_id:?}"
            )));
        }
        let bytes: i64 = row.try_get(2).map_err(db_error)?;
        sqlx::query(
            "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(&token.as_bytes()[..])
        .bind(seq)
        .bind(now)
        .bind(retry_ms)
        .bind(data)
        .execute(&mut self.conn)
        .await
        .map_err(db_error)?;
        trim_stream(
            &mut self.conn,
            &token.as_bytes()[..],
            seq,
            bytes,
            self.retention,
        )
        .await?;
        u64::try_from(seq).map_err(|_| Error::Corrupt(format!("negative sequence {seq}")))
    }

    async fn delete_stream(&mut self, token: StreamToken) -> Result<u64> {
        let deleted = sqlx::query("DELETE FROM mes_events WHERE token = ?1")
            .bind(&token.as_bytes()[..])
            .execute(&mut self.conn)
            .await
            .map_err(db_error)?
            .rows_affected();
        sqlx::query("DELETE FROM mes_streams WHERE token = ?1")
            .bind(&token.as_bytes()[..])
            .execute(&mut self.conn)
            .await
            .map_err(db_error)?;
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

fn fail(command: Command, e: &Arc<sqlx::Error>) {
    let err = || Error::backend(BACKEND, e.clone());
    match command {
        Command::Append { reply, .. } | Command::DeleteStream { reply, .. } => {
            let _ = reply.send(Err(err()));
        }
        Command::PutSession { reply, .. } => {
            let _ = reply.send(Err(err()));
        }
        Command::DeleteSession { reply, .. } => {
            let _ = reply.send(Err(err()));
        }
        Command::Purge { reply, .. } => {
            let _ = reply.send(Err(err()));
        }
        Command::Close { reply } => {
            let _ = reply.send(());
        }
    }
}

/// Deletes up to one batch of events older than `cutoff`, keeps the byte
/// counters right, and removes streams left with no events.
async fn purge_aged_events(conn: &mut SqliteConnection, cutoff: i64) -> Result<(u64, u64)> {
    let rows = sqlx::query(
        "DELETE FROM mes_events WHERE rowid IN \
         (SELECT rowid FROM mes_events WHERE stored_at < ?1 ORDER BY stored_at LIMIT ?2) \
         RETURNING token, length(payload)",
    )
    .bind(cutoff)
    .bind(PURGE_BATCH)
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let mut freed: HashMap<Vec<u8>, i64> = HashMap::new();
    for row in &rows {
        let token: Vec<u8> = row.try_get(0).map_err(db_error)?;
        let len: i64 = row.try_get(1).map_err(db_error)?;
        *freed.entry(token).or_default() += len;
    }
    let mut streams = 0;
    for (token, bytes) in freed {
        sqlx::query("UPDATE mes_streams SET bytes = bytes - ?2 WHERE token = ?1")
            .bind(&token)
            .bind(bytes)
            .execute(&mut *conn)
            .await
            .map_err(db_error)?;
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
    Ok((rows.len() as u64, streams))
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
        removed += trim_stream(conn, &token, last_seq, bytes, retention).await?;
        last = Some(token);
    }
    let more = rows.len() as i64 == LIMIT_SCAN_BATCH;
    Ok((removed, if more { last } else { None }))
}

/// Removes a stream's oldest events until it is within the count and byte
/// limits, never removing the newest event. Returns how many went.
pub(crate) async fn trim_stream(
    conn: &mut SqliteConnection,
    token: &[u8],
    last_seq: i64,
    bytes: i64,
    retention: Retention,
) -> Result<u64> {
    let mut removed = 0;
    let mut bytes = bytes;
    if let Some(max) = retention.max_events_per_stream {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        if last_seq > max {
            let (count, freed) = delete_through(conn, token, last_seq - max).await?;
            removed += count;
            bytes -= freed;
        }
    }
    if let Some(max) = retention.max_bytes_per_stream {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        while bytes > max {
            let sizes = sqlx::query(
                "SELECT seq, length(payload) FROM mes_events WHERE token = ?1 \
                 ORDER BY seq LIMIT 256",
            )
            .bind(token)
            .fetch_all(&mut *conn)
            .await
            .map_err(db_error)?;
            let mut cut = None;
            let mut excess = bytes - max;
            for row in &sizes {
                let seq: i64 = row.try_get(0).map_err(db_error)?;
                let len: i64 = row.try_get(1).map_err(db_error)?;
                if excess <= 0 || seq >= last_seq {
                    break;
                }
                excess -= len;
                cut = Some(seq);
            }
            let Some(cut) = cut else { break };
            let (count, freed) = delete_through(conn, token, cut).await?;
            removed += count;
            bytes -= freed;
        }
    }
    Ok(removed)
}

/// Deletes a stream's events up to and including `seq`, keeping its byte
/// counter right. Returns (events, bytes) removed.
async fn delete_through(conn: &mut SqliteConnection, token: &[u8], seq: i64) -> Result<(u64, i64)> {
    let freed: Vec<i64> = sqlx::query_scalar(
        "DELETE FROM mes_events WHERE token = ?1 AND seq <= ?2 RETURNING length(payload)",
    )
    .bind(token)
    .bind(seq)
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let bytes: i64 = freed.iter().sum();
    if bytes > 0 {
        sqlx::query("UPDATE mes_streams SET bytes = bytes - ?2 WHERE token = ?1")
            .bind(token)
            .bind(bytes)
            .execute(&mut *conn)
            .await
            .map_err(db_error)?;
    }
    Ok((freed.len() as u64, bytes))
}
