//! Redis Streams backend for **mcp-event-store**: a shared, bounded event
//! store for resumable MCP Streamable HTTP streams, on a standalone Redis or
//! a Redis Cluster (Redis 6.2 or newer).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_redis::RedisStore;
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let id = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
//! let replay = store.replay_events_after(&id.to_string()).await?;
//! # drop(replay);
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! * **One Redis Stream per event stream**, appended with `XADD *`: the
//!   server assigns the entry id `<ms>-<seq>`, which becomes the event id's
//!   position (major = ms, minor = seq). The id's stream token names the
//!   stream's keys directly (see the [key layout](#key-layout)), so resuming
//!   needs no index lookup.
//! * **`store_event` is one round trip**: one Lua script (`EVALSHA`, loaded
//!   again by itself after a server restart) checks the stream id against the
//!   token, appends, updates the metadata hash, trims by count and bytes, and
//!   sets the stream's TTL. Scripts are atomic, so ids are assigned in
//!   visibility order and a reader can never see an event appear behind its
//!   cursor (C6).
//! * **Replay** reads pages with exclusive `XRANGE (<id> + COUNT <page>`,
//!   each in a `MULTI` with the metadata it is checked against: one round
//!   trip per page, the first page included. A cursor before the retained
//!   window is `EventsPurged`, decided from the metadata (`purged`, the newest
//!   id retention removed) without reading the stream; every later page is
//!   checked the same way, so a purge racing a replay is an error, never a
//!   silent gap. Ids after the newest issued, before the stream's first, or on
//!   a stream that does not exist are `UnknownEventId`.
//! * **Retention**: the count and byte limits are applied exactly, inline on
//!   every append (the newest event is never removed by them). The byte limit
//!   uses a running byte counter in the metadata hash; trimming reads each
//!   removed entry once to learn its size, which is why trimming is exact
//!   rather than `MAXLEN ~` (an approximate trim does not say what it
//!   removed). Age is judged by the store's [`Clock`](mcp_event_store_core::Clock)
//!   (each entry records the clock's time) and applied by
//!   [`purge_expired`](EventStore::purge_expired), which `SCAN`s this prefix's
//!   metadata and session hashes in batches on every master. As a backstop in
//!   real time, every append sets `PEXPIRE <max_age>` on the stream's keys, so
//!   an idle stream disappears by itself even if nobody purges.
//! * **Sessions** are hashes with the expiry time by the store's clock, plus a
//!   `PEXPIRE` of the TTL as a real-time backstop.
//! * **Cluster-safe**: every command and script touches only keys under one
//!   hash tag, so nothing is ever `CROSSSLOT`; streams spread over all masters
//!   by their tokens.
//!
//! # Connecting
//!
//! [`RedisStore::connect`] and [`RedisStore::connect_with`] take:
//!
//! * `redis://[user:pass@]host[:port][/db]`, `rediss://` (TLS, when the
//!   redis crate is built with a TLS feature), `redis+unix:///path`: one
//!   server, through a multiplexed connection that reconnects by itself;
//! * `redis+cluster://[user:pass@]host:port[,host:port...]`, or any
//!   `redis://` URL with `?cluster=true`: a Redis Cluster, from one or more
//!   seed nodes (`rediss+cluster://` for TLS).
//!
//! Servers older than 6.2 are refused when connecting.
//!
//! # Key layout
//!
//! ```text
//! <prefix>:format                        "1": the format marker (C12)
//! <prefix>:v1:stream-key                 32 random bytes keying stream tokens
//! <prefix>:v1:{<token>}:events           the Redis Stream (fields t, d, r)
//! <prefix>:v1:{<token>}:meta             hash: sid base last purged bytes head_t
//! <prefix>:v1:{<session token>}:session  hash: id d exp
//! ```
//!
//! `<token>` is the 24-character token of the event ids. The prefix may not
//! contain `{`, `}` or glob characters, so the token is always the hash tag:
//! a stream id never appears in a key name and cannot choose a slot. The
//! first store to connect creates the marker and the secret with `SET NX`;
//! every later one reads them, so all instances derive the same tokens. A
//! marker other than `1` (a newer, incompatible layout) is refused with
//! [`Error::IncompatibleFormat`].
//!
//! # Durability (C1, C10)
//!
//! `store_event` returns once the Redis primary has executed the append, so
//! the event is as durable as that server's persistence makes it; this
//! backend adds nothing and loses nothing on top:
//!
//! * **No persistence** (`appendonly no`, no RDB): events survive this
//!   process and are shared by every instance (C11), but a restart or crash
//!   of the Redis server loses them all. C1 holds only in the sense of "in
//!   the server's memory"; C10 holds for restarts of *your* processes, not of
//!   Redis.
//! * **`appendonly yes`, `appendfsync everysec`** (the usual production
//!   setting): Redis writes each append to the AOF before replying, so a
//!   `SIGKILL` or crash of the Redis process loses nothing acknowledged; an
//!   operating-system crash or power loss can lose up to about the last
//!   second (two in the worst case) of acknowledged events.
//! * **`appendonly yes`, `appendfsync always`**: the AOF is fsynced before
//!   the reply (group commit per event-loop turn), so acknowledged events
//!   survive power loss too: C1 and C10 in full, at the cost of an fsync per
//!   batch of appends.
//!
//! Replication is asynchronous: after a failover, a replica that had not yet
//! received the newest appends becomes primary without them. Replays from
//! the lost ids then fail as `UnknownEventId` (they are beyond the stream's
//! newest id) rather than skipping anything.
//!
//! Run Redis with `maxmemory-policy noeviction` (the default): an eviction
//! policy may drop a stream's keys under memory pressure. The store notices
//! what it can (an events key gone while its metadata remains makes replays
//! fail with `EventsPurged`, and the next append starts the stream over with
//! ids after the old ones, so old cursors are refused), but the events are
//! lost all the same.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod conn;
mod keys;
mod options;
mod scripts;
mod wire;

#[cfg(feature = "conformance")]
pub mod testing;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::{
    Error, EventId, EventStore, NewEvent, Page, Position, PurgeReport, Replay, Result,
    SessionStore, StreamKey, StreamToken, observe, paged_replay, retry_to_millis,
    validate_session_id, validate_stream_id,
};
use redis::{FromRedisValue, Pipeline, Value};

pub use conn::MIN_REDIS_VERSION;
pub use keys::{DEFAULT_KEY_PREFIX, validate_prefix};
pub use options::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, RedisOptions};

use conn::{Conn, backend};
use keys::{Keys, StreamKeys};
use scripts::SCRIPTS;
use wire::{after, parse_entries, parse_entry_id, parse_meta_id};

const BACKEND: &str = "redis";
/// The storage format this release reads and writes (the `<prefix>:format`
/// marker, and the `v1` in every data key).
pub const FORMAT_VERSION: u32 = 1;
/// Most entries one append removes by retention; more are left to the next
/// appends and to `purge_expired`, so one append never stalls the server.
const APPEND_TRIM_BUDGET: u32 = 256;
/// How long `delete_stream` remembers a deleted stream's newest id. Ids are
/// server milliseconds, so a re-created stream only needs it for as long as
/// the server clock might lag behind the old ids; an hour is ample.
const GONE_MARKER_TTL: Duration = Duration::from_secs(60 * 60);
/// Most entries one purge script call removes before yielding the server.
const PURGE_TRIM_BUDGET: u32 = 1_000;
/// `SCAN COUNT` during purges.
const SCAN_BATCH: u32 = 500;
/// Streams purged at once during `purge_expired`.
const PURGE_CONCURRENCY: usize = 16;
/// TTLs beyond this (about 30 years) are not set: nothing would expire anyway.
const MAX_PEXPIRE_MS: u64 = 1 << 40;

/// An [`EventStore`] and [`SessionStore`] on Redis Streams.
///
/// Cheap to clone; clones share one connection (or one set of cluster node
/// connections), which reconnects by itself after the connection is lost.
/// Calls in flight when a connection drops may fail; later calls go through
/// once the server answers again.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    keys: Keys,
    key: StreamKey,
    options: RedisOptions,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("key_prefix", &self.inner.keys.prefix())
            .field("cluster", &self.is_cluster())
            .finish_non_exhaustive()
    }
}

/// What the metadata hash says about a stream.
struct Meta {
    base: Position,
    last: Position,
    purged: Option<Position>,
}

impl Meta {
    fn parse(base: Option<String>, last: Option<String>, purged: Option<String>) -> Result<Self> {
        let (Some(base), Some(last)) = (
            parse_meta_id(base.as_deref())?,
            parse_meta_id(last.as_deref())?,
        ) else {
            return Err(Error::Corrupt(
                "stream metadata without base or last id".into(),
            ));
        };
        Ok(Self {
            base,
            last,
            purged: parse_meta_id(purged.as_deref())?,
        })
    }

    /// Whether this store issued `position` and still retains it.
    fn retains(&self, position: Position) -> bool {
        self.issued(position) && self.purged.is_none_or(|purged| position > purged)
    }

    /// Whether `position` lies in the range of ids this stream issued.
    fn issued(&self, position: Position) -> bool {
        (self.base..=self.last).contains(&position)
    }
}

impl RedisStore {
    /// Connects with default options; see [`connect_with`](Self::connect_with).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to the server or cluster `url` names (see the
    /// [crate docs](crate#connecting) for the forms), checks the server
    /// version and the format marker, and loads (or creates) the stream-token
    /// secret.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        let keys = Keys::new(&options.key_prefix)?;
        let target = conn::parse_url(url)?;
        let conn = conn::open(&target, options.response_timeout, options.connect_timeout).await?;
        check_format(&conn, &keys).await?;
        let key = load_secret(&conn, &keys).await?;
        warn_without_persistence(&conn).await;
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                keys,
                key,
                options,
            }),
        })
    }

    /// The key prefix every key of this store starts with.
    pub fn key_prefix(&self) -> &str {
        self.inner.keys.prefix()
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &RedisOptions {
        &self.inner.options
    }

    fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    fn now(&self) -> i64 {
        self.inner.options.store.clock.now_millis()
    }

    fn page_size(&self) -> usize {
        self.inner.options.store.page_size
    }

    /// Runs a read-only pipeline, retrying once if the connection dropped
    /// under it (reads are idempotent; appends are never retried).
    async fn read<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T> {
        let mut conn = self.conn();
        match pipe.query_async(&mut conn).await {
            Ok(value) => Ok(value),
            Err(e) if e.is_connection_dropped() || (e.is_io_error() && !e.is_timeout()) => {
                tracing::debug!(error = %e, "connection lost during a read; retrying once");
                pipe.query_async(&mut conn).await.map_err(backend)
            }
            Err(e) => Err(backend(e)),
        }
    }

    async fn append(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        let options = &self.inner.options.store;
        options.check_append(stream_id, event.data.len())?;
        let token = self.inner.key.token(stream_id);
        let keys = self.inner.keys.stream(&token);
        let retention = options.retention;
        let mut invocation = SCRIPTS.append.prepare_invoke();
        invocation
            .key(&keys.events)
            .key(&keys.meta)
            .key(&keys.gone)
            .arg(stream_id)
            .arg(event.data)
            .arg(
                retry_to_millis(event.retry)
                    .map(|ms| ms.to_string())
                    .unwrap_or_default(),
            )
            .arg(self.now())
            .arg(optional(retention.max_events_per_stream))
            .arg(optional(retention.max_bytes_per_stream))
            .arg(ttl_arg(retention.max_age))
            .arg(APPEND_TRIM_BUDGET);
        let reply: Value = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        match reply {
            Value::BulkString(id) => Ok(EventId::new(token, parse_entry_id(&id)?)),
            Value::SimpleString(id) => Ok(EventId::new(token, parse_entry_id(id.as_bytes())?)),
            Value::Array(mut restarted) if restarted.len() == 1 => {
                tracing::warn!(
                    stream_id,
                    "part of this stream's keys was gone (evicted or deleted by hand); \
                     it starts over, and cursors into its old events are refused"
                );
                match restarted.pop() {
                    Some(Value::BulkString(id)) => Ok(EventId::new(token, parse_entry_id(&id)?)),
                    _ => Err(Error::Corrupt(
                        "unexpected reply from the append script".into(),
                    )),
                }
            }
            Value::Int(-1) => Err(Error::Corrupt(format!(
                "stream token {token} already belongs to another stream id"
            ))),
            _ => Err(Error::Corrupt(
                "unexpected reply from the append script".into(),
            )),
        }
    }

    async fn open_replay(&self, raw: &str) -> Result<Replay> {
        let cursor: EventId = raw.parse()?;
        let token = cursor.token;
        let keys = self.inner.keys.stream(&token);
        let page_size = self.page_size();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HMGET")
            .arg(&keys.meta)
            .arg(&["sid", "base", "last", "purged"]);
        // The newest possible id has no successor (and `(` of it is an error).
        let room = cursor.position
            != Position {
                major: u64::MAX,
                minor: u64::MAX,
            };
        if room {
            pipe.cmd("XRANGE")
                .arg(&keys.events)
                .arg(after(cursor.position))
                .arg("+")
                .arg("COUNT")
                .arg(page_size);
        }
        let (meta, entries): (MetaRow, Option<Value>) = if room {
            let (meta, entries): (MetaRow, Value) = self.read(&pipe).await?;
            (meta, Some(entries))
        } else {
            let (meta,): (MetaRow,) = self.read(&pipe).await?;
            (meta, None)
        };
        let (Some(stream_id), base, last, purged) = meta else {
            return Err(Error::unknown_event_id(raw));
        };
        let meta = Meta::parse(base, last, purged)?;
        if !meta.issued(cursor.position) {
            return Err(Error::unknown_event_id(raw));
        }
        if meta.purged.is_some_and(|purged| cursor.position < purged) {
            return Err(Error::events_purged(raw));
        }
        let events = match entries {
            Some(entries) => parse_entries(token, entries)?,
            None => Vec::new(),
        };
        check_not_emptied(raw, &events, Some(meta.last), cursor.position)?;
        let mut first = Some(Page {
            last: events.len() < page_size,
            events,
        });
        let store = self.clone();
        let raw = raw.to_owned();
        let base = meta.base;
        let events = paged_replay(cursor.position, move |position| {
            let first = first.take();
            let store = store.clone();
            let raw = raw.clone();
            let keys = keys.clone();
            async move {
                match first {
                    Some(page) => Ok(page),
                    None => store.page(&raw, token, &keys, base, position).await,
                }
            }
        });
        Ok(Replay { stream_id, events })
    }

    /// Reads the page after `position`, checked against the metadata read in
    /// the same transaction: the stream must be the same incarnation (same
    /// `base`) and retention must not have removed anything after `position`.
    async fn page(
        &self,
        raw: &str,
        token: StreamToken,
        keys: &StreamKeys,
        base: Position,
        position: Position,
    ) -> Result<Page> {
        let page_size = self.page_size();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XRANGE")
            .arg(&keys.events)
            .arg(after(position))
            .arg("+")
            .arg("COUNT")
            .arg(page_size)
            .cmd("HMGET")
            .arg(&keys.meta)
            .arg(&["base", "last", "purged"]);
        let (entries, (base_now, last, purged)): (Value, PageMeta) = self.read(&pipe).await?;
        if parse_meta_id(base_now.as_deref())? != Some(base) {
            // Deleted (or deleted and recreated) while we were reading.
            return Err(Error::events_purged(raw));
        }
        if parse_meta_id(purged.as_deref())?.is_some_and(|purged| purged > position) {
            return Err(Error::events_purged(raw));
        }
        let events = parse_entries(token, entries)?;
        check_not_emptied(raw, &events, parse_meta_id(last.as_deref())?, position)?;
        Ok(Page {
            last: events.len() < page_size,
            events,
        })
    }

    async fn purge(&self) -> Result<PurgeReport> {
        let now = self.now();
        let pattern = self.inner.keys.scan_pattern();
        let mut report = PurgeReport::default();
        for node in conn::nodes(&self.inner.conn).await? {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_BATCH)
                    .arg("TYPE")
                    .arg("hash");
                let (next, found): (u64, Vec<Vec<u8>>) =
                    node.query(&self.inner.conn, &scan).await?;
                let reports: Vec<PurgeReport> = futures_util::stream::iter(found)
                    .filter_map(|key| async move { String::from_utf8(key).ok() })
                    .map(|key| async move { self.purge_key(&key, now).await })
                    .buffer_unordered(PURGE_CONCURRENCY)
                    .try_collect()
                    .await?;
                for one in reports {
                    report.add(one);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Applies retention to one stream, or expiry to one session, found by SCAN.
    async fn purge_key(&self, key: &str, now: i64) -> Result<PurgeReport> {
        let mut report = PurgeReport::default();
        if key.ends_with(":session") {
            let removed: u64 = SCRIPTS
                .session_purge
                .key(key)
                .arg(now)
                .invoke_async(&mut self.conn())
                .await
                .map_err(backend)?;
            report.sessions += removed;
            return Ok(report);
        }
        let Some(keys) = self.inner.keys.stream_of_meta(key) else {
            return Ok(report);
        };
        let retention = self.inner.options.store.retention;
        let cutoff = retention.expiry_cutoff_millis(now);
        loop {
            let (removed, gone, more): (u64, u64, u64) = SCRIPTS
                .purge
                .key(&keys.events)
                .key(&keys.meta)
                .arg(cutoff.map(|c| c.to_string()).unwrap_or_default())
                .arg(optional(retention.max_events_per_stream))
                .arg(optional(retention.max_bytes_per_stream))
                .arg(PURGE_TRIM_BUDGET)
                .invoke_async(&mut self.conn())
                .await
                .map_err(backend)?;
            report.events += removed;
            report.streams += gone;
            if more == 0 {
                return Ok(report);
            }
        }
    }

    /// Removes every key under this store's prefix: all streams, sessions, the
    /// secret and the format marker. For tests and for decommissioning; other
    /// handles on the same prefix stop working.
    pub async fn destroy(&self) -> Result<u64> {
        let pattern = self.inner.keys.all_pattern();
        let mut removed = 0;
        for node in conn::nodes(&self.inner.conn).await? {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_BATCH);
                let (next, found): (u64, Vec<Vec<u8>>) =
                    node.query(&self.inner.conn, &scan).await?;
                for key in found {
                    // One key per UNLINK: keys of different slots may not
                    // share a command, and UNLINK frees big streams off-thread.
                    let n: u64 = redis::cmd("UNLINK")
                        .arg(key)
                        .query_async(&mut self.conn())
                        .await
                        .map_err(backend)?;
                    removed += n;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(removed)
    }
}

/// `HMGET meta base last purged`, read with each later page.
type PageMeta = (Option<String>, Option<String>, Option<String>);

/// An empty page while the stream's newest id lies beyond `position` means
/// the events after it are gone (the events key was evicted or deleted by
/// hand): a gap, refused like any other.
fn check_not_emptied(
    raw: &str,
    events: &[mcp_event_store_core::StoredEvent],
    last: Option<Position>,
    position: Position,
) -> Result<()> {
    if events.is_empty() && last.is_some_and(|last| last > position) {
        return Err(Error::events_purged(raw));
    }
    Ok(())
}

/// `HMGET meta sid base last purged`.
type MetaRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A limit as a script argument: its decimal value, or `''` for none.
fn optional(limit: Option<u64>) -> String {
    limit.map(|l| l.to_string()).unwrap_or_default()
}

/// The real-time TTL that backs up age retention: `max_age` in ms (at least
/// 1, since `PEXPIRE 0` deletes at once), or `''` for no TTL.
fn ttl_arg(max_age: Option<Duration>) -> String {
    match max_age.map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)) {
        Some(ms) if ms <= MAX_PEXPIRE_MS => ms.max(1).to_string(),
        _ => String::new(),
    }
}

/// Creates the format marker if this prefix is new, and refuses any other
/// format than ours.
async fn check_format(conn: &Conn, keys: &Keys) -> Result<()> {
    let version = FORMAT_VERSION.to_string();
    let found = first_value_wins(conn, &keys.format(), version.as_bytes(), "format marker").await?;
    if found != version.as_bytes() {
        return Err(Error::IncompatibleFormat(format!(
            "keys under {:?} are in format {:?}; this release reads format {FORMAT_VERSION}",
            keys.prefix(),
            String::from_utf8_lossy(&found)
        )));
    }
    Ok(())
}

/// Loads the stream-token secret, creating it if this prefix is new.
async fn load_secret(conn: &Conn, keys: &Keys) -> Result<StreamKey> {
    let fresh = StreamKey::generate()?;
    let stored =
        first_value_wins(conn, &keys.secret(), &fresh.as_bytes()[..], "stream key").await?;
    StreamKey::from_bytes(&stored)
}

/// Sets `key` to `value` unless it is set, and returns what it holds:
/// `SET NX` makes concurrent first connections agree on one value. (Two
/// commands, since `SET .. NX GET` needs Redis 7.)
async fn first_value_wins(conn: &Conn, key: &str, value: &[u8], what: &str) -> Result<Vec<u8>> {
    let mut c = conn.clone();
    let _: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .query_async(&mut c)
        .await
        .map_err(backend)?;
    let stored: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut c)
        .await
        .map_err(backend)?;
    stored.ok_or_else(|| Error::Corrupt(format!("the {what} {key} vanished while connecting")))
}

/// Says once per process, at connect, when the server would lose events on
/// restart, since C1 and C10 then hold only as long as the server runs.
async fn warn_without_persistence(conn: &Conn) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Ok(nodes) = conn::nodes(conn).await else {
        return;
    };
    for node in nodes {
        let info: Result<String> = node
            .query(conn, redis::cmd("INFO").arg("persistence"))
            .await;
        if let Ok(info) = info {
            let aof = info.lines().any(|l| l.trim() == "aof_enabled:1");
            if !aof && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "Redis has no append-only file: acknowledged events are lost if the server restarts"
                );
                return;
            }
        }
    }
}

#[async_trait]
impl EventStore for RedisStore {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        observe::append(
            BACKEND,
            stream_id,
            event.data.len(),
            self.append(stream_id, event),
        )
        .await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(BACKEND, last_event_id, self.open_replay(last_event_id)).await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        let Some(id) = EventId::parse(event_id) else {
            return Ok(None);
        };
        let keys = self.inner.keys.stream(&id.token);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&keys.meta)
            .arg(&["sid", "base", "last", "purged"]);
        let ((sid, base, last, purged),): (MetaRow,) = self.read(&pipe).await?;
        let Some(sid) = sid else {
            return Ok(None);
        };
        let meta = Meta::parse(base, last, purged)?;
        Ok(meta.retains(id.position).then_some(sid))
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        validate_stream_id(stream_id)?;
        let keys = self.inner.keys.stream(&self.inner.key.token(stream_id));
        SCRIPTS
            .delete
            .key(&keys.events)
            .key(&keys.meta)
            .key(&keys.gone)
            .arg(stream_id)
            .arg(GONE_MARKER_TTL.as_millis() as u64)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        observe::purge(BACKEND, self.purge()).await
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        let expires_at =
            self.inner
                .options
                .store
                .check_session_put(session_id, state.len(), ttl)?;
        let key = self.inner.keys.session(&self.inner.key, session_id);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HSET")
            .arg(&key)
            .arg("id")
            .arg(session_id)
            .arg("d")
            .arg(state)
            .arg("exp")
            .arg(expires_at)
            .ignore();
        match ttl_arg(Some(ttl)).as_str() {
            "" => pipe.cmd("PERSIST").arg(&key).ignore(),
            ms => pipe.cmd("PEXPIRE").arg(&key).arg(ms).ignore(),
        };
        pipe.query_async::<()>(&mut self.conn())
            .await
            .map_err(backend)
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        if validate_session_id(session_id).is_err() {
            return Ok(None);
        }
        let key = self.inner.keys.session(&self.inner.key, session_id);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET").arg(&key).arg(&["id", "d", "exp"]);
        let ((id, data, expires_at),): ((Option<String>, Option<Vec<u8>>, Option<i64>),) =
            self.read(&pipe).await?;
        let (Some(id), Some(data), Some(expires_at)) = (id, data, expires_at) else {
            return Ok(None);
        };
        if id != session_id {
            return Err(Error::Corrupt(
                "session token already belongs to another session id".into(),
            ));
        }
        Ok((expires_at > self.now()).then(|| Bytes::from(data)))
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        if validate_session_id(session_id).is_err() {
            return Ok(false);
        }
        let key = self.inner.keys.session(&self.inner.key, session_id);
        let live: u64 = SCRIPTS
            .session_delete
            .key(&key)
            .arg(session_id)
            .arg(self.now())
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        Ok(live == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_arguments() {
        assert_eq!(ttl_arg(None), "");
        assert_eq!(ttl_arg(Some(Duration::ZERO)), "1");
        assert_eq!(ttl_arg(Some(Duration::from_secs(60))), "60000");
        assert_eq!(ttl_arg(Some(Duration::MAX)), "");
        assert_eq!(optional(None), "");
        assert_eq!(optional(Some(5)), "5");
    }

    #[test]
    fn meta_ranges() {
        let meta = Meta {
            base: Position {
                major: 10,
                minor: 0,
            },
            last: Position {
                major: 20,
                minor: 3,
            },
            purged: Some(Position {
                major: 12,
                minor: 0,
            }),
        };
        assert!(!meta.issued(Position::seq(9)));
        assert!(meta.issued(Position {
            major: 20,
            minor: 3
        }));
        assert!(!meta.issued(Position {
            major: 20,
            minor: 4
        }));
        assert!(!meta.retains(Position::seq(12)));
        assert!(meta.retains(Position {
            major: 12,
            minor: 1
        }));
    }
}
