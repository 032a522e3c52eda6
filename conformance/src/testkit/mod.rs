//! What every backend's tests need, once: finding
//! the server ([`find_server`]), a private namespace per test that is
//! removed even when the test panics ([`Namespace`]), a child process that
//! is killed by pid when its guard drops ([`ChildGuard`]), and the reader
//! that follows streams by cursor and checks every acknowledged event
//! ([`AckLog`]), and (feature `proxy`) a round-robin reverse proxy to put
//! several instances behind ([`RoundRobin`]).
//!
//! Server-backed tests never skip: when no server answers, [`find_server`]
//! panics with a message naming every way to provide one.
//!
//! The server is found in the environment, then at the local default, then
//! (feature `testcontainers`) in a container; `MCP_EVENT_STORE_TEST_SERVER`
//! ([`SERVER_SOURCE_ENV`]) set to `env`, `local` or `container` uses that
//! way alone, so the container path can be run where local servers answer.
//! Each backend's image variable ([`Container::image_env`]) starts another
//! image than the pinned one, such as those `.ci/build-test-images.sh`
//! builds from Debian packages. A test binary starts at most one container
//! per server, reached on loopback when the engine is local, labelled
//! [`CONTAINER_LABEL`], and removed when the binary exits.

mod acks;
mod child;
mod namespace;
#[cfg(feature = "proxy")]
mod proxy;
mod server;

pub use acks::{Ack, AckLog};
pub use child::{ChildGuard, ChildLines, test_child, test_path};
pub use namespace::{Cleanup, Namespace, random_suffix};
#[cfg(feature = "proxy")]
pub use proxy::RoundRobin;
pub use server::{
    CONTAINER_LABEL, Container, ImageRef, Probe, SERVER_SOURCE_ENV, ServerSource, ServerSpec,
    find_server,
};
