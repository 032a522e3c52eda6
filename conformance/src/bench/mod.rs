//! What a backend gives the benchmarks (the crate `mcp-event-store-benches`):
//! its bench baselines, behind one interface, [`Kit`].
//!
//! Each backend crate implements [`Kit`] in its `bench` module (feature
//! `bench`): how it builds a data set in bulk, the raw-driver baselines the
//! store is measured against (a range read, single appends, task rows, its
//! database's own wake-up), and its test harnesses. The in-memory store's is
//! [`MemoryKit`]. The facade lists every kit beside its descriptor
//! (`mcp_event_store::testing::visit_kit`, feature `testing`), so the
//! benches reach each backend by name, never by a list of their own: a
//! [`Visitor`] is handed the kit of the backend asked for, as a type.
//!
//! Everything here is generic over the kit, never boxed, so a raw baseline
//! costs exactly what its backend's driver does.
//!
//! * [`append`]: the append cases ([`AppendBench`](append::AppendBench)).
//! * [`tasks`]: the task rows by hand ([`TaskOps`](tasks::TaskOps)), a raw
//!   claim and a raw wake-up.
//! * [`bus`]: one message carried by the database's own primitive
//!   ([`Delivery`](bus::Delivery)).
//! * Here: the data sets of the replay and scale benches ([`StreamPlan`],
//!   [`Loaded`]) and the raw range read ([`RawRead`]).

pub mod append;
pub mod bus;
mod memory;
pub mod redeem;
pub mod tasks;

use std::future::Future;

use bytes::Bytes;
use mcp_event_store_core::backend::{StreamToken, dense};
use mcp_event_store_core::task::RuntimeStore;
use mcp_event_store_core::{
    Backend, EventId, EventStore, NewEvent, Position, Retention, Store, StoreOptions,
};

use crate::events::Harness;
use crate::tasks::TaskHarness;

pub use memory::MemoryKit;

/// Rows a raw range read asks for at a time: the largest page that keeps
/// PostgreSQL on the index scan (see DESIGN.md, "Traps").
pub const RAW_PAGE: usize = 1_000;

/// What a raw read decodes per event: position, payload, retry in ms.
pub type RawEvent = (Position, Bytes, Option<i64>);

/// Removes a bench's storage once its handles are dropped.
pub type Teardown = std::pin::Pin<Box<dyn Future<Output = ()>>>;

/// One backend's bench baselines and test harnesses.
///
/// The methods that build something are async and run on the bench's
/// multi-threaded runtime; the ones given a [`tokio::runtime::Runtime`] drive
/// it themselves between the cases they hand out.
pub trait Kit: Sized + 'static {
    /// The backend's descriptor (`crate::BACKEND`).
    const BACKEND: &'static Backend;

    /// The event suite's harness: one fresh piece of storage, any number of
    /// handles on it.
    type Harness: Harness<Store: RuntimeStore>;

    /// The task suite's harness (for a backend crate, the same type).
    type TaskHarness: TaskHarness;

    /// Fresh, private storage: a temporary file or directory, a schema or
    /// key prefix of its own on the test server.
    fn harness() -> impl Future<Output = Self::Harness>;

    /// Fresh, private storage for the task benches.
    fn task_harness() -> impl Future<Output = Self::TaskHarness>;

    // ----------------------------------------------------- replay, scale

    /// What [`load`](Kit::load) leaves for the raw baseline and the
    /// clean-up (the store, its files, schema or key prefix).
    type Storage;

    /// The raw baseline of a replay.
    type Raw: RawRead;

    /// A fresh store holding `plan` (the probe stream last), built in bulk
    /// as the store lays data out, with the probe stream's positions.
    fn load(plan: &[StreamPlan]) -> impl Future<Output = Loaded<Self::Storage>>;

    /// The raw baseline for the probe stream `probe` (whose token is
    /// `token`) of a loaded data set. Dropping it removes what it made.
    fn raw(
        storage: &Self::Storage,
        token: StreamToken,
        probe: &StreamPlan,
    ) -> impl Future<Output = Self::Raw>;

    /// The backend's further replay baselines beside
    /// [`RawRead::read_after`] (SQLite's read through SQLite itself, sled's
    /// read behind the blocking pool's hop), each handed to `cases`.
    fn read_cases(raw: &Self::Raw, cases: &mut impl ReadCases) {
        let _ = (raw, cases);
    }

    /// Removes what a data set left behind (the store is dropped first).
    fn cleanup(storage: Self::Storage) -> impl Future<Output = ()>;

    // ------------------------------------------------------------ append

    /// The append cases, in the order they are measured: the store's and
    /// the raw driver's, one writer and [`append::WRITERS`].
    fn append() -> impl Future<Output = append::AppendBench>;

    /// The store's append and the raw ones timed in interleaved rounds
    /// (`rounds` of each), printed: what the criterion cases, run one after
    /// another, cannot tell apart from the machine's drift. `false` if the
    /// backend has no such comparison.
    fn append_pairs(rounds: usize) -> impl Future<Output = bool> {
        let _ = rounds;
        async { false }
    }

    // ------------------------------------------------------------- tasks

    /// The task rows written by hand.
    type TaskOps: tasks::TaskOps;

    /// A raw claim, where the database has one ([`tasks::NoClaim`] if not).
    type Claim: tasks::RawClaim;

    /// A raw wake-up, where the driver has one ([`tasks::NoWake`] if not).
    type Wake: tasks::RawWake;

    /// The task baselines on `harness`'s storage, for the tasks of
    /// `subject`.
    fn task_raw(
        harness: &Self::TaskHarness,
        subject: &tasks::TaskSubject,
    ) -> impl Future<Output = tasks::TaskRaw<Self::TaskOps, Self::Claim, Self::Wake>>;

    // ------------------------------------------------------- redemptions

    /// The raw redemption (C21): the database's own insert-if-absent by
    /// hand.
    type RawRedeem: redeem::RawRedeem;

    /// The raw redemption on `harness`'s storage, which a store opened
    /// first (so its tables, trees or buckets are there).
    fn raw_redeem(harness: &Self::Harness) -> impl Future<Output = Self::RawRedeem>;

    // --------------------------------------------------------------- bus

    /// The database's own ways of carrying a message from one connection
    /// to another (`pg_notify`, `PUBLISH`, ...), each handed to `cases`
    /// under its name; none by default.
    fn bus(rt: &tokio::runtime::Runtime, cases: &mut impl bus::DeliveryCases) {
        let _ = (rt, cases);
    }
}

/// Something that runs with the kit of one backend, chosen by name at run
/// time and handed over as a type (`mcp_event_store::testing::visit_kit`).
pub trait Visitor {
    /// What the visit returns.
    type Output;

    /// Runs with the kit `K`.
    fn visit<K: Kit>(self) -> Self::Output;
}

/// The raw baseline of a replay: the same range read as a replay, done by
/// hand with the backend's driver, decoding each event into (position,
/// payload, retry) as the store does. No cursor check, no gap check, no id
/// formatting.
pub trait RawRead {
    /// Every event after `after`.
    fn read_after(&self, after: Position) -> impl Future<Output = Vec<RawEvent>>;
}

/// Where a kit hands its further replay baselines ([`Kit::read_cases`]).
pub trait ReadCases {
    /// A read run on the calling thread.
    fn on_thread(&mut self, id: &str, read: impl Fn(Position) -> Vec<RawEvent>);

    /// A read awaited.
    fn awaited<F: Future<Output = Vec<RawEvent>>>(
        &mut self,
        id: &str,
        read: impl Fn(Position) -> F,
    );
}

/// One stream of a data set: its id and how many events it gets.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    /// The stream id.
    pub stream_id: String,
    /// How many events it holds.
    pub len: u64,
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

/// Appends the data set `plan` through `store` (the 200-byte [`payload`]
/// each time), `in_flight` appends at once in [`schedule`] order, and
/// returns the ids of the probe stream (the plan's last), oldest first:
/// how a kit whose ids are the server's or the store's builds its data set.
pub async fn append_plan<S: EventStore + ?Sized>(
    store: &S,
    plan: &[StreamPlan],
    in_flight: usize,
) -> Vec<EventId> {
    use futures_util::StreamExt;
    let probe = plan.len() as u32 - 1;
    let data = payload();
    let mut ids: Vec<EventId> = futures_util::stream::iter(schedule(plan))
        .map(|i| {
            let data = &data;
            async move {
                let id = store
                    .store_event(&plan[i as usize].stream_id, NewEvent::new(data))
                    .await
                    .expect("append");
                (i == probe).then_some(id)
            }
        })
        .buffer_unordered(in_flight)
        .filter_map(|id| async move { id })
        .collect()
        .await;
    ids.sort_by_key(|id| id.position);
    ids
}

/// The positions of a densely numbered stream of `len` events in its life
/// `incarnation`.
pub fn dense_positions(incarnation: u64, len: u64) -> Vec<Position> {
    (1..=len)
        .map(|seq| dense::position(incarnation, seq))
        .collect()
}

/// A store holding a data set, with the probe stream's positions, and
/// `storage`: what the backend's kit needs for its raw baseline and its
/// clean-up.
pub struct Loaded<S> {
    /// The store, as the benches use it.
    pub store: std::sync::Arc<dyn Store>,
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

    /// Drops the store, then removes what the data set left behind
    /// ([`Kit::cleanup`]).
    pub async fn cleanup<K: Kit<Storage = S>>(self) {
        drop(self.store);
        K::cleanup(self.storage).await;
    }
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

/// The median of `times`, in microseconds (sorts them).
pub fn median_us(times: &mut [std::time::Duration]) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
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
