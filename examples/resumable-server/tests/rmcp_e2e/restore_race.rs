//! Two requests of one session arriving together on an instance that must
//! restore it: two server processes on one store, each session opened on
//! A, then two requests of it sent to B at once (two `POST`s, a `POST` and
//! the standalone `GET`, a `POST` and a resume). rmcp 3.11 alone could
//! answer one of them 500: the one that found the session absent but
//! reached rmcp's restore after the other had restored it
//! (`AlreadyPresent`), or the one that saw the session held before its
//! restored handshake was replayed. Every request must be served as the
//! session's.
//!
//! The second request of a pair leaves a little later each time (0 to
//! 1.9 ms, in steps of 100 µs), so that the pairs sweep the restore's
//! window instead of all landing at its start. The windows are narrow
//! (microseconds on an idle loopback): these pairs rarely land in them,
//! with or without the adapter's fix, and this case checks that the whole
//! server serves such pairs. The orderings that fail are forced,
//! deterministically, by the adapter's unit tests
//! (`integrations/rmcp/src/restore_race.rs`). Only backends whose storage
//! two processes share.
//!
//! With callers (C20), a request of the session's owner and one of another
//! caller sent to B at once: the owner's is served, the other's gets what
//! an unknown session gets (404). rmcp 3.11 hands a request that finds the
//! session absent the outcome of the restore attempt under way, so without
//! the adapter's care one of the two got the other's: the other caller
//! 500, or the owner 404. These pairs land in that window most of the
//! time (both look the session up at once).

use std::time::Duration;

use reqwest::header::HeaderValue;
use serde_json::json;

use crate::harness::{ChildServer, Fixture, RETRY};
use crate::wire::{Client, Sse};

/// How many sessions, each restored on B by a pair of requests.
const PAIRS: u64 = 20;

/// Every case on one backend whose storage two processes share.
macro_rules! restore_race_tests {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        restore_race_tests!(@shared $shared $backend);
    };
    (@shared no $backend:ident) => {};
    (@shared yes $backend:ident) => {
        mod $backend {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn requests_arriving_together_on_the_restoring_instance_are_served() {
                let fixture = crate::harness::Fixture::on(stringify!($backend)).await;
                super::requests_arriving_together_are_served(&fixture).await;
                fixture.teardown().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn another_callers_request_arriving_with_the_owners_on_the_restoring_instance_is_404() {
                let fixture = crate::harness::Fixture::on(stringify!($backend)).await;
                super::another_callers_request_arriving_with_the_owners_is_404(&fixture).await;
                fixture.teardown().await;
            }
        }
    };
}

mcp_event_store::for_each_backend!(restore_race_tests);

fn list(id: u64) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}})
}

/// A `tools/list` sent to `client`'s server: its status, and whether its
/// SSE response carries the answer.
async fn listed(client: &Client, id: u64) -> (u16, bool) {
    let response = client.post(list(id)).await;
    let status = response.status().as_u16();
    if status != 200 {
        return (status, false);
    }
    let events = Sse::new(response).collect_all().await;
    (status, events.iter().any(|event| event.is_response_to(id)))
}

/// What the second request of a pair does.
#[derive(Clone, Copy, Debug)]
enum Second {
    /// Another `tools/list`.
    List,
    /// Opens the session's standalone stream.
    Listen,
    /// Resumes a stream the session began on A.
    Resume,
}

pub async fn requests_arriving_together_are_served(fixture: &Fixture) {
    let args = [
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--retry-ms".to_owned(),
        RETRY.as_millis().to_string(),
    ];
    let [a, b] = [ChildServer::spawn(&args), ChildServer::spawn(&args)];
    for pair in 0..PAIRS {
        let second = [Second::List, Second::Listen, Second::Resume][(pair % 3) as usize];
        let mut on_a = Client::new(&a.url);
        on_a.initialize().await;
        // A stream of the session, begun on A, for the resume.
        let mut cursor = None;
        if let Second::Resume = second {
            let mut call = on_a.call_slow_count(2, 1, 0).await;
            cursor = call.next().await.and_then(|event| event.id);
            drop(call.collect_all().await);
        }
        let on_b = on_a.on(&b.url);
        let delay = Duration::from_micros(100 * (pair % 20));
        let first = listed(&on_b, 10);
        let later = async {
            tokio::time::sleep(delay).await;
            match second {
                Second::List => listed(&on_b, 11).await,
                Second::Listen => {
                    // `listen` asserts the 200; the stream stays open.
                    drop(on_b.listen().await);
                    (200, true)
                }
                Second::Resume => {
                    let cursor = cursor.as_deref().expect("the call's first event has an id");
                    let response = on_b
                        .get_with_last_event_id(HeaderValue::from_str(cursor).unwrap())
                        .await;
                    let status = response.status().as_u16();
                    if status != 200 {
                        return (status, false);
                    }
                    let events = Sse::new(response).collect_all().await;
                    (status, events.iter().any(|event| event.is_response_to(2)))
                }
            }
        };
        let ((first, answered), (later, served)) = tokio::time::timeout(
            Duration::from_secs(60),
            futures_util::future::join(first, later),
        )
        .await
        .unwrap_or_else(|_| panic!("pair {pair} ({second:?}): no answer within a minute"));
        assert_eq!(
            (first, later),
            (200, 200),
            "pair {pair} ({second:?}, the second {delay:?} later): both served as the session's"
        );
        assert!(answered, "pair {pair}: the tools/list is answered");
        assert!(served, "pair {pair} ({second:?}): the second is answered");
        // Both instances go on serving the session.
        assert_eq!(listed(&on_b, 12).await, (200, true), "pair {pair}: B after");
        assert_eq!(listed(&on_a, 13).await, (200, true), "pair {pair}: A after");
    }
}

/// What rmcp answers a `POST` for a session nobody has: its status and
/// body.
async fn unknown_session(client: &Client, id: u64) -> (u16, String) {
    let unknown = client.in_session("00000000-0000-4000-8000-000000000000");
    let response = unknown.post(list(id)).await;
    (
        response.status().as_u16(),
        response.text().await.expect("a body"),
    )
}

/// A session is its caller's (C20) even while it is being restored: each
/// session opened on A by alice, then a `tools/list` of alice and one of
/// another caller (mallory, or no caller at all) with its id sent to B at
/// once, B holding nothing yet. Whichever reaches B's restore first,
/// alice's is served and the other gets exactly what a request for an
/// unknown session gets (404), never 500; afterwards B serves alice and
/// still not the other. The pairs leave in both orders; the deadline only
/// turns a hang into a failure.
pub async fn another_callers_request_arriving_with_the_owners_is_404(fixture: &Fixture) {
    let args = [
        "--store".to_owned(),
        fixture.url().to_owned(),
        "--retry-ms".to_owned(),
        RETRY.as_millis().to_string(),
    ];
    let [a, b] = [ChildServer::spawn(&args), ChildServer::spawn(&args)];
    let alice = Client::new(&a.url).as_caller(Some("Bearer alice"));
    let unknown = unknown_session(&alice.on(&b.url), 1).await;
    assert_eq!(unknown.0, 404, "an unknown session");
    for pair in 0..PAIRS {
        let mut on_a = alice.clone();
        on_a.initialize().await;
        let owner = on_a.on(&b.url);
        let other = owner.as_caller([Some("Bearer mallory"), None][(pair % 2) as usize]);
        let theirs = async {
            let response = other.post(list(11)).await;
            (
                response.status().as_u16(),
                response.text().await.expect("a body"),
            )
        };
        let mine = listed(&owner, 10);
        let (mine, theirs) = tokio::time::timeout(Duration::from_secs(60), async {
            if pair % 4 < 2 {
                futures_util::future::join(mine, theirs).await
            } else {
                let (theirs, mine) = futures_util::future::join(theirs, mine).await;
                (mine, theirs)
            }
        })
        .await
        .unwrap_or_else(|_| panic!("pair {pair}: no answer within a minute"));
        assert_eq!(
            mine,
            (200, true),
            "pair {pair}: the owner's request is served"
        );
        assert_eq!(
            theirs, unknown,
            "pair {pair}: the other caller's request is answered as for an unknown session"
        );
        assert_eq!(
            listed(&owner, 12).await,
            (200, true),
            "pair {pair}: B after"
        );
        assert_eq!(
            other.post(list(13)).await.status().as_u16(),
            404,
            "pair {pair}: the other caller after"
        );
        assert_eq!(listed(&on_a, 14).await, (200, true), "pair {pair}: A after");
    }
}
