//! The task store (SEP-2663 durable tasks), in three trees of their own
//! (see the crate docs, "Tasks"): `t1/tasks` (digest -> the task with its
//! inputs), `t1/task_purge` (purge time ++ digest) and `t1/instances`
//! (instance id -> heartbeat deadline). A task's value is
//! [`mcp_event_store_core::backend::task::codec`]'s encoding (value
//! format 1, or 2 for a task with a cancel reason).
//!
//! Every mutation is one `compare_and_swap` of the task's one key: read the
//! value, let the state machine every backend shares decide
//! ([`TaskMachine::seen_at`](mcp_event_store_core::backend::task::TaskMachine::seen_at), then [`TaskMachine::answer`](mcp_event_store_core::backend::task::TaskMachine::answer),
//! [`TaskMachine::request_cancel`](mcp_event_store_core::backend::task::TaskMachine::request_cancel) or [`TaskMachine::apply`](mcp_event_store_core::backend::task::TaskMachine::apply)), and swap in
//! the new value only if the old one is still there, else read again. The
//! swap is conditioned on the whole value (its `rev` included), atomic
//! across handles, and atomic on disk. It takes no global lock, unlike
//! sled's transactions and batches (see the crate docs, "Layout"). A change
//! returns once flushed under the handle's durability, through the group
//! flusher, and then wakes the task's watchers through the database's
//! task wake-up hub, which every handle in the process shares.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::follow::{task_token, watch_task};
use mcp_event_store_core::backend::task::codec::{StoredTask as Stored, decode, encode};
use mcp_event_store_core::backend::task::{
    OwnerKey, TaskDigest, TaskMachine, count_ended, owner_key, stored_digest, stored_instance,
};
use mcp_event_store_core::backend::{Reader, RuntimeBackend, TaskBackend};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Requeue, Rev,
    TaskPurgeReport, TaskRecord, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};

use crate::SledStore;
use crate::error::backend;
use crate::keys;
use crate::shared::{Shared, blocking};

/// Tasks a purge step ends or deletes at most.
const PURGE_BATCH: usize = 500;

fn corrupt() -> Error {
    Error::Corrupt("a task record is malformed".into())
}

/// `purge_at ++ digest`, ordered by time.
fn purge_key(purge_at: i64, digest: &[u8; 16]) -> Vec<u8> {
    let mut key = Vec::with_capacity(24);
    key.extend_from_slice(&keys::encode_time(purge_at).to_be_bytes());
    key.extend_from_slice(digest);
    key
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

// ------------------------------------------------------------ blocking side

/// What a step decided: the new value to swap in (`None`: nothing
/// changes) and the answer.
type Decision<T> = (Option<Stored>, T);

impl Shared {
    fn alive_until(&self, instance: &[u8; 16]) -> Result<Option<i64>> {
        self.task_instances
            .get(instance)
            .map_err(backend)?
            .map(|v| {
                <[u8; 8]>::try_from(&v[..])
                    .map(i64::from_be_bytes)
                    .map_err(|_| corrupt())
            })
            .transpose()
    }

    fn load_task(&self, digest: &TaskDigest) -> Result<Option<(sled::IVec, Stored)>> {
        match self.tasks.get(digest.as_bytes()).map_err(backend)? {
            None => Ok(None),
            Some(raw) => {
                let stored = decode(&raw)?;
                Ok(Some((raw, stored)))
            }
        }
    }

    /// The task as `owner` (`None`: anyone) sees it at `now`.
    fn read_task(
        &self,
        digest: &TaskDigest,
        owner: Option<&[u8]>,
        now: i64,
    ) -> Result<Option<TaskRecord>> {
        let Some((_, stored)) = self.load_task(digest)? else {
            return Ok(None);
        };
        if owner.is_some_and(|o| o != stored.owner) {
            return Ok(None);
        }
        let alive = self.alive_until(&stored.instance)?;
        Ok(stored.record.seen_at(now, alive))
    }

    /// One atomic step on a task: `decide` sees the stored task, the task
    /// as read at `now` and its instance's heartbeat deadline, and names
    /// the new value; it is swapped in
    /// only if the stored value is unchanged, else the step runs again.
    /// Returns the answer and whether anything changed.
    fn task_step<T>(
        &self,
        digest: &TaskDigest,
        now: i64,
        mut decide: impl FnMut(Option<(&Stored, TaskRecord, Option<i64>)>) -> Result<Decision<T>>,
    ) -> Result<(T, bool)> {
        loop {
            let loaded = self.load_task(digest)?;
            let (new, answer) = match &loaded {
                None => decide(None)?,
                Some((_, stored)) => {
                    let alive = self.alive_until(&stored.instance)?;
                    match stored.record.clone().seen_at(now, alive) {
                        None => decide(None)?,
                        Some(seen) => decide(Some((stored, seen, alive)))?,
                    }
                }
            };
            let Some(new) = new else {
                return Ok((answer, false));
            };
            let old = loaded.as_ref().map(|(raw, _)| raw.clone());
            if old.is_none()
                || loaded.as_ref().map(|(_, s)| s.record.purge_at) != Some(new.record.purge_at)
            {
                // The index entry first: a crash leaves at most an entry
                // the purge finds stale, never a task it cannot find.
                self.task_purge
                    .insert(purge_key(new.record.purge_at, digest.as_bytes()), &[])
                    .map_err(backend)?;
            }
            let swapped = self
                .tasks
                .compare_and_swap(digest.as_bytes(), old, Some(encode(&new)))
                .map_err(backend)?;
            if swapped.is_ok() {
                return Ok((answer, true));
            }
        }
    }
}

// ------------------------------------------------------------ async side

/// Runs a task step on the blocking pool; a change is flushed under the
/// handle's durability, then wakes the task's watchers.
async fn task_write<T: Send + 'static>(
    store: &SledStore,
    digest: TaskDigest,
    step: impl FnOnce(&Shared) -> Result<(T, bool)> + Send + 'static,
) -> Result<T> {
    let shared = store.shared()?;
    let (answer, changed) = blocking({
        let shared = shared.clone();
        move || step(&shared)
    })
    .await?;
    if changed {
        store.settle(store.flush_after_write(&shared)).await?;
        shared.task_wakeups.wake(&task_token(&digest));
    }
    Ok(answer)
}

/// The task as `reader` sees it now.
async fn read_task(
    store: &SledStore,
    digest: TaskDigest,
    reader: Reader,
) -> Result<Option<TaskRecord>> {
    let shared = store.shared()?;
    let now = store.now();
    blocking(move || shared.read_task(&digest, reader.owner().map(Vec::as_slice), now)).await
}

/// A client's step: the owner must match, a terminal task is answered
/// as read.
async fn client_step(
    store: &SledStore,
    digest: TaskDigest,
    owner: OwnerKey,
    now: i64,
    change: impl Fn(&mut Stored) -> bool + Send + 'static,
) -> Result<Option<TaskRecord>> {
    task_write(store, digest, move |shared| {
        shared.task_step(&digest, now, |found| {
            let Some((stored, seen, alive)) = found else {
                return Ok((None, None));
            };
            if stored.owner != owner {
                return Ok((None, None));
            }
            Ok(stored.client_step(&seen, now, alive, &change))
        })
    })
    .await
}

#[async_trait]
impl TaskBackend for SledStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        let record = TaskRecord::created(task, now, &self.handle.store.tasks);
        let stored = Stored {
            owner: owner_key(task.owner),
            instance: *task.instance.as_bytes(),
            record: record.clone(),
            responses: Vec::new(),
            spent: Vec::new(),
        };
        let instance = task.instance;
        task_write(self, digest, move |shared| {
            // Only under an instance alive at the task's birth (T11). Its
            // deadline only moves later while it lives, so a check before
            // the insert holds for it.
            if shared
                .alive_until(instance.as_bytes())?
                .is_none_or(|until| until <= now)
            {
                return Err(Error::instance_lapsed(&instance));
            }
            let exists = shared
                .tasks
                .get(digest.as_bytes())
                .map_err(backend)?
                .is_some();
            if exists {
                return Ok((None, false));
            }
            shared
                .task_purge
                .insert(purge_key(stored.record.purge_at, digest.as_bytes()), &[])
                .map_err(backend)?;
            let swapped = shared
                .tasks
                .compare_and_swap(digest.as_bytes(), None::<&[u8]>, Some(encode(&stored)))
                .map_err(backend)?;
            Ok(match swapped {
                Ok(()) => (Some(record), true),
                Err(_) => (None, false),
            })
        })
        .await
    }

    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>> {
        read_task(self, digest, reader).await
    }

    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        let responses: Vec<(String, Bytes)> = responses
            .iter()
            .map(|(k, r)| ((*k).to_owned(), Bytes::copy_from_slice(r)))
            .collect();
        let now = self.now();
        client_step(self, digest, owner, now, move |new| {
            let responses: Vec<(&str, &[u8])> = responses
                .iter()
                .map(|(k, r)| (k.as_str(), &r[..]))
                .collect();
            new.record_answers(&responses, now)
        })
        .await
    }

    async fn task_cancel(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        let reason = reason.map(str::to_owned);
        client_step(self, digest, owner, now, move |new| {
            new.record.request_cancel(mode, reason.as_deref(), now)
        })
        .await
    }

    async fn task_watch(
        &self,
        digest: TaskDigest,
        reader: Reader,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let deadline = tokio::time::Instant::now() + max_wait;
        // The subscription holds the hub, not the database: closing the
        // last handle still closes it.
        let woken = self.shared()?.task_wakeups.subscribe(task_token(&digest));
        let recheck = self.handle.follow_recheck;
        watch_task(woken, after, deadline, recheck, || {
            let (store, reader) = (self.clone(), reader.clone());
            async move { read_task(&store, digest, reader).await }
        })
        .await
    }

    /// In steps of at most 500 tasks each, on the blocking pool; see the
    /// crate docs, "Tasks".
    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        let shared = self.shared()?;
        let now = self.now();
        let mut report = TaskPurgeReport::default();
        // Persist what reads show, a batch of the task tree at a time.
        let mut from: Option<sled::IVec> = None;
        loop {
            let step = blocking({
                let shared = shared.clone();
                let from = from.clone();
                move || shared.purge_end_step(from, now)
            })
            .await?;
            report += step.0;
            match step.1 {
                Some(next) => from = Some(next),
                None => break,
            }
        }
        loop {
            let (deleted, more) = blocking({
                let shared = shared.clone();
                move || shared.purge_delete_step(now)
            })
            .await?;
            report.deleted += deleted;
            if !more {
                break;
            }
        }
        report.instances = blocking({
            let shared = shared.clone();
            move || shared.forget_instances(now)
        })
        .await?;
        if report != TaskPurgeReport::default() {
            self.settle(self.flush_after_write(&shared)).await?;
            shared.task_wakeups.wake_all();
        }
        Ok(report)
    }

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        task_write(self, digest, move |shared| {
            let old = shared.tasks.remove(digest.as_bytes()).map_err(backend)?;
            if let Some(old) = &old {
                let stored = decode(old)?;
                shared
                    .task_purge
                    .remove(purge_key(stored.record.purge_at, digest.as_bytes()))
                    .map_err(backend)?;
            }
            let existed = old.is_some();
            Ok((existed, existed))
        })
        .await
    }
}

#[async_trait]
impl RuntimeBackend for SledStore {
    async fn claimed_apply(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let digest = *task;
        let now = self.now();
        let change = change.to_owned();
        let options = self.handle.store.tasks;
        task_write(self, digest, move |shared| {
            shared.task_step(&digest, now, |found| {
                let Some((stored, seen, alive)) = found else {
                    return Ok((None, Applied::Unknown));
                };
                let mut pairs = Vec::new();
                stored.worker_step(
                    &seen,
                    alive,
                    by,
                    change.as_change(&mut pairs),
                    &options,
                    now,
                )
            })
        })
        .await
    }

    /// Scans the task tree for tasks that may be taken over, and claims
    /// each with one compare-and-swap; see the crate docs, "Tasks".
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let shared = self.shared()?;
        let now = self.now();
        let claimed = blocking({
            let shared = shared.clone();
            move || shared.claim_tasks(by, limit, now)
        })
        .await?;
        if !claimed.is_empty() {
            self.settle(self.flush_after_write(&shared)).await?;
            for claim in &claimed {
                shared.task_wakeups.wake(&task_token(&claim.task));
            }
        }
        Ok(claimed)
    }

    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let shared = self.shared()?;
        let now = self.now();
        let until = now.saturating_add(millis(lease));
        let renewed = blocking({
            let shared = shared.clone();
            move || loop {
                let old = shared.task_instances.get(me.as_bytes()).map_err(backend)?;
                if let Some(old) = &old {
                    let alive = <[u8; 8]>::try_from(&old[..])
                        .map(i64::from_be_bytes)
                        .map_err(|_| corrupt())?;
                    if alive <= now {
                        // Lapsed: its tasks already read as lost.
                        return Ok(false);
                    }
                }
                let swapped = shared
                    .task_instances
                    .compare_and_swap(me.as_bytes(), old, Some(&until.to_be_bytes()[..]))
                    .map_err(backend)?;
                if swapped.is_ok() {
                    return Ok(true);
                }
            }
        })
        .await?;
        if renewed {
            self.settle(self.flush_after_write(&shared)).await?;
        }
        Ok(renewed)
    }

    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        let shared = self.shared()?;
        let now = self.now();
        let until = blocking(move || shared.alive_until(id.as_bytes())).await?;
        Ok(until.is_some_and(|until| until > now))
    }

    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        let shared = self.shared()?;
        let now = self.now();
        blocking(move || {
            shared
                .task_instances
                .iter()
                .map(|entry| {
                    let (id, until) = entry.map_err(backend)?;
                    let until = <[u8; 8]>::try_from(&until[..])
                        .map(i64::from_be_bytes)
                        .map_err(|_| corrupt())?;
                    Ok(InstanceLease::new(stored_instance(&id)?, until, now))
                })
                .collect()
        })
        .await
    }

    async fn claimed_view(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        let shared = self.shared()?;
        let now = self.now();
        let digest = *task;
        blocking(move || {
            let Some((_, stored)) = shared.load_task(&digest)? else {
                return Ok(None);
            };
            let alive = shared.alive_until(&stored.instance)?;
            stored.view(alive, now)
        })
        .await
    }

    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        let (digest, now) = (*task, self.now());
        task_write(self, digest, move |shared| {
            shared.task_step(&digest, now, |found| {
                Ok(found.map_or((None, Requeue::Unknown), |(stored, seen, _)| {
                    stored.requeue_step(&seen, now)
                }))
            })
        })
        .await
    }
}

impl Shared {
    /// Claims up to `limit` tasks for `by` at `now` (T17): a scan of the
    /// task tree, skipping tasks that may not be taken over before the
    /// step, each claim one compare-and-swap of the task's key.
    fn claim_tasks(&self, by: InstanceId, limit: usize, now: i64) -> Result<Vec<Claimed>> {
        let mine = self.alive_until(by.as_bytes())?;
        if mine.is_none_or(|until| until <= now) {
            return Err(Error::instance_lapsed(&by));
        }
        let mut claimed = Vec::new();
        for entry in self.tasks.iter() {
            if claimed.len() >= limit {
                break;
            }
            let (key, value) = entry.map_err(backend)?;
            let record = decode(&value)?.record;
            if record.takeover.is_none() || record.status.is_terminal() {
                continue;
            }
            let digest = stored_digest(&key)?;
            let (claim, _) = self.task_step(&digest, now, |found| {
                let Some((stored, _, alive)) = found else {
                    return Ok((None, None));
                };
                let Some((new, claim)) = stored.claim_step(digest, by, alive, mine, now)? else {
                    return Ok((None, None));
                };
                Ok((Some(new), Some(claim)))
            })?;
            claimed.extend(claim);
        }
        Ok(claimed)
    }

    /// Ends (persists as `failed`) up to [`PURGE_BATCH`] tasks of the task
    /// tree from `from` on that read as expired or orphaned; returns where
    /// the next step starts, `None` at the end.
    fn purge_end_step(
        &self,
        from: Option<sled::IVec>,
        now: i64,
    ) -> Result<(TaskPurgeReport, Option<sled::IVec>)> {
        let mut report = TaskPurgeReport::default();
        let range = match &from {
            Some(from) => self.tasks.range::<&[u8], _>((
                std::ops::Bound::Excluded(&from[..]),
                std::ops::Bound::Unbounded,
            )),
            None => self.tasks.iter(),
        };
        let batch: Vec<sled::IVec> = range
            .keys()
            .take(PURGE_BATCH)
            .collect::<std::result::Result<_, _>>()
            .map_err(backend)?;
        for key in &batch {
            let digest = stored_digest(key)?;
            let (ended, _) = self.task_step(&digest, now, |found| {
                let Some((stored, seen, _)) = found else {
                    return Ok((None, None));
                };
                let new = stored.ended_as_read(&seen);
                let ended = new.is_some().then_some(seen);
                Ok((new, ended))
            })?;
            if let Some(ended) = ended {
                count_ended(&mut report, &ended);
            }
        }
        let next = (batch.len() == PURGE_BATCH)
            .then(|| batch.last().cloned())
            .flatten();
        Ok((report, next))
    }

    /// Deletes up to [`PURGE_BATCH`] tasks whose purge time has come;
    /// returns how many and whether more may be due.
    fn purge_delete_step(&self, now: i64) -> Result<(u64, bool)> {
        let end = keys::encode_time(now).saturating_add(1).to_be_bytes();
        let batch: Vec<sled::IVec> = self
            .task_purge
            .range(..end.to_vec())
            .keys()
            .take(PURGE_BATCH)
            .collect::<std::result::Result<_, _>>()
            .map_err(backend)?;
        let mut deleted = 0;
        for key in &batch {
            let digest = stored_digest(key.get(8..24).ok_or_else(corrupt)?)?;
            let due = keys::encode_time(now);
            loop {
                let Some((raw, stored)) = self.load_task(&digest)? else {
                    break;
                };
                // A stale entry (the ttl changed since) leaves the task.
                if keys::encode_time(stored.record.purge_at) > due
                    || purge_key(stored.record.purge_at, digest.as_bytes())[..] != key[..]
                {
                    break;
                }
                let swapped = self
                    .tasks
                    .compare_and_swap(digest.as_bytes(), Some(raw), None::<&[u8]>)
                    .map_err(backend)?;
                if swapped.is_ok() {
                    deleted += 1;
                    break;
                }
            }
            self.task_purge.remove(key).map_err(backend)?;
        }
        Ok((deleted, batch.len() == PURGE_BATCH))
    }

    /// Forgets instances lapsed by `now`; every task of theirs is ended by
    /// then (the purge's first pass).
    fn forget_instances(&self, now: i64) -> Result<u64> {
        let mut forgotten = 0;
        for entry in self.task_instances.iter() {
            let (id, value) = entry.map_err(backend)?;
            let alive = <[u8; 8]>::try_from(&value[..])
                .map(i64::from_be_bytes)
                .map_err(|_| corrupt())?;
            if alive <= now
                && self
                    .task_instances
                    .compare_and_swap(&id, Some(value), None::<&[u8]>)
                    .map_err(backend)?
                    .is_ok()
            {
                forgotten += 1;
            }
        }
        Ok(forgotten)
    }
}
