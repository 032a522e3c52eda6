//! The tower-mcp crate's integration tests, as one test binary (one link,
//! one process that runs its tests in parallel): each module is a file of
//! its own, named for what it checks.

mod adapter;
mod contracts;
mod takeover;
