//! A worker's changes to tasks (`apply`, `apply_claimed`), batched: the
//! concurrent steps on one handle, each on a task of its own, share one
//! transaction ([`crate::batches`]).
//!
//! A step alone is one transaction on a pooled connection (see
//! [`crate::tasks`]): `BEGIN`, the locking read, the writes, `COMMIT`, four
//! round trips or more, and a WAL flush it waits for with the connection
//! held. Under a burst of task calls on one handle (1,000 at once, each
//! creating its task, finishing it and reading it back) the steps queued
//! for the pool's connections, and every other call of the handle queued
//! behind them: a task call took a median 0.7 s where Redis took 0.1 s.
//!
//! A batch runs the steps queued meanwhile (at most one per task, at most
//! [`Applies::MAX_REQUESTS`]) in one transaction:
//!
//! 1. one statement locks every task of the batch in digest order and
//!    reads each as the lone step's locking read does ([`LOCK_LOAD_MANY`];
//!    the tasks a step waited for are read again under their locks, as
//!    there, by [`LOAD_MANY`]);
//! 2. each step is decided by the same code a lone step runs
//!    ([`rows::apply`]) on its task as read, its writes collected
//!    ([`StepRows`]); a step the state machine refuses (an error) writes
//!    nothing and gets its error;
//! 3. the writes of every step go in one statement per kind (inputs
//!    superseded, answers taken, inputs requested, then the task rows,
//!    each conditioned on the `rev` read, as a lone step's);
//! 4. one `COMMIT`: one WAL flush for the batch.
//!
//! Each step still holds its task's row lock from its read to the commit,
//! so it is atomic against every other step on that task, from any
//! handle or process (T4); its caller is answered once the batch
//! committed (durable on return). Right after the commit, in the batch's
//! task, each change is announced and wakes this handle's watchers, as a
//! lone step's is in its own task: a committed change is announced even
//! if its caller has gone ([`crate::batches`]). Tasks are locked in
//! digest order, the order purges lock them in, so batches never deadlock
//! each other or a purge; other steps lock one task each. If the server
//! refuses a statement of the batch (or the commit), the transaction is
//! rolled back and each step runs again alone; a commit whose outcome is
//! unknown (the connection lost) fails every step of the batch, as it
//! would a lone step.
//!
//! A step that replaces inputs (`ReplaceInputs`, rare) always runs alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::task::TaskDigest;
use mcp_event_store_core::backend::task::rows::{self, Stepped, TaskRow, TaskRows, stored_digest};
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, Rev, TaskOptions, TaskRecord, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{Row, SqlStr};

use crate::batches::Statement;
use crate::error::NAME;
use crate::follow::Notifier;
use crate::sql::render;
use crate::tasks::{Announcer, decode, statements, to_i32, to_i64};

/// [`crate::tasks::LOCK_LOAD`] of many tasks, locked in digest order; each
/// row with whether it was read as locked (column 26) and its digest
/// (column 27).
pub(crate) const LOCK_LOAD_MANY: &str = concat!(
    crate::tasks::task_columns!(),
    ",\n       t.xmin = (SELECT o.xmin FROM {s}.tasks o WHERE o.digest = t.digest),",
    "\n       t.digest",
    "\n  FROM {s}.tasks t WHERE t.digest = ANY($1) ORDER BY t.digest FOR UPDATE OF t\n"
);

/// Supersedes every outstanding input of the tasks `$1`.
pub(crate) const SUPERSEDE_MANY: &str =
    "UPDATE {s}.task_inputs SET state = 2 WHERE digest = ANY($1) AND state = 0";

/// Supersedes the outstanding inputs `$2[i]` of the tasks `$1[i]`.
pub(crate) const SUPERSEDE_KEYS_MANY: &str = r#"
UPDATE {s}.task_inputs k SET state = 2
  FROM unnest($1::bytea[], $2::bytea[]) AS u(digest, key)
 WHERE k.digest = u.digest AND k.key = u.key AND k.state = 0
"#;

/// Marks the answered inputs `$2[i]` of the tasks `$1[i]` spent.
pub(crate) const TAKE_MANY: &str = r#"
UPDATE {s}.task_inputs k SET state = 2, response = NULL
  FROM unnest($1::bytea[], $2::bytea[]) AS u(digest, key)
 WHERE k.digest = u.digest AND k.key = u.key AND k.state = 1
"#;

/// Adds outstanding inputs: task, key, sequence number, request.
pub(crate) const REQUEST_MANY: &str = r#"
INSERT INTO {s}.task_inputs (digest, key, seq, state, request)
SELECT u.digest, u.key, u.seq, 0, u.request
  FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bytea[]) AS u(digest, key, seq, request)
"#;

/// [`crate::tasks`]'s `SAVE` of many tasks, each element of the arrays one
/// task (in `SAVE`'s order of parameters); returns the digest of each row
/// it wrote.
pub(crate) const SAVE_MANY: &str = r#"
UPDATE {s}.tasks t SET status = u.status, rev = u.rev, message = u.message,
       updated_at = u.updated_at, ttl_ms = u.ttl_ms, expires_at = u.expires_at,
       purge_at = u.purge_at, poll_ms = u.poll_ms, cancel = u.cancel, outcome = u.outcome,
       instance = u.instance, next_seq = u.next_seq, context = u.context,
       max_attempts = u.max_attempts, lapses = u.lapses, epoch = u.epoch,
       released = u.released, checkpoint = u.checkpoint, cancel_reason = u.cancel_reason
  FROM unnest($1::int2[], $2::int8[], $3::bytea[], $4::int8[], $5::int8[], $6::int8[],
              $7::int8[], $8::int8[], $9::bool[], $10::bytea[], $11::bytea[], $12::int8[],
              $13::bytea[], $14::int8[], $15::bytea[], $16::int4[], $17::int4[], $18::int4[],
              $19::bool[], $20::bytea[], $21::bytea[])
       AS u(status, rev, message, updated_at, ttl_ms, expires_at, purge_at, poll_ms, cancel,
            outcome, instance, next_seq, digest, read_rev, context, max_attempts, lapses,
            epoch, released, checkpoint, cancel_reason)
 WHERE t.digest = u.digest AND t.rev = u.read_rev
RETURNING t.digest
"#;

/// A worker's change, owned, so that it can wait for a batch.
#[derive(Debug)]
enum Change {
    RequestInput { key: String, request: Bytes },
    TakeAnswer { key: String },
    SetMessage(Option<String>),
    SetPollInterval(Option<Duration>),
    SetTtl(Option<Duration>),
    Completed(Bytes),
    Failed(Bytes),
    Cancelled,
    SetContext(Bytes),
    Checkpoint(Bytes),
    Release,
}

impl Change {
    /// `change`, owned; `None` for a change that always runs alone.
    fn of(change: &WorkerChange<'_>) -> Option<Self> {
        let bytes = |b: &[u8]| Bytes::copy_from_slice(b);
        Some(match *change {
            WorkerChange::RequestInput { key, request } => Self::RequestInput {
                key: key.to_owned(),
                request: bytes(request),
            },
            WorkerChange::TakeAnswer { key } => Self::TakeAnswer {
                key: key.to_owned(),
            },
            WorkerChange::SetMessage(message) => Self::SetMessage(message.map(str::to_owned)),
            WorkerChange::SetPollInterval(every) => Self::SetPollInterval(every),
            WorkerChange::SetTtl(ttl) => Self::SetTtl(ttl),
            WorkerChange::Finish(Finish::Completed(result)) => Self::Completed(bytes(result)),
            WorkerChange::Finish(Finish::Failed(error)) => Self::Failed(bytes(error)),
            WorkerChange::Finish(Finish::Cancelled) => Self::Cancelled,
            WorkerChange::SetContext(context) => Self::SetContext(bytes(context)),
            WorkerChange::ReplaceInputs { .. } => return None,
            WorkerChange::Checkpoint(checkpoint) => Self::Checkpoint(bytes(checkpoint)),
            WorkerChange::Release => Self::Release,
        })
    }

    /// The change, as the state machine takes it.
    fn as_change(&self) -> WorkerChange<'_> {
        match self {
            Self::RequestInput { key, request } => WorkerChange::RequestInput { key, request },
            Self::TakeAnswer { key } => WorkerChange::TakeAnswer { key },
            Self::SetMessage(message) => WorkerChange::SetMessage(message.as_deref()),
            Self::SetPollInterval(every) => WorkerChange::SetPollInterval(*every),
            Self::SetTtl(ttl) => WorkerChange::SetTtl(*ttl),
            Self::Completed(result) => WorkerChange::Finish(Finish::Completed(result)),
            Self::Failed(error) => WorkerChange::Finish(Finish::Failed(error)),
            Self::Cancelled => WorkerChange::Finish(Finish::Cancelled),
            Self::SetContext(context) => WorkerChange::SetContext(context),
            Self::Checkpoint(checkpoint) => WorkerChange::Checkpoint(checkpoint),
            Self::Release => WorkerChange::Release,
        }
    }

    /// Bytes it carries, against [`Applies::MAX_BYTES`].
    fn size(&self) -> usize {
        match self {
            Self::RequestInput { key, request } => key.len() + request.len(),
            Self::TakeAnswer { key } => key.len(),
            Self::SetMessage(message) => message.as_ref().map_or(0, String::len),
            Self::Completed(bytes)
            | Self::Failed(bytes)
            | Self::SetContext(bytes)
            | Self::Checkpoint(bytes) => bytes.len(),
            Self::SetPollInterval(_) | Self::SetTtl(_) | Self::Cancelled | Self::Release => 0,
        }
    }
}

/// One worker's change to one task.
#[derive(Debug)]
pub(crate) struct ApplyRequest {
    digest: TaskDigest,
    by: Worker,
    change: Change,
    options: TaskOptions,
    now: i64,
}

impl ApplyRequest {
    /// The step of `change` on `digest` by `by`, decided with `options`
    /// at `now`; `None` for a change that always runs alone.
    pub(crate) fn new(
        digest: TaskDigest,
        by: Worker,
        change: &WorkerChange<'_>,
        options: TaskOptions,
        now: i64,
    ) -> Option<Self> {
        Some(Self {
            digest,
            by,
            change: Change::of(change)?,
            options,
            now,
        })
    }
}

/// A step's outcome: the state machine's error is the step's own (shared
/// only to travel through the batch; each step has one caller).
pub(crate) type Outcome = std::result::Result<Stepped<Applied>, Arc<Error>>;

/// The caller's error from a step's [`Outcome`].
pub(crate) fn unshared(e: Arc<Error>) -> Error {
    Arc::try_unwrap(e).unwrap_or_else(|shared| Error::backend(NAME, shared))
}

/// Worker steps, batched: the pool they run on and their statements.
pub(crate) struct Applies {
    pool: PgPool,
    /// The store's schema, quoted: a step alone runs the statements of
    /// [`crate::tasks`].
    schema: String,
    /// Announces each committed change.
    announcer: Announcer,
    lock_load_many: SqlStr,
    load_many: SqlStr,
    supersede_many: SqlStr,
    supersede_keys_many: SqlStr,
    take_many: SqlStr,
    request_many: SqlStr,
    save_many: SqlStr,
}

impl Applies {
    /// The steps of the store in the schema `quoted_schema`, on `pool`,
    /// announced through `notifier` and to `watchers` (this handle's task
    /// watchers).
    pub(crate) fn new(
        pool: PgPool,
        quoted_schema: &str,
        notifier: Notifier,
        watchers: Arc<mcp_event_store_core::backend::follow::Wakeups>,
    ) -> Self {
        let sql = |template| render(template, quoted_schema);
        Self {
            pool,
            schema: quoted_schema.to_owned(),
            announcer: Announcer::new(notifier, watchers),
            lock_load_many: sql(LOCK_LOAD_MANY),
            load_many: sql(crate::tasks::LOAD_MANY),
            supersede_many: sql(SUPERSEDE_MANY),
            supersede_keys_many: sql(SUPERSEDE_KEYS_MANY),
            take_many: sql(TAKE_MANY),
            request_many: sql(REQUEST_MANY),
            save_many: sql(SAVE_MANY),
        }
    }
}

impl Statement for Applies {
    type Request = ApplyRequest;
    type Answer = Outcome;
    type Key = TaskDigest;

    const MAX_REQUESTS: usize = 128;
    const MAX_BYTES: usize = 4 << 20;
    const IN_FLIGHT: usize = 4;
    const STALL: Duration = Duration::from_millis(20);
    /// Each step is a change of its own: one per task per batch.
    const SHARE: bool = false;
    const WHAT: &'static str = "batched task step";

    fn key(request: &ApplyRequest) -> TaskDigest {
        request.digest
    }

    fn size(request: &ApplyRequest) -> usize {
        request.change.size()
    }

    /// The step alone, in a transaction of its own, as [`crate::tasks`]
    /// runs it.
    async fn one(&self, request: &ApplyRequest) -> sqlx::Result<Outcome> {
        let mut tx = self.pool.begin().await?;
        let stepped = rows::apply(
            &mut statements(&self.schema, &mut tx),
            &request.digest,
            &request.by,
            request.change.as_change(),
            &request.options,
            request.now,
        )
        .await;
        match stepped {
            Ok(stepped) => {
                tx.commit().await?;
                if stepped.changed {
                    self.announcer.announce([request.digest]);
                }
                Ok(Ok(stepped))
            }
            // Rolled back: the transaction is dropped.
            Err(e) => Ok(Err(Arc::new(e))),
        }
    }

    async fn many(&self, requests: &[&ApplyRequest]) -> sqlx::Result<Vec<Outcome>> {
        let mut tx = self.pool.begin().await?;
        let mut read = self.lock_and_read(&mut tx, requests).await?;
        let mut writes = Writes::default();
        let mut outcomes = Vec::with_capacity(requests.len());
        for request in requests {
            let mut step = StepRows {
                digest: request.digest,
                read: read.remove(&request.digest),
                locked: None,
                added: false,
                writes: Writes::default(),
            };
            let stepped = rows::apply(
                &mut step,
                &request.digest,
                &request.by,
                request.change.as_change(),
                &request.options,
                request.now,
            )
            .await;
            outcomes.push(match stepped {
                Ok(stepped) => {
                    writes.extend(step.writes);
                    Ok(stepped)
                }
                Err(e) => Err(Arc::new(e)),
            });
        }
        writes.run(self, &mut tx).await?;
        tx.commit().await?;
        self.announcer.announce(
            requests
                .iter()
                .zip(&outcomes)
                .filter(|(_, outcome)| outcome.as_ref().is_ok_and(|stepped| stepped.changed))
                .map(|(request, _)| request.digest),
        );
        Ok(outcomes)
    }
}

impl Applies {
    /// Locks the tasks of `requests` (distinct, in digest order) and reads
    /// them; a task missing from the answer does not exist.
    async fn lock_and_read(
        &self,
        conn: &mut PgConnection,
        requests: &[&ApplyRequest],
    ) -> sqlx::Result<HashMap<TaskDigest, Result<TaskRow>>> {
        let digests: Vec<&[u8]> = requests.iter().map(|r| &r.digest.as_bytes()[..]).collect();
        let locked = sqlx::query(self.lock_load_many.clone())
            .bind(&digests)
            .fetch_all(&mut *conn)
            .await?;
        let mut read = HashMap::with_capacity(locked.len());
        let mut stale = Vec::new();
        for row in locked {
            let digest = digest_of(&row, 27)?;
            match row.try_get::<Option<bool>, _>(26)? {
                Some(true) => {
                    read.insert(digest, decode(&row));
                }
                // Changed while the lock was awaited: read again, under
                // the lock, in a statement of its own.
                _ => stale.push(digest),
            }
        }
        if !stale.is_empty() {
            let digests: Vec<&[u8]> = stale.iter().map(|d| &d.as_bytes()[..]).collect();
            let rows = sqlx::query(self.load_many.clone())
                .bind(&digests)
                .fetch_all(&mut *conn)
                .await?;
            for row in rows {
                read.insert(digest_of(&row, 26)?, decode(&row));
            }
        }
        Ok(read)
    }
}

/// The task digest in column `at` of `row`.
fn digest_of(row: &sqlx::postgres::PgRow, at: usize) -> sqlx::Result<TaskDigest> {
    let bytes: Vec<u8> = row.try_get(at)?;
    stored_digest(&bytes).map_err(|e| sqlx::Error::Protocol(e.to_string()))
}

/// A task row as written back.
struct Save {
    digest: TaskDigest,
    read_rev: i64,
    status: i16,
    rev: i64,
    message: Option<Vec<u8>>,
    updated_at: i64,
    ttl_ms: Option<i64>,
    expires_at: i64,
    purge_at: i64,
    poll_ms: Option<i64>,
    cancel: bool,
    outcome: Option<Bytes>,
    instance: Vec<u8>,
    next_seq: i64,
    context: Option<Bytes>,
    max_attempts: Option<i32>,
    lapses: i32,
    epoch: i32,
    released: bool,
    checkpoint: Option<Bytes>,
    cancel_reason: Option<Vec<u8>>,
}

/// The writes of a batch's steps, by kind, in the order they run.
#[derive(Default)]
struct Writes {
    supersede: Vec<TaskDigest>,
    supersede_keys: Vec<(TaskDigest, String)>,
    take: Vec<(TaskDigest, String)>,
    request: Vec<(TaskDigest, String, i64, Bytes)>,
    save: Vec<Save>,
}

impl Writes {
    fn extend(&mut self, other: Writes) {
        self.supersede.extend(other.supersede);
        self.supersede_keys.extend(other.supersede_keys);
        self.take.extend(other.take);
        self.request.extend(other.request);
        self.save.extend(other.save);
    }

    /// One statement per kind that has writes.
    async fn run(&self, sql: &Applies, conn: &mut PgConnection) -> sqlx::Result<()> {
        let digest = |d: &TaskDigest| d.as_bytes().to_vec();
        if !self.supersede.is_empty() {
            sqlx::query(sql.supersede_many.clone())
                .bind(self.supersede.iter().map(digest).collect::<Vec<_>>())
                .execute(&mut *conn)
                .await?;
        }
        if !self.supersede_keys.is_empty() {
            sqlx::query(sql.supersede_keys_many.clone())
                .bind(
                    self.supersede_keys
                        .iter()
                        .map(|(d, _)| digest(d))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    self.supersede_keys
                        .iter()
                        .map(|(_, k)| k.as_bytes())
                        .collect::<Vec<_>>(),
                )
                .execute(&mut *conn)
                .await?;
        }
        if !self.take.is_empty() {
            let taken = sqlx::query(sql.take_many.clone())
                .bind(self.take.iter().map(|(d, _)| digest(d)).collect::<Vec<_>>())
                .bind(
                    self.take
                        .iter()
                        .map(|(_, k)| k.as_bytes())
                        .collect::<Vec<_>>(),
                )
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if taken != self.take.len() as u64 {
                return Err(sqlx::Error::Protocol(
                    "an answered input is missing under its task's lock".into(),
                ));
            }
        }
        if !self.request.is_empty() {
            let all = || self.request.iter();
            sqlx::query(sql.request_many.clone())
                .bind(all().map(|(d, ..)| digest(d)).collect::<Vec<_>>())
                .bind(all().map(|(_, k, ..)| k.as_bytes()).collect::<Vec<_>>())
                .bind(all().map(|(_, _, seq, _)| *seq).collect::<Vec<_>>())
                .bind(all().map(|(.., r)| &r[..]).collect::<Vec<_>>())
                .execute(&mut *conn)
                .await?;
        }
        if !self.save.is_empty() {
            let all = || self.save.iter();
            let saved: Vec<Vec<u8>> = sqlx::query_scalar(sql.save_many.clone())
                .bind(all().map(|s| s.status).collect::<Vec<_>>())
                .bind(all().map(|s| s.rev).collect::<Vec<_>>())
                .bind(all().map(|s| s.message.as_deref()).collect::<Vec<_>>())
                .bind(all().map(|s| s.updated_at).collect::<Vec<_>>())
                .bind(all().map(|s| s.ttl_ms).collect::<Vec<_>>())
                .bind(all().map(|s| s.expires_at).collect::<Vec<_>>())
                .bind(all().map(|s| s.purge_at).collect::<Vec<_>>())
                .bind(all().map(|s| s.poll_ms).collect::<Vec<_>>())
                .bind(all().map(|s| s.cancel).collect::<Vec<_>>())
                .bind(all().map(|s| s.outcome.as_deref()).collect::<Vec<_>>())
                .bind(all().map(|s| &s.instance[..]).collect::<Vec<_>>())
                .bind(all().map(|s| s.next_seq).collect::<Vec<_>>())
                .bind(all().map(|s| digest(&s.digest)).collect::<Vec<_>>())
                .bind(all().map(|s| s.read_rev).collect::<Vec<_>>())
                .bind(all().map(|s| s.context.as_deref()).collect::<Vec<_>>())
                .bind(all().map(|s| s.max_attempts).collect::<Vec<_>>())
                .bind(all().map(|s| s.lapses).collect::<Vec<_>>())
                .bind(all().map(|s| s.epoch).collect::<Vec<_>>())
                .bind(all().map(|s| s.released).collect::<Vec<_>>())
                .bind(all().map(|s| s.checkpoint.as_deref()).collect::<Vec<_>>())
                .bind(
                    all()
                        .map(|s| s.cancel_reason.as_deref())
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *conn)
                .await?;
            if saved.len() != self.save.len() {
                return Err(sqlx::Error::Protocol(
                    "a task changed under its row lock".into(),
                ));
            }
        }
        Ok(())
    }
}

/// One step of a batch, as the state machine drives it: its task as the
/// batch read it under the lock, and the writes it makes, collected.
struct StepRows {
    digest: TaskDigest,
    /// The task as read: not yet handed out to the step.
    read: Option<Result<TaskRow>>,
    /// The task as handed out ([`TaskRows::lock`]).
    locked: Option<TaskRow>,
    /// Whether the step requested an input.
    added: bool,
    writes: Writes,
}

impl StepRows {
    fn ours(&self, digest: &TaskDigest) -> Result<()> {
        if *digest == self.digest {
            Ok(())
        } else {
            Err(not_batched("another task"))
        }
    }
}

fn not_batched(what: &str) -> Error {
    Error::Corrupt(format!("a batched task step asked for {what}"))
}

#[async_trait]
impl TaskRows for StepRows {
    async fn lock(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        self.ours(digest)?;
        if self.locked.is_some() {
            return Err(not_batched("its task twice"));
        }
        let Some(read) = self.read.take() else {
            return Ok(None);
        };
        let row = read?;
        self.locked = Some(row.clone());
        Ok(Some(row))
    }

    async fn reload(&mut self, _: &TaskDigest) -> Result<Option<TaskRow>> {
        Err(not_batched("a reload"))
    }

    async fn save(
        &mut self,
        digest: &TaskDigest,
        read_rev: Rev,
        record: &TaskRecord,
        instance: &[u8],
        next_seq: i64,
    ) -> Result<()> {
        self.ours(digest)?;
        let takeover = record.takeover.as_ref();
        self.writes.save.push(Save {
            digest: *digest,
            read_rev: to_i64(read_rev),
            status: i16::from(record.status.as_u8()),
            rev: to_i64(record.rev),
            message: record.message.as_ref().map(|m| m.as_bytes().to_vec()),
            updated_at: record.updated_at,
            ttl_ms: record.ttl_ms.map(to_i64),
            expires_at: record.expires_at,
            purge_at: record.purge_at,
            poll_ms: record.poll_interval_ms.map(to_i64),
            cancel: record.cancel_requested,
            outcome: record.outcome.clone(),
            instance: instance.to_vec(),
            next_seq,
            context: record.context.clone(),
            max_attempts: takeover.map(|t| to_i32(t.max_attempts)),
            lapses: takeover.map_or(0, |t| to_i32(t.lapses)),
            epoch: takeover.map_or(1, |t| to_i32(t.epoch)),
            released: takeover.is_some_and(|t| t.released),
            checkpoint: takeover.and_then(|t| t.checkpoint.clone()),
            cancel_reason: record.cancel_reason.as_ref().map(|r| r.as_bytes().to_vec()),
        });
        Ok(())
    }

    async fn answer_input(&mut self, _: &TaskDigest, _: &str, _: &[u8]) -> Result<()> {
        Err(not_batched("an answer"))
    }

    async fn add_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        seq: i64,
        request: &[u8],
    ) -> Result<()> {
        self.ours(digest)?;
        self.added = true;
        self.writes.request.push((
            *digest,
            key.to_owned(),
            seq,
            Bytes::copy_from_slice(request),
        ));
        Ok(())
    }

    /// The response as read under the lock, which [`TAKE_MANY`] then
    /// marks spent (it fails the batch if the input is not answered).
    async fn take_input(&mut self, digest: &TaskDigest, key: &str) -> Result<Bytes> {
        self.ours(digest)?;
        let response = self
            .locked
            .as_ref()
            .and_then(|row| row.answers.iter().find(|(k, _)| k == key))
            .map(|(_, response)| response.clone())
            .ok_or_else(|| Error::Corrupt("an answered input is missing".into()))?;
        self.writes.take.push((*digest, key.to_owned()));
        Ok(response)
    }

    /// Skipped when the task as read has no outstanding input and the step
    /// requested none: it would write nothing.
    async fn supersede(&mut self, digest: &TaskDigest, keys: Option<&[String]>) -> Result<()> {
        self.ours(digest)?;
        let none_outstanding = !self.added
            && self
                .locked
                .as_ref()
                .is_some_and(|row| row.record.outstanding.is_empty());
        if none_outstanding {
            return Ok(());
        }
        match keys {
            None => self.writes.supersede.push(*digest),
            Some(keys) => self
                .writes
                .supersede_keys
                .extend(keys.iter().map(|key| (*digest, key.clone()))),
        }
        Ok(())
    }

    async fn ended(&mut self, _: i64, _: i64) -> Result<Vec<TaskDigest>> {
        Err(not_batched("a purge"))
    }

    async fn delete_past_grace(&mut self, _: i64, _: i64) -> Result<u64> {
        Err(not_batched("a purge"))
    }

    async fn forget_instances(&mut self, _: i64) -> Result<u64> {
        Err(not_batched("a purge"))
    }

    async fn waiting(&mut self, _: i64, _: i64) -> Result<Vec<TaskDigest>> {
        Err(not_batched("a claim"))
    }

    async fn alive(&mut self, _: &InstanceId, _: i64) -> Result<bool> {
        Err(not_batched("a claim"))
    }
}

/// Runs a worker's step: batched with concurrent steps of the handle, or
/// alone; a change is announced once committed.
pub(crate) async fn apply(
    store: &crate::PostgresStore,
    request: ApplyRequest,
) -> Result<Stepped<Applied>> {
    store.applies().call(request).await?.map_err(unshared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_but_a_replacement_batches_as_it_came() {
        let requests: &[(&str, &[u8])] = &[("k", b"r")];
        let changes = [
            WorkerChange::RequestInput {
                key: "k",
                request: b"r",
            },
            WorkerChange::TakeAnswer { key: "k" },
            WorkerChange::SetMessage(Some("m")),
            WorkerChange::SetMessage(None),
            WorkerChange::SetPollInterval(Some(Duration::from_secs(1))),
            WorkerChange::SetTtl(None),
            WorkerChange::Finish(Finish::Completed(b"ok")),
            WorkerChange::Finish(Finish::Failed(b"no")),
            WorkerChange::Finish(Finish::Cancelled),
            WorkerChange::SetContext(b"c"),
            WorkerChange::Checkpoint(b"p"),
            WorkerChange::Release,
        ];
        for change in changes {
            let owned = Change::of(&change).expect("batches");
            assert_eq!(owned.as_change(), change);
        }
        let replace = WorkerChange::ReplaceInputs {
            requests,
            message: None,
        };
        assert!(Change::of(&replace).is_none());
    }
}
