//! The PostgreSQL backend of **mcp-event-store**: durable, shared event
//! storage for resumable MCP Streamable HTTP streams, on sqlx.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use futures_util::TryStreamExt;
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_postgres::{PostgresOptions, PostgresStore};
//!
//! let store = PostgresStore::connect_with(
//!     "postgres://app@db.internal/app",
//!     PostgresOptions::default().schema("mcp_events").max_connections(20),
//! )
//! .await?;
//! let first = store.store_event("request-1", NewEvent::new(b"one")).await?;
//! store.store_event("request-1", NewEvent::new(b"two")).await?;
//! let missed: Vec<_> = store.replay_events_after(&first.to_string()).await?
//!     .events.try_collect().await?;
//! assert_eq!(missed.len(), 1);
//! # Ok(()) }
//! ```
//!
//! # Connecting
//!
//! [`PostgresStore::connect`]`(url)` takes the URL's location and
//! parameters and defaults for the rest; [`PostgresStore::connect_with`]`(url,
//! options)` takes [`PostgresOptions`] for everything the URL does not say: a
//! parameter the URL gives wins. This is what the `mcp-event-store` facade's
//! `connect` calls ([`BACKEND`]). [`PostgresStore::from_pool`] opens a store
//! on a pool of the application's own.
//!
//! The URL is anything sqlx's `PgConnectOptions` parses, plus this crate's
//! own parameters, which are taken out before sqlx sees it:
//!
//! | URL parameter | option | default |
//! |---|---|---|
//! | `schema=name` | [`PostgresOptions::schema`] | `mcp_event_store` |
//! | `vacuum=off\|auto` | [`PostgresOptions::vacuum`] (see "Retention") | `off` |
//! | `follow_recheck_ms=N` | [`PostgresOptions::follow_recheck`] (see "Following") | 5000 |
//! | `application_name=name` | [`PostgresOptions::application_name`] (also the driver's) | `mcp-event-store` |
//!
//! e.g. `postgres://app@db.internal/app?schema=mcp_events&vacuum=auto&sslmode=require`.
//! The driver's own parameters (`sslmode`, `sslrootcert`, `host`, `port`,
//! `options`, ...) go to sqlx; [`PostgresOptions::from_url`] lists them. An
//! unknown parameter, or one given twice, is
//! [`Error::Config`](mcp_event_store_core::Error::Config) naming it; so are
//! options [`PostgresOptions::validate`] refuses.
//!
//! Opening creates and migrates the schema (see "Format") on a connection of
//! its own, then reads the schema's stream key; any number of handles and
//! processes may open one schema at once. [`PostgresStore::close`] stops the
//! handle's follow listener and closes its pool; calls after it fail with
//! [`Error::Closed`](mcp_event_store_core::Error::Closed).
//!
//! ## Connections and errors
//!
//! Driver errors become `Error::Backend { backend: "postgres", source }` with
//! the sqlx error as the source. The pool does not ping before each acquire
//! (a round trip that cost 7% of append throughput); after a server restart
//! or `pg_terminate_backend`, each dead idle connection fails one call and
//! is replaced, and the store carries on by itself. Following adds one
//! connection outside the pool per handle that follows (see "Following").
//! TLS: enable one of
//! sqlx's `tls-*` features in your own `Cargo.toml`; Cargo's feature
//! unification turns it on for this crate's sqlx too.
//!
//! # Layout
//!
//! Everything lives in one schema (default `mcp_event_store`, see
//! [`PostgresOptions::schema`]), created and migrated on connect by the
//! embedded migrations unless [`PostgresOptions::run_migrations`] is off.
//! The name must match `^[a-z_][a-z0-9_]{0,62}$` and is quoted into the
//! statements once, when the store opens; every statement is
//! schema-qualified, so pooled connections need no `search_path` (and
//! [`PostgresStore::from_pool`] works on any pool).
//!
//! ## Tables
//!
//! | table | key | holds |
//! |---|---|---|
//! | `meta` | `key` | `stream_key`: the 32-byte secret keying stream tokens |
//! | `streams` | `token` (15 bytes) | `stream_id`, `incarnation`, `first_seq`, `last_seq`, `clean_seq`, `total_bytes`, `last_stored_at` |
//! | `events` | `(token, seq)` | `stored_at`, `cum_bytes`, `retry_ms`, `data` (BYTEA) |
//! | `sessions` | `session_id` | `state` (BYTEA), `expires_at` (indexed) |
//! | `incarnations` | (a sequence) | the next stream incarnation |
//! | `_sqlx_migrations` | `version` | the format history (C12) |
//! | `tasks`, `task_inputs`, `instances` | see [Tasks](#tasks) | durable tasks |
//! | `_mes_task_migrations` | `version` | the task format history (see "Format") |
//! | `_mes_task_context_migrations` | `version` | the task context history (see "Format") |
//!
//! Stream and session ids are stored as **BYTEA** (their UTF-8 bytes), not
//! TEXT: PostgreSQL text cannot hold a NUL byte, and the contract allows any
//! UTF-8 (C9), so a stream id like `"a\0b"` works here exactly as on every
//! other backend. In `psql`, `convert_from(stream_id, 'UTF8')` shows them.
//!
//! ## Event ids
//!
//! Event ids are `v1.<token>.<incarnation>-<seq>` (hex numbers): the token
//! is the HMAC of the stream id under the schema's stream key (inserted with
//! `ON CONFLICT DO NOTHING` and read back, so every instance derives the same
//! tokens), `seq` the dense per-stream sequence number 1, 2, 3, ..., and
//! `incarnation` names the life of the stream (see
//! `mcp_event_store_core::backend::dense`).
//!
//! A stream row takes its incarnation from the `incarnations` sequence when
//! the row is created. `delete_stream`, and a purge that expires a stream
//! whole, first *empty* its row (readers see the stream gone at once), then
//! delete its event rows in batches, and only then remove the row. An
//! append that arrives in between continues the same incarnation (its ids
//! still increase); an append after the row is gone creates it afresh with
//! a new incarnation, larger than every earlier one, since a sequence never
//! hands a value out twice and, with its cache of 1, hands them out in
//! increasing order to every connection. So no event id is ever issued twice (C2), and an id from an
//! earlier life of a stream is unknown to its new life: replay refuses it
//! with `UnknownEventId`, lookup answers `None`, and a replay that was
//! paging through the old life when the stream was started again ends with
//! `EventsPurged`, never with events of the new life (C5). The store keeps
//! one sequence for this, not a tombstone per deleted stream.
//!
//! ## Replay
//!
//! One statement per page: the events after the cursor by keyset over the
//! `(token, seq)` primary key, plus the stream's row (its incarnation among
//! them), in one snapshot; so a page costs O(log n + k) whatever else the
//! store holds. The first page comes with the cursor check (one round trip
//! for a short replay). Pages hold at most [`MAX_PAGE_SIZE`] events, because
//! PostgreSQL 15 answers a larger `LIMIT` with a parallel sequential scan
//! and a sort. The statement passes its inputs through sub-selects so that
//! PostgreSQL keeps its cached generic plan instead of planning every call
//! afresh. The cursor is checked with `dense::check_cursor` against the
//! row's incarnation and sequence numbers (a zero part, another
//! incarnation, or a sequence number beyond the newest is
//! `UnknownEventId`), and every page with `dense::check_page`, so a replay
//! never has a silent gap (C5). Lookups check the id against the same row
//! with `DenseStream::retains`.
//!
//! ## Tasks
//!
//! The store is also a
//! [`TaskStore`](mcp_event_store_core::task::TaskStore) (SEP-2663 durable
//! tasks), in three tables:
//!
//! * `tasks`: one row per task, keyed by the 16-byte digest of its id (the
//!   id itself is never stored, so a dump hands out no bearer token), with
//!   the owner's digest (empty for anonymous), `status` (INT2, 0 to 4;
//!   running is `status < 2`), `rev`, the message, the times, ttl and poll
//!   interval, the cancel flag, the instance that last worked on it, the
//!   outcome (BYTEA) and the context (BYTEA, T13: what the runtime keeps
//!   to run the task again). Indexed on `purge_at`, and on `instance` for
//!   running tasks only.
//! * `task_inputs`: one row per input key a task used (`key` BYTEA, `seq`,
//!   `state` 0 outstanding, 1 answered, 2 spent, the request and the
//!   response), primary key `(digest, key)`, kept until the task goes so a
//!   key is never usable twice, and deleted with it (`ON DELETE CASCADE`).
//! * `instances`: each runtime instance's heartbeat deadline.
//!
//! Keys and status messages are BYTEA for the same reason stream ids are:
//! text cannot hold NUL.
//!
//! Takeover (T16 to T19) adds to `tasks` the runs allowed (`max_attempts`,
//! NULL for a task that dies with its instance), the runs whose instance
//! lapsed (`lapses`), the claim's `epoch`, `released` and the
//! `checkpoint` (BYTEA), with a partial index on the tasks that may wait
//! for a claim; its migration is recorded in
//! `_mes_task_takeover_migrations`, so a release from before it still
//! opens the schema. Cancel reasons (T20) add the `cancel_reason` column
//! (BYTEA, as the message) the same way, recorded in
//! `_mes_task_cancel_reason_migrations`. A claim is one transaction: it selects the tasks that
//! wait for a runtime `FOR UPDATE SKIP LOCKED` (a task another claimant
//! holds locked is left to it, and no two claimants wait on each other),
//! decides each with the shared state machine, and writes it back as every
//! step does.
//!
//! **One atomic step per mutation.** `answer`, `request_cancel`, `apply`
//! and `delete` each run one transaction on a pooled connection: one
//! statement locks the task row (`SELECT … FOR UPDATE`), the next reads it
//! with its inputs and its instance's deadline (a statement of its own, so
//! that it sees the inputs every step it waited for wrote: the sub-selects
//! of a locking read keep the snapshot from before its wait); the state
//! machine every backend
//! shares decides in Rust (`TaskRecord::seen_at`, then `answer`,
//! `request_cancel` or `apply`); the row is written back with
//! `UPDATE … WHERE digest = $n AND rev = $m` (the `rev` just read), with
//! the input rows the machine names. The row lock serializes racing steps
//! on one task across handles and processes (T4); steps on different tasks
//! never wait for each other. This was chosen over one CTE per operation
//! so that the state machine is written once, in core, and not again in
//! SQL. `create` (`INSERT … ON CONFLICT DO NOTHING`) and `heartbeat`
//! (an upsert that refuses to revive a lapsed instance) are single
//! statements. Every call returns after its commit, so a task is durable
//! (under the server's `synchronous_commit`) and visible to every handle
//! once `create` returns (T1, T9).
//!
//! **What a mutation costs.** A step that changes a task writes its row and
//! queues its notification in one statement (a CTE around the `UPDATE`
//! whose `SELECT pg_notify(…)` runs only for the row it wrote). An `apply`
//! without input rows (a message, a status, a finish with nothing
//! outstanding) is then five round trips: `BEGIN`, the lock, the read, the
//! write with its notification, `COMMIT`. An input request, taking an answer or
//! superseding inputs adds one statement; `answer` and `request_cancel`
//! add their input statements and one read of the task as stored, which
//! they return. A step that changes nothing (a refusal, a terminal task)
//! is `BEGIN`, the read and `COMMIT`. `create`, `heartbeat`, `get` and
//! each re-read of a `watch` are one round trip. The explicit transaction
//! stays: the state machine decides in Rust between the locking read and
//! the write, so the read and the write cannot be one statement without
//! writing the machine again in SQL, and dropping the lock for an
//! optimistic `UPDATE … WHERE rev` with retries would change how racing
//! steps behave under contention. Sequential `apply(SetMessage)` on one
//! task over loopback ran at about 1,100 ops/s before and after the
//! change (the commit's WAL flush dominates there; the saved round trip
//! matters on a network).
//!
//! Expiry and lost instances are decided when a task is read; only a
//! purge writes them down:
//! [`TaskStore::purge_expired_tasks`](mcp_event_store_core::task::TaskStore::purge_expired_tasks)
//! persists them and deletes tasks past their grace with their inputs, in
//! steps of at most 500 tasks, one transaction each. Lifetimes come from
//! [`StoreOptions::tasks`](mcp_event_store_core::StoreOptions::tasks). `purge_expired` (events and sessions) leaves
//! tasks alone.
//!
//! **Watching.** `get` and `watch` read a task with one statement (one
//! snapshot: the row, its inputs and its instance's deadline). A mutation
//! that changed a task also runs `pg_notify(<channel>, 't' || <the first
//! 15 bytes of its digest in hex>)` inside its transaction, which
//! PostgreSQL delivers at the commit (never for a step that rolled back),
//! on the store's channel (see "Following"). The handle's one listening
//! connection, the one its follows use, wakes its watchers of that task,
//! which re-read it; the handle's own mutations wake its watchers right
//! after the commit. A watch opens the listener if the handle has none
//! yet, and re-reads every [`PostgresOptions::follow_recheck`] should a
//! notification be lost. An idle watch holds no connection: a registration
//! in the handle's hub (a test holds 1,000 of them on a pool of 4 and counts
//! the connections in `pg_stat_activity`). Measured through another handle
//! on a local server, a watch returns a median 2.5 ms (p95 4.1 ms, at most
//! 9 ms in 300 changes) after the change began, 0.3 ms after it returned. Releases from before tasks
//! ignore the `t` payloads (they are not a stream token).
//!
//! ## Redemptions
//!
//! [`RedeemStore::redeem`](mcp_event_store_core::RedeemStore::redeem)
//! (C21) is one `INSERT INTO <schema>.redeemed (key, forget_at) ... ON
//! CONFLICT (key) DO NOTHING`, committed before the answer (one round
//! trip): the primary key orders racing inserts from every handle and
//! process, so exactly one inserts the row. The key is the 32-byte digest
//! core computes (the principal's digest and the nonce, never the nonce);
//! `forget_at` is the nonce's expiry plus
//! [`REDEEM_GRACE`](mcp_event_store_core::REDEEM_GRACE). PostgreSQL has no
//! ttl per row: [`EventStore::purge_expired`](mcp_event_store_core::EventStore::purge_expired)
//! deletes the rows past `forget_at` in batches on its index (`FOR UPDATE
//! SKIP LOCKED`, as for sessions), counted in
//! [`PurgeReport::redemptions`](mcp_event_store_core::PurgeReport::redemptions),
//! so the table holds at most the redemptions of the last
//! [`MAX_REDEEM_HORIZON`](mcp_event_store_core::MAX_REDEEM_HORIZON) plus
//! the grace, and whatever the purge has not reached yet.
//!
//! ## Rewrites in place
//!
//! [`EventStore::rewriter`](mcp_event_store_core::EventStore::rewriter)
//! (C22, for re-sealing the schema under a new key while servers run)
//! lists events, sessions and tasks with their values as the tables hold
//! them, one statement per page, and swaps a value with one conditional
//! `UPDATE` (`... SET data = <new> WHERE token = <token> AND seq = <seq>
//! AND data = <expected>`, for an event retained in the stream's current
//! incarnation only; the same for a session's state, a task's context,
//! outcome or checkpoint, an input's request or response, which first
//! takes its task's row lock as every task step does). A value written
//! since it was read is left alone. Only that column changes: no `rev`, expiry,
//! time or byte count moves (the new bytes have the old length). Each swap
//! leaves a dead tuple, as a delete does: with autovacuum off, `VACUUM`
//! the store's tables (tasks included) after a rewrite (see "Disk space and
//! autovacuum").
//!
//! # Durability
//!
//! `store_event` is one statement, one round trip: a CTE that upserts the
//! stream row (`INSERT .. ON CONFLICT (token) DO UPDATE SET last_seq =
//! last_seq + 1 .. RETURNING incarnation, last_seq`, a new row drawing its
//! incarnation with `nextval` in the same statement) and inserts the event
//! with that sequence number. It returns once the transaction has
//! committed, so under the server's default `synchronous_commit = on` the
//! event is durable (C1);
//! a server or role configured with `synchronous_commit = off` trades that
//! away, and the store does not override it.
//!
//! An append that fails with a connection error may or may not have
//! committed: retrying it can store the event twice (under a new id).
//!
//! ## Batching
//!
//! Under concurrency, appends are batched: while appends are in flight, new
//! ones queue, and a batcher sends everything queued (at most one event per
//! stream, up to 64 events) as one statement, the same upsert and insert
//! applied to every row of an `unnest`ed input, so many streams share one
//! commit and one WAL flush. One batch runs at a time, the next one filling
//! meanwhile; more (up to four) start beside it only when a full batch is
//! waiting or the running one is slow. A lone append never waits for a
//! batch, and runs the statement written for one event (plain parameters,
//! no `unnest`), which costs the server less. A batch that fails is retried one event at a
//! time, so every caller gets its own answer, and a token collision fails
//! only its own event.
//!
//! ## Ordering (C6)
//!
//! The upsert takes the stream row's lock and keeps it until
//! commit, so writers of one stream, in any process, are serialized from the
//! moment they draw a sequence number until they commit. Writer *n + 1*
//! can only draw `seq + 1` after writer *n* committed `seq`, hence per-stream
//! sequence order **is** commit order, and a reader that has seen event `k`
//! has already been able to see every event before it: nothing can appear
//! behind its cursor. A global `BIGSERIAL` read as `id > cursor` would not
//! give this (sequence values are drawn before commit, and transactions
//! commit out of order), which is why there is none. Different streams
//! never wait for each other.
//!
//! ## Lock order
//!
//! Every statement that locks several stream rows locks them in
//! token order. A batch inserts its rows sorted by token; the purge's trim
//! and its removal of empty streams lock their rows first with `SELECT ..
//! ORDER BY token FOR UPDATE` (PostgreSQL sorts, then locks). Each event-row
//! deletion sits in the statement that locked its stream's row, after it.
//! `delete_stream` locks one row at a time, and the purge of expired
//! sessions skips rows another transaction holds (`FOR UPDATE SKIP
//! LOCKED`). So appends, purges and deletions from any number of handles
//! never deadlock (an `UPDATE .. FROM` alone locks in join order, and
//! purges under a multi-stream append load used to be aborted with SQLSTATE
//! 40P01).
//!
//! # Retention
//!
//! [`EventStore::purge_expired`](mcp_event_store_core::EventStore::purge_expired)
//! walks the streams in token order, [`BATCH`] streams per planning query,
//! finds for each the first event to keep (by age, count and bytes, each an
//! index probe), and then raises `first_seq` and deletes the rows below it
//! in statements of at most [`BATCH`] rows, so no statement holds locks for
//! long (and takes them in token order, see "Lock order" under "Durability"). Streams left
//! empty are dropped; expired sessions go in batches too. The report counts
//! rows physically deleted, including those the count and byte limits had
//! already hidden at append time. Run it on an interval with
//! `mcp_event_store_core::PurgeTask`.
//!
//! At high volume (tens of millions of events a day), row-by-row deletes
//! and the vacuum work they cause dominate. The way to scale is to make
//! expiry by age a matter of dropping partitions: partition `events` by
//! `stored_at` (declarative range partitioning, e.g. hourly, managed by
//! `pg_partman` or a cron job) with the same primary key within each
//! partition, and drop partitions older than `max_age`; keep the count and
//! byte limits for the few streams that outgrow them.
//!
//! ## At append
//!
//! The append statement applies the count and byte limits *logically*: it
//! moves `first_seq` past the events they drop, so readers stop seeing them
//! at once, and leaves the rows to `purge_expired`.
//!
//! ## Disk space and autovacuum
//!
//! A deleted row's space is only reused once `VACUUM` has marked it free.
//! Until then every new event goes at the end of the table, so a store
//! whose tables are never vacuumed grows with every event ever appended,
//! however few it retains. Measured on PostgreSQL 15 with autovacuum off
//! (`examples/vacuum.rs`): 100,000 appends over 100 streams keeping 10
//! events each, purged every 1,000 appends, grew the events table with its
//! index in a straight line to 13.9 MiB; under [`Vacuum::Auto`] it stayed
//! at 0.3 MiB from the first purges on.
//!
//! Autovacuum does this by default. On connect, the store warns (a
//! `tracing` warning, once per connect) when it cannot: the server runs
//! with `autovacuum = off` or `track_counts = off`, or one of the store's
//! tables (or its TOAST table) has `autovacuum_enabled = false`; the
//! warning names the setting and the statement that changes it. Remedies,
//! best first:
//!
//! 1. Turn autovacuum on (`ALTER SYSTEM SET autovacuum = on; SELECT
//!    pg_reload_conf();`, and `track_counts` likewise), or `ALTER TABLE
//!    <schema>.events RESET (autovacuum_enabled)` for a table turned off.
//!    Where it lags behind a busy store, vacuum `events` sooner:
//!    `ALTER TABLE <schema>.events SET (autovacuum_vacuum_scale_factor =
//!    0.01)`.
//! 2. Open the store with [`Vacuum::Auto`] (`?vacuum=auto`): after a purge,
//!    once the handle's purges have deleted at least [`VACUUM_MIN_ROWS`]
//!    rows and a fifth of the rows the tables held when last counted,
//!    `purge_expired` runs `VACUUM (SKIP_LOCKED, TRUNCATE false)` on the
//!    store's three tables. Plain `VACUUM` (never `FULL`) takes a lock that
//!    only other vacuums and schema changes wait for, so appends and
//!    replays carry on meanwhile; `TRUNCATE false` keeps it from taking the
//!    brief exclusive lock that returning the table's empty tail to the
//!    operating system needs (the pages stay, free for new rows); a table
//!    another vacuum is busy with is skipped. The store's role must own the
//!    tables (it does when it ran the migrations). Run `purge_expired` on
//!    an interval, as with any retention. The vacuum does cost I/O and CPU:
//!    measured here (2 shared cores), 32 appenders ran at 60 to 100% of
//!    their rate while a vacuum of a 2-million-row table with half its rows
//!    dead took 3.5 to 6.3 s, and never stopped.
//! 3. `VACUUM` the store's tables on a schedule of your own.
//!
//! A table that already grew keeps its size (its free pages are reused);
//! `VACUUM FULL` or `pg_repack` gives the space back, with the locks they
//! take.
//!
//! # Following
//!
//! [`follow_events_after`](mcp_event_store_core::EventStore::follow_events_after)
//! replays after the cursor, then waits for wake-ups and re-reads the
//! stream by cursor after each one (the same page statement as a replay),
//! so events come in order, each once, with no gap at the seam (C13).
//! Wake-ups only prompt that re-read; no event travels in them.
//!
//! Wake-ups:
//!
//! * **Same handle.** An append wakes the handle's followers of its stream
//!   in process, right after it committed.
//! * **Other handles and processes: `LISTEN`/`NOTIFY`.** Right after an
//!   append commits, the handle announces the stream with `pg_notify` on
//!   the store's channel, `mcp_event_store.<schema>` (a hashed form for
//!   schema names over 47 characters; [`PostgresStore::notify_channel`]),
//!   payload the stream's token in hex; stores in other schemas use other
//!   channels and never wake each other. Each handle that follows keeps
//!   **one** listening connection (a `PgListener`, outside the pool,
//!   opened on the handle's first follow, with the pool's connect options
//!   and `application_name`) and fans notifications out to its followers
//!   of the named stream, and to its task watchers (payload `t…`, see
//!   [Tasks](#tasks)).
//!   A handle sends that `NOTIFY` only while another handle listens: each
//!   listening connection holds a shared advisory lock (class `"mes!"`,
//!   `0x6d657321`, second key from the channel) for its session's life,
//!   and a handle with appends to announce reads `pg_locks` for other
//!   holders at most every 50 ms. A store whose appends nobody else
//!   follows (one instance, or a writer no other instance reads) sends no
//!   notifications at all. A listener that starts just as another handle
//!   read "nobody listens" may miss that handle's appends of the next
//!   50 ms; it wakes its followers again 120 ms after it took the lock,
//!   and that re-read finds them.
//! * **Safety net.** Every follower also re-reads every
//!   [`PostgresOptions::follow_recheck`] (default
//!   [`DEFAULT_FOLLOW_RECHECK`], 5 s; `?follow_recheck_ms=`). A lost
//!   notification (the process died between its commit and its
//!   announcement) costs at most that delay. When the listening connection
//!   is lost (`pg_terminate_backend`, a failover), the listener connects
//!   and listens again, then wakes every follower of the handle to
//!   re-read, since notifications sent meanwhile are gone.
//!
//! The notification is sent in a short transaction of its own right
//! after the append's commit, not inside the append transaction. PostgreSQL
//! serializes notifying commits cluster-wide, from before the commit record
//! until it is flushed, so durable appends that notify cannot share WAL
//! flushes. Measured on this project's machine (2 cores, PostgreSQL 15,
//! `examples/follow.rs instances`: 8 handles with 4 writers each),
//! `pg_notify` inside the append statement cut durable appends from about
//! 4,300 to 520 events/s; sent afterwards, as now, they run at 3,500 to
//! 4,000 (the extra statement costs 10 to 18% there; it carries every
//! stream appended to while the previous one was in flight, once each).
//! With one handle and 32 writers the batching hides most of either
//! (about 20,000 events/s without notifications, 17,000 to 18,700 with
//! them sent afterwards). Its transaction writes nothing and runs with
//! `synchronous_commit` off, so it never waits for a flush.
//!
//! Latency, from `store_event` returning to the event reaching a follower
//! (`examples/follow.rs latency`, loopback, a shared 2-core machine):
//! median about 0.2 ms and p99 0.4 ms on the same handle; median about
//! 0.3 ms and p99 0.5 ms through another handle (notification, then one
//! page read). A busy server adds its queueing to both.
//!
//! An idle follower holds no connection: it is a wake-up registration in
//! its handle's hub and a waiting future. 1,000 idle followers on one
//! handle use the handle's pool plus its one listening connection (a test
//! checks this in `pg_stat_activity`); each costs one indexed page read
//! per recheck interval (1,000 followers at 5 s: 200 small reads a
//! second), and every notification costs each listening handle one hash
//! lookup. Followers of other streams cost appends nothing measurable
//! here (1,000 idle followers on another handle: within the run-to-run
//! noise of about 15%).
//!
//! The listener ends, closing its connection, when the handle and every
//! clone and follow of it are dropped, or at [`PostgresStore::close`];
//! follows after `close` fail with
//! [`Error::Closed`](mcp_event_store_core::Error::Closed). A listener that
//! stops reading would hold back PostgreSQL's notification queue (8 GB by
//! default; `pg_notification_queue_usage()` shows it), after which every
//! `NOTIFY` fails; the listener reads continuously, and a failed
//! announcement only logs a warning (the append itself has committed).
//!
//! # Inspecting
//!
//! [`EventStore::stats`](mcp_event_store_core::EventStore::stats) and
//! [`EventStore::list_streams`](mcp_event_store_core::EventStore::list_streams)
//! read the `streams` rows, never a stream's events one by one: a stream's
//! count is `last_seq - first_seq + 1` (sequence numbers are dense), its
//! bytes `total_bytes` less the `cum_bytes` of its oldest retained event,
//! its oldest time that event's `stored_at` and its newest `last_stored_at`;
//! one primary-key probe into `events` per stream. Streams with no retained
//! event (deleted or expired, their rows not yet purged) are left out.
//! `stats` sums 10,000 stream rows per statement, so no statement holds a
//! snapshot for long on a large store (about 10 ms per 1,000 streams
//! here); a listing page is one statement in token order (a keyed hash of
//! the stream id: stable, not alphabetical) whose cursor is the last
//! listed token, and reads at most its limit plus one row. Both count what a
//! replay would see, including events past `max_age` until a purge
//! removes them.
//!
//! [`EventStore::check`](mcp_event_store_core::EventStore::check) reports
//! backend `postgres`, the newest format version the schema records (see
//! "Format"), and, as the store's pooled connections see them (a role or
//! database setting of `synchronous_commit` counts):
//!
//! | setting | ok | warns, and what to do |
//! |---|---|---|
//! | `synchronous_commit` | `on`, `local`, `remote_write`, `remote_apply` | `off`: a server crash loses the last acknowledged appends; set it `on` for the store's role or database |
//! | `fsync` | `on` | `off`: an OS crash or power loss can lose or corrupt committed events; `ALTER SYSTEM SET fsync = on` |
//! | `full_page_writes` | `on` | `off`: a crash mid-write can leave pages the WAL cannot repair; turn it `on` |
//! | `autovacuum`, `track_counts` | `on`, or anything under `vacuum=auto` | `off` with `vacuum=off`: purged events' space is never reclaimed (see "Disk space and autovacuum"); the `ALTER SYSTEM` that fixes it, or `vacuum=auto` |
//! | `autovacuum_enabled` | no store table (or TOAST table) has it off, or `vacuum=auto` | the tables that have it off, and the `ALTER TABLE .. RESET` for each |
//! | `vacuum` | `auto`, or `off` while autovacuum can do the work | `off` while nothing reclaims space: open the store with `vacuum=auto` |
//! | `retention` | has a `max_age` | no `max_age`: no stream is ever removed; set one and run `purge_expired` on an interval |
//!
//! Every batched statement records how many appends it committed together
//! in the `mcp_event_store_append_batch_size` histogram (1 for an append
//! that ran alone); the other metrics are those of
//! `mcp_event_store_core::backend::observe`.
//!
//! # Format
//!
//! The migrations are the format's history, recorded in the schema's
//! `_sqlx_migrations` table, and [`FORMAT_VERSION`] the newest one this
//! release knows (the task tables are recorded apart; see "Tasks and older
//! releases"). Opening a schema that holds a migration this
//! release does not know (a newer release migrated it) fails with
//! [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat);
//! so does a half-applied migration, or (with `run_migrations` off) a schema
//! that is behind. Rolling upgrades therefore migrate with the new release
//! only once every old instance is gone.
//!
//! ## Format 2 and the upgrade from format 1
//!
//! Format 2 (migration `0002_incarnations`) adds the `incarnations`
//! sequence and renumbers the existing streams' incarnations from it (format
//! 1 drew them at random per handle, zero and negatives included). Ids
//! issued under format 1 (`v1.<token>.<seq>`, no incarnation) are refused
//! afterwards with `UnknownEventId`, like any id the store cannot place,
//! rather than replayed from a guess.
//!
//! ## Tasks and older releases
//!
//! The task tables are additive and leave the event format alone:
//! [`FORMAT_VERSION`] stays 2. Their migration (`migrations/tasks/`) is
//! recorded in a table of its own, `_mes_task_migrations`, not in
//! `_sqlx_migrations`, whose check in every release refuses a row it does
//! not know: so a release from before tasks still opens a schema holding
//! tasks and keeps serving its events (it never touches the task tables,
//! and ignores task notifications). A task migration this release does not
//! know (a newer task format) is refused with
//! [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat)
//! and changes nothing, also with `run_migrations` off. With
//! `run_migrations` off the task tables are not created: a schema without
//! them serves events, and task calls fail until the deploy step that
//! migrates runs a release with tasks.
//!
//! Task contexts (T13) follow the same rule one step further: their
//! migration (`migrations/task_context/`, adding the `context` column) is
//! recorded in a table of its own, `_mes_task_context_migrations`, so a
//! release of task format 1, whose check refuses any row of
//! `_mes_task_migrations` it does not know, still opens the schema and
//! keeps serving events and tasks. Its statements name their columns, so
//! what it writes leaves a task's context as it is. A task context
//! migration this release does not know is refused like a newer task
//! format.
//!
//! Redemptions (C21) take the same path: their migration
//! (`migrations/redeem/`, the `redeemed` table and its `forget_at` index)
//! is recorded in `_mes_redeem_migrations`, so a release from before them
//! opens the schema and serves events and tasks, never touching the table;
//! a redemption migration of a newer release is refused, and with
//! `run_migrations` off a schema without the table opens (redemptions fail
//! until a release with them migrates it).
//!
//! # Limits
//!
//! * Stream ids of 1 to 1024 bytes and payloads up to the
//!   [`StoreOptions`](mcp_event_store_core::StoreOptions) maximum (8 MiB by
//!   default), as for every backend. Stream and session ids are stored as
//!   BYTEA, so any UTF-8 is data, NUL included (see "Layout").
//! * Schema names match `^[a-z_][a-z0-9_]{0,62}$`
//!   ([`validate_schema_name`]); notification channels fit PostgreSQL's 63
//!   bytes (see "Following").
//! * Replay pages hold at most [`MAX_PAGE_SIZE`] (1,000) events, whatever
//!   [`StoreOptions::page_size`](mcp_event_store_core::StoreOptions::page_size)
//!   says. Retention statements touch at most [`BATCH`] (1,000) rows each;
//!   `stats` sums 10,000 stream rows per statement. A batched append carries
//!   at most 64 events and 4 MiB of payload, and a handle runs at most 4
//!   batches at once.
//! * Sequence numbers and incarnations are BIGINTs: an id beyond `i64::MAX`
//!   was never issued and is refused as unknown.
//! * Stream tokens have 120 bits. The append checks that the stream row's
//!   stored stream id is the caller's: if two stream ids ever shared a token,
//!   the append fails with
//!   [`Error::Corrupt`](mcp_event_store_core::Error::Corrupt) rather than
//!   mixing two streams.
//! * Tasks: outcomes up to `max_payload_bytes`, each input request and
//!   response up to 1 MiB, status messages up to 4 KiB, keys of 1 to 256
//!   bytes, at most 64 inputs outstanding per task, as every backend.
//! * Connections: a handle's pool ([`PostgresOptions::max_connections`],
//!   default 10), plus one listening connection once it follows or watches
//!   a task, plus one for task heartbeats once it renews one (so a renewal
//!   never queues behind a busy pool).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod append;
mod batches;
mod creates;
mod error;
mod follow;
mod inspect;
mod options;
mod purge;
mod redeem;
mod replay;
mod rewrite;
mod sessions;
mod setup;
mod sql;
mod state;
mod steps;
mod store;
mod tasks;

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "conformance")]
pub mod testing;

pub use options::{
    BATCH, DEFAULT_APPLICATION_NAME, DEFAULT_FOLLOW_RECHECK, DEFAULT_SCHEMA, MAX_PAGE_SIZE,
    PostgresOptions, VACUUM_MIN_ROWS, Vacuum, validate_schema_name,
};
pub use store::PostgresStore;

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// schemes `postgres` and `postgresql`, facade feature `postgres`. Its
/// `connect` is [`PostgresStore::connect_with`] (the URL's parameters as
/// [`PostgresOptions::from_url`] reads them) with the shared
/// [`StoreOptions`](mcp_event_store_core::StoreOptions).
///
/// ```
/// assert!(mcp_event_store_postgres::BACKEND.opens("postgresql://app@db/app?schema=events"));
/// ```
pub const BACKEND: mcp_event_store_core::Backend = mcp_event_store_core::Backend {
    name: "postgres",
    schemes: &["postgres", "postgresql"],
    feature: "postgres",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = PostgresOptions::default().store(options);
            let store = PostgresStore::connect_with(&url, options).await?;
            Ok(std::sync::Arc::new(store) as std::sync::Arc<dyn mcp_event_store_core::Store>)
        })
    },
};

/// The newest storage format (migration version) this release writes and
/// reads. A schema holding a migration newer than this was written by an
/// incompatible newer release and is refused (see "Format").
pub const FORMAT_VERSION: i64 = 2;
