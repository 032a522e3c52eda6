//! The suites on core's in-memory stores, and proof that they fail stores
//! that break the contract: one test binary for the crate.

mod bus_flaws;
mod event_flaws;
mod memory;
mod task_flaws;
