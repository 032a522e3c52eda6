//! What the criterion benches of mcp-event-store share: backend selection,
//! quick mode, data sets built in bulk (honouring each store's id scheme),
//! the raw baselines, and clean-up.
//!
//! * `MCP_EVENT_STORE_BENCH_BACKENDS=sqlite,redis` runs only those backends
//!   (names: those `mcp_event_store::backends()` lists; default: all).
//! * `MCP_EVENT_STORE_BENCH_QUICK=1` shrinks the data sets so that
//!   `cargo bench -p mcp-event-store-benches -- --test` (each benchmark
//!   once, nothing measured) proves the benches still work in a few minutes.
//!
//! Server-backed benches find their server as the tests do
//! (`testing::server_url()`), work in a random schema or key prefix, and
//! remove it at the end.
//!
//! # One module per backend
//!
//! Each backend's module ([`memory`], [`sqlite`], [`postgres`], [`redis`],
//! [`sled`]) holds everything that depends on how that store lays out its
//! data, behind the same small interface:
//!
//! * `async fn load(plan: &[StreamPlan]) -> Loaded<Storage>`: a fresh store
//!   holding the data set, built in bulk, with the probe stream's positions;
//! * `async fn raw(storage: &Storage, token: StreamToken, probe: &StreamPlan) -> Raw`:
//!   the raw baseline for the probe stream, whose
//!   `async fn read_after(&self, after: Position) -> Vec<RawEvent>` is the
//!   same range read as a replay, done by hand with the backend's driver;
//! * `async fn cleanup(storage: Storage)`: removes the schema, key prefix
//!   or files.
//!
//! [`load`], [`raw`] and [`Loaded::cleanup`] pick the module by [`Backend`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::path::PathBuf;

use mcp_event_store::{DynStore, EventId, Position, Retention, StoreOptions};

// The backend plumbing the bulk loads use to lay out data as the stores do.
pub use mcp_event_store_core::backend::{StreamKey, StreamToken, dense};

pub mod memory;
pub mod postgres;
pub mod redis;
pub mod sled;
pub mod sqlite;

/// Rows a raw range read asks for at a time: the largest page that keeps
/// PostgreSQL on the index scan (see DESIGN.md, "Traps").
pub const RAW_PAGE: usize = 1_000;
/// Streams in the scale data sets.
pub const SCALE_STREAMS: u64 = 1_000;
/// Events of the probe stream in the scale data sets; replays read its
/// last 100.
pub const PROBE_LEN: u64 = 200;

/// The backends the benches know, each with a module here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `MemoryStore`.
    Memory,
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// Redis Streams.
    Redis,
    /// sled.
    Sled,
}

impl Backend {
    /// The backend of this name (a `mcp_event_store::Backend`'s `name`).
    pub fn named(name: &str) -> Option<Backend> {
        Some(match name {
            "memory" => Backend::Memory,
            "sqlite" => Backend::Sqlite,
            "postgres" => Backend::Postgres,
            "redis" => Backend::Redis,
            "sled" => Backend::Sled,
            _ => return None,
        })
    }

    /// Its name, as `mcp_event_store::backends()` and the benchmark ids
    /// spell it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::Sled => "sled",
        }
    }
}

/// Every backend compiled into the facade, in its order
/// (`mcp_event_store::backends()`) that has a module here; one without is
/// named on stderr and not measured.
pub fn compiled() -> Vec<Backend> {
    mcp_event_store::backends()
        .iter()
        .filter_map(|backend| {
            let known = Backend::named(backend.name);
            if known.is_none() {
                // A new backend benches once it has its module; until then
                // the run says so instead of failing every bench.
                eprintln!(
                    "benches: no module for the backend {:?} (add benches/src/{}.rs); not measured",
                    backend.name, backend.name
                );
            }
            known
        })
        .collect()
}

/// The backends `MCP_EVENT_STORE_BENCH_BACKENDS` selects (all compiled in
/// if unset), in [`compiled`] order. An unknown name is an error, not a
/// silent skip.
pub fn selected() -> Vec<Backend> {
    let all = compiled();
    let Ok(list) = std::env::var("MCP_EVENT_STORE_BENCH_BACKENDS") else {
        return all;
    };
    let mut chosen = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let backend = all
            .iter()
            .copied()
            .find(|b| b.name().eq_ignore_ascii_case(name))
            .unwrap_or_else(|| {
                let known: Vec<&str> = all.iter().map(|b| b.name()).collect();
                panic!(
                    "MCP_EVENT_STORE_BENCH_BACKENDS: unknown backend {name:?} (known: {})",
                    known.join(", ")
                )
            });
        chosen.push(backend);
    }
    if chosen.is_empty() {
        return all;
    }
    all.into_iter().filter(|b| chosen.contains(b)).collect()
}

/// Whether `MCP_EVENT_STORE_BENCH_QUICK` asks for small data sets.
pub fn quick() -> bool {
    std::env::var("MCP_EVENT_STORE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The runtime every bench runs on: multi-threaded, two workers (the
/// machines these numbers come from have two cores).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The median of `times`, in microseconds (sorts them).
pub fn median_us(times: &mut [std::time::Duration]) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}

/// The number of rounds an example runs: its first argument, else
/// `default`.
pub fn rounds_arg(default: usize) -> usize {
    match std::env::args().nth(1) {
        Some(n) => n.parse().expect("the number of rounds"),
        None => default,
    }
}

/// The process's user and system CPU time so far, in nanoseconds, from
/// `/proc/self/stat` (`None` off Linux).
pub fn process_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses: utime and
    // stime are the 12th and 13th of them, in clock ticks (100 a second
    // on Linux).
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let ticks = fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// Where criterion writes its results, found as criterion finds it:
/// `$CRITERION_HOME`, else `$CARGO_TARGET_DIR/criterion`, else the target
/// directory `cargo metadata` names when run in the bench's working
/// directory (cargo runs benches in their package's directory, so a
/// relative `target` would be the wrong one), plus `criterion`. Asking in
/// the working directory, not the directory the bench was compiled in,
/// keeps the two in the same checkout when checkouts share a build.
pub fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    let from_metadata = std::env::var_os("CARGO").and_then(|cargo| {
        let output = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .ok()?;
        let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        Some(PathBuf::from(metadata["target_directory"].as_str()?))
    });
    from_metadata
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
        .join("criterion")
}

/// A 200-byte JSON-RPC progress notification, the typical SSE event.
pub fn payload() -> Vec<u8> {
    let mut p = br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1,"message":""#.to_vec();
    p.resize(196, b'x');
    p.extend_from_slice(br#""}}"#);
    p
}

/// Milliseconds since the Unix epoch, as the stores stamp events.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Store options for data sets that hold more than the default 10,000
/// events per stream: nothing is trimmed, everything else is default.
pub fn unbounded() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

/// One stream of a data set: its id and how many events it gets.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    /// The stream id.
    pub stream_id: String,
    /// How many events it holds.
    pub len: u64,
}

/// The scale data set: `SCALE_STREAMS - 1` background streams sharing
/// about `total - PROBE_LEN` events, plus the probe stream (the last plan)
/// of `PROBE_LEN` events.
pub fn scale_plan(total: u64) -> Vec<StreamPlan> {
    let background = SCALE_STREAMS - 1;
    let per = (total.saturating_sub(PROBE_LEN) / background).max(1);
    let mut plan: Vec<StreamPlan> = (0..background)
        .map(|i| StreamPlan {
            stream_id: format!("background-{i}"),
            len: per,
        })
        .collect();
    plan.push(StreamPlan {
        stream_id: "probe".into(),
        len: PROBE_LEN,
    });
    plan
}

/// How many events a data set holds.
pub fn plan_total(plan: &[StreamPlan]) -> u64 {
    plan.iter().map(|s| s.len).sum()
}

/// The order events are written in: streams interleaved in time, the way
/// they arrive at a server (event `seq` of a stream of `len` events is
/// written at time `seq / len`). Returns stream indexes.
pub fn schedule(plan: &[StreamPlan]) -> Vec<u32> {
    let mut order: Vec<(f64, u32)> = Vec::with_capacity(plan_total(plan) as usize);
    for (i, stream) in plan.iter().enumerate() {
        for seq in 1..=stream.len {
            order.push((seq as f64 / stream.len as f64, i as u32));
        }
    }
    order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    order.into_iter().map(|(_, i)| i).collect()
}

/// The positions of a densely numbered stream of `len` events in its life
/// `incarnation`.
pub fn dense_positions(incarnation: u64, len: u64) -> Vec<Position> {
    (1..=len)
        .map(|seq| dense::position(incarnation, seq))
        .collect()
}

/// What a raw read decodes per event: position, payload, retry in ms.
pub type RawEvent = (Position, bytes::Bytes, Option<i64>);

/// A store holding a data set, with the probe stream's positions, and
/// `storage`: what the backend's module needs for its raw baseline and
/// its cleanup.
pub struct Loaded<S = Storage> {
    /// The store, as the benches use it.
    pub store: DynStore,
    /// The probe stream's token.
    pub token: StreamToken,
    /// The probe stream's event positions, oldest first.
    pub positions: Vec<Position>,
    /// The backend's own handles (its store, files, schema or key prefix).
    pub storage: S,
}

impl<S> Loaded<S> {
    /// The id to resume from so that the replay yields the last `k` events.
    pub fn cursor_for_last(&self, k: usize) -> String {
        let at = self.positions.len() - k - 1;
        EventId::new(self.token, self.positions[at]).to_string()
    }

    fn map_storage<T>(self, f: impl FnOnce(S) -> T) -> Loaded<T> {
        Loaded {
            store: self.store,
            token: self.token,
            positions: self.positions,
            storage: f(self.storage),
        }
    }
}

impl Loaded {
    /// Removes what the data set left behind: schema, key prefix, files.
    pub async fn cleanup(self) {
        drop(self.store);
        match self.storage {
            Storage::Memory(storage) => memory::cleanup(storage).await,
            Storage::Sqlite(storage) => sqlite::cleanup(storage).await,
            Storage::Postgres(storage) => postgres::cleanup(storage).await,
            Storage::Redis(storage) => redis::cleanup(storage).await,
            Storage::Sled(storage) => sled::cleanup(storage).await,
        }
    }
}

/// A loaded data set's backend handles, whichever the backend.
pub enum Storage {
    /// [`memory::Storage`].
    Memory(memory::Storage),
    /// [`sqlite::Storage`].
    Sqlite(sqlite::Storage),
    /// [`postgres::Storage`].
    Postgres(postgres::Storage),
    /// [`redis::Storage`].
    Redis(redis::Storage),
    /// [`sled::Storage`].
    Sled(sled::Storage),
}

/// Builds `plan` (the probe stream last) in a fresh store of `backend`.
pub async fn load(backend: Backend, plan: &[StreamPlan]) -> Loaded {
    match backend {
        Backend::Memory => memory::load(plan).await.map_storage(Storage::Memory),
        Backend::Sqlite => sqlite::load(plan).await.map_storage(Storage::Sqlite),
        Backend::Postgres => postgres::load(plan).await.map_storage(Storage::Postgres),
        Backend::Redis => redis::load(plan).await.map_storage(Storage::Redis),
        Backend::Sled => sled::load(plan).await.map_storage(Storage::Sled),
    }
}

/// A raw baseline, whichever the backend: the same range read as a replay,
/// done by hand with the backend's driver, decoding each event into
/// (position, payload, retry) as the store does. No cursor check, no gap
/// check, no id formatting.
pub enum Raw {
    /// [`memory::Raw`].
    Memory(memory::Raw),
    /// [`sqlite::Raw`].
    Sqlite(sqlite::Raw),
    /// [`postgres::Raw`].
    Postgres(postgres::Raw),
    /// [`redis::Raw`].
    Redis(redis::Raw),
    /// [`sled::Raw`].
    Sled(sled::Raw),
}

impl Raw {
    /// Reads every event after `after`; returns them.
    pub async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        match self {
            Raw::Memory(raw) => raw.read_after(after).await,
            Raw::Sqlite(raw) => raw.read_after(after).await,
            Raw::Postgres(raw) => raw.read_after(after).await,
            Raw::Redis(raw) => raw.read_after(after).await,
            Raw::Sled(raw) => raw.read_after(after).await,
        }
    }
}

/// The raw baseline for the probe stream (the last of `plan`) of a loaded
/// data set. Dropping it removes what it made (the sled copy's directory).
pub async fn raw(loaded: &Loaded, plan: &[StreamPlan]) -> Raw {
    let probe = &plan[plan.len() - 1];
    let token = loaded.token;
    match &loaded.storage {
        Storage::Memory(storage) => Raw::Memory(memory::raw(storage, token, probe).await),
        Storage::Sqlite(storage) => Raw::Sqlite(sqlite::raw(storage, token, probe).await),
        Storage::Postgres(storage) => Raw::Postgres(postgres::raw(storage, token, probe).await),
        Storage::Redis(storage) => Raw::Redis(redis::raw(storage, token, probe).await),
        Storage::Sled(storage) => Raw::Sled(sled::raw(storage, token, probe).await),
    }
}

/// Removes a bench's storage once its handles are dropped.
pub type Teardown = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Two handles on one fresh storage of `backend` (the backend's own test
/// harness: a temporary file or directory, a schema, a key prefix), and
/// what removes it: for the benches of what crosses handles (following,
/// the bus). For memory, A and B are one handle; for sled, two handles in
/// one process, as sled allows.
pub async fn two_handles(backend: Backend) -> (DynStore, DynStore, Teardown) {
    use mcp_event_store_conformance::events::{Harness, MemoryHarness};

    async fn open<H: Harness>(harness: H) -> (DynStore, DynStore, Teardown)
    where
        H::Store: mcp_event_store::task::RuntimeStore,
    {
        let a = harness.open(unbounded()).await;
        let b = harness.open(unbounded()).await;
        (
            std::sync::Arc::new(a),
            std::sync::Arc::new(b),
            Box::pin(harness.teardown()),
        )
    }
    match backend {
        Backend::Memory => open(MemoryHarness::new().await).await,
        Backend::Sqlite => open(mcp_event_store_sqlite::testing::SqliteHarness::new().await).await,
        Backend::Postgres => {
            open(mcp_event_store_postgres::testing::PostgresHarness::new().await).await
        }
        Backend::Redis => open(mcp_event_store_redis::testing::RedisHarness::new().await).await,
        Backend::Sled => open(mcp_event_store_sled::testing::SledHarness::new().await).await,
    }
}

/// The value at fraction `p` (0 to 1) of `sorted`.
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

/// One way of carrying a message from one handle or connection to
/// another, for [`deliveries`].
pub trait Delivery {
    /// Sends one message and waits until the other side has it: the time
    /// the case measures.
    fn one(&mut self) -> impl std::future::Future<Output = std::time::Duration>;
}

/// Times 1,000 single deliveries (20 when quick) of `delivery` and
/// reports their percentiles ([`report_percentiles`]), then has criterion
/// estimate one as `<group>/latency`.
pub fn deliveries(
    c: &mut criterion::Criterion,
    rt: &tokio::runtime::Runtime,
    backend: Backend,
    group: &str,
    delivery: &mut impl Delivery,
) {
    use std::time::Duration;

    let samples = if quick() { 20 } else { 1_000 };
    let mut times: Vec<Duration> = rt.block_on(async {
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            times.push(delivery.one().await);
        }
        times
    });
    report_percentiles(backend, &format!("{group}/latency"), &mut times);
    let mut measured = c.benchmark_group(group);
    measured.sample_size(30);
    measured.measurement_time(Duration::from_secs(5));
    measured.bench_function("latency", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += delivery.one().await;
                }
                total
            })
        })
    });
    measured.finish();
}

/// Sorts `times` (single deliveries of `backend`'s case `case`, a
/// criterion id such as `follow/sqlite/latency`), prints their median and
/// 99th percentile, and (unless quick) writes them to
/// `<criterion dir>/<case>/percentiles.json` for the performance report.
pub fn report_percentiles(backend: Backend, case: &str, times: &mut [std::time::Duration]) {
    times.sort();
    let (median, p99) = (percentile(times, 0.5), percentile(times, 0.99));
    println!(
        "{case}: median {:.3} ms, p99 {:.3} ms over {} deliveries",
        median.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        times.len()
    );
    if !quick() {
        let dir = criterion_dir().join(case);
        std::fs::create_dir_all(&dir).expect("the criterion directory");
        let json = format!(
            "{{\"backend\":\"{}\",\"case\":\"{case}\",\"samples\":{},\"median_ns\":{},\"p99_ns\":{}}}\n",
            backend.name(),
            times.len(),
            median.as_nanos(),
            p99.as_nanos()
        );
        std::fs::write(dir.join("percentiles.json"), json).expect("write percentiles");
    }
}
