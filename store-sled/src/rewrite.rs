//! Values swapped in place (C22): events, sessions and tasks listed as
//! their trees hold them and swapped by `compare_and_swap` of the one key
//! that holds each, so a swap is atomic against every other write of the
//! process and on disk, with no global lock (sled's batches and
//! transactions take one, see the crate docs, "Layout").
//!
//! A swap replaces only the value's bytes, with bytes of the same length,
//! inside the stored value:
//!
//! * an event's payload after its header, whose time, retry hint and
//!   cumulative byte count stay: the stream's byte counts (rebuilt from
//!   the first and last events' counts and payload lengths) and the age
//!   index are unchanged, so no counter needs touching;
//! * a session's state after its expiry, so the expiry and its entry in the
//!   expiry index stay;
//! * one value inside a task's encoding, so its `rev`, status, times,
//!   instance, claim and purge index entry stay; every task step swaps in
//!   its new value over the whole old one, so a step that read the task
//!   before a swap fails its own swap and reads again.
//!
//! A swap returns once flushed under the handle's durability, as any other
//! write, and wakes no one: no reader or watcher sees a change.

use std::ops::Bound;

use async_trait::async_trait;
use bytes::Bytes;
use mcp_event_store_core::backend::RewriteBackend;
use mcp_event_store_core::backend::dense;
use mcp_event_store_core::backend::task::codec::{decode, decode_to_rewrite, encode};
use mcp_event_store_core::backend::task::{TaskDigest, stored_digest};
use mcp_event_store_core::rewrite::{
    SessionValue, SessionValuePage, TaskField, TaskValuePage, TaskValues,
};
use mcp_event_store_core::{EventId, Result, SessionDigest};

use crate::SledStore;
use crate::error::backend;
use crate::keys::{self, EVENT_HEADER_LEN};
use crate::shared::{Shared, blocking};

/// What every session key of core starts with ([`SessionDigest::key`]):
/// the listing walks only these keys, in the order of their digests.
const SESSION_KEY_PREFIX: &[u8] = b"s1.";

#[async_trait]
impl RewriteBackend for SledStore {
    /// `true`: an event is one value under `token ++ seq`.
    fn rewrites_events(&self) -> bool {
        true
    }

    /// Under the stream's lock (as appends, trims and deletes take it),
    /// the event's value swapped by `compare_and_swap` with its payload
    /// alone changed. Only an event of the stream's current life that
    /// readers can see (durable) is swapped: an id of an earlier life, of
    /// another stream, or not yet visible is `false`.
    async fn event_swap(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let shared = self.shared()?;
        let swapped = blocking({
            let shared = shared.clone();
            let (stream_id, id) = (stream_id.to_owned(), *id);
            let (expected, new) = (expected.to_vec(), new.to_vec());
            move || shared.swap_event(&stream_id, &id, &expected, &new)
        })
        .await?;
        if swapped {
            self.settle(self.flush_after_write(&shared)).await?;
        }
        Ok(swapped)
    }

    /// The session tree from `after`'s key on, in key order, which for
    /// core's `s1.<hex>` keys is digest order; keys of a release from
    /// before digests (C20) are skipped.
    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let shared = self.shared()?;
        let after = after.copied();
        blocking(move || shared.session_page(after, limit)).await
    }

    /// `compare_and_swap` of the session's value (expiry, then state) for
    /// the same expiry and the new state.
    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let shared = self.shared()?;
        let swapped = blocking({
            let shared = shared.clone();
            let key = digest.key();
            let (expected, new) = (expected.to_vec(), new.to_vec());
            move || shared.swap_session(&key, &expected, &new)
        })
        .await?;
        if swapped {
            self.settle(self.flush_after_write(&shared)).await?;
        }
        Ok(swapped)
    }

    /// The task tree after `after`, in key (digest) order.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        let shared = self.shared()?;
        let after = after.copied();
        blocking(move || shared.task_page(after, limit)).await
    }

    /// `compare_and_swap` of the task's whole value for the same encoding
    /// with one value changed; read again when a step swapped in between.
    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let shared = self.shared()?;
        let swapped = blocking({
            let shared = shared.clone();
            let (digest, field) = (*digest, field.clone());
            let (expected, new) = (expected.to_vec(), new.to_vec());
            move || shared.swap_task(&digest, &field, &expected, &new)
        })
        .await?;
        if swapped {
            self.settle(self.flush_after_write(&shared)).await?;
        }
        Ok(swapped)
    }
}

impl Shared {
    /// Swaps the payload of event `id` of `stream_id`; see
    /// [`RewriteBackend::event_swap`].
    fn swap_event(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let token = self.key.token(stream_id);
        let Some((incarnation, seq)) = dense::parts(id.position).filter(|_| id.token == token)
        else {
            return Ok(false);
        };
        self.with_stream(token, |slot, meta| {
            let Some(m) = meta.as_ref() else {
                return Ok(false);
            };
            if &*m.stream_id != stream_id
                || m.incarnation != incarnation
                || !(m.first_seq..=m.last_seq).contains(&seq)
                || seq > slot.durable()
            {
                return Ok(false);
            }
            let key = keys::event_key(&token, seq);
            let Some(old) = self.events.get(key).map_err(backend)? else {
                return Ok(false);
            };
            keys::payload_len(&old)?;
            if old[EVENT_HEADER_LEN..] != *expected {
                return Ok(false);
            }
            let mut value = old.to_vec();
            value[EVENT_HEADER_LEN..].copy_from_slice(new);
            // Under the stream's lock nothing else writes the key; the
            // compare-and-swap is what makes it one step all the same.
            let swapped = self
                .events
                .compare_and_swap(key, Some(old), Some(value))
                .map_err(backend)?;
            Ok(swapped.is_ok())
        })
    }

    /// Up to `limit` sessions after `after`, by digest.
    fn session_page(&self, after: Option<SessionDigest>, limit: usize) -> Result<SessionValuePage> {
        let start = match after {
            Some(after) => Bound::Excluded(after.key().into_bytes()),
            None => Bound::Included(SESSION_KEY_PREFIX.to_vec()),
        };
        let mut sessions = Vec::with_capacity(limit);
        for entry in self.sessions.range::<Vec<u8>, _>((start, Bound::Unbounded)) {
            let (key, value) = entry.map_err(backend)?;
            if !key.starts_with(SESSION_KEY_PREFIX) {
                break;
            }
            let Some(digest) = std::str::from_utf8(&key)
                .ok()
                .and_then(SessionDigest::from_key)
            else {
                continue;
            };
            keys::session_expires(&value)?;
            sessions.push(SessionValue::new(
                digest,
                Bytes::copy_from_slice(&value[8..]),
            ));
            if sessions.len() == limit {
                break;
            }
        }
        Ok(SessionValuePage::new(sessions, limit))
    }

    /// Swaps a session's state, keeping its expiry: a write in between
    /// (a put) is read again, and swapped over only if it still holds the
    /// bytes expected.
    fn swap_session(&self, key: &str, expected: &[u8], new: &[u8]) -> Result<bool> {
        loop {
            let Some(old) = self.sessions.get(key).map_err(backend)? else {
                return Ok(false);
            };
            keys::session_expires(&old)?;
            if old[8..] != *expected {
                return Ok(false);
            }
            let mut value = old.to_vec();
            value[8..].copy_from_slice(new);
            let swapped = self
                .sessions
                .compare_and_swap(key, Some(old), Some(value))
                .map_err(backend)?;
            if swapped.is_ok() {
                return Ok(true);
            }
        }
    }

    /// Up to `limit` tasks after `after`, by digest, with their values.
    fn task_page(&self, after: Option<TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        let range = match after {
            Some(after) => self
                .tasks
                .range::<&[u8], _>((Bound::Excluded(&after.as_bytes()[..]), Bound::Unbounded)),
            None => self.tasks.iter(),
        };
        let mut tasks = Vec::with_capacity(limit);
        for entry in range.take(limit) {
            let (key, value) = entry.map_err(backend)?;
            let stored = decode(&value)?;
            tasks.push(TaskValues::new(stored_digest(&key)?, stored.values()));
        }
        Ok(TaskValuePage::new(tasks, limit))
    }

    /// Swaps one value of a task over the whole stored value.
    fn swap_task(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        loop {
            let Some(old) = self.tasks.get(digest.as_bytes()).map_err(backend)? else {
                return Ok(false);
            };
            let mut stored = decode_to_rewrite(&old)?;
            match stored.value_mut(field) {
                Some(bytes) if bytes[..] == *expected => *bytes = Bytes::copy_from_slice(new),
                _ => return Ok(false),
            }
            let swapped = self
                .tasks
                .compare_and_swap(digest.as_bytes(), Some(old), Some(encode(&stored)))
                .map_err(backend)?;
            if swapped.is_ok() {
                return Ok(true);
            }
        }
    }
}
