//! Following (C13): the per-handle wake-up hub and the one watcher task
//! that turns other handles' appends into wake-ups.
//!
//! * Appends through this handle wake the hub as soon as the append script
//!   returned (see `RedisStore::store_event`).
//! * Standalone: one task per handle, while anyone follows, holds one
//!   dedicated connection and loops on `XREAD COUNT 1 BLOCK <1 s> STREAMS
//!   <every followed stream's key> <newest id seen of each>`. Keys that got
//!   entries wake their followers. A follow on a stream the pending `XREAD`
//!   does not cover interrupts it with `CLIENT UNBLOCK <watcher id>` from the
//!   handle's main connection, so the new key is covered at once (at worst
//!   after the one-second block, when the unblock raced the `XREAD` in
//!   flight).
//! * Cluster: `XREAD` of keys in different slots is `CROSSSLOT`, and one
//!   blocking `XREAD` per slot would take a connection per stream, so the
//!   task polls instead: every `cluster_follow_poll` it reads `HGET meta
//!   last` of every followed stream (non-blocking, on the handle's cluster
//!   connection) and wakes the streams whose newest id moved.
//!
//! A stream's newest id is read when it is first covered, and that stream's
//! followers are woken once then: an append between a follower's first read
//! and that baseline is not missed. The task ends when nobody follows any
//! more (after its current block or poll) and is aborted when the handle is
//! closed or dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use mcp_event_store_core::backend::follow::{Wakeups, follow, reread};
use mcp_event_store_core::backend::{EventBackend, StreamToken};
use mcp_event_store_core::{EventId, FollowOptions, Position, Replay, Result};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::task::AbortHandle;

use crate::RedisStore;
use crate::conn::Conn;
use crate::error::NAME;
use crate::keys::Keys;
use crate::wire::{entry_id, parse_entry_id};

/// How long one `XREAD` blocks at most. Bounds how long a watcher stays
/// after its last follower went, and how late a stream is covered when its
/// `CLIENT UNBLOCK` raced the `XREAD` in flight.
pub(crate) const WATCH_BLOCK: Duration = Duration::from_secs(1);
/// The name the watcher's connection carries in `CLIENT LIST`.
pub const WATCHER_CLIENT_NAME: &str = "mcp-event-store-follow";
/// First and longest wait before the watcher connects again after losing
/// its connection.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// `HGET`s in flight at once during a cluster poll.
const POLL_CONCURRENCY: usize = 64;
/// `CLIENT UNBLOCK` attempts when it races the watcher's `XREAD`.
const UNBLOCK_ATTEMPTS: usize = 5;

/// Where the watcher reads from.
pub(crate) enum Source {
    /// A standalone server: the watcher opens its own connection with this
    /// client, and the handle's main connection sends `CLIENT UNBLOCK`.
    Standalone {
        client: redis::Client,
        main: Conn,
        connect_timeout: Duration,
        response_timeout: Duration,
    },
    /// A cluster: the watcher polls through the handle's cluster connection.
    Cluster { conn: Conn, poll: Duration },
}

/// One handle's following machinery.
pub(crate) struct Follow {
    shared: Arc<Shared>,
}

struct Shared {
    hub: Arc<Wakeups>,
    keys: Keys,
    source: Source,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// A watcher task is alive (it clears this itself when it ends).
    task: Option<AbortHandle>,
    /// Bumped whenever a follow starts on a stream the watcher does not
    /// cover yet.
    generation: u64,
    /// The streams the watcher's current `XREAD` (or poll) covers.
    covered: HashSet<StreamToken>,
    /// The watcher connection's `CLIENT ID`, while it is connected.
    client_id: Option<i64>,
    /// While an `XREAD` is in flight: the generation its keys were taken at.
    blocking: Option<u64>,
    /// The handle was closed: no watcher starts again.
    closed: bool,
}

impl Follow {
    pub(crate) fn new(keys: Keys, source: Source) -> Self {
        Self {
            shared: Arc::new(Shared {
                hub: Arc::new(Wakeups::default()),
                keys,
                source,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The wake-up hub of this handle.
    pub(crate) fn hub(&self) -> &Arc<Wakeups> {
        &self.shared.hub
    }

    /// Makes sure the watcher covers `token` (already subscribed in the
    /// hub): starts the watcher if none runs, or interrupts its `XREAD` so
    /// the next one includes the stream.
    pub(crate) async fn watch(&self, token: StreamToken) {
        let (client_id, generation) = {
            let mut state = self.shared.state();
            if state.closed {
                return;
            }
            if state.task.is_none() {
                let shared = self.shared.clone();
                let task = tokio::spawn(async move { shared.run().await });
                state.task = Some(task.abort_handle());
                return;
            }
            if state.covered.contains(&token) {
                return;
            }
            state.generation += 1;
            (state.client_id, state.generation)
        };
        let Source::Standalone { main, .. } = &self.shared.source else {
            // The next poll covers it.
            return;
        };
        // Not connected: the watcher reads the followed streams when it is.
        let Some(client_id) = client_id else { return };
        for _ in 0..UNBLOCK_ATTEMPTS {
            let unblocked: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(client_id)
                .query_async(&mut main.clone())
                .await;
            match unblocked {
                Ok(1) => return,
                Ok(_) => {}
                Err(e) => {
                    // The bounded block covers the stream soon anyway.
                    tracing::debug!(error = %e, "CLIENT UNBLOCK of the follow watcher failed");
                    return;
                }
            }
            // Not blocked: either between two reads (the next one covers
            // the stream), or its XREAD was in flight, built before this
            // follow: then it is about to block without the stream.
            let racing = {
                let state = self.shared.state();
                state.client_id == Some(client_id)
                    && state.blocking.is_some_and(|taken| taken < generation)
            };
            if !racing {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

impl Follow {
    /// Stops the watcher (its connection closes with it) for good, and wakes
    /// every follower, so each reads again and meets the closed handle.
    pub(crate) fn close(&self) {
        let task = {
            let mut state = self.shared.state();
            state.closed = true;
            state.client_id = None;
            state.blocking = None;
            state.covered.clear();
            state.task.take()
        };
        if let Some(task) = task {
            task.abort();
        }
        self.shared.hub.wake_all();
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        if let Some(task) = self.shared.state().task.take() {
            task.abort();
        }
    }
}

/// Opens a follow (C13): the replay after `cursor`, then every event
/// appended to its stream, woken by this handle's hub.
pub(crate) async fn follow_after(
    store: &RedisStore,
    raw: &str,
    cursor: EventId,
    options: FollowOptions,
) -> Result<Replay> {
    // Subscribe before the first read, so no wake-up falls in between;
    // then make sure the watcher covers the stream.
    let subscription = store.inner.follow.hub().subscribe(cursor.token);
    store.inner.follow.watch(cursor.token).await;
    // The job's own replay (through the trait: setup.rs builds this file's
    // watcher, so this file imports no job file that imports setup.rs).
    let first = store.replay_after(raw, cursor).await?;
    Ok(follow(
        NAME,
        first,
        subscription,
        raw.to_owned(),
        store.inner.options.follow_recheck,
        options,
        reread(store.clone()),
    ))
}

/// How many follows of this handle are open.
pub(crate) fn follows_open(store: &RedisStore) -> usize {
    store.inner.follow.hub().followers()
}

/// A stream being watched: its token and events key.
struct Watched {
    token: StreamToken,
    events: String,
    meta: String,
    /// The newest entry id seen.
    seen: Position,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The streams followed now, and the generation they were taken at; or
    /// `None` when nobody follows, after which the task ends (decided under
    /// the lock `watch` takes, so a follow starting now starts a new task).
    fn snapshot(&self) -> Option<(u64, Vec<StreamToken>)> {
        let mut state = self.state();
        let followed = self.hub.followed();
        if followed.is_empty() {
            state.task = None;
            state.client_id = None;
            state.blocking = None;
            state.covered.clear();
            return None;
        }
        state.covered = followed.iter().copied().collect();
        Some((state.generation, followed))
    }

    async fn run(self: Arc<Self>) {
        match &self.source {
            Source::Standalone {
                client,
                connect_timeout,
                response_timeout,
                ..
            } => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(*connect_timeout))
                    .set_response_timeout(Some(WATCH_BLOCK + *response_timeout));
                self.run_standalone(client, &config).await;
            }
            Source::Cluster { conn, poll } => self.run_cluster(conn, *poll).await,
        }
    }

    /// Updates `watched` to the followed streams; returns the new ones.
    fn track(
        &self,
        watched: &mut HashMap<StreamToken, Watched>,
        followed: &[StreamToken],
    ) -> Vec<StreamToken> {
        let now: HashSet<&StreamToken> = followed.iter().collect();
        watched.retain(|token, _| now.contains(token));
        let mut fresh = Vec::new();
        for token in followed {
            watched.entry(*token).or_insert_with(|| {
                fresh.push(*token);
                let keys = self.keys.stream(token);
                Watched {
                    token: *token,
                    events: keys.events,
                    meta: keys.meta,
                    seen: Position::ZERO,
                }
            });
        }
        fresh
    }

    async fn run_standalone(&self, client: &redis::Client, config: &AsyncConnectionConfig) {
        let mut watched: HashMap<StreamToken, Watched> = HashMap::new();
        let mut conn: Option<MultiplexedConnection> = None;
        let mut backoff = RECONNECT_MIN;
        let mut fresh: Vec<StreamToken> = Vec::new();
        loop {
            let Some((generation, followed)) = self.snapshot() else {
                return;
            };
            fresh.extend(self.track(&mut watched, &followed));
            fresh.retain(|token| watched.contains_key(token));
            let mut c = match conn.take() {
                Some(c) => c,
                None => match connect(client, config).await {
                    Ok((c, id)) => {
                        self.state().client_id = Some(id);
                        backoff = RECONNECT_MIN;
                        c
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the follow watcher cannot connect; retrying (followers still re-read periodically)");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(RECONNECT_MAX);
                        continue;
                    }
                },
            };
            let outcome = async {
                if !fresh.is_empty() {
                    // Baselines: each new stream's newest id, then one wake-up
                    // for what was appended before it.
                    let tokens: Vec<StreamToken> = fresh.clone();
                    let newest = newest_ids(&mut c, &tokens, &watched).await?;
                    for (token, newest) in tokens.iter().zip(newest) {
                        if let Some(w) = watched.get_mut(token) {
                            w.seen = newest.unwrap_or(Position::ZERO);
                        }
                        self.hub.wake(token);
                    }
                    fresh.clear();
                }
                self.state().blocking = Some(generation);
                let read = xread(&mut c, &watched).await;
                self.state().blocking = None;
                let moved = read?;
                if moved.is_empty() {
                    return Ok(());
                }
                // Jump to each stream's newest id (one entry was read of
                // each), so a busy stream is not read entry by entry.
                for (token, id) in &moved {
                    if let Some(w) = watched.get_mut(token) {
                        w.seen = w.seen.max(*id);
                    }
                }
                let tokens: Vec<StreamToken> = moved.iter().map(|(t, _)| *t).collect();
                let newest = newest_ids(&mut c, &tokens, &watched).await?;
                for (token, newest) in tokens.iter().zip(newest) {
                    if let (Some(w), Some(newest)) = (watched.get_mut(token), newest) {
                        w.seen = w.seen.max(newest);
                    }
                    self.hub.wake(token);
                }
                Ok::<(), redis::RedisError>(())
            }
            .await;
            match outcome {
                Ok(()) => conn = Some(c),
                Err(e) => {
                    // The connection is dropped and made again; the ids seen
                    // are kept, so the next XREAD returns what came meanwhile.
                    self.state().client_id = None;
                    tracing::debug!(error = %e, "the follow watcher lost its connection; reconnecting");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        }
    }

    async fn run_cluster(&self, conn: &Conn, poll: Duration) {
        let mut watched: HashMap<StreamToken, Watched> = HashMap::new();
        loop {
            let Some((_, followed)) = self.snapshot() else {
                return;
            };
            let fresh: HashSet<StreamToken> =
                self.track(&mut watched, &followed).into_iter().collect();
            let targets: Vec<(StreamToken, String)> = watched
                .values()
                .map(|w| (w.token, w.meta.clone()))
                .collect();
            let reads = futures_util::stream::iter(targets.into_iter().map(|(token, meta)| {
                let mut conn = conn.clone();
                async move {
                    let last: redis::RedisResult<Option<String>> = redis::cmd("HGET")
                        .arg(meta)
                        .arg("last")
                        .query_async(&mut conn)
                        .await;
                    (token, last)
                }
            }))
            .buffer_unordered(POLL_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
            for (token, last) in reads {
                let Some(w) = watched.get_mut(&token) else {
                    continue;
                };
                match last {
                    Ok(last) => {
                        let newest = last
                            .and_then(|l| parse_entry_id(l.as_bytes()).ok())
                            .unwrap_or(Position::ZERO);
                        // A new stream: its baseline, and one wake-up for
                        // what came before it.
                        if fresh.contains(&token) || newest > w.seen {
                            w.seen = newest;
                            self.hub.wake(&token);
                        }
                    }
                    Err(e) => {
                        // Read again at the next poll; the followers'
                        // periodic re-read is the safety net meanwhile.
                        tracing::debug!(error = %e, "the follow poll failed for one stream");
                        if fresh.contains(&token) {
                            self.hub.wake(&token);
                        }
                    }
                }
            }
            tokio::time::sleep(poll).await;
        }
    }
}

/// Opens the watcher's own connection, names it, and learns its id.
async fn connect(
    client: &redis::Client,
    config: &AsyncConnectionConfig,
) -> redis::RedisResult<(MultiplexedConnection, i64)> {
    let mut conn = client
        .get_multiplexed_async_connection_with_config(config)
        .await?;
    let mut pipe = redis::pipe();
    pipe.cmd("CLIENT")
        .arg("SETNAME")
        .arg(WATCHER_CLIENT_NAME)
        .ignore()
        .cmd("CLIENT")
        .arg("ID");
    let (id,): (i64,) = pipe.query_async(&mut conn).await?;
    Ok((conn, id))
}

/// `HGET meta last` of each stream, in one round trip.
async fn newest_ids(
    conn: &mut MultiplexedConnection,
    tokens: &[StreamToken],
    watched: &HashMap<StreamToken, Watched>,
) -> redis::RedisResult<Vec<Option<Position>>> {
    let mut pipe = redis::pipe();
    for token in tokens {
        match watched.get(token) {
            Some(w) => pipe.cmd("HGET").arg(&w.meta).arg("last"),
            None => pipe.cmd("ECHO").arg(""),
        };
    }
    let values: Vec<Option<Vec<u8>>> = pipe.query_async(conn).await?;
    Ok(values
        .into_iter()
        .map(|v| v.and_then(|id| parse_entry_id(&id).ok()))
        .collect())
}

/// One `XREAD COUNT 1 BLOCK` over every watched stream: the streams that
/// got entries, each with the id of the entry read.
async fn xread(
    conn: &mut MultiplexedConnection,
    watched: &HashMap<StreamToken, Watched>,
) -> redis::RedisResult<Vec<(StreamToken, Position)>> {
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(WATCH_BLOCK.as_millis() as u64)
        .arg("STREAMS");
    let streams: Vec<&Watched> = watched.values().collect();
    let by_key: HashMap<&[u8], StreamToken> = streams
        .iter()
        .map(|w| (w.events.as_bytes(), w.token))
        .collect();
    for w in &streams {
        cmd.arg(&w.events);
    }
    for w in &streams {
        cmd.arg(entry_id(w.seen));
    }
    let reply: Value = cmd.query_async(conn).await?;
    Ok(parse_xread(reply, &by_key))
}

/// The streams in an `XREAD` reply (RESP2 array or RESP3 map), each with the
/// id of its newest entry in the reply.
fn parse_xread(reply: Value, by_key: &HashMap<&[u8], StreamToken>) -> Vec<(StreamToken, Position)> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|stream| match stream {
                Value::Array(parts) => {
                    let mut parts = parts.into_iter();
                    Some((parts.next()?, parts.next()?))
                }
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs,
        _ => Vec::new(),
    };
    let mut moved = Vec::new();
    for (key, entries) in pairs {
        let key = match key {
            Value::BulkString(key) => key,
            Value::SimpleString(key) => key.into_bytes(),
            _ => continue,
        };
        let Some(token) = by_key.get(key.as_slice()) else {
            continue;
        };
        let Value::Array(entries) = entries else {
            continue;
        };
        let newest = entries
            .into_iter()
            .filter_map(|entry| match entry {
                Value::Array(parts) => match parts.into_iter().next() {
                    Some(Value::BulkString(id)) => parse_entry_id(&id).ok(),
                    Some(Value::SimpleString(id)) => parse_entry_id(id.as_bytes()).ok(),
                    _ => None,
                },
                _ => None,
            })
            .max();
        // A reply naming the stream means it moved, even if its entry id
        // could not be read: wake it all the same.
        moved.push((*token, newest.unwrap_or(Position::ZERO)));
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_event_store_core::backend::StreamKey;

    #[test]
    fn xread_replies_in_both_protocols() {
        let token = StreamKey::generate().unwrap().token("s");
        let key = b"p:v1:{t}:events".to_vec();
        let by_key: HashMap<&[u8], StreamToken> = [(key.as_slice(), token)].into();
        let entry = |id: &str| {
            Value::Array(vec![
                Value::BulkString(id.as_bytes().to_vec()),
                Value::Array(vec![]),
            ])
        };
        let entries = Value::Array(vec![entry("5-1"), entry("7-0")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(key.clone()),
            entries.clone(),
        ])]);
        let want = vec![(token, Position::new(7, 0))];
        assert_eq!(parse_xread(resp2, &by_key), want);
        let resp3 = Value::Map(vec![(Value::BulkString(key.clone()), entries)]);
        assert_eq!(parse_xread(resp3, &by_key), want);
        assert!(parse_xread(Value::Nil, &by_key).is_empty());
        let other = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"other".to_vec()),
            Value::Array(vec![entry("1-0")]),
        ])]);
        assert!(parse_xread(other, &by_key).is_empty());
    }
}
