//! Values swapped in place (C22): the rewrite side of the store, for
//! re-sealing a file under a new key while servers keep writing to it.
//!
//! Each swap is one conditional `UPDATE` on the writer thread (`... SET
//! <column> = new WHERE <row> AND <column> = expected`), so it runs under
//! SQLite's write lock like every other write, in its group's transaction
//! or alone: a write of the value by any handle or process on the file
//! comes wholly before or after it, and after it the swap finds other
//! bytes and changes nothing. A swap writes the one column: an event's
//! sequence number, time and retry hint, a session's expiry, a task's
//! `rev`, status, instance and claim stay as they are, so nothing a reader
//! or watcher waits for moves, and nobody is woken.
//!
//! The new bytes have the length of the old ones (core checks it), which
//! is what keeps `mes_streams.bytes` right: its triggers fire on insert and
//! delete of an event only, and an `UPDATE` of a payload fires neither, so
//! the count neither moves nor needs to.
//!
//! Listings read on the read side and never wait for the writer: sessions
//! from the read pool, a page of tasks with their inputs on a page thread
//! in one read transaction, so one snapshot.

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::RewriteBackend;
use mcp_event_store_core::backend::dense;
use mcp_event_store_core::backend::task::TaskDigest;
use mcp_event_store_core::backend::task::rows::stored_digest;
use mcp_event_store_core::rewrite::{
    SessionValue, SessionValuePage, TaskField, TaskValue, TaskValuePage, TaskValues,
};
use mcp_event_store_core::{Error, EventId, Result, SessionDigest};
use rusqlite::{Connection, params};

use crate::SqliteStore;
use crate::error::{db_error, sqlite_error};
use crate::replay::read_snapshot;
use crate::writer::{Writer, execute};

/// Replaces an event's payload if it is the one expected, only in the
/// stream's current incarnation (`mes_streams.incarnation`): an id of an
/// earlier life of the stream names a row of the new life by token and
/// sequence number alike, and must not reach it. The stream id is checked
/// too, as a replay checks it, against a token collision.
///
/// ?1 new payload, ?2 token, ?3 seq, ?4 expected payload, ?5 incarnation,
/// ?6 stream id.
const SWAP_EVENT: &str = "UPDATE mes_events SET payload = ?1 \
     WHERE token = ?2 AND seq = ?3 AND payload = ?4 \
       AND EXISTS (SELECT 1 FROM mes_streams s \
                    WHERE s.token = ?2 AND s.incarnation = ?5 AND s.stream_id = ?6)";

/// Sessions after a key, in key order, among the keys a digest names
/// (`s1.` and 64 hex digits, all between ?1's `s1.` and ?2's `s1/`):
/// older releases keyed sessions by their raw id, and those rows, outside
/// the range or not parsing within it, are no digest's to list.
///
/// ?1 after (a key), ?2 the end of the range, ?3 limit.
const SESSION_PAGE: &str = "SELECT session_id, state FROM mes_sessions \
     WHERE session_id > ?1 AND session_id < ?2 ORDER BY session_id LIMIT ?3";

/// Where session keys start: every key is above it (`s1.` alone is none).
const SESSION_KEYS_FROM: &str = "s1.";

/// Where session keys end: `/` follows `.` in ASCII, so every `s1.` key is
/// below it.
const SESSION_KEYS_TO: &str = "s1/";

/// Replaces a session's state if it is the one expected; its expiry
/// stays. ?1 new, ?2 key, ?3 expected.
const SWAP_SESSION: &str =
    "UPDATE mes_sessions SET state = ?1 WHERE session_id = ?2 AND state = ?3";

/// A page of tasks after a digest, in digest order, with the values the
/// row holds. ?1 after (the empty blob: from the first), ?2 limit.
const TASK_PAGE: &str = "SELECT digest, context, outcome, checkpoint FROM mes_tasks \
     WHERE digest > ?1 ORDER BY digest LIMIT ?2";

/// The inputs of the tasks of a page, by the page's digest range (every
/// task in it is the page's, in the same snapshot): each input's request,
/// and its response when it holds one, whatever its state (a spent
/// input keeps its request until its task goes). ?1 after, ?2 the page's
/// last digest.
const TASK_PAGE_INPUTS: &str = "SELECT digest, key, request, response FROM mes_task_inputs \
     WHERE digest > ?1 AND digest <= ?2 ORDER BY digest, key";

/// The swap of each value of a task: one column of one row, nothing else
/// (not `rev`, not `updated_at`). ?1 new, ?2 digest, ?3 expected, and
/// for an input ?4 its key.
const SWAP_CONTEXT: &str = "UPDATE mes_tasks SET context = ?1 WHERE digest = ?2 AND context = ?3";
const SWAP_OUTCOME: &str = "UPDATE mes_tasks SET outcome = ?1 WHERE digest = ?2 AND outcome = ?3";
const SWAP_CHECKPOINT: &str =
    "UPDATE mes_tasks SET checkpoint = ?1 WHERE digest = ?2 AND checkpoint = ?3";
const SWAP_REQUEST: &str = "UPDATE mes_task_inputs SET request = ?1 \
     WHERE digest = ?2 AND key = ?4 AND request = ?3";
const SWAP_RESPONSE: &str = "UPDATE mes_task_inputs SET response = ?1 \
     WHERE digest = ?2 AND key = ?4 AND response = ?3";

/// Values listed and swapped in place (C22); see the crate docs,
/// ["Rewrites in place"](crate#rewrites-in-place).
#[async_trait]
impl RewriteBackend for SqliteStore {
    /// Events are rows: a payload can be rewritten in place.
    fn rewrites_events(&self) -> bool {
        true
    }

    /// `SWAP_EVENT` on the writer's connection. An id whose token is not
    /// the stream's, or whose parts SQLite cannot hold, names no event of
    /// it.
    async fn event_swap(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        if id.token != self.inner.key.token(stream_id) {
            return Ok(false);
        }
        let Some((Ok(incarnation), Ok(seq))) = dense::parts(id.position)
            .map(|(incarnation, seq)| (i64::try_from(incarnation), i64::try_from(seq)))
        else {
            return Ok(false);
        };
        let token = id.token;
        let (stream_id, expected, new) = (stream_id.to_owned(), expected.to_vec(), new.to_vec());
        self.inner
            .writer
            .run(move |writer: &mut Writer, _: bool| {
                execute(
                    &writer.conn,
                    SWAP_EVENT,
                    params![
                        new,
                        &token.as_bytes()[..],
                        seq,
                        expected,
                        incarnation,
                        stream_id
                    ],
                )
                .map(|changed| changed == 1)
            })
            .await
    }

    /// `SESSION_PAGE` on the read pool, again after a page that rows of
    /// no digest thinned (so a full page is `limit` sessions, and the
    /// listing never ends early). Expired sessions not yet purged are
    /// listed: their bytes are still in the file.
    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let mut from = after.map_or_else(|| SESSION_KEYS_FROM.to_owned(), SessionDigest::key);
        let mut sessions = Vec::with_capacity(limit);
        while sessions.len() < limit {
            let wanted = limit - sessions.len();
            let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(SESSION_PAGE)
                .bind(&from)
                .bind(SESSION_KEYS_TO)
                .bind(i64::try_from(wanted).unwrap_or(i64::MAX))
                .fetch_all(&self.inner.readers)
                .await
                .map_err(db_error)?;
            let short = rows.len() < wanted;
            for (key, state) in rows {
                if let Some(digest) = SessionDigest::from_key(&key) {
                    sessions.push(SessionValue::new(digest, Bytes::from(state)));
                }
                from = key;
            }
            if short {
                break;
            }
        }
        Ok(SessionValuePage::new(sessions, limit))
    }

    /// `SWAP_SESSION` on the writer's connection.
    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let (key, expected, new) = (digest.key(), expected.to_vec(), new.to_vec());
        self.inner
            .writer
            .run(move |writer: &mut Writer, _: bool| {
                execute(&writer.conn, SWAP_SESSION, params![new, key, expected])
                    .map(|changed| changed == 1)
            })
            .await
    }

    /// `TASK_PAGE` and `TASK_PAGE_INPUTS` on a page thread, in one read
    /// transaction.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        let after = after.map_or_else(Vec::new, |digest| digest.as_bytes().to_vec());
        let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
        let tasks = self
            .inner
            .pages
            .run(move |conn| read_snapshot(conn, || read_task_page(conn, &after, limit_sql)))
            .await?;
        Ok(TaskValuePage::new(tasks, limit))
    }

    /// The one statement of `field` (see `SWAP_CONTEXT`) on the writer's
    /// connection.
    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let Some((value, key)) = TaskColumn::of(field) else {
            // A value this release does not keep: never held, never listed.
            return Ok(false);
        };
        let (digest, expected, new) = (*digest, expected.to_vec(), new.to_vec());
        self.inner
            .writer
            .run(move |writer: &mut Writer, _: bool| {
                let (sql, digest) = (value.swap(), &digest.as_bytes()[..]);
                match &key {
                    None => execute(&writer.conn, sql, params![new, digest, expected]),
                    Some(key) => execute(&writer.conn, sql, params![new, digest, expected, key]),
                }
                .map(|changed| changed == 1)
            })
            .await
    }
}

/// The column a task's value is kept in.
#[derive(Clone, Copy)]
enum TaskColumn {
    Context,
    Outcome,
    Checkpoint,
    Request,
    Response,
}

impl TaskColumn {
    /// The column of `field`, and the input's key (as stored) for an
    /// input's value; `None` for a value this release does not keep.
    fn of(field: &TaskField) -> Option<(Self, Option<Vec<u8>>)> {
        let input = |key: &str| Some(key.as_bytes().to_vec());
        Some(match field {
            TaskField::Context => (Self::Context, None),
            TaskField::Outcome => (Self::Outcome, None),
            TaskField::Checkpoint => (Self::Checkpoint, None),
            TaskField::Request(key) => (Self::Request, input(key)),
            TaskField::Response(key) => (Self::Response, input(key)),
            _ => return None,
        })
    }

    /// Its swap statement.
    fn swap(self) -> &'static str {
        match self {
            Self::Context => SWAP_CONTEXT,
            Self::Outcome => SWAP_OUTCOME,
            Self::Checkpoint => SWAP_CHECKPOINT,
            Self::Request => SWAP_REQUEST,
            Self::Response => SWAP_RESPONSE,
        }
    }
}

/// A page of tasks with their values, inside the read transaction
/// [`read_snapshot`] holds: the tasks, then their inputs by the page's
/// digest range, so the memory a page takes is bounded by its limit (and
/// the inputs of its tasks).
fn read_task_page(conn: &Connection, after: &[u8], limit: i64) -> Result<Vec<TaskValues>> {
    let mut tasks = Vec::new();
    let mut statement = conn.prepare_cached(TASK_PAGE).map_err(sqlite_error)?;
    let mut rows = statement
        .query(params![after, limit])
        .map_err(sqlite_error)?;
    while let Some(row) = rows.next().map_err(sqlite_error)? {
        let digest: Vec<u8> = row.get(0).map_err(sqlite_error)?;
        let mut values = Vec::new();
        for (column, field) in [
            (1, TaskField::Context),
            (2, TaskField::Outcome),
            (3, TaskField::Checkpoint),
        ] {
            let value: Option<Vec<u8>> = row.get(column).map_err(sqlite_error)?;
            if let Some(bytes) = value {
                values.push(TaskValue::new(field, bytes.into()));
            }
        }
        tasks.push(TaskValues::new(stored_digest(&digest)?, values));
    }
    drop(rows);
    drop(statement);
    let Some(last) = tasks.last().map(|task| task.digest) else {
        return Ok(tasks);
    };
    let mut statement = conn
        .prepare_cached(TASK_PAGE_INPUTS)
        .map_err(sqlite_error)?;
    let mut rows = statement
        .query(params![after, &last.as_bytes()[..]])
        .map_err(sqlite_error)?;
    while let Some(row) = rows.next().map_err(sqlite_error)? {
        let digest: Vec<u8> = row.get(0).map_err(sqlite_error)?;
        let key = String::from_utf8(row.get(1).map_err(sqlite_error)?)
            .map_err(|_| Error::Corrupt("an input key is not UTF-8".into()))?;
        let request: Vec<u8> = row.get(2).map_err(sqlite_error)?;
        let response: Option<Vec<u8>> = row.get(3).map_err(sqlite_error)?;
        // Both come in digest order; every input of the range is a task's
        // of the page, whose rows go together.
        let Ok(at) = tasks.binary_search_by(|task| task.digest.as_bytes()[..].cmp(&digest[..]))
        else {
            continue;
        };
        let values = &mut tasks[at].values;
        if let Some(response) = response {
            values.push(TaskValue::new(
                TaskField::Response(key.clone()),
                response.into(),
            ));
        }
        values.push(TaskValue::new(TaskField::Request(key), request.into()));
    }
    Ok(tasks)
}
