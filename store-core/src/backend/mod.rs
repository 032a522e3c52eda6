//! For backend authors: the plumbing every backend shares.
//!
//! Applications never need this module. A backend crate implements the
//! job traits ([`jobs`]: [`BackendHandle`], [`EventBackend`],
//! [`SessionBackend`], [`TaskBackend`], [`RuntimeBackend`]; and
//! [`redeem`]'s [`RedeemBackend`], which every [`EventBackend`] is), which
//! say only
//! what its database makes different; the public traits
//! ([`EventStore`](crate::EventStore), [`SessionStore`](crate::SessionStore),
//! [`TaskStore`](crate::task::TaskStore), [`RuntimeStore`](crate::task::RuntimeStore),
//! [`RedeemStore`](crate::RedeemStore))
//! come from core over them, with the closed check, the input every store
//! refuses the same way ([`validate_stream_id`], [`validate_session_id`],
//! [`check_list_limit`], the task limits) and the spans and metrics
//! ([`observe`]) written once. For the job itself it uses the rest of this
//! module: dense streams and their cursor and gap checks ([`dense`]),
//! following ([`follow`]), long replays in pages ([`paged_replay`],
//! [`paged_replay_with`] when the first page came with the cursor check), stream
//! tokens from a per-store secret ([`StreamKey`], [`StreamToken`]), and a
//! task store's shared parts ([`task`]: the state machine, the step driver
//! of row stores, the one-value codec).
//!
//! A new backend is a crate that implements the job traits with these,
//! exports a [`Backend`](crate::Backend) descriptor as `BACKEND`, and runs
//! the suites of the crate `mcp-event-store-conformance` from its own
//! tests. [`MemoryStore`](crate::MemoryStore) and
//! [`MemoryTaskStore`](crate::task::MemoryTaskStore) are built the same
//! way.
//!
//! # Every backend crate has the same shape
//!
//! So that a diff between two backend crates shows only what the database
//! makes different, each has the same files with the same jobs:
//! `options.rs` (`XOptions`: `Default`, `store(StoreOptions)`, `validate()`,
//! and `from_url`, which owns every URL parameter and refuses an unknown or
//! repeated one), `setup.rs` (opening, migrations or layout, the format check,
//! the stream secret), `store.rs` (the front door: the public store type,
//! `connect(url)`, `connect_with(url, options)` where a parameter given in the
//! URL wins, `close(&self)`, its accessors, then `impl BackendHandle` and
//! `impl EventBackend`, one line a method calling the job file's function of
//! the same name: `append::append`, `replay::replay_after`,
//! `replay::replay_whole`, `replay::stream_of`, `follow::follow_after`,
//! `follow::follows_open`, `purge::remove_stream`, `purge::purge`,
//! `inspect::stats`, `inspect::streams`, `inspect::check`), `state.rs` (what
//! the clones of one handle share, and the crate-internal accessors the job
//! files reach it through), `error.rs` (`NAME`, the backend's name in errors,
//! spans and metrics, and the mapping of driver errors to
//! [`Error`](crate::Error)), files named for the jobs the database makes
//! different (`append.rs`, `replay.rs`, `follow.rs`, `purge.rs`,
//! `inspect.rs`, each a set of free functions taking the store;
//! `sessions.rs`, which holds `impl SessionBackend`, `redeem.rs`, which
//! holds `impl RedeemBackend`, and `tasks.rs`, which
//! holds `impl TaskBackend` and `impl RuntimeBackend`), and `testing.rs` (the
//! harnesses of the conformance suites, feature `conformance`). The job files
//! take what they share from `state.rs` and `error.rs` and name the store
//! type through the crate root; nothing imports from `store.rs` but
//! `lib.rs`. No job file checks closed-ness, validates input or records an
//! append, replay or purge: core does, around it. (A replay's later pages,
//! read after the call returned, are the backend's to refuse once the
//! handle is closed.) Crate docs use the same headings: Connecting,
//! Layout, Durability, Retention, Following, Inspecting, Format, Limits.
//!
//! A new backend is a crate `store-<name>` (a workspace member by its
//! directory name) that implements the job traits with the plumbing in
//! `mcp_event_store_core::backend`, exports its `BACKEND` descriptor, and
//! implements `Harness`, `PersistentHarness`, `UrlHarness`, `TaskHarness`
//! and `PersistentTaskHarness` from `mcp-event-store-conformance`,
//! on its test kit (`mcp_event_store_conformance::testkit`: server discovery,
//! a namespace per test removed even on panic, a child-process guard, the
//! acknowledged-events reader). Its tests are one binary,
//! `tests/<name>/main.rs`, whose `event_suite.rs` is the one line
//! `event_suite!(<Name>Harness::new(), persistent);`, which runs every case,
//! the SIGKILL and newer-format cases included, and whose `task_suite.rs` is
//! the same for the task suite (`task_suite!(<Name>Harness::new(),
//! persistent)`). A test that installs a
//! process-wide recorder or subscriber gets a binary of its own. Its `bench`
//! module (feature `bench`, which takes `conformance`) holds its kit,
//! `<Name>Kit`: the `mcp_event_store_conformance::bench::Kit` the
//! benchmarks and the facade's test support reach it through (its
//! harnesses, its bulk load, and the raw-driver baselines: the range read,
//! single appends, task rows, its database's own wake-up), and its
//! `test_kit!` macro (its kit, and what its test storage allows: `restart`,
//! `shared`). The facade then needs the lines listed under "The descriptor
//! and the lists that name backends" below; `connect`, the command line,
//! the example servers (`--features full`), the front-door tests, the
//! end-to-end suites, the tower-mcp contract tests and the benches then
//! reach it, each case where its storage allows it.
//!
//! # The descriptor and the lists that name backends
//!
//! Each backend crate exports a descriptor, `BACKEND` (an
//! `mcp_event_store::Backend`: name, URL schemes, facade feature,
//! `connect`), and its kit (above). The facade keeps the one list of them,
//! the `backends!` macro in its `src/lib.rs`, an entry a backend (module,
//! feature, kit, URL schemes), and everything else iterates it:
//! `mcp_event_store::backends()` (what `connect`, the command line and the
//! benches' selection choose from), `KNOWN_SCHEMES` (which feature a URL
//! needs), `testing::storage` and `testing::storages` (test storage by URL:
//! the end-to-end fixtures, the command line's tests),
//! `testing::visit_kit` (a backend's kit, as a type: the benches) and
//! `for_each_backend!` (a module of tests per backend, with its kit and
//! what its storage allows: the rmcp and tower-mcp end-to-end suites, the
//! tower-mcp contract and adapter tests, the command line's scenario, the
//! facade's own checks). The server packages and the command line have no
//! feature per backend: `full` forwards to the facade's `all-backends`,
//! `default-backend` to its default, and one backend alone is the facade's
//! feature (`--features mcp-event-store/<name>`).
//!
//! So a backend is named outside its crate in these lines, which the
//! facade's `tests/backend_places.rs` finds and counts (at most six a
//! backend, so the count cannot drift; it lists them when it fails):
//!
//! 1. the workspace's `Cargo.toml`: the facade's optional dependency, named
//!    for its feature, so that it is the feature too:
//!    `<name> = { package = "mcp-event-store-<name>", path = "store-<name>",
//!    version = "0.1.0", optional = true }` (the `store-*` members glob
//!    already takes the crate);
//! 2. the same file: its entry in the feature `all-backends`;
//! 3. the same file: its entry in the feature `testing`,
//!    `"<name>?/bench"`;
//! 4. `src/lib.rs`: its entry in the `backends!` list,
//!    `<name>, "<name>", <Name>Kit, [<its URL schemes>];` (wrapped when the
//!    schemes are many);
//! 5. `README.md`: its row in the table of crates (the same test checks
//!    the table against the list).
//!
//! SQLite, the default backend, has a sixth: `default = ["sqlite"]`. A
//! backend's driver may also be a `[workspace.dependencies]` line (those of
//! the four here are, as `sqlx`, `redis` or `sled`), or be named in its
//! crate alone. Prose that names a database ("SQLite", "sled") is not a
//! place: the docs describe backends, they do not list them for code.

pub mod dense;
pub mod follow;
pub mod jobs;
pub mod observe;
pub mod redeem;
pub mod rewrite;
pub mod task;

pub use jobs::{BackendHandle, EventBackend, Reader, RuntimeBackend, SessionBackend, TaskBackend};
pub use redeem::{RedeemBackend, RedeemKey};
pub use rewrite::{RewriteBackend, TaskKeys};

pub use crate::event::{retry_from_millis, retry_to_millis};
pub use crate::id::{STREAM_KEY_LEN, STREAM_TOKEN_LEN, StreamKey, StreamToken};
pub use crate::inspect::check_list_limit;
pub use crate::options::{validate_session_id, validate_stream_id};
pub use crate::store::{Page, paged_replay, paged_replay_with};
