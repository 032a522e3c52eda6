//! Any **mcp-event-store** store as [tower-mcp](https://docs.rs/tower-mcp)'s
//! three pluggable stores (0.25):
//!
//! * [`TowerEventStore`]: tower-mcp's `event_store::EventStore`, for
//!   resumable SSE streams (protocol 2025-11-25 and before);
//! * [`TowerSessionStore`]: its `session_store::SessionStore`, so a
//!   session created on one instance is served by another;
//! * [`TowerTaskStore`]: its `async_task::TaskStore`, for durable tasks
//!   (SEP-2663, protocol 2026-07-28) that every instance answers for.
//!
//! The event and session adapters take an `Arc` of a store: the
//! `DynStore` that `mcp_event_store::connect` returns (the default type
//! parameter, `dyn Store`), or a concrete one (`Arc<SqliteStore>`, ...).
//! The task adapter takes the process's [`Runtime`] (the framework-neutral
//! runtime every integration shares: the instance's one lease, purges,
//! takeovers). They use only the public contract of
//! `mcp-event-store-core`, so the same code serves SQLite, PostgreSQL,
//! Redis, sled and memory, and tower-mcp's own contract suites pass on all
//! five (`tests/adapters/contracts.rs`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::sync::Arc;
//! use mcp_event_store_tower_mcp::{Runtime, TowerEventStore, TowerSessionStore, TowerTaskStore};
//! use tower_mcp::{HttpTransport, McpRouter};
//!
//! let store: Arc<dyn mcp_event_store_core::Store> =
//!     Arc::new(mcp_event_store_core::MemoryStore::new()); // or connect("postgres://...")
//! let runtime = Runtime::builder(store.clone()).start().await?;
//! let tasks = TowerTaskStore::builder(runtime.clone()).build()?;
//! let router = McpRouter::new().task_store(Arc::new(tasks));
//! let transport = HttpTransport::new(router)
//!     .session_store(Arc::new(TowerSessionStore::new(store.clone())))
//!     .event_store(Arc::new(TowerEventStore::new(store)));
//! // Serve; at the end: runtime.shutdown().await;
//! # let _ = transport; Ok(()) }
//! ```
//!
//! tower-mcp's stores and this project's contract (the clauses in
//! `mcp-event-store-core`'s docs) differ in places. Each difference, and
//! what this crate does about it, follows.
//!
//! # Events
//!
//! * **Who numbers events.** tower-mcp's transport numbers a session's
//!   events itself (a `u64` per session) and replays by session and number;
//!   the stores assign unguessable ids of their own (C2) and replay by id.
//!   Each session is one stream, `<namespace><session id>`, and each event
//!   is stored in an envelope of this crate's (a version byte, tower-mcp's
//!   number and timestamp, then the data). A replay reads the session's
//!   stream from its oldest retained event (C16, grown into the contract
//!   for this) and keeps the events numbered after the cursor, in store
//!   order. A replay is thus linear in the session's retained events, which
//!   the store's retention bounds (C8: 10,000 events, 64 MiB and an hour
//!   per stream by default); tower-mcp's memory store keeps 1,000 per
//!   session.
//! * **No event is lost to a purge mid-replay**: retention overtaking a
//!   replay is refused by the store (C5), and the replay starts over.
//! * **What tower-mcp does not store cannot be resumed.** Its transport
//!   stores only the events of GET streams (the standalone stream and
//!   `subscriptions/listen`), and a session's events only while a GET
//!   stream is open; POST responses carry no event ids (pinned by a test
//!   in `examples/tower-mcp-server/tests/tower_e2e`).
//! * **Idle cleanup is per instance**: tower-mcp deletes a session, and
//!   purges its events, on an instance where it idled, even while another
//!   instance serves it. The stores built
//!   [`across_instances`](TowerSessionStore::across_instances), with the
//!   layer of [Across instances](#across-instances), spare such a session.
//!
//! # Sessions
//!
//! * Each session is a record of the store's session store, keyed
//!   `<namespace><session id>`: tower-mcp's `SessionRecord` as JSON, kept
//!   until its `expires_at` (tower-mcp saves on every request, sliding it).
//!   A record read after its `expires_at` is never returned.
//! * **`create` is check-then-write**, not one atomic step: the session
//!   store has no insert-if-absent. Two creates racing under one id could
//!   both succeed; tower-mcp draws a random UUID for every session, so it
//!   never races itself so. A taken id gets a fresh UUID.
//!
//! # Across instances
//!
//! Instances on one store act as one behind a load balancer without
//! session affinity as far as tower-mcp 0.25 lets a session's live state
//! out. [`Across`] carries over the runtime's bus what it can:
//!
//! * **A `DELETE` ends the session everywhere**: its layer
//!   ([`Across::layer`], on the router built with
//!   `into_router_at_with_handle`) publishes a client's `DELETE`, and
//!   every instance ends the session it holds (tower-mcp's
//!   `SessionHandle::terminate_session`) and closes the session's SSE
//!   responses it is sending, within the bus's latency, and refuses it
//!   from then on (for an hour), whatever record another instance wrote
//!   back before it heard. Without it, an
//!   instance that restored a session keeps serving it from memory after a
//!   `DELETE` on another and writes its record back.
//! * **A session initialized through another instance is served**:
//!   tower-mcp refuses the requests of a session it created until it hears
//!   `notifications/initialized`, which a load balancer may send to
//!   another instance; the layer then drops the stale copy and tower-mcp
//!   restores the session from its record (proven by
//!   `behind_a_round_robin_proxy_one_session_spans_both_servers`).
//! * **Idle cleanup spares a session served elsewhere**: with the session
//!   and event stores built `across_instances`, tower-mcp's local idle
//!   cleanup deletes no record that another instance's `save` kept live
//!   (tower-mcp saves on every request) and purges no events (they are
//!   left to the store's retention); a client's `DELETE`, told apart by
//!   the layer, deletes and purges as before.
//! * **Broadcast notifications reach every instance**: [`Across::raise`]
//!   publishes a list change or resource update once, and every instance
//!   hands it to tower-mcp's external notification channel
//!   ([`Across::notifications`]), which sends it to its own clients.
//! * **A task's status reaches its listeners on every instance**: with
//!   [`AcrossLayer::announcing_tasks`], each instance watches in the store
//!   the tasks its `subscriptions/listen` streams name (`taskIds`) and has
//!   its router announce every change (`notifications/tasks`), wherever
//!   the change was made: a run, a takeover, an answer, a cancel.
//!
//! What tower-mcp 0.25 gives no seam for, so that stays per instance
//! (pinned by tests in `examples/tower-mcp-server/tests/tower_e2e` where a
//! client can observe it):
//!
//! * **A server-to-client request's answer** (sampling, elicitation or
//!   roots in a 2025-11-25 session) must reach the instance that sent the
//!   request: tower-mcp keeps the waiting request in that instance's
//!   memory, numbers it itself and offers no hook to route an answer, so
//!   an answer POSTed to another instance is dropped there (answered
//!   `202 Accepted`) and the request waits on, for an answer POSTed to its
//!   instance or until its POST's stream closes (pinned by
//!   `an_answer_posted_to_another_server_is_dropped_there`). The
//!   2026-07-28 flow (input requests carried by the task or by
//!   `inputResponses`) has no such state and works on any instance.
//! * **Notifications for one session** (progress, log messages):
//!   tower-mcp sends only from inside the request or to all of an
//!   instance's sessions; a notification for one session published by
//!   another framework's adapter is skipped here.
//! * **`resources/subscribe`** is kept per instance: a resource update is
//!   delivered to the sessions that subscribed to it on the instance that
//!   delivers it, so every instance delivers it to its own subscribers.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # async fn demo(store: Arc<dyn mcp_event_store_core::Store>, router: tower_mcp::McpRouter)
//! #     -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use mcp_event_store_tower_mcp::{Across, Broadcast, Runtime, TowerEventStore, TowerSessionStore};
//! use tower_mcp::HttpTransport;
//!
//! let runtime = Runtime::builder(store.clone()).start().await?;
//! let across = Across::new(runtime);
//! let transport = HttpTransport::new(router)
//!     .session_store(Arc::new(TowerSessionStore::new(store.clone()).across_instances()))
//!     .event_store(Arc::new(TowerEventStore::new(store).across_instances()))
//!     .external_notifications(across.notifications().await?);
//! let (app, sessions) = transport.into_router_at_with_handle("/mcp");
//! let app = app.layer(across.layer(sessions).await?);
//! // With tasks: `.announcing_tasks(router.clone(), tasks.clone())` on the
//! // layer, given the router and its `TowerTaskStore`.
//! across.raise(&Broadcast::ResourcesListChanged).await?;
//! # let _ = app; Ok(()) }
//! ```
//!
//! # Tasks
//!
//! tower-mcp asks of a task store what the task contract did not have;
//! where that took more than a mapping, the contract grew (T13 to T15, each
//! on every store, with cases in the shared suite), and otherwise this
//! crate decides:
//!
//! * **Tool name, arguments, owner and `_meta` are the task's context**
//!   (T13, new): JSON this crate writes at creation and the store keeps
//!   with the task, so `resume_context` works on whichever instance
//!   `tasks/update` arrives at. `set_task_meta` replaces the context while
//!   the task runs (a terminal task changes no more, T4: `false`), last
//!   writer winning.
//! * **The owner string is kept verbatim, in the context.** tower-mcp's
//!   `task_owner` must return it exactly, and its router authorizes by
//!   equality with it, while T3 keeps only a digest of a principal. So the
//!   store binds the task to the digest of the owner string (every string a
//!   principal of its own: `None`, `""` and long ones apart), and the
//!   context keeps the string. tower-mcp's owner is an authenticated
//!   principal (an OAuth `sub` by default), not a secret; do not resolve
//!   owners to credentials, as they are stored.
//! * **tower-mcp reads and writes without the owner** (its router
//!   authorizes first): this crate reads through the runtime's view
//!   (`RuntimeStore::view`, T14), which returns the owner, and passes it
//!   to the owner-checked calls it makes (`answer`, `request_cancel`,
//!   `watch`).
//! * **Expired is unknown there, `failed` here.** tower-mcp forgets a task,
//!   terminal or not, once its ttl (from creation) has passed; the store
//!   reads a running one `failed` and keeps any task for its grace, an
//!   hour by default however short the ttl (T21). This crate hides every
//!   task at `created + ttl` (by the system clock) and reports
//!   `TaskPresence::Expired` with its owner during the grace, so tower-mcp
//!   tells the owner "expired" rather than "not found". Every transition
//!   on it answers `false`/`None`. `set_ttl(0)` expires a task at once. The
//!   store caps a ttl at its `max_task_age` (7 days by default), and
//!   `get_task` reports the capped ttl; `ttl: None` is
//!   [`DEFAULT_TASK_TTL`] (an hour).
//! * **`require_input` replaces the outstanding set** there, and the
//!   contract's `request_input` added one key: T15 (new) replaces the set
//!   in one atomic step, superseding the keys left out, carrying forward a
//!   live key with the same request (compared as serialized JSON), and
//!   refusing a spent or re-pointed key, which this crate reports as
//!   `InvalidTransition`. Without a message it keeps the task's current
//!   one (tower-mcp's memory store sets "Awaiting client input", which then
//!   outlives the wait); messages longer than the store's 4 KiB are cut
//!   (tower-mcp passes MRTR request state there).
//! * **Every answer is kept.** tower-mcp re-runs the handler with all
//!   answers over all rounds: this crate never takes an answer (T5's
//!   `TakeAnswer`), and the runtime's view returns all that were not taken.
//! * **Which call an answer came from.** `apply_input_responses` must say
//!   which keys *this* call answered (tower-mcp resumes the handler when a
//!   call completes the set, so exactly one caller may see that), and the
//!   store's `answer` returns the task after the call. Each stored answer
//!   carries a random nonce of its call's (an envelope of this crate's in
//!   the store's opaque response bytes), and the keys whose stored answer
//!   has this call's nonce are the accepted ones: one more read, but exact
//!   under races. (Changing `answer`'s result would have broken every
//!   implementor of the contract.)
//! * **`list_tasks` lists this process's tasks.** Its tasks must come with
//!   their ids, and the store never keeps a task id (T2: a dump hands out
//!   no bearer token), so only the process that holds an id can list it:
//!   the tasks this process created or resumed, read fresh from the store.
//!   tower-mcp's router never lists (SEP-2663 removed `tasks/list`).
//! * **Cancellation tokens are process-local.** `create_task` and
//!   `resume_context` hand out a token per task and process, which
//!   `cancel_task` raises before it returns, in its own process. Each token
//!   has a guard that watches its task through the store (T10, so a change
//!   through any instance wakes it) and raises the token when the task is
//!   cancelled, fails (it can no longer finish), expires (at its deadline)
//!   or goes. So a `tasks/cancel` through another instance stops the
//!   handler where it runs. A cancel is immediate (T6,
//!   `CancelMode::Immediate`), as in tower-mcp, and keeps its reason (T20):
//!   the task's status message reads `Cancelled: <reason>`, as tower-mcp's
//!   own store shows it, on every instance.
//! * **Instances and their lease** (T11) have no counterpart in
//!   tower-mcp. The [`Runtime`] registers the process's instance, renews
//!   its one lease, and runs under it every task this process creates or
//!   works on; a process that dies (or drops its runtime) leaves its
//!   running tasks reading `failed` ("server instance lost") one lease
//!   later, on every instance. The runtime also purges expired events,
//!   sessions and tasks.
//! * **`set_status`** sets a running task's message; the status follows the
//!   inputs (`input_required` while any is outstanding), so `set_status`
//!   to `input_required` is refused (`InvalidTransition`), and to `working`
//!   leaves an `input_required` task so. `set_ttl` on a terminal task
//!   answers `false` (T4; tower-mcp's memory store allows it).
//! * **Durable state; durable execution on opt-in.** By default the handler
//!   runs in the process that created (or resumed) the task; if it dies,
//!   the task reads `failed` after the lease, and nothing runs it again.
//!   Tasks of the tools a builder opts in may outlive their process:
//!   [Takeover](#takeover).
//!
//! # Takeover
//!
//! What tower-mcp 0.25's runtime allows, read from its source:
//!
//! * It runs a task's handler in two places only: on `tools/call`, in the
//!   process that received it (the router spawns the handler right after
//!   `TaskStore::create_task`), and on a `tasks/update` that answered the
//!   last outstanding input (`McpRouter::resume_task`, crate-private,
//!   called from the router's `UpdateTask` arm), in the process that
//!   received the update, which calls `TaskStore::resume_context` there and
//!   re-runs the handler from the top. Only that second path runs a task in
//!   a process that did not start it, and only when a client's answer
//!   arrives; nothing in tower-mcp re-runs a task whose process died, and
//!   no public call starts `resume_task`. Its runtime learns of a task only
//!   through a request naming its id.
//! * Everything it does to a task is keyed by the task id, which the store
//!   never keeps (T2, a bearer credential), so a process that claims a
//!   task (by its digest) cannot hand it to tower-mcp's task runtime.
//!   This crate does not keep the id anywhere to get round that.
//! * The router's public `Service` runs a tool as a plain 2026-07-28
//!   `tools/call` (no task), with `inputResponses`: the same handler, with
//!   the same arguments and answers, that `resume_task` would run.
//!
//! So, with [`TowerTaskStoreBuilder::takeover`] (every tool) or
//! [`takeover_tools`](TowerTaskStoreBuilder::takeover_tools) (the tools
//! named), and [`TowerTaskStore::run_takeovers`] given the router:
//!
//! * Tasks of those tools are created to be taken over (T16), at most the
//!   runtime's `max_attempts` runs in all, held by this process's claim
//!   (T18, epoch 1). The lease keeps them; when the instance lapses,
//!   another instance running takeovers claims them (T17, at its runtime's
//!   `claim_every`) and has its router run the tool again as above, then
//!   writes the outcome (result, error, or input requests) under its
//!   claim. After the last run's instance lapses, the task reads `failed`
//!   ("server instance lost"). tower-mcp runs a task's handler where it
//!   is created, so a runtime's hand-off to workers does not apply here.
//! * **Fencing.** Every write to such a task names this process's claim.
//!   A write from a stale claim (the task was claimed since by another, or
//!   given back) is refused by the store (`Applied::Fenced`) and reads as
//!   not applied (`Ok(false)`, as for a terminal task: tower-mcp then drops
//!   the outcome without overwriting anything), and raises the task's
//!   token here; a token's guard raises it too when it sees the task
//!   claimed by another. A handler run through the router is dropped when
//!   its claim is lost or the task ends (a `tasks/cancel` through any
//!   instance included, or its expiry).
//! * **Parking.** When a handler asks for input, the task is given back
//!   (T17 release, no run counted) as soon as it is parked: nothing runs
//!   it. The `tasks/update` that answers it resumes it in whichever
//!   process it reaches: `resume_context` claims it there (claims are not
//!   by task, so other tasks claimed with it are run as above) and
//!   tower-mcp re-runs the handler under that claim; if another instance
//!   claimed it first, the resume there runs nothing (its token comes
//!   raised) and that instance runs it.
//! * **Traces** (feature `otel`). A task keeps, with its tool and
//!   arguments (the runtime's `TaskCall`), the W3C trace context of the
//!   span its `tools/call` was created in; a run through the router after a
//!   takeover runs in a `task.run` span continuing that trace. tower-mcp
//!   runs a resumed task itself, in the request that resumed it.
//!
//! Guaranteed: each such task's handler runs **at least once** to an
//! outcome, and **at most `max_attempts` times** over instance lapses (a
//! run given back after parking counts none); exactly one outcome is
//! recorded, by the current claim; a stale process never overwrites it.
//!
//! Not guaranteed, and why:
//!
//! * **Exactly once**: a handler may have done its work, or part of it,
//!   when its process died; the next run starts from the top. Opt in only
//!   tools that are safe to run again. Checkpoints (T19) are in the store,
//!   but tower-mcp gives a handler no way to save or read one.
//! * **Live handlers** (`live_task_handler`) are never replayed by
//!   tower-mcp (it does not even keep their arguments) and park inside
//!   their own future, which the release after parking would fence: do not
//!   opt their tools in.
//! * **A run through the router is a plain call, not tower-mcp's task
//!   run**: the handler finds no `TaskContext` (no task id to find it by),
//!   tower-mcp pushes no `notifications/tasks` for it (clients polling
//!   `tasks/get` see every change, and listeners hear them through
//!   [`AcrossLayer::announcing_tasks`]), and a tool with
//!   `TaskSupportMode::Required` is refused as a plain call, which fails
//!   the task. The request claims every input capability (roots,
//!   sampling, elicitation), as tower-mcp's own replay checks none; a
//!   router error (unknown tool, a capability filter refusing the
//!   anonymous call) fails the task with that error.
//! * **Every instance sharing the store should run takeovers**: only this
//!   adapter, running them, creates tasks to be taken over, but an answer
//!   reaching an instance that does not run them leaves the task given
//!   back until one that does claims it (or it expires).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod across;
mod callers;
mod events;
mod sessions;
mod support;
mod takeover;
mod tasks;

pub use across::{Across, AcrossLayer, AcrossService, Broadcast};
pub use callers::{BindCallers, CallerPrincipal, CallersLayer, CallersService};
pub use events::TowerEventStore;
pub use mcp_event_store_runtime::{self as runtime, Callers, Runtime, RuntimeBuilder, Takeovers};
pub use sessions::TowerSessionStore;
pub use tasks::{DEFAULT_POLL_INTERVAL, DEFAULT_TASK_TTL, TowerTaskStore, TowerTaskStoreBuilder};

/// The prefix of the stream ids and session keys the event and session
/// adapters write, so that tower-mcp's sessions keep apart from anything
/// else in the store; change it with `with_namespace`.
pub const DEFAULT_NAMESPACE: &str = "tower-mcp/";
