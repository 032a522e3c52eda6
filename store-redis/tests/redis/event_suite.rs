//! The shared conformance suite against a standalone Redis (found as
//! `mcp_event_store_redis::testing` says), one key prefix per case, removed
//! afterwards. `cluster.rs` runs the same suite on a cluster it starts.

use mcp_event_store_redis::testing::RedisHarness;

mcp_event_store_conformance::event_suite!(RedisHarness::new(), persistent);
