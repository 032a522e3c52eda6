//! The sled crate's integration tests, as one test binary (one link,
//! one process that runs its tests in parallel): each module is a file of
//! its own, named for what it checks.

mod event_suite;
mod follow;
mod inspect;
mod lifecycle;
mod process;
mod rewrite;
mod task_suite;
mod tasks;
