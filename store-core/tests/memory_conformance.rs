//! The conformance suite on the in-memory store, in the crate that holds it.

#![cfg(feature = "conformance")]

use mcp_event_store_core::conformance::MemoryHarness;

mcp_event_store_core::conformance_tests!(MemoryHarness::new());
