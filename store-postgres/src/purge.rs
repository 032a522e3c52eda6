//! Retention (C8) and stream deletion, in bounded batches.
//!
//! Removal has two steps. *Logical*: a stream's `first_seq` moves up, and
//! from that commit on no reader sees the events below it. *Physical*: the
//! rows below `first_seq` are deleted, at most [`BATCH`] per statement, and
//! `clean_seq` records how far that went. Both steps of one batch commit in
//! one statement, so no statement holds locks for long and a purge that
//! dies half way leaves only rows that the next purge removes.
//!
//! Every statement here that locks several stream rows locks them in token
//! order, as appends do (see [`crate::sql::TRIM`]), so purges, deletions
//! and batched appends never deadlock one another.
//!
//! Under [`Vacuum::Auto`](crate::Vacuum::Auto), a purge that brought this
//! handle's deletions past the threshold ends with a plain `VACUUM` of the
//! store's tables ([`vacuum_if_due`]).

use std::time::Instant;

use mcp_event_store_core::{PurgeReport, Result};
use sqlx::{Row, SqlStr};

use crate::PostgresStore;
use crate::error::backend;
use crate::options::BATCH;

/// One piece of retention work on one stream: raise `first_seq` to
/// `new_first` and delete the rows in `[lo, hi)`.
struct Work {
    token: Vec<u8>,
    incarnation: i64,
    new_first: i64,
    lo: i64,
    hi: i64,
}

/// Runs work items in statements of at most [`BATCH`] rows each, splitting
/// long ranges. Returns the rows deleted.
async fn run_work(store: &PostgresStore, work: Vec<Work>) -> Result<u64> {
    let mut deleted = 0u64;
    let mut tokens = Vec::new();
    let mut incarnations = Vec::new();
    let mut new_firsts = Vec::new();
    let mut los = Vec::new();
    let mut his = Vec::new();
    let mut rows_in_batch = 0i64;
    let batch = BATCH as i64;
    for item in work {
        let mut lo = item.lo;
        loop {
            let room = batch - rows_in_batch;
            let hi = item.hi.min(lo.saturating_add(room));
            // Every chunk raises first_seq all the way (hi <= new_first), so
            // the whole range disappears for readers with the first chunk.
            tokens.push(item.token.clone());
            incarnations.push(item.incarnation);
            new_firsts.push(item.new_first);
            los.push(lo);
            his.push(hi);
            rows_in_batch += hi - lo;
            if rows_in_batch >= batch || tokens.len() >= BATCH {
                deleted += flush(
                    store,
                    &mut tokens,
                    &mut incarnations,
                    &mut new_firsts,
                    &mut los,
                    &mut his,
                )
                .await?;
                rows_in_batch = 0;
            }
            if hi >= item.hi {
                break;
            }
            lo = hi;
        }
    }
    if !tokens.is_empty() {
        deleted += flush(
            store,
            &mut tokens,
            &mut incarnations,
            &mut new_firsts,
            &mut los,
            &mut his,
        )
        .await?;
    }
    Ok(deleted)
}

async fn flush(
    store: &PostgresStore,
    tokens: &mut Vec<Vec<u8>>,
    incarnations: &mut Vec<i64>,
    new_firsts: &mut Vec<i64>,
    los: &mut Vec<i64>,
    his: &mut Vec<i64>,
) -> Result<u64> {
    let deleted: i64 = sqlx::query_scalar(store.sql().trim.clone())
        .bind(std::mem::take(tokens))
        .bind(std::mem::take(incarnations))
        .bind(std::mem::take(new_firsts))
        .bind(std::mem::take(los))
        .bind(std::mem::take(his))
        .fetch_one(store.pool())
        .await
        .map_err(backend)?;
    Ok(deleted as u64)
}

async fn remove_empty(store: &PostgresStore, tokens: Vec<Vec<u8>>) -> Result<u64> {
    if tokens.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(store.sql().remove_empty.clone())
        .bind(tokens)
        .execute(store.pool())
        .await
        .map_err(backend)?;
    Ok(done.rows_affected())
}

/// Removes a stream: empties it logically in one statement (so every reader
/// sees it gone at once), deletes its rows in batches, then drops its row.
/// Returns how many events it held.
pub(crate) async fn remove_stream(store: &PostgresStore, stream_id: &str) -> Result<u64> {
    let token = store.key().token(stream_id);
    let row = sqlx::query(store.sql().delete_mark.clone())
        .bind(&token.as_bytes()[..])
        .bind(stream_id.as_bytes())
        .fetch_optional(store.pool())
        .await
        .map_err(backend)?;
    let Some(row) = row else {
        return Ok(0);
    };
    let old_first: i64 = row.try_get(0).map_err(backend)?;
    let last: i64 = row.try_get(1).map_err(backend)?;
    let clean: i64 = row.try_get(2).map_err(backend)?;
    let incarnation: i64 = row.try_get(3).map_err(backend)?;
    if clean <= last {
        run_work(
            store,
            vec![Work {
                token: token.as_bytes().to_vec(),
                incarnation,
                new_first: last + 1,
                lo: clean,
                hi: last + 1,
            }],
        )
        .await?;
    }
    let streams = remove_empty(store, vec![token.as_bytes().to_vec()]).await?;
    let removed = (last + 1 - old_first).max(0) as u64;
    // Counted for the next purge's vacuum; a deletion never vacuums itself.
    store.add_deleted(removed + streams);
    Ok(removed)
}

/// Applies every retention limit to every stream, a batch of streams at a
/// time, then removes expired sessions and redemptions past their time.
pub(crate) async fn purge(store: &PostgresStore) -> Result<PurgeReport> {
    let now = store.now();
    let retention = store.options().retention;
    let cutoff = retention.expiry_cutoff_millis(now);
    let max_bytes = retention
        .max_bytes_per_stream
        .map(|b| i64::try_from(b).unwrap_or(i64::MAX));
    let max_events = retention
        .max_events_per_stream
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    let mut report = PurgeReport::default();
    let mut after: Vec<u8> = Vec::new();
    loop {
        let rows = sqlx::query(store.sql().plan.clone())
            .bind(&after)
            .bind(cutoff)
            .bind(max_bytes)
            .bind(BATCH as i64)
            .fetch_all(store.pool())
            .await
            .map_err(backend)?;
        let Some(last_row) = rows.last() else {
            break;
        };
        after = last_row.try_get(0).map_err(backend)?;
        let full = rows.len() >= BATCH;
        let mut work = Vec::new();
        let mut emptied = Vec::new();
        for row in rows {
            let token: Vec<u8> = row.try_get(0).map_err(backend)?;
            let incarnation: i64 = row.try_get(1).map_err(backend)?;
            let first: i64 = row.try_get(2).map_err(backend)?;
            let last: i64 = row.try_get(3).map_err(backend)?;
            let clean: i64 = row.try_get(4).map_err(backend)?;
            let age_keep: Option<i64> = row.try_get(5).map_err(backend)?;
            let bytes_keep: Option<i64> = row.try_get(6).map_err(backend)?;
            // The count limit never removes the newest event (max >= 1).
            let count_keep = max_events.map(|max| last.saturating_add(1).saturating_sub(max));
            let new_first = [Some(first), age_keep, bytes_keep, count_keep]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(first);
            if new_first > last {
                emptied.push(token.clone());
            }
            if clean < new_first {
                work.push(Work {
                    token,
                    incarnation,
                    new_first,
                    lo: clean,
                    hi: new_first,
                });
            }
        }
        report.events += run_work(store, work).await?;
        report.streams += remove_empty(store, emptied).await?;
        if !full {
            break;
        }
    }
    report.sessions = purge_sessions(store, now).await?;
    report.redemptions = purge_redeemed(store, now).await?;
    let deleted = report.events + report.streams + report.sessions + report.redemptions;
    if let Some(deleted) = store.add_deleted(deleted) {
        vacuum_if_due(store, deleted).await;
    }
    Ok(report)
}

/// Vacuums the store's tables once `deleted` rows (at least
/// [`VACUUM_MIN_ROWS`](crate::VACUUM_MIN_ROWS), counted since this handle
/// last vacuumed) are also a fifth of the rows the tables held when last
/// counted, so the work a vacuum does stays in proportion to the space it
/// frees. A vacuum that fails is logged and tried again after the next
/// purge: the rows are deleted and the purge's report stands.
pub(crate) async fn vacuum_if_due(store: &PostgresStore, deleted: u64) {
    let start = Instant::now();
    let rows: sqlx::Result<Option<i64>> = sqlx::query_scalar(store.sql().table_rows.clone())
        .fetch_one(store.pool())
        .await;
    let rows = match rows {
        Ok(rows) => rows.unwrap_or(0).max(0) as u64,
        Err(e) => {
            tracing::warn!(error = %e, schema = store.schema(), "could not size the store's tables for a vacuum");
            return;
        }
    };
    if deleted < rows / 5 {
        return;
    }
    match sqlx::raw_sql(store.sql().vacuum.clone())
        .execute(store.pool())
        .await
    {
        Ok(_) => {
            store.vacuumed(deleted);
            tracing::debug!(
                schema = store.schema(),
                deleted,
                rows,
                elapsed_ms = start.elapsed().as_millis() as u64,
                "vacuumed the store's tables"
            );
        }
        Err(e) => tracing::warn!(
            error = %e,
            schema = store.schema(),
            "vacuuming the store's tables after a purge failed; trying again after the next purge"
        ),
    }
}

/// Deletes redemptions past their time (C21), as [`purge_sessions`]
/// deletes sessions.
async fn purge_redeemed(store: &PostgresStore, now: i64) -> Result<u64> {
    delete_in_batches(store, &store.sql().purge_redeemed, now).await
}

/// Deletes expired sessions in batches; see [`crate::sql`] for why it skips
/// rows another transaction holds.
async fn purge_sessions(store: &PostgresStore, now: i64) -> Result<u64> {
    delete_in_batches(store, &store.sql().purge_sessions, now).await
}

/// Runs `delete` (`$1` now, `$2` the batch size) until a batch removes
/// fewer rows than the batch size; how many rows went.
async fn delete_in_batches(store: &PostgresStore, delete: &SqlStr, now: i64) -> Result<u64> {
    let mut removed = 0;
    loop {
        let done = sqlx::query(delete.clone())
            .bind(now)
            .bind(BATCH as i64)
            .execute(store.pool())
            .await
            .map_err(backend)?;
        removed += done.rows_affected();
        if done.rows_affected() < BATCH as u64 {
            return Ok(removed);
        }
    }
}
