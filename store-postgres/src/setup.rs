//! Opening a store: the connection and the pool, creating and migrating
//! the schema, checking its format (C12), reading the shared stream key,
//! and warning when the server's settings let the store's tables grow
//! without bound (C8).

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};

use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::{Error, Result};

use crate::FORMAT_VERSION;
use crate::error::{NAME, backend};
use crate::options::{DEFAULT_APPLICATION_NAME, PostgresOptions, Vacuum, quote_schema};
use crate::sql::{self, render};

/// The embedded migrations: the schema's history, and its format version.
pub(crate) static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The table recording the task migrations applied, in the store's schema.
/// Not `_sqlx_migrations`: a release from before tasks refuses any row it
/// does not know there, and must keep serving events (see the crate docs,
/// "Tasks and older releases").
pub(crate) const TASK_MIGRATIONS: &str = "_mes_task_migrations";

/// The embedded task migrations (`migrations/tasks/`), recorded in
/// [`TASK_MIGRATIONS`].
pub(crate) fn task_migrator() -> Migrator {
    let mut tasks = sqlx::migrate!("./migrations/tasks");
    tasks.dangerous_set_table_name(TASK_MIGRATIONS);
    tasks
}

/// The table recording the task context migrations applied (T13). Apart
/// from [`TASK_MIGRATIONS`], whose check in a release of task format 1
/// refuses any row it does not know: that release must keep serving
/// events and tasks from a schema whose tasks have contexts.
pub(crate) const CONTEXT_MIGRATIONS: &str = "_mes_task_context_migrations";

/// The embedded task context migrations (`migrations/task_context/`),
/// recorded in [`CONTEXT_MIGRATIONS`]; they run after the task migrations.
fn context_migrator() -> Migrator {
    let mut contexts = sqlx::migrate!("./migrations/task_context");
    contexts.dangerous_set_table_name(CONTEXT_MIGRATIONS);
    contexts
}

/// The table recording the task takeover migrations applied (T16 to
/// T19), apart from the others for the same reason as
/// [`CONTEXT_MIGRATIONS`].
pub(crate) const TAKEOVER_MIGRATIONS: &str = "_mes_task_takeover_migrations";

/// The embedded task takeover migrations (`migrations/task_takeover/`),
/// recorded in [`TAKEOVER_MIGRATIONS`]; they run after the context ones.
fn takeover_migrator() -> Migrator {
    let mut takeover = sqlx::migrate!("./migrations/task_takeover");
    takeover.dangerous_set_table_name(TAKEOVER_MIGRATIONS);
    takeover
}

/// The table recording the cancel reason migrations applied (T20), apart
/// from the others for the same reason as [`CONTEXT_MIGRATIONS`].
pub(crate) const CANCEL_REASON_MIGRATIONS: &str = "_mes_task_cancel_reason_migrations";

/// The embedded cancel reason migrations (`migrations/task_cancel_reason/`),
/// recorded in [`CANCEL_REASON_MIGRATIONS`]; they run after the takeover
/// ones.
fn cancel_reason_migrator() -> Migrator {
    let mut reasons = sqlx::migrate!("./migrations/task_cancel_reason");
    reasons.dangerous_set_table_name(CANCEL_REASON_MIGRATIONS);
    reasons
}

/// The table recording the redemption migrations applied (C21), apart
/// from the others for the same reason as [`CONTEXT_MIGRATIONS`]: a
/// release from before redemptions opens the schema and serves events and
/// tasks.
pub(crate) const REDEEM_MIGRATIONS: &str = "_mes_redeem_migrations";

/// The embedded redemption migrations (`migrations/redeem/`), recorded in
/// [`REDEEM_MIGRATIONS`]; they run after the task ones.
fn redeem_migrator() -> Migrator {
    let mut redeem = sqlx::migrate!("./migrations/redeem");
    redeem.dangerous_set_table_name(REDEEM_MIGRATIONS);
    redeem
}

/// The additive migration sets after the event format's (the tasks and
/// their additions, the redemptions), in the order they run: each recorded
/// in a table of its own, named in refusals.
fn additive_migrators() -> [(Migrator, &'static str, &'static str); 5] {
    [
        (task_migrator(), TASK_MIGRATIONS, "task"),
        (context_migrator(), CONTEXT_MIGRATIONS, "task context"),
        (takeover_migrator(), TAKEOVER_MIGRATIONS, "task takeover"),
        (
            cancel_reason_migrator(),
            CANCEL_REASON_MIGRATIONS,
            "task cancel reason",
        ),
        (redeem_migrator(), REDEEM_MIGRATIONS, "redemption"),
    ]
}

/// The connect options of the store's connections: the URL's, with the
/// `application_name` of `options` (the URL's, when it named one), else
/// the one the environment gives (`PGAPPNAME`), else
/// [`DEFAULT_APPLICATION_NAME`].
pub(crate) fn connect_options(
    mut connect: PgConnectOptions,
    options: &PostgresOptions,
) -> PgConnectOptions {
    match &options.application_name {
        Some(name) => connect = connect.application_name(name),
        None if connect.get_application_name().is_none() => {
            connect = connect.application_name(DEFAULT_APPLICATION_NAME);
        }
        None => {}
    }
    connect
}

/// A pool of one connection beside the store's `main` pool, connecting
/// lazily, for work that must never queue behind the main pool's calls.
pub(crate) fn side_pool(connect: PgConnectOptions, main: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(main.options().get_acquire_timeout())
        .test_before_acquire(false)
        .connect_lazy_with(connect)
}

/// The store's pool, connecting lazily.
pub(crate) fn pool(connect: PgConnectOptions, options: &PostgresOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        // sqlx pings before every acquire by default: a round trip that
        // cost 7% of append throughput here. A dead connection instead
        // fails its one call and the pool replaces it.
        .test_before_acquire(false)
        .connect_lazy_with(connect)
}

/// Prepares the options' schema on a dedicated connection (so no pooled
/// connection is left with a changed `search_path`), checks the vacuum
/// settings, and returns the stream key.
pub(crate) async fn prepare(
    connect: &PgConnectOptions,
    options: &PostgresOptions,
) -> Result<StreamKey> {
    let mut conn = PgConnection::connect_with(connect).await.map_err(backend)?;
    let mut result = prepare_on(&mut conn, &options.schema, options.run_migrations).await;
    if result.is_ok()
        && let Err(e) = check_vacuum_settings(&mut conn, options).await
    {
        result = Err(e);
    }
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
    if !run_migrations {
        for (migrator, table, what) in additive_migrators() {
            check_task_format(conn, schema, &migrator, table, what).await?;
        }
    }
    if run_migrations {
        // `run_direct` is `run` minus the `Acquire` bound that makes this
        // future not `Send` (sqlx's own workaround for that compiler error).
        MIGRATOR
            .run_direct(None, &mut *conn, false)
            .await
            .map_err(|e| migrate_error(schema, e))?;
        for (migrator, _, what) in additive_migrators() {
            migrator
                .run_direct(None, &mut *conn, false)
                .await
                .map_err(|e| task_migrate_error(schema, &migrator, what, e))?;
        }
    }
    load_key(conn, &quoted).await
}

/// With `run_migrations` off: refuses a schema whose task migrations of
/// one set (`migrator`, recorded in `table`) include one this release does
/// not know (a newer task format) or one that failed part way. A schema
/// without the table opens (its events are served; task calls fail until a
/// release with tasks migrates it).
async fn check_task_format(
    conn: &mut PgConnection,
    schema: &str,
    migrator: &Migrator,
    table: &str,
    what: &str,
) -> Result<()> {
    let has_table: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = $2)",
    )
    .bind(schema)
    .bind(table)
    .fetch_one(&mut *conn)
    .await
    .map_err(backend)?;
    if !has_table {
        return Ok(());
    }
    let applied: Vec<(i64, bool)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT version, success FROM {table} ORDER BY version"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(backend)?;
    for (version, success) in applied {
        if !migrator.version_exists(version) {
            return Err(task_migrate_error(
                schema,
                migrator,
                what,
                MigrateError::VersionMissing(version),
            ));
        }
        if !success {
            return Err(task_migrate_error(
                schema,
                migrator,
                what,
                MigrateError::Dirty(version),
            ));
        }
    }
    Ok(())
}

/// A refusal of one set of task migrations (`what`: "task", "task
/// context"): a newer format, or a different one, is
/// [`Error::IncompatibleFormat`].
fn task_migrate_error(schema: &str, migrator: &Migrator, what: &str, e: MigrateError) -> Error {
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    match e {
        MigrateError::VersionMissing(version) => Error::IncompatibleFormat(format!(
            "schema \"{schema}\" holds {what} migration {version}, unknown to this release \
             ({what} format {known}); it was written by a newer release"
        )),
        MigrateError::VersionMismatch(version) => Error::IncompatibleFormat(format!(
            "{what} migration {version} of schema \"{schema}\" differs from this release's; \
             the schema was written by another build"
        )),
        MigrateError::Dirty(version) => Error::IncompatibleFormat(format!(
            "{what} migration {version} of schema \"{schema}\" failed part way; repair it by hand"
        )),
        other => Error::backend(NAME, other),
    }
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
        other => Error::backend(NAME, other),
    }
}

/// What decides whether autovacuum reclaims the store's deleted rows, as
/// [`sql::VACUUM_SETTINGS`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VacuumSettings {
    /// The server's `autovacuum`.
    pub autovacuum: bool,
    /// The server's `track_counts`.
    pub track_counts: bool,
    /// The store's tables with `autovacuum_enabled` off: `events`, or
    /// `events (TOAST)` for a TOAST table.
    pub disabled: Vec<String>,
}

impl VacuumSettings {
    /// Reads them for the store's schema.
    pub(crate) async fn read<'e>(conn: impl sqlx::PgExecutor<'e>, schema: &str) -> Result<Self> {
        let row = sqlx::query(sql::VACUUM_SETTINGS)
            .bind(schema)
            .fetch_one(conn)
            .await
            .map_err(backend)?;
        Ok(Self {
            autovacuum: row.try_get(0).map_err(backend)?,
            track_counts: row.try_get(1).map_err(backend)?,
            disabled: row.try_get(2).map_err(backend)?,
        })
    }

    /// Whether autovacuum reclaims the space of every table of the store.
    pub(crate) fn reclaims(&self) -> bool {
        self.autovacuum && self.track_counts && self.disabled.is_empty()
    }
}

/// The statement that turns `autovacuum` back on.
pub(crate) const AUTOVACUUM_ON: &str = "ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();";
/// The statement that turns `track_counts` back on.
pub(crate) const TRACK_COUNTS_ON: &str =
    "ALTER SYSTEM SET track_counts = on; SELECT pg_reload_conf();";

/// The statement that gives a table listed in
/// [`VacuumSettings::disabled`] back to autovacuum.
pub(crate) fn table_reset(schema: &str, table: &str) -> String {
    let (name, toast) = match table.strip_suffix(" (TOAST)") {
        Some(name) => (name, "toast."),
        None => (table, ""),
    };
    format!("ALTER TABLE \"{schema}\".{name} RESET ({toast}autovacuum_enabled);")
}

/// Warns, once per connect, when deleted rows of the store's tables will
/// never be reclaimed by autovacuum: the server runs with `autovacuum` or
/// `track_counts` off, or one of the tables (or its TOAST table) has
/// `autovacuum_enabled` off. The tables then grow with every event ever
/// appended, however few are retained. The message says what to change;
/// under [`Vacuum::Auto`] the purges reclaim the space themselves, so it is
/// only information.
async fn check_vacuum_settings(conn: &mut PgConnection, options: &PostgresOptions) -> Result<()> {
    let settings = VacuumSettings::read(&mut *conn, &options.schema).await?;
    let Some(problem) = vacuum_problem(&options.schema, &settings) else {
        return Ok(());
    };
    let schema = options.schema.as_str();
    if options.vacuum == Vacuum::Auto {
        tracing::info!(
            schema,
            "{problem}; purge_expired vacuums the store's tables itself (vacuum=auto), \
             so run it on an interval"
        );
    } else {
        tracing::warn!(
            schema,
            "the store's tables will grow without bound: {problem}, so the space of \
             purged events is never reclaimed. Fix the setting, or open the store with \
             vacuum=auto (the URL parameter, or PostgresOptions::vacuum(Vacuum::Auto)) so \
             that purge_expired vacuums its tables, or VACUUM them on a schedule"
        );
    }
    Ok(())
}

/// What keeps autovacuum from reclaiming the store's space, and what to
/// change, or `None` when nothing does.
fn vacuum_problem(schema: &str, settings: &VacuumSettings) -> Option<String> {
    let mut problems = Vec::new();
    if !settings.autovacuum {
        problems.push(format!(
            "autovacuum is off on the server (set autovacuum = on: {AUTOVACUUM_ON})"
        ));
    }
    if !settings.track_counts {
        problems.push(format!(
            "track_counts is off on the server, so autovacuum cannot tell which tables need \
             it (set track_counts = on: {TRACK_COUNTS_ON})"
        ));
    }
    for table in &settings.disabled {
        let (name, toast) = match table.strip_suffix(" (TOAST)") {
            Some(name) => (name, "toast."),
            None => (table.as_str(), ""),
        };
        problems.push(format!(
            "table \"{schema}\".{name} has {toast}autovacuum_enabled = false ({})",
            table_reset(schema, table)
        ));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
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

#[cfg(test)]
mod tests {
    use super::{MIGRATOR, VacuumSettings};
    use crate::FORMAT_VERSION;

    #[test]
    fn the_format_is_the_newest_migration() {
        assert_eq!(
            MIGRATOR.iter().map(|m| m.version).max(),
            Some(FORMAT_VERSION)
        );
    }

    fn vacuum_problem(
        schema: &str,
        autovacuum: bool,
        track_counts: bool,
        disabled: &[String],
    ) -> Option<String> {
        let settings = VacuumSettings {
            autovacuum,
            track_counts,
            disabled: disabled.to_vec(),
        };
        super::vacuum_problem(schema, &settings)
    }

    #[test]
    fn vacuum_problems_name_what_to_change() {
        assert_eq!(vacuum_problem("s", true, true, &[]), None);
        let off = vacuum_problem("s", false, true, &[]).unwrap();
        assert!(
            off.contains("autovacuum is off") && off.contains("autovacuum = on"),
            "{off}"
        );
        let counts = vacuum_problem("s", true, false, &[]).unwrap();
        assert!(counts.contains("track_counts = on"), "{counts}");
        let tables =
            vacuum_problem("s", true, true, &["events".into(), "events (TOAST)".into()]).unwrap();
        assert!(
            tables.contains("ALTER TABLE \"s\".events RESET (autovacuum_enabled)")
                && tables.contains("RESET (toast.autovacuum_enabled)"),
            "{tables}"
        );
    }
}
