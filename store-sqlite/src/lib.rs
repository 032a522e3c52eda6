//! SQLite backend for **mcp-event-store**: an embedded, durable store for
//! resumable MCP Streamable HTTP streams, in one database file.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_sqlite::SqliteStore;
//!
//! let store = SqliteStore::open("events.db").await?;
//! let id = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
//! let replay = store.replay_events_after(&id.to_string()).await?;
//! # drop(replay);
//! store.close().await;
//! # Ok(()) }
//! ```
//!
//! # Connecting
//!
//! There is no server: a handle opens the file itself, creating it if
//! missing.
//!
//! * [`SqliteStore::connect`]`("sqlite://events.db")` (relative) or
//!   `"sqlite:///var/lib/app/events.db"` (absolute): the URL's file and
//!   parameters, defaults for the rest. [`SqliteStore::connect_with`] takes
//!   [`SqliteOptions`] for everything the URL does not say; a parameter the
//!   URL gives wins. This is what the `mcp-event-store` facade's `connect`
//!   calls ([`BACKEND`]).
//! * [`SqliteStore::open`]`(path)` and [`SqliteStore::open_with`]`(options)`:
//!   the same without a URL.
//!
//! | URL parameter | option | default |
//! |---|---|---|
//! | `durability=process\|power_loss` | [`SqliteOptions::durability`] | `process` |
//! | `follow_poll_ms=<ms>` | [`SqliteOptions::follow_poll_interval`] | 50 |
//! | `follow_recheck_ms=<ms>` | [`SqliteOptions::follow_recheck`] | 5000 |
//!
//! An unknown parameter, or one given twice, is [`Error::Config`] naming
//! it; so are options [`SqliteOptions::validate`] refuses.
//!
//! Opening is safe from any number of handles and processes at once, on a
//! new file or an existing one: the migrations and the creation of the
//! stream secret happen once, under SQLite's write lock, and every other
//! opener waits for it (up to [`SqliteOptions::busy_timeout`]), then finds
//! the work done. [`SqliteStore::close`] finishes queued writes and closes
//! everything the handle holds; calls after it fail with [`Error::Closed`].
//!
//! # Layout
//!
//! ## Tables
//!
//! The store's tables all carry the `mes_` prefix, so the file can hold an
//! application's own tables too: `mes_streams` (one row per stream: its
//! token, id, incarnation, newest sequence number and retained bytes),
//! `mes_events` (token, sequence number, time, retry hint, payload; unique
//! on `(token, seq)`, indexed on the time), `mes_sessions`, `mes_meta` (the
//! format version, the stream secret, the incarnation counter),
//! `mes_migrations` (the embedded migrations applied), and for durable tasks
//! `mes_tasks`, `mes_task_inputs`, `mes_instances`, `mes_task_migrations`,
//! `mes_task_context_migrations`, `mes_task_takeover_migrations` and
//! `mes_task_cancel_reason_migrations` (see [Tasks](#tasks)), and
//! `mes_redeemed` and `mes_redeem_migrations` (see
//! [Redemptions](#redemptions)).
//!
//! ## One writer, many readers
//!
//! The file is in **WAL mode**. One **writer thread** per handle owns one
//! connection, through SQLite itself (rusqlite, no async driver), and makes
//! every write: appends, stream deletes, purges, sessions and task steps.
//! Replay pages and task reads run on threads of the handle's own, each
//! with a connection through SQLite itself (see [Replay](#replay)), and a
//! pool of read connections (sqlx) serves lookups, sessions and inspection.
//! A write is one hop to the writer thread and one back. Appends from every
//! stream queue at the writer, which commits
//! whatever is waiting in one transaction (group commit; consecutive
//! appends become one multi-row insert) and answers each caller only after
//! the commit: under [`Durability::PowerLoss`] many appends share one fsync
//! instead of paying one each. Several handles or processes may share one
//! file: SQLite's write lock serializes their writers, and `busy_timeout`
//! makes them wait rather than fail.
//!
//! ## Event ids
//!
//! Ids are `v1.<stream token>.<incarnation>-<seq>` (see
//! [`dense`](mcp_event_store_core::backend::dense)). Each stream has a dense
//! sequence (1, 2, 3, ...) assigned inside the writer's transaction, so
//! sequence order is commit order and a reader can never see an event
//! appear behind its cursor (C6). Its **incarnation** names one life of the
//! stream: a stream deleted, or expired whole, and then written again
//! starts at sequence 1 under a new incarnation, taken from a store-wide
//! counter (`mes_meta.last_incarnation`) that only goes up, in the
//! statement that creates the stream's row. So no id is ever issued twice,
//! by any process, and an id of an earlier life is refused with
//! [`Error::UnknownEventId`] rather than resuming into the new one. The
//! steady-state append is still one statement: the incarnation is drawn
//! only when a stream's row is created.
//!
//! ## Replay
//!
//! Replay is one indexed seek plus a range read per page on the
//! `(token, seq)` index; each page is read in one read transaction with
//! the stream's row, so a replay whose stream is deleted and started again
//! under it ends in [`Error::EventsPurged`], never in events of the new
//! life.
//!
//! Pages are read through SQLite itself (rusqlite), not through sqlx: each
//! page is one hop to a thread of the handle's, which holds a `query_only`
//! connection with the page statements prepared once, and the events come
//! back built. Threads start as replays need them, up to
//! [`SqliteOptions::read_connections`], and end when the handle is closed
//! or dropped. A replay's first page is short (at most 128 events, what
//! most resumes miss) and read on the calling task instead: from SQLite's
//! cache that costs less than the hop itself. It uses a `query_only`
//! connection of the handle's own (as many as page threads at most) that
//! never waits for a lock: when none is free, or SQLite answers busy, the
//! page takes the hop as any other. sqlx's pool, worker thread and row decoding made a page
//! cost four to seven times what SQLite takes to read it; this path stays
//! within one thread hop of it (the replay bench's `direct_hop`). Both
//! drivers link the one SQLite library.
//!
//! ## Tasks
//!
//! [`SqliteStore`] is also a
//! [`TaskStore`](mcp_event_store_core::task::TaskStore) (SEP-2663 durable
//! tasks), in three tables:
//!
//! * `mes_tasks`: one row per task, keyed by the 16-byte digest of its id
//!   (the id itself is never stored, so a copy of the file hands out no
//!   bearer token), with its owner's digest (empty for anonymous), status,
//!   `rev`, times, ttl, poll interval, cancel flag, the instance running it,
//!   its outcome bytes and its context (T13: what the runtime keeps to run
//!   it again); indexed on `purge_at`, and on `instance` for running tasks
//!   only.
//! * `mes_task_inputs`: one row per input key a task used, with its
//!   request, its response and its state (outstanding, answered, spent),
//!   kept until the task goes so a key is never usable twice.
//! * `mes_instances`: each runtime instance's heartbeat deadline.
//!
//! **One atomic step per mutation.** Every task mutation goes through the
//! handle's writer thread, like an append: it reads the task, decides with
//! the state machine every backend shares, and writes the row back
//! conditioned on the `rev` it read, all inside one transaction that holds
//! SQLite's write lock from the read to the commit (`BEGIN IMMEDIATE`, or
//! the group commit's transaction it shares). Handles and processes on the
//! file take turns on that lock, so of racing finishers exactly one wins.
//! `create` (an insert-if-absent) and `heartbeat` (an upsert that refuses a
//! lapsed instance) are single statements. The caller is answered after
//! the commit, so a task is durable (under the [durability](#durability)
//! setting) and readable from every handle before `create` returns.
//! Expiry and lost instances are decided when a task is read;
//! [`TaskStore::purge_expired_tasks`](mcp_event_store_core::task::TaskStore::purge_expired_tasks)
//! persists them and deletes tasks past their grace with their inputs, in
//! steps of at most 500 tasks, one transaction each, queued at the writer
//! like any write, so a large purge never holds the write lock for long.
//! Lifetimes come from [`StoreOptions::tasks`](mcp_event_store_core::StoreOptions::tasks).
//!
//! **Watching.** `get` and `watch` read one snapshot (the task, its inputs
//! and its instance's deadline) on a page thread. A change through this
//! handle wakes its watchers from the writer thread, right after the commit.
//! A change through another handle or process is found by the handle's one
//! follow watcher (see [Following](#following)): while anyone follows or
//! watches, it reads `PRAGMA data_version` every
//! [`SqliteOptions::follow_poll_interval`] (default 50 ms), and when another
//! connection committed it wakes every task watcher, which re-reads its
//! task's `rev` and waits again if it did not move. Expect a change made
//! elsewhere within one poll interval plus a read. As a safety net each
//! watcher also re-reads every [`SqliteOptions::follow_recheck`]. An idle
//! watcher holds no connection and no task of its own: a registration in
//! the handle's wake-up hub; dropping the `watch` future frees it.
//!
//! ## Redemptions
//!
//! [`RedeemStore::redeem`](mcp_event_store_core::RedeemStore::redeem)
//! (C21) is one `INSERT INTO mes_redeemed (key, forget_at) ... ON CONFLICT
//! (key) DO NOTHING` on the writer thread, committed with its group before
//! the answer: SQLite's write lock orders the handles and processes on the
//! file, so of racing redemptions of one nonce exactly one inserts the row.
//! The key is the 32-byte digest core computes (the principal's digest and
//! the nonce, never the nonce); `forget_at` is the nonce's expiry plus
//! [`REDEEM_GRACE`](mcp_event_store_core::REDEEM_GRACE). SQLite has no ttl
//! per row: [`EventStore::purge_expired`] deletes the rows past
//! `forget_at` (on its index, 500 a transaction, counted in
//! [`PurgeReport::redemptions`](mcp_event_store_core::PurgeReport::redemptions)),
//! so the table holds at most the redemptions of the last
//! [`MAX_REDEEM_HORIZON`](mcp_event_store_core::MAX_REDEEM_HORIZON) plus
//! the grace, and whatever the purge has not reached yet.
//!
//! ## Rewrites in place
//!
//! [`EventStore::rewriter`] (C22, for re-sealing the file under a new key
//! while servers run) lists events, sessions and tasks with their values
//! as the file holds them, and swaps a value with one conditional `UPDATE`
//! on the writer thread (`... SET payload = <new> WHERE token = <token> AND
//! seq = <seq> AND payload = <expected>`, in the stream's current
//! incarnation only; the same for a session's state, a task's context,
//! outcome or checkpoint, an input's request or response). A value
//! written since it was read is left alone. Only that column changes: no `rev`, expiry or
//! time moves, and `mes_streams.bytes` stays right (its triggers fire on
//! insert and delete only, and a swap keeps the length).
//!
//! # Durability
//!
//! The default, [`Durability::Process`] (`synchronous=NORMAL`), survives
//! the process being killed at any moment (including `SIGKILL`) with
//! nothing acknowledged lost; a power loss may lose the newest commits.
//! [`Durability::PowerLoss`] (`synchronous=FULL`, URL
//! `?durability=power_loss`) also survives power loss, at the cost of an
//! fsync per group commit.
//!
//! # Retention
//!
//! The count and byte limits of [`Retention`](mcp_event_store_core::Retention)
//! are applied inline on every append (the oldest events of that stream go,
//! never its newest). Age, expired sessions and anything left over go in
//! [`EventStore::purge_expired`], which the writer runs in transactions of
//! at most 500 rows interleaved with append groups, so retention never
//! stalls appends for long. [`EventStore::delete_stream`] removes a stream's
//! row and events in one transaction.
//!
//! Tasks are kept apart from this: their lifetimes are
//! [`StoreOptions::tasks`](mcp_event_store_core::StoreOptions::tasks), and
//! [`TaskStore::purge_expired_tasks`](mcp_event_store_core::task::TaskStore::purge_expired_tasks)
//! (see [Tasks](#tasks)) deletes them.
//!
//! # Following
//!
//! [`EventStore::follow_events_after`] replays the events after a cursor,
//! then keeps the stream open and delivers each event appended to it
//! afterwards, by this handle, another handle or another process on the
//! same file (C13). Wake-ups carry no data: they only make a follower
//! re-read its stream after its newest delivered id, with the same indexed
//! read as a replay, so events arrive in order, each once, and nothing
//! queues up per follower.
//!
//! * **Appends through this handle** (or a clone of it) wake their stream's
//!   followers from the writer thread, right after the commit that made them
//!   visible and before `store_event` returns. Expect a follower to have the
//!   event within about a millisecond of `store_event` returning (one page
//!   read on a page thread).
//! * **Appends by another handle or process** are found by this handle's
//!   *watcher*: one task with one dedicated connection that reads
//!   `PRAGMA data_version`, whose value changes when another connection
//!   committed; then the watcher reads the rows of the streams being
//!   followed and wakes those that moved. It checks as soon as the
//!   operating system reports a change to the database file or its `-wal`
//!   (a file notification on the database's directory, through the
//!   `notify` crate: inotify on Linux, FSEvents on macOS,
//!   ReadDirectoryChangesW on Windows), so a commit by any process on this
//!   host wakes it at once: expect the event within a millisecond or so of
//!   its commit. The notifications of commits made during a check prompt
//!   one more check, and a stream of commits (this handle's own included)
//!   keeps the watcher busy a quarter of the time at most; while commits
//!   keep coming that wake none of this handle's followers (appends to
//!   streams nobody here follows, while the handle has no task watch),
//!   notified checks back off, up to the poll interval, so such commits
//!   cost a few checks, not one each, and a follower of a stream among
//!   them may wait up to one poll interval, as it would without
//!   notifications. Task watches do not back off: any commit may be their
//!   task's.
//!
//!   The notifier is on while others commit. A single process writing
//!   through one handle would otherwise pay for hearing its own commits
//!   (inotify reports every write of the `-wal`), whose followers its
//!   writer wakes anyway. So the watcher tells its own handle's commits from
//!   others' (its writer counts its commit groups, and reads
//!   `data_version` on its own connection, where only others' commits move
//!   it), and turns the notifier off once 64 checks in a row found only
//!   its own commits. The next commit from elsewhere is then found by the
//!   poll, or at once if this handle's writer commits meanwhile, and turns
//!   the notifier back on: the first commit from another process after a
//!   spell of this handle's own may take up to one poll interval to
//!   arrive; the ones after it are notified. While nothing commits, the
//!   notifier costs nothing and stays on.
//! * **The poll**: the watcher also checks every
//!   [`SqliteOptions::follow_poll_interval`] (default 50 ms, URL
//!   `?follow_poll_ms=`) after its last check. It is the bound on the
//!   follow latency wherever notifications fall short: a writer on another
//!   host sharing a network file system (which raises no notification
//!   here), a handle whose notifier could not be created (the inotify
//!   instance or watch limit reached, say: one warning is logged, and the
//!   handle polls), and a commit published only after the check its write
//!   prompted and the re-checks that follow it (at once, and 1 ms later).
//!   There, expect the event within one poll interval of its commit
//!   (about half of one on average), plus a read. A shorter interval costs
//!   one cheap statement more per poll.
//! * **The safety net**: every follower also re-reads its stream every
//!   [`SqliteOptions::follow_recheck`] (default 5 s, URL
//!   `?follow_recheck_ms=`) whatever it was told, so a missed wake-up (the
//!   watcher's connection failing, say) delays an event, never loses it.
//!
//! **What an idle follower costs:** no connection and no task of its own:
//! a registration in the handle's wake-up hub and its suspended stream,
//! plus one indexed read per re-check interval. A thousand idle followers
//! share the page threads (at most [`SqliteOptions::read_connections`])
//! and one watcher. The watcher runs only while the handle has at least one
//! follower or task watcher: the first follow (or task `watch`) starts it,
//! with its notifier (on Linux, one inotify instance and the thread that
//! reads it), and it ends (closing its connection and its notifier) at its
//! first check after the last one is dropped, or at once when the handle
//! is closed or dropped. An idle store pays nothing. A follow keeps its
//! handle alive while it is open; [`SqliteStore::close`] ends every open
//! follow with [`Error::Closed`].
//!
//! # Inspecting
//!
//! [`EventStore::stats`] and [`EventStore::list_streams`] read the stream
//! rows, never every event: a stream's count comes from its dense sequence
//! numbers (one index seek for its first retained event), its bytes from
//! the running total its row keeps, its ages from its first and last
//! events, and the store's ages from the two ends of the `stored_at` index.
//! Totals are summed 512 stream rows per statement; listings go in stream
//! token order with the last token as the cursor, one statement per page.
//! Both use the read pool and never wait for the writer.
//!
//! [`EventStore::check`] reports the format version the file holds and:
//!
//! | setting | ok | warns, and what to do |
//! |---|---|---|
//! | `journal_mode` | `wal` | anything else: put the file back in WAL mode |
//! | `synchronous` | at least what the durability needs (`NORMAL` for `process`, `FULL` for `power_loss`) | below it: open the store through this crate, which sets it on every connection |
//! | `durability` | `power_loss` | `process` (the default): a power loss or OS crash can lose the newest acknowledged events; use `?durability=power_loss` if they must survive one |
//! | `wal_autocheckpoint` | above 0 pages | 0: the WAL file grows without bound; leave it at its default (1000) |
//! | `retention` | a maximum age is set | none: no stream is ever removed; set `retention.max_age` and run `purge_expired` periodically |
//!
//! Each group commit records how many appends it made durable in the
//! `mcp_event_store_append_batch_size` histogram (1 for an append committed
//! alone); the other metrics are those of
//! [`mcp_event_store_core::backend::observe`].
//!
//! # Format
//!
//! The schema is created by embedded migrations recorded in the
//! `mes_migrations` table, and `mes_meta.format_version` names the format
//! ([`FORMAT_VERSION`]). A database migrated by a newer, unknown release
//! (a migration this release does not know, or a newer format version) is
//! refused with [`Error::IncompatibleFormat`] (C12), and the refusal
//! changes nothing in the file.
//!
//! ## Format 2 and the upgrade from format 1
//!
//! Format 2 (this release) added incarnations. Opening a format 1 database
//! migrates it in place: every stream and event is kept, and each stream
//! gets an incarnation above every sequence number format 1 issued, so its
//! new ids sort after its old ones. Format 1 ids (`<seq>`, no incarnation)
//! are refused with [`Error::UnknownEventId`] from then on, never misread.
//! Stop every process of the older release before opening the file with
//! this one: an older writer still running can append under ids this
//! release refuses (it cannot create streams: the new schema refuses rows
//! without an incarnation).
//!
//! ## Tasks and older releases
//!
//! The task tables are additive and leave the event format alone:
//! [`FORMAT_VERSION`] stays 2. Their migration (`migrations/tasks/`) is
//! recorded in a table of its own, `mes_task_migrations`, not in
//! `mes_migrations`, because a release checks `mes_migrations` against the
//! migrations it embeds and refuses a file with one it does not know. So a
//! release from before tasks still opens a file holding tasks and keeps
//! serving its events (it never touches the task tables). A task migration
//! of a newer release is refused with [`Error::IncompatibleFormat`] naming
//! it, and the refusal changes nothing.
//!
//! Task contexts (T13) go one step further the same way: their migration
//! (`migrations/task_context/`, adding the `context` column) is recorded
//! in `mes_task_context_migrations`, so a release of task format 1 (whose
//! check refuses an unknown row of `mes_task_migrations`) still opens the
//! file and serves events and tasks; its statements name their columns,
//! so what it writes leaves a context as it is. A task context migration
//! of a newer release is refused in turn.
//!
//! Takeover (T16 to T19) follows the same path: its migration
//! (`migrations/task_takeover/`) adds to `mes_tasks` the runs allowed
//! (`max_attempts`, NULL for a task that dies with its instance), the
//! runs whose instance lapsed, the claim's epoch, the release flag and the
//! checkpoint, with a partial index on the tasks that may wait for a
//! claim, and is recorded in `mes_task_takeover_migrations`. A release
//! from before it opens the file and reads such a task as one that dies
//! with its instance. A claim is one step at the writer like every other:
//! it selects the tasks that wait for a runtime, decides each with the
//! shared state machine, and writes them back in the same transaction, so
//! of racing claimants exactly one claims a task.
//!
//! Cancel reasons (T20) take the same path once more: their migration
//! (`migrations/task_cancel_reason/`) adds the `cancel_reason` column and
//! is recorded in `mes_task_cancel_reason_migrations`; a release from
//! before it opens the file, reads a task without its reason, and leaves
//! the reason as it is when it writes the task.
//!
//! Redemptions (C21) take the same path: their migration
//! (`migrations/redeem/`, the `mes_redeemed` table and its `forget_at`
//! index) is recorded in `mes_redeem_migrations`, so a release from before
//! them opens the file and serves events and tasks, never touching the
//! table; a redemption migration of a newer release is refused.
//!
//! # Limits
//!
//! * Payloads up to [`StoreOptions::max_payload_bytes`](mcp_event_store_core::StoreOptions::max_payload_bytes)
//!   (8 MiB by default), stream ids of 1 to 1024 bytes, as every backend.
//! * Sequence numbers and incarnations are SQLite integers: an id beyond
//!   `i64::MAX` was never issued and is refused as unknown.
//! * One writer at a time per file: handles and processes take turns on
//!   SQLite's write lock, each committing up to [`SqliteOptions::max_batch`]
//!   appends (default 512) per transaction; up to 4096 writes queue at a
//!   handle's writer before callers wait.
//! * Tasks: outcomes up to `max_payload_bytes`, each input request and
//!   response and each context up to 1 MiB, status messages up to 4 KiB, input keys of 1 to
//!   256 bytes, at most 64 inputs outstanding per task, as every backend.
//!   A commit by another connection wakes every task watcher of a handle
//!   (one keyed read each), not only those of the task it changed.
//! * WAL needs shared memory between the processes on the file: one host,
//!   a local file system (not a network share), not `:memory:`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod append;
mod error;
mod follow;
mod inspect;
mod options;
mod pages;
mod purge;
mod redeem;
mod replay;
mod rewrite;
mod sessions;
mod setup;
mod state;
mod store;
mod tasks;
mod watcher;
mod writer;

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "conformance")]
pub mod testing;

use std::sync::Arc;

use mcp_event_store_core::{Backend, Store};
#[cfg(doc)]
use mcp_event_store_core::{Error, EventStore};

pub use options::{Durability, SqliteOptions};
pub use store::SqliteStore;

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// scheme `sqlite`, facade feature `sqlite`. Its `connect` is
/// [`SqliteStore::connect_with`] with the shared
/// [`StoreOptions`](mcp_event_store_core::StoreOptions) given.
///
/// ```
/// assert!(mcp_event_store_sqlite::BACKEND.opens("sqlite://events.db"));
/// ```
pub const BACKEND: Backend = Backend {
    name: error::NAME,
    schemes: &["sqlite"],
    feature: "sqlite",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = SqliteOptions::default().store(options);
            Ok(Arc::new(SqliteStore::connect_with(&url, options).await?) as Arc<dyn Store>)
        })
    },
};

/// The storage format this release reads and writes.
pub const FORMAT_VERSION: i64 = 2;
