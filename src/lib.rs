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
//! # Backends and features
//!
//! | feature | backend | URL |
//! |---|---|---|
//! | (always) | [`MemoryStore`] | `memory://` |
//! | `sqlite` (default) | `sqlite::SqliteStore` | `sqlite://events.db`, `sqlite:///abs/path.db` |
//! | `postgres` | `postgres::PostgresStore` | `postgres://user@host/db`, `?schema=name` |
//! | `redis` | `redis::RedisStore` | `redis://host:6379`, `redis+cluster://h1:7000,h2:7001` |
//! | `sled` | `sled::SledStore` | `sled:///var/lib/app/events` |
//! | `full` | every backend above, and `rmcp` | |
//! | `tower-mcp` (in `full`) | adapters for tower-mcp 0.25 (Rust 1.90) | |
//!
//! Every backend implements [`EventStore`], [`SessionStore`] and
//! [`TaskStore`](task::TaskStore) and passes the same conformance suites:
//! the handle [`connect`] returns serves resumable streams (MCP up to
//! 2025-11-25) and durable tasks (SEP-2663, MCP 2026-07-28) from one URL.
//!
//! # Durable tasks
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store::Result<()> {
//! use std::time::Duration;
//! use mcp_event_store::task::{Finish, InstanceId, NewTask, Owner, TaskStatus, TaskStore, WorkerChange};
//!
//! let store = mcp_event_store::connect("memory://").await?;
//! let me = InstanceId::generate()?;
//! store.heartbeat(me, Duration::from_secs(30)).await?;
//! let owner = Owner::principal(b"alice")?;
//! let (id, _) = store.create(NewTask::new(&owner, me)).await?;
//! store.apply(&id, me, WorkerChange::Finish(Finish::Completed(br#"{"content":[]}"#))).await?;
//! // Any instance sharing the store answers `tasks/get` for its owner:
//! let task = store.get(&id.to_string(), &owner).await?.expect("the task");
//! assert_eq!(task.status, TaskStatus::Completed);
//! # Ok(()) }
//! ```
//!
//! With the `rmcp` feature, the `rmcp` module makes any of them (a
//! [`DynStore`] included) a drop-in `EventStore` and `SessionStore` for rmcp
//! 3.9's Streamable HTTP server, `rmcp::SessionScoped` keeps resumes
//! inside their session, and `rmcp::tasks::DurableTasks` serves the tasks
//! extension from the same store. The `resumable-server` package
//! (`examples/resumable-server`) is a complete server:
//! `cargo run -p resumable-server`.
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
pub use mcp_event_store_core::task;
pub use mcp_event_store_core::{
    Backend, BoxError, Clock, Connecting, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PAGE_SIZE, Error,
    EventId, EventStore, FollowOptions, HealthReport, MAX_EVENT_ID_LEN, MAX_LIST_PAGE,
    MAX_STREAM_ID_LEN, ManualClock, MemoryStore, NewEvent, Position, Presence, PurgeReport,
    PurgeTask, Replay, Result, Retention, SessionStore, Setting, Store, StoreOptions, StoreStats,
    StoredEvent, StreamCursor, StreamInfo, StreamPage, SystemClock, Verdict, observe,
};
/// rmcp, the official Rust MCP SDK (feature `rmcp`): the whole
/// `mcp-event-store-rmcp` crate.
#[cfg(feature = "rmcp")]
pub use mcp_event_store_rmcp as rmcp;

/// With the `tower-mcp` feature: any store as tower-mcp 0.25's event store,
/// session store and task store (the crate `mcp-event-store-tower-mcp`,
/// which needs Rust 1.90).
#[cfg(feature = "tower-mcp")]
pub use mcp_event_store_tower_mcp as tower_mcp;

/// The backends behind a cargo feature, one line each: module, crate,
/// feature, its test harness, and its URL schemes (so that a scheme whose
/// feature is off still names the feature; `tests/connect.rs` checks them
/// against each crate's `BACKEND.schemes`). For each line this re-exports
/// the whole crate as the module (under its feature), lists its `BACKEND` in
/// [`backends`], its schemes in [`KNOWN_SCHEMES`], and (feature `testing`)
/// its test storage in `testing::storages`.
macro_rules! backends {
    ($($module:ident: $krate:ident, $feature:literal, $harness:ident,
        [$($scheme:literal),+ $(,)?];)+) => {
        $(
            #[doc = concat!("The `", $feature, "` backend (feature `", $feature, "`): the whole `",
                stringify!($krate), "` crate.")]
            #[cfg(feature = $feature)]
            pub use $krate as $module;
        )+

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
        /// without naming it.
        #[cfg(feature = "testing")]
        pub mod testing {
            pub use mcp_event_store_core::conformance::UrlHarness;

            use crate::Backend;

            /// Fresh private storage on each persistent backend compiled in
            /// (every one but `memory://`, which is private to each
            /// `connect`), with its descriptor, in [`backends`](crate::backends)
            /// order. Server-backed storage is a schema or key prefix of its
            /// own on the test server, found as
            /// `mcp_event_store_core::testkit::find_server` says (never
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
            /// is `memory`).
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
                        return Some(Box::new(crate::$module::testing::$harness::new().await));
                    }
                )+
                let _ = name;
                None
            }
        }
    };
}

backends! {
    sqlite: mcp_event_store_sqlite, "sqlite", SqliteHarness, ["sqlite"];
    postgres: mcp_event_store_postgres, "postgres", PostgresHarness, ["postgres", "postgresql"];
    redis: mcp_event_store_redis, "redis", RedisHarness, [
        "redis", "rediss", "redis+unix", "unix", "redis+cluster", "rediss+cluster",
        "valkey", "valkeys", "valkey+unix", "valkey+cluster", "valkeys+cluster",
    ];
    sled: mcp_event_store_sled, "sled", SledHarness, ["sled"];
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
