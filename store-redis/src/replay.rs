//! Replaying (C3, C5) and looking an event up (C4): the first page read
//! inclusively from the cursor with the metadata in one `MULTI`, later
//! pages exclusively, each checked against the metadata read with it.

use mcp_event_store_core::backend::{Page, StreamToken, paged_replay_with};
use mcp_event_store_core::{Error, EventId, Position, Replay, ReplayEvents, Result};
use redis::Value;

use crate::RedisStore;
use crate::keys::StreamKeys;
use crate::options::SECRET_ATTEMPTS;
use crate::setup::secret_kept_changing;
use crate::wire::{after, entry_id, parse_entries, parse_meta_id};

/// What the metadata hash says about a stream.
struct Meta {
    base: Position,
    last: Position,
    purged: Option<Position>,
}

impl Meta {
    fn parse(base: Option<String>, last: Option<String>, purged: Option<String>) -> Result<Self> {
        let (Some(base), Some(last)) = (
            parse_meta_id(base.as_deref())?,
            parse_meta_id(last.as_deref())?,
        ) else {
            return Err(Error::Corrupt(
                "stream metadata without base or last id".into(),
            ));
        };
        Ok(Self {
            base,
            last,
            purged: parse_meta_id(purged.as_deref())?,
        })
    }

    /// Whether `position` lies in the range of ids this stream issued.
    fn issued(&self, position: Position) -> bool {
        (self.base..=self.last).contains(&position)
    }
}

/// Opens a replay after `raw` (C3, C5): checks the cursor against the
/// metadata and reads the first page at once; later pages as they are
/// polled.
pub(crate) async fn replay_after(store: &RedisStore, raw: &str, cursor: EventId) -> Result<Replay> {
    let token = cursor.token;
    let keys = store.inner.keys.stream(&token);
    let page_size = store.page_size();
    // One round trip: the metadata, and an inclusive range that must
    // start with the cursor itself, which proves the cursor was issued
    // (a position between two real ids is never accepted).
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("HMGET")
        .arg(&keys.meta)
        .arg(&["sid", "base", "last", "purged"])
        .cmd("XRANGE")
        .arg(&keys.events)
        .arg(entry_id(cursor.position))
        .arg("+")
        .arg("COUNT")
        .arg(page_size.saturating_add(1));
    let (meta, entries): (MetaRow, Value) = store.read(&pipe).await?;
    let (Some(stream_id), base, last, purged) = meta else {
        return Err(Error::unknown_event_id(raw));
    };
    let meta = Meta::parse(base, last, purged)?;
    let mut events = first_page(raw, &meta, cursor.position, parse_entries(token, entries)?)?;
    events.truncate(page_size);
    let first = Page {
        last: events.len() < page_size,
        events,
    };
    let events = pages(
        store,
        raw.to_owned(),
        token,
        keys,
        meta.base,
        cursor.position,
        first,
    );
    Ok(Replay { stream_id, events })
}

/// Every retained event of a stream from its oldest (C16): the
/// metadata and the first page (`XRANGE - +`) in one `MULTI`, later
/// pages as a replay's, with the same checks. A stream not found under
/// this handle's secret is looked for again once the secret is checked
/// (C14), as a delete does.
pub(crate) async fn replay_whole(store: &RedisStore, stream_id: &str) -> Result<Replay> {
    let page_size = store.page_size();
    for _ in 0..SECRET_ATTEMPTS {
        let key = store.key();
        let token = key.token(stream_id);
        let keys = store.inner.keys.stream(&token);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HMGET")
            .arg(&keys.meta)
            .arg(&["sid", "base", "last", "purged"])
            .cmd("XRANGE")
            .arg(&keys.events)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(page_size);
        let (meta, entries): (MetaRow, Value) = store.read(&pipe).await?;
        let (Some(_), base, last, purged) = meta else {
            if store.secret_holds(&key).await? {
                return Ok(Replay::empty(stream_id));
            }
            continue;
        };
        let meta = Meta::parse(base, last, purged)?;
        let events = parse_entries(token, entries)?;
        let Some(oldest) = events.first().map(|e| e.id) else {
            return Ok(Replay::empty(stream_id));
        };
        let first = Page {
            last: events.len() < page_size,
            events,
        };
        let events = pages(
            store,
            oldest.to_string(),
            token,
            keys,
            meta.base,
            Position::ZERO,
            first,
        );
        return Ok(Replay {
            stream_id: stream_id.to_owned(),
            events,
        });
    }
    Err(secret_kept_changing())
}

/// The events after `start`: `first`, then the pages after it as they
/// are polled, each checked against the metadata read with it; `raw` names
/// the replay in errors.
fn pages(
    store: &RedisStore,
    raw: String,
    token: StreamToken,
    keys: StreamKeys,
    base: Position,
    start: Position,
    first: Page,
) -> ReplayEvents {
    let store = store.clone();
    paged_replay_with(start, first, move |position| {
        let (store, raw, keys) = (store.clone(), raw.clone(), keys.clone());
        async move { page(&store, &raw, token, &keys, base, position).await }
    })
}

/// Reads the page after `position`, checked against the metadata read in
/// the same transaction: the stream must be the same incarnation (same
/// `base`) and retention must not have removed anything after `position`.
async fn page(
    store: &RedisStore,
    raw: &str,
    token: StreamToken,
    keys: &StreamKeys,
    base: Position,
    position: Position,
) -> Result<Page> {
    let page_size = store.page_size();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("XRANGE")
        .arg(&keys.events)
        .arg(after(position))
        .arg("+")
        .arg("COUNT")
        .arg(page_size)
        .cmd("HMGET")
        .arg(&keys.meta)
        .arg(&["base", "last", "purged"]);
    let (entries, (base_now, last, purged)): (Value, PageMeta) = store.read(&pipe).await?;
    if parse_meta_id(base_now.as_deref())? != Some(base) {
        // Deleted (or deleted and recreated) while we were reading.
        return Err(Error::events_purged(raw));
    }
    if parse_meta_id(purged.as_deref())?.is_some_and(|purged| purged > position) {
        return Err(Error::events_purged(raw));
    }
    let events = parse_entries(token, entries)?;
    check_not_emptied(raw, &events, parse_meta_id(last.as_deref())?, position)?;
    Ok(Page {
        last: events.len() < page_size,
        events,
    })
}

/// The stream of a retained event, or `None` (C4).
pub(crate) async fn stream_of(store: &RedisStore, id: EventId) -> Result<Option<String>> {
    let keys = store.inner.keys.stream(&id.token);
    // The entry itself must exist: a position between two issued ids is
    // never found.
    let at = entry_id(id.position);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("HGET")
        .arg(&keys.meta)
        .arg("sid")
        .cmd("XRANGE")
        .arg(&keys.events)
        .arg(&at)
        .arg(&at)
        .arg("COUNT")
        .arg(1);
    let (sid, entry): (Option<String>, Vec<Value>) = store.read(&pipe).await?;
    Ok(sid.filter(|_| !entry.is_empty()))
}

/// `HMGET meta base last purged`, read with each later page.
type PageMeta = (Option<String>, Option<String>, Option<String>);

/// Checks the first page of a replay, read inclusively from the cursor, and
/// returns the events after the cursor (at most one page).
///
/// * outside the ids this stream issued: `UnknownEventId`;
/// * before the newest id retention removed: `EventsPurged`;
/// * the newest id retention removed itself: it was issued, and nothing
///   after it is gone, so the replay goes on from there;
/// * within the retained window: the read must start with the cursor's own
///   entry, or the position was never issued (`UnknownEventId`); nothing at
///   all while the stream's newest id is at or after the cursor means the
///   events key was lost (`EventsPurged`).
fn first_page(
    raw: &str,
    meta: &Meta,
    cursor: Position,
    mut events: Vec<mcp_event_store_core::StoredEvent>,
) -> Result<Vec<mcp_event_store_core::StoredEvent>> {
    if !meta.issued(cursor) {
        return Err(Error::unknown_event_id(raw));
    }
    match meta.purged {
        Some(purged) if cursor < purged => return Err(Error::events_purged(raw)),
        Some(purged) if cursor == purged => {
            events.retain(|e| e.id.position > cursor);
        }
        _ => match events.first() {
            None => return Err(Error::events_purged(raw)),
            Some(first) if first.id.position != cursor => {
                return Err(Error::unknown_event_id(raw));
            }
            Some(_) => {
                events.remove(0);
            }
        },
    }
    Ok(events)
}

/// An empty page while the stream's newest id lies beyond `position` means
/// the events after it are gone (the events key was evicted or deleted by
/// hand): a gap, refused like any other.
fn check_not_emptied(
    raw: &str,
    events: &[mcp_event_store_core::StoredEvent],
    last: Option<Position>,
    position: Position,
) -> Result<()> {
    if events.is_empty() && last.is_some_and(|last| last > position) {
        return Err(Error::events_purged(raw));
    }
    Ok(())
}

/// `HMGET meta sid base last purged`.
type MetaRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mcp_event_store_core::backend::StreamKey;

    #[test]
    fn meta_ranges() {
        let meta = Meta {
            base: Position::new(10, 0),
            last: Position::new(20, 3),
            purged: Some(Position::new(12, 0)),
        };
        assert!(!meta.issued(Position::seq(9)));
        assert!(meta.issued(Position::new(20, 3)));
        assert!(!meta.issued(Position::new(20, 4)));
    }

    #[test]
    fn the_first_page_must_start_at_the_cursor() {
        let token = StreamKey::generate().unwrap().token("s");
        let page = |positions: &[(u64, u64)]| -> Vec<mcp_event_store_core::StoredEvent> {
            positions
                .iter()
                .map(|&(a, b)| mcp_event_store_core::StoredEvent {
                    id: EventId::new(token, Position::new(a, b)),
                    data: Bytes::new(),
                    retry: None,
                })
                .collect()
        };
        let positions = |events: Vec<mcp_event_store_core::StoredEvent>| -> Vec<Position> {
            events.iter().map(|e| e.id.position).collect()
        };
        let meta = Meta {
            base: Position::new(10, 0),
            last: Position::new(30, 0),
            purged: Some(Position::new(12, 0)),
        };
        let unknown = |r: Result<_>| matches!(r, Err(Error::UnknownEventId { .. }));
        let purged = |r: Result<_>| matches!(r, Err(Error::EventsPurged { .. }));
        // Within the window: the read starts with the cursor, which is dropped.
        let got = first_page("x", &meta, Position::new(20, 0), page(&[(20, 0), (25, 0)]));
        assert_eq!(positions(got.unwrap()), vec![Position::new(25, 0)]);
        // A position between two real ids, or before one, was never issued.
        assert!(unknown(first_page(
            "x",
            &meta,
            Position::new(20, 1),
            page(&[(25, 0)])
        )));
        assert!(unknown(first_page(
            "x",
            &meta,
            Position::new(13, 0),
            page(&[(14, 0)])
        )));
        // Outside the issued range.
        assert!(unknown(first_page("x", &meta, Position::ZERO, page(&[]))));
        assert!(unknown(first_page(
            "x",
            &meta,
            Position::new(30, 1),
            page(&[])
        )));
        // Before the newest purged id: a gap.
        assert!(purged(first_page(
            "x",
            &meta,
            Position::new(11, 0),
            page(&[(14, 0)])
        )));
        // The newest purged id itself: nothing after it is gone.
        let got = first_page("x", &meta, Position::new(12, 0), page(&[(14, 0)]));
        assert_eq!(positions(got.unwrap()), vec![Position::new(14, 0)]);
        // Nothing at all although the stream reaches the cursor: lost events.
        assert!(purged(first_page(
            "x",
            &meta,
            Position::new(30, 0),
            page(&[])
        )));
    }
}
