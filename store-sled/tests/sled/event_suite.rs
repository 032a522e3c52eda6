//! The shared conformance suite (contract C1 to C22) on this backend, each
//! case in its own temporary directory, reopened from disk for the
//! persistent cases.

use mcp_event_store_sled::testing::SledHarness;

mcp_event_store_conformance::event_suite!(SledHarness::new(), persistent);
