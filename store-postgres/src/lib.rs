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
//! # Schema
//!
//! Everything lives in one schema (default `mcp_event_store`, see
//! [`PostgresOptions::schema`]), created and migrated on connect by the
//! embedded migrations unless [`PostgresOptions::run_migrations`] is off.
//! The name must match `^[a-z_][a-z0-9_]{0,62}$` and is quoted into the
//! statements once, when the store opens; every statement is
//! schema-qualified, so pooled connections need no `search_path` (and
//! [`PostgresStore::from_pool`] works on any pool).
//!
//! | table | key | holds |
//! |---|---|---|
//! | `meta` | `key` | `stream_key`: the 32-byte secret keying stream tokens |
//! | `streams` | `token` (15 bytes) | `stream_id`, `first_seq`, `last_seq`, `clean_seq`, `total_bytes`, `last_stored_at`, `incarnation` |
//! | `events` | `(token, seq)` | `stored_at`, `cum_bytes`, `retry_ms`, `data` (BYTEA) |
//! | `sessions` | `session_id` | `state` (BYTEA), `expires_at` (indexed) |
//! | `_sqlx_migrations` | `version` | the format history (C12) |
//!
//! Stream and session ids are stored as **BYTEA** (their UTF-8 bytes), not
//! TEXT: PostgreSQL text cannot hold a NUL byte, and the contract allows any
//! UTF-8 (C9), so a stream id like `"a\0b"` works here exactly as on every
//! other backend. In `psql`, `convert_from(stream_id, 'UTF8')` shows them.
//!
//! Event ids are `v1.<token>.<seq>`: the token is the HMAC of the stream id
//! under the schema's stream key (inserted with `ON CONFLICT DO NOTHING` and
//! read back, so every instance derives the same tokens), `seq` the dense
//! per-stream sequence number 1, 2, 3, ...
//!
//! # Appends and C6
//!
//! `store_event` is one statement, one round trip: a CTE that upserts the
//! stream row (`INSERT .. ON CONFLICT (token) DO UPDATE SET last_seq =
//! last_seq + 1 .. RETURNING last_seq`) and inserts the event with that
//! sequence number. It returns once the transaction has committed, so under
//! the server's default `synchronous_commit = on` the event is durable (C1);
//! a server or role configured with `synchronous_commit = off` trades that
//! away, and the store does not override it.
//!
//! Under concurrency, appends are batched: while appends are in flight, new
//! ones queue, and a batcher sends everything queued (at most one event per
//! stream, up to 64 events) as one statement, the same upsert and insert
//! applied to every row of an `unnest`ed input, so many streams share one
//! commit and one WAL flush. A few batches run at a time; a lone append
//! never waits for a batch. A batch that fails is retried one event at a
//! time, so every caller gets its own answer, and a token collision fails
//! only its own event.
//!
//! Ordering: the upsert takes the stream row's lock and keeps it until
//! commit, so writers of one stream, in any process, are serialized from the
//! moment they draw a sequence number until they commit. Writer *n + 1*
//! can only draw `seq + 1` after writer *n* committed `seq`, hence per-stream
//! sequence order **is** commit order, and a reader that has seen event `k`
//! has already been able to see every event before it: nothing can appear
//! behind its cursor. A global `BIGSERIAL` read as `id > cursor` would not
//! give this (sequence values are drawn before commit, and transactions
//! commit out of order), which is why there is none. Different streams
//! never wait for each other. A batch locks its stream rows in token order,
//! so concurrent batches cannot deadlock each other.
//!
//! The same statement applies the count and byte limits *logically*: it
//! moves `first_seq` past the events they drop, so readers stop seeing them
//! at once, and leaves the rows to `purge_expired`. The upsert also checks
//! that the row's stored stream id is the caller's: if two stream ids ever
//! shared a 120-bit token, the append fails with
//! [`Error::Corrupt`](mcp_event_store_core::Error::Corrupt) rather than
//! mixing two streams.
//!
//! An append that fails with a connection error may or may not have
//! committed: retrying it can store the event twice (under a new id).
//!
//! # Replay
//!
//! One statement per page: the events after the cursor by keyset over the
//! `(token, seq)` primary key, plus the stream's row, in one snapshot; so a
//! page costs O(log n + k) whatever else the store holds. The first page
//! comes with the cursor check (one round trip for a short replay). Pages
//! hold at most [`MAX_PAGE_SIZE`] events, because PostgreSQL 15 answers a
//! larger `LIMIT` with a parallel sequential scan and a sort. The cursor is
//! checked with `dense::check_cursor` and every page with
//! `dense::check_page`, so a replay never has a silent gap (C5).
//!
//! # Retention
//!
//! [`EventStore::purge_expired`](mcp_event_store_core::EventStore::purge_expired)
//! walks the streams in token order, [`BATCH`] streams per planning query,
//! finds for each the first event to keep (by age, count and bytes, each an
//! index probe), and then raises `first_seq` and deletes the rows below it
//! in statements of at most [`BATCH`] rows, so no statement holds locks for
//! long. Streams left empty are dropped; expired sessions go in batches
//! too. The report counts rows physically deleted, including those the count
//! and byte limits had already hidden at append time. Run it on an
//! interval with `mcp_event_store_core::PurgeTask`.
//!
//! At high volume (tens of millions of events a day), row-by-row deletes
//! and the vacuum work they cause dominate. The way to scale is to make
//! expiry by age a matter of dropping partitions: partition `events` by
//! `stored_at` (declarative range partitioning, e.g. hourly, managed by
//! `pg_partman` or a cron job) with the same primary key within each
//! partition, and drop partitions older than `max_age`; keep the count and
//! byte limits for the few streams that outgrow them. Until then, tune
//! autovacuum on `events` (`autovacuum_vacuum_scale_factor = 0.01`) so the
//! deleted rows are reclaimed promptly.
//!
//! # Format (C12)
//!
//! The migrations are the format's history and [`FORMAT_VERSION`] the newest
//! one this release knows. Opening a schema that holds a migration this
//! release does not know (a newer release migrated it) fails with
//! [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat);
//! so does a half-applied migration, or (with `run_migrations` off) a schema
//! that is behind. Rolling upgrades therefore migrate with the new release
//! only once every old instance is gone.
//!
//! # Errors and connections
//!
//! Driver errors become `Error::Backend { backend: "postgres", source }` with
//! the sqlx error as the source. The pool does not ping before each acquire
//! (a round trip that cost 7% of append throughput); after a server restart
//! or `pg_terminate_backend`, each dead idle connection fails one call and
//! is replaced, and the store carries on by itself. TLS: enable one of
//! sqlx's `tls-*` features in your own `Cargo.toml`; Cargo's feature
//! unification turns it on for this crate's sqlx too.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod batch;
mod options;
mod purge;
mod setup;
mod sql;
mod store;

#[cfg(feature = "conformance")]
pub mod testing;

pub use options::{
    DEFAULT_APPLICATION_NAME, DEFAULT_SCHEMA, MAX_PAGE_SIZE, PostgresOptions, validate_schema_name,
};
pub use purge::BATCH;
pub use setup::FORMAT_VERSION;
pub use store::PostgresStore;

/// The backend name in errors and traces.
pub(crate) const BACKEND: &str = "postgres";

/// Wraps a driver error, keeping it as the source.
pub(crate) fn backend(e: sqlx::Error) -> mcp_event_store_core::Error {
    mcp_event_store_core::Error::backend(BACKEND, e)
}
