//! Replay (C3, C5) and lookup (C4): a cursor checked against the stream's
//! durable state, then pages read by one range scan each: the first, short,
//! on the calling task, each after it on the blocking pool, read ahead
//! while the caller consumes the current one. Readers never look past a stream's durable watermark (see the crate
//! docs on never reissuing an id after a crash).

use std::sync::Arc;

use bytes::Bytes;
use mcp_event_store_core::backend::dense::{self, DenseStream};
use mcp_event_store_core::backend::{Page, StreamToken, paged_replay};
use mcp_event_store_core::{Error, EventId, Position, Replay, Result, StoredEvent};

use crate::SledStore;
use crate::error::{NAME, backend};
use crate::keys::{self, EVENT_HEADER_LEN};
use crate::shared::{Incarnations, Shared, blocking, lock};
use crate::slot::{Slot, StreamMeta};

/// Payloads at least this long are handed out without copying.
const ZERO_COPY_MIN: usize = 1024;

/// The most events of a replay's first page, read on the calling task:
/// a short range scan of sled's cache costs less than the hop to the
/// blocking pool and back, and most resumes miss a few events.
const INLINE_EVENTS: usize = 128;

/// The events after a cursor: [`EventStore::replay_events_after`](mcp_event_store_core::EventStore::replay_events_after).
pub(crate) async fn replay_after(store: &SledStore, raw: &str, cursor: EventId) -> Result<Replay> {
    let (stream_id, reader, after, first) = start_replay(store, raw, cursor).await?;
    Ok(Replay {
        stream_id,
        events: reader.stream(after, Some(first)),
    })
}

/// Every retained event of a stream from its oldest (C16): the stream's
/// durable state, then pages as a replay after the event before the oldest,
/// through the same reader and checks. As in [`start_replay`], the state
/// and the first page (at most [`INLINE_EVENTS`]) are read on the calling
/// task.
pub(crate) async fn replay_whole(store: &SledStore, stream_id: &str) -> Result<Replay> {
    let limit = store.handle.store.page_size;
    let shared = store.shared()?;
    let token = shared.key.token(stream_id);
    let start = shared.with_stream(token, |slot, meta| {
        let Some(m) = meta.as_ref() else {
            shared.kill(token, slot);
            return Ok(None);
        };
        Ok(durable_state(slot, m)
            .first_retained
            .map(|first| (m.incarnation, first, slot.clone())))
    })?;
    let Some((incarnation, first, slot)) = start else {
        return Ok(Replay::empty(stream_id));
    };
    let raw: Arc<str> = EventId::new(token, dense::position(incarnation, first))
        .to_string()
        .into();
    let after = first - 1;
    let reader = Arc::new(PageReader {
        shared,
        slot,
        token,
        incarnation,
        raw,
        limit,
    });
    let first_page = reader.first_page(after)?;
    Ok(Replay {
        stream_id: stream_id.to_owned(),
        events: reader.stream(after, Some(first_page)),
    })
}

/// The stream of an event id: [`EventStore::get_stream_id_for_event_id`](mcp_event_store_core::EventStore::get_stream_id_for_event_id).
pub(crate) async fn stream_of(store: &SledStore, id: EventId) -> Result<Option<String>> {
    let shared = store.shared()?;
    blocking(move || shared.lookup(&id)).await
}

/// Checks a replay's cursor and reads its first page (at most
/// [`INLINE_EVENTS`]) on the calling task: no hop for the few events most
/// resumes miss; the pages after it are read on the blocking pool. Returns
/// the stream id, the reader for the rest, the sequence number read after,
/// and the first page.
pub(crate) async fn start_replay(
    store: &SledStore,
    last_event_id: &str,
    cursor: EventId,
) -> Result<(String, Arc<PageReader>, u64, Page)> {
    let limit = store.handle.store.page_size;
    let shared = store.shared()?;
    let raw: Arc<str> = last_event_id.into();
    let (stream_id, incarnation, after, slot) = shared.replay_start(&raw, &cursor)?;
    let reader = Arc::new(PageReader {
        shared,
        slot,
        token: cursor.token,
        incarnation,
        raw,
        limit,
    });
    let first = reader.first_page(after)?;
    Ok((stream_id, reader, after, first))
}

/// Reads one replay's pages. While the caller consumes a page, the next one
/// is already being read on the blocking pool, so at most two pages are in
/// memory and the hop to the blocking pool is hidden behind the caller's work.
pub(crate) struct PageReader {
    pub(crate) shared: Arc<Shared>,
    pub(crate) slot: Arc<Slot>,
    pub(crate) token: StreamToken,
    /// The life of the stream this replay reads.
    pub(crate) incarnation: u64,
    pub(crate) raw: Arc<str>,
    pub(crate) limit: usize,
}

/// A page being read ahead: the position it reads after, and the read.
type Ahead = Arc<std::sync::Mutex<Option<(u64, tokio::task::JoinHandle<Result<Page>>)>>>;

impl PageReader {
    /// The page after `after`, at most [`INLINE_EVENTS`], read on the
    /// calling task: a replay's first.
    fn first_page(&self, after: u64) -> Result<Page> {
        self.shared.read_page(
            &self.raw,
            &self.token,
            &self.slot,
            self.incarnation,
            after,
            self.limit.min(INLINE_EVENTS),
        )
    }

    fn read(self: &Arc<Self>, after: u64) -> impl FnOnce() -> Result<Page> + Send + 'static {
        let reader = self.clone();
        move || {
            reader.shared.read_page(
                &reader.raw,
                &reader.token,
                &reader.slot,
                reader.incarnation,
                after,
                reader.limit,
            )
        }
    }

    /// The events after `after`, starting with `first` if it was read
    /// already (the page after `after`).
    pub(crate) fn stream(
        self: Arc<Self>,
        after: u64,
        first: Option<Page>,
    ) -> mcp_event_store_core::ReplayEvents {
        let mut first = first.map(|page| (after, page));
        let ahead: Ahead = Arc::default();
        paged_replay(
            mcp_event_store_core::backend::dense::position(self.incarnation, after),
            move |position| {
                let after = position.minor;
                let ready = first
                    .take()
                    .filter(|(at, _)| *at == after)
                    .map(|(_, page)| page);
                let pending = lock(&ahead).take();
                let (reader, ahead) = (self.clone(), ahead.clone());
                async move {
                    let page = match (ready, pending) {
                        (Some(page), _) => page,
                        (None, Some((at, read))) if at == after => match read.await {
                            Ok(page) => page?,
                            Err(e) => return Err(Error::backend(NAME, e)),
                        },
                        (None, _) => blocking(reader.read(after)).await?,
                    };
                    if let (false, Some(last), Ok(runtime)) = (
                        page.last,
                        page.events.last(),
                        tokio::runtime::Handle::try_current(),
                    ) {
                        let next = last.id.position.minor;
                        let read = runtime.spawn_blocking(reader.read(next));
                        *lock(&ahead) = Some((next, read));
                    }
                    Ok(page)
                }
            },
        )
    }
}

impl Shared {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mcp_event_store_core::backend::dense;
    use mcp_event_store_core::{Error, EventId, EventStore, NewEvent};

    use crate::test_support::replayed_after;
    use crate::{SledOptions, SledStore};

    /// The crash-reissue trap: an event that is written but not yet flushed
    /// must be invisible to every reader, and become visible once flushed,
    /// even if the task that appended it was cancelled meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_never_see_an_unflushed_event() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path(), SledOptions::default())
            .await
            .unwrap();
        let db = store.shared().unwrap();
        let first = store.store_event("s", NewEvent::new(b"1")).await.unwrap();

        for cancel in [false, true] {
            db.flusher.pause(true);
            let written = db.events.len() + 1;
            let pending = tokio::spawn({
                let store = store.clone();
                async move { store.store_event("s", NewEvent::new(b"next")).await }
            });
            while db.events.len() < written {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let next = EventId::new(
                first.token,
                dense::position(first.position.major, written as u64),
            );
            assert!(!pending.is_finished(), "returned before the flush");
            let visible = replayed_after(&store, &first).await.unwrap();
            assert_eq!(
                visible.len(),
                written - 2,
                "an unflushed event was replayed"
            );
            assert_eq!(
                store
                    .get_stream_id_for_event_id(&next.to_string())
                    .await
                    .unwrap(),
                None
            );
            assert!(matches!(
                replayed_after(&store, &next).await,
                Err(Error::UnknownEventId { .. })
            ));
            if cancel {
                pending.abort();
            }
            db.flusher.pause(false);
            if cancel {
                // Whoever flushes publishes it although nobody waits any more.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while store
                    .get_stream_id_for_event_id(&next.to_string())
                    .await
                    .unwrap()
                    .is_none()
                {
                    assert!(std::time::Instant::now() < deadline, "never published");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            } else {
                assert_eq!(pending.await.unwrap().unwrap(), next);
            }
            assert_eq!(
                replayed_after(&store, &first).await.unwrap().last(),
                Some(&next)
            );
        }
        drop(db);
        store.close().await.unwrap();
    }
}
