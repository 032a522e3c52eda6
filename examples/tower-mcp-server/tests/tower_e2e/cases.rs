//! The cases: two server processes (A and B) on one store.

use serde_json::{Value, json};

use crate::harness::{ChildServer, Fixture};
use crate::wire::{
    Stream, counts_until, delete, get_task, initialize, initialize_as, initialize_with, post,
    request, request_as, start_task, task_until,
};

fn list_tools(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
}

fn count_call(id: i64, count: u32, progress: &str) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": "slow_count",
            "arguments": {"count": count, "interval_ms": 5},
            "_meta": {"progressToken": progress}
        }
    })
}

fn text_of(answer: &Value) -> &str {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {answer}"))
}

/// The progress message of a stored notification.
fn progress_message(data: &str) -> String {
    let message: Value = serde_json::from_str(data).expect("a JSON-RPC message");
    assert_eq!(message["method"], "notifications/progress", "{message}");
    message["params"]["message"]
        .as_str()
        .expect("a progress message")
        .to_owned()
}

fn event_number(id: &Option<String>) -> u64 {
    id.as_deref()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a numbered event id, got {id:?}"))
}

/// A session created on A is served by B, which restores it from the
/// shared session store: B lists the tools and runs a call in it.
pub async fn session_created_on_one_server_is_served_by_another(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let session = initialize(&a.url).await;
    let listed = post(&b.url, Some(&session), list_tools(2)).await;
    assert!(
        listed.status.is_success(),
        "tools/list on B: {}",
        listed.status
    );
    let listed = listed.answer.expect("the tool list");
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(names.contains(&"slow_count"), "{names:?}");
    let called = post(&b.url, Some(&session), count_call(3, 2, "p")).await;
    assert_eq!(text_of(&called.answer.expect("the result")), "counted to 2");
    let unknown = crate::wire::Session {
        id: "no-such-session".into(),
        caller: None,
    };
    assert_eq!(
        post(&b.url, Some(&unknown), list_tools(4)).await.status,
        reqwest::StatusCode::NOT_FOUND
    );
}

/// A GET stream of a session on A, dropped after the client processed
/// three of its eight progress notifications, resumes on B from the third's
/// id: B replays the other five from the store, each once, in order, with
/// A's ids and data, and goes on live with ids after them.
pub async fn stream_dropped_on_one_server_resumes_on_another(fixture: &Fixture) {
    const STEPS: u32 = 8;
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let session = initialize(&a.url).await;
    let mut stream = Stream::open(&a.url, &session, None).await;
    let called = post(&a.url, Some(&session), count_call(2, STEPS, "count")).await;
    assert_eq!(
        text_of(&called.answer.expect("the result")),
        format!("counted to {STEPS}")
    );
    // Every step reached the wire, so A stored each (tower-mcp stores an
    // event before it sends it). The client processed three, then lost the
    // connection.
    let mut sent = Vec::new();
    for step in 1..=STEPS {
        let event = stream.next().await;
        assert_eq!(
            progress_message(&event.data),
            format!("step {step} of {STEPS}")
        );
        sent.push(event);
    }
    drop(stream);
    let processed = &sent[..3];
    let last = processed[2].id.clone().expect("an event id");

    let mut resumed = Stream::open(&b.url, &session, Some(&last)).await;
    let mut replayed = Vec::new();
    for _ in 3..STEPS {
        replayed.push(resumed.next().await);
    }
    assert_eq!(
        replayed,
        sent[3..],
        "the missed events, each once, in order, as A sent them"
    );
    // B goes on live, numbering after what A stored.
    let called = post(&b.url, Some(&session), count_call(3, 1, "more")).await;
    assert_eq!(text_of(&called.answer.expect("the result")), "counted to 1");
    let live = resumed.next().await;
    assert_eq!(progress_message(&live.data), "step 1 of 1");
    assert!(
        event_number(&live.id) > event_number(&sent[STEPS as usize - 1].id),
        "a live event's id follows the stored ones: {:?}",
        live.id
    );
}

/// tower-mcp stores a session's notifications as it sends them on an open
/// GET stream of the instance producing them, and drops them when none is
/// open (its broadcast has no subscriber): what a call reports while the
/// client has no GET stream is never stored, so no instance can resume it.
/// Read from the store itself, so the check waits for nothing.
pub async fn notifications_with_no_get_stream_open_are_never_stored(fixture: &Fixture) {
    use futures_util::StreamExt;
    use mcp_event_store::tower_mcp::TowerEventStore;

    let a = ChildServer::start(fixture.url());
    let session = initialize(&a.url).await;
    let store = mcp_event_store::connect(fixture.url())
        .await
        .expect("the store opens");
    let stream_id = TowerEventStore::new(store.clone()).stream_id(&session.id);
    // The stored notifications of the call with progress token `token`
    // (the store holds tower-mcp's event in an envelope; its JSON is whole
    // inside).
    let stored = |token: &'static str| {
        let (store, stream_id) = (store.clone(), stream_id.clone());
        async move {
            let needle = format!("\"progressToken\":\"{token}\"");
            store
                .replay_stream(&stream_id)
                .await
                .expect("the session's stream replays")
                .events
                .filter(|event| {
                    let data = event.as_ref().expect("an event").data.clone();
                    let found = String::from_utf8_lossy(&data).contains(&needle);
                    async move { found }
                })
                .count()
                .await
        }
    };
    let called = post(&a.url, Some(&session), count_call(2, 4, "unheard")).await;
    assert_eq!(text_of(&called.answer.expect("the result")), "counted to 4");
    // No GET stream has been open: nothing can have been stored.
    assert_eq!(stored("unheard").await, 0, "stored without a GET stream");
    let mut stream = Stream::open(&a.url, &session, None).await;
    let called = post(&a.url, Some(&session), count_call(3, 4, "heard")).await;
    assert_eq!(text_of(&called.answer.expect("the result")), "counted to 4");
    let mut step = 0;
    while step < 4 {
        let event = stream.next().await;
        let message: Value = serde_json::from_str(&event.data).expect("JSON");
        // A notification of the first call still on its way when the
        // stream opened is sent (and stored) now: not this call's.
        if message["params"]["progressToken"] == "heard" {
            step += 1;
            assert_eq!(progress_message(&event.data), format!("step {step} of 4"));
        }
    }
    assert_eq!(
        stored("heard").await,
        4,
        "with a GET stream open, each was stored"
    );
}

/// A session deleted on A answers 404 on B, which never held it: its
/// record is gone from the shared store.
pub async fn session_deleted_on_one_server_is_gone_on_another(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let session = initialize(&a.url).await;
    assert!(delete(&a.url, &session).await.is_success());
    assert_eq!(
        post(&b.url, Some(&session), list_tools(2)).await.status,
        reqwest::StatusCode::NOT_FOUND
    );
    assert_eq!(
        post(&a.url, Some(&session), list_tools(3)).await.status,
        reqwest::StatusCode::NOT_FOUND
    );
}

/// A session B restored before A deleted it ends on B too (the `DELETE`
/// goes over the bus): B's GET stream of it ends, B answers 404, and B
/// writes no record back, so A answers 404 as well.
pub async fn a_session_another_server_holds_ends_with_a_delete(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let session = initialize(&a.url).await;
    assert!(
        post(&b.url, Some(&session), list_tools(2))
            .await
            .status
            .is_success()
    );
    let on_b = Stream::open(&b.url, &session, None).await;
    assert!(delete(&a.url, &session).await.is_success());
    // B ends the stream after it ended the session.
    on_b.ends().await;
    assert_eq!(
        post(&b.url, Some(&session), list_tools(3)).await.status,
        reqwest::StatusCode::NOT_FOUND,
        "B no longer serves the session"
    );
    assert_eq!(
        post(&a.url, Some(&session), list_tools(4)).await.status,
        reqwest::StatusCode::NOT_FOUND,
        "nothing wrote the record back"
    );
}

/// What the `announce` tool raises once on A reaches the GET streams of
/// sessions on A and on B (tower-mcp's external notifications, fed by
/// the bus on each instance).
pub async fn a_broadcast_raised_on_one_server_reaches_clients_of_every_server(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let on_a = initialize(&a.url).await;
    let on_b = initialize(&b.url).await;
    let mut stream_a = Stream::open(&a.url, &on_a, None).await;
    let mut stream_b = Stream::open(&b.url, &on_b, None).await;
    let called = post(
        &a.url,
        Some(&on_a),
        json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "announce", "arguments": {}}
        }),
    )
    .await;
    assert_eq!(text_of(&called.answer.expect("the result")), "announced");
    for stream in [&mut stream_b, &mut stream_a] {
        stream
            .next_with_method("notifications/resources/list_changed")
            .await;
    }
}

/// A listener on B of a task A runs hears its status (tower-mcp announces
/// only what it drives, on the instance driving it; the layer has B watch
/// the task in the store and announce each change): the task's
/// `notifications/tasks` reach B's `subscriptions/listen` stream, up to
/// its completion, each the whole task.
pub async fn a_tasks_status_reaches_its_listener_on_another_server(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let task = start_task(
        &a.url,
        "slow_count",
        json!({"count": 20, "interval_ms": 100}),
    )
    .await;
    let mut listening = crate::wire::listen_to_tasks(&b.url, &[&task]).await;
    loop {
        let heard = listening.next_with_method("notifications/tasks").await;
        assert_eq!(heard["params"]["taskId"], task.as_str(), "{heard}");
        if heard["params"]["status"] == "completed" {
            break;
        }
        assert_eq!(heard["params"]["status"], "working", "{heard}");
    }
}

/// Behind a round-robin proxy with no session affinity (the test kit's:
/// each request goes to the other server than the one before), one
/// session spans both: its calls are served whichever server gets them
/// (the one that created it heard no `notifications/initialized`, which
/// went to the other, and restores it from its record), a
/// broadcast raised through the proxy reaches its GET stream wherever that
/// is served, and once it is deleted every request is answered 404,
/// whichever server gets it (the other within the bus's latency), and its
/// GET stream ends.
pub async fn behind_a_round_robin_proxy_one_session_spans_both_servers(fixture: &Fixture) {
    use mcp_event_store_conformance::testkit::RoundRobin;

    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let address = |url: &str| -> std::net::SocketAddr {
        url.trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .parse()
            .expect("a server address")
    };
    let proxy = RoundRobin::start(vec![address(&a.url), address(&b.url)])
        .await
        .expect("the proxy listens");
    let url = proxy.url("/mcp");
    let session = initialize(&url).await;
    for id in 2..6 {
        let listed = post(&url, Some(&session), list_tools(id)).await;
        assert!(listed.status.is_success(), "tools/list: {}", listed.status);
        let listed = listed.answer.expect("an answer");
        assert!(listed["result"]["tools"].is_array(), "{listed}");
    }
    let mut stream = Stream::open(&url, &session, None).await;
    let called = post(
        &url,
        Some(&session),
        json!({
            "jsonrpc": "2.0", "id": 6, "method": "tools/call",
            "params": {"name": "announce", "arguments": {}}
        }),
    )
    .await;
    assert_eq!(text_of(&called.answer.expect("the result")), "announced");
    stream
        .next_with_method("notifications/resources/list_changed")
        .await;
    assert!(delete(&url, &session).await.is_success());
    // The server that did not get the DELETE hears of it over the bus: until
    // then it may still answer. Then both answer 404, time after time (4 in
    // a row: each server twice).
    let deadline = tokio::time::Instant::now() + crate::wire::EVENTUALLY;
    let mut not_found_in_a_row = 0;
    let mut id = 10;
    while not_found_in_a_row < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a server still serves the deleted session"
        );
        let status = post(&url, Some(&session), list_tools(id)).await.status;
        if status == reqwest::StatusCode::NOT_FOUND {
            not_found_in_a_row += 1;
        } else {
            not_found_in_a_row = 0;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        id += 1;
    }
    stream.ends().await;
}

/// tower-mcp's idle cleanup on A (the session idled there) neither deletes
/// the record nor purges the events of a session B keeps serving: the
/// events B stored stay in the store, read from the store itself.
pub async fn idle_cleanup_spares_a_session_another_server_serves(fixture: &Fixture) {
    let quick = ["--session-ttl-secs", "1", "--session-cleanup-ms", "200"];
    let a = ChildServer::start_with(fixture.url(), &quick);
    let b = ChildServer::start_with(fixture.url(), &quick);
    let session = initialize(&a.url).await;
    let store = mcp_event_store::connect(fixture.url())
        .await
        .expect("the store opens");
    let stream_id =
        mcp_event_store::tower_mcp::TowerEventStore::new(store.clone()).stream_id(&session.id);
    let stored = || async {
        use futures_util::StreamExt;
        store
            .replay_stream(&stream_id)
            .await
            .expect("the session's stream replays")
            .events
            .count()
            .await
    };
    let mut on_b = Stream::open(&b.url, &session, None).await;
    let called = post(&b.url, Some(&session), count_call(2, 2, "kept")).await;
    assert_eq!(text_of(&called.answer.expect("the result")), "counted to 2");
    on_b.next_with_method("notifications/progress").await;
    let before = stored().await;
    assert!(before > 0, "B stored the progress it sent");
    // B keeps the session busy while it idles on A, until A's cleanup has
    // removed it from A's memory.
    let busy = async {
        for id in 10.. {
            let listed = post(&b.url, Some(&session), list_tools(id)).await;
            assert!(listed.status.is_success(), "B serves: {}", listed.status);
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        }
    };
    let cleaned_on_a = ["Expired session removed", session.id.as_str()];
    tokio::select! {
        () = busy => unreachable!(),
        () = a.logs(&cleaned_on_a) => {}
    }
    // One more cleanup round has passed on A.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    // (B may still be storing what it sent: it stores after sending.)
    assert!(stored().await >= before, "A's idle cleanup purged nothing");
    assert!(
        post(&b.url, Some(&session), list_tools(1_000))
            .await
            .status
            .is_success()
    );
}

/// A limit of tower-mcp 0.25 this integration cannot carry across
/// instances: the answer to a server-to-client request (here the
/// `sampling/createMessage` of `ask_client`, in a 2025-11-25 session) must
/// be POSTed to the instance that sent it. A keeps the waiting request in
/// its memory (a table of the live session), numbers it itself (each
/// instance counts from 1 per session) and offers no hook to route an
/// answer, so B, which serves the session too, restores it, finds no
/// request of that id waiting, logs "Received response for unknown
/// request" and answers `202 Accepted`: the answer is dropped. The call on
/// A completes only with the answer POSTed to A, proof B's never reached it.
pub async fn an_answer_posted_to_another_server_is_dropped_there(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let session = initialize_with(&a.url, json!({"sampling": {}})).await;
    let mut call = Stream::post(
        &a.url,
        &session,
        json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "ask_client", "arguments": {"prompt": "Who answers?"}}
        }),
    )
    .await;
    let asked = call.next_with_method("sampling/createMessage").await;
    assert_eq!(
        asked["params"]["messages"][0]["content"]["text"], "Who answers?",
        "{asked}"
    );
    let asked_id = asked["id"].clone();
    assert!(asked_id.is_number() || asked_id.is_string(), "{asked}");
    let answer = |text: &str| {
        json!({
            "jsonrpc": "2.0", "id": asked_id.clone(),
            "result": {
                "role": "assistant",
                "content": {"type": "text", "text": text},
                "model": "e2e"
            }
        })
    };

    let on_b = post(&b.url, Some(&session), answer("from B")).await;
    assert_eq!(on_b.status, reqwest::StatusCode::ACCEPTED, "B's answer");
    b.logs(&["Received response for unknown request"]).await;
    // Not a correctness threshold: time for a forwarded answer to reach A,
    // were there any forwarding.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    let on_a = post(&a.url, Some(&session), answer("from A")).await;
    assert_eq!(on_a.status, reqwest::StatusCode::ACCEPTED, "A's answer");
    let result = call.next_answer(2).await;
    assert_eq!(text_of(&result), "sampled: from A", "{result}");
}

/// A task created on A is read through B (waiting for input), answered
/// through B (which then runs the rest of the call: tower-mcp resumes the
/// handler where the answer arrives), and read completed on both. A long
/// count running on A is cancelled through B, and A's handler stops.
pub async fn task_created_on_one_server_is_read_answered_and_cancelled_through_another(
    fixture: &Fixture,
) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let task = start_task(
        &a.url,
        "confirm_count",
        json!({"count": 2, "interval_ms": 10}),
    )
    .await;
    let parked = task_until(&b.url, &task, "input_required", |t| {
        t["status"] == "input_required"
    })
    .await;
    assert_eq!(
        parked["inputRequests"]["confirm"]["params"]["message"], "Count to 2?",
        "{parked}"
    );
    let answered = request(
        &b.url,
        "tasks/update",
        &task,
        json!({
            "taskId": task,
            "inputResponses": {"confirm": {"action": "accept", "content": {"count": 3}}}
        }),
    )
    .await;
    assert!(answered.get("error").is_none(), "{answered}");
    let done = task_until(&b.url, &task, "completed", |t| t["status"] == "completed").await;
    assert_eq!(
        done["result"]["content"][0]["text"], "counted to 3",
        "{done}"
    );
    assert_eq!(get_task(&a.url, &task).await["status"], "completed");

    let long = start_task(
        &a.url,
        "slow_count",
        json!({"count": 100_000, "interval_ms": 20}),
    )
    .await;
    counts_until(&a.url, 1).await;
    let cancelled = request(&b.url, "tasks/cancel", &long, json!({"taskId": long})).await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    task_until(&a.url, &long, "cancelled", |t| t["status"] == "cancelled").await;
    counts_until(&a.url, 0).await;
}

/// A is killed (SIGKILL) while a task of its runs: once its lease lapses,
/// B reads the task failed ("server instance lost"); a task A completed
/// before stays completed.
pub async fn tasks_of_a_killed_server_read_failed_on_another(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let short = start_task(&a.url, "slow_count", json!({"count": 1, "interval_ms": 1})).await;
    task_until(&b.url, &short, "completed", |t| t["status"] == "completed").await;
    let long = start_task(
        &a.url,
        "slow_count",
        json!({"count": 100_000, "interval_ms": 50}),
    )
    .await;
    counts_until(&a.url, 1).await;
    assert_eq!(get_task(&b.url, &long).await["status"], "working");
    a.kill();
    let failed = task_until(&b.url, &long, "failed", |t| t["status"] == "failed").await;
    assert_eq!(
        failed["error"]["message"], "server instance lost",
        "{failed}"
    );
    assert_eq!(get_task(&b.url, &short).await["status"], "completed");
}

/// With `--takeover`, a `slow_count` task of a killed server is run again
/// by another server started with it: B, polled throughout, never reads
/// it `failed`, and reads it `completed` with the count's result.
pub async fn task_of_a_killed_server_is_taken_over_by_another(fixture: &Fixture) {
    let a = ChildServer::start_with(fixture.url(), &["--takeover", "3"]);
    let b = ChildServer::start_with(fixture.url(), &["--takeover", "3"]);
    let task = start_task(
        &a.url,
        "slow_count",
        json!({"count": 20, "interval_ms": 100}),
    )
    .await;
    counts_until(&a.url, 1).await;
    a.kill();
    let done = task_until(&b.url, &task, "completed", |t| {
        assert_ne!(t["status"], "failed", "a task taken over read failed: {t}");
        t["status"] == "completed"
    })
    .await;
    assert_eq!(
        done["result"]["content"][0]["text"], "counted to 20",
        "{done}"
    );
}

/// A session and a task are their caller's on every server (C20, T3):
/// another caller (or an anonymous one) holding the session's id gets
/// what a client of an unknown session gets, on the server that holds it
/// and on the one that would restore it (a POST and a resume are 404, a
/// `DELETE` leaves it alone), and a task of another caller reads as an
/// unknown task. Their owner goes on using both, on both servers.
pub async fn sessions_and_tasks_are_their_callers_on_every_server(fixture: &Fixture) {
    let a = ChildServer::start(fixture.url());
    let b = ChildServer::start(fixture.url());
    let alice = Some("Bearer alice");
    let session = initialize_as(&a.url, alice, json!({})).await;
    let mut stream = Stream::open(&a.url, &session, None).await;
    let called = post(&a.url, Some(&session), count_call(2, 2, "p")).await;
    assert!(
        called.status.is_success(),
        "alice's call: {}",
        called.status
    );
    let cursor = stream
        .next()
        .await
        .id
        .expect("the GET stream's events have ids");
    drop(stream);
    let unknown = crate::wire::Session {
        id: "00000000-0000-4000-8000-000000000000".into(),
        caller: session.caller.clone(),
    };
    let mut id = 10;
    for url in [&a.url, &b.url] {
        for other in [Some("Bearer mallory"), None] {
            let other = session.as_caller(other);
            id += 1;
            let (theirs, none) = (
                post(url, Some(&other), list_tools(id)).await,
                post(url, Some(&unknown), list_tools(id)).await,
            );
            assert_eq!(
                theirs.status,
                reqwest::StatusCode::NOT_FOUND,
                "POST on {url}"
            );
            assert_eq!(theirs.status, none.status);
            assert_eq!(theirs.answer, none.answer);
            assert_eq!(
                crate::wire::resume_status(url, &other, &cursor).await,
                crate::wire::resume_status(url, &unknown, &cursor).await,
                "a resume on {url}"
            );
            assert_eq!(
                delete(url, &other).await,
                delete(url, &unknown).await,
                "DELETE on {url}"
            );
        }
    }
    for url in [&b.url, &a.url] {
        id += 1;
        let own = post(url, Some(&session), list_tools(id)).await;
        assert!(own.status.is_success(), "alice on {url}: {}", own.status);
    }

    let task = request_as(
        &a.url,
        alice,
        "tools/call",
        "slow_count",
        json!({"name": "slow_count", "arguments": {"count": 1, "interval_ms": 5}}),
    )
    .await;
    let task = task["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {task}"))
        .to_owned();
    let get = |url: &str, caller: Option<&'static str>, task: &str| {
        let (url, task) = (url.to_owned(), task.to_owned());
        async move { request_as(&url, caller, "tasks/get", &task, json!({"taskId": task})).await }
    };
    let no_such = "t1.00000000000000000000000000";
    for url in [&a.url, &b.url] {
        for other in [Some("Bearer mallory"), None] {
            let theirs = get(url, other, &task).await;
            let none = get(url, other, no_such).await;
            assert!(theirs.get("error").is_some(), "{theirs}");
            assert_eq!(
                theirs["error"]["code"], none["error"]["code"],
                "{theirs} {none}"
            );
        }
        let own = get(url, alice, &task).await;
        assert!(own.get("result").is_some(), "alice's task on {url}: {own}");
    }
}
