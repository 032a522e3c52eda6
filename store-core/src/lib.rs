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
//!   a call is still running (C13);
//! * [`EventStore::replay_stream`], a stream's every retained event from
//!   its oldest, for a transport that numbers its events itself (C16);
//! * [`EventStore::stats`], [`EventStore::list_streams`] and
//!   [`EventStore::check`], what an operator asks of a store (C15);
//! * [`RedeemStore`], single use of a nonce across every instance (C21),
//!   reached from any store through [`EventStore::redeemer`];
//! * [`rewrite`], a store's values listed and swapped in place (C22), for
//!   re-sealing under a new key while servers run;
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
//!
//! # The contract
//!
//! Numbered so that tests and notes can cite them; every backend meets all
//! of them, and the conformance suite has cases for each. The task clauses
//! (T1 to T23) are in the [`task`] module docs.
//!
//! * **C1 Durable before return.** `store_event` returns only once the
//!   event is durable under the store's documented durability setting.
//! * **C2 Event ids.** Unique in the store and never reissued, increasing
//!   within a stream, self-locating, SSE-safe, unguessable across streams.
//! * **C3 Replay.** Exactly the events of the id's stream after it, in
//!   order, each once, paged, never another stream's.
//! * **C4 Lookup.** `get_stream_id_for_event_id` finds a retained event's
//!   stream; unknown, expired and malformed ids are `None`, never a panic.
//! * **C5 No silent gaps.** An unknown id is [`Error::UnknownEventId`]; a
//!   partly purged successor range is [`Error::EventsPurged`].
//! * **C6 Concurrency.** Concurrent appends lose nothing, duplicate nothing
//!   and never appear behind a reader's cursor.
//! * **C7 Priming events.** Empty data with a retry hint is stored and
//!   replayed like any event.
//! * **C8 Retention.** Age, count and byte limits, purges and stream
//!   deletion: nothing grows without bound.
//! * **C9 Opaque input.** Any stream id of 1 to 1024 bytes is data; a
//!   payload over the limit is [`Error::PayloadTooLarge`].
//! * **C10 Restart.** A reopened persistent store replays everything
//!   acknowledged before a SIGKILL.
//! * **C11 Shared.** Handles and processes on one backend see each
//!   other's events once `store_event` returns.
//! * **C12 Versioned format.** Stored data carries its format; a newer
//!   format is refused clearly, an older one read or migrated.
//! * **C13 Follow.** A replay may stay open and deliver each new event of
//!   its stream, from any handle, in order, each once.
//! * **C14 Converge.** Handles agree on the stream secret and the format,
//!   even after the backend lost its data.
//! * **C15 Inspect.** Store statistics, a paged listing of streams and a
//!   health check, bounded in memory.
//! * **C16 Whole streams.** A stream's every retained event from its
//!   oldest, for a transport that numbers events itself.
//! * **C17 Bus.** A message published to a [`bus::Topic`] on any handle
//!   reaches every subscription to that topic on every handle sharing the
//!   store, in publish order, each once, and never a message of another
//!   topic (nor an event of a stream); it is durable once `publish`
//!   returns.
//! * **C18 Bus catch-up.** A subscription resumed after a message's
//!   cursor receives every message published after it; one whose cursor
//!   retention overtook is [`Error::FellBehind`], when it subscribes or
//!   when it reaches the gap: never a silent gap.
//! * **C19 Bus bounds.** A topic is 1 to 256 bytes of visible ASCII, else
//!   [`Error::InvalidTopic`]; a message over the payload limit is
//!   [`Error::PayloadTooLarge`], and either refusal stores nothing;
//!   messages are kept under the store's retention; a subscription reads
//!   the store only as it is polled, so a slow one holds no backlog in
//!   memory.
//! * **C20 Sessions by digest, bound to their owner.** A store keeps a
//!   session under the digest of its id ([`SessionDigest`]), never the
//!   id: nothing read from its tables, keys or files yields a live session
//!   id. A session stored with [`SessionStore::put_session_as`] is read
//!   and deleted only by the same [`task::Owner`]; for any other it is
//!   answered exactly as an unknown session. Sessions a release before
//!   this one stored under their ids are not found any more (their clients
//!   start new sessions, as MCP clients do on a 404) and go with their
//!   time to live.
//! * **C21 Redeemed once.** [`RedeemStore::redeem`] answers
//!   [`Redemption::Redeemed`] once per principal and nonce across every
//!   handle and process sharing the storage, and
//!   [`Redemption::AlreadyRedeemed`] after. The store keeps a digest of
//!   the principal's digest and the nonce, never the nonce, so one caller
//!   cannot burn another's. An expiry not in the future (by the store's
//!   clock) is [`Redemption::Expired`]; an empty nonce, one over
//!   [`MAX_NONCE_BYTES`], or an expiry beyond [`MAX_REDEEM_HORIZON`] is
//!   [`Error::Config`]; either refusal stores nothing. Records are
//!   forgotten [`REDEEM_GRACE`] after their expiry (by the database's ttl
//!   per key, else by `purge_expired`), so storage stays bounded, and a
//!   forgotten nonce stays refused: every later redemption of it is
//!   expired.
//! * **C22 Swapped in place, only over what was read.**
//!   [`EventStore::rewriter`] lists the values a store holds (events by
//!   stream, sessions by digest, tasks by digest with each of their
//!   values) as the database keeps them, a bounded page at a time, and
//!   swaps one for bytes of the same length only if it still holds exactly
//!   the bytes expected; a value written, removed or expired since is left
//!   alone ([`rewrite::Swap::Changed`]). A swap changes nothing else: an
//!   event keeps its id, position, time and retry hint, a session its
//!   expiry, a task its status, revision, instance and claim. A backend
//!   whose events live in an append-only log (Redis streams, NATS
//!   JetStream) says so ([`rewrite::RewriteStore::rewrites_events`]) and
//!   refuses an event swap with [`Error::Config`]; its events leave with
//!   retention.
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
mod redeem;
mod session;
mod store;

pub mod backend;
pub mod bus;
pub mod observe;
pub mod rewrite;
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
pub use redeem::{MAX_NONCE_BYTES, MAX_REDEEM_HORIZON, REDEEM_GRACE, RedeemStore, Redemption};
pub use session::SessionDigest;
pub use store::{EventStore, FollowOptions, Replay, ReplayEvents, SessionStore, Store};
