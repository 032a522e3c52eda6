//! T1, T12 on a persistent store: tasks survive a reopen and the SIGKILL of
//! the process that wrote them with everything acknowledged, and a task
//! format newer than this release's is refused without being touched.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use mcp_event_store_core::task::{
    Applied, CancelMode, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskStatus, TaskStore,
    WorkerChange,
};
use mcp_event_store_core::{Error, StoreOptions};

use super::support::*;
use super::{PersistentTaskHarness, TaskHarness};
use crate::events::{Harness, PersistentHarness, append, replay_data, test_clock, test_options};

/// T1, T12: every kind of state a task holds (outstanding inputs, an
/// answer, an outcome, a context, a checkpoint and its claim) survives
/// closing every handle and opening a new one, and the new handle's worker
/// finishes the task exactly once.
pub async fn tasks_survive_a_reopen<H: PersistentTaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (asking, asking_id) = f
        .create_with(NewTask::new(&f.owner, f.me).context(b"{\"tool\":\"ask\"}"))
        .await;
    f.request(&asking, "q").await;
    f.request(&asking, "r").await;
    f.answer(&asking_id, &[("r", b"{\"yes\":true}")]).await;
    let (done, done_id) = f.create().await;
    let finish = WorkerChange::Finish(Finish::Completed(b"{\"content\":[]}"));
    assert!(is_changed(&f.apply(&done, finish).await));
    let (takeover, takeover_id) = f
        .create_with(NewTask::new(&f.owner, f.me).takeover(3))
        .await;
    assert!(is_changed(
        &f.apply(&takeover, WorkerChange::Checkpoint(b"step 7"))
            .await
    ));
    let (_, cancelled_id) = f.create().await;
    let asked = f
        .cancel_because(&cancelled_id, CancelMode::Cooperative, Some("kept: T20"))
        .await;
    assert_eq!(asked.cancel_reason.as_deref(), Some("kept: T20"));
    let before = [
        f.get(&asking_id).await,
        f.get(&done_id).await,
        f.get(&takeover_id).await,
        asked,
    ];
    let (clock, me, owner) = (f.clock.clone(), f.me, f.owner);
    f.close(h).await;

    let store = TaskHarness::open(h, test_options(&clock)).await;
    for (id, seen) in [&asking_id, &done_id, &takeover_id, &cancelled_id]
        .into_iter()
        .zip(&before)
    {
        let again = store.get(id, &owner).await.unwrap();
        assert_eq!(again.as_ref(), Some(seen), "task {id} after the reopen");
    }
    assert_eq!(
        before[0].outstanding.len(),
        1,
        "one input still outstanding"
    );
    assert_eq!(
        before[0].context.as_deref(),
        Some(&b"{\"tool\":\"ask\"}"[..])
    );
    let view = store
        .view_claimed(&asking.digest())
        .await
        .unwrap()
        .expect("the runtime's view of the task");
    assert_eq!(
        view.answers,
        vec![("r".to_owned(), Bytes::from_static(b"{\"yes\":true}"))],
        "the answer after the reopen"
    );
    assert_eq!(
        before[2]
            .takeover
            .as_ref()
            .and_then(|t| t.checkpoint.as_deref()),
        Some(&b"step 7"[..])
    );
    assert_eq!(
        store.apply(&done, me, finish).await.unwrap(),
        Applied::AlreadyTerminal(TaskStatus::Completed)
    );
    let finish = WorkerChange::Finish(Finish::Completed(b"{}"));
    assert!(is_changed(&store.apply(&asking, me, finish).await.unwrap()));
    assert_eq!(
        store.apply(&asking, me, finish).await.unwrap(),
        Applied::AlreadyTerminal(TaskStatus::Completed)
    );
    TaskHarness::close(h, store).await;
}

/// T12: storage whose tasks a newer release wrote is refused with
/// [`Error::IncompatibleFormat`] naming that format, when it is opened or,
/// for a store that marks each task, when the task is read or written; and
/// the refusal changes nothing: with this release's format back, the events
/// and the task read as before.
pub async fn a_newer_task_format_is_refused_and_changes_nothing<H: PersistentTaskHarness>(h: &H) {
    let events = Harness::open(h, test_options(&test_clock())).await;
    let first = append(&events, "s", b"e1").await;
    append(&events, "s", b"e2").await;
    Harness::close(h, events).await;
    let f = fixture(h).await;
    let (task, id) = f.create().await;
    f.request(&task, "k").await;
    let before = f.get(&id).await;
    let (me, owner) = (f.me, f.owner);
    f.close(h).await;

    let current = h.task_format_version();
    let newer = current + 1;
    h.set_task_format_version(newer).await;
    let refused = |what: &str, e: Error| match e {
        Error::IncompatibleFormat(message) => assert!(
            message.contains(&newer.to_string()) && message.contains("task"),
            "{what}: the refusal should name task format {newer}: {message}"
        ),
        other => {
            panic!("{what} under task format {newer}: expected IncompatibleFormat, got {other}")
        }
    };
    match PersistentHarness::try_open(h, test_options(&test_clock())).await {
        Err(e) => refused("open", e),
        Ok(opened) => {
            // A store that marks each task opens, and refuses the task.
            Harness::close(h, opened).await;
            let store = TaskHarness::open(h, test_options(&test_clock())).await;
            refused("get", store.get(&id, &owner).await.unwrap_err());
            let cancel = WorkerChange::Finish(Finish::Cancelled);
            refused("apply", store.apply(&task, me, cancel).await.unwrap_err());
            refused(
                "answer",
                store.answer(&id, &owner, &[("k", b"1")]).await.unwrap_err(),
            );
            TaskHarness::close(h, store).await;
        }
    }

    h.set_task_format_version(current).await;
    let store = TaskHarness::open(h, test_options(&test_clock())).await;
    assert_eq!(store.get(&id, &owner).await.unwrap(), Some(before));
    TaskHarness::close(h, store).await;
    let events = Harness::open(h, test_options(&test_clock())).await;
    assert_eq!(replay_data(&events, &first).await, vec![b"e2".to_vec()]);
    Harness::close(h, events).await;
}

/// The environment variable that tells [`task_sigkill_child`] where the
/// storage is ([`PersistentHarness::locator`]).
pub const TASK_CRASH_LOCATOR_ENV: &str = "MCP_EVENT_STORE_TASK_CRASH_LOCATOR";
/// Tasks the parent waits for before the kill.
const TASKS_BEFORE_KILL: usize = 100;
/// How long the child may take to acknowledge them.
const TASK_CRASH_DEADLINE: Duration = Duration::from_secs(120);

/// The owner of the crash child's tasks.
fn crash_owner() -> Owner {
    Owner::principal(b"crash").unwrap()
}

/// T1, T12: a child process creates tasks under the default durability
/// (each asks for input; every other one then completes with a result),
/// printing each once every step is acknowledged; it is killed with SIGKILL
/// mid-flight. Reopened here, every acknowledged task is there, with its
/// inputs or its result.
///
/// `module` is the `module_path!()` of the test, so the child (this test
/// binary running [`task_sigkill_child`] alone) can be named.
pub async fn acknowledged_tasks_survive_sigkill<H: PersistentTaskHarness>(h: &H, module: &str) {
    let child_test = crate::testkit::test_path(module, "task_sigkill_child");
    let locator = h.locator();
    let mut child =
        crate::testkit::ChildLines::spawn(&child_test, &[(TASK_CRASH_LOCATOR_ENV, &locator)])
            .expect("start the child");
    let parse = |line: &str| -> Option<(String, u64)> {
        // libtest may print "test <name> ... " before the first line.
        let rest = &line[line.find("TASK ")? + 5..];
        let (id, n) = rest.trim_end().split_once(' ')?;
        Some((id.to_owned(), n.parse().ok()?))
    };
    let mut acked = Vec::new();
    let deadline = tokio::time::Instant::now() + TASK_CRASH_DEADLINE;
    while acked.len() < TASKS_BEFORE_KILL {
        match child.next_line(deadline).await {
            Ok(Some(line)) => acked.extend(parse(&line)),
            Ok(None) => panic!(
                "the child {child_test} ended after {} tasks (run it alone to see why)",
                acked.len()
            ),
            Err(_) => panic!(
                "the child acknowledged {} tasks in {TASK_CRASH_DEADLINE:?}",
                acked.len()
            ),
        }
    }
    // What it printed before it died was acknowledged too.
    for line in child.kill().await {
        acked.extend(parse(&line));
    }

    let store = TaskHarness::open(h, StoreOptions::default()).await;
    let owner = crash_owner();
    for (id, n) in &acked {
        let task = store
            .get(id, &owner)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("acknowledged task {n} is gone"));
        let request = format!("{{\"n\":{n}}}").into_bytes();
        if n % 2 == 0 {
            assert_eq!(task.status, TaskStatus::Completed, "task {n}");
            assert_eq!(task.outcome.as_deref(), Some(&request[..]), "task {n}");
        } else {
            assert_eq!(task.status, TaskStatus::InputRequired, "task {n}");
            assert_eq!(
                task.outstanding,
                vec![(format!("k{n}"), request.into())],
                "task {n}"
            );
        }
    }
    TaskHarness::close(h, store).await;
}

/// The child of [`acknowledged_tasks_survive_sigkill`]: attaches to the
/// storage named by [`TASK_CRASH_LOCATOR_ENV`] (a harness like the one
/// `make` builds) and creates tasks until it is killed, printing
/// `TASK <id> <n>` once each is acknowledged. Run without the variable (by
/// `cargo test -- --ignored`), it has nothing to do.
pub async fn task_sigkill_child<H, F, Fut>(make: F)
where
    H: PersistentTaskHarness,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = H>,
{
    use std::io::Write;

    let Ok(locator) = std::env::var(TASK_CRASH_LOCATOR_ENV) else {
        return;
    };
    // `make` only names the harness type; the storage is the parent's.
    let _ = make;
    let harness = H::attach(&locator).await;
    let store = Arc::new(TaskHarness::open(&harness, StoreOptions::default()).await);
    let me = InstanceId::generate().unwrap();
    assert!(
        store
            .heartbeat(me, Duration::from_secs(3600))
            .await
            .unwrap()
    );
    let owner = crash_owner();
    for n in 0u64.. {
        let (id, _) = store.create(NewTask::new(&owner, me)).await.unwrap();
        let request = format!("{{\"n\":{n}}}");
        let key = format!("k{n}");
        let asked = store
            .apply(
                &id,
                me,
                WorkerChange::RequestInput {
                    key: &key,
                    request: request.as_bytes(),
                },
            )
            .await
            .unwrap();
        assert!(is_changed(&asked), "{asked:?}");
        if n % 2 == 0 {
            let done = WorkerChange::Finish(Finish::Completed(request.as_bytes()));
            let finished = store.apply(&id, me, done).await.unwrap();
            assert!(is_changed(&finished), "{finished:?}");
        }
        let mut out = std::io::stdout().lock();
        // One write per line, so a kill never leaves a whole wrong line.
        out.write_all(format!("TASK {id} {n}\n").as_bytes())
            .and_then(|()| out.flush())
            .expect("stdout");
    }
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite)
/// (its `persistent` form).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_persistent {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            tasks_survive_a_reopen,
            a_newer_task_format_is_refused_and_changes_nothing
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn acknowledged_tasks_survive_sigkill() {
            let harness = $harness.await;
            $crate::tasks::acknowledged_tasks_survive_sigkill(&harness, module_path!()).await;
            $crate::tasks::TaskHarness::teardown(harness).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "the child process of acknowledged_tasks_survive_sigkill"]
        async fn task_sigkill_child() {
            $crate::tasks::task_sigkill_child(|| $harness).await;
        }
    };
}
