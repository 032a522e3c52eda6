//! The Redis crate's integration tests, as one test binary (one link,
//! one process that runs its tests in parallel): each module is a file of
//! its own, named for what it checks.

mod cluster;
mod common;
mod event_suite;
mod faults;
mod follow;
mod inspect;
mod redeem;
mod replicas;
mod rewrite;
mod store;
mod task_suite;
mod tasks;
