//! A task's status and its record as stored and as read.

use std::fmt;

use bytes::Bytes;

use super::{EXPIRED_ERROR, INSTANCE_LOST_ERROR, Rev};

/// Where a task is in its life (SEP-2663's five statuses).
///
/// The numbers ([`as_u8`](Self::as_u8)) are what backends store: the
/// non-terminal statuses are below 2, so "still running" is `status < 2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Running.
    Working,
    /// Waiting for the client to answer input requests.
    InputRequired,
    /// Ended with a result.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended on a cancel request.
    Cancelled,
}

impl TaskStatus {
    /// Every status, in the order of their numbers.
    pub const ALL: [TaskStatus; 5] = [
        TaskStatus::Working,
        TaskStatus::InputRequired,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// `true` once the task has ended; a terminal task never changes (T4).
    pub fn is_terminal(self) -> bool {
        self.as_u8() >= 2
    }

    /// The stored number, 0 to 4.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The status a stored number stands for.
    pub fn from_u8(n: u8) -> Option<Self> {
        Self::ALL.get(usize::from(n)).copied()
    }

    /// The protocol's spelling: `working`, `input_required`, `completed`,
    /// `failed` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task as a store returns it.
///
/// Times are milliseconds since the epoch by the store's clock. Payloads
/// are the serialized JSON the worker and the client gave, never parsed by
/// the store (T7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    /// The status.
    pub status: TaskStatus,
    /// Bumped by every change (T4).
    pub rev: Rev,
    /// The status message.
    pub message: Option<String>,
    /// When the task was created.
    pub created_at: i64,
    /// When it last changed.
    pub updated_at: i64,
    /// The ttl (capped by `max_task_age`); `None` for a `null` ttl.
    pub ttl_ms: Option<u64>,
    /// Past this a non-terminal task reads `failed` (T8).
    pub expires_at: i64,
    /// From this on the task reads as unknown and may be deleted (T8).
    pub purge_at: i64,
    /// The suggested poll interval.
    pub poll_interval_ms: Option<u64>,
    /// Whether the client asked to cancel (T6).
    pub cancel_requested: bool,
    /// The reason the client gave when it asked to cancel (T20), kept
    /// once the task ended.
    pub cancel_reason: Option<String>,
    /// The result when `completed`, the error when `failed`.
    pub outcome: Option<Bytes>,
    /// The input requests awaiting an answer, `(key, request)`, oldest
    /// first: what the client is shown.
    pub outstanding: Vec<(String, Bytes)>,
    /// The keys answered but not yet taken by the worker, oldest first.
    pub answered: Vec<String>,
    /// The task's context (T13): bytes the runtime keeps with the task to
    /// run it again (a tool's name and arguments), given at creation or
    /// replaced by the worker; never parsed by the store. `None` when the
    /// runtime gave none.
    pub context: Option<Bytes>,
    /// For a task that may outlive its instance (T16 to T19): its attempts,
    /// its claim's epoch and its checkpoint. `None` for a task that dies
    /// with its instance.
    pub takeover: Option<Takeover>,
}

/// The state of a task that may be taken over (T16 to T19).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Takeover {
    /// The most runs the task gets.
    pub max_attempts: u32,
    /// The runs whose instance lapsed so far: the task is on run
    /// `lapses + 1`.
    pub lapses: u32,
    /// The current claim's epoch (T18): 1 at creation, one more per claim.
    pub epoch: u32,
    /// Nobody runs the task: it was created for a worker, or its worker
    /// gave it back; it waits for a claim (T17).
    pub released: bool,
    /// The newest checkpoint its operation saved (T19).
    pub checkpoint: Option<Bytes>,
}

impl Takeover {
    /// A new task's: run 1 of `max_attempts`, epoch 1, held by its creator
    /// unless `released` (queued for a worker).
    pub fn new(max_attempts: u32, released: bool) -> Self {
        Self {
            max_attempts,
            lapses: 0,
            epoch: 1,
            released,
            checkpoint: None,
        }
    }

    /// Which run the task is on, from 1.
    pub fn attempt(&self) -> u32 {
        self.lapses.saturating_add(1)
    }

    /// Whether a run is left after the current one.
    pub fn attempts_left(&self) -> bool {
        self.attempt() < self.max_attempts
    }
}

impl TaskRecord {
    /// The task as a read at `now` must show it (T8, T11), given when its
    /// instance's heartbeat runs out (`None`: the instance is unknown, so
    /// lost). Backends store what changed and call this on every read, so
    /// no sweeper is needed for correctness.
    ///
    /// * From `purge_at` on: `None`, as if deleted.
    /// * Non-terminal past `expires_at`, or past its instance's lapse:
    ///   `failed` with [`EXPIRED_ERROR`] or [`INSTANCE_LOST_ERROR`],
    ///   whichever came first, at `rev + 1` and updated when it happened;
    ///   exactly what [`TaskStore::purge_expired_tasks`](super::TaskStore::purge_expired_tasks)
    ///   persists later, so the record reads the same before and after.
    pub(crate) fn seen_at(mut self, now: i64, instance_alive_until: Option<i64>) -> Option<Self> {
        if now >= self.purge_at {
            return None;
        }
        if self.status.is_terminal() {
            return Some(self);
        }
        let mut lapsed_at = instance_alive_until.unwrap_or(i64::MIN);
        // A task that may be taken over waits for a claim instead while
        // it has runs left, or when nobody runs it (T16, T17).
        if self
            .takeover
            .as_ref()
            .is_some_and(|t| t.released || t.attempts_left())
        {
            lapsed_at = i64::MAX;
        }
        let ended = if now >= self.expires_at && self.expires_at <= lapsed_at {
            Some((self.expires_at, EXPIRED_ERROR))
        } else if now >= lapsed_at {
            Some((lapsed_at.max(self.created_at), INSTANCE_LOST_ERROR))
        } else {
            None
        };
        if let Some((at, error)) = ended {
            self.status = TaskStatus::Failed;
            self.rev += 1;
            self.updated_at = at.max(self.updated_at);
            self.outcome = Some(Bytes::from_static(error));
            self.outstanding.clear();
        }
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TaskRecord {
        TaskRecord {
            status: TaskStatus::Working,
            rev: 1,
            message: None,
            created_at: 100,
            updated_at: 100,
            ttl_ms: Some(100),
            expires_at: 200,
            purge_at: 300,
            poll_interval_ms: None,
            cancel_requested: false,
            cancel_reason: None,
            outcome: None,
            outstanding: vec![("k".into(), Bytes::from_static(b"{}"))],
            answered: vec![],
            context: Some(Bytes::from_static(b"ctx")),
            takeover: None,
        }
    }

    #[test]
    fn statuses_round_trip_their_numbers() {
        for status in TaskStatus::ALL {
            assert_eq!(TaskStatus::from_u8(status.as_u8()), Some(status));
        }
        assert_eq!(TaskStatus::from_u8(5), None);
        assert!(!TaskStatus::InputRequired.is_terminal());
        assert!(TaskStatus::Completed.is_terminal());
    }

    #[test]
    fn read_time_decisions() {
        assert_eq!(record().seen_at(150, Some(1_000)), Some(record()));
        let expired = record().seen_at(200, Some(1_000)).unwrap();
        assert_eq!(expired.status, TaskStatus::Failed);
        assert_eq!(expired.rev, 2);
        assert_eq!(expired.updated_at, 200);
        assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
        assert!(expired.outstanding.is_empty());
        let lost = record().seen_at(180, Some(150)).unwrap();
        assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
        assert_eq!(lost.updated_at, 150);
        // Lost first, then expired: lost it stays.
        let lost = record().seen_at(250, Some(150)).unwrap();
        assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
        assert_eq!(record().seen_at(300, Some(1_000)), None);
        let unknown_instance = record().seen_at(150, None).unwrap();
        assert_eq!(unknown_instance.status, TaskStatus::Failed);
        let mut done = record();
        done.status = TaskStatus::Completed;
        assert_eq!(done.clone().seen_at(250, None), Some(done));
    }

    #[test]
    fn a_task_that_may_be_taken_over_waits_while_runs_are_left() {
        let mut task = record();
        task.takeover = Some(Takeover::new(2, false));
        // Its instance lapsed on run 1 of 2: it waits for a claim.
        assert_eq!(task.clone().seen_at(180, Some(150)), Some(task.clone()));
        // On its last run, a lapse ends it.
        task.takeover.as_mut().unwrap().lapses = 1;
        let lost = task.clone().seen_at(180, Some(150)).unwrap();
        assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
        // Released (nobody runs it), whatever the runs: it waits.
        task.takeover.as_mut().unwrap().released = true;
        assert_eq!(task.clone().seen_at(180, None), Some(task.clone()));
        // Expiry still ends it.
        let expired = task.seen_at(200, None).unwrap();
        assert_eq!(expired.outcome.as_deref(), Some(EXPIRED_ERROR));
    }
}
