//! The conformance suite: every backend runs every case (contract C1 to C14).
//!
//! Each case is a plain async function taking a [`Harness`]; the
//! [`conformance_tests!`](crate::conformance_tests) macro turns them all into
//! one `#[tokio::test]` per case for a given harness. A backend crate (or the
//! facade's `tests/`) implements [`Harness`] once and calls the macro:
//!
//! ```ignore
//! mcp_event_store_core::conformance_tests!(MyHarness::new(), persistent);
//! ```
//!
//! The calling crate needs `tokio` with the `macros` and `rt-multi-thread`
//! features among its dev-dependencies.

mod cases;
mod follow;
mod inspect;

pub use cases::*;
pub use follow::*;
pub use inspect::*;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::TryStreamExt;

use crate::{
    Error, EventId, EventStore, ManualClock, NewEvent, Result, Retention, SessionStore,
    StoreOptions, StoredEvent,
};

/// What a backend provides so the suite can run against it.
///
/// A harness owns one isolated piece of storage (a temporary directory, a
/// schema, a key prefix); every [`open`](Harness::open) gives a new handle on
/// that same storage, so the suite can check sharing (C11) and reopening (C10).
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type Store: EventStore + SessionStore;

    /// Opens a handle on this harness's storage with these options.
    async fn open(&self, options: StoreOptions) -> Self::Store;

    /// Closes a handle, releasing what it holds (by default, drops it).
    async fn close(&self, store: Self::Store) {
        drop(store);
    }

    /// Makes the backend lose every stored byte of this harness's storage
    /// while the open handles stay open, as a Redis without persistence does
    /// when it restarts (C14). Returns `false`, the default, for backends
    /// whose data cannot vanish underneath open handles (a database file, a
    /// schema): C14 then holds because the secret cannot be lost without the
    /// events, and the case has nothing to check.
    async fn lose_data(&self) -> bool {
        false
    }

    /// Removes the storage after the case (by default, nothing to do).
    async fn teardown(self)
    where
        Self: Sized,
    {
    }
}

/// The harness for [`MemoryStore`](crate::MemoryStore): every `open` hands
/// out a new handle on one shared set of data.
#[derive(Debug, Default)]
pub struct MemoryHarness {
    store: std::sync::Mutex<Option<crate::MemoryStore>>,
}

impl MemoryHarness {
    /// A harness with no store yet, as an async constructor for the macro.
    pub async fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    type Store = crate::MemoryStore;

    async fn open(&self, options: StoreOptions) -> crate::MemoryStore {
        let mut shared = self
            .store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*shared {
            Some(store) => store
                .share_with_options(options)
                .expect("valid test options"),
            None => shared
                .insert(crate::MemoryStore::with_options(options))
                .clone(),
        }
    }
}

/// Generates one `#[tokio::test]` per conformance case for a harness.
///
/// `$harness` is an expression evaluating to a future of the harness (an
/// `async` constructor call), evaluated afresh for each case. Add
/// `persistent` for stores that survive a reopen, to run those cases too.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            round_trip, replay_preserves_order, replay_is_strictly_after,
            replay_after_the_newest_event_is_empty, priming_event_keeps_its_retry_hint,
            retry_hint_round_trips_with_data, streams_are_isolated,
            ids_are_unique_across_streams, ids_are_sse_safe_and_bounded,
            ids_increase_within_a_stream, unknown_well_formed_id_is_refused,
            position_never_issued_is_refused, truncated_ids_never_reach_another_stream,
            extended_ids_never_reach_another_stream, ids_from_another_store_are_refused,
            ids_forged_from_another_streams_id_are_refused, garbage_ids_are_refused,
            lookup_finds_the_stream, hostile_stream_ids_are_data,
            like_wildcards_match_nothing_else, nul_in_a_stream_id_is_data_or_refused,
            positions_with_a_zero_part_are_refused,
            positions_never_issued_between_real_ones_are_refused,
            deleted_stream_started_again_never_reissues_ids,
            expired_stream_started_again_never_reissues_ids,
            handles_converge_after_the_backend_lost_its_data,
            stream_id_of_1024_bytes_is_accepted,
            stream_id_of_1025_bytes_is_refused, empty_stream_id_is_refused,
            empty_payload_round_trips, megabyte_payload_round_trips,
            payload_over_the_limit_is_refused, binary_payloads_round_trip,
            many_streams_stay_separate, concurrent_appends_to_one_stream_never_open_a_gap,
            concurrent_appends_to_many_streams, retention_by_age,
            stream_expires_entirely_by_age, retention_by_count, retention_by_bytes,
            newest_event_survives_the_byte_limit, delete_stream_removes_only_that_stream,
            delete_unknown_stream_removes_nothing, purge_with_nothing_expired_removes_nothing,
            replay_pages_through_long_streams, session_round_trip, session_expires,
            session_ids_are_data, two_handles_share_events,
            follow_yields_the_stored_rest_then_live_events,
            follow_from_the_newest_event_waits_for_the_next,
            follow_delivers_appends_from_another_handle,
            follow_under_concurrent_appends_has_no_gap_and_no_duplicate,
            dropped_follow_releases_everything, follow_ends_after_its_maximum_hold,
            follow_never_yields_another_streams_events,
            retention_overtaking_a_follower_is_events_purged,
            follow_of_an_unknown_id_is_refused,
            stats_count_streams_events_and_bytes,
            list_streams_pages_through_every_stream_once, list_streams_refuses_a_zero_limit,
            deleted_streams_leave_stats_and_listing, check_reports_backend_format_and_settings,
            operations_are_counted_in_metrics
        );
    };
    ($harness:expr, persistent) => {
        $crate::conformance_tests!($harness);
        $crate::__conformance_cases!($harness;
            reopen_replays_everything_acknowledged, reopen_continues_each_stream,
            reopen_keeps_sessions, reopen_never_reissues_ids_of_a_deleted_stream
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::conformance::$case(&harness).await;
                $crate::conformance::Harness::teardown(harness).await;
            }
        )*
    };
}

/// The metrics the suite's recorder has seen so far: counters and gauges
/// as their running totals, histograms as how many values they recorded.
static RECORDED: std::sync::Mutex<Option<HashMap<MetricKey, f64>>> = std::sync::Mutex::new(None);
static SNAPSHOTTER: std::sync::OnceLock<Option<metrics_util::debugging::Snapshotter>> =
    std::sync::OnceLock::new();

/// A metric's name and labels, sorted.
type MetricKey = (String, Vec<(String, String)>);

/// Installs the suite's metrics recorder as the process's global recorder,
/// once; later calls do nothing. The metrics case needs it: a test binary
/// running the suite must not install another recorder.
pub fn install_test_recorder() {
    SNAPSHOTTER.get_or_init(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().ok().map(|()| snapshotter)
    });
}

/// The value the recorder holds for metric `name`, summed over every label
/// set that includes `labels`: a counter's or gauge's total, or the number
/// of values a histogram recorded. Zero before anything was recorded.
///
/// # Panics
///
/// If another recorder was installed before [`install_test_recorder`].
pub fn recorded_metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    use metrics_util::debugging::DebugValue;
    let snapshotter = SNAPSHOTTER
        .get()
        .and_then(Option::as_ref)
        .expect("install_test_recorder first (and no other recorder)");
    // Snapshots drain the recorder, so they are folded into running totals
    // under one lock: concurrent cases each see every update.
    let mut recorded = RECORDED.lock().unwrap_or_else(|p| p.into_inner());
    let totals = recorded.get_or_insert_with(HashMap::new);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut key_labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        key_labels.sort();
        let total = totals
            .entry((key.name().to_owned(), key_labels))
            .or_insert(0.0);
        *total += match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(v) => v.into_inner(),
            DebugValue::Histogram(values) => values.len() as f64,
        };
    }
    totals
        .iter()
        .filter(|((n, l), _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| *v)
        .sum()
}

/// The options most cases use: no retention, a clock under test control.
pub fn test_options(clock: &Arc<ManualClock>) -> StoreOptions {
    StoreOptions::default()
        .retention(Retention::unbounded())
        .clock(clock.clone())
}

/// A manual clock set to the real current time, so stored timestamps are
/// plausible for backends that also look at real time.
pub fn test_clock() -> Arc<ManualClock> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Arc::new(ManualClock::new(now))
}

/// Opens a store with [`test_options`] and returns it with its clock.
pub async fn open_default<H: Harness>(harness: &H) -> (H::Store, Arc<ManualClock>) {
    let clock = test_clock();
    (harness.open(test_options(&clock)).await, clock)
}

/// Appends and unwraps, with a message naming the stream.
pub async fn append<S: EventStore + ?Sized>(store: &S, stream_id: &str, data: &[u8]) -> EventId {
    store
        .store_event(stream_id, NewEvent::new(data))
        .await
        .unwrap_or_else(|e| panic!("store_event({stream_id:?}) failed: {e}"))
}

/// Replays after `id` and collects everything, or the first error.
pub async fn replay_all<S: EventStore + ?Sized>(
    store: &S,
    id: &str,
) -> Result<(String, Vec<StoredEvent>)> {
    let replay = store.replay_events_after(id).await?;
    let events = replay.events.try_collect().await?;
    Ok((replay.stream_id, events))
}

/// Replays after `id`, expecting success, and returns the payloads.
pub async fn replay_data<S: EventStore + ?Sized>(store: &S, id: &EventId) -> Vec<Vec<u8>> {
    let (_, events) = replay_all(store, &id.to_string())
        .await
        .unwrap_or_else(|e| panic!("replay after {id} failed: {e}"));
    events.into_iter().map(|e| e.data.to_vec()).collect()
}

/// Asserts that replay after `id` fails as unknown and lookup gives `None`.
pub async fn assert_unknown<S: EventStore + ?Sized>(store: &S, id: &str) {
    match replay_all(store, id).await {
        Err(Error::UnknownEventId { .. }) => {}
        Err(other) => panic!("replay after {id:?}: expected UnknownEventId, got {other}"),
        Ok((stream, events)) => panic!(
            "replay after {id:?}: expected UnknownEventId, got {} events of {stream:?}",
            events.len()
        ),
    }
    let found = store
        .get_stream_id_for_event_id(id)
        .await
        .unwrap_or_else(|e| panic!("lookup of {id:?} failed: {e}"));
    assert_eq!(found, None, "lookup of {id:?} should find nothing");
}

/// Asserts that replay after `id` fails with `EventsPurged`.
pub async fn assert_purged<S: EventStore + ?Sized>(store: &S, id: &EventId) {
    match replay_all(store, &id.to_string()).await {
        Err(Error::EventsPurged { .. }) => {}
        Err(other) => panic!("replay after {id}: expected EventsPurged, got {other}"),
        Ok((_, events)) => panic!(
            "replay after {id}: expected EventsPurged, got a partial replay of {} events",
            events.len()
        ),
    }
}

/// A short pause for cases that poll.
pub(crate) async fn tick() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}
