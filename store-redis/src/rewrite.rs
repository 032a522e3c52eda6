//! Values swapped in place (C22): sessions and tasks listed by digest and
//! swapped by one Lua script each; events not at all, since a Redis
//! Stream is an append-only log.
//!
//! **Events.** A stream entry cannot be changed once `XADD` wrote it, and
//! no entry can be added again below the stream's newest id, so an event
//! cannot be replaced under its id: [`rewrites_events`] is `false`, and an
//! event leaves only with retention. Core refuses an event swap before it
//! reaches this backend.
//!
//! **Listings.** Redis keeps no index ordered by digest (on a cluster no
//! script could keep one key in step with keys in other slots, the reason
//! the purge has none either), so a page is one `SCAN` of this prefix's
//! session (or task) hashes on every master, keeping only the `limit`
//! smallest digests after the cursor as it goes (a sorted set of at most
//! `limit` digests, so memory is bounded by the page, not by the store),
//! then one read of each session (or task) kept. A session's key is named
//! by a keyed hash of its digest, not by the digest, so the walk also
//! reads each session's `id` field (`HGET`, 16 at a time): a page costs a
//! walk of every key under the prefix and one small read per session
//! stored, and listing every session one round trip per page, about
//! sessions² / limit reads in all. A task's key carries its digest, so a
//! task page costs the walk and `limit` reads.
//!
//! **Swaps.** One script each, on the one key that holds the value, so
//! one slot on a cluster: a session's `d` is replaced only if it holds the
//! bytes expected (`SESSION_SWAP`); a task's `c` (its context) or `v` (the
//! rest of the task, encoded) only if it holds the bytes expected, and the
//! task's swap stamp `s` is bumped (`TASK_SWAP`). `HSET` keeps the key's
//! TTL, and no other field moves: not a session's `exp`, not a task's
//! `rev`. Every task step writes over the stamp it read as well as the
//! `rev`, so a step that read the task before a swap reads it again rather
//! than writing back the bytes the swap replaced.
//!
//! [`rewrites_events`]: RewriteBackend::rewrites_events

use std::collections::BTreeSet;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::backend::RewriteBackend;
use mcp_event_store_core::backend::task::TaskDigest;
use mcp_event_store_core::backend::task::codec::{self, StoredTask};
use mcp_event_store_core::rewrite::{
    SessionValue, SessionValuePage, TaskField, TaskValue, TaskValuePage, TaskValues,
};
use mcp_event_store_core::{Error, EventId, Result, SessionDigest};

use crate::RedisStore;
use crate::conn::{self, Node};
use crate::error::NAME;
use crate::options::{PURGE_CONCURRENCY, SCAN_BATCH, SECRET_ATTEMPTS};
use crate::scripts::SCRIPTS;
use crate::setup::secret_kept_changing;
use crate::tasks::task_script;

#[async_trait]
impl RewriteBackend for RedisStore {
    /// `false`: events live in Redis Streams, an append-only log.
    fn rewrites_events(&self) -> bool {
        false
    }

    /// Never called by core (see [`rewrites_events`](Self::rewrites_events));
    /// refused all the same, changing nothing.
    async fn event_swap(&self, _: &str, _: &EventId, _: &[u8], _: &[u8]) -> Result<bool> {
        Err(Error::Config(format!(
            "the {NAME} backend keeps events in Redis Streams, an append-only log: an entry \
             cannot be rewritten in place, and leaves with retention"
        )))
    }

    /// A walk of every session hash on every master, keeping the `limit`
    /// smallest digests after `after`, then one `HMGET id d` of each: a
    /// walk of every key under the prefix and a read of each session's
    /// `id` per page (see the crate docs, "Rewrites in place").
    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let mut chosen = Smallest::new(after.copied(), limit);
        let mut scan = Scan::new(self, self.inner.keys.session_pattern()).await?;
        while let Some(batch) = scan.next().await? {
            let ids: Vec<Option<Vec<u8>>> = futures_util::stream::iter(batch)
                .map(|key| async move {
                    let mut pipe = redis::pipe();
                    pipe.cmd("HGET").arg(key).arg("id");
                    let (id,): (Option<Vec<u8>>,) = self.read(&pipe).await?;
                    Ok::<_, Error>(id)
                })
                .buffered(PURGE_CONCURRENCY)
                .try_collect()
                .await?;
            // An id that is no digest's key is a session of a release
            // from before digests (C20): not listed.
            ids.iter()
                .filter_map(|id| SessionDigest::from_key(std::str::from_utf8(id.as_ref()?).ok()?))
                .for_each(|digest| chosen.offer(digest));
        }
        // Read under the name this handle gives the digest, which is the
        // one a swap writes: a session the walk met under a name no longer
        // in use (an older secret's) is not listed.
        let key = self.key();
        let (digests, last) = chosen.into_parts();
        let sessions: Vec<Option<SessionValue>> = futures_util::stream::iter(digests)
            .map(|digest| {
                let name = self.inner.keys.session(&key, &digest.key());
                async move {
                    let mut pipe = redis::pipe();
                    pipe.cmd("HMGET").arg(name).arg(&["id", "d"]);
                    let ((id, state),): ((Option<String>, Option<Vec<u8>>),) =
                        self.read(&pipe).await?;
                    Ok::<_, Error>(match (id, state) {
                        (Some(id), Some(state)) if id == digest.key() => {
                            Some(SessionValue::new(digest, Bytes::from(state)))
                        }
                        _ => None,
                    })
                }
            })
            .buffered(PURGE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut page = SessionValuePage::new(sessions.into_iter().flatten().collect(), limit);
        // A session gone between the walk and its read leaves the page
        // short; the listing still goes on after the last digest chosen.
        if page.next.is_none() {
            page.next = last;
        }
        Ok(page)
    }

    /// `SESSION_SWAP` on the session's key: its state `d` replaced if it
    /// holds `expected`, its expiry (`exp`, and the key's TTL) kept. When
    /// there is no such key, the handle checks its stream secret first, as
    /// a read does: after the server lost its data, the session may live
    /// under the name another secret gives it.
    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let id = digest.key();
        for _ in 0..SECRET_ATTEMPTS {
            let key = self.key();
            let session = self.inner.keys.session(&key, &id);
            let call = SCRIPTS
                .session_swap
                .call()
                .key(&session)
                .arg(&id)
                .arg(expected)
                .arg(new);
            let (reply, acked) = self.run(&call, true).await?;
            let swapped: i64 =
                redis::from_redis_value(reply).map_err(|e| Error::backend(NAME, e))?;
            if swapped == 1 {
                self.check_wait(acked, "the session's swapped state")?;
            }
            if swapped >= 0 || self.secret_holds(&key).await? {
                return Ok(swapped == 1);
            }
        }
        Err(secret_kept_changing())
    }

    /// A walk of every task hash on every master, keeping the `limit`
    /// smallest digests (in the key names) after `after`, then one
    /// `HMGET v c` of each.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        let mut chosen = Smallest::new(after.copied(), limit);
        let mut scan = Scan::new(self, self.inner.keys.task_pattern()).await?;
        while let Some(batch) = scan.next().await? {
            batch
                .iter()
                .filter_map(|key| self.inner.keys.digest_of_task(key))
                .for_each(|digest| chosen.offer(digest));
        }
        let (digests, last) = chosen.into_parts();
        let tasks: Vec<Option<TaskValues>> = futures_util::stream::iter(digests)
            .map(|digest| async move {
                let Some((value, context)) = self.task_fields(&digest).await? else {
                    return Ok::<_, Error>(None);
                };
                let stored = codec::decode(&value)?;
                Ok(Some(TaskValues::new(digest, values_of(&stored, context))))
            })
            .buffered(PURGE_CONCURRENCY)
            .try_collect()
            .await?;
        let mut page = TaskValuePage::new(tasks.into_iter().flatten().collect(), limit);
        // As for sessions: a task gone since the walk shortens the page,
        // not the listing.
        if page.next.is_none() {
            page.next = last;
        }
        Ok(page)
    }

    /// `TASK_SWAP` on the task's key: its context `c` replaced if it holds
    /// `expected`; any other value inside `v`, which is decoded, changed in
    /// that one value, encoded again and written only if `v` still holds
    /// the bytes read (else read again: a step wrote the task since). Either
    /// bumps the swap stamp, never `rev`, the TTL or the takeover index.
    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let key = self.inner.keys.task(digest);
        loop {
            let Some((value, context)) = self.task_fields(digest).await? else {
                return Ok(false);
            };
            let (name, old, replacement) = match context {
                Some(context) if *field == TaskField::Context => {
                    if context != expected {
                        return Ok(false);
                    }
                    ("c", context, new.to_vec())
                }
                _ => {
                    let mut stored = codec::decode_to_rewrite(&value)?;
                    match stored.value_mut(field) {
                        Some(bytes) if bytes[..] == *expected => {
                            *bytes = Bytes::copy_from_slice(new);
                        }
                        _ => return Ok(false),
                    }
                    ("v", value, codec::encode(&stored))
                }
            };
            let call = SCRIPTS
                .task_swap
                .call()
                .key(&key)
                .arg(name)
                .arg(old)
                .arg(replacement);
            if task_script(self, call, "the task's swapped value").await? == 1 {
                return Ok(true);
            }
            if name == "c" {
                // The script compared the context itself: it no longer
                // holds the bytes expected, or the task went.
                return Ok(false);
            }
        }
    }
}

/// `HMGET task v c`: a task's encoded value and its context, if any.
type ValueAndContext = (Option<Vec<u8>>, Option<Vec<u8>>);

impl RedisStore {
    /// A task's `v` and `c` (its context, if it has one), read together.
    async fn task_fields(&self, digest: &TaskDigest) -> Result<Option<(Vec<u8>, Option<Vec<u8>>)>> {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.inner.keys.task(digest))
            .arg(&["v", "c"]);
        let ((value, context),): (ValueAndContext,) = self.read(&pipe).await?;
        Ok(value.map(|value| (value, context)))
    }
}

/// Every value a task holds ([`StoredTask::values`]), its context read
/// from the field `c` where the task keeps it there rather than in `v`.
fn values_of(stored: &StoredTask, context: Option<Vec<u8>>) -> Vec<TaskValue> {
    let mut values = stored.values();
    if let Some(context) = context {
        values.retain(|value| value.field != TaskField::Context);
        values.insert(0, TaskValue::new(TaskField::Context, context.into()));
    }
    values
}

/// The `limit` smallest digests after a cursor among those offered, in a
/// sorted set never holding more than `limit`, so a listing's memory is
/// bounded by its page whatever the store holds.
struct Smallest<D> {
    after: Option<D>,
    limit: usize,
    set: BTreeSet<D>,
}

impl<D: Ord + Copy> Smallest<D> {
    fn new(after: Option<D>, limit: usize) -> Self {
        Self {
            after,
            limit,
            set: BTreeSet::new(),
        }
    }

    /// Keeps `digest` if it is after the cursor and among the smallest so
    /// far (once: `SCAN` may return a key twice).
    fn offer(&mut self, digest: D) {
        if self.after.is_some_and(|after| digest <= after) {
            return;
        }
        if self.set.len() >= self.limit && self.set.last().is_some_and(|last| digest >= *last) {
            return;
        }
        self.set.insert(digest);
        if self.set.len() > self.limit {
            self.set.pop_last();
        }
    }

    /// The digests kept, ascending, and, if they fill a page, the last one
    /// (where the next page starts).
    fn into_parts(self) -> (Vec<D>, Option<D>) {
        let last = (self.set.len() >= self.limit)
            .then(|| self.set.last().copied())
            .flatten();
        (self.set.into_iter().collect(), last)
    }
}

/// A `SCAN ... TYPE hash` of one pattern over every master, a batch (about
/// [`SCAN_BATCH`] keys) at a time, so a walk holds one batch at once.
struct Scan<'a> {
    store: &'a RedisStore,
    pattern: String,
    nodes: Vec<Node>,
    at: usize,
    cursor: u64,
}

impl<'a> Scan<'a> {
    async fn new(store: &'a RedisStore, pattern: String) -> Result<Self> {
        Ok(Self {
            nodes: conn::nodes(&store.inner.conn).await?,
            store,
            pattern,
            at: 0,
            cursor: 0,
        })
    }

    /// The next non-empty batch, or `None` once every master is done.
    async fn next(&mut self) -> Result<Option<Vec<Vec<u8>>>> {
        while let Some(node) = self.nodes.get(self.at) {
            let mut scan = redis::cmd("SCAN");
            scan.arg(self.cursor)
                .arg("MATCH")
                .arg(&self.pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH)
                .arg("TYPE")
                .arg("hash");
            let (next, found): (u64, Vec<Vec<u8>>) =
                node.query(&self.store.inner.conn, &scan).await?;
            self.cursor = next;
            if next == 0 {
                self.at += 1;
            }
            if !found.is_empty() {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_after_the_cursor_are_kept_once() {
        let mut kept = Smallest::new(Some(3), 3);
        for n in [9, 1, 3, 7, 4, 8, 4, 5, 12] {
            kept.offer(n);
        }
        assert_eq!(kept.into_parts(), (vec![4, 5, 7], Some(7)));
        let mut short = Smallest::new(None, 3);
        short.offer(2);
        short.offer(2);
        assert_eq!(short.into_parts(), (vec![2], None));
    }
}
