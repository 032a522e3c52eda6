//! Test support (feature `conformance`): the test server, a schema per
//! test, and the conformance harness [`PostgresHarness`], all on
//! [`mcp_event_store_conformance::testkit`].
//!
//! Tests find their server as [`SERVER`] describes, and fail (never skip)
//! when none answers:
//!
//! 1. the URL in `MCP_EVENT_STORE_POSTGRES_URL`;
//! 2. `postgres://postgres@127.0.0.1:5432/postgres`, if it answers within a
//!    second;
//! 3. with the `testcontainers` feature, a pinned `postgres` container
//!    started through Docker (`MCP_EVENT_STORE_POSTGRES_IMAGE=name:tag`
//!    starts another image).
//!
//! `MCP_EVENT_STORE_TEST_SERVER=env`, `local` or `container` uses only that
//! way ([`testkit::find_server`]).
//!
//! Each test works in a schema of its own ([`namespace`]), dropped when
//! the test ends, also when it panics.

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use mcp_event_store_conformance::events::{Harness, PersistentHarness, UrlHarness};
use mcp_event_store_conformance::tasks::{NO_RECHECK, PersistentTaskHarness, TaskHarness};
use mcp_event_store_conformance::testkit::{self, Container, Namespace, ServerSpec};
use mcp_event_store_core::{Result, StoreOptions};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::options::schema_and_driver_url;
use crate::setup::MIGRATOR;
use crate::{FORMAT_VERSION, PostgresOptions, PostgresStore, validate_schema_name};

/// Where the tests find their PostgreSQL server (see the module docs).
pub const SERVER: ServerSpec = ServerSpec {
    name: "PostgreSQL",
    env: "MCP_EVENT_STORE_POSTGRES_URL",
    local: "postgres://postgres@127.0.0.1:5432/postgres",
    container: Container {
        image: "postgres",
        tag: "15.10-alpine",
        image_env: "MCP_EVENT_STORE_POSTGRES_IMAGE",
        port: 5432,
        ready_on_stderr: true,
        ready_message: "database system is ready to accept connections",
        env: &[("POSTGRES_HOST_AUTH_METHOD", "trust")],
        cmd: &[],
        url: |host, port| format!("postgres://postgres@{host}:{port}/postgres"),
    },
};

/// The prefix of every test schema's name.
pub const SCHEMA_PREFIX: &str = "mcp_test_";

/// The URL of the test server, found once per process
/// ([`testkit::find_server`] with [`SERVER`]); panics, naming every way to
/// provide one, if there is none.
pub async fn server_url() -> String {
    testkit::find_server(&SERVER, probe).await
}

/// Whether a server answers at `url`: a connection opens and closes.
fn probe(url: String) -> BoxFuture<'static, std::result::Result<(), String>> {
    Box::pin(async move {
        let conn = PgConnection::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        conn.close().await.map_err(|e| e.to_string())
    })
}

/// A fresh schema name, [`SCHEMA_PREFIX`] and 16 random hex digits.
pub fn random_schema() -> String {
    format!("{SCHEMA_PREFIX}{}", testkit::random_suffix())
}

/// A fresh schema on the server at `url`, dropped (with everything in it)
/// by [`Namespace::remove`], or when the guard drops.
pub fn namespace(url: &str) -> Namespace {
    let url = url.to_owned();
    Namespace::new(SCHEMA_PREFIX, move |schema| {
        Box::pin(async move { drop_schema(&url, &schema).await.map_err(|e| e.to_string()) })
    })
}

/// Drops a schema and everything in it.
///
/// A server under test may still write to it (a runtime's last renewal or
/// purge): the drop locks table after table, so the server can pick it as
/// a deadlock's victim. It is tried again then, a few times.
pub async fn drop_schema(url: &str, schema: &str) -> std::result::Result<(), sqlx::Error> {
    validate_schema_name(schema).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let mut conn = PgConnection::connect(url).await?;
    let drop = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
    let mut tries = 0;
    loop {
        match sqlx::query(AssertSqlSafe(drop.clone()))
            .execute(&mut conn)
            .await
        {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40P01") && tries < 5 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            done => {
                done?;
                return conn.close().await;
            }
        }
    }
}

/// Ends every server connection whose `application_name` is `name`, as a
/// crash, a failover or an operator would; returns how many it ended.
pub async fn terminate_connections(url: &str, name: &str) -> std::result::Result<u64, sqlx::Error> {
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

/// Records format `version` in `schema` where the migrations record it: a
/// successful row of `_sqlx_migrations` for every version up to it (this
/// release's own migrations as they are, newer ones as a newer release
/// would have left them), none after it.
async fn record_format(
    url: &str,
    schema: &str,
    version: i64,
) -> std::result::Result<(), sqlx::Error> {
    validate_schema_name(schema).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let table = format!("\"{schema}\"._sqlx_migrations");
    let mut conn = PgConnection::connect(url).await?;
    let mut tx = conn.begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE version > $1"
    )))
    .bind(version)
    .execute(&mut *tx)
    .await?;
    for v in 1..=version {
        let (description, checksum) = match MIGRATOR.iter().find(|m| m.version == v) {
            Some(migration) => (
                migration.description.to_string(),
                migration.checksum.to_vec(),
            ),
            None => (format!("format {v} of a newer release"), vec![0]),
        };
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (version, description, success, checksum, execution_time) \
             VALUES ($1, $2, true, $3, 0) ON CONFLICT (version) DO NOTHING"
        )))
        .bind(v)
        .bind(description)
        .bind(checksum)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    conn.close().await
}

/// The conformance harness: a schema of its own on the test server (a
/// [`Namespace`], dropped by `teardown`, or when the harness drops after
/// a panic). Every `open` makes a new pool on that schema.
///
/// Its [`locator`](PersistentHarness::locator) is a connection URL, the
/// server's with `schema=` added, which
/// [`PostgresStore::connect`] opens as it is.
#[derive(Debug)]
pub struct PostgresHarness {
    /// The server's URL, without this crate's parameters.
    url: String,
    namespace: Namespace,
}

impl PostgresHarness {
    /// A harness on the test server, with a schema of its own.
    pub async fn new() -> Self {
        let (_, url) = schema_and_driver_url(&server_url().await)
            .unwrap_or_else(|e| panic!("the test server's URL: {e}"));
        Self {
            namespace: namespace(&url),
            url,
        }
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema this harness works in.
    pub fn schema(&self) -> &str {
        self.namespace.name()
    }

    /// Options for a store on this harness's schema.
    pub fn options(&self, store: StoreOptions) -> PostgresOptions {
        PostgresOptions::default()
            .store(store)
            .schema(self.schema())
            .max_connections(8)
    }

    /// Opens a store with these options, panicking on failure.
    pub async fn open_with(&self, options: PostgresOptions) -> PostgresStore {
        PostgresStore::connect_with(&self.url, options)
            .await
            .unwrap_or_else(|e| panic!("opening schema {}: {e}", self.schema()))
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

    async fn teardown(self) {
        self.namespace.remove().await;
    }
}

/// The server's URL with `?schema=` ([`PersistentHarness::locator`]);
/// removing it drops the schema.
#[async_trait]
impl UrlHarness for PostgresHarness {
    fn url(&self) -> String {
        self.locator()
    }

    async fn remove(self: Box<Self>) {
        Harness::teardown(*self).await;
    }
}

#[async_trait]
impl PersistentHarness for PostgresHarness {
    /// The server's URL with `schema=<schema>` added, e.g.
    /// `postgres://postgres@127.0.0.1:5432/postgres?schema=mcp_test_0123456789abcdef`.
    fn locator(&self) -> String {
        let (base, fragment) = match self.url.split_once('#') {
            Some((base, fragment)) => (base, Some(fragment)),
            None => (self.url.as_str(), None),
        };
        let separator = if base.contains('?') { '&' } else { '?' };
        let mut locator = format!("{base}{separator}schema={}", self.schema());
        if let Some(fragment) = fragment {
            locator.push('#');
            locator.push_str(fragment);
        }
        locator
    }

    async fn attach(locator: &str) -> Self {
        let (schema, url) = schema_and_driver_url(locator)
            .unwrap_or_else(|e| panic!("the locator {locator:?}: {e}"));
        let schema = schema.unwrap_or_else(|| panic!("the locator {locator:?} names no schema"));
        Self {
            url,
            namespace: Namespace::borrowed(schema),
        }
    }

    async fn try_open(&self, options: StoreOptions) -> Result<PostgresStore> {
        PostgresStore::connect_with(&self.url, self.options(options)).await
    }

    fn format_version(&self) -> u64 {
        FORMAT_VERSION as u64
    }

    async fn set_format_version(&self, version: u64) {
        let version = i64::try_from(version).expect("a format version within BIGINT");
        record_format(&self.url, self.schema(), version)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "recording format {version} in schema {}: {e}",
                    self.schema()
                )
            });
    }

    /// Every row of every table in the harness's schema, as PostgreSQL's
    /// text form of the row (`bytea` as hex).
    async fn stored_bytes(&self) -> Vec<u8> {
        let mut conn = PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url));
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
        )
        .bind(self.schema())
        .fetch_all(&mut conn)
        .await
        .expect("list the schema's tables");
        let mut bytes = Vec::new();
        for table in tables {
            let rows: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT t::text FROM \"{}\".\"{table}\" t",
                self.schema()
            )))
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("dumping {table} failed: {e}"));
            for row in rows {
                bytes.extend(row.into_bytes());
                bytes.push(b'\n');
            }
        }
        bytes
    }
}

/// The task conformance harness ([`task_suite!`](mcp_event_store_conformance::task_suite)):
/// the same schema per case as [`Harness`]; [`raw_rows`](TaskHarness::raw_rows)
/// dumps the task tables through a connection of its own.
#[async_trait]
impl TaskHarness for PostgresHarness {
    type Store = PostgresStore;

    async fn open(&self, options: StoreOptions) -> PostgresStore {
        Harness::open(self, options).await
    }

    /// A handle whose watches re-read only when woken (the safety-net
    /// re-read an hour away).
    async fn open_without_recheck(&self, options: StoreOptions) -> PostgresStore {
        self.open_with(self.options(options).follow_recheck(NO_RECHECK))
            .await
    }

    async fn close(&self, store: PostgresStore) {
        store.close().await;
    }

    /// The store's own rewriter: a PostgreSQL store is an event store.
    fn rewriter<'s>(
        &self,
        store: &'s Self::Store,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }

    /// Every row of `tasks`, `task_inputs` and `instances`, each column as
    /// its bytes (`bytea` as stored, other types as their text), joined by
    /// `|`.
    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        const TABLES: [(&str, &[&str]); 3] = [
            (
                "tasks",
                &[
                    "digest",
                    "owner",
                    "status",
                    "rev",
                    "message",
                    "created_at",
                    "updated_at",
                    "expires_at",
                    "purge_at",
                    "ttl_ms",
                    "poll_ms",
                    "cancel",
                    "instance",
                    "outcome",
                    "next_seq",
                ],
            ),
            (
                "task_inputs",
                &["digest", "key", "seq", "state", "request", "response"],
            ),
            ("instances", &["id", "alive_until"]),
        ];
        const BYTEA: [&str; 9] = [
            "digest", "owner", "message", "instance", "outcome", "key", "request", "response", "id",
        ];
        let mut conn = PgConnection::connect(&self.url)
            .await
            .expect("connect to dump the task tables");
        let mut rows = Vec::new();
        for (table, columns) in TABLES {
            let select = columns
                .iter()
                .map(|column| {
                    if BYTEA.contains(column) {
                        (*column).to_owned()
                    } else {
                        format!("convert_to({column}::text, 'UTF8')")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let query = format!("SELECT {select} FROM \"{}\".{table}", self.schema());
            for row in sqlx::query(AssertSqlSafe(query))
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("dump {table}: {e}"))
            {
                let mut raw = Vec::new();
                for column in 0..row.len() {
                    let value: Option<Vec<u8>> = row.try_get(column).expect("a column as bytes");
                    raw.extend(value.unwrap_or_default());
                    raw.push(b'|');
                }
                rows.push(raw);
            }
        }
        conn.close().await.expect("close");
        Some(rows)
    }

    async fn teardown(self) {
        Harness::teardown(self).await;
    }
}

/// The task format is the newest task migration (`migrations/tasks`),
/// recorded in the schema's `_mes_task_migrations`, which a release checks
/// on connect.
#[async_trait]
impl PersistentTaskHarness for PostgresHarness {
    fn task_format_version(&self) -> u64 {
        newest_task_migration() as u64
    }

    /// Records a newer release's task migration (a row past this release's
    /// newest), or takes every such row away for this release's format.
    async fn set_task_format_version(&self, version: u64) {
        let newest = newest_task_migration();
        let version = i64::try_from(version).expect("a task migration version within BIGINT");
        let mut conn = PgConnection::connect(&self.url)
            .await
            .expect("connect to mark the task format");
        let table = format!("\"{}\".{}", self.schema(), crate::setup::TASK_MIGRATIONS);
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE version > $1"
        )))
        .bind(newest)
        .execute(&mut conn)
        .await
        .expect("take newer task migrations away");
        if version > newest {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (version, description, success, checksum, execution_time) \
                 VALUES ($1, 'a newer release (test)', TRUE, '\\x00', 0)"
            )))
            .bind(version)
            .execute(&mut conn)
            .await
            .expect("record a newer task migration");
        }
        conn.close().await.expect("close the raw connection");
    }
}

/// The newest task migration this release runs.
fn newest_task_migration() -> i64 {
    crate::setup::task_migrator()
        .iter()
        .map(|migration| migration.version)
        .max()
        .expect("the task migrations")
}
