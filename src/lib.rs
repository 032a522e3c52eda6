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
//!
//! Every backend implements [`EventStore`] and [`SessionStore`] and passes
//! the same conformance suite.
//!
//! With the `rmcp` feature, the `rmcp` module makes any of them (a
//! [`DynStore`] included) a drop-in `EventStore` and `SessionStore` for rmcp
//! 3.9's Streamable HTTP server, and `rmcp::SessionScoped` keeps resumes
//! inside their session. The `resumable_server` example is a complete
//! server: `cargo run --example resumable_server --features rmcp`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::sync::Arc;

pub use mcp_event_store_core::*;

/// The SQLite backend (feature `sqlite`).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use mcp_event_store_sqlite::{Durability, FORMAT_VERSION, SqliteOptions, SqliteStore};
}

/// The PostgreSQL backend (feature `postgres`).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use mcp_event_store_postgres::{
        DEFAULT_SCHEMA, FORMAT_VERSION, PostgresOptions, PostgresStore, validate_schema_name,
    };
}

/// The Redis Streams backend (feature `redis`).
#[cfg(feature = "redis")]
pub mod redis {
    pub use mcp_event_store_redis::{
        DEFAULT_KEY_PREFIX, FORMAT_VERSION, MIN_REDIS_VERSION, RedisOptions, RedisStore,
        validate_prefix,
    };
}

/// The sled backend (feature `sled`).
#[cfg(feature = "sled")]
pub mod sled {
    pub use mcp_event_store_sled::{
        DEFAULT_CACHE_CAPACITY, Durability, FORMAT_VERSION, MAX_FLUSH_INTERVAL, SledOptions,
        SledStore,
    };
}

/// A store of any backend, as [`connect`] returns it.
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
///   keys live under the `mcp-event-store` prefix (or `?prefix=name`).
/// * `sled:///absolute/dir` or `sled://relative/dir` (feature `sled`), with
///   `?flush_interval_ms=N` for interval flushing instead of a flush per
///   append group.
///
/// A URL whose backend is not compiled in is [`Error::BackendNotEnabled`],
/// naming the cargo feature to enable.
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
    match scheme.as_str() {
        "memory" => Ok(Arc::new(MemoryStore::try_with_options(options)?)),
        "sqlite" => open_sqlite(url, options).await,
        "postgres" | "postgresql" => open_postgres(url, scheme, options).await,
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+unix" | "unix"
        | "valkey" | "valkeys" => open_redis(url, scheme, options).await,
        "sled" => open_sled(url, scheme, options).await,
        _ => Err(Error::Config(format!(
            "unknown store URL scheme {scheme:?} (known: memory, sqlite, postgres, redis, sled)"
        ))),
    }
}

#[cfg(not(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "sled"
)))]
fn not_enabled(scheme: String, feature: &'static str) -> Error {
    Error::BackendNotEnabled { scheme, feature }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(url: &str, options: StoreOptions) -> Result<DynStore> {
    let sqlite = sqlite::SqliteOptions::from_url(url)?.store_options(options);
    Ok(Arc::new(sqlite::SqliteStore::open_with(sqlite).await?))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str, _scheme: String, options: StoreOptions) -> Result<DynStore> {
    let (url, schema) = take_query_param(url, "schema");
    let mut postgres = postgres::PostgresOptions::default().store(options);
    if let Some(schema) = schema {
        postgres = postgres.schema(schema);
    }
    Ok(Arc::new(
        postgres::PostgresStore::connect_with(&url, postgres).await?,
    ))
}

/// Removes `name=value` from a URL's query string, returning the URL
/// without it and the value: options of ours that the driver must not see.
#[cfg(any(feature = "postgres", feature = "redis"))]
fn take_query_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((key, v)) if key == name => {
                value = Some(v.to_owned());
                false
            }
            _ => !pair.is_empty(),
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, value)
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str, scheme: String, _options: StoreOptions) -> Result<DynStore> {
    Err(not_enabled(scheme, "postgres"))
}

#[cfg(feature = "redis")]
async fn open_redis(url: &str, _scheme: String, options: StoreOptions) -> Result<DynStore> {
    let (url, prefix) = take_query_param(url, "prefix");
    let mut redis = redis::RedisOptions::default().store(options);
    if let Some(prefix) = prefix {
        redis = redis.key_prefix(prefix);
    }
    Ok(Arc::new(
        redis::RedisStore::connect_with(&url, redis).await?,
    ))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(_url: &str, scheme: String, _options: StoreOptions) -> Result<DynStore> {
    Err(not_enabled(scheme, "redis"))
}

#[cfg(feature = "sled")]
async fn open_sled(url: &str, _scheme: String, options: StoreOptions) -> Result<DynStore> {
    let sled = sled::SledOptions::default().store(options);
    Ok(Arc::new(sled::SledStore::connect_with(url, sled).await?))
}

#[cfg(not(feature = "sled"))]
async fn open_sled(_url: &str, scheme: String, _options: StoreOptions) -> Result<DynStore> {
    Err(not_enabled(scheme, "sled"))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_url: &str, _options: StoreOptions) -> Result<DynStore> {
    Err(not_enabled("sqlite".into(), "sqlite"))
}
