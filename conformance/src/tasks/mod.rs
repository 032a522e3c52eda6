//! The task conformance suite: every backend's task store
//! ([`TaskStore`](mcp_event_store_core::task::TaskStore) and
//! [`RuntimeStore`]) runs every case (contract T1 to T23), a file per
//! clause group; a persistent store
//! also runs the reopen, SIGKILL and newer-format cases
//! ([`PersistentTaskHarness`]).
//!
//! As with the event suite ([`crate::events`]), each case is a plain
//! async function over a [`TaskHarness`], and
//! [`task_suite!`](crate::task_suite) turns them into
//! one `#[tokio::test]` per case:
//!
//! ```ignore
//! mcp_event_store_conformance::task_suite!(MyTaskHarness::new());
//! ```
//!
//! The cases run on [`ManualClock`](mcp_event_store_core::ManualClock)s
//! and assume the store's
//! [`TaskOptions`](mcp_event_store_core::task::TaskOptions) are the defaults. None asserts a latency: a
//! wake-up case watches through a handle that re-reads only when woken
//! ([`TaskHarness::open_without_recheck`]) with a `max_wait` of an hour,
//! so a lost wake-up fails it at a generous deadline while a working one
//! passes on any machine, however loaded.

mod cancel;
mod expiry;
mod identity;
mod input;
mod instances;
mod limits;
mod metrics;
mod operators;
mod persistent;
mod rewrite;
mod runtime;
mod states;
mod support;
mod takeover;
mod watch;

pub use cancel::*;
pub use expiry::*;
pub use identity::*;
pub use input::*;
pub use instances::*;
pub use limits::*;
pub use metrics::*;
pub use operators::*;
pub use persistent::*;
pub use rewrite::*;
pub use runtime::*;
pub use states::*;
pub use takeover::*;
pub use watch::*;

use std::time::Duration;

use async_trait::async_trait;
use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::rewrite::RewriteStore;
use mcp_event_store_core::task::{MemoryTaskStore, RuntimeStore};

use crate::events::PersistentHarness;

/// What a backend provides so the task suite can run against it.
///
/// A harness owns one isolated piece of storage; every
/// [`open`](TaskHarness::open) gives a new handle on that same storage, so
/// the suite can check sharing (T9) and cross-handle wake-ups (T5, T10).
#[async_trait]
pub trait TaskHarness: Send + Sync + 'static {
    /// The store under test.
    type Store: RuntimeStore;

    /// Opens a handle on this harness's storage with these options (and
    /// its [`TaskOptions`](mcp_event_store_core::task::TaskOptions), `options.tasks`).
    async fn open(&self, options: StoreOptions) -> Self::Store;

    /// Closes a handle, releasing what it holds (by default, drops it).
    async fn close(&self, store: Self::Store) {
        drop(store);
    }

    /// Every row (record, key, entry) the backend holds for this harness's
    /// storage, raw, as an operator's dump would show it; `None` (the
    /// default) if the harness cannot tell, and then the cases that scan
    /// the storage check only what the API shows.
    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        None
    }

    /// Opens a handle like [`open`](TaskHarness::open) whose periodic
    /// re-read of watched tasks (the backend's safety net, such as its
    /// `follow_recheck`) is an hour or more away, so a watch on it returns
    /// before its `max_wait` only when a wake-up reached it. The wake-up
    /// cases (T5, T10) watch through such a handle: a lost notification
    /// then fails them at a generous deadline, while a working one passes
    /// however loaded the machine is. A store with no periodic re-read
    /// opens a plain handle.
    async fn open_without_recheck(&self, options: StoreOptions) -> Self::Store;

    /// The store's values listed and swapped in place (C22): for a store
    /// that is also an event store (every backend's), its
    /// [`EventStore::rewriter`](mcp_event_store_core::EventStore::rewriter);
    /// `None` only for a store that keeps tasks alone (and so has no
    /// rewriter to hand out). Required, so that no backend's harness skips
    /// the C22 task case by default.
    fn rewriter<'s>(&self, store: &'s Self::Store) -> Option<&'s dyn RewriteStore>;

    /// Removes the storage after the case (by default, nothing to do).
    async fn teardown(self)
    where
        Self: Sized,
    {
    }
}

/// What a persistent task store adds so the suite can reopen it, kill a
/// process writing to it and age its task format: the `persistent` task
/// cases (T1, T12) need it.
///
/// It is the event harness's [`PersistentHarness`] on the same storage
/// (its [`locator`](PersistentHarness::locator),
/// [`attach`](PersistentHarness::attach) and
/// [`try_open`](PersistentHarness::try_open) serve both suites), plus where
/// the task format is recorded.
#[async_trait]
pub trait PersistentTaskHarness: TaskHarness + PersistentHarness {
    /// The task format this release writes, as this backend numbers it (a
    /// task migration's version, a metadata value, a value's format byte).
    fn task_format_version(&self) -> u64;

    /// Records `version` as the format of this storage's tasks exactly
    /// where a release writing that version would (a task migration row,
    /// a metadata key, the format byte of every stored task value), with
    /// no handle open; [`task_format_version`](Self::task_format_version)
    /// puts back what this release wrote.
    async fn set_task_format_version(&self, version: u64);
}

/// The harness for [`MemoryTaskStore`]: every `open` hands out a new handle
/// on one shared set of data. It has no raw rows to show (a process's memory
/// is no dump an operator reads), so the cases that scan storage check only
/// what the API shows on it.
#[derive(Debug, Default)]
pub struct MemoryTaskHarness {
    store: std::sync::Mutex<Option<MemoryTaskStore>>,
}

impl MemoryTaskHarness {
    /// A harness with no store yet, as an async constructor for the macro.
    pub async fn new() -> Self {
        Self::default()
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Option<MemoryTaskStore>> {
        self.store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl TaskHarness for MemoryTaskHarness {
    type Store = MemoryTaskStore;

    async fn open(&self, options: StoreOptions) -> MemoryTaskStore {
        let mut shared = self.shared();
        match &*shared {
            Some(store) => store.share_with_options(options),
            None => shared
                .insert(MemoryTaskStore::with_options(options))
                .clone(),
        }
    }

    /// Its watches re-read only when woken.
    async fn open_without_recheck(&self, options: StoreOptions) -> MemoryTaskStore {
        self.open(options).await
    }

    /// A store of tasks alone: its values are rewritten through the
    /// [`MemoryStore`](mcp_event_store_core::MemoryStore) that holds one
    /// (the next harness).
    fn rewriter<'s>(&self, _: &'s MemoryTaskStore) -> Option<&'s dyn RewriteStore> {
        None
    }
}

/// The task suite on [`MemoryStore`](mcp_event_store_core::MemoryStore), the store
/// `memory://` opens: the same [`MemoryHarness`](crate::events::MemoryHarness)
/// the event suite uses, every `open` a handle on one shared set of data.
#[async_trait]
impl TaskHarness for crate::events::MemoryHarness {
    type Store = mcp_event_store_core::MemoryStore;

    async fn open(&self, options: StoreOptions) -> mcp_event_store_core::MemoryStore {
        crate::events::Harness::open(self, options).await
    }

    /// As for [`MemoryTaskStore`], whose tasks it holds.
    async fn open_without_recheck(
        &self,
        options: StoreOptions,
    ) -> mcp_event_store_core::MemoryStore {
        TaskHarness::open(self, options).await
    }

    fn rewriter<'s>(
        &self,
        store: &'s mcp_event_store_core::MemoryStore,
    ) -> Option<&'s dyn RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }
}

/// A watch's `max_wait` in the wake-up cases, and the safety-net re-read
/// interval a handle from [`TaskHarness::open_without_recheck`] should
/// have: far beyond the test, so a watch that returns was woken.
pub const NO_RECHECK: Duration = Duration::from_secs(3600);

/// Generates one `#[tokio::test]` per task conformance case for a harness.
///
/// `$harness` is an expression evaluating to a future of the harness (an
/// `async` constructor call), evaluated afresh for each case. Add
/// `persistent` for stores that survive a reopen (the harness then also
/// implements [`PersistentTaskHarness`]), to run the reopen, SIGKILL and
/// newer-task-format cases too.
///
/// Each file of cases registers its own cases beside their code, and a
/// test of this crate fails if a case is written but not registered.
#[macro_export]
macro_rules! task_suite {
    ($harness:expr) => {
        $crate::__task_cases_identity!($harness);
        $crate::__task_cases_states!($harness);
        $crate::__task_cases_input!($harness);
        $crate::__task_cases_cancel!($harness);
        $crate::__task_cases_limits!($harness);
        $crate::__task_cases_expiry!($harness);
        $crate::__task_cases_watch!($harness);
        $crate::__task_cases_instances!($harness);
        $crate::__task_cases_runtime!($harness);
        $crate::__task_cases_takeover!($harness);
        $crate::__task_cases_rewrite!($harness);
        $crate::__task_cases_metrics!($harness);
        $crate::__task_cases_operators!($harness);
    };
    ($harness:expr, persistent) => {
        $crate::task_suite!($harness);
        $crate::__task_cases_persistent!($harness);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __task_conformance_cases {
    ($harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $harness.await;
                $crate::tasks::$case(&harness).await;
                $crate::tasks::TaskHarness::teardown(harness).await;
            }
        )*
    };
}

#[cfg(test)]
mod registration {
    //! Every case a file defines is registered by that file's macro, and
    //! every file's macro is part of `task_suite!`.

    #[test]
    fn every_case_is_registered_and_every_file_runs() {
        crate::registration::Suite {
            name: "task_suite",
            module: include_str!("mod.rs"),
            file_macro: "__task_cases_",
            files: &[
                ("identity", include_str!("identity.rs")),
                ("states", include_str!("states.rs")),
                ("input", include_str!("input.rs")),
                ("cancel", include_str!("cancel.rs")),
                ("limits", include_str!("limits.rs")),
                ("persistent", include_str!("persistent.rs")),
                ("expiry", include_str!("expiry.rs")),
                ("watch", include_str!("watch.rs")),
                ("instances", include_str!("instances.rs")),
                ("runtime", include_str!("runtime.rs")),
                ("takeover", include_str!("takeover.rs")),
                ("rewrite", include_str!("rewrite.rs")),
                ("metrics", include_str!("metrics.rs")),
                ("operators", include_str!("operators.rs")),
            ],
            dir: "tasks",
        }
        .check();
    }
}
