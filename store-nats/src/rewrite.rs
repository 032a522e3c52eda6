//! Values swapped in place (C22): sessions and tasks listed as their
//! buckets hold them, and each swapped by one revision-checked write of
//! its key. Events are not: they live in a JetStream stream, whose
//! messages never change.
//!
//! A swap reads the key with its revision, compares the value there with
//! the bytes expected, and writes the new value with the bucket's
//! `update`, a publish that names that revision
//! (`Nats-Expected-Last-Subject-Sequence`): it lands only if nothing was
//! written to the key since the read (JetStream orders the writes to one
//! key on every server of a cluster; 2.9.21 there, as the crate requires).
//! When another write got in first, the swap reads again and compares
//! again, as every task step does: a write of other bytes ends it with
//! `false`, a write that left the value as expected (a task's checkpoint
//! saved beside the context being swapped) does not make it give up.
//!
//! A swap writes the value read back with only the swapped bytes changed:
//! a session keeps its expiry (kept in the value, not by the bucket, whose
//! messages never age out), a task its revision, status, times, instance,
//! claim and takeover index entry. It wakes no watcher: nothing a client
//! or worker reads changed. A value too large for one message goes to the
//! spill stream as a normal write's does: new chunks under a new id (the
//! same length makes the same chunk count), then the key's value swapped
//! by revision; the old chunks stay until `purge_expired` removes them as
//! unreferenced after the grace (a reader may be reading them). A session
//! swap that loses the race drops the chunks it wrote; a task swap's, as
//! a task step's, are left for that purge.
//!
//! Listings read every key of a bucket, from the subjects its stream
//! holds (bounded by the bucket: one value per key), then sort them; see
//! [`session_page`](RewriteBackend::session_page) and
//! [`task_page`](RewriteBackend::task_page) for what a page costs.

use async_nats::jetstream::kv::{self, UpdateErrorKind};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt, stream};
use mcp_event_store_core::backend::RewriteBackend;
use mcp_event_store_core::backend::task::stored_digest;
use mcp_event_store_core::rewrite::{
    SessionValue, SessionValuePage, TaskField, TaskValuePage, TaskValues,
};
use mcp_event_store_core::task::TaskDigest;
use mcp_event_store_core::{Error, EventId, Result, SessionDigest};

use crate::NatsStore;
use crate::error::{backend, is_conflict};
use crate::sessions::{State, decode, encode, session_key};
use crate::spill::{drop_spilled, unspill};
use crate::tasks::{Loaded, entry, hex, keys_of, open_value, swap, unhex};

/// How many session values a listing reads at once: it reads every one
/// (see [`RewriteBackend::session_page`]), so in flight, not in turn.
const READS_IN_FLIGHT: usize = 16;

#[async_trait]
impl RewriteBackend for NatsStore {
    /// Events are JetStream messages, which no write changes: they leave
    /// with retention (the count and age limits, the purge).
    fn rewrites_events(&self) -> bool {
        false
    }

    /// Never called by core (see [`rewrites_events`](Self::rewrites_events));
    /// refused, should anything call it.
    async fn event_swap(&self, _: &str, _: &EventId, _: &[u8], _: &[u8]) -> Result<bool> {
        Err(Error::Config(
            "the nats backend keeps events in a JetStream stream, an append-only log: they \
             cannot be rewritten in place, and leave with retention"
                .into(),
        ))
    }

    /// A session's bucket key is a keyed hash of its digest's key (so
    /// nothing in a key names the session), which says nothing of the
    /// digest's order. So a page lists the bucket's keys (its stream's
    /// subject listing), gets every value (a few gets in flight at once; a
    /// spilled state's reference, not its chunks) for the digest's key it
    /// holds, sorts the digests after `after`, and gets the first `limit`
    /// again with their states (a spilled one from its chunks): each page
    /// reads every session stored, and a whole listing does that
    /// `sessions / limit` times. An operator's pass, not a request's.
    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let bucket = &self.inner.sessions;
        let mut heads: Vec<(SessionDigest, String)> = stream::iter(keys_of(bucket).await?)
            .map(|key| async move {
                let Some((_, value)) = entry(bucket, &key).await? else {
                    return Ok::<_, Error>(None);
                };
                let (_, id, _) = decode(&value)?;
                // A key whose value names no digest (written before C20)
                // is not listed.
                Ok(std::str::from_utf8(&id)
                    .ok()
                    .and_then(SessionDigest::from_key)
                    .filter(|digest| after.is_none_or(|after| digest > after))
                    .map(|digest| (digest, key)))
            })
            .buffer_unordered(READS_IN_FLIGHT)
            .try_filter_map(|head| async move { Ok(head) })
            .try_collect()
            .await?;
        heads.sort_unstable();
        // The page is the first `limit` still there when read in full: a
        // session removed since its head was read does not cut it short.
        let mut sessions = Vec::with_capacity(limit.min(heads.len()));
        for (digest, key) in heads {
            if sessions.len() >= limit {
                break;
            }
            if let Some(stored) = read_session(self, &key, &digest).await? {
                sessions.push(SessionValue::new(digest, stored.state));
            }
        }
        Ok(SessionValuePage::new(sessions, limit))
    }

    /// The value rewritten with the expiry and id it holds and the new
    /// state, by revision; read and compared again when another write got
    /// in first. The expiry is the value's own, by the store's clock: the
    /// bucket has no age limit, so the new message's time changes nothing
    /// of when the session ends.
    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let key = session_key(self, &digest.key());
        loop {
            let Some(stored) = read_session(self, &key, digest).await? else {
                return Ok(false);
            };
            if stored.state[..] != *expected {
                return Ok(false);
            }
            let (value, spilled) = encode(self, &key, stored.expires_at, &stored.id, new).await?;
            match self
                .inner
                .sessions
                .update(&key, value, stored.revision)
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision || is_conflict(&e) => {
                    // Written or removed since the read: nothing refers to
                    // the chunks just written.
                    if let Some(spilled) = spilled {
                        drop_spilled(self, &format!("s{key}"), Some(&spilled.id)).await?;
                    }
                }
                Err(e) => return Err(backend(e)),
            }
        }
    }

    /// Task keys are their digests in hex, so the order of the keys is the
    /// digests': a page lists the bucket's keys (its stream's subject
    /// listing, bounded by the bucket), sorts those after `after`, and
    /// reads the first `limit` tasks (one get each, and the chunks of a
    /// spilled one). A whole listing lists the keys `tasks / limit` times
    /// and reads each task once.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        let mut digests: Vec<TaskDigest> = keys_of(&self.inner.tasks)
            .await?
            .iter()
            .filter_map(|key| unhex(key).and_then(|bytes| stored_digest(&bytes).ok()))
            .filter(|digest| after.is_none_or(|after| digest > after))
            .collect();
        digests.sort_unstable();
        let mut tasks = Vec::with_capacity(limit.min(digests.len()));
        for digest in digests {
            if tasks.len() >= limit {
                break;
            }
            if let Some((_, stored)) = read_task(self, &digest).await? {
                tasks.push(TaskValues::new(digest, stored.values()));
            }
        }
        Ok(TaskValuePage::new(tasks, limit))
    }

    /// The task decoded, the one value replaced, and written back through
    /// the crate's one task write (`tasks::swap`: spilled when too large,
    /// by revision), with no wake-up. A worker or client step that read
    /// the task before the swap fails its own revision check and runs
    /// again on the swapped value, so no step writes the old bytes back.
    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        loop {
            let Some((revision, mut stored)) = read_task(self, digest).await? else {
                return Ok(false);
            };
            match stored.value_mut(field) {
                Some(value) if value[..] == *expected => *value = Bytes::copy_from_slice(new),
                _ => return Ok(false),
            }
            if swap(self, digest, Some(revision), &stored).await? {
                return Ok(true);
            }
        }
    }
}

/// A session as its value holds it, and the revision it was read at.
struct StoredSession {
    revision: u64,
    expires_at: i64,
    /// The digest's key, as core named the session.
    id: Bytes,
    /// The state core gave, read back from its chunks if spilled.
    state: Bytes,
}

/// The session under `key`, which must be `digest`'s; none when gone.
async fn read_session(
    store: &NatsStore,
    key: &str,
    digest: &SessionDigest,
) -> Result<Option<StoredSession>> {
    let bucket = &store.inner.sessions;
    loop {
        let Some((revision, value)) = entry(bucket, key).await? else {
            return Ok(None);
        };
        let (expires_at, id, state) = decode(&value)?;
        if id != digest.key().as_bytes() {
            return Err(Error::Corrupt(
                "a session key holds another session id".into(),
            ));
        }
        let state = match state {
            State::Inline(state) => state,
            State::Spilled(spilled) => {
                match unspill(store, &format!("s{key}"), &spilled).await {
                    Ok(state) => state,
                    // A delete since the read removed the chunks: read
                    // the key again.
                    Err(_) if moved(bucket, key, revision).await? => continue,
                    Err(e) => return Err(e),
                }
            }
        };
        return Ok(Some(StoredSession {
            revision,
            expires_at,
            id,
            state,
        }));
    }
}

/// The task `digest` with the revision it was read at; none when gone.
async fn read_task(store: &NatsStore, digest: &TaskDigest) -> Result<Option<Loaded>> {
    let bucket = &store.inner.tasks;
    let key = hex(digest.as_bytes());
    loop {
        let Some((revision, value)) = entry(bucket, &key).await? else {
            return Ok(None);
        };
        match open_value(store, &key, value).await {
            Ok(stored) => return Ok(Some((revision, stored))),
            // A purge since the read removed a spilled value's chunks:
            // read the key again.
            Err(_) if moved(bucket, &key, revision).await? => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether `key` no longer holds what was read at `revision`: written
/// again or removed since.
async fn moved(bucket: &kv::Store, key: &str, revision: u64) -> Result<bool> {
    Ok(entry(bucket, key)
        .await?
        .is_none_or(|(now, _)| now != revision))
}
