//! The backend's name and how a database error becomes the store's
//! [`Error`].

use mcp_event_store_core::Error;

/// The backend name in errors, traces and metrics.
pub(crate) const NAME: &str = "sqlite";

/// A database error as the store reports it.
pub(crate) fn db_error(e: sqlx::Error) -> Error {
    match e {
        // The read pool is closed only by `SqliteStore::close`.
        sqlx::Error::PoolClosed => Error::Closed,
        e => Error::backend(NAME, e),
    }
}

/// An error of SQLite itself (rusqlite, on the replay page threads) as the
/// store reports it.
pub(crate) fn sqlite_error(e: rusqlite::Error) -> Error {
    Error::backend(NAME, e)
}
