//! The shared task conformance suite (T1 to T23) on a standalone Redis.

use mcp_event_store_redis::testing::RedisHarness;

mcp_event_store_conformance::task_suite!(RedisHarness::new(), persistent);
