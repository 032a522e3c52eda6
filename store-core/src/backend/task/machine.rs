//! The task state machine, written once for every backend.
//!
//! What a client call or a worker's change does to a task is decided here,
//! in memory, on the [`TaskRecord`] a backend read inside its atomic step
//! (its lock or transaction), with `outstanding` and `answered` filled from
//! the task's inputs. A backend:
//!
//! 1. reads the task and decides visibility with
//!    [`TaskMachine::seen_at`](crate::backend::task::TaskMachine::seen_at); if the record as seen is terminal, it
//!    answers with it (or [`Applied::AlreadyTerminal`]) and changes
//!    nothing (T4);
//! 2. calls [`TaskMachine::answer`](crate::backend::task::TaskMachine::answer), [`TaskMachine::request_cancel`](crate::backend::task::TaskMachine::request_cancel) or
//!    [`TaskMachine::apply`](crate::backend::task::TaskMachine::apply) on the record as stored;
//! 3. if that reports a change, stores the record (its `rev` already
//!    bumped) and the inputs' new states the call names, conditioned on
//!    the `rev` it read, in the same atomic step.
//!
//! So backends differ only in how they store bytes.

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::task::{
    Applied, CancelMode, EXPIRED_ERROR, INSTANCE_LOST_ERROR, InstanceId, MAX_OUTSTANDING_INPUTS,
    NewTask, RequeueRefusal, Rev, Takeover, TaskOptions, TaskRecord, TaskStatus, Worker,
    WorkerChange, millis,
};

/// What a backend stores for a task's inputs when [`TaskMachine::apply`](crate::backend::task::TaskMachine::apply)
/// changed the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputEffect<'a> {
    /// The inputs stay as they are.
    None,
    /// Add `key` as a new outstanding input with `request`, after every
    /// input the task has (inputs are ordered by when they were requested).
    Request {
        /// The key, not used before by this task.
        key: &'a str,
        /// The serialized request.
        request: &'a [u8],
    },
    /// Mark the answered input `key` spent and hand its response to the
    /// worker as [`Applied::Changed`]'s `answer`.
    Take {
        /// A key the record listed as answered.
        key: &'a str,
    },
    /// Mark every outstanding input spent (the task ended).
    Supersede,
    /// The outstanding inputs were replaced by `requests` (T15): mark every
    /// outstanding input whose key is not among them spent, and add each of
    /// them that was not outstanding as a new outstanding input, in the
    /// order given, after every input the task has. [`replacement`] says
    /// which, given the record as it was before.
    Replace {
        /// The new outstanding set, `(key, request)`.
        requests: &'a [(&'a str, &'a [u8])],
    },
}

/// What an [`InputEffect::Replace`] of `before`'s outstanding inputs by
/// `requests` changes: the keys it supersedes, and the requests it adds
/// (those not outstanding before), in the order given.
pub fn replacement<'a>(
    before: &TaskRecord,
    requests: &'a [(&'a str, &'a [u8])],
) -> (Vec<String>, Vec<(&'a str, &'a [u8])>) {
    let superseded = before
        .outstanding
        .iter()
        .filter(|(key, _)| !requests.iter().any(|(k, _)| k == key))
        .map(|(key, _)| key.clone())
        .collect();
    let added = requests
        .iter()
        .filter(|(key, _)| !before.outstanding.iter().any(|(k, _)| k == key))
        .copied()
        .collect();
    (superseded, added)
}

/// What [`TaskMachine::apply`](crate::backend::task::TaskMachine::apply) decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Nothing changed: answer the worker with this and store nothing.
    Unchanged(Applied),
    /// The record changed and its `rev` was bumped: store it, make the
    /// calling instance the task's instance (T11), apply the input effect,
    /// and answer [`Applied::Changed`] with the new `rev`.
    Changed(InputEffect<'a>),
}

impl TaskRecord {
    /// A new task's record, created at `now` with the lifetime `options`
    /// give its requested ttl (T8): `working` at `rev` 1.
    pub(crate) fn created(task: &NewTask<'_>, now: i64, options: &TaskOptions) -> Self {
        let lifetime = options.lifetime(now, task.ttl);
        TaskRecord {
            status: TaskStatus::Working,
            rev: 1,
            message: task.message.map(str::to_owned),
            created_at: now,
            updated_at: now,
            ttl_ms: lifetime.ttl_ms,
            expires_at: lifetime.expires_at,
            purge_at: lifetime.purge_at,
            poll_interval_ms: task.poll_interval.map(millis),
            cancel_requested: false,
            cancel_reason: None,
            outcome: None,
            outstanding: Vec::new(),
            answered: Vec::new(),
            context: task.context.map(Bytes::copy_from_slice),
            takeover: task
                .takeover
                .map(|max_attempts| Takeover::new(max_attempts, task.queued)),
        }
    }

    /// Whether `by` may not write to the task at `now`, whose instance is
    /// `holder`, alive until `holder_alive_until` (T18): a task that may be
    /// taken over takes writes only from the current claim, its instance
    /// and epoch, while that instance is alive, and from nobody while it is
    /// released. So an instance that comes back after it was counted
    /// lapsed changes nothing, claimed since or not. A task that dies with
    /// its instance takes any writer.
    pub(crate) fn fenced(
        &self,
        by: &Worker,
        holder: &[u8],
        holder_alive_until: Option<i64>,
        now: i64,
    ) -> bool {
        self.takeover.as_ref().is_some_and(|takeover| {
            takeover.released
                || takeover.epoch != by.epoch
                || holder != by.instance.as_bytes()
                || holder_alive_until.is_none_or(|until| until <= now)
        })
    }

    /// Claims the task for `by` at `now`, given its instance's heartbeat
    /// deadline (T17): if it may be taken over, reads `working`, and is
    /// released or its instance lapsed (with a run left, else it reads
    /// `failed`), the epoch grows by one, a lapse counts one more run, the
    /// task is no longer released, and `rev` is bumped; the claim to write
    /// under is returned. `None`, changing nothing, otherwise. The backend
    /// stores the record with `by` as the task's instance.
    pub(crate) fn claim(
        &mut self,
        by: InstanceId,
        instance_alive_until: Option<i64>,
        now: i64,
    ) -> Option<Worker> {
        let seen = self.clone().seen_at(now, instance_alive_until)?;
        if seen.status != TaskStatus::Working {
            return None;
        }
        let lapsed = now >= instance_alive_until.unwrap_or(i64::MIN);
        let takeover = self.takeover.as_mut()?;
        if !takeover.released && !lapsed {
            return None;
        }
        if !takeover.released {
            takeover.lapses += 1;
        }
        takeover.released = false;
        takeover.epoch += 1;
        let epoch = takeover.epoch;
        self.bump(now);
        Some(Worker {
            instance: by,
            epoch,
        })
    }

    /// Records a change made at `now`: bumps `rev` (T4) and moves
    /// `updated_at` forward, never back. Returns the new `rev`.
    pub(crate) fn bump(&mut self, now: i64) -> Rev {
        self.rev += 1;
        self.updated_at = now.max(self.updated_at);
        self.rev
    }

    /// The client answers (T5): each response whose key is outstanding
    /// moves it to `answered`; other keys, and repeats of a key, are
    /// ignored. Once nothing is outstanding the task is `working` again.
    ///
    /// Returns the responses to store, one per newly answered key, in the
    /// order given. Empty: nothing changed, store nothing and answer with
    /// the record as read. Otherwise the record was bumped at `now`; the
    /// backend stores it and those inputs as answered, then answers with
    /// the task as stored (whose `answered` is in request order).
    pub(crate) fn answer<'r, K: AsRef<str>, R>(
        &mut self,
        responses: &'r [(K, R)],
        now: i64,
    ) -> Vec<&'r (K, R)> {
        let mut answered = Vec::new();
        for response in responses {
            let key = response.0.as_ref();
            if let Some(at) = self.outstanding.iter().position(|(k, _)| k == key) {
                let (key, _) = self.outstanding.remove(at);
                self.answered.push(key);
                answered.push(response);
            }
        }
        if !answered.is_empty() {
            if self.outstanding.is_empty() {
                self.status = TaskStatus::Working;
            }
            self.bump(now);
        }
        answered
    }

    /// The client asks to cancel (T6): `cancel_requested` is set, every
    /// outstanding input is superseded, the task is `working` (the worker
    /// winds down, [`CancelMode::Cooperative`]) or `cancelled`
    /// ([`CancelMode::Immediate`]), and `reason` is kept unless a reason is
    /// kept already (T20).
    ///
    /// Returns `false` when that is already so: store nothing. Otherwise
    /// the record was bumped at `now`; the backend stores it and marks
    /// every outstanding input spent.
    pub(crate) fn request_cancel(
        &mut self,
        mode: CancelMode,
        reason: Option<&str>,
        now: i64,
    ) -> bool {
        let status = match mode {
            CancelMode::Cooperative => TaskStatus::Working,
            CancelMode::Immediate => TaskStatus::Cancelled,
        };
        if self.cancel_requested && self.outstanding.is_empty() && self.status == status {
            return false;
        }
        self.cancel_requested = true;
        if self.cancel_reason.is_none() {
            self.cancel_reason = reason.map(str::to_owned);
        }
        self.outstanding.clear();
        self.status = status;
        self.bump(now);
        true
    }

    /// An operator's requeue at `now` (T23) of this record as stored, which
    /// a read shows as `seen`: `Ok` when it changed (bumped past `seen`;
    /// the backend stores it and marks every outstanding input spent),
    /// else why not, changing nothing.
    pub(crate) fn requeue(
        &mut self,
        seen: &TaskRecord,
        now: i64,
    ) -> std::result::Result<(), RequeueRefusal> {
        if seen.status != TaskStatus::Failed {
            return Err(RequeueRefusal::NotFailed(seen.status));
        }
        let Some(takeover) = self.takeover.as_mut() else {
            return Err(RequeueRefusal::NotTakenOver);
        };
        if now >= self.expires_at || seen.outcome.as_deref() == Some(EXPIRED_ERROR) {
            return Err(RequeueRefusal::Expired);
        }
        if self.cancel_requested {
            return Err(RequeueRefusal::CancelRequested);
        }
        // Lost on its last run (read so, or persisted so by a purge): that
        // run counts, as a claim after a lapse would count it.
        if seen.outcome.as_deref() == Some(INSTANCE_LOST_ERROR) && !takeover.released {
            takeover.lapses += 1;
        }
        takeover.max_attempts = takeover.max_attempts.max(takeover.attempt());
        takeover.released = true;
        self.status = TaskStatus::Working;
        self.outcome = None;
        self.outstanding.clear();
        self.rev = self.rev.max(seen.rev);
        self.bump(now);
        Ok(())
    }

    /// Applies a worker's change at `now` (T4, T5, T8, T13, T15); `key_used`
    /// tells whether the task ever used a key, in any state (T5: a key is
    /// spent once used). `options` give the lifetime for
    /// [`WorkerChange::SetTtl`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a request past [`MAX_OUTSTANDING_INPUTS`].
    pub(crate) fn apply<'a>(
        &mut self,
        change: WorkerChange<'a>,
        key_used: impl Fn(&str) -> bool,
        options: &TaskOptions,
        now: i64,
    ) -> Result<Step<'a>> {
        let effect = match change {
            WorkerChange::RequestInput { key, request } => {
                if key_used(key) {
                    return Ok(Step::Unchanged(Applied::KeySpent));
                }
                if self.cancel_requested {
                    return Ok(Step::Unchanged(Applied::CancelRequested));
                }
                if self.outstanding.len() >= MAX_OUTSTANDING_INPUTS {
                    return Err(Error::Config(format!(
                        "a task may have at most {MAX_OUTSTANDING_INPUTS} input requests outstanding"
                    )));
                }
                self.outstanding
                    .push((key.to_owned(), Bytes::copy_from_slice(request)));
                self.status = TaskStatus::InputRequired;
                InputEffect::Request { key, request }
            }
            WorkerChange::TakeAnswer { key } => {
                let Some(at) = self.answered.iter().position(|k| k == key) else {
                    return Ok(Step::Unchanged(Applied::Changed {
                        rev: self.rev,
                        answer: None,
                    }));
                };
                self.answered.remove(at);
                InputEffect::Take { key }
            }
            WorkerChange::SetMessage(message) => {
                self.message = message.map(str::to_owned);
                InputEffect::None
            }
            WorkerChange::SetPollInterval(interval) => {
                self.poll_interval_ms = interval.map(millis);
                InputEffect::None
            }
            WorkerChange::SetTtl(ttl) => {
                let lifetime = options.lifetime(self.created_at, ttl);
                self.ttl_ms = lifetime.ttl_ms;
                self.expires_at = lifetime.expires_at;
                self.purge_at = lifetime.purge_at;
                InputEffect::None
            }
            WorkerChange::Finish(finish) => {
                self.status = finish.status();
                self.outcome = finish.outcome().map(Bytes::copy_from_slice);
                self.outstanding.clear();
                InputEffect::Supersede
            }
            WorkerChange::SetContext(context) => {
                self.context = Some(Bytes::copy_from_slice(context));
                InputEffect::None
            }
            WorkerChange::ReplaceInputs { requests, message } => {
                return self.replace_inputs(requests, message, key_used, now);
            }
            WorkerChange::Checkpoint(checkpoint) => {
                let Some(takeover) = self.takeover.as_mut() else {
                    return Ok(Step::Unchanged(Applied::NoTakeover));
                };
                takeover.checkpoint = Some(Bytes::copy_from_slice(checkpoint));
                InputEffect::None
            }
            WorkerChange::Release => {
                let Some(takeover) = self.takeover.as_mut() else {
                    return Ok(Step::Unchanged(Applied::NoTakeover));
                };
                takeover.released = true;
                InputEffect::None
            }
        };
        self.bump(now);
        Ok(Step::Changed(effect))
    }
}

impl TaskRecord {
    /// [`WorkerChange::ReplaceInputs`] (T15): refuses a carried-forward key
    /// whose request differs and any other key ever used, then replaces
    /// the outstanding set. The same set again with no new message is no
    /// change.
    fn replace_inputs<'a>(
        &mut self,
        requests: &'a [(&'a str, &'a [u8])],
        message: Option<&str>,
        key_used: impl Fn(&str) -> bool,
        now: i64,
    ) -> Result<Step<'a>> {
        for (key, request) in requests {
            match self.outstanding.iter().find(|(k, _)| k == key) {
                Some((_, current)) if current[..] == **request => {}
                Some(_) => return Ok(Step::Unchanged(Applied::KeySpent)),
                None if key_used(key) => return Ok(Step::Unchanged(Applied::KeySpent)),
                None => {}
            }
        }
        if self.cancel_requested && !requests.is_empty() {
            return Ok(Step::Unchanged(Applied::CancelRequested));
        }
        let status = if requests.is_empty() {
            TaskStatus::Working
        } else {
            TaskStatus::InputRequired
        };
        let (superseded, added) = replacement(self, requests);
        let message_changes = message.is_some_and(|m| self.message.as_deref() != Some(m));
        if superseded.is_empty() && added.is_empty() && self.status == status && !message_changes {
            return Ok(Step::Unchanged(Applied::Changed {
                rev: self.rev,
                answer: None,
            }));
        }
        self.outstanding
            .retain(|(key, _)| !superseded.contains(key));
        self.outstanding.extend(
            added
                .iter()
                .map(|(key, request)| ((*key).to_owned(), Bytes::copy_from_slice(request))),
        );
        self.status = status;
        if let Some(message) = message {
            self.message = Some(message.to_owned());
        }
        self.bump(now);
        Ok(Step::Changed(InputEffect::Replace { requests }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{Finish, InstanceId, Owner};

    fn record() -> TaskRecord {
        let task = NewTask::new(&Owner::Anonymous, InstanceId::from_bytes([0; 16]));
        TaskRecord::created(&task, 100, &TaskOptions::default())
    }

    #[test]
    fn answers_each_outstanding_key_once() {
        let mut r = record();
        r.outstanding = vec![("a".into(), Bytes::new()), ("b".into(), Bytes::new())];
        let responses = [("a", 1), ("x", 2), ("a", 3)];
        assert_eq!(r.answer(&responses, 150), vec![&("a", 1)]);
        assert_eq!((r.rev, r.updated_at), (2, 150));
        assert_eq!(r.answered, ["a"]);
        assert_eq!(r.status, TaskStatus::Working);
        assert!(r.answer(&[("a", 4)], 160).is_empty());
        assert_eq!(r.rev, 2);
    }

    #[test]
    fn cancel_changes_once() {
        let mut r = record();
        assert!(r.request_cancel(CancelMode::Cooperative, Some("first"), 150));
        assert!(!r.request_cancel(CancelMode::Cooperative, Some("ignored"), 160));
        assert!(r.request_cancel(CancelMode::Immediate, Some("second"), 170));
        assert_eq!(r.cancel_reason.as_deref(), Some("first"));
        assert_eq!((r.status, r.rev), (TaskStatus::Cancelled, 3));
    }

    #[test]
    fn worker_changes_name_their_input_effects() {
        let options = TaskOptions::default();
        let mut r = record();
        let ask = WorkerChange::RequestInput {
            key: "k",
            request: b"{}",
        };
        assert_eq!(
            r.apply(ask, |_| true, &options, 150).unwrap(),
            Step::Unchanged(Applied::KeySpent)
        );
        assert_eq!(
            r.apply(ask, |_| false, &options, 150).unwrap(),
            Step::Changed(InputEffect::Request {
                key: "k",
                request: b"{}"
            })
        );
        assert_eq!(r.status, TaskStatus::InputRequired);
        let take = WorkerChange::TakeAnswer { key: "k" };
        assert_eq!(
            r.apply(take, |_| true, &options, 160).unwrap(),
            Step::Unchanged(Applied::Changed {
                rev: 2,
                answer: None
            })
        );
        r.answer(&[("k", ())], 170);
        assert_eq!(
            r.apply(take, |_| true, &options, 180).unwrap(),
            Step::Changed(InputEffect::Take { key: "k" })
        );
        let finish = WorkerChange::Finish(Finish::Completed(b"{}"));
        assert_eq!(
            r.apply(finish, |_| true, &options, 190).unwrap(),
            Step::Changed(InputEffect::Supersede)
        );
        assert_eq!((r.status, r.rev), (TaskStatus::Completed, 5));
    }
}
