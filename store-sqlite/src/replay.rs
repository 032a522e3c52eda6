//! Replay and lookup (C3, C4, C5): one indexed seek and a range read per
//! page on the `(token, seq)` index, each page read in one read
//! transaction with the stream's row, so a replay whose stream is deleted
//! and started again under it ends in [`Error::EventsPurged`], never in
//! events of the new life. A replay's first page, short, is read on the
//! calling task; the pages after it, and lookups, on the page threads
//! ([`crate::pages`]).

use std::sync::Arc;

use bytes::Bytes;
use mcp_event_store_core::backend::dense::{self, DenseStream};
use mcp_event_store_core::backend::{Page, StreamToken, paged_replay_with, retry_from_millis};
use mcp_event_store_core::{Error, EventId, Replay, ReplayEvents, Result, StoredEvent};
use rusqlite::OptionalExtension;

use crate::SqliteStore;
use crate::error::sqlite_error;
use crate::pages::INLINE_EVENTS;

/// The replay after `cursor` (`raw` as the client sent it): the stream's
/// row and first page in one read, the cursor checked against the row,
/// then pages as they are polled.
pub(crate) async fn replay_after(
    store: &SqliteStore,
    raw: &str,
    cursor: EventId,
) -> Result<Replay> {
    let (incarnation, after) = dense::cursor_parts(raw, cursor.position)?;
    // SQLite integers stop at i64::MAX: beyond it, never issued.
    let after_sql = i64::try_from(after).map_err(|_| Error::unknown_event_id(raw))?;
    let (stream, first_page) = first_page(store, cursor.token, incarnation, after_sql).await?;
    let (stream_id, state) = stream.ok_or_else(|| Error::unknown_event_id(raw))?;
    // Another incarnation (an earlier life of the stream), a zero part or
    // a sequence number beyond the newest: never issued.
    dense::check_cursor(raw, &cursor, state)?;
    let first = first_page.first().map(|e| e.id.position.minor);
    dense::check_page(raw, after, first, Some(state.last_seq))?;
    let first_page = page(first_page, Some(state.last_seq), first_limit(store));
    let events = pages(
        store,
        raw.into(),
        cursor.token,
        incarnation,
        after,
        first_page,
    );
    Ok(Replay { stream_id, events })
}

/// Every retained event of a stream, from its oldest (C16): the stream's
/// row and first page in one statement, then pages as a replay after the
/// event before the oldest, with the same gap checks.
pub(crate) async fn replay_whole(store: &SqliteStore, stream_id: &str) -> Result<Replay> {
    let token = store.inner.key.token(stream_id);
    // Named under incarnation 0 until the row says which it is.
    let (stream, first_page) = first_page(store, token, 0, 0).await?;
    let Some((_, state)) = stream else {
        return Ok(Replay::empty(stream_id));
    };
    let Some(first) = state.first_retained else {
        return Ok(Replay::empty(stream_id));
    };
    let incarnation = state.incarnation;
    let first_page: Vec<StoredEvent> = first_page
        .into_iter()
        .map(|mut e| {
            e.id.position.major = incarnation;
            e
        })
        .collect();
    let after = first - 1;
    let raw: Arc<str> = EventId::new(token, dense::position(incarnation, first))
        .to_string()
        .into();
    dense::check_page(
        &raw,
        after,
        first_page.first().map(|e| e.id.position.minor),
        Some(state.last_seq),
    )?;
    let first_page = page(first_page, Some(state.last_seq), first_limit(store));
    Ok(Replay {
        stream_id: stream_id.to_owned(),
        events: pages(store, raw, token, incarnation, after, first_page),
    })
}

/// The events after `after`: `first`, then pages read as they are polled,
/// each checked against the stream's row; `raw` names the replay in errors.
fn pages(
    store: &SqliteStore,
    raw: Arc<str>,
    token: StreamToken,
    incarnation: u64,
    after: u64,
    first: Page,
) -> ReplayEvents {
    let store = store.clone();
    paged_replay_with(dense::position(incarnation, after), first, move |after| {
        let (store, raw) = (store.clone(), raw.clone());
        async move { checked_page(&store, &raw, token, incarnation, after.minor).await }
    })
}

/// The stream of a retained event (C4), in the stream's current
/// incarnation: an id of an earlier life of the stream finds nothing.
pub(crate) async fn stream_of(store: &SqliteStore, id: EventId) -> Result<Option<String>> {
    // A zero part was never issued; neither was anything SQLite cannot
    // hold.
    let Some((Ok(incarnation), Ok(seq))) = dense::parts(id.position)
        .map(|(incarnation, seq)| (i64::try_from(incarnation), i64::try_from(seq)))
    else {
        return Ok(None);
    };
    // On a page thread, as a resume's replay that usually follows.
    let token = id.token;
    store
        .inner
        .pages
        .run(move |conn| {
            conn.prepare_cached(STREAM_OF_EVENT)
                .and_then(|mut statement| {
                    statement
                        .query_row(
                            rusqlite::params![&token.as_bytes()[..], seq, incarnation],
                            |row| row.get(0),
                        )
                        .optional()
                })
                .map_err(sqlite_error)
        })
        .await
}

/// The id of the stream that holds an event, in the stream's current
/// incarnation.
const STREAM_OF_EVENT: &str = "SELECT s.stream_id FROM mes_events e \
     JOIN mes_streams s ON s.token = e.token \
     WHERE e.token = ?1 AND e.seq = ?2 AND s.incarnation = ?3";

/// One page of a stream's events after sequence number `after`, read on
/// a page thread in one read transaction (so one snapshot) with the
/// stream's row: its id and state, for the cursor and gap checks. The
/// events are named under `incarnation`, the cursor's; they are only used
/// when the row says that is the stream's current incarnation (every event
/// of a token belongs to the current row: a stream's events go before or
/// with its row). `None` for the row: no such stream, and then no events.
async fn page_with_stream(
    store: &SqliteStore,
    token: StreamToken,
    incarnation: u64,
    after: i64,
) -> Result<PageWithStream> {
    let limit = i64::try_from(store.inner.options.page_size).unwrap_or(i64::MAX);
    store
        .inner
        .pages
        .run(move |conn| read_page(conn, token, incarnation, after, limit))
        .await
}

/// A replay's first page, as [`page_with_stream`] reads it but short
/// ([`first_limit`]), so that it is read on the calling task: most resumes
/// miss a few events and then cost no thread hop.
async fn first_page(
    store: &SqliteStore,
    token: StreamToken,
    incarnation: u64,
    after: i64,
) -> Result<PageWithStream> {
    let limit = i64::try_from(first_limit(store)).unwrap_or(i64::MAX);
    store
        .inner
        .pages
        .run_short(move |conn| read_page(conn, token, incarnation, after, limit))
        .await
}

/// The most events a replay's first page holds.
fn first_limit(store: &SqliteStore) -> usize {
    store.inner.options.page_size.min(INLINE_EVENTS)
}

/// A replay page after the first, checked for gaps (C5) against the
/// stream's row as of the same snapshot. A stream that is gone, or that
/// was deleted and started again under a new incarnation, lost the events
/// after the cursor: [`Error::EventsPurged`], never events of its new
/// life. Once the handle is closed the page threads are, and the page is
/// [`Error::Closed`].
async fn checked_page(
    store: &SqliteStore,
    raw: &str,
    token: StreamToken,
    incarnation: u64,
    after: u64,
) -> Result<Page> {
    let (stream, events) = page_with_stream(store, token, incarnation, from_seq(after)?).await?;
    let Some((_, state)) = stream.filter(|(_, state)| state.incarnation == incarnation) else {
        // The rows read, if any, are the new life's.
        return Err(Error::events_purged(raw));
    };
    let first = events.first().map(|e| e.id.position.minor);
    dense::check_page(raw, after, first, Some(state.last_seq))?;
    Ok(page(
        events,
        Some(state.last_seq),
        store.inner.options.page_size,
    ))
}

/// A checked page read with `limit`; the last when it is short or reaches
/// the stream's newest event as of its snapshot (later events reach a
/// client live).
fn page(events: Vec<StoredEvent>, last_seq: Option<u64>, limit: usize) -> Page {
    let reached_end = events
        .last()
        .zip(last_seq)
        .is_some_and(|(event, last_seq)| event.id.position.minor >= last_seq);
    Page {
        last: reached_end || events.len() < limit,
        events,
    }
}

/// What [`page_with_stream`] reads, on a page thread: the
/// stream's row, then the page, in one read transaction, so one snapshot.
fn read_page(
    conn: &rusqlite::Connection,
    token: StreamToken,
    incarnation: u64,
    after: i64,
    limit: i64,
) -> Result<PageWithStream> {
    let token_bytes = &token.as_bytes()[..];
    read_snapshot(conn, || {
        let stream = conn
            .prepare_cached(STREAM_ROW)
            .map_err(sqlite_error)?
            .query_row([token_bytes], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, Option<i64>>(3)?,
                ))
            })
            .optional()
            .map_err(sqlite_error)?
            .map(|(stream_id, incarnation, last_seq, first_retained)| {
                Ok::<_, Error>((
                    stream_id,
                    DenseStream {
                        incarnation: to_incarnation(incarnation)?,
                        last_seq: to_seq(last_seq)?,
                        first_retained: first_retained.map(to_seq).transpose()?,
                    },
                ))
            })
            .transpose()?;
        let mut events = Vec::new();
        if stream.is_some() {
            let mut statement = conn.prepare_cached(PAGE).map_err(sqlite_error)?;
            let mut rows = statement
                .query(rusqlite::params![token_bytes, after, limit])
                .map_err(sqlite_error)?;
            while let Some(row) = rows.next().map_err(sqlite_error)? {
                events.push(event_from_row(token, incarnation, row)?);
            }
        }
        Ok((stream, events))
    })
}

/// Runs `read` in one read transaction on `conn`: every statement in it
/// sees the same snapshot. (`BEGIN` and `COMMIT` as cached statements:
/// rusqlite's transaction parses them anew each time.)
pub(crate) fn read_snapshot<T>(
    conn: &rusqlite::Connection,
    read: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if !conn.is_autocommit() {
        // A read that failed part way left its transaction open.
        conn.execute_batch("ROLLBACK").map_err(sqlite_error)?;
    }
    conn.prepare_cached("BEGIN")
        .and_then(|mut begin| begin.execute([]))
        .map_err(sqlite_error)?;
    let read = read();
    let ended = conn
        .prepare_cached("COMMIT")
        .and_then(|mut commit| commit.execute([]));
    let value = read?;
    ended.map_err(sqlite_error)?;
    Ok(value)
}

/// A stream's row: its id, incarnation, newest and oldest retained
/// sequence numbers.
pub(crate) const STREAM_ROW: &str = "SELECT stream_id, incarnation, last_seq, \
         (SELECT MIN(seq) FROM mes_events WHERE token = ?1) \
     FROM mes_streams WHERE token = ?1";

/// A page of a stream's events after a sequence number.
const PAGE: &str = "SELECT seq, retry_ms, payload FROM mes_events \
     WHERE token = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";

/// A page of events, and the stream's row (its id and state) if it exists.
type PageWithStream = (Option<(String, DenseStream)>, Vec<StoredEvent>);

/// An event of incarnation `incarnation` from a row whose first columns are
/// `seq, retry_ms, payload`.
fn event_from_row(
    token: StreamToken,
    incarnation: u64,
    row: &rusqlite::Row<'_>,
) -> Result<StoredEvent> {
    let seq: i64 = row.get(0).map_err(sqlite_error)?;
    let retry: Option<i64> = row.get(1).map_err(sqlite_error)?;
    let payload = row
        .get_ref(2)
        .map_err(sqlite_error)?
        .as_bytes()
        .map_err(|e| Error::Corrupt(format!("event {seq}'s payload: {e}")))?;
    Ok(StoredEvent {
        id: EventId::new(token, dense::position(incarnation, to_seq(seq)?)),
        data: Bytes::copy_from_slice(payload),
        retry: retry_from_millis(retry),
    })
}

fn to_seq(value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("negative sequence number {value}")))
}

/// A stored incarnation; they start at 1, so 0 or less is damage.
pub(crate) fn to_incarnation(value: i64) -> Result<u64> {
    u64::try_from(value)
        .ok()
        .filter(|&incarnation| incarnation != 0)
        .ok_or_else(|| Error::Corrupt(format!("stream incarnation {value} is not positive")))
}

fn from_seq(value: u64) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| Error::Corrupt(format!("sequence number {value} out of range")))
}
