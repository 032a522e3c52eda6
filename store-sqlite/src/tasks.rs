//! The task store (SEP-2663 durable tasks): `mes_tasks`, `mes_task_inputs`
//! and `mes_instances`.
//!
//! Every mutation is one [`TaskChange`], a typed job for the writer thread,
//! which runs it as one transaction under SQLite's write lock (`BEGIN
//! IMMEDIATE`, or the group's transaction when it shares a group commit)
//! and wakes the watchers of what it changed: the step every row
//! store shares ([`rows`]) reads the task, lets the state machine decide,
//! and writes the row, with the inputs the machine names, back conditioned
//! on the `rev` just read; this file holds only the statements
//! ([`TaskRows`] for the writer's rusqlite connection, whose statements run
//! synchronously, so the shared step's future is ready at its first poll).
//! Holding the write lock from the read to the commit makes the step atomic
//! across handles and processes (T4); `create` and `heartbeat` are single
//! statements. The caller is answered after the commit (T1).
//!
//! Reads (`get`, `watch`) run on the replay page threads
//! ([`crate::pages`]), in one read transaction, so a task and its inputs
//! come from one snapshot. The writer wakes this handle's watchers after
//! each commit that changed their task. Changes made through other handles
//! and processes are found by the handle's one follow watcher
//! ([`crate::watcher`]), which polls `PRAGMA data_version` while anyone
//! follows or watches and, when another connection committed, wakes every
//! task watcher to re-read its task's `rev` (T10). Each watcher also
//! re-reads every `follow_recheck`, should a wake-up be missed.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::follow::{Wakeups, task_token, watch_task};
use mcp_event_store_core::backend::task::rows::{
    self, ANSWERED, OUTSTANDING, SPENT, TaskRow, TaskRows, stored_digest,
};
use mcp_event_store_core::backend::task::{
    OwnerKey, TaskDigest, TaskMachine, owner_key, stored_instance,
};
use mcp_event_store_core::backend::{Reader, RuntimeBackend, TaskBackend};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Requeue, Rev, Takeover,
    TaskPurgeReport, TaskRecord, TaskStatus, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};
use rusqlite::{Connection, OptionalExtension, Params, params};

use crate::SqliteStore;
use crate::error::{NAME, sqlite_error};
use crate::replay::read_snapshot;
use crate::writer::{Job, Writer, execute};

/// Tasks a purge step ends or deletes at most, so one transaction never
/// holds the write lock long: other writers on the file wait for it only
/// up to their busy timeout.
const PURGE_BATCH: i64 = 500;

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

// ------------------------------------------------------------ the traits

/// Durable tasks in `mes_tasks`, `mes_task_inputs` and `mes_instances`; see
/// the crate's "Tasks" section.
#[async_trait]
impl TaskBackend for SqliteStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        let record = TaskRecord::created(task, self.now(), &self.inner.options.tasks);
        let (owner, instance) = (owner_key(task.owner), task.instance);
        statement(self, move |conn| {
            create(conn, &digest, &owner, &instance, &record)
        })
        .await
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
        let responses: Vec<(String, Vec<u8>)> = responses
            .iter()
            .map(|(key, response)| ((*key).to_owned(), response.to_vec()))
            .collect();
        let now = self.now();
        transaction(self, Woken::Task(digest), move |conn| {
            at_once(rows::answer(
                &mut SqliteRows { conn },
                &digest,
                &owner,
                &responses,
                now,
            ))
            .map(|stepped| stepped.answer)
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
        let (reason, now) = (reason.map(str::to_owned), self.now());
        transaction(self, Woken::Task(digest), move |conn| {
            at_once(rows::cancel(
                &mut SqliteRows { conn },
                &digest,
                &owner,
                mode,
                reason.as_deref(),
                now,
            ))
            .map(|stepped| stepped.answer)
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
        // Subscribed before the first read: a commit after the read started
        // wakes the next wait.
        // Woken by the writer after this handle's commits, or by the watcher
        // when another connection committed.
        let woken = self.inner.task_wakeups.subscribe(task_token(&digest));
        // Started after subscribing: its first poll wakes every task watcher.
        self.inner.watcher.ensure();
        watch_task(woken, after, deadline, self.inner.task_recheck, || {
            let (store, reader) = (self.clone(), reader.clone());
            async move { read(&store, &digest, &reader).await }
        })
        .await
    }

    /// Purges in steps of one transaction each (at most 500
    /// tasks ended and as many deleted), queued at the writer one after
    /// another, so appends and task writes get their turn in between.
    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        let now = self.now();
        let mut report = TaskPurgeReport::default();
        loop {
            let (step, more) = transaction(self, Woken::All, move |conn| {
                at_once(rows::purge(&mut SqliteRows { conn }, now, PURGE_BATCH))
                    .map(|(stepped, more)| (stepped.answer, more))
            })
            .await?;
            report += step;
            if !more {
                return Ok(report);
            }
        }
    }

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        transaction(self, Woken::Task(digest), move |conn| {
            let digest = &digest.as_bytes()[..];
            execute(
                conn,
                "DELETE FROM mes_task_inputs WHERE digest = ?1",
                [digest],
            )?;
            let deleted = execute(conn, "DELETE FROM mes_tasks WHERE digest = ?1", [digest])?;
            Ok(deleted > 0)
        })
        .await
    }
}

#[async_trait]
impl RuntimeBackend for SqliteStore {
    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let now = self.now();
        let until = now.saturating_add(to_i64(millis(lease)));
        statement(self, move |conn| {
            // Inserted, or renewed while still alive; a lapsed instance
            // stays lapsed (its tasks already read as lost).
            let renewed = execute(
                conn,
                "INSERT INTO mes_instances (id, alive_until) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO UPDATE SET alive_until = excluded.alive_until \
                     WHERE mes_instances.alive_until > ?3",
                params![&me.as_bytes()[..], until, now],
            )?;
            Ok(renewed > 0)
        })
        .await
    }

    /// Whether instance `id` is alive now (T11), read on a page thread.
    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        let now = self.now();
        self.inner
            .pages
            .run(move |conn| alive(conn, &id, now))
            .await
    }

    /// Every lease `mes_instances` holds (T11), read on a page thread.
    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        let now = self.now();
        self.inner
            .pages
            .run(move |conn| {
                let leases: Vec<(Vec<u8>, i64)> = conn
                    .prepare_cached("SELECT id, alive_until FROM mes_instances")
                    .and_then(|mut statement| {
                        statement
                            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                            .collect()
                    })
                    .map_err(sqlite_error)?;
                leases
                    .into_iter()
                    .map(|(id, until)| Ok(InstanceLease::new(stored_instance(&id)?, until, now)))
                    .collect()
            })
            .await
    }

    async fn claimed_apply(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let (digest, change) = (*task, change.to_owned());
        let (options, now) = (self.inner.options.tasks, self.now());
        transaction(self, Woken::Task(digest), move |conn| {
            let mut pairs = Vec::new();
            let change = change.as_change(&mut pairs);
            at_once(rows::apply(
                &mut SqliteRows { conn },
                &digest,
                &by,
                change,
                &options,
                now,
            ))
            .map(|stepped| stepped.answer)
        })
        .await
    }

    /// The task as its runtime reads it (T14), from one snapshot.
    async fn claimed_view(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        let now = self.now();
        let row = snapshot(self, task).await?;
        row.map_or(Ok(None), |row| row.view(now))
    }

    /// Claims under the write lock: the waiting tasks, each decided again.
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now();
        transaction(self, Woken::All, move |conn| {
            at_once(rows::claim(&mut SqliteRows { conn }, by, limit, now))
                .map(|stepped| stepped.answer)
        })
        .await
    }

    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        let (digest, now) = (*task, self.now());
        transaction(self, Woken::Task(digest), move |conn| {
            at_once(rows::requeue(&mut SqliteRows { conn }, &digest, now))
                .map(|stepped| stepped.answer)
        })
        .await
    }
}

// ------------------------------------------------------------ writes

/// Whose watchers a committed task change wakes.
#[derive(Clone, Copy)]
enum Woken {
    /// The watchers of this task.
    Task(TaskDigest),
    /// Every watcher of this handle (a purge or a claim changed tasks it
    /// did not name beforehand).
    All,
    /// Nobody (a creation, a heartbeat).
    Nobody,
}

/// A task change for the writer: `change` on its connection, in one
/// transaction (the group's, or one of its own unless it is one
/// statement, which commits by itself), then the wake-up of the watchers
/// of what it changed.
struct TaskChange<F> {
    change: F,
    one_statement: bool,
    woken: Woken,
    /// This handle's task watchers.
    watchers: Arc<Wakeups>,
}

impl<T, F> Job for TaskChange<F>
where
    F: Fn(&mut Connection) -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    type Output = T;

    fn run(&self, writer: &mut Writer, in_transaction: bool) -> Result<T> {
        // One statement needs no transaction of its own.
        writer.atomically(in_transaction || self.one_statement, |writer| {
            (self.change)(&mut writer.conn)
        })
    }

    fn committed(&self, _: &T) {
        match self.woken {
            Woken::Task(digest) => self.watchers.wake(&task_token(&digest)),
            Woken::All => self.watchers.wake_all(),
            Woken::Nobody => {}
        }
    }
}

/// Runs `change`, a step of several statements, as one transaction on the
/// writer; wakes the watchers `woken` names once it is committed.
async fn transaction<T: Send + 'static>(
    store: &SqliteStore,
    woken: Woken,
    change: impl Fn(&mut Connection) -> Result<T> + Send + 'static,
) -> Result<T> {
    let job = TaskChange {
        change,
        one_statement: false,
        woken,
        watchers: store.inner.task_wakeups.clone(),
    };
    store.inner.writer.run(job).await
}

/// Runs `change`, one statement that changes what no watcher waits for, on
/// the writer.
async fn statement<T: Send + 'static>(
    store: &SqliteStore,
    change: impl Fn(&mut Connection) -> Result<T> + Send + 'static,
) -> Result<T> {
    let job = TaskChange {
        change,
        one_statement: true,
        woken: Woken::Nobody,
        watchers: store.inner.task_wakeups.clone(),
    };
    store.inner.writer.run(job).await
}

/// The task as `reader` sees it now, read from one snapshot.
async fn read(
    store: &SqliteStore,
    digest: &TaskDigest,
    reader: &Reader,
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    let row = snapshot(store, digest).await?;
    Ok(row.and_then(|row| match reader.owner() {
        Some(owner) => row.read_by(owner, now),
        None => row.seen(now),
    }))
}

/// The task under `digest` as stored now, read from one snapshot (a read
/// transaction) on a page thread.
async fn snapshot(store: &SqliteStore, digest: &TaskDigest) -> Result<Option<TaskRow>> {
    let digest = *digest;
    store
        .inner
        .pages
        .run(move |conn| read_snapshot(conn, || load(conn, &digest)))
        .await
}

// ------------------------------------------------------------ storage

/// Reads a task, its inputs and its instance's deadline; on the writer's
/// connection inside its transaction, or on a page thread's inside a read
/// transaction.
fn load(conn: &Connection, digest: &TaskDigest) -> Result<Option<TaskRow>> {
    let mut statement = conn
        .prepare_cached(
            "SELECT owner, instance, status, rev, message, created_at, updated_at, ttl_ms, \
                    expires_at, purge_at, poll_ms, cancel, outcome, next_seq, \
                    (SELECT alive_until FROM mes_instances i WHERE i.id = t.instance), context, \
                    max_attempts, lapses, epoch, released, checkpoint, cancel_reason \
             FROM mes_tasks t WHERE digest = ?1",
        )
        .map_err(sqlite_error)?;
    let mut rows = statement
        .query([&digest.as_bytes()[..]])
        .map_err(sqlite_error)?;
    let Some(row) = rows.next().map_err(sqlite_error)? else {
        return Ok(None);
    };
    let status: i64 = row.get(2).map_err(sqlite_error)?;
    let status = u8::try_from(status)
        .ok()
        .and_then(TaskStatus::from_u8)
        .ok_or_else(|| Error::Corrupt(format!("a task has the unknown status {status}")))?;
    let record = TaskRecord {
        status,
        rev: to_u64(row.get(3).map_err(sqlite_error)?),
        message: row.get(4).map_err(sqlite_error)?,
        created_at: row.get(5).map_err(sqlite_error)?,
        updated_at: row.get(6).map_err(sqlite_error)?,
        ttl_ms: row
            .get::<_, Option<i64>>(7)
            .map_err(sqlite_error)?
            .map(to_u64),
        expires_at: row.get(8).map_err(sqlite_error)?,
        purge_at: row.get(9).map_err(sqlite_error)?,
        poll_interval_ms: row
            .get::<_, Option<i64>>(10)
            .map_err(sqlite_error)?
            .map(to_u64),
        cancel_requested: row.get(11).map_err(sqlite_error)?,
        cancel_reason: row.get(21).map_err(sqlite_error)?,
        outcome: row
            .get::<_, Option<Vec<u8>>>(12)
            .map_err(sqlite_error)?
            .map(Into::into),
        outstanding: Vec::new(),
        answered: Vec::new(),
        context: row
            .get::<_, Option<Vec<u8>>>(15)
            .map_err(sqlite_error)?
            .map(Into::into),
        takeover: None,
    };
    let max_attempts: Option<i64> = row.get(16).map_err(sqlite_error)?;
    let takeover = max_attempts
        .map(|max| -> Result<Takeover> {
            let mut takeover = Takeover::new(to_u32(max)?, row.get(19).map_err(sqlite_error)?);
            takeover.lapses = to_u32(row.get(17).map_err(sqlite_error)?)?;
            takeover.epoch = to_u32(row.get(18).map_err(sqlite_error)?)?;
            takeover.checkpoint = row
                .get::<_, Option<Vec<u8>>>(20)
                .map_err(sqlite_error)?
                .map(Into::into);
            Ok(takeover)
        })
        .transpose()?;
    let record = TaskRecord { takeover, ..record };
    let mut task = TaskRow::new(
        row.get(0).map_err(sqlite_error)?,
        row.get(1).map_err(sqlite_error)?,
        row.get(13).map_err(sqlite_error)?,
        record,
        row.get(14).map_err(sqlite_error)?,
    );
    drop(rows);
    drop(statement);
    let mut statement = conn
        .prepare_cached(
            "SELECT key, state, CASE WHEN state = 0 THEN request END, \
                    CASE WHEN state = 1 THEN response END \
             FROM mes_task_inputs WHERE digest = ?1 ORDER BY seq",
        )
        .map_err(sqlite_error)?;
    let mut inputs = statement
        .query([&digest.as_bytes()[..]])
        .map_err(sqlite_error)?;
    while let Some(input) = inputs.next().map_err(sqlite_error)? {
        let key = String::from_utf8(input.get(0).map_err(sqlite_error)?)
            .map_err(|_| Error::Corrupt("an input key is not UTF-8".into()))?;
        let state: i64 = input.get(1).map_err(sqlite_error)?;
        let state = i16::try_from(state)
            .map_err(|_| Error::Corrupt(format!("an input has the unknown state {state}")))?;
        let request: Option<Vec<u8>> = input.get(2).map_err(sqlite_error)?;
        let response: Option<Vec<u8>> = input.get(3).map_err(sqlite_error)?;
        task.push_input(
            key,
            state,
            request.map(Into::into),
            response.map(Into::into),
        )?;
    }
    Ok(Some(task))
}

/// The task digests a cached query returns.
fn digests(conn: &Connection, sql: &str, params: impl Params) -> Result<Vec<TaskDigest>> {
    let digests: Vec<Vec<u8>> = conn
        .prepare_cached(sql)
        .and_then(|mut statement| statement.query_map(params, |row| row.get(0))?.collect())
        .map_err(sqlite_error)?;
    digests.iter().map(|digest| stored_digest(digest)).collect()
}

/// Whether the instance is alive at `now`.
fn alive(conn: &Connection, id: &InstanceId, now: i64) -> Result<bool> {
    conn.prepare_cached("SELECT 1 FROM mes_instances WHERE id = ?1 AND alive_until > ?2")
        .and_then(|mut statement| statement.exists(params![&id.as_bytes()[..], now]))
        .map_err(sqlite_error)
}

/// The task statements on the writer's connection, inside the transaction
/// it holds the write lock in: what [`rows`] runs a step through. Every
/// statement runs to its end before its method returns, so the step's
/// future is ready at its first poll ([`at_once`]).
struct SqliteRows<'a> {
    /// Held `&mut` only so that the step's future is `Send`.
    conn: &'a mut Connection,
}

#[async_trait]
impl TaskRows for SqliteRows<'_> {
    /// The writer holds the write lock, so reading is locking.
    async fn lock(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        load(self.conn, digest)
    }

    async fn reload(&mut self, digest: &TaskDigest) -> Result<Option<TaskRow>> {
        load(self.conn, digest)
    }

    async fn save(
        &mut self,
        digest: &TaskDigest,
        read_rev: Rev,
        record: &TaskRecord,
        instance: &[u8],
        next_seq: i64,
    ) -> Result<()> {
        let saved = execute(
            self.conn,
            "UPDATE mes_tasks SET status = ?1, rev = ?2, message = ?3, updated_at = ?4, \
                    ttl_ms = ?5, expires_at = ?6, purge_at = ?7, poll_ms = ?8, cancel = ?9, \
                    outcome = ?10, instance = ?11, next_seq = ?12, context = ?15, \
                    max_attempts = ?16, lapses = ?17, epoch = ?18, released = ?19, \
                    checkpoint = ?20, cancel_reason = ?21 \
             WHERE digest = ?13 AND rev = ?14",
            params![
                i64::from(record.status.as_u8()),
                to_i64(record.rev),
                record.message.as_deref(),
                record.updated_at,
                record.ttl_ms.map(to_i64),
                record.expires_at,
                record.purge_at,
                record.poll_interval_ms.map(to_i64),
                record.cancel_requested,
                record.outcome.as_deref(),
                instance,
                next_seq,
                &digest.as_bytes()[..],
                to_i64(read_rev),
                record.context.as_deref(),
                record.takeover.as_ref().map(|t| i64::from(t.max_attempts)),
                record.takeover.as_ref().map_or(0, |t| i64::from(t.lapses)),
                record.takeover.as_ref().map_or(1, |t| i64::from(t.epoch)),
                record.takeover.as_ref().is_some_and(|t| t.released),
                record
                    .takeover
                    .as_ref()
                    .and_then(|t| t.checkpoint.as_deref()),
                record.cancel_reason.as_deref(),
            ],
        )?;
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
        execute(
            self.conn,
            "UPDATE mes_task_inputs SET state = ?1, response = ?2 \
             WHERE digest = ?3 AND key = ?4 AND state = ?5",
            params![
                ANSWERED,
                response,
                &digest.as_bytes()[..],
                key.as_bytes(),
                OUTSTANDING
            ],
        )?;
        Ok(())
    }

    async fn add_input(
        &mut self,
        digest: &TaskDigest,
        key: &str,
        seq: i64,
        request: &[u8],
    ) -> Result<()> {
        execute(
            self.conn,
            "INSERT INTO mes_task_inputs (digest, key, seq, state, request) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                &digest.as_bytes()[..],
                key.as_bytes(),
                seq,
                OUTSTANDING,
                request
            ],
        )?;
        Ok(())
    }

    async fn take_input(&mut self, digest: &TaskDigest, key: &str) -> Result<Bytes> {
        let response: Option<Vec<u8>> = self
            .conn
            .prepare_cached(
                "SELECT response FROM mes_task_inputs \
                 WHERE digest = ?1 AND key = ?2 AND state = ?3",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(
                        params![&digest.as_bytes()[..], key.as_bytes(), ANSWERED],
                        |row| row.get(0),
                    )
                    .optional()
            })
            .map_err(sqlite_error)?
            .ok_or_else(|| Error::Corrupt("an answered input is missing".into()))?;
        execute(
            self.conn,
            "UPDATE mes_task_inputs SET state = ?1, response = NULL \
             WHERE digest = ?2 AND key = ?3",
            params![SPENT, &digest.as_bytes()[..], key.as_bytes()],
        )?;
        Ok(response.unwrap_or_default().into())
    }

    async fn supersede(&mut self, digest: &TaskDigest, keys: Option<&[String]>) -> Result<()> {
        let Some(keys) = keys else {
            execute(
                self.conn,
                "UPDATE mes_task_inputs SET state = ?1 WHERE digest = ?2 AND state = ?3",
                params![SPENT, &digest.as_bytes()[..], OUTSTANDING],
            )?;
            return Ok(());
        };
        for key in keys {
            execute(
                self.conn,
                "UPDATE mes_task_inputs SET state = ?1 \
                 WHERE digest = ?2 AND key = ?3 AND state = ?4",
                params![SPENT, &digest.as_bytes()[..], key.as_bytes(), OUTSTANDING],
            )?;
        }
        Ok(())
    }

    async fn ended(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        digests(
            self.conn,
            "SELECT digest FROM mes_tasks t WHERE status < 2 AND purge_at > ?1 \
                 AND (expires_at <= ?1 OR NOT EXISTS \
                     (SELECT 1 FROM mes_instances i \
                       WHERE i.id = t.instance AND i.alive_until > ?1)) \
             ORDER BY digest LIMIT ?2",
            params![now, limit],
        )
    }

    async fn delete_past_grace(&mut self, now: i64, limit: i64) -> Result<u64> {
        /// The tasks past their grace period one step removes (?1 now, ?2
        /// the limit).
        macro_rules! batch {
            () => {
                "(SELECT digest FROM mes_tasks WHERE purge_at <= ?1 \
                  ORDER BY purge_at, digest LIMIT ?2)"
            };
        }
        // The same batch twice: the first statement leaves mes_tasks alone.
        execute(
            self.conn,
            concat!("DELETE FROM mes_task_inputs WHERE digest IN ", batch!()),
            params![now, limit],
        )?;
        execute(
            self.conn,
            concat!("DELETE FROM mes_tasks WHERE digest IN ", batch!()),
            params![now, limit],
        )
    }

    async fn waiting(&mut self, now: i64, limit: i64) -> Result<Vec<TaskDigest>> {
        digests(
            self.conn,
            "SELECT digest FROM mes_tasks t \
             WHERE max_attempts IS NOT NULL AND status = 0 AND expires_at > ?1 \
               AND (released OR NOT EXISTS \
                   (SELECT 1 FROM mes_instances i \
                     WHERE i.id = t.instance AND i.alive_until > ?1)) \
             ORDER BY updated_at, digest LIMIT ?2",
            params![now, limit],
        )
    }

    async fn alive(&mut self, id: &InstanceId, now: i64) -> Result<bool> {
        alive(self.conn, id, now)
    }

    async fn forget_instances(&mut self, now: i64) -> Result<u64> {
        execute(
            self.conn,
            "DELETE FROM mes_instances WHERE alive_until <= ?1",
            [now],
        )
    }
}

/// Runs a step of the shared state machine over [`SqliteRows`] to its end.
/// Its statements are synchronous, so it is ready at its first poll; one
/// that is not is an error, not a wait on the writer thread.
fn at_once<T>(step: impl Future<Output = Result<T>>) -> Result<T> {
    let mut step = std::pin::pin!(step);
    match step.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => Err(Error::backend(
            NAME,
            "a task step waited for something on the sqlite writer thread",
        )),
    }
}

/// Inserts a task unless its digest is taken; [`Error::InstanceLapsed`]
/// unless its instance is alive.
fn create(
    conn: &Connection,
    digest: &TaskDigest,
    owner: &[u8],
    instance: &InstanceId,
    record: &TaskRecord,
) -> Result<Option<TaskRecord>> {
    // Only under an instance alive at the task's birth (T11), in the same
    // statement.
    let inserted = execute(
        conn,
        "INSERT INTO mes_tasks (digest, owner, status, rev, message, created_at, updated_at, \
                 expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq, \
                 context, max_attempts, released) \
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, FALSE, ?12, NULL, 0, ?13, ?14, \
                ?15 \
          WHERE EXISTS (SELECT 1 FROM mes_instances WHERE id = ?12 AND alive_until > ?6) \
         ON CONFLICT (digest) DO NOTHING",
        params![
            &digest.as_bytes()[..],
            owner,
            i64::from(record.status.as_u8()),
            to_i64(record.rev),
            record.message.as_deref(),
            record.created_at,
            record.updated_at,
            record.expires_at,
            record.purge_at,
            record.ttl_ms.map(to_i64),
            record.poll_interval_ms.map(to_i64),
            &instance.as_bytes()[..],
            record.context.as_deref(),
            record.takeover.as_ref().map(|t| i64::from(t.max_attempts)),
            record.takeover.as_ref().is_some_and(|t| t.released),
        ],
    )?;
    if inserted == 1 {
        return Ok(Some(record.clone()));
    }
    // Nothing written: the id was taken, or the instance is not alive.
    // The writer holds the file, so this reads what the insert saw.
    if alive(conn, instance, record.created_at)? {
        Ok(None)
    } else {
        Err(Error::instance_lapsed(instance))
    }
}
