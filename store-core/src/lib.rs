//! The core of **mcp-event-store**: the contract every backend meets.
//!
//! MCP's Streamable HTTP transport lets a client that lost its SSE connection
//! reconnect with `Last-Event-ID` and receive what it missed. That only works
//! if the server kept the events. This crate defines how they are kept:
//!
//! * [`EventStore`] and [`SessionStore`], the traits every backend implements
//!   (dyn-compatible: hold them as `Arc<dyn EventStore>`);
//! * [`EventId`], the one id scheme all backends share: self-locating,
//!   SSE-safe and unguessable across streams;
//! * [`Error`], one error enum named by meaning;
//! * [`Retention`], [`PurgeReport`] and [`PurgeTask`], so nothing grows
//!   without bound;
//! * [`EventStore::follow_events_after`], the replay that stays open while
//!   a call is still running (C13), and [`Presence`], which ends it once
//!   the instance writing the stream is known gone;
//! * [`EventStore::replay_stream`], a stream's every retained event from
//!   its oldest, for a transport that numbers its events itself (C16);
//! * [`EventStore::stats`], [`EventStore::list_streams`] and
//!   [`EventStore::check`], what an operator asks of a store (C15);
//! * [`MemoryStore`], a complete in-memory backend;
//! * [`backend`], the plumbing backend crates share (cursor and gap checks,
//!   follow, spans and metrics, stream tokens), kept out of applications'
//!   way.
//!
//! The suites every backend passes, and the test kit they run on, are the
//! crate `mcp-event-store-conformance`.
//!
//! Core depends on no MCP framework: the integrations
//! (`mcp-event-store-rmcp`, `mcp-event-store-tower-mcp`) are crates of
//! their own over this crate's public API, so a framework's breaking
//! release re-versions one crate, not the family.
//!
//! Most users want the `mcp-event-store` facade crate, which re-exports all
//! of this beside the backends.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod descriptor;
mod error;
mod event;
mod id;
mod inspect;
mod maintenance;
mod memory;
mod options;
mod presence;
mod store;

pub mod backend;
pub mod observe;
pub mod task;

pub use descriptor::{Backend, Connecting};
pub use error::{BoxError, Error, Result};
pub use event::{NewEvent, StoredEvent};
pub use id::{EventId, MAX_EVENT_ID_LEN, Position};
pub use inspect::{
    HealthReport, MAX_LIST_PAGE, Setting, StoreStats, StreamCursor, StreamInfo, StreamPage, Verdict,
};
pub use maintenance::PurgeTask;
pub use memory::MemoryStore;
pub use options::{
    Clock, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_PAGE_SIZE, MAX_STREAM_ID_LEN, ManualClock,
    PurgeReport, Retention, StoreOptions, SystemClock,
};
pub use presence::{DEFAULT_PRESENCE_LEASE, DEFAULT_PRODUCER_TTL, Presence};
pub use store::{EventStore, FollowOptions, Replay, SessionStore, Store};
