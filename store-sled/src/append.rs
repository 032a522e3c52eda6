//! Appending (`store_event`): the async side, and the single-key writes
//! behind it, run on the blocking pool: a stream's next sequence number
//! from its slot, the event, and inline retention (count and byte limits).
//! With `Flush` durability the append then waits for the group flush
//! ([`Flusher`](crate::flusher::Flusher)) that publishes it to readers.

use std::sync::Arc;

use mcp_event_store_core::backend::{StreamToken, dense};
use mcp_event_store_core::{Error, EventId, NewEvent, Result, Retention};

use crate::SledStore;
use crate::error::backend;
use crate::flusher::{Ack, Publish, flushed, wait_flushed};
use crate::keys::{self, EVENT_HEADER_LEN};
use crate::shared::{Shared, blocking};
use crate::slot::{Slot, StreamMeta};

/// How an append learns its event is durable; `None` for relaxed handles.
pub(crate) type Durable = Option<Ack>;

/// Appends one event: [`EventStore::store_event`](mcp_event_store_core::EventStore::store_event).
pub(crate) async fn append(
    store: &SledStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    let shared = store.shared()?;
    let token = shared.key.token(stream_id);
    let now = keys::encode_time(store.now());
    let value = keys::encode_event(now, event.retry, event.data);
    let stream_id = stream_id.to_owned();
    let retention = store.handle.store.retention;
    let relaxed = store.relaxed();
    let handle = store.handle.clone();
    let _appending = (!relaxed).then(|| shared.flusher.appending());
    let writer = shared.clone();
    let (id, ack) = blocking(move || {
        if !handle
            .limits_noted
            .load(std::sync::atomic::Ordering::Acquire)
        {
            writer.note_limits(&retention)?;
            handle
                .limits_noted
                .store(true, std::sync::atomic::Ordering::Release);
        }
        writer.append(&stream_id, token, value, now, retention, relaxed)
    })
    .await?;
    match ack {
        None => {}
        Some(Ack::Flushed(outcome)) => flushed(Ok(outcome))?,
        Some(Ack::Queued(wait)) => wait_flushed(wait).await?,
    }
    Ok(id)
}

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
    pub(crate) fn trim_to_limits(
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
}
