//! The metrics every store records, and their names.
//!
//! Every store wraps its appends, replays, follows, purges and redemptions
//! in the same spans and metrics, and counts the task operations an
//! operator watches (created, claimed, fenced, inputs, finished) (tracing spans `mcp_event_store.append`,
//! `mcp_event_store.replay`, `mcp_event_store.purge` and
//! `mcp_event_store.redeem`).
//!
//! # Metrics
//!
//! Through the [`metrics`] facade: the application installs the exporter it
//! wants (Prometheus, StatsD, ...). With none installed (and no `tracing`
//! subscriber), the span and metrics around one append cost about 180 ns
//! (the `append/observe` bench). Every metric carries a `backend` label
//! (`memory`, `sqlite`, `postgres`, `redis`, `sled`).
//!
//! | name | kind | unit | labels | what |
//! |---|---|---|---|---|
//! | `mcp_event_store_appends_total` | counter | appends | `outcome` (`ok`, `error`) | `store_event` calls |
//! | `mcp_event_store_append_duration_seconds` | histogram | seconds | | `store_event` latency, durable under the store's setting |
//! | `mcp_event_store_append_batch_size` | histogram | events | | events committed together, where the backend groups appends (SQLite, PostgreSQL, sled) |
//! | `mcp_event_store_replays_total` | counter | replays | `outcome` (`ok`, `refused`) | replays opened (a follow's re-reads count too) |
//! | `mcp_event_store_replay_open_duration_seconds` | histogram | seconds | | time to open a replay (cursor checks, first read) |
//! | `mcp_event_store_replayed_events_total` | counter | events | | events yielded by replays |
//! | `mcp_event_store_follows_active` | gauge | follows | | follows open now |
//! | `mcp_event_store_follow_delivery_seconds` | histogram | seconds | | from a follower's wake-up to the event in its hands |
//! | `mcp_event_store_purges_total` | counter | purges | `outcome` | `purge_expired` runs |
//! | `mcp_event_store_purge_duration_seconds` | histogram | seconds | | `purge_expired` duration |
//! | `mcp_event_store_purged_events_total` | counter | events | | events removed by purges |
//! | `mcp_event_store_purged_streams_total` | counter | streams | | streams removed whole by purges |
//! | `mcp_event_store_purged_redemptions_total` | counter | redemptions | | redemption records past their expiry removed by purges (C21; backends with a ttl per key forget them by themselves) |
//! | `mcp_event_store_redemptions_total` | counter | redemptions | `outcome` (`redeemed`, `already_redeemed`, `expired`, `error`) | `redeem` calls (C21) |
//! | `mcp_event_store_redeem_duration_seconds` | histogram | seconds | | `redeem` latency, durable under the store's setting |
//! | `mcp_event_store_errors_total` | counter | errors | `operation`, `kind` ([`Error::kind`](crate::Error::kind)) | failed appends, replays, purges and redemptions |
//! | `mcp_event_store_tasks_created_total` | counter | tasks | `mode` (`held`: run by its creator; `queued`: waits for a claim) | tasks created |
//! | `mcp_event_store_task_claims_total` | counter | claims | | tasks claimed by an instance or worker (T17): queued, released by their worker, or taken over after their instance lapsed |
//! | `mcp_event_store_task_fenced_writes_total` | counter | writes | | a worker's writes refused under a stale claim (T18) |
//! | `mcp_event_store_task_inputs_requested_total` | counter | inputs | | input requests written by workers (T5; a replacement counts each request it writes) |
//! | `mcp_event_store_task_inputs_taken_total` | counter | inputs | | answers taken by workers (each answer once) |
//! | `mcp_event_store_tasks_finished_total` | counter | tasks | `status` (`completed`, `failed`, `cancelled`) | tasks a worker finished |
//! | `mcp_event_store_tasks_exhausted_total` | counter | tasks | | tasks created to be taken over whose last run's instance lapsed, persisted `failed` by a purge (T16) |
//! | `mcp_event_store_task_takeover_delay_seconds` | histogram | seconds | | from a task's instance lapsing to the claim that took it over (T16, the store's clock) |
//! | `mcp_event_store_tasks_requeued_total` | counter | tasks | | failed tasks an operator requeued (T23) |
//! | `mcp_event_store_task_run_duration_seconds` | histogram | seconds | `outcome` (`completed`, `failed`, `cancelled`, `input_required`, `stopped`) | one run of a task driven by the runtime (`TaskRun::drive`), from its start to its end; `stopped`: it lost its claim or its instance stopped it (no `backend` label: the runtime's) |
//! | `mcp_event_store_tasks` | gauge | tasks | `status` | the store's tasks by status as read, counted by the runtime when asked (`RuntimeBuilder::count_tasks_every`, off by default: each count reads every task; no `backend` label) |

/// The metric names, as the table above lists them.
pub mod names {
    /// `store_event` calls, by `outcome`.
    pub const APPENDS_TOTAL: &str = "mcp_event_store_appends_total";
    /// `store_event` latency in seconds.
    pub const APPEND_DURATION_SECONDS: &str = "mcp_event_store_append_duration_seconds";
    /// Events committed together.
    pub const APPEND_BATCH_SIZE: &str = "mcp_event_store_append_batch_size";
    /// Replays opened, by `outcome`.
    pub const REPLAYS_TOTAL: &str = "mcp_event_store_replays_total";
    /// Time to open a replay, in seconds.
    pub const REPLAY_OPEN_DURATION_SECONDS: &str = "mcp_event_store_replay_open_duration_seconds";
    /// Events yielded by replays.
    pub const REPLAYED_EVENTS_TOTAL: &str = "mcp_event_store_replayed_events_total";
    /// Follows open now.
    pub const FOLLOWS_ACTIVE: &str = "mcp_event_store_follows_active";
    /// From a follower's wake-up to the event in its hands, in seconds.
    pub const FOLLOW_DELIVERY_SECONDS: &str = "mcp_event_store_follow_delivery_seconds";
    /// `purge_expired` runs, by `outcome`.
    pub const PURGES_TOTAL: &str = "mcp_event_store_purges_total";
    /// `purge_expired` duration in seconds.
    pub const PURGE_DURATION_SECONDS: &str = "mcp_event_store_purge_duration_seconds";
    /// Events removed by purges.
    pub const PURGED_EVENTS_TOTAL: &str = "mcp_event_store_purged_events_total";
    /// Streams removed whole by purges.
    pub const PURGED_STREAMS_TOTAL: &str = "mcp_event_store_purged_streams_total";
    /// Redemption records removed by purges (C21).
    pub const PURGED_REDEMPTIONS_TOTAL: &str = "mcp_event_store_purged_redemptions_total";
    /// `redeem` calls, by `outcome` (C21).
    pub const REDEMPTIONS_TOTAL: &str = "mcp_event_store_redemptions_total";
    /// `redeem` latency in seconds (C21).
    pub const REDEEM_DURATION_SECONDS: &str = "mcp_event_store_redeem_duration_seconds";
    /// Failed operations, by `operation` and `kind`.
    pub const ERRORS_TOTAL: &str = "mcp_event_store_errors_total";
    /// Tasks created, by `mode` (`held`, `queued`).
    pub const TASKS_CREATED_TOTAL: &str = "mcp_event_store_tasks_created_total";
    /// Tasks claimed (T17).
    pub const TASK_CLAIMS_TOTAL: &str = "mcp_event_store_task_claims_total";
    /// Workers' writes refused under a stale claim (T18).
    pub const TASK_FENCED_WRITES_TOTAL: &str = "mcp_event_store_task_fenced_writes_total";
    /// Input requests written by workers (T5).
    pub const TASK_INPUTS_REQUESTED_TOTAL: &str = "mcp_event_store_task_inputs_requested_total";
    /// Answers taken by workers (T5).
    pub const TASK_INPUTS_TAKEN_TOTAL: &str = "mcp_event_store_task_inputs_taken_total";
    /// Tasks a worker finished, by `status`.
    pub const TASKS_FINISHED_TOTAL: &str = "mcp_event_store_tasks_finished_total";
    /// Tasks whose last run's instance lapsed, persisted by a purge (T16).
    pub const TASKS_EXHAUSTED_TOTAL: &str = "mcp_event_store_tasks_exhausted_total";
    /// From an instance's lapse to the claim that took its task over, in
    /// seconds (T16).
    pub const TASK_TAKEOVER_DELAY_SECONDS: &str = "mcp_event_store_task_takeover_delay_seconds";
    /// Failed tasks an operator requeued (T23).
    pub const TASKS_REQUEUED_TOTAL: &str = "mcp_event_store_tasks_requeued_total";
    /// One run of a task, in seconds, by `outcome` (the runtime's).
    pub const TASK_RUN_DURATION_SECONDS: &str = "mcp_event_store_task_run_duration_seconds";
    /// The store's tasks by `status`, as the runtime last counted them.
    pub const TASKS: &str = "mcp_event_store_tasks";
}
