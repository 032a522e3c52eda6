//! Replay (C3, C5) and lookup (C4): one statement per page, keyset over
//! the `(token, seq)` primary key, with the stream's row in the same
//! snapshot, checked by `dense::check_cursor` and `dense::check_page` so a
//! replay never has a silent gap.

use bytes::Bytes;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};

use mcp_event_store_core::backend::dense::{self, DenseStream};
use mcp_event_store_core::backend::{
    Page, StreamToken, paged_replay, paged_replay_with, retry_from_millis,
};
use mcp_event_store_core::{Error, EventId, Position, Replay, ReplayEvents, Result, StoredEvent};

use crate::PostgresStore;
use crate::error::backend;

/// Opens a replay after `cursor`, the event id `raw`
/// (`replay_events_after`): the first page comes with the cursor check, in
/// one round trip.
pub(crate) async fn replay_after(
    store: &PostgresStore,
    raw: &str,
    cursor: EventId,
) -> Result<Replay> {
    let (incarnation, after) = dense::cursor_parts(raw, cursor.position)?;
    // Stored numbers are positive BIGINTs: a larger one was never issued.
    if i64::try_from(incarnation).is_err() || i64::try_from(after).is_err() {
        return Err(Error::unknown_event_id(raw));
    }
    let at = PageAt {
        token: cursor.token,
        incarnation,
        after,
    };
    let mut page = fetch_page(
        store.pool().clone(),
        store.sql().page.clone(),
        at,
        store.page_size(),
        true,
    )
    .await?;
    let Some(mut header) = page.header.take() else {
        return Err(Error::unknown_event_id(raw));
    };
    let stream_id = header
        .stream_id
        .take()
        .ok_or_else(|| Error::Corrupt("stream row without a stream id".into()))?;
    // Another incarnation (an earlier life of the stream, or a forgery),
    // a sequence number beyond the newest: never issued, unknown.
    dense::check_cursor(raw, &cursor, header.dense())?;
    page.header = Some(header);
    let first = page.into_page(raw, at, store.page_size())?;
    let events = pages(store, raw.to_owned(), at, Some(first));
    Ok(Replay { stream_id, events })
}

/// Every retained event of a stream from its oldest (C16): its row, then
/// pages as a replay after the event before the oldest, with the same gap
/// checks.
pub(crate) async fn replay_whole(store: &PostgresStore, stream_id: &str) -> Result<Replay> {
    let token = store.key().token(stream_id);
    let row: Option<PgRow> = sqlx::query(store.sql().lookup.clone())
        .bind(&token.as_bytes()[..])
        .fetch_optional(store.pool())
        .await
        .map_err(backend)?;
    let Some(row) = row else {
        return Ok(Replay::empty(stream_id));
    };
    let incarnation = stored_number(row.try_get(1).map_err(backend)?)?;
    let first_seq: i64 = row.try_get(2).map_err(backend)?;
    let last_seq: i64 = row.try_get(3).map_err(backend)?;
    if first_seq > last_seq {
        return Ok(Replay::empty(stream_id));
    }
    let first_seq = stored_number(first_seq)?;
    let at = PageAt {
        token,
        incarnation,
        after: first_seq - 1,
    };
    let raw = EventId::new(token, dense::position(incarnation, first_seq)).to_string();
    Ok(Replay {
        stream_id: stream_id.to_owned(),
        events: pages(store, raw, at, None),
    })
}

/// The events from `at` on, page by page, starting with `first` if it was
/// read already; `raw` names the replay in errors.
fn pages(store: &PostgresStore, raw: String, at: PageAt, first: Option<Page>) -> ReplayEvents {
    let pool = store.pool().clone();
    let sql = store.sql().page.clone();
    let limit = store.page_size();
    let fetch = move |position: Position| {
        let (pool, sql, raw) = (pool.clone(), sql.clone(), raw.clone());
        let at = PageAt {
            after: position.minor,
            ..at
        };
        async move {
            fetch_page(pool, sql, at, limit, false)
                .await?
                .into_page(&raw, at, limit)
        }
    };
    let start = dense::position(at.incarnation, at.after);
    match first {
        Some(first) => paged_replay_with(start, first, fetch),
        None => paged_replay(start, fetch),
    }
}

/// The stream of a retained event (`get_stream_id_for_event_id`); `None`
/// for anything never issued or expired.
pub(crate) async fn stream_of(store: &PostgresStore, id: EventId) -> Result<Option<String>> {
    if dense::parts(id.position).is_none() {
        // A zero part: never issued, no need to ask.
        return Ok(None);
    }
    let row: Option<PgRow> = sqlx::query(store.sql().lookup.clone())
        .bind(&id.token.as_bytes()[..])
        .fetch_optional(store.pool())
        .await
        .map_err(backend)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let stream_id: Vec<u8> = row.try_get(0).map_err(backend)?;
    let incarnation: i64 = row.try_get(1).map_err(backend)?;
    let first_seq: i64 = row.try_get(2).map_err(backend)?;
    let last_seq: i64 = row.try_get(3).map_err(backend)?;
    let stream = Header {
        incarnation: stored_number(incarnation)?,
        first_seq: first_seq as u64,
        last_seq: last_seq as u64,
        stream_id: None,
    };
    if stream.dense().retains(id.position) {
        decode_id(stream_id).map(Some)
    } else {
        Ok(None)
    }
}

/// A stored incarnation or sequence number as the `u64` an id carries;
/// the schema keeps them positive.
pub(crate) fn stored_number(n: i64) -> Result<u64> {
    u64::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::Corrupt(format!("stored incarnation or sequence number {n}")))
}

/// Decodes a stored stream or session id.
pub(crate) fn decode_id(bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Corrupt("stored stream id is not UTF-8".into()))
}

/// Where a page starts: after sequence number `after` of the stream's
/// incarnation `incarnation`.
#[derive(Clone, Copy)]
struct PageAt {
    token: StreamToken,
    incarnation: u64,
    after: u64,
}

/// The stream's row, as the page statement read it.
struct Header {
    incarnation: u64,
    first_seq: u64,
    last_seq: u64,
    stream_id: Option<String>,
}

impl Header {
    fn dense(&self) -> DenseStream {
        DenseStream {
            incarnation: self.incarnation,
            last_seq: self.last_seq,
            first_retained: (self.first_seq <= self.last_seq).then_some(self.first_seq),
        }
    }
}

/// The rows of one page query, before the gap checks.
struct RawPage {
    header: Option<Header>,
    events: Vec<(u64, Option<i64>, Bytes)>,
}

impl RawPage {
    /// Orders the page (the query's branches are not ordered against each
    /// other) and applies the gap check (C5). A stream that is gone, or is
    /// in another incarnation (deleted or expired under the replay, perhaps
    /// started again), is [`Error::EventsPurged`]: the rest of the replay's
    /// stream is lost, and nothing of the new life belongs to it.
    fn into_page(mut self, raw: &str, at: PageAt, limit: i64) -> Result<Page> {
        let PageAt {
            token,
            incarnation,
            after,
        } = at;
        if self
            .header
            .as_ref()
            .is_none_or(|h| h.incarnation != incarnation)
        {
            return Err(Error::events_purged(raw));
        }
        self.events.sort_unstable_by_key(|(seq, _, _)| *seq);
        let first = self.events.first().map(|(seq, _, _)| *seq);
        dense::check_page(raw, after, first, self.header.as_ref().map(|h| h.last_seq))?;
        // Dense numbering: a hole inside a page would be corruption.
        for (offset, (seq, _, _)) in self.events.iter().enumerate() {
            if *seq != after + 1 + offset as u64 {
                return Err(Error::Corrupt(format!(
                    "event {seq} of stream {token} is out of sequence"
                )));
            }
        }
        // Short page, or the stream's newest event: no need to ask again.
        let last = (self.events.len() as i64) < limit
            || self.header.as_ref().is_some_and(|h| {
                self.events
                    .last()
                    .is_some_and(|(seq, _, _)| *seq >= h.last_seq)
            });
        let events = self
            .events
            .into_iter()
            .map(|(seq, retry, data)| StoredEvent {
                id: EventId::new(token, dense::position(incarnation, seq)),
                data,
                retry: retry_from_millis(retry),
            })
            .collect();
        Ok(Page { events, last })
    }
}

/// Runs the page statement. `at`'s numbers fit a BIGINT (checked when the
/// replay opened; later cursors come from stored rows).
async fn fetch_page(
    pool: PgPool,
    sql: sqlx::SqlStr,
    at: PageAt,
    limit: i64,
    with_stream_id: bool,
) -> Result<RawPage> {
    let rows: Vec<PgRow> = sqlx::query(sql)
        .bind(&at.token.as_bytes()[..])
        .bind(at.after as i64)
        .bind(limit)
        .bind(with_stream_id)
        .bind(at.incarnation as i64)
        .fetch_all(&pool)
        .await
        .map_err(backend)?;
    let mut page = RawPage {
        header: None,
        events: Vec::with_capacity(rows.len()),
    };
    for row in rows {
        let seq: Option<i64> = row.try_get(0).map_err(backend)?;
        match seq {
            Some(seq) => {
                let retry: Option<i64> = row.try_get(1).map_err(backend)?;
                let data: Vec<u8> = row.try_get(2).map_err(backend)?;
                page.events.push((seq as u64, retry, Bytes::from(data)));
            }
            None => {
                let incarnation: i64 = row.try_get(3).map_err(backend)?;
                let first_seq: i64 = row.try_get(4).map_err(backend)?;
                let last_seq: i64 = row.try_get(5).map_err(backend)?;
                let stream_id: Option<Vec<u8>> = row.try_get(6).map_err(backend)?;
                page.header = Some(Header {
                    incarnation: stored_number(incarnation)?,
                    first_seq: first_seq as u64,
                    last_seq: last_seq as u64,
                    stream_id: stream_id.map(decode_id).transpose()?,
                });
            }
        }
    }
    Ok(page)
}
