//! One binary encoding of a task with its inputs, for backends that keep a
//! task in one value (sled, Redis).
//!
//! A backend that stores a task as one value (rather than rows) reads it,
//! lets [`StoredTask::client_step`] or
//! [`StoredTask::worker_step`] run the shared state
//! machine on it, and writes [`encode`]'s bytes of the new value back,
//! conditioned on what it read. A released format never changes: a change
//! is a new [`VALUE_VERSION`], which older releases refuse.
//!
//! Layout, all integers big-endian, byte strings as a `u32` length and the
//! bytes, optional values as a presence byte and the value (zero when
//! absent):
//!
//! ```text
//! u8 version (1) | owner | instance [16] | u8 status | u64 rev
//! | i64 created_at, updated_at, expires_at, purge_at
//! | opt u64 ttl_ms | opt u64 poll_interval_ms | u8 cancel_requested
//! | opt message | opt outcome | extension bytes
//! | u32 n, n x (key, request)        outstanding, oldest first
//! | u32 n, n x (key, response)       answered, oldest first
//! | u32 n, n x key                   spent keys
//! | fields                           version 2 only
//! ```
//!
//! Version 2 adds the fields at the end: each a tag byte and a byte
//! string, in tag order, until the value ends. Tag 1 is the reason a
//! client gave for its cancel request (T20). A value with no field to
//! write is written as version 1, byte for byte what releases before
//! version 2 wrote and read, so they keep reading every task that has
//! none; one with a field is refused by them as a newer format.
//!
//! The extension bytes were reserved (empty) in the first release, whose
//! reader skips them whatever they hold: they carry the task's context
//! (T13) as `0x01 ‖ context`, and stay empty for a task without one. So a
//! release from before contexts still reads every task; one that rewrites
//! a task with a context (a purge ending it) writes it back without.
//! Another leading byte is an extension of a later release, skipped the
//! same way.

use bytes::Bytes;

use super::{InputEffect, Step};
use crate::error::{Error, Result};
use crate::rewrite::{TaskField, TaskValue};
use crate::task::{
    Applied, Claimed, InstanceId, Owner, Requeue, Takeover, TaskDigest, TaskOptions, TaskRecord,
    TaskStatus, TaskView, Worker, WorkerChange,
};

/// The newest format of an encoded task, its first byte: this release
/// reads versions 1 and 2, and writes 1 unless a field of version 2 is
/// set.
pub const VALUE_VERSION: u8 = 2;

/// The tag of the field holding a cancel request's reason (T20).
const CANCEL_REASON_FIELD: u8 = 1;

/// The leading byte of extension bytes that hold a context (T13).
const CONTEXT_EXTENSION: u8 = 1;
/// The leading byte of extension bytes of a task that may be taken over
/// (T16 to T19): its takeover state, then its optional context.
const TAKEOVER_EXTENSION: u8 = 2;

/// A task as stored: the record, its owner and instance, the responses
/// waiting for the worker (parallel to `record.answered`), and every key
/// spent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTask {
    /// The owner's digest ([`owner_key`](super::owner_key)).
    pub owner: Vec<u8>,
    /// The instance that last worked on the task (T11).
    pub instance: [u8; 16],
    /// The record, with `outstanding` and `answered`.
    pub record: TaskRecord,
    /// The responses of `record.answered`, in the same order.
    pub responses: Vec<Bytes>,
    /// Every key taken or superseded, never usable again (T5).
    pub spent: Vec<String>,
}

impl StoredTask {
    /// Every value the task holds (C22): its context, outcome and
    /// checkpoint, the request of each outstanding input and the response
    /// of each input answered and not yet taken (a spent input keeps
    /// neither). What a backend that keeps a task as one value lists.
    pub fn values(&self) -> Vec<TaskValue> {
        let record = &self.record;
        let fields = [
            (TaskField::Context, record.context.as_ref()),
            (TaskField::Outcome, record.outcome.as_ref()),
            (
                TaskField::Checkpoint,
                record.takeover.as_ref().and_then(|t| t.checkpoint.as_ref()),
            ),
        ];
        let mut values: Vec<TaskValue> = fields
            .into_iter()
            .filter_map(|(field, value)| Some(TaskValue::new(field, value?.clone())))
            .collect();
        values.extend(record.outstanding.iter().map(|(key, request)| {
            TaskValue::new(TaskField::Request(key.clone()), request.clone())
        }));
        values.extend(
            record
                .answered
                .iter()
                .zip(&self.responses)
                .map(|(key, response)| {
                    TaskValue::new(TaskField::Response(key.clone()), response.clone())
                }),
        );
        values
    }

    /// Where the task keeps `field`, to swap it in place (C22); `None` when
    /// it holds no such value.
    pub fn value_mut(&mut self, field: &TaskField) -> Option<&mut Bytes> {
        let record = &mut self.record;
        match field {
            TaskField::Context => record.context.as_mut(),
            TaskField::Outcome => record.outcome.as_mut(),
            TaskField::Checkpoint => record.takeover.as_mut()?.checkpoint.as_mut(),
            TaskField::Request(key) => record
                .outstanding
                .iter_mut()
                .find(|(k, _)| k == key)
                .map(|(_, request)| request),
            TaskField::Response(key) => {
                let at = record.answered.iter().position(|k| k == key)?;
                self.responses.get_mut(at)
            }
        }
    }
}

/// Decodes a stored task to swap one of its values in place (C22),
/// refusing one that encoding again would not give back byte for byte (a
/// later release's extension, which decoding skips): writing it back
/// would lose what this release cannot read.
///
/// # Errors
///
/// As [`decode`]; [`Error::IncompatibleFormat`] for such a task.
pub fn decode_to_rewrite(value: &[u8]) -> Result<StoredTask> {
    let stored = decode(value)?;
    if encode(&stored) == value {
        return Ok(stored);
    }
    Err(Error::IncompatibleFormat(
        "a task holds parts this release cannot read (written by a later release): its values \
         cannot be rewritten in place without losing them"
            .into(),
    ))
}

impl StoredTask {
    /// A new task's value: `record` as [`TaskMachine::created`](crate::backend::task::TaskMachine::created) made it.
    pub fn new(owner: &Owner, instance: [u8; 16], record: TaskRecord) -> Self {
        Self {
            owner: super::owner_key(owner),
            instance,
            record,
            responses: Vec::new(),
            spent: Vec::new(),
        }
    }

    /// Every answer given and not yet taken, `(key, response)`, in request
    /// order: [`TaskView::answers`](crate::task::TaskView::answers).
    pub fn answers(&self) -> Vec<(String, Bytes)> {
        self.record
            .answered
            .iter()
            .cloned()
            .zip(self.responses.iter().cloned())
            .collect()
    }

    /// Whether the task ever used `key`, in any state (the `key_used` of
    /// [`TaskMachine::apply`](crate::backend::task::TaskMachine::apply)).
    pub fn key_used(&self, key: &str) -> bool {
        self.record.outstanding.iter().any(|(k, _)| k == key)
            || self.record.answered.iter().any(|k| k == key)
            || self.spent.iter().any(|k| k == key)
    }

    /// Every key that was outstanding or answered before and is neither
    /// now is spent (taken, superseded or ended with the task), and the
    /// responses follow `answered`. Call it after the state machine changed
    /// `record`, with the record and responses as they were before.
    pub fn settle_inputs(&mut self, before: &TaskRecord, before_responses: &[Bytes]) {
        let live = |record: &TaskRecord, key: &str| {
            record.outstanding.iter().any(|(k, _)| k == key)
                || record.answered.iter().any(|k| k == key)
        };
        for key in before
            .outstanding
            .iter()
            .map(|(k, _)| k)
            .chain(before.answered.iter())
        {
            if !live(&self.record, key) && !self.spent.contains(key) {
                self.spent.push(key.clone());
            }
        }
        // A key answered before keeps its response; a key answered by this
        // step has its response at its place in `self.responses`.
        let responses = self
            .record
            .answered
            .iter()
            .enumerate()
            .map(|(at, key)| {
                before
                    .answered
                    .iter()
                    .position(|k| k == key)
                    .and_then(|was| before_responses.get(was))
                    .or_else(|| self.responses.get(at))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        self.responses = responses;
    }

    /// What a purge writes back (T8, T11): this value ended as a read at
    /// some time shows it, `seen` (expired or orphaned, inputs spent), or
    /// `None` when the read shows what is stored.
    pub fn ended_as_read(&self, seen: &TaskRecord) -> Option<StoredTask> {
        if seen.status == self.record.status {
            return None;
        }
        let mut new = self.clone();
        new.record = seen.clone();
        new.settle_inputs(&self.record, &self.responses);
        Some(new)
    }

    /// A client's step (`answer`, `request_cancel`) on this value, whose
    /// record reads as `seen` at `now`, its owner already checked (T3).
    /// `change` edits a copy and says whether it changed anything.
    ///
    /// Returns the value to write (`None`: nothing, a terminal task or no
    /// change) and the task as the client then sees it, with
    /// `alive_until` the heartbeat deadline of the task's instance (T11).
    pub fn client_step(
        &self,
        seen: &TaskRecord,
        now: i64,
        alive_until: Option<i64>,
        change: impl FnOnce(&mut StoredTask) -> bool,
    ) -> (Option<StoredTask>, Option<TaskRecord>) {
        if seen.status.is_terminal() {
            return (None, Some(seen.clone()));
        }
        let mut new = self.clone();
        if !change(&mut new) {
            return (None, Some(seen.clone()));
        }
        new.settle_inputs(&self.record, &self.responses);
        let after = new.record.clone().seen_at(now, alive_until);
        (Some(new), after)
    }

    /// [`TaskMachine::answer`](crate::backend::task::TaskMachine::answer) on this value, keeping each new response
    /// beside its key (the `change` of an answering
    /// [`client_step`](Self::client_step)). Returns whether anything changed.
    pub fn record_answers(&mut self, responses: &[(&str, &[u8])], now: i64) -> bool {
        let before = self.record.answered.len();
        let answered: Vec<Bytes> = self
            .record
            .answer(responses, now)
            .into_iter()
            .map(|(_, response)| Bytes::copy_from_slice(response))
            .collect();
        if answered.is_empty() {
            return false;
        }
        // The new responses follow the earlier ones, in the order the
        // machine appended their keys to `answered`.
        self.responses.truncate(before);
        self.responses.extend(answered);
        true
    }

    /// A worker's step ([`RuntimeStore::apply_claimed`](crate::task::RuntimeStore::apply_claimed))
    /// by `by` on this value, whose record reads as `seen` at `now` and
    /// whose instance is alive until `alive_until`: [`Applied::Fenced`] when
    /// `by` does not hold the task's claim (T18).
    ///
    /// Returns the value to write (`None`: nothing) and what to answer;
    /// a [`WorkerChange::TakeAnswer`] answers with the response it took.
    ///
    /// # Errors
    ///
    /// As [`TaskMachine::apply`](crate::backend::task::TaskMachine::apply).
    pub fn worker_step(
        &self,
        seen: &TaskRecord,
        alive_until: Option<i64>,
        by: Worker,
        change: WorkerChange<'_>,
        options: &TaskOptions,
        now: i64,
    ) -> Result<(Option<StoredTask>, Applied)> {
        if seen.status.is_terminal() {
            return Ok((None, Applied::AlreadyTerminal(seen.status)));
        }
        if self.record.fenced(&by, &self.instance, alive_until, now) {
            return Ok((None, Applied::Fenced));
        }
        let mut new = self.clone();
        let answer = match new
            .record
            .apply(change, |key| self.key_used(key), options, now)?
        {
            Step::Unchanged(applied) => return Ok((None, applied)),
            Step::Changed(InputEffect::Take { key }) => {
                let at = self
                    .record
                    .answered
                    .iter()
                    .position(|k| k == key)
                    .ok_or_else(corrupt)?;
                Some(self.responses.get(at).cloned().unwrap_or_default())
            }
            Step::Changed(_) => None,
        };
        new.instance = *by.instance.as_bytes();
        new.settle_inputs(&self.record, &self.responses);
        let rev = new.record.rev;
        Ok((Some(new), Applied::Changed { rev, answer }))
    }

    /// A claim of this value, the task under `task`, by `by` at `now`
    /// (T17), given its instance's heartbeat deadline and `by`'s: the
    /// value to write (with `by` as its instance) and the claim, or `None`
    /// when the task does not wait for a runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a stored owner that is not one.
    pub fn claim_step(
        &self,
        task: TaskDigest,
        by: InstanceId,
        alive_until: Option<i64>,
        by_alive_until: Option<i64>,
        now: i64,
    ) -> Result<Option<(StoredTask, Claimed)>> {
        let mut new = self.clone();
        let Some(worker) = new.record.claim(by, alive_until, now) else {
            return Ok(None);
        };
        new.instance = *by.as_bytes();
        let Some(view) = new.view(by_alive_until, now)? else {
            return Ok(None);
        };
        let claimed = Claimed::new(task, worker, view).taken_from(&self.record, alive_until, now);
        Ok(Some((new, claimed)))
    }

    /// The task as the runtime holding its claim reads it at `now` (T14,
    /// T17), given its instance's heartbeat deadline.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a stored owner that is not one.
    pub fn view(&self, alive_until: Option<i64>, now: i64) -> Result<Option<TaskView>> {
        let Some(seen) = self.record.clone().seen_at(now, alive_until) else {
            return Ok(None);
        };
        Ok(Some(
            TaskView::new(super::owner_of(&self.owner)?, seen, self.answers())
                .on_instance(InstanceId::from_bytes(self.instance), alive_until),
        ))
    }

    /// An operator's requeue (T23) of this value, whose record reads as
    /// `seen` at `now`: the value to write (`None`: nothing) and the answer.
    pub fn requeue_step(&self, seen: &TaskRecord, now: i64) -> (Option<StoredTask>, Requeue) {
        let mut new = self.clone();
        if let Err(why) = new.record.requeue(seen, now) {
            return (None, Requeue::Refused(seen.clone(), why));
        }
        new.settle_inputs(&self.record, &self.responses);
        let after = new.record.clone();
        (Some(new), Requeue::Requeued(after))
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_opt_u64(out: &mut Vec<u8>, n: Option<u64>) {
    out.push(u8::from(n.is_some()));
    out.extend_from_slice(&n.unwrap_or(0).to_be_bytes());
}

fn put_opt_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    out.push(u8::from(bytes.is_some()));
    put_bytes(out, bytes.unwrap_or_default());
}

/// The task's bytes.
pub fn encode(s: &StoredTask) -> Vec<u8> {
    let r = &s.record;
    let mut out = Vec::with_capacity(128);
    out.push(if r.cancel_reason.is_some() { 2 } else { 1 });
    put_bytes(&mut out, &s.owner);
    out.extend_from_slice(&s.instance);
    out.push(r.status.as_u8());
    out.extend_from_slice(&r.rev.to_be_bytes());
    for t in [r.created_at, r.updated_at, r.expires_at, r.purge_at] {
        out.extend_from_slice(&t.to_be_bytes());
    }
    put_opt_u64(&mut out, r.ttl_ms);
    put_opt_u64(&mut out, r.poll_interval_ms);
    out.push(u8::from(r.cancel_requested));
    put_opt_bytes(&mut out, r.message.as_deref().map(str::as_bytes));
    put_opt_bytes(&mut out, r.outcome.as_deref());
    match (&r.takeover, &r.context) {
        (None, None) => put_bytes(&mut out, &[]),
        (None, Some(context)) => {
            let mut extension = Vec::with_capacity(1 + context.len());
            extension.push(CONTEXT_EXTENSION);
            extension.extend_from_slice(context);
            put_bytes(&mut out, &extension);
        }
        (Some(takeover), context) => {
            let mut extension = vec![TAKEOVER_EXTENSION];
            for n in [takeover.max_attempts, takeover.lapses, takeover.epoch] {
                extension.extend_from_slice(&n.to_be_bytes());
            }
            extension.push(u8::from(takeover.released));
            put_opt_bytes(&mut extension, takeover.checkpoint.as_deref());
            put_opt_bytes(&mut extension, context.as_deref());
            put_bytes(&mut out, &extension);
        }
    }
    out.extend_from_slice(&(r.outstanding.len() as u32).to_be_bytes());
    for (key, request) in &r.outstanding {
        put_bytes(&mut out, key.as_bytes());
        put_bytes(&mut out, request);
    }
    out.extend_from_slice(&(r.answered.len() as u32).to_be_bytes());
    for (key, response) in r.answered.iter().zip(&s.responses) {
        put_bytes(&mut out, key.as_bytes());
        put_bytes(&mut out, response);
    }
    out.extend_from_slice(&(s.spent.len() as u32).to_be_bytes());
    for key in &s.spent {
        put_bytes(&mut out, key.as_bytes());
    }
    if let Some(reason) = &r.cancel_reason {
        out.push(CANCEL_REASON_FIELD);
        put_bytes(&mut out, reason.as_bytes());
    }
    out
}

/// Reads a value field by field.
struct Reader<'a>(&'a [u8]);

fn corrupt() -> Error {
    Error::Corrupt("a task record is malformed".into())
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(corrupt());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().map_err(|_| corrupt())?,
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().map_err(|_| corrupt())?,
        ))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().map_err(|_| corrupt())?,
        ))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| corrupt())
    }
    fn opt_u64(&mut self) -> Result<Option<u64>> {
        let some = self.u8()? != 0;
        let n = self.u64()?;
        Ok(some.then_some(n))
    }
    fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        let some = self.u8()? != 0;
        let bytes = self.bytes()?;
        Ok(some.then_some(bytes))
    }
}

/// The task [`encode`] wrote.
///
/// # Errors
///
/// [`Error::IncompatibleFormat`] for a value of another [`VALUE_VERSION`],
/// [`Error::Corrupt`] for malformed bytes.
pub fn decode(value: &[u8]) -> Result<StoredTask> {
    let mut r = Reader(value);
    let version = r.u8()?;
    if !(1..=VALUE_VERSION).contains(&version) {
        return Err(Error::IncompatibleFormat(format!(
            "a task is stored in task format {version}; mcp-event-store {} reads task \
             formats 1 to {VALUE_VERSION} only",
            env!("CARGO_PKG_VERSION")
        )));
    }
    let owner = r.bytes()?.to_vec();
    let instance: [u8; 16] = r.take(16)?.try_into().map_err(|_| corrupt())?;
    let status = TaskStatus::from_u8(r.u8()?).ok_or_else(corrupt)?;
    let rev = r.u64()?;
    let (created_at, updated_at, expires_at, purge_at) = (r.i64()?, r.i64()?, r.i64()?, r.i64()?);
    let ttl_ms = r.opt_u64()?;
    let poll_interval_ms = r.opt_u64()?;
    let cancel_requested = r.u8()? != 0;
    let message = r
        .opt_bytes()?
        .map(|m| String::from_utf8(m.to_vec()).map_err(|_| corrupt()))
        .transpose()?;
    let outcome = r.opt_bytes()?.map(Bytes::copy_from_slice);
    let (context, takeover) = match r.bytes()? {
        [CONTEXT_EXTENSION, context @ ..] => (Some(Bytes::copy_from_slice(context)), None),
        [TAKEOVER_EXTENSION, extension @ ..] => {
            let mut e = Reader(extension);
            let mut takeover = Takeover::new(e.u32()?, false);
            takeover.lapses = e.u32()?;
            takeover.epoch = e.u32()?;
            takeover.released = e.u8()? != 0;
            takeover.checkpoint = e.opt_bytes()?.map(Bytes::copy_from_slice);
            let context = e.opt_bytes()?.map(Bytes::copy_from_slice);
            (context, Some(takeover))
        }
        // None, or a later release's extension: skipped.
        _ => (None, None),
    };
    let mut outstanding = Vec::new();
    for _ in 0..r.u32()? {
        let key = r.string()?;
        outstanding.push((key, Bytes::copy_from_slice(r.bytes()?)));
    }
    let (mut answered, mut responses) = (Vec::new(), Vec::new());
    for _ in 0..r.u32()? {
        answered.push(r.string()?);
        responses.push(Bytes::copy_from_slice(r.bytes()?));
    }
    let mut spent = Vec::new();
    for _ in 0..r.u32()? {
        spent.push(r.string()?);
    }
    let mut cancel_reason = None;
    while version >= 2 && !r.0.is_empty() {
        match (r.u8()?, r.bytes()?) {
            (CANCEL_REASON_FIELD, reason) if cancel_reason.is_none() => {
                cancel_reason = Some(String::from_utf8(reason.to_vec()).map_err(|_| corrupt())?);
            }
            _ => return Err(corrupt()),
        }
    }
    if !r.0.is_empty() {
        return Err(corrupt());
    }
    Ok(StoredTask {
        owner,
        instance,
        record: TaskRecord {
            status,
            rev,
            message,
            created_at,
            updated_at,
            ttl_ms,
            expires_at,
            purge_at,
            poll_interval_ms,
            cancel_requested,
            cancel_reason,
            outcome,
            outstanding,
            answered,
            context,
            takeover,
        },
        responses,
        spent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> StoredTask {
        let mut s = StoredTask::new(
            &Owner::principal(b"alice").unwrap(),
            [7; 16],
            TaskRecord {
                status: TaskStatus::InputRequired,
                rev: 9,
                message: Some("m\0😀".into()),
                created_at: -5,
                updated_at: 10,
                ttl_ms: Some(60_000),
                expires_at: 60_000,
                purge_at: 120_000,
                poll_interval_ms: None,
                cancel_requested: false,
                cancel_reason: None,
                outcome: None,
                outstanding: vec![("a".into(), Bytes::from_static(b"\xff{"))],
                answered: vec!["b".into()],
                context: Some(Bytes::from_static(b"\0ctx")),
                takeover: None,
            },
        );
        s.responses = vec![Bytes::from_static(b"\0")];
        s.spent = vec!["c".into()];
        s
    }

    #[test]
    fn round_trips_and_refuses_other_versions() {
        let s = stored();
        let bytes = encode(&s);
        assert_eq!(bytes[0], 1, "no field of version 2: the released format");
        assert_eq!(decode(&bytes).unwrap(), s);
        let mut newer = bytes.clone();
        newer[0] = VALUE_VERSION + 1;
        assert!(matches!(decode(&newer), Err(Error::IncompatibleFormat(_))));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(Error::Corrupt(_))
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(Error::Corrupt(_))));
        // Version 2 with no field reads as version 1 did.
        let mut two = bytes;
        two[0] = 2;
        assert_eq!(decode(&two).unwrap(), s);
    }

    /// A cancel's reason (T20) is a field of version 2, after the
    /// released layout; a field it does not know, or one twice, is refused.
    #[test]
    fn a_cancel_reason_is_a_version_two_field() {
        let mut s = stored();
        let without = encode(&s);
        s.record.cancel_reason = Some("deployment shutdown".into());
        let with = encode(&s);
        assert_eq!(with[0], 2);
        assert_eq!(decode(&with).unwrap(), s);
        let mut field = vec![CANCEL_REASON_FIELD, 0, 0, 0, 19];
        field.extend_from_slice(b"deployment shutdown");
        assert_eq!(with[1..], [&without[1..], &field[..]].concat()[..]);
        let mut twice = with.clone();
        twice.extend_from_slice(&field);
        assert!(matches!(decode(&twice), Err(Error::Corrupt(_))));
        let mut unknown = with[..without.len()].to_vec();
        unknown.extend_from_slice(&[9, 0, 0, 0, 0]);
        assert!(matches!(decode(&unknown), Err(Error::Corrupt(_))));
    }

    #[test]
    fn an_answer_then_its_take_keeps_the_response_and_spends_the_key() {
        let s = stored();
        let seen = s.record.clone();
        // The task's instance heartbeats until 1,000; without it the task
        // would read as orphaned.
        let alive = Some(1_000);
        let (new, after) = s.client_step(&seen, 20, alive, |new| {
            new.record_answers(&[("a", b"yes"), ("zz", b"ignored")], 20)
        });
        let new = new.expect("an outstanding key was answered");
        let after = after.expect("still readable");
        assert_eq!(after.status, TaskStatus::Working);
        assert_eq!(after.rev, 10);
        assert_eq!(new.record.answered, ["b", "a"]);
        assert_eq!(new.responses, [&b"\0"[..], &b"yes"[..]]);

        let options = TaskOptions::default();
        let take = WorkerChange::TakeAnswer { key: "a" };
        let (taken, applied) = new
            .worker_step(
                &new.record,
                None,
                Worker::first(InstanceId::from_bytes([3; 16])),
                take,
                &options,
                21,
            )
            .unwrap();
        let taken = taken.expect("an answer was taken");
        assert_eq!(
            applied,
            Applied::Changed {
                rev: 11,
                answer: Some(Bytes::from_static(b"yes"))
            }
        );
        assert_eq!(taken.instance, [3; 16]);
        assert_eq!(taken.record.answered, ["b"]);
        assert_eq!(taken.responses, [&b"\0"[..]]);
        assert!(taken.key_used("a") && taken.spent.contains(&"a".to_owned()));
        let again = WorkerChange::RequestInput {
            key: "a",
            request: b"{}",
        };
        let (none, spent) = taken
            .worker_step(
                &taken.record,
                None,
                Worker::first(InstanceId::from_bytes([3; 16])),
                again,
                &options,
                22,
            )
            .unwrap();
        assert!(none.is_none());
        assert_eq!(spent, Applied::KeySpent);
    }

    #[test]
    fn a_terminal_task_changes_for_nobody() {
        let mut s = stored();
        s.record.status = TaskStatus::Cancelled;
        let seen = s.record.clone();
        let (new, after) = s.client_step(&seen, 20, None, |new| {
            new.record_answers(&[("a", b"x")], 20)
        });
        assert!(new.is_none());
        assert_eq!(after, Some(seen.clone()));
        let finish = WorkerChange::SetMessage(Some("late"));
        let (new, applied) = s
            .worker_step(
                &seen,
                None,
                Worker::first(InstanceId::from_bytes([1; 16])),
                finish,
                &TaskOptions::default(),
                20,
            )
            .unwrap();
        assert!(new.is_none());
        assert_eq!(applied, Applied::AlreadyTerminal(TaskStatus::Cancelled));
    }

    /// The context rides in the extension bytes the first release skips:
    /// the value is the released layout with `01 ‖ context` there, and an
    /// extension of a later release is skipped in turn.
    #[test]
    fn the_context_is_an_extension_a_released_reader_skips() {
        let mut s = stored();
        s.record.context = None;
        let without = encode(&s);
        s.record.context = Some(Bytes::from_static(b"ctx"));
        let with = encode(&s);
        assert_eq!(decode(&with).unwrap(), s);
        // The same bytes but for the extension field.
        let mut ext = vec![0, 0, 0, 4, CONTEXT_EXTENSION];
        ext.extend_from_slice(b"ctx");
        let split = with
            .windows(ext.len())
            .position(|w| w == ext)
            .expect("the extension bytes are 01 ‖ context");
        let mut rebuilt = with[..split].to_vec();
        rebuilt.extend_from_slice(&0u32.to_be_bytes());
        rebuilt.extend_from_slice(&with[split + ext.len()..]);
        assert_eq!(rebuilt, without, "only the extension field differs");
        // A later release's extension: read as no context.
        let mut later = with[..split].to_vec();
        later.extend_from_slice(&[0, 0, 0, 2, 7, 7]);
        later.extend_from_slice(&with[split + ext.len()..]);
        assert_eq!(decode(&later).unwrap().record.context, None);
        // An empty context is kept apart from none.
        s.record.context = Some(Bytes::new());
        assert_eq!(
            decode(&encode(&s)).unwrap().record.context,
            Some(Bytes::new())
        );
    }

    /// The released layout, byte for byte: a change here breaks databases.
    #[test]
    fn the_layout_is_the_released_one() {
        let s = StoredTask::new(
            &Owner::Anonymous,
            [1; 16],
            TaskRecord {
                status: TaskStatus::Working,
                rev: 1,
                message: None,
                created_at: 2,
                updated_at: 3,
                ttl_ms: None,
                expires_at: 4,
                purge_at: 5,
                poll_interval_ms: Some(6),
                cancel_requested: true,
                cancel_reason: None,
                outcome: None,
                outstanding: Vec::new(),
                answered: Vec::new(),
                context: None,
                takeover: None,
            },
        );
        let mut want = vec![1u8, 0, 0, 0, 0];
        want.extend([1; 16]);
        want.push(0);
        want.extend(1u64.to_be_bytes());
        for t in [2i64, 3, 4, 5] {
            want.extend(t.to_be_bytes());
        }
        want.push(0);
        want.extend(0u64.to_be_bytes());
        want.push(1);
        want.extend(6u64.to_be_bytes());
        want.push(1);
        for _ in 0..2 {
            want.push(0);
            want.extend(0u32.to_be_bytes());
        }
        want.extend(0u32.to_be_bytes());
        for _ in 0..3 {
            want.extend(0u32.to_be_bytes());
        }
        assert_eq!(encode(&s), want);
    }
}
