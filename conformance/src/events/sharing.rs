//! C11, C14: handles on one backend see each other's writes at once, and agree again after the backend lost its data.

use super::*;
use mcp_event_store_core::EventStore;

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

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_sharing {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            two_handles_share_events,
            handles_converge_after_the_backend_lost_its_data
        );
    };
}
