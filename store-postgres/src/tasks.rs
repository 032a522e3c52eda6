//! The task store (SEP-2663 durable tasks): `tasks`, `task_inputs` and
//! `instances` in the store's schema.
//!
//! Every mutation is **one transaction** on a pooled connection: the task
//! row is locked (`SELECT … FOR UPDATE`), then read with its inputs and its
//! instance's deadline in one statement (after the lock, so it sees every
//! step that committed before; see [`LOAD`]), the state machine decides
//! in Rust with the same code every backend uses ([`TaskRecord::seen_at`],
//! then [`TaskRecord::answer`], [`TaskRecord::request_cancel`] or
//! [`TaskRecord::apply`]), and the row, with the inputs the machine names,
//! is written back with `UPDATE … WHERE digest = $n AND rev = $m` (the `rev`
//! just read). The row lock makes the step atomic across handles and
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::follow::{task_token, watch_task};
use mcp_event_store_core::task::{
    Applied, CancelMode, InputEffect, InstanceId, NewTask, Owner, Rev, Step, TaskDigest, TaskId,
    TaskOptions, TaskPurgeReport, TaskRecord, TaskStatus, TaskStore, TaskView, WorkerChange,
    check_responses, replacement,
};
use mcp_event_store_core::{Error, Result};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Postgres, Row, SqlStr, Transaction};

use crate::follow::task_payload;
use crate::options::quote_schema;
use crate::sql::render;
use crate::store::{PostgresStore, backend};

/// An input request awaiting its answer.
const OUTSTANDING: i16 = 0;
/// An input answered, not yet taken by the worker.
const ANSWERED: i16 = 1;
// State 2: an input taken or superseded; its key is never usable again.
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
               FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.seq)
  FROM {s}.tasks t WHERE t.digest = $1
"#;

/// Locks a task's row for a mutation's transaction; the [`LOAD`] after it
/// reads what every step before committed.
const LOCK: &str = "SELECT 1 FROM {s}.tasks WHERE digest = $1 FOR UPDATE";

const SAVE: &str = r#"
UPDATE {s}.tasks SET status = $1, rev = $2, message = $3, updated_at = $4, ttl_ms = $5,
       expires_at = $6, purge_at = $7, poll_ms = $8, cancel = $9, outcome = $10,
       instance = $11, next_seq = $12, context = $15
 WHERE digest = $13 AND rev = $14
"#;

/// [`SAVE`] that, when it writes the row, also queues the task's
/// notification (`$16` the channel, `$17` the payload), which PostgreSQL
/// delivers at commit: one round trip for both. It returns one row when
/// the row was written, none otherwise.
const SAVE_AND_NOTIFY: &str = r#"
WITH saved AS (
UPDATE {s}.tasks SET status = $1, rev = $2, message = $3, updated_at = $4, ttl_ms = $5,
       expires_at = $6, purge_at = $7, poll_ms = $8, cancel = $9, outcome = $10,
       instance = $11, next_seq = $12, context = $15
 WHERE digest = $13 AND rev = $14
RETURNING 1
)
SELECT pg_notify($16, $17)::text FROM saved
"#;

/// Inserts a task, only under an instance alive at its birth (T11).
const CREATE: &str = r#"
INSERT INTO {s}.tasks (digest, owner, status, rev, message, created_at, updated_at,
       expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq, context)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, FALSE, $12, NULL, 0, $13
 WHERE EXISTS (SELECT 1 FROM {s}.instances WHERE id = $12 AND alive_until > $6)
ON CONFLICT (digest) DO NOTHING
"#;

/// Whether an instance is alive at `$2`: why [`CREATE`] wrote nothing.
const ALIVE: &str = "SELECT 1 FROM {s}.instances WHERE id = $1 AND alive_until > $2";

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

/// A task statement with the store's schema spliced in.
fn sql(store: &PostgresStore, template: &str) -> SqlStr {
    render(template, &quote_schema(store.schema()))
}

/// The owner as stored: the principal's digest, empty for anonymous.
fn owner_bytes(owner: &Owner) -> Vec<u8> {
    owner.digest().map_or_else(Vec::new, |d| d.to_vec())
}

/// The owner a stored owner column names: empty for anonymous, else the
/// principal's digest.
fn owner_of(bytes: &[u8]) -> Result<Owner> {
    if bytes.is_empty() {
        return Ok(Owner::Anonymous);
    }
    <[u8; 16]>::try_from(bytes)
        .map(Owner::Principal)
        .map_err(|_| Error::Corrupt("a task owner is not 16 bytes".into()))
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

// ------------------------------------------------------------ storage

/// A task row with its inputs and its instance's heartbeat deadline.
struct Stored {
    owner: Vec<u8>,
    instance: Vec<u8>,
    next_seq: i64,
    /// The record as stored, with `outstanding` and `answered` from the
    /// inputs.
    record: TaskRecord,
    /// Every key the task used.
    keys: Vec<String>,
    /// The response of each key of `record.answered`, in the same order.
    answers: Vec<(String, Bytes)>,
    alive_until: Option<i64>,
}

impl Stored {
    /// The record as a read at `now` shows it (T8, T11).
    fn seen(&self, now: i64) -> Option<TaskRecord> {
        self.record.clone().seen_at(now, self.alive_until)
    }
}

fn utf8(bytes: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Corrupt(format!("{what} is not UTF-8")))
}

fn decode(row: &PgRow) -> Result<Stored> {
    let status: i16 = row.try_get(2).map_err(backend)?;
    let status = u8::try_from(status)
        .ok()
        .and_then(TaskStatus::from_u8)
        .ok_or_else(|| Error::Corrupt(format!("a task has the unknown status {status}")))?;
    let message: Option<Vec<u8>> = row.try_get(4).map_err(backend)?;
    let mut record = TaskRecord {
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
    };
    let keys: Vec<Vec<u8>> = row.try_get(15).map_err(backend)?;
    let states: Vec<i16> = row.try_get(16).map_err(backend)?;
    let requests: Vec<Vec<u8>> = row.try_get(17).map_err(backend)?;
    let responses: Vec<Vec<u8>> = row.try_get(19).map_err(backend)?;
    let mut used = Vec::with_capacity(keys.len());
    let mut answers = Vec::new();
    for (((key, state), request), response) in
        keys.into_iter().zip(states).zip(requests).zip(responses)
    {
        let key = utf8(key, "an input key")?;
        match state {
            OUTSTANDING => record.outstanding.push((key.clone(), request.into())),
            ANSWERED => {
                record.answered.push(key.clone());
                answers.push((key.clone(), response.into()));
            }
            _ => {}
        }
        used.push(key);
    }
    Ok(Stored {
        owner: row.try_get(0).map_err(backend)?,
        instance: row.try_get(1).map_err(backend)?,
        next_seq: row.try_get(13).map_err(backend)?,
        record,
        keys: used,
        answers,
        alive_until: row.try_get(14).map_err(backend)?,
    })
}

/// Reads (and, `lock`, first locks) a task with its inputs.
async fn load(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    lock: bool,
) -> Result<Option<Stored>> {
    if lock {
        let locked = sqlx::query(sql(store, LOCK))
            .bind(&digest.as_bytes()[..])
            .fetch_optional(&mut *conn)
            .await
            .map_err(backend)?;
        if locked.is_none() {
            return Ok(None);
        }
    }
    sqlx::query(sql(store, LOAD))
        .bind(&digest.as_bytes()[..])
        .fetch_optional(&mut *conn)
        .await
        .map_err(backend)?
        .as_ref()
        .map(decode)
        .transpose()
}

/// Whether [`save`] queues the task's notification in its statement.
#[derive(Clone, Copy)]
enum Announce {
    /// In the same statement ([`SAVE_AND_NOTIFY`]).
    WithSave,
    /// Later, by [`commit`] (a purge announces all its tasks at once).
    AtCommit,
}

/// Writes `record` back over the row read at `read_rev`; the row must still
/// be at `read_rev` (it is locked, so it is).
#[allow(clippy::too_many_arguments)]
async fn save(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    read_rev: Rev,
    record: &TaskRecord,
    instance: &[u8],
    next_seq: i64,
    announce: Announce,
) -> Result<()> {
    let statement = match announce {
        Announce::WithSave => SAVE_AND_NOTIFY,
        Announce::AtCommit => SAVE,
    };
    let query = sqlx::query(sql(store, statement))
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
        .bind(record.context.as_deref());
    let saved = match announce {
        Announce::WithSave => query
            .bind(store.notify_channel())
            .bind(task_payload(Some(&task_token(digest))))
            .fetch_all(&mut *conn)
            .await
            .map_err(backend)?
            .len(),
        Announce::AtCommit => usize::try_from(
            query
                .execute(&mut *conn)
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

async fn supersede_inputs(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
) -> Result<()> {
    sqlx::query(sql(store, SUPERSEDE))
        .bind(&digest.as_bytes()[..])
        .execute(&mut *conn)
        .await
        .map_err(backend)?;
    Ok(())
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

/// The task under `digest` if `owner` (or, `None`, anyone) may see it,
/// locked, as stored and as seen at `now`.
async fn visible(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    owner: Option<&[u8]>,
    now: i64,
) -> Result<Option<(Stored, TaskRecord)>> {
    let Some(stored) = load(store, conn, digest, true).await? else {
        return Ok(None);
    };
    if owner.is_some_and(|owner| owner != stored.owner) {
        return Ok(None);
    }
    Ok(stored.seen(now).map(|seen| (stored, seen)))
}

/// The task as `owner` sees it now, from one statement's snapshot.
async fn read(
    store: &PostgresStore,
    digest: &TaskDigest,
    owner: &[u8],
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    let mut conn = store.pool().acquire().await.map_err(backend)?;
    let stored = load(store, &mut conn, digest, false).await?;
    Ok(stored
        .filter(|stored| stored.owner == owner)
        .and_then(|stored| stored.seen(now)))
}

/// Writes back a record a client's call changed (the task keeps its
/// instance), and answers with the task as now stored.
async fn save_client_change(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    stored: &Stored,
    record: &TaskRecord,
    now: i64,
) -> Result<Option<TaskRecord>> {
    save(
        store,
        conn,
        digest,
        stored.record.rev,
        record,
        &stored.instance,
        stored.next_seq,
        Announce::WithSave,
    )
    .await?;
    Ok(load(store, conn, digest, false)
        .await?
        .and_then(|s| s.seen(now)))
}

// ------------------------------------------------------------ the steps

async fn answer_step(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    owner: &[u8],
    responses: &[(&str, &[u8])],
    now: i64,
) -> Result<(Option<TaskRecord>, bool)> {
    let Some((stored, seen)) = visible(store, conn, digest, Some(owner), now).await? else {
        return Ok((None, false));
    };
    if seen.status.is_terminal() {
        return Ok((Some(seen), false));
    }
    let mut record = stored.record.clone();
    let answered = record.answer(responses, now);
    if answered.is_empty() {
        return Ok((Some(seen), false));
    }
    for (key, response) in answered {
        sqlx::query(sql(store, ANSWER_INPUT))
            .bind(*response)
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .execute(&mut *conn)
            .await
            .map_err(backend)?;
    }
    let after = save_client_change(store, conn, digest, &stored, &record, now).await?;
    Ok((after, true))
}

async fn cancel_step(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    owner: &[u8],
    mode: CancelMode,
    now: i64,
) -> Result<(Option<TaskRecord>, bool)> {
    let Some((stored, seen)) = visible(store, conn, digest, Some(owner), now).await? else {
        return Ok((None, false));
    };
    if seen.status.is_terminal() {
        return Ok((Some(seen), false));
    }
    let mut record = stored.record.clone();
    if !record.request_cancel(mode, now) {
        return Ok((Some(seen), false));
    }
    supersede_inputs(store, conn, digest).await?;
    let after = save_client_change(store, conn, digest, &stored, &record, now).await?;
    Ok((after, true))
}

async fn apply_step(
    store: &PostgresStore,
    conn: &mut PgConnection,
    digest: &TaskDigest,
    by: &InstanceId,
    change: WorkerChange<'_>,
    now: i64,
    options: &TaskOptions,
) -> Result<(Applied, bool)> {
    let Some((stored, seen)) = visible(store, conn, digest, None, now).await? else {
        return Ok((Applied::Unknown, false));
    };
    if seen.status.is_terminal() {
        return Ok((Applied::AlreadyTerminal(seen.status), false));
    }
    let mut record = stored.record.clone();
    let effect = match record.apply(
        change,
        |key| stored.keys.iter().any(|k| k == key),
        options,
        now,
    )? {
        Step::Unchanged(applied) => return Ok((applied, false)),
        Step::Changed(effect) => effect,
    };
    let mut next_seq = stored.next_seq;
    let mut answer = None;
    match effect {
        InputEffect::None => {}
        InputEffect::Request { key, request } => {
            next_seq += 1;
            sqlx::query(sql(store, REQUEST_INPUT))
                .bind(&digest.as_bytes()[..])
                .bind(key.as_bytes())
                .bind(next_seq)
                .bind(request)
                .execute(&mut *conn)
                .await
                .map_err(backend)?;
        }
        InputEffect::Take { key } => {
            let response: Option<Vec<u8>> = sqlx::query_scalar(sql(store, TAKE_INPUT))
                .bind(&digest.as_bytes()[..])
                .bind(key.as_bytes())
                .fetch_optional(&mut *conn)
                .await
                .map_err(backend)?
                .ok_or_else(|| Error::Corrupt("an answered input is missing".into()))?;
            answer = Some(response.unwrap_or_default().into());
        }
        InputEffect::Supersede => supersede_inputs(store, conn, digest).await?,
        InputEffect::Replace { requests } => {
            let (superseded, added) = replacement(&stored.record, requests);
            if !superseded.is_empty() {
                let superseded: Vec<&[u8]> = superseded.iter().map(|k| k.as_bytes()).collect();
                sqlx::query(sql(store, SUPERSEDE_KEYS))
                    .bind(&digest.as_bytes()[..])
                    .bind(superseded)
                    .execute(&mut *conn)
                    .await
                    .map_err(backend)?;
            }
            for (key, request) in added {
                next_seq += 1;
                sqlx::query(sql(store, REQUEST_INPUT))
                    .bind(&digest.as_bytes()[..])
                    .bind(key.as_bytes())
                    .bind(next_seq)
                    .bind(request)
                    .execute(&mut *conn)
                    .await
                    .map_err(backend)?;
            }
        }
    }
    save(
        store,
        conn,
        digest,
        stored.record.rev,
        &record,
        &by.0,
        next_seq,
        Announce::WithSave,
    )
    .await?;
    Ok((
        Applied::Changed {
            rev: record.rev,
            answer,
        },
        true,
    ))
}

/// One step of a purge, in one transaction: persists what reads show for
/// up to [`PURGE_BATCH`] tasks (expired and orphaned tasks as `failed`),
/// deletes up to as many tasks past their grace (their inputs go with
/// them), and, once no running task of a lapsed instance is left, forgets
/// lapsed instances. Returns whether there is more to do.
async fn purge_step(
    store: &PostgresStore,
    conn: &mut PgConnection,
    now: i64,
) -> Result<(TaskPurgeReport, bool)> {
    let mut report = TaskPurgeReport::default();
    let ended: Vec<Vec<u8>> = sqlx::query_scalar(sql(store, ENDED))
        .bind(now)
        .bind(PURGE_BATCH)
        .fetch_all(&mut *conn)
        .await
        .map_err(backend)?;
    let ended_all = (ended.len() as i64) < PURGE_BATCH;
    for digest in ended {
        let digest = TaskDigest(
            digest
                .try_into()
                .map_err(|_| Error::Corrupt("a task digest is not 16 bytes".into()))?,
        );
        // Locked and read again: a step may have changed it meanwhile.
        let Some(stored) = load(store, conn, &digest, true).await? else {
            continue;
        };
        let Some(seen) = stored.seen(now) else {
            continue;
        };
        if seen.status == stored.record.status {
            continue;
        }
        report.count_ended(&seen);
        supersede_inputs(store, conn, &digest).await?;
        let mut record = stored.record.clone();
        record.status = seen.status;
        record.outcome = seen.outcome;
        record.rev = seen.rev;
        record.updated_at = seen.updated_at;
        save(
            store,
            conn,
            &digest,
            stored.record.rev,
            &record,
            &stored.instance,
            stored.next_seq,
            Announce::AtCommit,
        )
        .await?;
    }
    report.deleted = sqlx::query(sql(store, DELETE_PAST_GRACE))
        .bind(now)
        .bind(PURGE_BATCH)
        .execute(&mut *conn)
        .await
        .map_err(backend)?
        .rows_affected();
    if ended_all {
        // Every running task of a lapsed instance is terminal now, so
        // forgetting the instance brings nothing back.
        report.instances = sqlx::query(sql(store, FORGET_INSTANCES))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(backend)?
            .rows_affected();
    }
    let more = !ended_all || report.deleted >= PURGE_BATCH as u64;
    Ok((report, more))
}

// ------------------------------------------------------------ the trait

/// Durable tasks in `tasks`, `task_inputs` and `instances`; see the crate
/// docs, "Tasks".
#[async_trait]
impl TaskStore for PostgresStore {
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> Result<Option<TaskRecord>> {
        task.check()?;
        let record = TaskRecord::created(task, self.now(), self.task_options());
        let inserted = sqlx::query(sql(self, CREATE))
            .bind(&id.digest().as_bytes()[..])
            .bind(owner_bytes(task.owner))
            .bind(i16::from(record.status.as_u8()))
            .bind(to_i64(record.rev))
            .bind(record.message.as_deref().map(str::as_bytes))
            .bind(record.created_at)
            .bind(record.updated_at)
            .bind(record.expires_at)
            .bind(record.purge_at)
            .bind(record.ttl_ms.map(to_i64))
            .bind(record.poll_interval_ms.map(to_i64))
            .bind(&task.instance.0[..])
            .bind(task.context)
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
            .bind(&task.instance.0[..])
            .bind(record.created_at)
            .fetch_optional(self.pool())
            .await
            .map_err(backend)?;
        match alive {
            Some(_) => Ok(None),
            None => Err(Error::instance_lapsed(&task.instance)),
        }
    }

    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        read(self, &digest, &owner_bytes(who)).await
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
        let owner = owner_bytes(who);
        let now = self.now();
        let mut tx = begin(self).await?;
        let (after, changed) = answer_step(self, &mut tx, &digest, &owner, responses, now).await?;
        commit(self, tx, Some(&digest), changed, Announce::WithSave).await?;
        Ok(after)
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
        let owner = owner_bytes(who);
        let now = self.now();
        let mut tx = begin(self).await?;
        let (after, changed) = cancel_step(self, &mut tx, &digest, &owner, mode, now).await?;
        commit(self, tx, Some(&digest), changed, Announce::WithSave).await?;
        Ok(after)
    }

    async fn apply(
        &self,
        id: &TaskId,
        by: InstanceId,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        change.check(self.options().max_payload_bytes)?;
        let digest = id.digest();
        let now = self.now();
        let options = *self.task_options();
        let mut tx = begin(self).await?;
        let (applied, changed) =
            apply_step(self, &mut tx, &digest, &by, change, now, &options).await?;
        commit(self, tx, Some(&digest), changed, Announce::WithSave).await?;
        Ok(applied)
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
        let owner: Arc<[u8]> = owner_bytes(who).into();
        let deadline = tokio::time::Instant::now() + max_wait;
        let follows = self.follows();
        // Listening, and subscribed, before the first read: a change
        // committed after that read is announced.
        follows.listen().await?;
        let woken = follows.tasks().subscribe(task_token(&digest));
        watch_task(woken, after, deadline, follows.recheck(), || {
            let (store, owner) = (self.clone(), owner.clone());
            async move { read(&store, &digest, &owner).await }
        })
        .await
    }

    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let now = self.now();
        // Inserted, or renewed while still alive; a lapsed instance stays
        // lapsed (its tasks already read as lost).
        let renewed: Option<i32> = sqlx::query_scalar(sql(self, HEARTBEAT))
            .bind(&me.0[..])
            .bind(now.saturating_add(to_i64(millis(lease))))
            .bind(now)
            .fetch_optional(self.heartbeats())
            .await
            .map_err(backend)?;
        Ok(renewed.is_some())
    }

    /// Purges in steps of one transaction each (at most 500 tasks ended
    /// and 500 deleted per step).
    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
        let now = self.now();
        let mut report = TaskPurgeReport::default();
        loop {
            let mut tx = begin(self).await?;
            let (step, more) = purge_step(self, &mut tx, now).await?;
            commit(
                self,
                tx,
                None,
                step != TaskPurgeReport::default(),
                Announce::AtCommit,
            )
            .await?;
            report += step;
            if !more {
                return Ok(report);
            }
        }
    }

    async fn view(&self, id: &TaskId) -> Result<Option<TaskView>> {
        let now = self.now();
        let mut conn = self.pool().acquire().await.map_err(backend)?;
        let Some(stored) = load(self, &mut conn, &id.digest(), false).await? else {
            return Ok(None);
        };
        let Some(seen) = stored.seen(now) else {
            return Ok(None);
        };
        Ok(Some(TaskView::new(
            owner_of(&stored.owner)?,
            seen,
            stored.answers,
        )))
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(false);
        };
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
