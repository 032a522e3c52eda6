//! The memory store's kit: loaded through its API; its raw baselines are a
//! `BTreeMap` range (replay), a `BTreeMap` insert behind a mutex (append)
//! and task-sized values in a `HashMap` (tasks).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::backend::{RedeemKey, StreamToken, dense};
use mcp_event_store_core::task::TaskStatus;
use mcp_event_store_core::{Backend, EventStore, MemoryStore, NewEvent, Position};

use super::append::{AppendBench, AppendCase, AppendFn, store_append};
use super::redeem::RawRedeem;
use super::tasks::{NoClaim, NoWake, RESULT, TaskOps, TaskRaw, TaskSubject, fresh_key};
use super::{Kit, Loaded, RawEvent, RawRead, ReadCases, StreamPlan};
use super::{dense_positions, payload, schedule, unbounded};
use crate::events::MemoryHarness;
use crate::tasks::MemoryTaskHarness;

/// The in-memory store's [`Kit`].
pub struct MemoryKit;

/// The raw baseline of a replay: the probe stream's events in a
/// `BTreeMap` of their own.
pub struct MemoryRaw(BTreeMap<u64, (Bytes, Option<Duration>)>);

impl RawRead for MemoryRaw {
    /// A `BTreeMap` range: every event after `after`.
    async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        self.0
            .range(after.minor + 1..)
            .map(|(seq, (data, retry))| {
                (
                    dense::position(after.major, *seq),
                    data.clone(),
                    retry.map(|r| r.as_millis() as i64),
                )
            })
            .collect()
    }
}

/// Raw tasks: task-sized values in a `HashMap` behind a mutex.
pub struct MemoryTasks {
    map: std::sync::Mutex<std::collections::HashMap<[u8; 16], Vec<u8>>>,
    /// The length of the store's encoding of a fresh task.
    value_len: usize,
}

impl TaskOps for MemoryTasks {
    type Key = [u8; 16];

    async fn create(&self) -> [u8; 16] {
        let key = fresh_key();
        let mut value = vec![0u8; self.value_len];
        value[1..9].copy_from_slice(&1u64.to_be_bytes());
        let mut map = self.map.lock().expect("raw map");
        match map.entry(key) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(value);
            }
            std::collections::hash_map::Entry::Occupied(_) => panic!("a key drawn twice"),
        }
        key
    }

    async fn get(&self, key: &[u8; 16]) {
        let value = self.map.lock().expect("raw map").get(key).cloned();
        black_box(value.expect("the row is there"));
    }

    async fn finish(&self, key: &[u8; 16]) {
        let mut map = self.map.lock().expect("raw map");
        let value = map.get_mut(key).expect("the row is there");
        assert_eq!(value[0], 0, "the row is working");
        let rev = u64::from_be_bytes(value[1..9].try_into().expect("8 bytes"));
        value[0] = TaskStatus::Completed.as_u8();
        value[1..9].copy_from_slice(&(rev + 1).to_be_bytes());
        value.extend_from_slice(RESULT);
    }
}

/// The raw redemption: a `HashMap` insert-if-absent behind a mutex, as
/// the store's map.
#[derive(Debug, Default)]
pub struct MemoryRedeem(std::sync::Mutex<std::collections::HashMap<RedeemKey, i64>>);

impl RawRedeem for MemoryRedeem {
    async fn redeem(&self, key: &RedeemKey, forget_at: i64) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match map.entry(*key) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(forget_at);
                true
            }
        }
    }
}

impl Kit for MemoryKit {
    const BACKEND: &'static Backend = &MemoryStore::BACKEND;

    type Harness = MemoryHarness;
    type TaskHarness = MemoryTaskHarness;

    async fn harness() -> MemoryHarness {
        MemoryHarness::new().await
    }

    async fn task_harness() -> MemoryTaskHarness {
        MemoryTaskHarness::new().await
    }

    type RawRedeem = MemoryRedeem;

    async fn raw_redeem(_: &MemoryHarness) -> MemoryRedeem {
        MemoryRedeem::default()
    }

    /// Nothing to keep: the data set lives and dies with the store.
    type Storage = ();
    type Raw = MemoryRaw;

    /// Builds `plan` through the store's API, in schedule order.
    async fn load(plan: &[StreamPlan]) -> Loaded<()> {
        let store = MemoryStore::with_options(unbounded());
        let data = payload();
        let mut probe = None;
        for i in schedule(plan) {
            let id = store
                .store_event(&plan[i as usize].stream_id, NewEvent::new(&data))
                .await
                .expect("append");
            if i as usize == plan.len() - 1 {
                probe = Some(id);
            }
        }
        let probe = probe.expect("a probe stream");
        Loaded {
            store: Arc::new(store),
            token: probe.token,
            positions: dense_positions(probe.position.major, plan[plan.len() - 1].len),
            storage: (),
        }
    }

    /// A `BTreeMap` holding the probe stream's events as the store holds
    /// them.
    async fn raw(_: &(), _: StreamToken, probe: &StreamPlan) -> MemoryRaw {
        let data = payload();
        MemoryRaw(
            (1..=probe.len)
                .map(|seq| (seq, (Bytes::copy_from_slice(&data), None)))
                .collect(),
        )
    }

    /// `raw_stream`: the raw range into a `Vec`, then handed out one event
    /// at a time through a boxed stream and collected, as the `Replay`
    /// stream every store returns is: the floor of that API over an
    /// in-memory read.
    fn read_cases(raw: &MemoryRaw, cases: &mut impl ReadCases) {
        cases.awaited("raw_stream", |after| async move {
            let page = raw.read_after(after).await;
            futures_util::stream::iter(page.into_iter().map(Ok::<_, mcp_event_store_core::Error>))
                .boxed()
                .try_collect::<Vec<_>>()
                .await
                .expect("events")
        });
    }

    /// Nothing to remove.
    async fn cleanup(_: ()) {}

    /// The store, and a `BTreeMap` keyed by (stream, seq) behind a mutex.
    async fn append() -> AppendBench {
        let store = store_append(Arc::new(MemoryStore::new()));
        type RawMap = BTreeMap<(usize, u64), Vec<u8>>;
        let map: Arc<std::sync::Mutex<RawMap>> = Arc::default();
        let data = payload();
        let raw: AppendFn = Arc::new(move |writer| {
            let (map, data) = (map.clone(), data.clone());
            Box::pin(async move {
                let mut map = map.lock().expect("raw map");
                let next = map
                    .range((writer, 0)..(writer, u64::MAX))
                    .next_back()
                    .map_or(1, |((_, seq), _)| seq + 1);
                map.insert((writer, next), data);
            })
        });
        AppendBench::new(
            vec![
                AppendCase::one("store_1_writer", &store),
                AppendCase::one("raw_1_writer", &raw),
                AppendCase::many("store_32_writers", &store),
                AppendCase::many("raw_32_writers", &raw),
            ],
            async {},
        )
    }

    type TaskOps = MemoryTasks;
    type Claim = NoClaim;
    type Wake = NoWake;

    async fn task_raw(
        _: &MemoryTaskHarness,
        subject: &TaskSubject,
    ) -> TaskRaw<MemoryTasks, NoClaim, NoWake> {
        TaskRaw {
            ops: MemoryTasks {
                map: Default::default(),
                value_len: subject.value_len(),
            },
            finishes: Vec::new(),
            claim: None,
            wake: None,
            settle: Duration::from_micros(100),
        }
    }
}
