//! Appends (C1, C2, C6): the store's side (the stream token, the write
//! queued for the writer) and the writer's (the stream row and its
//! incarnation, the sequence number, a group's multi-row insert, the inline
//! trim to the retention limits).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mcp_event_store_core::backend::{StreamToken, dense, retry_to_millis};
use mcp_event_store_core::{Error, EventId, NewEvent, Position, Result};
use rusqlite::{OptionalExtension, ToSql, params, params_from_iter};

use crate::SqliteStore;
use crate::error::{NAME, sqlite_error};
use crate::purge::trim_stream;
use crate::replay::to_incarnation;
use crate::writer::{Append, Known, Writer, padded};

/// Appends one event: the write queued for the writer, answered once
/// committed.
pub(crate) async fn append(
    store: &SqliteStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    let token = store.inner.key.token(stream_id);
    let position = store
        .inner
        .writer
        .append(Append {
            token,
            stream_id: stream_id.to_owned(),
            data: event.data.to_vec(),
            retry_ms: retry_to_millis(event.retry),
            now: store.now(),
        })
        .await?;
    Ok(EventId::new(token, position))
}

impl Writer {
    /// Makes sure the stream's row exists and belongs to `stream_id`, and
    /// returns what this writer now knows of it. A new row takes the next
    /// incarnation of the store-wide counter; the counter moves in the same
    /// statement (a trigger), under SQLite's write lock, so two writers,
    /// even in two processes, never take the same one.
    fn ensure_stream(&mut self, token: StreamToken, stream_id: &str, now: i64) -> Result<Known> {
        let (stored_stream, incarnation, bytes): (String, i64, i64) = self
            .conn
            .prepare_cached(
                "INSERT INTO mes_streams (token, stream_id, incarnation, last_seq, bytes, \
                     updated_at) \
                 VALUES (?1, ?2, (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                     0, 0, ?3) \
                 ON CONFLICT (token) DO UPDATE SET token = excluded.token \
                 RETURNING stream_id, incarnation, bytes",
            )
            .and_then(|mut statement| {
                statement.query_row(params![&token.as_bytes()[..], stream_id, now], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
            })
            .map_err(sqlite_error)?;
        if stored_stream != stream_id {
            return Err(Error::Corrupt(format!(
                "stream token collision between {stored_stream:?} and {stream_id:?}"
            )));
        }
        let known = Known { incarnation, bytes };
        self.remember(token, known);
        Ok(known)
    }

    /// Appends one event. In the steady state this is one statement: the
    /// sequence number comes from the stream row (if it is still the
    /// incarnation this writer knows), and a trigger moves the row along.
    pub(crate) fn append(&mut self, append: &Append, in_transaction: bool) -> Result<Position> {
        let Append {
            token,
            ref stream_id,
            ref data,
            retry_ms,
            now,
        } = *append;
        let mut known = match self.known.get(&token) {
            Some(known) => *known,
            None => self.ensure_stream(token, stream_id, now)?,
        };
        let mut seq = self.insert_event(token, known.incarnation, data, retry_ms, now)?;
        if seq.is_none() {
            // The row went away (deleted or expired, perhaps by another
            // process, and perhaps started again under a new incarnation)
            // since this writer last saw it.
            self.known.remove(&token);
            known = self.ensure_stream(token, stream_id, now)?;
            seq = self.insert_event(token, known.incarnation, data, retry_ms, now)?;
        }
        let seq =
            seq.ok_or_else(|| Error::Corrupt("stream row vanished during an append".into()))?;
        known.bytes += data.len() as i64;
        self.remember(token, known);
        match trim_stream(
            &self.conn,
            &token.as_bytes()[..],
            seq,
            known.bytes,
            self.retention,
        ) {
            Ok((_, Some(bytes))) => self.remember(token, Known { bytes, ..known }),
            Ok((_, None)) => {}
            Err(e) if in_transaction => return Err(e),
            // The event is committed; trimming is retried by the next
            // append or purge.
            Err(e) => tracing::warn!(error = %e, "trimming a stream after an append failed"),
        }
        position(known.incarnation, seq)
    }

    /// Appends a run of events inside the group's transaction with a
    /// constant number of statements, however many there are: one read of
    /// the streams' state, one multi-row insert per [`MAX_ROWS`] events, and
    /// the trims. Under the write lock nobody else can move the streams, so
    /// sequence numbers are assigned here, in arrival order. Returns one
    /// answer per write; a token collision fails only its own write, while a
    /// database error fails them all (and the caller rolls the group back).
    pub(crate) fn append_run(&mut self, appends: &[&Append]) -> Vec<Result<Position>> {
        match self.try_append_run(appends) {
            Ok(answers) => answers,
            Err(e) => {
                let e = Arc::new(e);
                appends
                    .iter()
                    .map(|_| Err(Error::backend(NAME, e.clone())))
                    .collect()
            }
        }
    }

    fn try_append_run(
        &mut self,
        appends: &[&Append],
    ) -> std::result::Result<Vec<Result<Position>>, Error> {
        let mut streams: HashMap<StreamToken, RunStream> = HashMap::new();
        let tokens: Vec<StreamToken> = {
            let mut seen = HashSet::new();
            appends
                .iter()
                .map(|a| a.token)
                .filter(|t| seen.insert(*t))
                .collect()
        };
        for chunk in tokens.chunks(MAX_ROWS) {
            let mut statement = self
                .conn
                .prepare_cached(&select_streams_sql(chunk.len()))
                .map_err(sqlite_error)?;
            let marks = (0..padded(chunk.len())).map(|i| chunk.get(i).map(|t| &t.as_bytes()[..]));
            let mut rows = statement
                .query(params_from_iter(marks))
                .map_err(sqlite_error)?;
            while let Some(row) = rows.next().map_err(sqlite_error)? {
                let token: Vec<u8> = row.get(0).map_err(sqlite_error)?;
                let token = chunk
                    .iter()
                    .find(|t| t.as_bytes()[..] == token[..])
                    .copied()
                    .ok_or_else(|| Error::Corrupt("a stream row the run did not ask for".into()))?;
                streams.insert(
                    token,
                    RunStream {
                        stream_id: row.get(1).map_err(sqlite_error)?,
                        incarnation: row.get(2).map_err(sqlite_error)?,
                        last_seq: row.get(3).map_err(sqlite_error)?,
                        bytes: row.get(4).map_err(sqlite_error)?,
                    },
                );
            }
        }

        // Assign sequence numbers in arrival order; new streams get a row
        // and an incarnation first (rare: once per stream's life).
        let mut answers = Vec::with_capacity(appends.len());
        let mut rows: Vec<(StreamToken, i64, &Append)> = Vec::with_capacity(appends.len());
        for append in appends {
            let stream = match streams.entry(append.token) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(new) => {
                    let incarnation: i64 = self
                        .conn
                        .prepare_cached(
                            "INSERT INTO mes_streams \
                                 (token, stream_id, incarnation, last_seq, bytes, updated_at) \
                             VALUES (?1, ?2, \
                                 (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                                 0, 0, ?3) \
                             RETURNING incarnation",
                        )
                        .and_then(|mut statement| {
                            statement.query_row(
                                params![
                                    &append.token.as_bytes()[..],
                                    &append.stream_id,
                                    append.now
                                ],
                                |row| row.get(0),
                            )
                        })
                        .map_err(sqlite_error)?;
                    new.insert(RunStream {
                        stream_id: append.stream_id.to_owned(),
                        incarnation,
                        last_seq: 0,
                        bytes: 0,
                    })
                }
            };
            if stream.stream_id != append.stream_id {
                answers.push(Err(Error::Corrupt(format!(
                    "stream token collision between {:?} and {:?}",
                    stream.stream_id, append.stream_id
                ))));
                continue;
            }
            stream.last_seq += 1;
            stream.bytes += append.data.len() as i64;
            rows.push((append.token, stream.last_seq, append));
            answers.push(position(stream.incarnation, stream.last_seq));
        }

        for chunk in rows.chunks(MAX_ROWS) {
            let mut statement = self
                .conn
                .prepare_cached(&insert_events_sql(chunk.len()))
                .map_err(sqlite_error)?;
            let mut mark = 0;
            let mut bind = |value: &dyn ToSql| {
                mark += 1;
                statement.raw_bind_parameter(mark, value)
            };
            for i in 0..padded(chunk.len()) {
                let row = chunk.get(i);
                bind(&row.map(|(token, _, _)| &token.as_bytes()[..]))
                    .and_then(|()| bind(&row.map(|(_, seq, _)| *seq)))
                    .and_then(|()| bind(&row.map(|(_, _, a)| a.now)))
                    .and_then(|()| bind(&row.and_then(|(_, _, a)| a.retry_ms)))
                    .and_then(|()| bind(&row.map(|(_, _, a)| &a.data[..])))
                    .map_err(sqlite_error)?;
            }
            let inserted = statement.raw_execute().map_err(sqlite_error)?;
            if inserted != chunk.len() {
                return Err(Error::Corrupt(format!(
                    "inserted {inserted} of {} events",
                    chunk.len()
                )));
            }
        }

        for token in tokens {
            let Some(stream) = streams.get(&token) else {
                continue;
            };
            let (_, bytes) = trim_stream(
                &self.conn,
                &token.as_bytes()[..],
                stream.last_seq,
                stream.bytes,
                self.retention,
            )?;
            self.remember(
                token,
                Known {
                    incarnation: stream.incarnation,
                    bytes: bytes.unwrap_or(stream.bytes),
                },
            );
        }
        Ok(answers)
    }

    /// Inserts an event after the stream's newest, if the stream row is
    /// still in `incarnation`; `None` if it is not (or is gone).
    fn insert_event(
        &self,
        token: StreamToken,
        incarnation: i64,
        data: &[u8],
        retry_ms: Option<i64>,
        now: i64,
    ) -> Result<Option<i64>> {
        self.conn
            .prepare_cached(
                "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
                 SELECT token, last_seq + 1, ?3, ?4, ?5 FROM mes_streams \
                 WHERE token = ?1 AND incarnation = ?2 \
                 RETURNING seq",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(
                        params![&token.as_bytes()[..], incarnation, now, retry_ms, data],
                        |row| row.get(0),
                    )
                    .optional()
            })
            .map_err(sqlite_error)
    }
}

/// Events one multi-row insert carries at most (5 parameters each).
const MAX_ROWS: usize = 128;

/// A stream's state while a run is assigned sequence numbers.
struct RunStream {
    stream_id: String,
    incarnation: i64,
    last_seq: i64,
    bytes: i64,
}

fn select_streams_sql(tokens: usize) -> String {
    let marks = vec!["?"; padded(tokens)].join(", ");
    format!(
        "SELECT token, stream_id, incarnation, last_seq, bytes FROM mes_streams \
         WHERE token IN ({marks})"
    )
}

fn insert_events_sql(rows: usize) -> String {
    let values = vec!["(?, ?, ?, ?, ?)"; padded(rows)].join(", ");
    // `column1` is the token: padding rows are all NULL and are skipped.
    format!(
        "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
         SELECT column1, column2, column3, column4, column5 FROM (VALUES {values}) \
         WHERE column1 IS NOT NULL"
    )
}

/// The id position of event `seq` of a stream in `incarnation`, both as
/// stored.
fn position(incarnation: i64, seq: i64) -> Result<Position> {
    let seq = u64::try_from(seq).map_err(|_| Error::Corrupt(format!("negative sequence {seq}")))?;
    Ok(dense::position(to_incarnation(incarnation)?, seq))
}
