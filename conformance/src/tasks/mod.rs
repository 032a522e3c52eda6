//! The task conformance suite: every backend's [`TaskStore`] runs every
//! case (contract T1 to T11, and T13 to T19).
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
//! The cases run on [`ManualClock`]s and assume the
//! store's [`TaskOptions`] are the defaults. None asserts a latency: a
//! wake-up case watches through a handle that re-reads only when woken
//! ([`TaskHarness::open_without_recheck`]) with a `max_wait` of an hour,
//! so a lost wake-up fails it at a generous deadline while a working one
//! passes on any machine, however loaded.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use bytes::Bytes;

use crate::events::{test_clock, test_options};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, EXPIRED_ERROR, Finish, INSTANCE_LOST_ERROR, InstanceId,
    MAX_CHECKPOINT_BYTES, MAX_CONTEXT_BYTES, MAX_INPUT_BYTES, MAX_MESSAGE_BYTES,
    MAX_OUTSTANDING_INPUTS, MemoryTaskStore, NewTask, Owner, Takeover, TaskDigest, TaskId,
    TaskOptions, TaskRecord, TaskStatus, TaskStore, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, ManualClock, StoreOptions};

/// What a backend provides so the task suite can run against it.
///
/// A harness owns one isolated piece of storage; every
/// [`open`](TaskHarness::open) gives a new handle on that same storage, so
/// the suite can check sharing (T9) and cross-handle wake-ups (T5, T10).
#[async_trait]
pub trait TaskHarness: Send + Sync + 'static {
    /// The store under test.
    type Store: TaskStore;

    /// Opens a handle on this harness's storage with these options (and
    /// the default [`TaskOptions`]).
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

    /// Removes the storage after the case (by default, nothing to do).
    async fn teardown(self)
    where
        Self: Sized,
    {
    }
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
            Some(store) => store.share_with_options(options, TaskOptions::default()),
            None => shared
                .insert(MemoryTaskStore::with_options(
                    options,
                    TaskOptions::default(),
                ))
                .clone(),
        }
    }

    /// Its watches re-read only when woken.
    async fn open_without_recheck(&self, options: StoreOptions) -> MemoryTaskStore {
        self.open(options).await
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
}

/// Generates one `#[tokio::test]` per task conformance case for a harness.
///
/// `$harness` is an expression evaluating to a future of the harness (an
/// `async` constructor call), evaluated afresh for each case.
#[macro_export]
macro_rules! task_suite {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            created_task_is_readable_from_another_handle,
            task_ids_are_unique_well_formed_and_never_stored,
            malformed_task_ids_find_nothing,
            wrong_owner_is_indistinguishable_from_unknown,
            every_status_and_operation,
            racing_finishers_exactly_one_wins,
            racing_answers_cancels_and_finishes_stay_consistent,
            spent_keys_are_refused,
            partial_answer_keeps_input_required,
            unknown_and_duplicate_answers_change_nothing,
            answer_on_one_handle_wakes_a_watch_on_another,
            cancel_supersedes_outstanding_inputs,
            cooperative_cancel_leaves_the_ending_to_the_worker,
            immediate_cancel_ends_the_task,
            payloads_at_the_limit_are_accepted_one_more_is_refused,
            hostile_payloads_and_keys_round_trip,
            expired_task_reads_failed,
            expired_task_is_purged_with_its_inputs_after_grace,
            null_ttl_is_capped,
            set_ttl_takes_effect,
            watch_returns_at_once_when_newer,
            watch_returns_the_unchanged_task_at_max_wait,
            watch_wakes_across_handles,
            suspended_watches_hold_nothing,
            lapsed_instance_fails_its_tasks,
            renewed_heartbeat_keeps_tasks_alive,
            late_finish_from_a_reaped_instance_is_already_terminal,
            no_task_is_born_under_a_lapsed_instance,
            context_is_kept_with_the_task,
            view_reads_any_owner_with_every_answer,
            replacing_inputs_supersedes_and_carries_forward,
            racing_replacements_admit_each_key_once,
            exactly_one_of_racing_instances_claims_a_task,
            a_stale_claim_is_fenced,
            runs_are_bounded,
            a_checkpoint_survives_a_takeover,
            cancel_requested_during_a_takeover_is_honoured,
            an_input_answered_while_nobody_holds_the_task_resumes_it,
            a_queued_task_waits_for_a_claim,
            only_waiting_tasks_are_claimed_and_only_by_the_living,
            a_claim_takes_at_most_its_limit
        );
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

const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const LONG: Duration = Duration::from_secs(10);
/// A watch's `max_wait` in the wake-up cases, and the safety-net re-read
/// interval a handle from [`TaskHarness::open_without_recheck`] should
/// have: far beyond the test, so a watch that returns was woken.
pub const NO_RECHECK: Duration = Duration::from_secs(3600);
/// "Must happen eventually" guard in the wake-up cases; never a latency
/// bound. A watch not back within it was not woken.
const EVENTUALLY: Duration = Duration::from_secs(30);

/// `watch` within [`EVENTUALLY`], or the case fails naming `what`.
async fn eventually<T>(what: &str, watch: impl Future<Output = T>) -> T {
    tokio::time::timeout(EVENTUALLY, watch)
        .await
        .unwrap_or_else(|_| panic!("{what}: not woken within {EVENTUALLY:?}"))
}

/// A handle, its clock, a heartbeating instance and an owner.
struct Fixture<S> {
    store: S,
    clock: Arc<ManualClock>,
    me: InstanceId,
    owner: Owner,
}

async fn fixture<H: TaskHarness>(h: &H) -> Fixture<H::Store> {
    fixture_with(h, test_options(&test_clock())).await
}

async fn fixture_with<H: TaskHarness>(h: &H, options: StoreOptions) -> Fixture<H::Store> {
    let clock = test_clock();
    let store = h.open(options.clock(clock.clone())).await;
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    Fixture {
        store,
        clock,
        me,
        owner: Owner::principal(b"alice").unwrap(),
    }
}

impl<S: TaskStore> Fixture<S> {
    async fn create(&self) -> (TaskId, String) {
        self.create_with(NewTask::new(&self.owner, self.me)).await
    }

    async fn create_with(&self, task: NewTask<'_>) -> (TaskId, String) {
        let (id, record) = self.store.create(task).await.unwrap();
        assert_eq!(record.status, TaskStatus::Working);
        (id, id.to_string())
    }

    async fn get(&self, id: &str) -> TaskRecord {
        self.store
            .get(id, &self.owner)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("task {id:?} should be readable"))
    }

    async fn apply(&self, id: &TaskId, change: WorkerChange<'_>) -> Applied {
        self.store.apply(id, self.me, change).await.unwrap()
    }

    async fn request(&self, id: &TaskId, key: &str) {
        let applied = self
            .apply(
                id,
                WorkerChange::RequestInput {
                    key,
                    request: b"{\"q\":1}",
                },
            )
            .await;
        assert!(
            matches!(applied, Applied::Changed { .. }),
            "request {key:?}: {applied:?}"
        );
    }

    async fn answer(&self, id: &str, responses: &[(&str, &[u8])]) -> TaskRecord {
        self.store
            .answer(id, &self.owner, responses)
            .await
            .unwrap()
            .expect("the owner may answer")
    }

    async fn cancel(&self, id: &str, mode: CancelMode) -> TaskRecord {
        self.store
            .request_cancel(id, &self.owner, mode)
            .await
            .unwrap()
            .expect("the owner may cancel")
    }

    async fn take(&self, id: &TaskId, key: &str) -> Option<Vec<u8>> {
        match self.apply(id, WorkerChange::TakeAnswer { key }).await {
            Applied::Changed { answer, .. } => answer.map(|a| a.to_vec()),
            other => panic!("take_answer({key:?}): {other:?}"),
        }
    }

    async fn close<H: TaskHarness<Store = S>>(self, h: &H) {
        h.close(self.store).await;
    }
}

fn is_changed(applied: &Applied) -> bool {
    matches!(applied, Applied::Changed { .. })
}

// ---------------------------------------------------------------- T1, T9

/// T1, T9: a created task is readable at once from another handle.
pub async fn created_task_is_readable_from_another_handle<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let (_, id) = f
        .create_with(NewTask::new(&f.owner, f.me).message("starting").ttl(LONG))
        .await;
    let seen = other
        .get(&id, &f.owner)
        .await
        .unwrap()
        .expect("visible on B");
    assert_eq!(seen, f.get(&id).await);
    assert_eq!(seen.message.as_deref(), Some("starting"));
    assert_eq!(seen.ttl_ms, Some(10_000));
    assert!(!seen.cancel_requested && seen.outcome.is_none());
    h.close(other).await;
    f.close(h).await;
}

// ---------------------------------------------------------------- T2

/// T2: 10k ids are distinct and spelled `t1.` + 26 base32hex characters;
/// no stored row contains an id.
pub async fn task_ids_are_unique_well_formed_and_never_stored<H: TaskHarness>(h: &H) {
    let mut seen = HashSet::new();
    for _ in 0..10_000 {
        let id = TaskId::generate().unwrap().to_string();
        assert_eq!(id.len(), 29, "{id}");
        assert!(id.starts_with("t1."), "{id}");
        assert!(
            id[3..]
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'v')),
            "{id}"
        );
        assert_eq!(TaskId::parse(&id).map(|p| p.to_string()), Some(id.clone()));
        assert!(seen.insert(id), "an id was drawn twice");
    }
    let f = fixture(h).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (task, id) = f.create().await;
        f.request(&task, "k").await;
        ids.push(id);
    }
    if let Some(rows) = h.raw_rows().await {
        assert!(!rows.is_empty(), "the harness sees no rows");
        for id in &ids {
            for needle in [id.as_bytes(), &id.as_bytes()[3..]] {
                assert!(
                    !rows
                        .iter()
                        .any(|row| row.windows(needle.len()).any(|w| w == needle)),
                    "a stored row contains the task id {id}"
                );
            }
        }
    }
    f.close(h).await;
}

/// T2: malformed ids, altered ids and the empty id find nothing, through
/// every call taking an id, and change nothing.
pub async fn malformed_task_ids_find_nothing<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let before = f.get(&id).await;
    let mut bad: Vec<String> = vec![
        String::new(),
        "t1.".into(),
        "t1".into(),
        id.to_uppercase(),
        id.replacen("t1.", "t2.", 1),
        id.replacen("t1.", "T1.", 1),
        format!("{id} "),
        format!(" {id}"),
        format!("{id}0"),
        id[..id.len() - 1].to_owned(),
        id[3..].to_owned(),
        format!("{id}\0"),
        "t1.zzzzzzzzzzzzzzzzzzzzzzzzzz".into(),
        "t1.😀😀😀😀😀😀".into(),
        "x".repeat(100_000),
    ];
    for (i, _) in id.char_indices().skip(3) {
        let mut altered = id.clone().into_bytes();
        altered[i] = if altered[i] == b'0' { b'1' } else { b'0' };
        bad.push(String::from_utf8(altered).unwrap());
    }
    for text in &bad {
        assert_eq!(f.store.get(text, &f.owner).await.unwrap(), None, "{text:?}");
        assert_eq!(
            f.store
                .answer(text, &f.owner, &[("k", b"1")])
                .await
                .unwrap(),
            None
        );
        for mode in [CancelMode::Cooperative, CancelMode::Immediate] {
            assert_eq!(
                f.store.request_cancel(text, &f.owner, mode).await.unwrap(),
                None
            );
        }
        assert_eq!(
            f.store
                .watch(text, &f.owner, 0, Duration::ZERO)
                .await
                .unwrap(),
            None
        );
        assert!(!f.store.delete(text).await.unwrap(), "{text:?}");
    }
    assert_eq!(f.get(&id).await, before, "a malformed id changed the task");
    f.close(h).await;
}

// ---------------------------------------------------------------- T3

/// T3: a wrong owner, anonymous against owned and owned against anonymous
/// all get what an unknown id gets, from every client-facing call, and
/// change nothing.
pub async fn wrong_owner_is_indistinguishable_from_unknown<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let bob = Owner::principal(b"bob").unwrap();
    let (owned_task, owned) = f.create().await;
    f.request(&owned_task, "k").await;
    let (anon_task, anon) = f.create_with(NewTask::new(&Owner::Anonymous, f.me)).await;
    f.request(&anon_task, "k").await;
    let unknown = TaskId::generate().unwrap().to_string();
    let cases = [
        (&owned, bob),
        (&owned, Owner::Anonymous),
        (&anon, f.owner),
        (&anon, bob),
        (&unknown, f.owner),
    ];
    let owned_before = f.get(&owned).await;
    let anon_before = f.store.get(&anon, &Owner::Anonymous).await.unwrap();
    assert!(anon_before.is_some(), "anonymous sees its own task");
    for (id, who) in &cases {
        let who = *who;
        assert_eq!(f.store.get(id, &who).await.unwrap(), None, "get {who:?}");
        assert_eq!(
            f.store.answer(id, &who, &[("k", b"1")]).await.unwrap(),
            None,
            "answer {who:?}"
        );
        for mode in [CancelMode::Cooperative, CancelMode::Immediate] {
            assert_eq!(
                f.store.request_cancel(id, &who, mode).await.unwrap(),
                None,
                "cancel {who:?}"
            );
        }
        assert_eq!(
            f.store
                .watch(id, &who, 0, Duration::from_millis(1))
                .await
                .unwrap(),
            None,
            "watch {who:?}"
        );
    }
    assert_eq!(f.get(&owned).await, owned_before);
    assert_eq!(
        f.store.get(&anon, &Owner::Anonymous).await.unwrap(),
        anon_before
    );
    f.close(h).await;
}

// ---------------------------------------------------------------- T4

/// Brings a fresh task to `status`; `k0` is outstanding when it is
/// `input_required`.
async fn task_in<S: TaskStore>(f: &Fixture<S>, status: TaskStatus) -> (TaskId, String) {
    let (task, id) = f.create().await;
    let finish = match status {
        TaskStatus::Working => None,
        TaskStatus::InputRequired => {
            f.request(&task, "k0").await;
            None
        }
        TaskStatus::Completed => Some(Finish::Completed(b"{\"content\":[]}")),
        TaskStatus::Failed => Some(Finish::Failed(b"{\"code\":1,\"message\":\"no\"}")),
        TaskStatus::Cancelled => Some(Finish::Cancelled),
    };
    if let Some(finish) = finish {
        assert!(is_changed(
            &f.apply(&task, WorkerChange::Finish(finish)).await
        ));
    }
    assert_eq!(f.get(&id).await.status, status);
    (task, id)
}

/// T4: every (status, operation) pair: what each does from each status,
/// `rev` bumped by every change and by nothing else, terminal tasks
/// immutable.
pub async fn every_status_and_operation<H: TaskHarness>(h: &H) {
    use TaskStatus::*;
    let f = fixture(h).await;
    let changes: [(&str, WorkerChange<'_>); 10] = [
        (
            "request_input",
            WorkerChange::RequestInput {
                key: "new",
                request: b"{}",
            },
        ),
        ("take_answer", WorkerChange::TakeAnswer { key: "k0" }),
        ("set_message", WorkerChange::SetMessage(Some("m"))),
        (
            "set_poll_interval",
            WorkerChange::SetPollInterval(Some(Duration::from_secs(2))),
        ),
        (
            "set_ttl",
            WorkerChange::SetTtl(Some(Duration::from_secs(3600))),
        ),
        (
            "complete",
            WorkerChange::Finish(Finish::Completed(b"{\"r\":1}")),
        ),
        ("fail", WorkerChange::Finish(Finish::Failed(b"{\"e\":1}"))),
        ("cancelled", WorkerChange::Finish(Finish::Cancelled)),
        ("set_context", WorkerChange::SetContext(b"ctx")),
        (
            "replace_inputs",
            WorkerChange::ReplaceInputs {
                requests: &[("fresh", b"{}")],
                message: Some("asking"),
            },
        ),
    ];
    for status in TaskStatus::ALL {
        for (name, change) in changes {
            let (task, id) = task_in(&f, status).await;
            let before = f.get(&id).await;
            let applied = f.apply(&task, change).await;
            let after = f.get(&id).await;
            let what = format!("{name} on a {status} task");
            if status.is_terminal() {
                assert_eq!(applied, Applied::AlreadyTerminal(status), "{what}");
                assert_eq!(after, before, "{what} changed a terminal task");
                continue;
            }
            if name == "take_answer" {
                // Nothing answered yet: nothing to take, nothing changes.
                assert_eq!(
                    applied,
                    Applied::Changed {
                        rev: before.rev,
                        answer: None
                    },
                    "{what}"
                );
                assert_eq!(after, before, "{what}");
                continue;
            }
            assert_eq!(
                applied,
                Applied::Changed {
                    rev: after.rev,
                    answer: None
                },
                "{what}"
            );
            assert!(after.rev > before.rev, "{what}: rev did not increase");
            assert!(after.updated_at >= before.updated_at, "{what}");
            let want = match change {
                WorkerChange::RequestInput { .. } | WorkerChange::ReplaceInputs { .. } => {
                    InputRequired
                }
                WorkerChange::Finish(finish) => finish.status(),
                _ => status,
            };
            assert_eq!(after.status, want, "{what}");
            match change {
                WorkerChange::SetMessage(m) => assert_eq!(after.message.as_deref(), m),
                WorkerChange::SetPollInterval(_) => assert_eq!(after.poll_interval_ms, Some(2_000)),
                WorkerChange::SetTtl(_) => assert_eq!(after.ttl_ms, Some(3_600_000)),
                WorkerChange::Finish(finish) => {
                    assert_eq!(after.outcome.as_deref(), finish.outcome(), "{what}");
                    assert!(after.outstanding.is_empty(), "{what}");
                }
                WorkerChange::SetContext(c) => assert_eq!(after.context.as_deref(), Some(c)),
                WorkerChange::ReplaceInputs { .. } => {
                    // `k0`, outstanding on an input_required task, is
                    // superseded.
                    assert_eq!(keys(&after.outstanding), ["fresh"], "{what}");
                    assert_eq!(after.message.as_deref(), Some("asking"), "{what}");
                }
                _ => {}
            }
        }
        // The client's calls from the same status.
        for mode in [
            None,
            Some(CancelMode::Cooperative),
            Some(CancelMode::Immediate),
        ] {
            let (_, id) = task_in(&f, status).await;
            let before = f.get(&id).await;
            let returned = match mode {
                None => f.answer(&id, &[("k0", b"{\"a\":1}")]).await,
                Some(mode) => f.cancel(&id, mode).await,
            };
            let after = f.get(&id).await;
            assert_eq!(
                returned, after,
                "{mode:?} on a {status} task returns the task"
            );
            let what = format!("{} on a {status} task", mode.map_or("answer", |_| "cancel"));
            if status.is_terminal() || (mode.is_none() && status == Working) {
                assert_eq!(after, before, "{what} changed it");
                continue;
            }
            assert!(after.rev > before.rev, "{what}: rev did not increase");
            let want = match mode {
                Some(CancelMode::Immediate) => Cancelled,
                _ => Working,
            };
            assert_eq!(after.status, want, "{what}");
            assert_eq!(after.cancel_requested, mode.is_some(), "{what}");
            assert!(after.outstanding.is_empty(), "{what}");
        }
    }
    f.close(h).await;
}

/// T4: of 32 finishers racing on two handles, exactly one wins; the others
/// see the winner's status and the winner's outcome stays.
pub async fn racing_finishers_exactly_one_wins<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let a = Arc::new(h.open(test_options(&f.clock)).await);
    let b = Arc::new(h.open(test_options(&f.clock)).await);
    for round in 0..3 {
        let (task, id) = f.create().await;
        let racers: Vec<_> = (0..32u32)
            .map(|i| {
                let store = if i % 2 == 0 { a.clone() } else { b.clone() };
                let me = f.me;
                tokio::spawn(async move {
                    let outcome = format!("{{\"winner\":{i}}}");
                    let change = match i % 3 {
                        0 => WorkerChange::Finish(Finish::Completed(outcome.as_bytes())),
                        1 => WorkerChange::Finish(Finish::Failed(outcome.as_bytes())),
                        _ => WorkerChange::Finish(Finish::Cancelled),
                    };
                    let status = match change {
                        WorkerChange::Finish(finish) => finish.status(),
                        _ => unreachable!(),
                    };
                    let applied = store.apply(&task, me, change).await.unwrap();
                    (i, status, outcome, applied)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut losers = Vec::new();
        for racer in racers {
            let (i, status, outcome, applied) = racer.await.unwrap();
            match applied {
                Applied::Changed { .. } => winners.push((i, status, outcome)),
                Applied::AlreadyTerminal(seen) => losers.push(seen),
                other => panic!("round {round}: racer {i} got {other:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {} finishers won",
            winners.len()
        );
        let (_, status, outcome) = &winners[0];
        assert!(losers.iter().all(|seen| seen == status), "round {round}");
        let after = f.get(&id).await;
        assert_eq!(after.status, *status);
        let want = (*status != TaskStatus::Cancelled).then_some(outcome.as_bytes());
        assert_eq!(after.outcome.as_deref(), want, "round {round}");
        assert_eq!(after.rev, 2, "round {round}: one change, one bump");
    }
    for store in [a, b] {
        h.close(Arc::into_inner(store).expect("racers done")).await;
    }
    f.close(h).await;
}

/// T4: an answer racing a finish, and an input request racing a cancel,
/// end in a state one order or the other would give; `rev` never goes
/// back for a watcher.
pub async fn racing_answers_cancels_and_finishes_stay_consistent<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = Arc::new(h.open(test_options(&f.clock)).await);
    let owner = f.owner;
    for round in 0..20 {
        // Answer against finish.
        let (task, id) = f.create().await;
        f.request(&task, "k").await;
        let answer = {
            let (other, id) = (other.clone(), id.clone());
            tokio::spawn(async move { other.answer(&id, &owner, &[("k", b"1")]).await })
        };
        let finish = f
            .apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await;
        let answered = answer.await.unwrap().unwrap().expect("visible");
        assert!(
            is_changed(&finish),
            "round {round}: the finish must win: {finish:?}"
        );
        let end = f.get(&id).await;
        assert_eq!(end.status, TaskStatus::Completed, "round {round}");
        assert!(answered.rev <= end.rev, "round {round}");
        assert!(end.outstanding.is_empty(), "round {round}");

        // Input request against cancel.
        let (task, id) = f.create().await;
        let cancel = {
            let (other, id) = (other.clone(), id.clone());
            tokio::spawn(async move {
                other
                    .request_cancel(&id, &owner, CancelMode::Cooperative)
                    .await
            })
        };
        let request = f
            .apply(
                &task,
                WorkerChange::RequestInput {
                    key: "k",
                    request: b"{}",
                },
            )
            .await;
        cancel.await.unwrap().unwrap().expect("visible");
        assert!(
            matches!(request, Applied::Changed { .. } | Applied::CancelRequested),
            "round {round}: {request:?}"
        );
        let end = f.get(&id).await;
        assert_eq!(end.status, TaskStatus::Working, "round {round}");
        assert!(end.cancel_requested, "round {round}");
        assert!(
            end.outstanding.is_empty(),
            "round {round}: an input request outlived the cancel"
        );
        let again = f
            .apply(
                &task,
                WorkerChange::RequestInput {
                    key: "k",
                    request: b"{}",
                },
            )
            .await;
        let want = match request {
            Applied::Changed { .. } => Applied::KeySpent,
            _ => Applied::CancelRequested,
        };
        assert_eq!(again, want, "round {round}");
    }
    h.close(Arc::into_inner(other).expect("racers done")).await;
    f.close(h).await;
}

// ---------------------------------------------------------------- T5

/// T5: a key is spent once requested, whether answered, taken or
/// superseded; reusing it changes nothing.
pub async fn spent_keys_are_refused<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let reuse = WorkerChange::RequestInput {
        key: "a",
        request: b"{}",
    };
    f.request(&task, "a").await;
    assert_eq!(
        f.apply(&task, reuse).await,
        Applied::KeySpent,
        "outstanding"
    );
    f.answer(&id, &[("a", b"1")]).await;
    assert_eq!(f.apply(&task, reuse).await, Applied::KeySpent, "answered");
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"1"[..]));
    let before = f.get(&id).await;
    assert_eq!(f.apply(&task, reuse).await, Applied::KeySpent, "taken");
    assert_eq!(f.take(&task, "a").await, None, "an answer is taken once");
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused request changed the task"
    );
    f.close(h).await;
}

/// T5: answering some of the outstanding keys leaves the task
/// `input_required`; answering the rest makes it `working`.
pub async fn partial_answer_keeps_input_required<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    f.request(&task, "b").await;
    let seen = f.get(&id).await;
    let keys: Vec<_> = seen.outstanding.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(seen.outstanding[0].1.as_ref(), b"{\"q\":1}");
    let partial = f.answer(&id, &[("a", b"\"A\"")]).await;
    assert_eq!(partial.status, TaskStatus::InputRequired);
    assert_eq!(partial.outstanding.len(), 1);
    assert_eq!(partial.answered, ["a"]);
    let full = f.answer(&id, &[("b", b"\"B\"")]).await;
    assert_eq!(full.status, TaskStatus::Working);
    assert!(full.outstanding.is_empty());
    assert_eq!(full.answered, ["a", "b"]);
    assert_eq!(f.take(&task, "b").await.as_deref(), Some(&b"\"B\""[..]));
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"\"A\""[..]));
    assert!(f.get(&id).await.answered.is_empty());
    f.close(h).await;
}

/// T5 (SEP:381): keys that are not outstanding are ignored, and answering
/// a key twice changes nothing the second time.
pub async fn unknown_and_duplicate_answers_change_nothing<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    let before = f.get(&id).await;
    let ignored = f
        .answer(&id, &[("zzz", b"1"), ("", b"2"), ("A", b"3")])
        .await;
    assert_eq!(ignored, before, "unknown keys changed the task");
    let once = f.answer(&id, &[("a", b"first"), ("other", b"x")]).await;
    assert!(once.rev > before.rev);
    let twice = f.answer(&id, &[("a", b"second")]).await;
    assert_eq!(twice, once, "a duplicate answer changed the task");
    assert_eq!(f.take(&task, "a").await.as_deref(), Some(&b"first"[..]));
    f.close(h).await;
}

/// T5, T10: an answer written through handle B wakes the worker's watch on
/// handle A, which re-reads only when woken (its `max_wait` is an hour).
pub async fn answer_on_one_handle_wakes_a_watch_on_another<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let a = h.open_without_recheck(test_options(&f.clock)).await;
    let b = h.open(test_options(&f.clock)).await;
    let (task, id) = f.create().await;
    f.request(&task, "k").await;
    let rev = f.get(&id).await.rev;
    let watch = a.watch(&id, &f.owner, rev, NO_RECHECK);
    let answer = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.answer(&id, &f.owner, &[("k", b"42")])
            .await
            .unwrap()
            .expect("the owner may answer")
    };
    let (woken, _) = eventually("the watch on A", async { tokio::join!(watch, answer) }).await;
    let woken = woken.unwrap().expect("the task is there");
    assert!(woken.rev > rev);
    assert_eq!(woken.answered, ["k"]);
    assert_eq!(f.take(&task, "k").await.as_deref(), Some(&b"42"[..]));
    h.close(a).await;
    h.close(b).await;
    f.close(h).await;
}

/// T5, T6: a cancel supersedes the outstanding inputs: they are no longer
/// shown, answers to them are ignored, and their keys are spent.
pub async fn cancel_supersedes_outstanding_inputs<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "a").await;
    f.request(&task, "b").await;
    let cancelled = f.cancel(&id, CancelMode::Cooperative).await;
    assert_eq!(cancelled.status, TaskStatus::Working);
    assert!(cancelled.cancel_requested && cancelled.outstanding.is_empty());
    assert_eq!(f.answer(&id, &[("a", b"1")]).await, cancelled);
    assert_eq!(f.take(&task, "a").await, None);
    for key in ["a", "b"] {
        assert_eq!(
            f.apply(
                &task,
                WorkerChange::RequestInput {
                    key,
                    request: b"{}"
                }
            )
            .await,
            Applied::KeySpent
        );
    }
    f.close(h).await;
}

// ---------------------------------------------------------------- T6

/// T6: a cooperative cancel records the request; the worker sees it, may
/// ask for no more input, and chooses how the task ends.
pub async fn cooperative_cancel_leaves_the_ending_to_the_worker<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let rev = f.get(&id).await.rev;
    let cancelled = f.cancel(&id, CancelMode::Cooperative).await;
    assert_eq!(cancelled.status, TaskStatus::Working);
    assert!(cancelled.cancel_requested);
    assert_eq!(
        f.cancel(&id, CancelMode::Cooperative).await,
        cancelled,
        "a second cancel changed the task"
    );
    let seen = f
        .store
        .watch(&id, &f.owner, rev, LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(seen.cancel_requested, "the worker sees the request");
    assert_eq!(
        f.apply(
            &task,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{}"
            }
        )
        .await,
        Applied::CancelRequested
    );
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some("winding down")))
            .await
    ));
    assert!(is_changed(
        &f.apply(
            &task,
            WorkerChange::Finish(Finish::Completed(b"{\"partial\":true}"))
        )
        .await
    ));
    let end = f.get(&id).await;
    assert_eq!(end.status, TaskStatus::Completed);
    assert_eq!(f.cancel(&id, CancelMode::Immediate).await, end);
    f.close(h).await;
}

/// T6: an immediate cancel ends the task as `cancelled` in the same step;
/// the worker's later finish is refused.
pub async fn immediate_cancel_ends_the_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "k").await;
    let cancelled = f.cancel(&id, CancelMode::Immediate).await;
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert!(cancelled.cancel_requested && cancelled.outstanding.is_empty());
    assert_eq!(f.get(&id).await, cancelled);
    assert_eq!(
        f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await,
        Applied::AlreadyTerminal(TaskStatus::Cancelled)
    );
    assert_eq!(f.cancel(&id, CancelMode::Immediate).await, cancelled);
    assert_eq!(f.cancel(&id, CancelMode::Cooperative).await, cancelled);
    f.close(h).await;
}

// ---------------------------------------------------------------- T7

fn assert_too_large<T: std::fmt::Debug>(result: mcp_event_store_core::Result<T>, what: &str) {
    match result {
        Err(Error::PayloadTooLarge { .. }) => {}
        other => panic!("{what}: expected PayloadTooLarge, got {other:?}"),
    }
}

/// T7: each limit accepts exactly its size and refuses one byte more with
/// `PayloadTooLarge`, leaving the task as it was; keys are 1 to 256 bytes
/// and at most 64 inputs are outstanding.
pub async fn payloads_at_the_limit_are_accepted_one_more_is_refused<H: TaskHarness>(h: &H) {
    const OUTCOME: usize = 64 * 1024;
    let clock = test_clock();
    let f = fixture_with(h, test_options(&clock).max_payload_bytes(OUTCOME)).await;
    let (task, id) = f.create().await;
    let big = vec![b'x'; MAX_INPUT_BYTES + 1];

    let message = "m".repeat(MAX_MESSAGE_BYTES + 1);
    assert_too_large(
        f.store
            .create(NewTask::new(&f.owner, f.me).message(&message))
            .await,
        "create with a long message",
    );
    let before = f.get(&id).await;
    assert_too_large(
        f.store
            .apply(&task, f.me, WorkerChange::SetMessage(Some(&message)))
            .await,
        "message",
    );
    assert_too_large(
        f.store
            .apply(
                &task,
                f.me,
                WorkerChange::RequestInput {
                    key: "k",
                    request: &big,
                },
            )
            .await,
        "input request",
    );
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused payload changed the task"
    );
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some(&message[1..])))
            .await
    ));
    assert!(is_changed(
        &f.apply(
            &task,
            WorkerChange::RequestInput {
                key: "k",
                request: &big[1..]
            }
        )
        .await
    ));
    assert_eq!(f.get(&id).await.outstanding[0].1.len(), MAX_INPUT_BYTES);

    let before = f.get(&id).await;
    assert_too_large(
        f.store.answer(&id, &f.owner, &[("k", &big)]).await,
        "response",
    );
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused response changed the task"
    );
    f.answer(&id, &[("k", &big[1..])]).await;
    assert_eq!(
        f.take(&task, "k").await.map(|a| a.len()),
        Some(MAX_INPUT_BYTES)
    );

    for key in ["", &"k".repeat(257)] {
        let refused = f
            .store
            .apply(
                &task,
                f.me,
                WorkerChange::RequestInput {
                    key,
                    request: b"{}",
                },
            )
            .await;
        assert!(
            refused.is_err(),
            "a key of {} bytes was accepted",
            key.len()
        );
    }
    f.request(&task, &"k".repeat(256)).await;
    for i in 1..MAX_OUTSTANDING_INPUTS {
        f.request(&task, &format!("many-{i}")).await;
    }
    let before = f.get(&id).await;
    assert_eq!(before.outstanding.len(), MAX_OUTSTANDING_INPUTS);
    let refused = f
        .store
        .apply(
            &task,
            f.me,
            WorkerChange::RequestInput {
                key: "one-more",
                request: b"{}",
            },
        )
        .await;
    assert!(refused.is_err(), "a 65th outstanding input was accepted");
    assert_eq!(f.get(&id).await, before);

    let outcome = vec![b'o'; OUTCOME + 1];
    for finish in [Finish::Completed(&outcome), Finish::Failed(&outcome)] {
        assert_too_large(
            f.store
                .apply(&task, f.me, WorkerChange::Finish(finish))
                .await,
            "outcome",
        );
    }
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused outcome changed the task"
    );
    assert!(is_changed(
        &f.apply(
            &task,
            WorkerChange::Finish(Finish::Completed(&outcome[1..]))
        )
        .await
    ));
    assert_eq!(f.get(&id).await.outcome.map(|o| o.len()), Some(OUTCOME));
    f.close(h).await;
}

/// Keys that break naive backends: quoting, LIKE wildcards, Redis hash
/// tags, NUL, emoji.
const HOSTILE_KEYS: &[&str] = &[
    "'", "%", "_", "a%", "a_", "{}", "{x}", "😀", "a\0b", " ", "\\",
];

/// T7: payloads are bytes, never parsed (NUL, invalid UTF-8), and hostile
/// keys are data; everything comes back exactly.
pub async fn hostile_payloads_and_keys_round_trip<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let payload = |i: usize| [&b"\0\xff\xfe{"[..], &i.to_be_bytes(), "😀".as_bytes()].concat();
    for (i, key) in HOSTILE_KEYS.iter().enumerate() {
        assert!(is_changed(
            &f.apply(
                &task,
                WorkerChange::RequestInput {
                    key,
                    request: &payload(i)
                }
            )
            .await
        ));
    }
    let seen = f.get(&id).await;
    let want: Vec<(String, Vec<u8>)> = HOSTILE_KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), payload(i)))
        .collect();
    let got: Vec<(String, Vec<u8>)> = seen
        .outstanding
        .iter()
        .map(|(k, r)| (k.clone(), r.to_vec()))
        .collect();
    assert_eq!(got, want, "requests in order, byte for byte");
    let responses: Vec<(&str, Vec<u8>)> = HOSTILE_KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, payload(i + 100)))
        .collect();
    // One at a time, so a key matched as a pattern would answer another.
    for (key, response) in &responses {
        f.answer(&id, &[(key, response)]).await;
    }
    for (key, response) in &responses {
        assert_eq!(f.take(&task, key).await.as_ref(), Some(response), "{key:?}");
    }
    let message = "\0 '%_{} 😀";
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetMessage(Some(message)))
            .await
    ));
    let outcome = payload(7);
    assert!(is_changed(
        &f.apply(&task, WorkerChange::Finish(Finish::Failed(&outcome)))
            .await
    ));
    let end = f.get(&id).await;
    assert_eq!(end.message.as_deref(), Some(message));
    assert_eq!(end.outcome.as_deref(), Some(&outcome[..]));
    f.close(h).await;
}

// ---------------------------------------------------------------- T8

/// T8: a task past its ttl reads `failed` with "task expired", the worker
/// can no longer change it, and purging persists exactly what reads showed.
pub async fn expired_task_reads_failed<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(60)))
        .await;
    f.request(&task, "k").await;
    f.clock.advance(Duration::from_millis(59_999));
    assert_eq!(f.get(&id).await.status, TaskStatus::InputRequired);
    f.clock.advance(Duration::from_millis(1));
    let expired = f.get(&id).await;
    assert_eq!(expired.status, TaskStatus::Failed);
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    assert!(expired.outstanding.is_empty());
    assert_eq!(
        f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await,
        Applied::AlreadyTerminal(TaskStatus::Failed)
    );
    assert_eq!(f.answer(&id, &[("k", b"1")]).await, expired);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.expired, 1);
    assert_eq!(
        f.get(&id).await,
        expired,
        "the purge changed what reads show"
    );
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().expired, 0);
    f.close(h).await;
}

/// T8: a task is deleted one ttl (at most an hour) after it expires, with
/// its inputs, and reads as unknown from then on, finished or not.
pub async fn expired_task_is_purged_with_its_inputs_after_grace<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let rows_before = h.raw_rows().await.map(|rows| rows.len());
    let ttl = Duration::from_secs(60);
    let (running, running_id) = f.create_with(NewTask::new(&f.owner, f.me).ttl(ttl)).await;
    let (done, done_id) = f.create_with(NewTask::new(&f.owner, f.me).ttl(ttl)).await;
    for task in [&running, &done] {
        f.request(task, "asked").await;
        f.request(task, "answered").await;
    }
    f.answer(&running_id, &[("answered", b"1")]).await;
    f.apply(&done, WorkerChange::Finish(Finish::Completed(b"{}")))
        .await;
    f.clock.advance(ttl + ttl - Duration::from_millis(1));
    assert_eq!(f.get(&running_id).await.status, TaskStatus::Failed);
    assert_eq!(
        f.get(&done_id).await.status,
        TaskStatus::Completed,
        "kept for its grace"
    );
    f.clock.advance(Duration::from_millis(1));
    for id in [&running_id, &done_id] {
        assert_eq!(
            f.store.get(id, &f.owner).await.unwrap(),
            None,
            "past its grace"
        );
    }
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.deleted, 2);
    if let (Some(before), Some(after)) = (rows_before, h.raw_rows().await) {
        assert_eq!(
            after.len(),
            before,
            "rows of purged tasks are left: {after:?}"
        );
    }
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().deleted, 0);
    f.close(h).await;
}

/// T8: a `null` ttl is capped by `max_task_age` (7 days by default).
pub async fn null_ttl_is_capped<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let created = f.get(&id).await;
    assert_eq!(created.ttl_ms, None);
    let week = 7 * DAY;
    assert_eq!(
        created.expires_at,
        created.created_at + week.as_millis() as i64
    );
    let step = Duration::from_secs(12 * 60 * 60);
    for _ in 0..13 {
        f.clock.advance(step);
        assert!(f.store.heartbeat(f.me, DAY).await.unwrap());
    }
    f.clock.advance(step - Duration::from_millis(1));
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    f.clock.advance(Duration::from_millis(1));
    let expired = f.get(&id).await;
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.clock.advance(Duration::from_secs(3600));
    assert_eq!(f.store.get(&id, &f.owner).await.unwrap(), None);
    f.close(h).await;
}

/// T8: `set_ttl` moves the expiry, still counted from creation.
pub async fn set_ttl_takes_effect<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(60)))
        .await;
    let created = f.get(&id).await.created_at;
    f.apply(&task, WorkerChange::SetTtl(Some(Duration::from_secs(600))))
        .await;
    let longer = f.get(&id).await;
    assert_eq!(longer.ttl_ms, Some(600_000));
    assert_eq!(longer.expires_at, created + 600_000);
    f.clock.advance(Duration::from_secs(61));
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    // Expired 11 s ago, within its grace (one ttl) still readable.
    f.apply(&task, WorkerChange::SetTtl(Some(Duration::from_secs(50))))
        .await;
    let expired = f.get(&id).await;
    assert_eq!(
        expired.status,
        TaskStatus::Failed,
        "a ttl already past expires the task"
    );
    assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.close(h).await;
}

// ---------------------------------------------------------------- T10

/// T10: a watch whose task is already past `after` returns at once.
pub async fn watch_returns_at_once_when_newer<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.apply(&task, WorkerChange::SetMessage(Some("one"))).await;
    let now = f.get(&id).await;
    let seen = eventually(
        "a watch already behind its task",
        f.store.watch(&id, &f.owner, now.rev - 1, NO_RECHECK),
    )
    .await
    .unwrap();
    assert_eq!(seen, Some(now));
    f.close(h).await;
}

/// T10: with no change, a watch returns the unchanged task at `max_wait`;
/// a deleted task ends it with `None`.
pub async fn watch_returns_the_unchanged_task_at_max_wait<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let now = f.get(&id).await;
    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let seen = eventually(
        "a watch with nothing to see, at its max_wait",
        f.store.watch(&id, &f.owner, now.rev, wait),
    )
    .await
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(seen, Some(now));
    assert!(waited >= wait, "returned after {waited:?}");
    let a = h.open_without_recheck(test_options(&f.clock)).await;
    let watch = a.watch(&id, &f.owner, f.get(&id).await.rev, NO_RECHECK);
    let delete = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(f.store.delete(&id).await.unwrap());
    };
    let (gone, ()) = eventually("the watch of a deleted task", async {
        tokio::join!(watch, delete)
    })
    .await;
    assert_eq!(gone.unwrap(), None);
    h.close(a).await;
    f.close(h).await;
}

/// T10: a watcher on one handle wakes when another handle changes the
/// task: its handle re-reads only when woken, and its `max_wait` is an
/// hour, so each of five changes is seen through a wake-up.
pub async fn watch_wakes_across_handles<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let b = h.open_without_recheck(test_options(&f.clock)).await;
    let (task, id) = f.create().await;
    for round in 0..5 {
        let rev = f.get(&id).await.rev;
        let watch = b.watch(&id, &f.owner, rev, NO_RECHECK);
        let change = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let message = format!("round {round}");
            f.apply(&task, WorkerChange::SetMessage(Some(&message)))
                .await
        };
        let (seen, applied) = eventually(&format!("round {round}"), async {
            tokio::join!(watch, change)
        })
        .await;
        let Applied::Changed { rev: new_rev, .. } = applied else {
            panic!("{applied:?}")
        };
        let seen = seen.unwrap().expect("visible");
        assert_eq!(seen.rev, new_rev, "round {round}");
    }
    h.close(b).await;
    f.close(h).await;
}

/// T10: a watch whose caller stops polling it holds nothing the store
/// needs. A worker that waits on its task's cancel in a `select!` beside a
/// short sleep leaves the watch pinned and unpolled, often in the middle of
/// a re-read, while it changes the task; 1,000 such workers at once on one
/// handle all finish, and every read and change succeeds (a watch holding a
/// pooled connection while unpolled starves the pool: every change then
/// waits for a connection that never comes back, and fails at the pool's
/// acquire timeout).
pub async fn suspended_watches_hold_nothing<H: TaskHarness>(h: &H) {
    const WORKERS: usize = 1_000;
    let f = fixture(h).await;
    let worker = |n: usize| {
        let f = &f;
        async move {
            let (task, id) = f.create().await;
            // The cancel wait of rmcp's task context: watch again after
            // every change until a cancel or an end.
            let cancelled = async {
                let mut rev = 0;
                loop {
                    match f.store.watch(&id, &f.owner, rev, LONG).await.unwrap() {
                        Some(t) if !t.cancel_requested && !t.status.is_terminal() => rev = t.rev,
                        _ => return,
                    }
                }
            };
            tokio::pin!(cancelled);
            for step in 0..3 {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(1)) => {}
                    () = &mut cancelled => panic!("task {n} was never cancelled"),
                }
                let message = format!("worker {n} step {step}");
                let applied = f
                    .store
                    .apply(&task, f.me, WorkerChange::SetMessage(Some(&message)))
                    .await
                    .unwrap_or_else(|e| panic!("worker {n} step {step}: {e}"));
                assert!(is_changed(&applied), "worker {n} step {step}: {applied:?}");
            }
            // Read while the watch is still pinned, unpolled.
            assert_eq!(f.get(&id).await.message, Some(format!("worker {n} step 2")));
        }
    };
    futures_util::future::join_all((0..WORKERS).map(worker)).await;
    f.close(h).await;
}

// ---------------------------------------------------------------- T11

/// T11: when an instance's heartbeat lapses, its running tasks read
/// `failed` with "server instance lost", and the instance cannot come back.
pub async fn lapsed_instance_fails_its_tasks<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let gone = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(gone, lease).await.unwrap());
    let (task, id) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let (_, finished) = f.create_with(NewTask::new(&f.owner, gone)).await;
    f.store
        .apply(
            &task,
            gone,
            WorkerChange::RequestInput {
                key: "k",
                request: b"{}",
            },
        )
        .await
        .unwrap();
    let done = TaskId::parse(&finished).unwrap();
    f.store
        .apply(&done, gone, WorkerChange::Finish(Finish::Completed(b"{}")))
        .await
        .unwrap();
    let (_, healthy) = f.create().await;
    f.clock.advance(lease - Duration::from_millis(1));
    assert_eq!(f.get(&id).await.status, TaskStatus::InputRequired);
    f.clock.advance(Duration::from_millis(1));
    let lost = f.get(&id).await;
    assert_eq!(lost.status, TaskStatus::Failed);
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    assert_eq!(f.get(&finished).await.status, TaskStatus::Completed);
    assert_eq!(f.get(&healthy).await.status, TaskStatus::Working);
    assert!(
        !f.store.heartbeat(gone, lease).await.unwrap(),
        "a lapsed instance was revived"
    );
    assert_eq!(f.get(&id).await, lost);
    let report = f.store.purge_expired_tasks().await.unwrap();
    assert_eq!(report.orphaned, 1);
    assert_eq!(f.get(&id).await, lost, "the purge changed what reads show");
    f.close(h).await;
}

/// T11: renewing the heartbeat keeps an instance's tasks running well past
/// one lease.
pub async fn renewed_heartbeat_keeps_tasks_alive<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let me = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(me, lease).await.unwrap());
    let (_, id) = f.create_with(NewTask::new(&f.owner, me)).await;
    for _ in 0..10 {
        f.clock.advance(Duration::from_secs(10));
        assert!(f.store.heartbeat(me, lease).await.unwrap());
        assert_eq!(f.store.purge_expired_tasks().await.unwrap().orphaned, 0);
        assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    }
    f.close(h).await;
}

/// T11: no task is born under an instance the store does not count
/// alive, whether its lease ran out on the store's clock with no renewal
/// in between, or it never registered: creating fails with
/// [`Error::InstanceLapsed`] and stores nothing, where it would otherwise
/// store a task that reads `failed` from its first `get`. A live instance
/// still creates.
pub async fn no_task_is_born_under_a_lapsed_instance<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let lapsed = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(lapsed, lease).await.unwrap());
    let rows = h.raw_rows().await.map(|rows| rows.len());
    f.clock.advance(lease);
    let never = InstanceId::generate().unwrap();
    for instance in [lapsed, never] {
        match f.store.create(NewTask::new(&f.owner, instance)).await {
            Err(Error::InstanceLapsed { instance: named }) => {
                assert_eq!(named, instance.to_string());
            }
            other => panic!("created under {instance:?}: {other:?}"),
        }
    }
    assert_eq!(h.raw_rows().await.map(|rows| rows.len()), rows);
    let (_, id) = f.create().await;
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    f.close(h).await;
}

/// T11: a worker whose instance was reaped gets `AlreadyTerminal` for its
/// late finish, and the task keeps its "instance lost" outcome.
pub async fn late_finish_from_a_reaped_instance_is_already_terminal<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let lease = Duration::from_secs(30);
    let zombie = InstanceId::generate().unwrap();
    assert!(f.store.heartbeat(zombie, lease).await.unwrap());
    let (task, id) = f.create_with(NewTask::new(&f.owner, zombie)).await;
    f.clock.advance(lease + Duration::from_secs(1));
    f.store.purge_expired_tasks().await.unwrap();
    let lost = f.get(&id).await;
    let late = f
        .store
        .apply(
            &task,
            zombie,
            WorkerChange::Finish(Finish::Completed(b"{}")),
        )
        .await
        .unwrap();
    assert_eq!(late, Applied::AlreadyTerminal(TaskStatus::Failed));
    assert_eq!(f.get(&id).await, lost);
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    f.close(h).await;
}

// ---------------------------------------------------------------- T13 to T15

/// The keys of `(key, bytes)` pairs, in order.
fn keys<T>(pairs: &[(String, T)]) -> Vec<&str> {
    pairs.iter().map(|(k, _)| k.as_str()).collect()
}

/// T13, T1, T7, T9: a task keeps the context it was created with, byte for
/// byte, readable at once from another handle; the worker replaces it; it
/// outlives the task's end; an empty context is not none; each limit
/// accepts exactly its size and refuses one byte more, changing nothing.
pub async fn context_is_kept_with_the_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let context: &[u8] = b"{\"tool\":\"deploy\"}\0\xff\xfe";
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).context(context))
        .await;
    let seen = other
        .get(&id, &f.owner)
        .await
        .unwrap()
        .expect("visible on B");
    assert_eq!(seen.context.as_deref(), Some(context));
    let view = other.view(&task).await.unwrap().expect("viewed on B");
    assert_eq!(view.record, seen);
    assert!(is_changed(
        &f.apply(&task, WorkerChange::SetContext(b"second")).await
    ));
    let seen = other.get(&id, &f.owner).await.unwrap().unwrap();
    assert_eq!(seen.context.as_deref(), Some(&b"second"[..]));
    assert!(is_changed(
        &f.apply(&task, WorkerChange::Finish(Finish::Completed(b"{}")))
            .await
    ));
    assert_eq!(f.get(&id).await.context.as_deref(), Some(&b"second"[..]));

    let (_, none) = f.create().await;
    assert_eq!(f.get(&none).await.context, None, "no context given");
    let (_, empty) = f
        .create_with(NewTask::new(&f.owner, f.me).context(b""))
        .await;
    assert_eq!(
        f.get(&empty).await.context.as_deref(),
        Some(&b""[..]),
        "an empty context is kept apart from none"
    );

    let max = vec![b'c'; MAX_CONTEXT_BYTES];
    let (task, id) = f
        .create_with(NewTask::new(&f.owner, f.me).context(&max))
        .await;
    assert_eq!(f.get(&id).await.context.as_deref(), Some(&max[..]));
    let over = vec![b'c'; MAX_CONTEXT_BYTES + 1];
    assert!(matches!(
        f.store
            .create(NewTask::new(&f.owner, f.me).context(&over))
            .await,
        Err(Error::PayloadTooLarge { .. })
    ));
    let before = f.get(&id).await;
    assert!(matches!(
        f.store
            .apply(&task, f.me, WorkerChange::SetContext(&over))
            .await,
        Err(Error::PayloadTooLarge { .. })
    ));
    assert_eq!(
        f.get(&id).await,
        before,
        "a refused context changed nothing"
    );
    h.close(other).await;
    f.close(h).await;
}

/// T14, T5: the runtime's view reads a task whoever owns it, with its
/// owner, the record a read shows (expired and lost decided), and every
/// answer given and not yet taken, over several rounds of input; a task
/// never created or purged is `None`.
pub async fn view_reads_any_owner_with_every_answer<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let (owned, owned_id) = f.create().await;
    let (anon, anon_id) = f.create_with(NewTask::new(&Owner::Anonymous, f.me)).await;
    let view = other.view(&owned).await.unwrap().expect("the owned task");
    assert_eq!(view.owner, f.owner);
    assert_eq!(view.record, f.get(&owned_id).await);
    assert!(view.answers.is_empty());
    let view = other
        .view(&anon)
        .await
        .unwrap()
        .expect("the anonymous task");
    assert_eq!(view.owner, Owner::Anonymous);
    assert_eq!(
        Some(view.record),
        f.store.get(&anon_id, &Owner::Anonymous).await.unwrap()
    );

    // Two rounds, each answered; the worker takes none.
    f.request(&owned, "first").await;
    f.answer(&owned_id, &[("first", b"one\0")]).await;
    f.request(&owned, "second").await;
    f.answer(&owned_id, &[("second", b"\xfftwo")]).await;
    let view = other.view(&owned).await.unwrap().unwrap();
    assert_eq!(
        view.answers,
        [
            ("first".to_owned(), Bytes::from_static(b"one\0")),
            ("second".to_owned(), Bytes::from_static(b"\xfftwo")),
        ],
        "every answer not yet taken, in request order"
    );
    assert_eq!(keys(&view.answers), view.record.answered);
    assert_eq!(
        f.take(&owned, "first").await.as_deref(),
        Some(&b"one\0"[..])
    );
    let view = other.view(&owned).await.unwrap().unwrap();
    assert_eq!(keys(&view.answers), ["second"], "a taken answer is gone");

    // As a read shows it: expired reads failed.
    let (short, _) = f
        .create_with(NewTask::new(&f.owner, f.me).ttl(Duration::from_secs(60)))
        .await;
    f.clock.advance(Duration::from_secs(61));
    let view = other
        .view(&short)
        .await
        .unwrap()
        .expect("kept for its grace");
    assert_eq!(view.record.status, TaskStatus::Failed);
    assert_eq!(view.record.outcome.as_deref(), Some(EXPIRED_ERROR));
    f.clock.advance(Duration::from_secs(60));
    assert_eq!(other.view(&short).await.unwrap(), None, "past its grace");
    assert_eq!(
        other.view(&TaskId::generate().unwrap()).await.unwrap(),
        None,
        "never created"
    );
    h.close(other).await;
    f.close(h).await;
}

/// Replaces `id`'s outstanding inputs, each request `{"q":"<key>"}`.
async fn replace<S: TaskStore>(
    f: &Fixture<S>,
    id: &TaskId,
    keys: &[&str],
    message: Option<&str>,
) -> Applied {
    let requests: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| format!("{{\"q\":\"{k}\"}}").into_bytes())
        .collect();
    let pairs: Vec<(&str, &[u8])> = keys
        .iter()
        .zip(&requests)
        .map(|(k, r)| (*k, &r[..]))
        .collect();
    f.apply(
        id,
        WorkerChange::ReplaceInputs {
            requests: &pairs,
            message,
        },
    )
    .await
}

/// T15, T5: replacing the outstanding inputs supersedes the keys left out,
/// carries forward keys with the same request, and refuses, changing
/// nothing, a spent key (superseded or answered) or a live key pointed at
/// another request; the task is `input_required` while anything is
/// outstanding and `working` once nothing is; the same set again is no
/// change; limits and a cancel are refused as for one request.
pub async fn replacing_inputs_supersedes_and_carries_forward<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    let outstanding = |r: &TaskRecord| keys(&r.outstanding).join(",");
    assert!(is_changed(
        &replace(&f, &task, &["approval"], Some("needs a decision")).await
    ));
    let parked = f.get(&id).await;
    assert_eq!(parked.status, TaskStatus::InputRequired);
    assert_eq!(parked.message.as_deref(), Some("needs a decision"));
    assert_eq!(outstanding(&parked), "approval");
    assert!(is_changed(
        &replace(&f, &task, &["approval", "region"], None).await
    ));
    let carried = f.get(&id).await;
    assert_eq!(outstanding(&carried), "approval,region");
    assert_eq!(
        carried.message.as_deref(),
        Some("needs a decision"),
        "no message keeps the current one"
    );
    assert_eq!(
        replace(&f, &task, &["approval", "region"], None).await,
        Applied::Changed {
            rev: carried.rev,
            answer: None
        },
        "the same set again changes nothing"
    );
    assert_eq!(f.get(&id).await, carried);
    assert!(is_changed(&replace(&f, &task, &["region"], None).await));
    let narrowed = f.get(&id).await;
    assert_eq!(outstanding(&narrowed), "region");
    assert_eq!(
        replace(&f, &task, &["approval"], None).await,
        Applied::KeySpent,
        "a superseded key"
    );
    assert_eq!(
        f.get(&id).await,
        narrowed,
        "a refused replacement changed it"
    );
    assert_eq!(
        f.apply(
            &task,
            WorkerChange::RequestInput {
                key: "approval",
                request: b"{}"
            }
        )
        .await,
        Applied::KeySpent,
        "superseded by a replacement is spent for every change"
    );

    assert!(is_changed(
        &replace(&f, &task, &["region", "zone"], None).await
    ));
    let partial = f.answer(&id, &[("region", b"eu")]).await;
    assert_eq!(partial.status, TaskStatus::InputRequired);
    assert_eq!(
        replace(&f, &task, &["region", "zone"], None).await,
        Applied::KeySpent,
        "an answered key"
    );
    let repointed = [("zone", &b"{\"q\":\"something else\"}"[..])];
    assert_eq!(
        f.apply(
            &task,
            WorkerChange::ReplaceInputs {
                requests: &repointed,
                message: None
            }
        )
        .await,
        Applied::KeySpent,
        "a live key pointed at another request"
    );
    assert_eq!(f.get(&id).await, partial);
    let done = f.answer(&id, &[("zone", b"a")]).await;
    assert_eq!(done.status, TaskStatus::Working);
    assert!(done.outstanding.is_empty());
    assert!(is_changed(&replace(&f, &task, &["confirm"], None).await));
    assert!(is_changed(&replace(&f, &task, &[], None).await));
    let emptied = f.get(&id).await;
    assert_eq!(emptied.status, TaskStatus::Working, "nothing outstanding");
    assert!(emptied.outstanding.is_empty());
    assert_eq!(
        replace(&f, &task, &["confirm"], None).await,
        Applied::KeySpent
    );
    let view = f.store.view(&task).await.unwrap().unwrap();
    assert_eq!(keys(&view.answers), ["region", "zone"]);

    // Limits, as for one request.
    let many: Vec<String> = (0..=MAX_OUTSTANDING_INPUTS)
        .map(|i| format!("m{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for bad in [
        &many[..],
        &["twice", "twice"][..],
        &[""][..],
        &[&"k".repeat(257)[..]][..],
    ] {
        let requests: Vec<(&str, &[u8])> = bad.iter().map(|k| (*k, &b"{}"[..])).collect();
        assert!(
            matches!(
                f.store
                    .apply(
                        &task,
                        f.me,
                        WorkerChange::ReplaceInputs {
                            requests: &requests,
                            message: None
                        }
                    )
                    .await,
                Err(Error::Config(_))
            ),
            "{} keys starting {:?}",
            bad.len(),
            bad.first()
        );
    }
    assert_eq!(f.get(&id).await, emptied);
    let big = vec![b'r'; MAX_INPUT_BYTES + 1];
    assert!(matches!(
        f.store
            .apply(
                &task,
                f.me,
                WorkerChange::ReplaceInputs {
                    requests: &[("big", &big)],
                    message: None
                }
            )
            .await,
        Err(Error::PayloadTooLarge { .. })
    ));
    f.cancel(&id, CancelMode::Cooperative).await;
    assert_eq!(
        replace(&f, &task, &["late"], None).await,
        Applied::CancelRequested
    );
    f.close(h).await;
}

/// T15, T4: replacements racing on two handles are each one atomic step:
/// of 16 replacing with a fresh key each, every one changes the task once,
/// one key is left outstanding and every other is spent; of 16 admitting
/// the same fresh key with different requests, exactly one does.
pub async fn racing_replacements_admit_each_key_once<H: TaskHarness>(h: &H) {
    let f = Arc::new(fixture(h).await);
    let other = Arc::new(h.open(test_options(&f.clock)).await);
    let (task, id) = f.create().await;
    let before = f.get(&id).await;
    let mut racers = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            None
        } else {
            Some(other.clone())
        };
        let f = f.clone();
        racers.push(tokio::spawn(async move {
            let key = format!("k{i}");
            let request = format!("{{\"n\":{i}}}").into_bytes();
            let change = WorkerChange::ReplaceInputs {
                requests: &[(&key, &request)],
                message: None,
            };
            let applied = match store {
                None => f.store.apply(&task, f.me, change).await,
                Some(other) => other.apply(&task, f.me, change).await,
            };
            (key, applied.unwrap())
        }));
    }
    let mut keys_changed = Vec::new();
    for racer in racers {
        let (key, applied) = racer.await.unwrap();
        assert!(is_changed(&applied), "{key}: {applied:?}");
        keys_changed.push(key);
    }
    let after = f.get(&id).await;
    assert_eq!(after.rev, before.rev + 16, "each replacement one change");
    assert_eq!(after.outstanding.len(), 1);
    let last = after.outstanding[0].0.clone();
    for key in &keys_changed {
        let again = f
            .apply(
                &task,
                WorkerChange::RequestInput {
                    key,
                    request: b"{}",
                },
            )
            .await;
        assert_eq!(again, Applied::KeySpent, "{key} was used");
        if *key != last {
            assert!(
                !f.get(&id).await.outstanding.iter().any(|(k, _)| k == key),
                "{key} was superseded"
            );
        }
    }

    let (task, id) = f.create().await;
    let mut racers = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            None
        } else {
            Some(other.clone())
        };
        let f = f.clone();
        racers.push(tokio::spawn(async move {
            let request = format!("{{\"n\":{i}}}").into_bytes();
            let change = WorkerChange::ReplaceInputs {
                requests: &[("same", &request)],
                message: None,
            };
            let applied = match store {
                None => f.store.apply(&task, f.me, change).await,
                Some(other) => other.apply(&task, f.me, change).await,
            };
            (request, applied.unwrap())
        }));
    }
    let mut admitted = Vec::new();
    for racer in racers {
        let (request, applied) = racer.await.unwrap();
        match applied {
            Applied::Changed { .. } => admitted.push(request),
            Applied::KeySpent => {}
            other => panic!("a racing replacement answered {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 1, "exactly one admits the key");
    let parked = f.get(&id).await;
    assert_eq!(parked.outstanding.len(), 1);
    assert_eq!(parked.outstanding[0].1[..], admitted[0][..]);
    match Arc::try_unwrap(other) {
        Ok(other) => h.close(other).await,
        Err(_) => panic!("a racer kept the handle"),
    }
    match Arc::try_unwrap(f) {
        Ok(f) => f.close(h).await,
        Err(_) => panic!("a racer kept the fixture"),
    }
}

// ---------------------------------------------------------------- T16 to T19

/// The lease the takeover cases give an instance that is to lapse.
const LEASE: Duration = Duration::from_secs(30);

/// A new instance on `store`, alive for `lease`.
async fn instance<S: TaskStore>(store: &S, lease: Duration) -> InstanceId {
    let id = InstanceId::generate().unwrap();
    assert!(store.heartbeat(id, lease).await.unwrap());
    id
}

/// A task that may be taken over (`max_attempts` runs), created and run
/// by a fresh instance alive for [`LEASE`]: its id, text and creator.
async fn takeover_task<S: TaskStore>(
    f: &Fixture<S>,
    max_attempts: u32,
) -> (TaskId, String, InstanceId) {
    let creator = instance(&f.store, LEASE).await;
    let (task, id) = f
        .create_with(
            NewTask::new(&f.owner, creator)
                .context(b"{\"tool\":\"count\"}")
                .takeover(max_attempts),
        )
        .await;
    (task, id, creator)
}

/// The one claim `by` makes for the task `task` (a case with no other
/// waiting task).
async fn claim_one<S: TaskStore>(store: &S, by: InstanceId, task: &TaskId) -> Claimed {
    let mut claimed = store.claim(by, 16).await.unwrap();
    assert_eq!(claimed.len(), 1, "one task waits: {claimed:?}");
    let claim = claimed.pop().unwrap();
    assert_eq!(claim.task, task.digest());
    assert_eq!(claim.worker.instance, by);
    claim
}

/// The task's takeover state as `get` shows it.
async fn takeover_of<S: TaskStore>(f: &Fixture<S>, id: &str) -> Takeover {
    f.get(id)
        .await
        .takeover
        .expect("the task may be taken over")
}

/// T16, T17, T9: of 32 live instances on several handles racing to claim
/// the tasks of an instance that lapsed, each task is claimed exactly
/// once, under epoch 2, counting a second run; the claims are seen on
/// every handle, and nothing is left to claim.
pub async fn exactly_one_of_racing_instances_claims_a_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let mut handles = vec![];
    for _ in 0..4 {
        handles.push(Arc::new(h.open(test_options(&f.clock)).await));
    }
    let gone = instance(&f.store, LEASE).await;
    let mut tasks = HashSet::new();
    for _ in 0..3 {
        let (task, _) = f
            .create_with(NewTask::new(&f.owner, gone).takeover(3))
            .await;
        tasks.insert(task.digest());
    }
    let (_, plain) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let mut racers = vec![];
    for n in 0..32 {
        racers.push(instance(&*handles[n % handles.len()], DAY).await);
    }
    f.clock.advance(LEASE);
    let mut claims = tokio::task::JoinSet::new();
    for (n, racer) in racers.iter().copied().enumerate() {
        let store = handles[n % handles.len()].clone();
        claims.spawn(async move { store.claim(racer, 16).await.unwrap() });
    }
    let mut claimed = vec![];
    while let Some(won) = claims.join_next().await {
        claimed.extend(won.unwrap());
    }
    let won: HashSet<TaskDigest> = claimed.iter().map(|c| c.task).collect();
    assert_eq!(
        claimed.len(),
        3,
        "each task claimed exactly once: {claimed:?}"
    );
    assert_eq!(won, tasks);
    for claim in &claimed {
        assert!(racers.contains(&claim.worker.instance));
        assert_eq!(claim.worker.epoch, 2);
        let takeover = claim.view.record.takeover.clone().unwrap();
        assert_eq!((takeover.attempt(), takeover.epoch), (2, 2));
        assert!(!takeover.released);
        assert_eq!(claim.view.record.status, TaskStatus::Working);
        assert_eq!(claim.view.owner, f.owner);
        for handle in &handles {
            let seen = handle.view_claimed(&claim.task).await.unwrap().unwrap();
            assert_eq!(seen.record.takeover, Some(takeover.clone()));
        }
    }
    assert_eq!(
        f.get(&plain).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR),
        "a task that dies with its instance is not taken over"
    );
    assert!(f.store.claim(racers[0], 16).await.unwrap().is_empty());
    for handle in handles {
        match Arc::try_unwrap(handle) {
            Ok(handle) => h.close(handle).await,
            Err(_) => panic!("a racer kept a handle"),
        }
    }
    f.close(h).await;
}

/// T18: every worker write names its claim. The creator writes under epoch
/// 1 while it lives; once it lapses its writes are refused (`Fenced`),
/// before and after another instance claims the task; the claimant's
/// writes under an older epoch are refused too, and under its claim go
/// through. A refused write changes nothing. Checkpoint and release are
/// refused (`NoTakeover`) on a task that dies with its instance.
pub async fn a_stale_claim_is_fenced<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, creator) = takeover_task(&f, 3).await;
    let first = Worker::first(creator);
    let digest = task.digest();
    let message = WorkerChange::SetMessage(Some("run 1"));
    assert!(is_changed(
        &f.store
            .apply_claimed(&digest, first, message)
            .await
            .unwrap()
    ));
    assert!(is_changed(
        &f.store.apply(&task, creator, message).await.unwrap()
    ));
    let other = instance(&f.store, DAY).await;
    assert_eq!(
        f.store
            .apply_claimed(&digest, Worker::first(other), message)
            .await
            .unwrap(),
        Applied::Fenced,
        "another instance wrote under the creator's epoch"
    );
    f.clock.advance(LEASE);
    let before = f.get(&id).await;
    let late = WorkerChange::Finish(Finish::Completed(b"{\"late\":1}"));
    assert_eq!(
        f.store.apply_claimed(&digest, first, late).await.unwrap(),
        Applied::Fenced,
        "a lapsed instance wrote to a task that may be taken over"
    );
    assert_eq!(f.get(&id).await, before);
    let claim = claim_one(&f.store, other, &task).await;
    for stale in [first, Worker::first(other)] {
        assert_eq!(
            f.store.apply_claimed(&digest, stale, late).await.unwrap(),
            Applied::Fenced
        );
    }
    assert_eq!(f.get(&id).await, claim.view.record);
    let done = WorkerChange::Finish(Finish::Completed(b"{\"run\":2}"));
    assert!(is_changed(
        &f.store
            .apply_claimed(&digest, claim.worker, done)
            .await
            .unwrap()
    ));
    let completed = f.get(&id).await;
    assert_eq!(completed.status, TaskStatus::Completed);
    assert_eq!(completed.outcome.as_deref(), Some(&b"{\"run\":2}"[..]));
    assert_eq!(
        f.store.apply_claimed(&digest, first, late).await.unwrap(),
        Applied::AlreadyTerminal(TaskStatus::Completed)
    );
    let (plain, _) = f.create().await;
    for change in [WorkerChange::Checkpoint(b"1"), WorkerChange::Release] {
        assert_eq!(f.apply(&plain, change).await, Applied::NoTakeover);
    }
    f.close(h).await;
}

/// T16: runs are bounded. A task of 2 runs whose instance lapses reads
/// `working` while it waits, is claimed for its second run, and when that
/// run's instance lapses too it reads `failed` ("server instance lost"),
/// is claimed by nobody, and the purge ends it as orphaned. A task of one
/// run is not taken over at all.
pub async fn runs_are_bounded<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, _) = takeover_task(&f, 2).await;
    let (_, single, _) = takeover_task(&f, 1).await;
    f.clock.advance(LEASE);
    let waiting = f.get(&id).await;
    assert_eq!(waiting.status, TaskStatus::Working, "it waits for a claim");
    assert_eq!(
        f.get(&single).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR)
    );
    let second = instance(&f.store, LEASE).await;
    let claim = claim_one(&f.store, second, &task).await;
    assert_eq!(claim.view.record.takeover.as_ref().unwrap().attempt(), 2);
    f.clock.advance(LEASE);
    let lost = f.get(&id).await;
    assert_eq!(lost.status, TaskStatus::Failed);
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    let third = instance(&f.store, DAY).await;
    assert!(f.store.claim(third, 16).await.unwrap().is_empty());
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().orphaned, 2);
    assert_eq!(f.get(&id).await, lost);
    assert!(
        matches!(
            f.store
                .create(NewTask::new(&f.owner, third).takeover(0))
                .await,
            Err(Error::Config(_))
        ),
        "a task with no run was created"
    );
    f.close(h).await;
}

/// T19, T13, T14: the newest checkpoint, byte for byte, survives a
/// takeover with the context, every untaken answer and the owner; a
/// checkpoint accepts exactly [`MAX_CHECKPOINT_BYTES`] and refuses one
/// byte more, changing nothing. A watch by digest sees the claim.
pub async fn a_checkpoint_survives_a_takeover<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, creator) = takeover_task(&f, 3).await;
    let run1 = Worker::first(creator);
    let digest = task.digest();
    let write = |change| f.store.apply_claimed(&digest, run1, change);
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(b"step 3")).await.unwrap()
    ));
    let newest: &[u8] = b"step 4\0\xff\xfe";
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(newest)).await.unwrap()
    ));
    let full = vec![b'c'; MAX_CHECKPOINT_BYTES];
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(&full)).await.unwrap()
    ));
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(newest)).await.unwrap()
    ));
    let before = f.get(&id).await;
    let over = vec![b'c'; MAX_CHECKPOINT_BYTES + 1];
    assert_too_large(write(WorkerChange::Checkpoint(&over)).await, "checkpoint");
    assert_eq!(f.get(&id).await, before);
    let request = WorkerChange::RequestInput {
        key: "name",
        request: b"{\"q\":\"name?\"}",
    };
    assert!(is_changed(&write(request).await.unwrap()));
    f.answer(&id, &[("name", b"\"ada\"")]).await;
    f.clock.advance(LEASE);
    let other = f
        .store
        .watch_claimed(&digest, 0, LONG)
        .await
        .unwrap()
        .unwrap();
    let rev = other.rev;
    let next = instance(&f.store, DAY).await;
    let claim = claim_one(&f.store, next, &task).await;
    let takeover = claim.view.record.takeover.clone().unwrap();
    assert_eq!(takeover.checkpoint.as_deref(), Some(newest));
    assert_eq!(
        claim.view.record.context.as_deref(),
        Some(&b"{\"tool\":\"count\"}"[..])
    );
    assert_eq!(claim.view.answers.len(), 1);
    assert_eq!(claim.view.answers[0].0, "name");
    assert_eq!(&claim.view.answers[0].1[..], b"\"ada\"");
    assert_eq!(claim.view.owner, f.owner);
    let woken = f
        .store
        .watch_claimed(&digest, rev, LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(woken.rev > rev);
    assert_eq!(woken.takeover, Some(takeover));
    assert_eq!(
        f.store.view_claimed(&digest).await.unwrap().unwrap(),
        claim.view
    );
    f.close(h).await;
}

/// T17, T6: cancel across a takeover behaves as on one instance. A
/// cooperative cancel asked while nobody runs the task is claimed with
/// the task, and the claimant ends it `cancelled`; an immediate cancel
/// while nobody runs it ends it at once, and nobody claims it.
pub async fn cancel_requested_during_a_takeover_is_honoured<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, _) = takeover_task(&f, 3).await;
    let (_, now, _) = takeover_task(&f, 3).await;
    f.clock.advance(LEASE);
    assert!(
        f.cancel(&id, CancelMode::Cooperative)
            .await
            .cancel_requested
    );
    let ended = f.cancel(&now, CancelMode::Immediate).await;
    assert_eq!(ended.status, TaskStatus::Cancelled);
    let next = instance(&f.store, DAY).await;
    let claim = claim_one(&f.store, next, &task).await;
    assert!(claim.view.record.cancel_requested);
    let cancel = WorkerChange::Finish(Finish::Cancelled);
    assert!(is_changed(
        &f.store
            .apply_claimed(&claim.task, claim.worker, cancel)
            .await
            .unwrap()
    ));
    assert_eq!(f.get(&id).await.status, TaskStatus::Cancelled);
    assert_eq!(f.get(&now).await, ended);
    assert!(f.store.claim(next, 16).await.unwrap().is_empty());
    f.close(h).await;
}

/// T17, T5: a worker that waits for input releases the task, and holds
/// nothing: no claim takes it while its input is outstanding, the
/// releaser's writes are refused, and a lapse of the releaser changes
/// nothing. Answered, it is claimed (a release counts no run) with the
/// answer, which the claimant takes; the key stays spent.
pub async fn an_input_answered_while_nobody_holds_the_task_resumes_it<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, creator) = takeover_task(&f, 3).await;
    let run1 = Worker::first(creator);
    let digest = task.digest();
    let request = WorkerChange::RequestInput {
        key: "confirm",
        request: b"{\"q\":\"sure?\"}",
    };
    assert!(is_changed(
        &f.store.apply_claimed(&digest, run1, request).await.unwrap()
    ));
    assert!(is_changed(
        &f.store
            .apply_claimed(&digest, run1, WorkerChange::Release)
            .await
            .unwrap()
    ));
    assert!(takeover_of(&f, &id).await.released);
    let waiter = instance(&f.store, DAY).await;
    assert!(f.store.claim(waiter, 16).await.unwrap().is_empty());
    assert_eq!(
        f.store
            .apply_claimed(&digest, run1, WorkerChange::SetMessage(Some("x")))
            .await
            .unwrap(),
        Applied::Fenced,
        "a worker wrote to the task it released"
    );
    f.clock.advance(LEASE);
    let parked = f.get(&id).await;
    assert_eq!(
        parked.status,
        TaskStatus::InputRequired,
        "a release outlives its worker"
    );
    let answered = f.answer(&id, &[("confirm", b"true")]).await;
    assert_eq!(answered.status, TaskStatus::Working);
    let claim = claim_one(&f.store, waiter, &task).await;
    let takeover = claim.view.record.takeover.clone().unwrap();
    assert_eq!((takeover.attempt(), takeover.epoch), (1, 2));
    assert_eq!(claim.view.answers.len(), 1);
    let take = WorkerChange::TakeAnswer { key: "confirm" };
    match f
        .store
        .apply_claimed(&digest, claim.worker, take)
        .await
        .unwrap()
    {
        Applied::Changed {
            answer: Some(answer),
            ..
        } => assert_eq!(&answer[..], b"true"),
        other => panic!("take: {other:?}"),
    }
    let again = WorkerChange::RequestInput {
        key: "confirm",
        request: b"{}",
    };
    assert_eq!(
        f.store
            .apply_claimed(&digest, claim.worker, again)
            .await
            .unwrap(),
        Applied::KeySpent
    );
    f.close(h).await;
}

/// T17: a queued task waits, `working`, for a worker: its creator does not
/// hold it (its writes are refused) and its creator's lapse changes
/// nothing; a worker claims it without counting a run and finishes it.
pub async fn a_queued_task_waits_for_a_claim<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let server = instance(&f.store, LEASE).await;
    let (task, id) = f.create_with(NewTask::new(&f.owner, server).queued()).await;
    let takeover = takeover_of(&f, &id).await;
    assert!(takeover.released);
    assert_eq!(
        takeover.max_attempts,
        mcp_event_store_core::task::DEFAULT_MAX_ATTEMPTS
    );
    assert_eq!(
        f.store
            .apply(&task, server, WorkerChange::SetMessage(Some("x")))
            .await
            .unwrap(),
        Applied::Fenced
    );
    f.clock.advance(LEASE + LEASE);
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().orphaned, 0);
    let worker = instance(&f.store, DAY).await;
    let claim = claim_one(&f.store, worker, &task).await;
    let takeover = claim.view.record.takeover.clone().unwrap();
    assert_eq!((takeover.attempt(), takeover.epoch), (1, 2));
    let done = WorkerChange::Finish(Finish::Completed(b"{}"));
    assert!(is_changed(
        &f.store
            .apply_claimed(&claim.task, claim.worker, done)
            .await
            .unwrap()
    ));
    assert_eq!(f.get(&id).await.status, TaskStatus::Completed);
    f.close(h).await;
}

/// T17: a claim takes only tasks that wait for a runtime, and only for a
/// live instance: not a task whose instance lives, nor one that ended
/// (completed, expired), nor one that dies with its instance; a lapsed or
/// unknown instance's claim fails with [`Error::InstanceLapsed`] and
/// changes nothing.
pub async fn only_waiting_tasks_are_claimed_and_only_by_the_living<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, held, _) = {
        let (task, id) = f
            .create_with(NewTask::new(&f.owner, f.me).takeover(3))
            .await;
        (task, id, f.me)
    };
    let (done, done_id, creator) = takeover_task(&f, 3).await;
    f.store
        .apply_claimed(
            &done.digest(),
            Worker::first(creator),
            WorkerChange::Finish(Finish::Completed(b"{}")),
        )
        .await
        .unwrap();
    let (_, expiring, _) = {
        let gone = instance(&f.store, LEASE).await;
        let (task, id) = f
            .create_with(
                NewTask::new(&f.owner, gone)
                    .ttl(Duration::from_secs(20))
                    .takeover(3),
            )
            .await;
        (task, id, gone)
    };
    let gone = instance(&f.store, LEASE).await;
    let (_, plain) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let lapsing = instance(&f.store, LEASE).await;
    f.clock.advance(LEASE);
    // Compared as sets: a dump need not list rows in the same order twice
    // (a Redis Cluster's SCAN does not).
    let rows = || async {
        h.raw_rows().await.map(|mut rows| {
            rows.sort();
            rows
        })
    };
    let before = rows().await;
    for nobody in [lapsing, InstanceId::generate().unwrap()] {
        match f.store.claim(nobody, 16).await {
            Err(Error::InstanceLapsed { instance }) => assert_eq!(instance, nobody.to_string()),
            other => panic!("a claim by a lapsed instance: {other:?}"),
        }
    }
    assert_eq!(rows().await, before);
    let live = instance(&f.store, DAY).await;
    assert!(f.store.claim(live, 16).await.unwrap().is_empty());
    assert_eq!(f.get(&held).await.status, TaskStatus::Working);
    assert_eq!(f.get(&done_id).await.status, TaskStatus::Completed);
    assert_eq!(
        f.get(&expiring).await.outcome.as_deref(),
        Some(EXPIRED_ERROR)
    );
    assert_eq!(
        f.get(&plain).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR)
    );
    f.close(h).await;
}

/// T17: a claim takes at most its limit, and a claim of zero takes none.
pub async fn a_claim_takes_at_most_its_limit<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    for _ in 0..5 {
        f.create_with(NewTask::new(&f.owner, f.me).queued()).await;
    }
    let worker = instance(&f.store, DAY).await;
    assert!(f.store.claim(worker, 0).await.unwrap().is_empty());
    assert_eq!(f.store.claim(worker, 2).await.unwrap().len(), 2);
    assert_eq!(f.store.claim(worker, 10).await.unwrap().len(), 3);
    assert!(f.store.claim(worker, 10).await.unwrap().is_empty());
    f.close(h).await;
}

#[cfg(test)]
mod registration {
    //! Every case this file defines is registered by the macro, once.

    #[test]
    fn every_case_is_registered() {
        let source = include_str!("mod.rs");
        let start = source.find("macro_rules! task_suite").unwrap();
        let end = source[start..]
            .find("macro_rules! __task_conformance_cases")
            .unwrap();
        let registered: Vec<&str> = source[start..start + end]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect();
        let defined: Vec<&str> = source
            .lines()
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .filter(|rest| rest.contains("TaskHarness"))
            .map(|rest| rest.split(['<', '(']).next().unwrap_or_default())
            .collect();
        assert!(defined.len() >= 20, "found only {defined:?}");
        for case in defined {
            assert_eq!(
                registered.iter().filter(|w| **w == case).count(),
                1,
                "{case} is not registered exactly once"
            );
        }
    }
}
