//! What the criterion benches of mcp-event-store share: backend selection,
//! quick mode, the scale data sets, timing helpers, and the way to each
//! backend's kit.
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
//! # Each backend's baselines are in its own crate
//!
//! Everything that depends on how a store lays out its data (its bulk load,
//! the raw-driver baselines: range read, single appends, task rows, its
//! database's own wake-up; its harnesses) is the backend crate's `bench`
//! module, behind one interface, `mcp_event_store_conformance::bench::Kit`
//! (the memory store's is `MemoryKit`). The benches are generic over the
//! kit and reach each backend by name through the facade
//! ([`visit`]: `mcp_event_store::testing::visit_kit`), so no list here names
//! a backend: every backend `mcp_event_store::backends()` lists is measured.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use mcp_event_store::{Backend, DynStore, StoreOptions};
use mcp_event_store_conformance::bench::{Kit, Visitor};
use mcp_event_store_conformance::events::Harness;

pub use mcp_event_store_conformance::bench::bus::Delivery;
pub use mcp_event_store_conformance::bench::{
    Loaded, RawEvent, StreamPlan, Teardown, median_us, now_millis, payload, plan_total,
    process_cpu_ns, schedule, unbounded,
};

/// Streams in the scale data sets.
pub const SCALE_STREAMS: u64 = 1_000;
/// Events of the probe stream in the scale data sets; replays read its
/// last 100.
pub const PROBE_LEN: u64 = 200;

/// Every backend compiled into the facade, in its order
/// (`mcp_event_store::backends()`).
pub fn compiled() -> Vec<&'static Backend> {
    mcp_event_store::backends()
}

/// The backends `MCP_EVENT_STORE_BENCH_BACKENDS` selects (all compiled in
/// if unset), in [`compiled`] order. An unknown name is an error, not a
/// silent skip.
pub fn selected() -> Vec<&'static Backend> {
    let all = compiled();
    let Ok(list) = std::env::var("MCP_EVENT_STORE_BENCH_BACKENDS") else {
        return all;
    };
    let mut chosen = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let backend = all
            .iter()
            .copied()
            .find(|b| b.name.eq_ignore_ascii_case(name))
            .unwrap_or_else(|| {
                let known: Vec<&str> = all.iter().map(|b| b.name).collect();
                panic!(
                    "MCP_EVENT_STORE_BENCH_BACKENDS: unknown backend {name:?} (known: {})",
                    known.join(", ")
                )
            });
        chosen.push(backend.name);
    }
    if chosen.is_empty() {
        return all;
    }
    all.into_iter()
        .filter(|b| chosen.contains(&b.name))
        .collect()
}

/// Runs `visitor` with the kit of `backend` (one [`selected`] names).
pub fn visit<V: Visitor>(backend: &Backend, visitor: V) -> V::Output {
    mcp_event_store::testing::visit_kit(backend.name, visitor)
        .unwrap_or_else(|| panic!("no kit for the backend {:?}", backend.name))
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

/// Two handles on one fresh storage of `backend` (its kit's harness: a
/// temporary file or directory, a schema, a key prefix), and what removes
/// it: for the benches of what crosses handles (following, the bus). For
/// memory, A and B are one handle; for sled, two handles in one process, as
/// sled allows.
pub async fn two_handles(backend: &Backend) -> (DynStore, DynStore, Teardown) {
    struct Two;
    impl Visitor for Two {
        type Output = Pin<Box<dyn Future<Output = (DynStore, DynStore, Teardown)>>>;

        fn visit<K: Kit>(self) -> Self::Output {
            Box::pin(async {
                let harness = K::harness().await;
                let a = harness.open(unbounded()).await;
                let b = harness.open(unbounded()).await;
                let teardown: Teardown = Box::pin(harness.teardown());
                (Arc::new(a) as DynStore, Arc::new(b) as DynStore, teardown)
            })
        }
    }
    visit(backend, Two).await
}

/// A handle with `options` on fresh storage of `backend` (its kit's
/// harness), and what removes it.
pub async fn one_handle(backend: &Backend, options: StoreOptions) -> (DynStore, Teardown) {
    struct One(StoreOptions);
    impl Visitor for One {
        type Output = Pin<Box<dyn Future<Output = (DynStore, Teardown)>>>;

        fn visit<K: Kit>(self) -> Self::Output {
            Box::pin(async move {
                let harness = K::harness().await;
                let store = harness.open(self.0).await;
                let teardown: Teardown = Box::pin(harness.teardown());
                (Arc::new(store) as DynStore, teardown)
            })
        }
    }
    visit(backend, One(options)).await
}

/// The value at fraction `p` (0 to 1) of `sorted`.
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

/// Times 1,000 single deliveries (20 when quick) of `delivery` and
/// reports their percentiles ([`report_percentiles`]), then has criterion
/// estimate one as `<group>/latency`.
pub fn deliveries(
    c: &mut criterion::Criterion,
    rt: &tokio::runtime::Runtime,
    backend: &Backend,
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
pub fn report_percentiles(backend: &Backend, case: &str, times: &mut [std::time::Duration]) {
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
            backend.name,
            times.len(),
            median.as_nanos(),
            p99.as_nanos()
        );
        std::fs::write(dir.join("percentiles.json"), json).expect("write percentiles");
    }
}
