//! The shared task conformance suite (T1 to T23) on SQLite: each case gets
//! its own temporary database file.

use mcp_event_store_sqlite::testing::SqliteHarness;

mcp_event_store_conformance::task_suite!(SqliteHarness::new(), persistent);
