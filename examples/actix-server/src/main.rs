//! `actix-mcp-server`: the command. Reads the options, sets up logging,
//! listens, and serves until Ctrl-C or SIGTERM. The server itself is the
//! library (`actix_mcp_server`), which the end-to-end test drives.

use resumable_server::shutdown_signal;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rmcp=warn".into()),
        )
        .init();
    let options = actix_mcp_server::parse(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    let listener = match std::net::TcpListener::bind(options.bind) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on {}: {error}", options.bind);
            std::process::exit(1);
        }
    };
    if let Err(error) = actix_mcp_server::serve(options, listener, shutdown_signal()).await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
