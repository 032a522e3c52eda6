//! `resumable-server`: the command. Reads the options, sets up logging,
//! listens, and serves until Ctrl-C or SIGTERM (or, with `--worker`, runs
//! tasks from the store until then). The server itself is the
//! library (`resumable_server`), which the end-to-end tests drive.

use resumable_server::{Options, serve};

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
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rmcp=warn".into()),
        )
        .init();
    let options = Options::try_parse(std::env::args().skip(1)).unwrap_or_else(|e| e.exit());
    if options.worker {
        if let Err(error) = resumable_server::work(options, shutdown_signal()).await {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
        return;
    }
    let listener = match tokio::net::TcpListener::bind(options.bind).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on {}: {error}", options.bind);
            std::process::exit(1);
        }
    };
    if let Err(error) = serve(options, listener, shutdown_signal()).await {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}
