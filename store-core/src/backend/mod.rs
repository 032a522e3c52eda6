//! For backend authors: the plumbing every backend shares.
//!
//! Applications never need this module. A backend crate uses it to number
//! dense streams and check cursors and gaps ([`dense`]), to follow streams
//! ([`follow`]), to record the spans and metrics every store reports
//! ([`observe`]), to page through long replays ([`paged_replay`]), to derive
//! stream tokens from a per-store secret ([`StreamKey`], [`StreamToken`]),
//! and to check the input every store refuses the same way
//! ([`validate_stream_id`], [`validate_session_id`], [`check_list_limit`]);
//! and a task store's shared parts ([`task`]: the state machine, the step
//! driver of row stores, the one-value codec).
//!
//! A new backend is a crate that implements [`EventStore`](crate::EventStore)
//! and [`SessionStore`](crate::SessionStore) with these, exports a
//! [`Backend`](crate::Backend) descriptor as `BACKEND`, and runs the
//! conformance suite (feature `conformance`) from its own tests.

pub mod dense;
pub mod follow;
pub mod observe;
pub mod task;

pub use crate::event::{retry_from_millis, retry_to_millis};
pub use crate::id::{STREAM_KEY_LEN, STREAM_TOKEN_LEN, StreamKey, StreamToken};
pub use crate::inspect::check_list_limit;
pub use crate::options::{validate_session_id, validate_stream_id};
pub use crate::store::{Page, paged_replay};
