//! mcp-event-store for [rmcp](https://crates.io/crates/rmcp), the official
//! Rust MCP SDK (3.9 and newer): any store behind rmcp's Streamable HTTP
//! server, every guarantee wired in one call.
//!
//! # In one call
//!
//! [`Durable`] takes a store (any of ours; `mcp_event_store::connect(url)`
//! gives one) and hands rmcp everything it needs: the event store (resumes
//! follow their stream; they end early when the instance writing it died),
//! the session store (sessions restored on any instance), the session
//! manager (resumes scoped to their session; sessions deleted anywhere end
//! everywhere), the durable-task runtime, and one maintenance loop
//! (heartbeats, purges). A complete session-mode server:
//!
//! ```no_run
//! use mcp_event_store_rmcp::{Durable, DurableTasks};
//! use rmcp::ServerHandler;
//! use rmcp::model::{ServerCapabilities, ServerConfig};
//!
//! /// Your handler; its `call_tool` runs task-mode calls with
//! /// `self.tasks.spawn(..)`, and `get_task`, `update_task` and
//! /// `cancel_task` delegate to `self.tasks`.
//! #[derive(Clone)]
//! struct Counter {
//!     tasks: DurableTasks,
//! }
//!
//! impl ServerHandler for Counter {
//!     fn get_info(&self) -> ServerConfig {
//!         ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! # let store = std::sync::Arc::new(mcp_event_store_core::MemoryStore::new());
//! // let store = mcp_event_store::connect("postgres://app@db/app").await?;
//! let durable = Durable::builder(store).start().await?;
//! let tasks = durable.tasks();
//! let service = durable.service(move || Ok(Counter { tasks: tasks.clone() }));
//! // axum::Router::new().nest_service("/mcp", service), and serve it; then
//! durable.shutdown().await;
//! # let _ = service; Ok(()) }
//! ```
//!
//! Everything has a default and a setter on [`DurableBuilder`] (the follow
//! hold, the instance lease, the purge interval, the session lifetime and
//! check interval, the priming events' retry hint, the task owner); what
//! the store itself knows (its retention) is read from it. Stateless mode:
//! [`Durable::stateless_service`].
//!
//! # The pieces
//!
//! rmcp defines two seams, both in
//! `rmcp::transport::streamable_http_server::session`:
//!
//! * its `EventStore`, which keeps every SSE event of every stream so a client
//!   can resume with `Last-Event-ID`: [`RmcpEventStore`] implements it over
//!   any of our [`EventStore`]s;
//! * its `SessionStore`, which keeps each session's `initialize` parameters so
//!   another instance can restore the session: [`RmcpSessionStore`]
//!   implements it over any of our [`SessionStore`]s.
//!
//! And [`SessionScoped`] wraps rmcp's `LocalSessionManager` so that a
//! `Last-Event-ID` only resumes streams of the session presenting it (rmcp
//! alone replays any stream the id names, whatever the session), and so that
//! a session deleted or expired in the shared session store ends on every
//! instance (rmcp alone keeps serving a session it restored from memory).
//! [`DurableTasks`] runs the tasks extension (MCP 2026-07-28) over any
//! `TaskStore`.
//!
//! [`Durable`] builds all of them; to wire them yourself, [`IntoRmcp`]
//! makes any `Arc` of a store (a `DynStore` included) either adapter:
//!
//! ```no_run
//! # async fn demo() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use mcp_event_store_core::{EventStore, MemoryStore};
//! use mcp_event_store_rmcp::{IntoRmcp, SessionScoped};
//! use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
//! use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
//!
//! let store = Arc::new(MemoryStore::new()); // or mcp_event_store::connect(url).await?
//! // Stateless mode takes the event store alone:
//! let stateless = NeverSessionManager::default().with_event_store(store.clone().into_rmcp());
//! // Session mode: LocalSessionManager with the event store, resumes scoped,
//! // bindings kept as long as events, sessions checked against the store.
//! let session_store = store.clone().into_rmcp_sessions();
//! let sessions = SessionScoped::local(store.clone())
//!     .with_retention(store.retention())
//!     .with_session_store(&session_store);
//! let mut config = StreamableHttpServerConfig::default();
//! config.session_store = Some(session_store);
//! # let _ = (stateless, sessions, config);
//! # Ok(()) }
//! ```
//!
//! # How a `ServerSseMessage` is stored
//!
//! An rmcp SSE message is an optional JSON-RPC message, an optional `retry`
//! hint and the event id. It becomes one of our events as follows:
//!
//! * **payload**: the JSON-RPC message serialized with `serde_json`, exactly
//!   the bytes rmcp itself would put in the SSE `data:` field; for a message
//!   without a JSON-RPC message (a SEP-1699 *priming event*, or a bare retry
//!   hint) the payload is **empty**. No JSON value serializes to zero bytes,
//!   so "empty" and "has a message" can never be confused, and no marker byte
//!   is needed: the stored payload is the wire payload.
//! * **retry**: stored with the event, in whole milliseconds (the unit SSE
//!   and rmcp's encoder use).
//! * **event id**: ignored on the way in (rmcp asks the store to assign it);
//!   on replay every message carries the id the store assigned when it was
//!   appended, so a client can resume again from any replayed event.
//!
//! Replay parses each payload back into rmcp's `ServerJsonRpcMessage`; rmcp
//! serializes it again when it writes the SSE frame. For every message shape
//! the tests cover (requests, notifications, results of each variant of rmcp's
//! untagged `ServerResult`, errors, custom methods) the replayed frame is byte
//! for byte the one sent live. [`decode`] can be asked to check this for a
//! stored payload with [`replays_exactly`].
//!
//! # Replay streams and errors in the middle of one
//!
//! rmcp wants a replay as a `Stream<Item = ServerSseMessage> + Send + Sync`,
//! with no room for an error. Our replay streams are `Send` but not `Sync`;
//! [`RmcpEventStore`] holds the stream behind a `std::sync::Mutex` that is
//! only ever reached through `&mut` (`Mutex::get_mut`), so it is never
//! locked: `Sync` at no cost and without `unsafe`.
//!
//! Errors before the first event (an unknown, forged or expired id; events
//! purged after the cursor) are returned from `replay_events_after`, and rmcp
//! answers the client with an empty SSE stream (HTTP 200), never a 5xx. An
//! error *during* a replay (a purge racing the reader, the backend failing, a
//! stored payload that no longer parses) **ends the stream** after the events
//! already yielded, and is logged at `warn` with the stream id and the last
//! event id delivered. The stream never skips an event: the client sees a
//! clean end of stream, comes back with the `Last-Event-ID` of the last event
//! it received, and either gets the rest or, if it is gone, an empty stream.
//!
//! # Resumes follow the call to its answer
//!
//! A resume *follows* its stream (C13, [`EventStore::follow_events_after`]):
//! the client gets what is stored after its `Last-Event-ID`, then, in the
//! same response, each message the server goes on sending, from this or any
//! other instance sharing the store. A request stream ends right after the
//! JSON-RPC response or error that answers its request, as rmcp ends a live
//! one; the standalone stream (`<session>:common`), and a request stream
//! whose answer has not come, end after [`DEFAULT_FOLLOW_HOLD`] (five
//! minutes), and the client resumes again with its newest id.
//! [`RmcpEventStore::with_follow_hold`] sets another hold,
//! [`RmcpEventStore::without_follow`] makes every resume a plain replay
//! that ends at the newest stored event (a poll), and
//! [`SessionScoped::local_with_events`] takes the configured event store.
//!
//! # SEP-1699 polling in rmcp 3.9
//!
//! What rmcp does, with one of these stores plugged in:
//!
//! * **Priming events.** `StreamableHttpServerConfig::sse_retry` (and, for
//!   request streams in session mode, `SessionConfig::sse_retry`; both 3 s by
//!   default) makes every request stream start with a priming event (no
//!   data, a `retry` hint), which is stored like any event and so carries an
//!   id the client can resume from before any message arrived.
//! * **Closing a stream on purpose.** Session mode has
//!   `LocalSessionHandle::close_sse_stream(http_request_id, retry)` and
//!   `close_standalone_sse_stream(retry)`, but a tool handler cannot learn
//!   the `http_request_id` of its stream, and stateless mode has no handle.
//!   Ending the HTTP response body works in both modes and is safe, since
//!   every event is stored before rmcp writes it: the example server
//!   (`examples/resumable-server`) does that (`--poll-every N`).
//! * **Resuming.** A `GET` with `Last-Event-ID` (with `Mcp-Session-Id` in
//!   session mode) is answered from the event store, in session mode
//!   without re-attaching to rmcp's live channel: the follow above is what
//!   keeps the response open until the answer.
//!   Refused resumes get an empty stream with status 200.
//! * **The client.** rmcp's `StreamableHttpClientTransport` reconnects when a
//!   stream ends gracefully, waits for the server's `retry` hint (or its
//!   retry policy), and resumes with the newest `Last-Event-ID` until the
//!   response arrives.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod codec;
mod durable;
mod events;
mod scoped;
mod sessions;
pub mod tasks;
mod tracker;

pub use codec::{DecodeError, decode, encode, replays_exactly};
pub use durable::{
    DEFAULT_PURGE_EVERY, DEFAULT_SSE_RETRY, Durable, DurableBuilder, SessionManager,
};
pub use events::{DEFAULT_FOLLOW_HOLD, RmcpEventStore};
pub use scoped::{
    DEFAULT_BINDING_KEY_PREFIX, DEFAULT_BINDING_TTL, DEFAULT_SESSION_CHECK_INTERVAL, ScopedError,
    SessionScoped,
};
pub use sessions::{DEFAULT_SESSION_KEY_PREFIX, DEFAULT_SESSION_TTL, RmcpSessionStore};
pub use tasks::{DurableTaskContext, DurableTasks, DurableTasksBuilder};

use std::sync::Arc;

use mcp_event_store_core::{EventStore, SessionStore};

/// What went wrong in an adapter, as rmcp receives it (boxed into its
/// `EventStoreError` / `SessionStoreError`).
///
/// The store's [`Error`](mcp_event_store_core::Error) or the JSON error is kept as the
/// [`source`](std::error::Error::source), so a caller can walk the chain or
/// downcast it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdapterError {
    /// The underlying store refused or failed.
    #[error("event store {operation} failed: {source}")]
    Store {
        /// What the adapter was doing (`"store_event"`, `"replay"`, ...).
        operation: &'static str,
        /// The store's error.
        #[source]
        source: mcp_event_store_core::Error,
    },
    /// A message could not be serialized to JSON.
    #[error("cannot serialize the JSON-RPC message: {0}")]
    Encode(#[source] serde_json::Error),
    /// Stored session state could not be read back.
    #[error("stored state of session {session_id:?} is unreadable: {source}")]
    SessionState {
        /// The session.
        session_id: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

impl AdapterError {
    fn store(operation: &'static str, source: mcp_event_store_core::Error) -> Self {
        Self::Store { operation, source }
    }
}

/// Turns an `Arc` of any store into rmcp's `EventStore` and `SessionStore`,
/// in one call.
///
/// Implemented for every `Arc<S>` where `S` is one of our stores, sized or
/// not, so it works on `Arc<SqliteStore>`, `Arc<dyn Store>` (the facade's
/// `DynStore`) and `Arc<dyn EventStore>` alike. The results coerce to
/// `Arc<dyn rmcp::…::EventStore>` / `Arc<dyn rmcp::…::SessionStore>` where
/// rmcp expects them.
pub trait IntoRmcp<S: ?Sized> {
    /// This store as rmcp's `EventStore`.
    fn into_rmcp(self) -> Arc<RmcpEventStore<S>>
    where
        S: EventStore;

    /// This store as rmcp's `SessionStore`, with the default time to live
    /// ([`DEFAULT_SESSION_TTL`]); see [`RmcpSessionStore::with_ttl`] for
    /// another.
    fn into_rmcp_sessions(self) -> Arc<RmcpSessionStore<S>>
    where
        S: SessionStore;
}

impl<S: ?Sized> IntoRmcp<S> for Arc<S> {
    fn into_rmcp(self) -> Arc<RmcpEventStore<S>>
    where
        S: EventStore,
    {
        Arc::new(RmcpEventStore::new(self))
    }

    fn into_rmcp_sessions(self) -> Arc<RmcpSessionStore<S>>
    where
        S: SessionStore,
    {
        Arc::new(RmcpSessionStore::new(self))
    }
}

#[cfg(test)]
mod across_instances;
#[cfg(test)]
mod tests;
