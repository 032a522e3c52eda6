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
    // The real-time backstop: both keys expire max_age after the append at
    // the earliest (less the time this test took since), and at most the
    // slack (1 s at this age) later.
    for key in [&events, &meta] {
        let ttl = pttl(&mut conn, key).await;
        assert!((590_000..=601_000).contains(&ttl), "{key}: {ttl}");
    }
    h.teardown().await;
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn pexpire(conn: &mut redis::aio::MultiplexedConnection, key: &str, ms: i64) {
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(ms)
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(set, 1, "{key}");
}

/// The append script sets a stream's TTL only when less than `max_age` is
/// left (to `max_age` plus a slack), not on every append; and every append
/// leaves both keys at least `max_age` to live, whatever TTL it found: the
/// exact `max_age` a release before this one set on every append, none
/// (a store opened without an age limit), or one of a longer `max_age`.
/// Without an age limit, an append removes a TTL it finds.
#[tokio::test]
async fn the_ttl_backstop_is_never_short_and_set_only_when_it_runs_low() {
    const AGE: i64 = 600_000;
    const SLACK: i64 = 1_000;
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let aged = test_options(&clock)
        .retention(Retention::default().max_age(Duration::from_millis(AGE.try_into().unwrap())));
    let store = open(&h, aged.clone()).await;
    let id = store
        .store_event("s", NewEvent::new(b"first"))
        .await
        .unwrap();
    let mut conn = raw(h.url()).await;
    let p = h.prefix();
    let token = id.token.to_text();
    let keys = [
        format!("{p}:v1:{{{token}}}:events"),
        format!("{p}:v1:{{{token}}}:meta"),
    ];
    let at_least_age = async |conn: &mut redis::aio::MultiplexedConnection, what: &str| {
        for key in &keys {
            let ttl = pttl(conn, key).await;
            assert!(
                (AGE - 5_000..=AGE + SLACK).contains(&ttl),
                "{what}: {key}: {ttl}"
            );
        }
    };
    at_least_age(&mut conn, "created").await;

    // Left with more than max_age: not set again.
    for key in &keys {
        pexpire(&mut conn, key, AGE + 500_000).await;
    }
    store
        .store_event("s", NewEvent::new(b"more"))
        .await
        .unwrap();
    for key in &keys {
        let ttl = pttl(&mut conn, key).await;
        assert!(ttl > AGE + SLACK && ttl <= AGE + 500_000, "{key}: {ttl}");
    }

    // Below max_age (as an older release's exact TTL is a moment later, or
    // any TTL once the slack has run out): set to max_age plus the slack.
    for key in &keys {
        pexpire(&mut conn, key, AGE - 1).await;
    }
    store.store_event("s", NewEvent::new(b"low")).await.unwrap();
    for key in &keys {
        let ttl = pttl(&mut conn, key).await;
        assert!((AGE..=AGE + SLACK).contains(&ttl), "{key}: {ttl}");
    }

    // Without an age limit, an append removes the TTL; with one again, the
    // next append sets it.
    let unaged = open(&h, test_options(&clock).retention(Retention::unbounded())).await;
    unaged
        .store_event("s", NewEvent::new(b"no age"))
        .await
        .unwrap();
    for key in &keys {
        assert_eq!(pttl(&mut conn, key).await, -1, "{key}");
    }
    store
        .store_event("s", NewEvent::new(b"aged"))
        .await
        .unwrap();
    at_least_age(&mut conn, "aged again").await;

    // Nothing else moved: every event replays, and the byte counter and
    // the count limit still hold.
    let got: Vec<Vec<u8>> = store
        .replay_stream("s")
        .await
        .unwrap()
        .events
        .map_ok(|e| e.data.to_vec())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        got,
        [&b"first"[..], b"more", b"low", b"no age", b"aged"].map(<[u8]>::to_vec)
    );
    let bytes: String = redis::cmd("HGET")
        .arg(&keys[1])
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(bytes, "22");
    unaged.close().await;
    store.close().await;
    h.teardown().await;
}

/// The previous release's append script (its `TRIM` and `APPEND`, copied
/// verbatim), which set both keys' TTL to exactly `max_age` on every append
/// and read `head_t` and `last` on every append.
const PREVIOUS_APPEND: &str = r#"
local function entry_info(e)
  local f = e[2]
  local t, size = nil, 0
  for i = 1, #f, 2 do
    local name = f[i]
    if name == 't' then t = f[i + 1] elseif name == 'd' then size = #f[i + 1] end
  end
  return t, size
end

local function trim(ev, len, bytes, head_t, cutoff, max_n, max_b, budget)
  local updates = {'bytes', string.format('%d', bytes)}
  local function over(t)
    if len == 0 then return false end
    if cutoff ~= nil and t < cutoff then return true end
    if len < 2 then return false end
    return (max_n ~= nil and len > max_n) or (max_b ~= nil and bytes > max_b)
  end
  if budget == nil or budget < 1 or not over(head_t) then return 0, false, updates end
  local removed, last_id, next_t, done = 0, nil, nil, false
  local want = 1
  if max_n ~= nil and len > max_n then want = len - max_n end
  while not done and removed < budget do
    local n = math.min(want, 8, budget - removed)
    local batch = redis.call('XRANGE', ev, '-', '+', 'COUNT', n + 1)
    if #batch == 0 then done = true; break end
    local ids = {}
    for i, e in ipairs(batch) do
      local t, size = entry_info(e)
      if not over(tonumber(t) or 0) then next_t = t; done = true; break end
      if i > n then break end
      ids[#ids + 1] = e[1]
      last_id = e[1]
      len = len - 1
      bytes = bytes - size
      removed = removed + 1
    end
    if #ids > 0 then redis.call('XDEL', ev, unpack(ids)) end
    want = want * 2
  end
  updates[2] = string.format('%d', bytes)
  if last_id ~= nil then
    updates[#updates + 1] = 'purged'
    updates[#updates + 1] = last_id
  end
  if next_t ~= nil then
    updates[#updates + 1] = 'head_t'
    updates[#updates + 1] = next_t
  end
  return removed, (not done) and removed >= budget, updates
end


local ev, meta = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'sid', 'bytes', 'head_t', 'last', 'pending')
local sid = state[1]
if sid ~= false and sid ~= ARGV[1] then return -1 end
local size = #ARGV[2]
local fields = {'t', ARGV[4], 'd', ARGV[2]}
if ARGV[3] ~= '' then
  fields[5] = 'r'
  fields[6] = ARGV[3]
end
local id = false
local restarted = false
local floor = false
if sid ~= false then
  id = redis.call('XADD', ev, 'NOMKSTREAM', '*', unpack(fields))
  restarted = id == false
  floor = state[4]
elseif redis.call('EXISTS', ev) == 1 then
  local newest = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
  if #newest > 0 then floor = newest[1][1] end
  redis.call('DEL', ev)
  restarted = true
end
if sid == false and not floor then
  floor = redis.call('GET', KEYS[3])
end
local created = id == false
if created then
  if floor then
    -- An empty stream whose last id is the old one, so the new ids sort
    -- after every id the lost incarnation issued.
    redis.call('XADD', ev, 'MAXLEN', '0', floor, 't', '0')
  end
  id = redis.call('XADD', ev, '*', unpack(fields))
  redis.call('DEL', meta, KEYS[3])
  redis.call('HSET', meta, 'sid', ARGV[1], 'base', id, 'last', id, 'bytes', size, 'head_t', ARGV[4],
    'pending', '1')
else
  local max_n, max_b = tonumber(ARGV[5]), tonumber(ARGV[6])
  local bytes = (tonumber(state[2]) or 0) + size
  local updates
  if max_n == nil and max_b == nil then
    updates = {'bytes', string.format('%d', bytes)}
  else
    local len = redis.call('XLEN', ev)
    local _, _, u = trim(ev, len, bytes, tonumber(state[3]) or 0, nil, max_n, max_b, tonumber(ARGV[8]))
    updates = u
  end
  redis.call('HSET', meta, 'last', id, unpack(updates))
end
if ARGV[7] == '' then
  redis.call('PERSIST', ev)
  redis.call('PERSIST', meta)
else
  redis.call('PEXPIRE', ev, ARGV[7])
  redis.call('PEXPIRE', meta, ARGV[7])
end
if restarted then return {id, 'restarted'} end
if created then return {id, 'new'} end
if state[5] then return {id, 'pending'} end
return id
"#;

/// A stream the previous release's append script wrote (no format change
/// since: the same keys, fields and values) is read, appended to, trimmed,
/// replayed and purged by this release as it is; and the previous script,
/// run again after this release's appends, still reads what they wrote
/// (handles of both releases may share a prefix).
#[tokio::test]
async fn a_stream_the_previous_append_script_wrote_works_as_it_is() {
    const AGE: u64 = 600_000;
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let retention = Retention::unbounded()
        .max_age(Duration::from_millis(AGE))
        .max_events_per_stream(4);
    let store = open(&h, test_options(&clock).retention(retention)).await;
    let mut conn = raw(h.url()).await;
    let p = h.prefix();
    let secret: Vec<u8> = redis::cmd("GET")
        .arg(format!("{p}:v1:stream-key"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let token = mcp_event_store_core::backend::StreamKey::from_bytes(&secret)
        .unwrap()
        .token("old")
        .to_text();
    let [events, meta, gone] =
        ["events", "meta", "gone"].map(|k| format!("{p}:v1:{{{token}}}:{k}"));
    let script = redis::Script::new(PREVIOUS_APPEND);
    let previous_append = async |conn: &mut redis::aio::MultiplexedConnection, data: &str| {
        let reply: redis::Value = script
            .key(&events)
            .key(&meta)
            .key(&gone)
            .arg("old")
            .arg(data)
            .arg("")
            .arg(mcp_event_store_core::Clock::now_millis(&*clock))
            .arg(4)
            .arg("")
            .arg(AGE)
            .arg(256)
            .invoke_async(conn)
            .await
            .unwrap();
        reply
    };
    // Five appends by the previous script (the first creates the stream,
    // whose secret check then clears `pending`, as its `CONFIRM` did): the
    // count limit of 4 removed the first.
    for data in ["p1", "p2", "p3", "p4", "p5"] {
        previous_append(&mut conn, data).await;
        let _: i64 = redis::cmd("HDEL")
            .arg(&meta)
            .arg("pending")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let first: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(&events)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(pttl(&mut conn, &events).await, pttl(&mut conn, &meta).await);

    // This release appends to it: same stream, trimmed to 4, the counter
    // right, the TTL at least max_age.
    let n1 = store
        .store_event("old", NewEvent::new(b"n1"))
        .await
        .unwrap();
    assert_eq!(n1.token.to_text(), token);
    let n2 = store
        .store_event("old", NewEvent::new(b"n2"))
        .await
        .unwrap();
    let data = |events: Vec<mcp_event_store_core::StoredEvent>| {
        events
            .into_iter()
            .map(|e| String::from_utf8(e.data.to_vec()).unwrap())
            .collect::<Vec<_>>()
    };
    let whole: Vec<_> = store
        .replay_stream("old")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(data(whole), ["p4", "p5", "n1", "n2"]);
    // A cursor the previous script issued, now trimmed away, is a gap; one
    // still retained resumes.
    let cursor = |entry: &StreamEntry| {
        let (ms, seq) = entry.0.split_once('-').unwrap();
        mcp_event_store_core::EventId::new(
            n1.token,
            mcp_event_store_core::Position::new(ms.parse().unwrap(), seq.parse().unwrap()),
        )
        .to_string()
    };
    let err = replay_all(&store, &cursor(&first[0])).await.unwrap_err();
    assert!(matches!(err, Error::EventsPurged { .. }), "{err}");
    let (stream, after) = replay_all(&store, &cursor(&first[2])).await.unwrap();
    assert_eq!(stream, "old");
    assert_eq!(data(after), ["p5", "n1", "n2"]);
    let bytes: String = redis::cmd("HGET")
        .arg(&meta)
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(bytes, "8");
    for key in [&events, &meta] {
        let ttl = pttl(&mut conn, key).await;
        assert!(ttl >= AGE as i64 - 5_000, "{key}: {ttl}");
    }

    // The previous script appends after this release's: it reads what
    // this release wrote, and this release reads what it wrote.
    previous_append(&mut conn, "p6").await;
    let n3 = store
        .store_event("old", NewEvent::new(b"n3"))
        .await
        .unwrap();
    let (_, after) = replay_all(&store, &n2.to_string()).await.unwrap();
    assert_eq!(data(after), ["p6", "n3"]);

    // Past max_age by the store's clock, the purge removes it whole and
    // leaves its newest id behind, so it starts again after it.
    clock.advance(Duration::from_millis(AGE + 1));
    let report = store.purge_expired().await.unwrap();
    assert_eq!((report.events, report.streams), (4, 1), "{report:?}");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&events)
        .arg(&meta)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    let again = store
        .store_event("old", NewEvent::new(b"again"))
        .await
        .unwrap();
    assert!(again.position > n3.position);
    store.close().await;
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
