//! C22: sessions and events listed as stored and swapped in place, only
//! over the bytes read, changing nothing else.
//!
//! The cases read and write through the store's
//! [`rewriter`](EventStore::rewriter), which works on what the database
//! holds; they compare what the public API shows only when the listing
//! shows the bytes the case wrote (a store with no decorator over it).

use std::time::Duration;

use futures_util::TryStreamExt;

use super::*;
use mcp_event_store_core::rewrite::{RewriteStore, SessionValue, Swap};
use mcp_event_store_core::{Error, EventStore, SessionDigest, SessionStore};

/// The same bytes, each changed: the new value a swap writes.
pub(crate) fn flipped(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().map(|b| b ^ 0x5a).collect()
}

fn rewriter_of<S: EventStore + ?Sized>(store: &S) -> &dyn RewriteStore {
    store
        .rewriter()
        .expect("every store of this project hands out its rewriter (C22)")
}

/// Every session the listing holds, read a page of `limit` at a time.
async fn all_sessions(rewriter: &dyn RewriteStore, limit: usize) -> Vec<SessionValue> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = rewriter
            .session_values(after.as_ref(), limit)
            .await
            .unwrap();
        assert!(page.sessions.len() <= limit, "a page over its limit");
        all.extend(page.sessions);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

/// C22 for sessions: the listing holds each session once, under the
/// digest of its id, ascending, page by page; a swap over the bytes read
/// replaces them and keeps the expiry; a swap over other bytes, of
/// another length or of an unknown session changes nothing.
pub async fn sessions_are_swapped_only_over_the_bytes_read<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    let rewriter = rewriter_of(&store);
    let long = Duration::from_secs(600);
    let ids = ["alpha", "beta", "gamma"];
    for id in ids {
        let state = format!("state of {id}");
        store.put_session(id, state.as_bytes(), long).await.unwrap();
    }
    store
        .put_session("short", b"state of short", Duration::from_secs(10))
        .await
        .unwrap();

    let listed = all_sessions(rewriter, 2).await;
    let digests: Vec<SessionDigest> = listed.iter().map(|s| s.digest).collect();
    let mut expected: Vec<SessionDigest> = ids
        .iter()
        .chain(&["short"])
        .map(|id| SessionDigest::of(id))
        .collect();
    expected.sort();
    assert_eq!(digests, expected, "each session once, ascending by digest");
    let stored = |id: &str| {
        listed
            .iter()
            .find(|s| s.digest == SessionDigest::of(id))
            .map(|s| s.state.clone())
            .unwrap()
    };
    // Without a decorator the store holds what was put.
    let plain = stored("alpha") == b"state of alpha"[..];

    let old = stored("alpha");
    let new = flipped(&old);
    let alpha = SessionDigest::of("alpha");
    assert_eq!(
        rewriter.swap_session(&alpha, &old, &new).await.unwrap(),
        Swap::Swapped
    );
    assert_eq!(
        rewriter.swap_session(&alpha, &old, &old).await.unwrap(),
        Swap::Changed,
        "a swap over bytes no longer there"
    );
    assert!(matches!(
        rewriter.swap_session(&alpha, &new, &new[1..]).await,
        Err(Error::Config(_))
    ));
    let unknown = SessionDigest::of("never stored");
    assert_eq!(
        rewriter.swap_session(&unknown, &old, &new).await.unwrap(),
        Swap::Changed
    );
    let relisted = all_sessions(rewriter, 100).await;
    for session in &relisted {
        let want = if session.digest == alpha {
            new.clone()
        } else {
            stored_of(&listed, &session.digest)
        };
        assert_eq!(session.state[..], want[..], "only alpha changed");
    }
    if plain {
        assert_eq!(
            store.get_session("alpha").await.unwrap().as_deref(),
            Some(&new[..])
        );
        assert_eq!(
            store.get_session("beta").await.unwrap().as_deref(),
            Some(&b"state of beta"[..])
        );
    }

    // The expiry stays: a swapped short session is gone at its time.
    let short = SessionDigest::of("short");
    let old = stored("short");
    assert_eq!(
        rewriter
            .swap_session(&short, &old, &flipped(&old))
            .await
            .unwrap(),
        Swap::Swapped
    );
    clock.advance(Duration::from_secs(11));
    assert_eq!(
        store.get_session("short").await.unwrap(),
        None,
        "a swap extended a session's life"
    );
    assert!(store.get_session("beta").await.unwrap().is_some());
    h.close(store).await;
}

fn stored_of(listed: &[SessionValue], digest: &SessionDigest) -> Vec<u8> {
    listed
        .iter()
        .find(|s| s.digest == *digest)
        .map(|s| s.state.to_vec())
        .unwrap_or_else(|| panic!("session {digest} listed twice or appeared"))
}

/// C22 for events: a stream's events are listed as stored; where the
/// backend rewrites events, a swap over the bytes read replaces one
/// event's data, keeping its id, retry hint and the stream's byte count,
/// and a swap over other bytes, of another length, of another stream or
/// of a stream's earlier life changes nothing. A backend that keeps events
/// in an append-only log refuses every event swap with `Config` and
/// changes nothing.
pub async fn events_are_swapped_only_over_the_bytes_read<H: Harness>(h: &H) {
    let (store, _) = open_default(h).await;
    let rewriter = rewriter_of(&store);
    let first = append(&store, "s1", b"first event").await;
    let second = store
        .store_event(
            "s1",
            NewEvent::new(b"second event").with_retry(Duration::from_millis(1_500)),
        )
        .await
        .unwrap();
    append(&store, "s1", b"third event").await;
    append(&store, "s2", b"other stream").await;

    let listed: Vec<StoredEvent> = rewriter
        .event_values("s1")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), 3);
    assert_eq!((listed[0].id, listed[1].id), (first, second));
    let plain = listed[0].data[..] == b"first event"[..];
    let bytes_before = store.stats().await.unwrap().bytes;

    let old = listed[1].data.clone();
    let new = flipped(&old);
    if !rewriter.rewrites_events() {
        assert!(matches!(
            rewriter.swap_event("s1", &second, &old, &new).await,
            Err(Error::Config(_))
        ));
        let again: Vec<StoredEvent> = rewriter
            .event_values("s1")
            .await
            .unwrap()
            .events
            .try_collect()
            .await
            .unwrap();
        assert_eq!(again, listed, "a refused swap changed an event");
        h.close(store).await;
        return;
    }
    assert_eq!(
        rewriter
            .swap_event("s2", &second, &old, &new)
            .await
            .unwrap(),
        Swap::Changed,
        "an event swapped through another stream"
    );
    assert_eq!(
        rewriter
            .swap_event("s1", &second, &old, &new)
            .await
            .unwrap(),
        Swap::Swapped
    );
    assert_eq!(
        rewriter
            .swap_event("s1", &second, &old, &old)
            .await
            .unwrap(),
        Swap::Changed,
        "a swap over bytes no longer there"
    );
    assert!(matches!(
        rewriter.swap_event("s1", &second, &new, &new[1..]).await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        rewriter.swap_event("", &second, &new, &new).await,
        Err(Error::InvalidStreamId { .. })
    ));

    let after: Vec<StoredEvent> = rewriter
        .event_values("s1")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(after.len(), 3);
    assert_eq!(after[0], listed[0]);
    assert_eq!(after[2], listed[2]);
    assert_eq!((after[1].id, after[1].retry), (second, listed[1].retry));
    assert_eq!(after[1].data[..], new[..]);
    assert_eq!(after[1].retry, Some(Duration::from_millis(1_500)));
    assert_eq!(
        store.stats().await.unwrap().bytes,
        bytes_before,
        "a swap of the same length changed the byte count"
    );
    if plain {
        let (_, replayed) = replay_all(&store, &first.to_string()).await.unwrap();
        assert_eq!(replayed[0].data[..], new[..]);
    }

    // An id of a stream's earlier life never reaches its new events, even
    // at the same sequence with the same bytes.
    let earlier = append(&store, "s3", b"same bytes").await;
    let stored = rewriter
        .event_values("s3")
        .await
        .unwrap()
        .events
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .remove(0)
        .data;
    store.delete_stream("s3").await.unwrap();
    store
        .store_event("s3", NewEvent::new(b"same bytes"))
        .await
        .unwrap();
    let now_stored = rewriter
        .event_values("s3")
        .await
        .unwrap()
        .events
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .remove(0)
        .data;
    if now_stored == stored {
        assert_eq!(
            rewriter
                .swap_event("s3", &earlier, &stored, &flipped(&stored))
                .await
                .unwrap(),
            Swap::Changed,
            "an id of a deleted stream swapped its successor's event"
        );
    }
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_rewrite {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            sessions_are_swapped_only_over_the_bytes_read,
            events_are_swapped_only_over_the_bytes_read
        );
    };
}

#[cfg(test)]
mod tests {
    use super::flipped;

    #[test]
    fn a_flipped_value_differs_in_every_byte() {
        let value = b"{\"a\":1}";
        let new = flipped(value);
        assert_eq!(new.len(), value.len());
        assert!(new.iter().zip(value).all(|(a, b)| a != b));
    }
}
