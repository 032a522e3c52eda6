//! The backend traits: what a database makes different, job by job.
//!
//! A backend implements [`BackendHandle`] (its name, its options, whether
//! it is closed) and the jobs it serves: [`EventBackend`],
//! [`SessionBackend`], [`TaskBackend`] and [`RuntimeBackend`]. The public
//! traits ([`EventStore`], [`SessionStore`], [`TaskStore`],
//! [`RuntimeStore`]) are written once, here, over them: every call is
//! checked against the closed flag and the contract's input rules (C9, T2,
//! the task limits) and observed (spans and metrics, [`observe`]) before
//! and after the backend's part, so no backend writes a prologue, and
//! every backend reports and refuses the same way.
//!
//! What each job method receives is already checked: the store is open,
//! stream and session ids are valid, an event's payload is within the
//! store's maximum, a replay's cursor parsed, a client's task id is one
//! the store could have issued (a call with any other answers as for an
//! unknown task without reaching the backend), a worker's change within
//! the limits. The job methods carry names of their own (`append`,
//! `task_read`, ...) so that a backend crate can have both traits in
//! scope without ambiguity.
//!
//! ```
//! # use std::time::Duration;
//! # use bytes::Bytes;
//! use async_trait::async_trait;
//! use mcp_event_store_core::backend::{BackendHandle, SessionBackend};
//! use mcp_event_store_core::{Result, SessionStore, StoreOptions};
//!
//! /// A session store that keeps nothing (each job method is what the
//! /// database makes different; the checks are written once in core).
//! struct Forgetful(StoreOptions);
//!
//! impl BackendHandle for Forgetful {
//!     const NAME: &'static str = "forgetful";
//!     fn store_options(&self) -> &StoreOptions { &self.0 }
//!     fn is_closed(&self) -> bool { false }
//! }
//!
//! #[async_trait]
//! impl SessionBackend for Forgetful {
//!     async fn session_put(&self, _: &str, _: &[u8], _: Duration, _: i64) -> Result<()> { Ok(()) }
//!     async fn session_get(&self, _: &str) -> Result<Option<Bytes>> { Ok(None) }
//!     async fn session_delete(&self, _: &str) -> Result<bool> { Ok(false) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Forgetful(StoreOptions::default());
//! // The checks come from core: an empty session id is refused before
//! // the backend is asked.
//! assert!(store.put_session("", b"{}", Duration::from_secs(60)).await.is_err());
//! assert!(store.get_session("").await.unwrap().is_none());
//! # }
//! ```

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::observe;
use crate::backend::redeem::RedeemBackend;
use crate::backend::rewrite::{RewriteBackend, TaskKeys};
use crate::backend::task::{
    OwnerKey, TaskDigest, check_message, check_responses, client_call, owner_key,
};
use crate::error::{Error, Result};
use crate::event::NewEvent;
use crate::id::EventId;
use crate::inspect::{HealthReport, StoreStats, StreamCursor, StreamPage, check_list_limit};
use crate::options::{
    PurgeReport, Retention, StoreOptions, validate_session_id, validate_stream_id,
};
use crate::redeem::RedeemStore;
use crate::rewrite::RewriteStore;
use crate::session::SessionDigest;
use crate::store::{EventStore, FollowOptions, Replay, SessionStore};
use crate::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Owner, Requeue, Rev,
    RuntimeStore, TaskEntry, TaskId, TaskPage, TaskPurgeReport, TaskRecord, TaskStore, TaskView,
    Worker, WorkerChange,
};
use futures_util::{StreamExt, TryStreamExt};

/// What every job of a backend shares: its name, its options and whether
/// its handle was closed.
pub trait BackendHandle: Send + Sync + 'static {
    /// The backend's name in errors, spans and metrics (`"sqlite"`, ...).
    const NAME: &'static str;

    /// The options every store has (limits, retention, page size, clock).
    fn store_options(&self) -> &StoreOptions;

    /// Whether `close` was called on this handle or a clone: every call
    /// then fails with [`Error::Closed`].
    fn is_closed(&self) -> bool;

    /// Now, in milliseconds since the epoch, by the store's clock.
    fn now_millis(&self) -> i64 {
        self.store_options().clock.now_millis()
    }
}

/// [`Error::Closed`] once the handle is closed: what every call checks
/// first.
pub(crate) fn ensure_open<B: BackendHandle + ?Sized>(backend: &B) -> Result<()> {
    if backend.is_closed() {
        Err(Error::Closed)
    } else {
        Ok(())
    }
}

/// The event side of a backend: what [`EventStore`] needs from the
/// database. Every input is checked before these are called (see the
/// [module docs](self)). Redemptions (C21) come with it: an event backend
/// is a [`RedeemBackend`], which its store's
/// [`EventStore::redeemer`] hands out. Rewrites in place (C22) come with
/// it too: an event backend is a [`RewriteBackend`], which
/// [`EventStore::rewriter`] hands out.
#[async_trait]
pub trait EventBackend: RedeemBackend + RewriteBackend {
    /// Stores one event durably (C1) and returns its id (C2). The store
    /// wakes this handle's followers of the stream itself, or is woken by
    /// the database, either way (C13).
    async fn append(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId>;

    /// The replay after `cursor` (C3, C5); `raw` is the id as the client
    /// sent it, for the errors.
    async fn replay_after(&self, raw: &str, cursor: EventId) -> Result<Replay>;

    /// Every retained event of `stream_id`, from the oldest (C16).
    async fn replay_whole(&self, stream_id: &str) -> Result<Replay>;

    /// The replay after `cursor` that stays open (C13). It is observed
    /// once, as one replay, around this call: its first read is this
    /// backend's own [`replay_after`](Self::replay_after) (the public
    /// replay would be observed a second time), and its re-reads
    /// [`follow::reread`](crate::backend::follow::reread).
    async fn follow_after(
        &self,
        raw: &str,
        cursor: EventId,
        options: FollowOptions,
    ) -> Result<Replay>;

    /// How many follows of this handle are open.
    fn follows_open(&self) -> usize;

    /// The stream of a retained event (C4).
    async fn stream_of(&self, id: EventId) -> Result<Option<String>>;

    /// Removes a stream and its events; how many events went (C8).
    async fn remove_stream(&self, stream_id: &str) -> Result<u64>;

    /// Applies retention now, sessions included (C8).
    async fn purge(&self) -> Result<PurgeReport>;

    /// The store's statistics (C15).
    async fn inspect_stats(&self) -> Result<StoreStats>;

    /// One page of streams; `limit` checked (C15).
    async fn inspect_streams(
        &self,
        after: Option<&StreamCursor>,
        limit: usize,
    ) -> Result<StreamPage>;

    /// The settings that decide durability and boundedness (C15).
    async fn inspect_check(&self) -> Result<HealthReport>;
}

#[async_trait]
impl<B: EventBackend> EventStore for B {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        observe::append(B::NAME, stream_id, event.data.len(), async {
            ensure_open(self)?;
            self.store_options()
                .check_append(stream_id, event.data.len())?;
            self.append(stream_id, event).await
        })
        .await
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        observe::replay(B::NAME, last_event_id, async {
            ensure_open(self)?;
            let cursor: EventId = last_event_id.parse()?;
            self.replay_after(last_event_id, cursor).await
        })
        .await
    }

    async fn replay_stream(&self, stream_id: &str) -> Result<Replay> {
        observe::replay(B::NAME, stream_id, async {
            ensure_open(self)?;
            validate_stream_id(stream_id)?;
            self.replay_whole(stream_id).await
        })
        .await
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        ensure_open(self)?;
        match EventId::parse(event_id) {
            Some(id) => self.stream_of(id).await,
            None => Ok(None),
        }
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        ensure_open(self)?;
        validate_stream_id(stream_id)?;
        self.remove_stream(stream_id).await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        observe::purge(B::NAME, async {
            ensure_open(self)?;
            self.purge().await
        })
        .await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        observe::replay(B::NAME, last_event_id, async {
            ensure_open(self)?;
            let cursor: EventId = last_event_id.parse()?;
            self.follow_after(last_event_id, cursor, options).await
        })
        .await
    }

    fn open_follows(&self) -> usize {
        self.follows_open()
    }

    fn retention(&self) -> Retention {
        self.store_options().retention
    }

    async fn stats(&self) -> Result<StoreStats> {
        ensure_open(self)?;
        self.inspect_stats().await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        ensure_open(self)?;
        let limit = check_list_limit(limit)?;
        self.inspect_streams(after, limit).await
    }

    async fn check(&self) -> Result<HealthReport> {
        ensure_open(self)?;
        self.inspect_check().await
    }

    fn redeemer(&self) -> Option<&dyn RedeemStore> {
        Some(self)
    }

    fn rewriter(&self) -> Option<&dyn RewriteStore> {
        Some(self)
    }
}

/// The session side of a backend: what [`SessionStore`] needs from the
/// database.
///
/// Each method receives the session's *key*, the
/// [`SessionDigest::key`] of the id the caller gave (C20): 67 ASCII bytes
/// (`s1.` and 64 hex digits), never the id itself, so what a backend
/// stores names no live session.
#[async_trait]
pub trait SessionBackend: BackendHandle {
    /// Keeps `state` under `key` until `expires_at` (milliseconds since
    /// the epoch by the store's clock, `ttl` from now), replacing what was
    /// there. Size checked.
    async fn session_put(
        &self,
        key: &str,
        state: &[u8],
        ttl: Duration,
        expires_at: i64,
    ) -> Result<()>;

    /// The state under `key` unless it expired.
    async fn session_get(&self, key: &str) -> Result<Option<Bytes>>;

    /// Forgets `key`; whether a live session was there.
    async fn session_delete(&self, key: &str) -> Result<bool>;
}

#[async_trait]
impl<B: SessionBackend> SessionStore for B {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        ensure_open(self)?;
        let expires_at = self
            .store_options()
            .check_session_put(session_id, state.len(), ttl)?;
        let key = SessionDigest::of(session_id).key();
        self.session_put(&key, state, ttl, expires_at).await
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        ensure_open(self)?;
        if validate_session_id(session_id).is_err() {
            return Ok(None);
        }
        self.session_get(&SessionDigest::of(session_id).key()).await
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        ensure_open(self)?;
        if validate_session_id(session_id).is_err() {
            return Ok(false);
        }
        self.session_delete(&SessionDigest::of(session_id).key())
            .await
    }
}

/// Who reads or watches a task: its owner (a client's call, which sees
/// only its own tasks, T3) or the runtime running it (which sees any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reader {
    /// A client's call: the task's owner as stored must be this one.
    Owner(OwnerKey),
    /// The runtime holding a claim: whoever owns the task.
    Runtime,
}

impl Reader {
    /// The owner key a client read must match, `None` for the runtime.
    pub fn owner(&self) -> Option<&OwnerKey> {
        match self {
            Reader::Owner(key) => Some(key),
            Reader::Runtime => None,
        }
    }
}

/// The task side of a backend: what [`TaskStore`] needs from the database.
/// A client's call arrives as the task's digest and the caller's owner key
/// (T2, T3): an id the store could not have issued never reaches it.
#[async_trait]
pub trait TaskBackend: BackendHandle {
    /// Inserts the task under `digest` unless one is there (T1), only
    /// under an instance alive at its birth (T11). `task` checked.
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>>;

    /// The task as `reader` sees it now (T8, T11 decided at read time).
    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>>;

    /// Records a client's responses (T5); checked.
    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>>;

    /// Records a client's cancel request (T6, T20); the reason checked.
    async fn task_cancel(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>>;

    /// The task once its `rev` is past `after`, or at `max_wait` (T10).
    async fn task_watch(
        &self,
        digest: TaskDigest,
        reader: Reader,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>>;

    /// Persists what reads show, deletes what is past its grace, forgets
    /// lapsed instances (T8, T11, T21).
    async fn task_purge(&self) -> Result<TaskPurgeReport>;

    /// Deletes the task under `digest`, whoever owns it.
    async fn task_delete(&self, digest: TaskDigest) -> Result<bool>;
}

#[async_trait]
impl<B: TaskBackend> TaskStore for B {
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> Result<Option<TaskRecord>> {
        task.check()?;
        ensure_open(self)?;
        let created = self.task_create(id.digest(), task).await?;
        if let Some(record) = &created {
            let queued = record.takeover.as_ref().is_some_and(|t| t.released);
            observe::task_created(B::NAME, queued);
        }
        Ok(created)
    }

    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
        ensure_open(self)?;
        let Some((digest, owner)) = client_call(id, who) else {
            return Ok(None);
        };
        self.task_read(digest, Reader::Owner(owner)).await
    }

    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        check_responses(responses)?;
        ensure_open(self)?;
        let Some((digest, owner)) = client_call(id, who) else {
            return Ok(None);
        };
        self.task_answer(digest, owner, responses).await
    }

    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        check_message(reason)?;
        ensure_open(self)?;
        let Some((digest, owner)) = client_call(id, who) else {
            return Ok(None);
        };
        self.task_cancel(digest, owner, mode, reason).await
    }

    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        ensure_open(self)?;
        let Some((digest, owner)) = client_call(id, who) else {
            return Ok(None);
        };
        self.task_watch(digest, Reader::Owner(owner), after, max_wait)
            .await
    }

    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
        ensure_open(self)?;
        let report = self.task_purge().await?;
        observe::tasks_purged(B::NAME, &report);
        Ok(report)
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        ensure_open(self)?;
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(false);
        };
        self.task_delete(digest).await
    }
}

/// The runtime side of a backend: instances, leases and claims, what
/// [`RuntimeStore`] needs from the database (T11, T14, T17, T18).
#[async_trait]
pub trait RuntimeBackend: TaskBackend + TaskKeys {
    /// Registers or renews `me` for `lease` (T11); `false` when it lapsed.
    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool>;

    /// Whether `id` is alive now (T11).
    async fn lease_alive(&self, id: InstanceId) -> Result<bool>;

    /// Every lease the store holds (T11).
    async fn leases(&self) -> Result<Vec<InstanceLease>>;

    /// A worker's change under a claim (T4, T18); checked against the
    /// store's payload limit.
    async fn claimed_apply(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied>;

    /// The task as the runtime reads it (T14).
    async fn claimed_view(&self, task: &TaskDigest) -> Result<Option<TaskView>>;

    /// Claims up to `limit` tasks waiting for a runtime (T17).
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>>;

    /// An operator's requeue (T23) in one atomic step:
    /// [`rows::requeue`](crate::backend::task::rows::requeue) or
    /// [`StoredTask::requeue_step`](crate::backend::task::codec::StoredTask::requeue_step)
    /// on the task as stored.
    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue>;
}

/// How many task reads a [`RuntimeStore::task_page`] runs at once.
const PAGE_READS: usize = 8;

#[async_trait]
impl<B: RuntimeBackend> RuntimeStore for B {
    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        ensure_open(self)?;
        self.lease_renew(me, lease).await
    }

    async fn is_alive(&self, id: InstanceId) -> Result<bool> {
        ensure_open(self)?;
        self.lease_alive(id).await
    }

    async fn instances(&self) -> Result<Vec<InstanceLease>> {
        ensure_open(self)?;
        self.leases().await
    }

    async fn apply_claimed(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        change.check(self.store_options().max_payload_bytes)?;
        ensure_open(self)?;
        let kind = observe::ChangeKind::of(&change);
        let applied = self.claimed_apply(task, by, change).await?;
        observe::task_applied(B::NAME, kind, &applied);
        Ok(applied)
    }

    async fn view_claimed(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        ensure_open(self)?;
        self.claimed_view(task).await
    }

    async fn watch_claimed(
        &self,
        task: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        ensure_open(self)?;
        self.task_watch(*task, Reader::Runtime, after, max_wait)
            .await
    }

    async fn claim(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        ensure_open(self)?;
        let claimed = self.claim_tasks(by, limit).await?;
        observe::tasks_claimed(B::NAME, &claimed);
        Ok(claimed)
    }

    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskPage> {
        ensure_open(self)?;
        let limit = check_list_limit(limit)?;
        let (keys, next) = self.task_keys(after, limit).await?;
        let tasks: Vec<Option<TaskEntry>> = futures_util::stream::iter(keys)
            .map(|task| async move {
                let view = self.claimed_view(&task).await?;
                Ok::<_, Error>(view.map(|view| TaskEntry::new(task, view)))
            })
            .buffered(PAGE_READS)
            .try_collect()
            .await?;
        Ok(TaskPage::new(tasks.into_iter().flatten().collect(), next))
    }

    async fn cancel_task(
        &self,
        task: &TaskDigest,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        check_message(reason)?;
        ensure_open(self)?;
        // The owner never changes, so the one read first names it.
        let Some(view) = self.claimed_view(task).await? else {
            return Ok(None);
        };
        let owner = owner_key(&view.owner);
        self.task_cancel(*task, owner, CancelMode::Immediate, reason)
            .await
    }

    async fn requeue_task(&self, task: &TaskDigest) -> Result<Requeue> {
        ensure_open(self)?;
        let requeued = self.task_requeue(task).await?;
        if matches!(requeued, Requeue::Requeued(_)) {
            observe::task_requeued(B::NAME);
        }
        Ok(requeued)
    }
}
