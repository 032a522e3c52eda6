//! Test support: finding a Redis server and running the shared conformance
//! suite on it.
//!
//! The server is found in this order, and the tests fail (never skip) when
//! none is found:
//!
//! 1. the `MCP_EVENT_STORE_REDIS_URL` environment variable;
//! 2. the local default `redis://127.0.0.1:6379`, if it answers `PING`
//!    within a second;
//! 3. with the `testcontainers` feature, a container of a pinned Redis 7
//!    image.
//!
//! Every harness works under its own random key prefix and removes every key
//! under it in [`Harness::teardown`], so tests run in parallel on one server.
//!
//! ```ignore
//! use mcp_event_store_redis::testing::RedisHarness;
//! mcp_event_store_core::conformance_tests!(RedisHarness::new(), persistent);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::conformance::Harness;
use tokio::sync::OnceCell;

use crate::{RedisOptions, RedisStore};

/// The environment variable naming the test server.
pub const URL_VAR: &str = "MCP_EVENT_STORE_REDIS_URL";
/// The server tried when the variable is unset.
pub const LOCAL_DEFAULT: &str = "redis://127.0.0.1:6379";
/// The image used with the `testcontainers` feature (Redis 7, pinned).
pub const CONTAINER_IMAGE: (&str, &str) = ("redis", "7.2.5-alpine");

static SERVER: OnceCell<String> = OnceCell::const_new();

/// The URL of the Redis server tests should use, found once per process.
///
/// # Panics
///
/// When no server is found, with a message naming every way to provide one.
pub async fn server_url() -> String {
    SERVER
        .get_or_init(|| async {
            match find_server().await {
                Ok(url) => url,
                Err(why) => panic!(
                    "no Redis server for the tests ({why}). Provide one of: \
                     (1) set {URL_VAR}=redis://host:port; \
                     (2) run Redis on {LOCAL_DEFAULT} (e.g. `redis-server --port 6379 --save '' --appendonly no`); \
                     (3) build with `--features testcontainers` and a working Docker, to start {}:{}",
                    CONTAINER_IMAGE.0, CONTAINER_IMAGE.1
                ),
            }
        })
        .await
        .clone()
}

async fn find_server() -> Result<String, String> {
    if let Ok(url) = std::env::var(URL_VAR) {
        return answers(&url, Duration::from_secs(5))
            .await
            .map(|()| url)
            .map_err(|e| format!("{URL_VAR} is set but its server does not answer: {e}"));
    }
    let local = answers(LOCAL_DEFAULT, Duration::from_secs(1)).await;
    if local.is_ok() {
        return Ok(LOCAL_DEFAULT.to_owned());
    }
    #[cfg(feature = "testcontainers")]
    {
        container::start().await.map_err(|e| {
            format!(
                "{URL_VAR} is unset, {LOCAL_DEFAULT} does not answer, and the container failed: {e}"
            )
        })
    }
    #[cfg(not(feature = "testcontainers"))]
    Err(format!(
        "{URL_VAR} is unset and {LOCAL_DEFAULT} does not answer: {}",
        local.unwrap_err()
    ))
}

/// Whether the server at `url` answers `PING` within `within`.
pub async fn answers(url: &str, within: Duration) -> Result<(), String> {
    let ping = async {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(within, ping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("no answer within {within:?}")),
    }
}

#[cfg(feature = "testcontainers")]
mod container {
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, GenericImage};
    use tokio::sync::OnceCell;

    /// Kept for the life of the test process.
    static CONTAINER: OnceCell<ContainerAsync<GenericImage>> = OnceCell::const_new();

    pub async fn start() -> Result<String, String> {
        let container = CONTAINER
            .get_or_try_init(|| async {
                GenericImage::new(super::CONTAINER_IMAGE.0, super::CONTAINER_IMAGE.1)
                    .with_exposed_port(6379.tcp())
                    .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
                    .start()
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
        let host = container.get_host().await.map_err(|e| e.to_string())?;
        let port = container
            .get_host_port_ipv4(6379)
            .await
            .map_err(|e| e.to_string())?;
        Ok(format!("redis://{host}:{port}"))
    }
}

/// A fresh key prefix for one test: `mcp-es-test-<random hex>`.
pub fn random_prefix() -> String {
    let key = StreamKey::generate().expect("OS randomness");
    let hex: String = key.as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("mcp-es-test-{hex}")
}

/// The conformance harness: one server, one random key prefix per harness.
/// Every [`open`](Harness::open) is a new connection on that prefix, which is
/// exactly a reopen, so the `persistent` cases apply.
///
/// Clones share the prefix. [`Harness::teardown`] removes every key under it;
/// if a test panics before that, the last clone to drop removes them instead
/// (best effort, through a plain blocking connection), so a failing test
/// leaves nothing behind on a shared server either.
#[derive(Debug, Clone)]
pub struct RedisHarness {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    url: String,
    prefix: String,
    torn_down: AtomicBool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if !self.torn_down.load(Ordering::SeqCst) {
            remove_prefix_blocking(&self.url, &self.prefix);
        }
    }
}

/// Removes every key under `prefix` on each node the URL names, ignoring
/// errors: the panic-path fallback of [`Harness::teardown`].
fn remove_prefix_blocking(url: &str, prefix: &str) {
    let nodes = match RedisOptions::default()
        .with_url(url)
        .map(|(_, target)| target)
    {
        Ok(crate::conn::Target::Standalone(url)) => vec![url],
        Ok(crate::conn::Target::Cluster(nodes)) => nodes,
        Err(_) => return,
    };
    for node in nodes {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            continue;
        };
        let mut cursor = 0u64;
        loop {
            let Ok((next, keys)): redis::RedisResult<(u64, Vec<Vec<u8>>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}:*"))
                .arg("COUNT")
                .arg(500)
                .query(&mut conn)
            else {
                break;
            };
            for key in keys {
                let _: redis::RedisResult<u64> = redis::cmd("UNLINK").arg(key).query(&mut conn);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
}

impl RedisHarness {
    /// A harness on the test server (see [`server_url`]).
    pub async fn new() -> Self {
        Self::with_url(server_url().await).await
    }

    /// A harness on the server or cluster at `url`.
    pub async fn with_url(url: impl Into<String>) -> Self {
        Self {
            shared: Arc::new(Shared {
                url: url.into(),
                prefix: random_prefix(),
                torn_down: AtomicBool::new(false),
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
        RedisStore::connect_with(self.url(), self.options(options))
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()))
    }

    /// Removes every key under this harness's prefix, on every master of a
    /// cluster (`SCAN` + `UNLINK`), through a connection of its own while the
    /// stores stay open: to this store, exactly what a Redis restarted
    /// without persistence does (the server's loaded scripts stay, which
    /// only spares the stores one `SCRIPT LOAD`).
    async fn lose_data(&self) -> bool {
        let (_, target) = RedisOptions::default()
            .with_url(self.url())
            .unwrap_or_else(|e| panic!("bad test server URL {}: {e}", self.url()));
        let conn = crate::setup::connect(&target, Duration::from_secs(30), Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()));
        crate::purge::unlink_matching(&conn, &format!("{}:*", self.prefix()))
            .await
            .unwrap_or_else(|e| panic!("removing the keys under {} failed: {e}", self.prefix()));
        true
    }

    async fn teardown(self) {
        let store = RedisStore::connect_with(self.url(), self.options(StoreOptions::default()))
            .await
            .unwrap_or_else(|e| panic!("connecting to {} for teardown failed: {e}", self.url()));
        store
            .destroy()
            .await
            .unwrap_or_else(|e| panic!("removing the keys under {} failed: {e}", self.prefix()));
        self.shared.torn_down.store(true, Ordering::SeqCst);
    }
}
