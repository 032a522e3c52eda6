//! The backend's name and how a sled error becomes the store's [`Error`].

use std::error::Error as StdError;

use mcp_event_store_core::Error;

/// The backend name in errors and traces.
pub(crate) const NAME: &str = "sled";

/// A sled error as the contract's backend error, source kept.
pub(crate) fn backend(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Error {
    Error::backend(NAME, e)
}
