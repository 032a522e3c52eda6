//! Replaying (C3, C5, C16) and looking up (C4): direct gets by subject,
//! page by page, each event checked against the one before it.

use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use mcp_event_store_core::backend::{Page, StreamToken, paged_replay, paged_replay_with};
use mcp_event_store_core::{Error, EventId, Position, Replay, ReplayEvents, Result, StoredEvent};

use crate::NatsStore;
use crate::get::{At, get};
use crate::spill::unspill;
use crate::wire::{self, Body, Header};

/// One event as read: its sequence, header, stream id and payload.
pub(crate) type Read = (u64, Header, Bytes, Body);

/// The newest event of a subject.
pub(crate) async fn last_event(store: &NatsStore, subject: &str) -> Result<Option<Read>> {
    read(get(&store.inner.events, At::Last(subject)).await?)
}

/// The first event of a subject at or after sequence `from` (`None`:
/// from its oldest).
pub(crate) async fn next_event(
    store: &NatsStore,
    subject: &str,
    from: Option<u64>,
) -> Result<Option<Read>> {
    read(get(&store.inner.events, At::Next(subject, from)).await?)
}

/// The replay after `cursor` (C3, C5).
///
/// The cursor is `<base>-<seq>`: the first sequence of its stream's
/// life, and its own. The first event after it in the stream must
/// chain to it (`prev == seq`) in the same life; an event of the same
/// life that chains to something later means what followed the cursor
/// was removed (`EventsPurged`); anything else, or nothing while the
/// stream's newest event is not the cursor, means the cursor was never
/// issued in this life of the stream (`UnknownEventId`).
pub(crate) async fn replay_after(store: &NatsStore, raw: &str, cursor: EventId) -> Result<Replay> {
    let token = cursor.token;
    let Position {
        major: base,
        minor: after,
    } = cursor.position;
    let Some(next) = after.checked_add(1).filter(|_| base != 0 && after >= base) else {
        return Err(Error::unknown_event_id(raw));
    };
    let subject = store.inner.names.event_subject(&token);
    let (first, stream_id) = loop {
        match next_event(store, &subject, Some(next)).await? {
            Some(read) => {
                let header = read.1;
                if header.base != base || header.prev < after {
                    return Err(Error::unknown_event_id(raw));
                }
                if header.prev > after {
                    return Err(Error::events_purged(raw));
                }
                let stream_id = stream_id(&read.2)?;
                break (Some(read), stream_id);
            }
            None => match last_event(store, &subject).await? {
                Some((seq, header, sid, _)) if seq == after && header.base == base => {
                    break (None, stream_id(&sid)?);
                }
                // Appended since the first read: read again.
                Some((seq, ..)) if seq > after => continue,
                _ => return Err(Error::unknown_event_id(raw)),
            },
        }
    };
    let first = match first {
        Some(read) => Some(event(store, token, read).await?),
        None => None,
    };
    let events = pages(
        store,
        raw.to_owned(),
        token,
        subject,
        base,
        cursor.position,
        first,
    );
    Ok(Replay { stream_id, events })
}

/// Every retained event of `stream_id` from its oldest (C16).
pub(crate) async fn replay_whole(store: &NatsStore, stream_id: &str) -> Result<Replay> {
    let token = store.token(stream_id);
    let subject = store.inner.names.event_subject(&token);
    let Some(read) = next_event(store, &subject, None).await? else {
        return Ok(Replay::empty(stream_id));
    };
    let (base, seq) = (read.1.base, read.0);
    let first = event(store, token, read).await?;
    let raw = format!("the oldest event of stream {stream_id:?}");
    let events = pages(
        store,
        raw,
        token,
        subject,
        base,
        Position::new(base, seq),
        Some(first),
    );
    Ok(Replay {
        stream_id: stream_id.to_owned(),
        events,
    })
}

/// The events after `after`: `first` (the event the opening read found,
/// if any), then the pages after it as they are polled; `raw` names the
/// replay in errors.
fn pages(
    store: &NatsStore,
    raw: String,
    token: StreamToken,
    subject: String,
    base: u64,
    after: Position,
    first: Option<StoredEvent>,
) -> ReplayEvents {
    let store = store.clone();
    let fetch = move |position| {
        let (store, raw, subject) = (store.clone(), raw.clone(), subject.clone());
        async move { fill_page(&store, &raw, token, &subject, base, position).await }
    };
    match first {
        Some(first) => {
            let first = Page {
                events: vec![first],
                last: false,
            };
            paged_replay_with(after, first, fetch)
        }
        None => paged_replay(after, fetch),
    }
}

/// Reads the events after `position` into a page until it holds a page
/// size of them or the stream has no more. Each must chain to the one
/// before it in the same life, or retention (or a delete) removed what
/// the replay had not reached yet: `EventsPurged`, never a gap.
async fn fill_page(
    store: &NatsStore,
    raw: &str,
    token: StreamToken,
    subject: &str,
    base: u64,
    mut position: Position,
) -> Result<Page> {
    if store.is_closed_now() {
        return Err(Error::Closed);
    }
    let mut page = Page::default();
    let page_size = store.inner.options.store.page_size;
    while page.events.len() < page_size {
        let Some(next) = position.minor.checked_add(1) else {
            page.last = true;
            return Ok(page);
        };
        let Some(read) = next_event(store, subject, Some(next)).await? else {
            page.last = true;
            return Ok(page);
        };
        if read.1.base != base || read.1.prev != position.minor {
            return Err(Error::events_purged(raw));
        }
        let read = event(store, token, read).await?;
        position = read.id.position;
        page.events.push(read);
    }
    Ok(page)
}

/// The stream of a retained event (C4): the event must be there, on
/// its stream's subject, in the life its id names.
pub(crate) async fn stream_of(store: &NatsStore, id: EventId) -> Result<Option<String>> {
    let Position {
        major: base,
        minor: seq,
    } = id.position;
    if base == 0 || seq < base {
        return Ok(None);
    }
    let got = get(&store.inner.events, At::Seq(seq)).await?;
    let subject = store.inner.names.event_subject(&id.token);
    match got {
        Some(message) if message.subject.as_str() == subject => {
            let (header, sid, _) = wire::decode(seq, message.payload)?;
            if header.base != base {
                return Ok(None);
            }
            stream_id(&sid).map(Some)
        }
        _ => Ok(None),
    }
}

fn read(got: Option<StreamMessage>) -> Result<Option<Read>> {
    let Some(message) = got else {
        return Ok(None);
    };
    let (header, sid, data) = wire::decode(message.sequence, message.payload)?;
    Ok(Some((message.sequence, header, sid, data)))
}

/// An event as replayed, its payload read back if it was spilled.
async fn event(
    store: &NatsStore,
    token: StreamToken,
    (seq, header, _, body): Read,
) -> Result<StoredEvent> {
    let data = match body {
        Body::Inline(data) => data,
        Body::Spilled(spilled) => unspill(store, &event_owner(&token), &spilled).await?,
    };
    Ok(StoredEvent {
        id: EventId {
            token,
            position: Position::new(header.base, seq),
        },
        data,
        retry: header.retry,
    })
}

/// The owner of a stream's spilled payloads.
pub(crate) fn event_owner(token: &StreamToken) -> String {
    format!("e{}", token.to_text())
}

/// A stream id as stored in an event.
pub(crate) fn stream_id(stored: &[u8]) -> Result<String> {
    String::from_utf8(stored.to_vec())
        .map_err(|_| Error::Corrupt("an event's stream id is not UTF-8".into()))
}
