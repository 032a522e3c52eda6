//! The replay read path: each page read through SQLite itself (rusqlite),
//! on threads the store owns, with no async driver in between.
//!
//! A replay page is one indexed range read; through sqlx's pool, worker
//! thread and row decoding it cost several times what SQLite takes to run
//! it (see the `direct` baselines of the replay bench). Here a page is one
//! hop to a thread that holds its own connection and cached statement, and
//! the events come back built. Task reads (one snapshot of a task and its
//! inputs) run here too. Writes go through SQLite itself as well, on the
//! writer's thread ([`crate::writer`]); other reads go through sqlx's read
//! pool.
//!
//! The threads are started as replays need them, up to
//! [`SqliteOptions::read_connections`](crate::SqliteOptions::read_connections),
//! each with one connection to the file, which is already in WAL mode
//! (setup saw to that): readers never wait for the writer. A connection is
//! `query_only`: this path cannot write.
//!
//! A short read (a replay's first page, at most [`INLINE_EVENTS`] events:
//! what most resumes need) is cheaper than the hop itself: about 30 us
//! from SQLite's cache against as much again for the two thread switches.
//! So [`PageReaders::run_short`] runs it on the calling task, on a
//! connection of the handle's own taken from a small stack (as many as
//! page threads at most), never waiting: when none is free, or SQLite
//! would have to wait for a lock (its busy timeout is zero there), the read
//! goes to a page thread as any other.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use mcp_event_store_core::{Error, Result};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use crate::error::{NAME, sqlite_error};

/// A read run on a page thread's connection.
type Job = Box<dyn FnOnce(&Connection) + Send>;

/// The page threads of one handle (shared by its clones).
#[derive(Debug)]
pub(crate) struct PageReaders {
    path: PathBuf,
    busy_timeout: Duration,
    max_threads: usize,
    /// Threads waiting for a job.
    idle: Arc<AtomicUsize>,
    state: Mutex<State>,
    /// The connections of short reads on the calling task, free ones
    /// stacked; `None` once closed.
    inline: Mutex<Option<Vec<Connection>>>,
    /// Connections opened for short reads, free or in use.
    inline_opened: AtomicUsize,
}

/// The most events a read run on the calling task asks for
/// ([`PageReaders::run_short`]).
pub(crate) const INLINE_EVENTS: usize = 128;

#[derive(Debug)]
struct State {
    /// `None` once closed.
    queue: Option<Sender<Job>>,
    jobs: Arc<Mutex<Receiver<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl PageReaders {
    /// Page threads for the database at `path` (opened, migrated and in
    /// WAL mode), at most `max_threads` of them; none runs yet.
    pub(crate) fn new(path: &Path, busy_timeout: Duration, max_threads: usize) -> Self {
        let (queue, jobs) = std::sync::mpsc::channel();
        Self {
            path: path.to_owned(),
            busy_timeout,
            max_threads: max_threads.max(1),
            idle: Arc::default(),
            state: Mutex::new(State {
                queue: Some(queue),
                jobs: Arc::new(Mutex::new(jobs)),
                threads: Vec::new(),
            }),
            inline: Mutex::new(Some(Vec::new())),
            inline_opened: AtomicUsize::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `read` on a page thread's connection and waits for its answer.
    /// [`Error::Closed`] once the handle is closed.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.submit(Box::new(move |conn| {
            let _ = reply.send(read(conn));
        }))?;
        answer.await.map_err(|_| {
            Error::backend(
                NAME,
                "a replay page read ended without an answer (its thread panicked)",
            )
        })?
    }

    /// Runs a short `read` (see [`INLINE_EVENTS`]) on the calling task when
    /// a connection of its own is free and SQLite need not wait for a
    /// lock; otherwise, or when it fails, on a page thread as
    /// [`run`](Self::run) does. `read` must only read: it may run twice.
    pub(crate) async fn run_short<T: Send + 'static>(
        &self,
        read: impl Fn(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if let Some(conn) = self.take_inline() {
            let answer = read(&conn);
            self.give_back(conn);
            if let Ok(value) = answer {
                return Ok(value);
            }
            // Busy (its timeout is zero), or a real failure: the page
            // thread, which waits as every read does, answers.
        }
        self.run(read).await
    }

    /// A free connection for a read on the calling task: one from the
    /// stack, or a new one while fewer than the page threads are open.
    fn take_inline(&self) -> Option<Connection> {
        {
            let mut inline = self.inline.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(conn) = inline.as_mut()?.pop() {
                return Some(conn);
            }
        }
        let opened = self.inline_opened.fetch_add(1, Ordering::AcqRel);
        if opened >= self.max_threads {
            self.inline_opened.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        match open(&self.path, Duration::ZERO) {
            Ok(conn) => Some(conn),
            Err(_) => {
                // The page thread's open will report it.
                self.inline_opened.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    fn give_back(&self, conn: Connection) {
        let mut inline = self.inline.lock().unwrap_or_else(|p| p.into_inner());
        match inline.as_mut() {
            Some(free) if conn.is_autocommit() => free.push(conn),
            // Closed, or a failed read left a transaction open: let it go.
            _ => {
                self.inline_opened.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn submit(&self, job: Job) -> Result<()> {
        let mut state = self.state();
        let queue = state.queue.clone().ok_or(Error::Closed)?;
        if self.idle.load(Ordering::Acquire) == 0 && state.threads.len() < self.max_threads {
            // Opened here, not on the thread, so that a file that cannot be
            // opened is this call's error. Once per thread, a few dozen
            // microseconds.
            let conn = open(&self.path, self.busy_timeout)?;
            let (jobs, idle) = (state.jobs.clone(), self.idle.clone());
            let thread = std::thread::Builder::new()
                .name("mcp-event-store-sqlite-pages".into())
                .spawn(move || serve(&conn, &jobs, &idle))
                .map_err(|e| Error::backend(NAME, e))?;
            state.threads.push(thread);
        }
        queue.send(job).map_err(|_| Error::Closed)
    }

    /// Stops taking reads; waits for the threads to finish the reads queued
    /// before and close their connections.
    pub(crate) async fn close(&self) {
        let inline = self.inline.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(inline);
        let threads = {
            let mut state = self.state();
            state.queue = None;
            std::mem::take(&mut state.threads)
        };
        if threads.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

/// A page thread: runs jobs until every sender is gone (closed or dropped).
fn serve(conn: &Connection, jobs: &Mutex<Receiver<Job>>, idle: &AtomicUsize) {
    loop {
        idle.fetch_add(1, Ordering::AcqRel);
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        idle.fetch_sub(1, Ordering::AcqRel);
        let Ok(job) = job else { return };
        // A job that panics drops its reply (its caller gets an error);
        // the thread and its connection go on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(conn)));
    }
}

/// A read connection to the store's file.
fn open(path: &Path, busy_timeout: Duration) -> Result<Connection> {
    let conn = connect(path, busy_timeout)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(sqlite_error)?;
    Ok(conn)
}

/// A connection of the store's own threads (the page threads and the
/// writer) to its file: read-write, no SQLite mutex (each thread owns its
/// connection), the busy timeout, and the query planner stability
/// guarantee: a cached statement is never prepared again because a
/// parameter was bound anew. Without it SQLite re-plans the page statement
/// on every use (its `LIMIT` is a bound parameter), which costs more than
/// reading a short page.
pub(crate) fn connect(path: &Path, busy_timeout: Duration) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite_error)?;
    conn.busy_timeout(busy_timeout).map_err(sqlite_error)?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map_err(sqlite_error)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WAL database file with one table, and page readers on it.
    fn readers(dir: &tempfile::TempDir, threads: usize) -> PageReaders {
        let path = dir.path().join("pages.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (7);",
        )
        .unwrap();
        PageReaders::new(&path, Duration::from_secs(1), threads)
    }

    fn read_n(conn: &Connection) -> Result<i64> {
        conn.query_row("SELECT n FROM t", [], |row| row.get(0))
            .map_err(sqlite_error)
    }

    #[tokio::test]
    async fn reads_run_on_at_most_the_threads_allowed_and_close_ends_them() {
        let dir = tempfile::tempdir().unwrap();
        let readers = Arc::new(readers(&dir, 2));
        let mut reads = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let readers = readers.clone();
            reads.spawn(async move { readers.run(read_n).await });
        }
        while let Some(read) = reads.join_next().await {
            assert_eq!(read.unwrap().unwrap(), 7);
        }
        let started = readers.state().threads.len();
        assert!((1..=2).contains(&started), "{started} threads");
        readers.close().await;
        assert!(readers.state().threads.is_empty());
        assert!(matches!(readers.run(read_n).await, Err(Error::Closed)));
    }

    #[tokio::test]
    async fn a_short_read_runs_on_the_calling_task_unless_no_connection_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let readers = readers(&dir, 1);
        assert_eq!(readers.run_short(read_n).await.unwrap(), 7);
        assert!(readers.state().threads.is_empty(), "no page thread started");
        // The one connection allowed is in use: the read takes the hop.
        let held = readers.take_inline().unwrap();
        assert!(readers.take_inline().is_none());
        assert_eq!(readers.run_short(read_n).await.unwrap(), 7);
        assert_eq!(readers.state().threads.len(), 1);
        readers.give_back(held);
        assert!(readers.take_inline().is_some());
        readers.close().await;
        assert!(matches!(
            readers.run_short(read_n).await,
            Err(Error::Closed)
        ));
    }

    #[tokio::test]
    async fn a_short_read_that_fails_on_the_calling_task_is_read_again_on_a_page_thread() {
        let dir = tempfile::tempdir().unwrap();
        let readers = readers(&dir, 1);
        let on_thread = || std::thread::current().name() == Some("mcp-event-store-sqlite-pages");
        // Fails unless on a page thread, as a read SQLite would have made
        // wait for a lock does on the calling task.
        let read = move |conn: &Connection| {
            if on_thread() {
                read_n(conn)
            } else {
                Err(Error::backend(NAME, "busy"))
            }
        };
        assert_eq!(readers.run_short(read).await.unwrap(), 7);
        assert_eq!(readers.state().threads.len(), 1);
        readers.close().await;
    }

    #[tokio::test]
    async fn a_connection_only_reads() {
        let dir = tempfile::tempdir().unwrap();
        let readers = readers(&dir, 1);
        let write = readers
            .run(|conn| {
                conn.execute("INSERT INTO t VALUES (8)", [])
                    .map_err(sqlite_error)
            })
            .await;
        assert!(matches!(write, Err(Error::Backend { .. })), "{write:?}");
        assert_eq!(readers.run(read_n).await.unwrap(), 7);
        readers.close().await;
    }

    #[tokio::test]
    async fn a_read_that_panics_is_an_error_and_the_thread_reads_on() {
        let dir = tempfile::tempdir().unwrap();
        let readers = readers(&dir, 1);
        let panicked = readers
            .run(|_| -> Result<()> { panic!("a bug in a read") })
            .await;
        let Err(Error::Backend { source, .. }) = panicked else {
            panic!("{panicked:?}")
        };
        assert!(source.to_string().contains("panicked"), "{source}");
        assert_eq!(readers.run(read_n).await.unwrap(), 7);
        assert_eq!(readers.state().threads.len(), 1);
        readers.close().await;
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_opened_is_the_reads_error() {
        let dir = tempfile::tempdir().unwrap();
        let readers = PageReaders::new(&dir.path().join("missing.db"), Duration::from_secs(1), 1);
        assert!(matches!(
            readers.run(read_n).await,
            Err(Error::Backend { .. })
        ));
        readers.close().await;
    }
}
