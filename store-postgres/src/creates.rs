//! Task creates (T1, T11): one statement each, and batches, in which
//! concurrent creates share one statement and one commit.
//!
//! A create is one `INSERT … ON CONFLICT (digest) DO NOTHING` of the task
//! row, under an instance alive at its birth ([`CREATE`]), committed
//! before the call returns. Committed one by one, a burst of creates is
//! bound by the commits the server flushes: at most one per pooled
//! connection per WAL flush. 1,000 creates at once on one handle (a pool
//! of 8, a disk whose `fdatasync` takes 1 to 4 ms) took 320 to 390 ms, a
//! median 172 ms per call, where Redis took 56 ms.
//!
//! So creates batch ([`crate::batches`]): a lone create runs at once, as
//! [`CREATE`]; creates that arrive while others are in flight queue, and
//! go together (at most one create per task digest, at most
//! [`Creates::MAX_REQUESTS`] and [`Creates::MAX_BYTES`]) in one call of
//! [`CREATE_BATCH`], the same insert for many rows, passed as arrays,
//! returning the digests it inserted: one statement, one commit, one WAL
//! flush for the batch. With them, the same 1,000 creates took 31 to 36 ms
//! (a median 17 ms per call), beside Redis's 30 to 37 ms in the same run.
//!
//! Every guarantee of a single create holds for each task of a batch: its
//! row is inserted only if no task has its digest (the primary key decides
//! between racing creates from every handle and process; a batch never
//! holds one digest twice, so it cannot race itself) and only under an
//! instance alive at the task's `created_at` (the same `EXISTS`, per row);
//! the call returns once the batch committed, so the task is durable and
//! visible to every handle (T1, T9). A task the batch did not insert is
//! decided as a single create decides it: its instance is read, and a
//! live instance means the id was taken, a lapsed one that the instance
//! lapsed. The rows are sent in digest order and inserted in the order
//! sent (`ORDER BY` their ordinality), so two batches that insert the same
//! digests (racing creates of the same ids) take their index entries in
//! the same order.
//!
//! If the server refuses a batch (its transaction rolled back, nothing of
//! it is stored), each of its creates runs again alone, so that each
//! caller gets its own answer. Any other failure (the connection lost
//! mid-statement) leaves the outcome unknown, and every caller gets the
//! error, as a single create would.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use mcp_event_store_core::backend::task::rows::stored_digest;
use mcp_event_store_core::task::TaskDigest;
use sqlx::SqlStr;
use sqlx::postgres::PgPool;

use crate::batches::Statement;

/// Inserts a task, only under an instance alive at its birth (T11).
pub(crate) const CREATE: &str = r#"
INSERT INTO {s}.tasks (digest, owner, status, rev, message, created_at, updated_at,
       expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq, context,
       max_attempts, released)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, FALSE, $12, NULL, 0, $13, $14, $15
 WHERE EXISTS (SELECT 1 FROM {s}.instances WHERE id = $12 AND alive_until > $6)
ON CONFLICT (digest) DO NOTHING
"#;

/// [`CREATE`] for many tasks of distinct digests, each one element of
/// the arrays `$1` to `$15` (in [`CREATE`]'s order of parameters),
/// inserted in the order of the arrays; returns the digest of each task it
/// inserted.
pub(crate) const CREATE_BATCH: &str = r#"
INSERT INTO {s}.tasks (digest, owner, status, rev, message, created_at, updated_at,
       expires_at, purge_at, ttl_ms, poll_ms, cancel, instance, outcome, next_seq, context,
       max_attempts, released)
SELECT r.digest, r.owner, r.status, r.rev, r.message, r.created_at, r.updated_at,
       r.expires_at, r.purge_at, r.ttl_ms, r.poll_ms, FALSE, r.instance, NULL, 0, r.context,
       r.max_attempts, r.released
  FROM unnest($1::bytea[], $2::bytea[], $3::int2[], $4::int8[], $5::bytea[], $6::int8[],
              $7::int8[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::bytea[],
              $13::bytea[], $14::int4[], $15::bool[]) WITH ORDINALITY
       AS r(digest, owner, status, rev, message, created_at, updated_at, expires_at,
            purge_at, ttl_ms, poll_ms, instance, context, max_attempts, released, n)
 WHERE EXISTS (SELECT 1 FROM {s}.instances i
                WHERE i.id = r.instance AND i.alive_until > r.created_at)
 ORDER BY r.n
ON CONFLICT (digest) DO NOTHING
RETURNING digest
"#;

/// One create: everything the statement binds.
pub(crate) struct CreateRequest {
    pub digest: TaskDigest,
    pub owner: Vec<u8>,
    pub status: i16,
    pub rev: i64,
    pub message: Option<Vec<u8>>,
    pub created_at: i64,
    pub updated_at: i64,
    pub expires_at: i64,
    pub purge_at: i64,
    pub ttl_ms: Option<i64>,
    pub poll_ms: Option<i64>,
    pub instance: Vec<u8>,
    pub context: Option<Bytes>,
    pub max_attempts: Option<i32>,
    pub released: bool,
}

impl CreateRequest {
    /// What the request weighs against [`Creates::MAX_BYTES`].
    fn size(&self) -> usize {
        self.message.as_ref().map_or(0, Vec::len) + self.context.as_ref().map_or(0, Bytes::len)
    }
}

/// Task creates, batched: the pool they run on and their two statements.
pub(crate) struct Creates {
    pub pool: PgPool,
    /// [`CREATE`], for a task alone.
    pub one: SqlStr,
    /// [`CREATE_BATCH`], for a batch.
    pub batch: SqlStr,
}

impl Statement for Creates {
    type Request = CreateRequest;
    /// Whether the task was inserted.
    type Answer = bool;
    type Key = TaskDigest;

    const MAX_REQUESTS: usize = 128;
    /// Contexts and messages.
    const MAX_BYTES: usize = 4 << 20;
    const IN_FLIGHT: usize = 4;
    const STALL: Duration = Duration::from_millis(20);
    /// Two creates of one id must each learn whether it inserted.
    const SHARE: bool = false;
    const WHAT: &'static str = "batched task create";

    fn key(request: &CreateRequest) -> TaskDigest {
        request.digest
    }

    fn size(request: &CreateRequest) -> usize {
        request.size()
    }

    async fn one(&self, request: &CreateRequest) -> sqlx::Result<bool> {
        run_one(self, request).await
    }

    async fn many(&self, requests: &[&CreateRequest]) -> sqlx::Result<Vec<bool>> {
        let inserted = run_many(self, requests).await?;
        Ok(requests
            .iter()
            .map(|request| inserted.contains(&request.digest))
            .collect())
    }
}

/// [`CREATE`] of one task: whether it was inserted.
async fn run_one(writer: &Creates, r: &CreateRequest) -> sqlx::Result<bool> {
    let inserted = sqlx::query(writer.one.clone())
        .bind(&r.digest.as_bytes()[..])
        .bind(&r.owner[..])
        .bind(r.status)
        .bind(r.rev)
        .bind(r.message.as_deref())
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.expires_at)
        .bind(r.purge_at)
        .bind(r.ttl_ms)
        .bind(r.poll_ms)
        .bind(&r.instance[..])
        .bind(r.context.as_deref())
        .bind(r.max_attempts)
        .bind(r.released)
        .execute(&writer.pool)
        .await?
        .rows_affected();
    Ok(inserted == 1)
}

/// [`CREATE_BATCH`] of tasks of distinct digests: the digests it inserted.
async fn run_many(
    writer: &Creates,
    requests: &[&CreateRequest],
) -> sqlx::Result<HashSet<TaskDigest>> {
    let all = || requests.iter();
    let inserted: Vec<Vec<u8>> = sqlx::query_scalar(writer.batch.clone())
        .bind(all().map(|r| &r.digest.as_bytes()[..]).collect::<Vec<_>>())
        .bind(all().map(|r| &r.owner[..]).collect::<Vec<_>>())
        .bind(all().map(|r| r.status).collect::<Vec<_>>())
        .bind(all().map(|r| r.rev).collect::<Vec<_>>())
        .bind(all().map(|r| r.message.as_deref()).collect::<Vec<_>>())
        .bind(all().map(|r| r.created_at).collect::<Vec<_>>())
        .bind(all().map(|r| r.updated_at).collect::<Vec<_>>())
        .bind(all().map(|r| r.expires_at).collect::<Vec<_>>())
        .bind(all().map(|r| r.purge_at).collect::<Vec<_>>())
        .bind(all().map(|r| r.ttl_ms).collect::<Vec<_>>())
        .bind(all().map(|r| r.poll_ms).collect::<Vec<_>>())
        .bind(all().map(|r| &r.instance[..]).collect::<Vec<_>>())
        .bind(all().map(|r| r.context.as_deref()).collect::<Vec<_>>())
        .bind(all().map(|r| r.max_attempts).collect::<Vec<_>>())
        .bind(all().map(|r| r.released).collect::<Vec<_>>())
        .fetch_all(&writer.pool)
        .await?;
    inserted
        .iter()
        .map(|digest| stored_digest(digest))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| sqlx::Error::Protocol(format!("a batched task create returned {e}")))
}
