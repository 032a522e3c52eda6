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
//! store.close().await;
//! # Ok(()) }
//! ```
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
//! `connect_with`. The redis crate's own parameters
//! ([`DRIVER_URL_PARAMETERS`]: `protocol=resp3`, and `db`, `user`, `pass`
//! on unix sockets) go to it unchanged. Any other parameter, or one given
//! twice, is refused with [`Error::Config`](mcp_event_store_core::Error::Config)
//! naming it, rather than ignored. [`RedisOptions::from_url`] reads the
//! same parameters into options.
//!
//! Servers older than 6.2 are refused when connecting.
//!
//! [`RedisStore::close`] stops the handle's follow watcher and makes every
//! later call of the handle and its clones fail with
//! [`Error::Closed`](mcp_event_store_core::Error::Closed); the connection
//! closes when the last clone is dropped.
//!
//! # Layout
//!
//! ```text
//! <prefix>:format                        "1": the format marker (see Format)
//! <prefix>:v1:stream-key                 32 random bytes keying stream tokens
//! <prefix>:v1:{<token>}:events           the Redis Stream (fields t, d, r)
//! <prefix>:v1:{<token>}:meta             hash: sid base last purged bytes head_t [pending]
//! <prefix>:v1:{<token>}:gone             a deleted or expired stream's newest id, for an hour
//! <prefix>:v1:{<session token>}:session  hash: id d exp [pending]
//! <prefix>:t1:{<task digest>}:task       hash: v rev [c] [s] (see Tasks)
//! <prefix>:t1:instance:{<instance id>}   a task instance's heartbeat deadline
//! ```
//!
//! **One Redis Stream per event stream**, appended with `XADD *`: the
//! server assigns the entry id `<ms>-<seq>`, which becomes the event id's
//! position (major = ms, minor = seq). `<token>` is the 24-character token
//! of the event ids, so an id names its stream's keys directly and resuming
//! needs no index lookup. The prefix may not contain `{`, `}` or glob
//! characters, so the token is always the hash tag: a stream id never
//! appears in a key name and cannot choose a slot. `pending` marks a stream
//! or session whose creator has not yet checked the secret (see
//! [Restart without persistence](#restart-without-persistence)).
//!
//! A stream started again under the same stream id, after `delete_stream` or
//! after it expired whole, never reissues an id of its earlier life: its
//! first id is after the `gone` marker (and Redis's own ids are later than
//! any the server issued before, unless its clock went back).
//!
//! ## Appending
//!
//! `store_event` is one round trip: one Lua script (`EVALSHA`; a node
//! that does not know it, after a restart or a failover, gets it by `EVAL`
//! on that one call, on that node only) checks the stream id against the
//! token, appends, updates the metadata hash, trims by count and bytes, and
//! keeps the stream's TTL (see [Retention](#retention)). Scripts are
//! atomic, so ids are assigned in
//! visibility order and a reader can never see an event appear behind its
//! cursor (C6). The append that *creates* a stream takes two more round
//! trips, to check that the handle's cached stream secret is still the
//! stored one (see [after a restart](#restart-without-persistence)); with
//! [`wait_replicas`](RedisOptions::wait_replicas), `WAIT` rides in the same
//! round trip as the script (see [replicas](#replicas-and-wait)).
//!
//! ## Replaying
//!
//! Replay is one round trip for the first page: the metadata and an
//! inclusive `XRANGE <cursor> + COUNT <page + 1>` in one `MULTI`. Within
//! the retained window the read must start with the cursor's own entry,
//! so a position never issued (between two real ids, just beside one, or
//! with a zero part such as `v1.<token>.0`) is `UnknownEventId`, never a
//! resume from the middle. Later pages read exclusively, `XRANGE (<id> +`,
//! each checked against the metadata in the same `MULTI`. A cursor before
//! the retained window is `EventsPurged`, decided from the metadata
//! (`purged`, the newest id retention removed) without reading the
//! stream; every later page is checked the same way, so a purge racing a
//! replay is an error, never a silent gap. Ids after the newest issued,
//! before the stream's first, or on a stream that does not exist are
//! `UnknownEventId`. Lookup (`get_stream_id_for_event_id`) reads
//! `XRANGE <id> <id>`: only an entry that exists is found.
//!
//! ## Sessions
//!
//! Sessions are hashes named by a keyed hash of the session id (keyed with
//! the stream secret, so no more guessable than a stream's keys), with the
//! expiry time by the store's clock, plus a `PEXPIRE` of the TTL as a
//! real-time backstop.
//!
//! ## Redis Cluster
//!
//! Every command and script touches only keys under one hash tag, so
//! nothing is ever `CROSSSLOT`; streams spread over all masters by their
//! tokens. Keyless commands (`SCAN`, `INFO`, `CONFIG GET`) go to every
//! master.
//!
//! ## Redemptions
//!
//! [`RedeemStore::redeem`](mcp_event_store_core::RedeemStore::redeem)
//! (C21) is one `SET <prefix>:r1:{<digest>} <forget_at> NX PXAT
//! <forget_at>` (followed by `WAIT` when `wait_replicas` is set, and
//! refused as an append is when too few replicas acknowledged): one key
//! whose hash tag is the 32-byte digest core computes (the principal's
//! digest and the nonce, in hex; never the nonce), so one slot on a
//! cluster and one atomic command on its master; `OK` for the first
//! redemption, nil for every later one. `forget_at` is the nonce's expiry
//! plus [`REDEEM_GRACE`](mcp_event_store_core::REDEEM_GRACE), and Redis
//! expires the key then, by its own clock: the keys are bounded by the
//! redemptions of the last
//! [`MAX_REDEEM_HORIZON`](mcp_event_store_core::MAX_REDEEM_HORIZON) plus
//! the grace without any purge (`purge_expired` does not visit them, and
//! counts none). They live as long as Redis keeps its data: a Redis that
//! lost its data (a restart without persistence) forgets every
//! redemption, and a failover without `WAIT` may lose the newest.
//!
//! ## Rewrites in place
//!
//! [`EventStore::rewriter`] (C22, what re-sealing a store under a new key
//! works on) lists sessions and tasks by digest and swaps their values in
//! place, each swap one Lua script on the value's one key (so one slot on
//! a cluster) that writes only over the bytes expected and keeps the key's
//! TTL: a session's `d` (its `exp` kept), a task's `c` or `v` (its `rev`
//! kept), bumping the task's swap stamp `s`, which every task step checks
//! beside `rev` so that a step that read the task before the swap reads
//! it again instead of writing the old bytes back. Events are not
//! rewritten: a stream entry is immutable, and none can be added again
//! below a stream's newest id, so
//! [`rewrites_events`](mcp_event_store_core::rewrite::RewriteStore::rewrites_events)
//! is `false` and an event swap is refused with
//! [`Error::Config`](mcp_event_store_core::Error::Config); events leave
//! with retention.
//!
//! Redis keeps no index by digest, so each page of a listing walks every
//! session (or task) hash under the prefix on every master (`SCAN`),
//! keeping only the page's smallest digests (memory bounded by the page),
//! and a session listing also reads each session's `id` on the way (its
//! key is named by a keyed hash, not by the digest): listing `n` sessions
//! a page of `p` at a time costs about `n² / p` small reads. An operator's
//! tool run now and then, not a request path. Task steps of a release from
//! before rewrites do not check `s`: rewrite once every handle on the
//! prefix runs this release, or a step of an older one may write back a
//! value swapped while it ran.
//!
//! # Durability
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
//! Tasks are exactly as durable: `create` returns once the primary ran its
//! script, so without `appendfsync always` (or `WAIT`, see
//! [below](#replicas-and-wait)) a task acknowledged as created, which
//! SEP-2663 requires to be durable, can be lost; [`check`](#inspecting)
//! says so.
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
//! # Retention
//!
//! The count and byte limits are applied exactly, inline on every append
//! (the newest event is never removed by them). The byte limit uses a
//! running byte counter in the metadata hash; trimming reads each removed
//! entry once to learn its size, which is why trimming is exact rather than
//! `MAXLEN ~` (an approximate trim does not say what it removed). Age is
//! judged by the store's [`Clock`](mcp_event_store_core::Clock) (each entry
//! records the clock's time) and applied by
//! [`purge_expired`](EventStore::purge_expired), which `SCAN`s this prefix's
//! metadata and session hashes in batches on every master. As a backstop in
//! real time, the stream's keys carry a TTL, so an idle stream disappears by
//! itself even if nobody purges: never earlier than `max_age` after its
//! last append, and at most a slack later, 1/16 of `max_age` and at most
//! one second (for the default hour, between 60:00 and 60:01 minutes
//! after). Each append reads the events key's `PTTL` and, only when less
//! than `max_age` is left, sets both keys' TTL to `max_age` plus the slack,
//! so a stream's TTL is set at most once per slack rather than by two
//! `PEXPIRE`s on every append (which is what releases before this one did;
//! they and this one share a prefix without harm: an append of either
//! leaves at least `max_age`). After `max_age` is lowered, keys that got a
//! TTL under the longer one keep it until it comes within the new
//! `max_age` (purges apply the new age at once). Without an age limit the
//! keys get no TTL, and an append removes one an earlier configuration
//! left. Sessions
//! expire by their TTL the same two ways (a session's TTL is exactly its
//! own, set on each put).
//!
//! [`delete_stream`](EventStore::delete_stream) removes a stream's keys at
//! once and leaves its newest id in the `gone` key for an hour (see
//! [Layout](#layout)); [`RedisStore::destroy`] removes every key of the
//! prefix.
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
//! # Tasks
//!
//! [`RedisStore`] is also a
//! [`TaskStore`](mcp_event_store_core::task::TaskStore) (SEP-2663 durable
//! tasks), in a key family of its own, `t1`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>:t1:{<digest>}:task` | hash | `v`: the whole task in core's [`codec`](mcp_event_store_core::backend::task::codec) encoding (owner digest, instance, status, `rev`, times, ttl, poll interval, cancel flag, message, outcome, its inputs: outstanding requests, answered responses, spent keys, and the cancel reason (T20) if any: value format 2); `rev`: the task's revision in decimal; `c`, when the task has one: its context (T13), a field of its own so that a release from before contexts, which writes only `v` and `rev`, leaves it as it is; `s`, once a value of the task was swapped in place (see [Rewrites in place](#rewrites-in-place)): how many times |
//! | `<prefix>:t1:instance:{<instance id>}` | string | the instance's heartbeat deadline (store-clock ms) |
//! | `<prefix>:t1:changes` | pub/sub channel | the digest (hex) of each task that changed |
//! | `<prefix>:t1:takeover` | set | the digest (hex) of each task that may be taken over (T16): a claim's candidates |
//!
//! `<digest>` is the 32 hex digits of the task's digest
//! (`SHA-256("mcp-event-store/task\0" ‖ id)[..16]`): the id itself is
//! never stored, not even in a key name (T2), and the principal only as
//! its digest. The digest is the hash tag, so the id, which the client
//! chooses only among ids the store issued, picks no slot.
//!
//! **Takeover (T16 to T19).** A task that may be taken over keeps its
//! runs, claim epoch, release flag and checkpoint in `v` (an extension a
//! release from before takeover skips), and its digest in the
//! `t1:takeover` set, added before the task is created, so a crash in
//! between leaves an entry no task backs, which the next claim removes;
//! and added again after it, because a claim running meanwhile may have
//! read the entry before the task was written and removed it as one of
//! those (a claim that removes an entry also reads the task once more
//! and puts the entry back if the task is there).
//! A claim `SSCAN`s the set and claims each task that waits for a runtime
//! with the same conditional write as every step below, so of racing
//! claimants exactly one writes. A task leaves the set when it ends, when
//! it is deleted, or when a claim finds it gone. Each claim reads every
//! task still in the set, the running ones included (two round trips
//! each): claim every second or so, not in a tight loop.
//!
//! **One atomic step.** Every mutation (`answer`, `request_cancel`,
//! `apply`, a purge ending a task) reads the task (`HMGET v c s`) and its
//! instance's deadline (`GET`, a second command: the instance key lives in
//! another slot), lets the state machine every backend shares decide, and
//! writes with one Lua script that stores the new value only if the stored
//! `rev` (and swap stamp `s`) are still the ones read, sets the key's
//! backstop TTL and `PUBLISH`es the digest; if either moved, the step
//! reads again. `rev` only grows, so the compare-and-set cannot be fooled,
//! and of racing finishers exactly one writes (T4). `create` reads its instance's
//! deadline (`GET`) and refuses a lapsed instance
//! ([`Error::InstanceLapsed`](mcp_event_store_core::Error::InstanceLapsed)),
//! then runs one script that inserts only if the key is absent: two round
//! trips. A task's inputs live in its value, as in
//! sled, so one key is the whole task and the script touches one slot.
//!
//! **Durable before return.** A task call returns once the Redis primary
//! ran its script; with [`wait_replicas`](RedisOptions::wait_replicas) it
//! also waits, in the same round trip, for that many replicas, as appends
//! do. Without `appendonly yes` and `appendfsync always` (or `WAIT` and a
//! failover that promotes an up-to-date replica), an acknowledged create
//! can be lost, against SEP-2663's "durably created": see
//! [Durability](#durability), and [`check`](#inspecting), which warns.
//!
//! **Watch.** Each handle has one subscriber connection, opened by its
//! first `watch` and closed by [`RedisStore::close`] or the handle's drop,
//! subscribed to `<prefix>:t1:changes`; each message wakes that task's
//! watchers in the handle's wake-up hub, and a change through the handle
//! itself wakes them at once. A watch subscribes in the hub (and waits for
//! the subscriber to be subscribed) before its first read, so no change is
//! missed; it holds no connection while it waits. A wake-up only prompts a
//! re-read, and every [`follow_recheck`](RedisOptions::follow_recheck) a
//! watcher reads again anyway, covering messages lost while the subscriber
//! reconnected (it also wakes every watcher once it is subscribed again).
//! Expiry and orphaning wake no one (they are decided at read time, T8 and
//! T11). Measured on loopback (debug build, a loaded two-core machine, 800
//! changes through another handle, from the start of the change to the
//! watch's return, the change's own three round trips included): median
//! 1.1 to 1.2 ms, 95th percentile about 5 ms, at most 10 ms.
//!
//! **Expiry.** The store's clock judges, never Redis's: a task's expiry,
//! purge time and its instance's deadline are values in the task and the
//! instance key, compared with the store clock on every read (T8, T11). A
//! heartbeat of an instance whose deadline passed changes nothing and
//! returns `false`. Redis's own expiry is only a backstop for stores nobody
//! purges: a task key gets `PEXPIRE` of its purge time plus one day (from
//! its last write), an instance key of its lease plus the longest a task
//! lives and is kept (7 days and 1 hour by default) plus one day, so Redis
//! deletes nothing the store's clock still keeps, as long as that clock
//! runs with real time, and never forgets (and so lets revive) an instance
//! while a task that names it is kept.
//! [`TaskStore::purge_expired_tasks`](mcp_event_store_core::task::TaskStore::purge_expired_tasks)
//! `SCAN`s the task keys on every master in batches of 500 (bounded steps,
//! each task one read and at most one script), persists expired and
//! orphaned tasks as `failed`, deletes tasks past their grace (a script
//! that deletes only if `rev` did not move), then `SCAN`s the instance
//! keys and forgets lapsed instances.
//!
//! **Redis Cluster.** Every script touches one key, so nothing is ever
//! `CROSSSLOT`. A purge index (a sorted set by purge time) was not chosen:
//! in a cluster it would live in one slot, and no script could update it
//! together with a task in another, so it could drift; `SCAN` needs no
//! second structure to keep right, at the cost of a purge's time growing
//! with the number of tasks. `PUBLISH` reaches every node of a cluster, so
//! the subscriber connects to one node (the first seed that answers, the
//! next one after a connection is lost).
//!
//! **Format.** Tasks add keys and change no existing one: a release
//! without tasks never reads the `t1` family, and keeps serving its events
//! (no key of an event stream, session, marker or secret changes; tested).
//! [`FORMAT_VERSION`] is unchanged. A task value of a newer task format is
//! refused with
//! [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat),
//! changing nothing. [`RedisStore::destroy`] removes tasks with the rest.
//!
//! # Inspecting
//!
//! [`check`](EventStore::check) (C15, and `mcp-event-store check`) reports
//! the backend `redis`, the format version [`FORMAT_VERSION`], and these
//! settings, read with `CONFIG GET` from the server (on a cluster, from
//! every master), each `ok` or a warning with its remedy:
//!
//! * `appendonly`: `yes` is ok; `no` warns, since a restart or crash of
//!   Redis then loses acknowledged events and tasks.
//! * `appendfsync`: `always` is ok; `everysec` warns (an operating-system
//!   crash or power loss can lose about the last second of acknowledged
//!   events and task changes, see [Durability](#durability)), and so does
//!   `no`.
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
//!
//! # Format
//!
//! The layout is version [`FORMAT_VERSION`]: the `v1` in every data key's
//! name, and the marker `<prefix>:format` holding `1` (an unversioned name,
//! so a newer layout can refuse this one). The first store to connect
//! creates the marker and the secret with `SET NX`; every later one reads
//! them, so all instances derive the same tokens. A marker other than `1`
//! (a newer, incompatible layout) is refused with
//! [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat)
//! when connecting, and nothing under the prefix is changed. After the
//! server lost its data, the marker is put back with the secret (see
//! [Restart without persistence](#restart-without-persistence)).
//!
//! Redemption keys are a family of their own (`r1`), like the tasks':
//! releases from before them never touch them, and the format marker is
//! unchanged.
//!
//! The append script's cheaper hot path (fewer fields read, the TTL set
//! only when it ran low, see [Retention](#retention)) changed no key, field
//! or value: streams written before it open and append as they are, and
//! releases before it read what it writes, so the format is still `1`.
//!
//! # Limits
//!
//! * Stream ids of 1 to 1024 bytes and payloads up to the
//!   [`StoreOptions`](mcp_event_store_core::StoreOptions) maximum (8 MiB by
//!   default), as for every backend; Redis itself takes values up to its
//!   `proto-max-bulk-len` (512 MB by default).
//! * Key prefixes: 1 to 128 bytes of `[A-Za-z0-9._:/-]` (no hash tags, no
//!   glob characters).
//! * Redis [`MIN_REDIS_VERSION`] (6.2) or newer, standalone or Cluster;
//!   Cluster not over unix sockets.
//! * One append removes at most 256 entries by retention, one purge script
//!   call at most 1,000: more is left to later appends and purges, so no
//!   call stalls the server.
//! * Replies wait [`DEFAULT_RESPONSE_TIMEOUT`] (30 s) and connections
//!   [`DEFAULT_CONNECT_TIMEOUT`] (5 s) unless configured; an append that
//!   waits for replicas waits at most
//!   [`wait_timeout`](RedisOptions::wait_timeout).
//! * TTLs longer than about 35 years are not set on the keys (nothing would
//!   expire anyway).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod append;
mod conn;
mod error;
mod follow;
mod inspect;
mod keys;
mod options;
mod purge;
mod redeem;
mod replay;
mod rewrite;
mod scripts;
mod sessions;
mod setup;
mod state;
mod store;
mod tasks;
mod wire;

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "conformance")]
pub mod testing;

use std::sync::Arc;

#[cfg(doc)]
use mcp_event_store_core::EventStore;
use mcp_event_store_core::{Backend, Store};

pub use follow::WATCHER_CLIENT_NAME;
pub use keys::validate_prefix;
pub use options::{
    DEFAULT_CLUSTER_FOLLOW_POLL, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FOLLOW_RECHECK,
    DEFAULT_KEY_PREFIX, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_WAIT_TIMEOUT, DRIVER_URL_PARAMETERS,
    MIN_REDIS_VERSION, RedisOptions, URL_PARAMETERS, URL_SCHEMES,
};
pub use store::RedisStore;

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
    name: error::NAME,
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

/// The storage format this release reads and writes (the `<prefix>:format`
/// marker, and the `v1` in every data key).
pub const FORMAT_VERSION: u32 = 1;
