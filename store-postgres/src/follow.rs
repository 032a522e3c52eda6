//! Following (C13): wake-ups by `LISTEN`/`NOTIFY`, fanned out in process.
//!
//! Once an append has committed, the handle announces its stream with
//! `pg_notify(<channel>, <token in hex>)` ([`Notifier`], statement
//! [`crate::sql::NOTIFY`]); PostgreSQL delivers it to every session
//! listening on the channel, in any process. Task changes are announced
//! the same way, with the payload [`task_payload`]. The notification goes
//! in a short transaction of its own right after the change's, not in the
//! change's: notifying commits are serialized cluster-wide until their WAL
//! is flushed, which would cost concurrent durable appends and task steps
//! their shared flushes (see [`crate::sql::NOTIFY`]). Announcements queued
//! while one is in flight go together in the next, one per stream or task,
//! and only while another handle listens ([`Listeners`]). The channel is derived from the
//! store's schema ([`channel`]), so stores in two schemas never wake each
//! other.
//!
//! A store handle opens **one** listening connection, on its first follow,
//! whatever the number of followers: a task that takes the listener lock
//! ([`Listeners`]), listens, reads notifications and wakes the followers of
//! the named stream in the handle's [`Wakeups`] hub.
//! Appends through the handle itself wake its hub directly once they have
//! committed, without waiting for the round trip through the server.
//!
//! Wake-ups only prompt a re-read by cursor, so nothing depends on a
//! notification arriving. When the listening connection is lost, the
//! notifications sent meanwhile are gone: the task connects again, listens
//! again, and then wakes every follower of the handle to re-read (an append
//! committed before the new `LISTEN` is found by that re-read, one after it
//! is announced). Followers also re-read on their own every
//! [`PostgresOptions::follow_recheck`](crate::PostgresOptions::follow_recheck),
//! the safety net for anything else.
//!
//! The task ends, closing its connection, when the handle (every clone of
//! it, and every follow it opened) is dropped, or when
//! [`PostgresStore::close`](crate::PostgresStore::close) is called.

use std::collections::HashSet;
use std::mem;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::backend::follow::{self, Wakeups};
use mcp_event_store_core::{Error, EventId, FollowOptions, Replay, Result};
use sqlx::SqlStr;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::PostgresStore;
use crate::error::NAME;
use crate::replay::replay_after;

/// Follows the stream of `cursor` (`follow_events_after`): the replay
/// after it, then each new event as wake-ups prompt re-reads.
pub(crate) async fn follow_after(
    store: &PostgresStore,
    raw: &str,
    cursor: EventId,
    options: FollowOptions,
) -> Result<Replay> {
    let follows = store.follows();
    // Listening, and subscribed, before the first read: an append
    // committed after that read is announced, by the listener or by
    // this handle's own append.
    follows.listen().await?;
    let subscription = follows.hub().subscribe(cursor.token);
    let first = replay_after(store, raw, cursor).await?;
    Ok(follow::follow(
        NAME,
        first,
        subscription,
        raw.to_owned(),
        follows.recheck(),
        options,
        follow::reread(store.clone()),
    ))
}

/// How many follows of this handle are open.
pub(crate) fn follows_open(store: &PostgresStore) -> usize {
    store.follows().hub().followers()
}

/// The prefix of every store's notification channel.
const CHANNEL_PREFIX: &str = "mcp_event_store.";

/// The longest channel name PostgreSQL takes (`NAMEDATALEN - 1`).
const MAX_CHANNEL_LEN: usize = 63;

/// The first pause before connecting again after a failed attempt; it
/// doubles with each failure, up to the follow recheck interval.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// The notification channel of the store in `schema`:
/// `mcp_event_store.<schema>`, or, for a schema name longer than 47
/// characters (a channel name has at most 63 bytes),
/// `mcp_event_store.<first 30 characters>.<16 hex digits of the name's
/// 64-bit FNV-1a hash>`. Every release and process derives the same name.
pub(crate) fn channel(schema: &str) -> String {
    let plain = format!("{CHANNEL_PREFIX}{schema}");
    if plain.len() <= MAX_CHANNEL_LEN {
        return plain;
    }
    // Schema names are ASCII (validated), so any byte index is a boundary.
    let head = &schema[..schema.len().min(30)];
    format!("{CHANNEL_PREFIX}{head}.{:016x}", fnv1a64(schema.as_bytes()))
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The first key of the advisory lock every listening connection holds
/// (`"mes!"`); the second is derived from the channel ([`Listeners`]).
const LISTENER_LOCK_CLASS: i32 = 0x6d65_7321;

/// How long a handle trusts what it last read of who listens before it
/// reads again, at most once per this interval while it appends.
const LISTENERS_FRESH: Duration = Duration::from_millis(50);

/// When a listener, once listening, wakes its followers a second time: past
/// [`LISTENERS_FRESH`], with a margin, so any append that another handle
/// left unannounced because it had not yet seen this listener has
/// committed by then and is found by that re-read.
const LISTENERS_REWAKE: Duration = Duration::from_millis(120);

/// Who listens on a store's channel, so that a handle announces its
/// appends only when another handle can hear them.
///
/// PostgreSQL shows no session which channels another session listens on,
/// so each listening connection also holds a shared advisory lock,
/// `pg_try_advisory_lock_shared(LISTENER_LOCK_CLASS, <the channel's
/// key>)`, taken before its `LISTEN` and released with its session, which
/// `pg_locks` shows to every session of the database. A handle's notifier
/// reads `pg_locks` at most every [`LISTENERS_FRESH`] while it has
/// appends to announce, and sends its `NOTIFY` only when a connection
/// other than its own listener holds that lock (its own followers are
/// woken in process). A handle whose appends nobody else follows thus
/// sends no `NOTIFY` at all, and a lone writer no longer pays one
/// transaction per append beside its own.
///
/// A listener that starts while another handle's reading says nobody
/// listens can miss that handle's appends for up to [`LISTENERS_FRESH`]:
/// it wakes its followers again [`LISTENERS_REWAKE`] after it took the
/// lock, and that re-read finds them. Anything else holding the lock (a
/// session that took it by accident, a listener whose session outlives
/// it) only makes handles announce when they need not.
#[derive(Clone)]
pub(crate) struct Listeners {
    /// The store's channel ([`channel`]).
    channel: Arc<str>,
    /// The second key of the lock: 31 bits of the channel's FNV-1a hash.
    key: i32,
    /// The server process id of this handle's own listening connection,
    /// 0 while it has none (every holder then counts).
    own: Arc<AtomicI32>,
}

/// Takes the listener's lock on its connection and names the connection's
/// server process. $1, $2 the lock's keys.
const REGISTER_LISTENER: &str =
    "SELECT pg_backend_pid(), pg_try_advisory_lock_shared($1::int4, $2::int4)";

/// Whether a session other than $3 holds (or waits for) the listener lock
/// of keys $1, $2 in this database.
const OTHERS_LISTEN: &str = r#"
SELECT EXISTS (
  SELECT 1 FROM pg_catalog.pg_locks
   WHERE locktype = 'advisory' AND objsubid = 2
     AND database = (SELECT oid FROM pg_catalog.pg_database
                      WHERE datname = current_database())
     AND classid = $1::int4::oid AND objid = $2::int4::oid
     AND pid <> $3::int4)
"#;

impl Listeners {
    /// Who listens on `channel`.
    pub(crate) fn new(channel: String) -> Self {
        Self {
            key: (fnv1a64(channel.as_bytes()) & 0x7fff_ffff) as i32,
            channel: channel.into(),
            own: Arc::default(),
        }
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Whether a connection other than this handle's listener listens,
    /// read again when `known` is older than [`LISTENERS_FRESH`]. When it
    /// cannot tell, it says yes: an unneeded `NOTIFY` costs little, a
    /// missing one a follower's recheck.
    async fn others_listen(&self, pool: &PgPool, known: &mut Option<(Instant, bool)>) -> bool {
        if let Some((at, others)) = *known
            && at.elapsed() < LISTENERS_FRESH
        {
            return others;
        }
        // Taken before the read: the answer holds for appends committed
        // up to LISTENERS_FRESH after this instant (see LISTENERS_REWAKE).
        let at = Instant::now();
        let read = sqlx::query_scalar(OTHERS_LISTEN)
            .bind(LISTENER_LOCK_CLASS)
            .bind(self.key)
            .bind(self.own.load(Ordering::Acquire))
            .fetch_one(pool)
            .await;
        match read {
            Ok(others) => {
                *known = Some((at, others));
                others
            }
            Err(error) => {
                if !pool.is_closed() {
                    tracing::debug!(%error, "could not read who listens; announcing anyway");
                }
                *known = None;
                true
            }
        }
    }

    /// On a new listening connection, before its `LISTEN`: takes the lock
    /// and records the connection as this handle's own.
    async fn register(&self, listener: &mut PgListener) -> sqlx::Result<()> {
        let (pid, locked): (i32, bool) = sqlx::query_as(REGISTER_LISTENER)
            .bind(LISTENER_LOCK_CLASS)
            .bind(self.key)
            .fetch_one(&mut *listener)
            .await?;
        if !locked {
            // Only an exclusive holder refuses a shared lock; while it
            // holds it, every handle announces (it is another holder).
            tracing::warn!(
                class = LISTENER_LOCK_CLASS,
                key = self.key,
                "another session holds this store's listener lock exclusively; \
                 appends from other handles may reach this one only at its recheck \
                 once that session lets it go"
            );
        }
        self.own.store(pid, Ordering::Release);
        Ok(())
    }

    /// This handle no longer listens.
    fn forget(&self) {
        self.own.store(0, Ordering::Release);
    }
}

/// The stream a notification names: its payload is the token in hex, as
/// `encode(token, 'hex')` writes it. Anything else (a notification some
/// other client sent on the channel) is ignored.
fn token_of(payload: &str) -> Option<StreamToken> {
    let pairs = payload.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let bytes: Option<Vec<u8>> = pairs
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect();
    StreamToken::from_bytes(&bytes?)
}

/// What starts the payload of a task notification; an append's payload is
/// hex only, so releases from before tasks ignore these (`token_of` refuses
/// them).
const TASK_PAYLOAD_PREFIX: &str = "t";

/// The payload announcing a change to the task whose watchers wait under
/// `token` (a prefix of its digest): `t` and the token in hex; `t*` wakes
/// every task watcher.
pub(crate) fn task_payload(token: Option<&StreamToken>) -> String {
    match token {
        Some(token) => format!("{TASK_PAYLOAD_PREFIX}{}", payload(token)),
        None => format!("{TASK_PAYLOAD_PREFIX}*"),
    }
}

/// The token as notification payload: lowercase hex, as
/// `encode(token, 'hex')` writes it.
fn payload(token: &StreamToken) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    token
        .as_bytes()
        .iter()
        .flat_map(|b| {
            [
                HEX[usize::from(b >> 4)] as char,
                HEX[usize::from(b & 15)] as char,
            ]
        })
        .collect()
}

/// What a [`Notifier`] announces: a stream appended to, or a task
/// changed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Note {
    /// An append to the stream of this token (payload: the token in hex).
    Stream(StreamToken),
    /// A change to the task whose watchers wait under this token (payload
    /// [`task_payload`]).
    Task(StreamToken),
    /// A change to any task (a purge): every task watcher re-reads.
    AllTasks,
}

impl Note {
    fn payload(&self) -> String {
        match self {
            Self::Stream(token) => payload(token),
            Self::Task(token) => task_payload(Some(token)),
            Self::AllTasks => task_payload(None),
        }
    }
}

/// Announces committed appends and task changes to the store's channel,
/// from a task of its own, so that no append or task step waits for it.
#[derive(Clone)]
pub(crate) struct Notifier {
    /// What changed since the last announcement, once each.
    pending: Arc<Mutex<HashSet<Note>>>,
    /// Rung after adding to `pending`; one ring is enough however many
    /// appends come meanwhile. Dropping every clone (the handle's and its
    /// batcher's) ends the task.
    doorbell: mpsc::Sender<()>,
}

impl Notifier {
    /// Starts the task on the current tokio runtime. It sends `statement`
    /// only while another handle listens ([`Listeners`]).
    pub(crate) fn start(pool: PgPool, statement: SqlStr, listeners: Listeners) -> Self {
        let pending = Arc::new(Mutex::new(HashSet::new()));
        let (doorbell, rings) = mpsc::channel(1);
        tokio::spawn(announce(pool, statement, listeners, pending.clone(), rings));
        Self { pending, doorbell }
    }

    /// Announces appends to the streams of `tokens`; call it once they
    /// have committed. A batch announces all its streams at once (see
    /// [`crate::append`]), so its commit costs one ring and, as a rule,
    /// one `NOTIFY`.
    pub(crate) fn announce(&self, tokens: impl IntoIterator<Item = StreamToken>) {
        self.note(tokens.into_iter().map(Note::Stream));
    }

    /// Announces changes to the tasks whose watchers wait under `tokens`
    /// (a prefix of each task's digest, [`task_token`](mcp_event_store_core::backend::follow::task_token));
    /// call it once they have committed.
    pub(crate) fn announce_tasks(&self, tokens: impl IntoIterator<Item = StreamToken>) {
        self.note(tokens.into_iter().map(Note::Task));
    }

    /// Announces a change to any task (a purge): every watcher re-reads.
    /// Call it once the change has committed.
    pub(crate) fn announce_all_tasks(&self) {
        self.note([Note::AllTasks]);
    }

    fn note(&self, notes: impl IntoIterator<Item = Note>) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(notes);
        // Full: a ring is pending, and the task will take these too.
        let _ = self.doorbell.try_send(());
    }
}

async fn announce(
    pool: PgPool,
    statement: SqlStr,
    listeners: Listeners,
    pending: Arc<Mutex<HashSet<Note>>>,
    mut rings: mpsc::Receiver<()>,
) {
    let mut known = None;
    while rings.recv().await.is_some() {
        let payloads: Vec<String> = {
            let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending.drain().map(|note| note.payload()).collect()
        };
        // Everything here was committed before this check begins.
        if payloads.is_empty() || !listeners.others_listen(&pool, &mut known).await {
            continue;
        }
        let sent = sqlx::query(statement.clone())
            .bind(&payloads)
            .execute(&pool)
            .await;
        // A lost announcement only delays followers and task watchers
        // elsewhere until their recheck; the change itself is committed
        // and acknowledged.
        if let Err(error) = sent
            && !pool.is_closed()
        {
            tracing::warn!(%error, changes = payloads.len(),
                "could not announce appends or task changes to other handles; \
                 their followers and watchers find them on their next recheck");
        }
    }
}

/// One store handle's following: its wake-up hub and its listener.
pub(crate) struct Follows {
    hub: Arc<Wakeups>,
    /// This handle's task watchers, by a prefix of the task's digest: woken
    /// by notifications whose payload is `t` and that prefix in hex (see
    /// [`task_payload`]), and by this handle's own task mutations.
    tasks: Arc<Wakeups>,
    /// The channel, the lock this handle's listener holds, and its
    /// connection's pid.
    listeners: Listeners,
    /// How the listener connects: the pool's own connect options.
    connect: PgConnectOptions,
    acquire_timeout: Duration,
    recheck: Duration,
    listener: Mutex<Listening>,
}

enum Listening {
    /// No follow yet: no connection, no task.
    NotStarted,
    Running(Listener),
    /// The store was closed; follows are refused.
    Closed,
}

/// The listener task of a handle. Dropping it (with the handle) ends the
/// task, which then closes its connection.
struct Listener {
    /// Dropped or sent: the task ends.
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// Turns `true` once the first attempt to listen has finished, however
    /// it went.
    settled: watch::Receiver<bool>,
}

impl Follows {
    pub(crate) fn new(
        listeners: Listeners,
        connect: PgConnectOptions,
        acquire_timeout: Duration,
        recheck: Duration,
    ) -> Self {
        Self {
            hub: Arc::new(Wakeups::default()),
            tasks: Arc::new(Wakeups::default()),
            listeners,
            connect,
            acquire_timeout,
            recheck,
            listener: Mutex::new(Listening::NotStarted),
        }
    }

    pub(crate) fn hub(&self) -> &Arc<Wakeups> {
        &self.hub
    }

    /// The wake-up hub of this handle's task watchers.
    pub(crate) fn tasks(&self) -> &Arc<Wakeups> {
        &self.tasks
    }

    pub(crate) fn channel(&self) -> &str {
        self.listeners.channel()
    }

    pub(crate) fn recheck(&self) -> Duration {
        self.recheck
    }

    fn listening(&self) -> MutexGuard<'_, Listening> {
        // Every critical section is one assignment or clone.
        self.listener.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the listener if it is not running, and waits until its first
    /// attempt to `LISTEN` has finished: a follow then reads the stream
    /// only once appends from elsewhere are announced to it. If that
    /// attempt failed, the follow goes on (on rechecks, and on the wake-up
    /// the task gives every follower once it does listen).
    pub(crate) async fn listen(&self) -> Result<()> {
        let mut settled = match &mut *self.listening() {
            Listening::Closed => return Err(Error::Closed),
            Listening::Running(listener) => listener.settled.clone(),
            state @ Listening::NotStarted => {
                let listener = self.start();
                let settled = listener.settled.clone();
                *state = Listening::Running(listener);
                settled
            }
        };
        // An error means the task is gone, which only close does; the
        // replay that follows reports the closed pool.
        let _ = settled.wait_for(|settled| *settled).await;
        Ok(())
    }

    fn start(&self) -> Listener {
        // A pool of one: PgListener reconnects through it. It is not the
        // store's pool, so the listener never takes a connection appends
        // and replays need, and never counts against `max_connections`.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.acquire_timeout)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_lazy_with(self.connect.clone());
        let (stop, stopped) = oneshot::channel();
        let (settle, settled) = watch::channel(false);
        let task = tokio::spawn(run(
            pool,
            self.listeners.clone(),
            self.hub.clone(),
            self.tasks.clone(),
            self.recheck,
            settle,
            stopped,
        ));
        Listener {
            stop: Some(stop),
            task,
            settled,
        }
    }

    /// Stops the listener, if any, and waits until its connection is
    /// closed; later follows are refused with [`Error::Closed`].
    pub(crate) async fn close(&self) {
        let state = mem::replace(&mut *self.listening(), Listening::Closed);
        if let Listening::Running(mut listener) = state {
            drop(listener.stop.take());
            // The task never panics; a JoinError could only say it was
            // cancelled with its runtime, and then its connection is gone.
            let _ = (&mut listener.task).await;
        }
    }
}

/// What woke the listener task.
enum Event {
    Stop,
    Rewake,
    Received(sqlx::Result<Option<sqlx::postgres::PgNotification>>),
}

/// The listener task: connect, take the listener lock, `LISTEN`, wake
/// followers per notification; after a lost connection, do it all again
/// and wake every follower. Each time it listens anew it wakes every
/// follower twice: at once, and [`LISTENERS_REWAKE`] later.
async fn run(
    pool: PgPool,
    listeners: Listeners,
    hub: Arc<Wakeups>,
    tasks: Arc<Wakeups>,
    max_backoff: Duration,
    settle: watch::Sender<bool>,
    mut stop: oneshot::Receiver<()>,
) {
    let channel = listeners.channel();
    let mut listener: Option<PgListener> = None;
    let mut rewake: Option<Instant> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Some(active) = listener.as_mut() else {
            let connect = async {
                let mut listener = PgListener::connect_with(&pool).await?;
                listeners.register(&mut listener).await?;
                listener.listen(channel).await?;
                Ok::<_, sqlx::Error>(listener)
            };
            let outcome = tokio::select! {
                _ = &mut stop => break,
                outcome = connect => outcome,
            };
            settle.send_replace(true);
            match outcome {
                Ok(connected) => {
                    listener = Some(connected);
                    backoff = FIRST_BACKOFF;
                    // Whatever was committed while nobody listened is
                    // found by this re-read; later appends are announced,
                    // or found by the second one.
                    hub.wake_all();
                    tasks.wake_all();
                    rewake = Some(Instant::now() + LISTENERS_REWAKE);
                }
                Err(error) => {
                    listeners.forget();
                    tracing::warn!(%error, channel, retry_in = ?backoff,
                        "cannot listen for appends from other handles; followers \
                         re-read on their recheck interval until it can");
                    tokio::select! {
                        _ = &mut stop => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(max_backoff.max(FIRST_BACKOFF));
                }
            }
            continue;
        };
        let event = tokio::select! {
            _ = &mut stop => Event::Stop,
            () = sleep_until(rewake), if rewake.is_some() => Event::Rewake,
            received = active.try_recv() => Event::Received(received),
        };
        match event {
            Event::Stop => break,
            Event::Rewake => {
                rewake = None;
                hub.wake_all();
                tasks.wake_all();
            }
            Event::Received(Ok(Some(notification))) => {
                let payload = notification.payload();
                if let Some(task) = payload.strip_prefix(TASK_PAYLOAD_PREFIX) {
                    match token_of(task) {
                        Some(token) => tasks.wake(&token),
                        // `t*`: a purge; every watcher re-reads.
                        None if task == "*" => tasks.wake_all(),
                        None => {}
                    }
                } else if let Some(token) = token_of(payload) {
                    hub.wake(&token);
                }
            }
            // The connection was lost and PgListener has connected and
            // listened again, on a session without the listener lock:
            // start afresh (lock, then `LISTEN`), which wakes every
            // follower, as notifications in between are gone.
            Event::Received(Ok(None)) => {
                tracing::info!(
                    channel,
                    "the listening connection was lost and is back; followers re-read"
                );
                listeners.forget();
                listener = None;
            }
            // Connecting again failed (or the connection broke in another
            // way): start afresh, after a pause.
            Event::Received(Err(error)) => {
                tracing::warn!(%error, channel, "the listening connection failed; reconnecting");
                listeners.forget();
                listener = None;
                tokio::select! {
                    _ = &mut stop => break,
                    () = tokio::time::sleep(FIRST_BACKOFF) => {}
                }
            }
        }
    }
    listeners.forget();
    // PgListener's drop unlistens and returns the connection to the pool,
    // which then closes it, and with it the session's listener lock.
    drop(listener);
    pool.close().await;
}

/// Sleeps until `deadline`; never, without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_fit_and_differ() {
        assert_eq!(
            channel("mcp_event_store"),
            "mcp_event_store.mcp_event_store"
        );
        let long_a = format!("{}a", "x".repeat(62));
        let long_b = format!("{}b", "x".repeat(62));
        for schema in ["a", &"y".repeat(47), &"y".repeat(48), &long_a, &long_b] {
            let name = channel(schema);
            assert!(name.len() <= MAX_CHANNEL_LEN, "{name}");
            assert!(name.starts_with(CHANNEL_PREFIX));
        }
        assert_eq!(channel(&"y".repeat(47)).len(), 63);
        assert_ne!(channel(&long_a), channel(&long_b));
        assert_eq!(channel(&long_a), channel(&long_a.clone()));
    }

    #[test]
    fn payloads_name_tokens() {
        let token = StreamToken::from_bytes(&[0xab; 15]).unwrap();
        assert_eq!(token_of(&"ab".repeat(15)), Some(token));
        let mixed =
            StreamToken::from_bytes(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x7f, 0xff])
                .unwrap();
        assert_eq!(payload(&mixed), "000102030405060708090a0b0c7fff");
        assert_eq!(token_of(&payload(&mixed)), Some(mixed));
        for bad in [
            "",
            "ab",
            "AB".repeat(15).as_str(),
            "zz".repeat(15).as_str(),
            "abc",
            format!("{}a", "ab".repeat(15)).as_str(),
        ] {
            assert_eq!(token_of(bad), None, "{bad}");
        }
    }
}
