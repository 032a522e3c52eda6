//! Tasks taken over across runtimes (T16 to T19): takeover of a lapsed
//! instance's run with its checkpoint and answers, fencing of the stale
//! run, cancel across a takeover, a run given back for input and resumed
//! elsewhere, hand-off to a worker.
//!
//! Every runtime here claims only when the test says so
//! ([`Runtime::claim_now`]), and its instance lapses only when the
//! store's manual clock jumps past its lease: no timing decides anything.
//! Each step of the `steps` tool waits for a permit of its runtime's gate,
//! so the test decides how far a run gets.

use std::sync::Mutex as StdMutex;

use mcp_event_store_runtime::{RuntimeBuilder, TaskCall};
use tokio::sync::{Semaphore, mpsc};

use super::*;

/// "Must happen eventually" bound; never a latency assertion.
const EVENTUALLY: Duration = Duration::from_secs(30);
/// Half the runtimes' lease: no renewal happens during a test. (The tasks'
/// ttl, rmcp's default, is much longer.)
const BEAT: Duration = Duration::from_secs(60);
/// Never, in a test.
const HOUR: Duration = Duration::from_secs(3600);

type Events = mpsc::UnboundedSender<String>;

/// Says `"<label> dropped"` when a run's future is dropped: finished, or
/// aborted because it stopped.
struct Dropped(&'static str, Events);

impl Drop for Dropped {
    fn drop(&mut self) {
        let _ = self.1.send(format!("{} dropped", self.0));
    }
}

/// The `steps` tool as runtime `label` runs it: with `{"ask": true}` it
/// first asks for `to` under the key `go`, else it takes `{"to": N}`; then
/// it counts from its last checkpoint to `to`, each step waiting for a
/// permit of `gate`, saving the step as its checkpoint and its status
/// message (`at N`). It answers who ran it, from where and on which attempt.
/// With `{"leak": true}` it first hands a clone of its context to the
/// test, as code outside the run might hold one.
fn steps(
    label: &'static str,
    gate: Arc<Semaphore>,
    events: Events,
    leaks: mpsc::UnboundedSender<DurableTaskContext>,
) -> impl Fn(DurableTaskContext, TakeoverCall) -> TaskFuture + Send + Sync + 'static {
    move |t, call| {
        let gate = gate.clone();
        let events = events.clone();
        let leaks = leaks.clone();
        Box::pin(async move {
            let _dropped = Dropped(label, events.clone());
            let _ = events.send(format!("{label} started attempt {}", t.attempt()));
            let arguments = call.arguments.unwrap_or_default();
            if arguments.get("leak") == Some(&Value::Bool(true)) {
                let _ = leaks.send(t.clone());
            }
            let to = if arguments.get("ask") == Some(&Value::Bool(true)) {
                let request: InputRequest = serde_json::from_value(json!({
                    "method": "elicitation/create",
                    "params": {
                        "message": "How far?",
                        "requestedSchema": {"type": "object", "properties": {}}
                    }
                }))
                .unwrap();
                let answer = t.request_input("go", request).await?;
                answer["content"]["to"].as_u64().unwrap()
            } else {
                arguments["to"].as_u64().unwrap()
            };
            let from: u64 = t
                .last_checkpoint()
                .map(|c| std::str::from_utf8(c).unwrap().parse().unwrap())
                .unwrap_or(0);
            for n in from + 1..=to {
                gate.acquire().await.unwrap().forget();
                let _ = events.send(format!("{label} trying {n}"));
                t.checkpoint(n.to_string()).await?;
                let _ = events.send(format!("{label} saved {n}"));
                t.set_status_message(format!("at {n}")).await?;
            }
            Ok(ok(format!(
                "{label} from {from} to {to} on attempt {}",
                t.attempt()
            )))
        })
    }
}

/// A store on a manual clock.
fn clocked() -> (Arc<ManualClock>, Arc<MemoryStore>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    (clock, store)
}

/// One instance's side of a test: its tasks, its gate, what its runs say.
struct Instance {
    tasks: DurableTasks,
    gate: Arc<Semaphore>,
    events: mpsc::UnboundedReceiver<String>,
    /// The contexts its runs handed out (`{"leak": true}`).
    leaked: mpsc::UnboundedReceiver<DurableTaskContext>,
    seen: Arc<StdMutex<Vec<String>>>,
}

impl Instance {
    /// A runtime with the `steps` tool, on a two-minute lease (renewed
    /// every 40 s, never within a test), claiming only when told (its claim
    /// rounds tick hourly).
    async fn start(store: Arc<dyn Store>, label: &'static str) -> Self {
        Self::start_with(store, label, |b| b).await
    }

    async fn start_with(
        store: Arc<dyn Store>,
        label: &'static str,
        configure: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder,
    ) -> Self {
        let gate = Arc::new(Semaphore::new(0));
        let (sender, events) = mpsc::unbounded_channel();
        let (leaks, leaked) = mpsc::unbounded_channel();
        let runtime = Runtime::builder(store)
            .lease(2 * BEAT)
            .claim_every(HOUR)
            .watch_wait(Duration::from_millis(50));
        let runtime = configure(runtime).start().await.unwrap();
        let tasks = DurableTasks::builder()
            .owner(by_client_name)
            .takeover("steps", steps(label, gate.clone(), sender, leaks))
            .build(&runtime);
        Self {
            tasks,
            gate,
            events,
            leaked,
            seen: Arc::default(),
        }
    }

    /// Waits until one of this runtime's runs says `what`.
    async fn said(&mut self, what: &str) {
        let seen = self.seen.clone();
        tokio::time::timeout(EVENTUALLY, async {
            loop {
                let event = self.events.recv().await.expect("the runtime lives");
                seen.lock().unwrap().push(event.clone());
                if event == what {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("never said {what:?}; said {:?}", self.seen.lock().unwrap()));
    }

    /// Everything its runs said so far.
    fn said_so_far(&mut self) -> Vec<String> {
        while let Ok(event) = self.events.try_recv() {
            self.seen.lock().unwrap().push(event);
        }
        self.seen.lock().unwrap().clone()
    }
}

/// Polls until the task satisfies `done`, checking every read with
/// `always`; for at most [`EVENTUALLY`].
async fn watch_until(
    client: &Client,
    id: &str,
    always: impl Fn(&DetailedTask),
    done: impl Fn(&DetailedTask) -> bool,
) -> DetailedTask {
    tokio::time::timeout(EVENTUALLY, async {
        loop {
            let task = get(client, id).await;
            always(&task);
            if done(&task) {
                return task;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("task {id} never reached the expected state"))
}

fn at(task: &DetailedTask, n: u64) -> bool {
    task.task.status_message.as_deref() == Some(&format!("at {n}"))
}

fn never_failed(task: &DetailedTask) {
    assert_ne!(task.status(), rmcp::model::TaskStatus::Failed, "{task:?}");
}

fn completed_text(task: &DetailedTask) -> String {
    let TaskPayload::Completed { result } = &task.payload else {
        panic!("expected completed, got {task:?}");
    };
    result["content"][0]["text"].as_str().unwrap().to_owned()
}

async fn answer_go(client: &Client, id: &str, to: u64) {
    let mut responses = InputResponses::new();
    responses.insert(
        "go".into(),
        json!({"action": "accept", "content": {"to": to}}),
    );
    client
        .peer()
        .update_task(UpdateTaskParams::new(id.to_owned(), responses))
        .await
        .unwrap();
}

/// A's run asks for input (and is given back), is answered, claimed again
/// by A, and saves two steps; then A's instance lapses. B claims the task:
/// its run is attempt 2, gets the answer without asking again, and counts
/// on from A's checkpoint. `tasks/get` never reads `failed` meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_runtimes_task_is_taken_over_with_its_checkpoint_and_answers() {
    let (clock, store) = clocked();
    let mut a = Instance::start(store.clone(), "A").await;
    let client = connect(&a.tasks, "alice", true).await;
    let id = call(&client, "steps", json!({"ask": true}))
        .await
        .task
        .task_id;
    a.said("A dropped").await; // given back while it waits for input
    let waiting = watch_until(&client, &id, never_failed, |t| {
        t.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await;
    assert!(matches!(waiting.payload, TaskPayload::InputRequired { .. }));
    answer_go(&client, &id, 5).await;

    a.gate.add_permits(2);
    a.tasks.runtime().claim_now().await;
    a.said("A started attempt 1").await;
    watch_until(&client, &id, never_failed, |t| at(t, 2)).await;
    a.said("A saved 2").await;

    // A stalls past its lease; B, alive, takes the task over.
    clock.advance(3 * BEAT);
    let mut b = Instance::start(store.clone(), "B").await;
    b.gate.add_permits(10);
    b.tasks.runtime().claim_now().await;
    let done = watch_until(&client, &id, never_failed, terminal).await;
    assert_eq!(completed_text(&done), "B from 2 to 5 on attempt 2");
    b.said("B dropped").await;
    assert!(
        !b.said_so_far()
            .iter()
            .any(|e| e == "B trying 1" || e == "B trying 2"),
        "B resumed after A's checkpoint: {:?}",
        b.said_so_far()
    );
    client.cancel().await.unwrap();
}

/// A's run is taken over while it is stuck: its runtime sees the newer
/// claim and stops the run there, before it writes again (its checkpoint
/// is not saved), and the task keeps B's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_run_is_stopped_once_its_task_is_claimed() {
    let (clock, store) = clocked();
    let mut a = Instance::start(store.clone(), "A").await;
    let client = connect(&a.tasks, "alice", true).await;
    a.gate.add_permits(1);
    let id = call(&client, "steps", json!({"to": 3})).await.task.task_id;
    watch_until(&client, &id, never_failed, |t| at(t, 1)).await;

    clock.advance(3 * BEAT);
    let mut b = Instance::start(store.clone(), "B").await;
    b.tasks.runtime().claim_now().await;
    a.said("A dropped").await;
    b.gate.add_permits(10);
    let done = watch_until(&client, &id, never_failed, terminal).await;
    assert_eq!(completed_text(&done), "B from 1 to 3 on attempt 2");
    b.said("B dropped").await;

    // A's gate opens: nothing of A's runs any more.
    a.gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !a.said_so_far()
            .iter()
            .any(|s| s == "A trying 2" || s == "A saved 2"),
        "{:?}",
        a.said_so_far()
    );
    let after = get(&client, &id).await;
    assert_eq!(completed_text(&after), "B from 1 to 3 on attempt 2");
    client.cancel().await.unwrap();
}

/// A stale run's context held outside the run is not left waiting once
/// the task is claimed by another: its writes are fenced and return an
/// error, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_runs_context_held_elsewhere_returns() {
    let (clock, store) = clocked();
    let mut a = Instance::start(store.clone(), "A").await;
    let client = connect(&a.tasks, "alice", true).await;
    a.gate.add_permits(1);
    let arguments = json!({"to": 3, "leak": true});
    let id = call(&client, "steps", arguments).await.task.task_id;
    let held = tokio::time::timeout(EVENTUALLY, a.leaked.recv())
        .await
        .unwrap()
        .unwrap();
    watch_until(&client, &id, never_failed, |t| at(t, 1)).await;

    clock.advance(3 * BEAT);
    let mut b = Instance::start(store.clone(), "B").await;
    b.tasks.runtime().claim_now().await;
    b.said("B started attempt 2").await;
    a.said("A dropped").await;

    assert!(held.checkpoint("2").await.is_err(), "fenced");
    assert!(held.set_status_message("A's").await.is_err(), "fenced");
    assert!(held.is_cancel_requested().await, "its run is over");
    b.gate.add_permits(10);
    let done = watch_until(&client, &id, never_failed, terminal).await;
    assert_eq!(completed_text(&done), "B from 1 to 3 on attempt 2");
    client.cancel().await.unwrap();
}

/// A cancel recorded while the lapsed run was stuck is honoured by the
/// runtime that claims the task: it ends `cancelled` without running the
/// tool again. So is a cancel of a task given back while it waits for
/// input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_is_honoured_across_a_takeover() {
    let (clock, store) = clocked();
    let a = Instance::start(store.clone(), "A").await;
    let client = connect(&a.tasks, "alice", true).await;
    a.gate.add_permits(1);
    let stuck = call(&client, "steps", json!({"to": 3})).await.task.task_id;
    watch_until(&client, &stuck, never_failed, |t| at(t, 1)).await;
    let asking = call(&client, "steps", json!({"ask": true}))
        .await
        .task
        .task_id;
    watch_until(&client, &asking, never_failed, |t| {
        t.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await;
    for id in [&stuck, &asking] {
        client
            .peer()
            .cancel_task(CancelTaskParams::new(id.clone()))
            .await
            .unwrap();
    }

    clock.advance(3 * BEAT);
    let mut b = Instance::start(store.clone(), "B").await;
    b.gate.add_permits(10);
    b.tasks.runtime().claim_now().await;
    for id in [&stuck, &asking] {
        let done = watch_until(&client, id, never_failed, terminal).await;
        assert_eq!(
            done.status(),
            rmcp::model::TaskStatus::Cancelled,
            "{done:?}"
        );
    }
    assert!(
        b.said_so_far().is_empty(),
        "B never ran the tool: {:?}",
        b.said_so_far()
    );
    client.cancel().await.unwrap();
}

/// A run that asks for input gives the task back and stops: no runtime is
/// occupied while the client thinks. Answered, the task is claimed by
/// another runtime (A is alive: this is no takeover, so still attempt 1),
/// whose run gets the answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_given_back_for_input_resumes_on_another_runtime_once_answered() {
    let (_clock, store) = clocked();
    let mut a = Instance::start(store.clone(), "A").await;
    let mut b = Instance::start(store.clone(), "B").await;
    let client = connect(&a.tasks, "alice", true).await;
    let id = call(&client, "steps", json!({"ask": true}))
        .await
        .task
        .task_id;
    a.said("A dropped").await;
    watch_until(&client, &id, never_failed, |t| {
        t.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await;
    // Nothing to claim while the client thinks.
    b.tasks.runtime().claim_now().await;
    assert!(b.said_so_far().is_empty(), "{:?}", b.said_so_far());

    answer_go(&client, &id, 2).await;
    b.gate.add_permits(2);
    b.tasks.runtime().claim_now().await;
    let done = watch_until(&client, &id, never_failed, terminal).await;
    assert_eq!(completed_text(&done), "B from 0 to 2 on attempt 1");
    b.said("B dropped").await;
    client.cancel().await.unwrap();
}

/// A front end that hands its tasks off runs nothing: the task waits,
/// `working`, until a worker's claim loop (here every 20 ms) picks it up.
/// A worker without the tool fails a task it claims, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_end_hands_off_to_a_worker() {
    let (_clock, store) = clocked();
    let runtime = Runtime::builder(store.clone())
        .hand_off_to_workers()
        .start()
        .await
        .unwrap();
    let front = DurableTasks::builder()
        .owner(by_client_name)
        .build(&runtime);
    assert!(front.hands_off() && !front.is_takeover("steps"));
    let client = connect(&front, "alice", true).await;
    let id = call(&client, "steps", json!({"to": 2})).await.task.task_id;
    let unknown = call(&client, "nowhere", json!({})).await.task.task_id;
    runtime.claim_now().await; // a front end claims nothing
    assert_eq!(
        get(&client, &id).await.status(),
        rmcp::model::TaskStatus::Working
    );

    let mut worker = Instance::start_with(store.clone(), "W", |b| {
        b.claim_every(Duration::from_millis(20)).max_running(1)
    })
    .await;
    worker.gate.add_permits(2);
    let done = watch_until(&client, &id, never_failed, terminal).await;
    assert_eq!(completed_text(&done), "W from 0 to 2 on attempt 1");
    let failed = watch_until(&client, &unknown, |_| {}, terminal).await;
    let TaskPayload::Failed { error } = &failed.payload else {
        panic!("expected failed, got {failed:?}");
    };
    assert!(
        error["message"].as_str().unwrap().contains("\"nowhere\""),
        "{error:?}"
    );
    worker.said("W dropped").await;
    client.cancel().await.unwrap();
}

/// The call stored with a task reads back as it was given, from the
/// runtime's `TaskCall` encoding and from the one written before it (this
/// type's own serde form), which stored tasks still hold.
#[test]
fn a_call_round_trips_through_the_task_context() {
    let mut arguments = JsonObject::new();
    arguments.insert("to".into(), json!(3));
    let read = |bytes: &[u8]| {
        TaskCall::decode(bytes)
            .map_err(|e| e.to_string())
            .and_then(TakeoverCall::try_from)
    };
    for call in [
        TakeoverCall::new("steps", Some(arguments)),
        TakeoverCall::new("bare", None),
    ] {
        let bytes = TaskCall::from(call.clone()).encode();
        assert_eq!(read(&bytes).unwrap(), call);
        let before = serde_json::to_vec(&call).unwrap();
        assert_eq!(read(&before).unwrap(), call);
    }
    assert!(read(b"[]").is_err());
    assert!(read(br#"{"tool":"x","arguments":3}"#).is_err());
}
