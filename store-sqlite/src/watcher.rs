//! The watcher: finds writes made by other handles and processes for this
//! handle's followers.
//!
//! Appends through this handle wake its followers from the writer thread, right
//! after the commit. Another handle (or process) on the same file commits
//! through its own connection, and SQLite tells nobody. What SQLite does
//! offer is `PRAGMA data_version`: on one connection, its value changes when
//! any *other* connection has committed since the last time it was read. So
//! each handle with followers runs one watcher task owning one dedicated
//! connection, which reads `data_version` at each *check*. When it changed,
//! the watcher reads the rows of the streams being followed (one statement
//! per [`TOKENS_PER_QUERY`] streams) and wakes the streams whose row moved
//! (or appeared, or went), so a write to a stream nobody here follows costs
//! no follower a re-read. Task watchers ([`crate::tasks`]) are all woken
//! when `data_version` changed, and each re-reads its own task.
//!
//! What prompts a check:
//!
//! * **A file notification** (the `notify` crate: inotify on Linux,
//!   FSEvents on macOS, ReadDirectoryChangesW on Windows). The task watches
//!   the database's directory, not recursively (the `-wal` file comes and
//!   goes), and reacts to changes of the database file, its `-wal` and its
//!   `-journal` only (not to mere opens and closes); every commit, by any
//!   process on this host, writes one of them. A notification wakes the
//!   task at once, with no timer in the way. The notifications that come
//!   during a check (a commit is several writes) are coalesced into one
//!   pending wake-up ([`Notify`]), so at most one more check follows it.
//!   Each check is charged [`CHECK_DUTY`] times its duration (at most
//!   [`BURST`]), and once the charges run more than [`BURST`] ahead of the
//!   clock, notified checks wait for it: a commit now and then is checked
//!   at once, and a stream of commits (this handle's own included: to the
//!   watcher's connection they are another connection's) keeps the watcher
//!   busy about a quarter of the time at most. Commits that wake none of
//!   this handle's followers (its own appends to streams nobody here
//!   follows, say) make notified checks back off ([`QUIET`]), up to the
//!   poll interval, until one wakes a follower again. A commit's writes are reported before the commit is
//!   visible to readers (SQLite publishes it in the WAL index, in shared
//!   memory, afterwards, which no notification reports), so a notified
//!   check that found nothing new is repeated at once up to
//!   [`QUICK_RETRIES`] times, then once more [`SETTLE`] later. The first
//!   check runs as soon as the notifier is in place, so a commit made
//!   before it was is found too.
//!
//!   The notifier runs while others commit: see [`OwnCommits`] for how the
//!   handle's own commits are told from others', and
//!   [`OWN_CHECKS_BEFORE_OFF`] for when it is turned off and on again.
//! * **The poll**, every
//!   [`follow_poll_interval`](crate::SqliteOptions::follow_poll_interval)
//!   after the last check: the safety net for what notifications miss (a
//!   commit published after the settle re-check, a writer on another host
//!   sharing a network file system, which raises no notification here),
//!   and the only prompt for a handle whose notifier could not be created
//!   (the inotify instance or watch limit reached, say: one warning is
//!   logged per handle, and the handle polls) and for an in-memory
//!   database.
//!
//! The watcher runs only while the handle has followers or task watchers:
//! the first follow or task watch starts it (and its notifier), and it ends
//! (dropping the notifier) at the first check that finds neither left, or
//! at once when the handle is closed or dropped. An idle store holds no
//! extra connection, no notifier and runs no task.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::backend::follow::Wakeups;
use notify::{EventKind, RecursiveMode, Watcher as _};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::writer::padded;

/// Streams one state query names at most.
const TOKENS_PER_QUERY: usize = 256;

/// Each check is charged this many times its duration (at most [`BURST`]):
/// checks that notifications prompt wait while the charges run ahead of
/// the clock by more than [`BURST`], so however fast commits come (this
/// handle's own included), the watcher spends at most about a quarter of
/// its time checking (reading a thousand followed streams' rows takes
/// longer than reading one), while a commit now and then is checked at
/// once. The cap keeps one check slowed down by a busy machine (the
/// followers it woke, say) from holding the next one back; checks that
/// really take longer than `BURST / CHECK_DUTY` (tens of thousands of
/// streams followed) are spaced `BURST` apart instead.
const CHECK_DUTY: u32 = 4;

/// How far the charges of [`CHECK_DUTY`] may run ahead of the clock before
/// a notified check waits.
const BURST: Duration = Duration::from_millis(5);

/// After a check that found a commit but woke no follower, notified checks
/// wait this long after it, twice as long after each further such check
/// (up to the poll interval), and at once again after one that woke a
/// follower: commits nobody here follows, such as this handle's own
/// appends to streams nobody here follows, cost a few checks, not one
/// each. A check that woke task watchers (every check that found a
/// commit, while there are any: each re-reads its own task) counts as
/// waking a follower, so a watch is woken at once however often tasks
/// change; this handle's own commits turn the notifier off instead (see
/// [`OWN_CHECKS_BEFORE_OFF`]).
const QUIET: Duration = Duration::from_millis(1);

/// How many times a notified check that found nothing new is repeated at
/// once: the notified write's commit is usually published within
/// microseconds of it.
const QUICK_RETRIES: usize = 3;

/// How long after a notified check that still found nothing new the
/// watcher checks once more, for a commit published later than that.
const SETTLE: Duration = Duration::from_millis(1);

/// Held by a running watcher task, so a [`Weak`] to it tells whether the
/// task (and its connection) is still there.
#[derive(Debug)]
pub(crate) struct Running;

/// What the handle's writer tells its watcher about commits, so the watcher
/// can tell another connection's commit (another handle's, another
/// process's) from the handle's own, which its writer wakes followers for
/// itself: the file notifier is worth its cost only while others commit.
///
/// The writer counts each commit group before it starts ([`started`]) and
/// after it ends ([`finished`]). A check whose `data_version` moved, while
/// no group of the writer's was in flight since the check before, saw
/// another connection's commit: `finished` is read before a check's
/// `data_version` and `started` after it, so any own commit published
/// between two checks' reads is counted by the later `started` and not by
/// the earlier `finished`. While the writer is busy that test says nothing,
/// so the writer also reads `data_version` on its own connection after
/// each group (where only others' commits move it) and reports what it
/// finds through [`foreign`].
///
/// [`started`]: OwnCommits::started
/// [`finished`]: OwnCommits::finished
/// [`foreign`]: OwnCommits::foreign
#[derive(Debug, Default)]
pub(crate) struct OwnCommits {
    started: AtomicU64,
    finished: AtomicU64,
    /// Set by the writer when its `data_version` moved: another
    /// connection committed. Taken by the watcher's next check.
    reported: AtomicBool,
    /// Notified with [`reported`](Self::reported), to prompt a check while
    /// the notifier is off.
    foreign: Notify,
    /// Checks that saw another connection's commit (see `testing`).
    seen: AtomicU64,
    /// Whether the file notifier is on (see `testing`).
    notifying: AtomicBool,
}

impl OwnCommits {
    /// Called by the writer before each commit group.
    pub(crate) fn starting(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
    }

    /// Called by the writer after each commit group.
    pub(crate) fn finished(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    /// Called by the writer when its connection's `data_version` moved.
    pub(crate) fn saw_foreign_commit(&self) {
        self.reported.store(true, Ordering::SeqCst);
        self.foreign.notify_one();
    }
}

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
    /// The files whose changes prompt a check, found when the handle was
    /// opened (so a relative path means what it meant then), or why there
    /// are none to watch.
    files: Result<Files, NoFiles>,
    /// Set once the notifier could not be created, so that is logged as a
    /// warning once per handle.
    warned: AtomicBool,
    /// What the handle's writer reports of its commits.
    own: Arc<OwnCommits>,
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
        own: Arc<OwnCommits>,
        wakeups: Arc<Wakeups>,
        task_wakeups: Arc<Wakeups>,
    ) -> Self {
        let files = Files::of(connect.get_filename());
        Self {
            shared: Arc::new(Shared {
                connect,
                interval,
                files,
                warned: AtomicBool::new(false),
                own,
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

    /// How many of the watcher's checks saw another connection's commit
    /// (see `testing`).
    #[cfg_attr(not(feature = "conformance"), allow(dead_code))]
    pub(crate) fn foreign_commits_seen(&self) -> u64 {
        self.shared.own.seen.load(Ordering::SeqCst)
    }

    /// Whether the watcher's file notifier is on (see `testing`).
    #[cfg_attr(not(feature = "conformance"), allow(dead_code))]
    pub(crate) fn notifying(&self) -> bool {
        self.shared.own.notifying.load(Ordering::SeqCst)
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

/// The database's directory and the names in it whose changes mean a
/// commit.
#[derive(Debug)]
struct Files {
    dir: PathBuf,
    names: Arc<[OsString]>,
}

/// Why a database has no files to watch.
#[derive(Debug)]
enum NoFiles {
    /// It is in memory: nobody else can commit to it.
    InMemory,
    /// Its path could not be resolved.
    Unresolved(String),
}

impl Files {
    /// The files of the database at `path`: itself, its `-wal` and its
    /// `-journal`, in its directory with symbolic links resolved (as SQLite
    /// resolves them to name its `-wal`).
    fn of(path: &Path) -> Result<Files, NoFiles> {
        let text = path.to_string_lossy();
        if text.is_empty()
            || text == ":memory:"
            || (text.starts_with("file:") && text.contains("mode=memory"))
        {
            return Err(NoFiles::InMemory);
        }
        let file = std::fs::canonicalize(path).map_err(|e| {
            NoFiles::Unresolved(format!("could not resolve {}: {e}", path.display()))
        })?;
        let (Some(dir), Some(name)) = (file.parent(), file.file_name()) else {
            return Err(NoFiles::Unresolved(format!(
                "{} has no directory",
                file.display()
            )));
        };
        let names = ["", "-wal", "-journal"]
            .iter()
            .map(|suffix| {
                let mut name = name.to_owned();
                name.push(suffix);
                name
            })
            .collect();
        Ok(Files {
            dir: dir.to_owned(),
            names,
        })
    }
}

/// Whether `event` may mean a commit: a change (not a mere open or close)
/// of a file named in `names`, lost notifications, or an error (when in
/// doubt, check).
fn concerned(names: &[OsString], event: &notify::Result<notify::Event>) -> bool {
    let Ok(event) = event else {
        return true;
    };
    if event.need_rescan() {
        return true;
    }
    !matches!(event.kind, EventKind::Access(_))
        && event.paths.iter().any(|path| {
            path.file_name()
                .is_some_and(|name| names.iter().any(|ours| ours == name))
        })
}

/// A file notifier on the database's directory; dropping it stops it.
struct Notifier {
    /// Notified (coalesced into one pending wake-up) on each change of the
    /// database's files.
    changed: Arc<Notify>,
    _watcher: notify::RecommendedWatcher,
}

impl Notifier {
    /// The notifier for `shared`'s file, or `None` (polling only) for an
    /// in-memory database or when it could not be created, which is logged
    /// once per handle.
    fn start(shared: &Shared) -> Option<Notifier> {
        if shared.warned.load(Ordering::Relaxed) {
            // It failed before: this handle polls.
            return None;
        }
        let failed = match &shared.files {
            Ok(files) => match Self::watch(files) {
                Ok(notifier) => return Some(notifier),
                Err(e) => e.to_string(),
            },
            Err(NoFiles::InMemory) => return None,
            Err(NoFiles::Unresolved(why)) => why.clone(),
        };
        if !shared.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %failed,
                interval = ?shared.interval,
                "the sqlite follow watcher could not watch the database's files for changes; \
                 it finds other processes' commits by polling only"
            );
        }
        None
    }

    fn watch(files: &Files) -> notify::Result<Notifier> {
        let changed = Arc::new(Notify::new());
        let wake = changed.clone();
        let names = files.names.clone();
        let mut watcher = notify::recommended_watcher(move |event| {
            // Runs on the notifier's own thread; never panics.
            if concerned(&names, &event) {
                wake.notify_one();
            }
        })?;
        watcher.watch(&files.dir, RecursiveMode::NonRecursive)?;
        Ok(Notifier {
            changed,
            _watcher: watcher,
        })
    }
}

/// Why a check runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// The poll interval passed, or a settle check was due.
    Timer,
    /// A file notification.
    Notified,
    /// The handle's writer saw another connection's commit.
    Foreign,
}

/// How many checks that found only this handle's own commits turn the file
/// notifier off, counted since the last check that saw another
/// connection's. Then the notifier would hear only the handle's own
/// commits, whose followers its writer already wakes; off, it costs
/// nothing. Commits from elsewhere are then found by the poll, or at once
/// when this handle's writer commits and sees them, and turn it back on.
/// While nothing commits, the notifier costs nothing and stays on.
const OWN_CHECKS_BEFORE_OFF: u32 = 64;

/// The task: check at each notification and each poll until closed,
/// dropped, or no follower or task watcher is left.
async fn run(shared: Arc<Shared>, mut closed: watch::Receiver<bool>, token: Arc<Running>) {
    // On from the start: a follower usually waits for someone's commit.
    let mut notifier = Notifier::start(&shared);
    shared
        .own
        .notifying
        .store(notifier.is_some(), Ordering::SeqCst);
    // Checks that found only this handle's commits since the last that saw
    // another connection's (see `OWN_CHECKS_BEFORE_OFF`).
    let mut own_checks = 0;
    let mut poll = Poll::default();
    // With a notifier, check at once: a commit made before its watch was in
    // place is found now, and every later one is notified. Polling only,
    // the first check is one interval away, as every later one.
    let mut next = match notifier {
        Some(_) => Instant::now(),
        None => Instant::now() + shared.interval,
    };
    // Where the checks' charges (see `CHECK_DUTY`) have got to.
    let mut charged = Instant::now();
    // How long after the last check a notified one waits (see `QUIET`),
    // and when that check ended.
    let mut quiet = Duration::ZERO;
    let mut ended = Instant::now();
    // The writer's `finished` count read before the last check (see
    // `OwnCommits`); `None` before the first.
    let mut finished_before = None;
    loop {
        if *closed.borrow_and_update() {
            break;
        }
        let cause = tokio::select! {
            changed = closed.changed() => {
                // The handle was dropped (`Err`) or closed: stop now.
                if changed.is_err() || *closed.borrow() {
                    break;
                }
                continue;
            }
            () = tokio::time::sleep_until(next) => Cause::Timer,
            () = notified(
                notifier.as_ref(),
                charged.checked_sub(BURST).map_or(ended + quiet, |due| due.max(ended + quiet)),
            ) => Cause::Notified,
            // With the notifier on, the writer's reports are taken at the
            // next check instead.
            () = shared.own.foreign.notified(), if notifier.is_none() => Cause::Foreign,
        };
        {
            let mut running = shared.running();
            if shared.wakeups.followers() == 0 && shared.task_wakeups.followers() == 0 {
                *running = None;
                break;
            }
        }
        let finished = shared.own.finished.load(Ordering::SeqCst);
        let started = Instant::now();
        let mut checked = poll.check(&shared).await;
        if cause == Cause::Notified {
            // The notified write's commit is usually published a few
            // microseconds after it: look again at once, a few times.
            for _ in 0..QUICK_RETRIES {
                if !matches!(checked, Ok(None)) {
                    break;
                }
                checked = poll.check(&shared).await;
            }
        }
        let moved = matches!(checked, Ok(Some(_)));
        let foreign = shared.own.reported.swap(false, Ordering::SeqCst)
            || cause == Cause::Foreign
            || (moved && finished_before == Some(shared.own.started.load(Ordering::SeqCst)));
        finished_before = Some(finished);
        match checked {
            Ok(None) => poll.failing = false,
            Ok(Some(true)) => {
                poll.failing = false;
                quiet = Duration::ZERO;
            }
            Ok(Some(false)) => {
                // A commit no follower here waits for (an append to a
                // stream nobody here follows, with no task watcher here):
                // notified checks back off, up to the poll interval.
                poll.failing = false;
                quiet = (quiet * 2).clamp(QUIET, shared.interval.max(QUIET));
            }
            Err(e) => {
                // The followers' periodic re-check covers the gap; try a
                // fresh connection at the next poll.
                if !poll.failing {
                    tracing::warn!(error = %e, "sqlite follow watcher poll failed; retrying");
                } else {
                    tracing::debug!(error = %e, "sqlite follow watcher poll failed again");
                }
                poll.failing = true;
                poll.reset().await;
                finished_before = None;
                // Notifications wait for the next poll too.
                ended = Instant::now();
                next = ended + shared.interval;
                charged = next + BURST;
                continue;
            }
        }
        ended = Instant::now();
        charged = charged.max(started) + ((ended - started) * CHECK_DUTY).min(BURST);
        next = if cause == Cause::Notified && matches!(checked, Ok(None)) {
            // The notified commit is still not published: one more check
            // a little later.
            ended + SETTLE
        } else {
            // A commit notified during the check left its wake-up pending.
            ended + shared.interval
        };
        if foreign {
            own_checks = 0;
            if notifier.is_none() {
                notifier = Notifier::start(&shared);
                if notifier.is_some() {
                    shared.own.notifying.store(true, Ordering::SeqCst);
                    // A commit made before the watch was in place.
                    next = ended;
                }
            }
            shared.own.seen.fetch_add(1, Ordering::SeqCst);
        } else if moved && notifier.is_some() {
            own_checks += 1;
            if own_checks >= OWN_CHECKS_BEFORE_OFF {
                // Only this handle's own commits lately: the poll and the
                // writer's reports find the next commit from elsewhere.
                notifier = None;
                shared.own.notifying.store(false, Ordering::Relaxed);
            }
        }
    }
    drop(notifier);
    shared.own.notifying.store(false, Ordering::Relaxed);
    poll.reset().await;
    drop(token);
}

/// Returns when `notifier` reports a change, and not before `earliest`;
/// never without a notifier.
async fn notified(notifier: Option<&Notifier>, earliest: Instant) {
    match notifier {
        Some(notifier) => {
            notifier.changed.notified().await;
            // Only when still due: a timer, even one already past, may
            // wait for the timer driver's next tick (a millisecond).
            if Instant::now() < earliest {
                tokio::time::sleep_until(earliest).await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The watcher's connection and what it saw last.
#[derive(Default)]
struct Poll {
    conn: Option<SqliteConnection>,
    /// `data_version` at the last check that read the streams; `None`
    /// before the first, so the first check reads them.
    version: Option<i64>,
    /// Each followed stream's row as last read: `(incarnation, last_seq)`,
    /// `None` if it had none.
    seen: HashMap<StreamToken, Option<(i64, i64)>>,
    failing: bool,
}

impl Poll {
    /// Reads `data_version`; if another connection committed since the last
    /// check, reads the followed streams' rows and wakes those that moved.
    /// A stream not seen before (a new follower's) is woken too: it may
    /// have moved between its follower's first read and this check.
    /// Returns `None` if `data_version` had not changed (it always has, the
    /// first time), else whether any followed stream or task watcher was
    /// woken.
    async fn check(&mut self, shared: &Shared) -> Result<Option<bool>, sqlx::Error> {
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
            return Ok(None);
        }
        // Task watchers re-read their task and go back to waiting if its
        // `rev` did not move: one keyed read each, only when something
        // was committed elsewhere.
        let mut woke = shared.task_wakeups.followers() > 0;
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
                woke = true;
            }
        }
        self.seen = seen;
        self.version = Some(version);
        Ok(Some(woke))
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
