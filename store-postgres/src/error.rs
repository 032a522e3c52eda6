//! The backend's name and how a driver error becomes the store's
//! [`Error`].

use mcp_event_store_core::Error;

/// The backend name in errors, spans and metrics.
pub(crate) const NAME: &str = crate::BACKEND.name;

/// Wraps a driver error, keeping it as the source; a call on a closed pool
/// is [`Error::Closed`].
pub(crate) fn backend(e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::PoolClosed => Error::Closed,
        e => Error::backend(NAME, e),
    }
}
