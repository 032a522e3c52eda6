//! The one thread that writes: group commit for appends, bounded purges.
//!
//! SQLite allows one writer at a time, and every commit under
//! `synchronous=FULL` costs an fsync. Funnelling all writes through one
//! thread that owns one connection lets appends that arrive together share
//! one transaction and one fsync: the writer takes everything queued (up to
//! `max_batch`), runs it in a single `BEGIN IMMEDIATE ... COMMIT`, wakes the
//! followers and task watchers of what it changed, and only then answers
//! each caller. Consecutive appends in a group become one multi-row
//! `INSERT`, so a group costs a few statements however many appends it
//! holds. A token collision fails only its own append; a database error
//! rolls the group back and each write is retried alone, so one bad write
//! cannot sink its neighbours.
//!
//! The writer is an OS thread of its own (`mcp-event-store-sqlite-writer`)
//! with a connection through SQLite itself (rusqlite; every statement is
//! prepared once and cached), not a task on an async driver: a write is one
//! hop from the caller to the thread (a tokio channel the thread waits on
//! blocking) and one back (a oneshot), where sqlx's connection made every
//! statement a further round trip to its own worker thread. The connection
//! is opened as the store's others are (see [`open`]): the file's WAL mode,
//! `synchronous` per [`Durability`](crate::Durability), the busy timeout,
//! foreign keys off; and temporary storage in memory. A write that panics
//! is answered with an error, with the rest of its group not yet
//! committed; the writer rolls back what it left open and serves on.
//!
//! Purges run here too, in small transactions interleaved with append
//! groups, so retention never stalls appends for long. `Close` is answered
//! once the connection is closed; writes queued after it, and every write
//! once the thread has ended, fail with [`Error::Closed`].
//!
//! What each write does is in the file for its job: [`crate::append`],
//! [`crate::purge`] (stream deletes and purges), [`crate::sessions`],
//! [`crate::tasks`] (every task mutation, each in one transaction).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamToken, observe};
use mcp_event_store_core::task::TaskOptions;
use mcp_event_store_core::{Error, Position, PurgeReport, Result, Retention};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::error::{NAME, sqlite_error};
use crate::purge::PurgeJob;
use crate::tasks::{TaskAnswer, TaskWrite};

/// The name of the writer's thread.
const THREAD_NAME: &str = "mcp-event-store-sqlite-writer";

/// A write for the writer thread, and where its answer goes.
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
    /// A write that panics: the writer's recovery under test.
    #[cfg(test)]
    Panic,
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
    pub(crate) conn: Connection,
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
        conn: Connection,
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

    /// Starts the writer's thread, serving `commands` until every sender is
    /// gone or `Close` arrives.
    pub(crate) fn spawn(self, commands: mpsc::Receiver<Command>) -> Result<()> {
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || self.run(commands))
            .map(drop)
            .map_err(|e| Error::backend(NAME, e))
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
            #[cfg(test)]
            Write::Panic => {}
        }
    }

    /// Serves commands until every sender is gone or `Close` arrives: the
    /// writer thread's whole life. Waits for commands blocking; the thread
    /// is its own.
    fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut closing = None;
        loop {
            let mut batch = Vec::new();
            if self.purge.is_none() {
                match commands.blocking_recv() {
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
            self.commit_group(group);
            if closing.is_some() {
                break;
            }
            if let Some(job) = self.purge.take() {
                self.purge_once(job);
            }
        }
        // Commands queued after `Close` are dropped with the queue: their
        // callers get `Error::Closed`.
        drop(commands);
        if let Some(job) = self.purge.take() {
            for reply in job.replies {
                let _ = reply.send(Err(Error::Closed));
            }
        }
        if let Err((_, e)) = self.conn.close() {
            tracing::warn!(error = %e, "closing the sqlite writer connection failed");
        }
        if let Some(reply) = closing {
            let _ = reply.send(());
        }
    }

    /// Runs one step of a purge, and answers its callers once it is done
    /// (or failed).
    fn purge_once(&mut self, mut job: PurgeJob) {
        let streams_before = job.report.streams;
        let step = catch_unwind(AssertUnwindSafe(|| self.purge_step(&mut job)))
            .unwrap_or_else(|_| Err(self.recover_from_panic()));
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

    /// Runs a group of writes and answers each one after its commit (see
    /// [`run_group`](Self::run_group)). A write that panicked, and every
    /// write of its group not yet committed, is answered with an error; the
    /// writer rolls back what was open and goes on.
    fn commit_group(&mut self, group: Vec<(Write, Reply)>) {
        if group.is_empty() {
            return;
        }
        let (writes, replies): (Vec<Write>, Vec<Reply>) = group.into_iter().unzip();
        let mut answers: Vec<Option<Result<Answer>>> = writes.iter().map(|_| None).collect();
        if catch_unwind(AssertUnwindSafe(|| self.run_group(&writes, &mut answers))).is_err() {
            let e = Arc::new(self.recover_from_panic());
            for answer in answers.iter_mut().filter(|answer| answer.is_none()) {
                *answer = Some(Err(Error::backend(NAME, e.clone())));
            }
        }
        // After the commit and before the answers, so a woken follower's
        // re-read finds what its caller is told was stored. Outside the
        // panic guard: an answer filled in is committed, whatever follows.
        for (write, answer) in writes.iter().zip(&answers) {
            if let Some(answer) = answer {
                self.wake(write, answer);
            }
        }
        for (reply, answer) in replies.into_iter().zip(answers) {
            reply.send(answer.unwrap_or_else(|| {
                Err(Error::backend(
                    NAME,
                    "the sqlite writer left a write unanswered",
                ))
            }));
        }
    }

    /// After a write or a purge step panicked: rolls back the transaction it
    /// left open, forgets the byte hints, and returns the error its callers
    /// are answered with.
    fn recover_from_panic(&mut self) -> Error {
        if !self.conn.is_autocommit()
            && let Err(e) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::warn!(error = %e, "rolling back after a panicking write failed");
        }
        self.known.clear();
        tracing::error!("a write panicked in the sqlite writer; it was rolled back");
        Error::backend(
            NAME,
            "a write panicked in the sqlite writer; it was rolled back",
        )
    }

    /// Runs a group of writes in one transaction, filling in each answer
    /// after the commit. A lone write runs without an
    /// explicit transaction (its main statement commits by itself). If the
    /// database fails part-way, the group is rolled back and each write
    /// retried alone, so one bad write cannot sink its neighbours.
    fn run_group(&mut self, group: &[Write], done: &mut [Option<Result<Answer>>]) {
        if let [write] = group {
            let answer = self.apply(write, false);
            record_batch(std::iter::once((write, &answer)));
            done[0] = Some(answer);
            return;
        }
        if let Err(e) = self.execute("BEGIN IMMEDIATE") {
            let e = Arc::new(e);
            for answer in done.iter_mut() {
                *answer = Some(Err(Error::backend(NAME, e.clone())));
            }
            return;
        }
        let mut answers = Vec::with_capacity(group.len());
        let mut broken = false;
        let mut next = 0;
        while next < group.len() {
            let run: Vec<&Append> = group[next..]
                .iter()
                .map_while(|write| match write {
                    Write::Append(append) => Some(append),
                    _ => None,
                })
                .collect();
            let checked = answers.len();
            if run.len() >= 2 {
                answers.extend(self.append_run(&run));
                next += run.len();
            } else {
                answers.push(self.apply(&group[next], true));
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
            match self.execute("COMMIT") {
                Ok(()) => {
                    record_batch(group.iter().zip(&answers));
                    for (answer, slot) in answers.into_iter().zip(done) {
                        *slot = Some(answer);
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "group commit failed; retrying writes one by one")
                }
            }
        }
        let _ = self.execute("ROLLBACK");
        // Byte hints may count rolled-back appends.
        self.known.clear();
        for (write, slot) in group.iter().zip(done) {
            let answer = self.apply(write, false);
            record_batch(std::iter::once((write, &answer)));
            *slot = Some(answer);
        }
    }

    fn apply(&mut self, write: &Write, in_transaction: bool) -> Result<Answer> {
        match write {
            Write::Append(append) => self.append(append, in_transaction).map(Answer::Position),
            Write::DeleteStream { token } => self
                .delete_stream(*token, in_transaction)
                .map(Answer::Count),
            Write::PutSession {
                session_id,
                state,
                expires_at,
            } => self
                .put_session(session_id, state, *expires_at)
                .map(|()| Answer::Unit),
            Write::DeleteSession { session_id, now } => {
                self.delete_session(session_id, *now).map(Answer::Flag)
            }
            Write::Task(task) => self.task(task, in_transaction).map(Answer::Task),
            #[cfg(test)]
            Write::Panic => panic!("a bug in a write"),
        }
    }

    /// Runs a statement that takes no parameters and returns no rows
    /// (`BEGIN IMMEDIATE`, `COMMIT`, `ROLLBACK`), prepared once.
    pub(crate) fn execute(&self, sql: &str) -> Result<()> {
        execute(&self.conn, sql, []).map(drop)
    }

    /// Runs `step` in a transaction of its own under the write lock
    /// (`BEGIN IMMEDIATE`): committed if it succeeds, rolled back if not.
    pub(crate) fn in_transaction<T>(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        self.execute("BEGIN IMMEDIATE")?;
        let answer = step(self).and_then(|answer| self.execute("COMMIT").map(|()| answer));
        if answer.is_err() && !self.conn.is_autocommit() {
            let _ = self.execute("ROLLBACK");
        }
        answer
    }

    pub(crate) fn remember(&mut self, token: StreamToken, known: Known) {
        if self.known.len() >= KNOWN_STREAMS_LIMIT {
            self.known.clear();
        }
        self.known.insert(token, known);
    }
}

/// Opens the writer's connection to the store's file, which setup has
/// already put in WAL mode and migrated: as the page threads' (see
/// [`crate::pages::connect`]), with `synchronous`
/// for the durability, foreign keys off (as every connection of the
/// store), temporary storage in memory, and a statement cache that holds
/// every statement the writer runs.
pub(crate) fn open(
    path: &std::path::Path,
    busy_timeout: std::time::Duration,
    synchronous: &str,
) -> Result<Connection> {
    let conn = crate::pages::connect(path, busy_timeout)?;
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(sqlite_error)?;
    conn.pragma_update(None, "foreign_keys", false)
        .map_err(sqlite_error)?;
    // A statement inside a group's transaction keeps an undo copy of the
    // pages it changes (the statement journal), and SQLite moves that copy
    // to a new temporary file once it passes 64 KiB: a file created,
    // written and unlinked by every full group. In memory it costs no
    // system call. Every delete the writer runs is bounded
    // ([`crate::purge`]), so the copy stays small.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(sqlite_error)?;
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .map_err(sqlite_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Config(format!(
            "the SQLite writer found the database in journal mode {mode:?} instead of WAL"
        )));
    }
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Runs a cached statement that changes rows; returns how many it changed.
pub(crate) fn execute(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<u64> {
    conn.prepare_cached(sql)
        .and_then(|mut statement| statement.execute(params))
        .map(|changed| changed as u64)
        .map_err(sqlite_error)
}

/// Statements the writer keeps prepared: every fixed statement, and each
/// padded size of the multi-row ones.
const STATEMENT_CACHE: usize = 128;

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

#[cfg(test)]
mod tests {
    use mcp_event_store_core::backend::StreamKey;
    use mcp_event_store_core::{EventStore, NewEvent};

    use super::*;
    use crate::SqliteStore;

    fn append(key: &StreamKey, stream_id: &str) -> Write {
        Write::Append(Append {
            token: key.token(stream_id),
            stream_id: stream_id.into(),
            data: b"x".to_vec(),
            retry_ms: None,
            now: 1,
        })
    }

    fn events(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM mes_events", [], |row| row.get(0))
            .unwrap()
    }

    /// Runs `writes` as one group; their answers, in order.
    fn group(writer: &mut Writer, writes: Vec<Write>) -> Vec<Result<Position>> {
        let (group, answers): (Vec<_>, Vec<_>) = writes
            .into_iter()
            .map(|write| {
                let (reply, answer) = oneshot::channel();
                ((write, Reply::Position(reply)), answer)
            })
            .unzip();
        writer.commit_group(group);
        answers
            .into_iter()
            .map(|mut answer| answer.try_recv().expect("answered"))
            .collect()
    }

    #[tokio::test]
    async fn a_write_that_panics_is_an_error_and_the_writer_writes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("w.db")).await.unwrap();
        let panicked = store.write(Reply::Unit, Write::Panic).await;
        let Err(Error::Backend { source, .. }) = panicked else {
            panic!("{panicked:?}")
        };
        assert!(source.to_string().contains("panicked"), "{source}");
        let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
        assert_eq!(
            store
                .get_stream_id_for_event_id(&id.to_string())
                .await
                .unwrap(),
            Some("s".into())
        );
        store.close().await;
        assert!(matches!(
            store.store_event("s", NewEvent::new(b"x")).await,
            Err(Error::Closed)
        ));
    }

    #[tokio::test]
    async fn a_group_with_a_write_that_panics_is_rolled_back_and_answered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        SqliteStore::open(&path).await.unwrap().close().await;
        let conn = open(&path, std::time::Duration::from_secs(1), "NORMAL").unwrap();
        let mut writer = Writer::new(
            conn,
            Retention::unbounded(),
            512,
            Arc::default(),
            Arc::default(),
            TaskOptions::default(),
        );
        let key = StreamKey::generate().unwrap();
        let answers = group(
            &mut writer,
            vec![
                append(&key, "a"),
                append(&key, "b"),
                Write::Panic,
                append(&key, "a"),
            ],
        );
        assert_eq!(answers.len(), 4);
        for answer in &answers {
            assert!(matches!(answer, Err(Error::Backend { .. })), "{answer:?}");
        }
        assert!(writer.conn.is_autocommit(), "the group was rolled back");
        assert_eq!(events(&writer.conn), 0);
        let answers = group(&mut writer, vec![append(&key, "a"), append(&key, "a")]);
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(events(&writer.conn), 2);
    }

    #[tokio::test]
    async fn the_writer_connection_is_opened_as_the_durability_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        SqliteStore::open(&path).await.unwrap().close().await;
        for (synchronous, level) in [("NORMAL", 1), ("FULL", 2)] {
            let conn = open(&path, std::time::Duration::from_secs(1), synchronous).unwrap();
            let read = |pragma: &str| -> i64 {
                conn.pragma_query_value(None, pragma, |row| row.get(0))
                    .unwrap()
            };
            assert_eq!(read("synchronous"), level);
            assert_eq!(read("foreign_keys"), 0);
            assert_eq!(read("busy_timeout"), 1000);
            assert_eq!(read("temp_store"), 2, "statement journals in memory");
        }
        let missing = open(
            &dir.path().join("missing.db"),
            std::time::Duration::from_secs(1),
            "NORMAL",
        );
        assert!(matches!(missing, Err(Error::Backend { .. })));
    }
}
