//! `tower-mcp-server`: a [tower-mcp](https://docs.rs/tower-mcp) 0.25 server
//! whose sessions, SSE events and durable tasks live in an
//! **mcp-event-store** store, through `mcp_event_store::tower_mcp`.
//!
//! ```sh
//! cargo run -p tower-mcp-server                        # SQLite, http://127.0.0.1:8001/mcp
//! cargo run -p tower-mcp-server --features full -- --store postgres://postgres@127.0.0.1/postgres
//! ```
//!
//! Two instances on one PostgreSQL, Redis or SQLite file serve the same
//! sessions and tasks: a session created on one is served by the other, a
//! GET stream dropped on one resumes on the other (`Last-Event-ID`), a task
//! created on one is read, answered and cancelled through the other, and
//! the tasks of an instance killed mid-task read `failed` on the other one
//! lease later; with `--takeover N` on both, the other one runs a killed
//! instance's `slow_count` task again instead (from the top: tower-mcp
//! gives a handler no checkpoints), and it completes.
//!
//! Its tools:
//!
//! * `slow_count` (`count`, `interval_ms`): counts to `count`, waiting
//!   `interval_ms` between steps, with a progress notification per step
//!   when the call carries a `progressToken` (on a 2025-11-25 session they
//!   reach the session's GET stream, where they are stored and resumable).
//!   It runs as a task when the client declares the tasks extension
//!   (2026-07-28), and then a `tasks/cancel` through any instance stops it.
//! * `confirm_count` (same arguments): asks the client first, with an
//!   elicitation under the input key `confirm` (the answer may change the
//!   count), then counts. As a task, the answer may come through
//!   `tasks/update` on any instance, which then runs the count.
//! * `running_counts`: how many counts run in this process now (what a
//!   cancel through another instance is seen to stop by).
//! * `ask_client` (`prompt`, optional): asks the client for an LLM
//!   completion (`sampling/createMessage`, 2025-11-25 sessions) and answers
//!   `sampled: <text>`. It shows a limit tower-mcp 0.25 sets: the answer
//!   must be POSTed to the instance running the call, which keeps the
//!   waiting request in its memory; another instance drops it.
//!
//! Options (`tower-mcp-server --help`): `--store URL` (default
//! `sqlite://mcp-tower-mcp-server.db`), `--bind ADDR` (default
//! `127.0.0.1:8001`), `--task-lease-ms MS` (default 30000),
//! `--session-ttl-secs SECS` (default 1800), `--allow-host HOST`,
//! `--takeover N` (off by default), `--trace EXPORT` (off by default; see
//! [Traces](#traces)). It builds 188 crates (`cargo tree -e normal`),
//! against 192 for `resumable-server`.
//! The requests of the durable-tasks curl walk-through
//! (`docs/tasks-walkthrough.md`) work against two instances of it too; it
//! wants `Mcp-Name` on `tasks/*` as well.
//!
//! The library is what the command runs, and what its end-to-end tests
//! drive.
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
//! In Kubernetes (`docs/operations.md` has more):
//!
//! ```yaml
//! livenessProbe:
//!   httpGet: { path: /healthz, port: 8001 }
//!   periodSeconds: 10
//!   failureThreshold: 3
//! readinessProbe:
//!   httpGet: { path: /readyz, port: 8001 }
//!   periodSeconds: 5
//!   timeoutSeconds: 3
//!   failureThreshold: 2
//! ```
//!
//! (with `--bind 0.0.0.0:8001`, so that the kubelet reaches the pod's
//! address).
//!
//! # Traces
//!
//! `--trace stdout` exports the server's spans as OpenTelemetry traces to
//! stdout (the logs stay on stderr); `--trace otlp` sends them over
//! OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT` (default
//! `http://localhost:4318`), with the package's `otlp` feature:
//!
//! ```text
//! cargo run -p tower-mcp-server -- --takeover 3 --trace stdout
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 \
//!   cargo run -p tower-mcp-server --features otlp -- --takeover 3 --trace otlp
//! ```
//!
//! Each `tools/call` then runs in a `tools/call` span (`tool`), and the
//! task it creates keeps that span's W3C trace context. When another
//! server takes the task over (`--takeover`), its run is a `task.run` span
//! (the task's digest, the attempt, the tool) in the same trace, a child
//! of the creating request's span. Without `--trace` nothing is exported
//! and no `tools/call` span is made. `docs/operations.md` has more.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::builder::TypedValueParser;
use mcp_event_store::DynStore;
use mcp_event_store::runtime::otel::Export;
use mcp_event_store::tower_mcp::{
    Across, BindCallers, Broadcast, Callers, CallersLayer, Runtime, TowerEventStore,
    TowerSessionStore, TowerTaskStore,
};
use schemars::JsonSchema;
use serde::Deserialize;
use tower_mcp::extract::{Context, Json, State};
use tower_mcp::protocol::{
    ElicitAction, ElicitFieldValue, ElicitFormParams, ElicitFormSchema, ElicitRequestParams,
    InputRequest, InputRequiredResult, InputResponse, McpRequest, RequestOutcome,
};
use tower_mcp::transport::http::SessionConfig;
use tower_mcp::{
    BoxError, CallToolResult, CreateMessageParams, HttpTransport, McpRouter, RequestContext,
    RouterRequest, SamplingMessage, TaskSupportMode, Tool, ToolBuilder,
};
use tracing::Instrument;

/// The highest count the tools accept.
pub const MAX_COUNT: u32 = 100_000;
/// The longest wait between steps the tools accept, in milliseconds.
pub const MAX_INTERVAL_MS: u64 = 60_000;
/// The input key under which `confirm_count` asks the client.
pub const CONFIRM_KEY: &str = "confirm";

/// The command's options.
#[derive(Clone, Debug, PartialEq, Eq, clap::Parser)]
#[command(
    name = "tower-mcp-server",
    version,
    about = "A tower-mcp server whose sessions, SSE events and durable tasks live in an \
             mcp-event-store store",
    long_about = "A tower-mcp 0.25 server whose sessions, SSE events and durable tasks live in \
                  an mcp-event-store store, named by URL (memory://, sqlite://, postgres://, \
                  redis://, sled://), at http://ADDR/mcp.\n\n\
                  Tools: slow_count (counts to `count`, waiting `interval_ms` between steps, \
                  with a progress notification per step; a task when the client declares the \
                  tasks extension), confirm_count (asks the client to confirm through an \
                  elicitation, input key `confirm`, then counts), running_counts (the \
                  counts running in this process), announce (tells every client of every instance \
                  that the resource list changed) and ask_client (asks the client for an LLM \
                  completion, sampling in a 2025-11-25 session, and answers `sampled: <text>`; \
                  the client must answer the instance running the call).\n\n\
                  Two instances on one PostgreSQL, Redis or SQLite file serve the same \
                  sessions and tasks. Stop it with Ctrl-C or SIGTERM. Logs go to stderr \
                  (RUST_LOG, default `info,tower_mcp=warn,tower_mcp_server=info`).\n\n\
                  Exit status: 0 after a clean shutdown, 1 when it cannot listen or the store \
                  fails, 2 on bad arguments.",
    after_help = "Examples:\n  \
                  tower-mcp-server\n  \
                  tower-mcp-server --store postgres://postgres@127.0.0.1/postgres --bind 127.0.0.1:8002\n\n\
                  Backends other than SQLite need the package's features: \
                  cargo run -p tower-mcp-server --features full -- --store URL"
)]
pub struct Options {
    /// Where to keep sessions, events and tasks: any URL
    /// `mcp_event_store::connect` takes (PostgreSQL, Redis and sled with
    /// `--features full`).
    #[arg(
        long,
        value_name = "URL",
        default_value = "sqlite://mcp-tower-mcp-server.db"
    )]
    pub store: String,
    /// Where to listen.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8001")]
    pub bind: SocketAddr,
    /// How long one renewal of this instance's lease keeps it alive,
    /// renewed every third of it: a server that dies leaves its running tasks reading
    /// `failed` this long after (at least 300).
    #[arg(long, value_name = "MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(300..))]
    pub task_lease_ms: u64,
    /// How long an idle session lives (at least 1).
    #[arg(long, value_name = "SECS", default_value_t = 1_800,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub session_ttl_secs: u64,
    /// How often idle sessions are looked for (at least 100).
    #[arg(long, value_name = "MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(100..))]
    pub session_cleanup_ms: u64,
    /// Accept this `Host` header (repeatable); loopback names are always
    /// accepted.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Let `slow_count` tasks outlive this server: when it dies, another
    /// server started with this option runs the count again (from the top:
    /// tower-mcp has no checkpoints), up to N runs in all. Off by default:
    /// the tasks of a server that dies read `failed`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub takeover: Option<u32>,
    /// Export spans as OpenTelemetry traces: `stdout`, or `otlp` (over
    /// OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`, default
    /// `http://localhost:4318`; needs the `otlp` feature). Each
    /// `tools/call` then runs in a span, and a task's runs taken over by
    /// another server continue the trace of the request that created it.
    #[arg(long, value_name = "EXPORT",
          value_parser = clap::builder::PossibleValuesParser::new(["stdout", "otlp"])
              .try_map(|name| name.parse::<Export>()))]
    pub trace: Option<Export>,
}

impl Options {
    /// The options in `args` (the command's arguments, without its name).
    ///
    /// # Errors
    ///
    /// clap's error for bad or unknown arguments, or for `--help`; its
    /// `exit()` prints it and exits with the right status.
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Self, clap::Error> {
        <Self as clap::Parser>::try_parse_from(
            std::iter::once("tower-mcp-server".to_owned()).chain(args),
        )
    }

    fn lease(&self) -> Duration {
        Duration::from_millis(self.task_lease_ms)
    }
}

/// The arguments of both counting tools.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CountInput {
    /// How far to count (at most 100,000).
    pub count: u32,
    /// Milliseconds to wait before each step (default 100, at most 60,000).
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
}

fn default_interval() -> u64 {
    100
}

impl CountInput {
    fn check(&self) -> Result<(), tower_mcp::Error> {
        if self.count > MAX_COUNT || self.interval_ms > MAX_INTERVAL_MS {
            return Err(tower_mcp::Error::invalid_params(format!(
                "count is at most {MAX_COUNT} and interval_ms at most {MAX_INTERVAL_MS}"
            )));
        }
        Ok(())
    }
}

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NoInput {}

/// The arguments of `ask_client`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AskInput {
    /// What to ask the client's model (default: a fixed question).
    #[serde(default)]
    pub prompt: Option<String>,
}

/// What `ask_client` asks when the call names no prompt.
pub const DEFAULT_PROMPT: &str = "Say something.";

/// Counts the counts running in this process, for as long as each runs:
/// a count dropped on cancellation stops counting too.
#[derive(Clone, Debug, Default)]
struct Running(Arc<AtomicUsize>);

/// One running count.
struct Counting(Arc<AtomicUsize>);

impl Running {
    fn enter(&self) -> Counting {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counting(self.0.clone())
    }

    fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts to `count`, a step each `interval_ms`, reporting progress.
async fn count_to(ctx: &RequestContext, running: &Running, count: u32, interval_ms: u64) {
    let _counting = running.enter();
    for step in 1..=count {
        tokio::time::sleep(Duration::from_millis(interval_ms)).await;
        let message = format!("step {step} of {count}");
        ctx.report_progress(f64::from(step), Some(f64::from(count)), Some(&message))
            .await;
    }
}

fn slow_count(running: Running) -> Tool {
    ToolBuilder::new("slow_count")
        .description(
            "Counts to `count`, waiting `interval_ms` between steps, with a progress \
             notification per step; a task when the client declares the tasks extension",
        )
        .task_support(TaskSupportMode::Optional)
        .extractor_handler(
            running,
            |State(running): State<Running>, ctx: Context, Json(input): Json<CountInput>| async move {
                input.check()?;
                count_to(&ctx, &running, input.count, input.interval_ms).await;
                Ok(CallToolResult::text(format!("counted to {}", input.count)))
            },
        )
        .build()
}

/// The elicitation `confirm_count` sends: confirm the count, or change it.
fn confirmation(count: u32) -> InputRequest {
    InputRequest::Elicit(ElicitRequestParams::Form(ElicitFormParams {
        mode: None,
        message: format!("Count to {count}?"),
        requested_schema: ElicitFormSchema::new().integer_field_with_default(
            "count",
            Some("how far to count"),
            false,
            i64::from(count),
        ),
        meta: None,
    }))
}

/// The count an answer to the confirmation names: `None` if declined.
fn confirmed_count(answer: &InputResponse, asked: u32) -> Option<u32> {
    let InputResponse::Elicit(result) = answer else {
        return None;
    };
    if result.action != ElicitAction::Accept {
        return None;
    }
    let count = match result.content.as_ref().and_then(|c| c.get("count")) {
        Some(ElicitFieldValue::Integer(n)) => u32::try_from(*n).ok(),
        Some(ElicitFieldValue::Number(n)) if n.fract() == 0.0 && *n >= 0.0 => {
            u32::try_from(*n as u64).ok()
        }
        None => Some(asked),
        Some(_) => None,
    };
    Some(count.unwrap_or(asked))
}

fn confirm_count(running: Running) -> Tool {
    ToolBuilder::new("confirm_count")
        .description(
            "Asks the client to confirm the count (elicitation, input key `confirm`), then \
             counts; a task when the client declares the tasks extension",
        )
        .task_support(TaskSupportMode::Optional)
        .mrtr_handler(move |ctx: RequestContext, input: CountInput| {
            let running = running.clone();
            async move {
                input.check()?;
                let answer = ctx
                    .input_responses()
                    .and_then(|answers| answers.get(CONFIRM_KEY))
                    .cloned();
                let Some(answer) = answer else {
                    let ask = [(CONFIRM_KEY.to_owned(), confirmation(input.count))];
                    return Ok(RequestOutcome::InputRequired(
                        InputRequiredResult::with_requests(ask.into_iter().collect()),
                    ));
                };
                let Some(count) = confirmed_count(&answer, input.count) else {
                    return Ok(RequestOutcome::Complete(CallToolResult::text(
                        "not confirmed: nothing counted",
                    )));
                };
                if count > MAX_COUNT {
                    return Err(tower_mcp::Error::invalid_params(format!(
                        "count is at most {MAX_COUNT}"
                    )));
                }
                count_to(&ctx, &running, count, input.interval_ms).await;
                Ok(RequestOutcome::Complete(CallToolResult::text(format!(
                    "counted to {count}"
                ))))
            }
        })
        .build()
}

fn running_counts(running: Running) -> Tool {
    ToolBuilder::new("running_counts")
        .description("How many counts run in this process now")
        .handler(move |_: NoInput| {
            let running = running.clone();
            async move { Ok(CallToolResult::text(running.now().to_string())) }
        })
        .build()
}

/// The tool that tells every client of every instance that the resource
/// list changed, raised once through [`Across`].
fn announce(across: Across) -> Tool {
    ToolBuilder::new("announce")
        .description(
            "Tells every client of every instance sharing the store that the resource list \
             changed (notifications/resources/list_changed)",
        )
        .handler(move |_: NoInput| {
            let across = across.clone();
            async move {
                across
                    .raise(&Broadcast::ResourcesListChanged)
                    .await
                    .map_err(|e| tower_mcp::Error::internal(e.to_string()))?;
                Ok(CallToolResult::text("announced"))
            }
        })
        .build()
}

/// The tool that asks the client for an LLM completion: a server-to-client
/// request (`sampling/createMessage`) sent on the SSE response of the
/// call's POST, in a 2025-11-25 session. It exists to show, end to end,
/// what tower-mcp 0.25 keeps on one instance: the request waits in the
/// memory of the instance running the call, numbered by it, and only an
/// answer POSTed to that instance completes it.
fn ask_client() -> Tool {
    ToolBuilder::new("ask_client")
        .description(
            "Asks the client for an LLM completion of `prompt` (sampling/createMessage, \
             2025-11-25 sessions) and answers `sampled: <text>`",
        )
        .extractor_handler((), |ctx: Context, Json(input): Json<AskInput>| async move {
            let prompt = input.prompt.unwrap_or_else(|| DEFAULT_PROMPT.to_owned());
            let params = CreateMessageParams::new(vec![SamplingMessage::user(prompt)], 100);
            let sampled = ctx.sample(params).await?;
            let text = sampled.first_text().unwrap_or_default();
            Ok(CallToolResult::text(format!("sampled: {text}")))
        })
        .build()
}

/// The server's HTTP service on `store`: tower-mcp's Streamable HTTP
/// transport at `/mcp`, its sessions, events and tasks in the store, run
/// by the runtime (this instance's one lease, purges of expired events,
/// sessions and tasks, takeovers), wired across instances through
/// [`Across`].
///
/// # Errors
///
/// If the runtime cannot register this instance or listen on the bus.
pub async fn app(store: DynStore, options: &Options) -> Result<App, BoxError> {
    let lease = options.lease();
    let mut runtime = Runtime::builder(store.clone())
        .version(concat!(
            env!("CARGO_PKG_NAME"),
            " ",
            env!("CARGO_PKG_VERSION")
        ))
        .lease(lease)
        .claim_every(lease / 3);
    if let Some(runs) = options.takeover {
        runtime = runtime.max_attempts(runs);
    }
    let runtime = runtime.start().await?;
    let mut builder = TowerTaskStore::builder(runtime.clone());
    if options.takeover.is_some() {
        builder = builder.takeover_tools(["slow_count"]);
    }
    let tasks = Arc::new(builder.build()?);
    let running = Running::default();
    let across = Across::new(runtime.clone());
    let router = McpRouter::new()
        .server_info(
            "mcp-event-store-tower-mcp-server",
            env!("CARGO_PKG_VERSION"),
        )
        .task_store(tasks.clone())
        .tool(slow_count(running.clone()))
        .tool(confirm_count(running.clone()))
        .tool(running_counts(running))
        .tool(announce(across.clone()))
        .tool(ask_client())
        .with_tasks()
        .bind_callers();
    let takeovers = options
        .takeover
        .is_some()
        .then(|| tasks.run_takeovers(router.clone()));
    // Across instances: idle cleanup spares sessions served elsewhere, a
    // DELETE ends the session on every instance, what `announce` raises
    // reaches every instance's clients, and a task's status reaches its
    // listeners on every instance. Sampling (`ask_client`)
    // stays on the instance that asked: tower-mcp gives it no seam.
    let sessions = TowerSessionStore::new(store.clone()).across_instances();
    let events = TowerEventStore::new(store).across_instances();
    let announcing = router.clone();
    let mut transport = HttpTransport::new(router)
        .bind_callers()
        .session_store(Arc::new(sessions))
        .event_store(Arc::new(events))
        .session_config(
            SessionConfig::with_ttl(Duration::from_secs(options.session_ttl_secs))
                .cleanup_interval(Duration::from_millis(options.session_cleanup_ms)),
        )
        .external_notifications(across.notifications().await?)
        .with_sampling();
    if options.trace.is_some() {
        transport = transport.layer(tower_layer::layer_fn(Traced));
    }
    if !options.allowed_hosts.is_empty() {
        transport = transport.allowed_hosts(options.allowed_hosts.clone());
    }
    let (router, handle) = transport.into_router_at_with_handle("/mcp");
    Ok(App {
        router: router
            .layer(
                across
                    .layer(handle)
                    .await?
                    .announcing_tasks(announcing, TowerTaskStore::clone(&tasks)),
            )
            // Sessions and tasks are bound to the caller (C20, T3).
            .layer(CallersLayer::new(callers()))
            .layer(axum::middleware::map_request(|request| {
                std::future::ready(authenticate(request))
            }))
            // After the MCP layers: the probes need no session, no caller
            // and no allowed `Host` (the transport checks those at `/mcp`).
            .merge(health_router(runtime.clone())),
        takeovers,
        runtime,
    })
}

/// The router with each `tools/call` in a `tools/call` span (`--trace`): a
/// task it creates keeps that span's trace, which the task's runs continue
/// on whichever server takes it over.
#[derive(Clone)]
struct Traced(McpRouter);

impl tower_service::Service<RouterRequest> for Traced {
    type Response = <McpRouter as tower_service::Service<RouterRequest>>::Response;
    type Error = <McpRouter as tower_service::Service<RouterRequest>>::Error;
    type Future = tracing::instrument::Instrumented<
        <McpRouter as tower_service::Service<RouterRequest>>::Future,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: RouterRequest) -> Self::Future {
        let span = match &request.inner {
            McpRequest::CallTool(call) => tracing::info_span!("tools/call", tool = %call.name),
            _ => tracing::Span::none(),
        };
        self.0.call(request).instrument(span)
    }
}

/// How long `/readyz` waits for the store before it answers 503: shorter
/// than a probe's `timeoutSeconds` (say 3), so that a hung database fails
/// the probe with a reason rather than hanging it.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz` and `GET /readyz` (see "Health" in the crate docs), for
/// `runtime`, this instance's: merged into [`app`]'s router, on the MCP
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

/// Who a request comes from, as the example's stand-in for authentication
/// ([`authenticate`]) puts it in the request's extensions: its
/// `Authorization` header. A real server's authentication middleware
/// inserts its own type (verified claims), and [`callers`] reads that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub String);

/// The example's stand-in for authentication: a request's non-empty
/// `Authorization` header, whatever it holds, becomes its [`Caller`]. Do
/// not trust a header like this in production; verify it first.
pub fn authenticate(mut request: axum::extract::Request) -> axum::extract::Request {
    let caller = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .map(|value| value.as_bytes())
        .filter(|bytes| !bytes.is_empty())
        .map(|bytes| match std::str::from_utf8(bytes) {
            Ok(text) => format!("u:{text}"),
            Err(_) => format!("b:{}", hex(bytes)),
        });
    if let Some(caller) = caller {
        request.extensions_mut().insert(Caller(caller));
    }
    request
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Who is calling: the [`Caller`] of each request. tower-mcp binds each
/// session and each task to it.
pub fn callers() -> Callers {
    Callers::from_extension(|caller: &Caller| caller.0.clone())
}

/// The server's HTTP service, the takeovers it runs (with `--takeover`),
/// which stop when this is dropped, and its runtime.
pub struct App {
    /// The HTTP service: tower-mcp's transport at `/mcp`.
    pub router: axum::Router,
    /// The runtime's takeover runner for lost `slow_count` tasks, if any.
    pub takeovers: Option<mcp_event_store::tower_mcp::Takeovers>,
    /// This instance's runtime.
    pub runtime: Runtime,
}

/// Opens the store, then serves on `listener` until `shutdown` resolves;
/// the runtime purges expired events, sessions and tasks every minute.
///
/// # Errors
///
/// If the store cannot be opened, or serving fails.
pub async fn serve(
    options: Options,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BoxError> {
    let store = mcp_event_store::connect(&options.store).await?;
    let App {
        router,
        takeovers,
        runtime,
    } = app(store, &options).await?;
    tracing::info!(
        store = %options.store,
        address = %listener.local_addr()?,
        "serving MCP at /mcp"
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    // Stops claiming and lets go of the router before the task store.
    drop(takeovers);
    runtime.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::parse(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn options_have_defaults_and_refuse_nonsense() {
        let defaults = parse(&[]).unwrap();
        assert_eq!(defaults.store, "sqlite://mcp-tower-mcp-server.db");
        assert_eq!(defaults.bind, "127.0.0.1:8001".parse().unwrap());
        assert_eq!(defaults.lease(), Duration::from_secs(30));
        let set = parse(&[
            "--store",
            "memory://",
            "--task-lease-ms",
            "3000",
            "--allow-host",
            "a.example",
        ])
        .unwrap();
        assert_eq!(
            (set.store.as_str(), set.task_lease_ms),
            ("memory://", 3_000)
        );
        assert_eq!(set.allowed_hosts, ["a.example"]);
        assert_eq!(defaults.trace, None);
        assert_eq!(
            parse(&["--trace", "stdout"]).unwrap().trace,
            Some(Export::Stdout)
        );
        assert_eq!(
            parse(&["--trace", "otlp"]).unwrap().trace,
            Some(Export::Otlp)
        );
        for bad in [
            &["--trace", "jaeger"][..],
            &["--task-lease-ms", "10"],
            &["--bind", "nowhere"],
            &["--session-ttl-secs", "0"],
            &["--unknown"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_confirmation_names_its_count() {
        let answer = |json: serde_json::Value| serde_json::from_value(json).unwrap();
        let accept = answer(serde_json::json!({"action": "accept", "content": {"count": 4}}));
        assert_eq!(confirmed_count(&accept, 3), Some(4));
        let same = answer(serde_json::json!({"action": "accept"}));
        assert_eq!(confirmed_count(&same, 3), Some(3));
        let decline = answer(serde_json::json!({"action": "decline"}));
        assert_eq!(confirmed_count(&decline, 3), None);
        let odd = answer(serde_json::json!({"action": "accept", "content": {"count": -2}}));
        assert_eq!(confirmed_count(&odd, 3), Some(3));
    }
}
