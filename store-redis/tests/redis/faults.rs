//! Faults on private `redis-server` processes this test starts (each owned by
//! a guard that kills it on drop): SIGKILL and restart with
//! `appendfsync always`, connections killed under load, and slow replies
//! against the response timeout.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::{Error, EventId, EventStore, NewEvent};
use mcp_event_store_redis::RedisStore;
use mcp_event_store_redis::testing::{RedisHarness, random_prefix};
use tokio::sync::Mutex;

use crate::common::RedisProcess;

/// Acknowledged (id, payload) pairs of one stream, in order.
type Acked = Vec<(EventId, Vec<u8>)>;

/// What the writers saw: acknowledged events per stream, and errors.
#[derive(Default)]
struct Ledger {
    acked: Mutex<HashMap<String, Acked>>,
    acks: AtomicU64,
    errors: AtomicU64,
}

/// Starts `writers` tasks appending to their own streams until `stop`.
fn start_writers(
    store: &Arc<RedisStore>,
    ledger: &Arc<Ledger>,
    stop: &Arc<AtomicBool>,
    writers: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (store, ledger, stop) = (store.clone(), ledger.clone(), stop.clone());
            tokio::spawn(async move {
                let stream = format!("writer-{w}");
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let payload = format!("{w}:{i}").into_bytes();
                    i += 1;
                    match store.store_event(&stream, NewEvent::new(&payload)).await {
                        Ok(id) => {
                            ledger
                                .acked
                                .lock()
                                .await
                                .entry(stream.clone())
                                .or_default()
                                .push((id, payload));
                            ledger.acks.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => {
                            ledger.errors.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

async fn wait_for_acks(ledger: &Ledger, at_least: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while ledger.acks.load(Ordering::SeqCst) < at_least {
        assert!(
            Instant::now() < deadline,
            "only {} of {at_least} appends acknowledged within {within:?} ({} errors)",
            ledger.acks.load(Ordering::SeqCst),
            ledger.errors.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every acknowledged event of every stream is replayable, in order, with its
/// payload (events that failed may or may not be there).
async fn assert_all_acknowledged_replay(store: &RedisStore, ledger: &Ledger) {
    let acked = ledger.acked.lock().await;
    assert!(!acked.is_empty());
    for (stream, events) in acked.iter() {
        let (first, _) = &events[0];
        assert_eq!(
            store
                .get_stream_id_for_event_id(&first.to_string())
                .await
                .unwrap()
                .as_deref(),
            Some(stream.as_str()),
            "the first acknowledged event of {stream} is gone"
        );
        let replay = store
            .replay_events_after(&first.to_string())
            .await
            .unwrap_or_else(|e| panic!("replay of {stream} failed: {e}"));
        let replayed: Vec<_> = replay.events.try_collect().await.unwrap();
        let mut replayed = replayed.iter();
        for (id, payload) in &events[1..] {
            let found = replayed
                .by_ref()
                .find(|e| e.id == *id)
                .unwrap_or_else(|| panic!("acknowledged event {id} of {stream} was lost"));
            assert_eq!(&found.data[..], &payload[..], "{id} changed");
        }
    }
}

/// The Redis *server* killed with SIGKILL under `appendfsync always`, with
/// writers appending, and started again from its AOF: every acknowledged
/// event is there, through the same handle (which reconnects by itself) and
/// a new one. (The shared C10 case kills the appending process instead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_a_server_sigkill_with_appendfsync_always() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RedisProcess::start(
        dir.path(),
        crate::common::free_port(),
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let harness = RedisHarness::with_url(server.url()).await;
    let clock = test_clock();
    let store = Arc::new(
        RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
            .await
            .unwrap(),
    );
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&store, &ledger, &stop, 8);

    wait_for_acks(&ledger, 400, Duration::from_secs(30)).await;
    tokio::task::block_in_place(|| server.kill());
    let acked_before_restart = ledger.acks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| server.restart());

    // The same handle recovers by itself once the server is back.
    wait_for_acks(&ledger, acked_before_restart + 400, Duration::from_secs(30)).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }
    assert!(
        ledger.errors.load(Ordering::SeqCst) > 0,
        "the kill went unnoticed"
    );
    assert_all_acknowledged_replay(&store, &ledger).await;

    // A new connection (as a restarted process would make) sees them too.
    let reopened = RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
        .await
        .unwrap();
    assert_all_acknowledged_replay(&reopened, &ledger).await;
    harness.teardown().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_recovers_after_its_connections_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisProcess::start(
        dir.path(),
        crate::common::free_port(),
        &["--appendonly", "no"],
    );
    let harness = RedisHarness::with_url(server.url()).await;
    let clock = test_clock();
    let store = Arc::new(
        RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)))
            .await
            .unwrap(),
    );
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = start_writers(&store, &ledger, &stop, 6);
    // A reader replaying throughout: its calls may fail, never panic.
    let reads = Arc::new(AtomicU64::new(0));
    tasks.push({
        let (store, stop, reads) = (store.clone(), stop.clone(), reads.clone());
        tokio::spawn(async move {
            let first = loop {
                match store.store_event("reader", NewEvent::new(b"start")).await {
                    Ok(id) => break id,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            };
            while !stop.load(Ordering::SeqCst) {
                let _ = store.store_event("reader", NewEvent::new(b"x")).await;
                if let Ok(replay) = store.replay_events_after(&first.to_string()).await
                    && replay.events.try_collect::<Vec<_>>().await.is_ok()
                {
                    reads.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    });

    wait_for_acks(&ledger, 200, Duration::from_secs(30)).await;
    let url = server.url();
    let mut killed = 0u64;
    for _ in 0..5 {
        let url = url.clone();
        killed += tokio::task::spawn_blocking(move || {
            crate::common::command::<u64>(
                &url,
                redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .arg("SKIPME")
                    .arg("yes"),
            )
        })
        .await
        .unwrap()
        .unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(killed >= 5, "CLIENT KILL found only {killed} connections");
    let after_kills = ledger.acks.load(Ordering::SeqCst);
    let reads_after_kills = reads.load(Ordering::SeqCst);
    wait_for_acks(&ledger, after_kills + 300, Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while reads.load(Ordering::SeqCst) <= reads_after_kills {
        assert!(Instant::now() < deadline, "replays did not recover");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    // Once recovered, calls simply succeed.
    for i in 0..50u8 {
        store
            .store_event("after", NewEvent::new(&[i]))
            .await
            .expect("appends succeed after recovery");
    }
    assert_all_acknowledged_replay(&store, &ledger).await;
    harness.teardown().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_timeout_is_configurable_and_the_store_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisProcess::start(
        dir.path(),
        crate::common::free_port(),
        &["--enable-debug-command", "yes"],
    );
    let clock = test_clock();
    let options = mcp_event_store_redis::RedisOptions::default()
        .store(test_options(&clock))
        .key_prefix(random_prefix())
        .response_timeout(Duration::from_millis(200));
    let store = RedisStore::connect_with(&server.url(), options)
        .await
        .unwrap();
    store
        .store_event("s", NewEvent::new(b"before"))
        .await
        .unwrap();
    let url = server.url();
    let sleeper = tokio::task::spawn_blocking(move || {
        crate::common::command::<()>(&url, redis::cmd("DEBUG").arg("SLEEP").arg("5"))
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = store
        .store_event("s", NewEvent::new(b"during"))
        .await
        .expect_err("the server is asleep for longer than the timeout");
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "redis",
                ..
            }
        ),
        "{err}"
    );
    // The server sleeps five seconds; an error while it still sleeps came
    // from the client's own timeout, not from the server.
    assert!(
        !sleeper.is_finished(),
        "the append waited for the server: the 200 ms timeout did not apply"
    );
    sleeper.await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.store_event("s", NewEvent::new(b"after")).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(server);
}

/// Appends `data` through `store`, retrying while the handle reconnects to
/// a restarted server (an attempt that fails before reaching the server
/// stores nothing).
async fn append_when_back(store: &RedisStore, stream: &str, data: &[u8]) -> EventId {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.store_event(stream, NewEvent::new(data)).await {
            Ok(id) => return id,
            Err(e) => assert!(
                Instant::now() < deadline,
                "no append within 30 s of the restart: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// C14 on a real restart: two handles, the server restarted empty (no
/// persistence), a third handle connecting afterwards (and so storing a new
/// secret first); all three append to one stream id. One token, and every
/// event replays from every handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_converge_after_a_restart_without_persistence() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = RedisProcess::start(
        dir.path(),
        crate::common::free_port(),
        &["--appendonly", "no"],
    );
    let harness = RedisHarness::with_url(server.url()).await;
    let clock = test_clock();
    let open = || RedisStore::connect_with(harness.url(), harness.options(test_options(&clock)));
    let a = open().await.unwrap();
    let b = open().await.unwrap();
    let before = append_when_back(&a, "s", b"before").await;
    assert_eq!(
        append_when_back(&b, "s", b"before-b").await.token,
        before.token
    );

    tokio::task::block_in_place(|| server.restart());
    let c = open().await.unwrap();
    let mut ids = Vec::new();
    for round in 0..3 {
        for (name, store) in [("c", &c), ("a", &a), ("b", &b)] {
            let data = format!("{name}-{round}");
            ids.push((append_when_back(store, "s", data.as_bytes()).await, data));
        }
    }
    let token = ids[0].0.token;
    for (id, data) in &ids {
        assert_eq!(
            id.token, token,
            "{data} got {id}: the handles disagree on the token"
        );
    }
    assert_ne!(token, before.token, "the restarted server kept nothing");
    let (first, _) = &ids[0];
    let want: Vec<&[u8]> = ids[1..].iter().map(|(_, d)| d.as_bytes()).collect();
    for (name, store) in [("a", &a), ("b", &b), ("c", &c)] {
        let replay = store.replay_events_after(&first.to_string()).await.unwrap();
        let events: Vec<_> = replay.events.try_collect().await.unwrap();
        let got: Vec<&[u8]> = events.iter().map(|e| &e.data[..]).collect();
        assert_eq!(got, want, "replay through handle {name}");
        assert_eq!(
            store
                .get_stream_id_for_event_id(&ids.last().unwrap().0.to_string())
                .await
                .unwrap()
                .as_deref(),
            Some("s")
        );
    }
    // The format marker is back too.
    let marker: Option<String> = crate::common::command(
        &server.url(),
        redis::cmd("GET").arg(format!("{}:format", harness.prefix())),
    )
    .unwrap();
    assert_eq!(marker.as_deref(), Some("1"));
    harness.teardown().await;
    drop(server);
}
