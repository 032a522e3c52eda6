//! Reading one message of a stream: by sequence, the next on a subject
//! from a sequence, or the newest on a subject.
//!
//! A stream on one server answers direct gets (`allow_direct`), the
//! cheapest read JetStream has. A replicated stream is read through its
//! leader instead (the stream API's message get): with direct gets, any
//! replica answers, and one that has not applied the newest write yet
//! would show a value older than a write already acknowledged.

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind, Stream};
use mcp_event_store_core::Result;

use crate::error::backend;

/// Which message to read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum At<'a> {
    /// The message at this sequence.
    Seq(u64),
    /// The first message on the subject at or after the sequence (`None`:
    /// its oldest).
    Next(&'a str, Option<u64>),
    /// The newest message on the subject.
    Last(&'a str),
}

/// Reads one message of `stream`; `None` when there is none.
pub(crate) async fn get(stream: &Stream, at: At<'_>) -> Result<Option<StreamMessage>> {
    if stream.cached_info().config.allow_direct {
        let got = match at {
            At::Seq(seq) => stream.direct_get(seq).await,
            At::Next(subject, from) => stream.direct_get_next_for_subject(subject, from).await,
            At::Last(subject) => stream.direct_get_last_for_subject(subject).await,
        };
        match got {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(backend(e)),
        }
    } else {
        let builder = stream.raw_message_builder();
        let got = match at {
            At::Seq(seq) => builder.sequence(seq).send().await,
            At::Next(subject, from) => {
                builder
                    .sequence(from.unwrap_or(1))
                    .next_by_subject(subject.to_owned())
                    .send()
                    .await
            }
            At::Last(subject) => builder.last_by_subject(subject.to_owned()).send().await,
        };
        match got {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }
}
