//! A backend's append beside its raw ones, timed in interleaved rounds, so
//! every kind sees the same machine: what the criterion cases
//! (`append/<backend>/*_1_writer`), run one after another, cannot tell
//! apart from the machine's drift. Each backend's kit says how it pairs
//! them (`Kit::append_pairs`, in its crate's `bench` module): PostgreSQL
//! in blocks of 50 of each kind (the store's `NOTIFY` runs after its
//! append returns), with the process's CPU per append; Redis one of each
//! kind per round, against raw `XADD`, an `XADD`-only script and `XADD
//! MAXLEN` at the count limit, with the process's CPU and the server's own
//! time per append (`INFO commandstats`). A backend without pairs says so.
//! Finds its server as the tests do and removes what it made.
//!
//! ```text
//! cargo run --release -p mcp-event-store-benches --example append_pairs -- postgres          # 5,000 rounds
//! cargo run --release -p mcp-event-store-benches --example append_pairs -- redis 20000
//! ```

use mcp_event_store_conformance::bench::{Kit, Visitor};

/// Runs the kit's pairs.
struct Pairs {
    rounds: usize,
}

impl Visitor for Pairs {
    type Output = bool;

    fn visit<K: Kit>(self) -> bool {
        mcp_event_store_benches::runtime().block_on(K::append_pairs(self.rounds))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args
        .next()
        .expect("the backend's name (mcp_event_store::backends())");
    let rounds = match args.next() {
        Some(n) => n.parse().expect("the number of rounds"),
        None => 5_000,
    };
    let backend = mcp_event_store::backends()
        .into_iter()
        .find(|backend| backend.name == name)
        .unwrap_or_else(|| panic!("no backend {name:?} is compiled in"));
    if !mcp_event_store_benches::visit(backend, Pairs { rounds }) {
        eprintln!("the {name} backend's kit has no append pairs");
        std::process::exit(1);
    }
}
