//! The task store (SEP-2663 durable tasks): `tasks`, `task_inputs` and
//! `instances` in the store's schema.
//!
//! Every mutation is **one transaction** on a pooled connection: the task
//! row is locked (`SELECT … FOR UPDATE`), then read with its inputs and its
//! instance's deadline in one statement (after the lock, so it sees every
//! step that committed before; see [`LOAD`]), the state machine decides
//! (the step every row store shares, [`rows`]; this file holds only the
//! statements, [`TaskRows`] for a transaction), and the row, with the
//! inputs the machine names, is written back with `UPDATE … WHERE digest =
//! $n AND rev = $m` (the `rev` just read). The row lock makes the step atomic across handles and
//! processes (T4): a racing step waits for the commit, then reads the new
//! `rev` and status. `create` and `heartbeat` are single statements.
//!
//! The same transaction runs `pg_notify(<channel>, 't' || <digest prefix in
//! hex>)`, in the statement that writes the row back ([`SAVE_AND_NOTIFY`]:
//! no round trip of its own), which PostgreSQL delivers at commit, so a notification never
//! announces a change that rolled back. Every handle's one listening
//! connection (the one its event follows use, [`crate::follow`]) wakes its
//! task watchers of that task, which re-read it (T10); the handle itself
//! wakes its own watchers right after the commit. A task watcher holds no
//! connection while it waits: a registration in the handle's hub.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::follow::{task_token, watch_task};
use mcp_event_store_core::backend::task::rows::{self, TaskRow, TaskRows, stored_digest};
use mcp_event_store_core::backend::task::{
    OwnerKey, TaskDigest, TaskMachine, owner_key, stored_instance,
};
use mcp_event_store_core::backend::{Reader, RuntimeBackend, TaskBackend};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Requeue, Rev, Takeover,
    TaskPurgeReport, TaskRecord, TaskStatus, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Postgres, Row, SqlStr, Transaction};

use crate::PostgresStore;
use crate::error::backend;
use crate::follow::task_payload;
use crate::options::quote_schema;
use crate::sql::render;

/// Tasks a purge step ends or deletes at most, so one transaction never
/// holds many row locks for long.
const PURGE_BATCH: i64 = 500;

/// The task, its inputs (in request order) and its instance's deadline, in
/// one statement. Inside a mutation it runs after [`LOCK`]: not as `FOR
/// UPDATE` itself, because a statement that waits for a row lock re-reads
/// the locked row when it gets it, but its sub-selects keep the snapshot
/// taken before the wait, and would miss the inputs the step it waited for
/// wrote (a replacement racing another then lost its supersedes).
const LOAD: &str = r#"
SELECT t.owner, t.instance, t.status, t.rev, t.message, t.created_at, t.updated_at,
       t.ttl_ms, t.expires_at, t.purge_at, t.poll_ms, t.cancel, t.outcome, t.next_seq,
       (SELECT i.alive_until FROM {s}.instances i WHERE i.id = t.instance),
       ARRAY(SELECT k.key FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.seq),
       ARRAY(SELECT k.state FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.seq),
       ARRAY(SELECT CASE WHEN k.state = 0 THEN k.request ELSE '\x'::bytea END
               FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.seq),
       t.context,
       ARRAY(SELECT CASE WHEN k.state = 1 THEN k.response ELSE '\x'::bytea END
               FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.seq),
       t.max_attempts, t.lapses, t.epoch, t.released, t.checkpoint, t.cancel_reason
  FROM {s}.tasks t WHERE t.digest = $1
"#;

/// Locks a task's row for a mutation's transaction; the [`LOAD`] after it
/// reads what every step before committed.
const LOCK: &str = "SELECT 1 FROM {s}.tasks WHERE digest = $1 FOR UPDATE";

const SAVE: &str = r#"
UPDATE {s}.tasks SET status = $1, rev = $2, message = $3, updated_at = $4, ttl_ms = $5,
       expires_at = $6, purge_at = $7, poll_ms = $8, cancel = $9, outcome = $10,
       instance = $11, next_seq = $12, context = $15, max_attempts = $16, lapses = $17,
       epoch = $18, released = $19, checkpoint = $20, cancel_reason = $21
 WHERE digest = $13 AND rev = $14
"#;

/// [`SAVE`] that, when it writes the row, also queues the task's
/// notification (`$22` the channel, `$23` the payload), which PostgreSQL
/// delivers at commit: one round trip for both. It returns one row when
/// the row was written, none otherwise.
const SAVE_AND_NOTIFY: &str = r#"
WITH saved AS (
UPDATE {s}.tasks SET status = $1, rev = $2, message = $3, updated_at = $4, ttl_ms = $5,
       expires_at = $6, purge_at = $7, poll_ms = $8, cancel = $9, outcome = $10,
       instance = $11, next_seq = $12, context = $15, max_attempts = $16, lapses = $17,
       epoch = $18, released = $19, checkpoint = $20, cancel_reason = $21
 WHERE digest = $13 AND rev = $14
RETURNING 1
)
SELECT pg_notify($22, $23)::text FROM saved
"#;

/// Inserts a task, only under an instance alive at its birth (T11).
const CREATE: &str = r#"
INSERT INTO {s}.tasks (digest, owner, status, rev, message, created_at, updated_at,
       expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq, context,
       max_attempts, released)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, FALSE, $12, NULL, 0, $13, $14, $15
 WHERE EXISTS (SELECT 1 FROM {s}.instances WHERE id = $12 AND alive_until > $6)
ON CONFLICT (digest) DO NOTHING
"#;

/// Whether an instance is alive at `$2`: why [`CREATE`] wrote nothing.
const ALIVE: &str = "SELECT 1 FROM {s}.instances WHERE id = $1 AND alive_until > $2";

/// Every instance's lease.
const INSTANCES: &str = "SELECT id, alive_until FROM {s}.instances";

const HEARTBEAT: &str = r#"
INSERT INTO {s}.instances AS i (id, alive_until) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until WHERE i.alive_until > $3
RETURNING 1
"#;

const SUPERSEDE: &str = "UPDATE {s}.task_inputs SET state = 2 WHERE digest = $1 AND state = 0";

/// Supersedes the outstanding inputs named in `$2` (a replacement, T15).
const SUPERSEDE_KEYS: &str = "UPDATE {s}.task_inputs SET state = 2 \
                              WHERE digest = $1 AND state = 0 AND key = ANY($2)";

const ANSWER_INPUT: &str = "UPDATE {s}.task_inputs SET state = 1, response = $1 \
                            WHERE digest = $2 AND key = $3 AND state = 0";

const REQUEST_INPUT: &str = "INSERT INTO {s}.task_inputs (digest, key, seq, state, request) \
                             VALUES ($1, $2, $3, 0, $4)";

/// Takes an answered input: marks it spent and returns its response, in
/// one statement (the `FROM` row is the one before the update).
const TAKE_INPUT: &str = r#"
UPDATE {s}.task_inputs k SET state = 2, response = NULL
  FROM {s}.task_inputs old
 WHERE k.digest = $1 AND k.key = $2 AND k.state = 1
   AND old.digest = k.digest AND old.key = k.key
RETURNING old.response
"#;

const DELETE: &str = "DELETE FROM {s}.tasks WHERE digest = $1";

const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// Running tasks that reads already show as ended (expired, or their
/// instance lapsed), not yet past their grace; in digest order, so two
/// purges lock rows in the same order and never deadlock.
const ENDED: &str = r#"
SELECT digest FROM {s}.tasks t
 WHERE status < 2 AND purge_at > $1
   AND (expires_at <= $1 OR NOT EXISTS
        (SELECT 1 FROM {s}.instances i WHERE i.id = t.instance AND i.alive_until > $1))
 ORDER BY digest LIMIT $2
"#;

/// Deletes a batch of tasks past their grace; their inputs go with them
/// (`ON DELETE CASCADE`). A task a step holds locked is skipped, and
/// deleted by a later purge.
const DELETE_PAST_GRACE: &str = r#"
DELETE FROM {s}.tasks WHERE digest IN
  (SELECT digest FROM {s}.tasks WHERE purge_at <= $1 ORDER BY purge_at, digest LIMIT $2
     FOR UPDATE SKIP LOCKED)
"#;

const FORGET_INSTANCES: &str = "DELETE FROM {s}.instances WHERE alive_until <= $1";

/// Tasks that may wait for a claim (T17), oldest change first; a task
/// another claim holds locked is skipped (it is being claimed).
const WAITING: &str = r#"
SELECT digest FROM {s}.tasks t
 WHERE max_attempts IS NOT NULL AND status = 0 AND expires_at > $1
   AND (released OR NOT EXISTS
        (SELECT 1 FROM {s}.instances i WHERE i.id = t.instance AND i.alive_until > $1))
 ORDER BY updated_at, digest LIMIT $2
 FOR UPDATE SKIP LOCKED
"#;

/// A task statement with the store's schema spliced in.
fn sql(store: &PostgresStore, template: &str) -> SqlStr {
    render(template, &quote_schema(store.schema()))
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

fn to_u32(n: i32) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Corrupt(format!("a task counter is {n}")))
}

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

// ------------------------------------------------------------ storage

fn utf8(bytes: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Corrupt(format!("{what} is not UTF-8")))
}

fn decode(row: &PgRow) -> Result<TaskRow> {
    let status: i16 = row.try_get(2).map_err(backend)?;
    let status = u8::try_from(status)
        .ok()
        .and_then(TaskStatus::from_u8)
        .ok_or_else(|| Error::Corrupt(format!("a task has the unknown status {status}")))?;
    let message: Option<Vec<u8>> = row.try_get(4).map_err(backend)?;
    let record = TaskRecord {
        status,
        rev: to_u64(row.try_get(3).map_err(backend)?),
        message: message.map(|m| utf8(m, "a status message")).transpose()?,
        created_at: row.try_get(5).map_err(backend)?,
        updated_at: row.try_get(6).map_err(backend)?,
        ttl_ms: row
            .try_get::<Option<i64>, _>(7)
            .map_err(backend)?
            .map(to_u64),
        expires_at: row.try_get(8).map_err(backend)?,
        purge_at: row.try_get(9).map_err(backend)?,
        poll_interval_ms: row
            .try_get::<Option<i64>, _>(10)
            .map_err(backend)?
            .map(to_u64),
        cancel_requested: row.try_get(11).map_err(backend)?,
        cancel_reason: row
            .try_get::<Option<Vec<u8>>, _>(25)
            .map_err(backend)?
            .map(|reason| utf8(reason, "a cancel reason"))
            .transpose()?,
        outcome: row
            .try_get::<Option<Vec<u8>>, _>(12)
            .map_err(backend)?
            .map(Into::into),
        outstanding: Vec::new(),
        answered: Vec::new(),
        context: row
            .try_get::<Option<Vec<u8>>, _>(18)
            .map_err(backend)?
            .map(Into::into),
        takeover: None,
    };
    let max_attempts: Option<i32> = row.try_get(20).map_err(backend)?;
    let takeover = max_attempts
        .map(|max| -> Result<Takeover> {
            let mut takeover = Takeover::new(to_u32(max)?, row.try_get(23).map_err(backend)?);
            takeover.lapses = to_u32(row.try_get(21).map_err(backend)?)?;
            takeover.epoch = to_u32(row.try_get(22).map_err(backend)?)?;
            takeover.checkpoint = row
                .try_get::<Option<Vec<u8>>, _>(24)
                .map_err(backend)?
                .map(Into::into);
            Ok(takeover)
        })
        .transpose()?;
    let record = TaskRecord { takeover, ..record };
    let mut task = TaskRow::new(
        row.try_get(0).map_err(backend)?,
        row.try_get(1).map_err(backend)?,
        row.try_get(13).map_err(backend)?,
        record,
        row.try_get(14).map_err(backend)?,
    );
    let keys: Vec<Vec<u8>> = row.try_get(15).map_err(backend)?;
    let states: Vec<i16> = row.try_get(16).map_err(backend)?;
    let requests: Vec<Vec<u8>> = row.try_get(17).map_err(backend)?;
    let responses: Vec<Vec<u8>> = row.try_get(19).map_err(backend)?;
    for (((key, state), request), response) in
        keys.into_iter().zip(states).zip(requests).zip(responses)
    {
        let key = utf8(key, "an input key")?;
        task.push_input(key, state, Some(request.into()), Some(response.into()))?;
    }
    Ok(task)
}

/// Reads a task with its inputs, from one statement's snapshot.
async fn load(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
) -> Result<Option<TaskRow>> {
    sqlx::query(sql(store, LOAD))
        .bind(&digest.as_bytes()[..])
        .fetch_optional(&mut *conn)
        .await
        .map_err(backend)?
        .as_ref()
        .map(decode)
        .transpose()
}

/// Where a changed task's notification is queued.
#[derive(Clone, Copy)]
enum Announce {
    /// In the statement that writes the row back ([`SAVE_AND_NOTIFY`]).
    WithSave,
    /// Once, by [`commit`] (a purge announces all its tasks at once).
    AtCommit,
}

/// The task statements in one transaction: what [`rows`] runs a step
/// through.
struct PgRows<'a> {
    store: &'a PostgresStore,
    conn: &'a mut PgConnection,
    announce: Announce,
}

#[async_trait]
impl TaskRows for PgRows<'_> {
    /// [`LOCK`], then [`LOAD`] (see why at [`LOAD`]).
    async fn lock(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        let locked = sqlx::query(sql(self.store, LOCK))
            .bind(&digest.as_bytes()[..])
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(backend)?;
        if locked.is_none() {
            return Ok(None);
        }
        load(self.store, self.conn, digest).await
    }

    async fn reload(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        load(self.store, self.conn, digest).await
    }

    async fn save(
        &mut self,
        digest: &TaskDigest,
        read_rev: Rev,
        record: &TaskRecord,
        instance: &[u8],
        next_seq: i64,
    ) -> Result<()> {
        let statement = match self.announce {
            Announce::WithSave => SAVE_AND_NOTIFY,
            Announce::AtCommit => SAVE,
        };
        let query = sqlx::query(sql(self.store, statement))
            .bind(i16::from(record.status.as_u8()))
            .bind(to_i64(record.rev))
            .bind(record.message.as_deref().map(str::as_bytes))
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
            .bind(record.takeover.as_ref().map(|t| to_i32(t.max_attempts)))
            .bind(record.takeover.as_ref().map_or(0, |t| to_i32(t.lapses)))
            .bind(record.takeover.as_ref().map_or(1, |t| to_i32(t.epoch)))
            .bind(record.takeover.as_ref().is_some_and(|t| t.released))
            .bind(
                record
                    .takeover
                    .as_ref()
                    .and_then(|t| t.checkpoint.as_deref()),
            )
            .bind(record.cancel_reason.as_deref().map(str::as_bytes));
        let saved = match self.announce {
            Announce::WithSave => query
                .bind(self.store.notify_channel())
                .bind(task_payload(Some(&task_token(digest))))
                .fetch_all(&mut *self.conn)
                .await
                .map_err(backend)?
                .len(),
            Announce::AtCommit => usize::try_from(
                query
                    .execute(&mut *self.conn)
                    .await
                    .map_err(backend)?
                    .rows_affected(),
            )
            .unwrap_or(usize::MAX),
        };
        if saved != 1 {
            return Err(Error::Corrupt("a task changed under its row lock".into()));
        }
        Ok(())
    }

    async fn answer_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        response: &[u8],
    ) -> Result<()> {
        sqlx::query(sql(self.store, ANSWER_INPUT))
            .bind(response)
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn add_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        seq: i64,
        request: &[u8],
    ) -> Result<()> {
        sqlx::query(sql(self.store, REQUEST_INPUT))
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .bind(seq)
            .bind(request)
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn take_input(&mut self, digest: &TaskDigest, key: &str) -> Result<Bytes> {
        let response: Option<Vec<u8>> = sqlx::query_scalar(sql(self.store, TAKE_INPUT))
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(backend)?
            .ok_or_else(|| Error::Corrupt("an answered input is missing".into()))?;
        Ok(response.unwrap_or_default().into())
    }

    async fn supersede(&mut self, digest: &TaskDigest, keys: Option<&[String]>) -> Result<()> {
        match keys {
            None => sqlx::query(sql(self.store, SUPERSEDE)).bind(&digest.as_bytes()[..]),
            Some(keys) => sqlx::query(sql(self.store, SUPERSEDE_KEYS))
                .bind(&digest.as_bytes()[..])
                .bind(keys.iter().map(String::as_bytes).collect::<Vec<_>>()),
        }
        .execute(&mut *self.conn)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn ended(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        let ended: Vec<Vec<u8>> = sqlx::query_scalar(sql(self.store, ENDED))
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(backend)?;
        ended.iter().map(|digest| stored_digest(digest)).collect()
    }

    async fn delete_past_grace(&mut self, now: i64, limit: i64) -> Result<u64> {
        Ok(sqlx::query(sql(self.store, DELETE_PAST_GRACE))
            .bind(now)
            .bind(limit)
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?
            .rows_affected())
    }

    async fn forget_instances(&mut self, now: i64) -> Result<u64> {
        Ok(sqlx::query(sql(self.store, FORGET_INSTANCES))
            .bind(now)
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?
            .rows_affected())
    }

    async fn waiting(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        let waiting: Vec<Vec<u8>> = sqlx::query_scalar(sql(self.store, WAITING))
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(backend)?;
        waiting.iter().map(|digest| stored_digest(digest)).collect()
    }

    async fn alive(&mut self, id: &InstanceId, now: i64) -> Result<bool> {
        let alive: Option<i32> = sqlx::query_scalar(sql(self.store, ALIVE))
            .bind(&id.as_bytes()[..])
            .bind(now)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(backend)?;
        Ok(alive.is_some())
    }
}

/// Queues the notification of a change to `digest` (every task, `None`),
/// delivered by PostgreSQL when the transaction commits.
async fn notify(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: Option<&TaskDigest>,
) -> Result<()> {
    sqlx::query(NOTIFY)
        .bind(store.notify_channel())
        .bind(task_payload(digest.map(task_token).as_ref()))
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    Ok(())
}

/// Commits a mutation's transaction, after queueing its notification if
/// it changed something and `announce` says the notification is still to
/// queue (PostgreSQL delivers it at the commit); then wakes this handle's
/// own watchers of `digest` (every task, `None`).
async fn commit(
    store: &PostgresStore,
    mut tx: Transaction<'static, Postgres>,
    digest: Option<&TaskDigest>,
    changed: bool,
    announce: Announce,
) -> Result<()> {
    if changed && matches!(announce, Announce::AtCommit) {
        notify(store, &mut tx, digest).await?;
    }
    tx.commit().await.map_err(backend)?;
    if changed {
        match digest {
            Some(digest) => store.follows().tasks().wake(&task_token(digest)),
            None => store.follows().tasks().wake_all(),
        }
    }
    Ok(())
}

async fn begin(store: &PostgresStore) -> Result<Transaction<'static, Postgres>> {
    store.pool().begin().await.map_err(backend)
}

/// The task as `reader` sees it now, from one statement's snapshot.
async fn read(
    store: &PostgresStore,
    digest: &TaskDigest,
    reader: &Reader,
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    let mut conn = store.pool().acquire().await.map_err(backend)?;
    let row = load(store, &mut conn, digest).await?;
    Ok(row.and_then(|row| match reader.owner() {
        Some(owner) => row.read_by(owner, now),
        None => row.seen(now),
    }))
}

/// A step's statements in `tx`, queueing the task's notification with the
/// row it writes.
fn statements<'a>(store: &'a PostgresStore, tx: &'a mut PgConnection) -> PgRows<'a> {
    PgRows {
        store,
        conn: tx,
        announce: Announce::WithSave,
    }
}

// ------------------------------------------------------------ the traits

/// Durable tasks in `tasks`, `task_inputs` and `instances`; see the crate
/// docs, "Tasks".
#[async_trait]
impl TaskBackend for PostgresStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        let record = TaskRecord::created(task, self.now(), self.task_options());
        let inserted = sqlx::query(sql(self, CREATE))
            .bind(&digest.as_bytes()[..])
            .bind(owner_key(task.owner))
            .bind(i16::from(record.status.as_u8()))
            .bind(to_i64(record.rev))
            .bind(record.message.as_deref().map(str::as_bytes))
            .bind(record.created_at)
            .bind(record.updated_at)
            .bind(record.expires_at)
            .bind(record.purge_at)
            .bind(record.ttl_ms.map(to_i64))
            .bind(record.poll_interval_ms.map(to_i64))
            .bind(&task.instance.as_bytes()[..])
            .bind(task.context)
            .bind(task.takeover.map(to_i32))
            .bind(task.queued)
            .execute(self.pool())
            .await
            .map_err(backend)?
            .rows_affected();
        if inserted == 1 {
            return Ok(Some(record));
        }
        // Nothing written: the id was taken, or the instance is not alive
        // (a lapsed instance never comes back, so this read agrees).
        let alive: Option<i32> = sqlx::query_scalar(sql(self, ALIVE))
            .bind(&task.instance.as_bytes()[..])
            .bind(record.created_at)
            .fetch_optional(self.pool())
            .await
            .map_err(backend)?;
        match alive {
            Some(_) => Ok(None),
            None => Err(Error::instance_lapsed(&task.instance)),
        }
    }

    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>> {
        read(self, &digest, &reader).await
    }

    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        let mut tx = begin(self).await?;
        let stepped = rows::answer(
            &mut statements(self, &mut tx),
            &digest,
            &owner,
            responses,
            now,
        )
        .await?;
        commit(self, tx, Some(&digest), stepped.changed, Announce::WithSave).await?;
        Ok(stepped.answer)
    }

    async fn task_cancel(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        let mut tx = begin(self).await?;
        let stepped = rows::cancel(
            &mut statements(self, &mut tx),
            &digest,
            &owner,
            mode,
            reason,
            now,
        )
        .await?;
        commit(self, tx, Some(&digest), stepped.changed, Announce::WithSave).await?;
        Ok(stepped.answer)
    }

    async fn task_watch(
        &self,
        digest: TaskDigest,
        reader: Reader,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let follows = self.follows();
        // Listening, and subscribed, before the first read: a change
        // committed after that read is announced.
        follows.listen().await?;
        let woken = follows.tasks().subscribe(task_token(&digest));
        watch_task(woken, after, deadline, follows.recheck(), || {
            let (store, reader) = (self.clone(), reader.clone());
            async move { read(&store, &digest, &reader).await }
        })
        .await
    }

    /// Purges in steps of one transaction each (at most 500 tasks ended
    /// and 500 deleted per step).
    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        let now = self.now();
        let mut report = TaskPurgeReport::default();
        loop {
            let mut tx = begin(self).await?;
            let mut rows = PgRows {
                store: self,
                conn: &mut tx,
                announce: Announce::AtCommit,
            };
            let (step, more) = rows::purge(&mut rows, now, PURGE_BATCH).await?;
            commit(self, tx, None, step.changed, Announce::AtCommit).await?;
            report += step.answer;
            if !more {
                return Ok(report);
            }
        }
    }

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        let mut tx = begin(self).await?;
        let deleted = sqlx::query(sql(self, DELETE))
            .bind(&digest.as_bytes()[..])
            .execute(&mut *tx)
            .await
            .map_err(backend)?
            .rows_affected()
            > 0;
        commit(self, tx, Some(&digest), deleted, Announce::AtCommit).await?;
        Ok(deleted)
    }
}

#[async_trait]
impl RuntimeBackend for PostgresStore {
    async fn claimed_apply(
        &self,
        digest: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let digest = *digest;
        let now = self.now();
        let options = *self.task_options();
        let mut tx = begin(self).await?;
        let stepped = rows::apply(
            &mut statements(self, &mut tx),
            &digest,
            &by,
            change,
            &options,
            now,
        )
        .await?;
        commit(self, tx, Some(&digest), stepped.changed, Announce::WithSave).await?;
        Ok(stepped.answer)
    }

    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let now = self.now();
        // Inserted, or renewed while still alive; a lapsed instance stays
        // lapsed (its tasks already read as lost).
        let renewed: Option<i32> = sqlx::query_scalar(sql(self, HEARTBEAT))
            .bind(&me.as_bytes()[..])
            .bind(now.saturating_add(to_i64(millis(lease))))
            .bind(now)
            .fetch_optional(self.heartbeats())
            .await
            .map_err(backend)?;
        Ok(renewed.is_some())
    }

    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        let alive: Option<i32> = sqlx::query_scalar(sql(self, ALIVE))
            .bind(&id.as_bytes()[..])
            .bind(self.now())
            .fetch_optional(self.pool())
            .await
            .map_err(backend)?;
        Ok(alive.is_some())
    }

    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        let now = self.now();
        let leases: Vec<(Vec<u8>, i64)> = sqlx::query_as(sql(self, INSTANCES))
            .fetch_all(self.pool())
            .await
            .map_err(backend)?;
        leases
            .into_iter()
            .map(|(id, until)| Ok(InstanceLease::new(stored_instance(&id)?, until, now)))
            .collect()
    }

    async fn claimed_view(&self, digest: &TaskDigest) -> Result<Option<TaskView>> {
        let now = self.now();
        let mut conn = self.pool().acquire().await.map_err(backend)?;
        let row = load(self, &mut conn, digest).await?;
        row.map_or(Ok(None), |row| row.view(now))
    }

    /// Claims in one transaction: the waiting tasks are locked (`FOR
    /// UPDATE SKIP LOCKED`, so racing claimants take different tasks), each
    /// is decided again and written back with its notification.
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now();
        let mut tx = begin(self).await?;
        let stepped = rows::claim(&mut statements(self, &mut tx), by, limit, now).await?;
        tx.commit().await.map_err(backend)?;
        for claimed in &stepped.answer {
            self.follows().tasks().wake(&task_token(&claimed.task));
        }
        Ok(stepped.answer)
    }

    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        let now = self.now();
        let mut tx = begin(self).await?;
        let stepped = rows::requeue(&mut statements(self, &mut tx), task, now).await?;
        commit(self, tx, Some(task), stepped.changed, Announce::WithSave).await?;
        Ok(stepped.answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_schema_everywhere() {
        for template in [
            LOAD,
            LOCK,
            SAVE,
            SAVE_AND_NOTIFY,
            CREATE,
            ALIVE,
            HEARTBEAT,
            SUPERSEDE,
            SUPERSEDE_KEYS,
            ANSWER_INPUT,
            REQUEST_INPUT,
            TAKE_INPUT,
            DELETE,
            ENDED,
            DELETE_PAST_GRACE,
            FORGET_INSTANCES,
            WAITING,
        ] {
            let rendered = template.replace("{s}", "\"x\"");
            for table in ["tasks", "task_inputs", "instances"] {
                for word in ["FROM ", "INTO ", "UPDATE "] {
                    assert!(
                        !rendered.contains(&format!("{word}{table}")),
                        "unqualified {table} in {template}"
                    );
                }
            }
        }
    }
}
