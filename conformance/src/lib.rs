//! The conformance suites every **mcp-event-store** backend passes, and the
//! test kit they run on.
//!
//! A backend (ours, or one of your own) proves it keeps the contract by
//! implementing a harness and calling two macros from its tests:
//!
//! * [`events`]: the event suite, contract C1 to C22, one case per clause
//!   file, run by [`event_suite!`]; a backend whose data survives a reopen
//!   adds `persistent` and implements [`events::PersistentHarness`] to run
//!   the restart, SIGKILL and format cases (C10, C12) as well;
//! * [`tasks`]: the task suite, contract T1 to T23, run by [`task_suite!`];
//!   a persistent backend adds `persistent` and implements
//!   [`tasks::PersistentTaskHarness`] for the reopen, SIGKILL and
//!   newer-task-format cases;
//! * [`testkit`]: what server-backed tests need (finding the server, in a
//!   container if need be; a namespace per test removed even on panic; a
//!   child process killed by pid when its guard drops; a reader that checks
//!   every acknowledged event);
//! * [`bench`](mod@bench): what a backend gives the benchmarks, its bench baselines
//!   behind one interface ([`bench::Kit`]).
//!
//! ```ignore
//! // tests/my_backend/main.rs
//! mcp_event_store_conformance::event_suite!(MyHarness::new(), persistent);
//! mod tasks {
//!     mcp_event_store_conformance::task_suite!(crate::MyHarness::new(), persistent);
//! }
//! ```
//!
//! Each generated case is a `#[tokio::test]`: the calling crate needs
//! `tokio` with the `macros` and `rt-multi-thread` features among its
//! dev-dependencies. The crate is versioned in lockstep with
//! `mcp-event-store-core`: a suite checks the contract of the core it was
//! released with.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod bench;
pub mod events;
pub mod tasks;
pub mod testkit;

#[cfg(test)]
mod registration;

pub use events::MemoryHarness;
