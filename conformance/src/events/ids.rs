//! C2, C4, C5: event ids are unique, SSE-safe and never reissued; lookup finds their stream; an id that was never issued, or was altered, is refused and never reaches another stream.

use std::collections::HashSet;
use std::time::Duration;

use super::*;
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{Error, EventId, EventStore, MemoryStore, Position, Retention};

/// The contract's bound on an event id's length (C2).
const SSE_ID_LIMIT: usize = 64;

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
    let stranger = mcp_event_store_core::backend::StreamKey::generate()
        .unwrap()
        .token("s");
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

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_ids {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            ids_are_unique_across_streams,
            ids_are_sse_safe_and_bounded,
            ids_increase_within_a_stream,
            unknown_well_formed_id_is_refused,
            position_never_issued_is_refused,
            positions_with_a_zero_part_are_refused,
            positions_never_issued_between_real_ones_are_refused,
            deleted_stream_started_again_never_reissues_ids,
            expired_stream_started_again_never_reissues_ids,
            truncated_ids_never_reach_another_stream,
            extended_ids_never_reach_another_stream,
            ids_from_another_store_are_refused,
            ids_forged_from_another_streams_id_are_refused,
            garbage_ids_are_refused,
            lookup_finds_the_stream
        );
    };
}
