//! What instances tell each other through the runtime: replies routed to
//! the instance whose request waits, notifications and ended sessions
//! heard by every instance. Two runtimes on one store stand for two
//! instances behind a load balancer.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::{EventStore, MemoryStore, Retention, SessionDigest, StoreOptions};
use mcp_event_store_runtime::{Audience, Heard, Listener, Notification, Reply, Route, Runtime};

/// "Must happen eventually" guard; never a latency bound.
const EVENTUALLY: Duration = Duration::from_secs(30);

async fn runtime(store: &Arc<MemoryStore>) -> Runtime {
    Runtime::builder(store.clone())
        .purge_every(None)
        .start()
        .await
        .unwrap()
}

async fn heard<T>(listener: &mut Listener<T>) -> Heard<T> {
    tokio::time::timeout(EVENTUALLY, listener.next())
        .await
        .expect("heard within the guard")
        .expect("the listener lives")
}

async fn message<T: std::fmt::Debug>(listener: &mut Listener<T>) -> T {
    match heard(listener).await {
        Heard::Message(message) => message,
        Heard::Missed => panic!("the listener missed messages"),
    }
}

/// An answer posted to B for a request A sent reaches A's replies, with
/// its session; one to B's own request, or to an id no runtime minted,
/// stays with B; one for an instance that shut down is refused as gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_reaches_the_instance_whose_request_waits() {
    let store = Arc::new(MemoryStore::new());
    let (a, b) = (runtime(&store).await, runtime(&store).await);
    let mut replies_a = a.replies().await.unwrap();
    let mut replies_b = b.replies().await.unwrap();
    let id = a.request_id();
    let answer = br#"{"jsonrpc":"2.0","id":"x","result":{}}"#;
    assert_eq!(
        b.route_reply("session-1", &id, answer).await.unwrap(),
        Route::Forwarded(a.instance())
    );
    assert_eq!(
        message(&mut replies_a).await,
        Reply {
            session: "session-1".into(),
            message: answer.to_vec().into(),
        }
    );
    for local in [b.request_id(), "0".to_owned(), "not.an.id".to_owned()] {
        assert_eq!(
            b.route_reply("session-1", &local, answer).await.unwrap(),
            Route::Local,
            "{local}"
        );
    }
    let gone = a.instance();
    a.shutdown().await;
    assert_eq!(
        b.route_reply("session-1", &id, answer).await.unwrap(),
        Route::Gone(gone)
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), replies_b.next())
            .await
            .is_err(),
        "B heard a reply meant for A"
    );
    assert!(
        replies_a.next().await.is_none(),
        "a listener outlived its runtime"
    );
    b.shutdown().await;
}

/// A notification raised once, on either instance, is heard by both, in
/// the order raised, with its audience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_is_heard_on_every_instance() {
    let store = Arc::new(MemoryStore::new());
    let (a, b) = (runtime(&store).await, runtime(&store).await);
    let mut on_a = a.notifications().await.unwrap();
    let mut on_b = b.notifications().await.unwrap();
    let all = br#"{"jsonrpc":"2.0","method":"notifications/resources/list_changed"}"#;
    let one = br#"{"jsonrpc":"2.0","method":"notifications/message"}"#;
    a.notify(&Audience::All, all).await.unwrap();
    b.notify(&Audience::session("s-9"), one).await.unwrap();
    for listener in [&mut on_a, &mut on_b] {
        assert_eq!(
            message(listener).await,
            Notification {
                audience: Audience::All,
                message: all.to_vec().into(),
            }
        );
        assert_eq!(
            message(listener).await,
            Notification {
                audience: Audience::session("s-9"),
                message: one.to_vec().into(),
            }
        );
    }
    // What the store keeps names the session by its digest only (C20).
    let streams = store.list_streams(None, 100).await.unwrap().streams;
    assert!(!streams.is_empty());
    for stream in streams {
        assert!(!stream.stream_id.contains("s-9"));
        let kept: Vec<_> = store
            .replay_stream(&stream.stream_id)
            .await
            .unwrap()
            .events
            .try_collect()
            .await
            .unwrap();
        for event in kept {
            assert!(!event.data.windows(3).any(|w| w == b"s-9"), "{event:?}");
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A session ended on one instance is heard ended on every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_session_is_heard_everywhere() {
    let store = Arc::new(MemoryStore::new());
    let (a, b) = (runtime(&store).await, runtime(&store).await);
    let mut on_a = a.ended_sessions().await.unwrap();
    let mut on_b = b.ended_sessions().await.unwrap();
    b.end_session("session-7").await.unwrap();
    let seven = SessionDigest::of("session-7");
    assert_eq!(message(&mut on_a).await, seven);
    assert_eq!(message(&mut on_b).await, seven);
    assert!(a.session_ended("session-7") && b.session_ended("session-7"));
    assert!(!a.session_ended("session-8"));
    a.shutdown().await;
    b.shutdown().await;
}

/// A listener retention overtook says so, then hears what comes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_listener_says_it_missed_and_goes_on() {
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().retention(Retention::unbounded().max_events_per_stream(3)),
    ));
    let a = runtime(&store).await;
    let mut slow = a.ended_sessions().await.unwrap();
    for i in 0..10 {
        a.end_session(&format!("s-{i}")).await.unwrap();
    }
    store.purge_expired().await.unwrap();
    assert_eq!(heard(&mut slow).await, Heard::Missed);
    a.end_session("after").await.unwrap();
    assert_eq!(message(&mut slow).await, SessionDigest::of("after"));
    a.shutdown().await;
}

/// However many notification listeners an instance hands out (one per
/// `subscriptions/listen` request, say), they share one subscription to
/// the store: each hears every notification once. One that falls more
/// than the shared window behind says it missed some and goes on, while
/// the others hear everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notification_listeners_share_one_subscription_and_a_slow_one_misses_alone() {
    let store = Arc::new(MemoryStore::new());
    let a = runtime(&store).await;
    let before = store.open_follows();
    let mut listeners = Vec::new();
    for _ in 0..100 {
        listeners.push(a.notifications().await.unwrap());
    }
    assert_eq!(
        store.open_follows(),
        before + 1,
        "100 listeners, one subscription"
    );
    let mut slow = a.notifications().await.unwrap();
    // More than the shared window (1,024) while `slow` is not polled; the
    // others keep up.
    let raised = 1_100;
    for i in 0..raised {
        a.notify(&Audience::All, format!("{i}").as_bytes())
            .await
            .unwrap();
        for listener in &mut listeners {
            assert_eq!(message(listener).await.message, format!("{i}").into_bytes());
        }
    }
    assert_eq!(heard(&mut slow).await, Heard::Missed);
    // It goes on with what is still in the window, in order, then hears
    // what comes next.
    let mut last: Option<u64> = None;
    while last != Some(raised - 1) {
        let n: u64 = std::str::from_utf8(&message(&mut slow).await.message)
            .unwrap()
            .parse()
            .unwrap();
        assert!(last.is_none_or(|last| n == last + 1), "in order");
        assert!(n < raised, "only what was raised");
        last = Some(n);
    }
    a.notify(&Audience::All, b"after").await.unwrap();
    assert_eq!(message(&mut slow).await.message, b"after".to_vec());
    a.shutdown().await;
    assert!(slow.next().await.is_none(), "listeners end at shutdown");
}

/// Replies follow the instance: once this runtime's instance lapsed and a
/// fresh one replaced it, the requests it sends name the fresh one, and
/// the answers forwarded to it reach the same replies listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_follow_a_replaced_instance() {
    use mcp_event_store_core::ManualClock;
    use mcp_event_store_core::task::{NewTask, Owner};

    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_options(
        StoreOptions::default().clock(clock.clone()),
    ));
    let start = |lease: u64| {
        Runtime::builder(store.clone())
            .lease(Duration::from_secs(lease))
            .purge_every(None)
            .start()
    };
    let (a, b) = (start(30).await.unwrap(), start(3_600).await.unwrap());
    let mut replies = a.replies().await.unwrap();
    let (heard, mut hearing) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Heard::Message(reply)) = replies.next().await {
            if heard.send(reply).is_err() {
                return;
            }
        }
    });
    let first = a.instance();
    clock.advance(Duration::from_secs(31));
    a.create(NewTask::new(&Owner::Anonymous, first))
        .await
        .unwrap();
    assert_ne!(a.instance(), first, "a fresh instance");
    // The listener moves over as it runs: answers forwarded before it did
    // are lost, so answer again until one arrives (never a time bound).
    let deadline = tokio::time::Instant::now() + EVENTUALLY;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no answer to the fresh instance's request arrived"
        );
        let id = a.request_id();
        assert_eq!(
            b.route_reply("session-1", &id, id.as_bytes())
                .await
                .unwrap(),
            Route::Forwarded(a.instance())
        );
        if let Ok(Some(reply)) =
            tokio::time::timeout(Duration::from_millis(200), hearing.recv()).await
        {
            assert_eq!(reply.session, "session-1");
            break;
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}
