//! Test support (feature `conformance`): finding a server, isolating each
//! test in its own schema, and the conformance [`Harness`].
//!
//! Tests find their server in this order, and fail (never skip) when none
//! answers:
//!
//! 1. the URL in `MCP_EVENT_STORE_POSTGRES_URL`;
//! 2. `postgres://postgres@127.0.0.1:5432/postgres`, if it answers within a
//!    second;
//! 3. with the `testcontainers` feature, a pinned `postgres` container
//!    ([`CONTAINER_IMAGE`]) started through Docker.

use std::time::Duration;

use async_trait::async_trait;
use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::conformance::Harness;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::OnceCell;

use crate::{PostgresOptions, PostgresStore, validate_schema_name};

/// The environment variable naming the test server.
pub const URL_ENV: &str = "MCP_EVENT_STORE_POSTGRES_URL";
/// The local server tried when the variable is unset.
pub const LOCAL_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// The image the `testcontainers` feature starts, pinned.
pub const CONTAINER_IMAGE: (&str, &str) = ("postgres", "15.10-alpine");

/// The URL of the test server; panics, naming every way to provide one, if
/// there is none.
pub async fn server_url() -> String {
    static URL: OnceCell<String> = OnceCell::const_new();
    URL.get_or_init(find_server).await.clone()
}

async fn find_server() -> String {
    if let Ok(url) = std::env::var(URL_ENV)
        && !url.is_empty()
    {
        return url;
    }
    let local = tokio::time::timeout(Duration::from_secs(1), PgConnection::connect(LOCAL_URL));
    if let Ok(Ok(conn)) = local.await {
        let _ = conn.close().await;
        return LOCAL_URL.to_owned();
    }
    #[cfg(feature = "testcontainers")]
    match container::start().await {
        Ok(url) => return url,
        Err(e) => panic!("{}\n(the container failed: {e})", no_server_message()),
    }
    #[allow(unreachable_code)]
    {
        panic!("{}", no_server_message())
    }
}

fn no_server_message() -> String {
    format!(
        "no PostgreSQL server for the tests. Provide one of:\n\
         1. {URL_ENV}=postgres://user@host:port/db in the environment;\n\
         2. a server at {LOCAL_URL} (trust auth) answering within 1 s;\n\
         3. Docker, and the `testcontainers` feature \
         (cargo test -p mcp-event-store-postgres --features testcontainers), \
         which starts {}:{}.",
        CONTAINER_IMAGE.0, CONTAINER_IMAGE.1
    )
}

#[cfg(feature = "testcontainers")]
mod container {
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};

    /// Starts the container on a thread of its own, whose runtime lives as
    /// long as the test process: each test has its own runtime, and the
    /// container must outlive all of them.
    pub(super) async fn start() -> Result<String, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let (name, tag) = super::CONTAINER_IMAGE;
                let started = GenericImage::new(name, tag)
                    .with_exposed_port(5432.tcp())
                    .with_wait_for(WaitFor::message_on_stderr(
                        "database system is ready to accept connections",
                    ))
                    .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
                    .start()
                    .await;
                let container = match started {
                    Ok(container) => container,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let port = match container.get_host_port_ipv4(5432.tcp()).await {
                    Ok(port) => port,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                // The first "ready" line comes from the init server; wait
                // for the real one to accept connections.
                let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
                for _ in 0..60 {
                    if sqlx::PgPool::connect(&url).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                let _ = tx.send(Ok(url));
                std::future::pending::<()>().await;
                drop(container);
            });
        });
        rx.await.map_err(|e| e.to_string())?
    }
}

/// A fresh schema name, `mcp_test_` and 16 random hex digits.
pub fn random_schema() -> String {
    let n = getrandom::u64().expect("OS randomness");
    format!("mcp_test_{n:016x}")
}

/// Drops a schema and everything in it.
pub async fn drop_schema(url: &str, schema: &str) -> Result<(), sqlx::Error> {
    validate_schema_name(schema).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let mut conn = PgConnection::connect(url).await?;
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&mut conn)
    .await?;
    conn.close().await
}

/// Ends every server connection whose `application_name` is `name`, as a
/// crash, a failover or an operator would; returns how many it ended.
pub async fn terminate_connections(url: &str, name: &str) -> Result<u64, sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
          WHERE application_name = $1 AND pid <> pg_backend_pid()) t",
    )
    .bind(name)
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(ended as u64)
}

/// The conformance harness: one random schema per test, dropped by
/// `teardown` (or, if the test panicked first, when the harness drops).
/// Every `open` makes a new pool on that schema.
#[derive(Debug)]
pub struct PostgresHarness {
    url: String,
    schema: String,
    torn_down: bool,
}

impl PostgresHarness {
    /// A harness on the test server, with a schema of its own.
    pub async fn new() -> Self {
        Self {
            url: server_url().await,
            schema: random_schema(),
            torn_down: false,
        }
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema this harness owns.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Options for a store on this harness's schema.
    pub fn options(&self, store: StoreOptions) -> PostgresOptions {
        PostgresOptions::default()
            .store(store)
            .schema(self.schema.clone())
            .max_connections(8)
    }

    /// Opens a store with these options, panicking on failure.
    pub async fn open_with(&self, options: PostgresOptions) -> PostgresStore {
        PostgresStore::connect_with(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("opening schema {}: {e}", self.schema))
    }
}

#[async_trait]
impl Harness for PostgresHarness {
    type Store = PostgresStore;

    async fn open(&self, options: StoreOptions) -> PostgresStore {
        self.open_with(self.options(options)).await
    }

    async fn close(&self, store: PostgresStore) {
        store.close().await;
    }

    async fn teardown(mut self) {
        drop_schema(&self.url, &self.schema)
            .await
            .unwrap_or_else(|e| panic!("dropping schema {}: {e}", self.schema));
        self.torn_down = true;
    }
}

impl Drop for PostgresHarness {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        // A test panicked before teardown: drop the schema anyway, on a
        // thread with its own runtime since Drop cannot await.
        let url = self.url.clone();
        let schema = self.schema.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(drop_schema(&url, &schema)).ok()
        });
        let _ = cleanup.join();
    }
}
