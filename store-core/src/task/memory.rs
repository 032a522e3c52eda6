//! The in-memory task store: the reference implementation of the contract.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use super::{
    Applied, CancelMode, Claimed, InstanceId, NewTask, Owner, Rev, TaskDigest, TaskId, TaskOptions,
    TaskPurgeReport, TaskRecord, TaskStore, TaskView, Worker, WorkerChange, millis,
};
use crate::backend::task::{InputEffect, Step, check_responses, count_ended, replacement};
use crate::error::{Error, Result};
use crate::options::StoreOptions;

/// A [`TaskStore`] kept in process memory.
///
/// Every mutation is one critical section under one lock, so exactly one
/// of racing finishers wins; each task has a `watch` channel of its `rev`
/// that its watchers subscribe to under the same lock as their read, so no
/// change slips between the two. Clones, and handles from
/// [`share_with_options`](Self::share_with_options), share the same data,
/// like two handles on one database. Nothing survives the process.
#[derive(Clone, Debug)]
pub struct MemoryTaskStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    options: StoreOptions,
    tasks: TaskOptions,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    tasks: HashMap<TaskDigest, Task>,
    /// Each instance's heartbeat deadline.
    instances: HashMap<InstanceId, i64>,
}

#[derive(Debug)]
struct Task {
    owner: Owner,
    instance: InstanceId,
    /// Everything but `outstanding` and `answered`, which `inputs` holds.
    record: TaskRecord,
    inputs: BTreeMap<String, Input>,
    next_seq: u64,
    /// The task's `rev`, for its watchers; dropped with the task, which
    /// wakes them to find it gone.
    changed: watch::Sender<Rev>,
}

#[derive(Debug)]
struct Input {
    seq: u64,
    state: InputState,
}

#[derive(Debug)]
enum InputState {
    Outstanding(Bytes),
    Answered(Bytes),
    /// Answered and taken, or superseded: the key is never usable again.
    Spent,
}

impl Task {
    /// The record as stored, with its inputs.
    fn stored(&self) -> TaskRecord {
        let mut inputs: Vec<_> = self.inputs.iter().collect();
        inputs.sort_by_key(|(_, input)| input.seq);
        let mut record = self.record.clone();
        for (key, input) in inputs {
            match &input.state {
                InputState::Outstanding(request) => {
                    record.outstanding.push((key.clone(), request.clone()))
                }
                InputState::Answered(_) => record.answered.push(key.clone()),
                InputState::Spent => {}
            }
        }
        record
    }

    /// The task as its runtime reads it at `now` (T14), given its
    /// instance's heartbeat deadline: with every answer not yet taken.
    fn view(&self, alive_until: Option<i64>, now: i64) -> Option<TaskView> {
        let seen = self.stored().seen_at(now, alive_until)?;
        let mut answered: Vec<_> = self
            .inputs
            .iter()
            .filter_map(|(key, input)| match &input.state {
                InputState::Answered(response) => Some((input.seq, key.clone(), response.clone())),
                _ => None,
            })
            .collect();
        answered.sort_by_key(|(seq, _, _)| *seq);
        let answers = answered
            .into_iter()
            .map(|(_, key, response)| (key, response))
            .collect();
        Some(TaskView::new(self.owner, seen, answers))
    }

    /// Marks every outstanding input superseded.
    fn supersede_inputs(&mut self) {
        for input in self.inputs.values_mut() {
            if matches!(input.state, InputState::Outstanding(_)) {
                input.state = InputState::Spent;
            }
        }
    }

    /// Keeps `record`, changed by the state machine (its `rev` bumped),
    /// without its inputs, which `inputs` holds, and wakes the watchers.
    fn commit(&mut self, record: TaskRecord) -> Rev {
        self.record = TaskRecord {
            outstanding: Vec::new(),
            answered: Vec::new(),
            ..record
        };
        self.changed.send_replace(self.record.rev);
        self.record.rev
    }
}

impl State {
    /// The task under `digest` as `who` may see it at `now` (`None` for
    /// any owner), with the task itself.
    fn seen(
        &mut self,
        digest: &TaskDigest,
        who: Option<&Owner>,
        now: i64,
    ) -> Option<(TaskRecord, &mut Task)> {
        let task = self.tasks.get_mut(digest)?;
        if who.is_some_and(|who| *who != task.owner) {
            return None;
        }
        let alive_until = self.instances.get(&task.instance).copied();
        let seen = task.stored().seen_at(now, alive_until)?;
        Some((seen, task))
    }
}

impl Default for MemoryTaskStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryTaskStore {
    /// A store with default options.
    pub fn new() -> Self {
        Self::with_options(StoreOptions::default(), TaskOptions::default())
    }

    /// A store with these options: `options` gives the clock and the
    /// outcome limit (`max_payload_bytes`), `tasks` the lifetimes.
    pub fn with_options(options: StoreOptions, tasks: TaskOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                tasks,
                state: Arc::default(),
            }),
        }
    }

    /// Another handle on the same data with other options (as two processes
    /// may open one database with different settings).
    pub fn share_with_options(&self, options: StoreOptions, tasks: TaskOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                tasks,
                state: self.inner.state.clone(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section completes its change before the guard
        // drops, so a poisoned lock holds nothing half-done.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> i64 {
        self.inner.options.clock.now_millis()
    }

    /// Every stored row as bytes, one per task and one per input, as a raw
    /// scan of a database would find them; for the conformance suite.
    #[cfg(feature = "conformance")]
    pub(crate) fn raw_rows(&self) -> Vec<Vec<u8>> {
        let state = self.state();
        let mut rows = Vec::new();
        for (digest, task) in &state.tasks {
            rows.push(format!("{digest:?} {:?} {:?}", task.owner, task.record).into_bytes());
            for (key, input) in &task.inputs {
                rows.push(format!("{digest:?} {key:?} {input:?}").into_bytes());
            }
        }
        rows.extend(
            state
                .instances
                .iter()
                .map(|(id, until)| format!("{id} {until}").into_bytes()),
        );
        rows
    }
}

#[async_trait]
impl TaskStore for MemoryTaskStore {
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> Result<Option<TaskRecord>> {
        task.check()?;
        let now = self.now();
        let record = TaskRecord::created(task, now, &self.inner.tasks);
        let mut state = self.state();
        if state
            .instances
            .get(&task.instance)
            .is_none_or(|until| *until <= now)
        {
            return Err(Error::instance_lapsed(&task.instance));
        }
        let std::collections::hash_map::Entry::Vacant(slot) = state.tasks.entry(id.digest()) else {
            return Ok(None);
        };
        slot.insert(Task {
            owner: *task.owner,
            instance: task.instance,
            record: record.clone(),
            inputs: BTreeMap::new(),
            next_seq: 0,
            changed: watch::channel(record.rev).0,
        });
        Ok(Some(record))
    }

    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let now = self.now();
        Ok(self
            .state()
            .seen(&digest, Some(who), now)
            .map(|(seen, _)| seen))
    }

    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        check_responses(responses)?;
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let now = self.now();
        let mut state = self.state();
        let Some((seen, task)) = state.seen(&digest, Some(who), now) else {
            return Ok(None);
        };
        if seen.status.is_terminal() {
            return Ok(Some(seen));
        }
        let mut record = task.stored();
        let answered = record.answer(responses, now);
        if answered.is_empty() {
            return Ok(Some(seen));
        }
        for (key, response) in answered {
            if let Some(input) = task.inputs.get_mut(*key) {
                input.state = InputState::Answered(Bytes::copy_from_slice(response));
            }
        }
        task.commit(record);
        Ok(Some(task.stored()))
    }

    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
    ) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let now = self.now();
        let mut state = self.state();
        let Some((seen, task)) = state.seen(&digest, Some(who), now) else {
            return Ok(None);
        };
        if seen.status.is_terminal() {
            return Ok(Some(seen));
        }
        let mut record = task.stored();
        if !record.request_cancel(mode, now) {
            return Ok(Some(seen));
        }
        task.supersede_inputs();
        task.commit(record);
        Ok(Some(task.stored()))
    }

    async fn apply_claimed(
        &self,
        digest: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        change.check(self.inner.options.max_payload_bytes)?;
        let now = self.now();
        let mut state = self.state();
        let holder_alive_until = state
            .tasks
            .get(digest)
            .and_then(|task| state.instances.get(&task.instance).copied());
        let Some((seen, task)) = state.seen(digest, None, now) else {
            return Ok(Applied::Unknown);
        };
        if seen.status.is_terminal() {
            return Ok(Applied::AlreadyTerminal(seen.status));
        }
        if task
            .record
            .fenced(&by, &task.instance.0, holder_alive_until, now)
        {
            return Ok(Applied::Fenced);
        }
        let mut record = task.stored();
        let effect = match record.apply(
            change,
            |key| task.inputs.contains_key(key),
            &self.inner.tasks,
            now,
        )? {
            Step::Unchanged(applied) => return Ok(applied),
            Step::Changed(effect) => effect,
        };
        let mut answer = None;
        match effect {
            InputEffect::None => {}
            InputEffect::Request { key, request } => {
                task.next_seq += 1;
                task.inputs.insert(
                    key.to_owned(),
                    Input {
                        seq: task.next_seq,
                        state: InputState::Outstanding(Bytes::copy_from_slice(request)),
                    },
                );
            }
            InputEffect::Take { key } => {
                if let Some(input) = task.inputs.get_mut(key)
                    && let InputState::Answered(response) =
                        std::mem::replace(&mut input.state, InputState::Spent)
                {
                    answer = Some(response);
                }
            }
            InputEffect::Supersede => {
                task.supersede_inputs();
            }
            InputEffect::Replace { requests } => {
                let (superseded, added) = replacement(&task.stored(), requests);
                for key in superseded {
                    if let Some(input) = task.inputs.get_mut(&key) {
                        input.state = InputState::Spent;
                    }
                }
                for (key, request) in added {
                    task.next_seq += 1;
                    task.inputs.insert(
                        key.to_owned(),
                        Input {
                            seq: task.next_seq,
                            state: InputState::Outstanding(Bytes::copy_from_slice(request)),
                        },
                    );
                }
            }
        }
        task.instance = by.instance;
        let rev = task.commit(record);
        Ok(Applied::Changed { rev, answer })
    }

    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        self.watch_as(&digest, Some(who), after, max_wait).await
    }

    async fn watch_claimed(
        &self,
        digest: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        self.watch_as(digest, None, after, max_wait).await
    }

    async fn claim(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now();
        let mut state = self.state();
        if state.instances.get(&by).is_none_or(|until| *until <= now) {
            return Err(Error::instance_lapsed(&by));
        }
        let State { tasks, instances } = &mut *state;
        let mut claimed = Vec::new();
        for (digest, task) in tasks.iter_mut() {
            if claimed.len() >= limit {
                break;
            }
            // Most tasks never wait for a claim: skip them before the
            // copy a claim decides on.
            if task.record.takeover.is_none() || task.record.status.is_terminal() {
                continue;
            }
            let alive_until = instances.get(&task.instance).copied();
            let mut record = task.stored();
            let Some(worker) = record.claim(by, alive_until, now) else {
                continue;
            };
            task.instance = by;
            task.commit(record);
            let view = task
                .view(instances.get(&by).copied(), now)
                .ok_or_else(|| Error::Corrupt("a task claimed now reads as gone".into()))?;
            claimed.push(Claimed::new(*digest, worker, view));
        }
        Ok(claimed)
    }

    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let now = self.now();
        let mut state = self.state();
        if state.instances.get(&me).is_some_and(|until| *until <= now) {
            return Ok(false);
        }
        let until = now.saturating_add(i64::try_from(millis(lease)).unwrap_or(i64::MAX));
        state.instances.insert(me, until);
        Ok(true)
    }

    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
        let now = self.now();
        let mut report = TaskPurgeReport::default();
        let mut state = self.state();
        let State { tasks, instances } = &mut *state;
        tasks.retain(|_, task| {
            let alive_until = instances.get(&task.instance).copied();
            let Some(seen) = task.stored().seen_at(now, alive_until) else {
                report.deleted += 1;
                return false;
            };
            if seen.status != task.record.status {
                count_ended(&mut report, &seen);
                task.supersede_inputs();
                task.commit(seen);
            }
            true
        });
        // Every task of a lapsed instance is terminal now, so forgetting the
        // instance brings nothing back.
        instances.retain(|_, until| {
            let keep = *until > now;
            report.instances += u64::from(!keep);
            keep
        });
        Ok(report)
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(false);
        };
        Ok(self.state().tasks.remove(&digest).is_some())
    }

    async fn view_claimed(&self, digest: &TaskDigest) -> Result<Option<TaskView>> {
        let now = self.now();
        let state = self.state();
        let Some(task) = state.tasks.get(digest) else {
            return Ok(None);
        };
        Ok(task.view(state.instances.get(&task.instance).copied(), now))
    }
}

impl MemoryTaskStore {
    /// A watch of `digest` as `who` sees it (anyone, `None`).
    async fn watch_as(
        &self,
        digest: &TaskDigest,
        who: Option<&Owner>,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let mut changed = {
                let now = self.now();
                let mut state = self.state();
                let Some((seen, task)) = state.seen(digest, who, now) else {
                    return Ok(None);
                };
                if seen.rev > after {
                    return Ok(Some(seen));
                }
                // Subscribed under the lock of the read: a change after it
                // is a change this receiver sees.
                task.changed.subscribe()
            };
            tokio::select! {
                // An error means the task was deleted: the re-read says so.
                _ = changed.changed() => {}
                () = tokio::time::sleep_until(deadline) => {
                    let now = self.now();
                    return Ok(self.state().seen(digest, who, now).map(|(seen, _)| seen));
                }
            }
        }
    }
}

#[cfg(all(test, feature = "conformance"))]
mod tests {
    //! The task suite on this store, and proof that it fails flawed ones.

    use std::panic::AssertUnwindSafe;

    use futures_util::FutureExt;

    use super::*;
    use crate::task::conformance::{self, MemoryTaskHarness, TaskHarness};
    use crate::task::{EXPIRED_ERROR, TaskStatus};

    crate::task_conformance_tests!(MemoryTaskHarness::new());

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
                    let t = NewTask {
                        owner: &Owner::Anonymous,
                        ..*t
                    };
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
                Flaw::TwoFinishersWin
                | Flaw::DeafWatches
                | Flaw::ReplaceOnlyAdds
                | Flaw::ViewWithoutAnswers
                | Flaw::UnfencedWrites
                | Flaw::ClaimsTwice => self.inner.get(id, who).await,
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
        ) -> Result<Option<TaskRecord>> {
            self.inner.request_cancel(id, who, mode).await
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
        async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
            self.inner.heartbeat(me, lease).await
        }
        async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
            self.inner.purge_expired_tasks().await
        }
        async fn delete(&self, id: &str) -> Result<bool> {
            self.inner.delete(id).await
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
            conformance::racing_finishers_exactly_one_wins(&h).await
        })
        .await;
        assert_case_fails(Flaw::TwoFinishersWin, |h| async move {
            conformance::every_status_and_operation(&h).await
        })
        .await;
    }

    #[tokio::test]
    async fn a_store_that_ignores_the_owner_fails_the_suite() {
        assert_case_fails(Flaw::IgnoresOwner, |h| async move {
            conformance::wrong_owner_is_indistinguishable_from_unknown(&h).await
        })
        .await;
    }

    /// On paused time: the case's 30 s guard passes at once, long before
    /// the deaf watch's hour.
    #[tokio::test(start_paused = true)]
    async fn a_store_that_loses_wake_ups_fails_the_suite() {
        assert_case_fails(Flaw::DeafWatches, |h| async move {
            conformance::watch_wakes_across_handles(&h).await
        })
        .await;
        assert_case_fails(Flaw::DeafWatches, |h| async move {
            conformance::answer_on_one_handle_wakes_a_watch_on_another(&h).await
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replacement_that_supersedes_nothing_fails_the_suite() {
        assert_case_fails(Flaw::ReplaceOnlyAdds, |h| async move {
            conformance::replacing_inputs_supersedes_and_carries_forward(&h).await
        })
        .await;
        assert_case_fails(Flaw::ReplaceOnlyAdds, |h| async move {
            conformance::racing_replacements_admit_each_key_once(&h).await
        })
        .await;
    }

    #[tokio::test]
    async fn a_view_without_the_answers_fails_the_suite() {
        assert_case_fails(Flaw::ViewWithoutAnswers, |h| async move {
            conformance::view_reads_any_owner_with_every_answer(&h).await
        })
        .await;
    }

    #[tokio::test]
    async fn unfenced_writes_fail_the_suite() {
        assert_case_fails(Flaw::UnfencedWrites, |h| async move {
            conformance::a_stale_claim_is_fenced(&h).await
        })
        .await;
        assert_case_fails(Flaw::UnfencedWrites, |h| async move {
            conformance::an_input_answered_while_nobody_holds_the_task_resumes_it(&h).await
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_that_is_not_one_step_fails_the_suite() {
        assert_case_fails(Flaw::ClaimsTwice, |h| async move {
            conformance::exactly_one_of_racing_instances_claims_a_task(&h).await
        })
        .await;
        assert_case_fails(Flaw::ClaimsTwice, |h| async move {
            conformance::a_claim_takes_at_most_its_limit(&h).await
        })
        .await;
    }

    #[tokio::test]
    async fn a_store_whose_tasks_never_expire_fails_the_suite() {
        assert_case_fails(Flaw::NeverExpires, |h| async move {
            conformance::expired_task_reads_failed(&h).await
        })
        .await;
    }
}
