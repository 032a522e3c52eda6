//! Retention (C8): deleting a stream, and `purge_expired` run by the
//! writer thread in bounded steps (age, then sessions, then redemptions past
//! their time, then the count and byte limits), each one short transaction queued as a job of its own, so
//! append groups run in between; and the trim that appends apply inline.

use std::collections::HashSet;
use std::sync::Arc;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::{PurgeReport, Result, Retention};
use rusqlite::{Connection, OptionalExtension, params};

use crate::SqliteStore;
use crate::error::sqlite_error;
use crate::writer::{Job, Writer, execute};

/// Rows one purge transaction deletes at most, and one delete statement
/// of events: the writer keeps each statement's undo copy in memory (see
/// [`crate::writer::open`]), so no statement may touch pages without
/// bound.
const PURGE_BATCH: i64 = 500;
/// Streams one limit-enforcement step visits at most.
const LIMIT_SCAN_BATCH: i64 = 100;

/// Deletes a stream and its events, in one transaction of the writer's;
/// its followers are woken to end with `EventsPurged`.
pub(crate) async fn remove_stream(store: &SqliteStore, stream_id: &str) -> Result<u64> {
    let job = RemoveStream {
        token: store.inner.key.token(stream_id),
        followers: store.inner.wakeups.clone(),
    };
    store.inner.writer.run(job).await
}

/// Applies retention now: one bounded step after another (age, then
/// sessions, then redemptions, then the count and byte limits), each a job for the writer,
/// so appends get their turn in between.
pub(crate) async fn purge(store: &SqliteStore) -> Result<PurgeReport> {
    let mut progress = Progress {
        now: store.now(),
        phase: Phase::Age,
        report: PurgeReport::default(),
    };
    loop {
        let step = PurgeStep {
            progress,
            followers: store.inner.wakeups.clone(),
        };
        match store.inner.writer.run(step).await? {
            (done, true) => return Ok(done.report),
            (next, false) => progress = next,
        }
    }
}

/// A stream to delete, row and events together (in the group's
/// transaction, or in one of its own): a row without its events is fine,
/// but events without their row would collide with the next life of the
/// stream.
struct RemoveStream {
    token: StreamToken,
    followers: Arc<Wakeups>,
}

impl Job for RemoveStream {
    type Output = u64;

    fn run(&self, writer: &mut Writer, in_transaction: bool) -> Result<u64> {
        writer.known.remove(&self.token);
        writer.atomically(in_transaction, |writer| {
            delete_stream_rows(&writer.conn, self.token)
        })
    }

    /// A follower must hear of the delete to end with `EventsPurged`.
    fn committed(&self, _: &u64) {
        self.followers.wake(&self.token);
    }
}

/// Where a purge has got to.
#[derive(Clone)]
enum Phase {
    Age,
    Sessions,
    Redemptions,
    Limits { after_token: Vec<u8> },
}

/// A purge in progress: its time, its phase and what it removed so far.
#[derive(Clone)]
struct Progress {
    now: i64,
    phase: Phase,
    report: PurgeReport,
}

/// One bounded transaction of a purge: the progress after it, and whether
/// the purge is done.
struct PurgeStep {
    progress: Progress,
    followers: Arc<Wakeups>,
}

impl Job for PurgeStep {
    type Output = (Progress, bool);

    fn run(&self, writer: &mut Writer, in_transaction: bool) -> Result<(Progress, bool)> {
        // Purging changes byte counts behind the hints' back.
        writer.known.clear();
        let retention = writer.retention;
        let mut progress = self.progress.clone();
        let done_with_phase = writer.atomically(in_transaction, |writer| {
            let conn = &writer.conn;
            let (now, report) = (progress.now, &mut progress.report);
            Ok(match &mut progress.phase {
                Phase::Age => match retention.expiry_cutoff_millis(now) {
                    None => true,
                    Some(cutoff) => {
                        let (events, streams) = purge_aged_events(conn, cutoff)?;
                        report.events += events;
                        report.streams += streams;
                        events < PURGE_BATCH as u64
                    }
                },
                Phase::Sessions => {
                    let removed = execute(
                        conn,
                        "DELETE FROM mes_sessions WHERE rowid IN \
                         (SELECT rowid FROM mes_sessions WHERE expires_at <= ?1 LIMIT ?2)",
                        params![now, PURGE_BATCH],
                    )?;
                    report.sessions += removed;
                    removed < PURGE_BATCH as u64
                }
                Phase::Redemptions => {
                    let removed = execute(
                        conn,
                        "DELETE FROM mes_redeemed WHERE key IN \
                         (SELECT key FROM mes_redeemed WHERE forget_at <= ?1 LIMIT ?2)",
                        params![now, PURGE_BATCH],
                    )?;
                    report.redemptions += removed;
                    removed < PURGE_BATCH as u64
                }
                Phase::Limits { after_token } => {
                    let (events, next) = enforce_limits(conn, after_token, retention)?;
                    report.events += events;
                    match next {
                        Some(next) => {
                            *after_token = next;
                            false
                        }
                        None => true,
                    }
                }
            })
        })?;
        if done_with_phase {
            progress.phase = match progress.phase {
                Phase::Age => Phase::Sessions,
                Phase::Sessions => Phase::Redemptions,
                Phase::Redemptions => Phase::Limits {
                    after_token: Vec::new(),
                },
                Phase::Limits { .. } => return Ok((progress, true)),
            };
        }
        Ok((progress, false))
    }

    /// Whole streams expired: their followers end with `EventsPurged` now
    /// rather than at their re-check.
    fn committed(&self, (progress, _): &(Progress, bool)) {
        if progress.report.streams != self.progress.report.streams {
            self.followers.wake_all();
        }
    }
}

/// Deletes a stream's row, then its events (so the delete trigger has no
/// counters left to update), a bounded batch per statement; the caller
/// holds a transaction, so the stream still goes all at once.
fn delete_stream_rows(conn: &Connection, token: StreamToken) -> Result<u64> {
    let token = &token.as_bytes()[..];
    execute(conn, "DELETE FROM mes_streams WHERE token = ?1", [token])?;
    delete_through(conn, token, i64::MAX)
}

/// Deletes up to one batch of events older than `cutoff` (the delete trigger
/// keeps byte counts right) and removes streams left with no events.
fn purge_aged_events(conn: &Connection, cutoff: i64) -> Result<(u64, u64)> {
    let tokens: Vec<Vec<u8>> = conn
        .prepare_cached(
            "DELETE FROM mes_events WHERE rowid IN \
             (SELECT rowid FROM mes_events WHERE stored_at < ?1 ORDER BY stored_at LIMIT ?2) \
             RETURNING token",
        )
        .and_then(|mut statement| {
            statement
                .query_map(params![cutoff, PURGE_BATCH], |row| row.get(0))?
                .collect()
        })
        .map_err(sqlite_error)?;
    let events = tokens.len() as u64;
    let touched: HashSet<Vec<u8>> = tokens.into_iter().collect();
    let mut streams = 0;
    for token in touched {
        streams += execute(
            conn,
            "DELETE FROM mes_streams WHERE token = ?1 \
             AND NOT EXISTS (SELECT 1 FROM mes_events WHERE token = ?1)",
            [&token],
        )?;
    }
    Ok((events, streams))
}

/// Trims every stream over the count or byte limit, a batch of streams at a
/// time in token order. Returns the events removed and where to continue.
fn enforce_limits(
    conn: &Connection,
    after_token: &[u8],
    retention: Retention,
) -> Result<(u64, Option<Vec<u8>>)> {
    if retention.max_events_per_stream.is_none() && retention.max_bytes_per_stream.is_none() {
        return Ok((0, None));
    }
    let rows: Vec<(Vec<u8>, i64, i64)> = conn
        .prepare_cached(
            "SELECT token, last_seq, bytes FROM mes_streams WHERE token > ?1 \
             ORDER BY token LIMIT ?2",
        )
        .and_then(|mut statement| {
            statement
                .query_map(params![after_token, LIMIT_SCAN_BATCH], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })?
                .collect()
        })
        .map_err(sqlite_error)?;
    let more = rows.len() as i64 == LIMIT_SCAN_BATCH;
    let mut removed = 0;
    let mut last = None;
    for (token, last_seq, bytes) in rows {
        removed += trim_stream(conn, &token, last_seq, bytes, retention)?.0;
        last = Some(token);
    }
    Ok((removed, if more { last } else { None }))
}

/// Removes a stream's oldest events until it is within the count and byte
/// limits, never removing the newest event (`last_seq`). `bytes_hint` is what
/// the caller believes the stream holds; the real count is read before any
/// byte-limit deletion. Returns the events removed and, if it was read, the
/// stream's real byte count afterwards.
pub(crate) fn trim_stream(
    conn: &Connection,
    token: &[u8],
    last_seq: i64,
    bytes_hint: i64,
    retention: Retention,
) -> Result<(u64, Option<i64>)> {
    let mut removed = 0;
    if let Some(max) = retention.max_events_per_stream {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        if last_seq > max {
            removed += delete_through(conn, token, last_seq - max)?;
        }
    }
    let Some(max) = retention.max_bytes_per_stream else {
        return Ok((removed, None));
    };
    let max = i64::try_from(max).unwrap_or(i64::MAX);
    if bytes_hint <= max {
        return Ok((removed, None));
    }
    loop {
        let bytes: i64 = conn
            .prepare_cached("SELECT bytes FROM mes_streams WHERE token = ?1")
            .and_then(|mut statement| statement.query_row([token], |row| row.get(0)).optional())
            .map_err(sqlite_error)?
            .unwrap_or(0);
        if bytes <= max {
            return Ok((removed, Some(bytes)));
        }
        let sizes: Vec<(i64, i64)> = conn
            .prepare_cached(
                "SELECT seq, length(payload) FROM mes_events WHERE token = ?1 AND seq < ?2 \
                 ORDER BY seq LIMIT 256",
            )
            .and_then(|mut statement| {
                statement
                    .query_map(params![token, last_seq], |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })?
                    .collect()
            })
            .map_err(sqlite_error)?;
        let mut cut = None;
        let mut excess = bytes - max;
        for (seq, len) in sizes {
            if excess <= 0 {
                break;
            }
            excess -= len;
            cut = Some(seq);
        }
        let Some(cut) = cut else {
            // Only the newest event is left; it stays.
            return Ok((removed, Some(bytes)));
        };
        removed += delete_through(conn, token, cut)?;
    }
}

/// Deletes a stream's events up to and including `seq` (the delete trigger
/// keeps its byte count right), oldest first, a bounded batch per
/// statement. Returns how many went.
fn delete_through(conn: &Connection, token: &[u8], seq: i64) -> Result<u64> {
    let mut removed = 0;
    loop {
        let deleted = execute(
            conn,
            "DELETE FROM mes_events WHERE rowid IN \
             (SELECT rowid FROM mes_events WHERE token = ?1 AND seq <= ?2 \
              ORDER BY seq LIMIT ?3)",
            params![token, seq, PURGE_BATCH],
        )?;
        removed += deleted;
        if deleted < PURGE_BATCH as u64 {
            return Ok(removed);
        }
    }
}
