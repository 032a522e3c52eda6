//! The conformance suite on every store compiled into the facade.

mod memory {
    use mcp_event_store_core::conformance::MemoryHarness;

    mcp_event_store_core::conformance_tests!(MemoryHarness::new());
}
