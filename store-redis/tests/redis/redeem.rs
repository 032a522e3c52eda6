//! Redemptions (C21) as Redis holds them: one string key per redeemed
//! nonce, named by its digest, that Redis itself expires the grace after
//! the nonce's expiry (the conformance suite cannot see that ttl: it runs
//! on the store's clock).

use std::time::{Duration, UNIX_EPOCH};

use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::backend::RedeemKey;
use mcp_event_store_core::task::Owner;
use mcp_event_store_core::{Clock, EventStore, REDEEM_GRACE, Redemption};
use mcp_event_store_redis::testing::RedisHarness;

#[tokio::test]
async fn a_redemption_is_a_key_redis_expires_after_the_grace() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let who = Owner::principal(b"alice").unwrap();
    let now = clock.now_millis();
    let expires = UNIX_EPOCH + Duration::from_millis(now as u64 + 60_000);
    let redeemed = store
        .redeemer()
        .unwrap()
        .redeem(b"the-nonce", expires, &who)
        .await
        .unwrap();
    assert_eq!(redeemed, Redemption::Redeemed);

    let key = format!(
        "{}:r1:{{{}}}",
        h.prefix(),
        RedeemKey::of(b"the-nonce", &who).to_hex()
    );
    let mut conn = redis::Client::open(h.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let forget_at = now + 60_000 + REDEEM_GRACE.as_millis() as i64;
    let value: i64 = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, forget_at, "the value is the time it may go");
    let expires_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(expires_at, forget_at, "Redis expires the key then");
    h.close(store).await;
    h.teardown().await;
}
