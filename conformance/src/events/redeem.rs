//! C21: a nonce is redeemed once per principal across every handle sharing
//! the storage; refused input stores nothing; records past their expiry
//! are forgotten, and a forgotten nonce stays refused.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use mcp_event_store_core::task::Owner;
use mcp_event_store_core::{
    EventStore, MAX_NONCE_BYTES, MAX_REDEEM_HORIZON, REDEEM_GRACE, RedeemStore, Redemption,
};

/// The store's redemptions, which every store of this project hands out.
pub(crate) fn redeemer<S: EventStore + ?Sized>(store: &S) -> &dyn RedeemStore {
    store
        .redeemer()
        .expect("C21: the store hands out no redemptions (EventStore::redeemer is None)")
}

/// Now by the store's test clock, as a [`SystemTime`].
pub(crate) fn clock_now(clock: &ManualClock) -> SystemTime {
    use mcp_event_store_core::Clock;
    UNIX_EPOCH + Duration::from_millis(clock.now_millis() as u64)
}

/// Redeems and unwraps, with a message naming the nonce.
async fn redeem<S: EventStore + ?Sized>(
    store: &S,
    nonce: &[u8],
    expires_at: SystemTime,
    who: &Owner,
) -> Redemption {
    redeemer(store)
        .redeem(nonce, expires_at, who)
        .await
        .unwrap_or_else(|e| panic!("redeem({nonce:?}) failed: {e}"))
}

/// C21: the first redemption of a nonce wins; every later one, through the
/// same handle or another on the storage, is refused. Nonces are bytes:
/// any value of 1 to the maximum length is one nonce, never another.
pub async fn a_nonce_is_redeemed_once<H: Harness>(h: &H) {
    let clock = test_clock();
    let one = h.open(test_options(&clock)).await;
    let two = h.open(test_options(&clock)).await;
    let alice = Owner::principal(b"alice").unwrap();
    let soon = clock_now(&clock) + Duration::from_secs(600);
    let nonces: [&[u8]; 5] = [
        b"n-1",
        b"n-2",
        &[0, 255, b'{', b'}', b'%', 0],
        &[0xff; MAX_NONCE_BYTES],
        &[0xff; MAX_NONCE_BYTES - 1],
    ];
    for nonce in nonces {
        assert_eq!(
            redeem(&one, nonce, soon, &alice).await,
            Redemption::Redeemed,
            "the first redemption of {nonce:?}"
        );
        assert_eq!(
            redeem(&one, nonce, soon, &alice).await,
            Redemption::AlreadyRedeemed,
            "{nonce:?} again on the same handle"
        );
        assert_eq!(
            redeem(&two, nonce, soon, &alice).await,
            Redemption::AlreadyRedeemed,
            "{nonce:?} again on another handle"
        );
    }
    // A later expiry makes no new nonce of an old one.
    let later = soon + Duration::from_secs(60);
    assert_eq!(
        redeem(&two, b"n-1", later, &alice).await,
        Redemption::AlreadyRedeemed
    );
    h.close(one).await;
    h.close(two).await;
}

/// C21: many redemptions of one nonce at once, from several handles:
/// exactly one is `Redeemed`.
pub async fn concurrent_redemptions_have_one_winner<H: Harness>(h: &H) {
    let clock = test_clock();
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(Arc::new(h.open(test_options(&clock)).await));
    }
    let who = Owner::principal(b"racer").unwrap();
    let soon = clock_now(&clock) + Duration::from_secs(600);
    for round in 0..8u8 {
        let nonce = [b'r', round];
        let mut racers = Vec::new();
        for i in 0..16 {
            let store = handles[i % handles.len()].clone();
            racers.push(tokio::spawn(async move {
                redeemer(&*store).redeem(&nonce, soon, &who).await
            }));
        }
        let mut winners = 0;
        for racer in racers {
            match racer.await.expect("a racer panicked") {
                Ok(Redemption::Redeemed) => winners += 1,
                Ok(Redemption::AlreadyRedeemed) => {}
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(winners, 1, "round {round}: {winners} redemptions won");
    }
    for store in handles {
        let store = Arc::try_unwrap(store).unwrap_or_else(|_| panic!("a racer kept a handle"));
        h.close(store).await;
    }
}

/// C21: the same nonce under different principals (and anonymously) is a
/// redemption each: one caller cannot burn another's.
pub async fn principals_redeem_independently<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    let soon = clock_now(&clock) + Duration::from_secs(600);
    let alice = Owner::principal(b"alice").unwrap();
    let bob = Owner::principal(b"bob").unwrap();
    // Bob (or an anonymous caller) redeems a nonce he saw first.
    assert!(redeem(&store, b"shared", soon, &bob).await.is_first());
    assert!(
        redeem(&store, b"shared", soon, &Owner::Anonymous)
            .await
            .is_first()
    );
    // Alice's is still hers to redeem, once.
    assert_eq!(
        redeem(&store, b"shared", soon, &alice).await,
        Redemption::Redeemed
    );
    for who in [&alice, &bob, &Owner::Anonymous] {
        assert_eq!(
            redeem(&store, b"shared", soon, who).await,
            Redemption::AlreadyRedeemed,
            "{who:?} again"
        );
    }
    h.close(store).await;
}

/// C21: an expiry not in the future is `Expired`; an empty or oversized
/// nonce and an expiry beyond the horizon are `Error::Config`; none of
/// them stores anything, so the nonce redeems afterwards. The horizon
/// itself is accepted.
pub async fn refused_redemptions_store_nothing<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    let r = redeemer(&store);
    let who = Owner::principal(b"alice").unwrap();
    let now = clock_now(&clock);
    let soon = now + Duration::from_secs(600);
    for past in [now, now - Duration::from_secs(1), UNIX_EPOCH] {
        assert_eq!(
            r.redeem(b"expired", past, &who).await.unwrap(),
            Redemption::Expired,
            "an expiry of {past:?} with the clock at {now:?}"
        );
    }
    assert!(matches!(
        r.redeem(b"", soon, &who).await,
        Err(Error::Config(_))
    ));
    let long = [7u8; MAX_NONCE_BYTES + 1];
    assert!(matches!(
        r.redeem(&long, soon, &who).await,
        Err(Error::Config(_))
    ));
    let too_far = now + MAX_REDEEM_HORIZON + Duration::from_secs(1);
    assert!(matches!(
        r.redeem(b"far", too_far, &who).await,
        Err(Error::Config(_))
    ));
    // Nothing of the refusals was kept.
    assert_eq!(
        r.redeem(b"expired", soon, &who).await.unwrap(),
        Redemption::Redeemed
    );
    assert_eq!(
        r.redeem(b"far", soon, &who).await.unwrap(),
        Redemption::Redeemed
    );
    assert_eq!(
        r.redeem(&long[..MAX_NONCE_BYTES], soon, &who)
            .await
            .unwrap(),
        Redemption::Redeemed
    );
    assert_eq!(
        r.redeem(b"horizon", now + MAX_REDEEM_HORIZON, &who)
            .await
            .unwrap(),
        Redemption::Redeemed
    );
    h.close(store).await;
}

/// C21: a record is kept past its expiry for the grace, then forgotten
/// (by `purge_expired`, which counts it, or by the database's own ttl per
/// key, where the harness says so), and the nonce stays refused: every
/// later redemption of it is expired. A record whose time has not come is
/// kept.
pub async fn expired_redemptions_are_forgotten_and_stay_refused<H: Harness>(h: &H) {
    let (store, clock) = open_default(h).await;
    let r = redeemer(&store);
    let who = Owner::principal(b"alice").unwrap();
    let now = clock_now(&clock);
    let (short, long) = (
        now + Duration::from_secs(10),
        now + Duration::from_secs(3600),
    );
    assert!(r.redeem(b"short", short, &who).await.unwrap().is_first());
    assert!(r.redeem(b"long", long, &who).await.unwrap().is_first());
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.redemptions, 0, "nothing is due: {report:?}");

    clock.advance(Duration::from_secs(11));
    assert_eq!(
        r.redeem(b"short", short, &who).await.unwrap(),
        Redemption::Expired
    );
    let report = store.purge_expired().await.unwrap();
    assert_eq!(
        report.redemptions, 0,
        "forgotten before the grace passed: {report:?}"
    );

    clock.advance(REDEEM_GRACE);
    let report = store.purge_expired().await.unwrap();
    if !h.forgets_redemptions_itself() {
        assert_eq!(
            report.redemptions, 1,
            "the purge must forget the record past its time: {report:?}"
        );
        let again = store.purge_expired().await.unwrap();
        assert_eq!(again.redemptions, 0, "forgotten twice: {again:?}");
    }
    assert_eq!(
        r.redeem(b"short", short, &who).await.unwrap(),
        Redemption::Expired,
        "a forgotten nonce must stay refused"
    );
    assert_eq!(
        r.redeem(b"long", long, &who).await.unwrap(),
        Redemption::AlreadyRedeemed,
        "a record whose time has not come must be kept"
    );
    h.close(store).await;
}

/// C10, C21: redemptions survive a reopen; and the store keeps no nonce:
/// no stored byte holds one, raw or in hex, while its record (the digest)
/// is there to see.
pub async fn reopen_keeps_redemptions_and_no_nonce<H: PersistentHarness>(h: &H) {
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let who = Owner::principal(b"alice").unwrap();
    let soon = clock_now(&clock) + Duration::from_secs(600);
    let nonce = mcp_event_store_core::backend::StreamKey::generate()
        .unwrap()
        .token("c21")
        .to_string();
    let nonce = format!("nonce-{nonce}");
    assert!(
        redeem(&store, nonce.as_bytes(), soon, &who)
            .await
            .is_first()
    );
    let key = mcp_event_store_core::backend::RedeemKey::of(nonce.as_bytes(), &who);
    let dump = h.stored_bytes().await;
    let holds = |needle: &[u8]| {
        let hex = data_encoding::HEXLOWER.encode(needle);
        [needle, hex.as_bytes()]
            .iter()
            .any(|n| dump.windows(n.len()).any(|w| w == *n))
    };
    assert!(
        holds(key.as_bytes()),
        "the harness's stored bytes ({} bytes) do not hold the redemption's record",
        dump.len()
    );
    assert!(
        !holds(nonce.as_bytes()),
        "a stored byte holds the redeemed nonce"
    );
    h.close(store).await;

    let store = h.open(test_options(&clock)).await;
    assert_eq!(
        redeem(&store, nonce.as_bytes(), soon, &who).await,
        Redemption::AlreadyRedeemed,
        "a redemption must survive a reopen"
    );
    h.close(store).await;
}

/// Registers this file's cases with [`event_suite!`](crate::event_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_redeem {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            a_nonce_is_redeemed_once,
            concurrent_redemptions_have_one_winner,
            principals_redeem_independently,
            refused_redemptions_store_nothing,
            expired_redemptions_are_forgotten_and_stay_refused
        );
    };
}

/// Registers this file's cases that need a persistent store with
/// [`event_suite!`](crate::event_suite)'s `persistent` arm.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_redeem_persistent {
    ($harness:expr) => {
        $crate::__conformance_cases!($harness;
            reopen_keeps_redemptions_and_no_nonce
        );
    };
}
