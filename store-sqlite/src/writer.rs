//! The one thread that writes: group commit for appends, and the work the
//! job files hand it, each typed.
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
//! The writer knows appends (their group commit is its reason to be; what
//! an append does is in [`crate::append`]) and nothing else of the store:
//! every other write is a [`Job`] a job file hands it through the
//! [`Queue`] (stream deletes and purge steps from [`crate::purge`], session
//! writes from [`crate::sessions`], task steps from [`crate::tasks`]), whose
//! answer comes back as the job's own type. A job runs in the group's
//! transaction, or alone ([`Writer::atomically`]); a long one (a purge) is
//! queued as a job per bounded step, so appends get their turn in between.
//! `Close` is answered once the connection is closed; writes queued after
//! it, and every write once the thread has ended, fail with
//! [`Error::Closed`].

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamToken, observe};
use mcp_event_store_core::{Error, Position, Result, Retention};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::error::{NAME, sqlite_error};
use crate::watcher::OwnCommits;

/// The name of the writer's thread.
const THREAD_NAME: &str = "mcp-event-store-sqlite-writer";

/// Work a job file hands the writer: what it does on the writer's
/// connection, and whom it wakes once that is committed. Its answer reaches
/// the caller as [`Output`](Job::Output).
///
/// A job may run twice: when the group it ran in is rolled back, each of
/// its writes runs again alone. So it runs from `&self`.
pub(crate) trait Job: Send + 'static {
    /// What the caller is answered.
    type Output: Send + 'static;

    /// Runs on the writer's connection: inside the group's transaction when
    /// `in_transaction`, otherwise alone (a single statement commits by
    /// itself; more take a transaction of their own, see
    /// [`Writer::atomically`]).
    fn run(&self, writer: &mut Writer, in_transaction: bool) -> Result<Self::Output>;

    /// After the commit and before the answer: wakes whoever waits for what
    /// it changed.
    fn committed(&self, _output: &Self::Output) {}
}

/// A closure is a job that wakes nobody.
impl<T, F> Job for F
where
    F: Fn(&mut Writer, bool) -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    type Output = T;

    fn run(&self, writer: &mut Writer, in_transaction: bool) -> Result<T> {
        self(writer, in_transaction)
    }
}

/// The writer's queue, as a handle holds it: writes in, each answered with
/// its own type once committed. Every call fails with [`Error::Closed`]
/// once the writer has ended.
#[derive(Clone, Debug)]
pub(crate) struct Queue(mpsc::Sender<Command>);

impl Queue {
    /// Appends one event; its position once committed.
    pub(crate) async fn append(&self, append: Append) -> Result<Position> {
        let (reply, answer) = oneshot::channel();
        self.send(Write::Append(append, Answer::new(reply))).await?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// Runs `job`; its answer once committed.
    pub(crate) async fn run<J: Job>(&self, job: J) -> Result<J::Output> {
        let (reply, answer) = oneshot::channel();
        self.send(Write::Job(Box::new(Queued {
            job,
            answer: Answer::new(reply),
        })))
        .await?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// Finishes the writes queued before, then closes the writer's
    /// connection; returns once it is closed. Closing again does nothing.
    pub(crate) async fn close(&self) {
        let (reply, done) = oneshot::channel();
        if self.0.send(Command::Close { reply }).await.is_ok() {
            let _ = done.await;
        }
    }

    async fn send(&self, write: Write) -> Result<()> {
        self.0
            .send(Command::Write(write))
            .await
            .map_err(|_| Error::Closed)
    }
}

/// What the queue carries.
enum Command {
    Write(Write),
    Close { reply: oneshot::Sender<()> },
}

/// A queued write with the answer its caller waits for; kept until the
/// answer is sent, so a group that failed can be run again one write at a
/// time.
enum Write {
    /// An append, run with its neighbours as one multi-row insert.
    Append(Append, Answer<Position>),
    /// Anything else, from the file for its job.
    Job(Box<dyn Pending>),
}

/// One event to append.
pub(crate) struct Append {
    pub token: StreamToken,
    pub stream_id: String,
    pub data: Vec<u8>,
    pub retry_ms: Option<i64>,
    pub now: i64,
}

/// The answer to one write on its way to the caller: kept while the group
/// it ran in may still roll back, settled once it cannot.
struct Answer<T> {
    reply: oneshot::Sender<Result<T>>,
    kept: Option<Result<T>>,
    settled: Option<Result<T>>,
}

impl<T> Answer<T> {
    fn new(reply: oneshot::Sender<Result<T>>) -> Self {
        Self {
            reply,
            kept: None,
            settled: None,
        }
    }

    /// Keeps what a run produced; whether it is a database error, which
    /// sinks the group it ran in.
    fn keep(&mut self, answer: Result<T>) -> bool {
        let sinks = matches!(answer, Err(Error::Backend { .. }));
        self.kept = Some(answer);
        sinks
    }

    /// What was kept is committed (or failed for good).
    fn settle(&mut self) {
        if let Some(answer) = self.kept.take() {
            self.settled = Some(answer);
        }
    }

    /// Fails the write with `error` unless its answer is settled.
    fn fail(&mut self, error: &dyn Fn() -> Error) {
        if self.settled.is_none() {
            self.settled = Some(Err(error()));
        }
    }

    /// The committed output, if the write succeeded.
    fn committed(&self) -> Option<&T> {
        self.settled
            .as_ref()
            .and_then(|answer| answer.as_ref().ok())
    }

    fn send(self) {
        let answer = self.settled.unwrap_or_else(|| {
            Err(Error::backend(
                NAME,
                "the sqlite writer left a write unanswered",
            ))
        });
        let _ = self.reply.send(answer);
    }
}

/// A job and its answer, behind one type for the queue.
struct Queued<J: Job> {
    job: J,
    answer: Answer<J::Output>,
}

/// What the writer does with a queued job, whatever its output.
trait Pending: Send {
    /// Runs the job and keeps its answer; whether it sinks its group.
    fn run(&mut self, writer: &mut Writer, in_transaction: bool) -> bool;
    fn settle(&mut self);
    fn fail(&mut self, error: &dyn Fn() -> Error);
    /// Wakes whoever waits for what the job changed, if it was committed.
    fn wake(&self);
    fn send(self: Box<Self>);
}

impl<J: Job> Pending for Queued<J> {
    fn run(&mut self, writer: &mut Writer, in_transaction: bool) -> bool {
        let answer = self.job.run(writer, in_transaction);
        self.answer.keep(answer)
    }

    fn settle(&mut self) {
        self.answer.settle();
    }

    fn fail(&mut self, error: &dyn Fn() -> Error) {
        self.answer.fail(error);
    }

    fn wake(&self) {
        if let Some(output) = self.answer.committed() {
            self.job.committed(output);
        }
    }

    fn send(self: Box<Self>) {
        self.answer.send();
    }
}

impl Write {
    /// Runs the write alone, or in the group's transaction; whether it
    /// sinks the group.
    fn run(&mut self, writer: &mut Writer, in_transaction: bool) -> bool {
        match self {
            Write::Append(append, answer) => answer.keep(writer.append(append, in_transaction)),
            Write::Job(job) => job.run(writer, in_transaction),
        }
    }

    fn settle(&mut self) {
        match self {
            Write::Append(_, answer) => answer.settle(),
            Write::Job(job) => job.settle(),
        }
    }

    fn fail(&mut self, error: &dyn Fn() -> Error) {
        match self {
            Write::Append(_, answer) => answer.fail(error),
            Write::Job(job) => job.fail(error),
        }
    }

    fn send(self) {
        match self {
            Write::Append(_, answer) => answer.send(),
            Write::Job(job) => job.send(),
        }
    }

    /// The append and its answer, for a run of appends.
    fn as_append(&mut self) -> Option<(&Append, &mut Answer<Position>)> {
        match self {
            Write::Append(append, answer) => Some((append, answer)),
            Write::Job(_) => None,
        }
    }

    /// Whether this is an append that was committed.
    fn appended(&self) -> bool {
        matches!(self, Write::Append(_, answer) if answer.committed().is_some())
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
    pub(crate) known: HashMap<StreamToken, Known>,
    /// The handle's followers, woken after each commit of an append to
    /// their stream.
    wakeups: Arc<Wakeups>,
    /// Told of each commit group, and of other connections' commits, for
    /// the watcher.
    own: Arc<OwnCommits>,
    /// `data_version` on this connection after the last group: it moves
    /// only when another connection commits.
    data_version: Option<i64>,
}

impl Writer {
    pub(crate) fn new(
        conn: Connection,
        retention: Retention,
        max_batch: usize,
        wakeups: Arc<Wakeups>,
        own: Arc<OwnCommits>,
    ) -> Self {
        Self {
            conn,
            retention,
            max_batch,
            known: HashMap::new(),
            wakeups,
            own,
            data_version: None,
        }
    }

    /// Starts the writer's thread, serving a queue of `capacity` writes
    /// until every handle on it is gone or [`Queue::close`] is called.
    pub(crate) fn spawn(self, capacity: usize) -> Result<Queue> {
        let (queue, commands) = mpsc::channel(capacity);
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || self.run(commands))
            .map_err(|e| Error::backend(NAME, e))?;
        Ok(Queue(queue))
    }

    /// Serves commands until every sender is gone or `Close` arrives: the
    /// writer thread's whole life. Waits for commands blocking; the thread
    /// is its own.
    fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut closing = None;
        while let Some(first) = commands.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                match commands.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            let mut group = Vec::with_capacity(batch.len());
            for command in batch {
                match command {
                    Command::Write(write) => group.push(write),
                    Command::Close { reply } => closing = Some(reply),
                }
            }
            self.commit_group(group);
            if closing.is_some() {
                break;
            }
        }
        // Commands queued after `Close` are dropped with the queue: their
        // callers get `Error::Closed`.
        drop(commands);
        if let Err((_, e)) = self.conn.close() {
            tracing::warn!(error = %e, "closing the sqlite writer connection failed");
        }
        if let Some(reply) = closing {
            let _ = reply.send(());
        }
    }

    /// Runs a group of writes and answers each one after its commit (see
    /// [`run_group`](Self::run_group)). A write that panicked, and every
    /// write of its group not yet committed, is answered with an error; the
    /// writer rolls back what was open and goes on.
    fn commit_group(&mut self, mut group: Vec<Write>) {
        if group.is_empty() {
            return;
        }
        self.own.starting();
        if catch_unwind(AssertUnwindSafe(|| self.run_group(&mut group))).is_err() {
            let e = Arc::new(self.recover_from_panic());
            for write in &mut group {
                write.fail(&|| Error::backend(NAME, e.clone()));
            }
        }
        self.own.finished();
        self.look_for_foreign_commits();
        // After the commit and before the answers, so a woken follower's
        // re-read finds what its caller is told was stored. Outside the
        // panic guard: an answer settled is committed, whatever follows.
        for write in &group {
            match write {
                Write::Append(append, answer) => {
                    if answer.committed().is_some() {
                        self.wakeups.wake(&append.token);
                    }
                }
                Write::Job(job) => job.wake(),
            }
        }
        for write in group {
            write.send();
        }
    }

    /// Reads `data_version` on the writer's connection, which only another
    /// connection's commit moves, and tells the watcher when it moved (see
    /// [`OwnCommits`]). A failed read tells nothing; the watcher's poll
    /// stays the safety net.
    fn look_for_foreign_commits(&mut self) {
        let version = self
            .conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut statement| statement.query_row([], |row| row.get::<_, i64>(0)));
        match version {
            Ok(version) => {
                if self.data_version.is_some_and(|seen| seen != version) {
                    self.own.saw_foreign_commit();
                }
                self.data_version = Some(version);
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading data_version in the sqlite writer failed")
            }
        }
    }

    /// After a write panicked: rolls back the transaction it left open,
    /// forgets the byte hints, and returns the error its callers are
    /// answered with.
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

    /// Runs a group of writes in one transaction, settling each answer
    /// after the commit. A lone write runs without an explicit transaction
    /// of the group's (its main statement commits by itself). If the
    /// database fails part-way, the group is rolled back and each write
    /// retried alone, so one bad write cannot sink its neighbours.
    fn run_group(&mut self, group: &mut [Write]) {
        if let [write] = group {
            write.run(self, false);
            write.settle();
            record_batch(std::slice::from_ref(write));
            return;
        }
        if let Err(e) = self.execute("BEGIN IMMEDIATE") {
            let e = Arc::new(e);
            for write in group.iter_mut() {
                write.fail(&|| Error::backend(NAME, e.clone()));
            }
            return;
        }
        let mut broken = false;
        let mut next = 0;
        while next < group.len() && !broken {
            let mut run: Vec<(&Append, &mut Answer<Position>)> = group[next..]
                .iter_mut()
                .map_while(Write::as_append)
                .collect();
            if run.len() >= 2 {
                next += run.len();
                let appends: Vec<&Append> = run.iter().map(|(append, _)| *append).collect();
                let positions = self.append_run(&appends);
                for ((_, answer), position) in run.iter_mut().zip(positions) {
                    broken |= answer.keep(position);
                }
            } else {
                drop(run);
                broken = group[next].run(self, true);
                next += 1;
            }
        }
        if !broken {
            match self.execute("COMMIT") {
                Ok(()) => {
                    group.iter_mut().for_each(Write::settle);
                    record_batch(group);
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
        for write in group.iter_mut() {
            write.run(self, false);
            write.settle();
            record_batch(std::slice::from_ref(write));
        }
    }

    /// Runs a statement that takes no parameters and returns no rows
    /// (`BEGIN IMMEDIATE`, `COMMIT`, `ROLLBACK`), prepared once.
    pub(crate) fn execute(&self, sql: &str) -> Result<()> {
        execute(&self.conn, sql, []).map(drop)
    }

    /// Runs `step` as one transaction: the group's when `in_transaction`,
    /// otherwise one of its own under the write lock (`BEGIN IMMEDIATE`),
    /// committed if it succeeds, rolled back if not.
    pub(crate) fn atomically<T>(
        &mut self,
        in_transaction: bool,
        step: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if in_transaction {
            return step(self);
        }
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
fn record_batch(writes: &[Write]) {
    let appended = writes.iter().filter(|write| write.appended()).count();
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

    fn append(key: &StreamKey, stream_id: &str) -> Append {
        Append {
            token: key.token(stream_id),
            stream_id: stream_id.into(),
            data: b"x".to_vec(),
            retry_ms: None,
            now: 1,
        }
    }

    /// A write that panics: the writer's recovery under test.
    fn panics(_: &mut Writer, _: bool) -> Result<()> {
        panic!("a bug in a write")
    }

    fn events(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM mes_events", [], |row| row.get(0))
            .unwrap()
    }

    /// Runs `appends` as one group, with a panicking write before the one
    /// at `panic_at` if given; the appends' answers, in order.
    fn group(
        writer: &mut Writer,
        appends: Vec<Append>,
        panic_at: Option<usize>,
    ) -> (Vec<Result<Position>>, Option<Result<()>>) {
        let mut group = Vec::new();
        let mut answers = Vec::new();
        let mut panicked = None;
        for (i, append) in appends.into_iter().enumerate() {
            if panic_at == Some(i) {
                let (reply, answer) = oneshot::channel();
                group.push(Write::Job(Box::new(Queued {
                    job: panics,
                    answer: Answer::new(reply),
                })));
                panicked = Some(answer);
            }
            let (reply, answer) = oneshot::channel();
            group.push(Write::Append(append, Answer::new(reply)));
            answers.push(answer);
        }
        writer.commit_group(group);
        let answers = answers
            .into_iter()
            .map(|mut answer| answer.try_recv().expect("answered"))
            .collect();
        let panicked = panicked.map(|mut answer| answer.try_recv().expect("answered"));
        (answers, panicked)
    }

    #[tokio::test]
    async fn a_write_that_panics_is_an_error_and_the_writer_writes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("w.db")).await.unwrap();
        let panicked = store.inner.writer.run(panics).await;
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
        );
        let key = StreamKey::generate().unwrap();
        let (answers, panicked) = group(
            &mut writer,
            vec![append(&key, "a"), append(&key, "b"), append(&key, "a")],
            Some(2),
        );
        assert_eq!(answers.len(), 3);
        for answer in &answers {
            assert!(matches!(answer, Err(Error::Backend { .. })), "{answer:?}");
        }
        assert!(
            matches!(panicked, Some(Err(Error::Backend { .. }))),
            "{panicked:?}"
        );
        assert!(writer.conn.is_autocommit(), "the group was rolled back");
        assert_eq!(events(&writer.conn), 0);
        let (answers, _) = group(
            &mut writer,
            vec![append(&key, "a"), append(&key, "a")],
            None,
        );
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
