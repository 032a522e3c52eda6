//! Replaying (C3, C5, C16) and looking up (C4): direct gets by subject,
//! page by page, each event checked against the one before it.

use async_nats::jetstream::message::StreamMessage;
use bytes::Bytes;
use mcp_event_store_core::backend::{Page, StreamToken, paged_replay};
use mcp_event_store_core::{Error, EventId, Position, Replay, Result, StoredEvent};

use crate::NatsStore;
use crate::get::{At, get};
use crate::wire::{self, Body, Header};

/// One event as read: its sequence, header, stream id and payload.
pub(crate) type Read = (u64, Header, Bytes, Body);

impl NatsStore {
    /// The newest event of a subject.
    pub(crate) async fn last_event(&self, subject: &str) -> Result<Option<Read>> {
        read(get(&self.inner.events, At::Last(subject)).await?)
    }

    /// The first event of a subject at or after sequence `from` (`None`:
    /// from its oldest).
    pub(crate) async fn next_event(
        &self,
        subject: &str,
        from: Option<u64>,
    ) -> Result<Option<Read>> {
        read(get(&self.inner.events, At::Next(subject, from)).await?)
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
    pub(crate) async fn open_replay(&self, raw: &str, cursor: EventId) -> Result<Replay> {
        let token = cursor.token;
        let Position {
            major: base,
            minor: after,
        } = cursor.position;
        let Some(next) = after.checked_add(1).filter(|_| base != 0 && after >= base) else {
            return Err(Error::unknown_event_id(raw));
        };
        let subject = self.inner.names.event_subject(&token);
        let (first, stream_id) = loop {
            match self.next_event(&subject, Some(next)).await? {
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
                None => match self.last_event(&subject).await? {
                    Some((seq, header, sid, _)) if seq == after && header.base == base => {
                        break (None, stream_id(&sid)?);
                    }
                    // Appended since the first read: read again.
                    Some((seq, ..)) if seq > after => continue,
                    _ => return Err(Error::unknown_event_id(raw)),
                },
            }
        };
        let mut first = match first {
            Some(read) => Some(self.event(token, read).await?),
            None => None,
        };
        let store = self.clone();
        let raw = raw.to_owned();
        let events = paged_replay(cursor.position, move |position| {
            let first = first.take();
            let store = store.clone();
            let raw = raw.clone();
            let subject = subject.clone();
            async move {
                let mut page = Page::default();
                let mut position = position;
                if let Some(first) = first {
                    position = first.id.position;
                    page.events.push(first);
                }
                store
                    .fill_page(&raw, token, &subject, base, position, page)
                    .await
            }
        });
        Ok(Replay { stream_id, events })
    }

    /// Every retained event of `stream_id` from its oldest (C16).
    pub(crate) async fn open_stream_replay(&self, stream_id: &str) -> Result<Replay> {
        let token = self.token(stream_id);
        let subject = self.inner.names.event_subject(&token);
        let Some(read) = self.next_event(&subject, None).await? else {
            return Ok(Replay::empty(stream_id));
        };
        let (base, seq) = (read.1.base, read.0);
        let mut first = Some(self.event(token, read).await?);
        let store = self.clone();
        let raw = format!("the oldest event of stream {stream_id:?}");
        let events = paged_replay(Position::new(base, seq), move |position| {
            let first = first.take();
            let store = store.clone();
            let raw = raw.clone();
            let subject = subject.clone();
            async move {
                let mut page = Page::default();
                if let Some(first) = first {
                    page.events.push(first);
                }
                store
                    .fill_page(&raw, token, &subject, base, position, page)
                    .await
            }
        });
        Ok(Replay {
            stream_id: stream_id.to_owned(),
            events,
        })
    }

    /// Reads events after `position` into `page` until it holds a page
    /// size of them or the stream has no more. Each must chain to the one
    /// before it in the same life, or retention (or a delete) removed what
    /// the replay had not reached yet: `EventsPurged`, never a gap.
    async fn fill_page(
        &self,
        raw: &str,
        token: StreamToken,
        subject: &str,
        base: u64,
        mut position: Position,
        mut page: Page,
    ) -> Result<Page> {
        if self.is_closed_now() {
            return Err(Error::Closed);
        }
        let page_size = self.inner.options.store.page_size;
        while page.events.len() < page_size {
            let Some(next) = position.minor.checked_add(1) else {
                page.last = true;
                return Ok(page);
            };
            let Some(read) = self.next_event(subject, Some(next)).await? else {
                page.last = true;
                return Ok(page);
            };
            if read.1.base != base || read.1.prev != position.minor {
                return Err(Error::events_purged(raw));
            }
            let read = self.event(token, read).await?;
            position = read.id.position;
            page.events.push(read);
        }
        Ok(page)
    }

    /// The stream of a retained event (C4): the event must be there, on
    /// its stream's subject, in the life its id names.
    pub(crate) async fn lookup(&self, id: EventId) -> Result<Option<String>> {
        let Position {
            major: base,
            minor: seq,
        } = id.position;
        if base == 0 || seq < base {
            return Ok(None);
        }
        let got = get(&self.inner.events, At::Seq(seq)).await?;
        let subject = self.inner.names.event_subject(&id.token);
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
}

fn read(got: Option<StreamMessage>) -> Result<Option<Read>> {
    let Some(message) = got else {
        return Ok(None);
    };
    let (header, sid, data) = wire::decode(message.sequence, message.payload)?;
    Ok(Some((message.sequence, header, sid, data)))
}

impl NatsStore {
    /// An event as replayed, its payload read back if it was spilled.
    async fn event(&self, token: StreamToken, (seq, header, _, body): Read) -> Result<StoredEvent> {
        let data = match body {
            Body::Inline(data) => data,
            Body::Spilled(spilled) => self.unspill(&event_owner(&token), &spilled).await?,
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
