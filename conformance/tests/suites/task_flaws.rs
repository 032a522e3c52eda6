//! The task suite must fail task stores that break the contract. Each test
//! here runs cases against a deliberately flawed wrapper of
//! `MemoryTaskStore` and expects one to panic.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use mcp_event_store_conformance::tasks::{self, MemoryTaskHarness, TaskHarness};
use mcp_event_store_core::task::*;
use mcp_event_store_core::{Result, StoreOptions};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
    /// A finisher that finds the task terminal is told it won anyway.
    TwoFinishersWin,
    /// Every owner sees every task.
    IgnoresOwner,
    /// Reads ignore the ttl.
    NeverExpires,
    /// A watch is never woken: it reads again only at its `max_wait`.
    DeafWatches,
    /// Replacing the outstanding inputs only adds the new keys, one
    /// request at a time, superseding nothing.
    ReplaceOnlyAdds,
    /// The runtime's view shows no answers.
    ViewWithoutAnswers,
    /// A write under a stale claim is reported written.
    UnfencedWrites,
    /// A claim is a read then a write, not one step: every claimant
    /// that read the task before the first write claims it too.
    ClaimsTwice,
    /// A cancel's reason is dropped (T20).
    ForgetsCancelReasons,
    /// An expired task reads as missing at once (T21).
    ExpiredReadsMissing,
    /// Retiring an instance leaves its lease running.
    RetireKeepsAlive,
    /// Each page of the operators' listing after the first drops its
    /// first task.
    ListingSkipsAcrossPages,
    /// The operators' listing does not say where a task runs.
    ListingHidesInstances,
    /// An operator's cancel only asks, as a cooperative cancel would.
    OperatorCancelOnlyAsks,
    /// A requeue leaves a task held, so no claim takes it.
    RequeueLeavesItHeld,
}

struct Flawed {
    inner: MemoryTaskStore,
    flaw: Flaw,
    /// Every claim made through any handle, for [`Flaw::ClaimsTwice`].
    claimed: Arc<std::sync::Mutex<Vec<Claimed>>>,
}

#[async_trait]
impl TaskStore for Flawed {
    async fn try_create(&self, id: &TaskId, t: &NewTask<'_>) -> Result<Option<TaskRecord>> {
        match self.flaw {
            Flaw::IgnoresOwner => {
                let mut t = *t;
                t.owner = &Owner::Anonymous;
                self.inner.try_create(id, &t).await
            }
            _ => self.inner.try_create(id, t).await,
        }
    }
    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
        match self.flaw {
            Flaw::IgnoresOwner => self.inner.get(id, &Owner::Anonymous).await,
            Flaw::NeverExpires => {
                let record = self.inner.get(id, who).await?;
                Ok(record.map(|mut r| {
                    if r.outcome.as_deref() == Some(EXPIRED_ERROR) {
                        r.status = TaskStatus::Working;
                    }
                    r
                }))
            }
            Flaw::ExpiredReadsMissing => Ok(self
                .inner
                .get(id, who)
                .await?
                .filter(|r| r.outcome.as_deref() != Some(EXPIRED_ERROR))),
            _ => self.inner.get(id, who).await,
        }
    }
    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        r: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        self.inner.answer(id, who, r).await
    }
    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let reason = reason.filter(|_| self.flaw != Flaw::ForgetsCancelReasons);
        self.inner.request_cancel(id, who, mode, reason).await
    }
    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        if self.flaw == Flaw::DeafWatches {
            let now = self.inner.get(id, who).await?;
            if now.as_ref().is_none_or(|task| task.rev > after) {
                return Ok(now);
            }
            tokio::time::sleep(max_wait).await;
            return self.inner.get(id, who).await;
        }
        self.inner.watch(id, who, after, max_wait).await
    }
    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
        self.inner.purge_expired_tasks().await
    }
    async fn delete(&self, id: &str) -> Result<bool> {
        self.inner.delete(id).await
    }
}

#[async_trait]
impl RuntimeStore for Flawed {
    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        if self.flaw == Flaw::RetireKeepsAlive && lease.is_zero() {
            return self.inner.is_alive(me).await;
        }
        self.inner.heartbeat(me, lease).await
    }
    async fn is_alive(&self, id: InstanceId) -> Result<bool> {
        self.inner.is_alive(id).await
    }
    async fn instances(&self) -> Result<Vec<InstanceLease>> {
        self.inner.instances().await
    }
    async fn watch_claimed(
        &self,
        id: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        self.inner.watch_claimed(id, after, max_wait).await
    }
    async fn apply_claimed(
        &self,
        id: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        if let (Flaw::ReplaceOnlyAdds, WorkerChange::ReplaceInputs { requests, .. }) =
            (self.flaw, change)
        {
            let mut applied = Applied::Unknown;
            for (key, request) in requests {
                applied = self
                    .inner
                    .apply_claimed(id, by, WorkerChange::RequestInput { key, request })
                    .await?;
            }
            return Ok(applied);
        }
        let applied = self.inner.apply_claimed(id, by, change).await?;
        match (self.flaw, applied) {
            (Flaw::UnfencedWrites, Applied::Fenced) => Ok(Applied::Changed {
                rev: 0,
                answer: None,
            }),
            (Flaw::TwoFinishersWin, Applied::AlreadyTerminal(_)) => Ok(Applied::Changed {
                rev: 0,
                answer: None,
            }),
            (_, applied) => Ok(applied),
        }
    }
    async fn claim(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let mut claimed = self.inner.claim(by, limit).await?;
        let mut all = self.claimed.lock().unwrap();
        all.extend(claimed.iter().cloned());
        if self.flaw == Flaw::ClaimsTwice {
            for earlier in all.iter() {
                if !claimed.iter().any(|c| c.task == earlier.task) {
                    claimed.push(Claimed::new(
                        earlier.task,
                        Worker {
                            instance: by,
                            epoch: earlier.worker.epoch,
                        },
                        earlier.view.clone(),
                    ));
                }
            }
        }
        Ok(claimed)
    }
    async fn view_claimed(&self, id: &TaskDigest) -> Result<Option<TaskView>> {
        let view = self.inner.view_claimed(id).await?;
        Ok(view.map(|view| match self.flaw {
            Flaw::ViewWithoutAnswers => TaskView::new(view.owner, view.record, Vec::new()),
            _ => view,
        }))
    }
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskPage> {
        let mut page = self.inner.task_page(after, limit).await?;
        match self.flaw {
            Flaw::ListingSkipsAcrossPages if after.is_some() && !page.tasks.is_empty() => {
                page.tasks.remove(0);
            }
            Flaw::ListingHidesInstances => {
                for entry in &mut page.tasks {
                    entry.view.instance = None;
                }
            }
            _ => {}
        }
        Ok(page)
    }
    async fn cancel_task(
        &self,
        task: &TaskDigest,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        if self.flaw == Flaw::OperatorCancelOnlyAsks {
            let Some(view) = self.inner.view_claimed(task).await? else {
                return Ok(None);
            };
            // Reports the task as it is, ending nothing.
            return Ok(Some(view.record));
        }
        self.inner.cancel_task(task, reason).await
    }
    async fn requeue_task(&self, task: &TaskDigest) -> Result<Requeue> {
        let requeued = self.inner.requeue_task(task).await?;
        if let (Flaw::RequeueLeavesItHeld, Requeue::Requeued(_)) = (self.flaw, &requeued) {
            // A claim by an instance that then stops: held, never run.
            let holder = InstanceId::generate()?;
            self.inner
                .heartbeat(holder, Duration::from_secs(86_400))
                .await?;
            self.inner.claim(holder, 1).await?;
        }
        Ok(requeued)
    }
}

struct FlawedHarness {
    memory: MemoryTaskHarness,
    flaw: Flaw,
    claimed: Arc<std::sync::Mutex<Vec<Claimed>>>,
}

#[async_trait]
impl TaskHarness for FlawedHarness {
    type Store = Flawed;

    async fn open(&self, options: StoreOptions) -> Flawed {
        Flawed {
            inner: self.memory.open(options).await,
            flaw: self.flaw,
            claimed: self.claimed.clone(),
        }
    }

    async fn open_without_recheck(&self, options: StoreOptions) -> Flawed {
        self.open(options).await
    }

    /// The flaws are of the task side, over a store of tasks alone.
    fn rewriter<'s>(
        &self,
        _: &'s Flawed,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        None
    }
}

async fn assert_case_fails<F, Fut>(flaw: Flaw, case: F)
where
    F: FnOnce(FlawedHarness) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let harness = FlawedHarness {
        memory: MemoryTaskHarness::new().await,
        flaw,
        claimed: Arc::default(),
    };
    let outcome = AssertUnwindSafe(case(harness)).catch_unwind().await;
    assert!(outcome.is_err(), "the task suite let {flaw:?} through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_winning_finishers_fail_the_suite() {
    assert_case_fails(Flaw::TwoFinishersWin, |h| async move {
        tasks::racing_finishers_exactly_one_wins(&h).await
    })
    .await;
    assert_case_fails(Flaw::TwoFinishersWin, |h| async move {
        tasks::every_status_and_operation(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_store_that_ignores_the_owner_fails_the_suite() {
    assert_case_fails(Flaw::IgnoresOwner, |h| async move {
        tasks::wrong_owner_is_indistinguishable_from_unknown(&h).await
    })
    .await;
}

/// On paused time: the case's 30 s guard passes at once, long before
/// the deaf watch's hour.
#[tokio::test(start_paused = true)]
async fn a_store_that_loses_wake_ups_fails_the_suite() {
    assert_case_fails(Flaw::DeafWatches, |h| async move {
        tasks::watch_wakes_across_handles(&h).await
    })
    .await;
    assert_case_fails(Flaw::DeafWatches, |h| async move {
        tasks::answer_on_one_handle_wakes_a_watch_on_another(&h).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_supersedes_nothing_fails_the_suite() {
    assert_case_fails(Flaw::ReplaceOnlyAdds, |h| async move {
        tasks::replacing_inputs_supersedes_and_carries_forward(&h).await
    })
    .await;
    assert_case_fails(Flaw::ReplaceOnlyAdds, |h| async move {
        tasks::racing_replacements_admit_each_key_once(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_view_without_the_answers_fails_the_suite() {
    assert_case_fails(Flaw::ViewWithoutAnswers, |h| async move {
        tasks::view_reads_any_owner_with_every_answer(&h).await
    })
    .await;
}

#[tokio::test]
async fn unfenced_writes_fail_the_suite() {
    assert_case_fails(Flaw::UnfencedWrites, |h| async move {
        tasks::a_stale_claim_is_fenced(&h).await
    })
    .await;
    assert_case_fails(Flaw::UnfencedWrites, |h| async move {
        tasks::an_input_answered_while_nobody_holds_the_task_resumes_it(&h).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_is_not_one_step_fails_the_suite() {
    assert_case_fails(Flaw::ClaimsTwice, |h| async move {
        tasks::exactly_one_of_racing_instances_claims_a_task(&h).await
    })
    .await;
    assert_case_fails(Flaw::ClaimsTwice, |h| async move {
        tasks::a_claim_takes_at_most_its_limit(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_store_that_forgets_cancel_reasons_fails_the_suite() {
    assert_case_fails(Flaw::ForgetsCancelReasons, |h| async move {
        tasks::a_cancel_keeps_its_reason(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_store_whose_expired_tasks_read_missing_fails_the_suite() {
    assert_case_fails(Flaw::ExpiredReadsMissing, |h| async move {
        tasks::an_expired_task_reads_expired_for_the_whole_grace(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_retirement_that_keeps_the_lease_fails_the_suite() {
    assert_case_fails(Flaw::RetireKeepsAlive, |h| async move {
        tasks::leases_are_read_and_a_retired_instance_lapses_at_once(&h).await
    })
    .await;
}

#[tokio::test]
async fn an_operators_listing_that_skips_or_hides_fails_the_suite() {
    for flaw in [Flaw::ListingSkipsAcrossPages, Flaw::ListingHidesInstances] {
        assert_case_fails(flaw, |h| async move {
            tasks::operators_list_every_task_with_its_instance(&h).await
        })
        .await;
    }
}

#[tokio::test]
async fn an_operator_cancel_that_only_asks_fails_the_suite() {
    assert_case_fails(Flaw::OperatorCancelOnlyAsks, |h| async move {
        tasks::an_operator_cancels_any_owners_task(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_requeue_that_leaves_the_task_held_fails_the_suite() {
    assert_case_fails(Flaw::RequeueLeavesItHeld, |h| async move {
        tasks::a_requeue_gives_an_exhausted_task_another_run(&h).await
    })
    .await;
    assert_case_fails(Flaw::RequeueLeavesItHeld, |h| async move {
        tasks::a_requeue_is_seen_on_every_handle(&h).await
    })
    .await;
}

#[tokio::test]
async fn a_store_whose_tasks_never_expire_fails_the_suite() {
    assert_case_fails(Flaw::NeverExpires, |h| async move {
        tasks::expired_task_reads_failed(&h).await
    })
    .await;
}

/// Rewrite flaws (C22), over the memory store that holds tasks beside
/// its events: its own rewriter, with one flaw.
mod rewrite {
    use super::*;
    use mcp_event_store_conformance::events::MemoryHarness;
    use mcp_event_store_core::rewrite::{
        RewriteStore, SessionValuePage, Swap, TaskField, TaskValuePage,
    };
    use mcp_event_store_core::{EventId, EventStore, MemoryStore, Replay, SessionDigest};

    #[derive(Clone, Copy, Debug)]
    enum RewriteFlaw {
        /// A task swap writes whatever the value holds.
        SwapsUnconditionally,
        /// A task swap zeroes the task's other values too.
        SwapTouchesOtherValues,
        /// The listing leaves out the task's inputs.
        ListingOmitsInputs,
    }

    struct FlawedRewriter {
        store: MemoryStore,
        flaw: RewriteFlaw,
    }

    impl FlawedRewriter {
        fn inner(&self) -> &dyn RewriteStore {
            self.store.rewriter().expect("the memory store rewrites")
        }

        async fn current(&self, digest: &TaskDigest, field: &TaskField) -> Option<Vec<u8>> {
            let page = self.inner().task_values(None, 100).await.ok()?;
            let task = page.tasks.into_iter().find(|t| t.digest == *digest)?;
            let value = task.values.into_iter().find(|v| v.field == *field)?;
            Some(value.bytes.to_vec())
        }
    }

    #[async_trait]
    impl RewriteStore for FlawedRewriter {
        async fn event_values(&self, stream_id: &str) -> Result<Replay> {
            self.inner().event_values(stream_id).await
        }
        fn rewrites_events(&self) -> bool {
            true
        }
        async fn swap_event(&self, s: &str, id: &EventId, e: &[u8], n: &[u8]) -> Result<Swap> {
            self.inner().swap_event(s, id, e, n).await
        }
        async fn session_values(
            &self,
            after: Option<&SessionDigest>,
            limit: usize,
        ) -> Result<SessionValuePage> {
            self.inner().session_values(after, limit).await
        }
        async fn swap_session(&self, d: &SessionDigest, e: &[u8], n: &[u8]) -> Result<Swap> {
            self.inner().swap_session(d, e, n).await
        }
        async fn task_values(
            &self,
            after: Option<&TaskDigest>,
            limit: usize,
        ) -> Result<TaskValuePage> {
            let mut page = self.inner().task_values(after, limit).await?;
            if matches!(self.flaw, RewriteFlaw::ListingOmitsInputs) {
                for task in &mut page.tasks {
                    task.values.retain(|v| v.field.input_key().is_none());
                }
            }
            Ok(page)
        }
        async fn swap_task(
            &self,
            digest: &TaskDigest,
            field: &TaskField,
            expected: &[u8],
            new: &[u8],
        ) -> Result<Swap> {
            match self.flaw {
                RewriteFlaw::SwapsUnconditionally => match self.current(digest, field).await {
                    Some(current) => self.inner().swap_task(digest, field, &current, new).await,
                    None => Ok(Swap::Changed),
                },
                RewriteFlaw::SwapTouchesOtherValues => {
                    let swapped = self.inner().swap_task(digest, field, expected, new).await?;
                    if swapped == Swap::Swapped {
                        let page = self.inner().task_values(None, 100).await?;
                        let task = page.tasks.into_iter().find(|t| t.digest == *digest);
                        for value in task.map(|t| t.values).unwrap_or_default() {
                            if value.field != *field {
                                let zeros = vec![0; value.bytes.len()];
                                let _ = self
                                    .inner()
                                    .swap_task(digest, &value.field, &value.bytes, &zeros)
                                    .await?;
                            }
                        }
                    }
                    Ok(swapped)
                }
                RewriteFlaw::ListingOmitsInputs => {
                    self.inner().swap_task(digest, field, expected, new).await
                }
            }
        }
    }

    struct RewriteFlawHarness {
        memory: MemoryHarness,
        flaw: RewriteFlaw,
    }

    #[async_trait]
    impl TaskHarness for RewriteFlawHarness {
        type Store = MemoryStore;

        async fn open(&self, options: StoreOptions) -> MemoryStore {
            TaskHarness::open(&self.memory, options).await
        }

        async fn open_without_recheck(&self, options: StoreOptions) -> MemoryStore {
            TaskHarness::open(&self.memory, options).await
        }

        /// Leaked: a test's few bytes, so the flawed rewriter lives as
        /// long as any borrow of the store.
        fn rewriter<'s>(&self, store: &'s MemoryStore) -> Option<&'s dyn RewriteStore> {
            Some(Box::leak(Box::new(FlawedRewriter {
                store: store.clone(),
                flaw: self.flaw,
            })))
        }
    }

    async fn assert_rewrite_case_fails(flaw: RewriteFlaw) {
        let harness = RewriteFlawHarness {
            memory: MemoryHarness::new().await,
            flaw,
        };
        let outcome = AssertUnwindSafe(tasks::task_values_are_swapped_only_over_the_bytes_read(
            &harness,
        ))
        .catch_unwind()
        .await;
        assert!(outcome.is_err(), "the task suite let {flaw:?} through");
    }

    #[tokio::test]
    async fn an_unconditional_task_swap_fails_the_suite() {
        assert_rewrite_case_fails(RewriteFlaw::SwapsUnconditionally).await;
    }

    #[tokio::test]
    async fn a_swap_that_touches_other_values_fails_the_suite() {
        assert_rewrite_case_fails(RewriteFlaw::SwapTouchesOtherValues).await;
    }

    #[tokio::test]
    async fn a_listing_without_inputs_fails_the_suite() {
        assert_rewrite_case_fails(RewriteFlaw::ListingOmitsInputs).await;
    }
}
