//! The append bench's cases: the store's append and the raw driver's, each
//! a boxed future factory, so the bench times every one the same way.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use mcp_event_store_core::{NewEvent, Store};

use super::{Teardown, payload};

/// Concurrent writers, each on its own stream.
pub const WRITERS: usize = 32;
/// Appends each writer makes per iteration of a [`WRITERS`]-writer case.
pub const PER_WRITER: usize = 4;

/// One append by writer `w` (0 to [`WRITERS`] - 1), as a boxed future
/// factory: the store, or a raw driver call.
pub type AppendFn = Arc<dyn Fn(usize) -> BoxFuture<'static, ()> + Send + Sync>;

/// The store's append of the 200-byte [`payload`], writer `w` on the
/// stream `writer-<w>`.
pub fn store_append(store: Arc<dyn Store>) -> AppendFn {
    let data: Arc<[u8]> = payload().into();
    let streams: Arc<Vec<String>> = Arc::new((0..WRITERS).map(|w| format!("writer-{w}")).collect());
    Arc::new(move |writer| {
        let (store, data, streams) = (store.clone(), data.clone(), streams.clone());
        Box::pin(async move {
            store
                .store_event(&streams[writer], NewEvent::new(&data))
                .await
                .expect("append");
        })
    })
}

/// One case of the append bench.
pub struct AppendCase {
    /// Its benchmark id in the backend's group (`raw_1_writer`).
    pub id: String,
    /// 1: one append at a time from one writer; [`WRITERS`]: that many
    /// tasks making [`PER_WRITER`] appends each per iteration.
    pub writers: usize,
    /// The append.
    pub append: AppendFn,
    /// The group's sample size from this case on, if it changes here
    /// (slow durable cases take fewer samples).
    pub sample_size: Option<usize>,
}

impl AppendCase {
    /// One writer.
    pub fn one(id: &str, append: &AppendFn) -> Self {
        Self {
            id: id.to_owned(),
            writers: 1,
            append: append.clone(),
            sample_size: None,
        }
    }

    /// [`WRITERS`] writers.
    pub fn many(id: &str, append: &AppendFn) -> Self {
        Self {
            writers: WRITERS,
            ..Self::one(id, append)
        }
    }

    /// The same, with the group's sample size set to `n` from here on.
    pub fn sample_size(mut self, n: usize) -> Self {
        self.sample_size = Some(n);
        self
    }
}

/// A backend's append cases, in order, and what removes their storage.
pub struct AppendBench {
    /// The cases.
    pub cases: Vec<AppendCase>,
    /// Closes the stores and removes their storage (run once the cases
    /// are done).
    pub teardown: Teardown,
}

impl AppendBench {
    /// `cases`, then `teardown`.
    pub fn new(cases: Vec<AppendCase>, teardown: impl Future<Output = ()> + 'static) -> Self {
        Self {
            cases,
            teardown: Box::pin(teardown),
        }
    }
}
