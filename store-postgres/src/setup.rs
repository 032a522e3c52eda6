//! Opening a schema: creating it, migrating it, checking its format (C12)
//! and reading the shared stream key.

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, Row};

use mcp_event_store_core::{Error, Result, StreamKey};

use crate::options::quote_schema;
use crate::sql::{self, render};
use crate::{BACKEND, backend};

/// The embedded migrations: the schema's history, and its format version.
pub(crate) static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The newest storage format (migration version) this release writes and
/// reads. A schema holding a migration newer than this was written by an
/// incompatible newer release and is refused.
pub const FORMAT_VERSION: i64 = 1;

/// Prepares `schema` on a dedicated connection (so no pooled connection is
/// left with a changed `search_path`) and returns the stream key.
pub(crate) async fn prepare(
    connect: &PgConnectOptions,
    schema: &str,
    run_migrations: bool,
) -> Result<StreamKey> {
    let mut conn = PgConnection::connect_with(connect).await.map_err(backend)?;
    let result = prepare_on(&mut conn, schema, run_migrations).await;
    // A failed close only means the server went away; the work is done.
    let _ = conn.close().await;
    result
}

async fn prepare_on(
    conn: &mut PgConnection,
    schema: &str,
    run_migrations: bool,
) -> Result<StreamKey> {
    let quoted = quote_schema(schema);
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema)
            .fetch_one(&mut *conn)
            .await
            .map_err(backend)?;
    if !exists {
        if !run_migrations {
            return Err(Error::Config(format!(
                "schema {quoted} does not exist and run_migrations is off; \
                 run the migrations first or turn run_migrations on"
            )));
        }
        // Two instances starting at once can race here; the loser sees a
        // unique violation on pg_namespace and carries on.
        let created = sqlx::query(AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS {quoted}"
        )))
        .execute(&mut *conn)
        .await;
        if let Err(e) = created {
            let duplicate = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|code| code == "23505" || code == "42P06");
            if !duplicate {
                return Err(backend(e));
            }
        }
    }
    // Only the store's schema: the migrations and sqlx's bookkeeping table
    // land there. Built-in functions still resolve through pg_catalog.
    sqlx::query(AssertSqlSafe(format!("SET search_path TO {quoted}")))
        .execute(&mut *conn)
        .await
        .map_err(backend)?;

    check_format(conn, schema, &quoted, run_migrations).await?;
    if run_migrations {
        // `run_direct` is `run` minus the `Acquire` bound that makes this
        // future not `Send` (sqlx's own workaround for that compiler error).
        MIGRATOR
            .run_direct(None, &mut *conn, false)
            .await
            .map_err(|e| migrate_error(schema, e))?;
    }
    load_key(conn, &quoted).await
}

/// Refuses schemas this release cannot read (C12): one that a newer release
/// migrated further, one with a failed migration, and (when this handle may
/// not migrate) one that is behind.
async fn check_format(
    conn: &mut PgConnection,
    schema: &str,
    quoted: &str,
    run_migrations: bool,
) -> Result<()> {
    let has_table: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables \
          WHERE schemaname = $1 AND tablename = '_sqlx_migrations')",
    )
    .bind(schema)
    .fetch_one(&mut *conn)
    .await
    .map_err(backend)?;
    let applied = if has_table {
        sqlx::query(render(sql::APPLIED_MIGRATIONS, quoted))
            .fetch_all(&mut *conn)
            .await
            .map_err(backend)?
    } else {
        Vec::new()
    };
    let mut applied_versions = Vec::with_capacity(applied.len());
    for row in &applied {
        let version: i64 = row.try_get(0).map_err(backend)?;
        let description: String = row.try_get(1).map_err(backend)?;
        let success: bool = row.try_get(2).map_err(backend)?;
        if !MIGRATOR.version_exists(version) {
            return Err(Error::IncompatibleFormat(format!(
                "schema {quoted} is at format {version} ({description:?}), written by a newer \
                 release of mcp-event-store-postgres; this release reads formats up to \
                 {FORMAT_VERSION}. Upgrade the crate, or open another schema."
            )));
        }
        if !success {
            return Err(Error::IncompatibleFormat(format!(
                "migration {version} ({description:?}) of schema {quoted} failed part way; \
                 repair the schema by hand before opening it"
            )));
        }
        applied_versions.push(version);
    }
    if !run_migrations
        && let Some(missing) = MIGRATOR
            .iter()
            .find(|m| !applied_versions.contains(&m.version))
    {
        return Err(Error::IncompatibleFormat(format!(
            "schema {quoted} lacks migration {} ({:?}) and run_migrations is off; \
             run the migrations of this release first",
            missing.version, missing.description
        )));
    }
    Ok(())
}

fn migrate_error(schema: &str, e: MigrateError) -> Error {
    match e {
        MigrateError::VersionMissing(version) => Error::IncompatibleFormat(format!(
            "schema \"{schema}\" holds migration {version}, unknown to this release \
             (format {FORMAT_VERSION}); it was written by a newer release"
        )),
        MigrateError::VersionMismatch(version) => Error::IncompatibleFormat(format!(
            "migration {version} of schema \"{schema}\" differs from this release's; \
             the schema was written by another build"
        )),
        MigrateError::Dirty(version) => Error::IncompatibleFormat(format!(
            "migration {version} of schema \"{schema}\" failed part way; repair it by hand"
        )),
        other => Error::backend(BACKEND, other),
    }
}

/// Inserts a fresh key unless one exists, then reads the one that won, so
/// every instance on the schema derives the same stream tokens.
async fn load_key(conn: &mut PgConnection, quoted: &str) -> Result<StreamKey> {
    let candidate = StreamKey::generate()?;
    sqlx::query(render(sql::INSERT_KEY, quoted))
        .bind(&candidate.as_bytes()[..])
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    let stored: Vec<u8> = sqlx::query_scalar(render(sql::SELECT_KEY, quoted))
        .fetch_one(&mut *conn)
        .await
        .map_err(backend)?;
    StreamKey::from_bytes(&stored)
}
