//! What every backend's tests need, once (feature `conformance`): finding
//! the server ([`find_server`]), a private namespace per test that is
//! removed even when the test panics ([`Namespace`]), a child process that
//! is killed by pid when its guard drops ([`ChildGuard`]), and the reader
//! that follows streams by cursor and checks every acknowledged event
//! ([`AckLog`]).
//!
//! Server-backed tests never skip: when no server answers, [`find_server`]
//! panics with a message naming every way to provide one.

mod acks;
mod child;
mod namespace;
mod server;

pub use acks::{Ack, AckLog};
pub use child::{ChildGuard, test_child};
pub use namespace::{Cleanup, Namespace, random_suffix};
pub use server::{Container, Probe, ServerSpec, find_server};
