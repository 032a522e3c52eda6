//! The sealed store's tests, as one test binary: the conformance suites
//! through the decorator (on the memory store and on SQLite), and the
//! decorator's own cases, and its rotation on every backend.

mod harness;
mod limits;
mod rotation;
mod suites;
mod values;
