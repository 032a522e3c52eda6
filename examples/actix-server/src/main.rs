//! `actix-mcp-server`: the command. Reads the options, sets up logging,
//! listens, and serves until Ctrl-C or SIGTERM. The server itself is the
//! library (`actix_mcp_server`), which the end-to-end test drives.

use mcp_event_store::runtime::otel::Tracing;
use resumable_server::shutdown_signal;

#[tokio::main]
async fn main() {
    let options = actix_mcp_server::parse(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    // Logs to stderr; with `--trace`, spans exported as traces beside them.
    let trace = Tracing::install(options.trace, "actix-mcp-server", "info,rmcp=warn")
        .unwrap_or_else(|error| {
            eprintln!("error: --trace: {error}");
            std::process::exit(1);
        });
    let listener = match std::net::TcpListener::bind(options.bind) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on {}: {error}", options.bind);
            std::process::exit(1);
        }
    };
    let served = actix_mcp_server::serve(options, listener, shutdown_signal()).await;
    if let Some(trace) = trace {
        // Exports what is batched still; blocks until the exporter is done.
        let _ = tokio::task::spawn_blocking(move || trace.shutdown()).await;
    }
    if let Err(error) = served {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
