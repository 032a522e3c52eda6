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
//!
//! What each write does is in the file for its job: [`crate::append`],
//! [`crate::purge`] (stream deletes and purges), [`crate::sessions`],
//! [`crate::tasks`] (every task mutation, each in one transaction).

use std::collections::HashMap;
use std::sync::Arc;

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamToken, observe};
use mcp_event_store_core::task::TaskOptions;
use mcp_event_store_core::{Error, Position, PurgeReport, Result, Retention};
use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;
use tokio::sync::{mpsc, oneshot};

use crate::error::NAME;
use crate::purge::PurgeJob;
use crate::tasks::{TaskAnswer, TaskWrite};

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
    /// A task mutation: one atomic step under the write lock.
    Task(Box<TaskWrite>),
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
    Task(oneshot::Sender<Result<TaskAnswer>>),
}

/// What a write produced.
pub(crate) enum Answer {
    Position(Position),
    Count(u64),
    Unit,
    Flag(bool),
    Task(TaskAnswer),
}

impl Reply {
    fn send(self, answer: Result<Answer>) {
        match (self, answer) {
            (Reply::Position(tx), Ok(Answer::Position(p))) => drop(tx.send(Ok(p))),
            (Reply::Count(tx), Ok(Answer::Count(n))) => drop(tx.send(Ok(n))),
            (Reply::Unit(tx), Ok(Answer::Unit)) => drop(tx.send(Ok(()))),
            (Reply::Flag(tx), Ok(Answer::Flag(flag))) => drop(tx.send(Ok(flag))),
            (Reply::Task(tx), Ok(Answer::Task(answer))) => drop(tx.send(Ok(answer))),
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
            Reply::Task(tx) => drop(tx.send(Err(e))),
        }
    }
}

/// Streams this writer remembers at most (see [`Known`]).
const KNOWN_STREAMS_LIMIT: usize = 65_536;

/// A stream this writer has already matched to its stream id: the
/// incarnation it saw, and the byte count it last saw. Both may be stale
/// (another process may have written, or deleted the stream and started it
/// again), so the incarnation is checked by the append itself, and the byte
/// count is only a hint for when to look at the real one.
#[derive(Clone, Copy)]
pub(crate) struct Known {
    pub(crate) incarnation: i64,
    pub(crate) bytes: i64,
}

pub(crate) struct Writer {
    pub(crate) conn: SqliteConnection,
    pub(crate) retention: Retention,
    max_batch: usize,
    purge: Option<PurgeJob>,
    pub(crate) known: HashMap<StreamToken, Known>,
    /// The handle's followers, woken after each commit that touched their
    /// stream.
    wakeups: Arc<Wakeups>,
    /// The handle's task watchers, woken after each commit that changed
    /// their task.
    task_wakeups: Arc<Wakeups>,
    /// How long tasks live.
    pub(crate) task_options: TaskOptions,
}

impl Writer {
    pub(crate) fn new(
        conn: SqliteConnection,
        retention: Retention,
        max_batch: usize,
        wakeups: Arc<Wakeups>,
        task_wakeups: Arc<Wakeups>,
        task_options: TaskOptions,
    ) -> Self {
        Self {
            conn,
            retention,
            max_batch,
            purge: None,
            known: HashMap::new(),
            wakeups,
            task_wakeups,
            task_options,
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
            Write::Task(task) => task.wake(&self.task_wakeups),
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
                        None => self.purge = Some(PurgeJob::new(now, reply)),
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
            Write::Task(task) => self.task(task, in_transaction).await.map(Answer::Task),
        }
    }

    pub(crate) fn remember(&mut self, token: StreamToken, known: Known) {
        if self.known.len() >= KNOWN_STREAMS_LIMIT {
            self.known.clear();
        }
        self.known.insert(token, known);
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

/// Rows a statement is written for: the next power of two, so that a few
/// statement texts (and cached prepared statements) serve every run size.
/// The spare rows are bound to NULL and match nothing.
pub(crate) fn padded(rows: usize) -> usize {
    rows.next_power_of_two().max(2)
}
