//! Durable tasks (SEP-2663, protocol 2026-07-28) end to end: two server
//! processes on one store, driven by the wire client's [`TaskClient`].
//! Run on the backends two processes can share (the `tasks` tag).

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{ChildServer, Fixture, Server};
use crate::wire::TaskClient;

/// The lease of the servers here: short, so a killed server's
/// task reads as lost within seconds, not 30.
const LEASE_MS: u64 = 1_500;
/// How long a task may take to reach a state these cases wait for.
const WAIT: Duration = Duration::from_secs(30);
/// How long a killed server's task may take to read as lost: its lease,
/// with room for a busy machine.
const ORPHAN_WAIT: Duration = Duration::from_secs(60);

/// A server process on the fixture's store, with the short lease.
fn spawn(fixture: &Fixture) -> ChildServer {
    spawn_with(fixture, &[])
}

/// The server's arguments on the fixture's store: the short lease, a
/// claim every 100 ms, and `extra`.
fn arguments(fixture: &Fixture, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--task-lease-ms".into(),
        LEASE_MS.to_string(),
        "--claim-every-ms".into(),
        "100".into(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// A server process as [`spawn`], with `extra` arguments.
fn spawn_with(fixture: &Fixture, extra: &[&str]) -> ChildServer {
    ChildServer::spawn(&arguments(fixture, extra))
}

/// A worker process (`--worker`) on the fixture's store.
fn spawn_worker(fixture: &Fixture) -> ChildServer {
    ChildServer::spawn_worker(&arguments(fixture, &[]))
}

fn status(task: &Value) -> &str {
    task["status"].as_str().unwrap_or("")
}

fn terminal(task: &Value) -> bool {
    matches!(status(task), "completed" | "failed" | "cancelled")
}

/// The step the task's status message says it is at (`step N of M`).
fn step(task: &Value) -> Option<u64> {
    task["statusMessage"]
        .as_str()?
        .strip_prefix("step ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

fn result_text(task: &Value) -> &str {
    task["result"]["content"][0]["text"].as_str().unwrap_or("")
}

fn error_code(response: &Value) -> Option<i64> {
    response["error"]["code"].as_i64()
}

/// (a) A task created on A is readable on B as soon as A answered, and B
/// reads its progress and its result.
pub async fn created_on_one_server_read_on_another(fixture: &Fixture) {
    let a = spawn(fixture);
    let b = spawn(fixture);
    let on_a = TaskClient::new(&a.url);
    let on_b = on_a.on(&b.url);
    let created = on_a
        .call_tool(2, "slow_count", json!({"count": 4, "interval_ms": 200}))
        .await;
    let task = &created["result"];
    assert_eq!(task["resultType"], "task", "{created}");
    assert_eq!(task["status"], "working", "{created}");
    let id = task["taskId"].as_str().expect("a task id").to_owned();

    // Durable before the answer (T1): B resolves it at once.
    let seen = on_b.get_task(3, &id).await;
    assert_eq!(seen["result"]["taskId"], json!(id), "{seen}");
    assert!(
        matches!(status(&seen["result"]), "working" | "completed"),
        "{seen}"
    );

    let done = on_b.until(&id, WAIT, terminal).await;
    assert_eq!(status(&done), "completed", "{done}");
    assert_eq!(result_text(&done), "counted to 4", "{done}");
    assert_eq!(done["statusMessage"], "step 4 of 4", "{done}");
    // A, which ran it, reads the same.
    let on_a_done = on_a.get_task(4, &id).await;
    assert_eq!(on_a_done["result"]["result"], done["result"], "{on_a_done}");
}

/// (b) `confirm_count` on A asks for input; B shows the input request, takes
/// the answer, and A's operation counts to the number answered.
pub async fn input_answered_on_another_server(fixture: &Fixture) {
    let a = spawn(fixture);
    let b = spawn(fixture);
    let on_a = TaskClient::new(&a.url);
    let on_b = on_a.on(&b.url);
    let id = on_a
        .create_task(2, "confirm_count", json!({"count": 2, "interval_ms": 10}))
        .await;
    let waiting = on_b
        .until(&id, WAIT, |t| status(t) == "input_required")
        .await;
    let request = &waiting["inputRequests"]["confirm"];
    assert_eq!(request["method"], "elicitation/create", "{waiting}");
    assert_eq!(request["params"]["message"], "Count to 2?", "{waiting}");

    // A key never issued is ignored; `confirm` changes the count to 5.
    let ack = on_b
        .update_task(
            3,
            &id,
            json!({
                "confirm": {"action": "accept", "content": {"count": 5}},
                "never-asked": {"action": "accept", "content": {}}
            }),
        )
        .await;
    assert!(
        ack.get("result").is_some(),
        "tasks/update is acknowledged: {ack}"
    );
    let done = on_b.until(&id, WAIT, terminal).await;
    assert_eq!(status(&done), "completed", "{done}");
    assert_eq!(
        result_text(&done),
        "counted to 5",
        "the answer reached A: {done}"
    );
    assert!(done.get("inputRequests").is_none(), "{done}");
}

/// (c) A cancel sent to B is honoured by A's operation, which stops
/// counting: the task ends `cancelled` (cooperative cancellation: only the
/// operation itself ends it so) before its last step.
pub async fn cancel_on_another_server_stops_the_work(fixture: &Fixture) {
    let a = spawn(fixture);
    let b = spawn(fixture);
    let on_a = TaskClient::new(&a.url);
    let on_b = on_a.on(&b.url);
    let id = on_a
        .create_task(2, "slow_count", json!({"count": 100000, "interval_ms": 20}))
        .await;
    on_b.until(&id, WAIT, |t| step(t).is_some()).await;
    let ack = on_b.cancel_task(3, &id).await;
    assert!(
        ack.get("result").is_some(),
        "tasks/cancel is acknowledged: {ack}"
    );
    let done = on_b.until(&id, WAIT, terminal).await;
    assert_eq!(status(&done), "cancelled", "{done}");
    let stopped_at = step(&done).expect("a step before the cancel");
    assert!(stopped_at < 100000, "{done}");
    // Terminal: a second cancel changes nothing.
    on_b.cancel_task(4, &id).await;
    let again = on_a.get_task(5, &id).await;
    assert_eq!(again["result"]["status"], "cancelled", "{again}");
    assert_eq!(
        again["result"]["statusMessage"], done["statusMessage"],
        "{again}"
    );
}

/// (d) A is killed (SIGKILL) mid-task: once its lease lapses, B reads the
/// task `failed` with "server instance lost", while a task A finished
/// before it died stays `completed` (its outcome was stored). A new server
/// A' on the same store serves new tasks.
pub async fn killed_server_tasks_read_failed_elsewhere(fixture: &Fixture) {
    // Tasks that die with their instance, as before takeover.
    let a = spawn_with(fixture, &["--no-takeover"]);
    let b = spawn_with(fixture, &["--no-takeover"]);
    let on_a = TaskClient::new(&a.url);
    let on_b = on_a.on(&b.url);
    let finished = on_a
        .create_task(2, "slow_count", json!({"count": 1, "interval_ms": 1}))
        .await;
    let running = on_a
        .create_task(3, "slow_count", json!({"count": 100000, "interval_ms": 20}))
        .await;
    let done = on_b.until(&finished, WAIT, terminal).await;
    assert_eq!(status(&done), "completed", "{done}");
    on_b.until(&running, WAIT, |t| step(t).is_some()).await;
    a.kill();

    let lost = on_b.until(&running, ORPHAN_WAIT, terminal).await;
    assert_eq!(status(&lost), "failed", "{lost}");
    assert_eq!(
        lost["error"],
        json!({"code": -32603, "message": "server instance lost"}),
        "{lost}"
    );
    let still = on_b.get_task(4, &finished).await;
    assert_eq!(still["result"]["status"], "completed", "{still}");
    assert_eq!(result_text(&still["result"]), "counted to 1", "{still}");

    let a2 = spawn_with(fixture, &["--no-takeover"]);
    let on_a2 = on_a.on(&a2.url);
    let next = on_a2
        .create_task(5, "slow_count", json!({"count": 2, "interval_ms": 1}))
        .await;
    let next_done = on_b.until(&next, WAIT, terminal).await;
    assert_eq!(status(&next_done), "completed", "{next_done}");
    // The lost task stays lost: the new instance does not revive it.
    let after = on_a2.get_task(6, &running).await;
    assert_eq!(after["result"]["status"], "failed", "{after}");
}

/// (e) A client that did not declare the tasks extension: `confirm_count`
/// (task only) answers -32021 and writes nothing to the store;
/// `slow_count` answers its result directly, as before tasks.
pub async fn without_the_extension_nothing_is_stored(fixture: &Fixture) {
    let (server, counting) = Server::start_counting_tasks(fixture.url()).await;
    let plain = TaskClient::new(&server.url).without_tasks();
    let refused = plain
        .call_tool(2, "confirm_count", json!({"count": 1, "interval_ms": 1}))
        .await;
    assert_eq!(error_code(&refused), Some(-32021), "{refused}");
    assert_eq!(
        refused["error"]["data"]["requiredCapabilities"]["extensions"],
        json!({"io.modelcontextprotocol/tasks": {}}),
        "{refused}"
    );
    let direct = plain
        .call_tool(3, "slow_count", json!({"count": 2, "interval_ms": 1}))
        .await;
    assert_ne!(direct["result"]["resultType"], "task", "{direct}");
    assert_eq!(
        direct["result"]["content"][0]["text"], "counted to 2",
        "{direct}"
    );
    // tasks/get needs the extension too.
    let get = plain.get_task(4, "t1.00000000000000000000000000").await;
    assert_eq!(error_code(&get), Some(-32021), "{get}");
    assert_eq!(counting.writes(), 0, "nothing reached the task store");

    // The same server stores a task for a client that declares it.
    let declared = TaskClient::new(&server.url);
    let id = declared
        .create_task(5, "slow_count", json!({"count": 1, "interval_ms": 1}))
        .await;
    declared.until(&id, WAIT, terminal).await;
    assert!(counting.writes() > 0, "the counter counts");
    server.stop().await;
}

/// (f) Tasks are bound to the `Authorization` they were created with: on
/// another server, another principal, or none, gets -32602 for the id, as
/// for an id that does not exist, and cannot answer or cancel it.
pub async fn another_owner_cannot_see_or_touch_a_task(fixture: &Fixture) {
    let a = spawn(fixture);
    let b = spawn(fixture);
    let alice = TaskClient::new(&a.url).authorized("Bearer alice");
    let alice_b = alice.on(&b.url);
    let mallory_b = alice_b.authorized("Bearer mallory");
    let anonymous_b = TaskClient::new(&b.url);
    let id = alice
        .create_task(2, "confirm_count", json!({"count": 3, "interval_ms": 1}))
        .await;
    alice_b
        .until(&id, WAIT, |t| status(t) == "input_required")
        .await;
    let unknown = "t1.00000000000000000000000000";
    for (who, client) in [("mallory", &mallory_b), ("anonymous", &anonymous_b)] {
        let get = client.get_task(3, &id).await;
        assert_eq!(error_code(&get), Some(-32602), "{who}: {get}");
        assert!(get.get("result").is_none(), "{who}: {get}");
        // Answering or cancelling another's task looks exactly like doing
        // so on an unknown id, and changes nothing.
        let answer = json!({"confirm": {"action": "accept", "content": {"count": 99}}});
        let update = client.update_task(4, &id, answer.clone()).await;
        let update_unknown = client.update_task(4, unknown, answer).await;
        assert_eq!(
            error_code(&update),
            error_code(&update_unknown),
            "{who}: {update} vs {update_unknown}"
        );
        let cancel = client.cancel_task(5, &id).await;
        let cancel_unknown = client.cancel_task(5, unknown).await;
        assert_eq!(
            error_code(&cancel),
            error_code(&cancel_unknown),
            "{who}: {cancel} vs {cancel_unknown}"
        );
    }
    let untouched = alice_b.get_task(6, &id).await;
    assert_eq!(
        untouched["result"]["status"], "input_required",
        "{untouched}"
    );
    alice_b
        .update_task(
            7,
            &id,
            json!({"confirm": {"action": "accept", "content": {}}}),
        )
        .await;
    let done = alice_b.until(&id, WAIT, terminal).await;
    assert_eq!(status(&done), "completed", "{done}");
    assert_eq!(result_text(&done), "counted to 3", "{done}");
}

/// `tasks/get` result, asserting it never reads `failed`: a resumable
/// task is `working` while it waits for a runtime to take it over.
fn never_failed(task: &Value) {
    assert_ne!(status(task), "failed", "{task}");
}

/// Where a taken-over count resumed: `K` of `counted to N (resumed from
/// step K, attempt A)`, with `A`.
fn resumed(task: &Value) -> Option<(u64, u64)> {
    let text = result_text(task);
    let rest = text.split_once("(resumed from step ")?.1;
    let (from, rest) = rest.split_once(", attempt ")?;
    Some((from.parse().ok()?, rest.trim_end_matches(')').parse().ok()?))
}

/// (g) Two servers and a worker share the store. A resumable `slow_count`
/// runs on A, which is killed (SIGKILL) mid-count: once A's lease lapses,
/// B or the worker takes the task over and counts on from A's last
/// checkpoint (at least the step last seen), on attempt 2. Polled on B
/// throughout, the task never reads `failed`.
pub async fn killed_server_task_is_taken_over(fixture: &Fixture) {
    let a = spawn(fixture);
    let b = spawn(fixture);
    let _worker = spawn_worker(fixture);
    let on_a = TaskClient::new(&a.url);
    let on_b = on_a.on(&b.url);
    let count = 40;
    let id = on_a
        .create_task(2, "slow_count", json!({"count": count, "interval_ms": 100}))
        .await;
    let seen = on_b
        .until(&id, WAIT, |t| {
            never_failed(t);
            step(t).is_some_and(|n| n >= 3)
        })
        .await;
    a.kill();
    let seen_step = step(&seen).unwrap();

    let done = on_b
        .until(&id, ORPHAN_WAIT, |t| {
            never_failed(t);
            terminal(t)
        })
        .await;
    assert_eq!(status(&done), "completed", "{done}");
    let (from, attempt) = resumed(&done).unwrap_or_else(|| panic!("not taken over: {done}"));
    assert!(
        from >= seen_step && from < count,
        "resumed from A's checkpoint (A was seen at step {seen_step}): {done}"
    );
    assert_eq!(attempt, 2, "{done}");
    assert!(
        result_text(&done).starts_with(&format!("counted to {count} ")),
        "{done}"
    );
}

/// (h) A front end hands its `slow_count` tasks off to workers: worker 1
/// runs the task and is killed mid-count; worker 2, started after it,
/// takes it over from worker 1's checkpoint. The front end, polled
/// throughout, never reads it `failed`.
pub async fn killed_worker_task_is_taken_over(fixture: &Fixture) {
    let front = spawn_with(fixture, &["--hand-off"]);
    let on_front = TaskClient::new(&front.url);
    let first = spawn_worker(fixture);
    let count = 40;
    let id = on_front
        .create_task(2, "slow_count", json!({"count": count, "interval_ms": 100}))
        .await;
    let seen = on_front
        .until(&id, WAIT, |t| {
            never_failed(t);
            step(t).is_some_and(|n| n >= 2)
        })
        .await;
    let second = spawn_worker(fixture);
    first.kill();
    let seen_step = step(&seen).unwrap();

    let done = on_front
        .until(&id, ORPHAN_WAIT, |t| {
            never_failed(t);
            terminal(t)
        })
        .await;
    assert_eq!(status(&done), "completed", "{done}");
    let (from, attempt) = resumed(&done).unwrap_or_else(|| panic!("not taken over: {done}"));
    assert!(from >= seen_step && from < count, "{done}");
    assert_eq!(attempt, 2, "{done}");
    drop(second);
}
