//! The session store: round trips, expiry, and session ids as data.

use std::time::Duration;

use super::*;
use mcp_event_store_core::{Error, EventStore, SessionStore};

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

/// C20: a session stored for an owner reads, and deletes, for that owner
/// only; for anyone else it is an unknown session.
pub async fn a_session_is_read_only_by_its_owner<H: Harness>(h: &H) {
    use mcp_event_store_core::task::Owner;
    let (store, _) = open_default(h).await;
    let ttl = Duration::from_secs(600);
    let alice = Owner::principal(b"alice").unwrap();
    let bob = Owner::principal(b"bob").unwrap();
    store
        .put_session_as(&alice, "s-alice", b"a", ttl)
        .await
        .unwrap();
    store
        .put_session_as(&Owner::Anonymous, "s-anon", b"n", ttl)
        .await
        .unwrap();
    store.put_session("s-plain", b"p", ttl).await.unwrap();
    for other in [bob, Owner::Anonymous] {
        assert_eq!(store.get_session_as(&other, "s-alice").await.unwrap(), None);
        assert!(!store.delete_session_as(&other, "s-alice").await.unwrap());
    }
    assert_eq!(store.get_session_as(&alice, "s-anon").await.unwrap(), None);
    assert!(!store.delete_session_as(&alice, "s-anon").await.unwrap());
    // A value stored unbound is bound to nobody.
    for who in [alice, Owner::Anonymous] {
        assert_eq!(store.get_session_as(&who, "s-plain").await.unwrap(), None);
    }
    // What the refused calls left is all there.
    assert_eq!(
        store
            .get_session_as(&alice, "s-alice")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"a"[..])
    );
    assert_eq!(
        store
            .get_session_as(&Owner::Anonymous, "s-anon")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"n"[..])
    );
    assert_eq!(
        store.get_session("s-plain").await.unwrap().as_deref(),
        Some(&b"p"[..])
    );
    assert!(store.delete_session_as(&alice, "s-alice").await.unwrap());
    assert_eq!(store.get_session_as(&alice, "s-alice").await.unwrap(), None);
    assert!(!store.delete_session_as(&alice, "s-alice").await.unwrap());
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_sessions {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            session_round_trip,
            session_expires,
            session_ids_are_data,
            a_session_is_read_only_by_its_owner
        );
    };
}
