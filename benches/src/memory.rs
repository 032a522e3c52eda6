//! The memory store: loaded through its API; the raw baseline is a
//! `BTreeMap` range over one stream's events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mcp_event_store::{EventStore, MemoryStore, NewEvent, Position};

use crate::{
    Loaded, RawEvent, StreamPlan, StreamToken, dense, dense_positions, payload, schedule, unbounded,
};

/// Nothing to keep: the data set lives and dies with the store.
pub struct Storage;

/// Builds `plan` (the probe stream last) through the store's API, in
/// schedule order.
pub async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
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
        storage: Storage,
    }
}

/// The raw baseline: the probe stream's events in a `BTreeMap` of its own.
pub struct Raw(BTreeMap<u64, (Bytes, Option<Duration>)>);

/// A `BTreeMap` holding the probe stream's events as the store holds them.
pub async fn raw(_storage: &Storage, _token: StreamToken, probe: &StreamPlan) -> Raw {
    let data = payload();
    Raw((1..=probe.len)
        .map(|seq| (seq, (Bytes::copy_from_slice(&data), None)))
        .collect())
}

impl Raw {
    /// A `BTreeMap` range: every event after `after`.
    pub async fn read_after(&self, after: Position) -> Vec<RawEvent> {
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

/// Nothing to remove.
pub async fn cleanup(_storage: Storage) {}
