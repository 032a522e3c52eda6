//! The conformance suites on the in-memory store, in the crate that holds
//! it: the event suite, and the task suite on the same store (`memory://`
//! hands out one handle that is both).

#![cfg(feature = "conformance")]

use mcp_event_store_core::conformance::MemoryHarness;

mcp_event_store_core::conformance_tests!(MemoryHarness::new());

mod tasks {
    use mcp_event_store_core::conformance::MemoryHarness;

    mcp_event_store_core::task_conformance_tests!(MemoryHarness::new());
}
