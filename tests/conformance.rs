//! The conformance suite on every store compiled into the facade.

mod memory {
    use mcp_event_store_core::conformance::MemoryHarness;

    mcp_event_store_core::conformance_tests!(MemoryHarness::new());
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use mcp_event_store_sqlite::testing::SqliteHarness;

    mcp_event_store_core::conformance_tests!(SqliteHarness::new(), persistent);
}

/// Against a real PostgreSQL (found as `mcp_event_store_postgres::testing`
/// says), one schema per case, dropped afterwards.
#[cfg(feature = "postgres")]
mod postgres {
    use mcp_event_store_postgres::testing::PostgresHarness;

    mcp_event_store_core::conformance_tests!(PostgresHarness::new(), persistent);
}
