//! The shared conformance suite against PostgreSQL, the persistent cases
//! (restart, SIGKILL, newer format) included: one schema per case (found
//! as `mcp_event_store_postgres::testing` says), dropped afterwards.

use mcp_event_store_postgres::testing::PostgresHarness;

mcp_event_store_conformance::event_suite!(PostgresHarness::new(), persistent);
