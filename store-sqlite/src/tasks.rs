//! The task store (SEP-2663 durable tasks): `mes_tasks`, `mes_task_inputs`
//! and `mes_instances`.
//!
//! Every mutation is one [`TaskWrite`] for the writer task, which runs it as
//! one transaction under SQLite's write lock (`BEGIN IMMEDIATE`, or the
//! group's transaction when it shares a group commit): the task is read,
//! the state machine decides in Rust with the same code every backend uses
//! ([`TaskRecord::seen_at`], then [`TaskRecord::answer`],
//! [`TaskRecord::request_cancel`] or [`TaskRecord::apply`]), and the row,
//! with the inputs the machine names, is written back conditioned on the
//! `rev` just read. Holding the write lock from the read to the commit makes
//! the step atomic across handles and processes (T4); `create` and
//! `heartbeat` are single statements. The caller is answered after the
//! commit (T1).
//!
//! Reads (`get`, `watch`) use the read pool, in one read transaction, so a
//! task and its inputs come from one snapshot. The writer wakes this
//! handle's watchers after each commit that changed their task. Changes
//! made through other handles and processes are found by the handle's one
//! follow watcher ([`crate::watcher`]), which polls `PRAGMA data_version`
//! while anyone follows or watches and, when another connection committed,
//! wakes every task watcher to re-read its task's `rev` (T10). Each watcher
//! also re-reads every `follow_recheck`, should a wake-up be missed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mcp_event_store_core::backend::follow::{Wakeups, task_token, watch_task};
use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, InputEffect, InstanceId, NewTask, Owner, Rev, Step, TaskDigest,
    TaskId, TaskPurgeReport, TaskRecord, TaskStatus, TaskView, WorkerChange, check_responses,
    replacement,
};
use mcp_event_store_core::{Error, Result};
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::SqliteStore;
use crate::store::db_error;
use crate::writer::{Reply, Write, Writer};

/// An input request awaiting its answer.
const OUTSTANDING: i64 = 0;
/// An input answered, not yet taken by the worker.
const ANSWERED: i64 = 1;
/// An input taken or superseded: its key is never usable again.
const SPENT: i64 = 2;
/// Tasks a purge step ends or deletes at most, so one transaction never
/// holds the write lock long: other writers on the file wait for it only
/// up to their busy timeout.
const PURGE_BATCH: i64 = 500;

/// A task mutation for the writer, with everything it needs owned.
pub(crate) enum TaskWrite {
    Create {
        digest: TaskDigest,
        owner: Vec<u8>,
        instance: InstanceId,
        record: TaskRecord,
    },
    Answer {
        digest: TaskDigest,
        owner: Vec<u8>,
        responses: Vec<(String, Vec<u8>)>,
        now: i64,
    },
    Cancel {
        digest: TaskDigest,
        owner: Vec<u8>,
        mode: CancelMode,
        now: i64,
    },
    Apply {
        digest: TaskDigest,
        by: InstanceId,
        change: Change,
        now: i64,
    },
    Heartbeat {
        me: InstanceId,
        until: i64,
        now: i64,
    },
    /// One step of a purge: at most [`PURGE_BATCH`] tasks ended and at
    /// most as many deleted.
    Purge {
        now: i64,
    },
    Delete {
        digest: TaskDigest,
    },
}

/// A [`WorkerChange`], owned.
pub(crate) enum Change {
    RequestInput {
        key: String,
        request: Vec<u8>,
    },
    TakeAnswer {
        key: String,
    },
    SetMessage(Option<String>),
    SetPollInterval(Option<Duration>),
    SetTtl(Option<Duration>),
    Finish {
        status: TaskStatus,
        outcome: Vec<u8>,
    },
    SetContext(Vec<u8>),
    ReplaceInputs {
        requests: Vec<(String, Vec<u8>)>,
        message: Option<String>,
    },
}

impl Change {
    fn of(change: &WorkerChange<'_>) -> Self {
        match *change {
            WorkerChange::RequestInput { key, request } => Change::RequestInput {
                key: key.to_owned(),
                request: request.to_vec(),
            },
            WorkerChange::TakeAnswer { key } => Change::TakeAnswer {
                key: key.to_owned(),
            },
            WorkerChange::SetMessage(message) => Change::SetMessage(message.map(str::to_owned)),
            WorkerChange::SetPollInterval(interval) => Change::SetPollInterval(interval),
            WorkerChange::SetTtl(ttl) => Change::SetTtl(ttl),
            WorkerChange::Finish(finish) => Change::Finish {
                status: finish.status(),
                outcome: finish.outcome().unwrap_or_default().to_vec(),
            },
            WorkerChange::SetContext(context) => Change::SetContext(context.to_vec()),
            WorkerChange::ReplaceInputs { requests, message } => Change::ReplaceInputs {
                requests: requests
                    .iter()
                    .map(|(key, request)| ((*key).to_owned(), request.to_vec()))
                    .collect(),
                message: message.map(str::to_owned),
            },
        }
    }

    /// The change borrowed again, for the state machine; `pairs` holds the
    /// borrowed requests of a replacement.
    fn as_worker<'a>(&'a self, pairs: &'a mut Vec<(&'a str, &'a [u8])>) -> WorkerChange<'a> {
        match self {
            Change::RequestInput { key, request } => WorkerChange::RequestInput { key, request },
            Change::TakeAnswer { key } => WorkerChange::TakeAnswer { key },
            Change::SetMessage(message) => WorkerChange::SetMessage(message.as_deref()),
            Change::SetPollInterval(interval) => WorkerChange::SetPollInterval(*interval),
            Change::SetTtl(ttl) => WorkerChange::SetTtl(*ttl),
            Change::Finish { status, outcome } => WorkerChange::Finish(match status {
                TaskStatus::Completed => Finish::Completed(outcome),
                TaskStatus::Failed => Finish::Failed(outcome),
                _ => Finish::Cancelled,
            }),
            Change::SetContext(context) => WorkerChange::SetContext(context),
            Change::ReplaceInputs { requests, message } => {
                pairs.extend(requests.iter().map(|(k, r)| (k.as_str(), r.as_slice())));
                WorkerChange::ReplaceInputs {
                    requests: pairs,
                    message: message.as_deref(),
                }
            }
        }
    }
}

/// What a [`TaskWrite`] produced.
pub(crate) enum TaskAnswer {
    Record(Option<TaskRecord>),
    Applied(Applied),
    Flag(bool),
    /// A purge step's report, and whether there is more to do.
    Purged(TaskPurgeReport, bool),
}

impl TaskWrite {
    /// Wakes this handle's watchers of the task the committed write
    /// changed.
    pub(crate) fn wake(&self, hub: &Wakeups) {
        match self {
            TaskWrite::Answer { digest, .. }
            | TaskWrite::Cancel { digest, .. }
            | TaskWrite::Apply { digest, .. }
            | TaskWrite::Delete { digest } => hub.wake(&task_token(digest)),
            TaskWrite::Purge { .. } => hub.wake_all(),
            TaskWrite::Create { .. } | TaskWrite::Heartbeat { .. } => {}
        }
    }
}

/// The owner as stored: the principal's digest, empty for anonymous.
fn owner_bytes(owner: &Owner) -> Vec<u8> {
    owner.digest().map_or_else(Vec::new, |d| d.to_vec())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

// ------------------------------------------------------------ client side

pub(crate) async fn try_create(
    store: &SqliteStore,
    id: &TaskId,
    task: &NewTask<'_>,
) -> Result<Option<TaskRecord>> {
    task.check()?;
    let now = store.now();
    let record = TaskRecord::created(task, now, &store.inner.task_options);
    task_write(
        store,
        TaskWrite::Create {
            digest: id.digest(),
            owner: owner_bytes(task.owner),
            instance: task.instance,
            record,
        },
    )
    .await
    .and_then(record_answer)
}

/// The task as its runtime reads it (T14), from one snapshot on the read
/// pool.
pub(crate) async fn view(store: &SqliteStore, id: &TaskId) -> Result<Option<TaskView>> {
    let now = store.now();
    let mut tx = store.inner.readers.begin().await.map_err(db_error)?;
    let stored = load(&mut tx, &id.digest()).await?;
    drop(tx);
    let Some(stored) = stored else {
        return Ok(None);
    };
    let Some(seen) = stored.seen(now) else {
        return Ok(None);
    };
    let owner = if stored.owner.is_empty() {
        Owner::Anonymous
    } else {
        Owner::Principal(
            stored
                .owner
                .as_slice()
                .try_into()
                .map_err(|_| Error::Corrupt("a task owner is not 16 bytes".into()))?,
        )
    };
    Ok(Some(TaskView::new(owner, seen, stored.answers)))
}

pub(crate) async fn get(store: &SqliteStore, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
    let Some(digest) = TaskDigest::of(id) else {
        return Ok(None);
    };
    read(store, &digest, &owner_bytes(who)).await
}

pub(crate) async fn answer(
    store: &SqliteStore,
    id: &str,
    who: &Owner,
    responses: &[(&str, &[u8])],
) -> Result<Option<TaskRecord>> {
    check_responses(responses)?;
    let Some(digest) = TaskDigest::of(id) else {
        return Ok(None);
    };
    let write = TaskWrite::Answer {
        digest,
        owner: owner_bytes(who),
        responses: responses
            .iter()
            .map(|(key, response)| ((*key).to_owned(), response.to_vec()))
            .collect(),
        now: store.now(),
    };
    task_write(store, write).await.and_then(record_answer)
}

pub(crate) async fn request_cancel(
    store: &SqliteStore,
    id: &str,
    who: &Owner,
    mode: CancelMode,
) -> Result<Option<TaskRecord>> {
    let Some(digest) = TaskDigest::of(id) else {
        return Ok(None);
    };
    let write = TaskWrite::Cancel {
        digest,
        owner: owner_bytes(who),
        mode,
        now: store.now(),
    };
    task_write(store, write).await.and_then(record_answer)
}

pub(crate) async fn apply(
    store: &SqliteStore,
    id: &TaskId,
    by: InstanceId,
    change: WorkerChange<'_>,
) -> Result<Applied> {
    change.check(store.inner.options.max_payload_bytes)?;
    let write = TaskWrite::Apply {
        digest: id.digest(),
        by,
        change: Change::of(&change),
        now: store.now(),
    };
    match task_write(store, write).await? {
        TaskAnswer::Applied(applied) => Ok(applied),
        _ => Err(wrong_kind()),
    }
}

pub(crate) async fn watch(
    store: &SqliteStore,
    id: &str,
    who: &Owner,
    after: Rev,
    max_wait: Duration,
) -> Result<Option<TaskRecord>> {
    let Some(digest) = TaskDigest::of(id) else {
        return Ok(None);
    };
    let owner: Arc<[u8]> = owner_bytes(who).into();
    let deadline = tokio::time::Instant::now() + max_wait;
    // Subscribed before the first read: a commit after the read started
    // wakes the next wait.
    // Woken by the writer after this handle's commits, or by the watcher
    // when another connection committed.
    let woken = store.inner.task_wakeups.subscribe(task_token(&digest));
    // Started after subscribing: its first poll wakes every task watcher.
    store.inner.watcher.ensure();
    watch_task(woken, after, deadline, store.inner.task_recheck, || {
        let (store, owner) = (store.clone(), owner.clone());
        async move { read(&store, &digest, &owner).await }
    })
    .await
}

pub(crate) async fn heartbeat(
    store: &SqliteStore,
    me: InstanceId,
    lease: Duration,
) -> Result<bool> {
    let now = store.now();
    let write = TaskWrite::Heartbeat {
        me,
        until: now.saturating_add(to_i64(millis(lease))),
        now,
    };
    match task_write(store, write).await? {
        TaskAnswer::Flag(flag) => Ok(flag),
        _ => Err(wrong_kind()),
    }
}

/// Purges in steps of one transaction each, queued at the writer one after
/// another, so appends and task writes get their turn in between.
pub(crate) async fn purge_expired_tasks(store: &SqliteStore) -> Result<TaskPurgeReport> {
    let now = store.now();
    let mut report = TaskPurgeReport::default();
    loop {
        match task_write(store, TaskWrite::Purge { now }).await? {
            TaskAnswer::Purged(step, more) => {
                report += step;
                if !more {
                    return Ok(report);
                }
            }
            _ => return Err(wrong_kind()),
        }
    }
}

pub(crate) async fn delete(store: &SqliteStore, id: &str) -> Result<bool> {
    let Some(digest) = TaskDigest::of(id) else {
        return Ok(false);
    };
    match task_write(store, TaskWrite::Delete { digest }).await? {
        TaskAnswer::Flag(flag) => Ok(flag),
        _ => Err(wrong_kind()),
    }
}

async fn task_write(store: &SqliteStore, write: TaskWrite) -> Result<TaskAnswer> {
    store.write(Reply::Task, Write::Task(Box::new(write))).await
}

fn record_answer(answer: TaskAnswer) -> Result<Option<TaskRecord>> {
    match answer {
        TaskAnswer::Record(record) => Ok(record),
        _ => Err(wrong_kind()),
    }
}

fn wrong_kind() -> Error {
    Error::Corrupt("the writer answered a task write with the wrong kind".into())
}

/// The task as `owner` sees it now, read from one snapshot on the read
/// pool.
async fn read(
    store: &SqliteStore,
    digest: &TaskDigest,
    owner: &[u8],
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    let mut tx = store.inner.readers.begin().await.map_err(db_error)?;
    let stored = load(&mut tx, digest).await?;
    drop(tx);
    Ok(stored
        .filter(|stored| stored.owner == owner)
        .and_then(|stored| stored.seen(now)))
}

// ------------------------------------------------------------ storage

/// A task row with its inputs and its instance's heartbeat deadline.
struct Stored {
    owner: Vec<u8>,
    instance: Vec<u8>,
    next_seq: i64,
    /// The record as stored, with `outstanding` and `answered` from the
    /// inputs.
    record: TaskRecord,
    /// Every key the task used, with its state.
    inputs: Vec<(String, i64)>,
    /// The response of each key of `record.answered`, in the same order.
    answers: Vec<(String, Bytes)>,
    alive_until: Option<i64>,
}

impl Stored {
    /// The record as a read at `now` shows it (T8, T11).
    fn seen(&self, now: i64) -> Option<TaskRecord> {
        self.record.clone().seen_at(now, self.alive_until)
    }

    fn input(&self, key: &str) -> Option<i64> {
        self.inputs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, state)| *state)
    }
}

/// Reads a task, its inputs and its instance's deadline; on the writer's
/// connection inside its transaction, or on a read transaction.
async fn load(conn: &mut SqliteConnection, digest: &TaskDigest) -> Result<Option<Stored>> {
    let Some(row) = sqlx::query(
        "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                expires_at, purge_at, poll_ms, cancel, outcome, next_seq, \
                (SELECT alive_until FROM mes_instances i WHERE i.id = t.instance), context \
         FROM mes_tasks t WHERE digest = ?1",
    )
    .bind(&digest.as_bytes()[..])
    .fetch_optional(&mut *conn)
    .await
    .map_err(db_error)?
    else {
        return Ok(None);
    };
    let status: i64 = row.try_get(2).map_err(db_error)?;
    let status = u8::try_from(status)
        .ok()
        .and_then(TaskStatus::from_u8)
        .ok_or_else(|| Error::Corrupt(format!("a task has the unknown status {status}")))?;
    let mut record = TaskRecord {
        status,
        rev: to_u64(row.try_get(3).map_err(db_error)?),
        message: row.try_get(4).map_err(db_error)?,
        created_at: row.try_get(5).map_err(db_error)?,
        updated_at: row.try_get(6).map_err(db_error)?,
        ttl_ms: row
            .try_get::<Option<i64>, _>(7)
            .map_err(db_error)?
            .map(to_u64),
        expires_at: row.try_get(8).map_err(db_error)?,
        purge_at: row.try_get(9).map_err(db_error)?,
        poll_interval_ms: row
            .try_get::<Option<i64>, _>(10)
            .map_err(db_error)?
            .map(to_u64),
        cancel_requested: row.try_get(11).map_err(db_error)?,
        outcome: row
            .try_get::<Option<Vec<u8>>, _>(12)
            .map_err(db_error)?
            .map(Into::into),
        outstanding: Vec::new(),
        answered: Vec::new(),
        context: row
            .try_get::<Option<Vec<u8>>, _>(15)
            .map_err(db_error)?
            .map(Into::into),
    };
    let owner = row.try_get(0).map_err(db_error)?;
    let instance = row.try_get(1).map_err(db_error)?;
    let next_seq = row.try_get(13).map_err(db_error)?;
    let alive_until = row.try_get(14).map_err(db_error)?;
    let rows = sqlx::query(
        "SELECT key, state, CASE WHEN state = 0 THEN request END, \
                CASE WHEN state = 1 THEN response END \
         FROM mes_task_inputs WHERE digest = ?1 ORDER BY seq",
    )
    .bind(&digest.as_bytes()[..])
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let mut inputs = Vec::with_capacity(rows.len());
    let mut answers = Vec::new();
    for row in rows {
        let key = String::from_utf8(row.try_get(0).map_err(db_error)?)
            .map_err(|_| Error::Corrupt("an input key is not UTF-8".into()))?;
        let state: i64 = row.try_get(1).map_err(db_error)?;
        match state {
            OUTSTANDING => {
                let request: Vec<u8> = row.try_get(2).map_err(db_error)?;
                record.outstanding.push((key.clone(), request.into()));
            }
            ANSWERED => {
                let response: Option<Vec<u8>> = row.try_get(3).map_err(db_error)?;
                record.answered.push(key.clone());
                answers.push((key.clone(), response.unwrap_or_default().into()));
            }
            _ => {}
        }
        inputs.push((key, state));
    }
    Ok(Some(Stored {
        owner,
        instance,
        next_seq,
        record,
        inputs,
        answers,
        alive_until,
    }))
}

/// Writes `record` back over the row read at `read_rev`, with its `rev`
/// and `updated_at`; the row must still be at `read_rev`.
async fn save(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    read_rev: Rev,
    record: &TaskRecord,
    instance: &[u8],
    next_seq: i64,
) -> Result<()> {
    let saved = sqlx::query(
        "UPDATE mes_tasks SET status = ?1, rev = ?2, message = ?3, updated_at = ?4, \
                ttl_ms = ?5, expires_at = ?6, purge_at = ?7, poll_ms = ?8, cancel = ?9, \
                outcome = ?10, instance = ?11, next_seq = ?12, context = ?15 \
         WHERE digest = ?13 AND rev = ?14",
    )
    .bind(i64::from(record.status.as_u8()))
    .bind(to_i64(record.rev))
    .bind(record.message.as_deref())
    .bind(record.updated_at)
    .bind(record.ttl_ms.map(to_i64))
    .bind(record.expires_at)
    .bind(record.purge_at)
    .bind(record.poll_interval_ms.map(to_i64))
    .bind(record.cancel_requested)
    .bind(record.outcome.as_deref())
    .bind(instance)
    .bind(next_seq)
    .bind(&digest.as_bytes()[..])
    .bind(to_i64(read_rev))
    .bind(record.context.as_deref())
    .execute(&mut *conn)
    .await
    .map_err(db_error)?
    .rows_affected();
    if saved != 1 {
        return Err(Error::Corrupt("a task changed under the write lock".into()));
    }
    Ok(())
}

/// Marks every outstanding input of a task spent.
async fn supersede_inputs(conn: &mut SqliteConnection, digest: &TaskDigest) -> Result<()> {
    sqlx::query("UPDATE mes_task_inputs SET state = ?1 WHERE digest = ?2 AND state = ?3")
        .bind(SPENT)
        .bind(&digest.as_bytes()[..])
        .bind(OUTSTANDING)
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    Ok(())
}

// ------------------------------------------------------------ writer side

impl Writer {
    /// Runs one task write as one transaction: the group's, or one of its
    /// own under the write lock. `create` and `heartbeat` are one statement
    /// each and need none.
    pub(crate) async fn task(
        &mut self,
        write: &TaskWrite,
        in_transaction: bool,
    ) -> Result<TaskAnswer> {
        if in_transaction
            || matches!(
                write,
                TaskWrite::Create { .. } | TaskWrite::Heartbeat { .. }
            )
        {
            return self.task_step(write).await;
        }
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut self.conn)
            .await
            .map_err(db_error)?;
        let answer = match self.task_step(write).await {
            Ok(answer) => match sqlx::query("COMMIT").execute(&mut self.conn).await {
                Ok(_) => return Ok(answer),
                Err(e) => Err(db_error(e)),
            },
            Err(e) => Err(e),
        };
        let _ = sqlx::query("ROLLBACK").execute(&mut self.conn).await;
        answer
    }

    async fn task_step(&mut self, write: &TaskWrite) -> Result<TaskAnswer> {
        let conn = &mut self.conn;
        match write {
            TaskWrite::Create {
                digest,
                owner,
                instance,
                record,
            } => create(conn, digest, owner, instance, record).await,
            TaskWrite::Answer {
                digest,
                owner,
                responses,
                now,
            } => answer_step(conn, digest, owner, responses, *now).await,
            TaskWrite::Cancel {
                digest,
                owner,
                mode,
                now,
            } => cancel_step(conn, digest, owner, *mode, *now).await,
            TaskWrite::Apply {
                digest,
                by,
                change,
                now,
            } => {
                let options = self.task_options;
                apply_step(conn, digest, by, change, *now, &options).await
            }
            TaskWrite::Heartbeat { me, until, now } => {
                // Inserted, or renewed while still alive; a lapsed instance
                // stays lapsed (its tasks already read as lost).
                let renewed: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO mes_instances (id, alive_until) VALUES (?1, ?2) \
                     ON CONFLICT (id) DO UPDATE SET alive_until = excluded.alive_until \
                         WHERE mes_instances.alive_until > ?3 \
                     RETURNING 1",
                )
                .bind(&me.0[..])
                .bind(until)
                .bind(now)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db_error)?;
                Ok(TaskAnswer::Flag(renewed.is_some()))
            }
            TaskWrite::Purge { now } => purge_step(conn, *now)
                .await
                .map(|(report, more)| TaskAnswer::Purged(report, more)),
            TaskWrite::Delete { digest } => {
                sqlx::query("DELETE FROM mes_task_inputs WHERE digest = ?1")
                    .bind(&digest.as_bytes()[..])
                    .execute(&mut *conn)
                    .await
                    .map_err(db_error)?;
                let deleted = sqlx::query("DELETE FROM mes_tasks WHERE digest = ?1")
                    .bind(&digest.as_bytes()[..])
                    .execute(&mut *conn)
                    .await
                    .map_err(db_error)?
                    .rows_affected();
                Ok(TaskAnswer::Flag(deleted > 0))
            }
        }
    }
}

async fn create(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    owner: &[u8],
    instance: &InstanceId,
    record: &TaskRecord,
) -> Result<TaskAnswer> {
    // Only under an instance alive at the task's birth (T11), in the same
    // statement.
    let inserted = sqlx::query(
        "INSERT INTO mes_tasks (digest, owner, status, rev, message, created_at, updated_at, \
                 expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq, \
                 context) \
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, FALSE, ?12, NULL, 0, ?13 \
          WHERE EXISTS (SELECT 1 FROM mes_instances WHERE id = ?12 AND alive_until > ?6) \
         ON CONFLICT (digest) DO NOTHING",
    )
    .bind(&digest.as_bytes()[..])
    .bind(owner)
    .bind(i64::from(record.status.as_u8()))
    .bind(to_i64(record.rev))
    .bind(record.message.as_deref())
    .bind(record.created_at)
    .bind(record.updated_at)
    .bind(record.expires_at)
    .bind(record.purge_at)
    .bind(record.ttl_ms.map(to_i64))
    .bind(record.poll_interval_ms.map(to_i64))
    .bind(&instance.0[..])
    .bind(record.context.as_deref())
    .execute(&mut *conn)
    .await
    .map_err(db_error)?
    .rows_affected();
    if inserted == 1 {
        return Ok(TaskAnswer::Record(Some(record.clone())));
    }
    // Nothing written: the id was taken, or the instance is not alive.
    // The writer holds the file, so this reads what the insert saw.
    let alive: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM mes_instances WHERE id = ?1 AND alive_until > ?2")
            .bind(&instance.0[..])
            .bind(record.created_at)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_error)?;
    match alive {
        Some(_) => Ok(TaskAnswer::Record(None)),
        None => Err(Error::instance_lapsed(instance)),
    }
}

/// The task under `digest` if `owner` (or, `None`, anyone) may see it, as
/// stored and as seen at `now`.
async fn visible(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    owner: Option<&[u8]>,
    now: i64,
) -> Result<Option<(Stored, TaskRecord)>> {
    let Some(stored) = load(conn, digest).await? else {
        return Ok(None);
    };
    if owner.is_some_and(|owner| owner != stored.owner) {
        return Ok(None);
    }
    Ok(stored.seen(now).map(|seen| (stored, seen)))
}

/// The task as the call leaves it, re-read inside the same transaction.
async fn reread(conn: &mut SqliteConnection, digest: &TaskDigest, now: i64) -> Result<TaskAnswer> {
    let stored = load(conn, digest).await?;
    Ok(TaskAnswer::Record(stored.and_then(|s| s.seen(now))))
}

/// Writes back `record`, changed by a client's call (the task keeps its
/// instance), and answers with the task as now stored.
async fn save_client_change(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    stored: &Stored,
    record: &TaskRecord,
    now: i64,
) -> Result<TaskAnswer> {
    save(
        conn,
        digest,
        stored.record.rev,
        record,
        &stored.instance,
        stored.next_seq,
    )
    .await?;
    reread(conn, digest, now).await
}

async fn answer_step(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    owner: &[u8],
    responses: &[(String, Vec<u8>)],
    now: i64,
) -> Result<TaskAnswer> {
    let Some((stored, seen)) = visible(conn, digest, Some(owner), now).await? else {
        return Ok(TaskAnswer::Record(None));
    };
    if seen.status.is_terminal() {
        return Ok(TaskAnswer::Record(Some(seen)));
    }
    let mut record = stored.record.clone();
    let answered = record.answer(responses, now);
    if answered.is_empty() {
        return Ok(TaskAnswer::Record(Some(seen)));
    }
    for (key, response) in answered {
        sqlx::query(
            "UPDATE mes_task_inputs SET state = ?1, response = ?2 \
                 WHERE digest = ?3 AND key = ?4 AND state = ?5",
        )
        .bind(ANSWERED)
        .bind(&response[..])
        .bind(&digest.as_bytes()[..])
        .bind(key.as_bytes())
        .bind(OUTSTANDING)
        .execute(&mut *conn)
        .await
        .map_err(db_error)?;
    }
    save_client_change(conn, digest, &stored, &record, now).await
}

async fn cancel_step(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    owner: &[u8],
    mode: CancelMode,
    now: i64,
) -> Result<TaskAnswer> {
    let Some((stored, seen)) = visible(conn, digest, Some(owner), now).await? else {
        return Ok(TaskAnswer::Record(None));
    };
    if seen.status.is_terminal() {
        return Ok(TaskAnswer::Record(Some(seen)));
    }
    let mut record = stored.record.clone();
    if !record.request_cancel(mode, now) {
        return Ok(TaskAnswer::Record(Some(seen)));
    }
    supersede_inputs(conn, digest).await?;
    save_client_change(conn, digest, &stored, &record, now).await
}

async fn apply_step(
    conn: &mut SqliteConnection,
    digest: &TaskDigest,
    by: &InstanceId,
    change: &Change,
    now: i64,
    options: &mcp_event_store_core::task::TaskOptions,
) -> Result<TaskAnswer> {
    let Some((stored, seen)) = visible(conn, digest, None, now).await? else {
        return Ok(TaskAnswer::Applied(Applied::Unknown));
    };
    if seen.status.is_terminal() {
        return Ok(TaskAnswer::Applied(Applied::AlreadyTerminal(seen.status)));
    }
    let mut record = stored.record.clone();
    let mut pairs = Vec::new();
    let effect = match record.apply(
        change.as_worker(&mut pairs),
        |key| stored.input(key).is_some(),
        options,
        now,
    )? {
        Step::Unchanged(applied) => return Ok(TaskAnswer::Applied(applied)),
        Step::Changed(effect) => effect,
    };
    let mut next_seq = stored.next_seq;
    let mut answer = None;
    match effect {
        InputEffect::None => {}
        InputEffect::Request { key, request } => {
            next_seq += 1;
            sqlx::query(
                "INSERT INTO mes_task_inputs (digest, key, seq, state, request) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .bind(next_seq)
            .bind(OUTSTANDING)
            .bind(request)
            .execute(&mut *conn)
            .await
            .map_err(db_error)?;
        }
        InputEffect::Take { key } => {
            let response: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT response FROM mes_task_inputs WHERE digest = ?1 AND key = ?2 AND state = ?3",
            )
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .bind(ANSWERED)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_error)?
            .ok_or_else(|| Error::Corrupt("an answered input is missing".into()))?;
            sqlx::query(
                "UPDATE mes_task_inputs SET state = ?1, response = NULL \
                 WHERE digest = ?2 AND key = ?3",
            )
            .bind(SPENT)
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .execute(&mut *conn)
            .await
            .map_err(db_error)?;
            answer = Some(response.unwrap_or_default().into());
        }
        InputEffect::Supersede => supersede_inputs(conn, digest).await?,
        InputEffect::Replace { requests } => {
            let (superseded, added) = replacement(&stored.record, requests);
            for key in superseded {
                sqlx::query(
                    "UPDATE mes_task_inputs SET state = ?1 \
                     WHERE digest = ?2 AND key = ?3 AND state = ?4",
                )
                .bind(SPENT)
                .bind(&digest.as_bytes()[..])
                .bind(key.as_bytes())
                .bind(OUTSTANDING)
                .execute(&mut *conn)
                .await
                .map_err(db_error)?;
            }
            for (key, request) in added {
                next_seq += 1;
                sqlx::query(
                    "INSERT INTO mes_task_inputs (digest, key, seq, state, request) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .bind(&digest.as_bytes()[..])
                .bind(key.as_bytes())
                .bind(next_seq)
                .bind(OUTSTANDING)
                .bind(request)
                .execute(&mut *conn)
                .await
                .map_err(db_error)?;
            }
        }
    }
    save(conn, digest, stored.record.rev, &record, &by.0, next_seq).await?;
    Ok(TaskAnswer::Applied(Applied::Changed {
        rev: record.rev,
        answer,
    }))
}

/// One step of a purge, in one transaction: persists what reads show for
/// up to [`PURGE_BATCH`] tasks (expired and orphaned tasks as `failed`),
/// deletes up to as many tasks past their grace with their inputs, and,
/// once no running task of a lapsed instance is left, forgets lapsed
/// instances. Returns whether there is more to do.
async fn purge_step(conn: &mut SqliteConnection, now: i64) -> Result<(TaskPurgeReport, bool)> {
    let mut report = TaskPurgeReport::default();
    let ended: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT digest FROM mes_tasks t WHERE status < 2 AND purge_at > ?1 \
             AND (expires_at <= ?1 OR NOT EXISTS \
                 (SELECT 1 FROM mes_instances i WHERE i.id = t.instance AND i.alive_until > ?1)) \
         LIMIT ?2",
    )
    .bind(now)
    .bind(PURGE_BATCH)
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    let ended_all = (ended.len() as i64) < PURGE_BATCH;
    for digest in ended {
        let digest = TaskDigest(
            digest
                .try_into()
                .map_err(|_| Error::Corrupt("a task digest is not 16 bytes".into()))?,
        );
        let Some(stored) = load(conn, &digest).await? else {
            continue;
        };
        // Tasks past their grace are deleted below.
        let Some(seen) = stored.seen(now) else {
            continue;
        };
        if seen.status == stored.record.status {
            continue;
        }
        report.count_ended(&seen);
        supersede_inputs(conn, &digest).await?;
        let mut record = stored.record.clone();
        record.status = seen.status;
        record.outcome = seen.outcome;
        record.rev = seen.rev;
        record.updated_at = seen.updated_at;
        save(
            conn,
            &digest,
            stored.record.rev,
            &record,
            &stored.instance,
            stored.next_seq,
        )
        .await?;
    }
    // The same batch twice: the first statement leaves mes_tasks alone.
    const BATCH: &str = "SELECT digest FROM mes_tasks WHERE purge_at <= ?1 \
                         ORDER BY purge_at, digest LIMIT ?2";
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM mes_task_inputs WHERE digest IN ({BATCH})"
    )))
    .bind(now)
    .bind(PURGE_BATCH)
    .execute(&mut *conn)
    .await
    .map_err(db_error)?;
    report.deleted = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM mes_tasks WHERE digest IN ({BATCH})"
    )))
    .bind(now)
    .bind(PURGE_BATCH)
    .execute(&mut *conn)
    .await
    .map_err(db_error)?
    .rows_affected();
    if ended_all {
        // Every running task of a lapsed instance is terminal now, so
        // forgetting the instance brings nothing back. (Before that, a
        // forgotten instance would change when its tasks read as lost.)
        report.instances = sqlx::query("DELETE FROM mes_instances WHERE alive_until <= ?1")
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(db_error)?
            .rows_affected();
    }
    let more = !ended_all || report.deleted >= PURGE_BATCH as u64;
    Ok((report, more))
}
