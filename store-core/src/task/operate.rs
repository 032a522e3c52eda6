//! What an operator reads and does to tasks (T22, T23): every task with
//! its owner and instance, a cancel and a requeue that need no task id.
//!
//! A store never keeps a task's id (T2), so an operator names a task by
//! its [`TaskDigest`], as [`RuntimeStore::task_page`](super::RuntimeStore::task_page)
//! lists it.

use std::fmt;

use super::{TaskDigest, TaskRecord, TaskStatus, TaskView};

/// One task as an operator reads it ([`RuntimeStore::task_page`](super::RuntimeStore::task_page),
/// T22): its key and the runtime's view of it (owner, record as a read
/// shows it now, answers not yet taken, instance and that instance's
/// lease).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskEntry {
    /// The task's key.
    pub task: TaskDigest,
    /// The task as the runtime reads it.
    pub view: TaskView,
}

impl TaskEntry {
    /// An entry (for stores).
    pub fn new(task: TaskDigest, view: TaskView) -> Self {
        Self { task, view }
    }
}

/// One page of [`RuntimeStore::task_page`](super::RuntimeStore::task_page),
/// ascending by digest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskPage {
    /// The tasks of this page.
    pub tasks: Vec<TaskEntry>,
    /// Where the next page starts; `None` on the last one. A page may hold
    /// fewer tasks than asked (a task deleted while listed) and still have
    /// a next one.
    pub next: Option<TaskDigest>,
}

impl TaskPage {
    /// A page (for stores).
    pub fn new(tasks: Vec<TaskEntry>, next: Option<TaskDigest>) -> Self {
        Self { tasks, next }
    }
}

/// What [`RuntimeStore::requeue_task`](super::RuntimeStore::requeue_task)
/// did (T23).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Requeue {
    /// The task waits for a claim again: the record as stored now.
    Requeued(TaskRecord),
    /// Nothing changed: the task as read, and why.
    Refused(TaskRecord, RequeueRefusal),
    /// No such task (or past its grace).
    Unknown,
}

/// Why a task was not requeued (T23).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequeueRefusal {
    /// The task has not failed (it runs, or ended otherwise).
    NotFailed(TaskStatus),
    /// The task was created to die with its instance
    /// ([`NewTask::takeover`](super::NewTask::takeover) was not asked):
    /// no runtime knows how to run it again.
    NotTakenOver,
    /// The task's ttl ran out (T8): a run would end at once.
    Expired,
    /// Its client asked to cancel it (T6).
    CancelRequested,
}

impl fmt::Display for RequeueRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFailed(status) => write!(f, "the task is {status}, not failed"),
            Self::NotTakenOver => f.write_str(
                "the task was not created to be taken over, so no runtime can run it again",
            ),
            Self::Expired => f.write_str("the task's ttl ran out"),
            Self::CancelRequested => f.write_str("its client asked to cancel it"),
        }
    }
}
