//! The backend's name and how a driver error becomes the store's
//! [`Error`].

use mcp_event_store_core::Error;

/// The backend name in errors, traces and metrics.
pub(crate) const NAME: &str = "redis";

/// Maps a driver error, keeping it as the source.
pub fn backend(e: redis::RedisError) -> Error {
    Error::backend(NAME, e)
}
