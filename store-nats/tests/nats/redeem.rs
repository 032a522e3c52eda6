//! Redemptions (C21) as JetStream holds them: a bucket whose age limit,
//! the horizon plus the grace, is what forgets them (NATS 2.9 has no ttl
//! per key; the conformance suite cannot see that limit: it runs on the
//! store's clock).

use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::{MAX_REDEEM_HORIZON, REDEEM_GRACE};
use mcp_event_store_nats::testing::NatsHarness;

#[tokio::test]
async fn the_redemption_bucket_forgets_after_the_horizon_and_the_grace() {
    let h = NatsHarness::new().await;
    let clock = test_clock();
    let store = h.open(test_options(&clock)).await;
    let wanted = MAX_REDEEM_HORIZON + REDEEM_GRACE;
    let client = async_nats::connect(h.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let name = format!("KV_{}-redeemed", h.prefix());
    let mut bucket = js.get_stream(&name).await.unwrap();
    let config = bucket.info().await.unwrap().config.clone();
    assert_eq!(config.max_age, wanted);
    assert_eq!(config.max_messages_per_subject, 1);
    h.close(store).await;

    // A bucket found with a shorter limit (a hand-made change) would
    // forget records still needed: the next open sets it back.
    js.update_stream(async_nats::jetstream::stream::Config {
        max_age: std::time::Duration::from_secs(600),
        ..config
    })
    .await
    .unwrap();
    let store = h.open(test_options(&clock)).await;
    let config = bucket.info().await.unwrap().config.clone();
    assert_eq!(config.max_age, wanted);
    h.close(store).await;
    h.teardown().await;
}
