//! The shared task conformance suite (T1 to T23) on PostgreSQL: each case
//! gets its own schema (found as `mcp_event_store_postgres::testing` says),
//! dropped afterwards.

use mcp_event_store_postgres::testing::PostgresHarness;

mcp_event_store_conformance::task_suite!(PostgresHarness::new(), persistent);
