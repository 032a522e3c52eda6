//! sled: the data set appended through the store's API (its records and
//! indexes are the store's business); the raw baseline is a sled range over
//! a copy of the probe stream in the store's key and value layout, in a
//! database of its own (sled lets one process open a directory once).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use mcp_event_store::{EventId, EventStore, NewEvent, Position};
use mcp_event_store_sled::{Durability, SledOptions, SledStore};

use crate::{
    Loaded, RawEvent, StreamPlan, StreamToken, dense, dense_positions, now_millis, payload,
    schedule, unbounded,
};

/// The store and its directory.
pub struct Storage {
    store: SledStore,
    dir: tempfile::TempDir,
}

/// Writes the data set through a handle in interval mode, so the build does
/// not wait for a flush per group; then closes it and reopens the store
/// with the default durability, which is what the benches measure.
pub async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let builder = SledStore::open(
        dir.path(),
        SledOptions::default()
            .store(unbounded())
            .durability(Durability::Interval(Duration::from_millis(100))),
    )
    .await
    .expect("open sled");
    let probe = plan.len() as u32 - 1;
    let data = payload();
    let probes: Vec<EventId> = futures_util::stream::iter(schedule(plan))
        .map(|i| {
            let store = &builder;
            let data = &data;
            async move {
                let id = store
                    .store_event(&plan[i as usize].stream_id, NewEvent::new(data))
                    .await
                    .expect("append");
                (i == probe).then_some(id)
            }
        })
        .buffer_unordered(64)
        .filter_map(|id| async move { id })
        .collect()
        .await;
    builder.close().await.expect("close the builder");
    let store = SledStore::open(dir.path(), SledOptions::default().store(unbounded()))
        .await
        .expect("reopen sled");
    Loaded {
        store: Arc::new(store.clone()),
        token: probes[0].token,
        positions: dense_positions(probes[0].position.major, plan[plan.len() - 1].len),
        storage: Storage { store, dir },
    }
}

/// The raw baseline: a sled range over `token ++ seq` keys holding the
/// store's value layout (24-byte header, then the payload). Dropping it
/// removes its database.
pub struct Raw {
    tree: sled::Tree,
    token: Vec<u8>,
    // After the tree: the directory goes once the database is closed.
    _dir: tempfile::TempDir,
}

/// A database of its own holding a copy of the probe stream.
pub async fn raw(_storage: &Storage, token: StreamToken, probe: &StreamPlan) -> Raw {
    let token = token.as_bytes().to_vec();
    let data = payload();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(mcp_event_store_sled::DEFAULT_CACHE_CAPACITY)
        .open()
        .expect("raw sled");
    let tree = db.open_tree("events").expect("raw sled tree");
    let now = (now_millis() as u64) ^ (1 << 63);
    // Plain inserts: sled 0.34's batches switch the whole process to a
    // global lock that the store's operations would then take.
    let mut cum = 0u64;
    for seq in 1..=probe.len {
        let mut key = token.clone();
        key.extend_from_slice(&seq.to_be_bytes());
        let mut value = Vec::with_capacity(24 + data.len());
        value.extend_from_slice(&now.to_be_bytes());
        value.extend_from_slice(&u64::MAX.to_be_bytes());
        value.extend_from_slice(&cum.to_be_bytes());
        value.extend_from_slice(&data);
        cum += data.len() as u64;
        tree.insert(key, value).expect("raw sled insert");
    }
    db.flush().expect("raw sled flush");
    Raw {
        tree,
        token,
        _dir: dir,
    }
}

impl Raw {
    /// Every event after `after`: one range.
    pub async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        read_range(&self.tree, &self.token, after)
    }

    /// As [`read_after`](Raw::read_after), on tokio's blocking pool, as
    /// the store reads (it keeps every sled call off the executor's
    /// workers): the raw read behind the same thread hop.
    pub async fn read_after_on_blocking_pool(&self, after: Position) -> Vec<RawEvent> {
        let (tree, token) = (self.tree.clone(), self.token.clone());
        tokio::task::spawn_blocking(move || read_range(&tree, &token, after))
            .await
            .expect("raw sled read task")
    }
}

/// Every event of `token` after `after`: one range.
fn read_range(tree: &sled::Tree, token: &[u8], after: Position) -> Vec<RawEvent> {
    let mut start = token.to_vec();
    start.extend_from_slice(&(after.minor + 1).to_be_bytes());
    let mut end = token.to_vec();
    end.extend_from_slice(&u64::MAX.to_be_bytes());
    tree.range(start..end)
        .map(|entry| {
            let (key, value) = entry.expect("raw sled read");
            let seq = u64::from_be_bytes(key[15..23].try_into().expect("key"));
            let retry = u64::from_be_bytes(value[8..16].try_into().expect("header"));
            (
                dense::position(after.major, seq),
                Bytes::copy_from_slice(&value[24..]),
                (retry != u64::MAX).then_some(retry as i64),
            )
        })
        .collect()
}

/// Closes the store and removes its directory.
pub async fn cleanup(storage: Storage) {
    storage.store.close().await.expect("close sled");
    drop(storage.dir);
}
