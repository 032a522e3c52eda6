//! The conformance suite: every backend runs every case (contract C1 to C22).
//!
//! Each case is a plain async function taking a [`Harness`]; the
//! [`event_suite!`](crate::event_suite) macro turns them all into
//! one `#[tokio::test]` per case for a given harness. A backend crate (or the
//! facade's `tests/`) implements [`Harness`] once and calls the macro:
//!
//! ```ignore
//! mcp_event_store_conformance::event_suite!(MyHarness::new(), persistent);
//! ```
//!
//! The calling crate needs `tokio` with the `macros` and `rt-multi-thread`
//! features among its dev-dependencies.

mod bus;
mod concurrency;
mod follow;
mod ids;
mod input;
mod inspect;
mod oldest;
mod redeem;
mod replay;
mod restart;
mod retention;
mod rewrite;
mod sessions;
mod sharing;
mod support;

pub use bus::*;
pub use concurrency::*;
pub use follow::*;
pub use ids::*;
pub use input::*;
pub use inspect::*;
pub use oldest::*;
pub use redeem::*;
pub use replay::*;
pub use restart::*;
pub use retention::*;
pub(crate) use rewrite::flipped;
pub use rewrite::*;
pub use sessions::*;
pub use sharing::*;
pub use support::HOSTILE_STREAM_IDS;
pub(crate) use support::*;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::TryStreamExt;

use mcp_event_store_core::{
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

    /// Whether the backend forgets redemptions (C21) by itself, with a
    /// ttl per key on the database's clock, rather than in
    /// `purge_expired`: the expiry case then does not expect the purge to
    /// count them (the backend crate tests its ttl). `false`, the default,
    /// for backends whose purge removes them.
    fn forgets_redemptions_itself(&self) -> bool {
        false
    }

    /// Removes the storage after the case (by default, nothing to do).
    async fn teardown(self)
    where
        Self: Sized,
    {
    }
}

/// What a persistent backend adds so the suite can restart it (C10) and
/// age its format (C12): the `persistent` cases need it.
#[async_trait]
pub trait PersistentHarness: Harness {
    /// Where this harness's storage is, as text another process can
    /// [`attach`](Self::attach) to (a file path, a URL and a schema).
    fn locator(&self) -> String;

    /// A harness on the storage `locator` names, in this or another
    /// process. It does not own that storage: its teardown removes nothing.
    async fn attach(locator: &str) -> Self
    where
        Self: Sized;

    /// Opens a handle like [`Harness::open`], but returns the error
    /// instead of panicking.
    async fn try_open(&self, options: StoreOptions) -> Result<Self::Store>;

    /// The storage format version this release writes (the backend crate's
    /// `FORMAT_VERSION`).
    fn format_version(&self) -> u64;

    /// Records `version` as the format of this harness's storage, exactly
    /// where a release writing that version would (a migration row, a
    /// metadata key), with no handle open.
    async fn set_format_version(&self, version: u64);

    /// Every byte this harness's storage holds, as the database keeps it
    /// while handles are open: its files, or its rows as text, or its keys
    /// and values. What a dump of the store would hand out (C20). Values
    /// may come in any encoding the database shows them in, hex included.
    async fn stored_bytes(&self) -> Vec<u8>;
}

/// Private test storage that `connect` opens by URL, whatever the backend:
/// what the tests that go through the front door (end-to-end servers,
/// benches) are given, one per compiled-in backend, by the facade's
/// `testing::storages()`.
///
/// Every backend crate's harness implements it.
#[async_trait]
pub trait UrlHarness: Send + Sync + 'static {
    /// A URL that `connect` opens on this storage, with the backend's own
    /// parameters (`?schema=`, `?prefix=`) saying where.
    fn url(&self) -> String;

    /// Whether several processes may use the storage at once (C11); `false`
    /// for a backend limited to one process.
    fn shared_across_processes(&self) -> bool {
        true
    }

    /// Removes the storage (a dropped harness removes it too, best effort).
    async fn remove(self: Box<Self>);
}

/// The harness for [`MemoryStore`](mcp_event_store_core::MemoryStore): every `open` hands
/// out a new handle on one shared set of data.
#[derive(Debug, Default)]
pub struct MemoryHarness {
    store: std::sync::Mutex<Option<mcp_event_store_core::MemoryStore>>,
}

impl MemoryHarness {
    /// A harness with no store yet, as an async constructor for the macro.
    pub async fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    type Store = mcp_event_store_core::MemoryStore;

    async fn open(&self, options: StoreOptions) -> mcp_event_store_core::MemoryStore {
        let mut shared = self
            .store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*shared {
            Some(store) => store
                .share_with_options(options)
                .expect("valid test options"),
            None => shared
                .insert(mcp_event_store_core::MemoryStore::with_options(options))
                .clone(),
        }
    }
}

/// Generates one `#[tokio::test]` per conformance case for a harness.
///
/// `$harness` is an expression evaluating to a future of the harness (an
/// `async` constructor call), evaluated afresh for each case. Add
/// `persistent` for stores that survive a reopen (the harness then also
/// implements [`PersistentHarness`]), to run the restart and format cases
/// (C10, C12) too.
///
/// Each file of cases registers its own cases beside their code, and a
/// test of this crate fails if a case is written but not registered.
#[macro_export]
macro_rules! event_suite {
    ($harness:expr) => {
        $crate::__conformance_replay!($harness);
        $crate::__conformance_ids!($harness);
        $crate::__conformance_input!($harness);
        $crate::__conformance_concurrency!($harness);
        $crate::__conformance_retention!($harness);
        $crate::__conformance_sessions!($harness);
        $crate::__conformance_sharing!($harness);
        $crate::__conformance_follow!($harness);
        $crate::__conformance_inspect!($harness);
        $crate::__conformance_oldest!($harness);
        $crate::__conformance_bus!($harness);
        $crate::__conformance_redeem!($harness);
        $crate::__conformance_rewrite!($harness);
    };
    ($harness:expr, persistent) => {
        $crate::event_suite!($harness);
        $crate::__conformance_restart!($harness);
        $crate::__conformance_redeem_persistent!($harness);
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
                $crate::events::$case(&harness).await;
                $crate::events::Harness::teardown(harness).await;
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

#[cfg(test)]
mod registration {
    //! Every case a file defines is registered by that file's macro, and
    //! every file's macro is part of `event_suite!`.

    #[test]
    fn every_case_is_registered_and_every_file_runs() {
        crate::registration::Suite {
            name: "event_suite",
            module: include_str!("mod.rs"),
            file_macro: "__conformance_",
            files: &[
                ("replay", include_str!("replay.rs")),
                ("ids", include_str!("ids.rs")),
                ("input", include_str!("input.rs")),
                ("concurrency", include_str!("concurrency.rs")),
                ("retention", include_str!("retention.rs")),
                ("sessions", include_str!("sessions.rs")),
                ("rewrite", include_str!("rewrite.rs")),
                ("sharing", include_str!("sharing.rs")),
                ("restart", include_str!("restart.rs")),
                ("follow", include_str!("follow.rs")),
                ("inspect", include_str!("inspect.rs")),
                ("oldest", include_str!("oldest.rs")),
                ("bus", include_str!("bus.rs")),
                ("redeem", include_str!("redeem.rs")),
            ],
            dir: "events",
        }
        .check();
    }
}
