//! C15 Inspect: totals and stream listings from the stream records, and
//! the settings the health check reports. Blocking, like `ops`.
//!
//! A stream's summary needs no scan of its events: the events are numbered
//! densely and each carries the stream's cumulative byte count, so its first
//! and last retained events give its count, bytes and ages (the same two
//! reads that load a stream's in-memory state). Totals and listings walk the
//! stream records in token order, in bounded batches, and count only what a
//! replay may see: durable events (see the crate docs on never reissuing an
//! id), so an append still waiting for its flush is not counted yet.

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{Error, Result, StoreStats, StreamInfo};

use crate::keys;
use crate::shared::{META_FORMAT, Shared, backend};

/// Stream records read per step of a walk, so a walk over any number of
/// streams holds at most this many keys at once.
const WALK_BATCH: usize = 256;

fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Shared {
    /// What replays can see of a stream now: `None` if it has no durable,
    /// retained event (never written, deleted, expired whole, or a record a
    /// crash left without events).
    pub(crate) fn stream_info(&self, token: StreamToken) -> Result<Option<StreamInfo>> {
        self.with_stream(token, |slot, meta| {
            let Some(m) = meta.as_ref() else {
                self.kill(token, slot);
                return Ok(None);
            };
            let visible = slot.durable().min(m.last_seq);
            if visible < m.first_seq {
                return Ok(None);
            }
            let range = keys::event_key(&token, m.first_seq)..=keys::event_key(&token, visible);
            let Some(first) = self.events.range(range.clone()).next() else {
                return Ok(None);
            };
            let (first_key, first_value) = first.map_err(backend)?;
            let (last_key, last_value) = match self.events.range(range).next_back() {
                Some(last) => last.map_err(backend)?,
                None => (first_key.clone(), first_value.clone()),
            };
            let (first_header, last_header) = (
                keys::decode_event(&first_value)?,
                keys::decode_event(&last_value)?,
            );
            let events = keys::event_key_seq(&last_key)? - keys::event_key_seq(&first_key)? + 1;
            let bytes = last_header
                .cum_bytes
                .checked_sub(first_header.cum_bytes)
                .and_then(|b| b.checked_add(keys::payload_len(&first_value).ok()?))
                .ok_or_else(|| Error::Corrupt("stream byte counts are inconsistent".into()))?;
            Ok(Some(StreamInfo::new(
                m.stream_id.to_string(),
                events,
                bytes,
                Some(keys::decode_time(first_header.stored_at)),
                Some(keys::decode_time(last_header.stored_at)),
            )))
        })
    }

    /// Calls `visit` with each stream that has a visible event, in token
    /// order, starting after `after`, until it returns `false`. Reads the
    /// stream records in batches of [`WALK_BATCH`].
    fn walk_streams(
        &self,
        after: Option<StreamToken>,
        mut visit: impl FnMut(StreamToken, StreamInfo) -> bool,
    ) -> Result<()> {
        let mut after = after;
        loop {
            let batch = self.stream_tokens_after(after, WALK_BATCH)?;
            let Some(&last) = batch.last() else {
                return Ok(());
            };
            after = Some(last);
            for token in batch {
                if let Some(info) = self.stream_info(token)?
                    && !visit(token, info)
                {
                    return Ok(());
                }
            }
        }
    }

    /// Store-wide totals: one summary per stream, never a scan of events.
    pub(crate) fn stats(&self) -> Result<StoreStats> {
        let mut stats = StoreStats::default();
        self.walk_streams(None, |_, info| {
            stats.streams += 1;
            stats.events += info.events;
            stats.bytes += info.bytes;
            stats.oldest_millis = min_some(stats.oldest_millis, info.oldest_millis);
            stats.newest_millis = stats.newest_millis.max(info.newest_millis);
            true
        })?;
        Ok(stats)
    }

    /// Up to `limit` streams after `after`, in token order, and the token
    /// of the last one if another stream follows.
    pub(crate) fn list_streams(
        &self,
        after: Option<StreamToken>,
        limit: usize,
    ) -> Result<(Vec<StreamInfo>, Option<StreamToken>)> {
        let mut page = Vec::with_capacity(limit);
        let mut last = None;
        let mut more = false;
        self.walk_streams(after, |token, info| {
            if page.len() == limit {
                more = true;
                return false;
            }
            page.push(info);
            last = Some(token);
            true
        })?;
        Ok((page, last.filter(|_| more)))
    }

    /// The storage format version recorded in the database.
    pub(crate) fn format_version(&self) -> Result<u32> {
        let raw = self
            .meta
            .get(META_FORMAT)
            .map_err(backend)?
            .ok_or_else(|| Error::Corrupt("the format version record is missing".into()))?;
        <[u8; 4]>::try_from(&raw[..])
            .map(u32::from_be_bytes)
            .map_err(|_| Error::Corrupt("format version record is malformed".into()))
    }
}
