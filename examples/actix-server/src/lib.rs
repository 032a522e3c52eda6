//! The resumable MCP server on actix-web: rmcp's Streamable HTTP transport
//! through [rmcp-actix-web](https://crates.io/crates/rmcp-actix-web), every
//! SSE event, session and durable task kept in an mcp-event-store store.
//!
//! The server itself (its tools, options and store wiring) is
//! `resumable-server`'s library; this package is only its actix-web front:
//! [`app`] hands rmcp-actix-web's builder what `resumable_server::router`
//! hands rmcp's axum service (the [`Durable`]'s session manager and session
//! store, the retry hint, the allowed hosts, the shutdown token), serves
//! each request as its caller ([`Durable::as_caller`], where axum has
//! `Durable::scoped`), and answers `/healthz` and `/readyz` as the axum
//! server does. A stream begun on this server resumes on any instance
//! sharing the store, actix-web or axum.
//!
//! ```text
//! cargo run -p actix-mcp-server                  # http://127.0.0.1:8002/mcp, a SQLite file
//! cargo run -p actix-mcp-server -- --stateless
//! cargo run -p actix-mcp-server --features full -- --store postgres://postgres@127.0.0.1/postgres
//! ```
//!
//! The options are resumable-server's (`--help` lists them; its crate docs
//! explain each), with `--bind` defaulting to [`DEFAULT_BIND`] and
//! `--store` to [`DEFAULT_STORE`]; `--poll-every`, `--metrics` and
//! `--worker` are the axum server's alone (an actix-web worker would be
//! resumable-server's: it serves no HTTP).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::future::Future;
use std::sync::Arc;

use actix_web::dev::Service as _;
use actix_web::http::header::{AUTHORIZATION, ContentType};
use actix_web::{App, HttpMessage as _, HttpRequest, HttpResponse, HttpServer, web};
use mcp_event_store::rmcp::{Durable, DurableTasks, SessionManager};
use resumable_server::{Caller, Options, READY_TIMEOUT, SlowCounter, redact};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp_actix_web::transport::{CancellationToken, Extensions, StreamableHttpService, http};

/// Where the command listens by default: port 8002 (resumable-server's
/// is 8000, tower-mcp-server's 8001).
pub const DEFAULT_BIND: &str = "127.0.0.1:8002";

/// The command's store by default: a SQLite file in the working directory.
pub const DEFAULT_STORE: &str = "sqlite://mcp-actix-server.db";

/// The options resumable-server's axum server has and this one does not,
/// by their clap ids: hidden from `--help`, refused when given.
const AXUM_ONLY: [(&str, &str); 3] = [
    ("poll_every", "--poll-every"),
    ("metrics", "--metrics"),
    ("worker", "--worker"),
];

/// Parses the command line (without the program name):
/// resumable-server's options under this command's name and defaults; a
/// clap error to [`exit`](clap::Error::exit) with (`--help` and
/// `--version` among them, and an option of the axum server alone).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, clap::Error> {
    let mut command = None;
    let options = Options::try_parse_with(args, |resumable| {
        let mut actix = resumable
            .name("actix-mcp-server")
            .bin_name("actix-mcp-server")
            .about(
                "The resumable MCP server on actix-web (rmcp-actix-web): resumable-server's \
                 tools and store wiring at /mcp, every SSE event, session and durable task \
                 kept in an mcp-event-store store",
            )
            .long_about(None)
            .after_help(
                "Examples:\n  actix-mcp-server\n  \
                 actix-mcp-server --store sqlite://tasks.db --bind 127.0.0.1:8003",
            )
            .mut_arg("bind", |arg| arg.default_value(DEFAULT_BIND))
            .mut_arg("store", |arg| arg.default_value(DEFAULT_STORE));
        for (id, _) in AXUM_ONLY {
            actix = actix.mut_arg(id, |arg| arg.hide(true));
        }
        command = Some(actix.clone());
        actix
    })?;
    let given = [
        options.poll_every.is_some(),
        options.metrics.is_some(),
        options.worker,
    ];
    if let Some(((_, flag), _)) = AXUM_ONLY.iter().zip(given).find(|(_, given)| *given) {
        let mut command = command.expect("the command was built");
        return Err(command.error(
            clap::error::ErrorKind::ArgumentConflict,
            format!("{flag} is resumable-server's alone (cargo run -p resumable-server)"),
        ));
    }
    Ok(options)
}

/// rmcp-actix-web's service in either mode, built once and cloned into
/// each worker (they share its session manager).
#[derive(Clone)]
enum Endpoint {
    Sessions(StreamableHttpService<SlowCounter, SessionManager>),
    Stateless(StreamableHttpService<SlowCounter, NeverSessionManager>),
}

/// The application, for `App::configure` in each worker: MCP at `/mcp`
/// with everything `durable` wires, the handler's durable tasks on `tasks`
/// (normally `durable.tasks()`), and the probes `/healthz` and `/readyz`
/// on `durable`'s runtime. The translation of `resumable_server::router`:
///
/// * rmcp-actix-web's builder takes, knob by knob, what `Durable::config`
///   (or `stateless_config`) sets: the priming events' retry hint and, with
///   sessions, the session store ([`Durable::sessions`]); the session
///   manager is [`Durable::session_manager`] (or
///   `stateless_session_manager`);
/// * `shutdown` ends every open SSE stream when cancelled, and
///   `--allow-host` extends the accepted `Host` headers, as there;
/// * the example's stand-in for authentication (`Authorization` as the
///   [`Caller`], see `resumable_server::authenticate`) runs in a
///   middleware, which also serves the request as its caller
///   ([`Durable::as_caller`]: rmcp-actix-web calls rmcp's service inside
///   its own handler, where `Durable::scoped` cannot wrap it); its
///   `on_request` hook hands the caller on to rmcp, where
///   `resumable_server::callers` finds it for the tasks' owner.
///
/// `options.poll_every` and `options.metrics` are the axum server's: not
/// served here ([`parse`] refuses them).
pub fn app(
    durable: &Durable,
    tasks: DurableTasks,
    options: &Options,
    shutdown: &CancellationToken,
) -> impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static {
    let handler = SlowCounter::new(tasks, options).announcing_through(durable);
    let make: Arc<dyn Fn() -> std::io::Result<SlowCounter> + Send + Sync> =
        Arc::new(move || Ok(handler.clone()));
    let endpoint = if options.stateless {
        Endpoint::Stateless(
            StreamableHttpService::builder()
                .service_factory(make)
                .session_manager(durable.stateless_session_manager())
                .stateful_mode(false)
                .sse_retry(options.retry)
                .maybe_allowed_hosts(resumable_server::allowed_hosts(options))
                .cancellation_token(shutdown.child_token())
                .on_request_fn(pass_caller_on)
                .build(),
        )
    } else {
        Endpoint::Sessions(
            StreamableHttpService::builder()
                .service_factory(make)
                .session_manager(durable.session_manager())
                .session_store(durable.sessions().clone())
                .sse_retry(options.retry)
                .maybe_allowed_hosts(resumable_server::allowed_hosts(options))
                .cancellation_token(shutdown.child_token())
                .on_request_fn(pass_caller_on)
                .build(),
        )
    };
    let durable = durable.clone();
    move |config: &mut web::ServiceConfig| {
        // One `wrap_fn` per mode: the scopes' types differ.
        macro_rules! as_callers {
            ($scope:expr) => {{
                let durable = durable.clone();
                $scope.wrap_fn(move |request, service| {
                    let extensions = authenticate(&request);
                    durable.as_caller(&extensions, service.call(request))
                })
            }};
        }
        match endpoint.clone() {
            Endpoint::Sessions(service) => {
                config.service(as_callers!(service.scope_with_path("/mcp")));
            }
            Endpoint::Stateless(service) => {
                config.service(as_callers!(service.scope_with_path("/mcp")));
            }
        }
        // Beside `/mcp`: the probes need no session, no caller and no
        // allowed `Host` (rmcp checks those inside `/mcp`).
        let runtime = durable.runtime().clone();
        config
            .route("/healthz", web::get().to(|| async { "ok\n" }))
            .route(
                "/readyz",
                web::get().to(move || {
                    let runtime = runtime.clone();
                    async move {
                        match runtime.readiness(READY_TIMEOUT).await {
                            Ok(()) => HttpResponse::Ok()
                                .content_type(ContentType::plaintext())
                                .body("ready\n"),
                            Err(failed) => HttpResponse::ServiceUnavailable()
                                .content_type(ContentType::plaintext())
                                .body(format!("not ready\n{}\n", failed.join("\n"))),
                        }
                    }
                }),
            );
    }
}

/// `resumable_server::authenticate` for an actix-web request: its
/// `Authorization` header becomes its [`Caller`], in the request's
/// extensions (for [`pass_caller_on`]) and in the extensions returned, from
/// which the `Durable`'s callers read it.
fn authenticate(request: &actix_web::dev::ServiceRequest) -> http::Extensions {
    let mut extensions = http::Extensions::new();
    let caller = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| Caller::from_authorization(value.as_bytes()));
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller.clone());
        extensions.insert(caller);
    }
    extensions
}

/// rmcp-actix-web's `on_request` hook: the request's [`Caller`], to rmcp
/// (which puts it, nested, in the request context's `http::request::Parts`).
fn pass_caller_on(request: &HttpRequest, extensions: &mut Extensions) {
    if let Some(caller) = request.extensions().get::<Caller>() {
        extensions.insert(caller.clone());
    }
}

/// Opens the store and serves on `listener` until `shutdown` resolves, then
/// ends every open stream, stops the workers and returns.
pub async fn serve(
    options: Options,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store = mcp_event_store::connect_with(&options.store, options.store_options()).await?;
    let durable = resumable_server::durable(store, &options).await?;
    tracing::info!(instance = %durable.tasks().instance(), lease = ?options.task_lease, "durable tasks on");
    let cancel = CancellationToken::new();
    let configure = app(&durable, durable.tasks(), &options, &cancel);
    tracing::info!(
        address = %listener.local_addr()?,
        store = %redact(&options.store),
        mode = if options.stateless { "stateless" } else { "sessions" },
        max_age = ?options.retention.max_age,
        max_events_per_stream = ?options.retention.max_events_per_stream,
        "serving MCP at /mcp (actix-web)"
    );
    let server = HttpServer::new(move || App::new().configure(configure.clone()))
        .shutdown_signal(async move {
            shutdown.await;
            tracing::info!("shutting down: closing open streams");
            cancel.cancel();
        })
        .listen(listener)?
        .run();
    let served = server.await;
    // Resumes of this instance's streams elsewhere end now, not a lease
    // later.
    durable.shutdown().await;
    served?;
    tracing::info!("stopped");
    Ok(())
}
