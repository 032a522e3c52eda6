//! `tower-mcp-server`: the command. Reads the options, sets up logging,
//! listens, and serves until Ctrl-C or SIGTERM. The server itself is the
//! library (`tower_mcp_server`), which the end-to-end tests drive.

use mcp_event_store::runtime::otel::Tracing;
use tower_mcp_server::{Options, serve};

/// Resolves on Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
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

#[tokio::main]
async fn main() {
    let options = Options::parse(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    // Logs to stderr; with `--trace`, spans exported as traces beside them.
    // (`tower_mcp=warn` alone would match `tower_mcp_server` too:
    // directives match target prefixes.)
    let trace = Tracing::install(
        options.trace,
        "tower-mcp-server",
        "info,tower_mcp=warn,tower_mcp_server=info",
    )
    .unwrap_or_else(|error| {
        eprintln!("error: --trace: {error}");
        std::process::exit(1);
    });
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

/// Serves until Ctrl-C or SIGTERM; what went wrong, as the command prints
/// it.
async fn run(options: Options) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|error| format!("cannot listen on {}: {error}", options.bind))?;
    serve(options, listener, shutdown_signal())
        .await
        .map_err(|error| format!("error: {error}"))
}
