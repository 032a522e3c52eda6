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
//! * **`store_event` is one round trip**: one Lua script (`EVALSHA`; a node
//!   that does not know it, after a restart or a failover, gets it by `EVAL`
//!   on that one call, on that node only) checks the stream id against the
//!   token, appends, updates the metadata hash, trims by count and bytes, and
//!   sets the stream's TTL. Scripts are atomic, so ids are assigned in
//!   visibility order and a reader can never see an event appear behind its
//!   cursor (C6). The append that *creates* a stream takes two more round
//!   trips, to check that the handle's cached stream secret is still the
//!   stored one (see [after a restart](#restart-without-persistence)); with
//!   [`wait_replicas`](RedisOptions::wait_replicas), `WAIT` rides in the same
//!   round trip as the script (see [replicas](#replicas-and-wait)).
//! * **Replay** is one round trip for the first page: the metadata and an
//!   inclusive `XRANGE <cursor> + COUNT <page + 1>` in one `MULTI`. Within
//!   the retained window the read must start with the cursor's own entry,
//!   so a position never issued (between two real ids, just beside one, or
//!   with a zero part such as `v1.<token>.0`) is `UnknownEventId`, never a
//!   resume from the middle. Later pages read exclusively, `XRANGE (<id> +`,
//!   each checked against the metadata in the same `MULTI`. A cursor before
//!   the retained window is `EventsPurged`, decided from the metadata
//!   (`purged`, the newest id retention removed) without reading the
//!   stream; every later page is checked the same way, so a purge racing a
//!   replay is an error, never a silent gap. Ids after the newest issued,
//!   before the stream's first, or on a stream that does not exist are
//!   `UnknownEventId`. Lookup (`get_stream_id_for_event_id`) reads
//!   `XRANGE <id> <id>`: only an entry that exists is found.
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
//! [`RedisStore::connect`] and [`RedisStore::connect_with`] take (every
//! scheme is in [`URL_SCHEMES`]):
//!
//! * `redis://[user:pass@]host[:port][/db]`, `rediss://` (TLS, when the
//!   redis crate is built with a TLS feature), `redis+unix:///path` or
//!   `unix:///path`, and the same with `valkey` for `redis`: one server,
//!   through a multiplexed connection that reconnects by itself;
//! * `redis+cluster://[user:pass@]host:port[,host:port...]`, or any
//!   `redis://` URL with `?cluster=true`: a Redis Cluster, from one or more
//!   seed nodes (`rediss+cluster://` for TLS; `valkey+cluster://`,
//!   `valkeys+cluster://`).
//!
//! The query parameters in [`URL_PARAMETERS`] are this crate's own and are
//! taken out before the redis crate parses the URL: `prefix=<key prefix>`,
//! `cluster=true`, `wait_replicas=<n>`, `wait_timeout_ms=<ms>`,
//! `follow_recheck_ms=<ms>`, `cluster_follow_poll_ms=<ms>`. They
//! override the same settings in the [`RedisOptions`] given to
//! `connect_with`. Every other parameter (`protocol=resp3`, ...) goes to the
//! redis crate unchanged.
//!
//! Servers older than 6.2 are refused when connecting.
//!
//! # Key layout
//!
//! ```text
//! <prefix>:format                        "1": the format marker (C12)
//! <prefix>:v1:stream-key                 32 random bytes keying stream tokens
//! <prefix>:v1:{<token>}:events           the Redis Stream (fields t, d, r)
//! <prefix>:v1:{<token>}:meta             hash: sid base last purged bytes head_t [pending]
//! <prefix>:v1:{<token>}:gone             a deleted or expired stream's newest id, for an hour
//! <prefix>:v1:{<session token>}:session  hash: id d exp [pending]
//! ```
//!
//! `<token>` is the 24-character token of the event ids. The prefix may not
//! contain `{`, `}` or glob characters, so the token is always the hash tag:
//! a stream id never appears in a key name and cannot choose a slot. The
//! first store to connect creates the marker and the secret with `SET NX`;
//! every later one reads them, so all instances derive the same tokens. A
//! marker other than `1` (a newer, incompatible layout) is refused with
//! [`Error::IncompatibleFormat`]. `pending` marks a stream or session whose
//! creator has not yet checked the secret (next section).
//!
//! A stream started again under the same stream id, after `delete_stream` or
//! after it expired whole, never reissues an id of its earlier life: its
//! first id is after the `gone` marker (and Redis's own ids are later than
//! any the server issued before, unless its clock went back).
//!
//! # Durability (C1, C10)
//!
//! `store_event` returns once the Redis primary has executed the append, so
//! the event is as durable as that server's persistence makes it; this
//! backend adds nothing and loses nothing on top:
//!
//! * **No persistence** (`appendonly no`, no RDB): events survive this
//!   process and are shared by every instance (C11), but a restart or crash
//!   of the Redis server loses them all (see [below](#restart-without-persistence)).
//!   C1 holds only in the sense of "in the server's memory"; C10 holds for
//!   restarts of *your* processes, not of Redis.
//! * **`appendonly yes`, `appendfsync everysec`** (the usual production
//!   setting, about which [`check`](#inspecting) warns): Redis writes each
//!   append to the AOF before replying, so a `SIGKILL` or crash of the
//!   Redis process loses nothing acknowledged; an operating-system crash or
//!   power loss can lose up to about the last second (two in the worst
//!   case) of acknowledged events.
//! * **`appendonly yes`, `appendfsync always`**: the AOF is fsynced before
//!   the reply (group commit per event-loop turn), so acknowledged events
//!   survive power loss too: C1 and C10 in full, at the cost of an fsync per
//!   batch of appends.
//!
//! Run Redis with `maxmemory-policy noeviction` (the default): an eviction
//! policy may drop a stream's keys under memory pressure. The store notices
//! what it can (an events key gone while its metadata remains makes replays
//! fail with `EventsPurged`, and the next append starts the stream over with
//! ids after the old ones, so old cursors are refused), but the events are
//! lost all the same.
//!
//! ## Restart without persistence
//!
//! A Redis without persistence that restarts comes back empty: every event,
//! every session, the stream secret and the format marker are gone, while
//! the instances of your server keep running with the secret they cached
//! at connect. What happens then:
//!
//! * Every event id issued before is unknown: replay is `UnknownEventId`
//!   and lookup is `None`, never a partial replay, so clients start over.
//! * The instances converge on one secret. A handle checks its cached secret
//!   whenever it *creates* a stream or a session, and whenever a stream or
//!   session it names is missing (`get_session`, `delete_session`,
//!   `delete_stream` finding nothing): `SET NX` of its cached secret, then
//!   `GET`. The first handle to do so after the loss (or the first to
//!   connect, which stores a fresh secret) decides; every other handle
//!   adopts the stored secret on its next such check, logs a warning, and
//!   moves what it just wrote under the right name before answering. A new
//!   stream is marked `pending` until that check passed, and any append to
//!   a pending stream, by any handle, checks too, so no event is ever
//!   acknowledged under a token the other instances would not use. The
//!   format marker is put back by the same check.
//! * Appends to streams that exist cost nothing extra; only the first
//!   append of each stream pays the two extra round trips (measured on
//!   loopback, medians over six runs: 305 to 410 us, against 105 to 155 us
//!   for an append to an existing stream).
//!
//! ## Replicas and `WAIT`
//!
//! Redis replication is asynchronous: the primary acknowledges an append
//! before any replica has it, so a failover (Sentinel, Cluster, or by hand)
//! to a replica that had not yet received the newest appends loses them.
//! Replays from a lost id are then refused (`UnknownEventId`), never
//! resumed with a gap. To keep acknowledged events through a failover, set
//! [`RedisOptions::wait_replicas`] (`?wait_replicas=1`): each append is
//! followed, in the same round trip and on the same connection (on a
//! cluster: on the stream's master), by `WAIT <n> <wait_timeout>`, and
//! `store_event` returns only once `n` replicas hold the event. An event
//! acknowledged this way survives the primary being killed with `SIGKILL`
//! and one of those replicas promoted (set `n` to the number of replicas,
//! or rely on the failover promoting the most up-to-date replica, which
//! Sentinel and Cluster prefer). When fewer replicas acknowledge within
//! [`wait_timeout`](RedisOptions::wait_timeout) (default 1 s), the append
//! fails with an error saying the event was stored on the primary but may
//! not survive a failover; retrying it stores it a second time, under a new
//! id. The secret and the format marker, when a handle creates them, wait
//! for the replicas too. Right after a replica (re)synchronises, Redis 7
//! streams writes to it only once it has sent its first acknowledgement
//! (up to a second later), so appends may fail this way in that window.
//!
//! The cost: one replica round trip per append. `WAIT` blocks the
//! connection it is sent on, and a store handle multiplexes one connection
//! (per cluster master), so appends through one handle no longer overlap.
//! Measured on loopback with one replica (medians of 5,000 appends of 256
//! bytes, six runs on a shared two-core machine): one writer went from 110
//! to 160 us per append to 140 to 215 us, 30 to 55 us more; 32 concurrent
//! writers on one handle went from 24,000 to 34,000 appends/s to 7,300 to
//! 9,200. Across a network the added time is the round trip from the
//! primary to its slowest awaited replica.
//!
//! # Following
//!
//! [`follow_events_after`](EventStore::follow_events_after) (C13) replays
//! what is stored after the cursor, then stays open and delivers each event
//! appended to that stream by any handle, process or server instance. A
//! wake-up only prompts the follower to read again by cursor (`XRANGE` after
//! the newest id it delivered), so events arrive in order, each once, and
//! nothing is queued per follower: the stream is the queue. How wake-ups
//! come:
//!
//! * **Appends through the same handle** (and its clones) wake that stream's
//!   followers in process as soon as the append script returned.
//! * **Other handles and processes, standalone Redis**: each handle that has
//!   followers runs one watcher task with one connection of its own (named
//!   [`WATCHER_CLIENT_NAME`] in `CLIENT LIST`), never the multiplexed
//!   connection appends use. It loops on `XREAD COUNT 1 BLOCK 1000 STREAMS
//!   <every followed stream's key> <newest id seen of each>`, starting each
//!   stream at its newest id when it is first followed, and wakes the
//!   streams that got entries (then jumps to each one's newest id with
//!   `HGET meta last`, so a busy stream is not read entry by entry). A
//!   follow of a stream the pending `XREAD` does not cover interrupts it
//!   with `CLIENT UNBLOCK <watcher id>` from the main connection, so the
//!   next `XREAD` covers it at once (within the one-second block at worst,
//!   if the unblock raced an `XREAD` in flight). A lost watcher connection
//!   (server restart, `CLIENT KILL`, network) is made again with a backoff
//!   of 50 ms up to 2 s, and its next `XREAD` starts from the ids it had
//!   seen, so appends made meanwhile wake their followers then.
//! * **Other handles, Redis Cluster**: `XREAD` of keys in different slots is
//!   `CROSSSLOT`, and one blocking `XREAD` per slot would need a connection
//!   per followed stream, so on a cluster the watcher polls instead: every
//!   [`cluster_follow_poll`](RedisOptions::cluster_follow_poll) (default
//!   100 ms, `?cluster_follow_poll_ms=`) it reads `HGET meta last` of every
//!   followed stream, through the handle's cluster connection (non-blocking
//!   commands, sent to each stream's master), and wakes the streams whose
//!   newest id moved.
//! * **The safety net**: whatever else happens, each follower reads again
//!   every [`follow_recheck`](RedisOptions::follow_recheck) (default 5 s,
//!   `?follow_recheck_ms=`), so a wake-up lost while the watcher was
//!   reconnecting delays an event by at most that long; correctness never
//!   depends on a wake-up.
//!
//! **Latency** (append returned on one handle until the follower has the
//! event; loopback, Redis 7.0, debug build, 200 events, medians): same
//! handle about 0.4 ms, another handle on a standalone server about 0.4 ms
//! (one `XREAD` reply, then the follower's re-read); on a cluster, another
//! handle's append arrives within one poll interval (up to 100 ms by
//! default, half that on average), its own handle's appends at once.
//!
//! **What an idle follower costs**: a registration in the handle's wake-up
//! hub and its suspended task; no connection and no Redis command of its
//! own. Per *handle* with followers: one extra connection (standalone) and
//! one `XREAD` naming every followed stream, sent again after each wake-up
//! and at least once a second; on a cluster, no extra connection but one
//! `HGET` per followed stream per poll. 1,000 idle followers on one handle
//! add one connection (tested with `CLIENT LIST`). The watcher ends, and
//! its connection closes, within a second of the handle's last follow being
//! dropped, and at once when the handle itself is dropped.
//!
//! # Inspecting
//!
//! [`check`](EventStore::check) (C15, and `mcp-event-store check`) reports
//! the backend `redis`, the format version [`FORMAT_VERSION`], and these
//! settings, read with `CONFIG GET` from the server (on a cluster, from
//! every master), each `ok` or a warning with its remedy:
//!
//! * `appendonly`: `yes` is ok; `no` warns, since a restart or crash of
//!   Redis then loses acknowledged events.
//! * `appendfsync`: `always` is ok; `everysec` warns (an operating-system
//!   crash or power loss can lose about the last second of acknowledged
//!   events, see [Durability](#durability-c1-c10)), and so does `no`.
//!   Reported as unused while `appendonly` is `no`.
//! * `save` (RDB snapshots): ok with `appendonly yes`; otherwise it warns,
//!   saying whether snapshots are all there is or nothing is persisted.
//! * `maxmemory-policy`: `noeviction` is ok; any other policy warns, since
//!   it lets Redis evict a stream's keys when memory runs short.
//! * `wait_replicas` ([`RedisOptions::wait_replicas`]) against the replicas
//!   the server has connected (`INFO replication`): 0 without replicas is
//!   ok; 0 with replicas warns (a failover can lose the newest acknowledged
//!   events), and so does a number above the replicas connected (appends
//!   would fail).
//!
//! So a server run with `--appendonly yes --appendfsync always
//! --maxmemory-policy noeviction` and no replicas passes; one without
//! persistence does not. On a cluster, a setting every master shares is
//! reported once (`yes on all 3 masters`), one that differs once per
//! value, naming the masters. Where `CONFIG` is refused (managed services
//! rename or forbid it), `appendonly` and `maxmemory-policy` come from
//! `INFO`, and what `INFO` does not tell (`appendfsync`, `save`) is
//! `unknown` with a warning to verify it by hand.
//!
//! [`stats`](EventStore::stats) and
//! [`list_streams`](EventStore::list_streams) walk this prefix's stream
//! metadata hashes with `SCAN ... TYPE hash` (batches of 250) on every
//! master and read one summary per stream in a read-only script: its
//! `XLEN`, its byte counter, and the store-clock time of its oldest and
//! newest entries, read server-side (the payloads never cross the
//! network). Redis keeps no store-wide totals (on a cluster no script can
//! update one key from every master), so their time grows with the number
//! of streams; memory does not. Listings come in `SCAN` order (each
//! master's hash-table order, masters by slot), not sorted; the cursor is
//! the master, the `SCAN` cursor, and the last stream listed of that batch.
//! One page never lists a stream twice. Redis's `SCAN` may return a key
//! again when the server resizes its key table between calls (after many
//! keys went), so across pages, or within one `stats`, a stream can then be
//! met twice; streams appended or removed meanwhile may or may not appear.
//!
//! Appends are one script call each, never batched, so this backend
//! records no append batch size metric.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod conn;
mod follow;
mod inspect;
mod keys;
mod options;
mod scripts;
mod secret;
mod wire;

#[cfg(feature = "conformance")]
pub mod testing;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::backend::follow::follow;
use mcp_event_store_core::backend::{
    Page, StreamKey, StreamToken, observe, paged_replay, retry_to_millis, validate_session_id,
    validate_stream_id,
};
use mcp_event_store_core::{
    Backend, Error, EventId, EventStore, FollowOptions, HealthReport, NewEvent, Position,
    PurgeReport, Replay, Result, SessionStore, Store, StoreStats, StreamCursor, StreamPage,
};
use redis::{ErrorKind, FromRedisValue, Pipeline, ServerErrorKind, Value};

pub use conn::{MIN_REDIS_VERSION, URL_SCHEMES};
pub use follow::WATCHER_CLIENT_NAME;
pub use keys::{DEFAULT_KEY_PREFIX, validate_prefix};
pub use options::{
    DEFAULT_CLUSTER_FOLLOW_POLL, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FOLLOW_RECHECK,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_WAIT_TIMEOUT, RedisOptions, URL_PARAMETERS,
};

use conn::{Conn, Target, backend};
use follow::{Follow, Source};
use keys::{Keys, StreamKeys};
use scripts::{Call, SCRIPTS};
use secret::{Secret, Wait, check_replicas, settle};
use wire::{after, entry_id, parse_entries, parse_entry_id, parse_meta_id};

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// schemes [`URL_SCHEMES`], facade feature `redis`. Its `connect` reads the
/// URL with [`RedisStore::connect_with`] (this crate's [`URL_PARAMETERS`],
/// the rest for the redis crate) and applies the shared
/// [`StoreOptions`](mcp_event_store_core::StoreOptions).
///
/// ```
/// assert!(mcp_event_store_redis::BACKEND.opens("valkey+cluster://h1:7000,h2:7001"));
/// ```
pub const BACKEND: Backend = Backend {
    name: NAME,
    schemes: URL_SCHEMES,
    feature: "redis",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = RedisOptions::default().store(options);
            Ok(Arc::new(RedisStore::connect_with(&url, options).await?) as Arc<dyn Store>)
        })
    },
};

/// The backend name in errors and traces.
const NAME: &str = "redis";
/// The storage format this release reads and writes (the `<prefix>:format`
/// marker, and the `v1` in every data key).
pub const FORMAT_VERSION: u32 = 1;
/// Most entries one append removes by retention; more are left to the next
/// appends and to `purge_expired`, so one append never stalls the server.
const APPEND_TRIM_BUDGET: u32 = 256;
/// How long `delete_stream` (and a purge that empties a stream) remembers
/// the stream's newest id. Ids are
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
/// How many times one call writes again after finding that the stream
/// secret changed under it (each time means the backend lost its data
/// again while the call ran).
const SECRET_ATTEMPTS: usize = 4;

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
    secret: Secret,
    options: RedisOptions,
    follow: Follow,
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
    /// [crate docs](crate#connecting) for the forms and the parameters this
    /// crate reads from the URL, which override the same settings in
    /// `options`), checks the server version and the format marker, and
    /// loads (or creates) the stream-token secret.
    pub async fn connect_with(url: &str, options: RedisOptions) -> Result<Self> {
        let (options, url) = options.apply_url(url)?;
        options.validate()?;
        let keys = Keys::new(&options.key_prefix)?;
        let target = conn::parse_url(&url)?;
        let conn = conn::open(&target, options.response_timeout, options.connect_timeout).await?;
        let wait = wait_of(&options);
        let key = settle(&conn, &keys, &StreamKey::generate()?, wait).await?;
        warn_without_persistence(&conn).await;
        let source = match &target {
            Target::Standalone(url) => Source::Standalone {
                client: redis::Client::open(url.as_str()).map_err(backend)?,
                main: conn.clone(),
                connect_timeout: options.connect_timeout,
                response_timeout: options.response_timeout,
            },
            Target::Cluster(_) => Source::Cluster {
                conn: conn.clone(),
                poll: options.cluster_follow_poll,
            },
        };
        let follow = Follow::new(keys.clone(), source);
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                keys,
                secret: Secret::new(key),
                options,
                follow,
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

    /// The stream secret this handle uses now.
    fn key(&self) -> StreamKey {
        self.inner.secret.current()
    }

    /// `WAIT` arguments, if appends wait for replicas.
    fn wait(&self) -> Wait {
        wait_of(&self.inner.options)
    }

    /// Checks that `key`, the secret a call just used, is still the stored
    /// one, putting it (and the format marker) back if the backend lost
    /// them. `false`: another handle stored a different secret after a
    /// loss; this handle now uses that one, and the call must be made again.
    async fn secret_holds(&self, key: &StreamKey) -> Result<bool> {
        let stored = settle(&self.inner.conn, &self.inner.keys, key, self.wait()).await?;
        if stored.as_bytes() == key.as_bytes() {
            return Ok(true);
        }
        tracing::warn!(
            key_prefix = self.inner.keys.prefix(),
            "the stream secret in Redis is not the one this handle used: the server lost its \
             data (a restart without persistence?) and another handle stored a new secret; \
             adopting it"
        );
        self.inner.secret.adopt(stored);
        Ok(false)
    }

    /// Runs `call`, followed in the same round trip by `WAIT` when `wait`
    /// and appends wait for replicas (on the same connection and, on a
    /// cluster, on the same master: a pipeline goes where its first key
    /// lives). By `EVALSHA`; if the node does not know the script (it
    /// restarted, was promoted, or `SCRIPT FLUSH`), once more by `EVAL` of
    /// the source (the script did not run, so nothing is done twice).
    /// Returns the script's reply and, with `WAIT`, how many replicas
    /// acknowledged.
    async fn run(&self, call: &Call<'_>, wait: bool) -> Result<(Value, Option<u32>)> {
        let wait = self.wait().filter(|_| wait);
        let mut conn = self.conn();
        let mut by_source = false;
        loop {
            let mut pipe = redis::pipe();
            pipe.add_command(call.cmd(by_source));
            let result = match wait {
                Some((replicas, ms)) => {
                    pipe.cmd("WAIT").arg(replicas).arg(ms);
                    pipe.query_async::<(Value, u32)>(&mut conn)
                        .await
                        .map(|(reply, acked)| (reply, Some(acked)))
                }
                None => pipe
                    .query_async::<(Value,)>(&mut conn)
                    .await
                    .map(|(reply,)| (reply, None)),
            };
            match result {
                Err(e)
                    if !by_source && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    by_source = true;
                }
                other => return other.map_err(backend),
            }
        }
    }

    /// Runs `call` (never followed by `WAIT`) and converts its reply.
    async fn invoke<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T> {
        let (reply, _) = self.run(&call, false).await?;
        T::from_redis_value(reply).map_err(|e| Error::backend(NAME, e))
    }

    /// Fails a write that `WAIT` says too few replicas hold.
    fn check_wait(&self, acked: Option<u32>, what: &str) -> Result<()> {
        match (self.wait(), acked) {
            (Some((replicas, ms)), Some(acked)) => check_replicas(acked, replicas, ms, what),
            _ => Ok(()),
        }
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
        self.inner
            .options
            .store
            .check_append(stream_id, event.data.len())?;
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let token = key.token(stream_id);
            let keys = self.inner.keys.stream(&token);
            let (id, check) = self.append_once(stream_id, event, token, &keys).await?;
            let Some(check) = check else {
                return Ok(id);
            };
            if check == "restarted" {
                tracing::warn!(
                    stream_id,
                    "part of this stream's keys was gone (evicted or deleted by hand); \
                     it starts over, and cursors into its old events are refused"
                );
            }
            match self.secret_holds(&key).await {
                Ok(true) => {
                    let confirmed: i64 = self
                        .invoke(
                            SCRIPTS
                                .confirm
                                .call()
                                .key(&keys.events)
                                .key(&keys.meta)
                                .arg(entry_id(id.position))
                                .arg(stream_id),
                        )
                        .await?;
                    if confirmed == 1 {
                        return Ok(id);
                    }
                    // The entry went between the append and this check (the
                    // backend lost its data again): append once more.
                }
                Ok(false) => self.discard(&keys, stream_id).await?,
                Err(e) => {
                    if matches!(e, Error::IncompatibleFormat(_)) {
                        // A newer release took the prefix over after a loss.
                        self.discard(&keys, stream_id).await?;
                    }
                    return Err(e);
                }
            }
        }
        Err(secret_kept_changing())
    }

    /// Removes a stream this handle created under a secret that turned out
    /// to be out of date (nothing in it was acknowledged).
    async fn discard(&self, keys: &StreamKeys, stream_id: &str) -> Result<()> {
        let _: i64 = self
            .invoke(
                SCRIPTS
                    .discard
                    .call()
                    .key(&keys.events)
                    .key(&keys.meta)
                    .arg(stream_id),
            )
            .await?;
        Ok(())
    }

    /// One run of the append script (and `WAIT`): the id, and the state
    /// (`new`, `restarted`, `pending`) when the secret must be checked
    /// before the id may be returned.
    async fn append_once(
        &self,
        stream_id: &str,
        event: NewEvent<'_>,
        token: StreamToken,
        keys: &StreamKeys,
    ) -> Result<(EventId, Option<&'static str>)> {
        let retention = self.inner.options.store.retention;
        let call = SCRIPTS
            .append
            .call()
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
        let (reply, acked) = self.run(&call, true).await?;
        let (id, check) = match reply {
            Value::BulkString(id) => (parse_entry_id(&id)?, None),
            Value::SimpleString(id) => (parse_entry_id(id.as_bytes())?, None),
            Value::Array(parts) => match <(Vec<u8>, String)>::from_redis_value(Value::Array(parts))
            {
                Ok((id, state)) => {
                    let check = match state.as_str() {
                        "new" => "new",
                        "restarted" => "restarted",
                        "pending" => "pending",
                        _ => return Err(unexpected_reply("append")),
                    };
                    (parse_entry_id(&id)?, Some(check))
                }
                Err(_) => return Err(unexpected_reply("append")),
            },
            Value::Int(-1) => {
                return Err(Error::Corrupt(format!(
                    "stream token {token} already belongs to another stream id"
                )));
            }
            _ => return Err(unexpected_reply("append")),
        };
        self.check_wait(acked, "the event")?;
        Ok((EventId::new(token, id), check))
    }

    async fn open_replay(&self, raw: &str) -> Result<Replay> {
        let cursor: EventId = raw.parse()?;
        let token = cursor.token;
        let keys = self.inner.keys.stream(&token);
        let page_size = self.page_size();
        // One round trip: the metadata, and an inclusive range that must
        // start with the cursor itself, which proves the cursor was issued
        // (a position between two real ids is never accepted).
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HMGET")
            .arg(&keys.meta)
            .arg(&["sid", "base", "last", "purged"])
            .cmd("XRANGE")
            .arg(&keys.events)
            .arg(entry_id(cursor.position))
            .arg("+")
            .arg("COUNT")
            .arg(page_size.saturating_add(1));
        let (meta, entries): (MetaRow, Value) = self.read(&pipe).await?;
        let (Some(stream_id), base, last, purged) = meta else {
            return Err(Error::unknown_event_id(raw));
        };
        let meta = Meta::parse(base, last, purged)?;
        let mut events = first_page(raw, &meta, cursor.position, parse_entries(token, entries)?)?;
        events.truncate(page_size);
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
            let removed: u64 = self
                .invoke(SCRIPTS.session_purge.call().key(key).arg(now))
                .await?;
            report.sessions += removed;
            return Ok(report);
        }
        let Some(keys) = self.inner.keys.stream_of_meta(key) else {
            return Ok(report);
        };
        let retention = self.inner.options.store.retention;
        let cutoff = retention.expiry_cutoff_millis(now);
        loop {
            let (removed, gone, more): (u64, u64, u64) = self
                .invoke(
                    SCRIPTS
                        .purge
                        .call()
                        .key(&keys.events)
                        .key(&keys.meta)
                        .key(&keys.gone)
                        .arg(cutoff.map(|c| c.to_string()).unwrap_or_default())
                        .arg(optional(retention.max_events_per_stream))
                        .arg(optional(retention.max_bytes_per_stream))
                        .arg(PURGE_TRIM_BUDGET)
                        .arg(GONE_MARKER_TTL.as_millis() as u64),
                )
                .await?;
            report.events += removed;
            report.streams += gone;
            if more == 0 {
                return Ok(report);
            }
        }
    }

    /// Removes every key under this store's prefix: all streams, sessions, the
    /// secret and the format marker. For tests and for decommissioning. Handles
    /// still open on the prefix go on as after a server restart without
    /// persistence (see the [crate docs](crate#restart-without-persistence)).
    pub async fn destroy(&self) -> Result<u64> {
        unlink_matching(&self.inner.conn, &self.inner.keys.all_pattern()).await
    }
}

/// Removes every key matching `pattern` on every node (`SCAN` + `UNLINK`
/// per master), returning how many went.
pub(crate) async fn unlink_matching(conn: &Conn, pattern: &str) -> Result<u64> {
    let mut removed = 0;
    for node in conn::nodes(conn).await? {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let (next, found): (u64, Vec<Vec<u8>>) = node.query(conn, &scan).await?;
            for key in found {
                // One key per UNLINK: keys of different slots may not
                // share a command, and UNLINK frees big streams off-thread.
                let n: u64 = redis::cmd("UNLINK")
                    .arg(key)
                    .query_async(&mut conn.clone())
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

/// `HMGET meta base last purged`, read with each later page.
type PageMeta = (Option<String>, Option<String>, Option<String>);

/// Checks the first page of a replay, read inclusively from the cursor, and
/// returns the events after the cursor (at most one page).
///
/// * outside the ids this stream issued: `UnknownEventId`;
/// * before the newest id retention removed: `EventsPurged`;
/// * the newest id retention removed itself: it was issued, and nothing
///   after it is gone, so the replay goes on from there;
/// * within the retained window: the read must start with the cursor's own
///   entry, or the position was never issued (`UnknownEventId`); nothing at
///   all while the stream's newest id is at or after the cursor means the
///   events key was lost (`EventsPurged`).
fn first_page(
    raw: &str,
    meta: &Meta,
    cursor: Position,
    mut events: Vec<mcp_event_store_core::StoredEvent>,
) -> Result<Vec<mcp_event_store_core::StoredEvent>> {
    if !meta.issued(cursor) {
        return Err(Error::unknown_event_id(raw));
    }
    match meta.purged {
        Some(purged) if cursor < purged => return Err(Error::events_purged(raw)),
        Some(purged) if cursor == purged => {
            events.retain(|e| e.id.position > cursor);
        }
        _ => match events.first() {
            None => return Err(Error::events_purged(raw)),
            Some(first) if first.id.position != cursor => {
                return Err(Error::unknown_event_id(raw));
            }
            Some(_) => {
                events.remove(0);
            }
        },
    }
    Ok(events)
}

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

/// `WAIT` arguments from the options: (replicas, timeout ms), or none.
fn wait_of(options: &RedisOptions) -> Wait {
    (options.wait_replicas > 0).then(|| (options.wait_replicas, options.wait_timeout_ms()))
}

fn unexpected_reply(script: &str) -> Error {
    Error::Corrupt(format!("unexpected reply from the {script} script"))
}

/// A write found the stream secret changed again and again: the backend
/// keeps losing its data under it.
fn secret_kept_changing() -> Error {
    Error::backend(
        NAME,
        format!(
            "the stream secret in Redis changed {SECRET_ATTEMPTS} times during one call; \
             is something emptying the server?"
        ),
    )
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
        let id = observe::append(
            NAME,
            stream_id,
            event.data.len(),
            self.append(stream_id, event),
        )
        .await?;
        // The script returned: the event is visible to every reader now.
        self.inner.follow.hub().wake(&id.token);
        Ok(id)
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(NAME, last_event_id, self.open_replay(last_event_id)).await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        let Some(id) = EventId::parse(event_id) else {
            return Ok(None);
        };
        let keys = self.inner.keys.stream(&id.token);
        // The entry itself must exist: a position between two issued ids is
        // never found.
        let at = entry_id(id.position);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HGET")
            .arg(&keys.meta)
            .arg("sid")
            .cmd("XRANGE")
            .arg(&keys.events)
            .arg(&at)
            .arg(&at)
            .arg("COUNT")
            .arg(1);
        let (sid, entry): (Option<String>, Vec<Value>) = self.read(&pipe).await?;
        Ok(sid.filter(|_| !entry.is_empty()))
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        validate_stream_id(stream_id)?;
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let keys = self.inner.keys.stream(&key.token(stream_id));
            let removed: i64 = self
                .invoke(
                    SCRIPTS
                        .delete
                        .call()
                        .key(&keys.events)
                        .key(&keys.meta)
                        .key(&keys.gone)
                        .arg(stream_id)
                        .arg(GONE_MARKER_TTL.as_millis() as u64),
                )
                .await?;
            // No such stream: unless this handle's secret is out of date
            // (then the stream lives under another token), there is
            // nothing to delete.
            if removed >= 0 || self.secret_holds(&key).await? {
                return Ok(u64::try_from(removed).unwrap_or(0));
            }
        }
        Err(secret_kept_changing())
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        observe::purge(NAME, self.purge()).await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        let cursor: EventId = last_event_id.parse()?;
        // Subscribe before the first read, so no wake-up falls in between;
        // then make sure the watcher covers the stream.
        let subscription = self.inner.follow.hub().subscribe(cursor.token);
        self.inner.follow.watch(cursor.token).await;
        let first = self.replay_events_after(last_event_id).await?;
        let store = self.clone();
        Ok(follow(
            NAME,
            first,
            subscription,
            last_event_id.to_owned(),
            self.inner.options.follow_recheck,
            options,
            mcp_event_store_core::backend::follow::reread(store),
        ))
    }

    fn open_follows(&self) -> usize {
        self.inner.follow.hub().followers()
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.inspect_stats().await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        self.inspect_list(after, limit).await
    }

    async fn check(&self) -> Result<HealthReport> {
        self.inspect_check().await
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
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, session_id);
            let call = SCRIPTS
                .session_put
                .call()
                .key(&session)
                .arg(session_id)
                .arg(state)
                .arg(expires_at)
                .arg(ttl_arg(Some(ttl)));
            let (reply, acked) = self.run(&call, true).await?;
            let check = i64::from_redis_value(reply).map_err(|e| Error::backend(NAME, e))?;
            self.check_wait(acked, "the session")?;
            if check == 0 {
                return Ok(());
            }
            // A new session (or one still pending): as for a new stream, the
            // secret that named it must be the stored one.
            if self.secret_holds(&key).await? {
                let confirmed: i64 = self
                    .invoke(SCRIPTS.session_confirm.call().key(&session).arg(session_id))
                    .await?;
                if confirmed == 1 {
                    return Ok(());
                }
            } else {
                let _: i64 = self
                    .invoke(SCRIPTS.session_discard.call().key(&session).arg(session_id))
                    .await?;
            }
        }
        Err(secret_kept_changing())
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        if validate_session_id(session_id).is_err() {
            return Ok(None);
        }
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, session_id);
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET").arg(&session).arg(&["id", "d", "exp"]);
            let ((id, data, expires_at),): ((Option<String>, Option<Vec<u8>>, Option<i64>),) =
                self.read(&pipe).await?;
            let (Some(id), Some(data), Some(expires_at)) = (id, data, expires_at) else {
                // Missing: unless this handle's secret is out of date (then
                // the session lives under another key), there is none.
                if self.secret_holds(&key).await? {
                    return Ok(None);
                }
                continue;
            };
            if id != session_id {
                return Err(Error::Corrupt(
                    "session token already belongs to another session id".into(),
                ));
            }
            return Ok((expires_at > self.now()).then(|| Bytes::from(data)));
        }
        Err(secret_kept_changing())
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        if validate_session_id(session_id).is_err() {
            return Ok(false);
        }
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, session_id);
            let outcome: i64 = self
                .invoke(
                    SCRIPTS
                        .session_delete
                        .call()
                        .key(&session)
                        .arg(session_id)
                        .arg(self.now()),
                )
                .await?;
            if outcome >= 0 || self.secret_holds(&key).await? {
                return Ok(outcome == 1);
            }
        }
        Err(secret_kept_changing())
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
            base: Position::new(10, 0),
            last: Position::new(20, 3),
            purged: Some(Position::new(12, 0)),
        };
        assert!(!meta.issued(Position::seq(9)));
        assert!(meta.issued(Position::new(20, 3)));
        assert!(!meta.issued(Position::new(20, 4)));
    }

    #[test]
    fn the_first_page_must_start_at_the_cursor() {
        let token = StreamKey::generate().unwrap().token("s");
        let page = |positions: &[(u64, u64)]| -> Vec<mcp_event_store_core::StoredEvent> {
            positions
                .iter()
                .map(|&(a, b)| mcp_event_store_core::StoredEvent {
                    id: EventId::new(token, Position::new(a, b)),
                    data: Bytes::new(),
                    retry: None,
                })
                .collect()
        };
        let positions = |events: Vec<mcp_event_store_core::StoredEvent>| -> Vec<Position> {
            events.iter().map(|e| e.id.position).collect()
        };
        let meta = Meta {
            base: Position::new(10, 0),
            last: Position::new(30, 0),
            purged: Some(Position::new(12, 0)),
        };
        let unknown = |r: Result<_>| matches!(r, Err(Error::UnknownEventId { .. }));
        let purged = |r: Result<_>| matches!(r, Err(Error::EventsPurged { .. }));
        // Within the window: the read starts with the cursor, which is dropped.
        let got = first_page("x", &meta, Position::new(20, 0), page(&[(20, 0), (25, 0)]));
        assert_eq!(positions(got.unwrap()), vec![Position::new(25, 0)]);
        // A position between two real ids, or before one, was never issued.
        assert!(unknown(first_page(
            "x",
            &meta,
            Position::new(20, 1),
            page(&[(25, 0)])
        )));
        assert!(unknown(first_page(
            "x",
            &meta,
            Position::new(13, 0),
            page(&[(14, 0)])
        )));
        // Outside the issued range.
        assert!(unknown(first_page("x", &meta, Position::ZERO, page(&[]))));
        assert!(unknown(first_page(
            "x",
            &meta,
            Position::new(30, 1),
            page(&[])
        )));
        // Before the newest purged id: a gap.
        assert!(purged(first_page(
            "x",
            &meta,
            Position::new(11, 0),
            page(&[(14, 0)])
        )));
        // The newest purged id itself: nothing after it is gone.
        let got = first_page("x", &meta, Position::new(12, 0), page(&[(14, 0)]));
        assert_eq!(positions(got.unwrap()), vec![Position::new(14, 0)]);
        // Nothing at all although the stream reaches the cursor: lost events.
        assert!(purged(first_page(
            "x",
            &meta,
            Position::new(30, 0),
            page(&[])
        )));
    }
}
