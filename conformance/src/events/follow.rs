//! C13 Follow: a replay that stays open and delivers what is appended next.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use super::{Harness, append, open_default, test_clock, test_options};
use mcp_event_store_core::{
    Error, EventId, EventStore, FollowOptions, Replay, Result, Retention, StoredEvent,
};

/// How long a case waits for an event that must come; far above any
/// backend's follow latency, so a miss is a failure, not a slow machine.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The next event of a follow, failing the case if none comes in time.
async fn next_event(follow: &mut Replay, what: &str) -> Result<StoredEvent> {
    match tokio::time::timeout(DELIVERY_TIMEOUT, follow.events.next()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("the follow ended while waiting for {what}"),
        Err(_) => panic!("no event within {DELIVERY_TIMEOUT:?} while waiting for {what}"),
    }
}

/// The next `n` events' payloads, in the order delivered.
async fn next_payloads(follow: &mut Replay, n: usize, what: &str) -> Vec<Vec<u8>> {
    let mut payloads = Vec::with_capacity(n);
    for i in 0..n {
        let event = next_event(follow, what)
            .await
            .unwrap_or_else(|e| panic!("{what}: event {i} failed: {e}"));
        payloads.push(event.data.to_vec());
    }
    payloads
}

async fn follow<S: EventStore + ?Sized>(store: &S, after: &EventId) -> Replay {
    store
        .follow_events_after(&after.to_string(), FollowOptions::default())
        .await
        .unwrap_or_else(|e| panic!("follow after {after} failed: {e}"))
}

/// C13, C3: a follow from mid-stream yields the stored rest, then each event
/// appended afterwards, in order.
pub async fn follow_yields_the_stored_rest_then_live_events<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let first = append(&store, "s", b"1").await;
    append(&store, "s", b"2").await;
    append(&store, "s", b"3").await;
    let mut follow = follow(&store, &first).await;
    assert_eq!(follow.stream_id, "s");
    assert_eq!(
        next_payloads(&mut follow, 2, "the stored rest").await,
        [b"2".to_vec(), b"3".to_vec()]
    );
    for i in 4..=6u8 {
        let id = append(&store, "s", &[b'0' + i]).await;
        let event = next_event(&mut follow, "a live event").await.unwrap();
        assert_eq!(event.id, id, "the follow delivered another event");
        assert_eq!(&event.data[..], &[b'0' + i]);
    }
    drop(follow);
    h.close(store).await;
}

/// C13: a follow from the newest id waits, then delivers what comes.
pub async fn follow_from_the_newest_event_waits_for_the_next<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let newest = append(&store, "s", b"newest").await;
    let mut follow = follow(&store, &newest).await;
    let pending = tokio::time::timeout(Duration::from_millis(200), follow.events.next()).await;
    assert!(
        pending.is_err(),
        "the follow yielded or ended with nothing new"
    );
    let next = append(&store, "s", b"next").await;
    assert_eq!(
        next_event(&mut follow, "the next event").await.unwrap().id,
        next
    );
    drop(follow);
    h.close(store).await;
}

/// C13, C11: events appended through another handle on the same storage
/// (another process, another server instance) reach the follower.
pub async fn follow_delivers_appends_from_another_handle<H: Harness>(h: &H) {
    let clock = test_clock();
    let reader = h.open(test_options(&clock)).await;
    let writer = h.open(test_options(&clock)).await;
    let start = append(&writer, "s", b"start").await;
    let mut follow = follow(&reader, &start).await;
    for i in 0..5u8 {
        let id = append(&writer, "s", &[i]).await;
        let event = next_event(&mut follow, "an event from the other handle")
            .await
            .unwrap();
        assert_eq!(event.id, id);
    }
    drop(follow);
    h.close(reader).await;
    h.close(writer).await;
}

/// C13, C3, C6: 1,000 concurrent appends while following: the follower
/// gets every acknowledged event once, in store order, with no gap at the
/// seam between stored and live events.
pub async fn follow_under_concurrent_appends_has_no_gap_and_no_duplicate<H: Harness>(h: &H) {
    const WRITERS: usize = 10;
    const PER_WRITER: usize = 100;
    let (store, _) = open_default(h).await;
    let store = Arc::new(store);
    let start = append(&*store, "hot", b"start").await;
    // Some events stored before the follow opens, the rest live.
    for i in 0..10u8 {
        append(&*store, "hot", &[i]).await;
    }
    let mut follow = follow(&*store, &start).await;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::with_capacity(PER_WRITER);
                for i in 0..PER_WRITER {
                    ids.push(append(&*store, "hot", format!("{w}-{i}").as_bytes()).await);
                }
                ids
            })
        })
        .collect();
    let total = 10 + WRITERS * PER_WRITER;
    let mut delivered = Vec::with_capacity(total);
    for _ in 0..total {
        let event = next_event(&mut follow, "an acknowledged event")
            .await
            .unwrap();
        if let Some(previous) = delivered.last() {
            assert!(
                event.id.position > *previous,
                "the follow went backwards or repeated: {} after {previous}",
                event.id.position
            );
        }
        delivered.push(event.id.position);
    }
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    for id in &acknowledged {
        assert!(
            delivered.contains(&id.position),
            "acknowledged {id} was never delivered"
        );
    }
    let extra = tokio::time::timeout(Duration::from_millis(100), follow.events.next()).await;
    assert!(
        extra.is_err(),
        "the follow delivered more than was appended"
    );
    drop(follow);
    h.close(Arc::into_inner(store).expect("writers are done"))
        .await;
}

/// C13: dropping a follow releases what it held; the handle counts no
/// open follow afterwards.
pub async fn dropped_follow_releases_everything<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    assert_eq!(store.open_follows(), 0);
    let mut follows = Vec::new();
    for _ in 0..3 {
        follows.push(follow(&store, &start).await);
    }
    let other = append(&store, "other", b"x").await;
    follows.push(follow(&store, &other).await);
    assert_eq!(store.open_follows(), 4);
    follows.truncate(1);
    assert_eq!(store.open_follows(), 1);
    drop(follows);
    assert_eq!(store.open_follows(), 0, "a dropped follow is still counted");
    // Appends after every follower went still work, and wake no one.
    append(&store, "s", b"after").await;
    assert_eq!(store.open_follows(), 0);
    h.close(store).await;
}

/// C13: the maximum hold ends a follow that has nothing more to deliver,
/// after delivering what was stored.
pub async fn follow_ends_after_its_maximum_hold<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    append(&store, "s", b"stored").await;
    let mut follow = store
        .follow_events_after(
            &start.to_string(),
            FollowOptions::default().max_hold(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert_eq!(
        next_payloads(&mut follow, 1, "the stored event").await,
        [b"stored"]
    );
    match tokio::time::timeout(DELIVERY_TIMEOUT, follow.events.next()).await {
        Ok(None) => {}
        Ok(Some(event)) => panic!("expected the follow to end, got {:?}", event.map(|e| e.id)),
        Err(_) => panic!("the follow outlived its maximum hold by {DELIVERY_TIMEOUT:?}"),
    }
    drop(follow);
    assert_eq!(store.open_follows(), 0);
    h.close(store).await;
}

/// C13: a follow told to end ([`FollowOptions::until`]) ends only after it
/// delivered everything stored before it was told, including an event
/// appended through another handle just before, whose wake-up may not have
/// come yet; it holds nothing after.
pub async fn follow_ends_when_told_after_what_is_stored<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    let other = h.open(test_options(&clock)).await;
    let start = append(&store, "s", b"start").await;
    append(&store, "s", b"stored").await;
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let mut follow = store
        .follow_events_after(
            &start.to_string(),
            FollowOptions::default().until(async move {
                let _ = ended.await;
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        next_payloads(&mut follow, 1, "the stored event").await,
        [b"stored"]
    );
    let late = append(&other, "s", b"late").await;
    end.send(()).unwrap();
    let event = next_event(&mut follow, "the event stored before the end")
        .await
        .unwrap();
    assert_eq!(event.id, late);
    match tokio::time::timeout(DELIVERY_TIMEOUT, follow.events.next()).await {
        Ok(None) => {}
        Ok(Some(event)) => panic!("expected the follow to end, got {:?}", event.map(|e| e.id)),
        Err(_) => panic!("the follow went on {DELIVERY_TIMEOUT:?} after it was told to end"),
    }
    drop(follow);
    assert_eq!(store.open_follows(), 0);
    h.close(other).await;
    h.close(store).await;
}

/// C13, C6: a follower of one stream never sees another stream's events,
/// however many are appended there.
pub async fn follow_never_yields_another_streams_events<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let a = append(&store, "a", b"a0").await;
    let mut follow = follow(&store, &a).await;
    for i in 0..50u8 {
        append(&store, "b", &[i]).await;
    }
    let a1 = append(&store, "a", b"a1").await;
    let event = next_event(&mut follow, "stream a's event").await.unwrap();
    assert_eq!(event.id, a1, "the follower of a got another event");
    assert_eq!(&event.data[..], b"a1");
    drop(follow);
    h.close(store).await;
}

/// C13, C5: when retention overtakes a slow follower, the follow yields
/// `EventsPurged` after the events it could still deliver in order, and
/// ends; it never skips the gap.
pub async fn retention_overtaking_a_follower_is_events_purged<H: Harness>(h: &H) {
    let clock = test_clock();
    let options = test_options(&clock).retention(Retention::unbounded().max_events_per_stream(5));
    let store = h.open(options).await;
    let start = append(&store, "s", b"start").await;
    let mut follow = follow(&store, &start).await;
    let one = append(&store, "s", b"1").await;
    assert_eq!(next_event(&mut follow, "event 1").await.unwrap().id, one);
    // The follower stops reading while 20 more are appended and all but
    // the newest five are purged.
    for i in 0..20u8 {
        append(&store, "s", &[i]).await;
    }
    store.purge_expired().await.unwrap();
    let mut previous = one.position;
    loop {
        match next_event(&mut follow, "EventsPurged").await {
            Ok(event) => {
                assert_eq!(
                    event.id.position.minor,
                    previous.minor + 1,
                    "the follow skipped from {previous} to {}",
                    event.id.position
                );
                previous = event.id.position;
            }
            Err(Error::EventsPurged { .. }) => break,
            Err(other) => panic!("expected EventsPurged, got {other}"),
        }
    }
    let after = tokio::time::timeout(DELIVERY_TIMEOUT, follow.events.next()).await;
    assert!(
        matches!(after, Ok(None)),
        "the follow went on after EventsPurged"
    );
    drop(follow);
    h.close(store).await;
}

/// C13, C4: following an id the store never issued fails at once, as a
/// replay does.
pub async fn follow_of_an_unknown_id_is_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let known = append(&store, "s", b"x").await;
    let mut forged = known;
    forged.position.minor += 1_000;
    for id in [forged.to_string(), "garbage".to_owned()] {
        match store
            .follow_events_after(&id, FollowOptions::default())
            .await
        {
            Err(Error::UnknownEventId { .. }) => {}
            Err(other) => panic!("follow after {id:?}: expected UnknownEventId, got {other}"),
            Ok(_) => panic!("follow after {id:?} was accepted"),
        }
    }
    assert_eq!(store.open_follows(), 0);
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_follow {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            follow_yields_the_stored_rest_then_live_events,
            follow_from_the_newest_event_waits_for_the_next,
            follow_delivers_appends_from_another_handle,
            follow_under_concurrent_appends_has_no_gap_and_no_duplicate,
            dropped_follow_releases_everything,
            follow_ends_after_its_maximum_hold,
            follow_ends_when_told_after_what_is_stored,
            follow_never_yields_another_streams_events,
            retention_overtaking_a_follower_is_events_purged,
            follow_of_an_unknown_id_is_refused
        );
    };
}
