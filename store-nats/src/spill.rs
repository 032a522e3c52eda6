//! Values larger than one NATS message (`max_payload`, 1 MiB by default):
//! written as chunks to the stream `<prefix>-spill` first, on a subject of
//! their own, `<prefix>.sp.<owner>.<id>`, and then referred to from the
//! event, session or task that owns them by a small [`SpillRef`].
//!
//! The owner names the event stream (`e<token>`), session (`s<key>`) or
//! task (`t<digest>`) the value belongs to, so removing an owner removes
//! its values with one purge. A value no owner refers to any more (an event
//! JetStream's count limit removed, a session written again, a crash
//! between the chunks and their owner) is found by `purge_expired`, which
//! removes every value of an owner that the owner does not refer to, once
//! it is older than [`GRACE`] (so an append still writing its owner is
//! never cut short). The `id` starts with the value's write time by the
//! store's clock, which is what that age is read from.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::TryStreamExt;
use mcp_event_store_core::{Error, Result};

use crate::NatsStore;
use crate::error::backend;
use crate::get::{At, get};

/// How old an unreferenced value must be before a purge removes it.
pub(crate) const GRACE: Duration = Duration::from_secs(5 * 60);

/// The bytes a chunk leaves for the message's headers and subject.
const CHUNK_SLACK: usize = 512;

/// A spilled value as its owner refers to it: 48 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SpillRef {
    /// `<write time, 16 hex>` `<random, 16 hex>`.
    pub(crate) id: String,
    /// The value's length in bytes.
    pub(crate) len: u64,
    /// How many chunks hold it.
    pub(crate) chunks: u32,
}

/// The length of an encoded [`SpillRef`].
pub(crate) const REF_LEN: usize = 32 + 8 + 4;

impl SpillRef {
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_slice(self.id.as_bytes());
        out.put_u64_le(self.len);
        out.put_u32_le(self.chunks);
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let corrupt = || Error::Corrupt("a reference to a spilled value is malformed".into());
        if bytes.len() != REF_LEN {
            return Err(corrupt());
        }
        let id = std::str::from_utf8(&bytes[..32])
            .ok()
            .filter(|id| id.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(corrupt)?
            .to_owned();
        let len = u64::from_le_bytes(bytes[32..40].try_into().expect("8 bytes"));
        let chunks = u32::from_le_bytes(bytes[40..44].try_into().expect("4 bytes"));
        Ok(Self { id, len, chunks })
    }

    /// When the value was written, by the store's clock.
    fn written_at(&self) -> i64 {
        i64::from_str_radix(&self.id[..16], 16).unwrap_or(i64::MAX)
    }
}

/// The largest value that fits one message beside `overhead` bytes of
/// the owner's own.
pub(crate) fn inline_limit(store: &NatsStore, overhead: usize) -> usize {
    store
        .inner
        .client
        .max_payload()
        .saturating_sub(overhead + CHUNK_SLACK)
}

fn spill_subject(store: &NatsStore, owner: &str, id: &str) -> String {
    format!("{}.sp.{owner}.{id}", store.inner.names.prefix)
}

/// Writes `value` as chunks for `owner`, every chunk acknowledged,
/// and returns the reference to keep in the owner.
pub(crate) async fn spill(store: &NatsStore, owner: &str, value: &[u8]) -> Result<SpillRef> {
    let random = mcp_event_store_core::backend::StreamKey::generate()?;
    let id = format!(
        "{:016x}{}",
        store.now().max(0),
        random.as_bytes()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let subject = spill_subject(store, owner, &id);
    let size = inline_limit(store, 0).max(1);
    let mut acks = Vec::new();
    for chunk in value.chunks(size) {
        let ack = store
            .inner
            .js
            .publish(subject.clone(), Bytes::copy_from_slice(chunk))
            .await
            .map_err(backend)?;
        acks.push(ack);
    }
    for ack in acks {
        ack.await.map_err(backend)?;
    }
    Ok(SpillRef {
        id,
        len: value.len() as u64,
        chunks: u32::try_from(value.len().div_ceil(size)).unwrap_or(u32::MAX),
    })
}

/// Reads a spilled value back whole.
pub(crate) async fn unspill(store: &NatsStore, owner: &str, spilled: &SpillRef) -> Result<Bytes> {
    let subject = spill_subject(store, owner, &spilled.id);
    let mut out = BytesMut::with_capacity(usize::try_from(spilled.len).unwrap_or(0));
    let mut from = None;
    for _ in 0..spilled.chunks {
        let chunk = get(&store.inner.spill, At::Next(&subject, from))
            .await?
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "a chunk of a spilled value ({}) is missing",
                    spilled.id
                ))
            })?;
        from = Some(chunk.sequence + 1);
        out.put_slice(&chunk.payload);
    }
    if out.len() as u64 != spilled.len {
        return Err(Error::Corrupt(format!(
            "a spilled value ({}) has {} bytes, its reference says {}",
            spilled.id,
            out.len(),
            spilled.len
        )));
    }
    Ok(out.freeze())
}

/// Removes every spilled value of `owner`, or the one `id`.
pub(crate) async fn drop_spilled(store: &NatsStore, owner: &str, id: Option<&str>) -> Result<()> {
    let filter = match id {
        Some(id) => spill_subject(store, owner, id),
        None => format!("{}.sp.{owner}.*", store.inner.names.prefix),
    };
    store
        .inner
        .spill
        .purge()
        .filter(filter)
        .await
        .map_err(backend)?;
    Ok(())
}

/// Every spilled value, as `(owner, id)`.
pub(crate) async fn spilled(store: &NatsStore) -> Result<Vec<(String, String)>> {
    let prefix = format!("{}.sp.", store.inner.names.prefix);
    let mut subjects = store
        .inner
        .spill
        .info_with_subjects(format!("{prefix}>"))
        .await
        .map_err(backend)?;
    let mut out = Vec::new();
    while let Some((subject, _)) = subjects.try_next().await.map_err(backend)? {
        if let Some((owner, id)) = subject
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split_once('.'))
        {
            out.push((owner.to_owned(), id.to_owned()));
        }
    }
    Ok(out)
}

/// Removes the values of `owner` older than [`GRACE`] that are not in
/// `kept`; how many.
pub(crate) async fn drop_unreferenced(
    store: &NatsStore,
    owner: &str,
    ids: &[String],
    kept: &[String],
) -> Result<u64> {
    let cutoff = store
        .now()
        .saturating_sub(i64::try_from(GRACE.as_millis()).unwrap_or(i64::MAX));
    let mut dropped = 0;
    for id in ids {
        let old = SpillRef {
            id: id.clone(),
            len: 0,
            chunks: 0,
        }
        .written_at()
            < cutoff;
        if old && !kept.contains(id) {
            drop_spilled(store, owner, Some(id)).await?;
            dropped += 1;
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_round_trip() {
        let spilled = SpillRef {
            id: format!("{:016x}{:016x}", 1_700_000_000_000u64, 42u64),
            len: 3 << 20,
            chunks: 4,
        };
        let mut out = BytesMut::new();
        spilled.encode(&mut out);
        assert_eq!(out.len(), REF_LEN);
        assert_eq!(SpillRef::decode(&out).unwrap(), spilled);
        assert_eq!(spilled.written_at(), 1_700_000_000_000);
        assert!(SpillRef::decode(&out[..10]).is_err());
    }
}
