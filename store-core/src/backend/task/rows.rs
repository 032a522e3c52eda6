//! The whole task step for stores that keep a task as one row and its
//! inputs as rows of their own (SQLite, PostgreSQL), written once.
//!
//! A step runs inside the backend's atomic unit (PostgreSQL: a transaction
//! that locks the task's row; SQLite: the write lock), through
//! [`TaskRows`], the statements the backend writes: read the task (locked),
//! decide what it sees ([`TaskMachine::seen_at`](super::TaskMachine::seen_at)), let the state machine
//! decide the change ([`TaskMachine::answer`](super::TaskMachine::answer),
//! [`TaskMachine::request_cancel`](super::TaskMachine::request_cancel), [`TaskMachine::apply`](super::TaskMachine::apply)), write the
//! inputs the change names, and write the row back conditioned on the
//! `rev` just read. The steps here ([`answer`], [`cancel`], [`apply`],
//! [`purge`]) are those four moves in order; what differs between SQLite
//! and PostgreSQL is only SQL, in each backend's `TaskRows`.
//!
//! Inputs are stored with a state ([`OUTSTANDING`], [`ANSWERED`],
//! [`SPENT`]) and a sequence number (request order); a spent key stays, so
//! it can never be used again (T5).

use async_trait::async_trait;
use bytes::Bytes;

pub use super::stored_digest;
use super::{InputEffect, OwnerKey, Step, count_ended, owner_of, replacement, stored_instance};
use crate::error::{Error, Result};
use crate::task::{
    Applied, CancelMode, Claimed, InstanceId, Requeue, Rev, TaskDigest, TaskOptions,
    TaskPurgeReport, TaskRecord, TaskView, Worker, WorkerChange,
};

/// An input awaiting its answer.
pub const OUTSTANDING: i16 = 0;
/// An input answered, not yet taken by the worker.
pub const ANSWERED: i16 = 1;
/// An input taken or superseded: its key is never usable again.
pub const SPENT: i16 = 2;

/// A task's row with its inputs and its instance's heartbeat deadline, as
/// a step reads it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TaskRow {
    /// The owner as stored.
    pub owner: OwnerKey,
    /// The instance the task runs on, as stored.
    pub instance: Vec<u8>,
    /// The sequence number of the task's newest input.
    pub next_seq: i64,
    /// The record as stored, its `outstanding` and `answered` from the
    /// inputs (see [`push_input`](Self::push_input)).
    pub record: TaskRecord,
    /// Every key the task used, in request order.
    pub used: Vec<String>,
    /// The response to each key of `record.answered`, in the same order.
    pub answers: Vec<(String, Bytes)>,
    /// The heartbeat deadline of the task's instance, `None` if unknown.
    pub alive_until: Option<i64>,
}

impl TaskRow {
    /// A row as read, before its inputs: `record` with no `outstanding` or
    /// `answered` yet.
    pub fn new(
        owner: OwnerKey,
        instance: Vec<u8>,
        next_seq: i64,
        record: TaskRecord,
        alive_until: Option<i64>,
    ) -> Self {
        Self {
            owner,
            instance,
            next_seq,
            record,
            used: Vec::new(),
            answers: Vec::new(),
            alive_until,
        }
    }

    /// Adds an input as read (in request order): its key, its state, the
    /// request (read for an outstanding input) and the response (for an
    /// answered one).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for an unknown state.
    pub fn push_input(
        &mut self,
        key: String,
        state: i16,
        request: Option<Bytes>,
        response: Option<Bytes>,
    ) -> Result<()> {
        match state {
            OUTSTANDING => self
                .record
                .outstanding
                .push((key.clone(), request.unwrap_or_default())),
            ANSWERED => {
                self.record.answered.push(key.clone());
                self.answers
                    .push((key.clone(), response.unwrap_or_default()));
            }
            SPENT => {}
            other => {
                return Err(Error::Corrupt(format!(
                    "an input has the unknown state {other}"
                )));
            }
        }
        self.used.push(key);
        Ok(())
    }

    /// The record as a read at `now` shows it (T8, T11); `None` past its
    /// grace.
    pub fn seen(&self, now: i64) -> Option<TaskRecord> {
        self.record.clone().seen_at(now, self.alive_until)
    }

    /// The record as `owner` reads it at `now` (T3): `None` for another
    /// owner.
    pub fn read_by(&self, owner: &[u8], now: i64) -> Option<TaskRecord> {
        (self.owner == owner).then(|| self.seen(now)).flatten()
    }

    /// The task as its runtime reads it at `now` (T14).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a stored owner that is not one.
    pub fn view(self, now: i64) -> Result<Option<TaskView>> {
        let Some(seen) = self.seen(now) else {
            return Ok(None);
        };
        let view = TaskView::new(owner_of(&self.owner)?, seen, self.answers);
        Ok(Some(match stored_instance(&self.instance) {
            Ok(instance) => view.on_instance(instance, self.alive_until),
            Err(_) => view,
        }))
    }

    fn key_used(&self, key: &str) -> bool {
        self.used.iter().any(|k| k == key)
    }
}

/// The statements of one backend's row store, as one step runs them
/// inside its atomic unit.
#[async_trait]
pub trait TaskRows: Send {
    /// Reads the task, its inputs (in request order) and its instance's
    /// deadline, and holds it against every other step until this one
    /// ends (a row lock, or the store's write lock); `None` if there is
    /// no such task.
    async fn lock(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>>;

    /// Reads the task again inside the step, after its writes.
    async fn reload(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>>;

    /// Writes `record` over the row read at `read_rev` (which must still
    /// be there: [`Error::Corrupt`] otherwise), with the task's `instance`
    /// and newest input's `next_seq`.
    async fn save(
        &mut self,
        digest: &TaskDigest,
        read_rev: Rev,
        record: &TaskRecord,
        instance: &[u8],
        next_seq: i64,
    ) -> Result<()>;

    /// Marks the outstanding input `key` answered with `response`.
    async fn answer_input(&mut self, digest: &TaskDigest, key: &str, response: &[u8])
    -> Result<()>;

    /// Adds `key` as an outstanding input with `request`, numbered `seq`.
    async fn add_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        seq: i64,
        request: &[u8],
    ) -> Result<()>;

    /// Marks the answered input `key` spent and returns its response.
    async fn take_input(&mut self, digest: &TaskDigest, key: &str) -> Result<Bytes>;

    /// Marks outstanding inputs spent: every one (`None`), or those named.
    async fn supersede(&mut self, digest: &TaskDigest, keys: Option<&[String]>) -> Result<()>;

    /// Up to `limit` running tasks that reads at `now` show as ended
    /// (expired, or their instance lapsed), not yet past their grace; in
    /// a stable order, so two purges lock them in the same order.
    async fn ended(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>>;

    /// Deletes up to `limit` tasks past their grace at `now`, with their
    /// inputs; how many.
    async fn delete_past_grace(&mut self, now: i64, limit: i64) -> Result<u64>;

    /// Forgets the instances lapsed at `now`; how many.
    async fn forget_instances(&mut self, now: i64) -> Result<u64>;

    /// Up to `limit` tasks that may wait for a claim at `now` (T17): that
    /// may be taken over, stored `working`, not expired, and released or
    /// whose instance is not alive; oldest change first. The step checks
    /// each again, locked.
    async fn waiting(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>>;

    /// Whether instance `id` is alive at `now`.
    async fn alive(&mut self, id: &InstanceId, now: i64) -> Result<bool>;
}

/// What a step answers, and whether it changed the task (so the backend
/// announces the change to watchers once the step committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stepped<T> {
    /// The call's answer.
    pub answer: T,
    /// Whether the step wrote anything.
    pub changed: bool,
}

impl<T> Stepped<T> {
    fn unchanged(answer: T) -> Self {
        Self {
            answer,
            changed: false,
        }
    }
}

/// The task under `digest`, locked, if `owner` (`None`: anyone) may see
/// it, as stored and as seen at `now`.
async fn visible<R: TaskRows + ?Sized>(
    rows: &mut R,
    digest: &TaskDigest,
    owner: Option<&[u8]>,
    now: i64,
) -> Result<Option<(TaskRow, TaskRecord)>> {
    let Some(row) = rows.lock(digest).await? else {
        return Ok(None);
    };
    if owner.is_some_and(|owner| owner != row.owner) {
        return Ok(None);
    }
    Ok(row.seen(now).map(|seen| (row, seen)))
}

/// Writes back a record a client's call changed (the task keeps its
/// instance), and answers with the task as now stored.
async fn save_client_change<R: TaskRows + ?Sized>(
    rows: &mut R,
    digest: &TaskDigest,
    row: &TaskRow,
    record: &TaskRecord,
    now: i64,
) -> Result<Stepped<Option<TaskRecord>>> {
    rows.save(digest, row.record.rev, record, &row.instance, row.next_seq)
        .await?;
    let after = rows.reload(digest).await?.and_then(|row| row.seen(now));
    Ok(Stepped {
        answer: after,
        changed: true,
    })
}

/// `tasks/update` (T5): the owner's responses to outstanding keys are
/// recorded; [`TaskStore::answer`](crate::task::TaskStore::answer).
pub async fn answer<R, K, V>(
    rows: &mut R,
    digest: &TaskDigest,
    owner: &[u8],
    responses: &[(K, V)],
    now: i64,
) -> Result<Stepped<Option<TaskRecord>>>
where
    R: TaskRows + ?Sized,
    K: AsRef<str> + Sync,
    V: AsRef<[u8]> + Sync,
{
    let Some((row, seen)) = visible(rows, digest, Some(owner), now).await? else {
        return Ok(Stepped::unchanged(None));
    };
    if seen.status.is_terminal() {
        return Ok(Stepped::unchanged(Some(seen)));
    }
    let mut record = row.record.clone();
    let answered = record.answer(responses, now);
    if answered.is_empty() {
        return Ok(Stepped::unchanged(Some(seen)));
    }
    for (key, response) in answered {
        rows.answer_input(digest, key.as_ref(), response.as_ref())
            .await?;
    }
    save_client_change(rows, digest, &row, &record, now).await
}

/// `tasks/cancel` (T6); [`TaskStore::request_cancel`](crate::task::TaskStore::request_cancel).
pub async fn cancel<R: TaskRows + ?Sized>(
    rows: &mut R,
    digest: &TaskDigest,
    owner: &[u8],
    mode: CancelMode,
    reason: Option<&str>,
    now: i64,
) -> Result<Stepped<Option<TaskRecord>>> {
    let Some((row, seen)) = visible(rows, digest, Some(owner), now).await? else {
        return Ok(Stepped::unchanged(None));
    };
    if seen.status.is_terminal() {
        return Ok(Stepped::unchanged(Some(seen)));
    }
    let mut record = row.record.clone();
    if !record.request_cancel(mode, reason, now) {
        return Ok(Stepped::unchanged(Some(seen)));
    }
    rows.supersede(digest, None).await?;
    save_client_change(rows, digest, &row, &record, now).await
}

/// A worker's change by `by`, whose instance becomes the task's;
/// [`RuntimeStore::apply_claimed`](crate::task::RuntimeStore::apply_claimed).
pub async fn apply<R: TaskRows + ?Sized>(
    rows: &mut R,
    digest: &TaskDigest,
    by: &Worker,
    change: WorkerChange<'_>,
    options: &TaskOptions,
    now: i64,
) -> Result<Stepped<Applied>> {
    let Some((row, seen)) = visible(rows, digest, None, now).await? else {
        return Ok(Stepped::unchanged(Applied::Unknown));
    };
    if seen.status.is_terminal() {
        return Ok(Stepped::unchanged(Applied::AlreadyTerminal(seen.status)));
    }
    if row.record.fenced(by, &row.instance, row.alive_until, now) {
        return Ok(Stepped::unchanged(Applied::Fenced));
    }
    let mut record = row.record.clone();
    let effect = match record.apply(change, |key| row.key_used(key), options, now)? {
        Step::Unchanged(applied) => return Ok(Stepped::unchanged(applied)),
        Step::Changed(effect) => effect,
    };
    let mut next_seq = row.next_seq;
    let mut answer = None;
    match effect {
        InputEffect::None => {}
        InputEffect::Request { key, request } => {
            next_seq += 1;
            rows.add_input(digest, key, next_seq, request).await?;
        }
        InputEffect::Take { key } => answer = Some(rows.take_input(digest, key).await?),
        InputEffect::Supersede => rows.supersede(digest, None).await?,
        InputEffect::Replace { requests } => {
            let (superseded, added) = replacement(&row.record, requests);
            if !superseded.is_empty() {
                rows.supersede(digest, Some(&superseded)).await?;
            }
            for (key, request) in added {
                next_seq += 1;
                rows.add_input(digest, key, next_seq, request).await?;
            }
        }
    }
    rows.save(
        digest,
        row.record.rev,
        &record,
        by.instance.as_bytes(),
        next_seq,
    )
    .await?;
    Ok(Stepped {
        answer: Applied::Changed {
            rev: record.rev,
            answer,
        },
        changed: true,
    })
}

/// An operator's requeue (T23), decided on the task as stored and as read;
/// [`RuntimeStore::requeue_task`](crate::task::RuntimeStore::requeue_task).
pub async fn requeue<R: TaskRows + ?Sized>(
    rows: &mut R,
    digest: &TaskDigest,
    now: i64,
) -> Result<Stepped<Requeue>> {
    let Some((row, seen)) = visible(rows, digest, None, now).await? else {
        return Ok(Stepped::unchanged(Requeue::Unknown));
    };
    let mut record = row.record.clone();
    if let Err(why) = record.requeue(&seen, now) {
        return Ok(Stepped::unchanged(Requeue::Refused(seen, why)));
    }
    rows.supersede(digest, None).await?;
    rows.save(digest, row.record.rev, &record, &row.instance, row.next_seq)
        .await?;
    let after = rows.reload(digest).await?.and_then(|row| row.seen(now));
    Ok(Stepped {
        answer: after.map_or(Requeue::Unknown, Requeue::Requeued),
        changed: true,
    })
}

/// Claims up to `limit` tasks that wait for a runtime for `by` (T17),
/// each locked and decided again ([`TaskMachine::claim`](super::TaskMachine::claim));
/// [`RuntimeStore::claim`](crate::task::RuntimeStore::claim). [`Stepped::changed`]
/// is whether it claimed any.
///
/// # Errors
///
/// [`Error::InstanceLapsed`] when `by` is not alive.
pub async fn claim<R: TaskRows + ?Sized>(
    rows: &mut R,
    by: InstanceId,
    limit: usize,
    now: i64,
) -> Result<Stepped<Vec<Claimed>>> {
    if !rows.alive(&by, now).await? {
        return Err(Error::instance_lapsed(&by));
    }
    let mut claimed = Vec::new();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    for digest in rows.waiting(now, limit).await? {
        let Some(row) = rows.lock(&digest).await? else {
            continue;
        };
        let mut record = row.record.clone();
        let Some(worker) = record.claim(by, row.alive_until, now) else {
            continue;
        };
        rows.save(
            &digest,
            row.record.rev,
            &record,
            by.as_bytes(),
            row.next_seq,
        )
        .await?;
        // Read back in the step: the view names its new instance's lease,
        // as every later read of it does.
        let Some(view) = rows
            .reload(&digest)
            .await?
            .map(|after| after.view(now))
            .transpose()?
            .flatten()
        else {
            return Err(Error::Corrupt("a task claimed now reads as gone".into()));
        };
        claimed.push(Claimed::new(digest, worker, view).taken_from(
            &row.record,
            row.alive_until,
            now,
        ));
    }
    let changed = !claimed.is_empty();
    Ok(Stepped {
        answer: claimed,
        changed,
    })
}

/// One step of a purge (T8, T11), in one atomic unit: persists what reads
/// show for up to `batch` tasks (expired and orphaned tasks as `failed`,
/// their outstanding inputs spent), deletes up to as many tasks past their
/// grace with their inputs, and, once no running task of a lapsed instance
/// is left, forgets lapsed instances. Returns the report and whether there
/// is more to do; [`Stepped::changed`] is the report's not being empty.
pub async fn purge<R: TaskRows + ?Sized>(
    rows: &mut R,
    now: i64,
    batch: i64,
) -> Result<(Stepped<TaskPurgeReport>, bool)> {
    let mut report = TaskPurgeReport::default();
    let ended = rows.ended(now, batch).await?;
    let ended_all = (ended.len() as i64) < batch;
    for digest in ended {
        // Locked and read again: a step may have changed it meanwhile.
        let Some(row) = rows.lock(&digest).await? else {
            continue;
        };
        // Tasks past their grace are deleted below.
        let Some(seen) = row.seen(now) else {
            continue;
        };
        if seen.status == row.record.status {
            continue;
        }
        count_ended(&mut report, &seen);
        rows.supersede(&digest, None).await?;
        let mut record = row.record.clone();
        record.status = seen.status;
        record.outcome = seen.outcome;
        record.rev = seen.rev;
        record.updated_at = seen.updated_at;
        rows.save(
            &digest,
            row.record.rev,
            &record,
            &row.instance,
            row.next_seq,
        )
        .await?;
    }
    report.deleted = rows.delete_past_grace(now, batch).await?;
    if ended_all {
        // Every running task of a lapsed instance is terminal now, so
        // forgetting the instance brings nothing back.
        report.instances = rows.forget_instances(now).await?;
    }
    let more = !ended_all || report.deleted >= u64::try_from(batch).unwrap_or(0);
    let changed = report != TaskPurgeReport::default();
    Ok((
        Stepped {
            answer: report,
            changed,
        },
        more,
    ))
}
