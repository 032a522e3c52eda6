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

/// Against a real Redis (found as `mcp_event_store_redis::testing` says), one
/// key prefix per case, removed afterwards. The Redis Cluster run lives in
/// `store-redis/tests/cluster.rs`, which starts its own cluster.
#[cfg(feature = "redis")]
mod redis {
    use mcp_event_store_redis::testing::RedisHarness;

    mcp_event_store_core::conformance_tests!(RedisHarness::new(), persistent);
}

/// Each case in its own temporary directory.
#[cfg(feature = "sled")]
mod sled {
    use mcp_event_store_sled::testing::SledHarness;

    mcp_event_store_core::conformance_tests!(SledHarness::new(), persistent);
}
