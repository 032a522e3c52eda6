//! Tasks that outlive their process: claiming them (T17) and having
//! tower-mcp's router run their handler again; see the
//! [crate docs](crate#takeover).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use mcp_event_store_core::Error;
use mcp_event_store_core::task::{
    Applied, Claimed, Finish, TaskDigest, TaskId, TaskStore, TaskView, Worker, WorkerChange,
};
use serde_json::json;
use tokio::task::AbortHandle;
use tower_mcp::async_task::{Result, TaskStoreError};
use tower_mcp::error::JsonRpcError;
use tower_mcp::protocol::{CallToolParams, McpRequest, McpResponse, RequestId};
use tower_mcp::stateless::StatelessRequestMeta;
use tower_mcp::{McpRouter, RouterRequest};
use tower_service::Service;

use crate::support::{now_millis, task_error};
use crate::tasks::{Context, RECHECK, RETRY, Shared, TowerTaskStore, fit_message, to_json};

/// The most tasks one claim takes.
const CLAIM_BATCH: usize = 8;
/// The most batches a resume claims while looking for its task.
const RESUME_BATCHES: usize = 8;

/// Which tasks the adapter creates so that they may be taken over.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    pub(crate) max_attempts: u32,
    /// `None`: every tool.
    pub(crate) tools: Option<BTreeSet<String>>,
}

impl Policy {
    pub(crate) fn covers(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|tools| tools.contains(tool))
    }
}

/// The router that runs claimed tasks, and the runs under way.
#[derive(Clone)]
pub(crate) struct Runner {
    router: McpRouter,
    runs: Arc<Mutex<HashMap<TaskDigest, AbortHandle>>>,
}

impl Runner {
    fn runs(&self) -> MutexGuard<'_, HashMap<TaskDigest, AbortHandle>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Takeovers run by a [`TowerTaskStore`] through a router, from
/// [`TowerTaskStore::run_takeovers`] until this handle is dropped.
///
/// Dropping it stops claiming, aborts the handlers it runs (their tasks
/// are taken over again once this instance lapses, or read `failed` on
/// their last run) and lets go of the router, which holds the task store:
/// drop it before the last handle of the task store, or the store's
/// heartbeat outlives them both.
#[must_use = "dropping the handle stops the takeovers"]
pub struct Takeovers {
    stop: Box<dyn FnOnce() + Send + Sync>,
    claim_loop: AbortHandle,
}

impl fmt::Debug for Takeovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Takeovers").finish_non_exhaustive()
    }
}

impl Drop for Takeovers {
    fn drop(&mut self) {
        self.claim_loop.abort();
        let stop = std::mem::replace(&mut self.stop, Box::new(|| {}));
        stop();
    }
}

impl<S: TaskStore + ?Sized> TowerTaskStore<S> {
    /// Takes over tasks through `router`, the router this task store was
    /// given to (`McpRouter::task_store`), until the returned handle is
    /// dropped; must run inside a tokio runtime.
    ///
    /// From now on, the tasks of the tools the builder opted in
    /// ([`takeover`](crate::TowerTaskStoreBuilder::takeover),
    /// [`takeover_tools`](crate::TowerTaskStoreBuilder::takeover_tools)) are
    /// created so that they may outlive this process. Every
    /// [`claim_every`](crate::TowerTaskStoreBuilder::claim_every), this
    /// instance claims the tasks waiting for a runtime (their instance
    /// lapsed with runs left, or they were answered after parking) and has
    /// `router` run their tool again, from the top, with their arguments
    /// and every answer so far, writing the outcome under its claim. See
    /// the [crate docs](crate#takeover) for what that guarantees.
    pub fn run_takeovers(&self, router: McpRouter) -> Takeovers {
        let shared = self.shared().clone();
        let runner = Runner {
            router,
            runs: Arc::default(),
        };
        *shared.runner() = Some(runner);
        let claiming = shared.clone();
        let every = shared.claim_every;
        let claim_loop = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let Err(e) = claim_and_run(&claiming).await {
                    tracing::warn!(error = %e, "claiming tasks to take over failed; retrying");
                }
            }
        })
        .abort_handle();
        let stopping = shared;
        Takeovers {
            stop: Box::new(move || {
                if let Some(runner) = stopping.runner().take() {
                    for (_, run) in runner.runs().drain() {
                        run.abort();
                    }
                }
            }),
            claim_loop,
        }
    }
}

/// Claims up to a batch of tasks as this process's instance (a fresh one if
/// it lapsed).
async fn claim<S: TaskStore + ?Sized>(shared: &Shared<S>) -> Result<Vec<Claimed>> {
    let me = shared.instance().await?;
    match shared.store.claim(me, CLAIM_BATCH).await {
        Ok(claimed) => Ok(claimed),
        Err(Error::InstanceLapsed { .. }) => {
            let me = shared.renew(me).await?;
            shared
                .store
                .claim(me, CLAIM_BATCH)
                .await
                .map_err(task_error)
        }
        Err(e) => Err(task_error(e)),
    }
}

/// One round of the claim loop: claims what waits, in batches, and runs it.
async fn claim_and_run<S: TaskStore + ?Sized>(shared: &Arc<Shared<S>>) -> Result<()> {
    loop {
        let Some(runner) = shared.runner().clone() else {
            return Ok(());
        };
        let claimed = claim(shared).await?;
        let full = claimed.len() >= CLAIM_BATCH;
        for task in claimed {
            spawn_run(shared, &runner, task);
        }
        if !full {
            return Ok(());
        }
    }
}

/// Claims task `task` for a resume through tower-mcp's router (a
/// `tasks/update` answered it here): `Some` with the task as claimed if
/// this process got it. Claims are not by task, so the tasks claimed with
/// it are run like the claim loop's. `None` if this process runs no
/// takeovers, or another got the task.
pub(crate) async fn claim_for_resume<S: TaskStore + ?Sized>(
    shared: &Arc<Shared<S>>,
    task: &TaskId,
) -> Result<Option<TaskView>> {
    let digest = task.digest();
    for _ in 0..RESUME_BATCHES {
        let Some(runner) = shared.runner().clone() else {
            return Ok(None);
        };
        let claimed = claim(shared).await?;
        if claimed.is_empty() {
            return Ok(None);
        }
        let mut found = None;
        for other in claimed {
            if other.task == digest {
                shared.claims().insert(digest, other.worker);
                found = Some(other.view);
            } else {
                spawn_run(shared, &runner, other);
            }
        }
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// Runs a task claimed without its id, as this process's.
fn spawn_run<S: TaskStore + ?Sized>(shared: &Arc<Shared<S>>, runner: &Runner, task: Claimed) {
    let digest = task.task;
    shared.claims().insert(digest, task.worker);
    let running = shared.clone();
    let router = runner.router.clone();
    let runs = runner.runs.clone();
    let mut all = runner.runs();
    let run = tokio::spawn(async move {
        let worker = task.worker;
        if let Err(e) = run_claimed(&running, router, task).await {
            tracing::warn!(error = %e, "running a task taken over failed");
        }
        running.drop_claim(&digest, Some(worker));
        runs.lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&digest);
    })
    .abort_handle();
    if let Some(old) = all.insert(digest, run) {
        old.abort();
    }
}

/// The extensions of a request that runs a task again: the 2026-07-28
/// lifecycle (the one whose tasks park for input), with every client
/// capability an input request may need. tower-mcp's own replay checks
/// none (it parks what the handler asks); the original client declared
/// what it supports when the task was created.
fn replay_extensions() -> Result<tower_mcp::Extensions> {
    let meta: StatelessRequestMeta = serde_json::from_value(json!({
        "io.modelcontextprotocol/protocolVersion": tower_mcp::protocol::PROTOCOL_VERSION_2026_07_28,
        "io.modelcontextprotocol/clientCapabilities": {
            "roots": {},
            "sampling": {"tools": {}, "context": {}},
            "elicitation": {"form": {}, "url": {}}
        }
    }))
    .map_err(|e| TaskStoreError::Encode(format!("a replay's request metadata: {e}")))?;
    let mut extensions = tower_mcp::Extensions::new();
    extensions.insert(meta);
    Ok(extensions)
}

/// Runs a claimed task's tool again through `router` and writes the
/// outcome under the claim; stops (dropping the handler) when the task is
/// cancelled, ends, expires, goes, or is claimed by another (T18).
async fn run_claimed<S: TaskStore + ?Sized>(
    shared: &Arc<Shared<S>>,
    mut router: McpRouter,
    task: Claimed,
) -> Result<()> {
    let Claimed {
        task: digest,
        worker,
        view,
        ..
    } = task;
    let finish = |change: WorkerChange<'static>| async move {
        shared.apply_claimed(&digest, worker, change).await
    };
    if view.record.cancel_requested {
        // The client asked to cancel while nobody ran it: the claimant ends
        // it (T17).
        finish(WorkerChange::Finish(Finish::Cancelled)).await?;
        return Ok(());
    }
    let parsed = view
        .record
        .context
        .as_deref()
        .map(Context::decode)
        .transpose()
        .and_then(|context| Ok((context, crate::tasks::responses(&view)?)));
    let (context, responses) = match parsed {
        Ok((Some(context), responses)) => (context, responses),
        Ok((None, _)) | Err(_) => {
            let error = JsonRpcError::internal_error(
                "the task was taken over, but its tool and arguments cannot be read",
            );
            let error = to_json(&error, "a task's error")?;
            shared
                .apply_claimed(
                    &digest,
                    worker,
                    WorkerChange::Finish(Finish::Failed(&error)),
                )
                .await?;
            return Ok(());
        }
    };
    let request = RouterRequest {
        id: RequestId::String(format!("takeover-{}", worker.epoch)),
        inner: McpRequest::CallTool(CallToolParams {
            name: context.tool,
            arguments: context.arguments,
            input_responses: (!responses.is_empty()).then_some(responses),
            request_state: None,
            meta: None,
            task: None,
        }),
        extensions: replay_extensions()?,
    };
    let response = tokio::select! {
        biased;
        () = claim_lost(shared, &digest, worker, view.record.rev) => {
            tracing::debug!(epoch = worker.epoch, "a task taken over stopped: cancelled, ended or claimed by another");
            return Ok(());
        }
        response = router.call(request) => match response {
            Ok(response) => response.inner,
            Err(never) => match never {},
        },
    };
    let applied = match response {
        Ok(McpResponse::CallTool(result)) => {
            let result = to_json(&result, "a task's result")?;
            shared
                .apply_claimed(
                    &digest,
                    worker,
                    WorkerChange::Finish(Finish::Completed(&result)),
                )
                .await?
        }
        Ok(McpResponse::InputRequired(asked)) => {
            let requests = asked.input_requests.unwrap_or_default();
            park(
                shared,
                &digest,
                worker,
                &requests,
                asked.request_state.as_deref(),
            )
            .await?
        }
        Ok(_) => {
            fail(
                shared,
                &digest,
                worker,
                &JsonRpcError::internal_error("the tool answered a task's run with no result"),
            )
            .await?
        }
        Err(error) => fail(shared, &digest, worker, &error).await?,
    };
    if matches!(applied, Applied::Fenced) {
        tracing::debug!(
            epoch = worker.epoch,
            "a task taken over was claimed since by another: its outcome here is dropped"
        );
    }
    Ok(())
}

async fn fail<S: TaskStore + ?Sized>(
    shared: &Shared<S>,
    digest: &TaskDigest,
    worker: Worker,
    error: &JsonRpcError,
) -> Result<Applied> {
    let error = to_json(error, "a task's error")?;
    shared
        .apply_claimed(digest, worker, WorkerChange::Finish(Finish::Failed(&error)))
        .await
}

/// Parks a task taken over on the input its handler asked for, as
/// tower-mcp's router parks its own (an empty set fails it: nothing could
/// ever answer it), then gives it back, for whichever instance the answers
/// reach.
async fn park<S: TaskStore + ?Sized>(
    shared: &Shared<S>,
    digest: &TaskDigest,
    worker: Worker,
    requests: &tower_mcp::protocol::InputRequests,
    message: Option<&str>,
) -> Result<Applied> {
    if requests.is_empty() {
        let error = JsonRpcError::internal_error(
            "handler asked for input without naming any requests, so the task has nothing to \
             wait for",
        );
        return fail(shared, digest, worker, &error).await;
    }
    let encoded = requests
        .iter()
        .map(|(key, request)| Ok((key.as_str(), to_json(request, "an input request")?)))
        .collect::<Result<Vec<_>>>()?;
    let pairs: Vec<(&str, &[u8])> = encoded.iter().map(|(k, r)| (*k, &r[..])).collect();
    let change = WorkerChange::ReplaceInputs {
        requests: &pairs,
        message: message.map(fit_message),
    };
    let applied = shared.apply_claimed(digest, worker, change).await?;
    match applied {
        Applied::Changed { .. } => {
            shared
                .apply_claimed(digest, worker, WorkerChange::Release)
                .await
        }
        Applied::KeySpent => {
            let error = JsonRpcError::internal_error(
                "input request keys must be unique over a task's lifetime: the handler reused \
                 a key already answered or superseded",
            );
            fail(shared, digest, worker, &error).await
        }
        other => Ok(other),
    }
}

/// Resolves once claim `worker` on the task under `digest` no longer lets
/// its handler run: the task ended (cancelled included), expired, went, was
/// asked to cancel, was released or was claimed by another. A change wakes
/// it through the store's watch (T10); expiry and a lapse at the next
/// re-read.
async fn claim_lost<S: TaskStore + ?Sized>(
    shared: &Shared<S>,
    digest: &TaskDigest,
    worker: Worker,
    mut rev: u64,
) {
    loop {
        match shared.store.watch_claimed(digest, rev, RECHECK).await {
            Ok(None) => return,
            Ok(Some(record)) => {
                let lost = record.status.is_terminal()
                    || record.cancel_requested
                    || now_millis() >= record.expires_at
                    || record
                        .takeover
                        .as_ref()
                        .is_none_or(|t| t.released || t.epoch != worker.epoch);
                if lost {
                    return;
                }
                rev = record.rev;
            }
            Err(e) => {
                tracing::debug!(error = %e, "watching a task taken over failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
