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
//! everywhere), durable tasks, and the framework-neutral [`Runtime`] under
//! them all (the instance's one lease, one maintenance loop, the takeover
//! runner), the same runtime the tower-mcp integration runs. A complete
//! session-mode server:
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
//! hold, the session lifetime and check interval, the priming events'
//! retry hint, the task owner; the runtime's lease, purge and claim
//! intervals through [`DurableBuilder::runtime`]); what the store itself
//! knows (its retention) is read from it. Stateless mode:
//! [`Durable::stateless_service`].
//!
//! # What `Durable` wires
//!
//! What [`Durable`] wires is in its docs; for a server of your own shape,
//! `durable.session_manager()`, `durable.config()`,
//! `durable.stateless_session_manager()` and `durable.stateless_config()`
//! are the parts (and `durable.as_caller(..)` serves a request as its
//! caller where no tower service can wrap rmcp's, as in actix-web);
//! `IntoRmcp` (`store.into_rmcp()`, `store.into_rmcp_sessions()`) and
//! `SessionScoped` are the adapters underneath, for wiring by hand. The
//! facade's `rmcp` feature re-exports this crate as
//! `mcp_event_store::rmcp`.
//!
//! * `store.into_rmcp_sessions()` is rmcp's `SessionStore`: the `initialize`
//!   parameters as JSON, with a time to live (24 hours by default, counted
//!   from the session's start or its latest restore on another instance).
//! * `SessionScoped` closes three gaps in rmcp:
//!   * With an event store, `LocalSessionManager` resumes whatever stream a
//!     `Last-Event-ID` names, whichever session asks. `SessionScoped` binds
//!     each request stream to its session in the store (one small write per
//!     request stream) and refuses resumes from other sessions. A binding
//!     lives as long as the events it guards (`with_retention`: the store's
//!     `max_age`, one hour by default). When its session ends, each instance
//!     removes the bindings it wrote; the rest expire with the events.
//!   * rmcp keeps a session it restored in memory and never asks the session
//!     store again, so a session deleted (`DELETE`) on one instance lived on
//!     on another. `SessionScoped` looks each session it holds up in the
//!     session store at most once a second (`with_session_check_interval`),
//!     and a session deleted or expired there answers 404 on every instance
//!     within that second. The cost is one key lookup per busy session per
//!     second: `has_session` took 110 to 270 ns a request (rmcp's alone: 50 to
//!     70 ns), against 46 to 58 µs (SQLite), 81 µs (Redis) and 180 to 190 µs
//!     (PostgreSQL) when looking up on every request.
//!   * Two requests of one session arriving together on an instance that
//!     must restore it could get a 500 from rmcp 3.11: the one that saw
//!     the session held before its restored handshake was replayed, or the
//!     one that found it absent and came to restore it after the other had
//!     (`AlreadyPresent`). `SessionScoped` makes a request wait while its
//!     session is being restored on the instance (at most 10 s), and
//!     serves the late restore from the session already held, its
//!     handshake replayed to a handler of its own (see `SessionScoped`,
//!     *Restores racing requests*).
//! * A resume **follows** its stream (C13; see [below](#resumes-follow-the-call-to-its-answer)),
//!   and a client resumes again with its newest id after the hold (SEP-1699).
//!   `DurableBuilder::follow_hold(Some(d))` sets another hold;
//!   `follow_hold(None)` makes a resume end with what is stored, so the
//!   client polls again (rmcp's client does that by itself).
//! * **A call whose server died.** `Durable` gives the event store the
//!   instance's runtime (by hand: `RmcpEventStore::with_runtime`): the
//!   instance records itself as the writer of each request stream it starts
//!   (one session-store write per call), and its one lease says whether it
//!   lives. A client that resumes on instance B a call that was running on
//!   instance A, after A was killed, gets what A stored after its
//!   `Last-Event-ID`, and then the response **ends**, about one lease (30 to
//!   40 s) after A died, or at once when B sees A already gone; every later
//!   resume of that stream ends right after what is stored. There is no
//!   answer to the call: a client that keeps resuming gets nothing more, and
//!   should give up after its retries and call again (rmcp's and the official
//!   SDKs' clients do, after their reconnection attempts). Without a
//!   runtime, or for a stream whose writer was not recorded, the resume
//!   waits out the whole hold (five minutes) first. A graceful shutdown
//!   (`Durable::shutdown`, `Runtime::shutdown`) ends the lease at once, so
//!   resumes of its calls end at their next check (within 10 s).
//!
//! # Durable tasks
//!
//! Serve durable tasks from your own handler with the [`DurableTasks`] that
//! [`Durable`] builds: clone it into each handler and delegate the four
//! handler methods:
//!
//! ```no_run
//! # use mcp_event_store_core::task::Owner;
//! # #[derive(Clone)] struct MyServer { tasks: mcp_event_store_rmcp::DurableTasks }
//! # impl rmcp::ServerHandler for MyServer {}
//! # fn my_owner(_: &rmcp::service::RequestContext<rmcp::service::RoleServer>) -> Owner { Owner::Anonymous }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! # let store = std::sync::Arc::new(mcp_event_store_core::MemoryStore::new());
//! use mcp_event_store_rmcp::Durable;
//!
//! // let store = mcp_event_store::connect("postgres://postgres@127.0.0.1/postgres").await?;
//! let durable = Durable::builder(store)
//!     // Who may see a task: the principal your authentication established
//!     // (`Owner::principal(bytes)`), else `Owner::Anonymous`.
//!     .owner(|ctx| my_owner(ctx))
//!     .start()
//!     .await?;
//! let tasks = durable.tasks();
//! let service = durable.service(move || Ok(MyServer { tasks: tasks.clone() }));
//!
//! // impl ServerHandler for MyServer (declare it: ServerCapabilities::builder().enable_tasks()):
//! // call_tool:   self.tasks.spawn(&ctx, rmcp::task_manager::TaskOptions::new(),
//! //                  |task| Box::pin(work(task)))
//! //                  .await.map(CallToolResponse::Task)
//! //              (-32021, nothing stored, if the request did not declare the extension)
//! // get_task:    self.tasks.get_task(&ctx, params).await
//! // update_task: self.tasks.update_task(&ctx, params).await
//! // cancel_task: self.tasks.cancel_task(&ctx, params).await
//! # let _ = service; Ok(()) }
//! ```
//!
//! The operation gets a [`DurableTaskContext`]: `set_status_message`,
//! `request_input` (an input request the client answers through
//! `tasks/update`, on whichever instance), `cancelled` and
//! `is_cancel_requested`. The runtime renews the instance's lease (every
//! 10 s, a 30 s lease, `runtime(|r| r.lease(..))` to change it); a task
//! whose instance stops renewing reads `failed`. ([`DurableTasks::builder`]
//! builds the tasks of a runtime alone: a worker's, say.)
//!
//! # Request states used once
//!
//! A multi-round-trip request (SEP-2322, MCP 2026-07-28) hands the client
//! a `requestState` it echoes back on its retry, to whichever instance.
//! rmcp's `RequestStateCodec` signs it with the replicas' key ring; a
//! state that must be consumed at most once also needs a memory the
//! instances share. [`SingleUseStates`] is the codec beside the store's
//! redemptions (C21): [`seal`](SingleUseStates::seal) puts a fresh nonce
//! and the expiry in with the payload, [`open`](SingleUseStates::open)
//! checks the state with the codec and redeems its nonce, so the first
//! retry to reach any instance gets the payload and every replay, on any
//! instance, is refused:
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn mcp_event_store_core::Store>, state: String,
//! #     owner: mcp_event_store_core::task::Owner) -> Result<(), Box<dyn std::error::Error>> {
//! use mcp_event_store_rmcp::SingleUseStates;
//! use rmcp::model::RequestStateCodec;
//!
//! let states = SingleUseStates::new(RequestStateCodec::try_new(b"key shared by every replica, 32+ bytes".to_vec())?, store);
//! let payload = states.open(&state, b"alice|tools/call:pay", &owner).await?; // once, anywhere
//! # let _ = payload; Ok(()) }
//! ```
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
//! # Tasks that outlive their instance
//!
//! A tool registered for takeover ([`DurableTasksBuilder::takeover`],
//! called with [`DurableTasks::spawn_takeover`]) makes tasks that another
//! instance, or a worker process with no HTTP endpoint, takes over when the
//! instance running them dies. The guarantee is **at least once, with
//! fencing**: the handler may run again (from its last
//! [checkpoint](DurableTaskContext::checkpoint)), and a stale run is stopped
//! at its next write, so exactly one outcome is stored. What the handler
//! does outside the store between two writes must be safe to repeat.
//! Input requests give the task back until the client answers; the run
//! that claims it then gets every earlier answer at once. A cancel is
//! honoured whoever claims the task. Details in the [`tasks`] module.
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
//! for byte the one sent live, also for custom messages that rmcp's
//! untagged enums would otherwise read as a known type and trim.
//! [`decode`] can be asked to check this for a stored payload with
//! [`replays_exactly`].
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
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod callers;
mod codec;
mod durable;
mod events;
mod listeners;
mod restores;
mod routed;
mod scoped;
mod sessions;
mod single_use;
pub mod tasks;
mod tracker;

pub use callers::CallerScoped;
pub use codec::{DecodeError, decode, encode, replays_exactly};
pub use durable::{DEFAULT_SSE_RETRY, Durable, DurableBuilder, SessionManager};
pub use events::{DEFAULT_FOLLOW_HOLD, RmcpEventStore};
pub use mcp_event_store_runtime::{self as runtime, Callers, Runtime, RuntimeBuilder};
pub use routed::Routed;
pub use scoped::{
    DEFAULT_BINDING_KEY_PREFIX, DEFAULT_BINDING_TTL, DEFAULT_SESSION_CHECK_INTERVAL, ScopedError,
    SessionScoped,
};
pub use sessions::{DEFAULT_SESSION_KEY_PREFIX, DEFAULT_SESSION_TTL, RmcpSessionStore};
pub use single_use::{SingleUseError, SingleUseStates};
pub use tasks::{
    DurableTaskContext, DurableTasks, DurableTasksBuilder, TakeoverCall, TakeoverHandler,
};

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
mod restore_race;
#[cfg(test)]
mod tests;
