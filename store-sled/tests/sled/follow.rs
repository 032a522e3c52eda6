//! Following (C13) on sled: one wake-up hub per database in the process,
//! shared by every handle on it; what idle followers hold; followers end
//! when the database closes or their stream's life ends.
//!
//! Unless a test is about the re-check, handles re-check only once an hour,
//! so a delivery within the 30 s guard can only come from a wake-up.

use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use mcp_event_store_core::{
    Error, EventId, EventStore, FollowOptions, NewEvent, Replay, StoredEvent,
};
use mcp_event_store_sled::testing::followed_streams;
use mcp_event_store_sled::{Durability, MAX_FOLLOW_RECHECK, SledOptions, SledStore};

/// Guard for what must arrive eventually; far above any follow latency.
const GUARD: Duration = Duration::from_secs(30);

fn options() -> SledOptions {
    SledOptions::default().follow_recheck(MAX_FOLLOW_RECHECK)
}

async fn append(store: &SledStore, stream: &str, data: &[u8]) -> EventId {
    store
        .store_event(stream, NewEvent::new(data))
        .await
        .unwrap_or_else(|e| panic!("append to {stream}: {e}"))
}

async fn follow(store: &SledStore, after: &EventId) -> Replay {
    store
        .follow_events_after(&after.to_string(), FollowOptions::default())
        .await
        .unwrap_or_else(|e| panic!("follow after {after}: {e}"))
}

async fn next(follow: &mut Replay) -> Option<mcp_event_store_core::Result<StoredEvent>> {
    tokio::time::timeout(GUARD, follow.events.next())
        .await
        .unwrap_or_else(|_| panic!("nothing within {GUARD:?}"))
}

async fn next_event(follow: &mut Replay) -> StoredEvent {
    match next(follow).await {
        Some(Ok(event)) => event,
        Some(Err(e)) => panic!("the follow failed: {e}"),
        None => panic!("the follow ended"),
    }
}

/// Waits (up to the guard) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + GUARD;
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Handles opened separately on one directory, and handles derived from
/// one, share one hub: a follower on any of them gets the appends made
/// through any other, woken at once (the re-check is an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_on_one_handle_receive_appends_through_another() {
    let dir = tempfile::tempdir().unwrap();
    let a = SledStore::open(dir.path(), options()).await.unwrap();
    let b = SledStore::open(dir.path(), options()).await.unwrap();
    let c = a.handle_with_options(a.options().clone()).await.unwrap();
    let start = append(&b, "s", b"start").await;
    let mut on_a = follow(&a, &start).await;
    let mut on_b = follow(&b, &start).await;
    for (n, writer) in [&a, &b, &c, &b, &a].into_iter().enumerate() {
        let id = append(writer, "s", &[n as u8]).await;
        assert_eq!(next_event(&mut on_a).await.id, id);
        assert_eq!(next_event(&mut on_b).await.id, id);
    }
    // One hub: every handle counts every follower on the database.
    assert_eq!(
        (a.open_follows(), b.open_follows(), c.open_follows()),
        (2, 2, 2)
    );
    drop((on_a, on_b));
    assert_eq!(
        (a.open_follows(), b.open_follows(), c.open_follows()),
        (0, 0, 0)
    );
    for store in [a, b, c] {
        store.close().await.unwrap();
    }
}

/// The hub has one entry per followed stream, shared by the followers of
/// every handle; it goes when the stream's last follower drops, on
/// whichever handle that follower was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_hub_entry_goes_with_the_last_follower() {
    let dir = tempfile::tempdir().unwrap();
    let a = SledStore::open(dir.path(), options()).await.unwrap();
    let b = SledStore::open(dir.path(), options()).await.unwrap();
    let s = append(&a, "s", b"s").await;
    let t = append(&a, "t", b"t").await;
    assert_eq!(followed_streams(&a), 0);
    let s_on_a = follow(&a, &s).await;
    let s_on_b = follow(&b, &s).await;
    let t_on_b = follow(&b, &t).await;
    assert_eq!((followed_streams(&a), followed_streams(&b)), (2, 2));
    assert_eq!(a.open_follows(), 3);
    drop(s_on_a);
    assert_eq!(followed_streams(&b), 2, "s still has a follower on b");
    drop(s_on_b);
    assert_eq!((followed_streams(&a), followed_streams(&b)), (1, 1));
    drop(t_on_b);
    assert_eq!((followed_streams(&a), followed_streams(&b)), (0, 0));
    assert_eq!(a.open_follows(), 0);
    // A follow refused at open leaves no entry either.
    let mut forged = s;
    forged.position.minor += 100;
    assert!(matches!(
        a.follow_events_after(&forged.to_string(), FollowOptions::default())
            .await,
        Err(Error::UnknownEventId { .. })
    ));
    assert_eq!(followed_streams(&a), 0);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// 1,000 idle followers on one handle cost no task (no connection, thread
/// or listener exists to cost): the runtime has as many live tasks as
/// before they opened. Their 10 streams take 10 hub entries; an append
/// reaches its stream's 100 followers; dropping them all empties the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_followers_hold_no_task() {
    const STREAMS: usize = 10;
    const PER_STREAM: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), options()).await.unwrap();
    let mut heads = Vec::new();
    for s in 0..STREAMS {
        heads.push(append(&store, &format!("s{s}"), b"head").await);
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    // The opens' blocking reads are done before they return; their tasks
    // are released a moment later.
    let before = metrics.num_alive_tasks();
    let mut follows = Vec::new();
    for head in &heads {
        for _ in 0..PER_STREAM {
            let mut follow = follow(&store, head).await;
            // Polled until idle: the stored rest (nothing) is delivered and
            // the follow waits for a wake-up.
            assert!(follow.events.next().now_or_never().is_none());
            follows.push(follow);
        }
    }
    assert_eq!(store.open_follows(), STREAMS * PER_STREAM);
    assert_eq!(followed_streams(&store), STREAMS);
    until("the opens' tasks are released", || {
        metrics.num_alive_tasks() <= before
    })
    .await;

    let id = append(&store, "s3", b"live").await;
    for follow in &mut follows[3 * PER_STREAM..4 * PER_STREAM] {
        assert_eq!(next_event(follow).await.id, id);
    }
    drop(follows);
    assert_eq!(store.open_follows(), 0);
    assert_eq!(followed_streams(&store), 0);
    store.close().await.unwrap();
}

/// Idle followers hold the database only weakly: closing its last handle
/// closes it (the follows do not keep the directory locked), and each
/// follow ends at once with `Error::Closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_database_ends_its_follows() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), options()).await.unwrap();
    let head = append(&store, "s", b"head").await;
    let mut follows = Vec::new();
    for _ in 0..3 {
        let mut follow = follow(&store, &head).await;
        assert!(follow.events.next().now_or_never().is_none());
        follows.push(follow);
    }
    store.close().await.unwrap();
    for follow in &mut follows {
        match next(follow).await {
            Some(Err(Error::Closed)) => {}
            Some(other) => panic!("expected Closed, got {:?}", other.map(|e| e.id)),
            None => panic!("the follow ended without saying why"),
        }
        assert!(next(follow).await.is_none(), "the follow went on");
    }
    // Really closed: it opens again from disk with everything in it.
    let again = SledStore::open(dir.path(), options()).await.unwrap();
    let next_id = append(&again, "s", b"after").await;
    assert_eq!(next_id.position.minor, head.position.minor + 1);
    drop(follows);
    again.close().await.unwrap();
}

/// A deleted stream's followers are woken and end with `EventsPurged`
/// (as a replay under way does); they never see the stream's next life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_followed_stream_ends_its_follows() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path(), options()).await.unwrap();
    let head = append(&store, "s", b"head").await;
    let mut follow = follow(&store, &head).await;
    assert!(follow.events.next().now_or_never().is_none());
    assert_eq!(store.delete_stream("s").await.unwrap(), 1);
    append(&store, "s", b"next life").await;
    match next(&mut follow).await {
        Some(Err(Error::EventsPurged { .. })) => {}
        Some(other) => panic!("expected EventsPurged, got {:?}", other.map(|e| e.id)),
        None => panic!("the follow ended without saying why"),
    }
    assert!(next(&mut follow).await.is_none());
    drop(follow);
    store.close().await.unwrap();
}

/// With interval durability an append is acknowledged before it is
/// flushed, and its followers get it at once as well (a flush is not
/// waited for): delivery never lags acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_durability_delivers_on_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(
        dir.path(),
        // A flush only every hour: nothing below waits for one.
        options().durability(Durability::Interval(Duration::from_secs(3600))),
    )
    .await
    .unwrap();
    let head = append(&store, "s", b"head").await;
    let mut follow = follow(&store, &head).await;
    for i in 0..5u8 {
        let id = append(&store, "s", &[i]).await;
        assert_eq!(next_event(&mut follow).await.id, id);
    }
    drop(follow);
    store.close().await.unwrap();
}

/// `?follow_recheck_ms=` sets the re-check of a handle and of the handles
/// derived from it (the re-check itself is tested in the crate, with
/// wake-ups lost on purpose).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_sets_the_recheck() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sled://{}?follow_recheck_ms=20", dir.path().display());
    let store = SledStore::connect(&url).await.unwrap();
    assert_eq!(store.follow_recheck(), Duration::from_millis(20));
    let derived = store
        .handle_with_options(store.options().clone())
        .await
        .unwrap();
    assert_eq!(derived.follow_recheck(), Duration::from_millis(20));
    let default = SledStore::open(dir.path(), SledOptions::default())
        .await
        .unwrap();
    assert_eq!(
        default.follow_recheck(),
        mcp_event_store_sled::DEFAULT_FOLLOW_RECHECK
    );
    drop((derived, default));
    store.close().await.unwrap();
}

/// Not a test: prints follow latency (from `store_event` returning on one
/// handle to the event reaching a follower on another) and append rate with
/// and without 1,000 idle followers.
///
/// `cargo test -p mcp-event-store-sled --test sled -- --ignored --nocapture figures`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, run by hand"]
async fn figures() {
    let dir = tempfile::tempdir().unwrap();
    for durability in [
        Durability::Flush,
        Durability::Interval(Duration::from_millis(50)),
    ] {
        let writer = SledStore::open(dir.path(), options().durability(durability))
            .await
            .unwrap();
        let reader = SledStore::open(dir.path(), options()).await.unwrap();
        for same in [true, false] {
            let head = append(&writer, "lat", b"head").await;
            let mut follow = if same {
                follow(&writer, &head).await
            } else {
                follow(&reader, &head).await
            };
            let mut micros = Vec::new();
            for _ in 0..1_000 {
                let id = append(&writer, "lat", &[0u8; 200]).await;
                let acked = Instant::now();
                assert_eq!(next_event(&mut follow).await.id, id);
                micros.push(acked.elapsed().as_micros());
            }
            micros.sort_unstable();
            println!(
                "{durability:?} follow latency, {} handle: median {} us, p99 {} us (after store_event returned)",
                if same { "same" } else { "other" },
                micros[micros.len() / 2],
                micros[micros.len() * 99 / 100],
            );
        }
        // Alternating, three rounds each: this machine's load varies.
        let mut rates = [Vec::new(), Vec::new()];
        for _round in 0..3 {
            for (slot, idle) in [0usize, 1_000].into_iter().enumerate() {
                let mut follows = Vec::new();
                for i in 0..idle {
                    let head = append(&writer, &format!("idle{}", i % 10), b"h").await;
                    let mut follow = follow(&reader, &head).await;
                    assert!(follow.events.next().now_or_never().is_none());
                    follows.push(follow);
                }
                let start = Instant::now();
                let mut tasks = tokio::task::JoinSet::new();
                for w in 0..8 {
                    let writer = writer.clone();
                    tasks.spawn(async move {
                        for _ in 0..500 {
                            append(&writer, &format!("rate{w}"), &[0u8; 200]).await;
                        }
                    });
                }
                while let Some(done) = tasks.join_next().await {
                    done.unwrap();
                }
                rates[slot].push((4_000.0 / start.elapsed().as_secs_f64()) as u64);
                drop(follows);
            }
        }
        println!(
            "{durability:?} append rate, 8 writers, events/s per round: 0 idle followers {:?}, 1,000 idle followers {:?}",
            rates[0], rates[1]
        );
        if durability == Durability::Flush {
            let rss = || {
                std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|status| {
                        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
                        line.split_whitespace().nth(1)?.parse::<u64>().ok()
                    })
                    .unwrap_or(0)
            };
            let head = append(&writer, "mem", b"h").await;
            let before = rss();
            let mut follows = Vec::new();
            for _ in 0..10_000 {
                let mut follow = follow(&reader, &head).await;
                assert!(follow.events.next().now_or_never().is_none());
                follows.push(follow);
            }
            let after = rss();
            println!(
                "10,000 idle followers: resident memory grew by {} KiB (about {} bytes each)",
                after.saturating_sub(before),
                after.saturating_sub(before) * 1024 / 10_000
            );
            drop(follows);
        }
        drop(reader);
        writer.close().await.unwrap();
    }
}
