//! `resumable-server`: the command. Reads the options, sets up logging,
//! listens, and serves until Ctrl-C or SIGTERM (or, with `--worker`, runs
//! tasks from the store until then). The server itself is the
//! library (`resumable_server`), which the end-to-end tests drive.

use mcp_event_store::runtime::otel::Tracing;
use resumable_server::{Options, serve, shutdown_signal};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::main]
async fn main() {
    let options = Options::try_parse(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    // `--trace`: spans exported as OpenTelemetry traces, beside the logs.
    let trace = options
        .trace
        .map(|export| Tracing::start(export, "resumable-server"))
        .transpose()
        .unwrap_or_else(|error| {
            eprintln!("error: --trace: {error}");
            std::process::exit(1);
        });
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(trace.as_ref().map(|trace| trace.layer()))
        .with(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rmcp=warn".into()),
        )
        .init();
    let ran = run(options).await;
    if let Some(trace) = trace {
        // Exports what is batched still; blocks until the exporter is done.
        let _ = tokio::task::spawn_blocking(move || trace.shutdown()).await;
    }
    if let Err(error) = ran {
        eprintln!("{error}");
        std::process::exit(1);
    }
}

/// Serves (or, with `--worker`, works) until Ctrl-C or SIGTERM; what went
/// wrong, as the command prints it.
async fn run(options: Options) -> Result<(), String> {
    if options.worker {
        return resumable_server::work(options, shutdown_signal())
            .await
            .map_err(|error| format!("error: {error}"));
    }
    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", options.bind))?;
    serve(options, listener, shutdown_signal())
        .await
        .map_err(|error| format!("error: {error}"))
}
