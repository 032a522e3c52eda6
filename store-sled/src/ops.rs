//! The blocking work behind each trait method. Everything here runs on
//! tokio's blocking pool (see `blocking` in lib.rs), never on a worker.
//!
//! Writes are single-key sled operations, ordered so that a crash between
//! any two leaves something harmless (an extra index entry, an old event
//! not yet trimmed), never a stream that loses track of itself. sled's
//! `apply_batch` and transactions are avoided on purpose: in sled 0.34 they
//! take a process-wide write lock, and once one has run, every later sled
//! call (flushes included, for their whole fsync) takes that lock's read
//! side, so appends and replays would stall behind every flush.

use std::sync::Arc;

use crate::flusher::{Ack, Publish};
use crate::keys::{self, EVENT_HEADER_LEN};
use crate::shared::{Incarnations, Shared, Slot, StreamMeta, backend};
use bytes::Bytes;
use mcp_event_store_core::backend::dense::{self, DenseStream};
use mcp_event_store_core::backend::{Page, StreamToken};
use mcp_event_store_core::{Error, EventId, Position, PurgeReport, Result, Retention, StoredEvent};

/// Entries handled per scan step in a purge, so no step holds much memory
/// or holds a stream's lock for long.
const PURGE_BATCH: usize = 256;
/// Payloads at least this long are handed out without copying.
const ZERO_COPY_MIN: usize = 1024;

/// How an append learns its event is durable; `None` for relaxed handles.
pub(crate) type Durable = Option<Ack>;

impl Shared {
    /// Appends one event. `value` is the encoded event (header and payload)
    /// with its cumulative byte count still to be filled in. With `Flush`
    /// durability this flushes too, unless a flush is already running (see
    /// [`Flusher::flush_or_queue`](crate::flusher::Flusher::flush_or_queue)).
    pub(crate) fn append(
        &self,
        stream_id: &str,
        token: StreamToken,
        mut value: Vec<u8>,
        now: u64,
        retention: Retention,
        relaxed: bool,
    ) -> Result<(EventId, Durable)> {
        let len = (value.len() - EVENT_HEADER_LEN) as u64;
        let (id, publish) = loop {
            let appended = self.with_stream(token, |slot, meta| {
                if let Some(m) = meta.as_mut() {
                    if &*m.stream_id != stream_id {
                        return Err(Error::Corrupt(format!(
                            "stream token collision between {stream_id:?} and {:?}",
                            m.stream_id
                        )));
                    }
                    if m.incarnation < self.incarnations.floor {
                        // First append since a relaxed session was lost: its
                        // acknowledged events may be gone from disk, so this
                        // life's next sequence numbers may have been handed
                        // out already. The life ends (as in a delete) and a
                        // new one starts, in a new slot, under a new
                        // incarnation.
                        self.end_life(&token, slot, meta)?;
                        return Ok(None);
                    }
                }

                let Some(m) = meta.as_mut() else {
                    // A new life. Index entry, then record, then event: a
                    // crash in between leaves an entry or a record without
                    // events, which reads treat as no stream and the purge
                    // cleans up.
                    let incarnation = self.next_incarnation()?;
                    keys::set_cum_bytes(&mut value, len);
                    let fresh = StreamMeta {
                        stream_id: stream_id.into(),
                        incarnation,
                        age: now,
                        first_seq: 1,
                        last_seq: 1,
                        bytes: len,
                        last_cum: len,
                    };
                    self.stream_age
                        .insert(keys::age_key(now, &token), &[])
                        .map_err(backend)?;
                    self.put_record(&token, &fresh)?;
                    self.events
                        .insert(keys::event_key(&token, 1), std::mem::take(&mut value))
                        .map_err(backend)?;
                    *meta = Some(fresh);
                    return Ok(Some(self.acknowledge(slot, token, incarnation, 1, relaxed)));
                };

                let seq = m.last_seq.checked_add(1).ok_or_else(|| {
                    Error::Corrupt("stream sequence numbers are exhausted".into())
                })?;
                let cum = m.last_cum + len;
                keys::set_cum_bytes(&mut value, cum);
                self.events
                    .insert(keys::event_key(&token, seq), std::mem::take(&mut value))
                    .map_err(backend)?;
                // The event is written: from here on `meta` must count it and
                // the watermark must come to cover it, whatever else fails.
                m.last_seq = seq;
                m.last_cum = cum;
                m.bytes += len;
                if let Err(e) = self.trim_to_limits(&token, m, &retention) {
                    // Best effort: the next append or purge trims again.
                    tracing::warn!(error = %e, "inline retention failed");
                }
                Ok(Some(self.acknowledge(
                    slot,
                    token,
                    m.incarnation,
                    seq,
                    relaxed,
                )))
            })?;
            if let Some(appended) = appended {
                break appended;
            }
        };
        // Outside the stream's lock: a flush can take milliseconds, and
        // readers and appenders of the stream need the lock meanwhile.
        Ok((id, publish.map(|p| self.flusher.flush_or_queue(Some(p)))))
    }

    /// Makes a written event visible at once for relaxed handles; otherwise
    /// returns the watermark to publish after a flush covering it.
    fn acknowledge(
        &self,
        slot: &Arc<Slot>,
        token: StreamToken,
        incarnation: u64,
        seq: u64,
        relaxed: bool,
    ) -> (EventId, Option<Publish>) {
        let id = EventId::new(token, dense::position(incarnation, seq));
        if relaxed {
            // Acknowledged now, unflushed (the handle's choice): visible
            // and delivered to followers at once, like the id it returns.
            slot.publish(seq);
            self.wakeups.wake(&token);
            self.flusher.mark_dirty();
            (id, None)
        } else {
            (id, Some((slot.clone(), token, seq)))
        }
    }

    /// Removes a stream's oldest events while it is over its count or byte
    /// limit, always keeping the newest. Returns how many went.
    fn trim_to_limits(
        &self,
        token: &StreamToken,
        meta: &mut StreamMeta,
        retention: &Retention,
    ) -> Result<u64> {
        let max_events = retention.max_events_per_stream.unwrap_or(u64::MAX);
        let max_bytes = retention.max_bytes_per_stream.unwrap_or(u64::MAX);
        let mut removed = 0;
        while meta.count() > 1 && (meta.count() > max_events || meta.bytes > max_bytes) {
            let old = self
                .events
                .remove(keys::event_key(token, meta.first_seq))
                .map_err(backend)?;
            meta.first_seq += 1;
            if let Some(old) = old {
                meta.bytes = meta.bytes.saturating_sub(keys::payload_len(&old)?);
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Checks a replay cursor and returns its stream id, the incarnation and
    /// sequence number to read after, and the slot to read through.
    pub(crate) fn replay_start(
        &self,
        raw: &str,
        cursor: &EventId,
    ) -> Result<(String, u64, u64, Arc<Slot>)> {
        self.with_stream(cursor.token, |slot, meta| {
            let Some(m) = meta.as_ref() else {
                self.kill(cursor.token, slot);
                return Err(Error::unknown_event_id(raw));
            };
            let position = position_in(cursor.position, m.incarnation, &self.incarnations);
            let cursor = EventId::new(cursor.token, position);
            let after = dense::check_cursor(raw, &cursor, durable_state(slot, m))?;
            Ok((m.stream_id.to_string(), m.incarnation, after, slot.clone()))
        })
    }

    /// Reads the durable events after `after`, at most `limit`, as one
    /// range scan. `slot` is the stream's life `incarnation`: once that life
    /// ends (deleted, expired, or started again after a lost relaxed
    /// session) the slot is dead and so is the replay, with
    /// [`Error::EventsPurged`], never an event of a later life.
    pub(crate) fn read_page(
        &self,
        raw: &str,
        token: &StreamToken,
        slot: &Slot,
        incarnation: u64,
        after: u64,
        limit: usize,
    ) -> Result<Page> {
        if slot.is_dead() {
            return Err(Error::events_purged(raw));
        }
        let cap = slot.durable();
        if cap <= after {
            return Ok(Page {
                events: Vec::new(),
                last: true,
            });
        }
        let wanted = usize::try_from(cap - after)
            .unwrap_or(usize::MAX)
            .min(limit);
        let mut events = Vec::with_capacity(wanted);
        let range = keys::event_key(token, after + 1)..=keys::event_key(token, cap);
        for item in self.events.range(range).take(limit) {
            let (key, value) = item.map_err(backend)?;
            let seq = keys::event_key_seq(&key)?;
            // Dense numbering: a hole means retention removed events under
            // this reader (the first event is checked by `check_page`).
            if events
                .last()
                .is_some_and(|prev: &StoredEvent| prev.id.position.minor + 1 != seq)
            {
                return Err(Error::events_purged(raw));
            }
            let header = keys::decode_event(&value)?;
            let data = if value.len() - EVENT_HEADER_LEN >= ZERO_COPY_MIN {
                Bytes::from_owner(value).slice(EVENT_HEADER_LEN..)
            } else {
                Bytes::copy_from_slice(&value[EVENT_HEADER_LEN..])
            };
            events.push(StoredEvent {
                id: EventId::new(*token, dense::position(incarnation, seq)),
                data,
                retry: header.retry,
            });
        }
        dense::check_page(
            raw,
            after,
            events.first().map(|e| e.id.position.minor),
            Some(cap),
        )?;
        // A life that ended while the scan ran may have let a new life of
        // the same stream id write these keys again; never hand those out
        // under this cursor.
        if slot.is_dead() {
            return Err(Error::events_purged(raw));
        }
        let last =
            events.len() < limit || events.last().is_some_and(|e| e.id.position.minor >= cap);
        Ok(Page { events, last })
    }

    /// The stream of a retained, durable event of the stream's current life.
    pub(crate) fn lookup(&self, id: &EventId) -> Result<Option<String>> {
        self.with_stream(id.token, |slot, meta| {
            let Some(m) = meta.as_ref() else {
                self.kill(id.token, slot);
                return Ok(None);
            };
            let position = position_in(id.position, m.incarnation, &self.incarnations);
            let retained = durable_state(slot, m).retains(position);
            Ok(retained.then(|| m.stream_id.to_string()))
        })
    }

    /// Deletes a stream; returns how many events it had.
    pub(crate) fn delete_stream(&self, token: StreamToken) -> Result<u64> {
        self.with_stream(token, |slot, meta| {
            if meta.is_none() {
                self.kill(token, slot);
                return Ok(0);
            }
            self.end_life(&token, slot, meta)
        })
    }

    /// Ends a stream's current life: removes its events, record and index
    /// entry, and retires its slot. Returns how many events it had. The
    /// next append under the stream id starts a new life, under a new
    /// incarnation.
    fn end_life(
        &self,
        token: &StreamToken,
        slot: &Arc<Slot>,
        meta: &mut Option<StreamMeta>,
    ) -> Result<u64> {
        let Some(m) = meta.as_mut() else {
            return Ok(0);
        };
        let count = m.count();
        // Oldest first, keeping `meta` in step, so a failure part way
        // leaves a consistent (shorter) stream.
        while m.first_seq < m.last_seq {
            self.events
                .remove(keys::event_key(token, m.first_seq))
                .map_err(backend)?;
            m.first_seq += 1;
        }
        self.events
            .remove(keys::event_key(token, m.last_seq))
            .map_err(backend)?;
        self.finish_removal(token, slot, meta)?;
        Ok(count)
    }

    /// Removes the record and index entry of a stream whose events are all
    /// gone, and retires its slot.
    fn finish_removal(
        &self,
        token: &StreamToken,
        slot: &Arc<Slot>,
        meta: &mut Option<StreamMeta>,
    ) -> Result<()> {
        if let Some(m) = meta.take() {
            self.streams.remove(token.as_bytes()).map_err(backend)?;
            self.stream_age
                .remove(keys::age_key(m.age, token))
                .map_err(backend)?;
        }
        self.kill(*token, slot);
        Ok(())
    }

    /// Applies retention to every stream and expires sessions.
    pub(crate) fn purge(&self, retention: &Retention, now_millis: i64) -> Result<PurgeReport> {
        let mut report = PurgeReport::default();
        if let Some(cutoff) = retention.expiry_cutoff_millis(now_millis) {
            self.purge_by_age(keys::encode_time(cutoff), &mut report)?;
        }
        if self.limits_may_be_exceeded(retention) {
            self.purge_by_size(retention, &mut report)?;
        }
        report.sessions = self.purge_sessions(keys::encode_time(now_millis))?;
        Ok(report)
    }

    /// Walks the age index up to `cutoff`, oldest first, in batches.
    fn purge_by_age(&self, cutoff: u64, report: &mut PurgeReport) -> Result<()> {
        let end = cutoff.to_be_bytes();
        let mut start: Vec<u8> = Vec::new();
        loop {
            let batch: Vec<sled::IVec> = self
                .stream_age
                .range(start.clone()..end.to_vec())
                .keys()
                .take(PURGE_BATCH)
                .collect::<Result<_, _>>()
                .map_err(backend)?;
            let Some(last) = batch.last() else {
                return Ok(());
            };
            start = [&last[..], &[0]].concat();
            for key in batch {
                let (age, token) = keys::parse_age_key(&key)?;
                self.with_stream(token, |slot, meta| {
                    match meta.as_ref() {
                        None => {
                            self.kill(token, slot);
                            self.stream_age.remove(&key).map_err(backend)?;
                        }
                        // Stale entry: the stream is filed elsewhere.
                        Some(m) if m.age != age => {
                            self.stream_age.remove(&key).map_err(backend)?;
                        }
                        Some(_) => self.expire_stream(&token, slot, meta, cutoff, report)?,
                    }
                    Ok(())
                })?;
            }
        }
    }

    /// Removes a stream's events stored before `cutoff`, oldest first, and
    /// refiles (or removes) the stream.
    fn expire_stream(
        &self,
        token: &StreamToken,
        slot: &Arc<Slot>,
        meta: &mut Option<StreamMeta>,
        cutoff: u64,
        report: &mut PurgeReport,
    ) -> Result<()> {
        let Some(m) = meta.as_mut() else {
            return Ok(());
        };
        let old_age = m.age;
        let mut new_age = None;
        'scan: while m.first_seq <= m.last_seq {
            let range = keys::event_key(token, m.first_seq)..=keys::event_key(token, m.last_seq);
            let batch: Vec<(sled::IVec, sled::IVec)> = self
                .events
                .range(range)
                .take(PURGE_BATCH)
                .collect::<Result<_, _>>()
                .map_err(backend)?;
            if batch.is_empty() {
                break;
            }
            for (key, value) in batch {
                let seq = keys::event_key_seq(&key)?;
                let header = keys::decode_event(&value)?;
                if header.stored_at >= cutoff {
                    new_age = Some(header.stored_at);
                    break 'scan;
                }
                self.events.remove(&key).map_err(backend)?;
                m.first_seq = seq + 1;
                m.bytes = m.bytes.saturating_sub(keys::payload_len(&value)?);
                report.events += 1;
            }
        }
        match new_age {
            None => {
                report.streams += 1;
                self.finish_removal(token, slot, meta)
            }
            Some(age) if age != old_age => {
                // New entry, then record, then drop the old entry.
                self.stream_age
                    .insert(keys::age_key(age, token), &[])
                    .map_err(backend)?;
                m.age = age;
                let m = m.clone();
                self.put_record(token, &m)?;
                self.stream_age
                    .remove(keys::age_key(old_age, token))
                    .map_err(backend)?;
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    /// Up to `n` stream tokens after `after` (from the first with `None`),
    /// in key order: one batch of a walk over every stream.
    pub(crate) fn stream_tokens_after(
        &self,
        after: Option<StreamToken>,
        n: usize,
    ) -> Result<Vec<StreamToken>> {
        let start: Vec<u8> = match after {
            Some(token) => [&token.as_bytes()[..], &[0]].concat(),
            None => Vec::new(),
        };
        self.streams
            .range(start..)
            .keys()
            .take(n)
            .map(|key| {
                let key = key.map_err(backend)?;
                StreamToken::from_bytes(&key)
                    .ok_or_else(|| Error::Corrupt("malformed stream key".into()))
            })
            .collect()
    }

    /// Applies the count and byte limits to every stream, in key order and
    /// batches. Only needed when some append trimmed with looser limits
    /// (another handle, an earlier run): appends trim inline otherwise.
    fn purge_by_size(&self, retention: &Retention, report: &mut PurgeReport) -> Result<()> {
        let mut after = None;
        loop {
            let batch = self.stream_tokens_after(after, PURGE_BATCH)?;
            let Some(&last) = batch.last() else {
                return Ok(());
            };
            after = Some(last);
            for token in batch {
                report.events += self.with_stream(token, |_, meta| match meta.as_mut() {
                    Some(m) => self.trim_to_limits(&token, m, retention),
                    None => Ok(0),
                })?;
            }
        }
    }

    /// Removes sessions that expired at or before `now`, in batches.
    fn purge_sessions(&self, now: u64) -> Result<u64> {
        let end = now.saturating_add(1).to_be_bytes();
        let mut removed = 0;
        loop {
            let _guard = crate::shared::lock(&self.session_lock);
            let batch: Vec<sled::IVec> = self
                .session_expiry
                .range(..end.to_vec())
                .keys()
                .take(PURGE_BATCH)
                .collect::<Result<_, _>>()
                .map_err(backend)?;
            if batch.is_empty() {
                return Ok(removed);
            }
            for key in batch {
                let (expires, session_id) = keys::parse_expiry_key(&key)?;
                let current = self.sessions.get(session_id).map_err(backend)?;
                if let Some(current) = current
                    && keys::session_expires(&current)? == expires
                {
                    self.sessions.remove(session_id).map_err(backend)?;
                    removed += 1;
                }
                self.session_expiry.remove(&key).map_err(backend)?;
            }
        }
    }

    /// Stores a session (expiry entry first, so a crash never leaves a
    /// session the purge cannot find).
    pub(crate) fn put_session(&self, session_id: &str, expires: u64, state: &[u8]) -> Result<()> {
        let _guard = crate::shared::lock(&self.session_lock);
        let id = session_id.as_bytes();
        let old = self.sessions.get(id).map_err(backend)?;
        self.session_expiry
            .insert(keys::expiry_key(expires, id), &[])
            .map_err(backend)?;
        self.sessions
            .insert(id, keys::encode_session(expires, state))
            .map_err(backend)?;
        if let Some(old) = old {
            let old_expires = keys::session_expires(&old)?;
            if old_expires != expires {
                self.session_expiry
                    .remove(keys::expiry_key(old_expires, id))
                    .map_err(backend)?;
            }
        }
        Ok(())
    }

    /// A session's state if it has not expired by `now`.
    pub(crate) fn get_session(&self, session_id: &str, now: u64) -> Result<Option<Bytes>> {
        let Some(value) = self.sessions.get(session_id.as_bytes()).map_err(backend)? else {
            return Ok(None);
        };
        if keys::session_expires(&value)? <= now {
            return Ok(None);
        }
        Ok(Some(Bytes::copy_from_slice(&value[8..])))
    }

    /// Removes a session; `true` if it existed and had not expired.
    pub(crate) fn delete_session(&self, session_id: &str, now: u64) -> Result<bool> {
        let _guard = crate::shared::lock(&self.session_lock);
        let id = session_id.as_bytes();
        let Some(old) = self.sessions.remove(id).map_err(backend)? else {
            return Ok(false);
        };
        let expires = keys::session_expires(&old)?;
        self.session_expiry
            .remove(keys::expiry_key(expires, id))
            .map_err(backend)?;
        Ok(expires > now)
    }
}

/// What readers may see of a stream's life: only what is durable (see the
/// crate docs on never reissuing an id after a crash).
fn durable_state(slot: &Slot, meta: &StreamMeta) -> DenseStream {
    let durable = slot.durable();
    DenseStream {
        incarnation: meta.incarnation,
        last_seq: durable,
        first_retained: (meta.first_seq <= durable).then_some(meta.first_seq),
    }
}

/// The position a cursor names in a stream now in life `incarnation`.
///
/// Format 1 spelled an event's position `<seq>`, which parses as
/// `Position { major: seq, minor: 0 }` and which format 2 never issues.
/// For a stream migrated from format 1, still in its migrated life, that
/// spelling names the same event as `<incarnation>-<seq>` does, so clients
/// holding ids from before the upgrade resume as before. Elsewhere it is
/// left alone, and refused as a zero part.
pub(crate) fn position_in(
    position: Position,
    incarnation: u64,
    incarnations: &Incarnations,
) -> Position {
    if position.minor == 0 && incarnations.is_migrated(incarnation) {
        dense::position(incarnation, position.major)
    } else {
        position
    }
}
