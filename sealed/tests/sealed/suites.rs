//! The event and task suites through the decorator, on the memory store
//! and on every backend compiled into the facade (SQLite, a file in a
//! temporary directory, by default), with the restart, SIGKILL and format
//! cases where the backend's storage allows them.
//!
//! Every case runs but those that assert a byte count the envelope
//! changes by design ([`EXCLUDED`]); `limits.rs` and `values.rs` check the
//! same clauses with the envelope counted. A check below keeps the lists
//! here equal to the suite's registrations, so a case added to the suite
//! fails here until it is listed.

/// The cases left out, and why.
const EXCLUDED: &[(&str, &str)] = &[
    // C15: stats and listings count stored bytes, each event's data plus
    // OVERHEAD (limits.rs: sizes_and_the_byte_limit_count_sealed_bytes).
    ("stats_count_streams_events_and_bytes", "stored bytes"),
    (
        "list_streams_pages_through_every_stream_once",
        "stored bytes",
    ),
    ("deleted_streams_leave_stats_and_listing", "stored bytes"),
    // C8: the byte limit counts stored bytes (same case).
    ("retention_by_bytes", "stored bytes"),
    ("byte_limit_is_exact_when_first_crossed", "stored bytes"),
    // C20: its dump must show a session's state in plaintext first, to
    // prove it would see an id beside it; sealed, it shows none.
    ("no_stored_byte_names_a_live_session", "state is sealed"),
    // T7, T13, T19: context, input and checkpoint limits are fixed in
    // core and hold for the sealed value: through the decorator each is
    // OVERHEAD less (limits.rs: task_limits_are_the_fixed_limits_less_the_envelope;
    // values.rs: context_and_checkpoint_keep_their_bytes_across_a_takeover).
    (
        "payloads_at_the_limit_are_accepted_one_more_is_refused",
        "fixed limits",
    ),
    ("context_is_kept_with_the_task", "fixed limits"),
    ("a_checkpoint_survives_a_takeover", "fixed limits"),
];

/// The event cases of every harness.
macro_rules! event_cases {
    ($harness:expr) => {
        mcp_event_store_conformance::__conformance_replay!($harness);
        mcp_event_store_conformance::__conformance_ids!($harness);
        mcp_event_store_conformance::__conformance_input!($harness);
        mcp_event_store_conformance::__conformance_concurrency!($harness);
        mcp_event_store_conformance::__conformance_sessions!($harness);
        mcp_event_store_conformance::__conformance_sharing!($harness);
        mcp_event_store_conformance::__conformance_follow!($harness);
        mcp_event_store_conformance::__conformance_oldest!($harness);
        mcp_event_store_conformance::__conformance_bus!($harness);
        mcp_event_store_conformance::__conformance_redeem!($harness);
        mcp_event_store_conformance::__conformance_rewrite!($harness);
        mcp_event_store_conformance::__conformance_cases!($harness;
            // retention.rs
            handle_reports_its_retention,
            retention_by_age,
            stream_expires_entirely_by_age,
            retention_by_count,
            age_limit_after_count_trims,
            newest_event_survives_the_byte_limit,
            delete_stream_removes_only_that_stream,
            delete_stream_removes_a_long_stream_whole,
            delete_unknown_stream_removes_nothing,
            purge_with_nothing_expired_removes_nothing,
            // inspect.rs
            list_streams_refuses_a_zero_limit,
            check_reports_backend_format_and_settings,
            operations_are_counted_in_metrics,
        );
    };
}

/// The restart, SIGKILL and format cases of a persistent harness.
macro_rules! restart_cases {
    ($harness:expr) => {
        mcp_event_store_conformance::__conformance_cases!($harness;
            // restart.rs
            newer_format_is_refused_and_changes_nothing,
            reopen_replays_everything_acknowledged,
            reopen_continues_each_stream,
            reopen_keeps_sessions,
            reopen_never_reissues_ids_of_a_deleted_stream,
            reopen_with_a_lower_count_limit_trims_long_streams,
        );
        mcp_event_store_conformance::__conformance_redeem_persistent!($harness);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn acknowledged_events_survive_sigkill() {
            let harness = $harness.await;
            mcp_event_store_conformance::events::acknowledged_events_survive_sigkill(
                &harness,
                module_path!(),
            )
            .await;
            mcp_event_store_conformance::events::Harness::teardown(harness).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "the child process of acknowledged_events_survive_sigkill"]
        async fn sigkill_child_appender() {
            mcp_event_store_conformance::events::sigkill_child_appender(|| $harness).await;
        }
    };
}

/// The task cases of every harness.
macro_rules! task_cases {
    ($harness:expr) => {
        mcp_event_store_conformance::__task_cases_identity!($harness);
        mcp_event_store_conformance::__task_cases_states!($harness);
        mcp_event_store_conformance::__task_cases_input!($harness);
        mcp_event_store_conformance::__task_cases_cancel!($harness);
        mcp_event_store_conformance::__task_cases_expiry!($harness);
        mcp_event_store_conformance::__task_cases_watch!($harness);
        mcp_event_store_conformance::__task_cases_instances!($harness);
        mcp_event_store_conformance::__task_cases_rewrite!($harness);
        mcp_event_store_conformance::__task_cases_metrics!($harness);
        mcp_event_store_conformance::__task_cases_operators!($harness);
        mcp_event_store_conformance::__task_conformance_cases!($harness;
            // limits.rs
            hostile_payloads_and_keys_round_trip,
            // runtime.rs
            view_reads_any_owner_with_every_answer,
            replacing_inputs_supersedes_and_carries_forward,
            racing_replacements_admit_each_key_once,
            // takeover.rs
            exactly_one_of_racing_instances_claims_a_task,
            a_claim_racing_creates_loses_no_task,
            a_stale_claim_is_fenced,
            runs_are_bounded,
            cancel_requested_during_a_takeover_is_honoured,
            an_input_answered_while_nobody_holds_the_task_resumes_it,
            a_queued_task_waits_for_a_claim,
            only_waiting_tasks_are_claimed_and_only_by_the_living,
            a_claim_takes_at_most_its_limit,
        );
    };
}

mod memory {
    use crate::harness::SealedHarness;
    use mcp_event_store_conformance::MemoryHarness;

    event_cases!(SealedHarness::new(MemoryHarness::new()));

    mod tasks {
        use crate::harness::SealedHarness;
        use mcp_event_store_conformance::MemoryHarness;

        task_cases!(SealedHarness::new(MemoryHarness::new()));
    }
}

/// The suites on every backend compiled into the facade (its default,
/// SQLite, alone under `cargo test -p mcp-event-store-sealed`; every
/// backend with the facade's `full`), with the restart, SIGKILL and
/// format cases where its storage allows a new process to open it.
macro_rules! backend_suites {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        mod $backend {
            use crate::harness::SealedHarness;
            use mcp_event_store::testing::bench::Kit;

            event_cases!(SealedHarness::new(<$kit as Kit>::harness()));
            backend_suites!(@events $restart, $kit);

            mod tasks {
                use crate::harness::SealedHarness;
                use mcp_event_store::testing::bench::Kit;

                task_cases!(SealedHarness::new(<$kit as Kit>::task_harness()));
                backend_suites!(@tasks $restart, $kit);
            }
        }
    };
    (@events yes, $kit:path) => {
        restart_cases!(SealedHarness::new(<$kit as Kit>::harness()));
    };
    (@tasks yes, $kit:path) => {
        mcp_event_store_conformance::__task_cases_persistent!(SealedHarness::new(
            <$kit as Kit>::task_harness()
        ));
    };
    (@$suite:ident no, $kit:path) => {};
}

mcp_event_store::for_each_backend!(backend_suites);

/// The files split above, each with the cases it registers with the
/// suite: every one is run here or [`EXCLUDED`], none both.
#[test]
fn every_case_of_the_split_files_runs_or_is_excluded_for_a_reason() {
    let this = include_str!("suites.rs");
    let files = [
        include_str!("../../../conformance/src/events/retention.rs"),
        include_str!("../../../conformance/src/events/inspect.rs"),
        include_str!("../../../conformance/src/events/restart.rs"),
        include_str!("../../../conformance/src/tasks/limits.rs"),
        include_str!("../../../conformance/src/tasks/runtime.rs"),
        include_str!("../../../conformance/src/tasks/takeover.rs"),
    ];
    let run = |case: &str| this.matches(&format!("            {case},\n")).count();
    for file in files {
        let start = file.find("_cases!($harness;").expect("a registration");
        let end = start + file[start..].find(");").expect("its end");
        for case in file[start..end]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| w.len() > 8 && w.contains('_') && !w.ends_with("_cases"))
        {
            let excluded = EXCLUDED.iter().any(|(name, _)| *name == case);
            assert_eq!(
                run(case) + usize::from(excluded),
                1,
                "{case}: run it here (or exclude it, saying why), once"
            );
        }
    }
}

/// Every file the suites run is run here: whole, through its macro, or
/// split above, case by case.
#[test]
fn every_file_of_the_suites_runs_here() {
    let this = include_str!("suites.rs");
    let split = [
        "retention",
        "inspect",
        "restart",
        "limits",
        "runtime",
        "takeover",
    ];
    for (suite, module, prefix) in [
        (
            "event_suite",
            include_str!("../../../conformance/src/events/mod.rs"),
            "__conformance_",
        ),
        (
            "task_suite",
            include_str!("../../../conformance/src/tasks/mod.rs"),
            "__task_cases_",
        ),
    ] {
        let start = module
            .find(&format!("macro_rules! {suite}"))
            .expect("the suite's macro");
        let end = start + module[start..].find("\n}").expect("its end");
        for file in module[start..end]
            .split(&format!("$crate::{prefix}"))
            .skip(1)
            .filter_map(|rest| rest.split('!').next())
        {
            let whole = this.contains(&format!("{prefix}{file}!("));
            assert!(
                whole || split.contains(&file),
                "{suite}'s {file}.rs does not run through the decorator"
            );
        }
    }
}
