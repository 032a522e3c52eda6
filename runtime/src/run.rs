//! [`TaskRun`]: one run of a task on this instance, and how it ends.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use mcp_event_store_core::observe::names;
use mcp_event_store_core::task::{
    Applied, Claimed, Finish, Owner, Rev, TaskDigest, TaskId, TaskRecord, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};
use tokio::sync::watch;
use tracing::Instrument;

use crate::runtime::{failed_with, store_finish};
use crate::{CallError, Runtime, TaskCall};

/// A task's operation, aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a task's operation ended, for [`TaskRun::drive`] to store.
///
/// Payloads are the serialized JSON the framework sends: a result object,
/// a JSON-RPC error object, input requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed with this result.
    Completed(Vec<u8>),
    /// Failed with this JSON-RPC error.
    Failed(Vec<u8>),
    /// Ended on a cancel request.
    Cancelled,
    /// Waits for the client's input: these requests, `(key, request)`,
    /// replace the outstanding ones (T15), with this status message; the
    /// task is given back (T17) and runs again, on whichever instance
    /// claims it, once answered. An empty set fails the task: nothing
    /// could ever answer it.
    InputRequired {
        /// The whole set of requests.
        requests: Vec<(String, Vec<u8>)>,
        /// The status message; `None` keeps the current one.
        message: Option<String>,
    },
}

/// Why a run stopped before its operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// Another claim holds the task (T18): another runtime runs it, or it
    /// was given back.
    Fenced,
    /// The run gave the task back to wait for input: whoever claims it
    /// once answered runs it again.
    Parked,
}

/// One run of a task on this instance: the task it writes to, under which
/// claim (T18), and what the claim saw (its checkpoint, its answers, which
/// attempt it is).
///
/// Made by [`Runtime::create`] (the creator's run) or by a claim (the
/// takeover runner's, or [`Runtime::claim_for`]). Cheap to clone; clones
/// are the same run.
#[derive(Clone)]
pub struct TaskRun {
    inner: Arc<RunInner>,
}

struct RunInner {
    runtime: Runtime,
    digest: TaskDigest,
    /// The id, when this runtime created the task (a claim knows only the
    /// digest: ids are never stored, T2).
    id: Option<TaskId>,
    owner: Owner,
    /// The claim this run writes under: `Some` for a task that may be
    /// taken over, `None` for one that dies with its instance.
    claim: Option<Worker>,
    attempt: u32,
    checkpoint: Option<Bytes>,
    answers: Vec<(String, Bytes)>,
    context: Option<Bytes>,
    cancel_requested: bool,
    stop: watch::Sender<Option<Stop>>,
}

impl fmt::Debug for TaskRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskRun")
            .field("task", &self.inner.digest)
            .field("claim", &self.inner.claim)
            .field("attempt", &self.inner.attempt)
            .finish_non_exhaustive()
    }
}

impl TaskRun {
    /// The creator's run of a task this runtime just created.
    pub(crate) fn created(
        runtime: Runtime,
        id: &TaskId,
        owner: Owner,
        claim: Option<Worker>,
        context: Option<&[u8]>,
    ) -> Self {
        Self::new(RunInner {
            runtime,
            digest: id.digest(),
            id: Some(*id),
            owner,
            claim,
            attempt: 1,
            checkpoint: None,
            answers: Vec::new(),
            context: context.map(Bytes::copy_from_slice),
            cancel_requested: false,
            stop: watch::Sender::new(None),
        })
    }

    /// The run of a task this runtime claimed (T17).
    pub(crate) fn claimed(runtime: Runtime, claimed: Claimed) -> Self {
        let Claimed {
            task, worker, view, ..
        } = claimed;
        let (attempt, checkpoint) = view
            .record
            .takeover
            .as_ref()
            .map_or((1, None), |t| (t.attempt(), t.checkpoint.clone()));
        Self::new(RunInner {
            runtime,
            digest: task,
            id: None,
            owner: view.owner,
            claim: Some(worker),
            attempt,
            checkpoint,
            answers: view.answers,
            context: view.record.context,
            cancel_requested: view.record.cancel_requested,
            stop: watch::Sender::new(None),
        })
    }

    fn new(inner: RunInner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The runtime this run belongs to.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// The digest the store keys the task by: the same on every runtime
    /// that runs it, and safe to log (it gives no way to the id).
    pub fn digest(&self) -> TaskDigest {
        self.inner.digest
    }

    /// The task's id, when this runtime created it; `None` in a claimed
    /// run, which knows the task only by its digest (the id is the
    /// client's credential and is never stored, T2).
    pub fn id(&self) -> Option<&TaskId> {
        self.inner.id.as_ref()
    }

    /// Who owns the task (T3).
    pub fn owner(&self) -> &Owner {
        &self.inner.owner
    }

    /// The claim this run writes under: `Some` for a task that may be
    /// taken over (T18).
    pub fn claim(&self) -> Option<Worker> {
        self.inner.claim
    }

    /// Whether the task may be taken over.
    pub fn is_takeover(&self) -> bool {
        self.inner.claim.is_some()
    }

    /// Which run of the task this is, from 1: one more after each takeover
    /// of a lapsed instance's run (runs given back for input count none).
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// The newest checkpoint saved before this run began (T19), `None` on
    /// a first run or when no run saved one.
    pub fn last_checkpoint(&self) -> Option<&[u8]> {
        self.inner.checkpoint.as_deref()
    }

    /// Every answer given before this run began and not taken, `(key,
    /// response)`, in request order (T14): a claimed run gets all of them
    /// at once.
    pub fn answers(&self) -> &[(String, Bytes)] {
        &self.inner.answers
    }

    /// The answer given to `key` before this run began, if any.
    pub fn answer(&self, key: &str) -> Option<&Bytes> {
        self.inner
            .answers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, answer)| answer)
    }

    /// The task's context (T13): what to run, as given at creation or as
    /// claimed.
    pub fn context(&self) -> Option<&[u8]> {
        self.inner.context.as_deref()
    }

    /// The call the task's context holds ([`TaskCall`]), for a task
    /// created with one ([`Runtime::create_call`]).
    pub fn call(&self) -> std::result::Result<TaskCall, CallError> {
        TaskCall::decode(self.context().ok_or_else(CallError::missing)?)
    }

    /// The span this run runs in: `task.run`, with the task's digest (in
    /// hex), the attempt and, when its context is a [`TaskCall`], the
    /// tool. [`drive`](Self::drive) runs the operation in the span it is
    /// driven in.
    ///
    /// A claimed run's span (a takeover, a worker's run) starts no trace
    /// of the current span's: with the feature `otel`, its parent is the
    /// trace context the task keeps, that of the request that created it,
    /// so the run continues that trace on whichever instance; without it
    /// (or when the task keeps none), it is a root. The runtime runs every
    /// claimed task it starts in this span; the creator's run is a child
    /// of the current span.
    pub fn span(&self) -> tracing::Span {
        let call = self.call().ok();
        let tool = call.as_ref().map(|call| call.tool.as_str());
        let (task, attempt) = (self.inner.digest, self.inner.attempt);
        if self.inner.id.is_some() {
            return tracing::info_span!("task.run", %task, attempt, tool);
        }
        let span = tracing::info_span!(parent: None, "task.run", %task, attempt, tool);
        #[cfg(feature = "otel")]
        if let Some(call) = &call {
            crate::otel::continue_trace(&span, call);
        }
        span
    }

    /// Whether the client had asked to cancel when this run claimed the
    /// task (T17): the runner then ends it without running it.
    pub fn cancel_requested_at_claim(&self) -> bool {
        self.inner.cancel_requested
    }

    /// One write to the task under this run's claim (or, for a task that
    /// dies with its instance, as the runtime's instance). A write refused
    /// as [`Applied::Fenced`] stops this run.
    pub async fn write(&self, change: WorkerChange<'_>) -> Result<Applied> {
        let applied = self
            .inner
            .runtime
            .write(&self.inner.digest, self.inner.claim, change)
            .await?;
        if applied == Applied::Fenced {
            self.stop(Stop::Fenced);
        }
        Ok(applied)
    }

    /// Ends the task (T4): an outcome over the store's limit fails it
    /// instead, with -32603. A refusal (fenced, already ended) is logged.
    pub async fn finish(&self, finish: Finish<'_>) {
        store_finish(self, finish).await;
    }

    /// Saves the operation's progress (T19): the run that takes the task
    /// over next starts from it. Only in a task that may be taken over
    /// ([`Applied::NoTakeover`] otherwise).
    pub async fn checkpoint(&self, checkpoint: &[u8]) -> Result<Applied> {
        self.write(WorkerChange::Checkpoint(checkpoint)).await
    }

    /// Gives the task back (T17) while it waits for input: once answered,
    /// whichever runtime claims it runs it again. Stops this run.
    pub async fn release(&self) -> Result<Applied> {
        let applied = self.write(WorkerChange::Release).await?;
        if matches!(applied, Applied::Changed { .. }) {
            self.stop(Stop::Parked);
        }
        Ok(applied)
    }

    /// Replaces the outstanding input requests with `requests` (T15) and,
    /// in a task that may be taken over, gives it back while it waits (an
    /// empty set fails it). What a run whose operation asked for input
    /// stores.
    pub async fn park(
        &self,
        requests: &[(String, Vec<u8>)],
        message: Option<&str>,
    ) -> Result<Applied> {
        if requests.is_empty() {
            let error = failed_with(
                "the operation asked for input without naming any requests, so the task has \
                 nothing to wait for",
            );
            return self
                .write(WorkerChange::Finish(Finish::Failed(&error)))
                .await;
        }
        let pairs: Vec<(&str, &[u8])> = requests
            .iter()
            .map(|(key, request)| (key.as_str(), &request[..]))
            .collect();
        let change = WorkerChange::ReplaceInputs {
            requests: &pairs,
            message,
        };
        match self.write(change).await? {
            Applied::Changed { .. } if self.is_takeover() => self.release().await,
            Applied::KeySpent => {
                let error = failed_with(
                    "input request keys must be unique over a task's lifetime: the operation \
                     reused a key already answered or superseded",
                );
                self.write(WorkerChange::Finish(Finish::Failed(&error)))
                    .await
            }
            other => Ok(other),
        }
    }

    /// The task now, as the runtime reads it (T14).
    pub async fn read(&self) -> Result<Option<TaskRecord>> {
        let runtime = &self.inner.runtime;
        match (&self.inner.id, self.is_takeover()) {
            (Some(id), false) => {
                runtime
                    .store()
                    .get(&id.to_string(), &self.inner.owner)
                    .await
            }
            _ => Ok(runtime
                .runtime_store()
                .view_claimed(&self.inner.digest)
                .await?
                .map(|view| view.record)),
        }
    }

    /// The task once its `rev` is past `after`, or after the runtime's
    /// watch wait (T10).
    pub async fn watch(&self, after: Rev) -> Result<Option<TaskRecord>> {
        let runtime = &self.inner.runtime;
        let wait = runtime.watch_wait();
        match (&self.inner.id, self.is_takeover()) {
            (Some(id), false) => {
                runtime
                    .store()
                    .watch(&id.to_string(), &self.inner.owner, after, wait)
                    .await
            }
            _ => {
                runtime
                    .runtime_store()
                    .watch_claimed(&self.inner.digest, after, wait)
                    .await
            }
        }
    }

    /// Whether `record` shows the task no longer this run's: claimed since
    /// (a newer epoch), or given back.
    pub fn lost_by(&self, record: &TaskRecord) -> bool {
        self.inner.claim.is_some_and(|claim| {
            record
                .takeover
                .as_ref()
                .is_some_and(|t| t.epoch != claim.epoch || t.released)
        })
    }

    /// Stops the run if `record` shows its claim lost, and says whether
    /// it did.
    fn check_lost(&self, record: &TaskRecord) -> bool {
        let lost = self.lost_by(record);
        if lost {
            self.stop(Stop::Fenced);
        }
        lost
    }

    /// `true` once the client asked to cancel, or the task already ended
    /// or is gone (expired, lost, purged): either way the work is moot. A
    /// failed read counts as no request. A run whose claim is seen lost is
    /// stopped (and `true`).
    pub async fn is_cancel_requested(&self) -> bool {
        match self.read().await {
            Ok(Some(record)) => {
                self.check_lost(&record) || record.cancel_requested || record.status.is_terminal()
            }
            Ok(None) => true,
            Err(error) => {
                tracing::warn!(task = ?self.inner.digest, %error, "cannot read the task");
                false
            }
        }
    }

    /// Resolves once the client asks to cancel (at once if it has), or the
    /// task ends or is gone; a claim seen lost while waiting stops the run
    /// (and this resolves). Changes wake it through the store (T10);
    /// expiry and a lapse at the next re-read.
    pub async fn cancelled(&self) {
        let mut rev: Rev = 0;
        loop {
            match self.watch(rev).await {
                Ok(Some(record)) => {
                    if self.check_lost(&record)
                        || record.cancel_requested
                        || record.status.is_terminal()
                    {
                        return;
                    }
                    rev = record.rev;
                }
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(task = ?self.inner.digest, %error, "cannot watch the task");
                    tokio::time::sleep(self.inner.runtime.watch_wait()).await;
                }
            }
        }
    }

    /// Stops this run: [`drive`](Self::drive) drops the operation and
    /// writes nothing more.
    pub fn stop(&self, why: Stop) {
        self.inner.stop.send_replace(Some(why));
    }

    /// Why this run stopped, if it did.
    pub fn stopped(&self) -> Option<Stop> {
        *self.inner.stop.borrow()
    }

    /// Resolves when the run is stopped.
    async fn until_stopped(&self) -> Stop {
        let mut stop = self.inner.stop.subscribe();
        loop {
            if let Some(why) = *stop.borrow_and_update() {
                return why;
            }
            if stop.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Resolves once this run's claim no longer lets its operation run:
    /// the task ended, went, was given back or claimed by another. Never
    /// for a task that dies with its instance.
    async fn claim_lost(&self) {
        if self.inner.claim.is_none() {
            return std::future::pending().await;
        }
        let mut rev: Rev = 0;
        loop {
            match self.watch(rev).await {
                Ok(None) => return,
                Ok(Some(record)) => {
                    if record.status.is_terminal() || self.lost_by(&record) {
                        return;
                    }
                    rev = record.rev;
                }
                Err(error) => {
                    tracing::debug!(task = ?self.inner.digest, %error, "watching a run's task failed; retrying");
                    tokio::time::sleep(self.inner.runtime.watch_wait()).await;
                }
            }
        }
    }

    /// Runs `operation` on a task of its own (so a panic fails the task
    /// rather than leaving it running) and stores how it ended. The run
    /// stops, dropping the operation and writing nothing more, when it is
    /// [stopped](Self::stop) (fenced by a newer claim, or parked for
    /// input) or, for a task that may be taken over, when its claim is
    /// seen lost.
    pub async fn drive(self, operation: impl Future<Output = Outcome> + Send + 'static) {
        // Aborted however this ends: stopped, or this future dropped (the
        // runner that claimed it stopped).
        // In the current span (the run's, `span`): the operation's own
        // spans and events belong to the run.
        let started = std::time::Instant::now();
        let mut operation = AbortOnDrop(tokio::spawn(operation.in_current_span()));
        let ended = tokio::select! {
            biased;
            why = self.until_stopped() => {
                tracing::debug!(task = ?self.inner.digest, ?why, "task run stopped");
                None
            }
            () = self.claim_lost() => {
                tracing::debug!(task = ?self.inner.digest, "task run stopped: its claim was lost");
                None
            }
            ended = &mut operation.0 => Some(ended),
        };
        let outcome = ended.map(|ended| {
            ended.unwrap_or_else(|join| {
                Outcome::Failed(failed_with(&format!(
                    "task operation ended abnormally: {join}"
                )))
            })
        });
        let label = match &outcome {
            None => "stopped",
            Some(Outcome::Completed(_)) => "completed",
            Some(Outcome::Failed(_)) => "failed",
            Some(Outcome::Cancelled) => "cancelled",
            Some(Outcome::InputRequired { .. }) => "input_required",
        };
        metrics::histogram!(names::TASK_RUN_DURATION_SECONDS, "outcome" => label)
            .record(started.elapsed().as_secs_f64());
        if let Some(outcome) = outcome {
            self.store(outcome).await;
        }
    }

    /// Stores how the operation ended.
    pub async fn store(&self, outcome: Outcome) {
        match outcome {
            Outcome::Completed(result) => self.finish(Finish::Completed(&result)).await,
            Outcome::Failed(error) => self.finish(Finish::Failed(&error)).await,
            Outcome::Cancelled => self.finish(Finish::Cancelled).await,
            Outcome::InputRequired { requests, message } => {
                match self.park(&requests, message.as_deref()).await {
                    Ok(Applied::Changed { .. }) => {}
                    // Cancelled while the operation ran: it asks in vain.
                    Ok(Applied::CancelRequested) => self.finish(Finish::Cancelled).await,
                    Ok(other) => {
                        tracing::debug!(task = ?self.inner.digest, ?other, "input not requested")
                    }
                    // Requests the contract refuses (too large, too many,
                    // a key out of bounds): nothing could ever answer them.
                    Err(Error::PayloadTooLarge { size, max }) => {
                        let error = failed_with(&format!(
                            "an input request is {size} bytes, the limit is {max}"
                        ));
                        self.finish(Finish::Failed(&error)).await;
                    }
                    Err(Error::Config(message)) => {
                        let error = failed_with(&format!("the input requests: {message}"));
                        self.finish(Finish::Failed(&error)).await;
                    }
                    // The store failed: give the task back, so that a run
                    // asks again, rather than hold it unrun.
                    Err(error) => {
                        tracing::warn!(task = ?self.inner.digest, %error, "cannot store the input requests; giving the task back");
                        if let Err(error) = self.release().await {
                            tracing::warn!(task = ?self.inner.digest, %error, "cannot give the task back; it is claimed once this instance lapses");
                        }
                    }
                }
            }
        }
    }
}
