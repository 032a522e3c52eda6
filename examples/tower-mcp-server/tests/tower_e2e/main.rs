//! tower-mcp end to end, over real HTTP on loopback: two processes of this
//! package's server (tower-mcp's Streamable HTTP transport with the
//! `mcp_event_store::tower_mcp` stores) on one store, driven by a client
//! that speaks the wire protocol itself.
//!
//! Every case runs on each backend compiled in that two processes can
//! share (its crate says `shared = yes`; `mcp_event_store::for_each_backend!`,
//! at the bottom of the macro: no list here). Stores come from the facade's
//! `testing::storage`: a temporary file, or a schema or key prefix of its
//! own on the test server (found as
//! `mcp_event_store_conformance::testkit::find_server` says, failing rather
//! than skipping when there is none). Each server is a child process,
//! killed by its pid when its guard drops.

mod cases;
mod harness;
mod health;
mod wire;

use harness::{CHILD_ENV, Fixture};

/// One test per case for a backend that two server processes can share;
/// nothing for one they cannot.
macro_rules! e2e_tests {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = no) => {};
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = yes) => {
        mod $backend {
            use super::*;

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        let fixture = Fixture::on(stringify!($backend)).await;
                        $crate::cases::$case(&fixture).await;
                        fixture.teardown().await;
                    }
                };
            }

            case!(session_created_on_one_server_is_served_by_another);
            case!(stream_dropped_on_one_server_resumes_on_another);
            case!(notifications_with_no_get_stream_open_are_never_stored);
            case!(session_deleted_on_one_server_is_gone_on_another);
            case!(a_session_another_server_holds_ends_with_a_delete);
            case!(a_broadcast_raised_on_one_server_reaches_clients_of_every_server);
            case!(idle_cleanup_spares_a_session_another_server_serves);
            case!(a_tasks_status_reaches_its_listener_on_another_server);
            case!(behind_a_round_robin_proxy_one_session_spans_both_servers);
            case!(an_answer_posted_to_another_server_is_dropped_there);
            case!(task_created_on_one_server_is_read_answered_and_cancelled_through_another);
            case!(tasks_of_a_killed_server_read_failed_on_another);
            case!(task_of_a_killed_server_is_taken_over_by_another);
            case!(sessions_and_tasks_are_their_callers_on_every_server);
        }
    };
}

mcp_event_store::for_each_backend!(e2e_tests);

/// The server process of the cases: this test binary, re-executed with the
/// server's arguments in [`CHILD_ENV`]. It prints `LISTENING <url>` once it
/// accepts connections, and runs until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the server process of the end-to-end cases; they start it with its arguments"]
async fn child_server() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    // The child's log goes to its stderr, which the test keeps and prints
    // if the case fails: warnings, and the store and adapter at debug
    // (claims, fences, lapses), or what RUST_LOG says.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                // Every backend crate's target is `mcp_event_store_<name>`
                // (memory's is core's).
                let backends: String = mcp_event_store::backends()
                    .iter()
                    .filter(|backend| !backend.feature.is_empty())
                    .map(|backend| format!(",mcp_event_store_{}=debug", backend.name))
                    .collect();
                format!(
                    "warn,mcp_event_store_tower_mcp=debug{backends},\
                     tower_mcp::transport::http::session=debug"
                )
                .into()
            }),
        )
        .try_init();
    let options = tower_mcp_server::Options::parse(args.split('\u{1f}').map(str::to_owned))
        .expect("valid server arguments");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    println!("LISTENING http://{}/mcp", listener.local_addr().unwrap());
    tower_mcp_server::serve(options, listener, std::future::pending())
        .await
        .expect("the server runs");
}
