//! A resumable MCP server: rmcp's Streamable HTTP transport over axum, with
//! every SSE event kept in an mcp-event-store store.
//!
//! This package is the server of the workspace's README. Its command runs
//! it; this library is the server itself (options, handler, router,
//! `serve`), which the end-to-end tests in `tests/rmcp_e2e` drive over
//! loopback, and which `examples/actix-server` serves on actix-web. It
//! depends on what the server uses and nothing else, so running it builds
//! only that:
//!
//! ```text
//! cargo run -p resumable-server
//! cargo run -p resumable-server -- --stateless
//! cargo run -p resumable-server --features full -- --store postgres://postgres@127.0.0.1/postgres
//! cargo run -p resumable-server -- --poll-every 3 --retry-ms 500
//! cargo run -p resumable-server -- --max-age 900 --max-events 1000
//! ```
//!
//! The default build has the SQLite backend (and `memory://`); the feature
//! `full` adds every other, `--features mcp-event-store/<name>` one alone
//! (the facade's feature: `postgres`, `redis`, `sled`).
//!
//! Options:
//!
//! * `--store URL`: any store URL `connect` takes (default
//!   `sqlite://mcp-resumable-server.db`, a file in the working directory);
//! * `--bind ADDR`: where to listen (default `127.0.0.1:8000`); the endpoint
//!   is `/mcp`;
//! * `--stateless`: no MCP sessions (rmcp's `NeverSessionManager`); streams
//!   are still stored and resumable with `GET` + `Last-Event-ID`;
//! * `--poll-every N`: SEP-1699 polling: end every SSE response after `N`
//!   JSON-RPC messages, with a `retry:` hint; the client comes back with
//!   `Last-Event-ID` and gets the rest from the store;
//! * `--retry-ms MS`: the `retry` hint of the priming events (default 3000);
//! * `--max-age SECS`: keep events this many seconds (default 3600); a
//!   stream stays bound to its session (and resumable) as long;
//! * `--max-events N`: keep at most `N` events per stream (default 10000);
//! * `--session-check-ms MS`: how often, at most, each session held in
//!   memory is looked up in the store, so that one deleted or expired on
//!   another instance answers 404 here too (default 1000; 0 = on every
//!   request);
//! * `--follow-hold SECS`: a resume follows its stream live until the call
//!   is answered, or for at most this long (default 300); `0` turns
//!   following off, so a resume ends with what is stored (a poll);
//! * `--allow-host HOST`: accept this `Host` header (repeatable; default:
//!   loopback names only, rmcp's DNS-rebinding protection);
//! * `--metrics ADDR`: serve the store's and the runtime's metrics (and any
//!   other `metrics` the process records) in the Prometheus text format at
//!   `http://ADDR/metrics` (off by default); with it, the runtime counts
//!   the store's tasks by status every minute (`mcp_event_store_tasks`, a
//!   read of every task);
//! * `--task-lease-ms MS`: how long one renewal of this instance's lease
//!   keeps it alive (default 30000); it renews every third of that. Once a killed
//!   instance's lease lapses, its unfinished tasks read `failed` ("server
//!   instance lost") on every instance, and a resume on another instance of
//!   a call it was running ends after what it stored (the client then
//!   calls again).
//! * `--worker`: run as a worker: no HTTP endpoint (`--bind` is ignored),
//!   only the durable-task runtime, which claims `slow_count` tasks from
//!   the store and runs them (see below);
//! * `--hand-off`: create `slow_count` tasks queued for workers instead of
//!   running them on this instance, which then only answers `tasks/*`;
//! * `--no-takeover`: `slow_count` tasks die with their instance, as
//!   `confirm_count`'s do (the behaviour before takeover);
//! * `--claim-every-ms MS`: how often an instance or worker looks for
//!   tasks to claim (default 1000);
//! * `--max-attempts N`: the most runs a `slow_count` task gets when the
//!   instances running it die (default 3);
//! * `--trace EXPORT`: export spans as OpenTelemetry traces, `stdout` or
//!   `otlp` (see [Traces](#traces)); off by default.
//!
//! It has one tool, `slow_count`, which counts to `count` (default 10),
//! waiting `interval_ms` (default 500) between steps and sending a progress
//! notification for each (if the request carries a `progressToken`), then
//! answers `counted to N`. Drop the connection half way and resume with
//! `Last-Event-ID`: the store gives back everything that was sent since,
//! and the same response goes on with the remaining progress and the
//! result as the call produces them, on this instance or any other sharing
//! the store.
//!
//! A third tool, `ask_client`, is for 2025-era sessions: it asks the
//! client for a sampling message, then for a form elicitation, and answers
//! with both. Run two instances on one PostgreSQL or Redis store (or one
//! SQLite file) behind a load balancer without session affinity: the
//! client's answers reach either instance and are routed to the one whose
//! request waits for them.
//!
//! # Durable tasks (MCP 2026-07-28)
//!
//! The server also speaks the tasks extension (SEP-2663,
//! `io.modelcontextprotocol/tasks`) through
//! [`DurableTasks`], on the same store:
//!
//! * `slow_count`, called with the tasks extension in the request's
//!   `io.modelcontextprotocol/clientCapabilities`, answers at once with a
//!   task (`resultType: "task"`) and counts as a durable task: its status
//!   message says which step it is at, a `tasks/cancel` stops it between
//!   steps (it ends `cancelled`), and `tasks/get` gives the result once it
//!   is done. Called without the extension it behaves as above. (SEP-2663
//!   lets the server choose per request; the tool's `execution` field of
//!   2025-11-25 is gone.)
//! * `confirm_count` runs only as a task (without the extension it answers
//!   -32021, and nothing is stored): it asks the client to confirm the
//!   count with an elicitation (`inputRequests` key `confirm`, answered
//!   with `tasks/update`, `{"action": "accept", "content": {"count": N}}`,
//!   where `count` may change the number), then counts there as
//!   `slow_count` does. A declined or cancelled elicitation completes the
//!   task with an error result and counts nothing.
//!
//! A task lives as long as events are kept (`--max-age`). Any instance
//! sharing the store answers `tasks/get`, `tasks/update` and `tasks/cancel`
//! for a task, wherever it runs.
//!
//! `slow_count` is a takeover tool: its task outlives the instance that
//! runs it. Each step is saved as a checkpoint; when the instance dies
//! (once its lease lapses), any other instance or worker on the store
//! claims the task and counts on from the last checkpoint, and the result
//! says so (`counted to 20 (resumed from step 7, attempt 2)`). The task
//! reads `working` throughout, never `failed`, for up to `--max-attempts`
//! runs. With `--hand-off` the server runs none itself: workers
//! (`--worker`, processes with no HTTP endpoint) do:
//!
//! ```text
//! cargo run -p resumable-server --features full -- --store postgres://... --hand-off
//! cargo run -p resumable-server --features full -- --store postgres://... --worker
//! ```
//!
//! `confirm_count` (and `slow_count` with `--no-takeover`) runs on the
//! instance that created it, and dies with it (the task then reads
//! `failed` once the lease lapses).
//!
//! **Owner.** A request's `Authorization` header, whatever it holds, is the
//! task's owner: only requests with the same header see, answer or cancel
//! the task (others get -32602, as for an unknown id). Without the header,
//! tasks are anonymous and the task id is the only credential. This is the
//! example's stand-in for authentication: a real server takes the owner
//! from the principal its authentication established, never from an
//! unchecked header.
//!
//! In session mode the server keeps sessions in memory as rmcp's
//! `LocalSessionManager` does, stores each session's `initialize` parameters
//! in the store (so another instance on the same PostgreSQL or Redis
//! restores it), and binds every stream to its session: a `Last-Event-ID`
//! of another session's stream is refused. A session deleted (`DELETE`) or
//! expired on one instance answers 404 on every instance within
//! `--session-check-ms`.
//!
//! Logs go to stderr through `tracing` (`RUST_LOG=debug` for the store's
//! spans). Ctrl-C (or SIGTERM) stops accepting connections, ends the open
//! SSE streams and exits.
//!
//! # Health
//!
//! Two probes answer on the MCP endpoint's listener (`--bind`), with no
//! MCP session, no `Authorization` and whatever `Host` (`--allow-host`
//! guards `/mcp` only), and plain text:
//!
//! * `GET /healthz`: the process is alive and serving HTTP: always `200
//!   ok`, without touching the store. Restart the process when it fails.
//! * `GET /readyz`: this instance is ready for traffic: `200 ready` only
//!   when the durable-task runtime's lease is current (the store accepted
//!   a renewal within the last `--task-lease-ms`) and the store answers,
//!   within [`READY_TIMEOUT`] (2 s), that it counts this instance alive (a
//!   read by key). Otherwise `503`, `not ready` and a line per failed
//!   check (`lease: ...`, `store: ...`; the store's error is logged). It
//!   turns `200` again once the store answers and a renewal (under a fresh
//!   instance, if the old one lapsed) succeeds.
//!
//! A worker (`--worker`) has no HTTP listener, so no probes. In Kubernetes
//! (`docs/operations.md` has more):
//!
//! ```yaml
//! livenessProbe:
//!   httpGet: { path: /healthz, port: 8000 }
//!   periodSeconds: 10
//!   failureThreshold: 3
//! readinessProbe:
//!   httpGet: { path: /readyz, port: 8000 }
//!   periodSeconds: 5
//!   timeoutSeconds: 3
//!   failureThreshold: 2
//! ```
//!
//! (with `--bind 0.0.0.0:8000`, so that the kubelet reaches the pod's
//! address). `--metrics ADDR` stays a listener of its own.
//!
//! # Traces
//!
//! `--trace stdout` exports the server's (or worker's) spans as
//! OpenTelemetry traces to stdout (the logs stay on stderr); `--trace
//! otlp` sends them over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (default `http://localhost:4318`), with the package's `otlp` feature:
//!
//! ```text
//! cargo run -p resumable-server -- --hand-off --trace stdout
//! cargo run -p resumable-server -- --worker --trace stdout
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 \
//!   cargo run -p resumable-server --features otlp -- --trace otlp
//! ```
//!
//! Each task is then created in a `tools/call` span (`tool`), whose W3C
//! trace context the task keeps. Its runs are `task.run` spans (the task's
//! digest, the attempt, the tool) in that trace, wherever they run: the
//! first one here, a child of `tools/call`; one taken over by another
//! server, or run by a worker, a child of `tools/call` too, in its own
//! process. Without `--trace` nothing is exported and no `tools/call` span
//! is made. `docs/operations.md` has more.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use mcp_event_store::rmcp::tasks::{TaskExit, TaskFuture};
use mcp_event_store::rmcp::{
    Callers, Durable, DurableTaskContext, DurableTasks, DurableTasksBuilder, Runtime,
    RuntimeBuilder, TakeoverCall,
};
use mcp_event_store::runtime::Audience;
use mcp_event_store::runtime::otel::Export;
use mcp_event_store::task::Owner;
use mcp_event_store::{DynStore, Retention, StoreOptions};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientResult,
    ContentBlock, GetTaskParams, GetTaskResult, Implementation, InputRequest, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, ServerNotification, ServerRequest, SubscriptionFilter, Tool, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::task_manager::TaskOptions;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The largest `count` the tool accepts.
const MAX_COUNT: u64 = 100_000;
/// The longest `interval_ms` the tool accepts.
const MAX_INTERVAL_MS: u64 = 60_000;

/// How the server is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// The store URL.
    pub store: String,
    /// The listening address.
    pub bind: SocketAddr,
    /// No MCP sessions.
    pub stateless: bool,
    /// End SSE responses after this many JSON-RPC messages (SEP-1699).
    pub poll_every: Option<usize>,
    /// The `retry` hint of priming events.
    pub retry: Duration,
    /// How long and how much the store keeps; also how long a stream stays
    /// bound to its session.
    pub retention: Retention,
    /// How often, at most, a session held in memory is looked up in the
    /// store.
    pub session_check: Duration,
    /// How long a resume follows its stream; `None` replays what is stored.
    pub follow_hold: Option<Duration>,
    /// Extra accepted `Host` headers.
    pub allowed_hosts: Vec<String>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// How long one renewal keeps this instance alive (its durable tasks,
    /// and its streams for resumes elsewhere); renewed every third of it.
    pub task_lease: Duration,
    /// Run as a worker: no HTTP endpoint, only the claim loop running
    /// `slow_count` tasks from the store.
    pub worker: bool,
    /// Queue `slow_count` tasks for workers instead of running them here.
    pub hand_off: bool,
    /// `slow_count` tasks die with their instance (no takeover).
    pub no_takeover: bool,
    /// How often the runtime looks for tasks to take over.
    pub claim_every: Duration,
    /// The most runs a task taken over gets.
    pub max_attempts: u32,
    /// Where to export spans (`--trace`), if anywhere: each task is then
    /// created in a `tools/call` span, and its runs continue that trace.
    pub trace: Option<Export>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            store: "sqlite://mcp-resumable-server.db".into(),
            bind: SocketAddr::from(([127, 0, 0, 1], 8000)),
            stateless: false,
            poll_every: None,
            retry: Duration::from_secs(3),
            retention: Retention::default(),
            session_check: mcp_event_store::rmcp::DEFAULT_SESSION_CHECK_INTERVAL,
            follow_hold: Some(mcp_event_store::rmcp::DEFAULT_FOLLOW_HOLD),
            allowed_hosts: Vec::new(),
            metrics: None,
            task_lease: mcp_event_store::runtime::DEFAULT_LEASE,
            worker: false,
            hand_off: false,
            no_takeover: false,
            claim_every: mcp_event_store::runtime::DEFAULT_CLAIM_EVERY,
            max_attempts: mcp_event_store::task::DEFAULT_MAX_ATTEMPTS,
            trace: None,
        }
    }
}

/// The command line, as clap reads it; [`Options`] is what it means.
#[derive(clap::Parser, Debug)]
#[command(
    name = "resumable-server",
    version,
    about = "A resumable MCP server: rmcp's Streamable HTTP transport over axum, every SSE \
             event and durable task kept in an mcp-event-store store",
    long_about = "A resumable MCP server: rmcp's Streamable HTTP transport over axum at \
/mcp, every SSE event and durable task kept in an mcp-event-store store, so a client \
that lost its connection resumes with Last-Event-ID on any instance sharing the store.\n\n\
Tools: slow_count counts to `count`, waiting `interval_ms` between steps and sending a \
progress notification for each, or runs as a durable task when the client declares the \
tasks extension (a resumable one: taken over from its last step when its server dies); \
confirm_count runs only as a task and asks the client to confirm the count first.\n\n\
Stops on Ctrl-C or SIGTERM, finishing the requests under way. Logs go to stderr \
(RUST_LOG sets the filter, default info). Exits 2 on bad arguments, 1 if the store \
cannot be opened or the address bound.",
    after_help = "Examples:\n  \
resumable-server\n  \
resumable-server --store postgres://postgres@127.0.0.1/postgres --bind 127.0.0.1:8001\n  \
resumable-server --store sqlite://tasks.db --hand-off   # a front end for workers\n  \
resumable-server --store sqlite://tasks.db --worker     # a worker: no HTTP"
)]
struct Args {
    /// Any URL `connect` takes (PostgreSQL, Redis and sled need their feature)
    #[arg(
        long,
        value_name = "URL",
        default_value = "sqlite://mcp-resumable-server.db"
    )]
    store: String,
    /// Where to listen
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    bind: SocketAddr,
    /// No MCP sessions; streams are still stored and resumable
    #[arg(long)]
    stateless: bool,
    /// SEP-1699 polling: end every SSE response after N messages, with a
    /// `retry:` hint (0: off)
    #[arg(long, value_name = "N", default_value_t = 0)]
    poll_every: usize,
    /// The `retry` hint of priming events
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    retry_ms: u64,
    /// Keep events this long; a stream stays bound to its session (and
    /// resumable) as long [default: 3600]
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    max_age: Option<u64>,
    /// Keep at most N events per stream [default: 10000]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_events: Option<u64>,
    /// How often, at most, a session held in memory is looked up in the
    /// store, so one deleted or expired elsewhere answers 404 here too (0:
    /// every request) [default: 1000]
    #[arg(long, value_name = "MS")]
    session_check_ms: Option<u64>,
    /// A resume follows its stream live until the call is answered, or this
    /// long at most (0: a resume ends with what is stored) [default: 300]
    #[arg(long, value_name = "SECS")]
    follow_hold: Option<u64>,
    /// Accept this `Host` header too (repeatable; loopback only by default)
    #[arg(long = "allow-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Serve the store's metrics in the Prometheus text format at
    /// http://ADDR/metrics
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// How long one renewal of this instance's lease keeps it alive (renewed
    /// every third of it): a server that dies has its slow_count tasks
    /// taken over this long after [default: 30000]
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(3..))]
    task_lease_ms: Option<u64>,
    /// No HTTP: run slow_count tasks from the store (queued by --hand-off
    /// servers, or left by servers that died) until stopped
    #[arg(long, conflicts_with_all = ["hand_off", "no_takeover"])]
    worker: bool,
    /// Queue slow_count tasks for workers instead of running them here
    #[arg(long, conflicts_with = "no_takeover")]
    hand_off: bool,
    /// slow_count tasks die with this server, as before takeover
    #[arg(long)]
    no_takeover: bool,
    /// How often this server or worker looks for tasks to take over
    /// [default: 1000]
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    claim_every_ms: Option<u64>,
    /// The most runs a slow_count task gets across servers that die
    /// [default: 3]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Export spans as OpenTelemetry traces: to stdout, or over OTLP/HTTP
    /// to OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318; needs
    /// the `otlp` feature). A durable task's runs, on any server or worker,
    /// continue the trace of the request that created it
    #[arg(long, value_name = "EXPORT", value_parser = ["stdout", "otlp"])]
    trace: Option<String>,
}

impl From<Args> for Options {
    fn from(args: Args) -> Self {
        let defaults = Options::default();
        let mut retention = defaults.retention;
        if let Some(secs) = args.max_age {
            retention = retention.max_age(Duration::from_secs(secs));
        }
        if let Some(events) = args.max_events {
            retention = retention.max_events_per_stream(events);
        }
        Options {
            store: args.store,
            bind: args.bind,
            stateless: args.stateless,
            poll_every: (args.poll_every > 0).then_some(args.poll_every),
            retry: Duration::from_millis(args.retry_ms),
            retention,
            session_check: args
                .session_check_ms
                .map_or(defaults.session_check, Duration::from_millis),
            follow_hold: match args.follow_hold {
                None => defaults.follow_hold,
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
            },
            allowed_hosts: args.allowed_hosts,
            metrics: args.metrics,
            task_lease: args
                .task_lease_ms
                .map_or(defaults.task_lease, Duration::from_millis),
            worker: args.worker,
            hand_off: args.hand_off,
            no_takeover: args.no_takeover,
            claim_every: args
                .claim_every_ms
                .map_or(defaults.claim_every, Duration::from_millis),
            max_attempts: args.max_attempts.unwrap_or(defaults.max_attempts),
            // One of the names clap allows, each an export.
            trace: args.trace.and_then(|name| name.parse().ok()),
        }
    }
}

impl Options {
    /// Parses command-line arguments (without the program name); a clap
    /// error to [`exit`](clap::Error::exit) with (`--help` and `--version`
    /// among them).
    pub fn try_parse(args: impl IntoIterator<Item = String>) -> Result<Self, clap::Error> {
        Self::try_parse_with(args, |command| command)
    }

    /// [`try_parse`](Self::try_parse) for another command serving this
    /// server (the actix-web example): `configure` adjusts the command line
    /// before it parses `args` (its name, help texts, defaults; an option
    /// it hides still parses).
    pub fn try_parse_with(
        args: impl IntoIterator<Item = String>,
        configure: impl FnOnce(clap::Command) -> clap::Command,
    ) -> Result<Self, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let mut command = configure(Args::command());
        let argv = std::iter::once(command.get_name().to_owned()).chain(args);
        let matches = command.try_get_matches_from_mut(argv)?;
        Args::from_arg_matches(&matches)
            .map(Self::from)
            .map_err(|e| e.format(&mut command))
    }

    /// [`try_parse`](Self::try_parse), with the error (or the help) as the
    /// text clap would print.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        Self::try_parse(args).map_err(|e| e.render().to_string())
    }

    /// The options the store is opened with: the retention.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions::default().retention(self.retention)
    }
}

/// The MCP server: a slow tool that reports progress, or runs as a durable
/// task, and a task-only tool that asks the client to confirm first.
///
/// Build one per request from one [`DurableTasks`] per server (the
/// [`Durable`]'s, see [`durable`]); clones share the task runtime.
#[derive(Clone, Debug)]
pub struct SlowCounter {
    tasks: DurableTasks,
    task_ttl: Option<Duration>,
    /// Raises the notifications of `announce` and `tools_changed` on every
    /// instance, and serves `subscriptions/listen` across instances.
    durable: Option<Durable>,
    /// Each task is created in a `tools/call` span (`--trace`).
    traced: bool,
}

impl SlowCounter {
    /// The handler, running its tasks on `tasks`; a task lives as long as
    /// the store keeps events (`options.retention.max_age`). With
    /// `options.trace`, each task is created in a `tools/call` span, whose
    /// trace its runs continue.
    pub fn new(tasks: DurableTasks, options: &Options) -> Self {
        Self {
            tasks,
            task_ttl: options.retention.max_age,
            durable: None,
            traced: options.trace.is_some(),
        }
    }

    /// The span a task of `tool` is created in: `tools/call`, when traced.
    fn creating(&self, tool: &str) -> tracing::Span {
        if self.traced {
            tracing::info_span!("tools/call", tool)
        } else {
            tracing::Span::none()
        }
    }

    /// `announce` and `tools_changed` raise their notifications through
    /// `durable` for the listeners of every instance sharing the store, and
    /// `subscriptions/listen` hears them there (`Durable::listen`).
    pub fn announcing_through(mut self, durable: &Durable) -> Self {
        self.durable = Some(durable.clone());
        self
    }

    /// `announce`: `text` as a log message to every listener everywhere.
    async fn announce(&self, args: Option<&JsonObject>) -> Result<CallToolResult, ErrorData> {
        let Some(text) = args.and_then(|a| a.get("text")).and_then(|t| t.as_str()) else {
            return Err(ErrorData::invalid_params("text must be a string", None));
        };
        let notification: ServerNotification = serde_json::from_value(serde_json::json!({
            "method": "notifications/message",
            "params": {"level": "info", "data": text}
        }))
        .map_err(|e| ErrorData::internal_error(format!("the notification: {e}"), None))?;
        self.raise(notification).await?;
        Ok(text_result(format!("announced {text:?}")))
    }

    /// `tools_changed`: `notifications/tools/list_changed` to every
    /// listener everywhere.
    async fn tools_changed(&self) -> Result<CallToolResult, ErrorData> {
        self.raise(ServerNotification::ToolListChangedNotification(
            Default::default(),
        ))
        .await?;
        Ok(text_result(
            "raised notifications/tools/list_changed".to_owned(),
        ))
    }

    /// Raises `notification` for every listener of every instance.
    async fn raise(&self, notification: ServerNotification) -> Result<(), ErrorData> {
        let Some(durable) = &self.durable else {
            return Err(ErrorData::internal_error(
                "notifications are not wired (SlowCounter::announcing_through)",
                None,
            ));
        };
        durable
            .notify(&Audience::All, notification)
            .await
            .map_err(|e| ErrorData::internal_error(format!("raising a notification: {e}"), None))
    }

    /// rmcp's task options for a count whose steps are `interval` apart:
    /// the ttl, a poll interval near the step's, and the first message.
    fn task_options(&self, interval: Duration, message: String) -> TaskOptions {
        let ttl_ms = self
            .task_ttl
            .map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        let poll_ms = u64::try_from(interval.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(100, 5_000);
        TaskOptions::new()
            .with_ttl_ms(ttl_ms)
            .with_poll_interval_ms(poll_ms)
            .with_status_message(message)
    }
}

/// Who a request comes from, as the example's stand-in for authentication
/// ([`authenticate`]) puts it in the request's extensions: its
/// `Authorization` header. A real server's authentication middleware
/// inserts its own type (verified claims), and [`callers`] reads that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub String);

/// The example's stand-in for authentication: a request's `Authorization`
/// header, whatever it holds, becomes its [`Caller`] (an empty one is no
/// credential: the request is anonymous). Do not trust a header like this
/// in production; verify it first.
pub fn authenticate(mut request: axum::extract::Request) -> axum::extract::Request {
    let caller = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| Caller::from_authorization(value.as_bytes()));
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    request
}

impl Caller {
    /// The caller an `Authorization` header value stands for, as
    /// [`authenticate`] reads it (for a framework whose requests are not
    /// axum's); `None` for an empty value (no credential).
    pub fn from_authorization(value: &[u8]) -> Option<Self> {
        if value.is_empty() {
            return None;
        }
        Some(Self(match std::str::from_utf8(value) {
            Ok(text) => format!("u:{text}"),
            Err(_) => format!("b:{}", hex(value)),
        }))
    }

    /// The [`Caller`] in a request's extensions: where [`authenticate`]
    /// inserts it, or inside the `rmcp::model::Extensions` there, where
    /// rmcp-actix-web nests what its `on_request` hook inserts.
    pub fn of(extensions: &axum::http::Extensions) -> Option<&Self> {
        extensions
            .get::<Self>()
            .or_else(|| extensions.get::<rmcp::model::Extensions>()?.get::<Self>())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Who is calling, for [`Durable`]: the [`Caller`] of each request. Each
/// session, its streams and the tasks it creates are bound to it.
pub fn callers() -> Callers {
    Callers::from_fn(|extensions| Caller::of(extensions).map(|caller| caller.0.clone()))
}

/// The owner of the tasks a request creates or may see, as [`callers`]
/// binds them (for wiring [`DurableTasks`] by hand).
pub fn owner_of(context: &RequestContext<RoleServer>) -> Owner {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .map_or(Owner::Anonymous, |parts| callers().owner(&parts.extensions))
}

/// Everything the server needs from `store`, wired once ([`Durable`]):
/// resumes follow their stream for `options.follow_hold` (or until the
/// instance writing it is known gone), sessions are shared through the
/// store and checked every `options.session_check`, priming events carry
/// `options.retry`, the runtime renews the instance's one lease every third
/// of `options.task_lease` and takes `slow_count` tasks over
/// ([`runtime_options`], [`takeover_tools`]), sessions, their streams and
/// their tasks are bound to the request's [`callers`], and expired events, sessions and tasks are
/// purged every minute.
pub async fn durable(store: DynStore, options: &Options) -> mcp_event_store::Result<Durable> {
    let options = options.clone();
    Durable::builder(store)
        .runtime(|runtime| runtime_options(runtime, &options))
        .follow_hold(options.follow_hold)
        .session_check_interval(options.session_check)
        .sse_retry(options.retry)
        .callers(callers())
        .tasks(move |tasks| takeover_tools(tasks, &options))
        .start()
        .await
}

/// How often a server with `--metrics` counts the store's tasks by status.
pub const TASK_COUNT_EVERY: Duration = Duration::from_secs(60);

/// The runtime of a server or worker: `options`' lease, claim interval,
/// attempts and hand-off, this package's version on the instance card, and
/// with `--metrics` a count of the tasks by status every
/// [`TASK_COUNT_EVERY`].
pub fn runtime_options(runtime: RuntimeBuilder, options: &Options) -> RuntimeBuilder {
    let runtime = runtime
        .version(concat!(
            env!("CARGO_PKG_NAME"),
            " ",
            env!("CARGO_PKG_VERSION")
        ))
        .lease(options.task_lease)
        .claim_every(options.claim_every)
        .max_attempts(options.max_attempts)
        // With `--metrics`, the tasks by status too (a read of every task
        // a minute).
        .count_tasks_every(options.metrics.map(|_| TASK_COUNT_EVERY));
    if options.hand_off {
        runtime.hand_off_to_workers()
    } else {
        runtime
    }
}

/// The tools whose tasks a server or worker takes over: `slow_count`,
/// unless `options.no_takeover`.
pub fn takeover_tools(tasks: DurableTasksBuilder, options: &Options) -> DurableTasksBuilder {
    if options.no_takeover {
        return tasks;
    }
    tasks.takeover("slow_count", takeover_count)
}

/// `slow_count` as a task that may be taken over: its arguments from the
/// stored call, the count from the last checkpoint on.
fn takeover_count(task: DurableTaskContext, call: TakeoverCall) -> TaskFuture {
    Box::pin(async move {
        let args = call.arguments.as_ref();
        let count = argument(args, "count", 10, MAX_COUNT)?;
        let interval = Duration::from_millis(argument(args, "interval_ms", 500, MAX_INTERVAL_MS)?);
        count_in_task(&task, count, interval).await
    })
}

/// Runs `slow_count` tasks from the store, as a worker process: no HTTP
/// endpoint, only the runtime with the takeover tools, claiming tasks
/// queued for workers (`--hand-off` servers), given back for input and
/// answered, or left by instances that died. Until `shutdown`, then the
/// runtime shuts down (its lease ends at once).
pub async fn work(
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store = mcp_event_store::connect_with(&options.store, options.store_options()).await?;
    let runtime = runtime_options(Runtime::builder(store), &options)
        .start()
        .await?;
    let tasks = takeover_tools(DurableTasks::builder().owner(owner_of), &options).build(&runtime);
    tracing::info!(
        instance = %tasks.instance(),
        store = %redact(&options.store),
        claim_every = ?options.claim_every,
        "working: running slow_count tasks from the store"
    );
    runtime.claim_now().await;
    shutdown.await;
    drop(tasks);
    runtime.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

fn object_schema(schema: serde_json::Value) -> Arc<JsonObject> {
    let serde_json::Value::Object(schema) = schema else {
        unreachable!("an object literal")
    };
    Arc::new(schema)
}

fn count_schema() -> Arc<JsonObject> {
    object_schema(serde_json::json!({
        "type": "object",
        "properties": {
            "count": {
                "type": "integer", "minimum": 0, "maximum": MAX_COUNT,
                "description": "how many steps (default 10)"
            },
            "interval_ms": {
                "type": "integer", "minimum": 0, "maximum": MAX_INTERVAL_MS,
                "description": "milliseconds between steps (default 500)"
            }
        }
    }))
}

fn slow_count_tool() -> Tool {
    Tool::new(
        "slow_count",
        "Counts slowly, sending a progress notification at every step. With the tasks \
         extension declared, runs as a durable task instead (its status message says the step).",
        count_schema(),
    )
}

fn confirm_count_tool() -> Tool {
    Tool::new(
        "confirm_count",
        "Runs as a durable task only (needs the tasks extension): asks the client to confirm \
         the count (inputRequests key \"confirm\"), then counts to the confirmed number.",
        count_schema(),
    )
}

fn ask_client_tool() -> Tool {
    Tool::new(
        "ask_client",
        "In a session (2025-era protocol): asks the client for a sampling message, then for \
         a form elicitation, and answers with both. Behind a load balancer without affinity, \
         the client's answers may reach another instance: they are routed back here.",
        Arc::new(
            serde_json::from_value(serde_json::json!({"type": "object", "properties": {}}))
                .expect("a valid schema"),
        ),
    )
}

fn announce_tool() -> Tool {
    Tool::new(
        "announce",
        "Sends `text` as a log message notification to every listener (standalone GET) of \
         every session, on every instance sharing the store.",
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"]
            }))
            .expect("a valid schema"),
        ),
    )
}

fn tools_changed_tool() -> Tool {
    Tool::new(
        "tools_changed",
        "Sends notifications/tools/list_changed to every listener, on every instance sharing \
         the store: the standalone GET of every 2025-era session and every 2026-07-28 \
         subscriptions/listen request that asked for tool list changes.",
        Arc::new(
            serde_json::from_value(serde_json::json!({"type": "object", "properties": {}}))
                .expect("a valid schema"),
        ),
    )
}

fn tool(name: &str) -> Option<Tool> {
    match name {
        "slow_count" => Some(slow_count_tool()),
        "confirm_count" => Some(confirm_count_tool()),
        "ask_client" => Some(ask_client_tool()),
        "announce" => Some(announce_tool()),
        "tools_changed" => Some(tools_changed_tool()),
        _ => None,
    }
}

/// `ask_client`: a sampling request and an elicitation, sent to the client
/// on this session's stream and answered by the client with `POST`s that
/// any instance may receive.
async fn ask_client(context: &RequestContext<RoleServer>) -> Result<CallToolResult, ErrorData> {
    let sampled = ask(
        context,
        serde_json::json!({
            "method": "sampling/createMessage",
            "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": "Name a colour."}}],
                "maxTokens": 16
            }
        }),
    )
    .await?;
    let colour = sampled["content"]["text"]
        .as_str()
        .unwrap_or("(no text)")
        .to_owned();
    let answer = ask(
        context,
        serde_json::json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": format!("Is {colour} right?"),
                "requestedSchema": {"type": "object", "properties": {"sure": {"type": "boolean"}}}
            }
        }),
    )
    .await?;
    Ok(text_result(format!(
        "sampled {colour}; elicitation {} {}",
        answer["action"], answer["content"]
    )))
}

/// Sends the client `request` (a JSON-RPC request's method and params) and
/// waits for its answer, as JSON.
async fn ask(
    context: &RequestContext<RoleServer>,
    request: serde_json::Value,
) -> Result<serde_json::Value, ErrorData> {
    let method = request["method"].clone();
    let failed = |error: &dyn std::fmt::Display| {
        ErrorData::internal_error(format!("asking the client ({method}): {error}"), None)
    };
    let request: ServerRequest = serde_json::from_value(request).map_err(|e| failed(&e))?;
    let answer: ClientResult = context
        .peer
        .send_request(request)
        .await
        .map_err(|e| failed(&e))?;
    serde_json::to_value(answer).map_err(|e| failed(&e))
}

fn argument(
    args: Option<&JsonObject>,
    name: &str,
    default: u64,
    max: u64,
) -> Result<u64, ErrorData> {
    match args.and_then(|args| args.get(name)) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(value) => value.as_u64().filter(|n| *n <= max).ok_or_else(|| {
            ErrorData::invalid_params(format!("{name} must be an integer from 0 to {max}"), None)
        }),
    }
}

fn text_result(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// Counts as a durable task: the status message names each step, and a
/// cancel request stops the count between steps.
///
/// In a task that may be taken over each step is saved as the checkpoint before the
/// status message names it, and a run starts from the last checkpoint: a
/// run that took over says so in its result (`counted to N (resumed from
/// step K, attempt A)`).
async fn count_in_task(
    task: &DurableTaskContext,
    count: u64,
    interval: Duration,
) -> Result<CallToolResult, TaskExit> {
    let from = task
        .last_checkpoint()
        .and_then(|saved| std::str::from_utf8(saved).ok()?.parse::<u64>().ok())
        .unwrap_or(0)
        .min(count);
    if task.attempt() > 1 || from > 0 {
        tracing::info!(task = ?task.task_digest(), from, attempt = task.attempt(), "counting task resumed");
    }
    let cancelled = task.cancelled();
    tokio::pin!(cancelled);
    for step in from + 1..=count {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut cancelled => {
                tracing::info!(task = ?task.task_digest(), step, "counting task cancelled");
                return Err(TaskExit::Cancelled);
            }
        }
        if task.is_takeover() {
            task.checkpoint(step.to_string()).await?;
        }
        task.set_status_message(format!("step {step} of {count}"))
            .await?;
    }
    tracing::info!(task = ?task.task_digest(), count, "counting task finished");
    if task.attempt() > 1 || from > 0 {
        return Ok(text_result(format!(
            "counted to {count} (resumed from step {from}, attempt {})",
            task.attempt()
        )));
    }
    Ok(text_result(format!("counted to {count}")))
}

/// The elicitation `confirm_count` sends: confirm (or change) the count.
fn confirm_request(count: u64) -> Result<InputRequest, ErrorData> {
    serde_json::from_value(serde_json::json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": format!("Count to {count}?"),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "count": {
                        "type": "integer", "minimum": 0, "maximum": MAX_COUNT,
                        "default": count,
                        "description": "how far to count"
                    }
                }
            }
        }
    }))
    .map_err(|e| ErrorData::internal_error(format!("the elicitation request: {e}"), None))
}

/// Asks the client to confirm the count, then counts to the answer.
async fn confirm_then_count(
    task: DurableTaskContext,
    count: u64,
    interval: Duration,
) -> Result<CallToolResult, TaskExit> {
    let answer = task
        .request_input("confirm", confirm_request(count)?)
        .await?;
    if answer["action"] != "accept" {
        tracing::info!(task = ?task.task_digest(), action = %answer["action"], "count not confirmed");
        return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
            "not confirmed ({}): nothing counted",
            answer["action"]
        ))]));
    }
    let confirmed = match answer["content"].get("count") {
        None | Some(serde_json::Value::Null) => count,
        Some(value) => match value.as_u64().filter(|n| *n <= MAX_COUNT) {
            Some(n) => n,
            None => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "the confirmed count must be an integer from 0 to {MAX_COUNT}, got {value}"
                ))]));
            }
        },
    };
    task.set_status_message(format!("confirmed: counting to {confirmed}"))
        .await?;
    count_in_task(&task, confirmed, interval).await
}

impl ServerHandler for SlowCounter {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "mcp-event-store-resumable-server",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Call slow_count with a progressToken, drop the connection, \
             and resume with Last-Event-ID. On 2026-07-28, declare the tasks extension: \
             slow_count and confirm_count then run as durable tasks.",
        )
    }

    /// `subscriptions/listen` (2026-07-28): tool list changes, raised on
    /// any instance (`tools_changed`).
    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.durable
            .as_ref()
            .map(|_| SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        match &self.durable {
            Some(durable) => durable.listen(subscription).await,
            None => {
                subscription.cancelled().await;
                Ok(())
            }
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            slow_count_tool(),
            confirm_count_tool(),
            ask_client_tool(),
            announce_tool(),
            tools_changed_tool(),
        ]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tool(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if tool(&request.name).is_none() {
            return Err(ErrorData::invalid_params(
                format!("no tool named {:?}", request.name),
                None,
            ));
        }
        if request.name == "ask_client" {
            return Ok(ask_client(&context).await?.into());
        }
        if request.name == "announce" {
            return Ok(self.announce(request.arguments.as_ref()).await?.into());
        }
        if request.name == "tools_changed" {
            return Ok(self.tools_changed().await?.into());
        }
        let args = request.arguments.as_ref();
        let count = argument(args, "count", 10, MAX_COUNT)?;
        let interval = Duration::from_millis(argument(args, "interval_ms", 500, MAX_INTERVAL_MS)?);
        let declares_tasks = context
            .client_capabilities()
            .is_some_and(|capabilities| capabilities.supports_tasks());
        if request.name == "confirm_count" {
            // Task-only: without the extension, `spawn` answers -32021
            // before anything is stored.
            let options = self.task_options(interval, format!("asking to count to {count}"));
            let created = self
                .tasks
                .spawn(&context, options, move |task| {
                    Box::pin(confirm_then_count(task, count, interval))
                })
                .instrument(self.creating(&request.name))
                .await?;
            tracing::info!(task = %created.task.task_id, count, "confirm_count task created");
            return Ok(CallToolResponse::Task(created));
        }
        if declares_tasks && (self.tasks.is_takeover("slow_count") || self.tasks.hands_off()) {
            let options = self.task_options(interval, format!("counting to {count}"));
            let created = self
                .tasks
                .spawn_takeover(&context, options, TakeoverCall::from(&request))
                .instrument(self.creating(&request.name))
                .await?;
            tracing::info!(
                count,
                hand_off = self.tasks.hands_off(),
                "slow_count task created, to be taken over if this server dies"
            );
            return Ok(CallToolResponse::Task(created));
        }
        if declares_tasks {
            let options = self.task_options(interval, format!("counting to {count}"));
            let created = self
                .tasks
                .spawn(&context, options, move |task| {
                    Box::pin(async move { count_in_task(&task, count, interval).await })
                })
                .instrument(self.creating(&request.name))
                .await?;
            tracing::info!(task = %created.task.task_id, count, "slow_count task created");
            return Ok(CallToolResponse::Task(created));
        }
        let token = context.meta.get_progress_token();
        tracing::info!(count, ?interval, request_id = %context.id, "slow_count started");
        for step in 1..=count {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = context.ct.cancelled() => {
                    tracing::info!(step, "slow_count cancelled");
                    return Ok(CallToolResult::error(vec![ContentBlock::text("cancelled")]).into());
                }
            }
            if let Some(token) = &token {
                let progress = ProgressNotificationParam::new(token.clone(), step as f64)
                    .with_total(count as f64)
                    .with_message(format!("step {step} of {count}"));
                if let Err(error) = context.peer.notify_progress(progress).await {
                    tracing::warn!(%error, "could not send progress");
                }
            }
        }
        tracing::info!(count, "slow_count finished");
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("counted to {count}"))]).into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.tasks.get_task(&context, request).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.update_task(&context, request).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.tasks.cancel_task(&context, request).await
    }
}

/// The axum router serving MCP at `/mcp` with everything `durable` wired,
/// the handler's durable tasks on `tasks` (normally `durable.tasks()`),
/// and the probes `/healthz` and `/readyz` ([`health_router`], on
/// `durable`'s runtime).
///
/// `shutdown` ends every open SSE stream when cancelled.
pub fn router(
    durable: &Durable,
    tasks: DurableTasks,
    options: &Options,
    shutdown: &CancellationToken,
) -> axum::Router {
    let handler = SlowCounter::new(tasks, options).announcing_through(durable);
    let mut config = if options.stateless {
        durable.stateless_config()
    } else {
        durable.config()
    };
    config = config.with_cancellation_token(shutdown.child_token());
    if let Some(hosts) = allowed_hosts(options) {
        config = config.with_allowed_hosts(hosts);
    }
    let make = move || Ok(handler.clone());
    let router = if options.stateless {
        let service = StreamableHttpService::new(make, durable.stateless_session_manager(), config);
        axum::Router::new().nest_service("/mcp", durable.scoped(service))
    } else {
        let service = StreamableHttpService::new(make, durable.session_manager(), config);
        axum::Router::new().nest_service("/mcp", durable.scoped(service))
    }
    .layer(axum::middleware::map_request(|request| {
        std::future::ready(authenticate(request))
    }));
    let router = match options.poll_every {
        Some(messages) => {
            let retry = options.retry;
            router.layer(axum::middleware::map_response(move |response: Response| {
                std::future::ready(close_after(response, messages, retry))
            }))
        }
        None => router,
    };
    // After the MCP layers: the probes need no session, no caller and no
    // allowed `Host` (rmcp checks those inside `/mcp`).
    router.merge(health_router(durable.runtime().clone()))
}

/// The `Host` headers `/mcp` accepts: `None` (rmcp's default, loopback
/// names only) without `--allow-host`, or the loopback names and
/// `options.allowed_hosts`.
pub fn allowed_hosts(options: &Options) -> Option<Vec<String>> {
    if options.allowed_hosts.is_empty() {
        return None;
    }
    let mut hosts = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(options.allowed_hosts.iter().cloned());
    Some(hosts)
}

/// How long `/readyz` waits for the store before it answers 503: shorter
/// than a probe's `timeoutSeconds` (say 3), so that a hung database fails
/// the probe with a reason rather than hanging it.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz` and `GET /readyz` (see "Health" in the crate docs), for
/// `runtime`, this instance's: merged into [`router`], on the MCP
/// endpoint's listener.
pub fn health_router(runtime: Runtime) -> axum::Router {
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let runtime = runtime.clone();
                async move {
                    match runtime.readiness(READY_TIMEOUT).await {
                        Ok(()) => (axum::http::StatusCode::OK, "ready\n".to_owned()),
                        Err(failed) => (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready\n{}\n", failed.join("\n")),
                        ),
                    }
                }
            }),
        )
}

/// SEP-1699 polling at the HTTP layer: ends an SSE response after it carried
/// `messages` JSON-RPC messages, with a final `retry:` hint.
///
/// rmcp 3.9 can close a stream itself (`LocalSessionHandle::close_sse_stream`)
/// but a tool cannot find out which stream it is on, and stateless mode has
/// no handle at all. Ending the HTTP body is always safe here: every event is
/// in the store before rmcp writes it, so the client's `GET` with
/// `Last-Event-ID` gets whatever the cut left out.
pub fn close_after(response: Response, messages: usize, retry: Duration) -> Response {
    let is_sse = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse || messages == 0 {
        return response;
    }
    enum State {
        Open(axum::body::BodyDataStream, usize),
        Closing,
        Closed,
    }
    let retry_frame = Bytes::from(format!("retry: {}\n\n", retry.as_millis()));
    let (parts, body) = response.into_parts();
    let frames = futures_util::stream::unfold(
        State::Open(body.into_data_stream(), messages),
        move |state| {
            let retry_frame = retry_frame.clone();
            async move {
                match state {
                    State::Open(mut body, left) => {
                        let frame = body.next().await?;
                        let left = match &frame {
                            Ok(frame) if carries_message(frame) => left - 1,
                            _ => left,
                        };
                        let next = if left == 0 {
                            tracing::debug!("closing the SSE stream (SEP-1699 polling)");
                            State::Closing
                        } else {
                            State::Open(body, left)
                        };
                        Some((frame, next))
                    }
                    State::Closing => Some((Ok(retry_frame), State::Closed)),
                    State::Closed => None,
                }
            }
        },
    );
    Response::from_parts(parts, Body::from_stream(frames))
}

/// Whether an SSE frame (rmcp writes one event per frame) has non-empty
/// `data`: a JSON-RPC message, not a priming event or a keep-alive.
fn carries_message(frame: &[u8]) -> bool {
    frame.split(|b| *b == b'\n').any(|line| {
        line.strip_prefix(b"data:")
            .is_some_and(|data| !data.strip_prefix(b" ").unwrap_or(data).is_empty())
    })
}

/// Opens the store and serves until `shutdown` resolves, then ends every
/// open stream and returns.
pub async fn serve(
    options: Options,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let cancel = CancellationToken::new();
    // Before the store opens, so its first operations are counted.
    if let Some(addr) = options.metrics {
        let handle = install_metrics()?;
        let metrics = tokio::net::TcpListener::bind(addr).await?;
        tracing::info!(address = %metrics.local_addr()?, "serving metrics at /metrics");
        let stop = cancel.clone();
        tokio::spawn(async move {
            let served = axum::serve(metrics, metrics_router(handle))
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
            if let Err(error) = served {
                tracing::warn!(%error, "the metrics endpoint stopped");
            }
        });
    }
    let store = mcp_event_store::connect_with(&options.store, options.store_options()).await?;
    let durable = durable(store, &options).await?;
    tracing::info!(instance = %durable.tasks().instance(), lease = ?options.task_lease, "durable tasks on");
    let app = router(&durable, durable.tasks(), &options, &cancel);
    tracing::info!(
        address = %listener.local_addr()?,
        store = %redact(&options.store),
        mode = if options.stateless { "stateless" } else { "sessions" },
        poll_every = ?options.poll_every,
        max_age = ?options.retention.max_age,
        max_events_per_stream = ?options.retention.max_events_per_stream,
        "serving MCP at /mcp"
    );
    let stop = cancel.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: closing open streams");
            stop.cancel();
        })
        .await?;
    // Resumes of this instance's streams elsewhere end now, not a lease
    // later.
    durable.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on Ctrl-C, or SIGTERM on Unix: the command's `shutdown` for
/// [`serve`] and [`work`] (and the actix-web example's).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

/// Installs a Prometheus recorder as the process's `metrics` recorder and
/// returns its handle; fails if the process already has a recorder.
pub fn install_metrics() -> Result<PrometheusHandle, Box<dyn std::error::Error + Send + Sync>> {
    Ok(PrometheusBuilder::new().install_recorder()?)
}

/// `GET /metrics`: what `handle` has recorded, in the Prometheus text
/// format.
pub fn metrics_router(handle: PrometheusHandle) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let handle = handle.clone();
            async move {
                handle.run_upkeep();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    handle.render(),
                )
            }
        }),
    )
}

/// A store URL without its password, for the log.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--trace` names an export; without it, nothing is exported.
    #[test]
    fn trace_names_an_export() {
        let parse = |args: &[&str]| Options::parse(args.iter().map(|a| a.to_string()));
        assert_eq!(parse(&[]).unwrap().trace, None);
        assert_eq!(
            parse(&["--trace", "stdout"]).unwrap().trace,
            Some(Export::Stdout)
        );
        assert_eq!(parse(&["--trace=otlp"]).unwrap().trace, Some(Export::Otlp));
        assert!(parse(&["--trace", "jaeger"]).is_err());
    }

    /// Any `Authorization` value is a caller of its own: equal values the
    /// same, other values (long ones, and ones that are not UTF-8, too)
    /// another; an empty one is no credential.
    #[test]
    fn every_authorization_value_is_a_caller_of_its_own() {
        let caller = |value: &[u8]| {
            let request = axum::http::Request::builder()
                .header(axum::http::header::AUTHORIZATION, value)
                .body(Body::empty())
                .unwrap();
            let request = authenticate(request);
            callers().owner(request.extensions())
        };
        let short = caller(b"Bearer alice");
        assert_eq!(short, caller(b"Bearer alice"));
        assert_ne!(short, caller(b"Bearer mallory"));
        assert_ne!(short, Owner::Anonymous);
        assert_eq!(caller(b""), Owner::Anonymous);
        let long = vec![b'a'; 5_000];
        let mut other = long.clone();
        *other.last_mut().unwrap() = b'b';
        assert_eq!(caller(&long), caller(&long.clone()));
        assert_ne!(caller(&long), caller(&other));
        assert_ne!(caller(b"\xff\xfe"), caller(b"\xff\xfd"));
    }

    /// A caller nested in rmcp's `Extensions` (where rmcp-actix-web's
    /// `on_request` hook puts it) is the same caller as one `authenticate`
    /// inserts.
    #[test]
    fn a_caller_nested_in_rmcps_extensions_is_the_same_caller() {
        let caller = Caller::from_authorization(b"Bearer alice").unwrap();
        let mut direct = axum::http::Extensions::new();
        direct.insert(caller.clone());
        let mut hooked = rmcp::model::Extensions::new();
        hooked.insert(caller);
        let mut nested = axum::http::Extensions::new();
        nested.insert(hooked);
        let owner = callers().owner(&direct);
        assert_ne!(owner, Owner::Anonymous);
        assert_eq!(callers().owner(&nested), owner);
        assert_eq!(Caller::from_authorization(b""), None);
    }
}
