//! Values swapped in place (C22): the rewrite side of the store, for
//! re-sealing a schema under a new key while servers keep writing to it.
//!
//! Each swap is one conditional `UPDATE` (`... SET <column> = new WHERE
//! <row> AND <column> = expected`), committed by itself: PostgreSQL takes
//! the row's lock, and when another transaction wrote the row since the
//! statement's snapshot it re-reads the newest version and checks the
//! condition again on it (read committed), so a swap never writes over a
//! value it did not read, and a write that comes after it finds the new
//! bytes. A swap writes the one column: an event's `cum_bytes`, time and
//! retry hint, a stream's `total_bytes` and sequence numbers, a session's
//! expiry, a task's `rev`, status, instance and claim stay as they are (the
//! new bytes have the old length, so the byte counts stay true), and
//! nothing is announced: no reader or watcher waits for such a change.
//!
//! An `UPDATE` leaves the row's old version behind as a dead tuple, as a
//! delete does: rewriting a whole store leaves as many dead tuples as
//! values swapped, reclaimed by autovacuum, or, where autovacuum is off,
//! by a `VACUUM` of the operator's (the purge's own vacuum under
//! [`Vacuum::Auto`](crate::Vacuum::Auto) counts deleted rows only, not
//! swapped ones, and leaves the task tables to autovacuum). See the crate
//! docs, "Disk space and autovacuum".
//!
//! A swap locks one row, or, for an input, its task's row and then the
//! input's: the order of every transaction that writes an input (a step,
//! a delete, the purge), which holds the task's row first. So a swap
//! deadlocks with no append, purge or step (see the crate docs, "Lock
//! order").
//!
//! Listings are one statement per page, so one snapshot: a task comes with
//! its inputs' values as of the same moment.

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
use sqlx::postgres::PgRow;
use sqlx::{Row, SqlStr};

use crate::PostgresStore;
use crate::error::backend;
use crate::options::quote_schema;
use crate::sql::render;

/// Replaces an event's data if it is the one expected, only while the
/// event is retained in the stream's current incarnation: an id of an
/// earlier life of the stream (another incarnation), or one the purge or a
/// `delete_stream` already removed logically (below `first_seq`, whose row
/// may still be there, and whose stream may go on in the same
/// incarnation), names no event. The stream id is checked too, as a
/// replay does, against a token collision.
///
/// $1 token, $2 stream id, $3 seq, $4 expected, $5 new, $6 incarnation.
const SWAP_EVENT: &str = r#"
UPDATE {s}.events e SET data = $5
 WHERE e.token = $1 AND e.seq = $3 AND e.data = $4
   AND EXISTS (SELECT 1 FROM {s}.streams st
                WHERE st.token = $1 AND st.stream_id = $2 AND st.incarnation = $6
                  AND $3 BETWEEN st.first_seq AND st.last_seq)
"#;

/// Sessions after a key, in key order (bytea compares bytes, whatever the
/// database's collation), among the keys a digest names (`s1.` and 64 hex
/// digits, all between `s1.` and `s1/`): rows an older release keyed by
/// the raw id are no digest's to list.
///
/// $1 after (a key), $2 the end of the range, $3 limit.
const SESSION_PAGE: &str = r#"
SELECT session_id, state FROM {s}.sessions
 WHERE session_id > $1 AND session_id < $2
 ORDER BY session_id
 LIMIT $3
"#;

/// Where session keys start: every key is above it (`s1.` alone is none).
const SESSION_KEYS_FROM: &[u8] = b"s1.";

/// Where session keys end: `/` follows `.`, so every `s1.` key is below it.
const SESSION_KEYS_TO: &[u8] = b"s1/";

/// Replaces a session's state if it is the one expected; its expiry
/// stays. $1 key, $2 expected, $3 new.
const SWAP_SESSION: &str = r#"
UPDATE {s}.sessions SET state = $3 WHERE session_id = $1 AND state = $2
"#;

/// A page of tasks after a digest, in digest order, each with the values
/// its row holds and, by key, every input's key, request and response
/// (NULL when it holds none), whatever the input's state: a spent input
/// keeps its request until its task goes. One statement, one snapshot.
///
/// $1 after (the empty bytea: from the first), $2 limit.
const TASK_PAGE: &str = r#"
SELECT t.digest, t.context, t.outcome, t.checkpoint,
       ARRAY(SELECT k.key FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.key),
       ARRAY(SELECT k.request FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.key),
       ARRAY(SELECT k.response FROM {s}.task_inputs k WHERE k.digest = t.digest ORDER BY k.key)
  FROM {s}.tasks t
 WHERE t.digest > $1
 ORDER BY t.digest
 LIMIT $2
"#;

/// The swap of each value of a task: one column of one row, nothing else
/// (not `rev`, not `updated_at`). $1 digest, $2 expected, $3 new, and for
/// an input $4 its key.
const SWAP_CONTEXT: &str = r#"
UPDATE {s}.tasks SET context = $3 WHERE digest = $1 AND context = $2
"#;
const SWAP_OUTCOME: &str = r#"
UPDATE {s}.tasks SET outcome = $3 WHERE digest = $1 AND outcome = $2
"#;
const SWAP_CHECKPOINT: &str = r#"
UPDATE {s}.tasks SET checkpoint = $3 WHERE digest = $1 AND checkpoint = $2
"#;

/// An input's swap takes its task's row lock first (`FOR SHARE`), as every
/// task step holds it (`FOR UPDATE`) from its read to its commit, so the
/// swap comes wholly before or after a step: a step that takes the
/// answer returns the row it read before it waited for a lock
/// (`TAKE_INPUT`'s `FROM` row), and without this could hand out the bytes
/// a swap had just replaced. After the wait the input's newest version is
/// checked against `expected` again (read committed), so a response taken
/// meanwhile is not written.
const SWAP_REQUEST: &str = r#"
WITH task AS MATERIALIZED (SELECT 1 FROM {s}.tasks WHERE digest = $1 FOR SHARE)
UPDATE {s}.task_inputs SET request = $3
 WHERE digest = $1 AND key = $4 AND request = $2 AND EXISTS (SELECT 1 FROM task)
"#;
/// As [`SWAP_REQUEST`], for the response.
const SWAP_RESPONSE: &str = r#"
WITH task AS MATERIALIZED (SELECT 1 FROM {s}.tasks WHERE digest = $1 FOR SHARE)
UPDATE {s}.task_inputs SET response = $3
 WHERE digest = $1 AND key = $4 AND response = $2 AND EXISTS (SELECT 1 FROM task)
"#;

/// A rewrite statement with the store's schema spliced in.
fn sql(store: &PostgresStore, template: &str) -> SqlStr {
    render(template, &quote_schema(store.schema()))
}

/// Values listed and swapped in place (C22); see the crate docs,
/// ["Rewrites in place"](crate#rewrites-in-place).
#[async_trait]
impl RewriteBackend for PostgresStore {
    /// Events are rows: their data can be rewritten in place.
    fn rewrites_events(&self) -> bool {
        true
    }

    /// `SWAP_EVENT`. An id whose token is not the stream's, or whose
    /// parts no BIGINT holds, names no event of it.
    async fn event_swap(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        if id.token != self.key().token(stream_id) {
            return Ok(false);
        }
        let Some((Ok(incarnation), Ok(seq))) = dense::parts(id.position)
            .map(|(incarnation, seq)| (i64::try_from(incarnation), i64::try_from(seq)))
        else {
            return Ok(false);
        };
        let swapped = sqlx::query(sql(self, SWAP_EVENT))
            .bind(&id.token.as_bytes()[..])
            .bind(stream_id.as_bytes())
            .bind(seq)
            .bind(expected)
            .bind(new)
            .bind(incarnation)
            .execute(self.pool())
            .await
            .map_err(backend)?;
        Ok(swapped.rows_affected() == 1)
    }

    /// `SESSION_PAGE`, again after a page that rows of no digest thinned
    /// (so a full page is `limit` sessions, and the listing never ends
    /// early). Expired sessions not yet purged are listed: their bytes are
    /// still in the table.
    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let mut from = after.map_or_else(
            || SESSION_KEYS_FROM.to_vec(),
            |digest| digest.key().into_bytes(),
        );
        let mut sessions = Vec::with_capacity(limit);
        while sessions.len() < limit {
            let wanted = limit - sessions.len();
            let rows: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(sql(self, SESSION_PAGE))
                .bind(&from)
                .bind(SESSION_KEYS_TO)
                .bind(i64::try_from(wanted).unwrap_or(i64::MAX))
                .fetch_all(self.pool())
                .await
                .map_err(backend)?;
            let short = rows.len() < wanted;
            for (key, state) in rows {
                let digest = std::str::from_utf8(&key)
                    .ok()
                    .and_then(SessionDigest::from_key);
                if let Some(digest) = digest {
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

    /// `SWAP_SESSION`.
    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let swapped = sqlx::query(sql(self, SWAP_SESSION))
            .bind(digest.key().into_bytes())
            .bind(expected)
            .bind(new)
            .execute(self.pool())
            .await
            .map_err(backend)?;
        Ok(swapped.rows_affected() == 1)
    }

    /// `TASK_PAGE`: one statement, so one snapshot.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        let after = after.map_or(&[][..], |digest| &digest.as_bytes()[..]);
        let rows = sqlx::query(sql(self, TASK_PAGE))
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(backend)?;
        let tasks = rows.iter().map(task_values).collect::<Result<_>>()?;
        Ok(TaskValuePage::new(tasks, limit))
    }

    /// The one statement of `field` (see `SWAP_CONTEXT`).
    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let (template, key) = match field {
            TaskField::Context => (SWAP_CONTEXT, None),
            TaskField::Outcome => (SWAP_OUTCOME, None),
            TaskField::Checkpoint => (SWAP_CHECKPOINT, None),
            TaskField::Request(key) => (SWAP_REQUEST, Some(key.as_bytes())),
            TaskField::Response(key) => (SWAP_RESPONSE, Some(key.as_bytes())),
            // A value this release does not keep: never held, never listed.
            _ => return Ok(false),
        };
        let query = sqlx::query(sql(self, template))
            .bind(&digest.as_bytes()[..])
            .bind(expected)
            .bind(new);
        let query = match key {
            Some(key) => query.bind(key),
            None => query,
        };
        let swapped = query.execute(self.pool()).await.map_err(backend)?;
        Ok(swapped.rows_affected() == 1)
    }
}

/// A task of a [`TASK_PAGE`] row, with its values.
fn task_values(row: &PgRow) -> Result<TaskValues> {
    let digest: Vec<u8> = row.try_get(0).map_err(backend)?;
    let mut values = Vec::new();
    for (column, field) in [
        (1, TaskField::Context),
        (2, TaskField::Outcome),
        (3, TaskField::Checkpoint),
    ] {
        let value: Option<Vec<u8>> = row.try_get(column).map_err(backend)?;
        if let Some(bytes) = value {
            values.push(TaskValue::new(field, bytes.into()));
        }
    }
    let keys: Vec<Vec<u8>> = row.try_get(4).map_err(backend)?;
    let requests: Vec<Vec<u8>> = row.try_get(5).map_err(backend)?;
    let responses: Vec<Option<Vec<u8>>> = row.try_get(6).map_err(backend)?;
    if keys.len() != requests.len() || keys.len() != responses.len() {
        return Err(Error::Corrupt(
            "a task's input keys, requests and responses do not line up".into(),
        ));
    }
    for ((key, request), response) in keys.into_iter().zip(requests).zip(responses) {
        let key = String::from_utf8(key)
            .map_err(|_| Error::Corrupt("an input key is not UTF-8".into()))?;
        if let Some(response) = response {
            values.push(TaskValue::new(
                TaskField::Response(key.clone()),
                response.into(),
            ));
        }
        values.push(TaskValue::new(TaskField::Request(key), request.into()));
    }
    Ok(TaskValues::new(stored_digest(&digest)?, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_schema_everywhere() {
        for template in [
            SWAP_EVENT,
            SESSION_PAGE,
            SWAP_SESSION,
            TASK_PAGE,
            SWAP_CONTEXT,
            SWAP_OUTCOME,
            SWAP_CHECKPOINT,
            SWAP_REQUEST,
            SWAP_RESPONSE,
        ] {
            let rendered = template.replace("{s}", "\"x\"");
            for table in ["events", "streams", "sessions", "tasks", "task_inputs"] {
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
