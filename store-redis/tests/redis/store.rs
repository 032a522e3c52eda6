//! Redis-specific behaviour on the test server (found as the conformance
//! suite finds it), each test under its own key prefix, removed afterwards.

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_conformance::events::{Harness, append, replay_all, test_clock, test_options};
use mcp_event_store_core::{Error, EventStore, NewEvent, Retention, SessionStore, StoreOptions};
use mcp_event_store_redis::testing::RedisHarness;
use mcp_event_store_redis::{RedisOptions, RedisStore};

/// An `XRANGE` entry as the raw driver reads it: id and field/value pairs.
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn open(h: &RedisHarness, store: StoreOptions) -> RedisStore {
    RedisStore::connect_with(h.url(), h.options(store))
        .await
        .unwrap()
}

#[tokio::test]
async fn keys_follow_the_documented_layout() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(
        &h,
        test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(600))),
    )
    .await;
    let id = store
        .store_event("{evil}:common", NewEvent::new(b"payload"))
        .await
        .unwrap();
    let mut conn = raw(h.url()).await;
    let p = h.prefix();
    let token = id.token.to_text();
    let events = format!("{p}:v1:{{{token}}}:events");
    let meta = format!("{p}:v1:{{{token}}}:meta");

    let marker: String = redis::cmd("GET")
        .arg(format!("{p}:format"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(marker, "1");
    let secret: Vec<u8> = redis::cmd("GET")
        .arg(format!("{p}:v1:stream-key"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(secret.len(), 32);

    let sid: String = redis::cmd("HGET")
        .arg(&meta)
        .arg("sid")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(sid, "{evil}:common");
    // The entry id is the event id's position: <ms>-<seq>.
    let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(&events)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].0,
        format!("{}-{}", id.position.major, id.position.minor)
    );
    let time: (String, String) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let server_ms = time.0.parse::<u64>().unwrap() * 1000;
    assert!(
        id.position.major.abs_diff(server_ms) < 60_000,
        "ms part is server time"
    );
    // The real-time backstop: both keys expire after max_age.
    for key in [&events, &meta] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((1..=600_000).contains(&ttl), "{key}: {ttl}");
    }
    h.teardown().await;
}

#[tokio::test]
async fn bad_prefixes_and_options_are_refused_before_connecting() {
    for prefix in ["", "{tag}", "a}b", "a*", "has space"] {
        let err = RedisStore::connect_with(
            "redis://127.0.0.1:1",
            RedisOptions::default().key_prefix(prefix),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{prefix:?}: {err}");
    }
    let err = RedisStore::connect_with(
        "redis://127.0.0.1:1",
        RedisOptions::default().response_timeout(Duration::ZERO),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = RedisStore::connect("http://127.0.0.1:6379")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connections_agree_on_one_secret() {
    let h = RedisHarness::new().await;
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { open(&h, StoreOptions::default()).await })
        })
        .collect();
    let mut tokens = Vec::new();
    for store in opens {
        let store = store.await.unwrap();
        tokens.push(append(&store, "same", b"x").await.token);
    }
    assert!(tokens.windows(2).all(|w| w[0] == w[1]));
    h.teardown().await;
}

#[tokio::test]
async fn a_purge_racing_a_replay_is_an_error_not_a_gap() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let reader = open(&h, test_options(&clock).page_size(5)).await;
    let mut ids = Vec::new();
    for i in 0..40u8 {
        ids.push(append(&reader, "s", &[i]).await);
    }
    let mut replay = reader
        .replay_events_after(&ids[0].to_string())
        .await
        .unwrap()
        .events;
    for want in 1..=5u8 {
        assert_eq!(&replay.next().await.unwrap().unwrap().data[..], &[want]);
    }
    // Another instance with a count limit trims the stream to its newest 10.
    let trimmer = open(
        &h,
        test_options(&clock).retention(Retention::unbounded().max_events_per_stream(10)),
    )
    .await;
    append(&trimmer, "s", b"new").await;
    match replay.next().await {
        Some(Err(Error::EventsPurged { .. })) => {}
        other => panic!("expected EventsPurged after the trim, got {other:?}"),
    }
    // A replay from inside the retained window still works.
    let (_, events) = replay_all(&reader, &ids[30].to_string()).await.unwrap();
    assert_eq!(events.len(), 10);
    h.teardown().await;
}

#[tokio::test]
async fn a_delete_racing_a_replay_is_an_error_not_another_stream() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock).page_size(3)).await;
    let first = append(&store, "s", b"0").await;
    for i in 1..10u8 {
        append(&store, "s", &[i]).await;
    }
    let mut replay = store
        .replay_events_after(&first.to_string())
        .await
        .unwrap()
        .events;
    replay.next().await.unwrap().unwrap();
    assert_eq!(store.delete_stream("s").await.unwrap(), 10);
    for i in 0..10u8 {
        append(&store, "s", &[100 + i]).await;
    }
    let rest: Vec<_> = replay.collect().await;
    assert!(
        matches!(rest.last(), Some(Err(Error::EventsPurged { .. }))),
        "{rest:?}"
    );
    assert!(
        rest.iter()
            .all(|e| e.as_ref().map_or(true, |e| e.data[0] < 100)),
        "the replay crossed into the recreated stream"
    );
    h.teardown().await;
}

#[tokio::test]
async fn a_token_held_by_another_stream_id_is_refused() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock)).await;
    let id = append(&store, "mine", b"x").await;
    let meta = format!("{}:v1:{{{}}}:meta", h.prefix(), id.token);
    let mut conn = raw(h.url()).await;
    let _: () = redis::cmd("HSET")
        .arg(&meta)
        .arg("sid")
        .arg("someone else")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = store
        .store_event("mine", NewEvent::new(b"y"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert_eq!(store.delete_stream("mine").await.unwrap(), 0);
    let len: u64 = redis::cmd("XLEN")
        .arg(format!("{}:v1:{{{}}}:events", h.prefix(), id.token))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        len, 1,
        "nothing appended to or deleted from the other stream"
    );
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_scans_every_batch() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(
        &h,
        test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
    )
    .await;
    futures_util::stream::iter(0..1_200)
        .for_each_concurrent(32, |s| {
            let store = &store;
            async move {
                append(store, &format!("stream-{s}"), b"x").await;
            }
        })
        .await;
    let kept = append(&store, "kept", b"x").await;
    clock.advance(Duration::from_secs(61));
    append(&store, "fresh", b"x").await;
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.streams, 1_201, "{report:?}");
    assert_eq!(report.events, 1_201, "{report:?}");
    assert_eq!(
        store
            .get_stream_id_for_event_id(&kept.to_string())
            .await
            .unwrap(),
        None
    );
    h.teardown().await;
}

#[tokio::test]
async fn inline_trimming_is_bounded_and_purge_finishes_it() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let unbounded = open(&h, test_options(&clock)).await;
    let mut ids = Vec::new();
    for i in 0..600u32 {
        ids.push(append(&unbounded, "s", &i.to_be_bytes()).await);
    }
    let limited = open(
        &h,
        test_options(&clock).retention(Retention::unbounded().max_events_per_stream(5)),
    )
    .await;
    let newest = append(&limited, "s", b"newest").await;
    // One append removes at most its budget (256), never all 596 at once.
    assert!(
        limited
            .get_stream_id_for_event_id(&ids[300].to_string())
            .await
            .unwrap()
            .is_some()
    );
    let report = limited.purge_expired().await.unwrap();
    assert_eq!(report.events, 601 - 5 - 256, "{report:?}");
    let (_, events) = replay_all(&limited, &ids[595].to_string()).await.unwrap();
    assert_eq!(events.len(), 5);
    assert_eq!(events.last().unwrap().id, newest);
    h.teardown().await;
}

#[tokio::test]
async fn a_page_of_ten_thousand_events_fits_the_default_timeouts() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock).page_size(10_000)).await;
    let first = append(&store, "big", b"start").await;
    let payload = vec![7u8; 1024];
    futures_util::stream::iter(0..10_000)
        .for_each_concurrent(1, |_| async {
            append(&store, "big", &payload).await;
        })
        .await;
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(events.len(), 10_000);
    h.teardown().await;
}

#[tokio::test]
async fn sessions_get_a_real_ttl_backstop_and_a_keyed_name() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock)).await;
    store
        .put_session("{sess}", b"state", Duration::from_secs(10))
        .await
        .unwrap();
    let mut conn = raw(h.url()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*:session", h.prefix()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1);
    assert!(!keys[0].contains("{sess}"), "{}", keys[0]);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((1..=10_000).contains(&ttl), "{ttl}");
    assert!(store.delete_session("{sess}").await.unwrap());
    h.teardown().await;
}

#[tokio::test]
async fn the_byte_counter_matches_the_retained_payloads() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(
        &h,
        test_options(&clock).retention(
            Retention::unbounded()
                .max_bytes_per_stream(1_000)
                .max_events_per_stream(7)
                .max_age(Duration::from_secs(60)),
        ),
    )
    .await;
    let mut conn = raw(h.url()).await;
    let mut token = None;
    for i in 0..200usize {
        let size = (i * 37) % 450;
        token = Some(append(&store, "s", &vec![1u8; size]).await.token);
        if i == 150 {
            clock.advance(Duration::from_secs(61));
        }
    }
    store.purge_expired().await.unwrap();
    let token = token.unwrap();
    let meta = format!("{}:v1:{{{token}}}:meta", h.prefix());
    let events = format!("{}:v1:{{{token}}}:events", h.prefix());
    let counted: u64 = redis::cmd("HGET")
        .arg(&meta)
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap();
    let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(&events)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let retained: usize = entries
        .iter()
        .flat_map(|(_, fields)| fields.iter())
        .filter(|(name, _)| name == "d")
        .map(|(_, value)| value.len())
        .sum();
    assert_eq!(counted, retained as u64);
    assert!(retained <= 1_000 || entries.len() == 1);
    assert!(!entries.is_empty() && entries.len() <= 7);
    h.teardown().await;
}

#[tokio::test]
async fn lost_keys_are_refused_as_gaps_and_the_stream_starts_over() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock)).await;
    let first = append(&store, "s", b"0").await;
    for i in 1..5u8 {
        append(&store, "s", &[i]).await;
    }
    let events = format!("{}:v1:{{{}}}:events", h.prefix(), first.token);
    let meta = format!("{}:v1:{{{}}}:meta", h.prefix(), first.token);
    let mut conn = raw(h.url()).await;

    // The events key goes (as under maxmemory eviction): no silent empty replay.
    let _: () = redis::cmd("DEL")
        .arg(&events)
        .query_async(&mut conn)
        .await
        .unwrap();
    match replay_all(&store, &first.to_string()).await {
        Err(Error::EventsPurged { .. }) => {}
        other => panic!("expected EventsPurged, got {other:?}"),
    }
    // The next append starts a new incarnation; old cursors stay refused.
    let restarted = append(&store, "s", b"new").await;
    assert!(restarted.position > first.position);
    assert!(matches!(
        replay_all(&store, &first.to_string()).await,
        Err(Error::UnknownEventId { .. })
    ));
    let after = append(&store, "s", b"after").await;
    let (_, events_after) = replay_all(&store, &restarted.to_string()).await.unwrap();
    assert_eq!(events_after.len(), 1);
    assert_eq!(events_after[0].id, after);

    // The metadata goes: the orphaned events are dropped, the stream restarts.
    let _: () = redis::cmd("DEL")
        .arg(&meta)
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = append(&store, "s", b"again").await;
    assert!(matches!(
        replay_all(&store, &restarted.to_string()).await,
        Err(Error::UnknownEventId { .. })
    ));
    let (_, tail) = replay_all(&store, &again.to_string()).await.unwrap();
    assert!(tail.is_empty());
    h.teardown().await;
}

/// A stream deleted and re-created under the same id, even within one
/// server millisecond, never issues an id the deleted stream issued, so an
/// old cursor is refused instead of resuming into the new stream.
#[tokio::test]
async fn a_recreated_stream_never_reissues_old_ids() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock)).await;
    for round in 0..50 {
        let mut old_last = append(&store, "s", b"0").await;
        for i in 1..5u8 {
            old_last = append(&store, "s", &[i]).await;
        }
        store.delete_stream("s").await.unwrap();
        let new_first = append(&store, "s", b"new").await;
        assert!(
            new_first.position > old_last.position,
            "round {round}: {new_first} is not after the deleted stream's {old_last}"
        );
        assert!(matches!(
            replay_all(&store, &old_last.to_string()).await,
            Err(Error::UnknownEventId { .. })
        ));
        store.delete_stream("s").await.unwrap();
    }
    h.teardown().await;
}

/// A stream that expired whole and was purged, then started again under the
/// same id, even within one server millisecond, never issues an id of its
/// earlier life (the purge leaves the newest id behind, as a delete does).
#[tokio::test]
async fn a_stream_purged_whole_never_reissues_old_ids() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(
        &h,
        test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
    )
    .await;
    for round in 0..50 {
        let mut old_last = append(&store, "s", b"0").await;
        for i in 1..3u8 {
            old_last = append(&store, "s", &[i]).await;
        }
        clock.advance(Duration::from_secs(61));
        assert_eq!(store.purge_expired().await.unwrap().streams, 1);
        let new_first = append(&store, "s", b"new").await;
        assert!(
            new_first.position > old_last.position,
            "round {round}: {new_first} is not after the purged stream's {old_last}"
        );
        assert!(matches!(
            replay_all(&store, &old_last.to_string()).await,
            Err(Error::UnknownEventId { .. })
        ));
        clock.advance(Duration::from_secs(61));
        assert_eq!(store.purge_expired().await.unwrap().streams, 1);
    }
    h.teardown().await;
}

/// C14 for everything named through the secret, not only appends: after the
/// server lost its data, a handle with an out-of-date secret finds, puts and
/// deletes the sessions and streams that handles with the new one see.
#[tokio::test]
async fn sessions_and_deletes_converge_after_the_backend_lost_its_data() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let ttl = Duration::from_secs(60);
    let a = open(&h, test_options(&clock)).await;
    a.put_session("before", b"0", ttl).await.unwrap();

    // A stale handle puts; a handle opened after the loss reads.
    assert!(h.lose_data().await);
    let d = open(&h, test_options(&clock)).await;
    a.put_session("x", b"1", ttl).await.unwrap();
    assert_eq!(
        d.get_session("x").await.unwrap().as_deref(),
        Some(&b"1"[..])
    );

    // A new handle puts; a stale one reads and deletes.
    assert!(h.lose_data().await);
    let e = open(&h, test_options(&clock)).await;
    e.put_session("y", b"2", ttl).await.unwrap();
    assert_eq!(
        a.get_session("y").await.unwrap().as_deref(),
        Some(&b"2"[..])
    );
    assert!(
        d.delete_session("y").await.unwrap(),
        "the stale handle missed it"
    );
    assert_eq!(e.get_session("y").await.unwrap(), None);

    // A new handle appends; a stale one deletes the stream.
    assert!(h.lose_data().await);
    let f = open(&h, test_options(&clock)).await;
    let id = append(&f, "s", b"3").await;
    assert_eq!(
        a.delete_stream("s").await.unwrap(),
        1,
        "the stale handle missed it"
    );
    assert_eq!(
        f.get_stream_id_for_event_id(&id.to_string()).await.unwrap(),
        None
    );
    h.teardown().await;
}

/// C14 under concurrency: after the loss, stale handles and a handle opened
/// afterwards append to one stream at the same time. Whatever the
/// interleaving (a stream created under the old token, appended to by
/// another stale handle, then discarded), every acknowledged event carries
/// the one token and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_converge_after_the_backend_lost_its_data() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let a = open(&h, test_options(&clock)).await;
    let b = open(&h, test_options(&clock)).await;
    append(&a, "s", b"before").await;
    for round in 0..5 {
        assert!(h.lose_data().await);
        let d = open(&h, test_options(&clock)).await;
        let tasks: Vec<_> = [a.clone(), b.clone(), d.clone()]
            .into_iter()
            .enumerate()
            .map(|(n, store)| {
                tokio::spawn(async move {
                    let mut ids = Vec::new();
                    for i in 0..20 {
                        let data = format!("{round}-{n}-{i}");
                        let id = store
                            .store_event("s", NewEvent::new(data.as_bytes()))
                            .await
                            .unwrap();
                        ids.push((id, data));
                    }
                    ids
                })
            })
            .collect();
        let mut acked = Vec::new();
        for task in tasks {
            acked.extend(task.await.unwrap());
        }
        acked.sort_by_key(|(id, _)| id.position);
        let token = acked[0].0.token;
        assert!(
            acked.iter().all(|(id, _)| id.token == token),
            "round {round}: two tokens"
        );
        let (_, events) = replay_all(&d, &acked[0].0.to_string()).await.unwrap();
        let replayed: Vec<(String, Vec<u8>)> = events
            .iter()
            .map(|e| (e.id.to_string(), e.data.to_vec()))
            .collect();
        let want: Vec<(String, Vec<u8>)> = acked[1..]
            .iter()
            .map(|(id, data)| (id.to_string(), data.as_bytes().to_vec()))
            .collect();
        assert_eq!(replayed, want, "round {round}");
    }
    h.teardown().await;
}

/// `RedisStore::connect` reads this crate's own URL parameters (and takes
/// them out before the redis crate parses the URL): `prefix` puts every key
/// under it, `wait_replicas` and `wait_timeout_ms` set the options; the
/// URL's parameters win over the options given beside it.
#[tokio::test]
async fn url_parameters_are_read_by_connect() {
    let h = RedisHarness::new().await;
    let prefix = h.prefix().to_owned();
    let url = format!("{}?prefix={prefix}&wait_timeout_ms=250", h.url());
    let store = RedisStore::connect(&url).await.unwrap();
    assert_eq!(store.key_prefix(), prefix);
    assert_eq!(store.options().wait_timeout, Duration::from_millis(250));
    assert_eq!(store.options().wait_replicas, 0);
    let id = append(&store, "s", b"x").await;
    let mut conn = raw(h.url()).await;
    let events: bool = redis::cmd("EXISTS")
        .arg(format!("{prefix}:v1:{{{}}}:events", id.token))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(events, "the stream is not under ?prefix=");
    let marker: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}:format"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(marker.as_deref(), Some("1"));

    let over = RedisStore::connect_with(
        &format!("{}?prefix={prefix}", h.url()),
        RedisOptions::default().key_prefix("ignored-prefix"),
    )
    .await
    .unwrap();
    assert_eq!(over.key_prefix(), prefix);
    let err = RedisStore::connect(&format!("{}?prefix=a{{b}}", h.url()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    // A parameter nobody reads is refused, not ignored.
    let err = RedisStore::connect(&format!("{}?prefx={prefix}", h.url()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("`prefx`")),
        "{err}"
    );
    h.teardown().await;
}

/// `close` ends the handle and its clones: every later call is
/// `Error::Closed`, and so are further pages of a replay opened before;
/// closing again does nothing, and other handles go on.
#[tokio::test]
async fn a_closed_store_refuses_every_call() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = open(&h, test_options(&clock).page_size(2)).await;
    let first = append(&store, "s", b"0").await;
    for i in 1..6u8 {
        append(&store, "s", &[i]).await;
    }
    let mut replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let _ = replay.events.next().await.unwrap().unwrap();
    let clone = store.clone();
    store.close().await;
    store.close().await;

    let closed = |r: Result<(), Error>| matches!(r, Err(Error::Closed));
    let mut rest = Vec::new();
    while let Some(event) = replay.events.next().await {
        rest.push(event.map(drop));
    }
    assert!(
        rest.into_iter().any(closed),
        "a replay open at close reads no further pages"
    );
    let id = first.to_string();
    assert!(closed(
        clone.store_event("s", NewEvent::new(b"x")).await.map(drop)
    ));
    assert!(closed(clone.replay_events_after(&id).await.map(drop)));
    assert!(closed(
        clone.get_stream_id_for_event_id(&id).await.map(drop)
    ));
    assert!(closed(clone.delete_stream("s").await.map(drop)));
    assert!(closed(clone.purge_expired().await.map(drop)));
    assert!(closed(
        clone
            .follow_events_after(&id, mcp_event_store_core::FollowOptions::default())
            .await
            .map(drop)
    ));
    assert!(closed(clone.stats().await.map(drop)));
    assert!(closed(clone.list_streams(None, 10).await.map(drop)));
    assert!(closed(clone.check().await.map(drop)));
    assert!(closed(
        clone
            .put_session("sess", b"x", Duration::from_secs(60))
            .await
    ));
    assert!(closed(clone.get_session("sess").await.map(drop)));
    assert!(closed(clone.delete_session("sess").await.map(drop)));
    assert!(closed(clone.destroy().await.map(drop)));

    let other = open(&h, test_options(&clock)).await;
    assert_eq!(replay_all(&other, &id).await.unwrap().1.len(), 5);
    h.teardown().await;
}

/// The harness as a `UrlHarness`: its URL opens a store on its prefix, and
/// removing it removes the prefix's keys.
#[tokio::test]
async fn the_harness_url_opens_its_prefix_and_remove_cleans_it() {
    use mcp_event_store_conformance::events::UrlHarness;

    let h = RedisHarness::new().await;
    let prefix = h.prefix().to_owned();
    let store = RedisStore::connect(&UrlHarness::url(&h)).await.unwrap();
    assert_eq!(store.key_prefix(), prefix);
    append(&store, "s", b"x").await;
    let mut conn = raw(h.url()).await;
    let pattern = format!("{prefix}:*");
    let before: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!before.is_empty());
    Box::new(h).remove().await;
    let after: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(after.is_empty(), "keys left under {prefix}: {after:?}");
}
