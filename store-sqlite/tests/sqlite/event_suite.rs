//! The shared conformance suite (C1 to C22) on SQLite, in the crate itself,
//! so `cargo test -p mcp-event-store-sqlite` runs every case. Each case gets
//! its own temporary database file.

use mcp_event_store_sqlite::testing::SqliteHarness;

mcp_event_store_conformance::event_suite!(SqliteHarness::new(), persistent);
