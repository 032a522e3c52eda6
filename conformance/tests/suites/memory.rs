//! The suites on the in-memory stores core ships: the event suite and the
//! task suite on `MemoryStore` (`memory://` hands out one handle that is
//! both), and the task suite on the bare `MemoryTaskStore`.

use mcp_event_store_conformance::MemoryHarness;

mcp_event_store_conformance::event_suite!(MemoryHarness::new());

mod tasks {
    use mcp_event_store_conformance::MemoryHarness;

    mcp_event_store_conformance::task_suite!(MemoryHarness::new());
}

mod bare_tasks {
    use mcp_event_store_conformance::tasks::MemoryTaskHarness;

    mcp_event_store_conformance::task_suite!(MemoryTaskHarness::new());
}
