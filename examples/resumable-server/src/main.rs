//! `resumable-server`: the command. Reads the options, sets up logging,
//! listens, and serves until Ctrl-C or SIGTERM (or, with `--worker`, runs
//! tasks from the store until then). The server itself is the
//! library (`resumable_server`), which the end-to-end tests drive.

use mcp_event_store::runtime::otel::Tracing;
use resumable_server::{Options, serve, shutdown_signal};

#[tokio::main]
async fn main() {
    let options = Options::try_parse(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    // Logs to stderr; with `--trace`, spans exported as traces beside them.
    let trace = Tracing::install(options.trace, "resumable-server", "info,rmcp=warn")
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
