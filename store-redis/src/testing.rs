//! Test support (feature `conformance`): the Redis server the tests use and
//! the harness that runs the shared conformance suite on it, built on
//! [`mcp_event_store_conformance::testkit`].
//!
//! The server is found as [`testkit::find_server`] says, and the tests fail
//! (never skip) when none is found:
//!
//! 1. the `MCP_EVENT_STORE_REDIS_URL` environment variable;
//! 2. the local default `redis://127.0.0.1:6379`, if it answers `PING`
//!    within a second;
//! 3. with the `testcontainers` feature, a container of a pinned Redis 7
//!    image ([`SERVER`]; `MCP_EVENT_STORE_REDIS_IMAGE=name:tag` starts
//!    another image).
//!
//! `MCP_EVENT_STORE_TEST_SERVER=env`, `local` or `container` uses only that
//! way.
//!
//! Every harness works under its own random key prefix, a
//! [`Namespace`] whose keys [`Harness::teardown`] removes (and the guard's
//! drop, when a test panics first), so tests run in parallel on one server.
//!
//! ```ignore
//! use mcp_event_store_redis::testing::RedisHarness;
//! mcp_event_store_conformance::event_suite!(RedisHarness::new(), persistent);
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use mcp_event_store_conformance::events::{Harness, PersistentHarness, UrlHarness};
use mcp_event_store_conformance::tasks::{NO_RECHECK, PersistentTaskHarness, TaskHarness};
use mcp_event_store_conformance::testkit::{self, Container, Namespace, ServerSpec};
use mcp_event_store_core::{Result, StoreOptions};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::conn::{Conn, Target};
use crate::error::backend;
use crate::keys::Keys;
use crate::{FORMAT_VERSION, RedisOptions, RedisStore};

/// Where the tests find their Redis: `MCP_EVENT_STORE_REDIS_URL`, else
/// `redis://127.0.0.1:6379`, else (feature `testcontainers`) a
/// `redis:7.2.5-alpine` container.
pub const SERVER: ServerSpec = ServerSpec {
    name: "Redis",
    env: "MCP_EVENT_STORE_REDIS_URL",
    local: "redis://127.0.0.1:6379",
    container: Container {
        image: "redis",
        tag: "7.2.5-alpine",
        image_env: "MCP_EVENT_STORE_REDIS_IMAGE",
        port: 6379,
        ready_on_stderr: false,
        ready_message: "Ready to accept connections",
        env: &[],
        cmd: &[],
        url: |host, port| format!("redis://{host}:{port}"),
    },
};

/// The start of every test key prefix ([`random_prefix`], [`namespace`]).
pub const TEST_PREFIX: &str = "mcp-es-test-";

/// The URL of the Redis server tests should use, found once per process
/// ([`testkit::find_server`] with [`SERVER`]).
///
/// # Panics
///
/// When no server is found, with a message naming every way to provide one.
pub async fn server_url() -> String {
    testkit::find_server(&SERVER, probe).await
}

/// Whether the server at `url` answers `PING`.
fn probe(url: String) -> BoxFuture<'static, std::result::Result<(), String>> {
    Box::pin(async move {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// A fresh key prefix, `mcp-es-test-<16 random hex digits>`, that nothing
/// removes: for code that removes its keys itself (or a server it throws
/// away). Tests on a shared server take a [`namespace`] instead.
pub fn random_prefix() -> String {
    format!("{TEST_PREFIX}{}", testkit::random_suffix())
}

/// A key prefix of one test's own on the server or cluster at `url`
/// (`mcp-es-test-<random hex>`): [`Namespace::remove`] removes every key
/// under it, on every master, and so does dropping the guard if the test
/// panicked first.
pub fn namespace(url: &str) -> Namespace {
    let url = url.to_owned();
    Namespace::new(TEST_PREFIX, move |prefix| {
        Box::pin(async move {
            remove_prefix(&url, &prefix)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    })
}

/// A connection of its own to the server or cluster `url` names (this
/// crate's URL parameters are allowed and ignored). A standalone server is
/// tried once, without the store's reconnect retries, so a guard dropped
/// after its private server went fails at once.
async fn connect(url: &str) -> Result<Conn> {
    let (_, target) = RedisOptions::default().with_url(url)?;
    match &target {
        Target::Standalone(url) => {
            let client = redis::Client::open(url.as_str()).map_err(backend)?;
            let config = ConnectionManagerConfig::new()
                .set_number_of_retries(0)
                .set_connection_timeout(Some(Duration::from_secs(5)))
                .set_response_timeout(Some(Duration::from_secs(30)));
            Ok(Conn::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(backend)?,
            ))
        }
        Target::Cluster(_) => {
            crate::setup::connect(&target, Duration::from_secs(30), Duration::from_secs(5)).await
        }
    }
}

/// Removes every key under `prefix` (`SCAN` + `UNLINK` on every master).
async fn remove_prefix(url: &str, prefix: &str) -> Result<u64> {
    let conn = connect(url).await?;
    crate::purge::unlink_matching(&conn, &format!("{prefix}:*")).await
}

/// `url` with the `prefix` parameter set: a store URL for that prefix.
fn with_prefix(url: &str, prefix: &str) -> String {
    let (rest, fragment) = match url.split_once('#') {
        Some((rest, fragment)) => (rest, format!("#{fragment}")),
        None => (url, String::new()),
    };
    let separator = if rest.contains('?') { '&' } else { '?' };
    format!("{rest}{separator}prefix={prefix}{fragment}")
}

/// The server URL and the key prefix of a [`PersistentHarness::locator`].
fn split_locator(locator: &str) -> (String, String) {
    let prefix = RedisOptions::from_url(locator)
        .unwrap_or_else(|e| panic!("not a Redis harness locator ({e})"))
        .key_prefix;
    let (rest, fragment) = match locator.split_once('#') {
        Some((rest, fragment)) => (rest, format!("#{fragment}")),
        None => (locator, String::new()),
    };
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.starts_with("prefix="))
        .collect();
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    (format!("{base}{query}{fragment}"), prefix)
}

/// The conformance harness: one server, one key prefix ([`namespace`]) per
/// harness. Every [`open`](Harness::open) is a new connection on that
/// prefix, which is exactly a reopen, so the `persistent` cases apply.
///
/// Clones share the prefix. [`Harness::teardown`] removes every key under
/// it; if a test panics before that, the prefix's [`Namespace`] guard
/// removes them when the last clone drops, so a failing test leaves
/// nothing behind on a shared server either. A harness made by
/// [`attach`](PersistentHarness::attach) removes nothing. As a
/// [`UrlHarness`], its URL is the server's with `?prefix=`.
#[derive(Debug, Clone)]
pub struct RedisHarness {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    url: String,
    prefix: String,
    /// Until the teardown removes it.
    namespace: Mutex<Option<Namespace>>,
}

impl RedisHarness {
    /// A harness on the test server (see [`server_url`]).
    pub async fn new() -> Self {
        Self::with_url(server_url().await).await
    }

    /// A harness on the server or cluster at `url`, under a prefix of its
    /// own.
    pub async fn with_url(url: impl Into<String>) -> Self {
        let url = url.into();
        let namespace = namespace(&url);
        Self::on(url, namespace)
    }

    fn on(url: String, namespace: Namespace) -> Self {
        Self {
            shared: Arc::new(Shared {
                url,
                prefix: namespace.name().to_owned(),
                namespace: Mutex::new(Some(namespace)),
            }),
        }
    }

    /// The server URL.
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// This harness's key prefix.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The options `open` uses: the given store options under this prefix.
    pub fn options(&self, store: StoreOptions) -> RedisOptions {
        RedisOptions::default()
            .store(store)
            .key_prefix(self.prefix())
    }
}

#[async_trait]
impl Harness for RedisHarness {
    type Store = RedisStore;

    async fn open(&self, options: StoreOptions) -> RedisStore {
        self.try_open(options)
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()))
    }

    async fn close(&self, store: RedisStore) {
        store.close().await;
    }

    /// Removes every key under this harness's prefix, on every master of a
    /// cluster (`SCAN` + `UNLINK`), through a connection of its own while the
    /// stores stay open: to this store, exactly what a Redis restarted
    /// without persistence does (the server's loaded scripts stay, which
    /// only spares the stores one `SCRIPT LOAD`).
    async fn lose_data(&self) -> bool {
        remove_prefix(self.url(), self.prefix())
            .await
            .unwrap_or_else(|e| panic!("removing the keys under {} failed: {e}", self.prefix()));
        true
    }

    /// Redemption keys expire by Redis's own clock (`PXAT`, C21).
    fn forgets_redemptions_itself(&self) -> bool {
        true
    }

    async fn teardown(self) {
        let namespace = self
            .shared
            .namespace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(namespace) = namespace {
            namespace.remove().await;
        }
    }
}

#[async_trait]
impl PersistentHarness for RedisHarness {
    /// The server URL with this harness's prefix as its `prefix` parameter:
    /// a store URL another process (or the command line) can open.
    fn locator(&self) -> String {
        with_prefix(self.url(), self.prefix())
    }

    async fn attach(locator: &str) -> Self {
        let (url, prefix) = split_locator(locator);
        Self::on(url, Namespace::borrowed(prefix))
    }

    async fn try_open(&self, options: StoreOptions) -> Result<RedisStore> {
        RedisStore::connect_with(self.url(), self.options(options)).await
    }

    fn format_version(&self) -> u64 {
        u64::from(FORMAT_VERSION)
    }

    /// Sets the `<prefix>:format` marker key, where every release keeps it.
    async fn set_format_version(&self, version: u64) {
        let key = Keys::new(self.prefix())
            .expect("a valid test prefix")
            .format();
        let mut conn = connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()));
        redis::cmd("SET")
            .arg(&key)
            .arg(version.to_string())
            .query_async::<()>(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("setting {key} failed: {e}"));
    }

    /// Every key under the harness's prefix with its value, read by type,
    /// from every node of a cluster.
    async fn stored_bytes(&self) -> Vec<u8> {
        let conn = connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()));
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for node in crate::conn::nodes(&conn).await.expect("the server's nodes") {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}*", self.prefix()))
                    .arg("COUNT")
                    .arg(1_000);
                let (next, page): (u64, Vec<Vec<u8>>) = node
                    .query(&conn, &scan)
                    .await
                    .expect("scan the prefix's keys");
                keys.extend(page);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        let mut bytes = Vec::new();
        for key in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut conn.clone())
                .await
                .expect("TYPE");
            let read = match kind.as_str() {
                "string" => redis::cmd("GET").arg(&key).clone(),
                "hash" => redis::cmd("HGETALL").arg(&key).clone(),
                "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone(),
                "set" => redis::cmd("SMEMBERS").arg(&key).clone(),
                "zset" => redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .clone(),
                "stream" => redis::cmd("XRANGE").arg(&key).arg("-").arg("+").clone(),
                _ => continue,
            };
            let value: redis::Value = read
                .query_async(&mut conn.clone())
                .await
                .unwrap_or_else(|e| panic!("reading a key failed: {e}"));
            bytes.extend(key);
            flatten(&value, &mut bytes);
        }
        bytes
    }
}

#[async_trait]
impl UrlHarness for RedisHarness {
    /// The server URL with this harness's prefix as its `prefix` parameter
    /// (the same as its [`locator`](PersistentHarness::locator)).
    fn url(&self) -> String {
        with_prefix(&self.shared.url, &self.shared.prefix)
    }

    async fn remove(self: Box<Self>) {
        Harness::teardown(*self).await;
    }
}

/// The task suite on Redis: every [`open`](TaskHarness::open) is a new
/// connection on the harness's prefix, and
/// [`raw_rows`](TaskHarness::raw_rows) dumps every key under it.
#[async_trait]
impl TaskHarness for RedisHarness {
    type Store = RedisStore;

    async fn open(&self, options: StoreOptions) -> RedisStore {
        Harness::open(self, options).await
    }

    /// A handle whose watches re-read only when woken (the safety-net
    /// re-read an hour away).
    async fn open_without_recheck(&self, options: StoreOptions) -> RedisStore {
        RedisStore::connect_with(self.url(), self.options(options).follow_recheck(NO_RECHECK))
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()))
    }

    async fn close(&self, store: RedisStore) {
        Harness::close(self, store).await;
    }

    /// The store's own rewriter (C22): every backend store hands one out.
    fn rewriter<'s>(
        &self,
        store: &'s RedisStore,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }

    /// Every key under this harness's prefix with its value (`key |
    /// value`), through a handle of its own.
    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        let store = Harness::open(self, StoreOptions::default()).await;
        let rows = crate::tasks::raw_rows(&store)
            .await
            .unwrap_or_else(|e| panic!("dumping the keys under {} failed: {e}", self.prefix()));
        store.close().await;
        Some(rows)
    }

    async fn teardown(self) {
        Harness::teardown(self).await;
    }
}

/// Redis has no task format marker to check on connect: each task's value
/// starts with its format (core's `codec::VALUE_VERSION`), checked when the
/// task is read or written.
#[async_trait]
impl PersistentTaskHarness for RedisHarness {
    fn task_format_version(&self) -> u64 {
        u64::from(mcp_event_store_core::backend::task::codec::VALUE_VERSION)
    }

    /// Rewrites the format byte of every task value under the prefix, as a
    /// release writing that format would have stored them.
    async fn set_task_format_version(&self, version: u64) {
        let version = u8::try_from(version).expect("task value formats are one byte");
        let store = Harness::open(self, StoreOptions::default()).await;
        crate::tasks::set_task_format(&store, version)
            .await
            .unwrap_or_else(|e| panic!("rewriting the tasks under {} failed: {e}", self.prefix()));
        store.close().await;
    }
}

/// Every byte string in a reply, one after another.
fn flatten(value: &redis::Value, out: &mut Vec<u8>) {
    match value {
        redis::Value::BulkString(bytes) => out.extend_from_slice(bytes),
        redis::Value::SimpleString(text) => out.extend_from_slice(text.as_bytes()),
        redis::Value::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|item| flatten(item, out))
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locators_carry_the_prefix_and_give_it_back() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
            "rediss://h:1/2?protocol=resp3#insecure",
        ] {
            let locator = with_prefix(url, "mcp-es-test-00ff");
            RedisOptions::from_url(&locator).unwrap();
            assert_eq!(
                split_locator(&locator),
                (url.to_owned(), "mcp-es-test-00ff".to_owned())
            );
        }
    }

    #[test]
    fn test_prefixes_are_valid_and_differ() {
        let (a, b) = (random_prefix(), random_prefix());
        assert_ne!(a, b);
        crate::validate_prefix(&a).unwrap();
        assert!(a.starts_with(TEST_PREFIX));
    }
}
