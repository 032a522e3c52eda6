//! The cases. Each names the contract clauses it checks.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Harness, append, assert_purged, assert_unknown, open_default, replay_all, replay_data,
    test_clock, test_options, tick,
};
use crate::options::DEFAULT_MAX_PAYLOAD_BYTES;

/// The contract's bound on an event id's length (C2).
const SSE_ID_LIMIT: usize = 64;
use crate::{
    Error, EventId, EventStore, MemoryStore, NewEvent, Position, Retention, SessionStore,
    StreamToken,
};

/// Stream ids that break naive backends: quoting, LIKE wildcards, Redis hash
/// tags, separators, escapes, Unicode.
pub const HOSTILE_STREAM_IDS: &[&str] = &[
    "'",
    "\"",
    "';DROP TABLE events;--",
    "%",
    "a%",
    "_",
    "a_c",
    "abc",
    "{x}",
    "{}",
    "}{",
    "{a}:{b}",
    ":",
    "a:b:common",
    "/",
    "../../etc/passwd",
    "\\",
    "\\x00",
    "*",
    "?",
    "[a-z]",
    " ",
    "\t\n\r",
    "😀",
    "ünïcödé",
    "Δ-漢字-🚀",
    "null",
    "0",
    "v1.aaaaaaaaaaaaaaaaaaaaaaaa.1",
];

fn text(id: &EventId) -> String {
    id.to_string()
}

/// C1, C3: an event comes back with its id, payload and stream.
pub async fn round_trip<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let first = append(&store, "s", b"first").await;
    let second = append(&store, "s", b"second").await;
    let (stream, events) = replay_all(&store, &text(&first)).await.unwrap();
    assert_eq!(stream, "s");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, second);
    assert_eq!(&events[0].data[..], b"second");
    assert_eq!(events[0].retry, None);
    h.close(store).await;
}

/// C3: replay keeps store order and original ids.
pub async fn replay_preserves_order<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut ids = Vec::new();
    for i in 0..50u32 {
        ids.push(append(&store, "s", &i.to_be_bytes()).await);
    }
    let (_, events) = replay_all(&store, &text(&ids[0])).await.unwrap();
    let got: Vec<EventId> = events.iter().map(|e| e.id).collect();
    assert_eq!(got, ids[1..]);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(&event.data[..], &(i as u32 + 1).to_be_bytes());
    }
    h.close(store).await;
}

/// C3: replay after event k starts at k+1, each once.
pub async fn replay_is_strictly_after<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut ids = Vec::new();
    for i in 0..10u8 {
        ids.push(append(&store, "s", &[i]).await);
    }
    for (k, id) in ids.iter().enumerate() {
        let data = replay_data(&store, id).await;
        let want: Vec<Vec<u8>> = (k as u8 + 1..10).map(|i| vec![i]).collect();
        assert_eq!(data, want, "replay after event {k}");
    }
    h.close(store).await;
}

/// C3: a client that saw everything gets an empty replay, not an error.
pub async fn replay_after_the_newest_event_is_empty<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "s", b"a").await;
    let last = append(&store, "s", b"b").await;
    let (stream, events) = replay_all(&store, &text(&last)).await.unwrap();
    assert_eq!(stream, "s");
    assert!(events.is_empty());
    h.close(store).await;
}

/// C7: a priming event (empty data, retry hint) is stored and replayed, and
/// resuming from it works.
pub async fn priming_event_keeps_its_retry_hint<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let before = append(&store, "s", b"before").await;
    let priming = store
        .store_event("s", NewEvent::priming(Duration::from_millis(3_000)))
        .await
        .unwrap();
    let after = append(&store, "s", b"after").await;
    let (_, events) = replay_all(&store, &text(&before)).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].id, priming);
    assert!(events[0].data.is_empty());
    assert_eq!(events[0].retry, Some(Duration::from_millis(3_000)));
    let (_, events) = replay_all(&store, &text(&priming)).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, after);
    h.close(store).await;
}

/// C7: a retry hint travels with a data event too, at millisecond precision.
pub async fn retry_hint_round_trips_with_data<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    for ms in [0u64, 1, 250, 86_400_000] {
        store
            .store_event(
                "s",
                NewEvent::new(b"x").with_retry(Duration::from_millis(ms)),
            )
            .await
            .unwrap();
    }
    let (_, events) = replay_all(&store, &text(&start)).await.unwrap();
    let retries: Vec<_> = events.iter().map(|e| e.retry).collect();
    assert_eq!(
        retries,
        [0u64, 1, 250, 86_400_000].map(|ms| Some(Duration::from_millis(ms)))
    );
    h.close(store).await;
}

/// C3: a replay never yields another stream's events.
pub async fn streams_are_isolated<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let a0 = append(&store, "a", b"a0").await;
    let b0 = append(&store, "b", b"b0").await;
    for i in 1..5u8 {
        append(&store, "a", &[b'a', i]).await;
        append(&store, "b", &[b'b', i]).await;
    }
    let a = replay_data(&store, &a0).await;
    let b = replay_data(&store, &b0).await;
    assert_eq!(a, (1..5u8).map(|i| vec![b'a', i]).collect::<Vec<_>>());
    assert_eq!(b, (1..5u8).map(|i| vec![b'b', i]).collect::<Vec<_>>());
    h.close(store).await;
}

/// C2: ids are unique across every stream.
pub async fn ids_are_unique_across_streams<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut seen = HashSet::new();
    for round in 0..10 {
        for stream in 0..20 {
            let id = append(&store, &format!("stream-{stream}"), b"x").await;
            assert!(seen.insert(text(&id)), "duplicate id {id} in round {round}");
        }
    }
    assert_eq!(seen.len(), 200);
    h.close(store).await;
}

/// C2: ids are ASCII `[0-9A-Za-z._-]`, at most 64 bytes, and parse back.
pub async fn ids_are_sse_safe_and_bounded<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let long = "x".repeat(1024);
    let mut streams: Vec<&str> = HOSTILE_STREAM_IDS.to_vec();
    streams.push(&long);
    for stream in streams {
        let id = text(&append(&store, stream, b"x").await);
        assert!(id.len() <= SSE_ID_LIMIT, "{id} is too long");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
            "{id} is not SSE-safe"
        );
        assert!(EventId::parse(&id).is_some(), "{id} does not parse");
    }
    h.close(store).await;
}

/// C2: ids strictly increase within a stream in store order.
pub async fn ids_increase_within_a_stream<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut previous: Option<EventId> = None;
    for _ in 0..100 {
        let id = append(&store, "s", b"x").await;
        if let Some(previous) = previous {
            assert_eq!(id.token, previous.token, "one stream, one token");
            assert!(id.position > previous.position, "{id} after {previous}");
        }
        previous = Some(id);
    }
    h.close(store).await;
}

/// C5: a well-formed id this store never issued is unknown.
pub async fn unknown_well_formed_id_is_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "s", b"x").await;
    let stranger = crate::StreamKey::generate().unwrap().token("s");
    assert_unknown(&store, &text(&EventId::new(stranger, Position::seq(1)))).await;
    h.close(store).await;
}

/// C5: a position beyond anything issued on the stream is unknown, not an
/// empty replay (a forged future cursor must not silently skip events).
pub async fn position_never_issued_is_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let id = append(&store, "s", b"x").await;
    let far = EventId::new(
        id.token,
        Position {
            major: id.position.major.saturating_add(1 << 40),
            minor: 0,
        },
    );
    assert_unknown(&store, &text(&far)).await;
    h.close(store).await;
}

/// C4, C5: a position with a zero part is never issued (sequence numbers and
/// incarnations start at 1, and Redis never assigns `0-0`), so
/// `v1.<token>.0` and its kin are unknown even on a live stream, never a
/// replay of the whole stream.
pub async fn positions_with_a_zero_part_are_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut issued = Vec::new();
    for i in 0..3u8 {
        issued.push(append(&store, "s", &[i]).await);
    }
    let token = issued[0].token;
    let positions: HashSet<Position> = issued.iter().map(|id| id.position).collect();
    let mut candidates = vec![Position::ZERO];
    for id in &issued {
        candidates.push(Position::new(id.position.major, 0));
        candidates.push(Position::new(0, id.position.minor));
    }
    for candidate in candidates {
        if !positions.contains(&candidate) {
            assert_unknown(&store, &text(&EventId::new(token, candidate))).await;
        }
    }
    h.close(store).await;
}

/// C4, C5: a position next to issued ones but never issued itself (between
/// two events, just before or after one, in a neighbouring incarnation) is
/// unknown: replay refuses it and lookup finds nothing. A backend that only
/// checked "between the first and the newest" would resume from the middle.
pub async fn positions_never_issued_between_real_ones_are_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut issued = Vec::new();
    for i in 0..6u8 {
        issued.push(append(&store, "s", &[i]).await);
        append(&store, "other", &[i]).await;
        tick().await;
    }
    let token = issued[0].token;
    let positions: HashSet<Position> = issued.iter().map(|id| id.position).collect();
    let mut tried = HashSet::new();
    for id in &issued {
        let Position { major, minor } = id.position;
        let mut candidates = vec![
            Position::new(major, minor.saturating_add(1)),
            Position::new(major.saturating_add(1), 1),
            Position::new(major.saturating_add(1), minor),
        ];
        if minor > 1 {
            candidates.push(Position::new(major, minor - 1));
        }
        if major > 1 {
            candidates.push(Position::new(major - 1, minor.max(1)));
        }
        for candidate in candidates {
            if !positions.contains(&candidate) && tried.insert(candidate) {
                assert_unknown(&store, &text(&EventId::new(token, candidate))).await;
            }
        }
    }
    assert!(!tried.is_empty());
    // The real ids still work.
    assert_eq!(replay_data(&store, &issued[2]).await.len(), 3);
    h.close(store).await;
}

/// Appends `n` events `<tag>-<i>` to `stream`.
async fn append_n<S: EventStore + ?Sized>(
    store: &S,
    stream: &str,
    tag: &str,
    n: usize,
) -> Vec<EventId> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(append(store, stream, format!("{tag}-{i}").as_bytes()).await);
    }
    ids
}

/// Checks a stream's new life (`new`, payloads `<tag>-<i>`) against the ids
/// of its earlier lives (`old`): no id issued twice, the new ids after every
/// old one, and no old id resuming into the new life with a hole. The
/// newest old id may resume the new life whole (a backend that kept the
/// stream's numbering going), or be refused; never anything in between.
async fn assert_new_life<S: EventStore + ?Sized>(
    store: &S,
    stream: &str,
    old: &[EventId],
    new: &[EventId],
    tag: &str,
) {
    let old_text: HashSet<String> = old.iter().map(text).collect();
    for id in new {
        assert!(
            !old_text.contains(&text(id)),
            "{id} was issued again to a new life of {stream:?}"
        );
        for earlier in old {
            assert_eq!(id.token, earlier.token, "one stream id, one token");
            assert!(
                id.position > earlier.position,
                "{id} of the new life does not sort after {earlier} of an earlier one"
            );
        }
    }
    let new_data: Vec<Vec<u8>> = (0..new.len())
        .map(|i| format!("{tag}-{i}").into_bytes())
        .collect();
    let newest_old = old.iter().max_by_key(|id| id.position);
    for id in old {
        let found = store.get_stream_id_for_event_id(&text(id)).await.unwrap();
        assert_eq!(
            found, None,
            "lookup of {id} from an earlier life of {stream:?}"
        );
        match replay_all(store, &text(id)).await {
            Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {}
            Err(other) => panic!("replay after {id} from an earlier life: unexpected {other}"),
            Ok((replayed, events)) => {
                let data: Vec<Vec<u8>> = events.iter().map(|e| e.data.to_vec()).collect();
                assert!(
                    Some(id) == newest_old && replayed == stream && data == new_data,
                    "replay after {id} from an earlier life of {stream:?} gave {} events \
                     of {replayed:?}: a partial or foreign replay",
                    data.len()
                );
            }
        }
    }
    let (replayed, events) = replay_all(store, &text(&new[0])).await.unwrap();
    assert_eq!(replayed, stream);
    let data: Vec<Vec<u8>> = events.iter().map(|e| e.data.to_vec()).collect();
    assert_eq!(data, new_data[1..], "the new life replays whole");
    let found = store
        .get_stream_id_for_event_id(&text(&new[0]))
        .await
        .unwrap();
    assert_eq!(found.as_deref(), Some(stream));
}

/// C2, C5: a stream deleted and then started again under the same stream id
/// never reissues an id of an earlier life, before or after the purge that
/// clears the deleted rows; old ids never resume into the new life with a
/// hole.
pub async fn deleted_stream_started_again_never_reissues_ids<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut old = append_n(&store, "s", "first", 3).await;
    assert_eq!(store.delete_stream("s").await.unwrap(), 3);
    let second = append_n(&store, "s", "second", 3).await;
    assert_new_life(&store, "s", &old, &second, "second").await;
    old.extend(&second);
    assert_eq!(store.delete_stream("s").await.unwrap(), 3);
    store.purge_expired().await.unwrap();
    let third = append_n(&store, "s", "third", 3).await;
    assert_new_life(&store, "s", &old, &third, "third").await;
    h.close(store).await;
}

/// C2, C5, C8: a stream that expired whole (rmcp's `<session>:common` idle
/// past the maximum age) and is then written again never reissues an id of
/// an earlier life.
pub async fn expired_stream_started_again_never_reissues_ids<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        )
        .await;
    let mut old = Vec::new();
    for life in ["first", "second", "third"] {
        let ids = append_n(&store, "session:common", life, 3).await;
        if !old.is_empty() {
            assert_new_life(&store, "session:common", &old, &ids, life).await;
        }
        old.extend(ids);
        clock.advance(Duration::from_secs(61));
        let report = store.purge_expired().await.unwrap();
        assert_eq!(report.streams, 1, "{report:?}");
    }
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

/// C14: handles sharing a backend agree on the stream secret after the
/// backend lost all its data (a Redis restarted without persistence): the
/// same stream id gets one token on every handle, old and new, whichever
/// writes first, so a client resuming on any instance sees every event.
/// Backends that cannot lose their data under open handles skip this (their
/// harness says so).
pub async fn handles_converge_after_the_backend_lost_its_data<H: Harness>(h: &H) {
    let clock = test_clock();
    let a = h.open(test_options(&clock)).await;
    let b = h.open(test_options(&clock)).await;
    let before = append(&a, "s", b"before").await;
    assert_eq!(append(&b, "s", b"before-b").await.token, before.token);
    if !h.lose_data().await {
        h.close(a).await;
        h.close(b).await;
        return;
    }
    // An old handle writes first, then a handle opened after the loss.
    let first = append(&a, "s", b"a-1").await;
    let c = h.open(test_options(&clock)).await;
    let mut ids = vec![first];
    ids.push(append(&c, "s", b"c-1").await);
    ids.push(append(&b, "s", b"b-1").await);
    ids.push(append(&a, "s", b"a-2").await);
    for id in &ids {
        assert_eq!(
            id.token, first.token,
            "{id}: handles disagree on the token of \"s\""
        );
    }
    for store in [&a, &b, &c] {
        assert_eq!(
            replay_data(store, &first).await,
            vec![b"c-1".to_vec(), b"b-1".to_vec(), b"a-2".to_vec()]
        );
    }
    // Lost again; this time a handle opened after the loss writes first.
    assert!(h.lose_data().await);
    let d = h.open(test_options(&clock)).await;
    let first = append(&d, "s", b"d-1").await;
    let mut ids = vec![first];
    for (store, data) in [(&a, b"a-3"), (&b, b"b-3"), (&c, b"c-3")] {
        ids.push(append(store, "s", data).await);
    }
    for id in &ids {
        assert_eq!(
            id.token, first.token,
            "{id}: handles disagree on the token of \"s\""
        );
    }
    for store in [&a, &b, &c, &d] {
        assert_eq!(replay_data(store, &first).await.len(), 3);
    }
    for store in [a, b, c, d] {
        h.close(store).await;
    }
}

/// Checks that whatever `candidate` resolves to, it is never a stream other
/// than `own`.
async fn never_another_stream<S: EventStore + ?Sized>(store: &S, candidate: &str, own: &str) {
    match replay_all(store, candidate).await {
        Ok((stream, _)) => assert_eq!(stream, own, "{candidate:?} reached another stream"),
        Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {}
        Err(other) => panic!("replay after {candidate:?}: unexpected error {other}"),
    }
    let found = store.get_stream_id_for_event_id(candidate).await.unwrap();
    assert!(
        found.is_none() || found.as_deref() == Some(own),
        "lookup of {candidate:?} reached {found:?}"
    );
    if EventId::parse(candidate).is_none() {
        assert_unknown(store, candidate).await;
    }
}

/// C4, C5: every prefix of an id is refused or stays on its own stream.
pub async fn truncated_ids_never_reach_another_stream<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "other", b"secret").await;
    let mut last = append(&store, "own", b"x").await;
    for _ in 0..40 {
        last = append(&store, "own", b"x").await;
    }
    let full = text(&last);
    for end in 0..full.len() {
        never_another_stream(&store, &full[..end], "own").await;
    }
    h.close(store).await;
}

/// C4, C5: an id with anything appended is refused or stays on its stream.
pub async fn extended_ids_never_reach_another_stream<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    append(&store, "other", b"secret").await;
    let id = text(&append(&store, "own", b"x").await);
    for suffix in [
        "0", "f", "-1", ".", ".1", " ", "\n", "x", "%", "'", "\0", "😀",
    ] {
        never_another_stream(&store, &format!("{id}{suffix}"), "own").await;
        never_another_stream(&store, &format!("{suffix}{id}"), "own").await;
    }
    h.close(store).await;
}

/// C2, C5: an id issued by another store, for a stream of the same name, is
/// unknown here: tokens are keyed per store.
pub async fn ids_from_another_store_are_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let ours = append(&store, "shared-name", b"ours").await;
    let elsewhere = MemoryStore::new();
    let theirs = append(&elsewhere, "shared-name", b"theirs").await;
    assert_ne!(ours.token, theirs.token);
    assert_unknown(&store, &text(&theirs)).await;
    h.close(store).await;
}

/// C2: knowing a stream's ids gives no way to reach another stream. Tokens
/// one bit away from a real one, with real positions, are unknown; a real
/// token with another stream's positions stays on its own stream.
pub async fn ids_forged_from_another_streams_id_are_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let victim = append(&store, "victim", b"secret").await;
    let mut known = Vec::new();
    for _ in 0..5 {
        known.push(append(&store, "attacker", b"x").await);
    }
    for id in &known {
        let bytes = id.token.as_bytes();
        for bit in [0usize, 7, 60, 119] {
            let mut forged = *bytes;
            forged[bit / 8] ^= 1 << (bit % 8);
            let token = StreamToken::from_bytes(&forged).unwrap();
            assert_ne!(token, victim.token);
            assert_unknown(&store, &text(&EventId::new(token, id.position))).await;
        }
        let crossed = EventId::new(id.token, victim.position);
        never_another_stream(&store, &text(&crossed), "attacker").await;
    }
    h.close(store).await;
}

/// C4, C5: garbage is refused as unknown, never panics, never reaches the
/// backend as query text.
pub async fn garbage_ids_are_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let real = text(&append(&store, "s", b"x").await);
    let huge = "v1.".repeat(350_000);
    let garbage: Vec<String> = vec![
        String::new(),
        " ".into(),
        "0".into(),
        "-1".into(),
        "null".into(),
        "v1".into(),
        "v1.".into(),
        "v1...".into(),
        "v1.%.1".into(),
        "v1._.1".into(),
        "v1.*.1".into(),
        "' OR '1'='1".into(),
        "1; DROP TABLE events".into(),
        "\0".into(),
        "😀".into(),
        "{x}".into(),
        format!("v1.{}.1", "v".repeat(24)),
        format!("v1.{}.1", "w".repeat(24)),
        format!("v1.{}.ffffffffffffffff-ffffffffffffffff", "0".repeat(24)),
        real.replace("v1.", "v2."),
        real.to_uppercase(),
        huge,
    ];
    for id in &garbage {
        assert_unknown(&store, id).await;
    }
    h.close(store).await;
}

/// C4: lookup gives the stream of a retained event.
pub async fn lookup_finds_the_stream<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let a = append(&store, "alpha", b"x").await;
    let b = append(&store, "beta", b"x").await;
    let a2 = append(&store, "alpha", b"x").await;
    for (id, stream) in [(a, "alpha"), (b, "beta"), (a2, "alpha")] {
        let found = store.get_stream_id_for_event_id(&text(&id)).await.unwrap();
        assert_eq!(found.as_deref(), Some(stream));
    }
    h.close(store).await;
}

/// C9: hostile stream ids are stored, replayed, looked up and deleted as
/// plain data, each its own stream.
pub async fn hostile_stream_ids_are_data<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut firsts = Vec::new();
    for (i, stream) in HOSTILE_STREAM_IDS.iter().enumerate() {
        let first = append(&store, stream, format!("{i}-0").as_bytes()).await;
        firsts.push(first);
    }
    for (i, stream) in HOSTILE_STREAM_IDS.iter().enumerate() {
        append(&store, stream, format!("{i}-1").as_bytes()).await;
    }
    for (i, stream) in HOSTILE_STREAM_IDS.iter().enumerate() {
        let (replayed, events) = replay_all(&store, &text(&firsts[i])).await.unwrap();
        assert_eq!(replayed, *stream);
        let data: Vec<_> = events.iter().map(|e| e.data.to_vec()).collect();
        assert_eq!(
            data,
            vec![format!("{i}-1").into_bytes()],
            "stream {stream:?}"
        );
        let found = store
            .get_stream_id_for_event_id(&text(&firsts[i]))
            .await
            .unwrap();
        assert_eq!(found.as_deref(), Some(*stream));
    }
    h.close(store).await;
}

/// C9: a NUL byte in a stream id is either kept as data or refused with
/// `InvalidStreamId`; it never truncates the id onto another stream.
pub async fn nul_in_a_stream_id_is_data_or_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let plain = append(&store, "a", b"plain-0").await;
    append(&store, "a", b"plain-1").await;
    match store.store_event("a\0b", NewEvent::new(b"nul-0")).await {
        Err(Error::InvalidStreamId { .. }) => {}
        Err(other) => panic!("NUL stream id: expected InvalidStreamId, got {other}"),
        Ok(first) => {
            append(&store, "a\0b", b"nul-1").await;
            let (stream, events) = replay_all(&store, &text(&first)).await.unwrap();
            assert_eq!(stream, "a\0b");
            assert_eq!(events.len(), 1);
            assert_eq!(&events[0].data[..], b"nul-1");
        }
    }
    assert_eq!(replay_data(&store, &plain).await, vec![b"plain-1".to_vec()]);
    h.close(store).await;
}

/// C9: deleting `a%` or `a_c` leaves `abc` alone (no LIKE matching).
pub async fn like_wildcards_match_nothing_else<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let abc = append(&store, "abc", b"0").await;
    append(&store, "abc", b"1").await;
    append(&store, "a%", b"x").await;
    append(&store, "a_c", b"x").await;
    assert_eq!(store.delete_stream("a%").await.unwrap(), 1);
    assert_eq!(store.delete_stream("a_c").await.unwrap(), 1);
    assert_eq!(store.delete_stream("%").await.unwrap(), 0);
    assert_eq!(store.delete_stream("_bc").await.unwrap(), 0);
    assert_eq!(replay_data(&store, &abc).await, vec![b"1".to_vec()]);
    h.close(store).await;
}

/// C9: a stream id of exactly 1024 bytes (multi-byte characters) works.
pub async fn stream_id_of_1024_bytes_is_accepted<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let stream = format!("{}{}", "😀".repeat(255), "xxxx");
    assert_eq!(stream.len(), 1024);
    let first = append(&store, &stream, b"0").await;
    append(&store, &stream, b"1").await;
    let (replayed, events) = replay_all(&store, &text(&first)).await.unwrap();
    assert_eq!(replayed, stream);
    assert_eq!(events.len(), 1);
    assert_eq!(store.delete_stream(&stream).await.unwrap(), 2);
    h.close(store).await;
}

/// C9: a stream id of 1025 bytes is refused before anything is stored.
pub async fn stream_id_of_1025_bytes_is_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let stream = "x".repeat(1025);
    let err = store.store_event(&stream, NewEvent::new(b"x")).await;
    assert!(
        matches!(err, Err(Error::InvalidStreamId { .. })),
        "got {err:?}"
    );
    assert!(matches!(
        store.delete_stream(&stream).await,
        Err(Error::InvalidStreamId { .. })
    ));
    h.close(store).await;
}

/// C9: an empty stream id is refused.
pub async fn empty_stream_id_is_refused<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let err = store.store_event("", NewEvent::new(b"x")).await;
    assert!(
        matches!(err, Err(Error::InvalidStreamId { .. })),
        "got {err:?}"
    );
    h.close(store).await;
}

/// C9: a zero-byte payload round-trips (distinct from a priming event only by
/// its missing retry hint).
pub async fn empty_payload_round_trips<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    let empty = append(&store, "s", b"").await;
    let (_, events) = replay_all(&store, &text(&start)).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, empty);
    assert!(events[0].data.is_empty());
    assert_eq!(events[0].retry, None);
    h.close(store).await;
}

fn pseudo_random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// C9: a 1 MiB payload round-trips byte for byte.
pub async fn megabyte_payload_round_trips<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    let big = pseudo_random_bytes(1024 * 1024, 42);
    append(&store, "s", &big).await;
    let data = replay_data(&store, &start).await;
    assert_eq!(data.len(), 1);
    assert!(data[0] == big, "1 MiB payload changed on the way");
    h.close(store).await;
}

/// C9: a payload over the limit is `PayloadTooLarge` and stores nothing; one
/// exactly at the limit is accepted.
pub async fn payload_over_the_limit_is_refused<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let start = append(&store, "s", b"start").await;
    let over = vec![7u8; DEFAULT_MAX_PAYLOAD_BYTES + 1];
    let err = store.store_event("s", NewEvent::new(&over)).await;
    assert!(
        matches!(err, Err(Error::PayloadTooLarge { size, max }) if size == over.len() && max == DEFAULT_MAX_PAYLOAD_BYTES),
        "got {err:?}"
    );
    assert!(replay_data(&store, &start).await.is_empty());
    h.close(store).await;

    let small = h.open(test_options(&clock).max_payload_bytes(1_000)).await;
    let after = append(&small, "s", &[1u8; 1_000]).await;
    let err = small.store_event("s", NewEvent::new(&[1u8; 1_001])).await;
    assert!(
        matches!(err, Err(Error::PayloadTooLarge { .. })),
        "got {err:?}"
    );
    assert!(replay_data(&small, &after).await.is_empty());
    h.close(small).await;
}

/// C9: payloads are bytes, not text: NULs, invalid UTF-8, every byte value.
pub async fn binary_payloads_round_trip<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let start = append(&store, "s", b"start").await;
    let payloads: Vec<Vec<u8>> = vec![
        (0..=255u8).collect(),
        vec![0; 17],
        vec![0xff, 0xfe, 0xc3, 0x28],
        b"line\nbreak\r\nand: data:\n\n".to_vec(),
    ];
    for payload in &payloads {
        append(&store, "s", payload).await;
    }
    assert_eq!(replay_data(&store, &start).await, payloads);
    h.close(store).await;
}

/// C3: many streams, each replaying exactly its own events.
pub async fn many_streams_stay_separate<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let mut firsts = Vec::new();
    for s in 0..300 {
        firsts.push(append(&store, &format!("stream-{s}"), b"0").await);
    }
    for round in 1..3u8 {
        for s in 0..300 {
            append(&store, &format!("stream-{s}"), &[round]).await;
        }
    }
    for (s, first) in firsts.iter().enumerate() {
        let (stream, events) = replay_all(&store, &text(first)).await.unwrap();
        assert_eq!(stream, format!("stream-{s}"));
        let data: Vec<_> = events.iter().map(|e| e.data.to_vec()).collect();
        assert_eq!(data, vec![vec![1u8], vec![2u8]]);
    }
    h.close(store).await;
}

/// C6: 1000 appends to one stream from 20 tasks while a reader follows the
/// stream by cursor. The reader must end up with every acknowledged event,
/// each once, in id order: an event that became visible behind its cursor
/// would be missing.
pub async fn concurrent_appends_to_one_stream_never_open_a_gap<H: Harness>(h: &H) {
    const WRITERS: usize = 20;
    const PER_WRITER: usize = 50;
    let (store, _) = open_default(h).await;
    let store = Arc::new(store);
    let start = append(&*store, "hot", b"start").await;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let reader = {
        let store = store.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut cursor = start;
            let mut seen = Vec::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let (_, events) = replay_all(&*store, &text(&cursor)).await.unwrap();
                for event in events {
                    assert!(event.id.position > cursor.position, "replay went backwards");
                    cursor = event.id;
                    seen.push(event.id);
                }
                if finished {
                    return seen;
                }
                tick().await;
            }
        })
    };

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..PER_WRITER {
                    ids.push(append(&*store, "hot", format!("{w}-{i}").as_bytes()).await);
                }
                ids
            })
        })
        .collect();
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = reader.await.unwrap();

    acknowledged.sort_by_key(|id| id.position);
    assert_eq!(acknowledged.len(), WRITERS * PER_WRITER);
    let unique: HashSet<_> = acknowledged.iter().collect();
    assert_eq!(
        unique.len(),
        acknowledged.len(),
        "duplicate ids acknowledged"
    );
    assert_eq!(
        seen.len(),
        acknowledged.len(),
        "the reader missed events that appeared behind its cursor"
    );
    assert_eq!(seen, acknowledged);
    let store = Arc::into_inner(store).expect("all tasks finished");
    h.close(store).await;
}

/// C6: 32 tasks appending to 32 streams lose and duplicate nothing.
pub async fn concurrent_appends_to_many_streams<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let store = Arc::new(store);
    let tasks: Vec<_> = (0..32)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                let stream = format!("stream-{s}");
                let first = append(&*store, &stream, b"first").await;
                for i in 0..30u32 {
                    append(&*store, &stream, &i.to_be_bytes()).await;
                }
                (first, stream)
            })
        })
        .collect();
    for task in tasks {
        let (first, stream) = task.await.unwrap();
        let (replayed, events) = replay_all(&*store, &text(&first)).await.unwrap();
        assert_eq!(replayed, stream);
        let data: Vec<_> = events.iter().map(|e| e.data.to_vec()).collect();
        let want: Vec<_> = (0..30u32).map(|i| i.to_be_bytes().to_vec()).collect();
        assert_eq!(data, want, "{stream}");
    }
    let store = Arc::into_inner(store).expect("all tasks finished");
    h.close(store).await;
}

/// C8, C5: events older than `max_age` go; a cursor whose successors went
/// is `EventsPurged`; a cursor whose successors all remain still resumes.
pub async fn retention_by_age<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        )
        .await;
    let e1 = append(&store, "s", b"1").await;
    let e2 = append(&store, "s", b"2").await;
    clock.advance(Duration::from_secs(45));
    let e3 = append(&store, "s", b"3").await;
    clock.advance(Duration::from_secs(30));
    let e4 = append(&store, "s", b"4").await;
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 2, "{report:?}");
    assert_eq!(report.streams, 0, "{report:?}");
    assert_purged(&store, &e1).await;
    assert_eq!(
        replay_data(&store, &e2).await,
        vec![b"3".to_vec(), b"4".to_vec()]
    );
    assert_eq!(replay_data(&store, &e3).await, vec![b"4".to_vec()]);
    assert_eq!(
        store.get_stream_id_for_event_id(&text(&e1)).await.unwrap(),
        None
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&e4))
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    h.close(store).await;
}

/// C8: a stream whose every event expired disappears; others stay.
pub async fn stream_expires_entirely_by_age<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(
            test_options(&clock).retention(Retention::unbounded().max_age(Duration::from_secs(60))),
        )
        .await;
    let old = append(&store, "idle", b"x").await;
    append(&store, "idle", b"y").await;
    clock.advance(Duration::from_secs(61));
    let fresh = append(&store, "busy", b"x").await;
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 2, "{report:?}");
    assert_eq!(report.streams, 1, "{report:?}");
    match replay_all(&store, &text(&old)).await {
        Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {}
        other => panic!("replay on an expired stream: {other:?}"),
    }
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&fresh))
            .await
            .unwrap()
            .as_deref(),
        Some("busy")
    );
    h.close(store).await;
}

/// C8, C5: at most `max_events_per_stream` are kept, newest first.
pub async fn retention_by_count<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_events_per_stream(5)))
        .await;
    let mut ids = Vec::new();
    for i in 0..12u8 {
        ids.push(append(&store, "s", &[i]).await);
    }
    let other = append(&store, "other", b"x").await;
    store.purge_expired().await.unwrap();
    assert_purged(&store, &ids[0]).await;
    assert_purged(&store, &ids[5]).await;
    assert_eq!(
        replay_data(&store, &ids[6]).await,
        (7..12u8).map(|i| vec![i]).collect::<Vec<_>>()
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&ids[6]))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&other))
            .await
            .unwrap()
            .as_deref(),
        Some("other")
    );
    h.close(store).await;
}

/// C8, C5: at most `max_bytes_per_stream` payload bytes are kept.
pub async fn retention_by_bytes<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(1_000)))
        .await;
    let mut ids = Vec::new();
    for i in 0..10u8 {
        ids.push(append(&store, "s", &[i; 300]).await);
    }
    store.purge_expired().await.unwrap();
    assert_purged(&store, &ids[0]).await;
    assert_purged(&store, &ids[5]).await;
    assert_eq!(
        replay_data(&store, &ids[6]).await,
        (7..10u8).map(|i| vec![i; 300]).collect::<Vec<_>>()
    );
    h.close(store).await;
}

/// C8: the newest event stays even when it alone exceeds the byte limit, so
/// a stream always has something to resume from until it ages out.
pub async fn newest_event_survives_the_byte_limit<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(100)))
        .await;
    let first = append(&store, "s", &[1; 50]).await;
    let big = append(&store, "s", &[2; 500]).await;
    store.purge_expired().await.unwrap();
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&big))
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    assert!(replay_data(&store, &big).await.is_empty());
    assert_eq!(
        store
            .get_stream_id_for_event_id(&text(&first))
            .await
            .unwrap(),
        None
    );
    h.close(store).await;
}

/// C8: `delete_stream` removes one stream's events and nothing else.
pub async fn delete_stream_removes_only_that_stream<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let doomed = append(&store, "doomed", b"0").await;
    append(&store, "doomed", b"1").await;
    append(&store, "doomed", b"2").await;
    let kept = append(&store, "kept", b"0").await;
    append(&store, "kept", b"1").await;
    assert_eq!(store.delete_stream("doomed").await.unwrap(), 3);
    assert_unknown(&store, &text(&doomed)).await;
    assert_eq!(replay_data(&store, &kept).await, vec![b"1".to_vec()]);
    assert_eq!(store.delete_stream("doomed").await.unwrap(), 0);
    h.close(store).await;
}

/// C8: deleting a stream that never existed removes nothing.
pub async fn delete_unknown_stream_removes_nothing<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let kept = append(&store, "kept", b"0").await;
    assert_eq!(store.delete_stream("never-existed").await.unwrap(), 0);
    assert!(
        store
            .get_stream_id_for_event_id(&text(&kept))
            .await
            .unwrap()
            .is_some()
    );
    h.close(store).await;
}

/// C8: a purge with nothing expired removes nothing.
pub async fn purge_with_nothing_expired_removes_nothing<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h
        .open(test_options(&clock).retention(Retention::default()))
        .await;
    let first = append(&store, "s", b"0").await;
    append(&store, "s", b"1").await;
    store
        .put_session("sess", b"state", Duration::from_secs(600))
        .await
        .unwrap();
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report, crate::PurgeReport::default());
    assert_eq!(replay_data(&store, &first).await, vec![b"1".to_vec()]);
    h.close(store).await;
}

/// C3: a replay longer than one page comes back whole, in order.
pub async fn replay_pages_through_long_streams<H: Harness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock).page_size(7)).await;
    let mut ids = Vec::new();
    for i in 0..100u32 {
        ids.push(append(&store, "long", &i.to_be_bytes()).await);
    }
    for start in [0usize, 6, 7, 13, 14, 98] {
        let (_, events) = replay_all(&store, &text(&ids[start])).await.unwrap();
        let got: Vec<_> = events.iter().map(|e| e.id).collect();
        assert_eq!(got, ids[start + 1..], "replay after event {start}");
    }
    h.close(store).await;
}

/// Session store: put, get, replace, delete.
pub async fn session_round_trip<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let ttl = Duration::from_secs(600);
    assert_eq!(store.get_session("sess").await.unwrap(), None);
    store.put_session("sess", b"one", ttl).await.unwrap();
    assert_eq!(
        store.get_session("sess").await.unwrap().as_deref(),
        Some(&b"one"[..])
    );
    store.put_session("sess", &[0, 255, 0], ttl).await.unwrap();
    assert_eq!(
        store.get_session("sess").await.unwrap().as_deref(),
        Some(&[0u8, 255, 0][..])
    );
    store.put_session("other", b"two", ttl).await.unwrap();
    assert!(store.delete_session("sess").await.unwrap());
    assert_eq!(store.get_session("sess").await.unwrap(), None);
    assert!(!store.delete_session("sess").await.unwrap());
    assert_eq!(
        store.get_session("other").await.unwrap().as_deref(),
        Some(&b"two"[..])
    );
    h.close(store).await;
}

/// Session store: a session is gone once its TTL passes, and a purge removes
/// it for good.
pub async fn session_expires<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    store
        .put_session("short", b"x", Duration::from_secs(10))
        .await
        .unwrap();
    store
        .put_session("long", b"y", Duration::from_secs(1_000))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(11));
    assert_eq!(store.get_session("short").await.unwrap(), None);
    assert!(!store.delete_session("short").await.unwrap());
    store
        .put_session("short2", b"z", Duration::from_secs(10))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(11));
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.sessions, 1, "{report:?}");
    assert_eq!(
        store.get_session("long").await.unwrap().as_deref(),
        Some(&b"y"[..])
    );
    h.close(store).await;
}

/// C9 for sessions: hostile ids are data; empty and oversized ids are refused.
pub async fn session_ids_are_data<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let ttl = Duration::from_secs(600);
    for (i, id) in HOSTILE_STREAM_IDS.iter().enumerate() {
        store.put_session(id, &[i as u8], ttl).await.unwrap();
    }
    for (i, id) in HOSTILE_STREAM_IDS.iter().enumerate() {
        assert_eq!(
            store.get_session(id).await.unwrap().as_deref(),
            Some(&[i as u8][..]),
            "session {id:?}"
        );
    }
    assert!(matches!(
        store.put_session("", b"x", ttl).await,
        Err(Error::InvalidSessionId { .. })
    ));
    assert!(matches!(
        store.put_session(&"x".repeat(1025), b"x", ttl).await,
        Err(Error::InvalidSessionId { .. })
    ));
    h.close(store).await;
}

/// C11: two handles on one storage see each other's events as soon as
/// `store_event` returns.
pub async fn two_handles_share_events<H: Harness>(h: &H) {
    let clock = test_clock();
    let one = h.open(test_options(&clock)).await;
    let two = h.open(test_options(&clock)).await;
    let first = append(&one, "s", b"from one").await;
    for i in 0..20u8 {
        let id = append(&two, "s", &[i]).await;
        assert_eq!(
            one.get_stream_id_for_event_id(&text(&id))
                .await
                .unwrap()
                .as_deref(),
            Some("s"),
            "handle one cannot see {id} just stored by handle two"
        );
    }
    assert_eq!(replay_data(&one, &first).await.len(), 20);
    assert_eq!(replay_data(&two, &first).await.len(), 20);
    h.close(one).await;
    h.close(two).await;
}

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
