//! Stored values listed and swapped in place (C22): what re-sealing a
//! store under a new key needs while servers keep writing to it.
//!
//! An operator's tool, not an application's: [`RewriteStore`] hands out
//! the bytes a store holds (a session's state, an event's data, a task's
//! context, outcome, checkpoint, input requests and responses) exactly as
//! the database keeps them, a page at a time, and replaces one with bytes
//! of the same length only if it still holds the bytes the tool read. A
//! server that writes the value in between wins: the swap answers
//! [`Swap::Changed`] and leaves the newer value alone. A swap changes
//! nothing but the value: an event keeps its id, position, time and retry
//! hint, a session its expiry, a task its status, revision, instance and
//! claim, so the servers running on the store see no change at all.
//!
//! The sealing decorator's rotation (`mcp-event-store-sealed`, the CLI's
//! `keys --rewrite`) is its user. Reach it through
//! [`EventStore::rewriter`](crate::EventStore::rewriter):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use std::time::Duration;
//! use mcp_event_store_core::rewrite::Swap;
//! use mcp_event_store_core::{EventStore, MemoryStore, SessionStore};
//!
//! let store = MemoryStore::new();
//! store.put_session("session-1", b"v1", Duration::from_secs(60)).await?;
//! let rewriter = store.rewriter().expect("every store of this project rewrites");
//!
//! let page = rewriter.session_values(None, 100).await?;
//! let stored = &page.sessions[0];
//! // Same length, over the bytes read: swapped.
//! assert_eq!(rewriter.swap_session(&stored.digest, &stored.state, b"v2").await?, Swap::Swapped);
//! // Over bytes that are no longer there: left alone.
//! assert_eq!(rewriter.swap_session(&stored.digest, &stored.state, b"v3").await?, Swap::Changed);
//! assert_eq!(store.get_session("session-1").await?.as_deref(), Some(&b"v2"[..]));
//! # Ok(()) }
//! ```

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::Result;
use crate::id::EventId;
use crate::session::SessionDigest;
use crate::store::Replay;
use crate::task::TaskDigest;

/// What a swap did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Swap {
    /// The value held the bytes expected and now holds the new ones.
    Swapped,
    /// The value no longer holds the bytes expected (a server wrote it
    /// since it was read) or is gone (removed, expired, purged): nothing
    /// was written.
    Changed,
}

/// A session's state as the store holds it, under the digest of its id
/// (C20).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionValue {
    /// The digest the session is stored under.
    pub digest: SessionDigest,
    /// Its state, as stored.
    pub state: Bytes,
}

impl SessionValue {
    /// The state stored under `digest`.
    pub fn new(digest: SessionDigest, state: Bytes) -> Self {
        Self { digest, state }
    }
}

/// One page of [`RewriteStore::session_values`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionValuePage {
    /// The sessions, by digest, ascending.
    pub sessions: Vec<SessionValue>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<SessionDigest>,
}

impl SessionValuePage {
    /// A page of `sessions` (ascending by digest), given the limit it was
    /// read with: a full page has a next one (perhaps empty).
    pub fn new(sessions: Vec<SessionValue>, limit: usize) -> Self {
        let next = (sessions.len() >= limit)
            .then(|| sessions.last().map(|s| s.digest))
            .flatten();
        Self { sessions, next }
    }
}

/// Which value of a task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TaskField {
    /// Its context (T13): a tool's name and arguments.
    Context,
    /// Its outcome: the result or the error.
    Outcome,
    /// Its checkpoint (T19).
    Checkpoint,
    /// The request of the input `key` (T5).
    Request(String),
    /// The response of the input `key` (T5).
    Response(String),
}

impl TaskField {
    /// The field's name: `context`, `outcome`, `checkpoint`, `request` or
    /// `response`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Context => "context",
            Self::Outcome => "outcome",
            Self::Checkpoint => "checkpoint",
            Self::Request(_) => "request",
            Self::Response(_) => "response",
        }
    }

    /// The input key of a request or response.
    pub fn input_key(&self) -> Option<&str> {
        match self {
            Self::Request(key) | Self::Response(key) => Some(key),
            _ => None,
        }
    }
}

/// One value of a task, as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskValue {
    /// Which value.
    pub field: TaskField,
    /// Its bytes, as stored.
    pub bytes: Bytes,
}

impl TaskValue {
    /// The value of `field`.
    pub fn new(field: TaskField, bytes: Bytes) -> Self {
        Self { field, bytes }
    }
}

/// A task's values, as the store holds them: every value it keeps,
/// whatever the task's status (spent inputs' values included, where the
/// backend keeps them).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskValues {
    /// The digest the task is stored under (T2).
    pub digest: TaskDigest,
    /// Its values, in no particular order.
    pub values: Vec<TaskValue>,
}

impl TaskValues {
    /// The values of the task `digest`.
    pub fn new(digest: TaskDigest, values: Vec<TaskValue>) -> Self {
        Self { digest, values }
    }
}

/// One page of [`RewriteStore::task_values`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskValuePage {
    /// The tasks, by digest, ascending.
    pub tasks: Vec<TaskValues>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<TaskDigest>,
}

impl TaskValuePage {
    /// A page of `tasks` (ascending by digest), given the limit it was
    /// read with: a full page has a next one (perhaps empty).
    pub fn new(tasks: Vec<TaskValues>, limit: usize) -> Self {
        let next = (tasks.len() >= limit)
            .then(|| tasks.last().map(|t| t.digest))
            .flatten();
        Self { tasks, next }
    }

    /// The page's task keys and where the next page starts: what a backend
    /// lists for [`RuntimeStore::task_page`](crate::task::RuntimeStore::task_page)
    /// (T22) from its rewrite listing.
    pub fn keys(self) -> (Vec<TaskDigest>, Option<TaskDigest>) {
        (
            self.tasks.into_iter().map(|t| t.digest).collect(),
            self.next,
        )
    }
}

/// A store's values, listed and swapped in place (C22); see the
/// [module docs](self).
///
/// Every listing is bounded by its `limit` (1 to
/// [`MAX_LIST_PAGE`](crate::MAX_LIST_PAGE)); every swap needs the new
/// bytes to have the length of the expected ones (a value re-sealed under
/// another key keeps its length), so byte counts and retention stay true,
/// and is [`Error::Config`](crate::Error::Config) otherwise.
#[async_trait]
pub trait RewriteStore: Send + Sync {
    /// Every retained event of `stream_id` from its oldest, as stored
    /// (C16's replay, on the bytes the database holds).
    async fn event_values(&self, stream_id: &str) -> Result<Replay>;

    /// Whether [`swap_event`](Self::swap_event) can work: `false` for a
    /// backend whose events live in an append-only log (Redis streams,
    /// NATS JetStream), whose events leave only with retention.
    fn rewrites_events(&self) -> bool;

    /// Replaces the data of the event `id` of `stream_id` with `new` if it
    /// holds `expected`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`](crate::Error::Config) when the lengths differ or
    /// the backend [cannot rewrite events](Self::rewrites_events);
    /// [`Error::InvalidStreamId`](crate::Error::InvalidStreamId) for a
    /// stream id outside C9.
    async fn swap_event(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap>;

    /// One page of the sessions stored (live or not yet purged), ascending
    /// by digest, starting after `after`.
    async fn session_values(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage>;

    /// Replaces the state of the session stored under `digest` with `new`
    /// if it holds `expected`, keeping its expiry.
    async fn swap_session(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap>;

    /// One page of the tasks stored, ascending by digest, starting after
    /// `after`, each with every value it holds.
    async fn task_values(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage>;

    /// Replaces the value `field` of the task `digest` with `new` if it
    /// holds `expected`, changing nothing else of the task (not its
    /// revision: nothing a client or worker can see changed).
    async fn swap_task(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap>;
}
