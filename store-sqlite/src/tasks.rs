//! The task store (SEP-2663 durable tasks): `mes_tasks`, `mes_task_inputs`
//! and `mes_instances`.
//!
//! Every mutation is one [`TaskWrite`] for the writer task, which runs it as
//! one transaction under SQLite's write lock (`BEGIN IMMEDIATE`, or the
//! group's transaction when it shares a group commit): the step every row
//! store shares ([`rows`]) reads the task, lets the state machine decide,
//! and writes the row, with the inputs the machine names, back conditioned
//! on the `rev` just read; this file holds only the statements
//! ([`TaskRows`] for the writer's connection). Holding the write lock from the read to the commit makes
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

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::follow::{Wakeups, task_token, watch_task};
use mcp_event_store_core::backend::task::rows::{
    self, ANSWERED, OUTSTANDING, SPENT, TaskRow, TaskRows, stored_digest,
};
use mcp_event_store_core::backend::task::{
    OwnedWorkerChange, OwnerKey, TaskDigest, TaskMachine, check_responses, client_call, owner_key,
};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, NewTask, Owner, Rev, Takeover, TaskId,
    TaskPurgeReport, TaskRecord, TaskStatus, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Row};

use crate::SqliteStore;
use crate::error::db_error;
use crate::writer::{Reply, Write, Writer};

/// Tasks a purge step ends or deletes at most, so one transaction never
/// holds the write lock long: other writers on the file wait for it only
/// up to their busy timeout.
const PURGE_BATCH: i64 = 500;

/// A task mutation for the writer, with everything it needs owned.
pub(crate) enum TaskWrite {
    Create {
        digest: TaskDigest,
        owner: OwnerKey,
        instance: InstanceId,
        record: Box<TaskRecord>,
    },
    Answer {
        digest: TaskDigest,
        owner: OwnerKey,
        responses: Vec<(String, Vec<u8>)>,
        now: i64,
    },
    Cancel {
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        now: i64,
    },
    Apply {
        digest: TaskDigest,
        by: Worker,
        change: OwnedWorkerChange,
        now: i64,
    },
    /// A claim of up to `limit` waiting tasks (T17).
    Claim {
        by: InstanceId,
        limit: usize,
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

/// What a [`TaskWrite`] produced.
pub(crate) enum TaskAnswer {
    Record(Option<Box<TaskRecord>>),
    Applied(Applied),
    Claimed(Vec<Claimed>),
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
            TaskWrite::Purge { .. } | TaskWrite::Claim { .. } => hub.wake_all(),
            TaskWrite::Create { .. } | TaskWrite::Heartbeat { .. } => {}
        }
    }
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

fn to_u32(n: i64) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Corrupt(format!("a task counter is {n}")))
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
            owner: owner_key(task.owner),
            instance: task.instance,
            record: Box::new(record),
        },
    )
    .await
    .and_then(record_answer)
}

/// The task as its runtime reads it (T14), from one snapshot on the read
/// pool.
pub(crate) async fn view(store: &SqliteStore, digest: &TaskDigest) -> Result<Option<TaskView>> {
    let now = store.now();
    let mut tx = store.inner.readers.begin().await.map_err(db_error)?;
    let row = load(&mut tx, digest).await?;
    drop(tx);
    row.map_or(Ok(None), |row| row.view(now))
}

pub(crate) async fn get(store: &SqliteStore, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
    let Some((digest, owner)) = client_call(id, who) else {
        return Ok(None);
    };
    read(store, &digest, &owner).await
}

pub(crate) async fn answer(
    store: &SqliteStore,
    id: &str,
    who: &Owner,
    responses: &[(&str, &[u8])],
) -> Result<Option<TaskRecord>> {
    check_responses(responses)?;
    let Some((digest, owner)) = client_call(id, who) else {
        return Ok(None);
    };
    let write = TaskWrite::Answer {
        digest,
        owner,
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
    let Some((digest, owner)) = client_call(id, who) else {
        return Ok(None);
    };
    let write = TaskWrite::Cancel {
        digest,
        owner,
        mode,
        now: store.now(),
    };
    task_write(store, write).await.and_then(record_answer)
}

pub(crate) async fn apply(
    store: &SqliteStore,
    digest: &TaskDigest,
    by: Worker,
    change: WorkerChange<'_>,
) -> Result<Applied> {
    change.check(store.inner.options.max_payload_bytes)?;
    let write = TaskWrite::Apply {
        digest: *digest,
        by,
        change: change.to_owned(),
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
    let Some((digest, owner)) = client_call(id, who) else {
        return Ok(None);
    };
    let owner: Arc<[u8]> = owner.into();
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

/// A watch of the task under `digest` for its runtime, whoever owns it.
pub(crate) async fn watch_claimed(
    store: &SqliteStore,
    digest: &TaskDigest,
    after: Rev,
    max_wait: Duration,
) -> Result<Option<TaskRecord>> {
    let deadline = tokio::time::Instant::now() + max_wait;
    let woken = store.inner.task_wakeups.subscribe(task_token(digest));
    store.inner.watcher.ensure();
    let digest = *digest;
    watch_task(woken, after, deadline, store.inner.task_recheck, || {
        let store = store.clone();
        async move {
            let now = store.now();
            let mut tx = store.inner.readers.begin().await.map_err(db_error)?;
            let row = load(&mut tx, &digest).await?;
            drop(tx);
            Ok(row.and_then(|row| row.seen(now)))
        }
    })
    .await
}

/// Claims under the write lock: the waiting tasks, each decided again.
pub(crate) async fn claim(
    store: &SqliteStore,
    by: InstanceId,
    limit: usize,
) -> Result<Vec<Claimed>> {
    let write = TaskWrite::Claim {
        by,
        limit,
        now: store.now(),
    };
    match task_write(store, write).await? {
        TaskAnswer::Claimed(claimed) => Ok(claimed),
        _ => Err(wrong_kind()),
    }
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
        TaskAnswer::Record(record) => Ok(record.map(|record| *record)),
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
    let row = load(&mut tx, digest).await?;
    drop(tx);
    Ok(row.and_then(|row| row.read_by(owner, now)))
}

// ------------------------------------------------------------ storage

/// Reads a task, its inputs and its instance's deadline; on the writer's
/// connection inside its transaction, or on a read transaction.
async fn load(conn: &mut SqliteConnection, digest: &TaskDigest) -> Result<Option<TaskRow>> {
    let Some(row) = sqlx::query(
        "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                expires_at, purge_at, poll_ms, cancel, outcome, next_seq, \
                (SELECT alive_until FROM mes_instances i WHERE i.id = t.instance), context, \
                max_attempts, lapses, epoch, released, checkpoint \
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
    let record = TaskRecord {
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
        takeover: None,
    };
    let max_attempts: Option<i64> = row.try_get(16).map_err(db_error)?;
    let takeover = max_attempts
        .map(|max| -> Result<Takeover> {
            let mut takeover = Takeover::new(to_u32(max)?, row.try_get(19).map_err(db_error)?);
            takeover.lapses = to_u32(row.try_get(17).map_err(db_error)?)?;
            takeover.epoch = to_u32(row.try_get(18).map_err(db_error)?)?;
            takeover.checkpoint = row
                .try_get::<Option<Vec<u8>>, _>(20)
                .map_err(db_error)?
                .map(Into::into);
            Ok(takeover)
        })
        .transpose()?;
    let record = TaskRecord { takeover, ..record };
    let mut task = TaskRow::new(
        row.try_get(0).map_err(db_error)?,
        row.try_get(1).map_err(db_error)?,
        row.try_get(13).map_err(db_error)?,
        record,
        row.try_get(14).map_err(db_error)?,
    );
    let inputs = sqlx::query(
        "SELECT key, state, CASE WHEN state = 0 THEN request END, \
                CASE WHEN state = 1 THEN response END \
         FROM mes_task_inputs WHERE digest = ?1 ORDER BY seq",
    )
    .bind(&digest.as_bytes()[..])
    .fetch_all(&mut *conn)
    .await
    .map_err(db_error)?;
    for input in inputs {
        let key = String::from_utf8(input.try_get(0).map_err(db_error)?)
            .map_err(|_| Error::Corrupt("an input key is not UTF-8".into()))?;
        let state: i64 = input.try_get(1).map_err(db_error)?;
        let state = i16::try_from(state)
            .map_err(|_| Error::Corrupt(format!("an input has the unknown state {state}")))?;
        let request: Option<Vec<u8>> = input.try_get(2).map_err(db_error)?;
        let response: Option<Vec<u8>> = input.try_get(3).map_err(db_error)?;
        task.push_input(
            key,
            state,
            request.map(Into::into),
            response.map(Into::into),
        )?;
    }
    Ok(Some(task))
}

/// The task statements on the writer's connection, inside the transaction
/// it holds the write lock in: what [`rows`] runs a step through.
struct SqliteRows<'a> {
    conn: &'a mut SqliteConnection,
}

#[async_trait]
impl TaskRows for SqliteRows<'_> {
    /// The writer holds the write lock, so reading is locking.
    async fn lock(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        load(self.conn, digest).await
    }

    async fn reload(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        load(self.conn, digest).await
    }

    async fn save(
        &mut self,
        digest: &TaskDigest,
        read_rev: Rev,
        record: &TaskRecord,
        instance: &[u8],
        next_seq: i64,
    ) -> Result<()> {
        let saved = sqlx::query(
            "UPDATE mes_tasks SET status = ?1, rev = ?2, message = ?3, updated_at = ?4, \
                    ttl_ms = ?5, expires_at = ?6, purge_at = ?7, poll_ms = ?8, cancel = ?9, \
                    outcome = ?10, instance = ?11, next_seq = ?12, context = ?15, \
                    max_attempts = ?16, lapses = ?17, epoch = ?18, released = ?19, \
                    checkpoint = ?20 \
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
        .bind(record.takeover.as_ref().map(|t| i64::from(t.max_attempts)))
        .bind(record.takeover.as_ref().map_or(0, |t| i64::from(t.lapses)))
        .bind(record.takeover.as_ref().map_or(1, |t| i64::from(t.epoch)))
        .bind(record.takeover.as_ref().is_some_and(|t| t.released))
        .bind(
            record
                .takeover
                .as_ref()
                .and_then(|t| t.checkpoint.as_deref()),
        )
        .execute(&mut *self.conn)
        .await
        .map_err(db_error)?
        .rows_affected();
        if saved != 1 {
            return Err(Error::Corrupt("a task changed under the write lock".into()));
        }
        Ok(())
    }

    async fn answer_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        response: &[u8],
    ) -> Result<()> {
        sqlx::query(
            "UPDATE mes_task_inputs SET state = ?1, response = ?2 \
             WHERE digest = ?3 AND key = ?4 AND state = ?5",
        )
        .bind(ANSWERED)
        .bind(response)
        .bind(&digest.as_bytes()[..])
        .bind(key.as_bytes())
        .bind(OUTSTANDING)
        .execute(&mut *self.conn)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn add_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        seq: i64,
        request: &[u8],
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO mes_task_inputs (digest, key, seq, state, request) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(&digest.as_bytes()[..])
        .bind(key.as_bytes())
        .bind(seq)
        .bind(OUTSTANDING)
        .bind(request)
        .execute(&mut *self.conn)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn take_input(&mut self, digest: &TaskDigest, key: &str) -> Result<Bytes> {
        let response: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT response FROM mes_task_inputs WHERE digest = ?1 AND key = ?2 AND state = ?3",
        )
        .bind(&digest.as_bytes()[..])
        .bind(key.as_bytes())
        .bind(ANSWERED)
        .fetch_optional(&mut *self.conn)
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
        .execute(&mut *self.conn)
        .await
        .map_err(db_error)?;
        Ok(response.unwrap_or_default().into())
    }

    async fn supersede(&mut self, digest: &TaskDigest, keys: Option<&[String]>) -> Result<()> {
        let Some(keys) = keys else {
            sqlx::query("UPDATE mes_task_inputs SET state = ?1 WHERE digest = ?2 AND state = ?3")
                .bind(SPENT)
                .bind(&digest.as_bytes()[..])
                .bind(OUTSTANDING)
                .execute(&mut *self.conn)
                .await
                .map_err(db_error)?;
            return Ok(());
        };
        for key in keys {
            sqlx::query(
                "UPDATE mes_task_inputs SET state = ?1 \
                 WHERE digest = ?2 AND key = ?3 AND state = ?4",
            )
            .bind(SPENT)
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .bind(OUTSTANDING)
            .execute(&mut *self.conn)
            .await
            .map_err(db_error)?;
        }
        Ok(())
    }

    async fn ended(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        let ended: Vec<Vec<u8>> = sqlx::query_scalar(
            "SELECT digest FROM mes_tasks t WHERE status < 2 AND purge_at > ?1 \
                 AND (expires_at <= ?1 OR NOT EXISTS \
                     (SELECT 1 FROM mes_instances i \
                       WHERE i.id = t.instance AND i.alive_until > ?1)) \
             ORDER BY digest LIMIT ?2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *self.conn)
        .await
        .map_err(db_error)?;
        ended.iter().map(|digest| stored_digest(digest)).collect()
    }

    async fn delete_past_grace(&mut self, now: i64, limit: i64) -> Result<u64> {
        // The same batch twice: the first statement leaves mes_tasks alone.
        const BATCH: &str = "SELECT digest FROM mes_tasks WHERE purge_at <= ?1 \
                             ORDER BY purge_at, digest LIMIT ?2";
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM mes_task_inputs WHERE digest IN ({BATCH})"
        )))
        .bind(now)
        .bind(limit)
        .execute(&mut *self.conn)
        .await
        .map_err(db_error)?;
        Ok(sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM mes_tasks WHERE digest IN ({BATCH})"
        )))
        .bind(now)
        .bind(limit)
        .execute(&mut *self.conn)
        .await
        .map_err(db_error)?
        .rows_affected())
    }

    async fn waiting(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        let waiting: Vec<Vec<u8>> = sqlx::query_scalar(
            "SELECT digest FROM mes_tasks t \
             WHERE max_attempts IS NOT NULL AND status = 0 AND expires_at > ?1 \
               AND (released OR NOT EXISTS \
                   (SELECT 1 FROM mes_instances i \
                     WHERE i.id = t.instance AND i.alive_until > ?1)) \
             ORDER BY updated_at, digest LIMIT ?2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *self.conn)
        .await
        .map_err(db_error)?;
        waiting.iter().map(|digest| stored_digest(digest)).collect()
    }

    async fn alive(&mut self, id: &InstanceId, now: i64) -> Result<bool> {
        let alive: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM mes_instances WHERE id = ?1 AND alive_until > ?2")
                .bind(&id.0[..])
                .bind(now)
                .fetch_optional(&mut *self.conn)
                .await
                .map_err(db_error)?;
        Ok(alive.is_some())
    }

    async fn forget_instances(&mut self, now: i64) -> Result<u64> {
        Ok(
            sqlx::query("DELETE FROM mes_instances WHERE alive_until <= ?1")
                .bind(now)
                .execute(&mut *self.conn)
                .await
                .map_err(db_error)?
                .rows_affected(),
        )
    }
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
            } => rows::answer(&mut SqliteRows { conn }, digest, owner, responses, *now)
                .await
                .map(|stepped| TaskAnswer::Record(stepped.answer.map(Box::new))),
            TaskWrite::Cancel {
                digest,
                owner,
                mode,
                now,
            } => rows::cancel(&mut SqliteRows { conn }, digest, owner, *mode, *now)
                .await
                .map(|stepped| TaskAnswer::Record(stepped.answer.map(Box::new))),
            TaskWrite::Apply {
                digest,
                by,
                change,
                now,
            } => {
                let options = self.task_options;
                let mut pairs = Vec::new();
                let change = change.as_change(&mut pairs);
                rows::apply(&mut SqliteRows { conn }, digest, by, change, &options, *now)
                    .await
                    .map(|stepped| TaskAnswer::Applied(stepped.answer))
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
            TaskWrite::Claim { by, limit, now } => {
                rows::claim(&mut SqliteRows { conn }, *by, *limit, *now)
                    .await
                    .map(|stepped| TaskAnswer::Claimed(stepped.answer))
            }
            TaskWrite::Purge { now } => rows::purge(&mut SqliteRows { conn }, *now, PURGE_BATCH)
                .await
                .map(|(stepped, more)| TaskAnswer::Purged(stepped.answer, more)),
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
                 context, max_attempts, released) \
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, FALSE, ?12, NULL, 0, ?13, ?14, \
                ?15 \
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
    .bind(record.takeover.as_ref().map(|t| i64::from(t.max_attempts)))
    .bind(record.takeover.as_ref().is_some_and(|t| t.released))
    .execute(&mut *conn)
    .await
    .map_err(db_error)?
    .rows_affected();
    if inserted == 1 {
        return Ok(TaskAnswer::Record(Some(Box::new(record.clone()))));
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
