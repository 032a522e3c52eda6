//! The task store (SEP-2663 durable tasks) in three key-value buckets:
//! `<prefix>-tasks` (a task's digest, in hex, to the task with its inputs,
//! in core's one-value codec), `<prefix>-instances` (an instance id to its
//! lease deadline) and `<prefix>-takeover` (the digests of tasks that may
//! be taken over: what a claim scans).
//!
//! Every change is one compare-and-set of the task's key on its revision:
//! read the value, let the state machine every backend shares decide, and
//! write the new value only if the key's revision is still the one read,
//! else read again. JetStream orders the writes to one key, on every server
//! of a cluster, so of instances racing to claim a task exactly one wins
//! (T17), and a fenced worker's write never lands (T18). A key is removed
//! by purging its subject from the bucket's stream, which leaves no delete
//! marker behind. A change wakes the task's watchers on every handle
//! through the core subject `<prefix>.twake.<token>`.

use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::TryStreamExt;
use mcp_event_store_core::backend::follow::{task_token, watch_task};
use mcp_event_store_core::backend::task::codec::{StoredTask, decode, encode};
use mcp_event_store_core::backend::task::{
    OwnerKey, TaskDigest, TaskMachine, count_ended, stored_digest, stored_instance,
};
use mcp_event_store_core::backend::{Reader, RuntimeBackend, TaskBackend};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Requeue, Rev,
    TaskPurgeReport, TaskRecord, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};

use crate::NatsStore;
use crate::error::{backend, is_conflict};
use crate::spill::{REF_LEN, SpillRef, drop_spilled, inline_limit, spill, unspill};

/// The first byte of a task value whose codec bytes were spilled.
const SPILLED: u8 = 0xff;

/// A key as the buckets spell it: 32 lowercase hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn deadline(value: &[u8]) -> Result<i64> {
    <[u8; 8]>::try_from(value)
        .map(i64::from_be_bytes)
        .map_err(|_| Error::Corrupt("an instance lease is not 8 bytes".into()))
}

/// A stored task and the revision it was read at.
pub(crate) type Loaded = (u64, StoredTask);

/// What a step decided: the value to write (`None`: nothing changes) and
/// the answer.
type Decision<T> = (Option<StoredTask>, T);

/// The live value under `key`, with its revision (deleted keys and
/// markers read as none).
pub(crate) async fn entry(bucket: &kv::Store, key: &str) -> Result<Option<(u64, Bytes)>> {
    let entry = bucket.entry(key).await.map_err(backend)?;
    Ok(entry
        .filter(|entry| entry.operation == kv::Operation::Put)
        .map(|entry| (entry.revision, entry.value)))
}

/// Removes `key` from `bucket` whole: its subject purged, no marker.
pub(crate) async fn forget(bucket: &kv::Store, key: &str) -> Result<()> {
    bucket
        .stream
        .purge()
        .filter(format!("{}{key}", bucket.prefix))
        .await
        .map_err(backend)?;
    Ok(())
}

/// Every key of `bucket`, from the subjects its stream holds (a
/// removed key leaves no subject behind: see [`forget`]).
pub(crate) async fn keys_of(bucket: &kv::Store) -> Result<Vec<String>> {
    let mut subjects = bucket
        .stream
        .info_with_subjects(format!("{}>", bucket.prefix))
        .await
        .map_err(backend)?;
    let mut keys = Vec::new();
    while let Some((subject, _)) = subjects.try_next().await.map_err(backend)? {
        if let Some(key) = subject.strip_prefix(bucket.prefix.as_str()) {
            keys.push(key.to_owned());
        }
    }
    Ok(keys)
}

pub(crate) async fn load(store: &NatsStore, digest: &TaskDigest) -> Result<Option<Loaded>> {
    let key = hex(digest.as_bytes());
    let Some((revision, value)) = entry(&store.inner.tasks, &key).await? else {
        return Ok(None);
    };
    Ok(Some((revision, open_value(store, &key, value).await?)))
}

/// The task a value under `key` holds: its codec bytes, read back from
/// the spill stream first when the value is a reference to them.
pub(crate) async fn open_value(store: &NatsStore, key: &str, value: Bytes) -> Result<StoredTask> {
    let value = match value.split_first() {
        Some((&SPILLED, reference)) => {
            unspill(store, &format!("t{key}"), &SpillRef::decode(reference)?).await?
        }
        _ => value,
    };
    decode(&value)
}

/// The id of the spilled value the task under `key` refers to.
pub(crate) async fn spilled_task(store: &NatsStore, key: &str) -> Result<Option<String>> {
    Ok(match entry(&store.inner.tasks, key).await? {
        Some((_, value)) => match value.split_first() {
            Some((&SPILLED, reference)) => Some(SpillRef::decode(reference)?.id),
            _ => None,
        },
        None => None,
    })
}

/// An instance's lease deadline, if the store holds its lease.
async fn alive_until(store: &NatsStore, instance: &[u8; 16]) -> Result<Option<i64>> {
    match entry(&store.inner.instances, &hex(instance)).await? {
        Some((_, value)) => Ok(Some(deadline(&value)?)),
        None => Ok(None),
    }
}

/// Writes `new` under `digest` if the key is still at `revision`
/// (`None`: absent); `false` when another write got in first.
pub(crate) async fn swap(
    store: &NatsStore,
    digest: &TaskDigest,
    revision: Option<u64>,
    new: &StoredTask,
) -> Result<bool> {
    let key = hex(digest.as_bytes());
    let mut value = Bytes::from(encode(new));
    if value.len() > inline_limit(store, key.len()) {
        // Too large for one message: the value goes to the spill
        // stream, the key holds its reference (the value formats of
        // the codec never start with this byte).
        let spilled = spill(store, &format!("t{key}"), &value).await?;
        let mut reference = BytesMut::with_capacity(1 + REF_LEN);
        reference.put_u8(SPILLED);
        spilled.encode(&mut reference);
        value = reference.freeze();
    }
    let written = match revision {
        None => match store.inner.tasks.create(&key, value).await {
            Ok(_) => true,
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists || is_conflict(&e) => false,
            Err(e) => return Err(backend(e)),
        },
        Some(revision) => match store.inner.tasks.update(&key, value, revision).await {
            Ok(_) => true,
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision || is_conflict(&e) => false,
            Err(e) => return Err(backend(e)),
        },
    };
    Ok(written)
}

/// One atomic step on a task: `decide` sees the stored task, the task
/// as read at `now` and its instance's deadline, and names the new
/// value, written only if the task is unchanged since the read (else
/// the step runs again). Returns the answer; a change wakes the
/// task's watchers.
async fn step<T>(
    store: &NatsStore,
    digest: &TaskDigest,
    now: i64,
    mut decide: impl FnMut(Option<(&StoredTask, TaskRecord, Option<i64>)>) -> Result<Decision<T>>,
) -> Result<T> {
    loop {
        let loaded = load(store, digest).await?;
        let (new, answer) = match &loaded {
            None => decide(None)?,
            Some((_, stored)) => {
                let alive = alive_until(store, &stored.instance).await?;
                match stored.record.clone().seen_at(now, alive) {
                    None => decide(None)?,
                    Some(seen) => decide(Some((stored, seen, alive)))?,
                }
            }
        };
        let Some(new) = new else {
            return Ok(answer);
        };
        if swap(
            store,
            digest,
            loaded.as_ref().map(|(revision, _)| *revision),
            &new,
        )
        .await?
        {
            wake_task(store, digest).await;
            return Ok(answer);
        }
    }
}

/// Wakes the task's watchers on every handle. Best effort: a watcher
/// re-reads at its deadline or recheck anyway.
async fn wake_task(store: &NatsStore, digest: &TaskDigest) {
    let token = task_token(digest);
    store.inner.task_wakeups.wake(&token);
    let subject = store.inner.names.task_wake_subject(&token);
    if let Err(e) = store.inner.client.publish(subject, Bytes::new()).await {
        tracing::debug!(error = %e, "publishing a task wake-up failed");
    }
}

/// The task as `reader` sees it now.
async fn read(
    store: &NatsStore,
    digest: TaskDigest,
    reader: &Reader,
) -> Result<Option<TaskRecord>> {
    let Some((_, stored)) = load(store, &digest).await? else {
        return Ok(None);
    };
    if reader.owner().is_some_and(|owner| *owner != stored.owner) {
        return Ok(None);
    }
    let alive = alive_until(store, &stored.instance).await?;
    Ok(stored.record.seen_at(store.now(), alive))
}

/// A client's step: the owner must match; a terminal task is answered
/// as read.
async fn client_step(
    store: &NatsStore,
    digest: TaskDigest,
    owner: OwnerKey,
    change: impl Fn(&mut StoredTask, i64) -> bool,
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    step(store, &digest, now, |found| {
        let Some((stored, seen, alive)) = found else {
            return Ok((None, None));
        };
        if stored.owner != owner {
            return Ok((None, None));
        }
        Ok(stored.client_step(&seen, now, alive, |new| change(new, now)))
    })
    .await
}

/// Adds a task to the takeover index (or removes it).
async fn index_takeover(store: &NatsStore, digest: &TaskDigest, on: bool) -> Result<()> {
    let key = hex(digest.as_bytes());
    if on {
        store
            .inner
            .takeover
            .put(&key, Bytes::new())
            .await
            .map_err(backend)?;
        Ok(())
    } else {
        forget(&store.inner.takeover, &key).await
    }
}

/// Why a claim found nothing to claim under a takeover index entry.
enum Stale {
    /// The task waits for nothing now (running, or not lapsed).
    No,
    /// The task has ended: its entry can go.
    Ended,
    /// No task is there: it may be being created.
    Missing,
}

/// How old a takeover index entry whose task is missing must be before a
/// claim drops it (a create that died between the entry and the task).
pub(crate) const ABANDONED_AFTER: Duration = Duration::from_secs(10 * 60);

/// Whether the index entry under `key` was written [`ABANDONED_AFTER`] ago
/// or more, by the server's clock against this machine's (the margin is far
/// above any sane skew).
async fn abandoned(index: &kv::Store, key: &str) -> Result<bool> {
    let Some(entry) = index.entry(key).await.map_err(backend)? else {
        return Ok(false);
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let age = now.saturating_sub(entry.created.unix_timestamp());
    Ok(age >= ABANDONED_AFTER.as_secs() as i64)
}

/// Ends what reads show ended, deletes what is past its grace, and
/// drops index entries of tasks gone or ended.
async fn purge_tasks(store: &NatsStore) -> Result<TaskPurgeReport> {
    let now = store.now();
    let mut report = TaskPurgeReport::default();
    for key in keys_of(&store.inner.tasks).await? {
        let Some(digest) = unhex(&key).and_then(|b| stored_digest(&b).ok()) else {
            continue;
        };
        let ended = step(store, &digest, now, |found| {
            let Some((stored, seen, _)) = found else {
                return Ok((None, None));
            };
            let new = stored.ended_as_read(&seen);
            let ended = new.is_some().then_some(seen);
            Ok((new, ended))
        })
        .await?;
        if let Some(ended) = ended {
            count_ended(&mut report, &ended);
        }
        if let Some((_, stored)) = load(store, &digest).await?
            && stored.record.purge_at <= now
        {
            forget(&store.inner.tasks, &key).await?;
            forget(&store.inner.takeover, &key).await?;
            drop_spilled(store, &format!("t{key}"), None).await?;
            report.deleted += 1;
            wake_task(store, &digest).await;
        }
    }
    for key in keys_of(&store.inner.instances).await? {
        let Some((_, value)) = entry(&store.inner.instances, &key).await? else {
            continue;
        };
        // A lapsed lease is never renewed (`heartbeat` refuses it), so
        // removing it races with nothing.
        if deadline(&value)? <= now {
            forget(&store.inner.instances, &key).await?;
            report.instances += 1;
        }
    }
    Ok(report)
}

#[async_trait]
impl TaskBackend for NatsStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        // Only under an instance alive at the task's birth (T11). The
        // lease is another key, read first: its deadline only moves later
        // while the instance lives, so the check holds at the create.
        if alive_until(self, task.instance.as_bytes())
            .await?
            .is_none_or(|until| until <= now)
        {
            return Err(Error::instance_lapsed(&task.instance));
        }
        if task.takeover.is_some() {
            // The index first: a crash between leaves an entry a claim
            // finds stale, never a task no claim can find.
            index_takeover(self, &digest, true).await?;
        }
        let record = TaskRecord::created(task, now, &self.inner.options.store.tasks);
        let stored = StoredTask::new(task.owner, *task.instance.as_bytes(), record.clone());
        let created = swap(self, &digest, None, &stored).await;
        if task.takeover.is_some() && !matches!(created, Ok(false)) {
            // Again after it: a claim that read the index before the task
            // existed may have dropped the entry as stale meanwhile.
            index_takeover(self, &digest, true).await?;
        }
        Ok(created?.then_some(record))
    }

    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>> {
        read(self, digest, &reader).await
    }

    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        client_step(self, digest, owner, |new, now| {
            new.record_answers(responses, now)
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
        client_step(self, digest, owner, |new, now| {
            new.record.request_cancel(mode, reason, now)
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
        let woken = self.inner.task_wakeups.subscribe(task_token(&digest));
        let recheck = self.inner.options.follow_recheck;
        watch_task(woken, after, deadline, recheck, || {
            let (store, reader) = (self.clone(), reader.clone());
            async move { read(&store, digest, &reader).await }
        })
        .await
    }

    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        purge_tasks(self).await
    }

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        let existed = load(self, &digest).await?.is_some();
        let key = hex(digest.as_bytes());
        forget(&self.inner.tasks, &key).await?;
        forget(&self.inner.takeover, &key).await?;
        drop_spilled(self, &format!("t{key}"), None).await?;
        if existed {
            wake_task(self, &digest).await;
        }
        Ok(existed)
    }
}

#[async_trait]
impl RuntimeBackend for NatsStore {
    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let key = hex(me.as_bytes());
        let instances = &self.inner.instances;
        loop {
            let now = self.now();
            let until = now.saturating_add(millis(lease));
            let value = Bytes::copy_from_slice(&until.to_be_bytes());
            let written = match entry(instances, &key).await? {
                // Lapsed: its tasks already read as lost.
                Some((_, old)) if deadline(&old)? <= now => return Ok(false),
                Some((revision, _)) => match instances.update(&key, value, revision).await {
                    Ok(_) => true,
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision || is_conflict(&e) => {
                        false
                    }
                    Err(e) => return Err(backend(e)),
                },
                None => match instances.create(&key, value).await {
                    Ok(_) => true,
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists || is_conflict(&e) => {
                        false
                    }
                    Err(e) => return Err(backend(e)),
                },
            };
            if written {
                return Ok(true);
            }
        }
    }

    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        let now = self.now();
        Ok(alive_until(self, id.as_bytes())
            .await?
            .is_some_and(|until| until > now))
    }

    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        let now = self.now();
        let mut leases = Vec::new();
        for key in keys_of(&self.inner.instances).await? {
            let Some(id) = unhex(&key) else { continue };
            if let Some((_, value)) = entry(&self.inner.instances, &key).await? {
                leases.push(InstanceLease::new(
                    stored_instance(&id)?,
                    deadline(&value)?,
                    now,
                ));
            }
        }
        Ok(leases)
    }

    async fn claimed_apply(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let now = self.now();
        let options = self.inner.options.store.tasks;
        let change = change.to_owned();
        step(self, task, now, |found| {
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
        .await
    }

    async fn claimed_view(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        let Some((_, stored)) = load(self, task).await? else {
            return Ok(None);
        };
        let alive = alive_until(self, &stored.instance).await?;
        stored.view(alive, self.now())
    }

    /// Scans the takeover index and claims each task with one
    /// compare-and-set. Entries of ended tasks are dropped; an entry whose
    /// task is not there is dropped only once it is ten minutes old:
    /// its task may be being created right now (the create writes the
    /// entry before the task and again after it, and a drop between the two
    /// would lose the task for every claim).
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now();
        let mine = alive_until(self, by.as_bytes()).await?;
        if mine.is_none_or(|until| until <= now) {
            return Err(Error::instance_lapsed(&by));
        }
        let mut claimed = Vec::new();
        for key in keys_of(&self.inner.takeover).await? {
            if claimed.len() >= limit {
                break;
            }
            let Some(digest) = unhex(&key).and_then(|b| stored_digest(&b).ok()) else {
                continue;
            };
            let mut stale = Stale::No;
            let claim = step(self, &digest, now, |found| {
                let Some((stored, seen, alive)) = found else {
                    stale = Stale::Missing;
                    return Ok((None, None));
                };
                if seen.status.is_terminal() || stored.record.takeover.is_none() {
                    stale = Stale::Ended;
                    return Ok((None, None));
                }
                let Some((new, claim)) = stored.claim_step(digest, by, alive, mine, now)? else {
                    return Ok((None, None));
                };
                Ok((Some(new), Some(claim)))
            })
            .await;
            match claim {
                Ok(Some(claim)) => claimed.push(claim),
                Ok(None) => match stale {
                    Stale::Ended => index_takeover(self, &digest, false).await?,
                    Stale::Missing if abandoned(&self.inner.takeover, &key).await? => {
                        index_takeover(self, &digest, false).await?;
                    }
                    Stale::Missing | Stale::No => {}
                },
                // The claims made so far stand (see `RuntimeStore::claim`).
                Err(e) if claimed.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "a claim failed part way; returning the claims made");
                    break;
                }
            }
        }
        Ok(claimed)
    }

    /// The index first, as at creation: a refused requeue leaves an entry
    /// the next claim finds ended and drops.
    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        let now = self.now();
        index_takeover(self, task, true).await?;
        step(self, task, now, |found| {
            Ok(found.map_or((None, Requeue::Unknown), |(stored, seen, _)| {
                stored.requeue_step(&seen, now)
            }))
        })
        .await
    }
}

/// Every task value with its key (`key | value`), for the conformance
/// suite's check that no task id is stored.
#[cfg(feature = "conformance")]
pub(crate) async fn raw_rows(store: &NatsStore) -> Result<Vec<Vec<u8>>> {
    let mut rows = Vec::new();
    for bucket in [
        &store.inner.tasks,
        &store.inner.takeover,
        &store.inner.instances,
    ] {
        for key in keys_of(bucket).await? {
            let mut row = key.clone().into_bytes();
            row.extend_from_slice(b" | ");
            if let Some((_, value)) = entry(bucket, &key).await? {
                row.extend_from_slice(&value);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Rewrites the format byte of every task value.
#[cfg(feature = "conformance")]
pub(crate) async fn set_task_format(store: &NatsStore, version: u8) -> Result<()> {
    let tasks = &store.inner.tasks;
    for key in keys_of(tasks).await? {
        let Some(digest) = unhex(&key).and_then(|b| stored_digest(&b).ok()) else {
            continue;
        };
        if let Some((_, value)) = entry(tasks, &key).await? {
            let mut value = match value.split_first() {
                Some((&SPILLED, reference)) => {
                    unspill(store, &format!("t{key}"), &SpillRef::decode(reference)?)
                        .await?
                        .to_vec()
                }
                _ => value.to_vec(),
            };
            if let Some(first) = value.first_mut() {
                *first = version;
            }
            tasks.put(&key, value.into()).await.map_err(backend)?;
            drop_spilled(store, &format!("t{}", hex(digest.as_bytes())), None).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_as_hex() {
        let bytes = [0xab; 16];
        assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex("zz"), None);
    }
}
