//! For backend authors: the task plumbing every task store shares.
//!
//! Applications use [`crate::task`]; a backend's task store uses this:
//!
//! * [`TaskMachine`], the state machine written once: what a client call
//!   or a worker's change does to a [`TaskRecord`], decided in memory on
//!   the record a backend read inside its atomic step ([`machine`]);
//! * [`rows`], the whole step (read, decide, write back) for stores that
//!   keep a task as a row and its inputs as rows (SQLite, PostgreSQL): a
//!   backend writes only its statements ([`rows::TaskRows`]);
//! * [`codec`], the one binary encoding of a task in one value, for stores
//!   that keep a task as one value (sled, Redis);
//! * [`TaskDigest`], the key a backend stores a task under (T2), and
//!   [`OwnerKey`], the owner as stored (T3);
//! * the limits every store checks the same way ([`check_key`],
//!   [`check_message`], [`check_responses`]), and [`OwnedWorkerChange`], a
//!   [`WorkerChange`] a backend can send to another task or thread.

pub mod codec;
pub mod machine;
pub mod rows;

use std::time::Duration;

use bytes::Bytes;

pub use machine::{InputEffect, Step, replacement};

use crate::error::{Error, Result};
pub use crate::task::id::TaskDigest;
use crate::task::{
    CancelMode, EXPIRED_ERROR, Finish, InstanceId, MAX_INPUT_BYTES, MAX_INPUT_KEY_BYTES,
    MAX_MESSAGE_BYTES, NewTask, Owner, Rev, TaskOptions, TaskPurgeReport, TaskRecord, TaskStatus,
    Worker, WorkerChange,
};

/// The state machine on a [`TaskRecord`], for backends (see [`machine`]).
///
/// Implemented for [`TaskRecord`] only; bring it into scope to call these
/// as methods (`record.apply(..)`, `TaskRecord::created(..)`).
pub trait TaskMachine: Sized {
    /// A new task's record, created at `now` with the lifetime `options`
    /// give its requested ttl (T8): `working` at `rev` 1.
    fn created(task: &NewTask<'_>, now: i64, options: &TaskOptions) -> Self;

    /// The record as a read at `now` shows it, given its instance's
    /// heartbeat deadline (`None`: the instance is unknown): expired and
    /// orphaned tasks read `failed` (T8, T11), a task past its grace reads
    /// as gone (`None`).
    fn seen_at(self, now: i64, instance_alive_until: Option<i64>) -> Option<Self>;

    /// Records a change made at `now`: bumps `rev` (T4) and moves
    /// `updated_at` forward, never back. Returns the new `rev`.
    fn bump(&mut self, now: i64) -> Rev;

    /// The client answers (T5); returns the responses to store, one per
    /// newly answered key, in the order given (empty: nothing changed).
    fn answer<'r, K: AsRef<str>, R>(
        &mut self,
        responses: &'r [(K, R)],
        now: i64,
    ) -> Vec<&'r (K, R)>;

    /// The client asks to cancel (T6), giving `reason` (T20); `true` if the
    /// record changed.
    fn request_cancel(&mut self, mode: CancelMode, reason: Option<&str>, now: i64) -> bool;

    /// Whether `by` may not write to the task at `now`, whose instance as
    /// stored is `holder`, alive until `holder_alive_until` (T18): check it
    /// before [`apply`](Self::apply), and answer
    /// [`Applied::Fenced`](crate::task::Applied::Fenced) when it is.
    fn fenced(&self, by: &Worker, holder: &[u8], holder_alive_until: Option<i64>, now: i64)
    -> bool;

    /// Claims the task for `by` (T17) if it waits for a runtime, given its
    /// instance's heartbeat deadline: the claim to write under, the record
    /// changed (store it with `by` as its instance); `None`, unchanged,
    /// otherwise.
    fn claim(
        &mut self,
        by: InstanceId,
        instance_alive_until: Option<i64>,
        now: i64,
    ) -> Option<Worker>;

    /// A worker's change (T4, T5, T7, T13, T15, T19), given which keys the
    /// task ever used; what to store for the inputs when it changed.
    fn apply<'a>(
        &mut self,
        change: WorkerChange<'a>,
        key_used: impl Fn(&str) -> bool,
        options: &TaskOptions,
        now: i64,
    ) -> Result<Step<'a>>;
}

impl TaskMachine for TaskRecord {
    fn created(task: &NewTask<'_>, now: i64, options: &TaskOptions) -> Self {
        TaskRecord::created(task, now, options)
    }

    fn seen_at(self, now: i64, instance_alive_until: Option<i64>) -> Option<Self> {
        TaskRecord::seen_at(self, now, instance_alive_until)
    }

    fn bump(&mut self, now: i64) -> Rev {
        TaskRecord::bump(self, now)
    }

    fn answer<'r, K: AsRef<str>, R>(
        &mut self,
        responses: &'r [(K, R)],
        now: i64,
    ) -> Vec<&'r (K, R)> {
        TaskRecord::answer(self, responses, now)
    }

    fn request_cancel(&mut self, mode: CancelMode, reason: Option<&str>, now: i64) -> bool {
        TaskRecord::request_cancel(self, mode, reason, now)
    }

    fn apply<'a>(
        &mut self,
        change: WorkerChange<'a>,
        key_used: impl Fn(&str) -> bool,
        options: &TaskOptions,
        now: i64,
    ) -> Result<Step<'a>> {
        TaskRecord::apply(self, change, key_used, options, now)
    }

    fn fenced(
        &self,
        by: &Worker,
        holder: &[u8],
        holder_alive_until: Option<i64>,
        now: i64,
    ) -> bool {
        TaskRecord::fenced(self, by, holder, holder_alive_until, now)
    }

    fn claim(
        &mut self,
        by: InstanceId,
        instance_alive_until: Option<i64>,
        now: i64,
    ) -> Option<Worker> {
        TaskRecord::claim(self, by, instance_alive_until, now)
    }
}

/// The owner as stored (T3): the principal's digest, empty for
/// [`Owner::Anonymous`]. Compared as bytes, so anonymous never matches a
/// principal.
pub type OwnerKey = Vec<u8>;

/// The owner as a backend stores it ([`OwnerKey`]).
pub fn owner_key(owner: &Owner) -> OwnerKey {
    owner.digest().map_or_else(Vec::new, |d| d.to_vec())
}

/// The owner a stored [`OwnerKey`] names.
///
/// # Errors
///
/// [`Error::Corrupt`] for stored bytes that are neither empty nor a
/// digest.
pub fn owner_of(key: &[u8]) -> Result<Owner> {
    if key.is_empty() {
        return Ok(Owner::Anonymous);
    }
    key.try_into()
        .map(Owner::Principal)
        .map_err(|_| Error::Corrupt("a task owner is not 16 bytes".into()))
}

/// The opening of a client-facing call ([`get`](crate::task::TaskStore::get),
/// [`answer`](crate::task::TaskStore::answer), ...): the key of the task
/// `id` names and the caller's [`OwnerKey`], or `None` when `id` is not a
/// task id this store could have issued, so the call answers as for an
/// unknown task without reaching the backend (T2).
pub fn client_call(id: &str, who: &Owner) -> Option<(TaskDigest, OwnerKey)> {
    TaskDigest::of(id).map(|digest| (digest, owner_key(who)))
}

/// A stored task digest, checked (T2).
///
/// # Errors
///
/// [`Error::Corrupt`] unless it has a digest's 16 bytes.
pub fn stored_digest(bytes: &[u8]) -> Result<TaskDigest> {
    bytes
        .try_into()
        .map(TaskDigest::from_bytes)
        .map_err(|_| Error::Corrupt("a task digest is not 16 bytes".into()))
}

/// A stored instance id, checked (T11).
///
/// # Errors
///
/// [`Error::Corrupt`] unless it has an instance id's 16 bytes.
pub fn stored_instance(bytes: &[u8]) -> Result<InstanceId> {
    bytes
        .try_into()
        .map(InstanceId::from_bytes)
        .map_err(|_| Error::Corrupt("an instance id is not 16 bytes".into()))
}

/// Counts a task a purge persisted as a read showed it, `ended`: expired
/// ([`EXPIRED_ERROR`]) or orphaned.
pub fn count_ended(report: &mut TaskPurgeReport, ended: &TaskRecord) {
    if ended.outcome.as_deref() == Some(EXPIRED_ERROR) {
        report.expired += 1;
    } else {
        report.orphaned += 1;
        report.exhausted += u64::from(ended.takeover.is_some());
    }
}

/// Checks an input key: 1 to [`MAX_INPUT_KEY_BYTES`] bytes (T5).
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_INPUT_KEY_BYTES {
        return Err(Error::Config(format!(
            "input key is {} bytes, it must be 1 to {MAX_INPUT_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

/// Checks a status message against [`MAX_MESSAGE_BYTES`] (T7).
pub fn check_message(message: Option<&str>) -> Result<()> {
    check_size(message.map_or(0, str::len), MAX_MESSAGE_BYTES)
}

/// Checks client responses (T7): each at most [`MAX_INPUT_BYTES`]. Keys are
/// not checked: a key that is not outstanding is ignored, whatever it is.
pub fn check_responses(responses: &[(&str, &[u8])]) -> Result<()> {
    responses
        .iter()
        .try_for_each(|(_, response)| check_size(response.len(), MAX_INPUT_BYTES))
}

/// `PayloadTooLarge` when `size` exceeds `max`.
pub(crate) fn check_size(size: usize, max: usize) -> Result<()> {
    if size > max {
        return Err(Error::PayloadTooLarge { size, max });
    }
    Ok(())
}

/// A [`WorkerChange`] that owns its bytes, for a backend that hands the
/// change to another task or thread (a writer task, a blocking pool).
/// [`as_change`](Self::as_change) borrows it back for the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnedWorkerChange {
    /// [`WorkerChange::RequestInput`].
    RequestInput {
        /// The key.
        key: String,
        /// The serialized request.
        request: Bytes,
    },
    /// [`WorkerChange::TakeAnswer`].
    TakeAnswer {
        /// The key.
        key: String,
    },
    /// [`WorkerChange::SetMessage`].
    SetMessage(Option<String>),
    /// [`WorkerChange::SetPollInterval`].
    SetPollInterval(Option<Duration>),
    /// [`WorkerChange::SetTtl`].
    SetTtl(Option<Duration>),
    /// [`WorkerChange::Finish`]: the terminal status and its outcome
    /// (empty for `cancelled`).
    Finish {
        /// `completed`, `failed` or `cancelled`.
        status: TaskStatus,
        /// The result or error bytes.
        outcome: Bytes,
    },
    /// [`WorkerChange::SetContext`].
    SetContext(Bytes),
    /// [`WorkerChange::ReplaceInputs`].
    ReplaceInputs {
        /// The whole new set, `(key, serialized request)`.
        requests: Vec<(String, Bytes)>,
        /// The new status message, if any.
        message: Option<String>,
    },
    /// [`WorkerChange::Checkpoint`].
    Checkpoint(Bytes),
    /// [`WorkerChange::Release`].
    Release,
}

impl OwnedWorkerChange {
    /// Borrows the change back; `pairs` holds the borrowed requests of a
    /// replacement (pass an empty `Vec` that outlives the result).
    pub fn as_change<'a>(&'a self, pairs: &'a mut Vec<(&'a str, &'a [u8])>) -> WorkerChange<'a> {
        match self {
            Self::RequestInput { key, request } => WorkerChange::RequestInput { key, request },
            Self::TakeAnswer { key } => WorkerChange::TakeAnswer { key },
            Self::SetMessage(message) => WorkerChange::SetMessage(message.as_deref()),
            Self::SetPollInterval(interval) => WorkerChange::SetPollInterval(*interval),
            Self::SetTtl(ttl) => WorkerChange::SetTtl(*ttl),
            Self::Finish { status, outcome } => WorkerChange::Finish(match status {
                TaskStatus::Completed => Finish::Completed(outcome),
                TaskStatus::Failed => Finish::Failed(outcome),
                _ => Finish::Cancelled,
            }),
            Self::SetContext(context) => WorkerChange::SetContext(context),
            Self::Checkpoint(checkpoint) => WorkerChange::Checkpoint(checkpoint),
            Self::Release => WorkerChange::Release,
            Self::ReplaceInputs { requests, message } => {
                pairs.extend(requests.iter().map(|(k, r)| (k.as_str(), &r[..])));
                WorkerChange::ReplaceInputs {
                    requests: pairs,
                    message: message.as_deref(),
                }
            }
        }
    }
}

impl WorkerChange<'_> {
    /// This change, owning its bytes.
    pub fn to_owned(&self) -> OwnedWorkerChange {
        match *self {
            WorkerChange::RequestInput { key, request } => OwnedWorkerChange::RequestInput {
                key: key.to_owned(),
                request: Bytes::copy_from_slice(request),
            },
            WorkerChange::TakeAnswer { key } => OwnedWorkerChange::TakeAnswer {
                key: key.to_owned(),
            },
            WorkerChange::SetMessage(message) => {
                OwnedWorkerChange::SetMessage(message.map(str::to_owned))
            }
            WorkerChange::SetPollInterval(interval) => OwnedWorkerChange::SetPollInterval(interval),
            WorkerChange::SetTtl(ttl) => OwnedWorkerChange::SetTtl(ttl),
            WorkerChange::Finish(finish) => OwnedWorkerChange::Finish {
                status: finish.status(),
                outcome: Bytes::copy_from_slice(finish.outcome().unwrap_or_default()),
            },
            WorkerChange::SetContext(context) => {
                OwnedWorkerChange::SetContext(Bytes::copy_from_slice(context))
            }
            WorkerChange::Checkpoint(checkpoint) => {
                OwnedWorkerChange::Checkpoint(Bytes::copy_from_slice(checkpoint))
            }
            WorkerChange::Release => OwnedWorkerChange::Release,
            WorkerChange::ReplaceInputs { requests, message } => OwnedWorkerChange::ReplaceInputs {
                requests: requests
                    .iter()
                    .map(|(key, request)| ((*key).to_owned(), Bytes::copy_from_slice(request)))
                    .collect(),
                message: message.map(str::to_owned),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_change_borrows_back_as_the_change_it_was() {
        let requests = [("a", &b"{}"[..]), ("b", &b"[]"[..])];
        let changes = [
            WorkerChange::RequestInput {
                key: "k",
                request: b"{}",
            },
            WorkerChange::TakeAnswer { key: "k" },
            WorkerChange::SetMessage(Some("m")),
            WorkerChange::SetMessage(None),
            WorkerChange::SetPollInterval(Some(Duration::from_secs(1))),
            WorkerChange::SetTtl(None),
            WorkerChange::Finish(Finish::Completed(b"{}")),
            WorkerChange::Finish(Finish::Failed(b"{}")),
            WorkerChange::Finish(Finish::Cancelled),
            WorkerChange::SetContext(b"ctx"),
            WorkerChange::Checkpoint(b"step 3"),
            WorkerChange::Release,
            WorkerChange::ReplaceInputs {
                requests: &requests,
                message: Some("m"),
            },
        ];
        for change in changes {
            let owned = change.to_owned();
            let mut pairs = Vec::new();
            assert_eq!(
                format!("{:?}", owned.as_change(&mut pairs)),
                format!("{change:?}")
            );
        }
    }

    #[test]
    fn owner_keys_round_trip() {
        for owner in [Owner::Anonymous, Owner::principal(b"alice").unwrap()] {
            assert_eq!(owner_of(&owner_key(&owner)).unwrap(), owner);
        }
        assert!(matches!(owner_of(b"short"), Err(Error::Corrupt(_))));
    }

    #[test]
    fn limits_are_inclusive() {
        assert!(check_key("k").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(256)).is_ok());
        assert!(check_key(&"k".repeat(257)).is_err());
        assert!(check_message(Some(&"m".repeat(MAX_MESSAGE_BYTES))).is_ok());
        assert!(matches!(
            check_message(Some(&"m".repeat(MAX_MESSAGE_BYTES + 1))),
            Err(Error::PayloadTooLarge { .. })
        ));
    }
}
