//! Appending (C1, C2, C6): one JetStream publish, acknowledged once the
//! stream stored it (on a quorum of its replicas), chained to the stream's
//! previous event by JetStream's per-subject expected sequence.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{Error, EventId, NewEvent, Position, Result};

use crate::NatsStore;
use crate::error::{backend, is_conflict};
use crate::replay::{event_owner, last_event};
use crate::spill::{inline_limit, spill};
use crate::state::Head;
use crate::wire::{self, Header, MAX_OVERHEAD};

/// How many times an append re-reads its stream's head after another
/// writer's append got in first, before it gives up.
const MAX_ATTEMPTS: usize = 64;

/// Appends one event: the publish names the sequence of the stream's
/// newest event as this handle knows it, and JetStream stores it only
/// if that is still the newest, so events of one stream form an
/// unbroken chain (`prev`) whatever the writers. When another writer
/// got in first, the head is read again and the publish retried. The
/// message id is the same for every try, so a try whose
/// acknowledgement was lost is not stored twice.
pub(crate) async fn append(
    store: &NatsStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    let inner = &store.inner;
    let token = store.token(stream_id);
    let subject = inner.names.event_subject(&token);
    // A payload too large for one message goes to the spill stream
    // first (see `spill`); the event then holds its reference.
    let spilled = if event.data.len() > inline_limit(store, MAX_OVERHEAD) {
        Some(spill(store, &event_owner(&token), event.data).await?)
    } else {
        None
    };
    let message_id = message_id()?;
    let _turn = inner.append_turn(&token).await;
    let at = store.now();
    // The head this handle last wrote, or read once.
    let mut head = match inner.head(&token) {
        Some(head) => Some(head),
        None => read_head(store, &subject).await?,
    };
    for _ in 0..MAX_ATTEMPTS {
        let (base, prev, before) = head.map_or((0, 0, 0), |h| (h.base, h.seq, h.total));
        let header = Header {
            at,
            base,
            prev,
            total: before + event.data.len() as u64,
            retry: event.retry,
        };
        let body = match &spilled {
            Some(spilled) => wire::encode_spilled(&header, stream_id, spilled),
            None => wire::encode(&header, stream_id, event.data),
        };
        let publish = PublishMessage::build()
            .payload(body)
            .message_id(&message_id)
            .expected_last_subject_sequence(prev);
        let acked = match inner.js.send_publish(subject.clone(), publish).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => {
                let seq = ack.sequence;
                let base = if base == 0 { seq } else { base };
                inner.remember_head(
                    token,
                    Head {
                        seq,
                        base,
                        total: header.total,
                    },
                );
                wake(store, &token).await;
                return Ok(EventId {
                    token,
                    position: Position::new(base, seq),
                });
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence || is_conflict(&e) => {
                // Another writer appended (or retention or a delete
                // changed the stream): read its head and chain again.
                inner.forget_head(&token);
                head = read_head(store, &subject).await?;
            }
            Err(e) => {
                inner.forget_head(&token);
                return Err(backend(e));
            }
        }
    }
    Err(Error::backend(
        crate::error::NAME,
        format!("{MAX_ATTEMPTS} appends to one stream got in before this one; try again"),
    ))
}

/// The newest event of a stream, as its head, or `None` for a stream
/// with no event retained.
pub(crate) async fn read_head(store: &NatsStore, subject: &str) -> Result<Option<Head>> {
    let Some((seq, header, _, _)) = last_event(store, subject).await? else {
        return Ok(None);
    };
    Ok(Some(Head {
        seq,
        base: header.base,
        total: header.total,
    }))
}

/// Wakes the followers of `token` on every handle (C13). Best effort:
/// a lost wake-up only delays a follower to its next re-read.
async fn wake(store: &NatsStore, token: &StreamToken) {
    store.inner.wakeups.wake(token);
    let subject = store.inner.names.wake_subject(token);
    if let Err(e) = store.inner.client.publish(subject, Bytes::new()).await {
        tracing::debug!(error = %e, "publishing a wake-up failed");
    }
}

/// A fresh id for one append's message (JetStream's duplicate check).
fn message_id() -> Result<String> {
    let key = mcp_event_store_core::backend::StreamKey::generate()?;
    Ok(key.as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
