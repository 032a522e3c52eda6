//! rmcp end to end, over real HTTP on loopback: this package's server (rmcp's
//! Streamable HTTP server with our stores), driven by a client that speaks
//! the wire protocol itself and by rmcp's own client.
//!
//! Every case runs on every backend compiled in that its storage allows
//! (`mcp_event_store::for_each_backend!`, at the bottom: no list here).
//! Stores come from the facade's `testing::storage`: a temporary file or
//! directory, or a schema or key prefix of its own on the test server
//! (found as `mcp_event_store_conformance::testkit::find_server` says, failing
//! rather than skipping when there is none).

use resumable_server as server;

mod across;
mod cases;
mod harness;
mod health;
mod measure;
mod restore_race;
mod tasks;
mod wire;

use harness::{CHILD_ENV, Fixture, Mode};

/// One test per case and mode for a backend.
macro_rules! e2e_case {
    ($fixture:expr, $name:ident, $case:ident, $mode:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fixture = $fixture.await;
            $crate::cases::$case(&fixture, $mode).await;
            fixture.teardown().await;
        }
    };
}

/// One case of instances behind a round-robin proxy for a backend (they
/// start their own server processes).
macro_rules! across_case {
    ($fixture:expr, $name:ident, $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fixture = $fixture.await;
            $crate::across::$case(&fixture).await;
            fixture.teardown().await;
        }
    };
}

/// One durable-task case for a backend (they set up their own servers).
macro_rules! task_case {
    ($fixture:expr, $name:ident, $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fixture = $fixture.await;
            $crate::tasks::$case(&fixture).await;
            fixture.teardown().await;
        }
    };
}

/// Every case on one backend, as `mcp_event_store::for_each_backend!`
/// hands it over: the common cases, then those its storage allows, as its
/// crate says. `restart = yes` (a new process opens the storage again):
/// the store survives the server process. `shared = yes` (several processes
/// use it at once): two servers can use the store at once, durable tasks
/// across two server processes, and tasks taken over from a killed server
/// or worker process.
macro_rules! e2e_tests {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            e2e_tests!(@common Fixture::on(stringify!($backend)));
            e2e_tests!(@restart $restart Fixture::on(stringify!($backend)));
            e2e_tests!(@shared $shared Fixture::on(stringify!($backend)));
        }
    };
    (@common $fixture:expr) => {
        e2e_case!($fixture, sessions_resume_after_a_dropped_connection, resume_after_drop, Mode::Sessions);
        e2e_case!($fixture, stateless_resume_after_a_dropped_connection, resume_after_drop, Mode::Stateless);
        e2e_case!($fixture, sessions_foreign_forged_and_garbage_ids_replay_nothing, foreign_ids_yield_nothing, Mode::Sessions);
        e2e_case!($fixture, stateless_forged_and_garbage_ids_replay_nothing, foreign_ids_yield_nothing, Mode::Stateless);
        e2e_case!($fixture, sessions_rmcp_client_completes_while_the_server_closes_streams, rmcp_client_polls_through, Mode::Sessions);
        e2e_case!($fixture, stateless_rmcp_client_completes_while_the_server_closes_streams, rmcp_client_polls_through, Mode::Stateless);
        e2e_case!($fixture, sessions_one_resume_mid_call_streams_the_rest, one_resume_mid_call_streams_the_rest, Mode::Sessions);
        e2e_case!($fixture, stateless_one_resume_mid_call_streams_the_rest, one_resume_mid_call_streams_the_rest, Mode::Stateless);
        e2e_case!($fixture, sessions_rmcp_client_resumes_once_mid_call, rmcp_client_resumes_once_mid_call, Mode::Sessions);
        e2e_case!($fixture, stateless_rmcp_client_resumes_once_mid_call, rmcp_client_resumes_once_mid_call, Mode::Stateless);
    };
    (@restart no $fixture:expr) => {};
    (@restart yes $fixture:expr) => {
        e2e_case!($fixture, sessions_resume_after_the_server_process_restarts, resume_after_restart, Mode::Sessions);
        e2e_case!($fixture, stateless_resume_after_the_server_process_restarts, resume_after_restart, Mode::Stateless);
    };
    (@shared no $fixture:expr) => {};
    (@shared yes $fixture:expr) => {
        e2e_case!($fixture, sessions_stream_begun_on_one_server_resumes_on_another, resume_on_another_instance, Mode::Sessions);
        e2e_case!($fixture, stateless_stream_begun_on_one_server_resumes_on_another, resume_on_another_instance, Mode::Stateless);
        e2e_case!($fixture, sessions_deleted_on_one_server_are_gone_on_every_server, deleted_session_is_gone_everywhere, Mode::Sessions);
        e2e_case!($fixture, sessions_one_resume_on_another_instance_streams_the_rest, one_resume_on_another_instance_streams_the_rest, Mode::Sessions);
        e2e_case!($fixture, stateless_one_resume_on_another_instance_streams_the_rest, one_resume_on_another_instance_streams_the_rest, Mode::Stateless);
        e2e_case!($fixture, sessions_resume_of_a_killed_writers_stream_ends, resume_of_a_killed_writers_stream_ends, Mode::Sessions);
        e2e_case!($fixture, stateless_resume_of_a_killed_writers_stream_ends, resume_of_a_killed_writers_stream_ends, Mode::Stateless);
        across_case!($fixture, round_robin_server_requests_complete, server_requests_complete_behind_a_round_robin_proxy);
        across_case!($fixture, sessions_deleted_on_one_instance_end_at_once_on_another, a_delete_on_one_instance_ends_the_session_on_the_other);
        across_case!($fixture, sessions_are_their_callers_on_every_instance, a_session_is_its_callers_on_every_instance);
        across_case!($fixture, notifications_raised_on_one_instance_reach_every_listener, a_notification_raised_on_one_instance_reaches_listeners_on_every_instance);
        across_case!($fixture, changes_raised_on_one_instance_reach_every_subscription, a_change_raised_on_one_instance_reaches_subscriptions_on_every_instance);
        across_case!($fixture, forged_answers_never_reach_another_session, a_forged_answer_from_another_session_never_reaches_the_waiting_one);
        task_case!($fixture, tasks_created_on_one_server_are_read_on_another, created_on_one_server_read_on_another);
        task_case!($fixture, tasks_input_is_answered_through_another_server, input_answered_on_another_server);
        task_case!($fixture, tasks_cancel_through_another_server_stops_the_work, cancel_on_another_server_stops_the_work);
        task_case!($fixture, tasks_of_a_killed_server_read_failed_elsewhere, killed_server_tasks_read_failed_elsewhere);
        task_case!($fixture, tasks_without_the_extension_nothing_is_stored, without_the_extension_nothing_is_stored);
        task_case!($fixture, tasks_of_another_owner_are_unknown, another_owner_cannot_see_or_touch_a_task);
        task_case!($fixture, takeover_a_killed_servers_task_completes_elsewhere_from_its_checkpoint, killed_server_task_is_taken_over);
        task_case!($fixture, takeover_a_killed_workers_task_completes_on_another_worker, killed_worker_task_is_taken_over);
    };
}

// The memory store: every server opens its own, so only the common cases.
e2e_tests!(
    memory,
    kit = mcp_event_store::testing::bench::MemoryKit,
    restart = no,
    shared = no
);
// Every backend compiled in, with the cases its storage allows.
mcp_event_store::for_each_backend!(e2e_tests);

/// The server process of the `restart` cases: this test binary, re-executed
/// with the server's arguments in [`CHILD_ENV`]. It prints
/// `LISTENING <url>` once it accepts connections, and runs until killed;
/// with `--worker`, it prints `WORKING` and runs tasks until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the server process of the restart cases; they start it with its arguments"]
async fn child_server() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    // The child's log goes to the inherited stderr: errors by default,
    // more with RUST_LOG (say `RUST_LOG=mcp_event_store_rmcp=debug`).
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .try_init();
    let options = server::Options::parse(args.split('\u{1f}').map(str::to_owned))
        .expect("valid server arguments");
    if options.worker {
        println!("WORKING");
        server::work(options, std::future::pending())
            .await
            .expect("the worker runs");
        return;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    println!("LISTENING http://{}/mcp", listener.local_addr().unwrap());
    server::serve(options, listener, std::future::pending())
        .await
        .expect("the server runs");
}

/// The server's retention and session-check options reach the
/// store's options; nonsense is refused with the usage.
#[test]
fn server_options_set_retention_and_session_check() {
    use std::time::Duration;
    let parse = |args: &[&str]| server::Options::parse(args.iter().map(|a| a.to_string()));
    let defaults = parse(&[]).unwrap();
    assert_eq!(
        defaults.store_options().retention,
        mcp_event_store::Retention::default()
    );
    assert_eq!(defaults.session_check, Duration::from_secs(1));
    assert_eq!(
        defaults.follow_hold,
        Some(mcp_event_store::rmcp::DEFAULT_FOLLOW_HOLD)
    );
    assert_eq!(
        parse(&["--follow-hold", "30"]).unwrap().follow_hold,
        Some(Duration::from_secs(30))
    );
    assert_eq!(parse(&["--follow-hold=0"]).unwrap().follow_hold, None);
    assert_eq!(defaults.metrics, None);
    assert_eq!(
        parse(&["--metrics", "127.0.0.1:9100"]).unwrap().metrics,
        Some("127.0.0.1:9100".parse().unwrap())
    );

    let options = parse(&[
        "--max-age",
        "900",
        "--max-events=250",
        "--session-check-ms",
        "0",
    ])
    .unwrap();
    let retention = options.store_options().retention;
    assert_eq!(retention.max_age, Some(Duration::from_secs(900)));
    assert_eq!(retention.max_events_per_stream, Some(250));
    assert_eq!(
        retention.max_bytes_per_stream,
        mcp_event_store::Retention::default().max_bytes_per_stream
    );
    assert_eq!(options.session_check, Duration::ZERO);

    for bad in [
        &["--max-age", "0"][..],
        &["--max-age", "-5"],
        &["--max-events", "x"],
        &["--max-events"],
        &["--session-check-ms", "soon"],
        &["--follow-hold", "-1"],
        &["--metrics", "nowhere"],
    ] {
        let Err(message) = parse(bad) else {
            panic!("{bad:?} accepted");
        };
        // clap's error: what was wrong, naming the option where there is
        // one ("-5" reads as an argument of its own).
        assert!(message.starts_with("error:"), "{bad:?}: {message}");
    }
    assert!(parse(&["--help"]).unwrap_err().contains("--max-age <SECS>"));
}

/// `--task-lease-ms`: the lease of the server's instance
/// (default 30 s); under 3 ms (renewed every third) is refused.
#[test]
fn server_options_set_the_task_lease() {
    use std::time::Duration;
    let parse = |args: &[&str]| server::Options::parse(args.iter().map(|a| a.to_string()));
    assert_eq!(parse(&[]).unwrap().task_lease, Duration::from_secs(30));
    assert_eq!(
        parse(&["--task-lease-ms", "1500"]).unwrap().task_lease,
        Duration::from_millis(1500)
    );
    assert_eq!(
        parse(&["--task-lease-ms=3"]).unwrap().task_lease,
        Duration::from_millis(3)
    );
    for bad in [
        &["--task-lease-ms", "0"][..],
        &["--task-lease-ms", "2"],
        &["--task-lease-ms", "x"],
    ] {
        let message = parse(bad).unwrap_err();
        assert!(message.contains("--task-lease-ms"), "{bad:?}: {message}");
    }
    assert!(
        parse(&["--help"])
            .unwrap_err()
            .contains("--task-lease-ms <MS>")
    );
}

/// The takeover options: `--worker`, `--hand-off`, `--no-takeover`,
/// `--claim-every-ms`, `--max-attempts`; contradictions are refused.
#[test]
fn server_options_set_takeover() {
    use std::time::Duration;
    let parse = |args: &[&str]| server::Options::parse(args.iter().map(|a| a.to_string()));
    let defaults = parse(&[]).unwrap();
    assert!(!defaults.worker && !defaults.hand_off && !defaults.no_takeover);
    assert_eq!(defaults.claim_every, Duration::from_secs(1));
    assert_eq!(defaults.max_attempts, 3);
    let options = parse(&["--worker", "--claim-every-ms=250", "--max-attempts", "5"]).unwrap();
    assert!(options.worker);
    assert_eq!(options.claim_every, Duration::from_millis(250));
    assert_eq!(options.max_attempts, 5);
    assert!(parse(&["--hand-off"]).unwrap().hand_off);
    assert!(parse(&["--no-takeover"]).unwrap().no_takeover);
    for bad in [
        &["--worker", "--hand-off"][..],
        &["--worker", "--no-takeover"],
        &["--hand-off", "--no-takeover"],
        &["--claim-every-ms", "0"],
        &["--max-attempts", "0"],
        &["--max-attempts", "99999999999"],
    ] {
        let message = parse(bad).unwrap_err();
        assert!(
            message.starts_with("error:") && message.contains(bad[0]),
            "{bad:?}: {message}"
        );
    }
    assert!(parse(&["--help"]).unwrap_err().contains("--worker"));
}

/// `--metrics`: the server's Prometheus endpoint reports the store's
/// metrics, labelled with the backend, once the server has served a call.
/// (The only test here that installs the process's metrics recorder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_reports_the_store() {
    let handle = server::install_metrics().expect("the first recorder of this process");
    let mcp = harness::Server::start("memory://", Mode::Sessions, None).await;
    let mut client = wire::Client::new(&mcp.url);
    client.initialize().await;
    let events = client.call_slow_count(2, 3, 1).await.collect_all().await;
    assert!(events.iter().any(|e| e.is_response_to(2)), "{events:?}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let metrics = tokio::spawn(async move {
        axum::serve(listener, server::metrics_router(handle))
            .await
            .expect("the metrics endpoint runs")
    });
    let response = reqwest::get(&url).await.expect("GET /metrics");
    assert_eq!(response.status(), 200);
    let body = response.text().await.expect("a text body");
    for expected in [
        "mcp_event_store_appends_total{backend=\"memory\",outcome=\"ok\"}",
        "mcp_event_store_append_duration_seconds",
    ] {
        assert!(body.contains(expected), "{expected} missing from:\n{body}");
    }
    metrics.abort();
    mcp.stop().await;
}
