//! The runtime over the memory store: one lease per instance, one
//! maintenance loop, and the takeover runner with its fencing. Several
//! runtimes on one store stand for instances sharing it; one "dies" when it
//! is dropped without a shutdown (its lease is no longer renewed).
//!
//! No test bounds a latency: each waits, under a generous guard, for what
//! must happen eventually.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::task::{
    Applied, INSTANCE_LOST_ERROR, NewTask, Owner, TaskRecord, TaskStatus, TaskStore, WorkerChange,
};
use mcp_event_store_core::{
    Error, EventStore, ManualClock, MemoryStore, NewEvent, Retention, SessionStore, Store,
    StoreOptions,
};
use mcp_event_store_runtime::{Executor, Outcome, Runtime, Takeovers, TaskRun, internal_error};
use tokio::sync::mpsc;

/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(30);
/// A short lease, so that an instance that stops renewing lapses soon.
const LEASE: Duration = Duration::from_millis(300);

async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(EVENTUALLY, async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not within {EVENTUALLY:?}"));
}

async fn runtime(store: &Arc<MemoryStore>) -> Runtime {
    Runtime::builder(store.clone())
        .lease(LEASE)
        .claim_every(Duration::from_millis(20))
        .start()
        .await
        .unwrap()
}

/// A front end: a runtime that queues tasks to be taken over for workers
/// and runs none, their runs at most `max_attempts`.
async fn front(store: &Arc<MemoryStore>, max_attempts: u32) -> Runtime {
    Runtime::builder(store.clone())
        .lease(LEASE)
        .max_attempts(max_attempts)
        .hand_off_to_workers()
        .start()
        .await
        .unwrap()
}

/// Queues a task for workers on `front`, to run `context`.
async fn queue(front: &Runtime, context: &'static [u8]) -> mcp_event_store_core::task::TaskId {
    let task = front.for_takeover(NewTask::new(&Owner::Anonymous, front.instance()));
    front.create(task.context(context)).await.unwrap().0
}

/// A runtime whose maintenance loop ran on a tokio runtime that is gone:
/// a process killed, or stalled, with its objects still at hand. Its lease
/// lapses one lease after it started.
fn killed(store: &Arc<MemoryStore>) -> Runtime {
    let store = store.clone();
    std::thread::spawn(move || {
        let gone = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        gone.block_on(Runtime::builder(store).lease(LEASE).start())
            .unwrap()
    })
    .join()
    .unwrap()
}

/// What the test executor was asked to run, and by which runtime.
#[derive(Debug)]
struct Started {
    by: &'static str,
    context: Vec<u8>,
    attempt: u32,
}

/// Reports each run, then ends as the context says: `complete`, `hang`
/// (until dropped), `panic`, `ask` (for input `k`, unless answered). Counts
/// the operations dropped.
struct Script {
    by: &'static str,
    started: mpsc::UnboundedSender<Started>,
    dropped: Arc<AtomicUsize>,
}

/// Counts one more when dropped.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Executor for Script {
    fn run(&self, run: TaskRun) -> BoxFuture<'static, Outcome> {
        let (by, started) = (self.by, self.started.clone());
        let dropped = Dropped(self.dropped.clone());
        Box::pin(async move {
            let _dropped = dropped;
            let context = run.context().unwrap_or_default().to_vec();
            let _ = started.send(Started {
                by,
                context: context.clone(),
                attempt: run.attempt(),
            });
            match &context[..] {
                b"hang" => std::future::pending().await,
                b"panic" => panic!("the operation failed"),
                b"ask" if run.answer("k").is_none() => Outcome::InputRequired {
                    requests: vec![("k".into(), b"{\"q\":1}".to_vec())],
                    message: Some("waiting".into()),
                },
                _ => Outcome::Completed(format!("{{\"by\":\"{by}\"}}").into_bytes()),
            }
        })
    }
}

fn script(by: &'static str) -> (Arc<Script>, mpsc::UnboundedReceiver<Started>) {
    let (started, runs) = mpsc::unbounded_channel();
    let dropped = Arc::default();
    (
        Arc::new(Script {
            by,
            started,
            dropped,
        }),
        runs,
    )
}

async fn next(runs: &mut mpsc::UnboundedReceiver<Started>) -> Started {
    tokio::time::timeout(EVENTUALLY, runs.recv())
        .await
        .expect("a run within the guard")
        .expect("the executor lives")
}

/// The anonymous task `id` as a client reads it.
async fn read(store: &MemoryStore, id: &impl ToString) -> TaskRecord {
    let read = store.get(&id.to_string(), &Owner::Anonymous).await;
    read.unwrap().expect("the task reads")
}

/// A new runtime `by` that takes over the one task left to run, still on
/// its first attempt, and leaves it working.
async fn takes_over_on_the_first_attempt(
    store: &Arc<MemoryStore>,
    by: &'static str,
) -> (Runtime, Takeovers) {
    let runtime = runtime(store).await;
    let (executor, mut runs) = script(by);
    let takeovers = runtime.run_takeovers(executor);
    let started = next(&mut runs).await;
    assert_eq!((started.by, started.attempt), (by, 1));
    (runtime, takeovers)
}

/// An instance running events, sessions and tasks holds exactly one lease
/// in the store, and keeps no lease of any other kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_registers_one_lease() {
    let store = Arc::new(MemoryStore::new());
    let runtime = runtime(&store).await;
    store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    let stream = StreamKey::generate().unwrap().token("s");
    runtime.produces(&stream).await.unwrap();
    let (_, _, run) = runtime
        .create(NewTask::new(&Owner::Anonymous, runtime.instance()))
        .await
        .unwrap();
    run.write(WorkerChange::SetMessage(Some("working")))
        .await
        .unwrap();
    tokio::time::sleep(LEASE).await; // several renewals
    let leases = store.task_runtime().instances().await.unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].instance, runtime.instance());
    assert!(leases[0].alive);
    let presence = format!("mcp-presence/{}", runtime.instance());
    assert_eq!(store.get_session(&presence).await.unwrap(), None);
    runtime.shutdown().await;
}

/// The loop renews the lease while the runtime lives, its tasks keep
/// running and its streams' writer is alive; once every clone is dropped
/// the lease lapses: the task reads lost and the writer gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_lives_with_the_runtime() {
    let store = Arc::new(MemoryStore::new());
    let writer = runtime(&store).await;
    let watcher = runtime(&store).await;
    let stream = StreamKey::generate().unwrap().token("a call");
    writer.produces(&stream).await.unwrap();
    let (id, _, _) = writer
        .create(NewTask::new(&Owner::Anonymous, writer.instance()))
        .await
        .unwrap();
    tokio::time::sleep(LEASE * 5).await;
    assert_eq!(read(&store, &id).await.status, TaskStatus::Working);
    assert!(
        Box::pin(watcher.producer_lost(stream))
            .now_or_never()
            .is_none(),
        "the writer is alive"
    );
    drop(writer);
    tokio::time::timeout(EVENTUALLY, watcher.producer_lost(stream))
        .await
        .expect("a writer that stopped renewing is lost");
    let lost = read(&store, &id).await;
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
}

/// A graceful shutdown ends the lease at once: the writer is gone for
/// followers elsewhere, a task that may be taken over is claimed by another
/// instance without waiting for the lease, and the runtime creates nothing
/// more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_lease_at_once() {
    let store = Arc::new(MemoryStore::new());
    let leaving = Runtime::builder(store.clone())
        .lease(Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    let staying = runtime(&store).await;
    let (executor, mut runs) = script("staying");
    let _takeovers = staying.run_takeovers(executor);
    let stream = StreamKey::generate().unwrap().token("a call");
    leaving.produces(&stream).await.unwrap();
    let task = leaving.for_takeover(NewTask::new(&Owner::Anonymous, leaving.instance()));
    let (id, _, _) = leaving.create(task.context(b"complete")).await.unwrap();
    leaving.shutdown().await;
    tokio::time::timeout(EVENTUALLY, staying.producer_lost(stream))
        .await
        .expect("a shut down writer is gone");
    let started = next(&mut runs).await;
    assert_eq!((started.by, started.attempt), ("staying", 2));
    eventually("the task completed by the other instance", async || {
        store
            .get(&id.to_string(), &Owner::Anonymous)
            .await
            .unwrap()
            .is_some_and(|t| t.status == TaskStatus::Completed)
    })
    .await;
    let refused = leaving
        .create(NewTask::new(&Owner::Anonymous, leaving.instance()))
        .await;
    assert!(matches!(refused, Err(Error::Closed)), "{refused:?}");
}

/// An instance that stalled past its lease is never revived: its task
/// reads lost, and the runtime creates its next task under a fresh
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_instance_is_replaced() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let runtime = Runtime::builder(store.clone())
        .lease(Duration::from_secs(30))
        .start()
        .await
        .unwrap();
    let first = runtime.instance();
    let (id, _, _) = runtime
        .create(NewTask::new(&Owner::Anonymous, first))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(31));
    let (second, _, _) = runtime
        .create(NewTask::new(&Owner::Anonymous, first))
        .await
        .unwrap();
    assert_ne!(runtime.instance(), first, "a fresh instance");
    let lost = read(&store, &id).await;
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    let alive = read(&store, &second).await;
    assert_eq!(alive.status, TaskStatus::Working);
    runtime.shutdown().await;
}

/// `lease_remaining`: current while the loop renews the lease (never
/// more than one lease ahead), not current once no renewal was accepted for
/// a lease (a runtime whose loop is gone) or after a shutdown, and current
/// again under the fresh instance that replaces one the store saw lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_current_while_it_is_renewed() {
    let store = Arc::new(MemoryStore::new());
    let live = runtime(&store).await;
    assert!(live.lease_current());
    tokio::time::sleep(LEASE * 3).await; // several renewals
    let left = live.lease_remaining().expect("renewed: current");
    assert!(left <= LEASE, "{left:?}");

    let stalled = killed(&store);
    eventually("a lease no longer renewed is not current", async || {
        !stalled.lease_current()
    })
    .await;
    assert!(live.lease_current(), "the other instance renews its own");
    live.shutdown().await;
    assert_eq!(live.lease_remaining(), None, "shut down");

    // The store's clock jumps past the lease: the next renewal is refused,
    // and a fresh instance, current, replaces the lapsed one.
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let replaced = runtime(&store).await;
    let first = replaced.instance();
    clock.advance(LEASE * 10);
    eventually("a fresh instance with a current lease", async || {
        replaced.instance() != first && replaced.lease_current()
    })
    .await;
    assert!(
        store
            .task_runtime()
            .is_alive(replaced.instance())
            .await
            .unwrap()
    );
    replaced.shutdown().await;
}

/// Expired events and tasks go without anyone calling a purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_purges_expired_events_and_tasks() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let options = StoreOptions::default()
        .clock(clock.clone())
        .retention(Retention::default().max_age(Duration::from_secs(60)));
    let store = Arc::new(MemoryStore::with_options(options));
    store.store_event("old", NewEvent::new(b"x")).await.unwrap();
    let runtime = Runtime::builder(store.clone())
        .lease(Duration::from_secs(3600 * 24))
        .purge_every(Some(Duration::from_millis(20)))
        .start()
        .await
        .unwrap();
    let (id, _, _) = runtime
        .create(NewTask::new(&Owner::Anonymous, runtime.instance()).ttl(Duration::ZERO))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3601));
    eventually("the expired event and task purged", async || {
        store.stats().await.unwrap().events == 0
            && store
                .get(&id.to_string(), &Owner::Anonymous)
                .await
                .unwrap()
                .is_none()
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn nonsense_settings_are_refused() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let builder = || Runtime::builder(store.clone());
    for refused in [
        builder().lease(Duration::from_millis(2)).start().await,
        builder().purge_every(Some(Duration::ZERO)).start().await,
        builder().claim_every(Duration::ZERO).start().await,
        builder().max_running(0).start().await,
        builder().max_attempts(0).start().await,
    ] {
        assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
    }
}

/// A task whose instance died is run again by the one that claims it,
/// with its checkpoint and its attempt; the dead run's late writes are
/// fenced and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_instance_died_is_taken_over_and_the_old_run_fenced() {
    let store = Arc::new(MemoryStore::new());
    let dying = killed(&store);
    let task = dying.for_takeover(NewTask::new(&Owner::Anonymous, dying.instance()));
    let (id, _, old_run) = dying.create(task.context(b"complete")).await.unwrap();
    assert!(matches!(
        old_run.checkpoint(b"step 3").await.unwrap(),
        Applied::Changed { .. }
    ));
    let survivor = runtime(&store).await;
    let (executor, mut runs) = script("survivor");
    let _takeovers = survivor.run_takeovers(executor);
    let started = next(&mut runs).await;
    assert_eq!((started.by, started.attempt), ("survivor", 2));
    assert_eq!(started.context, b"complete");
    eventually("completed by the survivor", async || {
        store
            .get(&id.to_string(), &Owner::Anonymous)
            .await
            .unwrap()
            .is_some_and(|t| t.outcome.as_deref() == Some(&br#"{"by":"survivor"}"#[..]))
    })
    .await;
    let late = old_run
        .write(WorkerChange::SetMessage(Some("late")))
        .await
        .unwrap();
    assert!(
        matches!(late, Applied::Fenced | Applied::AlreadyTerminal(_)),
        "{late:?}"
    );
    survivor.shutdown().await;
}

/// A run whose task another instance claims is stopped, and its
/// operation dropped, even if it never writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_loses_its_claim_is_stopped() {
    let store = Arc::new(MemoryStore::new());
    let first = killed(&store);
    let task = first.for_takeover(NewTask::new(&Owner::Anonymous, first.instance()));
    let (_, _, run) = first.create(task.context(b"hang")).await.unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let guard = Dropped(dropped.clone());
    let driving = tokio::spawn(run.clone().drive(async move {
        let _guard = guard;
        std::future::pending::<Outcome>().await
    }));
    // The instance stalled: its lease lapses while its run goes on.
    let second = runtime(&store).await;
    let (executor, mut runs) = script("second");
    let _takeovers = second.run_takeovers(executor);
    assert_eq!(next(&mut runs).await.by, "second");
    tokio::time::timeout(EVENTUALLY, driving)
        .await
        .expect("the stale run stopped")
        .unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "its operation dropped");
    second.shutdown().await;
}

/// A cancel asked while nobody ran a task ends it `cancelled` at its
/// claim, without running it; an operation that panics fails its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_cancel_ends_the_task_and_a_panic_fails_it() {
    let store = Arc::new(MemoryStore::new());
    let front = front(&store, 3).await;
    let owner = Owner::Anonymous;
    let cancelled = queue(&front, b"complete").await;
    let panicking = queue(&front, b"panic").await;
    let cancel = mcp_event_store_core::task::CancelMode::Cooperative;
    store
        .request_cancel(&cancelled.to_string(), &owner, cancel, Some("not needed"))
        .await
        .unwrap();
    let (executor, mut runs) = script("front");
    let _nothing = front.run_takeovers(executor.clone());
    let worker = runtime(&store).await;
    let (executor, mut worker_runs) = script("worker");
    let _takeovers = worker.run_takeovers(executor);
    assert_eq!(next(&mut worker_runs).await.context, b"panic");
    eventually("both ended", async || {
        let get = |id: String| {
            let store = store.clone();
            async move { store.get(&id, &owner).await.unwrap().unwrap() }
        };
        let (c, p) = (
            get(cancelled.to_string()).await,
            get(panicking.to_string()).await,
        );
        c.status == TaskStatus::Cancelled && p.status == TaskStatus::Failed
    })
    .await;
    let failed = store
        .get(&panicking.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    let error: serde_json::Value =
        serde_json::from_slice(failed.outcome.as_deref().unwrap()).expect("a JSON-RPC error");
    assert_eq!(error["code"], -32603);
    assert!(
        runs.try_recv().is_err(),
        "a front end that hands off claims nothing"
    );
    assert!(
        worker_runs.try_recv().is_err(),
        "the cancelled task never ran"
    );
    worker.shutdown().await;
    front.shutdown().await;
}

/// An operation that asks for input parks its task, given back; once the
/// client answers, an instance claims it and runs it again with the
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_gives_the_task_back_until_answered() {
    let store = Arc::new(MemoryStore::new());
    let runtime = runtime(&store).await;
    let (executor, mut runs) = script("one");
    let _takeovers = runtime.run_takeovers(executor.clone());
    let owner = Owner::principal(b"alice").unwrap();
    let task = runtime.for_takeover(NewTask::new(&owner, runtime.instance()));
    let (id, _, run) = runtime.create(task.context(b"ask")).await.unwrap();
    let asked = executor.run(run.clone());
    run.drive(asked).await;
    assert_eq!(next(&mut runs).await.attempt, 1);
    let parked = store.get(&id.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(parked.status, TaskStatus::InputRequired);
    assert_eq!(parked.message.as_deref(), Some("waiting"));
    assert!(parked.takeover.as_ref().unwrap().released);
    store
        .answer(&id.to_string(), &owner, &[("k", b"\"yes\"")])
        .await
        .unwrap();
    let again = next(&mut runs).await;
    assert_eq!(again.attempt, 1, "a run given back counts no attempt");
    eventually("completed once answered", async || {
        store
            .get(&id.to_string(), &owner)
            .await
            .unwrap()
            .is_some_and(|t| t.status == TaskStatus::Completed)
    })
    .await;
    runtime.shutdown().await;
}

/// At most `max_running` claimed tasks run at once; the rest wait for a
/// permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimed_runs_are_bounded() {
    let store = Arc::new(MemoryStore::new());
    let front = front(&store, 3).await;
    for _ in 0..5 {
        queue(&front, b"hang").await;
    }
    let worker = Runtime::builder(store.clone())
        .lease(LEASE)
        .claim_every(Duration::from_millis(20))
        .max_running(2)
        .start()
        .await
        .unwrap();
    let (executor, mut runs) = script("worker");
    let _takeovers = worker.run_takeovers(executor);
    next(&mut runs).await;
    next(&mut runs).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(runs.try_recv().is_err(), "a third ran beside two");
    worker.shutdown().await;
    front.shutdown().await;
}

/// `claim_for` hands back the task asked for and runs the rest it claimed
/// with it; an outcome over the store's limit fails the task instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_for_returns_its_task_and_runs_the_others() {
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().max_payload_bytes(200),
    ));
    let front = front(&store, 3).await;
    let owner = Owner::Anonymous;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(queue(&front, b"complete").await);
    }
    let resumer = runtime(&store).await;
    assert!(
        resumer.claim_for(&ids[0].digest()).await.unwrap().is_none(),
        "no executor: nothing claimed"
    );
    let (executor, mut runs) = script("resumer");
    let _takeovers = resumer.run_takeovers(executor);
    let run = resumer
        .claim_for(&ids[0].digest())
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!(run.digest(), ids[0].digest());
    for _ in 0..2 {
        let other = next(&mut runs).await;
        assert_eq!(
            (other.by, other.attempt),
            ("resumer", 1),
            "the others run through the executor"
        );
    }
    run.drive(async { Outcome::Completed(vec![b'x'; 300]) })
        .await;
    let too_large = store
        .get(&ids[0].to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(too_large.status, TaskStatus::Failed);
    let error: serde_json::Value =
        serde_json::from_slice(too_large.outcome.as_deref().unwrap()).unwrap();
    assert!(
        error["message"].as_str().unwrap().contains("limit"),
        "{error}"
    );
    assert_eq!(internal_error("x")[..2], br#"{""#[..]);
    resumer.shutdown().await;
    front.shutdown().await;
}

/// Dropping a runner's handle stops its runs and gives their tasks back:
/// another runtime claims them at once, on the same attempt, while the
/// first runtime (and its lease) lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_runner_gives_its_tasks_back() {
    let store = Arc::new(MemoryStore::new());
    let front = front(&store, 3).await;
    let id = queue(&front, b"hang").await;
    let first = runtime(&store).await;
    let (executor, mut runs) = script("first");
    let takeovers = first.run_takeovers(executor.clone());
    assert_eq!(next(&mut runs).await.by, "first");
    drop(takeovers);
    assert!(!first.runs_takeovers());
    eventually("the stopped run's operation dropped", async || {
        executor.dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    let (second, _takeovers) = takes_over_on_the_first_attempt(&store, "second").await;
    assert_eq!(read(&store, &id).await.status, TaskStatus::Working);
    second.shutdown().await;
    first.shutdown().await;
    front.shutdown().await;
}

/// A graceful shutdown gives the tasks it runs back before its lease ends:
/// another runtime runs them on the same attempt, so a task on its last
/// attempt still runs rather than reading "server instance lost".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_gives_its_tasks_back_before_its_lease_ends() {
    let store = Arc::new(MemoryStore::new());
    let front = front(&store, 1).await;
    let id = queue(&front, b"hang").await;
    let leaving = runtime(&store).await;
    let (executor, mut runs) = script("leaving");
    let _takeovers = leaving.run_takeovers(executor);
    assert_eq!(next(&mut runs).await.attempt, 1);
    leaving.shutdown().await;
    let (staying, _takeovers) = takes_over_on_the_first_attempt(&store, "staying").await;
    assert_eq!(read(&store, &id).await.status, TaskStatus::Working);
    staying.shutdown().await;
    front.shutdown().await;
}

/// A second runner replaces the first; dropping the first's handle then
/// stops nothing, dropping the second's stops the runner.
#[tokio::test]
async fn a_replaced_runner_handle_stops_nothing() {
    let store = Arc::new(MemoryStore::new());
    let runtime = runtime(&store).await;
    let first = runtime.run_takeovers(script("first").0);
    let second = runtime.run_takeovers(script("second").0);
    drop(first);
    assert!(runtime.runs_takeovers());
    drop(second);
    assert!(!runtime.runs_takeovers());
    runtime.shutdown().await;
}

/// A claimed run's duration is recorded by its outcome, and a runtime
/// asked to count the store's tasks sets the gauge of each status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_and_tasks_by_status_are_measured() {
    use mcp_event_store_conformance::events::{install_test_recorder, recorded_metric};
    use mcp_event_store_core::observe::names::{TASK_RUN_DURATION_SECONDS, TASKS};
    install_test_recorder();
    let runs_before = recorded_metric(TASK_RUN_DURATION_SECONDS, &[("outcome", "completed")]);
    let store = Arc::new(MemoryStore::new());
    let front = front(&store, 3).await;
    let id = queue(&front, b"count").await;
    let worker = Runtime::builder(store.clone())
        .lease(LEASE)
        .claim_every(Duration::from_millis(20))
        .count_tasks_every(Some(Duration::from_millis(20)))
        .start()
        .await
        .unwrap();
    let (executor, mut runs) = script("worker");
    let _takeovers = worker.run_takeovers(executor);
    next(&mut runs).await;
    eventually("the task completes", async || {
        read(&store, &id).await.status == mcp_event_store_core::task::TaskStatus::Completed
    })
    .await;
    eventually("the run is measured", async || {
        recorded_metric(TASK_RUN_DURATION_SECONDS, &[("outcome", "completed")]) > runs_before
    })
    .await;
    eventually("the completed task is counted", async || {
        recorded_metric(TASKS, &[("status", "completed")]) >= 1.0
    })
    .await;
    worker.shutdown().await;
    front.shutdown().await;
}
