//! The [sled](https://docs.rs/sled/0.34.7) backend of **mcp-event-store**:
//! durable, bounded event storage for resumable MCP Streamable HTTP streams,
//! embedded in the server process. sled 0.34 is beta software, and a
//! database opens in one process at a time: read [Limits](#limits) before
//! choosing it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_sled::SledStore;
//!
//! # let dir = tempfile::tempdir().unwrap();
//! # let url = format!("sled://{}", dir.path().display());
//! // url = "sled:///var/lib/my-server/events"
//! let store = SledStore::connect(&url).await?;
//! let first = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
//! // `first` is durable: send it to the client as the SSE `id:`.
//! let next = store.store_event("session-1:common", NewEvent::new(b"[]")).await?;
//! let replay = store.replay_events_after(&first.to_string()).await?;
//! assert_eq!(replay.stream_id, "session-1:common");
//! store.close().await?;
//! # let _ = next;
//! # Ok(()) }
//! ```
//!
//! Feature `conformance` adds `testing::SledHarness`, the harness that runs
//! the shared conformance suite against this backend.
//!
//! # Connecting
//!
//! [`SledStore::connect`] opens the directory a URL names,
//! `sled:///absolute/dir` or `sled://relative/dir` (created if missing;
//! taken literally, no percent-decoding), with these parameters, joined by
//! `&` ([`SledOptions::from_url`]; an unknown one, one given twice, or both
//! durability parameters at once is [`Error::Config`] naming it):
//!
//! | parameter | sets | default |
//! |---|---|---|
//! | `durability=flush` | [`Durability::Flush`] | yes |
//! | `flush_interval_ms=N` | [`Durability::Interval`], 1 ms to one hour | |
//! | `follow_recheck_ms=N` | [`SledOptions::follow_recheck`], 1 ms to one hour | 5000 |
//!
//! [`SledStore::connect_with`] takes [`SledOptions`] too (retention and the
//! other shared [`StoreOptions`](mcp_event_store_core::StoreOptions), sled's
//! cache size); a parameter the URL gives wins. [`SledStore::open`] takes a
//! path and options, without a URL. The `mcp-event-store` facade opens
//! `sled://` URLs through [`BACKEND`] (feature `sled`).
//!
//! ## One process, many handles
//!
//! sled locks the database directory for the process that opens it.
//! Opening a directory another process holds fails at once with
//! [`Error::Backend`], saying so. Within one process, every
//! [`SledStore::open`] of the same directory (compared by canonical path)
//! shares one underlying `sled::Db`, found in a process-wide registry, so
//! handles see each other's events as soon as `store_event` returns (C11). [`SledStore::handle_with_options`] gives a
//! handle with other options directly. The database closes when the last
//! handle and replay stream are gone: dropping the last handle flushes and
//! closes on the dropping thread (briefly blocking it), so in async code
//! prefer [`SledStore::close`], which does that on the blocking pool.
//!
//! `close(&self)` closes a handle and its clones: afterwards every call
//! through them fails with [`Error::Closed`], and closing again does
//! nothing. It returns the final flush's error, if any, so a failed flush
//! of events acknowledged with [`Durability::Interval`] is never silent.
//!
//! ## Blocking
//!
//! Every sled call runs on tokio's blocking thread pool
//! (`spawn_blocking`), never on an executor worker: sled calls can block on
//! I/O (a page not in cache, a full log buffer). Measured here, a 200-byte
//! insert takes 1 us at the median but up to tens of milliseconds at worst
//! while a flush runs. The store therefore needs a tokio runtime; outside
//! one, calls fail with [`Error::Config`].
//!
//! # Layout
//!
//! A stream's events live in one tree under the key `token ++ seq`, both
//! big-endian (the 15-byte stream token from the contract's id scheme, and
//! the sequence number), so a replay is one ordered range scan, read a page
//! at a time, however many other streams the database holds: the cursor
//! check and the first page (at most 128 events, what most resumes miss) on
//! the calling task, where a short scan of sled's cache costs less than a
//! hop to the blocking pool; each later page on the blocking pool, read
//! ahead while the caller takes the one before. Each stream's
//! record (its incarnation, age and stream id), an age index, sessions and
//! a session expiry index are separate trees; the metadata tree keeps the
//! format version ([`FORMAT_VERSION`], checked on open) and the secret
//! stream key, generated once so ids stay valid across restarts.
//!
//! Writes are single-key operations ordered so that a crash between two of
//! them leaves only harmless leftovers. sled's batches and transactions are
//! avoided: in sled 0.34 they switch the whole process to a global lock that
//! every later operation, and every flush for its whole fsync, then takes.
//!
//! ## Tasks
//!
//! [`SledStore`] is also a [`TaskStore`] (SEP-2663 durable tasks), in three
//! trees of its own:
//!
//! | tree | key | value |
//! |---|---|---|
//! | `mcp-event-store/t1/tasks` | the task's 16-byte digest | the whole task: owner digest, instance, status, `rev`, times, ttl, poll interval, cancel flag, message, outcome, its inputs (outstanding requests, answered responses, spent keys), and the cancel reason (T20) if any |
//! | `mcp-event-store/t1/task_purge` | `purge_at ++ digest`, big-endian | empty |
//! | `mcp-event-store/t1/instances` | instance id | heartbeat deadline (ms) |
//!
//! A task is keyed by the digest of its id, never the id (T2), so a dump
//! of the database hands out no bearer token. The trees also hold no
//! principal, only its digest.
//!
//! **One atomic step.** Every mutation (`create`, `answer`,
//! `request_cancel`, `apply`, `heartbeat`, a purge ending or deleting a
//! task) is one `compare_and_swap` of the task's one key: the value is
//! read, the state machine every backend shares decides, and the new value
//! is swapped in only if the old value is still there (its `rev` and status
//! included), else the step runs again. It is atomic across handles and on
//! disk, and conditioned on status and `rev` (T4). This is why a task's
//! inputs live in its value and not in a `task_inputs` tree: a step over
//! two trees would need a sled transaction, which in sled 0.34 puts every
//! later call of the process, appends and flushes included, behind a global
//! lock (see above). The price: every change rewrites the task's inputs,
//! at most 64 outstanding requests of 1 MiB each, plus answers the worker
//! has not taken yet. The purge index entry is written before the task,
//! so a crash leaves at most a stale entry, which the purge drops.
//!
//! **Takeover (T16 to T19).** A task that may be taken over keeps its
//! runs, claim epoch, release flag and checkpoint in its value too (an
//! extension a release from before takeover skips). A claim scans the
//! task tree, decodes each value, and claims a task that waits for a
//! runtime with the same `compare_and_swap` as every step, so of racing
//! claimants exactly one swaps. The scan reads every task: fine for the
//! single-process database sled is, and a reason to claim every second or
//! so rather than in a tight loop.
//!
//! **Durable before return.** A task mutation returns once flushed under
//! the handle's durability, through the same group flusher as appends: with
//! [`Durability::Flush`] after the flush covering it, with
//! [`Durability::Interval`] at once, with the same loss window as events
//! (T1). Unlike events, tasks have no durable watermark: a `get` or `watch`
//! may see a change a few microseconds before its flush completes (and a
//! crash in between loses it, whose caller was never answered).
//!
//! **Watch.** After a change is flushed, it wakes the task's watchers
//! through the database's task wake-up hub, which every handle in the
//! process shares, as they share the followers' hub (T10): sled has one
//! process, so no listener or poll is needed. Task watchers are not
//! followers: [`EventStore::open_follows`] does not count them. A watcher holds a hub entry and a timer, no thread or
//! database reference; it re-reads on each wake-up and every
//! [`SledOptions::follow_recheck`]. Expiry and orphaning wake no one (they
//! are decided at read time, T8 and T11).
//!
//! **Purge.** [`TaskStore::purge_expired_tasks`] persists expired and
//! orphaned tasks as `failed` (walking the task tree 500 keys per blocking
//! call, so its cost follows the number of tasks), deletes tasks past their
//! grace through the `task_purge` index, 500 per blocking call, and then
//! forgets lapsed instances.
//!
//! ## Event ids
//!
//! An event's id is `v1.<token>.<incarnation>-<seq>` in hex (the
//! contract's [`EventId`] scheme, positions as in
//! [`mcp_event_store_core::backend::dense`]): `seq` numbers the stream's events 1, 2,
//! 3, ... and `incarnation` names one life of the stream. When a stream is
//! deleted, or expires whole, and an event is later appended under the same
//! stream id, it starts a new life at `seq` 1 under a new incarnation. No id
//! is ever issued twice in the lifetime of a database, whatever was purged
//! or deleted, and a cursor from an earlier life resumes nothing: replay
//! refuses it with [`Error::UnknownEventId`] (or [`Error::EventsPurged`] for
//! a replay under way when the life ended), and lookup finds nothing.
//!
//! Incarnations come from sled's id generator (`Db::generate_id`), one
//! counter for the whole database: monotonic across restarts and crashes
//! (after a crash it skips past every value it may have handed out
//! unflushed), under either durability setting, and without a flush of its
//! own. Nothing is kept per deleted stream. (Each open of a database that
//! was used before moves the generator on by two million, sled's
//! safety margin, so incarnations grow by that much per restart; a `u64`
//! does not run out.)
//!
//! ## Redemptions
//!
//! [`RedeemStore::redeem`](mcp_event_store_core::RedeemStore::redeem)
//! (C21) writes the record's expiry entry (`r1/redeem_expiry`:
//! `forget_at ++ digest`), then the record (`r1/redeemed`: the 32-byte
//! digest core computes, the principal's digest and the nonce, never the
//! nonce, to `forget_at`) by `compare_and_swap` from absent, which of racing
//! calls from any handle exactly one wins (a loser removes the expiry entry
//! it added, unless it is the winner's too); the winner waits for the flush
//! its handle's durability asks for before it answers. `forget_at` is the
//! nonce's expiry plus
//! [`REDEEM_GRACE`](mcp_event_store_core::REDEEM_GRACE). sled has no ttl:
//! `purge_expired` walks the expiry entries up to now and removes each
//! with its record (if the record still names that time), counted in
//! [`PurgeReport::redemptions`](mcp_event_store_core::PurgeReport::redemptions),
//! so the trees hold at most the redemptions of the last
//! [`MAX_REDEEM_HORIZON`](mcp_event_store_core::MAX_REDEEM_HORIZON) plus
//! the grace, and whatever the purge has not reached yet. Like the task
//! trees, they came without a new format version: releases from before
//! them never open them.
//!
//! ## Rewrites in place
//!
//! [`EventStore::rewriter`] (C22, what re-sealing a store under a new key
//! works on) lists sessions (the `s1.` keys of the session tree, in digest
//! order) and tasks (the task tree, in digest order) a bounded page at a
//! time, and swaps a value with one `compare_and_swap` of the key that
//! holds it, only over the bytes expected, changing nothing else in the
//! value: an event's payload behind its header (time, retry hint and
//! cumulative byte count kept, so byte counts and ages stay right; under
//! the stream's lock, for an event of the stream's current life only), a
//! session's state behind its expiry, one value inside a task's encoding
//! (its `rev`, status and claim kept). Every task step swaps over the
//! whole value it read, so a step that raced a swap reads again. A swap
//! returns once flushed under the handle's durability.
//!
//! # Durability
//!
//! [`Durability::Flush`] (the default): `store_event` returns only after the
//! event is flushed to disk (C1). One flush runs at a time. An append with
//! no other under way flushes itself on its blocking-pool thread, so a lone
//! writer pays what a raw insert and `flush()` cost; concurrent appends, and
//! those arriving during a flush, share the next flush, which one flusher
//! thread per database runs on behalf of everyone waiting (group flush), so
//! 32 concurrent writers cost about as many fsyncs as one. (Calling sled's
//! `flush_async` from many tasks instead deadlocks in 0.34.7 with eight or
//! more callers.)
//!
//! [`Durability::Interval`]: `store_event` returns once the event is written
//! to sled's in-memory log, and the flusher thread flushes at the given
//! interval. **Loss window:** on a crash (power loss, SIGKILL, panic=abort)
//! events acknowledged within the last interval, plus the time one flush
//! takes, may be lost. A clean close or drop flushes everything.
//!
//! ## Never reissuing an id after a crash
//!
//! The trap: sled makes a write visible to readers before it is on disk.
//! If a replay could hand out event 7 before it was flushed, and the process
//! then died, the restarted store would number its next event 7 again; the
//! client holding id 7 would resume *after* the new event 7 and silently
//! miss it.
//!
//! * With `Flush`, readers only see durable events. Each stream has a
//!   durable watermark in memory, moved (by whoever flushed) only after a
//!   flush covering the write succeeded; replays, lookups and cursor checks
//!   never look past it. Every id a client can ever hold, whether returned
//!   by `store_event` or read in a replay, is therefore on disk, and after a
//!   restart numbering resumes after it. (Events written but never
//!   acknowledged may or may not survive a crash; either way nobody saw
//!   their ids.) Sequence numbers are allocated under a per-stream lock in
//!   the one process that can open the database, and the watermark only
//!   moves forward over numbers already written, so no event ever appears
//!   behind a reader's cursor (C6).
//! * With `Interval`, acknowledged ids can be lost by design, so the store
//!   makes sure they are never reused instead. While a relaxed handle is
//!   open, a marker in the metadata says so; a clean close removes it. If
//!   the next open finds it, the previous process died with unflushed,
//!   acknowledged events, so each stream's next sequence numbers may have
//!   been handed out already. The open records an incarnation floor, above
//!   every incarnation issued so far, lost ones included; each stream below
//!   it ends its life at its next append (its events are dropped) and
//!   starts a new one. A client resuming from any id of the old life gets
//!   [`Error::UnknownEventId`] and starts over, instead of silently missing
//!   events. A stream created in the lost session is below the floor too if
//!   it reached the disk; if it did not, its next append starts a new life
//!   anyway, under an incarnation the id generator never handed out before.
//!
//! # Retention
//!
//! Count and byte limits are applied inline on every append (removing the
//! oldest events, never the newest). [`EventStore::purge_expired`] applies
//! the age limit by walking an index of streams ordered by their oldest
//! event, so its cost follows what expired, not the database size. It
//! re-applies the count and byte limits to every stream only when some
//! append trimmed with looser limits than the purging handle's (the loosest
//! limits ever used are kept in the metadata), and removes expired sessions
//! through an expiry index. All scans run in bounded batches.
//!
//! # Following
//!
//! [`EventStore::follow_events_after`] replays the events after a cursor,
//! then stays open and yields each event appended to that stream
//! afterwards, in order, each once (C13), until it is dropped, its
//! [`FollowOptions::max_hold`] passes, or an error ends it.
//!
//! **Wake-ups.** Every handle on one directory in this process shares one
//! wake-up hub ([`Wakeups`](mcp_event_store_core::backend::follow::Wakeups)), kept
//! with the shared database like its stream slots. sled lets one process
//! at a time open the directory, so every append any handle can see goes
//! through this process and this hub: there is no other process to hear
//! from, and no listener, thread or connection of any kind. An append wakes
//! its stream's followers right after it becomes visible to readers, never
//! before. A wake-up carries nothing: the follower re-reads by cursor.
//!
//! * With [`Durability::Flush`] that is after the flush covering the event
//!   succeeded, when whoever flushed moves the stream's durable watermark:
//!   a follower never gets an event that is not on disk. This follows the
//!   rule that makes replays safe (see "Never reissuing an id after a
//!   crash"): delivering on write would hand a client an id that a crash
//!   could reissue, and an event whose `store_event` could still fail. The
//!   wake-up comes just before the flusher answers the writer, so a
//!   follower may see an event a few microseconds before `store_event`
//!   returns, but never before it is durable, which is what returning
//!   means.
//! * With [`Durability::Interval`] that is right after the write, as
//!   `store_event` returns: followers get events as early as their writers
//!   are answered, with the same loss window.
//! * Deleting a stream, expiring it whole, or its new life after a lost
//!   relaxed session wakes its followers too: they end with
//!   [`Error::EventsPurged`], as a replay under way does, and never see the
//!   next life. Retention overtaking a slow follower also ends it with
//!   `EventsPurged`, after the events it could still deliver in order.
//!
//! **Latency.** The same through any handle, since the hub is shared:
//! measured here in a debug build on a loaded 2-core machine, from
//! `store_event` returning to the event reaching the follower, a median of
//! 55 to 105 us (the follower's task being scheduled and one read on the
//! blocking pool) and a p99 of about 1 to 3 ms (`cargo test -p
//! mcp-event-store-sled --test sled -- --ignored --nocapture figures`).
//!
//! **What an idle follower costs.** No task, thread, connection or
//! listener: its own stream (polled by whoever consumes it), a receiver in
//! the hub (one entry per followed stream, removed with its last
//! follower), a reference to its stream's in-memory state, and a timer for
//! the re-check while it is polled; about 0.9 KB of memory each (10,000
//! idle followers, measured as above). An append costs one more lock and
//! hash lookup for the wake-up; 1,000 idle followers of other streams
//! made no measurable difference to the append rate. A wake-up or re-check
//! that finds nothing new costs an atomic load, with no blocking call.
//! [`EventStore::open_follows`] counts every follower on the database in
//! this process, whichever handle opened it.
//!
//! An idle follower holds the database only weakly: closing or dropping the
//! last handle still closes the database (and unlocks the directory), and
//! its followers end at once with [`Error::Closed`]. A follow still
//! delivering stored events keeps it open until it has read them, as a
//! replay does.
//!
//! **Re-check.** Correctness never depends on a wake-up: a follower also
//! re-reads every [`SledOptions::follow_recheck`] (default
//! [`DEFAULT_FOLLOW_RECHECK`], 5 s; URL parameter `follow_recheck_ms=N`,
//! from 1 ms to one hour). Since every append wakes its followers, this is
//! only a safety net; it is each handle's own, and applies to the follows
//! opened through it.
//!
//! # Inspecting
//!
//! [`EventStore::check`] touches the database (it reads the format version
//! recorded there) and reports backend `sled`, that format version
//! ([`FORMAT_VERSION`]), and three settings, each `ok` or a warning with
//! its remedy:
//!
//! | setting | value | warns when |
//! |---|---|---|
//! | `durability` | this handle's: `flush` or `flush_interval_ms=N` | an interval: a crash loses the events acknowledged in the last interval |
//! | `database_durability` | `flush`, or the shortest `flush_interval_ms=N` of any handle that used the database since this process opened it | an interval: after a crash every stream drops its events at its next append, whichever handle acknowledged them (see "Never reissuing an id after a crash"); it clears once the database is closed and reopened by `flush` handles only |
//! | `retention` | this handle's `max_age`, `max_events_per_stream` and `max_bytes_per_stream` (`none` when unset) | no `max_age`: nothing ever removes a stream, so the database grows with every new stream (the per-stream limits bound each stream, not how many there are) |
//!
//! sled has no settings of its own that weaken durability: when data
//! reaches the disk is this crate's choice, the `durability` above.
//!
//! [`EventStore::stats`] and [`EventStore::list_streams`] never read a
//! stream's events one by one: a stream's count, bytes and ages come from
//! its first and last retained events (sequence numbers are dense and every
//! event carries the stream's cumulative byte count), the same two reads
//! that load its in-memory state. Both walk the stream records in batches
//! of 256, so their memory stays bounded however many streams there are
//! (and a listing page's by its limit), and count only what a replay can
//! see: an append still waiting for its flush is not counted yet. Listings
//! come in stream token order (a keyed hash of the stream id: stable, not
//! alphabetical); the cursor is the last listed stream's token.
//!
//! Metrics: besides what every backend reports, each group flush records in
//! `mcp_event_store_append_batch_size` how many appends it made durable
//! together. Appends of interval handles wait for no flush and record no
//! batch.
//!
//! # Format
//!
//! The metadata tree records the storage format ([`FORMAT_VERSION`], now
//! 2) and the release that created the database. Every open checks it: a
//! database of a newer format is refused with [`Error::IncompatibleFormat`]
//! naming its format and that release, and changes nothing; a sled database
//! this crate did not write (a wrong path) is refused the same way, and
//! never gets this crate's trees written into it. Only an empty directory
//! or database becomes a new event store.
//!
//! Tasks did not change the format version: they live in trees of their
//! own (see "Tasks") that a release without tasks never opens, and that
//! release accepts a database holding them and keeps serving its events.
//! The metadata records the task format separately (`task_format`, now 1),
//! and an open refuses a database of a newer task format with
//! [`Error::IncompatibleFormat`], changing nothing.
//!
//! A task's context (T13) did not change the task format either: it rides
//! in the extension bytes of core's task encoding, which the first release
//! with tasks reserved and skips when reading. Such a release (run on the
//! database after this one: sled is one process at a time) reads every
//! task, and writes back without its context a task it rewrites (a purge
//! ending an expired or orphaned one); a runtime that needs the context
//! then no longer finds it (tower-mcp's adapter reads such a task as
//! unknown).
//!
//! The format is this crate's layout on top of sled's own on-disk format,
//! which sled 0.34 does not promise to keep (see [Limits](#limits)).
//!
//! ## Upgrading from format 1
//!
//! Format 2 (this release) added the incarnation. The first open of a
//! database written by the previous release (format 1) migrates it: each
//! stream record gets an incarnation (one read of the record and one key
//! read per stream; events, indexes and sessions are kept as they are), and
//! then the format version changes. A crash part way repeats the migration
//! at the next open.
//!
//! Every stream keeps its events and goes on in the same life, under one
//! incarnation above every sequence number format 1 issued, so within a
//! stream the new ids sort after the old ones, and a stream format 1
//! deleted starts again with ids after any it ever had. Ids that release
//! issued (`v1.<token>.<seq>`) still resume and look up their events, which
//! come back under ids of this format. (A stream that format 1 would have
//! jumped to a new era at its next append, after a lost relaxed session,
//! starts a new life then instead.) There is no way back: the previous
//! release refuses a format 2 database, as this one refuses a newer format,
//! with [`Error::IncompatibleFormat`].
//!

//!
//! # Limits
//!
//! * Payloads up to [`StoreOptions::max_payload_bytes`](mcp_event_store_core::StoreOptions::max_payload_bytes)
//!   (8 MiB by default), stream and session ids of 1 to 1024 bytes, as for
//!   every backend; beyond, [`Error::PayloadTooLarge`] or an invalid-id
//!   error.
//! * One process per database directory (sled's lock; see "One process,
//!   many handles"). This also holds for tasks: a task is shared by every
//!   handle in the process, never by two server processes, so two
//!   instances of a server cannot share sled tasks (T9); use PostgreSQL or
//!   Redis for that.
//! * The flush interval and the follow re-check interval are 1 ms to one
//!   hour ([`MAX_FLUSH_INTERVAL`], [`MAX_FOLLOW_RECHECK`]).
//! * sled's page cache is [`DEFAULT_CACHE_CAPACITY`] (256 MiB) unless
//!   [`SledOptions::cache_capacity`] says otherwise; it is set by the first
//!   open of the database in the process.
//!
//! ## Is sled the right choice?
//!
//! sled 0.34 is **beta** software, and its own README says "if reliability
//! is your primary constraint, use SQLite". Its on-disk format is not
//! promised to stay readable (sled 1.0, still in alpha, is a rewrite with a
//! new format), it trades memory and disk space for speed, and a database
//! can be opened by **one process at a time**. This crate pins the stable
//! 0.34.7 line. Choose it when you want
//! a pure-Rust store without a C toolchain and fast replays (a replay is a
//! range scan over memory-resident pages). For most embedded deployments
//! SQLite (`mcp-event-store-sqlite`) is the safer choice: a file format
//! stable for decades, several processes on one file, and mature tooling.
//! To share events between server instances, use PostgreSQL or Redis.
//!
//! [`Error::Backend`]: mcp_event_store_core::Error::Backend
//! [`Error::Closed`]: mcp_event_store_core::Error::Closed
//! [`Error::Config`]: mcp_event_store_core::Error::Config
//! [`Error::EventsPurged`]: mcp_event_store_core::Error::EventsPurged
//! [`Error::IncompatibleFormat`]: mcp_event_store_core::Error::IncompatibleFormat
//! [`Error::PayloadTooLarge`]: mcp_event_store_core::Error::PayloadTooLarge
//! [`Error::UnknownEventId`]: mcp_event_store_core::Error::UnknownEventId
//! [`EventId`]: mcp_event_store_core::EventId
//! [`TaskStore`]: mcp_event_store_core::task::TaskStore
//! [`TaskStore::purge_expired_tasks`]: mcp_event_store_core::task::TaskStore::purge_expired_tasks
//! [`EventStore::check`]: mcp_event_store_core::EventStore::check
//! [`EventStore::follow_events_after`]: mcp_event_store_core::EventStore::follow_events_after
//! [`EventStore::list_streams`]: mcp_event_store_core::EventStore::list_streams
//! [`EventStore::open_follows`]: mcp_event_store_core::EventStore::open_follows
//! [`EventStore::purge_expired`]: mcp_event_store_core::EventStore::purge_expired
//! [`EventStore::rewriter`]: mcp_event_store_core::EventStore::rewriter
//! [`EventStore::stats`]: mcp_event_store_core::EventStore::stats
//! [`FollowOptions::max_hold`]: mcp_event_store_core::FollowOptions::max_hold
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod append;
mod error;
mod flusher;
mod follow;
mod inspect;
mod keys;
mod options;
mod purge;
mod redeem;
mod replay;
mod rewrite;
mod sessions;
mod setup;
mod shared;
mod slot;
mod state;
mod store;
mod tasks;
#[cfg(test)]
mod test_support;

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "conformance")]
pub mod testing;

use std::sync::Arc;

use mcp_event_store_core::{Backend, Store};

pub use crate::options::{
    DEFAULT_CACHE_CAPACITY, DEFAULT_FOLLOW_RECHECK, Durability, MAX_FLUSH_INTERVAL,
    MAX_FOLLOW_RECHECK, SledOptions,
};
pub use crate::store::SledStore;

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// scheme `sled`, facade feature `sled`. Its `connect` reads the URL with
/// [`SledStore::connect_with`] (the directory, `durability`,
/// `flush_interval_ms` and `follow_recheck_ms`) and applies the shared
/// [`StoreOptions`](mcp_event_store_core::StoreOptions).
///
/// ```
/// assert!(mcp_event_store_sled::BACKEND.opens("sled:///var/lib/app/events"));
/// ```
pub const BACKEND: Backend = Backend {
    name: error::NAME,
    schemes: &["sled"],
    feature: "sled",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = SledOptions::default().store(options);
            Ok(Arc::new(SledStore::connect_with(&url, options).await?) as Arc<dyn Store>)
        })
    },
};

/// The storage format this release writes and reads (C12).
///
/// * 1: the first format. A stream that was deleted or expired whole and
///   then written again numbered its events from 1 again, reissuing ids.
/// * 2: every stream record carries an incarnation, and ids are
///   `<incarnation>-<seq>`. Opening a format 1 database migrates it once
///   (see the crate docs); a database of a newer format is refused.
pub const FORMAT_VERSION: u32 = 2;
