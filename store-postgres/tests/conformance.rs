//! The shared conformance suite (contract C1 to C14) against PostgreSQL:
//! one schema per case (found as `mcp_event_store_postgres::testing` says),
//! dropped afterwards.

use mcp_event_store_postgres::testing::PostgresHarness;

mcp_event_store_core::conformance_tests!(PostgresHarness::new(), persistent);
