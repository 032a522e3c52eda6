//! Deleting a stream and applying retention (C8): the age limit by the
//! stream age index, oldest first; the count and byte limits again only
//! when some append trimmed with looser ones; expired sessions. Every scan
//! runs in batches of [`PURGE_BATCH`]. The blocking parts run on the pool.

use std::sync::Arc;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{PurgeReport, Result, Retention};

use crate::SledStore;
use crate::error::backend;
use crate::keys;
use crate::shared::{Shared, blocking};
use crate::slot::{Slot, StreamMeta};

/// Entries handled per scan step in a purge, so no step holds much memory
/// or holds a stream's lock for long.
pub(crate) const PURGE_BATCH: usize = 256;

/// Removes a stream and its events: [`EventStore::delete_stream`](mcp_event_store_core::EventStore::delete_stream).
pub(crate) async fn remove_stream(store: &SledStore, stream_id: &str) -> Result<u64> {
    let shared = store.shared()?;
    let token = shared.key.token(stream_id);
    let removed = blocking({
        let shared = shared.clone();
        move || shared.delete_stream(token)
    })
    .await?;
    if removed > 0 {
        store.settle(store.flush_after_write(&shared)).await?;
    }
    Ok(removed)
}

/// Applies retention and expires sessions: [`EventStore::purge_expired`](mcp_event_store_core::EventStore::purge_expired).
pub(crate) async fn purge(store: &SledStore) -> Result<PurgeReport> {
    let shared = store.shared()?;
    let retention = store.handle.store.retention;
    let now = store.now();
    let report = blocking({
        let shared = shared.clone();
        move || shared.purge(&retention, now)
    })
    .await?;
    if report != PurgeReport::default() {
        store.settle(store.flush_after_write(&shared)).await?;
    }
    Ok(report)
}

impl Shared {
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
    pub(crate) fn end_life(
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

    /// Applies retention to every stream, expires sessions and forgets
    /// redemptions past their time.
    pub(crate) fn purge(&self, retention: &Retention, now_millis: i64) -> Result<PurgeReport> {
        let mut report = PurgeReport::default();
        if let Some(cutoff) = retention.expiry_cutoff_millis(now_millis) {
            self.purge_by_age(keys::encode_time(cutoff), &mut report)?;
        }
        if self.limits_may_be_exceeded(retention) {
            self.purge_by_size(retention, &mut report)?;
        }
        report.sessions = self.purge_sessions(keys::encode_time(now_millis))?;
        report.redemptions = self.purge_redeemed(keys::encode_time(now_millis))?;
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
}
