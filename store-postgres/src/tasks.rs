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
//! Once a step that changed a task has committed, the handle announces it
//! to other handles: `pg_notify(<channel>, 't' || <digest prefix in hex>)`
//! through the handle's [`Notifier`](crate::follow::Notifier), the one its
//! appends use, in a short transaction of its own, together with whatever
//! else was queued meanwhile, and only while another handle listens. Not
//! inside the step's transaction: PostgreSQL serializes notifying commits
//! cluster-wide until their WAL is flushed, so steps that notified there
//! could not share a flush (under a burst of 1,000 task calls the steps
//! queued on that lock, `Lock:object` in `pg_stat_activity`, one flush
//! each; see [`crate::sql::NOTIFY`]). A notification never announces a
//! change that rolled back; one lost with the process between the commit
//! and the announcement only delays watchers elsewhere until their
//! recheck. Every handle's one listening connection (the one its event
//! follows use, [`crate::follow`]) wakes its task watchers of that task,
//! which re-read it (T10); the handle itself wakes its own watchers right
//! after the commit. The commit and the announcement run in a task of
//! their own (a batch's, for batched steps: [`crate::batches`]), which
//! goes on if the caller gives up mid-commit, so a committed change is
//! always announced. A task watcher holds no connection while it waits: a
//! registration in the handle's hub.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::follow::{Wakeups, task_token, watch_task};
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
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{Postgres, Row, SqlStr, Transaction};

use crate::PostgresStore;
use crate::batches::Statement;
use crate::creates::CreateRequest;
use crate::error::backend;
use crate::follow::Notifier;
use crate::options::quote_schema;
use crate::sql::render;
use crate::steps::{self, ApplyRequest};

/// Tasks a purge step ends or deletes at most, so one transaction never
/// holds many row locks for long.
const PURGE_BATCH: i64 = 500;

/// The columns [`LOAD`] and [`LOCK_LOAD`] read: the task row, its
/// instance's deadline and its inputs (in request order), as [`decode`]
/// takes them.
macro_rules! task_columns {
    () => {
        r#"
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
       t.max_attempts, t.lapses, t.epoch, t.released, t.checkpoint, t.cancel_reason"#
    };
}
pub(crate) use task_columns;

/// The task, its inputs (in request order) and its instance's deadline, in
/// one statement (one snapshot): what `get` and `watch` read, and what a
/// mutation reads after [`LOCK_LOAD`] found its snapshot stale.
const LOAD: &str = concat!(
    task_columns!(),
    "\n  FROM {s}.tasks t WHERE t.digest = $1\n"
);

/// Locks a task's row for a mutation's transaction and reads it as
/// [`LOAD`] does, plus whether that read is the row as locked (column
/// 26).
///
/// A statement that waits for a row lock re-reads the locked row when it
/// gets it, but its sub-selects keep the snapshot taken before the wait:
/// after a wait for a step that changed the task, they would miss the
/// inputs that step wrote (a replacement racing another then lost its
/// supersedes). Every committed change to a task, its inputs included,
/// writes a new version of its row, whose `xmin` is the writing
/// transaction; so the statement compares the `xmin` of the row it locked
/// with that of the row its snapshot shows (a sub-select, which keeps the
/// snapshot). Equal: no step changed the task between the snapshot and
/// the lock, and the whole read is of the task as locked. Otherwise
/// [`PgRows::lock`] reads it again with [`LOAD`], a statement of its own,
/// whose snapshot is taken under the lock. One round trip instead of two
/// for every step that did not wait for another.
const LOCK_LOAD: &str = concat!(
    task_columns!(),
    ",\n       t.xmin = (SELECT o.xmin FROM {s}.tasks o WHERE o.digest = t.digest)",
    "\n  FROM {s}.tasks t WHERE t.digest = $1 FOR UPDATE OF t\n"
);

/// [`LOAD`] of many tasks in one statement, each row with its digest
/// (column 26): what concurrent reads share ([`Reads`]).
pub(crate) const LOAD_MANY: &str = concat!(
    task_columns!(),
    ",\n       t.digest\n  FROM {s}.tasks t WHERE t.digest = ANY($1)\n"
);

const SAVE: &str = r#"
UPDATE {s}.tasks SET status = $1, rev = $2, message = $3, updated_at = $4, ttl_ms = $5,
       expires_at = $6, purge_at = $7, poll_ms = $8, cancel = $9, outcome = $10,
       instance = $11, next_seq = $12, context = $15, max_attempts = $16, lapses = $17,
       epoch = $18, released = $19, checkpoint = $20, cancel_reason = $21
 WHERE digest = $13 AND rev = $14
"#;

/// Whether an instance is alive at `$2`: why a create
/// ([`crate::creates::CREATE`]) wrote nothing.
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

/// A task statement with `schema` (quoted) spliced in.
fn sql_in(schema: &str, template: &str) -> SqlStr {
    render(template, schema)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn to_u32(n: i32) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Corrupt(format!("a task counter is {n}")))
}

pub(crate) fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

// ------------------------------------------------------------ storage

fn utf8(bytes: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Corrupt(format!("{what} is not UTF-8")))
}

pub(crate) fn decode(row: &PgRow) -> Result<TaskRow> {
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
    schema: &str,
    conn: &mut PgConnection,
    digest: &TaskDigest,
) -> Result<Option<TaskRow>> {
    sqlx::query(sql_in(schema, LOAD))
        .bind(&digest.as_bytes()[..])
        .fetch_optional(&mut *conn)
        .await
        .map_err(backend)?
        .as_ref()
        .map(decode)
        .transpose()
}

/// The task statements in one transaction: what [`rows`] runs a step
/// through.
pub(crate) struct PgRows<'a> {
    /// The store's schema, quoted.
    schema: &'a str,
    conn: &'a mut PgConnection,
    /// A task this transaction read with no outstanding input and has
    /// added none to since: superseding its outstanding inputs writes
    /// nothing, and is skipped. Inputs are added only under the task's row
    /// lock, which this transaction holds from its first read of the task.
    none_outstanding: Option<TaskDigest>,
}

impl PgRows<'_> {
    /// Notes what `row`, just read under the lock of `digest`, says of its
    /// outstanding inputs.
    fn seen(&mut self, digest: &TaskDigest, row: Option<&TaskRow>) {
        self.none_outstanding = row
            .is_some_and(|row| row.record.outstanding.is_empty())
            .then_some(*digest);
    }
}

#[async_trait]
impl TaskRows for PgRows<'_> {
    /// [`LOCK_LOAD`], then [`LOAD`] if the row changed while the lock was
    /// awaited (see why at [`LOCK_LOAD`]).
    async fn lock(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        let locked = sqlx::query(sql_in(self.schema, LOCK_LOAD))
            .bind(&digest.as_bytes()[..])
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(backend)?;
        let Some(locked) = locked else {
            self.seen(digest, None);
            return Ok(None);
        };
        let fresh: Option<bool> = locked.try_get(26).map_err(backend)?;
        let row = if fresh == Some(true) {
            Some(decode(&locked)?)
        } else {
            load(self.schema, self.conn, digest).await?
        };
        self.seen(digest, row.as_ref());
        Ok(row)
    }

    async fn reload(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        let row = load(self.schema, self.conn, digest).await?;
        self.seen(digest, row.as_ref());
        Ok(row)
    }

    async fn save(
        &mut self,
        digest: &TaskDigest,
        read_rev: Rev,
        record: &TaskRecord,
        instance: &[u8],
        next_seq: i64,
    ) -> Result<()> {
        let saved = sqlx::query(sql_in(self.schema, SAVE))
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
            .bind(record.cancel_reason.as_deref().map(str::as_bytes))
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?
            .rows_affected();
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
        sqlx::query(sql_in(self.schema, ANSWER_INPUT))
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
        if self.none_outstanding == Some(*digest) {
            self.none_outstanding = None;
        }
        sqlx::query(sql_in(self.schema, REQUEST_INPUT))
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
        let response: Option<Vec<u8>> = sqlx::query_scalar(sql_in(self.schema, TAKE_INPUT))
            .bind(&digest.as_bytes()[..])
            .bind(key.as_bytes())
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(backend)?
            .ok_or_else(|| Error::Corrupt("an answered input is missing".into()))?;
        Ok(response.unwrap_or_default().into())
    }

    /// Skipped for a task read with no outstanding input under this
    /// transaction's lock, which none was added to since: it would write
    /// nothing (a finish, a cancel of a task that asked for nothing).
    async fn supersede(&mut self, digest: &TaskDigest, keys: Option<&[String]>) -> Result<()> {
        if self.none_outstanding == Some(*digest) {
            return Ok(());
        }
        match keys {
            None => sqlx::query(sql_in(self.schema, SUPERSEDE)).bind(&digest.as_bytes()[..]),
            Some(keys) => sqlx::query(sql_in(self.schema, SUPERSEDE_KEYS))
                .bind(&digest.as_bytes()[..])
                .bind(keys.iter().map(String::as_bytes).collect::<Vec<_>>()),
        }
        .execute(&mut *self.conn)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn ended(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        let ended: Vec<Vec<u8>> = sqlx::query_scalar(sql_in(self.schema, ENDED))
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(backend)?;
        ended.iter().map(|digest| stored_digest(digest)).collect()
    }

    async fn delete_past_grace(&mut self, now: i64, limit: i64) -> Result<u64> {
        Ok(sqlx::query(sql_in(self.schema, DELETE_PAST_GRACE))
            .bind(now)
            .bind(limit)
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?
            .rows_affected())
    }

    async fn forget_instances(&mut self, now: i64) -> Result<u64> {
        Ok(sqlx::query(sql_in(self.schema, FORGET_INSTANCES))
            .bind(now)
            .execute(&mut *self.conn)
            .await
            .map_err(backend)?
            .rows_affected())
    }

    async fn waiting(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        let waiting: Vec<Vec<u8>> = sqlx::query_scalar(sql_in(self.schema, WAITING))
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(backend)?;
        waiting.iter().map(|digest| stored_digest(digest)).collect()
    }

    async fn alive(&mut self, id: &InstanceId, now: i64) -> Result<bool> {
        let alive: Option<i32> = sqlx::query_scalar(sql_in(self.schema, ALIVE))
            .bind(&id.as_bytes()[..])
            .bind(now)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(backend)?;
        Ok(alive.is_some())
    }
}

/// Commits a mutation's transaction; then, if it changed something,
/// announces the change to the task `digest` (every task, `None`).
async fn commit(
    store: &PostgresStore,
    tx: Transaction<'static, Postgres>,
    digest: Option<&TaskDigest>,
    changed: bool,
) -> Result<()> {
    let announcer = announcer(store);
    let digest = digest.copied();
    commit_then(tx, move || match digest {
        _ if !changed => {}
        Some(digest) => announcer.announce([digest]),
        None => announcer.announce_all(),
    })
    .await
}

/// Commits `tx`, then runs `then`, in a task of their own: a caller that
/// gives up mid-commit cannot cut `then` (an announcement) off from a
/// commit that happened.
async fn commit_then(
    tx: Transaction<'static, Postgres>,
    then: impl FnOnce() + Send + 'static,
) -> Result<()> {
    let committed = tokio::spawn(async move {
        tx.commit().await.map_err(backend)?;
        then();
        Ok(())
    });
    match committed.await {
        Ok(committed) => committed,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(Error::Closed),
    }
}

fn announcer(store: &PostgresStore) -> Announcer {
    Announcer::new(store.notifier().clone(), store.follows().tasks().clone())
}

/// Announces a handle's committed task changes: to other handles through
/// its [`Notifier`] (in a transaction of its own, only while another
/// handle listens), and to its own task watchers.
pub(crate) struct Announcer {
    notifier: Notifier,
    watchers: Arc<Wakeups>,
}

impl Announcer {
    pub(crate) fn new(notifier: Notifier, watchers: Arc<Wakeups>) -> Self {
        Self { notifier, watchers }
    }

    /// Once changes to the tasks `digests` have committed.
    pub(crate) fn announce(&self, digests: impl IntoIterator<Item = TaskDigest>) {
        let tokens: Vec<_> = digests.into_iter().map(|d| task_token(&d)).collect();
        if tokens.is_empty() {
            return;
        }
        self.notifier.announce_tasks(tokens.iter().copied());
        for token in &tokens {
            self.watchers.wake(token);
        }
    }

    /// Once a change to any task (a purge) has committed: every watcher
    /// re-reads.
    pub(crate) fn announce_all(&self) {
        self.notifier.announce_all_tasks();
        self.watchers.wake_all();
    }
}

async fn begin(store: &PostgresStore) -> Result<Transaction<'static, Postgres>> {
    store.pool().begin().await.map_err(backend)
}

/// Task reads, batched ([`crate::batches`]): a read alone is [`LOAD`];
/// reads that arrive while others are in flight share one [`LOAD_MANY`]
/// (those of one task share its row). Under a burst of task calls, reads
/// are most of the store's statements (a `tools/call` as a task through
/// tower-mcp reads its task five times: its owner, its presence, the
/// result, the watch), and each read alone took a pooled connection, a
/// round trip and a statement's fixed cost on the server. A read in a
/// batch still sees every change committed before it was called: the
/// batch's statement, and its snapshot, start after the read was queued.
pub(crate) struct Reads {
    pool: PgPool,
    one: SqlStr,
    many: SqlStr,
}

impl Reads {
    /// The reads of the store in the schema `quoted_schema`, on `pool`.
    pub(crate) fn new(pool: PgPool, quoted_schema: &str) -> Self {
        Self {
            pool,
            one: render(LOAD, quoted_schema),
            many: render(LOAD_MANY, quoted_schema),
        }
    }
}

impl Statement for Reads {
    type Request = TaskDigest;
    /// The task's row as read, for each caller to decode.
    type Answer = Option<Arc<PgRow>>;
    type Key = TaskDigest;

    const MAX_REQUESTS: usize = 256;
    const MAX_BYTES: usize = usize::MAX;
    const IN_FLIGHT: usize = 4;
    const STALL: Duration = Duration::from_millis(20);
    const SHARE: bool = true;
    const WHAT: &'static str = "batched task read";

    fn key(digest: &TaskDigest) -> TaskDigest {
        *digest
    }

    fn size(_: &TaskDigest) -> usize {
        0
    }

    async fn one(&self, digest: &TaskDigest) -> sqlx::Result<Option<Arc<PgRow>>> {
        Ok(sqlx::query(self.one.clone())
            .bind(&digest.as_bytes()[..])
            .fetch_optional(&self.pool)
            .await?
            .map(Arc::new))
    }

    async fn many(&self, digests: &[&TaskDigest]) -> sqlx::Result<Vec<Option<Arc<PgRow>>>> {
        let keys: Vec<&[u8]> = digests.iter().map(|d| &d.as_bytes()[..]).collect();
        let rows = sqlx::query(self.many.clone())
            .bind(&keys)
            .fetch_all(&self.pool)
            .await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in rows {
            let digest: Vec<u8> = row.try_get(26)?;
            found.insert(digest, Arc::new(row));
        }
        Ok(keys.iter().map(|key| found.get(*key).cloned()).collect())
    }
}

/// The task's row with its inputs, from one statement's snapshot taken
/// after this call began (alone, or in a batch of reads).
async fn fetch(store: &PostgresStore, digest: &TaskDigest) -> Result<Option<TaskRow>> {
    store
        .reads()
        .call(*digest)
        .await?
        .map(|row| decode(&row))
        .transpose()
}

/// The task as `reader` sees it now, from one statement's snapshot.
async fn read(
    store: &PostgresStore,
    digest: &TaskDigest,
    reader: &Reader,
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    let row = fetch(store, digest).await?;
    Ok(row.and_then(|row| match reader.owner() {
        Some(owner) => row.read_by(owner, now),
        None => row.seen(now),
    }))
}

/// A step's statements in `tx`, on the store in `schema` (quoted).
pub(crate) fn statements<'a>(schema: &'a str, tx: &'a mut PgConnection) -> PgRows<'a> {
    PgRows {
        schema,
        conn: tx,
        none_outstanding: None,
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
        let inserted = self
            .creates()
            .call(CreateRequest {
                digest,
                owner: owner_key(task.owner),
                status: i16::from(record.status.as_u8()),
                rev: to_i64(record.rev),
                message: record.message.as_deref().map(|m| m.as_bytes().to_vec()),
                created_at: record.created_at,
                updated_at: record.updated_at,
                expires_at: record.expires_at,
                purge_at: record.purge_at,
                ttl_ms: record.ttl_ms.map(to_i64),
                poll_ms: record.poll_interval_ms.map(to_i64),
                instance: task.instance.as_bytes().to_vec(),
                context: task.context.map(Bytes::copy_from_slice),
                max_attempts: task.takeover.map(to_i32),
                released: task.queued,
            })
            .await?;
        if inserted {
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
            &mut statements(&quote_schema(self.schema()), &mut tx),
            &digest,
            &owner,
            responses,
            now,
        )
        .await?;
        commit(self, tx, Some(&digest), stepped.changed).await?;
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
            &mut statements(&quote_schema(self.schema()), &mut tx),
            &digest,
            &owner,
            mode,
            reason,
            now,
        )
        .await?;
        commit(self, tx, Some(&digest), stepped.changed).await?;
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
            let (step, more) = rows::purge(
                &mut statements(&quote_schema(self.schema()), &mut tx),
                now,
                PURGE_BATCH,
            )
            .await?;
            commit(self, tx, None, step.changed).await?;
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
        commit(self, tx, Some(&digest), deleted).await?;
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
        if let Some(request) = ApplyRequest::new(digest, by, &change, options, now) {
            return Ok(steps::apply(self, request).await?.answer);
        }
        let mut tx = begin(self).await?;
        let stepped = rows::apply(
            &mut statements(&quote_schema(self.schema()), &mut tx),
            &digest,
            &by,
            change,
            &options,
            now,
        )
        .await?;
        commit(self, tx, Some(&digest), stepped.changed).await?;
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
        let row = fetch(self, digest).await?;
        row.map_or(Ok(None), |row| row.view(now))
    }

    /// Claims in one transaction: the waiting tasks are locked (`FOR
    /// UPDATE SKIP LOCKED`, so racing claimants take different tasks), each
    /// is decided again and written back; each is announced once committed.
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now();
        let mut tx = begin(self).await?;
        let stepped = rows::claim(
            &mut statements(&quote_schema(self.schema()), &mut tx),
            by,
            limit,
            now,
        )
        .await?;
        let announcer = announcer(self);
        let claimed: Vec<_> = stepped.answer.iter().map(|claimed| claimed.task).collect();
        commit_then(tx, move || announcer.announce(claimed)).await?;
        Ok(stepped.answer)
    }

    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        let now = self.now();
        let mut tx = begin(self).await?;
        let stepped = rows::requeue(
            &mut statements(&quote_schema(self.schema()), &mut tx),
            task,
            now,
        )
        .await?;
        commit(self, tx, Some(task), stepped.changed).await?;
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
            LOCK_LOAD,
            LOAD_MANY,
            SAVE,
            crate::creates::CREATE,
            crate::creates::CREATE_BATCH,
            crate::steps::LOCK_LOAD_MANY,
            crate::steps::SUPERSEDE_MANY,
            crate::steps::SUPERSEDE_KEYS_MANY,
            crate::steps::TAKE_MANY,
            crate::steps::REQUEST_MANY,
            crate::steps::SAVE_MANY,
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
