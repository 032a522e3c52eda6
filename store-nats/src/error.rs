//! The backend's name and how a driver error becomes the store's
//! [`Error`].

use mcp_event_store_core::Error;

/// The backend name in errors, traces and metrics.
pub(crate) const NAME: &str = "nats";

/// Maps a driver error, keeping it as the source.
pub(crate) fn backend<E>(e: E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    Error::backend(NAME, e)
}

/// Whether a write failed because another write to the same subject got
/// in first: JetStream's "wrong last sequence", also in the form newer
/// servers give a write that raced one still in flight (10164), anywhere
/// in the error's chain.
pub(crate) fn is_conflict(e: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::ErrorCode;
    let mut at = Some(e);
    while let Some(e) = at {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>()
            && [
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE,
                ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT,
            ]
            .contains(&js.error_code())
        {
            return true;
        }
        at = e.source();
    }
    false
}
