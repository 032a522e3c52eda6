//! Helpers the case files share.

use std::collections::HashSet;

use super::{append, replay_all};
use mcp_event_store_core::{Error, EventId, EventStore};

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

pub(crate) fn text(id: &EventId) -> String {
    id.to_string()
}

/// Events in the stream of the cases that delete or trim a long stream
/// at once: more than a backend would sensibly touch in one statement
/// (the SQLite store deletes 500 rows per statement), so its batching is
/// crossed twice.
pub(crate) const LONG_STREAM: usize = 1_100;

/// Appends `n` events `<tag>-<i>` to `stream`.
pub(crate) async fn append_n<S: EventStore + ?Sized>(
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
pub(crate) async fn assert_new_life<S: EventStore + ?Sized>(
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

pub(crate) fn pseudo_random_bytes(len: usize, seed: u64) -> Vec<u8> {
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
