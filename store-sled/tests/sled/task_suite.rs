//! The shared task conformance suite (T1 to T23) on sled: each case gets
//! its own temporary database directory.

use mcp_event_store_sled::testing::SledHarness;

mcp_event_store_conformance::task_suite!(SledHarness::new(), persistent);
