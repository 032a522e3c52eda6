//! T16 to T19: tasks that outlive their process: claims, fencing, bounded
//! runs, checkpoints and queued tasks.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::events::test_options;
use mcp_event_store_core::Error;
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, EXPIRED_ERROR, Finish, INSTANCE_LOST_ERROR, InstanceId,
    MAX_CHECKPOINT_BYTES, NewTask, RuntimeStore, Takeover, TaskDigest, TaskId, TaskStatus,
    TaskStore, Worker, WorkerChange,
};

use super::TaskHarness;
use super::support::*;

/// The lease the takeover cases give an instance that is to lapse.
const LEASE: Duration = Duration::from_secs(30);

/// A new instance on `store`, alive for `lease`.
async fn instance<S: RuntimeStore>(store: &S, lease: Duration) -> InstanceId {
    let id = InstanceId::generate().unwrap();
    assert!(store.heartbeat(id, lease).await.unwrap());
    id
}

/// A task that may be taken over (`max_attempts` runs), created and run
/// by a fresh instance alive for [`LEASE`]: its id, text and creator.
async fn takeover_task<S: RuntimeStore>(
    f: &Fixture<S>,
    max_attempts: u32,
) -> (TaskId, String, InstanceId) {
    let creator = instance(&f.store, LEASE).await;
    let (task, id) = f
        .create_with(
            NewTask::new(&f.owner, creator)
                .context(b"{\"tool\":\"count\"}")
                .takeover(max_attempts),
        )
        .await;
    (task, id, creator)
}

/// The one claim `by` makes for the task `task` (a case with no other
/// waiting task).
async fn claim_one<S: RuntimeStore>(store: &S, by: InstanceId, task: &TaskId) -> Claimed {
    let mut claimed = store.claim(by, 16).await.unwrap();
    assert_eq!(claimed.len(), 1, "one task waits: {claimed:?}");
    let claim = claimed.pop().unwrap();
    assert_eq!(claim.task, task.digest());
    assert_eq!(claim.worker.instance, by);
    claim
}

/// The task's takeover state as `get` shows it.
async fn takeover_of<S: RuntimeStore>(f: &Fixture<S>, id: &str) -> Takeover {
    f.get(id)
        .await
        .takeover
        .expect("the task may be taken over")
}

/// T16, T17, T9: of 32 live instances on several handles racing to claim
/// the tasks of an instance that lapsed, each task is claimed exactly
/// once, under epoch 2, counting a second run; the claims are seen on
/// every handle, and nothing is left to claim.
pub async fn exactly_one_of_racing_instances_claims_a_task<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let mut handles = vec![];
    for _ in 0..4 {
        handles.push(Arc::new(h.open(test_options(&f.clock)).await));
    }
    let gone = instance(&f.store, LEASE).await;
    let mut tasks = HashSet::new();
    for _ in 0..3 {
        let (task, _) = f
            .create_with(NewTask::new(&f.owner, gone).takeover(3))
            .await;
        tasks.insert(task.digest());
    }
    let (_, plain) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let mut racers = vec![];
    for n in 0..32 {
        racers.push(instance(&*handles[n % handles.len()], DAY).await);
    }
    f.clock.advance(LEASE);
    let mut claims = tokio::task::JoinSet::new();
    for (n, racer) in racers.iter().copied().enumerate() {
        let store = handles[n % handles.len()].clone();
        claims.spawn(async move { store.claim(racer, 16).await.unwrap() });
    }
    let mut claimed = vec![];
    while let Some(won) = claims.join_next().await {
        claimed.extend(won.unwrap());
    }
    let won: HashSet<TaskDigest> = claimed.iter().map(|c| c.task).collect();
    assert_eq!(
        claimed.len(),
        3,
        "each task claimed exactly once: {claimed:?}"
    );
    assert_eq!(won, tasks);
    for claim in &claimed {
        assert!(racers.contains(&claim.worker.instance));
        assert_eq!(claim.worker.epoch, 2);
        let takeover = claim.view.record.takeover.clone().unwrap();
        assert_eq!((takeover.attempt(), takeover.epoch), (2, 2));
        assert!(!takeover.released);
        assert_eq!(claim.view.record.status, TaskStatus::Working);
        assert_eq!(claim.view.owner, f.owner);
        for handle in &handles {
            let seen = handle.view_claimed(&claim.task).await.unwrap().unwrap();
            assert_eq!(seen.record.takeover, Some(takeover.clone()));
        }
    }
    assert_eq!(
        f.get(&plain).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR),
        "a task that dies with its instance is not taken over"
    );
    assert!(f.store.claim(racers[0], 16).await.unwrap().is_empty());
    for handle in handles {
        match Arc::try_unwrap(handle) {
            Ok(handle) => h.close(handle).await,
            Err(_) => panic!("a racer kept a handle"),
        }
    }
    f.close(h).await;
}

/// T16, T17: a claim that runs while tasks are being created never loses
/// one. Two instances claim over and over on handles of their own while
/// another creates tasks that may be taken over; once the creator lapses,
/// every one of its tasks is claimed, each once. (A store that indexes
/// the tasks to claim apart from the tasks must not let a claim that
/// reads the index before a task is written drop the task from it.)
pub async fn a_claim_racing_creates_loses_no_task<H: TaskHarness>(h: &H) {
    const TASKS: usize = 100;
    let f = fixture(h).await;
    let creator = instance(&f.store, LEASE).await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Barrier::new(3));
    let mut racers = tokio::task::JoinSet::new();
    let mut handles = vec![];
    for _ in 0..2 {
        let handle = Arc::new(h.open(test_options(&f.clock)).await);
        let racer = instance(&*handle, DAY).await;
        let (store, stop, started) = (handle.clone(), stop.clone(), started.clone());
        racers.spawn(async move {
            let mut first = Some(started);
            while !stop.load(Ordering::Relaxed) {
                let claimed = store.claim(racer, 16).await.unwrap();
                assert!(claimed.is_empty(), "nothing lapsed yet: {claimed:?}");
                if let Some(started) = first.take() {
                    started.wait().await;
                }
                tokio::task::yield_now().await;
            }
        });
        handles.push(handle);
    }
    // Both racers have claimed once; from here on they claim between (and,
    // where the store awaits, during) the creates.
    started.wait().await;
    let mut tasks = HashSet::new();
    for _ in 0..TASKS {
        let (task, _) = f
            .create_with(NewTask::new(&f.owner, creator).takeover(2))
            .await;
        tasks.insert(task.digest());
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = racers.join_next().await {
        done.unwrap();
    }
    f.clock.advance(LEASE);
    let taker = instance(&f.store, DAY).await;
    let mut claimed = HashSet::new();
    loop {
        let batch = f.store.claim(taker, 64).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for claim in batch {
            assert!(claimed.insert(claim.task), "claimed twice: {claim:?}");
        }
    }
    let lost = tasks.difference(&claimed).count();
    assert_eq!(
        lost, 0,
        "{lost} of {TASKS} tasks created while claims ran were never claimed"
    );
    assert_eq!(claimed, tasks);
    for handle in handles {
        match Arc::try_unwrap(handle) {
            Ok(handle) => h.close(handle).await,
            Err(_) => panic!("a racer kept a handle"),
        }
    }
    f.close(h).await;
}

/// T18: every worker write names its claim. The creator writes under epoch
/// 1 while it lives; once it lapses its writes are refused (`Fenced`),
/// before and after another instance claims the task; the claimant's
/// writes under an older epoch are refused too, and under its claim go
/// through. A refused write changes nothing. Checkpoint and release are
/// refused (`NoTakeover`) on a task that dies with its instance.
pub async fn a_stale_claim_is_fenced<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, creator) = takeover_task(&f, 3).await;
    let first = Worker::first(creator);
    let digest = task.digest();
    let message = WorkerChange::SetMessage(Some("run 1"));
    assert!(is_changed(
        &f.store
            .apply_claimed(&digest, first, message)
            .await
            .unwrap()
    ));
    assert!(is_changed(
        &f.store.apply(&task, creator, message).await.unwrap()
    ));
    let other = instance(&f.store, DAY).await;
    assert_eq!(
        f.store
            .apply_claimed(&digest, Worker::first(other), message)
            .await
            .unwrap(),
        Applied::Fenced,
        "another instance wrote under the creator's epoch"
    );
    f.clock.advance(LEASE);
    let before = f.get(&id).await;
    let late = WorkerChange::Finish(Finish::Completed(b"{\"late\":1}"));
    assert_eq!(
        f.store.apply_claimed(&digest, first, late).await.unwrap(),
        Applied::Fenced,
        "a lapsed instance wrote to a task that may be taken over"
    );
    assert_eq!(f.get(&id).await, before);
    let claim = claim_one(&f.store, other, &task).await;
    for stale in [first, Worker::first(other)] {
        assert_eq!(
            f.store.apply_claimed(&digest, stale, late).await.unwrap(),
            Applied::Fenced
        );
    }
    assert_eq!(f.get(&id).await, claim.view.record);
    let done = WorkerChange::Finish(Finish::Completed(b"{\"run\":2}"));
    assert!(is_changed(
        &f.store
            .apply_claimed(&digest, claim.worker, done)
            .await
            .unwrap()
    ));
    let completed = f.get(&id).await;
    assert_eq!(completed.status, TaskStatus::Completed);
    assert_eq!(completed.outcome.as_deref(), Some(&b"{\"run\":2}"[..]));
    assert_eq!(
        f.store.apply_claimed(&digest, first, late).await.unwrap(),
        Applied::AlreadyTerminal(TaskStatus::Completed)
    );
    let (plain, _) = f.create().await;
    for change in [WorkerChange::Checkpoint(b"1"), WorkerChange::Release] {
        assert_eq!(f.apply(&plain, change).await, Applied::NoTakeover);
    }
    f.close(h).await;
}

/// T16: runs are bounded. A task of 2 runs whose instance lapses reads
/// `working` while it waits, is claimed for its second run, and when that
/// run's instance lapses too it reads `failed` ("server instance lost"),
/// is claimed by nobody, and the purge ends it as orphaned. A task of one
/// run is not taken over at all.
pub async fn runs_are_bounded<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, _) = takeover_task(&f, 2).await;
    let (_, single, _) = takeover_task(&f, 1).await;
    f.clock.advance(LEASE);
    let waiting = f.get(&id).await;
    assert_eq!(waiting.status, TaskStatus::Working, "it waits for a claim");
    assert_eq!(
        f.get(&single).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR)
    );
    let second = instance(&f.store, LEASE).await;
    let claim = claim_one(&f.store, second, &task).await;
    assert_eq!(claim.view.record.takeover.as_ref().unwrap().attempt(), 2);
    f.clock.advance(LEASE);
    let lost = f.get(&id).await;
    assert_eq!(lost.status, TaskStatus::Failed);
    assert_eq!(lost.outcome.as_deref(), Some(INSTANCE_LOST_ERROR));
    let third = instance(&f.store, DAY).await;
    assert!(f.store.claim(third, 16).await.unwrap().is_empty());
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().orphaned, 2);
    assert_eq!(f.get(&id).await, lost);
    assert!(
        matches!(
            f.store
                .create(NewTask::new(&f.owner, third).takeover(0))
                .await,
            Err(Error::Config(_))
        ),
        "a task with no run was created"
    );
    f.close(h).await;
}

/// T19, T13, T14: the newest checkpoint, byte for byte, survives a
/// takeover with the context, every untaken answer and the owner; a
/// checkpoint accepts exactly [`MAX_CHECKPOINT_BYTES`] and refuses one
/// byte more, changing nothing. A watch by digest sees the claim.
pub async fn a_checkpoint_survives_a_takeover<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, creator) = takeover_task(&f, 3).await;
    let run1 = Worker::first(creator);
    let digest = task.digest();
    let write = |change| f.store.apply_claimed(&digest, run1, change);
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(b"step 3")).await.unwrap()
    ));
    let newest: &[u8] = b"step 4\0\xff\xfe";
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(newest)).await.unwrap()
    ));
    let full = vec![b'c'; MAX_CHECKPOINT_BYTES];
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(&full)).await.unwrap()
    ));
    assert!(is_changed(
        &write(WorkerChange::Checkpoint(newest)).await.unwrap()
    ));
    let before = f.get(&id).await;
    let over = vec![b'c'; MAX_CHECKPOINT_BYTES + 1];
    assert_too_large(write(WorkerChange::Checkpoint(&over)).await, "checkpoint");
    assert_eq!(f.get(&id).await, before);
    let request = WorkerChange::RequestInput {
        key: "name",
        request: b"{\"q\":\"name?\"}",
    };
    assert!(is_changed(&write(request).await.unwrap()));
    f.answer(&id, &[("name", b"\"ada\"")]).await;
    f.clock.advance(LEASE);
    let other = f
        .store
        .watch_claimed(&digest, 0, LONG)
        .await
        .unwrap()
        .unwrap();
    let rev = other.rev;
    let next = instance(&f.store, DAY).await;
    let claim = claim_one(&f.store, next, &task).await;
    let takeover = claim.view.record.takeover.clone().unwrap();
    assert_eq!(takeover.checkpoint.as_deref(), Some(newest));
    assert_eq!(
        claim.view.record.context.as_deref(),
        Some(&b"{\"tool\":\"count\"}"[..])
    );
    assert_eq!(claim.view.answers.len(), 1);
    assert_eq!(claim.view.answers[0].0, "name");
    assert_eq!(&claim.view.answers[0].1[..], b"\"ada\"");
    assert_eq!(claim.view.owner, f.owner);
    let woken = f
        .store
        .watch_claimed(&digest, rev, LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(woken.rev > rev);
    assert_eq!(woken.takeover, Some(takeover));
    assert_eq!(
        f.store.view_claimed(&digest).await.unwrap().unwrap(),
        claim.view
    );
    f.close(h).await;
}

/// T17, T6: cancel across a takeover behaves as on one instance. A
/// cooperative cancel asked while nobody runs the task is claimed with
/// the task, and the claimant ends it `cancelled`; an immediate cancel
/// while nobody runs it ends it at once, and nobody claims it.
pub async fn cancel_requested_during_a_takeover_is_honoured<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, _) = takeover_task(&f, 3).await;
    let (_, now, _) = takeover_task(&f, 3).await;
    f.clock.advance(LEASE);
    assert!(
        f.cancel(&id, CancelMode::Cooperative)
            .await
            .cancel_requested
    );
    let ended = f.cancel(&now, CancelMode::Immediate).await;
    assert_eq!(ended.status, TaskStatus::Cancelled);
    let next = instance(&f.store, DAY).await;
    let claim = claim_one(&f.store, next, &task).await;
    assert!(claim.view.record.cancel_requested);
    let cancel = WorkerChange::Finish(Finish::Cancelled);
    assert!(is_changed(
        &f.store
            .apply_claimed(&claim.task, claim.worker, cancel)
            .await
            .unwrap()
    ));
    assert_eq!(f.get(&id).await.status, TaskStatus::Cancelled);
    assert_eq!(f.get(&now).await, ended);
    assert!(f.store.claim(next, 16).await.unwrap().is_empty());
    f.close(h).await;
}

/// T17, T5: a worker that waits for input releases the task, and holds
/// nothing: no claim takes it while its input is outstanding, the
/// releaser's writes are refused, and a lapse of the releaser changes
/// nothing. Answered, it is claimed (a release counts no run) with the
/// answer, which the claimant takes; the key stays spent.
pub async fn an_input_answered_while_nobody_holds_the_task_resumes_it<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (task, id, creator) = takeover_task(&f, 3).await;
    let run1 = Worker::first(creator);
    let digest = task.digest();
    let request = WorkerChange::RequestInput {
        key: "confirm",
        request: b"{\"q\":\"sure?\"}",
    };
    assert!(is_changed(
        &f.store.apply_claimed(&digest, run1, request).await.unwrap()
    ));
    assert!(is_changed(
        &f.store
            .apply_claimed(&digest, run1, WorkerChange::Release)
            .await
            .unwrap()
    ));
    assert!(takeover_of(&f, &id).await.released);
    let waiter = instance(&f.store, DAY).await;
    assert!(f.store.claim(waiter, 16).await.unwrap().is_empty());
    assert_eq!(
        f.store
            .apply_claimed(&digest, run1, WorkerChange::SetMessage(Some("x")))
            .await
            .unwrap(),
        Applied::Fenced,
        "a worker wrote to the task it released"
    );
    f.clock.advance(LEASE);
    let parked = f.get(&id).await;
    assert_eq!(
        parked.status,
        TaskStatus::InputRequired,
        "a release outlives its worker"
    );
    let answered = f.answer(&id, &[("confirm", b"true")]).await;
    assert_eq!(answered.status, TaskStatus::Working);
    let claim = claim_one(&f.store, waiter, &task).await;
    let takeover = claim.view.record.takeover.clone().unwrap();
    assert_eq!((takeover.attempt(), takeover.epoch), (1, 2));
    assert_eq!(claim.view.answers.len(), 1);
    let take = WorkerChange::TakeAnswer { key: "confirm" };
    match f
        .store
        .apply_claimed(&digest, claim.worker, take)
        .await
        .unwrap()
    {
        Applied::Changed {
            answer: Some(answer),
            ..
        } => assert_eq!(&answer[..], b"true"),
        other => panic!("take: {other:?}"),
    }
    let again = WorkerChange::RequestInput {
        key: "confirm",
        request: b"{}",
    };
    assert_eq!(
        f.store
            .apply_claimed(&digest, claim.worker, again)
            .await
            .unwrap(),
        Applied::KeySpent
    );
    f.close(h).await;
}

/// T17: a queued task waits, `working`, for a worker: its creator does not
/// hold it (its writes are refused) and its creator's lapse changes
/// nothing; a worker claims it without counting a run and finishes it.
pub async fn a_queued_task_waits_for_a_claim<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let server = instance(&f.store, LEASE).await;
    let (task, id) = f.create_with(NewTask::new(&f.owner, server).queued()).await;
    let takeover = takeover_of(&f, &id).await;
    assert!(takeover.released);
    assert_eq!(
        takeover.max_attempts,
        mcp_event_store_core::task::DEFAULT_MAX_ATTEMPTS
    );
    assert_eq!(
        f.store
            .apply(&task, server, WorkerChange::SetMessage(Some("x")))
            .await
            .unwrap(),
        Applied::Fenced
    );
    f.clock.advance(LEASE + LEASE);
    assert_eq!(f.get(&id).await.status, TaskStatus::Working);
    assert_eq!(f.store.purge_expired_tasks().await.unwrap().orphaned, 0);
    let worker = instance(&f.store, DAY).await;
    let claim = claim_one(&f.store, worker, &task).await;
    let takeover = claim.view.record.takeover.clone().unwrap();
    assert_eq!((takeover.attempt(), takeover.epoch), (1, 2));
    let done = WorkerChange::Finish(Finish::Completed(b"{}"));
    assert!(is_changed(
        &f.store
            .apply_claimed(&claim.task, claim.worker, done)
            .await
            .unwrap()
    ));
    assert_eq!(f.get(&id).await.status, TaskStatus::Completed);
    f.close(h).await;
}

/// T17: a claim takes only tasks that wait for a runtime, and only for a
/// live instance: not a task whose instance lives, nor one that ended
/// (completed, expired), nor one that dies with its instance; a lapsed or
/// unknown instance's claim fails with [`Error::InstanceLapsed`] and
/// changes nothing.
pub async fn only_waiting_tasks_are_claimed_and_only_by_the_living<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, held, _) = {
        let (task, id) = f
            .create_with(NewTask::new(&f.owner, f.me).takeover(3))
            .await;
        (task, id, f.me)
    };
    let (done, done_id, creator) = takeover_task(&f, 3).await;
    f.store
        .apply_claimed(
            &done.digest(),
            Worker::first(creator),
            WorkerChange::Finish(Finish::Completed(b"{}")),
        )
        .await
        .unwrap();
    let (_, expiring, _) = {
        let gone = instance(&f.store, LEASE).await;
        let (task, id) = f
            .create_with(
                NewTask::new(&f.owner, gone)
                    .ttl(Duration::from_secs(20))
                    .takeover(3),
            )
            .await;
        (task, id, gone)
    };
    let gone = instance(&f.store, LEASE).await;
    let (_, plain) = f.create_with(NewTask::new(&f.owner, gone)).await;
    let lapsing = instance(&f.store, LEASE).await;
    f.clock.advance(LEASE);
    // Compared as sets: a dump need not list rows in the same order twice
    // (a Redis Cluster's SCAN does not).
    let rows = || async {
        h.raw_rows().await.map(|mut rows| {
            rows.sort();
            rows
        })
    };
    let before = rows().await;
    for nobody in [lapsing, InstanceId::generate().unwrap()] {
        match f.store.claim(nobody, 16).await {
            Err(Error::InstanceLapsed { instance }) => assert_eq!(instance, nobody.to_string()),
            other => panic!("a claim by a lapsed instance: {other:?}"),
        }
    }
    assert_eq!(rows().await, before);
    let live = instance(&f.store, DAY).await;
    assert!(f.store.claim(live, 16).await.unwrap().is_empty());
    assert_eq!(f.get(&held).await.status, TaskStatus::Working);
    assert_eq!(f.get(&done_id).await.status, TaskStatus::Completed);
    assert_eq!(
        f.get(&expiring).await.outcome.as_deref(),
        Some(EXPIRED_ERROR)
    );
    assert_eq!(
        f.get(&plain).await.outcome.as_deref(),
        Some(INSTANCE_LOST_ERROR)
    );
    f.close(h).await;
}

/// T17: a claim takes at most its limit, and a claim of zero takes none.
pub async fn a_claim_takes_at_most_its_limit<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    for _ in 0..5 {
        f.create_with(NewTask::new(&f.owner, f.me).queued()).await;
    }
    let worker = instance(&f.store, DAY).await;
    assert!(f.store.claim(worker, 0).await.unwrap().is_empty());
    assert_eq!(f.store.claim(worker, 2).await.unwrap().len(), 2);
    assert_eq!(f.store.claim(worker, 10).await.unwrap().len(), 3);
    assert!(f.store.claim(worker, 10).await.unwrap().is_empty());
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_takeover {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            exactly_one_of_racing_instances_claims_a_task,
            a_claim_racing_creates_loses_no_task,
            a_stale_claim_is_fenced,
            runs_are_bounded,
            a_checkpoint_survives_a_takeover,
            cancel_requested_during_a_takeover_is_honoured,
            an_input_answered_while_nobody_holds_the_task_resumes_it,
            a_queued_task_waits_for_a_claim,
            only_waiting_tasks_are_claimed_and_only_by_the_living,
            a_claim_takes_at_most_its_limit,
        );
    };
}
