//! Opening a database file: its connections, the switch to WAL, the
//! embedded migrations, the format check (C12) and the stream secret.
//!
//! Opening is safe from any number of handles and processes at once, on a
//! new file or an existing one. The busy timeout is in force from the first
//! statement; the switch of a new file to WAL is retried while another
//! connection makes it; the migrations and the creation of the stream secret
//! happen once, under one write lock (`BEGIN IMMEDIATE`), and every other
//! opener waits for it, then finds the work done.

use std::time::Duration;

use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::{Error, Result};
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};

use crate::FORMAT_VERSION;
use crate::error::{NAME, db_error};
use crate::options::SqliteOptions;

/// An opened database, brought to this release's format: what the store
/// is built from.
pub(crate) struct Opened {
    /// How every connection of the handle is opened (the watcher's too).
    pub(crate) connect: SqliteConnectOptions,
    /// The writer thread's connection (through SQLite itself, rusqlite).
    pub(crate) writer: rusqlite::Connection,
    /// The read pool.
    pub(crate) readers: SqlitePool,
    /// The secret that keys stream tokens.
    pub(crate) key: StreamKey,
}

/// Opens the file `options` names (creating it if missing), puts it in WAL
/// mode, runs the embedded migrations, checks the format version and loads
/// the stream secret (on a sqlx connection, which sqlx's migrator needs),
/// then opens the writer's connection and the read pool.
pub(crate) async fn open(options: &SqliteOptions) -> Result<Opened> {
    // sqlx sets the busy timeout when it opens a connection, before its
    // first statement, so every statement waits for a lock held by
    // another handle or process rather than failing with "database is
    // locked". The journal mode is left alone here: switching a new
    // file to WAL is done once, below, by `switch_to_wal`.
    let connect = SqliteConnectOptions::new()
        .filename(&options.path)
        .create_if_missing(true)
        .synchronous(options.durability.synchronous())
        .busy_timeout(options.busy_timeout)
        .foreign_keys(false);

    let mut setup = SqliteConnection::connect_with(&connect)
        .await
        .map_err(db_error)?;
    switch_to_wal(&mut setup, options.busy_timeout).await?;
    let key = prepare(&mut setup).await?;
    // The file is in WAL mode and migrated: the writer's own connection
    // takes over from the sqlx connection that saw to it, opened first so
    // that the file is never left without a connection (whose last close
    // would checkpoint the WAL).
    let writer = crate::writer::open(
        &options.path,
        options.busy_timeout,
        options.durability.synchronous_pragma(),
    )?;
    if let Err(e) = setup.close().await {
        tracing::warn!(error = %e, "closing the sqlite setup connection failed");
    }

    let readers = SqlitePoolOptions::new()
        .max_connections(options.read_connections)
        .min_connections(0)
        .test_before_acquire(false)
        .connect_with(connect.clone())
        .await
        .map_err(db_error)?;
    Ok(Opened {
        connect,
        writer,
        readers,
        key,
    })
}

/// Puts the database in WAL mode (a no-op once it is: the mode is stored in
/// the file). Two connections switching a new file at once can make SQLite
/// answer "database is locked" at once, without waiting: each holds a read
/// lock the other's switch must wait out, so SQLite refuses rather than
/// deadlock, and the busy timeout never applies. Such a refusal is retried
/// until `busy_timeout` has passed; the other connection's switch has
/// usually finished by the first retry.
async fn switch_to_wal(conn: &mut SqliteConnection, busy_timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + busy_timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        let mode: std::result::Result<String, sqlx::Error> =
            sqlx::query_scalar("PRAGMA journal_mode = WAL")
                .fetch_one(&mut *conn)
                .await;
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(Error::Config(format!(
                    "SQLite kept the database in journal mode {mode:?} instead of WAL \
                     (an in-memory database, or a file system without shared memory?)"
                )));
            }
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(db_error(e)),
        }
    }
}

/// Whether SQLite said busy (`SQLITE_BUSY` or one of its extended codes).
fn is_busy(e: &sqlx::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    e.as_database_error()
        .and_then(|e| e.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == SQLITE_BUSY)
}

/// Brings the database to this release's format and returns its stream
/// secret, all under one write lock (`BEGIN IMMEDIATE`, which waits for the
/// lock up to the busy timeout): handles and processes opening the file at
/// once take turns, and each re-reads what is applied only once it holds
/// the lock, so the migrations and the secret are created exactly once.
/// On any error nothing is changed.
async fn prepare(conn: &mut SqliteConnection) -> Result<StreamKey> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(db_error)?;
    migrate(&mut tx).await?;
    let key = load_stream_key(&mut tx).await?;
    tx.commit().await.map_err(db_error)?;
    Ok(key)
}

/// Runs the embedded migrations, refusing a database from a newer release.
/// The caller holds the write lock; sqlx nests each migration's own
/// transaction as a savepoint.
///
/// The event migrations (`migrations/`, recorded in `mes_migrations`), the
/// task migrations (`migrations/tasks/`, recorded in `mes_task_migrations`)
/// and each additive change to the tasks since (contexts, takeover, cancel
/// reasons: `migrations/task_*/`, each recorded in a table of its own), and
/// the redemptions (`migrations/redeem/`, recorded in
/// `mes_redeem_migrations`) are kept apart: a release that knows only
/// the event migrations finds nothing unknown in `mes_migrations`, so it
/// keeps serving events from a file that also holds tasks, and one of task
/// format 1 keeps serving tasks from a file whose tasks have contexts. Each
/// set refuses what a newer release added to it.
async fn migrate(conn: &mut SqliteConnection) -> Result<()> {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name("mes_migrations");
    run(&migrator, conn, "").await?;
    let format: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(value AS INTEGER) FROM mes_meta WHERE key = 'format_version'",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db_error)?;
    match format {
        Some(FORMAT_VERSION) => {}
        Some(other) => {
            return Err(Error::IncompatibleFormat(format!(
                "the database has format version {other}; this release reads version {FORMAT_VERSION}"
            )));
        }
        None => {
            return Err(Error::Corrupt(
                "the format version record is missing".into(),
            ));
        }
    }
    run(&task_migrator(), conn, "task ").await?;
    let mut contexts = sqlx::migrate!("./migrations/task_context");
    contexts.dangerous_set_table_name(CONTEXT_MIGRATIONS);
    run(&contexts, conn, "task context ").await?;
    let mut takeover = sqlx::migrate!("./migrations/task_takeover");
    takeover.dangerous_set_table_name(TAKEOVER_MIGRATIONS);
    run(&takeover, conn, "task takeover ").await?;
    let mut reasons = sqlx::migrate!("./migrations/task_cancel_reason");
    reasons.dangerous_set_table_name(CANCEL_REASON_MIGRATIONS);
    run(&reasons, conn, "task cancel reason ").await?;
    let mut redeem = sqlx::migrate!("./migrations/redeem");
    redeem.dangerous_set_table_name(REDEEM_MIGRATIONS);
    run(&redeem, conn, "redemption ").await
}

/// The table recording the task migrations applied.
pub(crate) const TASK_MIGRATIONS: &str = "mes_task_migrations";

/// The embedded task migrations (`migrations/tasks/`), recorded in
/// [`TASK_MIGRATIONS`].
pub(crate) fn task_migrator() -> Migrator {
    let mut tasks = sqlx::migrate!("./migrations/tasks");
    tasks.dangerous_set_table_name(TASK_MIGRATIONS);
    tasks
}

/// The table recording the task context migrations applied (T13): apart
/// from [`TASK_MIGRATIONS`], whose check in a release of task format 1
/// refuses any row it does not know, so that release keeps serving events
/// and tasks from a file whose tasks have contexts.
pub(crate) const CONTEXT_MIGRATIONS: &str = "mes_task_context_migrations";

/// The table recording the task takeover migrations applied (T16 to T19),
/// apart from the others for the same reason as [`CONTEXT_MIGRATIONS`].
pub(crate) const TAKEOVER_MIGRATIONS: &str = "mes_task_takeover_migrations";

/// The table recording the cancel reason migrations applied (T20), apart
/// from the others for the same reason as [`CONTEXT_MIGRATIONS`].
pub(crate) const CANCEL_REASON_MIGRATIONS: &str = "mes_task_cancel_reason_migrations";

/// The table recording the redemption migrations applied (C21), apart
/// from the others for the same reason as [`CONTEXT_MIGRATIONS`]: a
/// release from before redemptions opens the file and serves events and
/// tasks.
pub(crate) const REDEEM_MIGRATIONS: &str = "mes_redeem_migrations";

/// Runs one set of migrations; `what` names the set in a refusal.
async fn run(migrator: &Migrator, conn: &mut SqliteConnection, what: &str) -> Result<()> {
    // `run_direct` is sqlx's own way around `Acquire`'s lifetime limits for a
    // bare connection inside a `Send` future.
    migrator
        .run_direct(None, &mut *conn, false)
        .await
        .map_err(|e| match e {
            sqlx::migrate::MigrateError::VersionMissing(version) => {
                Error::IncompatibleFormat(format!(
                    "the database was migrated to {what}version {version} by a newer release of \
             mcp-event-store-sqlite; this release knows {what}versions up to {}",
                    migrator.iter().map(|m| m.version).max().unwrap_or(0)
                ))
            }
            sqlx::migrate::MigrateError::VersionMismatch(version) => {
                Error::IncompatibleFormat(format!(
                    "{what}migration {version} in the database differs from this release's; \
             it was written by an incompatible release"
                ))
            }
            other => Error::backend(NAME, other),
        })
}

/// Loads the secret that keys stream tokens, creating it on first open.
async fn load_stream_key(conn: &mut SqliteConnection) -> Result<StreamKey> {
    let fresh = StreamKey::generate()?;
    sqlx::query("INSERT OR IGNORE INTO mes_meta (key, value) VALUES ('stream_key', ?1)")
        .bind(&fresh.as_bytes()[..])
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    let stored: Vec<u8> = sqlx::query_scalar("SELECT value FROM mes_meta WHERE key = 'stream_key'")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
    StreamKey::from_bytes(&stored)
}
