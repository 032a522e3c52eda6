//! The in-memory task store: the reference implementation of the contract.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use super::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Owner, Requeue, Rev,
    TaskDigest, TaskPurgeReport, TaskRecord, TaskView, Worker, WorkerChange, millis,
};
use crate::backend::task::{InputEffect, OwnerKey, Step, count_ended, replacement};
use crate::backend::{BackendHandle, Reader, RuntimeBackend, TaskBackend, TaskKeys};
use crate::error::{Error, Result};
use crate::options::StoreOptions;
use crate::rewrite::{TaskField, TaskValue, TaskValuePage, TaskValues};

/// A [`TaskStore`](crate::task::TaskStore) kept in process memory.
///
/// Every mutation is one critical section under one lock, so exactly one
/// of racing finishers wins; each task has a `watch` channel of its `rev`
/// that its watchers subscribe to under the same lock as their read, so no
/// change slips between the two. Clones, and handles from
/// [`share_with_options`](Self::share_with_options), share the same data,
/// like two handles on one database. Nothing survives the process.
///
/// Like every backend it implements the job traits
/// ([`TaskBackend`], [`RuntimeBackend`]); the public traits, with their
/// checks, come from core.
#[derive(Clone, Debug)]
pub struct MemoryTaskStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    options: StoreOptions,
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
    /// Whether `key` names this task's owner (T3).
    fn owned_by(&self, key: &[u8]) -> bool {
        self.owner.digest().map_or(&[][..], |digest| &digest[..]) == key
    }

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
        Some(TaskView::new(self.owner, seen, answers).on_instance(self.instance, alive_until))
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
    /// The task under `digest` as the owner with key `who` may see it at
    /// `now` (`None` for any owner), with the task itself.
    fn seen(
        &mut self,
        digest: &TaskDigest,
        who: Option<&[u8]>,
        now: i64,
    ) -> Option<(TaskRecord, &mut Task)> {
        let task = self.tasks.get_mut(digest)?;
        if who.is_some_and(|who| !task.owned_by(who)) {
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
        Self::with_options(StoreOptions::default())
    }

    /// A store with these options: the clock, the outcome limit
    /// (`max_payload_bytes`) and the lifetimes (`tasks`).
    pub fn with_options(options: StoreOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                state: Arc::default(),
            }),
        }
    }

    /// Another handle on the same data with other options (as two processes
    /// may open one database with different settings).
    pub fn share_with_options(&self, options: StoreOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
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
}

/// The values of a task and their swaps (C22), for the [`MemoryStore`]
/// that holds this store.
///
/// [`MemoryStore`]: crate::MemoryStore
impl MemoryTaskStore {
    /// Up to `limit` tasks after `after`, by digest, with their values.
    pub(crate) fn value_page(&self, after: Option<&TaskDigest>, limit: usize) -> TaskValuePage {
        let state = self.state();
        let mut digests: Vec<&TaskDigest> = state
            .tasks
            .keys()
            .filter(|digest| after.is_none_or(|after| *digest > after))
            .collect();
        digests.sort_unstable();
        digests.truncate(limit);
        let tasks = digests
            .into_iter()
            .map(|digest| {
                let task = &state.tasks[digest];
                let record = &task.record;
                let mut values = Vec::new();
                let fields = [
                    (TaskField::Context, &record.context),
                    (TaskField::Outcome, &record.outcome),
                ];
                for (field, value) in fields {
                    if let Some(bytes) = value {
                        values.push(TaskValue::new(field, bytes.clone()));
                    }
                }
                if let Some(bytes) = record.takeover.as_ref().and_then(|t| t.checkpoint.as_ref()) {
                    values.push(TaskValue::new(TaskField::Checkpoint, bytes.clone()));
                }
                for (key, input) in &task.inputs {
                    match &input.state {
                        InputState::Outstanding(request) => values.push(TaskValue::new(
                            TaskField::Request(key.clone()),
                            request.clone(),
                        )),
                        InputState::Answered(response) => values.push(TaskValue::new(
                            TaskField::Response(key.clone()),
                            response.clone(),
                        )),
                        InputState::Spent => {}
                    }
                }
                TaskValues::new(*digest, values)
            })
            .collect();
        TaskValuePage::new(tasks, limit)
    }

    /// Replaces the value `field` of task `digest` if it is `expected`.
    pub(crate) fn value_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> bool {
        let mut state = self.state();
        let Some(task) = state.tasks.get_mut(digest) else {
            return false;
        };
        let slot = match field {
            TaskField::Context => task.record.context.as_mut(),
            TaskField::Outcome => task.record.outcome.as_mut(),
            TaskField::Checkpoint => task
                .record
                .takeover
                .as_mut()
                .and_then(|t| t.checkpoint.as_mut()),
            TaskField::Request(key) => match task.inputs.get_mut(key).map(|i| &mut i.state) {
                Some(InputState::Outstanding(request)) => Some(request),
                _ => None,
            },
            TaskField::Response(key) => match task.inputs.get_mut(key).map(|i| &mut i.state) {
                Some(InputState::Answered(response)) => Some(response),
                _ => None,
            },
        };
        match slot {
            Some(value) if value[..] == *expected => {
                *value = Bytes::copy_from_slice(new);
                true
            }
            _ => false,
        }
    }
}

impl BackendHandle for MemoryTaskStore {
    const NAME: &'static str = "memory";

    fn store_options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// A memory store is never closed: it lives as long as its handles.
    fn is_closed(&self) -> bool {
        false
    }
}

#[async_trait]
impl TaskBackend for MemoryTaskStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now_millis();
        let record = TaskRecord::created(task, now, &self.inner.options.tasks);
        let mut state = self.state();
        if state
            .instances
            .get(&task.instance)
            .is_none_or(|until| *until <= now)
        {
            return Err(Error::instance_lapsed(&task.instance));
        }
        let std::collections::hash_map::Entry::Vacant(slot) = state.tasks.entry(digest) else {
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

    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>> {
        let now = self.now_millis();
        Ok(self
            .state()
            .seen(&digest, reader.owner().map(Vec::as_slice), now)
            .map(|(seen, _)| seen))
    }

    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        let now = self.now_millis();
        let mut state = self.state();
        let Some((seen, task)) = state.seen(&digest, Some(&owner), now) else {
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

    async fn task_cancel(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now_millis();
        let mut state = self.state();
        let Some((seen, task)) = state.seen(&digest, Some(&owner), now) else {
            return Ok(None);
        };
        if seen.status.is_terminal() {
            return Ok(Some(seen));
        }
        let mut record = task.stored();
        if !record.request_cancel(mode, reason, now) {
            return Ok(Some(seen));
        }
        task.supersede_inputs();
        task.commit(record);
        Ok(Some(task.stored()))
    }

    async fn task_watch(
        &self,
        digest: TaskDigest,
        reader: Reader,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let who = reader.owner().map(Vec::as_slice);
        loop {
            let mut changed = {
                let now = self.now_millis();
                let mut state = self.state();
                let Some((seen, task)) = state.seen(&digest, who, now) else {
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
                    let now = self.now_millis();
                    return Ok(self.state().seen(&digest, who, now).map(|(seen, _)| seen));
                }
            }
        }
    }

    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        let now = self.now_millis();
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

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        Ok(self.state().tasks.remove(&digest).is_some())
    }
}

/// A store of tasks alone: its own listing (a [`MemoryStore`](crate::MemoryStore)
/// lists its tasks through its rewrite listing).
#[async_trait]
impl TaskKeys for MemoryTaskStore {
    async fn task_keys(
        &self,
        after: Option<&TaskDigest>,
        limit: usize,
    ) -> Result<(Vec<TaskDigest>, Option<TaskDigest>)> {
        Ok(self.value_page(after, limit).keys())
    }
}

#[async_trait]
impl RuntimeBackend for MemoryTaskStore {
    async fn claimed_apply(
        &self,
        digest: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let now = self.now_millis();
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
            .fenced(&by, task.instance.as_bytes(), holder_alive_until, now)
        {
            return Ok(Applied::Fenced);
        }
        let mut record = task.stored();
        let effect = match record.apply(
            change,
            |key| task.inputs.contains_key(key),
            &self.inner.options.tasks,
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

    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now_millis();
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
            let before = task.stored();
            let mut record = before.clone();
            let Some(worker) = record.claim(by, alive_until, now) else {
                continue;
            };
            task.instance = by;
            task.commit(record);
            let view = task
                .view(instances.get(&by).copied(), now)
                .ok_or_else(|| Error::Corrupt("a task claimed now reads as gone".into()))?;
            claimed.push(Claimed::new(*digest, worker, view).taken_from(&before, alive_until, now));
        }
        Ok(claimed)
    }

    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let now = self.now_millis();
        let mut state = self.state();
        if state.instances.get(&me).is_some_and(|until| *until <= now) {
            return Ok(false);
        }
        let until = now.saturating_add(i64::try_from(millis(lease)).unwrap_or(i64::MAX));
        state.instances.insert(me, until);
        Ok(true)
    }

    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        let now = self.now_millis();
        Ok(self
            .state()
            .instances
            .get(&id)
            .is_some_and(|until| *until > now))
    }

    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        let now = self.now_millis();
        Ok(self
            .state()
            .instances
            .iter()
            .map(|(id, until)| InstanceLease::new(*id, *until, now))
            .collect())
    }

    async fn claimed_view(&self, digest: &TaskDigest) -> Result<Option<TaskView>> {
        let now = self.now_millis();
        let state = self.state();
        let Some(task) = state.tasks.get(digest) else {
            return Ok(None);
        };
        Ok(task.view(state.instances.get(&task.instance).copied(), now))
    }

    async fn task_requeue(&self, digest: &TaskDigest) -> Result<Requeue> {
        let now = self.now_millis();
        let mut state = self.state();
        let Some((seen, task)) = state.seen(digest, None, now) else {
            return Ok(Requeue::Unknown);
        };
        let mut record = task.stored();
        if let Err(why) = record.requeue(&seen, now) {
            return Ok(Requeue::Refused(seen, why));
        }
        task.supersede_inputs();
        task.commit(record);
        Ok(Requeue::Requeued(task.stored()))
    }
}
