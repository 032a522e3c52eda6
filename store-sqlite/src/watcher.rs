//! The watcher: finds writes made by other handles and processes for this
//! handle's followers.
//!
//! Appends through this handle wake its followers from the writer thread, right
//! after the commit. Another handle (or process) on the same file commits
//! through its own connection, and SQLite tells nobody. What SQLite does
//! offer is `PRAGMA data_version`: on one connection, its value changes when
//! any *other* connection has committed since the last time it was read. So
//! each handle with followers runs one watcher task owning one dedicated
//! connection, which reads `data_version` every poll interval. When it
//! changed, the watcher reads the rows of the streams being followed (one
//! statement per [`TOKENS_PER_QUERY`] streams) and wakes the streams whose
//! row moved (or appeared, or went), so a write to a stream nobody here
//! follows costs no follower a re-read. Task watchers
//! ([`crate::tasks`]) are all woken when `data_version` changed, and each
//! re-reads its own task.
//!
//! The watcher runs only while the handle has followers or task watchers:
//! the first follow or task watch starts it, and it ends at the first poll
//! that finds neither left, or at once when the handle is closed or
//! dropped. An idle store holds no
//! extra connection and runs no task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::backend::follow::Wakeups;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::watch;

use crate::writer::padded;

/// Streams one state query names at most.
const TOKENS_PER_QUERY: usize = 256;

/// Held by a running watcher task, so a [`Weak`] to it tells whether the
/// task (and its connection) is still there.
#[derive(Debug)]
pub(crate) struct Running;

/// One handle's watcher: started on demand, ended when not needed.
#[derive(Debug)]
pub(crate) struct Watcher {
    shared: Arc<Shared>,
    /// Set to `true` by [`Watcher::close`]; dropped with the handle. Either
    /// ends the task at once.
    closed: watch::Sender<bool>,
}

/// What the task needs; it holds no reference to the store itself.
#[derive(Debug)]
struct Shared {
    connect: SqliteConnectOptions,
    interval: Duration,
    wakeups: Arc<Wakeups>,
    /// The handle's task watchers: all woken when another connection
    /// committed, each then re-reading its own task.
    task_wakeups: Arc<Wakeups>,
    /// The running task, if any. A task that finds no follower clears it
    /// under this lock, and a new follower checks it under the same lock
    /// after subscribing, so a follower is never left without a watcher.
    running: Mutex<Option<Weak<Running>>>,
}

impl Shared {
    fn running(&self) -> MutexGuard<'_, Option<Weak<Running>>> {
        // Every critical section completes its one assignment.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Watcher {
    pub(crate) fn new(
        connect: SqliteConnectOptions,
        interval: Duration,
        wakeups: Arc<Wakeups>,
        task_wakeups: Arc<Wakeups>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                connect,
                interval,
                wakeups,
                task_wakeups,
                running: Mutex::new(None),
            }),
            closed: watch::channel(false).0,
        }
    }

    /// Starts the task unless it runs. Call it after subscribing a
    /// follower or a task watcher, from within the Tokio runtime.
    pub(crate) fn ensure(&self) {
        let mut running = self.shared.running();
        if running.as_ref().and_then(Weak::upgrade).is_some() {
            return;
        }
        let token = Arc::new(Running);
        *running = Some(Arc::downgrade(&token));
        tokio::spawn(run(self.shared.clone(), self.closed.subscribe(), token));
    }

    /// Ends the task (if any) at once, and any started later.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// The running task, if any (see `testing`).
    #[cfg_attr(not(feature = "conformance"), allow(dead_code))]
    pub(crate) fn running(&self) -> Option<Weak<Running>> {
        self.shared
            .running()
            .clone()
            .filter(|running| running.strong_count() > 0)
    }
}

/// The task: poll until closed, dropped, or no follower or task watcher is
/// left.
async fn run(shared: Arc<Shared>, mut closed: watch::Receiver<bool>, token: Arc<Running>) {
    let mut poll = Poll::default();
    loop {
        if *closed.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = closed.changed() => {
                // The handle was dropped (`Err`) or closed: stop now.
                if changed.is_err() || *closed.borrow() {
                    break;
                }
                continue;
            }
            () = tokio::time::sleep(shared.interval) => {}
        }
        {
            let mut running = shared.running();
            if shared.wakeups.followers() == 0 && shared.task_wakeups.followers() == 0 {
                *running = None;
                break;
            }
        }
        match poll.check(&shared).await {
            Ok(()) => poll.failing = false,
            Err(e) => {
                // The followers' periodic re-check covers the gap; try a
                // fresh connection at the next poll.
                if !poll.failing {
                    tracing::warn!(
                        error = %e,
                        "the sqlite follow watcher could not read the database; retrying"
                    );
                }
                poll.failing = true;
                poll.reset().await;
            }
        }
    }
    poll.reset().await;
    drop(token);
}

/// The watcher's connection and what it saw last.
#[derive(Default)]
struct Poll {
    conn: Option<SqliteConnection>,
    /// `data_version` at the last poll that read the streams; `None` before
    /// the first, so the first poll reads them.
    version: Option<i64>,
    /// Each followed stream's row as last read: `(incarnation, last_seq)`,
    /// `None` if it had none.
    seen: HashMap<StreamToken, Option<(i64, i64)>>,
    failing: bool,
}

impl Poll {
    /// Reads `data_version`; if another connection committed since the last
    /// poll, reads the followed streams' rows and wakes those that moved.
    /// A stream not seen before (a new follower's) is woken too: it may
    /// have moved between its follower's first read and this poll.
    async fn check(&mut self, shared: &Shared) -> Result<(), sqlx::Error> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self
                .conn
                .insert(SqliteConnection::connect_with(&shared.connect).await?),
        };
        let version: i64 = sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(&mut *conn)
            .await?;
        if self.version == Some(version) {
            return Ok(());
        }
        // Task watchers re-read their task and go back to waiting if its
        // `rev` did not move: one keyed read each, only when something
        // was committed elsewhere.
        shared.task_wakeups.wake_all();
        let followed = shared.wakeups.followed();
        let mut seen = HashMap::with_capacity(followed.len());
        for chunk in followed.chunks(TOKENS_PER_QUERY) {
            let mut query = sqlx::query(AssertSqlSafe(states_sql(chunk.len())));
            for i in 0..padded(chunk.len()) {
                query = query.bind(chunk.get(i).map(|token| &token.as_bytes()[..]));
            }
            let mut states = HashMap::with_capacity(chunk.len());
            for row in query.fetch_all(&mut *conn).await? {
                let token: Vec<u8> = row.try_get(0)?;
                if let Some(token) = StreamToken::from_bytes(&token) {
                    states.insert(token, (row.try_get(1)?, row.try_get(2)?));
                }
            }
            for token in chunk {
                seen.insert(*token, states.get(token).copied());
            }
        }
        for (token, state) in &seen {
            if self.seen.get(token) != Some(state) {
                shared.wakeups.wake(token);
            }
        }
        self.seen = seen;
        self.version = Some(version);
        Ok(())
    }

    /// Closes the connection and forgets what was seen.
    async fn reset(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(e) = conn.close().await
        {
            tracing::debug!(error = %e, "closing the sqlite follow watcher's connection failed");
        }
        self.version = None;
        self.seen.clear();
    }
}

/// The rows of up to `tokens` streams (padded like the writer's statements,
/// so a few statement texts serve every count; the padding binds NULL,
/// which matches nothing).
fn states_sql(tokens: usize) -> String {
    let marks = vec!["?"; padded(tokens)].join(", ");
    format!("SELECT token, incarnation, last_seq FROM mes_streams WHERE token IN ({marks})")
}
