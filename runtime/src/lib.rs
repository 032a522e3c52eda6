//! The framework-neutral runtime of **mcp-event-store**: what keeps a
//! server instance alive in a shared store and runs its tasks, written once
//! for every MCP framework.
//!
//! A store is shared by every instance behind a load balancer; this crate
//! is what each instance runs over it. [`Runtime::builder`] takes any store
//! (`mcp_event_store::connect(url)` gives one) and starts:
//!
//! * **One instance with one lease** (T11): registered in the store's task
//!   instances, renewed every third of the [lease](RuntimeBuilder::lease).
//!   The tasks it runs read `failed` ("server instance lost") or are taken
//!   over once it lapses, and a resume elsewhere of a stream it writes
//!   ends once it is known gone ([`Runtime::produces`],
//!   [`Runtime::producer_lost`]). An instance that stalled past its lease
//!   is never revived: the runtime registers a fresh one. A graceful
//!   [`shutdown`](Runtime::shutdown) ends the lease at once.
//!   [`Runtime::lease_current`] says, without a store call, whether the
//!   store accepted a renewal within the last lease (for a readiness
//!   probe).
//! * **One maintenance loop**: the lease renewal, the purge of expired
//!   events, sessions and tasks ([`purge_every`](RuntimeBuilder::purge_every)),
//!   and the claim rounds of the takeover runner
//!   ([`claim_every`](RuntimeBuilder::claim_every)), each on a task of its
//!   own so none waits for another.
//! * **The takeover runner** (T16 to T19): tasks created to be taken over
//!   ([`Runtime::for_takeover`]) are claimed from the store when their
//!   instance lapsed, when they were queued for a worker, or when they were
//!   given back for input and since answered, and run again through the
//!   [`Executor`] a framework registers ([`Runtime::run_takeovers`]), at
//!   most [`max_running`](RuntimeBuilder::max_running) at once (but for
//!   the tasks [`Runtime::claim_for`] claims beside its own). Every write
//!   names its claim, so a run that lost it is stopped at its next write
//!   (or sooner, when its claim is seen lost) and changes nothing: *at least
//!   once, with fencing*.
//!
//! * **The bus between instances** (core's bus, C17 to C19): what is
//!   held only in memory stops at the instance that holds it, so the
//!   instances tell each other through the store. A server-to-client
//!   request carries an id naming its instance ([`Runtime::request_id`]);
//!   the instance a client posts the answer to routes it there
//!   ([`Runtime::route_reply`]), where [`Runtime::replies`] hands it to
//!   the waiting session. A notification raised once
//!   ([`Runtime::notify`]) is heard by every instance
//!   ([`Runtime::notifications`]), and so is a session ended anywhere
//!   ([`Runtime::end_session`], [`Runtime::ended_sessions`]). Each comes
//!   through a [`Listener`], which keeps its subscription across errors
//!   and says when retention overtook it.
//!
//! A [`TaskRun`] is one run of a task on this instance, whether the
//! instance created it or claimed it: its claim, its checkpoint, its
//! answers, its writes, and [`TaskRun::drive`], which runs an operation and
//! stores its [`Outcome`].
//!
//! A [`TaskCall`] is what a task runs, kept with it as its context (T13):
//! the tool's name, its arguments, the W3C trace context of the request
//! that created it, and the integration's own fields, in one JSON encoding
//! for every framework ([`Runtime::create_call`] creates a task with one,
//! [`TaskRun::call`] reads it back, [`TaskCall::tool_of`] gives the tool's
//! name to operators' tooling).
//!
//! # Traces
//!
//! Every run of a claimed task (a takeover, a worker's run) runs in a
//! `task.run` span ([`TaskRun::span`]) naming the task's digest, the
//! attempt and the tool. With the feature `otel`, a task keeps the trace
//! context of the span it was created in, and that span becomes the parent
//! of its claimed runs: the trace follows the work from instance to
//! instance (module `otel`). The feature `otel-export` adds
//! `otel::Tracing`, the export the example servers' `--trace` sets up (to
//! stdout, or with the feature `otlp` over OTLP).
//!
//! ```no_run
//! # async fn demo() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use mcp_event_store_runtime::Runtime;
//!
//! let store = Arc::new(mcp_event_store_core::MemoryStore::new()); // or connect(url)
//! let runtime = Runtime::builder(store)
//!     .lease(Duration::from_secs(30))
//!     .start()
//!     .await?;
//! // Hand `runtime.clone()` to the framework's adapters; at the end:
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! The integrations (`mcp-event-store-rmcp`, `mcp-event-store-tower-mcp`)
//! build on this crate and only translate between their framework's types
//! and it; the facade re-exports it as `mcp_event_store::runtime`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bus;
mod call;
mod callers;
mod card;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;
mod run;
mod runtime;
mod streams;
mod takeover;
mod time;

pub use bus::{Audience, Heard, Listener, Notification, Reply, Route};
pub use call::{CallError, TaskCall};
pub use callers::{Callers, owner_of};
pub use card::{CARD_EVERY, CARDS_STREAM, InstanceCard};
pub use run::{Outcome, Stop, TaskRun};
pub use runtime::{
    DEFAULT_CLAIM_EVERY, DEFAULT_LEASE, DEFAULT_MAX_RUNNING, DEFAULT_PURGE_EVERY, DEFAULT_VERSION,
    DEFAULT_WATCH_WAIT, MAX_RUNNING, Runtime, RuntimeBuilder,
};
pub use streams::DEFAULT_PRODUCER_TTL;
pub use takeover::{Executor, Takeovers};
pub use time::{internal_error, iso8601, status_message};
