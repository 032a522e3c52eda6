//! Durable tasks (SEP-2663): the contract every backend's [`TaskStore`] meets.
//!
//! Protocol 2026-07-28 drops `Last-Event-ID`; durable work uses tasks
//! instead. A server must not answer `CreateTaskResult` until a `tasks/get`
//! for the id would resolve on any instance, so the task's state lives in
//! the shared store, not in the process running it.
//!
//! This module is what applications use:
//!
//! * [`TaskStore`], the contract every backend meets for serving clients
//!   (create, get, answer, cancel, watch), and [`TaskId`], the one id
//!   scheme (T2): generated and parsed here only, and never stored
//!   (backends key a task by a digest of it);
//! * [`RuntimeStore`], what the runtime running tasks needs besides:
//!   instances and their leases, claims, and writes under a claim (T11,
//!   T14, T16 to T19); a handle from `connect` offers it only when asked
//!   ([`Store::task_runtime`](crate::Store::task_runtime));
//! * [`Owner`], who may see a task (T3);
//! * [`TaskStatus`], [`TaskRecord`] and the operations
//!   ([`NewTask`], [`WorkerChange`], [`TaskStore::answer`],
//!   [`TaskStore::request_cancel`]) with their results ([`Applied`],
//!   [`TaskView`]) (T4 to T6, T13 to T15, T20);
//! * takeover ([`NewTask::takeover`], [`RuntimeStore::claim`],
//!   [`RuntimeStore::apply_claimed`], [`Claimed`], [`Worker`]) (T16 to T19);
//! * the limits (T7) and [`TaskOptions`] (T8, T21); a task that expired,
//!   or whose instance died, reads `failed` (T8, T11), decided when it is
//!   read, so no sweeper is needed for correctness;
//! * [`MemoryTaskStore`], the reference implementation;
//! * the shared suite every task store passes is in the crate
//!   `mcp-event-store-conformance` (module `tasks`).
//!
//! What backends share to implement it (the state machine written once,
//! the step of row stores, the one-value codec, the limit checks) is
//! [`backend::task`](crate::backend::task).
//!
//! # The first twelve clauses: durable task state
//!
//! * **T1 Durable before return.** `create` returns only once the task is
//!   durable and readable from every handle.
//! * **T2 Ids.** `t1.` and 128 random bits; parsed here only, never stored
//!   (a digest keys the task), never reissued.
//! * **T3 Owner binding.** A wrong owner is indistinguishable from an
//!   unknown id, for every client-facing call.
//! * **T4 State machine.** Each change is one atomic step that bumps
//!   `rev`; terminal states never change (but for an operator's requeue,
//!   T23).
//! * **T5 Input round trips.** Requests and answers are durable and seen
//!   across instances; a key is spent once used.
//! * **T6 Cancellation.** Cooperative by default, or immediate.
//! * **T7 Payloads are bytes.** Never parsed by the store, within stated
//!   limits; over them [`Error::PayloadTooLarge`], changing nothing.
//! * **T8 TTL and purge.** Past its ttl a running task reads `failed`
//!   ("task expired"), decided when read; purges persist and delete.
//! * **T9 Shared.** Every change is visible to every handle once it
//!   returns.
//! * **T10 Follow.** `watch` returns once `rev` moves, or at its wait.
//! * **T11 Orphans.** A task whose instance's lease lapsed reads `failed`
//!   ("server instance lost"); a lapsed instance is never revived.
//! * **T12 Restart and format.** Tasks survive a reopen; a newer task
//!   format is refused clearly.
//!
//! # Clauses T13 to T15: what a runtime that re-runs a task needs
//!
//! The first twelve come from the starting design (`TASKS.md`). A runtime that re-runs a
//! task's handler after its input was answered, on whichever instance the
//! answer arrived (tower-mcp does, through its `resume_context`), needs
//! three more, which every backend meets and the suite checks:
//!
//! * **T13 Context.** A task may carry a context: opaque bytes, at most
//!   [`MAX_CONTEXT_BYTES`], given at creation ([`NewTask::context`]) and
//!   replaceable by the worker while the task runs
//!   ([`WorkerChange::SetContext`]); every read returns it
//!   ([`TaskRecord::context`]), also once the task ended. The store never
//!   parses it. It is where the runtime keeps what it needs to run the task
//!   again: the tool's name and arguments.
//! * **T14 The worker's view.** [`RuntimeStore::view`] reads a task by its
//!   [`TaskId`] whatever its owner, as [`apply`](RuntimeStore::apply) changes
//!   it: with its [`Owner`] (to act for the owner on the client-facing
//!   calls) and every answer given and not yet taken
//!   ([`TaskView::answers`]). Answers a worker never takes accumulate over
//!   every round of input, so a re-run handler sees them all. Like
//!   `apply`, it is for the runtime, which has authorized the caller
//!   itself; a client's read is [`get`](TaskStore::get).
//! * **T15 Replacing the outstanding inputs.**
//!   [`WorkerChange::ReplaceInputs`] replaces the whole set of outstanding
//!   input requests in one atomic step: an outstanding key left out is
//!   superseded (spent, T5); a key carried forward must name the same
//!   request bytes; every other key must never have been used. Otherwise
//!   it is [`Applied::KeySpent`] and nothing changes. The task is then
//!   `input_required`, or `working` when the new set is empty. Two
//!   concurrent replacements never both admit a key.
//!
//! # Clauses T16 to T19: tasks that outlive their process
//!
//! By default a task dies with its instance (T11). A task created with
//! [`NewTask::takeover`] may be run again elsewhere, for operations that
//! are safe to run again; the guarantee is *at least once, with fencing*:
//! a run may repeat work a dead run already did (the operation must be
//! idempotent up to its last checkpoint), and a run that lost its claim
//! can change nothing.
//!
//! * **T16 Takeover and bounded runs.** When the instance running such a
//!   task lapses, the task keeps reading `working` (or `input_required`)
//!   and waits for a claim, as long as a run is left: `max_attempts` runs
//!   in all, each lapse counting one ([`Takeover::attempt`]). When the
//!   last run's instance lapses, it reads `failed` "server instance lost",
//!   as in T11. The ttl bounds everything (T8).
//! * **T17 Claims.** [`RuntimeStore::claim`] hands the tasks that wait for a
//!   runtime to a live instance: those whose instance lapsed with a run
//!   left, and those nobody holds, because they were created for a worker
//!   ([`NewTask::queued`]) or given back ([`WorkerChange::Release`], for
//!   instance while the task waits for its client's input, so that it
//!   occupies no worker; it is claimable once answered). Each claim is
//!   one atomic step: of any number of racing claimants, exactly one gets
//!   a task. The claim ([`Claimed`]) carries the task's digest (ids are
//!   never stored, T2), the claim to write under, and the task's
//!   [`TaskView`]: its context (the request to run, T13), its checkpoint,
//!   and every answer given and not taken (T14). A cancel requested while
//!   nobody ran the task is claimed with it; the claimant ends it.
//! * **T18 Fencing.** Every claim has an epoch: 1 for the creator, one
//!   more per claim. Every worker write names its claim
//!   ([`RuntimeStore::apply_claimed`], a [`Worker`]); on a task that may be
//!   taken over, a write is refused with [`Applied::Fenced`], changing
//!   nothing, unless it names the current holder and epoch, the holder is
//!   alive, and the task is not released. So an instance that comes back
//!   after it was counted lapsed changes nothing, whether or not another
//!   instance claimed the task yet.
//! * **T19 Checkpoints.** [`WorkerChange::Checkpoint`] saves the
//!   operation's progress, at most [`MAX_CHECKPOINT_BYTES`], byte for
//!   byte; the next claim returns the newest one
//!   ([`Takeover::checkpoint`]), so a re-run can skip what is done.

//!
//! # Clauses T20 and T21: what a client is told
//!
//! * **T20 A cancel keeps its reason.** [`TaskStore::request_cancel`] may
//!   carry a reason, at most [`MAX_MESSAGE_BYTES`] (else
//!   [`Error::PayloadTooLarge`], changing nothing). The request that
//!   changes the task keeps its reason with it, in the same atomic step,
//!   unless one is kept already; every read returns it
//!   ([`TaskRecord::cancel_reason`]), also once the task ended, and no
//!   worker change alters it. A request on a terminal task keeps nothing.
//! * **T21 Expired, not missing.** A task past its ttl reads as it ended
//!   (a task still running then reads `failed`, "task expired", T8) for
//!   [`TaskOptions::grace`] after it expired (one hour by default, the
//!   same on every backend, set through
//!   [`StoreOptions::tasks`](crate::StoreOptions::tasks)), however short
//!   its ttl, zero included; from then on it reads as unknown and may be
//!   deleted. A changed ttl ([`WorkerChange::SetTtl`]) moves both.
//!
//! # Clauses T22 and T23: what an operator sees and does
//!
//! * **T22 Operators see every task.** [`RuntimeStore::task_page`] lists
//!   every task the store holds (but those past their grace), ascending by
//!   digest, a page at a time, each as the runtime reads it now (T8, T11
//!   decided) with its owner, its instance and that instance's lease
//!   deadline as read ([`TaskView::instance`]). A page never repeats or
//!   skips a task that was there throughout the listing.
//!   [`RuntimeStore::cancel_task`] ends a task `cancelled` at once whoever
//!   owns it, as its owner's immediate cancel would (T6, T20).
//! * **T23 A requeue is the one way back from `failed`.** Only an
//!   operator's [`RuntimeStore::requeue_task`] moves a terminal task: a
//!   task created to be taken over (T16) that reads `failed` (its run
//!   failed, or its last instance was lost), before its ttl ran out and
//!   unless its client asked to cancel it, becomes `working` and released
//!   (it waits for a claim, T17) in one atomic step: its outcome and
//!   outstanding inputs are dropped, answers not yet taken and its
//!   checkpoint kept, `rev` bumped past what any read showed, and, if no
//!   run is left, one more run allowed (a lost run counts as one). Any
//!   other task is refused, changing nothing ([`RequeueRefusal`]). A
//!   client that saw the task `failed` sees it move again: operators
//!   requeue a task when its client still waits for it.

pub(crate) mod id;
mod memory;
mod operate;
mod record;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::task::{check_key, check_message, check_size};
use crate::error::{Error, Result};

pub use id::{InstanceId, Owner, TaskDigest, TaskId};

pub use memory::MemoryTaskStore;
pub use operate::{Requeue, RequeueRefusal, TaskEntry, TaskPage};
pub use record::{Takeover, TaskRecord, TaskStatus};

/// A task's revision: bumped by every change, never decreasing (T4).
pub type Rev = u64;

/// Longest accepted input key, in bytes (T5); the shortest is 1.
pub const MAX_INPUT_KEY_BYTES: usize = 256;
/// Largest accepted input request or response, in bytes (T7).
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;
/// Largest accepted status message, in bytes (T7).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024;
/// Most input requests a task may have outstanding at once (T5).
pub const MAX_OUTSTANDING_INPUTS: usize = 64;
/// Largest accepted task context, in bytes (T13).
pub const MAX_CONTEXT_BYTES: usize = 1024 * 1024;
/// The runs a [`queued`](NewTask::queued) task gets unless told otherwise
/// (T16).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Longest accepted checkpoint, in bytes (T19).
pub const MAX_CHECKPOINT_BYTES: usize = 1024 * 1024;
/// Longest accepted principal, in bytes (T3).
pub const MAX_PRINCIPAL_BYTES: usize = 256;

/// The JSON-RPC error a task that outlived its ttl reads as (T8).
pub const EXPIRED_ERROR: &[u8] = br#"{"code":-32603,"message":"task expired"}"#;
/// The JSON-RPC error a task whose instance stopped heartbeating reads as
/// (T11).
pub const INSTANCE_LOST_ERROR: &[u8] = br#"{"code":-32603,"message":"server instance lost"}"#;

/// How long tasks live, and how long an expired one still reads expired,
/// when nobody says otherwise (T8, T21). Every backend takes them from its
/// [`StoreOptions::tasks`](crate::StoreOptions::tasks).
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::task::TaskOptions;
///
/// let options = TaskOptions::default().max_task_age(Duration::from_secs(3600));
/// assert_eq!(options.grace, Duration::from_secs(3600));
/// // However short the ttl, the task reads expired for the whole grace.
/// let lifetime = options.lifetime(0, Some(Duration::ZERO));
/// assert_eq!((lifetime.expires_at, lifetime.purge_at), (0, 3_600_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskOptions {
    /// The longest a task lives, whatever its ttl; a `null` ttl gets this.
    /// Without it a task with no ttl would be kept forever (C8). Default:
    /// 7 days.
    pub max_task_age: Duration,
    /// How long a task is kept after it expired (T21): it reads as it
    /// ended (or `failed`, "task expired") for this long, however short its
    /// ttl, then as unknown. Default: 1 h.
    pub grace: Duration,
}

/// The default [`TaskOptions::grace`]: one hour.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60 * 60);

impl Default for TaskOptions {
    fn default() -> Self {
        Self {
            max_task_age: Duration::from_secs(7 * 24 * 60 * 60),
            grace: DEFAULT_GRACE,
        }
    }
}

impl TaskOptions {
    /// Sets the longest a task lives.
    pub fn max_task_age(mut self, age: Duration) -> Self {
        self.max_task_age = age;
        self
    }

    /// Sets how long a task is kept after it expired (T21).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The ttl to record, when the task expires and when it is purged, for
    /// a task created at `created_at` with the requested `ttl` (T8, T21). A
    /// ttl over [`max_task_age`](Self::max_task_age), or none, is capped to
    /// it; the recorded ttl stays `None` for a `null` request. The task is
    /// purged one [`grace`](Self::grace) after it expires, whatever its ttl.
    pub fn lifetime(&self, created_at: i64, ttl: Option<Duration>) -> Lifetime {
        let cap = millis(self.max_task_age);
        let ttl_ms = ttl.map(|ttl| millis(ttl).min(cap));
        let live = ttl_ms.unwrap_or(cap);
        let expires_at = created_at.saturating_add(to_i64(live));
        Lifetime {
            ttl_ms,
            expires_at,
            purge_at: expires_at.saturating_add(to_i64(millis(self.grace))),
        }
    }
}

/// When a task expires and is purged; see [`TaskOptions::lifetime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    /// The ttl recorded (capped), `None` for a `null` ttl.
    pub ttl_ms: Option<u64>,
    /// Past this (ms since the epoch) a non-terminal task reads `failed`.
    pub expires_at: i64,
    /// From this on the task reads as unknown and may be deleted.
    pub purge_at: i64,
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn to_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// What the runtime passes to [`TaskStore::create`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct NewTask<'a> {
    /// Who may see the task.
    pub owner: &'a Owner,
    /// The instance running the task; it must be heartbeating (T11), or
    /// the task reads as lost at once.
    pub instance: InstanceId,
    /// The requested ttl (`ttlMs`), `None` for `null`.
    pub ttl: Option<Duration>,
    /// The suggested poll interval (`pollIntervalMs`).
    pub poll_interval: Option<Duration>,
    /// The first status message.
    pub message: Option<&'a str>,
    /// The task's context (T13), at most [`MAX_CONTEXT_BYTES`].
    pub context: Option<&'a [u8]>,
    /// The most runs the task gets when its instance lapses (T16): `None`
    /// (the default) for a task that dies with its instance.
    pub takeover: Option<u32>,
    /// Created for a worker to claim (T17), not run by `instance`, which
    /// only creates it: the task waits, `working`, for a claim.
    pub queued: bool,
}

impl<'a> NewTask<'a> {
    /// A task of `owner` run by `instance`, with a `null` ttl and no poll
    /// interval or message.
    pub fn new(owner: &'a Owner, instance: InstanceId) -> Self {
        Self {
            owner,
            instance,
            ttl: None,
            poll_interval: None,
            message: None,
            context: None,
            takeover: None,
            queued: false,
        }
    }

    /// Sets the ttl.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets the poll interval.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = Some(interval);
        self
    }

    /// Sets the first status message.
    pub fn message(mut self, message: &'a str) -> Self {
        self.message = Some(message);
        self
    }

    /// Sets the task's context (T13): what the runtime needs to run the
    /// task again.
    pub fn context(mut self, context: &'a [u8]) -> Self {
        self.context = Some(context);
        self
    }

    /// Lets the task outlive its instance (T16): when the instance running
    /// it lapses, another instance or worker claims it ([`RuntimeStore::claim`])
    /// and runs it again, up to `max_attempts` runs in all; after the last
    /// one's instance lapses, it reads `failed` ("server instance lost").
    /// The operation must be safe to run again.
    pub fn takeover(mut self, max_attempts: u32) -> Self {
        self.takeover = Some(max_attempts);
        self
    }

    /// Creates the task for a worker to run (T17): it waits, `working`,
    /// until a claim ([`RuntimeStore::claim`]); the creating instance does not
    /// run it. Implies [`takeover`](Self::takeover) (3 attempts unless set).
    pub fn queued(mut self) -> Self {
        self.queued = true;
        self.takeover.get_or_insert(DEFAULT_MAX_ATTEMPTS);
        self
    }

    /// Checks the limits (T7, T13, T16) before any backend work.
    pub fn check(&self) -> Result<()> {
        if self.takeover == Some(0) {
            return Err(Error::Config(
                "a task that may be taken over needs at least one attempt".into(),
            ));
        }
        check_message(self.message)?;
        check_size(self.context.map_or(0, <[u8]>::len), MAX_CONTEXT_BYTES)
    }
}

/// How a worker ends a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish<'a> {
    /// Completed with this result (a serialized `CallToolResult`).
    Completed(&'a [u8]),
    /// Failed with this error (a serialized JSON-RPC error object).
    Failed(&'a [u8]),
    /// Ended on a cancel request.
    Cancelled,
}

impl Finish<'_> {
    /// The status the task ends in.
    pub fn status(&self) -> TaskStatus {
        match self {
            Finish::Completed(_) => TaskStatus::Completed,
            Finish::Failed(_) => TaskStatus::Failed,
            Finish::Cancelled => TaskStatus::Cancelled,
        }
    }

    /// The outcome bytes to store.
    pub fn outcome(&self) -> Option<&[u8]> {
        match self {
            Finish::Completed(bytes) | Finish::Failed(bytes) => Some(bytes),
            Finish::Cancelled => None,
        }
    }
}

/// A change the worker running a task makes through [`RuntimeStore::apply`].
///
/// Each is one atomic step, allowed only while the task is not terminal
/// (T4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerChange<'a> {
    /// Asks the client for input under `key` (SEP `inputRequests`): the
    /// task becomes `input_required`. A key is spent once used, for the
    /// task's lifetime (T5).
    RequestInput {
        /// The key, 1 to 256 bytes.
        key: &'a str,
        /// The serialized request, at most [`MAX_INPUT_BYTES`].
        request: &'a [u8],
    },
    /// Takes the client's response to `key`, once: the answer is consumed.
    TakeAnswer {
        /// The key the input was requested under.
        key: &'a str,
    },
    /// Replaces the status message (`None` clears it).
    SetMessage(Option<&'a str>),
    /// Replaces the poll interval.
    SetPollInterval(Option<Duration>),
    /// Replaces the ttl, still counted from creation (T8).
    SetTtl(Option<Duration>),
    /// Ends the task; exactly one finisher wins.
    Finish(Finish<'a>),
    /// Replaces the task's context (T13), at most [`MAX_CONTEXT_BYTES`].
    SetContext(&'a [u8]),
    /// Replaces the outstanding input requests with `requests`, in one
    /// step (T15): outstanding keys left out are superseded, keys carried
    /// forward keep their request (which must be the same bytes), new keys
    /// must never have been used. The task is `input_required` while any is
    /// outstanding, else `working`.
    ReplaceInputs {
        /// The whole new set, `(key, serialized request)`, each key once.
        requests: &'a [(&'a str, &'a [u8])],
        /// The new status message; `None` keeps the current one.
        message: Option<&'a str>,
    },
    /// Saves the operation's progress (T19), at most
    /// [`MAX_CHECKPOINT_BYTES`]: whoever runs the task next (after a
    /// takeover, or a release) gets the newest one. Only on a task that may
    /// be taken over.
    Checkpoint(&'a [u8]),
    /// Gives the task back (T17): the worker stops running it, and any
    /// instance or worker may claim it once it is `working` (a task waiting
    /// for input is claimed once answered), without counting an attempt.
    /// Only on a task that may be taken over.
    Release,
}

impl WorkerChange<'_> {
    /// Checks the limits (T5, T7) before any backend work.
    pub fn check(&self, max_payload_bytes: usize) -> Result<()> {
        match self {
            WorkerChange::RequestInput { key, request } => {
                check_key(key)?;
                check_size(request.len(), MAX_INPUT_BYTES)
            }
            WorkerChange::TakeAnswer { key } => check_key(key),
            WorkerChange::SetMessage(message) => check_message(*message),
            WorkerChange::Finish(finish) => {
                check_size(finish.outcome().map_or(0, <[u8]>::len), max_payload_bytes)
            }
            WorkerChange::SetPollInterval(_) | WorkerChange::SetTtl(_) | WorkerChange::Release => {
                Ok(())
            }
            WorkerChange::Checkpoint(checkpoint) => {
                check_size(checkpoint.len(), MAX_CHECKPOINT_BYTES)
            }
            WorkerChange::SetContext(context) => check_size(context.len(), MAX_CONTEXT_BYTES),
            WorkerChange::ReplaceInputs { requests, message } => {
                check_message(*message)?;
                if requests.len() > MAX_OUTSTANDING_INPUTS {
                    return Err(Error::Config(format!(
                        "a task may have at most {MAX_OUTSTANDING_INPUTS} input requests \
                         outstanding, {} were given",
                        requests.len()
                    )));
                }
                for (at, (key, request)) in requests.iter().enumerate() {
                    check_key(key)?;
                    check_size(request.len(), MAX_INPUT_BYTES)?;
                    if requests[..at].iter().any(|(k, _)| k == key) {
                        return Err(Error::Config(format!(
                            "input key {key:?} appears twice in one set of requests"
                        )));
                    }
                }
                Ok(())
            }
        }
    }
}

/// What [`RuntimeStore::apply`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// The change was made; the task is now at `rev`. For
    /// [`WorkerChange::TakeAnswer`], `answer` is the response taken, or
    /// `None` (and nothing changed) when there was none to take.
    Changed {
        /// The task's revision after the change.
        rev: Rev,
        /// The response taken, for `TakeAnswer`.
        answer: Option<Bytes>,
    },
    /// The task was already terminal (perhaps only as read: expired or
    /// orphaned); nothing changed.
    AlreadyTerminal(TaskStatus),
    /// [`WorkerChange::RequestInput`] with a key this task already used;
    /// nothing changed.
    KeySpent,
    /// [`WorkerChange::RequestInput`] after the client asked to cancel:
    /// the worker should wind down instead; nothing changed.
    CancelRequested,
    /// No such task (never created, or purged).
    Unknown,
    /// The writer's claim is stale (T18): the task was released, or claimed
    /// since by another instance or worker (a newer epoch). Nothing
    /// changed; the writer must stop working on the task.
    Fenced,
    /// [`WorkerChange::Checkpoint`] or [`WorkerChange::Release`] on a task
    /// that may not be taken over; nothing changed.
    NoTakeover,
}

/// Which runtime works on a task, and under which claim (T18): what a
/// worker passes to every write ([`RuntimeStore::apply_claimed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Worker {
    /// The instance running the task.
    pub instance: InstanceId,
    /// The claim's epoch: 1 for the instance that created the task, one
    /// more for every claim since.
    pub epoch: u32,
}

impl Worker {
    /// The creating instance's claim: epoch 1.
    pub fn first(instance: InstanceId) -> Self {
        Self { instance, epoch: 1 }
    }
}

/// A task a runtime claimed ([`RuntimeStore::claim`], T17): its key (the id
/// is never stored, T2), the claim to write under, and the task as the
/// runtime reads it, its context (the request to run), its checkpoint and
/// every answer given so far included.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claimed {
    /// The task's key.
    pub task: TaskDigest,
    /// The claim every write names.
    pub worker: Worker,
    /// The task after the claim.
    pub view: TaskView,
    /// How long the task's instance had been lapsed when this claim took
    /// it over (T16), by the store's clock; `None` for a task that was
    /// released (queued, or given back), or whose lapsed instance the store
    /// no longer knows.
    pub lapsed_for: Option<Duration>,
}

impl Claimed {
    /// A claim (for backends).
    pub fn new(task: TaskDigest, worker: Worker, view: TaskView) -> Self {
        Self {
            task,
            worker,
            view,
            lapsed_for: None,
        }
    }

    /// The claim of a task that was stored as `before` (its instance alive
    /// until `alive_until`), made at `now`: [`lapsed_for`](Self::lapsed_for)
    /// set from them (for backends).
    pub fn taken_from(mut self, before: &TaskRecord, alive_until: Option<i64>, now: i64) -> Self {
        let held = before.takeover.as_ref().is_some_and(|t| !t.released);
        self.lapsed_for = alive_until
            .filter(|until| held && *until <= now)
            .map(|until| Duration::from_millis(u64::try_from(now - until).unwrap_or(0)));
        self
    }
}

/// A task as the runtime running it reads it ([`RuntimeStore::view`], T14):
/// whoever owns it, with every answer given and not yet taken.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskView {
    /// Who owns the task: what the runtime passes to the client-facing
    /// calls it makes for the owner ([`TaskStore::answer`],
    /// [`TaskStore::request_cancel`], [`TaskStore::watch`]).
    pub owner: Owner,
    /// The task as a read shows it now (T8, T11 decided), its context
    /// included.
    pub record: TaskRecord,
    /// The response to each key of `record.answered`, `(key, response)`, in
    /// the same order: every answer given and not yet taken by the worker.
    pub answers: Vec<(String, Bytes)>,
    /// The instance that runs the task, or ran it last (T11, T22); `None`
    /// from a store that does not say.
    pub instance: Option<InstanceId>,
    /// When that instance's lease runs out (ms since the epoch, by the
    /// store's clock), as the read saw it; `None` when the store knows the
    /// instance no more (it lapsed and was forgotten) or does not say.
    pub instance_alive_until: Option<i64>,
}

impl TaskView {
    /// A view (for backends).
    pub fn new(owner: Owner, record: TaskRecord, answers: Vec<(String, Bytes)>) -> Self {
        Self {
            owner,
            record,
            answers,
            instance: None,
            instance_alive_until: None,
        }
    }

    /// The view with the task's instance and that instance's lease
    /// deadline as read (T22; for backends).
    pub fn on_instance(mut self, instance: InstanceId, alive_until: Option<i64>) -> Self {
        self.instance = Some(instance);
        self.instance_alive_until = alive_until;
        self
    }
}

/// How [`TaskStore::request_cancel`] ends a task (T6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CancelMode {
    /// Records the request; the worker sees it and chooses how the task
    /// ends (rmcp's behaviour).
    #[default]
    Cooperative,
    /// Records the request and ends the task as `cancelled` in the same
    /// step (the C# SDK's and tower-mcp's behaviour).
    Immediate,
}

/// What [`TaskStore::purge_expired_tasks`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskPurgeReport {
    /// Tasks past their ttl persisted as `failed`.
    pub expired: u64,
    /// Tasks of lapsed instances persisted as `failed`.
    pub orphaned: u64,
    /// Of the `orphaned`, those created to be taken over (T16): their
    /// last run's instance lapsed, so no run was left.
    pub exhausted: u64,
    /// Tasks deleted with their inputs, past their grace.
    pub deleted: u64,
    /// Lapsed instances forgotten.
    pub instances: u64,
}

/// Adds up the reports of a purge's steps.
impl std::ops::AddAssign for TaskPurgeReport {
    fn add_assign(&mut self, step: Self) {
        self.expired += step.expired;
        self.orphaned += step.orphaned;
        self.exhausted += step.exhausted;
        self.deleted += step.deleted;
        self.instances += step.instances;
    }
}

/// Durable, shared task state (SEP-2663): what a server uses to serve its
/// clients (create, get, answer, cancel, watch), and what an operator
/// purges and deletes.
///
/// Client-facing calls take the id as received, text, and the caller's
/// [`Owner`]: a malformed id, an unknown one and one of another owner all
/// give the same `Ok(None)` (T2, T3). Every mutation is one atomic step,
/// visible to every handle on the backend once it returns (T4, T9).
///
/// What the runtime running tasks needs besides (instances and their
/// leases, claims, writes under a claim) is [`RuntimeStore`]: a handle
/// from `connect` offers it only when asked
/// ([`Store::task_runtime`](crate::Store::task_runtime)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use std::time::Duration;
/// use mcp_event_store_core::task::*;
///
/// let store = MemoryTaskStore::new();
/// // The runtime's part: an instance with a lease, a worker's write.
/// let me = InstanceId::generate()?;
/// store.heartbeat(me, Duration::from_secs(30)).await?;
/// let owner = Owner::principal(b"alice")?;
/// let (id, task) = store.create(NewTask::new(&owner, me)).await?;
/// assert_eq!(task.status, TaskStatus::Working);
/// let done = store.apply(&id, me, WorkerChange::Finish(Finish::Completed(b"{}"))).await?;
/// assert!(matches!(done, Applied::Changed { .. }));
///
/// // The client's part: reads by id and owner.
/// let seen = store.get(&id.to_string(), &owner).await?.unwrap();
/// assert_eq!(seen.status, TaskStatus::Completed);
/// assert!(store.get(&id.to_string(), &Owner::Anonymous).await?.is_none());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Inserts a `working` task under `id` if no task has that id, and
    /// returns it once it is durable and readable from every handle (T1);
    /// `None` when the id is taken (then nothing changed).
    /// [`Error::InstanceLapsed`], creating nothing, when the task's
    /// instance is not alive at the store's clock, in the same atomic step
    /// as the insert: a task is never born under a lapsed instance (T11).
    ///
    /// Use [`create`](Self::create), which draws the id.
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> Result<Option<TaskRecord>>;

    /// Creates a task under a fresh id (T1, T2): ids are never reissued, so
    /// a taken id is drawn again. [`Error::InstanceLapsed`] when the task's
    /// instance is not alive (see [`try_create`](Self::try_create)).
    async fn create(&self, task: NewTask<'_>) -> Result<(TaskId, TaskRecord)> {
        task.check()?;
        for _ in 0..8 {
            let id = TaskId::generate()?;
            if let Some(record) = self.try_create(&id, &task).await? {
                return Ok((id, record));
            }
        }
        Err(Error::Corrupt(
            "eight fresh task ids in a row were taken; the random source is broken".into(),
        ))
    }

    /// The task as its owner sees it now (T8, T11 decided at read time), or
    /// `None`.
    async fn get(&self, id: &str, who: &Owner) -> Result<Option<TaskRecord>>;

    /// Records the client's responses (`tasks/update`): outstanding keys
    /// become answered, every other key is ignored (SEP:381), and with none
    /// left outstanding the task is `working` again. On a terminal task it
    /// changes nothing. Returns the task after the call, or `None`.
    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>>;

    /// Records the client's cancel request (`tasks/cancel`, T6): on a
    /// non-terminal task it sets the cancel flag, supersedes the outstanding
    /// inputs and makes the task `working` (or, [`CancelMode::Immediate`],
    /// `cancelled`), keeping `reason` with the task unless a reason is kept
    /// already (T20; at most [`MAX_MESSAGE_BYTES`], else
    /// [`Error::PayloadTooLarge`]). Idempotent; returns the task after the
    /// call, or `None`.
    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>>;

    /// The task as soon as its `rev` is past `after`, or as it is when
    /// `max_wait` passes; `None` as [`get`](Self::get) (T10). A wake-up
    /// only prompts a re-read; dropping the future frees everything.
    /// Expiry and orphaning are decided by reads (T8, T11) and wake no
    /// one: a watcher sees them at `max_wait` at the latest, so a worker's
    /// `max_wait` bounds how long it keeps running on a task already failed.
    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>>;

    /// Persists what reads already show (expired and orphaned tasks as
    /// `failed`), deletes tasks past their grace with their inputs, and
    /// forgets lapsed instances with no task left running (T8, T11, T21).
    async fn purge_expired_tasks(&self) -> Result<TaskPurgeReport>;

    /// Deletes a task and its inputs, whoever owns it (an operator's call);
    /// `true` if it existed.
    async fn delete(&self, id: &str) -> Result<bool>;
}

/// One instance's lease as a store holds it ([`RuntimeStore::instances`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceLease {
    /// The instance.
    pub instance: InstanceId,
    /// When its lease runs out, in milliseconds since the epoch by the
    /// store's clock.
    pub alive_until: i64,
    /// Whether it was alive when read, by the store's clock.
    pub alive: bool,
}

impl InstanceLease {
    /// A lease as read at `now` (for backends).
    pub fn new(instance: InstanceId, alive_until: i64, now: i64) -> Self {
        Self {
            instance,
            alive_until,
            alive: alive_until > now,
        }
    }
}

/// What the runtime running tasks uses besides [`TaskStore`]: instances
/// and their leases (T11), claims (T17), and writes and reads under a claim
/// (T4, T14, T18).
///
/// Every store of this project implements it; an application reaches it
/// through [`Store::task_runtime`](crate::Store::task_runtime), and the
/// runtime crate (`mcp-event-store-runtime`) is what calls it. Like
/// [`apply`](Self::apply), these calls trust their caller: the runtime has
/// authorized the client itself.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use std::time::Duration;
/// use mcp_event_store_core::task::*;
///
/// let store = MemoryTaskStore::new();
/// let me = InstanceId::generate()?;
/// store.heartbeat(me, Duration::from_secs(30)).await?;
/// let owner = Owner::principal(b"alice")?;
/// let task = NewTask::new(&owner, me).context(br#"{"tool":"deploy"}"#);
/// let (id, _) = store.create(task).await?;
/// let ask = WorkerChange::RequestInput { key: "ok", request: b"{}" };
/// store.apply(&id, me, ask).await?;
/// store.answer(&id.to_string(), &owner, &[("ok", b"yes")]).await?;
///
/// let view = store.view(&id).await?.unwrap();
/// assert_eq!(view.owner, owner);
/// assert_eq!(view.record.context.as_deref(), Some(&br#"{"tool":"deploy"}"#[..]));
/// assert_eq!(view.answers, [("ok".to_owned(), bytes::Bytes::from_static(b"yes"))]);
///
/// assert!(store.is_alive(me).await?);
/// store.retire(me).await?; // a graceful shutdown: lapsed at once
/// assert!(!store.is_alive(me).await?);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait RuntimeStore: TaskStore {
    /// Registers or renews instance `me` for `lease` from now (T11).
    /// Returns `false`, changing nothing, when `me` had lapsed: its tasks
    /// already read as lost, and reviving it would bring them back, so the
    /// runtime must register under a new id.
    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> Result<bool>;

    /// Ends `me`'s lease now (T11): for a graceful shutdown, so that its
    /// tasks are taken over (or read lost) at once rather than a lease
    /// later. `false` when it had lapsed already.
    async fn retire(&self, me: InstanceId) -> Result<bool> {
        self.heartbeat(me, Duration::ZERO).await
    }

    /// Whether instance `id` is alive now, by the store's clock (T11): it
    /// registered and its lease has not run out. An instance the store
    /// forgot (lapsed and purged) or never saw is not.
    async fn is_alive(&self, id: InstanceId) -> Result<bool>;

    /// Every instance the store holds a lease of, alive or lapsed and not
    /// yet forgotten by a purge (T11), in no particular order.
    async fn instances(&self) -> Result<Vec<InstanceLease>>;

    /// Applies a worker's change (T4), made by instance `by` under the
    /// creator's claim ([`Worker::first`]); see
    /// [`apply_claimed`](Self::apply_claimed).
    async fn apply(
        &self,
        id: &TaskId,
        by: InstanceId,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        self.apply_claimed(&id.digest(), Worker::first(by), change)
            .await
    }

    /// Applies a worker's change (T4) to the task under `task`. For a task
    /// that dies with its instance, `by`'s instance becomes the task's: the
    /// instance that last worked on a task is the one whose heartbeat keeps
    /// it alive (T11). For one that may be taken over, `by` must hold the
    /// current claim, its instance and epoch, or the change is
    /// [`Applied::Fenced`] (T18). On a task that is terminal, or only reads
    /// so (expired, orphaned), nothing changes.
    async fn apply_claimed(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied>;

    /// The task as the runtime running it reads it (T14): whoever owns it,
    /// as a read shows it now (T8, T11), with its owner and every answer
    /// given and not yet taken; `None` for no such task (never created, or
    /// purged).
    async fn view(&self, id: &TaskId) -> Result<Option<TaskView>> {
        self.view_claimed(&id.digest()).await
    }

    /// [`view`](Self::view) of the task under `task`, for a runtime that
    /// holds a claim rather than the id (T14, T17).
    async fn view_claimed(&self, task: &TaskDigest) -> Result<Option<TaskView>>;

    /// [`watch`](TaskStore::watch) of the task under `task`, whoever owns
    /// it, for the runtime running it (T10, T17).
    async fn watch_claimed(
        &self,
        task: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>>;

    /// Claims up to `limit` tasks that wait for a runtime (T17): tasks that
    /// may be taken over, `working`, not ended as read, and either released
    /// (queued for a worker, given back by one) or whose instance lapsed
    /// with runs left. Each claim is atomic: of instances racing for a
    /// task, exactly one gets it. The task's instance becomes `by`, its
    /// epoch grows by one (so the previous holder is fenced, T18), and, if
    /// its instance lapsed, it counts one more run (T16). `by` must be alive
    /// ([`Error::InstanceLapsed`] otherwise). A task whose client asked to
    /// cancel is claimed too: the claimant ends it. A store that claims
    /// task by task and fails part way returns the claims it made (an
    /// `Err` would leave their tasks held by a live instance that runs
    /// none of them).
    async fn claim(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>>;

    /// Up to `limit` tasks after `after`, ascending by digest, each as
    /// [`view_claimed`](Self::view_claimed) reads it, with its instance
    /// (T22): what an operator lists. `limit` is 1 to
    /// [`MAX_LIST_PAGE`](crate::MAX_LIST_PAGE) (larger is cut to it).
    /// Costs one listing read and one task read per task.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskPage>;

    /// An operator's cancel (T22): the task under `task` ends `cancelled`
    /// at once, whoever owns it, exactly as its owner's
    /// [`CancelMode::Immediate`] request with `reason` would end it (T6,
    /// T20). The task as then read; `None` for no such task.
    async fn cancel_task(
        &self,
        task: &TaskDigest,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>>;

    /// An operator's requeue (T23): a task created to be taken over that
    /// reads `failed`, before its ttl ran out and unless its client asked
    /// to cancel it, waits for a claim again, with one more run if none is
    /// left; see [`Requeue`].
    async fn requeue_task(&self, task: &TaskDigest) -> Result<Requeue>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_caps_the_ttl_and_keeps_a_whole_grace() {
        let options = TaskOptions::default();
        let hour = 3_600_000;
        let l = options.lifetime(1_000, Some(Duration::from_secs(60)));
        assert_eq!(l.ttl_ms, Some(60_000));
        assert_eq!((l.expires_at, l.purge_at), (61_000, 61_000 + hour));
        let l = options.lifetime(0, Some(Duration::from_secs(3 * 3600)));
        assert_eq!(l.purge_at - l.expires_at, hour);
        let l = options.lifetime(5, Some(Duration::ZERO));
        assert_eq!((l.ttl_ms, l.expires_at, l.purge_at), (Some(0), 5, 5 + hour));
        let l = options.lifetime(0, None);
        assert_eq!(l.ttl_ms, None);
        assert_eq!(l.expires_at, 7 * 24 * hour);
        let l = options.lifetime(0, Some(Duration::from_secs(30 * 24 * 3600)));
        assert_eq!(l.ttl_ms, Some(7 * 24 * 3_600_000));
        let l = options
            .grace(Duration::from_secs(1))
            .lifetime(0, Some(Duration::from_millis(1)));
        assert_eq!((l.expires_at, l.purge_at), (1, 1_001));
    }

    #[tokio::test]
    async fn both_traits_are_dyn_compatible() {
        let store = std::sync::Arc::new(MemoryTaskStore::new());
        let runtime: std::sync::Arc<dyn RuntimeStore> = store.clone();
        let me = InstanceId::generate().unwrap();
        assert!(
            runtime
                .heartbeat(me, Duration::from_secs(30))
                .await
                .unwrap()
        );
        let tasks: std::sync::Arc<dyn TaskStore> = store;
        let (id, _) = tasks
            .create(NewTask::new(&Owner::Anonymous, me))
            .await
            .unwrap();
        let seen = tasks.get(&id.to_string(), &Owner::Anonymous).await.unwrap();
        assert_eq!(seen.map(|t| t.status), Some(TaskStatus::Working));
    }
}
