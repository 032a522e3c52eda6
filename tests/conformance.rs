//! The conformance suite on every store compiled into the facade: one line
//! per backend. Server-backed harnesses find their server as
//! `mcp_event_store_core::testkit::find_server` says (never skipping) and
//! give each case a schema or key prefix of its own.

/// The whole suite on one backend, when its feature is on.
macro_rules! suite {
    ($module:ident, $feature:literal, $harness:path $(, $persistent:ident)?) => {
        #[cfg(feature = $feature)]
        mod $module {
            use $harness as Harness;

            mcp_event_store_core::conformance_tests!(Harness::new() $(, $persistent)?);
        }
    };
}

mod memory {
    mcp_event_store_core::conformance_tests!(
        mcp_event_store_core::conformance::MemoryHarness::new()
    );
}

suite!(
    sqlite,
    "sqlite",
    mcp_event_store::sqlite::testing::SqliteHarness,
    persistent
);
suite!(
    postgres,
    "postgres",
    mcp_event_store::postgres::testing::PostgresHarness,
    persistent
);
suite!(
    redis,
    "redis",
    mcp_event_store::redis::testing::RedisHarness,
    persistent
);
suite!(
    sled,
    "sled",
    mcp_event_store::sled::testing::SledHarness,
    persistent
);
