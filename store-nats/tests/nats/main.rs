//! The NATS backend's tests, as one test binary (see the crate's `testing`
//! module for how it finds its server; the cluster tests start their own).

mod cluster;
mod common;
mod event_suite;
mod redeem;
mod rewrite;
mod store;
mod task_suite;
