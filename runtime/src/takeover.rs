//! The takeover runner: claiming the tasks that wait for a runtime (T17)
//! and running them through the framework's [`Executor`].

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use mcp_event_store_core::task::{Claimed, Finish, TaskDigest};
use mcp_event_store_core::{Error, Result};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::Runtime;
use crate::run::{Outcome, TaskRun};
use crate::runtime::{Inner, lock};

/// The most tasks one claim takes for [`Runtime::claim_for`].
const CLAIM_BATCH: usize = 8;
/// The most batches [`Runtime::claim_for`] claims while looking for its
/// task.
const RESUME_BATCHES: usize = 4;

/// What runs the tasks a runtime claims: the framework's part of the
/// takeover runner.
///
/// Given a claimed run ([`TaskRun::context`] says what to run, T13: for
/// both integrations a [`TaskCall`](crate::TaskCall), [`TaskRun::call`]),
/// it returns the operation to drive, which runs in the run's
/// [span](TaskRun::span). What cannot run (an unreadable context, an
/// unknown tool) is an [`Outcome::Failed`] at once. A task whose client
/// asked to cancel while nobody ran it never reaches the executor: the
/// runner ends it `cancelled`.
///
/// ```
/// use futures_util::future::BoxFuture;
/// use mcp_event_store_runtime::{Executor, Outcome, TaskRun, internal_error};
///
/// /// Runs every task's context back as its result.
/// struct Echo;
///
/// impl Executor for Echo {
///     fn run(&self, run: TaskRun) -> BoxFuture<'static, Outcome> {
///         Box::pin(async move {
///             match run.context() {
///                 Some(call) => Outcome::Completed(call.to_vec()),
///                 None => Outcome::Failed(internal_error("no call to run")),
///             }
///         })
///     }
/// }
/// ```
pub trait Executor: Send + Sync + 'static {
    /// The operation of the claimed task `run`.
    fn run(&self, run: TaskRun) -> BoxFuture<'static, Outcome>;
}

/// The takeover runner of a [`Runtime`] with an [`Executor`], from
/// [`Runtime::run_takeovers`] until this handle is dropped.
///
/// Dropping it stops claiming, aborts the runs it claimed and gives their
/// tasks back (T17: claimable at once by any runtime, no attempt counted),
/// and lets go of the executor. It holds the runtime only
/// weakly, so an executor that holds the runtime (through a framework's
/// router, say) is no cycle once the handle is dropped.
#[must_use = "dropping the handle stops the takeovers"]
pub struct Takeovers {
    runtime: Weak<Inner>,
    /// Which registration this is: dropping a handle a newer one replaced
    /// stops nothing.
    generation: u64,
}

impl fmt::Debug for Takeovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Takeovers").finish_non_exhaustive()
    }
}

impl Drop for Takeovers {
    fn drop(&mut self) {
        if let Some(inner) = self.runtime.upgrade() {
            // Given back in the background: a drop cannot wait.
            drop(stop_runner(&inner, Some(self.generation)));
        }
    }
}

/// Lets go of the executor (if `generation` is the current one, or
/// whatever it is for `None`), aborts the runs it claimed and gives their
/// tasks back (T17), on tasks of their own; the future resolves once every
/// one was given back (or failed to be, and is claimed once this instance
/// lapses).
pub(crate) fn stop_runner(
    inner: &Inner,
    generation: Option<u64>,
) -> impl Future<Output = ()> + use<> {
    let replaced = {
        let mut executor = lock(&inner.executor);
        let replaced = generation.is_some_and(|mine| {
            executor
                .as_ref()
                .is_some_and(|(current, _)| *current != mine)
        });
        if !replaced {
            executor.take();
        }
        replaced
    };
    let runs: Vec<_> = if replaced {
        Vec::new()
    } else {
        lock(&inner.runs).drain().collect()
    };
    let given_back: Vec<_> = runs
        .into_iter()
        .filter_map(|(_, (handle, run))| {
            handle.abort();
            give_back(run)
        })
        .collect();
    futures_util::future::join_all(given_back).map(drop)
}

/// Gives a run's task back (T17) on a task of its own, if there is a tokio
/// runtime to run it on.
fn give_back(run: TaskRun) -> Option<tokio::task::JoinHandle<()>> {
    let tokio = tokio::runtime::Handle::try_current().ok()?;
    Some(tokio.spawn(async move {
        if let Err(error) = run.release().await {
            tracing::debug!(task = ?run.digest(), %error, "giving a task back failed; it is claimed once this instance lapses");
        }
    }))
}

/// Whether the maintenance loop's claim rounds run: an executor is
/// registered and tasks are not handed off.
pub(crate) fn claims_here(inner: &Inner) -> bool {
    !inner.settings.hand_off && lock(&inner.executor).is_some()
}

/// The executor registered now.
fn executor(inner: &Inner) -> Option<Arc<dyn Executor>> {
    lock(&inner.executor)
        .as_ref()
        .map(|(_, executor)| executor.clone())
}

/// One claim round: as many waiting tasks as there are free permits, in
/// batches while they come full, each run on a task of its own.
pub(crate) async fn claim_round(inner: Arc<Inner>) {
    Runtime { inner }.claim_now().await;
}

impl Runtime {
    /// Runs the tasks this runtime claims through `executor`, from now
    /// until the returned handle is dropped: every
    /// [`claim_every`](crate::RuntimeBuilder::claim_every), the tasks that
    /// wait for a runtime (their instance lapsed with runs left, they were
    /// queued for a worker, or answered after they were given back) are
    /// claimed, at most [`max_running`](crate::RuntimeBuilder::max_running)
    /// running at once. Nothing is claimed by a runtime that
    /// [hands off](crate::RuntimeBuilder::hand_off_to_workers). A second
    /// call replaces the first's executor (dropping the first handle then
    /// stops nothing).
    pub fn run_takeovers(&self, executor: Arc<dyn Executor>) -> Takeovers {
        let generation = self.inner.generations.fetch_add(1, Ordering::SeqCst) + 1;
        *lock(&self.inner.executor) = Some((generation, executor));
        Takeovers {
            runtime: Arc::downgrade(&self.inner),
            generation,
        }
    }

    /// Whether an [`Executor`] runs this runtime's takeovers now (a
    /// [`Takeovers`] handle lives).
    pub fn runs_takeovers(&self) -> bool {
        lock(&self.inner.executor).is_some()
    }

    /// Claims and starts what waits for a runtime now, as the claim rounds
    /// do; for tests, and for a worker that wants to look at once. Does
    /// nothing without an executor, or when tasks are handed off. Errors
    /// are logged (the next round tries again); a lapsed instance is
    /// replaced first.
    pub async fn claim_now(&self) {
        if !claims_here(&self.inner) {
            return;
        }
        let Ok(_one_at_a_time) = self.inner.claiming.try_lock() else {
            return;
        };
        loop {
            let mut permits = Vec::new();
            while permits.len() < self.inner.settings.max_running {
                match self.inner.running.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            if permits.is_empty() {
                return;
            }
            let claimed = match self.claim(permits.len()).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::warn!(%error, "claiming tasks failed; retrying next round");
                    return;
                }
            };
            let full = claimed.len() == permits.len();
            for (claimed, permit) in claimed.into_iter().zip(permits) {
                self.start(claimed, Some(permit));
            }
            if !full {
                return;
            }
        }
    }

    /// Claims until the task under `task` is among the claimed, for a
    /// framework that runs it itself (tower-mcp resumes a task where its
    /// client's answer arrives): `Some` with its run if this runtime got
    /// it; `None` if no executor is registered, tasks are handed off, or
    /// another runtime holds it. Claims are not by task: the tasks claimed
    /// with it run through the executor, each batch as many as there are
    /// free permits, and one more.
    pub async fn claim_for(&self, task: &TaskDigest) -> Result<Option<TaskRun>> {
        for _ in 0..RESUME_BATCHES {
            if self.hands_off() || !self.runs_takeovers() {
                return Ok(None);
            }
            let mut permits = Vec::new();
            while permits.len() + 1 < CLAIM_BATCH {
                match self.inner.running.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            let claimed = self.claim(permits.len() + 1).await?;
            if claimed.is_empty() {
                return Ok(None);
            }
            let mut found = None;
            for claimed in claimed {
                if claimed.task == *task {
                    found = Some(TaskRun::claimed(self.clone(), claimed));
                } else {
                    self.start(claimed, permits.pop());
                }
            }
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Claims up to `limit` tasks as this runtime's instance, a fresh one
    /// if it lapsed.
    async fn claim(&self, limit: usize) -> Result<Vec<Claimed>> {
        self.ensure_open()?;
        let me = self.instance();
        match self.runtime_store().claim(me, limit).await {
            Err(Error::InstanceLapsed { .. }) => {
                let me = self.replace_lapsed(me).await?;
                self.runtime_store().claim(me, limit).await
            }
            claimed => claimed,
        }
    }

    /// Starts a claimed task: ends it `cancelled` if its client asked to
    /// while nobody ran it, else drives the executor's operation. A claim
    /// over this runtime's permits (one [`claim_for`](Self::claim_for)
    /// took with its task) runs without one.
    fn start(&self, claimed: Claimed, permit: Option<OwnedSemaphorePermit>) {
        let run = TaskRun::claimed(self.clone(), claimed);
        let (digest, claim) = (run.digest(), run.claim());
        let inner = Arc::downgrade(&self.inner);
        // The executor read under the runs' lock: a runner stopping now
        // either sees this run among the runs, or this run sees no executor.
        // The run's span: a child of the task's creator's (feature `otel`).
        let span = run.span();
        let mut runs = lock(&self.inner.runs);
        let executor = executor(&self.inner);
        let running = run.clone();
        let handle = tokio::spawn(async move {
            let _permit = permit;
            match executor {
                _ if run.cancel_requested_at_claim() => run.finish(Finish::Cancelled).await,
                Some(executor) => {
                    tracing::debug!(task = ?digest, attempt = run.attempt(), "running a claimed task");
                    let operation = executor.run(run.clone());
                    run.drive(operation).await;
                }
                // The runner stopped between the claim and now.
                None => {
                    if let Some(giving) = give_back(run) {
                        let _ = giving.await;
                    }
                }
            }
            if let Some(inner) = inner.upgrade() {
                let mut runs = lock(&inner.runs);
                // Only this run's entry: a newer claim's may be there.
                if runs
                    .get(&digest)
                    .is_some_and(|(_, run)| run.claim() == claim)
                {
                    runs.remove(&digest);
                }
            }
        }.instrument(span));
        if let Some((old, _)) = runs.insert(digest, (handle.abort_handle(), running)) {
            old.abort();
        }
    }
}
