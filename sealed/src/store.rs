//! [`Sealed`]: the decorator, trait by trait.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use mcp_event_store_core::bus::StoreBus;
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, EXPIRED_ERROR, Finish, INSTANCE_LOST_ERROR, InstanceId,
    InstanceLease, NewTask, Owner, Requeue, Rev, RuntimeStore, TaskDigest, TaskEntry, TaskId,
    TaskPage, TaskPurgeReport, TaskRecord, TaskStatus, TaskStore, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{
    Error, EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport, RedeemStore,
    Replay, ReplayEvents, Result, Retention, SessionDigest, SessionStore, Setting, Store,
    StoreOptions, StoreStats, StreamCursor, StreamPage,
};

use crate::envelope::{Field, OVERHEAD, Place, open, seal};
use crate::keys::KeyRing;

/// A store whose every kept payload is sealed: the decorator over any
/// store `S` (a backend's own type, or `dyn Store` as `connect` hands it
/// out). See the [crate docs](crate) for what is sealed, what stays
/// plaintext and what the limits become.
///
/// It is itself a [`Store`] (an [`EventStore`], [`SessionStore`],
/// [`TaskStore`] and [`RuntimeStore`]), so it passes as `Arc<dyn Store>`
/// wherever a store does, and a [`StoreBus`] over it seals the bus too
/// ([`Sealed::bus`]). Cheap to clone: the store and the key ring are
/// shared.
pub struct Sealed<S: ?Sized = dyn Store> {
    inner: Arc<S>,
    keys: Arc<KeyRing>,
}

impl<S: ?Sized> Clone for Sealed<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            keys: self.keys.clone(),
        }
    }
}

impl<S: ?Sized> fmt::Debug for Sealed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl<S: ?Sized> Sealed<S> {
    /// Seals everything written to `inner` under `keys`' current key, and
    /// opens what is read under whichever key of the ring sealed it.
    ///
    /// `inner`'s payload limit then holds for the sealed value, so the
    /// limit a caller sees is [`OVERHEAD`] less: open `inner` with
    /// [`headroom`] to keep the limit you meant.
    pub fn new(inner: Arc<S>, keys: KeyRing) -> Self {
        Self {
            inner,
            keys: Arc::new(keys),
        }
    }

    /// The store underneath, which holds the sealed bytes.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The store underneath, giving up the decorator.
    pub fn into_inner(self) -> Arc<S> {
        self.inner
    }

    /// The key ring.
    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    fn seal(&self, place: &Place<'_>, plaintext: &[u8]) -> Result<Vec<u8>> {
        seal(&self.keys, place, plaintext)
    }

    fn open(&self, place: &Place<'_>, stored: &[u8]) -> Result<Bytes> {
        open(&self.keys, place, stored)
    }
}

impl<S: EventStore + ?Sized> Sealed<S> {
    /// The bus between the handles sharing the store (core's [`StoreBus`])
    /// with its messages sealed: a topic is a stream of the store, so a
    /// message is bound to its topic as an event is to its stream.
    pub fn bus(&self) -> StoreBus {
        StoreBus::new(Arc::new(self.clone()))
    }
}

/// `options` with the payload limit raised by [`OVERHEAD`]: the options to
/// open the store under a [`Sealed`] with, so that its callers keep
/// `options.max_payload_bytes` as their limit, exactly.
///
/// ```
/// use mcp_event_store_core::StoreOptions;
/// use mcp_event_store_sealed::{OVERHEAD, headroom};
///
/// let options = headroom(StoreOptions::default().max_payload_bytes(1_000));
/// assert_eq!(options.max_payload_bytes, 1_000 + OVERHEAD);
/// ```
pub fn headroom(options: StoreOptions) -> StoreOptions {
    let max = options.max_payload_bytes.saturating_add(OVERHEAD);
    options.max_payload_bytes(max)
}

/// The refusal of a sealed value over the store's limit, told in
/// plaintext bytes: the value and the limit both [`OVERHEAD`] less, so a
/// caller sees the size it gave and the most it may give.
fn plaintext_limit(error: Error) -> Error {
    match error {
        Error::PayloadTooLarge { size, max } => Error::PayloadTooLarge {
            size: size.saturating_sub(OVERHEAD),
            max: max.saturating_sub(OVERHEAD),
        },
        other => other,
    }
}

/// Opens a replay's events, each bound to the replay's stream; the first
/// value that fails to open ends it with that error (as a backend error
/// ends a replay), so no event is skipped silently.
fn open_replay(keys: Arc<KeyRing>, replay: Replay) -> Replay {
    let stream_id: Arc<str> = replay.stream_id.as_str().into();
    let events = replay
        .events
        .map(move |item| {
            item.and_then(|mut event| {
                let place = Place::Event {
                    stream_id: &stream_id,
                };
                event.data = open(&keys, &place, &event.data)?;
                Ok(event)
            })
        })
        .scan(false, |ended, item| {
            std::future::ready((!*ended).then(|| {
                *ended = item.is_err();
                item
            }))
        });
    Replay {
        stream_id: replay.stream_id,
        events: ReplayEvents::new(events),
    }
}

#[async_trait]
impl<S: EventStore + ?Sized> EventStore for Sealed<S> {
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        let sealed = self.seal(&Place::Event { stream_id }, event.data)?;
        let mut event = event;
        event.data = &sealed;
        self.inner
            .store_event(stream_id, event)
            .await
            .map_err(plaintext_limit)
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay> {
        let replay = self.inner.replay_events_after(last_event_id).await?;
        Ok(open_replay(self.keys.clone(), replay))
    }

    async fn replay_stream(&self, stream_id: &str) -> Result<Replay> {
        let replay = self.inner.replay_stream(stream_id).await?;
        Ok(open_replay(self.keys.clone(), replay))
    }

    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>> {
        self.inner.get_stream_id_for_event_id(event_id).await
    }

    async fn delete_stream(&self, stream_id: &str) -> Result<u64> {
        self.inner.delete_stream(stream_id).await
    }

    async fn purge_expired(&self) -> Result<PurgeReport> {
        self.inner.purge_expired().await
    }

    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay> {
        let replay = self
            .inner
            .follow_events_after(last_event_id, options)
            .await?;
        Ok(open_replay(self.keys.clone(), replay))
    }

    fn open_follows(&self) -> usize {
        self.inner.open_follows()
    }

    fn retention(&self) -> Retention {
        self.inner.retention()
    }

    async fn stats(&self) -> Result<StoreStats> {
        self.inner.stats().await
    }

    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage> {
        self.inner.list_streams(after, limit).await
    }

    /// The store's own redemptions (C21): they keep only a digest of the
    /// principal and the nonce, nothing to seal.
    fn redeemer(&self) -> Option<&dyn RedeemStore> {
        self.inner.redeemer()
    }

    /// The store underneath's: it lists and swaps the sealed bytes, which
    /// is what a rotation re-seals (see [`crate::rotate`]).
    fn rewriter(&self) -> Option<&dyn mcp_event_store_core::rewrite::RewriteStore> {
        self.inner.rewriter()
    }

    /// The store's own report, and one more setting, `sealed`: the
    /// cipher, the current key and the keys the ring holds.
    async fn check(&self) -> Result<HealthReport> {
        let mut report = self.inner.check().await?;
        let ids: Vec<String> = self.keys.ids().iter().map(ToString::to_string).collect();
        report.settings.push(Setting::ok(
            "sealed",
            format!(
                "XChaCha20-Poly1305, current key {}, keys held {}",
                self.keys.current(),
                ids.join(",")
            ),
        ));
        Ok(report)
    }
}

#[async_trait]
impl<S: SessionStore + ?Sized> SessionStore for Sealed<S> {
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()> {
        let sealed = self.seal(
            &Place::Session {
                digest: &SessionDigest::of(session_id),
            },
            state,
        )?;
        self.inner
            .put_session(session_id, &sealed, ttl)
            .await
            .map_err(plaintext_limit)
    }

    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>> {
        match self.inner.get_session(session_id).await? {
            Some(stored) => self
                .open(
                    &Place::Session {
                        digest: &SessionDigest::of(session_id),
                    },
                    &stored,
                )
                .map(Some),
            None => Ok(None),
        }
    }

    async fn delete_session(&self, session_id: &str) -> Result<bool> {
        self.inner.delete_session(session_id).await
    }
}

impl<S: ?Sized> Sealed<S> {
    /// Opens every sealed field of a task record read from the store.
    ///
    /// The one plaintext a task field may hold is what the store itself
    /// writes: the outcome of a task it failed as expired (T8) or lost
    /// (T11), exactly [`EXPIRED_ERROR`] or [`INSTANCE_LOST_ERROR`], on a
    /// `failed` task.
    fn open_record(&self, task: &TaskDigest, mut record: TaskRecord) -> Result<TaskRecord> {
        if let Some(outcome) = record.outcome.take() {
            let by_the_store = record.status == TaskStatus::Failed
                && (outcome == EXPIRED_ERROR || outcome == INSTANCE_LOST_ERROR);
            record.outcome = Some(if by_the_store {
                outcome
            } else {
                self.open(&Place::task(task, Field::Outcome), &outcome)?
            });
        }
        if let Some(context) = &record.context {
            record.context = Some(self.open(&Place::task(task, Field::Context), context)?);
        }
        if let Some(takeover) = &mut record.takeover
            && let Some(checkpoint) = &takeover.checkpoint
        {
            takeover.checkpoint =
                Some(self.open(&Place::task(task, Field::Checkpoint), checkpoint)?);
        }
        for (key, request) in &mut record.outstanding {
            *request = self.open(&Place::input(task, Field::Request, key), request)?;
        }
        Ok(record)
    }

    fn open_record_opt(
        &self,
        task: &TaskDigest,
        record: Option<TaskRecord>,
    ) -> Result<Option<TaskRecord>> {
        record.map(|r| self.open_record(task, r)).transpose()
    }

    /// Opens a runtime's view: the record and every answer.
    fn open_view(&self, task: &TaskDigest, view: TaskView) -> Result<TaskView> {
        let mut view = view;
        view.record = self.open_record(task, view.record)?;
        view.answers = std::mem::take(&mut view.answers)
            .into_iter()
            .map(|(key, answer)| {
                let opened = self.open(&Place::input(task, Field::Answer, &key), &answer)?;
                Ok((key, opened))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(view)
    }
}

#[async_trait]
impl<S: TaskStore + ?Sized> TaskStore for Sealed<S> {
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> Result<Option<TaskRecord>> {
        task.check()?;
        let digest = id.digest();
        let context = task
            .context
            .map(|context| self.seal(&Place::task(&digest, Field::Context), context))
            .transpose()?;
        let mut sealed = *task;
        sealed.context = context.as_deref();
        let created = self
            .inner
            .try_create(id, &sealed)
            .await
            .map_err(plaintext_limit)?;
        self.open_record_opt(&digest, created)
    }

    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>> {
        // A malformed id is an unknown task (T2); it never reaches the
        // store.
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let record = self.inner.get(id, who).await?;
        self.open_record_opt(&digest, record)
    }

    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let sealed = responses
            .iter()
            .map(|(key, response)| {
                let place = Place::input(&digest, Field::Answer, key);
                Ok((*key, self.seal(&place, response)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let sealed: Vec<(&str, &[u8])> = sealed.iter().map(|(k, v)| (*k, &v[..])).collect();
        let record = self
            .inner
            .answer(id, who, &sealed)
            .await
            .map_err(plaintext_limit)?;
        self.open_record_opt(&digest, record)
    }

    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let record = self.inner.request_cancel(id, who, mode, reason).await?;
        self.open_record_opt(&digest, record)
    }

    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let Some(digest) = TaskDigest::of(id) else {
            return Ok(None);
        };
        let record = self.inner.watch(id, who, after, max_wait).await?;
        self.open_record_opt(&digest, record)
    }

    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport> {
        self.inner.purge_expired_tasks().await
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        self.inner.delete(id).await
    }
}

impl<S: Store + ?Sized> Sealed<S> {
    /// A worker's change with its bytes sealed for `task`, then made by the
    /// store underneath; its answer (a taken response) opened.
    async fn apply_sealed(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        // Every limit but the sealed values' (the store checks those, on
        // the sealed bytes) is checked here, on what the caller gave, so
        // that a refusal of the store's is a sealed value's.
        change.check(usize::MAX)?;
        let runtime = self.inner.task_runtime();
        let place = |field| Place::task(task, field);
        let applied = match change {
            WorkerChange::RequestInput { key, request } => {
                let request = self.seal(&Place::input(task, Field::Request, key), request)?;
                let change = WorkerChange::RequestInput {
                    key,
                    request: &request,
                };
                runtime.apply_claimed(task, by, change).await
            }
            WorkerChange::Finish(Finish::Completed(outcome)) => {
                let outcome = self.seal(&place(Field::Outcome), outcome)?;
                let change = WorkerChange::Finish(Finish::Completed(&outcome));
                runtime.apply_claimed(task, by, change).await
            }
            WorkerChange::Finish(Finish::Failed(outcome)) => {
                let outcome = self.seal(&place(Field::Outcome), outcome)?;
                let change = WorkerChange::Finish(Finish::Failed(&outcome));
                runtime.apply_claimed(task, by, change).await
            }
            WorkerChange::SetContext(context) => {
                let context = self.seal(&place(Field::Context), context)?;
                let change = WorkerChange::SetContext(&context);
                runtime.apply_claimed(task, by, change).await
            }
            WorkerChange::Checkpoint(checkpoint) => {
                let checkpoint = self.seal(&place(Field::Checkpoint), checkpoint)?;
                let change = WorkerChange::Checkpoint(&checkpoint);
                runtime.apply_claimed(task, by, change).await
            }
            WorkerChange::ReplaceInputs { requests, message } => {
                let sealed = self.replacement_requests(task, requests).await?;
                let requests: Vec<(&str, &[u8])> =
                    sealed.iter().map(|(k, v)| (*k, &v[..])).collect();
                let change = WorkerChange::ReplaceInputs {
                    requests: &requests,
                    message,
                };
                runtime.apply_claimed(task, by, change).await
            }
            WorkerChange::TakeAnswer { key } => {
                match runtime.apply_claimed(task, by, change).await? {
                    Applied::Changed {
                        rev,
                        answer: Some(answer),
                    } => {
                        let answer = self.open(&Place::input(task, Field::Answer, key), &answer)?;
                        Ok(Applied::Changed {
                            rev,
                            answer: Some(answer),
                        })
                    }
                    other => Ok(other),
                }
            }
            other => runtime.apply_claimed(task, by, other).await,
        };
        applied.map_err(plaintext_limit)
    }

    /// The sealed requests of a replacement (T15). A key carried forward
    /// must name the very bytes stored (the store compares them), and a
    /// fresh seal never matches (its nonce is new): so a request equal to
    /// the one outstanding under its key keeps the stored envelope. One
    /// read of the task more; the stored request of a key never changes
    /// while the key is outstanding, so the read cannot be stale for it.
    async fn replacement_requests<'a>(
        &self,
        task: &TaskDigest,
        requests: &'a [(&'a str, &'a [u8])],
    ) -> Result<Vec<(&'a str, Bytes)>> {
        let current = self.inner.task_runtime().view_claimed(task).await?;
        let outstanding = current.map(|v| v.record.outstanding).unwrap_or_default();
        requests
            .iter()
            .map(|&(key, request)| {
                let place = Place::input(task, Field::Request, key);
                if let Some((_, stored)) = outstanding.iter().find(|(k, _)| k == key)
                    && self.open(&place, stored)? == request
                {
                    return Ok((key, stored.clone()));
                }
                Ok((key, Bytes::from(self.seal(&place, request)?)))
            })
            .collect()
    }
}

#[async_trait]
impl<S: Store + ?Sized> RuntimeStore for Sealed<S> {
    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        self.inner.task_runtime().heartbeat(me, lease).await
    }

    async fn retire(&self, me: InstanceId) -> Result<bool> {
        self.inner.task_runtime().retire(me).await
    }

    async fn is_alive(&self, id: InstanceId) -> Result<bool> {
        self.inner.task_runtime().is_alive(id).await
    }

    async fn instances(&self) -> Result<Vec<InstanceLease>> {
        self.inner.task_runtime().instances().await
    }

    async fn apply_claimed(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        self.apply_sealed(task, by, change).await
    }

    async fn view_claimed(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        match self.inner.task_runtime().view_claimed(task).await? {
            Some(view) => self.open_view(task, view).map(Some),
            None => Ok(None),
        }
    }

    /// Lists as the store does, opening each task's view: a task whose
    /// values do not open with this ring fails the page (an operator
    /// lists through the ring the servers use, or through the store
    /// itself to see values as stored).
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskPage> {
        let mut page = self.inner.task_runtime().task_page(after, limit).await?;
        page.tasks = std::mem::take(&mut page.tasks)
            .into_iter()
            .map(|entry| {
                Ok(TaskEntry::new(
                    entry.task,
                    self.open_view(&entry.task, entry.view)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(page)
    }

    async fn cancel_task(
        &self,
        task: &TaskDigest,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let record = self.inner.task_runtime().cancel_task(task, reason).await?;
        self.open_record_opt(task, record)
    }

    async fn requeue_task(&self, task: &TaskDigest) -> Result<Requeue> {
        Ok(match self.inner.task_runtime().requeue_task(task).await? {
            Requeue::Requeued(record) => Requeue::Requeued(self.open_record(task, record)?),
            Requeue::Refused(record, why) => Requeue::Refused(self.open_record(task, record)?, why),
            other => other,
        })
    }

    async fn watch_claimed(
        &self,
        task: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        let record = self
            .inner
            .task_runtime()
            .watch_claimed(task, after, max_wait)
            .await?;
        self.open_record_opt(task, record)
    }

    /// Claims as the store does, opening each claimed task's view. A
    /// claimed task whose values do not open (a key missing from this
    /// instance's ring, damaged bytes) is given back at once
    /// ([`WorkerChange::Release`], counting no attempt) and left out, with
    /// a warning: an instance whose ring holds the key can claim it, and
    /// the other claims are returned whole (an error would leave them held
    /// by a live instance that runs none of them).
    async fn claim(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let runtime = self.inner.task_runtime();
        let mut opened = Vec::new();
        for mut claimed in runtime.claim(by, limit).await? {
            // A clone of refcounted bytes: the claim keeps the rest
            // (`lapsed_for`) as the store gave it.
            match self.open_view(&claimed.task, claimed.view.clone()) {
                Ok(view) => {
                    claimed.view = view;
                    opened.push(claimed);
                }
                Err(error) => {
                    tracing::warn!(
                        %error,
                        "a claimed task's sealed values do not open; it is released for another instance"
                    );
                    let released = runtime
                        .apply_claimed(&claimed.task, claimed.worker, WorkerChange::Release)
                        .await;
                    if let Err(error) = released {
                        tracing::warn!(%error, "releasing the unreadable task failed");
                    }
                }
            }
        }
        Ok(opened)
    }
}
