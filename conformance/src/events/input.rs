//! C9: stream ids and payloads are opaque data within their limits; anything beyond is a clear error.

use super::*;
use mcp_event_store_core::DEFAULT_MAX_PAYLOAD_BYTES;
use mcp_event_store_core::{Error, EventStore, NewEvent};

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

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_input {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            hostile_stream_ids_are_data,
            nul_in_a_stream_id_is_data_or_refused,
            like_wildcards_match_nothing_else,
            stream_id_of_1024_bytes_is_accepted,
            stream_id_of_1025_bytes_is_refused,
            empty_stream_id_is_refused,
            empty_payload_round_trips,
            megabyte_payload_round_trips,
            payload_over_the_limit_is_refused,
            binary_payloads_round_trip
        );
    };
}
