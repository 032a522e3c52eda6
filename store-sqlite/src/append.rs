//! Appends (C1, C2, C6): the store's side (checks, the stream token, the
//! write queued for the writer) and the writer's (the stream row and its
//! incarnation, the sequence number, a group's multi-row insert, the inline
//! trim to the retention limits).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use mcp_event_store_core::backend::{StreamToken, dense, observe, retry_to_millis};
use mcp_event_store_core::{Error, EventId, NewEvent, Position, Result};
use sqlx::{AssertSqlSafe, Row};

use crate::SqliteStore;
use crate::error::{NAME, db_error};
use crate::purge::trim_stream;
use crate::replay::to_incarnation;
use crate::writer::{Answer, Append, Known, Reply, Write, Writer, padded};

pub(crate) async fn store_event(
    store: &SqliteStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    observe::append(NAME, stream_id, event.data.len(), async {
        store
            .inner
            .options
            .check_append(stream_id, event.data.len())?;
        let token = store.inner.key.token(stream_id);
        let position = store
            .write(
                Reply::Position,
                Write::Append(Append {
                    token,
                    stream_id: stream_id.to_owned(),
                    data: event.data.to_vec(),
                    retry_ms: retry_to_millis(event.retry),
                    now: store.now(),
                }),
            )
            .await?;
        Ok(EventId::new(token, position))
    })
    .await
}

impl Writer {
    /// Makes sure the stream's row exists and belongs to `stream_id`, and
    /// returns what this writer now knows of it. A new row takes the next
    /// incarnation of the store-wide counter; the counter moves in the same
    /// statement (a trigger), under SQLite's write lock, so two writers,
    /// even in two processes, never take the same one.
    async fn ensure_stream(
        &mut self,
        token: StreamToken,
        stream_id: &str,
        now: i64,
    ) -> Result<Known> {
        let row = sqlx::query(
            "INSERT INTO mes_streams (token, stream_id, incarnation, last_seq, bytes, updated_at) \
             VALUES (?1, ?2, (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                 0, 0, ?3) \
             ON CONFLICT (token) DO UPDATE SET token = excluded.token \
             RETURNING stream_id, incarnation, bytes",
        )
        .bind(&token.as_bytes()[..])
        .bind(stream_id)
        .bind(now)
        .fetch_one(&mut self.conn)
        .await
        .map_err(db_error)?;
        let stored_stream: &str = row.try_get(0).map_err(db_error)?;
        if stored_stream != stream_id {
            return Err(Error::Corrupt(format!(
                "stream token collision between {stored_stream:?} and {stream_id:?}"
            )));
        }
        let known = Known {
            incarnation: row.try_get(1).map_err(db_error)?,
            bytes: row.try_get(2).map_err(db_error)?,
        };
        self.remember(token, known);
        Ok(known)
    }

    /// Appends one event. In the steady state this is one statement: the
    /// sequence number comes from the stream row (if it is still the
    /// incarnation this writer knows), and a trigger moves the row along.
    pub(crate) async fn append(
        &mut self,
        append: &Append,
        in_transaction: bool,
    ) -> Result<Position> {
        let Append {
            token,
            ref stream_id,
            ref data,
            retry_ms,
            now,
        } = *append;
        let mut known = match self.known.get(&token) {
            Some(known) => *known,
            None => self.ensure_stream(token, stream_id, now).await?,
        };
        let mut seq = self
            .insert_event(token, known.incarnation, data, retry_ms, now)
            .await?;
        if seq.is_none() {
            // The row went away (deleted or expired, perhaps by another
            // process, and perhaps started again under a new incarnation)
            // since this writer last saw it.
            self.known.remove(&token);
            known = self.ensure_stream(token, stream_id, now).await?;
            seq = self
                .insert_event(token, known.incarnation, data, retry_ms, now)
                .await?;
        }
        let seq =
            seq.ok_or_else(|| Error::Corrupt("stream row vanished during an append".into()))?;
        known.bytes += data.len() as i64;
        self.remember(token, known);
        match trim_stream(
            &mut self.conn,
            &token.as_bytes()[..],
            seq,
            known.bytes,
            self.retention,
        )
        .await
        {
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
    pub(crate) async fn append_run(&mut self, appends: &[&Append]) -> Vec<Result<Answer>> {
        match self.try_append_run(appends).await {
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

    async fn try_append_run(
        &mut self,
        appends: &[&Append],
    ) -> std::result::Result<Vec<Result<Answer>>, Error> {
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
            let sql = select_streams_sql(chunk.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for i in 0..padded(chunk.len()) {
                query = query.bind(chunk.get(i).map(|t| &t.as_bytes()[..]));
            }
            for row in query.fetch_all(&mut self.conn).await.map_err(db_error)? {
                let token: Vec<u8> = row.try_get(0).map_err(db_error)?;
                let token = chunk
                    .iter()
                    .find(|t| t.as_bytes()[..] == token[..])
                    .copied()
                    .ok_or_else(|| Error::Corrupt("a stream row the run did not ask for".into()))?;
                streams.insert(
                    token,
                    RunStream {
                        stream_id: row.try_get(1).map_err(db_error)?,
                        incarnation: row.try_get(2).map_err(db_error)?,
                        last_seq: row.try_get(3).map_err(db_error)?,
                        bytes: row.try_get(4).map_err(db_error)?,
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
                    let incarnation: i64 = sqlx::query_scalar(
                        "INSERT INTO mes_streams \
                             (token, stream_id, incarnation, last_seq, bytes, updated_at) \
                         VALUES (?1, ?2, \
                             (SELECT value + 1 FROM mes_meta WHERE key = 'last_incarnation'), \
                             0, 0, ?3) \
                         RETURNING incarnation",
                    )
                    .bind(&append.token.as_bytes()[..])
                    .bind(&append.stream_id[..])
                    .bind(append.now)
                    .fetch_one(&mut self.conn)
                    .await
                    .map_err(db_error)?;
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
            answers.push(position(stream.incarnation, stream.last_seq).map(Answer::Position));
        }

        for chunk in rows.chunks(MAX_ROWS) {
            let sql = insert_events_sql(chunk.len());
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for i in 0..padded(chunk.len()) {
                let row = chunk.get(i);
                query = query
                    .bind(row.map(|(token, _, _)| &token.as_bytes()[..]))
                    .bind(row.map(|(_, seq, _)| *seq))
                    .bind(row.map(|(_, _, a)| a.now))
                    .bind(row.and_then(|(_, _, a)| a.retry_ms))
                    .bind(row.map(|(_, _, a)| &a.data[..]));
            }
            let inserted = query
                .execute(&mut self.conn)
                .await
                .map_err(db_error)?
                .rows_affected();
            if inserted != chunk.len() as u64 {
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
                &mut self.conn,
                &token.as_bytes()[..],
                stream.last_seq,
                stream.bytes,
                self.retention,
            )
            .await?;
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
    async fn insert_event(
        &mut self,
        token: StreamToken,
        incarnation: i64,
        data: &[u8],
        retry_ms: Option<i64>,
        now: i64,
    ) -> Result<Option<i64>> {
        sqlx::query_scalar(
            "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
             SELECT token, last_seq + 1, ?3, ?4, ?5 FROM mes_streams \
             WHERE token = ?1 AND incarnation = ?2 \
             RETURNING seq",
        )
        .bind(&token.as_bytes()[..])
        .bind(incarnation)
        .bind(now)
        .bind(retry_ms)
        .bind(data)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(db_error)
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
