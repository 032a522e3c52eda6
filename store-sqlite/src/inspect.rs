//! C15 Inspect on SQLite: totals and stream listings from the stream rows,
//! and the health check from the database's own pragmas.
//!
//! Every read goes through the read pool, so inspecting never waits for the
//! writer and never holds the write lock. Nothing reads every event:
//!
//! * a stream's event count is `last_seq - first retained seq + 1` (its
//!   numbering is dense and retention removes only its oldest events, see
//!   [`dense`](mcp_event_store_core::backend::dense)); the first retained `seq` is
//!   one seek on the `(token, seq)` index;
//! * its bytes are the row's running `bytes`, kept by the insert and delete
//!   triggers;
//! * its oldest and newest times are the `stored_at` of those two events
//!   (two more seeks); the store's are the ends of the `stored_at` index.
//!
//! Totals are summed a page of stream rows per statement, so no statement
//! holds a read snapshot (which keeps the WAL from being checkpointed) for
//! longer than one page takes, however many streams there are.

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{Error, Result};
use mcp_event_store_core::{
    HealthReport, Setting, StoreStats, StreamCursor, StreamInfo, StreamPage,
};
use sqlx::Row;

use crate::SqliteStore;
use crate::error::{NAME, db_error};
use crate::options::Durability;

/// Stream rows summed by one statement of [`stats`].
const STATS_PAGE: i64 = 512;

pub(crate) async fn stats(store: &SqliteStore) -> Result<StoreStats> {
    let mut stats = StoreStats::default();
    let mut after: Vec<u8> = Vec::new();
    loop {
        // Per page: rows seen (to know where to go on), then over the
        // rows that still hold an event: streams, events and bytes.
        let row = sqlx::query(
            "SELECT COUNT(*), COUNT(first_seq), \
                 COALESCE(SUM(last_seq - first_seq + 1), 0), \
                 COALESCE(SUM(CASE WHEN first_seq IS NOT NULL THEN bytes END), 0), \
                 MAX(token) \
             FROM (SELECT s.token, s.bytes, s.last_seq, \
                     (SELECT MIN(seq) FROM mes_events e WHERE e.token = s.token) AS first_seq \
                   FROM mes_streams s WHERE s.token > ?1 ORDER BY s.token LIMIT ?2)",
        )
        .bind(&after[..])
        .bind(STATS_PAGE)
        .fetch_one(&store.inner.readers)
        .await
        .map_err(db_error)?;
        let rows: i64 = row.try_get(0).map_err(db_error)?;
        stats.streams += count(row.try_get(1).map_err(db_error)?, "streams")?;
        stats.events += count(row.try_get(2).map_err(db_error)?, "events")?;
        stats.bytes += count(row.try_get(3).map_err(db_error)?, "bytes")?;
        let last: Option<Vec<u8>> = row.try_get(4).map_err(db_error)?;
        match last {
            Some(last) if rows == STATS_PAGE => after = last,
            _ => break,
        }
    }
    // The two ends of the `stored_at` index; one subquery each, so each
    // is a single seek (one statement with both would scan).
    let row = sqlx::query(
        "SELECT (SELECT MIN(stored_at) FROM mes_events), \
                (SELECT MAX(stored_at) FROM mes_events)",
    )
    .fetch_one(&store.inner.readers)
    .await
    .map_err(db_error)?;
    stats.oldest_millis = row.try_get(0).map_err(db_error)?;
    stats.newest_millis = row.try_get(1).map_err(db_error)?;
    if stats.streams == 0 {
        // Read in another snapshot than the totals: keep them agreeing.
        stats.oldest_millis = None;
        stats.newest_millis = None;
    }
    Ok(stats)
}

pub(crate) async fn streams(
    store: &SqliteStore,
    after: Option<&StreamCursor>,
    limit: usize,
) -> Result<StreamPage> {
    // The cursor is the last listed stream's token, in the event ids'
    // own text form; streams are listed in token order.
    let after = match after {
        None => Vec::new(),
        Some(cursor) => StreamToken::parse(cursor.as_str())
            .ok_or_else(|| Error::Config(format!("not a stream cursor of this store: {cursor:?}")))?
            .as_bytes()
            .to_vec(),
    };
    // One more than the limit tells whether another page follows. The
    // join with the first retained event leaves out stream rows with
    // no event (a row whose only events were trimmed away by another
    // process, say). The newest event is never trimmed; should it be
    // gone anyway, the row's `updated_at` is its append time.
    let rows = sqlx::query(
        "SELECT s.token, s.stream_id, s.bytes, s.last_seq - f.seq + 1, f.stored_at, \
             COALESCE(l.stored_at, s.updated_at) \
         FROM mes_streams s \
         JOIN mes_events f ON f.token = s.token \
             AND f.seq = (SELECT MIN(seq) FROM mes_events m WHERE m.token = s.token) \
         LEFT JOIN mes_events l ON l.token = s.token AND l.seq = s.last_seq \
         WHERE s.token > ?1 ORDER BY s.token LIMIT ?2",
    )
    .bind(&after[..])
    .bind(limit as i64 + 1)
    .fetch_all(&store.inner.readers)
    .await
    .map_err(db_error)?;
    let more = rows.len() > limit;
    let mut streams = Vec::with_capacity(limit.min(rows.len()));
    let mut last = None;
    for row in rows.iter().take(limit) {
        let token: Vec<u8> = row.try_get(0).map_err(db_error)?;
        let stream_id: String = row.try_get(1).map_err(db_error)?;
        let bytes = count(row.try_get(2).map_err(db_error)?, "bytes")?;
        let events = count(row.try_get(3).map_err(db_error)?, "events")?;
        let oldest: i64 = row.try_get(4).map_err(db_error)?;
        let newest: i64 = row.try_get(5).map_err(db_error)?;
        streams.push(StreamInfo::new(
            stream_id,
            events,
            bytes,
            Some(oldest),
            Some(newest.max(oldest)),
        ));
        last = Some(token);
    }
    let next = match last.filter(|_| more) {
        Some(token) => Some(StreamCursor::new(
            StreamToken::from_bytes(&token)
                .ok_or_else(|| Error::Corrupt(format!("a stream token of {} bytes", token.len())))?
                .to_text(),
        )),
        None => None,
    };
    Ok(StreamPage::new(streams, next))
}

/// The format version the file holds, and the settings of this
/// handle's connections (all opened with the same options; the writer's,
/// opened through rusqlite, with the same `synchronous`) that decide what a returned append survives and
/// whether the WAL stays bounded.
pub(crate) async fn check(store: &SqliteStore) -> Result<HealthReport> {
    let mut conn = store.inner.readers.acquire().await.map_err(db_error)?;
    let format: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(value AS INTEGER) FROM mes_meta WHERE key = 'format_version'",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db_error)?;
    let format = format
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| Error::Corrupt("the format version record is missing".into()))?;
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
    let checkpoint: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_error)?;
    drop(conn);
    let durability = store.inner.durability;
    Ok(HealthReport::new(
        NAME,
        format,
        vec![
            journal_mode_setting(&journal_mode),
            synchronous_setting(synchronous, durability),
            durability_setting(durability),
            checkpoint_setting(checkpoint),
            Setting::retention(&store.inner.options.retention),
        ],
    ))
}

/// A non-negative count from SQLite.
fn count(value: i64, what: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("a negative count of {what}: {value}")))
}

fn journal_mode_setting(mode: &str) -> Setting {
    let mode = mode.to_ascii_lowercase();
    if mode == "wal" {
        Setting::ok("journal_mode", mode)
    } else {
        Setting::warn(
            "journal_mode",
            mode,
            "Put the file back in WAL mode (PRAGMA journal_mode = WAL, with no other process \
             using it): the store's durability and concurrency are designed for WAL.",
        )
    }
}

/// `PRAGMA synchronous` levels by number.
fn synchronous_name(level: i64) -> String {
    match level {
        0 => "OFF".into(),
        1 => "NORMAL".into(),
        2 => "FULL".into(),
        3 => "EXTRA".into(),
        other => other.to_string(),
    }
}

/// The level a durability asks for (in WAL mode, NORMAL survives the
/// process, FULL also a power loss); anything at or above it is ok.
fn synchronous_setting(level: i64, durability: Durability) -> Setting {
    let (needed, option) = match durability {
        Durability::Process => (1, "process"),
        Durability::PowerLoss => (2, "power_loss"),
    };
    let name = synchronous_name(level);
    if level >= needed {
        Setting::ok("synchronous", name)
    } else {
        Setting::warn(
            "synchronous",
            name,
            format!(
                "durability={option} needs synchronous={} or higher: open the store through \
                 this crate, which sets it on every connection, and let nothing lower it.",
                synchronous_name(needed)
            ),
        )
    }
}

fn durability_setting(durability: Durability) -> Setting {
    match durability {
        Durability::PowerLoss => Setting::ok("durability", "power_loss"),
        Durability::Process => Setting::warn(
            "durability",
            "process",
            "Acknowledged events survive a crash of the process but not a power loss or an \
             operating-system crash; open with durability=power_loss (?durability=power_loss \
             in the URL) if they must.",
        ),
    }
}

/// The WAL is checkpointed back into the database file only by automatic
/// checkpoints; with them off it grows without bound.
fn checkpoint_setting(pages: i64) -> Setting {
    if pages > 0 {
        Setting::ok("wal_autocheckpoint", format!("{pages} pages"))
    } else {
        Setting::warn(
            "wal_autocheckpoint",
            pages.to_string(),
            "Automatic checkpoints are off, so the WAL file grows without bound; leave \
             wal_autocheckpoint at its default (1000 pages).",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_event_store_core::Verdict;

    #[test]
    fn synchronous_is_judged_against_the_durability() {
        assert_eq!(
            synchronous_setting(1, Durability::Process).verdict,
            Verdict::Ok
        );
        assert_eq!(
            synchronous_setting(3, Durability::PowerLoss).verdict,
            Verdict::Ok
        );
        let low = synchronous_setting(1, Durability::PowerLoss);
        assert_eq!(low.value, "NORMAL");
        assert!(matches!(low.verdict, Verdict::Warn { remedy } if remedy.contains("FULL")));
        assert!(matches!(
            synchronous_setting(0, Durability::Process).verdict,
            Verdict::Warn { .. }
        ));
    }

    #[test]
    fn other_journal_modes_and_no_checkpoints_warn() {
        assert_eq!(journal_mode_setting("WAL").value, "wal");
        assert_eq!(journal_mode_setting("wal").verdict, Verdict::Ok);
        assert!(matches!(
            journal_mode_setting("delete").verdict,
            Verdict::Warn { .. }
        ));
        assert_eq!(checkpoint_setting(1000).verdict, Verdict::Ok);
        assert!(matches!(
            checkpoint_setting(0).verdict,
            Verdict::Warn { .. }
        ));
    }
}
