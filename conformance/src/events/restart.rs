//! C10, C12: a persistent store survives SIGKILL and reopening with everything
//! acknowledged, continues each stream, keeps sessions, never reissues an
//! id, and refuses a format newer than its own without touching it.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use mcp_event_store_core::{Error, EventStore, NewEvent, Retention, SessionStore};

/// C10, C12: a reopened store replays everything stored before, with the
/// same ids.
pub async fn reopen_replays_everything_acknowledged<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let mut streams = Vec::new();
    for s in 0..3 {
        let stream = format!("stream-{s}");
        let mut ids = Vec::new();
        for i in 0..40u32 {
            ids.push(append(&store, &stream, &i.to_be_bytes()).await);
        }
        streams.push((stream, ids));
    }
    let priming = store
        .store_event("stream-0", NewEvent::priming(Duration::from_secs(5)))
        .await
        .unwrap();
    h.close(store).await;

    let store = h.open(test_options(&clock)).await;
    for (stream, ids) in &streams {
        let (replayed, events) = replay_all(&store, &text(&ids[0])).await.unwrap();
        assert_eq!(replayed, *stream);
        let mut got: Vec<_> = events.iter().map(|e| e.id).collect();
        if stream == "stream-0" {
            assert_eq!(got.pop(), Some(priming));
            assert_eq!(events.last().unwrap().retry, Some(Duration::from_secs(5)));
        }
        assert_eq!(got, ids[1..], "{stream} after reopen");
    }
    h.close(store).await;
}

/// C10: after a reopen, a stream continues with ids after the old ones.
pub async fn reopen_continues_each_stream<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let before = append(&store, "s", b"before").await;
    h.close(store).await;
    let store = h.open(test_options(&clock)).await;
    let after = append(&store, "s", b"after").await;
    assert_eq!(after.token, before.token, "the stream key must persist");
    assert!(after.position > before.position);
    assert_eq!(replay_data(&store, &before).await, vec![b"after".to_vec()]);
    h.close(store).await;
}

/// C10: sessions survive a reopen.
pub async fn reopen_keeps_sessions<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    store
        .put_session("sess", b"state", Duration::from_secs(600))
        .await
        .unwrap();
    h.close(store).await;
    let store: <H as Harness>::Store = h.open(test_options(&clock)).await;
    assert_eq!(
        store.get_session("sess").await.unwrap().as_deref(),
        Some(&b"state"[..])
    );
    h.close(store).await;
}

/// C2, C10: the state that keeps ids from being reissued survives a reopen:
/// a stream deleted and purged, then started again by a new handle, still
/// gets ids never issued before.
pub async fn reopen_never_reissues_ids_of_a_deleted_stream<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let old = append_n(&store, "s", "first", 3).await;
    store.delete_stream("s").await.unwrap();
    store.purge_expired().await.unwrap();
    h.close(store).await;
    let store = h.open(test_options(&clock)).await;
    let new = append_n(&store, "s", "second", 3).await;
    assert_new_life(&store, "s", &old, &new, "second").await;
    h.close(store).await;
}

/// C8, C10: a store reopened with a lower count limit trims the streams
/// that grew under no limit, however many events go at once: after an
/// append to one and a purge, each keeps exactly its newest events, and a
/// cursor into what went is `EventsPurged`.
pub async fn reopen_with_a_lower_count_limit_trims_long_streams<H: Harness>(h: &H) {
    const KEPT: usize = 10;
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let appended = append_n(&store, "appended", "a", LONG_STREAM).await;
    let purged = append_n(&store, "purged", "p", LONG_STREAM).await;
    h.close(store).await;

    let limited =
        test_options(&clock).retention(Retention::unbounded().max_events_per_stream(KEPT as u64));
    let store = h.open(limited).await;
    let newest = append(&store, "appended", b"newest").await;
    store.purge_expired().await.unwrap();
    let retained = |events: Vec<mcp_event_store_core::StoredEvent>| {
        events.into_iter().map(|e| e.id).collect::<Vec<_>>()
    };
    let expected: Vec<_> = appended[LONG_STREAM - (KEPT - 1)..]
        .iter()
        .copied()
        .chain([newest])
        .collect();
    let events = replay_stream_all(&store, "appended").await.unwrap();
    assert_eq!(retained(events), expected, "the stream an append trimmed");
    let events = replay_stream_all(&store, "purged").await.unwrap();
    assert_eq!(
        retained(events),
        purged[LONG_STREAM - KEPT..],
        "the stream the purge trimmed"
    );
    assert_purged(&store, &appended[0]).await;
    assert_purged(&store, &purged[LONG_STREAM - KEPT - 2]).await;
    h.close(store).await;
}

/// C12: storage that a newer release marked with its format is refused
/// with [`Error::IncompatibleFormat`] naming the version, and the refusal
/// changes nothing: with the current version back, every event reads as
/// before.
pub async fn newer_format_is_refused_and_changes_nothing<H: PersistentHarness>(h: &H) {
    let (store, _) = open_default(h).await;
    let first = append(&store, "s", b"before").await;
    append(&store, "s", b"after").await;
    h.close(store).await;

    let current = h.format_version();
    let newer = current + 1;
    h.set_format_version(newer).await;
    match h.try_open(test_options(&test_clock())).await {
        Err(Error::IncompatibleFormat(message)) => assert!(
            message.contains(&newer.to_string()) || message.to_lowercase().contains("newer"),
            "the refusal should name the newer format: {message}"
        ),
        Err(other) => panic!("format {newer}: expected IncompatibleFormat, got {other}"),
        Ok(store) => {
            h.close(store).await;
            panic!("opened storage marked with format {newer}, newer than {current}");
        }
    }

    h.set_format_version(current).await;
    let (store, _) = open_default(h).await;
    assert_eq!(replay_data(&store, &first).await, vec![b"after".to_vec()]);
    h.close(store).await;
}

/// The environment variable that tells [`sigkill_child_appender`] where
/// the storage is ([`PersistentHarness::locator`]).
pub const CRASH_LOCATOR_ENV: &str = "MCP_EVENT_STORE_CRASH_LOCATOR";
/// Streams the crash child appends to at once.
const CRASH_STREAMS: usize = 4;
/// Acknowledgements the parent waits for before the kill.
const ACKS_BEFORE_KILL: usize = 1_000;
/// How long the child may take to acknowledge them.
const CRASH_DEADLINE: Duration = Duration::from_secs(120);

/// C1, C10: a child process appends to several streams under the default
/// durability setting, printing each acknowledged id; it is killed with
/// SIGKILL mid-flight; the storage, reopened here, replays every
/// acknowledged event of every stream, in order.
///
/// `module` is the `module_path!()` of the test, so the child (this test
/// binary running [`sigkill_child_appender`] alone) can be named.
pub async fn acknowledged_events_survive_sigkill<H: PersistentHarness>(h: &H, module: &str) {
    let child_test = crate::testkit::test_path(module, "sigkill_child_appender");
    let locator = h.locator();
    let mut child =
        crate::testkit::ChildLines::spawn(&child_test, &[(CRASH_LOCATOR_ENV, &locator)])
            .expect("start the child");
    let mut log = crate::testkit::AckLog::default();
    let deadline = tokio::time::Instant::now() + CRASH_DEADLINE;
    while log.acknowledged() < ACKS_BEFORE_KILL {
        match child.next_line(deadline).await {
            Ok(Some(line)) => {
                log.record_line(&line);
            }
            Ok(None) => panic!(
                "the child {child_test} ended after {} acknowledgements (run it alone to see why)",
                log.acknowledged()
            ),
            Err(_) => panic!(
                "the child acknowledged {} appends in {CRASH_DEADLINE:?}, expected {ACKS_BEFORE_KILL}",
                log.acknowledged()
            ),
        }
    }
    // What it printed before it died was acknowledged too.
    for line in child.kill().await {
        log.record_line(&line);
    }

    let (store, _) = open_default(h).await;
    let found = log
        .verify(&store)
        .await
        .unwrap_or_else(|e| panic!("after SIGKILL: {e}"));
    assert_eq!(found, log.acknowledged());
    assert_eq!(log.streams().count(), CRASH_STREAMS);
    h.close(store).await;
}

/// The child of [`acknowledged_events_survive_sigkill`]: attaches to the
/// storage named by [`CRASH_LOCATOR_ENV`] (a harness like the one `make`
/// builds) and appends to a few streams at once until it is killed,
/// printing `START` and `ACK` lines ([`Ack`](crate::testkit::Ack)). Run
/// without the variable (by `cargo test -- --ignored`), it has nothing to
/// do.
pub async fn sigkill_child_appender<H, F, Fut>(make: F)
where
    H: PersistentHarness,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = H>,
{
    use std::io::Write;

    use crate::testkit::Ack;

    let Ok(locator) = std::env::var(CRASH_LOCATOR_ENV) else {
        return;
    };
    // `make` only names the harness type; the storage is the parent's.
    let _ = make;
    let harness = H::attach(&locator).await;
    let store = Arc::new(harness.open(StoreOptions::default()).await);
    let print = |ack: Ack| {
        let mut out = std::io::stdout().lock();
        // One write per line, so a kill never leaves a whole wrong line.
        out.write_all(format!("{}\n", ack.line()).as_bytes())
            .and_then(|()| out.flush())
            .expect("stdout");
    };
    let writers: Vec<_> = (0..CRASH_STREAMS)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let stream = format!("crash-{s}");
                let start = append(&*store, &stream, b"start").await;
                print(Ack::Start {
                    stream: stream.clone(),
                    id: start.to_string(),
                });
                for n in 0u64.. {
                    let id = append(&*store, &stream, &Ack::payload(&stream, n)).await;
                    print(Ack::Event {
                        stream: stream.clone(),
                        n,
                        id: id.to_string(),
                    });
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("a writer panicked");
    }
}

/// C20: whatever the database holds (files, rows, keys, values) names no
/// live session id, bound or not, while the states are there to see.
pub async fn no_stored_byte_names_a_live_session<H: PersistentHarness>(h: &H) {
    let store = h.open(test_options(&test_clock())).await;
    let ttl = Duration::from_secs(600);
    let nonce = mcp_event_store_core::backend::StreamKey::generate()
        .unwrap()
        .token("c20")
        .to_string();
    let plain = format!("live-plain-{nonce}");
    let bound = format!("live-bound-{nonce}");
    let marker = format!("state-marker-{nonce}");
    let owner = mcp_event_store_core::task::Owner::principal(b"alice").unwrap();
    store
        .put_session(&plain, marker.as_bytes(), ttl)
        .await
        .unwrap();
    store
        .put_session_as(&owner, &bound, marker.as_bytes(), ttl)
        .await
        .unwrap();
    // Both readable by id, as before.
    assert!(store.get_session(&plain).await.unwrap().is_some());
    assert!(
        store
            .get_session_as(&owner, &bound)
            .await
            .unwrap()
            .is_some()
    );
    let dump = h.stored_bytes().await;
    let holds = |needle: &str| {
        let hex = data_encoding::HEXLOWER.encode(needle.as_bytes());
        [needle.as_bytes(), hex.as_bytes()]
            .iter()
            .any(|n| dump.windows(n.len()).any(|w| w == *n))
    };
    // The dump sees session data (the states are plaintext here), so it
    // would see an id stored beside them.
    assert!(
        holds(&marker),
        "the harness's stored bytes ({} bytes) do not hold a session's state",
        dump.len()
    );
    assert!(
        !holds(&plain),
        "a stored byte names the live session {plain}"
    );
    assert!(
        !holds(&bound),
        "a stored byte names the live session {bound}"
    );
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_restart {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            newer_format_is_refused_and_changes_nothing,
            reopen_replays_everything_acknowledged,
            reopen_continues_each_stream,
            reopen_keeps_sessions,
            no_stored_byte_names_a_live_session,
            reopen_never_reissues_ids_of_a_deleted_stream,
            reopen_with_a_lower_count_limit_trims_long_streams
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn acknowledged_events_survive_sigkill() {
            let harness = $harness.await;
            $crate::events::acknowledged_events_survive_sigkill(&harness, module_path!())
                .await;
            $crate::events::Harness::teardown(harness).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "the child process of acknowledged_events_survive_sigkill"]
        async fn sigkill_child_appender() {
            $crate::events::sigkill_child_appender(|| $harness).await;
        }
    };
}
