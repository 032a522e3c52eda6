//! **mcp-event-store**: durable event stores for resumable Server-Sent-Event
//! streams, built for MCP (Model Context Protocol) Streamable HTTP servers.
//!
//! When an MCP client loses its SSE connection, it reconnects with
//! `Last-Event-ID` and must receive every message it missed on that stream,
//! and nothing from any other stream, even if the server restarted or the
//! reconnect landed on another instance. This crate keeps those events.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store::Result<()> {
//! use futures_util::TryStreamExt;
//! use mcp_event_store::{EventStore, NewEvent};
//!
//! let store = mcp_event_store::connect("sqlite://events.db").await?;
//! let first = store.store_event("request-1", NewEvent::new(br#"{"jsonrpc":"2.0"}"#)).await?;
//! store.store_event("request-1", NewEvent::new(b"...")).await?;
//!
//! // The client reconnects with `Last-Event-ID: <first>`:
//! let replay = store.replay_events_after(&first.to_string()).await?;
//! let missed: Vec<_> = replay.events.try_collect().await?;
//! assert_eq!(missed.len(), 1);
//! # Ok(()) }
//! ```
//!
//! Contents: [Backends and features](#backends-and-features),
//! [Guarantees](#guarantees), [Durability](#durability),
//! [Following a stream](#following-a-stream), [Durable tasks](#durable-tasks),
//! [Operating](#operating), [Integrations](#integrations). The repository's
//! README is the short introduction; `docs/` there holds the performance
//! report and two curl walk-throughs of the example server.
//!
//! # Backends and features
//!
//! | feature | backend | URL |
//! |---|---|---|
//! | (always) | [`MemoryStore`] | `memory://` |
//! | `sqlite` (default) | `sqlite::SqliteStore` | `sqlite://events.db`, `sqlite:///abs/path.db` |
//! | `postgres` | `postgres::PostgresStore` | `postgres://user@host/db`, `?schema=name` |
//! | `redis` | `redis::RedisStore` | `redis://host:6379`, `redis+cluster://h1:7000,h2:7001` |
//! | `sled` | `sled::SledStore` | `sled:///var/lib/app/events` |
//!
//! Every backend implements [`EventStore`], [`SessionStore`] and
//! [`TaskStore`](task::TaskStore) and passes the same conformance suites:
//! the handle [`connect`] returns serves resumable streams (MCP up to
//! 2025-11-25) and durable tasks (SEP-2663, MCP 2026-07-28) from one URL.
//! Each backend crate documents its URL parameters, layout, durability,
//! retention, following, inspection, format and limits.
//!
//! | facade feature | enables |
//! |---|---|
//! | `sqlite` (default) | the SQLite backend |
//! | `postgres` | the PostgreSQL backend |
//! | `redis` | the Redis Streams backend |
//! | `sled` | the sled backend |
//! | `rmcp` | adapters for rmcp (3.9 to 3.11): `EventStore`, `SessionStore`, `SessionScoped`, and `DurableTasks` (durable tasks over any store) |
//! | `all-backends` | every backend |
//! | `tower-mcp` | the module `tower_mcp` (the crate `mcp-event-store-tower-mcp`): adapters for tower-mcp 0.25; needs Rust 1.90 |
//! | `full` | every backend, `rmcp` and `tower-mcp` |
//! | `otel` | OpenTelemetry: a durable task keeps the W3C trace context of the request that created it, and a run that claims it continues that trace (`runtime::otel`) |
//! | `otel-export` | `otel`, and `runtime::otel::Tracing`: spans exported to stdout |
//! | `otlp` | `otel-export`, and OTLP/HTTP export |
//! | `testing` | test support: `testing::storage(name)` and `testing::storages()`, private storage on each compiled-in backend that `connect` opens by URL (a temporary file, or a schema or key prefix of its own on the test server); `testing::visit_kit(name, ..)`, a backend's bench baselines and harnesses (its crate's `bench` module); [`for_each_backend!`], a module of tests per compiled-in backend |
//!
//! Which one? SQLite for a single server (or several processes on one host);
//! PostgreSQL or Redis when several instances behind a load balancer must
//! share one store. sled is the pure-Rust embedded option, but sled 0.34 is
//! beta software and one process at a time holds its directory: prefer SQLite
//! unless you need to avoid a C library.
//!
//! # Guarantees
//!
//! Every backend runs the same conformance suite (the crate
//! `mcp-event-store-conformance`), one test per case, so these hold for each
//! of them:
//!
//! - **C1 Durable before return.** `store_event` returns only once the event is
//!   stored under the store's durability setting; the id is safe to send.
//! - **C2 Safe ids.** Event ids look like `v1.<stream token>.<position>`: unique
//!   in the store, increasing within a stream, at most 64 ASCII characters from
//!   `[0-9A-Za-z._-]`. The stream token is an HMAC of the stream id under a
//!   secret kept in the backend, so an id locates its stream without a scan and
//!   knowing one stream's ids gives no way to forge another stream's. **No id is
//!   ever issued twice**: a stream deleted, or expired whole, and later written
//!   again under the same stream id (rmcp's `<session>:common` idle past the
//!   maximum age) starts a new life whose ids sort after every id of the old
//!   one (SQLite, PostgreSQL, sled and memory write `<incarnation>-<seq>`, the
//!   incarnation drawn from one counter per store; Redis writes its own
//!   `<ms>-<seq>` entry ids and remembers the newest id of a removed stream).
//!   An id of an earlier life is `Error::UnknownEventId`, never a resume into
//!   the new one.
//! - **C3 Exact replay.** A replay yields the events of the id's stream stored
//!   after it, in order, each once, with their original ids, and never another
//!   stream's. It reads page by page, so memory stays bounded.
//! - **C4 Lookup.** `get_stream_id_for_event_id` finds the stream of a retained
//!   event and answers `None` for anything else, malformed input included.
//! - **C5 No silent gaps.** Replay from an unknown, malformed or never-issued id
//!   (`v1.<token>.0`, a position between two real ones, past the newest) is
//!   `Error::UnknownEventId`; from an id whose successors were partly purged it
//!   is `Error::EventsPurged`, never a replay with a hole in it.
//! - **C6 Concurrency.** Concurrent appends, to one stream or many, from tasks
//!   or processes, lose and duplicate nothing, and no event ever appears behind a
//!   cursor a reader has passed.
//! - **C7 Priming events.** An event with empty data and a retry hint is stored
//!   and replayed like any other.
//! - **C8 Bounded.** Retention by age, by events per stream and by bytes per
//!   stream (defaults: 1 hour, 10,000 events, 64 MiB), `delete_stream`, and
//!   `PurgeTask` to purge on an interval. The newest event of a stream is only
//!   ever removed by age.
//! - **C9 Input is data.** Stream ids are any UTF-8 of 1 to 1024 bytes (quotes,
//!   `%`, `_`, `{}`, `:`, `/`, emoji); payloads are bytes up to a limit (default
//!   8 MiB) beyond which `Error::PayloadTooLarge`. Nothing a client sends is ever
//!   spliced into a query.
//! - **C10 Restart.** A persistent store reopened after its process was killed
//!   with `SIGKILL` replays everything it acknowledged.
//! - **C11 Shared.** Two handles or processes on one database see each other's
//!   events as soon as `store_event` returns.
//! - **C12 Versioned format.** Stored data carries a format version; data from
//!   an incompatible newer release is refused with `Error::IncompatibleFormat`.
//! - **C13 Follow.** A replay can stay open: after the stored events it yields
//!   each event appended to the stream through any handle or process, in
//!   order, each once, with no gap or duplicate at the seam; it ends when
//!   dropped (releasing everything), after a maximum hold, or on error. See
//!   [Following a stream](#following-a-stream).
//! - **C14 Converge.** Handles and processes sharing a backend agree on the
//!   stream secret and the format at all times, also after the backend lost its
//!   data (a Redis restarted without persistence): one stream id never gets two
//!   tokens.
//! - **C15 Inspect.** `stats()` (streams, events, payload bytes, oldest and
//!   newest append time), `list_streams(after, limit)` in pages of at most
//!   1,000 with an opaque cursor, and `check()`: the format version and the
//!   backend settings that decide durability and boundedness, each with a
//!   verdict and a remedy. See [Operating](#operating).
//! - **C16 Replay from the oldest.** `replay_stream(stream_id)` yields every
//!   retained event of a stream from its oldest, in order, with their ids: a
//!   replay that needs no cursor, for a transport that numbers its events
//!   itself (tower-mcp). A stream never written, deleted or expired whole
//!   replays nothing; retention overtaking the replay is `EventsPurged`, never
//!   a skipped event.
//! - **C17 to C19 The bus.** A message published on any handle reaches every
//!   subscription to its topic on every handle, in order, each once; a
//!   subscription resumed after its cursor misses nothing, or says
//!   `FellBehind`; topics and messages are bounded, and kept under the
//!   store's retention.
//! - **C20 Sessions by digest, bound to their owner.** The store keeps a
//!   session under the digest of its id, never the id: nothing read from its
//!   tables, keys or files yields a live session id. A session stored for an
//!   owner (`put_session_as`) reads and deletes for that owner only. See
//!   `docs/security.md` for callers bound through both frameworks.
//! - **C21 Redeemed once.** `redeem(nonce, expires_at, owner)` succeeds once
//!   per owner and nonce across every handle and process, is refused after,
//!   and its records are forgotten after their expiry, bounded, without ever
//!   reopening a nonce.
//! - **C22 Swapped in place, only over what was read.** `rewriter()` lists
//!   a store's sessions, task values and events as stored and swaps one
//!   only if it still holds the bytes read, changing nothing else: what
//!   re-sealing under a new key needs while servers run (Redis and NATS
//!   refuse event swaps: their event logs are append-only).
//!
//! A session store (`put_session`, `get_session`, `delete_session`, with a time
//! to live) rides along in the same backend, for restoring MCP sessions on
//! another instance.
//!
//! # Durability
//!
//! | backend | setting | survives |
//! |---|---|---|
//! | memory | none | nothing: events live in the process |
//! | SQLite | `Durability::Process` (default, `synchronous=NORMAL`) | the process being killed at any moment, `SIGKILL` included |
//! | SQLite | `Durability::PowerLoss` (`?durability=power_loss`, `synchronous=FULL`) | power loss and kernel crashes too; each group commit costs one fsync |
//! | PostgreSQL | the server's `synchronous_commit` (default `on`) | anything the server's commit survives; `store_event` returns after the commit |
//! | Redis | no persistence | restarts of your servers, not of Redis |
//! | Redis | `appendonly yes`, `appendfsync everysec` | Redis being killed (`SIGKILL`); a power loss can lose the last second or two |
//! | Redis | `appendonly yes`, `appendfsync always` | power loss too (the crate's restart test uses this) |
//! | Redis with replicas | `?wait_replicas=N` (`WAIT` after each append) | the primary being killed and a replica promoted: an append returns once `N` replicas hold it |
//! | sled | `Durability::Flush` (default) | power loss: `store_event` returns after a flush, and concurrent appends share one flush |
//! | sled | `Durability::Interval(d)` (`?flush_interval_ms=N`) | the process being killed loses at most the last interval; ids lost that way are never issued again |
//!
//! For Redis, also set `maxmemory-policy noeviction`: an evicted key is lost
//! history (the store notices and refuses resumes across the hole, but it cannot
//! bring the events back).
//!
//! For PostgreSQL, keep autovacuum on. The space of purged events is only
//! reused after a `VACUUM`; with autovacuum off, the store's tables grow with
//! every event ever appended, however few are retained (100,000 appends keeping
//! 10 events on each of 100 streams: 13.9 MiB and still growing, against 0.3 MiB
//! when vacuumed). The store warns at connect when `autovacuum` or
//! `track_counts` is off or its tables have `autovacuum_enabled = false`, and
//! says what to change. Where you cannot change that, open it with
//! `?vacuum=auto`: `purge_expired` then runs a plain `VACUUM` (never `FULL`, no
//! lock that appends wait for) of the store's tables once enough rows were
//! purged; appends ran at 60 to 100% of their rate while it did.
//!
//! SQLite runs in WAL mode with a single writer task: appends from all streams
//! that arrive together are committed in one transaction, and each caller is
//! answered only after that commit. Under `PowerLoss` this shares one fsync among
//! them. Any number of handles and processes may open one file at once, new or
//! not: the first migrates it, the others wait (up to `busy_timeout`).
//!
//! ## Redis: restart without persistence
//!
//! A Redis without persistence (`appendonly no`, no RDB) that restarts comes back
//! empty: every event, every session, the stream secret and the format marker
//! are gone, while your instances keep running. Every event id issued before is
//! then unknown (replay is `UnknownEventId`, lookup is `None`, never a partial
//! replay), so clients start over. The instances converge on one stream secret
//! by themselves (C14): a handle re-checks its cached secret (`SET NX`, then
//! `GET`) whenever it creates a stream or a session, and whenever a stream or
//! session it names is missing; the first handle to do so after the loss (or the
//! first to connect) decides, the others adopt that secret on their next check
//! and rewrite what they just wrote under the right name before answering. A new
//! stream stays marked pending until that check passed, so no event is ever
//! acknowledged under a token other instances would not use. Appends to existing
//! streams cost nothing extra; the append that creates a stream takes two more
//! round trips (about 0.3 to 0.4 ms instead of 0.1 to 0.15 ms on loopback).
//!
//! ## Redis: replicas and `WAIT`
//!
//! Redis replication is asynchronous: the primary acknowledges an append before
//! any replica has it, so a failover can lose the newest acknowledged events
//! (replays from them are then refused, never resumed with a gap). With
//! `?wait_replicas=N` (and optionally `&wait_timeout_ms=M`, default 1000), each
//! append is followed in the same round trip, on the stream's primary, by
//! `WAIT N M`: `store_event` returns only once N replicas hold the event, and an
//! acknowledged event survives the primary being killed with `SIGKILL` and a
//! replica promoted (the Redis crate's test `replicas.rs` does exactly that, and shows
//! events lost without the option). If fewer replicas acknowledge in time, the
//! append fails with an error saying the event was stored on the primary but may
//! not survive a failover (retrying stores it again under a new id). Cost,
//! measured on loopback with one replica: 30 to 55 µs more per append for one
//! writer (one replica round trip); because `WAIT` blocks the connection, 32
//! writers sharing one store handle drop from about 25,000–34,000 to about
//! 7,300–9,200 appends/s.
//!
//! # Following a stream
//!
//! `follow_events_after(last_event_id, FollowOptions)` is a replay that stays
//! open (C13): the stored events after the cursor, then each event appended to
//! that stream through any handle or process sharing the storage, in order,
//! each once. It ends when dropped (nothing is left behind: no task,
//! connection or listener per follower), after `FollowOptions::max_hold`, or
//! with an error (`EventsPurged` if retention overtakes a slow follower).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store::Result<()> {
//! # use std::time::Duration;
//! use futures_util::StreamExt;
//! use mcp_event_store::{EventStore, FollowOptions};
//!
//! # let store = mcp_event_store::connect("memory://").await?;
//! # let last_event_id = String::new();
//! let mut follow = store
//!     .follow_events_after(&last_event_id, FollowOptions::default().max_hold(Duration::from_secs(300)))
//!     .await?;
//! while let Some(event) = follow.events.next().await {
//!     let event = event?; // stored ones first, then live ones as they come
//! #   let _ = event;
//! }
//! # Ok(()) }
//! ```
//!
//! A wake-up only prompts a re-read by cursor from the store, so a lost
//! notification can delay an event but never lose or reorder one, and no
//! follower queues payloads: the store is the queue. A periodic re-read
//! (`?follow_recheck_ms=`, 5 s by default) is the safety net. How each backend
//! learns of an append made elsewhere:
//!
//! | backend | same handle | other handles and processes | an idle follower costs |
//! |---|---|---|---|
//! | memory | in process | handles sharing the data: in process | a hub entry |
//! | SQLite | in process, after the commit | one watcher per handle, only while someone follows, reads `PRAGMA data_version` every `?follow_poll_ms=` (50 ms) and wakes the streams that moved | a hub entry; one indexed read per re-check |
//! | PostgreSQL | in process, after the commit | `LISTEN`/`NOTIFY`: each append notifies right after its commit (`pg_notify` inside the append's transaction would serialize commits across the server); one listener connection per handle, reconnecting after a loss | a hub entry; one indexed read per re-check |
//! | Redis | in process | one watcher per handle on a connection of its own (never the multiplexed one appends use): `XREAD BLOCK` on every followed stream's key; on a Redis Cluster, a poll of each followed stream's newest id every `?cluster_follow_poll_ms=` (100 ms) | a hub entry; its key in the watcher's `XREAD` |
//! | sled | in process, after the flush | sled is one process per database; every handle in it shares one hub | a hub entry |
//!
//! 1,000 idle followers on one handle hold no connection each: the tests check
//! that PostgreSQL keeps at most its pool plus one listener, Redis one watcher
//! connection, SQLite its pool. Follow latency per backend is in the performance report
//! (`docs/performance.md` in the repository).
//!
//! # Durable tasks
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store::Result<()> {
//! use mcp_event_store::runtime::{Outcome, Runtime};
//! use mcp_event_store::task::{NewTask, Owner, TaskStatus};
//!
//! let store = mcp_event_store::connect("memory://").await?;
//! // The instance's runtime: its lease in the store, its task runs.
//! let runtime = Runtime::builder(store.clone()).start().await?;
//! let owner = Owner::principal(b"alice")?;
//! let (id, _, run) = runtime.create(NewTask::new(&owner, runtime.instance())).await?;
//! run.drive(async { Outcome::Completed(br#"{"content":[]}"#.to_vec()) }).await;
//! // Any instance sharing the store answers `tasks/get` for its owner:
//! let task = store.get(&id.to_string(), &owner).await?.expect("the task");
//! assert_eq!(task.status, TaskStatus::Completed);
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Protocol 2026-07-28 has no `Last-Event-ID`: work that must outlive a
//! connection runs as a *task* (SEP-2663, the `io.modelcontextprotocol/tasks`
//! extension). A client declares the extension in each request's
//! `_meta`; the server may then answer `tools/call` at once with a task handle
//! (`resultType: "task"`), and the client polls `tasks/get`, answers the
//! task's input requests with `tasks/update`, and may `tasks/cancel` it. The
//! same store that keeps the streams keeps the tasks: the handle `connect`
//! returns is a `TaskStore` too, so every instance sharing it answers for
//! every task, and a task is durable before its handle is sent (a `tasks/get`
//! on any instance resolves it at once).
//!
//! What runs tasks is the framework-neutral [`runtime`] (the crate
//! `mcp-event-store-runtime`), the same for every framework: one instance
//! with one lease in the store (renewed every 10 s, a 30 s lease by
//! default), one maintenance loop (the lease, purges of expired events,
//! sessions and tasks, claim rounds), and the takeover runner. The store
//! offers what only the runtime needs (instances, claims, writes under a
//! claim) only when asked ([`Store::task_runtime`]).
//!
//! In an rmcp server, `rmcp::Durable` starts the runtime and builds the
//! tasks (`durable.tasks()`, a `DurableTasks`): clone it into each handler
//! and delegate `call_tool` (task-mode calls), `get_task`, `update_task` and
//! `cancel_task` to it (the `mcp-event-store-rmcp` crate docs show how).
//! The operation gets a `DurableTaskContext`: `set_status_message`,
//! `request_input` (an input request the client answers through
//! `tasks/update`, on whichever instance), `cancelled` and
//! `is_cancel_requested`. A task whose instance stops renewing its lease
//! reads `failed`.
//!
//! The example server does all this (`examples/resumable-server`): `slow_count`
//! runs as a task when the request declares the extension (a plain call
//! behaves as before: progress on its stream), its status message naming the
//! step and a `tasks/cancel` stopping it between steps, and it may be taken over
//! (below); `confirm_count` runs
//! only as a task and first asks the client to confirm the count with an
//! elicitation (`inputRequests` key `confirm`; the answer may change the
//! count). The owner of a task is the request's `Authorization` header, as
//! is, or anonymous without one: the example's stand-in for authentication
//! (another header, or none, gets -32602 for the task's id). `--task-lease-ms
//! MS` sets the instance's lease (default 30000, renewed every third).
//!
//! The task contract (takeover included) is in the [`task`] module docs; the curl walk-through `docs/tasks-walkthrough.md` runs two
//! instances of the example server, an answer, a takeover, a worker and a
//! task that dies with its instance.
//!
//! ## Tasks that outlive their process
//!
//! A task created with [`NewTask::takeover`](task::NewTask::takeover) is
//! taken over when its instance dies: once the instance's lease lapses,
//! another instance, or a worker process with no HTTP endpoint, claims it
//! ([`RuntimeStore::claim`](task::RuntimeStore::claim): atomic, so exactly
//! one claimant among any number racing) and runs the operation again with the
//! original request (kept as the task's context), every input answered so
//! far and the newest checkpoint the operation saved. Runs are bounded
//! (`max_attempts`, then `failed` "server instance lost"), the ttl bounds
//! everything, and every worker write names its claim's epoch, so a run
//! that lost its claim (its process came back after a stall, say) changes
//! nothing ([`Applied::Fenced`](task::Applied::Fenced)). The guarantee is
//! **at least once, with fencing**: what the operation does outside the
//! store between two of its writes may happen twice, so it must be safe to
//! repeat (keyed by the checkpoint, or checked first). A task waiting for
//! its client's input occupies no worker: it is given back and claimed
//! again once answered. Cancel and input behave across a takeover as on
//! one instance. Every backend meets it; the contract is T16 to T19 in the
//! [`task`] module docs.
//!
//! In rmcp, register the tools that are safe to run again and create their
//! tasks with `spawn_takeover`; a worker is the same runtime in a process
//! without HTTP (the `mcp-event-store-rmcp` crate docs, "Takeover"):
//!
//! ```ignore
//! let durable = Durable::builder(store.clone())
//!     .owner(|ctx| my_owner(ctx))
//!     .tasks(|tasks| tasks.takeover("slow_count", slow_count)) // Fn(DurableTaskContext, TakeoverCall) -> TaskFuture
//!     .start()
//!     .await?;
//! // call_tool: self.tasks.spawn_takeover(&ctx, rmcp::task_manager::TaskOptions::new(),
//! //                                     TakeoverCall::from(&params)).await
//! // In slow_count: resume from task.last_checkpoint(), task.checkpoint(bytes) after each step.
//!
//! // A worker process: its own runtime, the same tools, no HTTP; it claims and runs until shut down.
//! let runtime = Runtime::builder(store).start().await?;
//! let worker = DurableTasks::builder().takeover("slow_count", slow_count).build(&runtime);
//! ```
//!
//! With tower-mcp, `TowerTaskStoreBuilder::takeover` (or `takeover_tools`)
//! and `TowerTaskStore::run_takeovers(router)` have another instance run a
//! lost task's handler again through the router (the
//! `mcp-event-store-tower-mcp` crate docs, "Takeover", say what tower-mcp
//! allows and what it does not).
//!
//! ## Limits
//!
//! - **Only a takeover tool's work outlives its process.** By default the
//!   store keeps the task's state, input and outcome, not the work: the
//!   operation runs in the process that created the task and dies with it,
//!   and the task then reads `failed` ("server instance lost") once that
//!   instance's lease lapses. A tool registered for takeover is taken over
//!   instead (see [Tasks that outlive their process](#tasks-that-outlive-their-process)):
//!   at least once, with fencing, so its handler must be safe to run
//!   again from its last checkpoint.
//! - **Owner binding needs the application's authentication.** A task is
//!   bound to the owner the `.owner(..)` extractor returns; without one,
//!   every task is anonymous and its id is the only credential. The example
//!   server trusts the `Authorization` header as it comes, which only stands
//!   in for real authentication.
//! - **Redis can lose an acknowledged create.** Without `appendfsync always`,
//!   or after a failover with no `WAIT` for the replicas, Redis can lose a
//!   task whose handle was already sent, against SEP-2663's "durably created"
//!   (see [Durability](#durability)).
//!
//! # Operating
//!
//! The command line `mcp-event-store` (crate `mcp-event-store-cli`, see its
//! README) runs `check`, `stats`, `streams`, `replay`, `tail`, `purge` and
//! `delete-stream` on any store URL, the same one the server is configured
//! with; `keys` for sealed stores; and, for durable tasks, `tasks` (by
//! status, owner, tool or instance), `task`, `cancel`, `requeue`, `stuck`
//! and `instances`, over the store's operator listing (T22, T23). What
//! `check` reports, per backend: SQLite `journal_mode`,
//! `synchronous`, the store's `durability`, `wal_autocheckpoint`; PostgreSQL
//! `synchronous_commit`, `fsync`, `full_page_writes`, `autovacuum`,
//! `track_counts`, the tables' `autovacuum_enabled`, the `vacuum` option and
//! retention; Redis `appendonly`, `appendfsync`, `save`, `maxmemory-policy`
//! and `wait_replicas` against the replicas connected (every master of a
//! cluster); sled the handle's and the database's flush mode and retention.
//! Each backend crate's docs ("Inspecting") list the verdicts.
//!
//! ## Metrics
//!
//! Every store reports through the [`metrics`](https://docs.rs/metrics) facade;
//! the application installs the exporter it wants. Every metric has a
//! `backend` label. With no recorder and no `tracing` subscriber installed,
//! the span and metrics around an append cost about 180 ns
//! (`MCP_EVENT_STORE_BENCH_BACKENDS=memory cargo bench -p mcp-event-store-benches --bench append -- observe`:
//! `append/observe/append_wrapper` 185 ns against `append/observe/bare` 6 ns),
//! next to 1 µs for a memory-store append and 100 µs or more for a durable one.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `mcp_event_store_appends_total` | counter | `outcome` (`ok`, `error`) | `store_event` calls |
//! | `mcp_event_store_append_duration_seconds` | histogram | | `store_event` latency (durable under the store's setting) |
//! | `mcp_event_store_append_batch_size` | histogram | | events committed together (SQLite group commit, PostgreSQL batch, sled flush group) |
//! | `mcp_event_store_replays_total` | counter | `outcome` (`ok`, `refused`) | replays opened (a follow's re-reads count too) |
//! | `mcp_event_store_replay_open_duration_seconds` | histogram | | time to open a replay |
//! | `mcp_event_store_replayed_events_total` | counter | | events yielded by replays |
//! | `mcp_event_store_follows_active` | gauge | | follows open now |
//! | `mcp_event_store_follow_delivery_seconds` | histogram | | from a follower's wake-up to the event in its hands |
//! | `mcp_event_store_purges_total` | counter | `outcome` | `purge_expired` runs |
//! | `mcp_event_store_purge_duration_seconds` | histogram | | `purge_expired` duration |
//! | `mcp_event_store_purged_events_total`, `mcp_event_store_purged_streams_total` | counter | | what purges removed |
//! | `mcp_event_store_errors_total` | counter | `operation` (`append`, `replay`, `purge`), `kind` (`Error::kind()`) | failures by kind |
//!
//! Tasks and instances have their own: tasks created, claimed, fenced
//! writes, inputs requested and taken, tasks finished by status, tasks
//! with no run left, the time from an instance's lapse to the takeover,
//! requeues, and, from the runtime, each run's duration and the tasks by
//! status; core's `observe` module lists them all with their labels.
//!
//! The server (`cargo run -p resumable-server`) serves them in the Prometheus
//! text format with `--metrics ADDR`:
//!
//! ```text
//! $ cargo run -p resumable-server -- --metrics 127.0.0.1:9100 &
//! $ curl -s http://127.0.0.1:9100/metrics | grep -v '^#' | grep -E 'appends_total|follows_active|delivery_seconds_count'
//! mcp_event_store_appends_total{backend="sqlite",outcome="ok"} 8
//! mcp_event_store_follows_active{backend="sqlite"} 0
//! mcp_event_store_follow_delivery_seconds_count{backend="sqlite"} 3
//! ```
//!
//! ## Running it
//!
//! - Run `purge_expired` periodically (a [`runtime::Runtime`], and so rmcp's `Durable`,
//!   purges events, sessions and tasks every minute; without one,
//!   `PurgeTask::spawn(store, Duration::from_secs(30))`); count and byte limits are also
//!   applied on every append.
//! - PostgreSQL: leave autovacuum on (or use `?vacuum=auto`, see [Durability](#durability)); on
//!   a busy store vacuum `events` sooner with
//!   `ALTER TABLE mcp_event_store.events SET (autovacuum_vacuum_scale_factor = 0.01)`.
//!   Purges, deletions and batched appends lock stream rows in one order (by
//!   token), so running `PurgeTask` on every instance is safe.
//! - Every append, replay and purge emits a `tracing` span
//!   (`mcp_event_store.append`, `.replay`, `.purge`) with the backend, stream id,
//!   event count, bytes and duration.
//! - Errors are one `#[non_exhaustive]` enum, `mcp_event_store::Error`, with the
//!   driver's error kept as the source of `Error::Backend`; `Error::kind()`
//!   names its kind.
//!
//! # Integrations
//!
//! With the `rmcp` feature, the `rmcp` module (the crate
//! `mcp-event-store-rmcp`) makes any store (a [`DynStore`] included) a
//! drop-in `EventStore` and `SessionStore` for rmcp 3.9's Streamable HTTP
//! server, `rmcp::SessionScoped` keeps resumes inside their session,
//! `rmcp::tasks::DurableTasks` serves the tasks extension from the same
//! store, and `rmcp::Durable` wires all of it in one call. The
//! `resumable-server` package (`examples/resumable-server`) is a complete
//! server: `cargo run -p resumable-server`.
//!
//! With the `tower-mcp` feature, the `tower_mcp` module (the crate
//! `mcp-event-store-tower-mcp`) makes any of them tower-mcp 0.25's event
//! store, session store and task store; `cargo run -p tower-mcp-server`
//! runs a tower-mcp server on them (`examples/tower-mcp-server`).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::sync::Arc;

// What applications use; the implementer plumbing stays in
// `mcp_event_store_core::backend`, for backend crates.
pub use mcp_event_store_core::bus;
pub use mcp_event_store_core::rewrite;
pub use mcp_event_store_core::task;
pub use mcp_event_store_core::{
    Backend, BoxError, Clock, Connecting, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PAGE_SIZE, Error,
    EventId, EventStore, FollowOptions, HealthReport, MAX_EVENT_ID_LEN, MAX_LIST_PAGE,
    MAX_NONCE_BYTES, MAX_REDEEM_HORIZON, MAX_STREAM_ID_LEN, ManualClock, MemoryStore, NewEvent,
    Position, PurgeReport, PurgeTask, REDEEM_GRACE, RedeemStore, Redemption, Replay, Result,
    Retention, SessionStore, Setting, Store, StoreOptions, StoreStats, StoredEvent, StreamCursor,
    StreamInfo, StreamPage, SystemClock, Verdict, observe,
};
/// rmcp, the official Rust MCP SDK (feature `rmcp`): the whole
/// `mcp-event-store-rmcp` crate.
#[cfg(feature = "rmcp")]
pub use mcp_event_store_rmcp as rmcp;
/// The framework-neutral runtime every integration runs (the whole
/// `mcp-event-store-runtime` crate): one instance with one lease, one
/// maintenance loop, the takeover runner.
pub use mcp_event_store_runtime as runtime;

/// With the `tower-mcp` feature: any store as tower-mcp 0.25's event store,
/// session store and task store (the crate `mcp-event-store-tower-mcp`,
/// which needs Rust 1.90).
#[cfg(feature = "tower-mcp")]
pub use mcp_event_store_tower_mcp as tower_mcp;

/// The backends behind a cargo feature, one line each: module (the
/// optional dependency and the cargo feature are named the same), feature,
/// its kit (the type in its crate's `bench` module), and its URL schemes
/// (so that a scheme whose feature is off still names the feature;
/// `tests/connect.rs` checks them against each crate's `BACKEND.schemes`).
/// For each line this re-exports the whole crate as the module (under its
/// feature), lists its `BACKEND` in [`backends`], its schemes in
/// [`KNOWN_SCHEMES`], and (feature `testing`) its test storage in
/// `testing::storages`, its kit in `testing::visit_kit` and the backend in
/// [`for_each_backend!`]. The first token is `$`, for the macros it
/// defines.
macro_rules! backends {
    ($d:tt $($module:ident, $feature:literal, $kit:ident,
        [$($scheme:literal),+ $(,)?];)+) => {
        $(
            #[doc = concat!("The `", $feature, "` backend (feature `", $feature,
                "`): the whole `mcp-event-store-", $feature, "` crate.")]
            #[cfg(feature = $feature)]
            pub use ::$module as $module;

            // What `for_each_backend!` expands for this backend: its crate's
            // `test_kit!` when it is compiled in with test support, nothing
            // otherwise. (A macro of the module's name, in the macro
            // namespace, beside the module.)
            #[cfg(all(feature = "testing", feature = $feature))]
            #[doc(hidden)]
            #[macro_export]
            macro_rules! $module {
                ($d callback:ident) => {
                    $d crate::$module::test_kit!($d callback!($module,));
                };
            }
            #[cfg(not(all(feature = "testing", feature = $feature)))]
            #[doc(hidden)]
            #[macro_export]
            macro_rules! $module {
                ($d callback:ident) => {};
            }
        )+

        /// Expands `callback!(<module>, kit = <kit>, restart = yes|no,
        /// shared = yes|no)` once for each backend compiled in, in
        /// [`backends`] order (memory, which has no crate, excepted), with
        /// the feature `testing`; without it, nothing.
        ///
        /// `<module>` is the backend's module here (named as its
        /// [`Backend::name`]), `<kit>` the path of its
        /// `mcp_event_store_conformance::bench::Kit` (its harnesses, so its
        /// concrete store type), and the two flags what its crate says its
        /// test storage allows: `restart`, a new process opens it again;
        /// `shared`, several processes use it at once. So that test suites
        /// (end to end, contracts, the command line's) expand a module of
        /// tests per backend without a list of their own, each case only
        /// where the storage allows it.
        ///
        /// ```
        /// macro_rules! name {
        ///     ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        ///         assert_eq!(stringify!($backend), mcp_event_store::$backend::BACKEND.name);
        ///     };
        /// }
        /// mcp_event_store::for_each_backend!(name);
        /// ```
        #[macro_export]
        macro_rules! for_each_backend {
            ($d callback:ident) => {
                $( $d crate::$module!($d callback); )+
            };
        }

        /// The backends compiled in, [`MemoryStore`] first, each once: what
        /// [`connect`] chooses from.
        ///
        /// ```
        /// let names: Vec<_> = mcp_event_store::backends().iter().map(|b| b.name).collect();
        /// assert_eq!(names[0], "memory");
        /// ```
        pub fn backends() -> Vec<&'static Backend> {
            #[allow(unused_mut)] // with no backend feature on
            let mut list = vec![&MemoryStore::BACKEND];
            $(
                #[cfg(feature = $feature)]
                list.push(&$module::BACKEND);
            )+
            list
        }

        /// Every URL scheme [`connect`] knows, whether its backend is
        /// compiled in or not, with the cargo feature that compiles it in
        /// (empty for `memory`, always there).
        pub const KNOWN_SCHEMES: &[(&str, &str)] = &[
            ("memory", ""),
            $($(($scheme, $feature),)+)+
        ];

        /// Test support (feature `testing`): private storage on every
        /// backend compiled in, opened by URL, so that tests going through
        /// [`connect`] (end-to-end servers, benches) cover each backend
        /// without naming it; and each backend's kit, its bench baselines
        /// and harnesses, by name.
        #[cfg(feature = "testing")]
        pub mod testing {
            pub use mcp_event_store_conformance::bench;
            pub use mcp_event_store_conformance::events::UrlHarness;

            use crate::Backend;
            #[allow(unused_imports)] // with no backend feature on
            use bench::Kit;

            /// Fresh private storage on each persistent backend compiled in
            /// (every one but `memory://`, which is private to each
            /// `connect`), with its descriptor, in [`backends`](crate::backends)
            /// order. Server-backed storage is a schema or key prefix of its
            /// own on the test server, found as
            /// `mcp_event_store_conformance::testkit::find_server` says (never
            /// skipping). Call [`UrlHarness::remove`] on each when done.
            pub async fn storages() -> Vec<(&'static Backend, Box<dyn UrlHarness>)> {
                #[allow(unused_mut)] // with no backend feature on
                let mut list = Vec::new();
                for backend in crate::backends() {
                    if let Some(storage) = storage(backend.name).await {
                        list.push((backend, storage));
                    }
                }
                list
            }

            /// Fresh private storage on the backend named `name`
            /// ([`Backend::name`]), or `None` if it is not compiled in (or
            /// is `memory`): its kit's harness.
            ///
            /// ```
            /// # #[tokio::main(flavor = "current_thread")]
            /// # async fn main() {
            /// for (backend, storage) in mcp_event_store::testing::storages().await {
            ///     let store = mcp_event_store::connect(&storage.url()).await.unwrap();
            ///     assert!(backend.opens(&storage.url()));
            /// #   drop(store);
            ///     storage.remove().await;
            /// }
            /// # }
            /// ```
            pub async fn storage(name: &str) -> Option<Box<dyn UrlHarness>> {
                $(
                    #[cfg(feature = $feature)]
                    if name == crate::$module::BACKEND.name {
                        return Some(Box::new(crate::$module::bench::$kit::harness().await));
                    }
                )+
                let _ = name;
                None
            }

            /// Runs `visitor` with the kit of the backend named `name`
            /// ([`Backend::name`], `memory` included): what the benches
            /// reach every backend through. `None` if it is not compiled
            /// in.
            ///
            /// ```
            /// use mcp_event_store::testing::bench::{Kit, Visitor};
            ///
            /// struct Name;
            /// impl Visitor for Name {
            ///     type Output = &'static str;
            ///     fn visit<K: Kit>(self) -> &'static str {
            ///         K::BACKEND.name
            ///     }
            /// }
            /// for backend in mcp_event_store::backends() {
            ///     let name = mcp_event_store::testing::visit_kit(backend.name, Name);
            ///     assert_eq!(name, Some(backend.name));
            /// }
            /// ```
            pub fn visit_kit<V: bench::Visitor>(name: &str, visitor: V) -> Option<V::Output> {
                if name == crate::MemoryStore::BACKEND.name {
                    return Some(visitor.visit::<bench::MemoryKit>());
                }
                $(
                    #[cfg(feature = $feature)]
                    if name == crate::$module::BACKEND.name {
                        return Some(visitor.visit::<crate::$module::bench::$kit>());
                    }
                )+
                None
            }
        }
    };
}

backends! { $
    sqlite, "sqlite", SqliteKit, ["sqlite"];
    postgres, "postgres", PostgresKit, ["postgres", "postgresql"];
    redis, "redis", RedisKit, [
        "redis", "rediss", "redis+unix", "unix", "redis+cluster", "rediss+cluster",
        "valkey", "valkeys", "valkey+unix", "valkey+cluster", "valkeys+cluster",
    ];
    sled, "sled", SledKit, ["sled"];
    nats, "nats", NatsKit, ["nats"];
}

/// A store of any backend, as [`connect`] returns it: an event store, a
/// session store and a task store in one handle. It passes as an
/// `Arc<dyn TaskStore>` (or `Arc<dyn EventStore>`, `Arc<dyn SessionStore>`)
/// where one is wanted.
pub type DynStore = Arc<dyn Store>;

/// Opens the store a URL names, with default options, so the backend can be
/// chosen in configuration.
///
/// * `memory://`: a fresh [`MemoryStore`] (nothing survives the process).
/// * `sqlite://path` or `sqlite:///absolute/path` (feature `sqlite`), with
///   an optional `?durability=process|power_loss`.
/// * `postgres://user@host/db` (feature `postgres`): the tables live in the
///   `mcp_event_store` schema (or `?schema=name`), created and migrated on
///   connect; other query parameters go to the driver.
/// * `redis://host:6379/0` (feature `redis`), a Redis Cluster as
///   `redis+cluster://host:7000,host:7001` or `redis://host:7000?cluster=true`;
///   keys live under the `mcp-event-store` prefix (or `?prefix=name`); every
///   scheme in the Redis crate's `URL_SCHEMES` (`valkey://`,
///   `valkey+cluster://`, ...).
/// * `sled:///absolute/dir` or `sled://relative/dir` (feature `sled`), with
///   `?flush_interval_ms=N` for interval flushing instead of a flush per
///   append group.
///
/// The scheme picks the backend from [`backends`]; the backend's own
/// `connect` reads the rest of the URL (each backend crate documents its
/// parameters). A URL whose backend is not compiled in is
/// [`Error::BackendNotEnabled`], naming the cargo feature to enable.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = mcp_event_store::connect("memory://").await.unwrap();
/// # let _ = store;
/// let Err(err) = mcp_event_store::connect("nosuch://x").await else {
///     panic!("no such backend");
/// };
/// assert!(err.to_string().contains("nosuch"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<DynStore> {
    connect_with(url, StoreOptions::default()).await
}

/// Like [`connect`], with the options every backend shares (retention,
/// payload limit, page size, clock).
pub async fn connect_with(url: &str, options: StoreOptions) -> Result<DynStore> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .ok_or_else(|| Error::Config(format!("not a store URL (no scheme): {url:?}")))?;
    if let Some(backend) = backends().into_iter().find(|backend| backend.opens(url)) {
        return (backend.connect)(url, options).await;
    }
    if let Some(&(_, feature)) = KNOWN_SCHEMES.iter().find(|(known, _)| *known == scheme) {
        return Err(Error::BackendNotEnabled { scheme, feature });
    }
    let known: Vec<&str> = KNOWN_SCHEMES.iter().map(|(known, _)| *known).collect();
    Err(Error::Config(format!(
        "unknown store URL scheme {scheme:?} (known: {})",
        known.join(", ")
    )))
}

/// The README's Rust snippets, compiled as doc tests (with the features
/// they use), so that a snippet that stops compiling fails the tests.
#[cfg(all(doctest, feature = "rmcp", feature = "tower-mcp"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
