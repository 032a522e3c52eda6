//! C15 Inspect: totals and stream listings from the stream records, and
//! the settings the health check reports. The walks are blocking and run
//! on the pool.
//!
//! A stream's summary needs no scan of its events: the events are numbered
//! densely and each carries the stream's cumulative byte count, so its first
//! and last retained events give its count, bytes and ages (the same two
//! reads that load a stream's in-memory state). Totals and listings walk the
//! stream records in token order, in bounded batches, and count only what a
//! replay may see: durable events (see the crate docs on never reissuing an
//! id), so an append still waiting for its flush is not counted yet.

use std::time::Duration;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{
    Error, HealthReport, Result, Setting, StoreStats, StreamCursor, StreamInfo, StreamPage,
};

use crate::SledStore;
use crate::error::{NAME, backend};
use crate::keys::{self, META_FORMAT};
use crate::options::Durability;
use crate::shared::{Shared, blocking};

/// Stream records read per step of a walk, so a walk over any number of
/// streams holds at most this many keys at once.
const WALK_BATCH: usize = 256;

/// Store-wide totals: [`EventStore::stats`](mcp_event_store_core::EventStore::stats).
pub(crate) async fn stats(store: &SledStore) -> Result<StoreStats> {
    let shared = store.shared()?;
    blocking(move || shared.stats()).await
}

/// A page of streams: [`EventStore::list_streams`](mcp_event_store_core::EventStore::list_streams).
pub(crate) async fn streams(
    store: &SledStore,
    after: Option<&StreamCursor>,
    limit: usize,
) -> Result<StreamPage> {
    let shared = store.shared()?;
    let after = after
        .map(|cursor| {
            StreamToken::parse(cursor.as_str()).ok_or_else(|| {
                Error::Config(format!("not a stream cursor of this store: {cursor:?}"))
            })
        })
        .transpose()?;
    let (streams, last) = blocking(move || shared.list_streams(after, limit)).await?;
    Ok(StreamPage::new(
        streams,
        last.map(|token| StreamCursor::new(token.to_text())),
    ))
}

/// The health check: [`EventStore::check`](mcp_event_store_core::EventStore::check).
pub(crate) async fn check(store: &SledStore) -> Result<HealthReport> {
    let shared = store.shared()?;
    let (format_version, database_interval) =
        blocking(move || Ok((shared.format_version()?, shared.relaxed_interval()))).await?;
    Ok(HealthReport::new(
        NAME,
        format_version,
        settings(store, database_interval),
    ))
}

/// What [`check`] reports, given the database-wide flush
/// interval of relaxed handles (see the crate docs, "Inspecting").
fn settings(store: &SledStore, database_interval: Option<Duration>) -> Vec<Setting> {
    let interval = |d: Duration| format!("flush_interval_ms={}", d.as_millis());
    let durability = match store.handle.durability {
        Durability::Flush => Setting::ok("durability", "flush"),
        Durability::Interval(d) => Setting::warn(
            "durability",
            interval(d),
            "this handle acknowledges events before they are flushed, so a crash loses \
             those of the last interval: open it with durability=flush (the default; drop \
             flush_interval_ms from the URL) if acknowledged events must survive a crash",
        ),
    };
    let database = match database_interval {
        None => Setting::ok("database_durability", "flush"),
        Some(d) => Setting::warn(
            "database_durability",
            interval(d),
            "a handle with interval durability has used this database since this process \
             opened it, so after a crash every stream drops its events at its next append, \
             even those acknowledged with durability=flush: open every handle on it with \
             durability=flush",
        ),
    };
    let retention = store.handle.store.retention;
    let retention = Setting::retention(&retention);
    vec![durability, database, retention]
}

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

#[cfg(test)]
mod tests {
    use mcp_event_store_core::{EventStore, NewEvent, StoreStats};

    use crate::keys;
    use crate::test_support::{Unpause, until};
    use crate::{SledOptions, SledStore};

    /// Totals and listings count what replays may see: an event written
    /// but not yet flushed is in neither until its flush, nor is a stream
    /// whose only event is unflushed; a stream record a crash left without
    /// events is no stream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspection_counts_only_durable_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let db = store.shared().unwrap();
        store.store_event("s", NewEvent::new(b"12")).await.unwrap();
        // A record without events, as a crash between writing a new
        // stream's record and its first event leaves it.
        let token = db.key.token("leftover");
        let record = keys::StreamRecord {
            incarnation: 1,
            age: keys::encode_time(0),
            stream_id: "leftover".into(),
        };
        db.streams
            .insert(token.as_bytes(), keys::encode_record(&record))
            .unwrap();
        let totals = |stats: StoreStats| (stats.streams, stats.events, stats.bytes);
        assert_eq!(totals(store.stats().await.unwrap()), (1, 1, 2));

        db.flusher.pause(true);
        let unpause = Unpause(&db.flusher);
        let written = db.events.len() + 2;
        let pending: Vec<_> = [("s", &b"345"[..]), ("new", &b"6789"[..])]
            .into_iter()
            .map(|(stream, data)| {
                let store = store.clone();
                tokio::spawn(async move { store.store_event(stream, NewEvent::new(data)).await })
            })
            .collect();
        until(|| db.events.len() >= written).await;
        assert_eq!(totals(store.stats().await.unwrap()), (1, 1, 2));
        let page = store.list_streams(None, 10).await.unwrap();
        let listed: Vec<_> = page
            .streams
            .iter()
            .map(|s| (&s.stream_id[..], s.events))
            .collect();
        assert_eq!(listed, [("s", 1)]);
        assert_eq!(page.next, None);

        drop(unpause);
        for append in pending {
            append.await.unwrap().unwrap();
        }
        assert_eq!(totals(store.stats().await.unwrap()), (2, 3, 9));
        let page = store.list_streams(None, 10).await.unwrap();
        let mut listed: Vec<_> = page
            .streams
            .iter()
            .map(|s| (&s.stream_id[..], s.events, s.bytes))
            .collect();
        listed.sort();
        assert_eq!(listed, [("new", 1, 4), ("s", 2, 5)]);
        drop(db);
        store.close().await.unwrap();
    }
}
