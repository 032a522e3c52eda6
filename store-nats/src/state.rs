//! What the clones of one [`NatsStore`] share ([`Inner`]: the connection,
//! the names, the stream secret, the options, the follow wake-ups), and the
//! plumbing the job files reach it through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_nats::jetstream::{self, kv};
use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamKey, StreamToken};

use crate::NatsOptions;
use crate::NatsStore;

/// The key-value buckets of a store, by job.
pub(crate) const BUCKETS: [&str; 6] = [
    "meta",
    "sessions",
    "tasks",
    "instances",
    "takeover",
    "redeemed",
];

/// The names of this store's streams, buckets and subjects, from its prefix.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    pub(crate) prefix: String,
}

impl Names {
    /// The JetStream stream that holds every event.
    pub(crate) fn events(&self) -> String {
        format!("{}-events", self.prefix)
    }

    /// The subject of one stream's events.
    pub(crate) fn event_subject(&self, token: &StreamToken) -> String {
        format!("{}.ev.{}", self.prefix, token.to_text())
    }

    /// Every event subject (the events stream's filter).
    pub(crate) fn event_subjects(&self) -> String {
        format!("{}.ev.*", self.prefix)
    }

    /// The core subject an append wakes followers of `token` on.
    pub(crate) fn wake_subject(&self, token: &StreamToken) -> String {
        format!("{}.wake.{}", self.prefix, token.to_text())
    }

    /// The core subject a task change wakes watchers of `token` on.
    pub(crate) fn task_wake_subject(&self, token: &StreamToken) -> String {
        format!("{}.twake.{}", self.prefix, token.to_text())
    }

    /// Every task wake-up subject.
    pub(crate) fn task_wake_subjects(&self) -> String {
        format!("{}.twake.*", self.prefix)
    }

    /// Every wake-up subject.
    pub(crate) fn wake_subjects(&self) -> String {
        format!("{}.wake.*", self.prefix)
    }

    /// The JetStream stream that holds spilled values.
    pub(crate) fn spill(&self) -> String {
        format!("{}-spill", self.prefix)
    }

    /// A key-value bucket of this store.
    pub(crate) fn bucket(&self, job: &str) -> String {
        format!("{}-{job}", self.prefix)
    }
}

/// Every JetStream stream of the store under `prefix` (a bucket is the
/// stream `KV_<bucket>`).
pub(crate) fn stream_names(prefix: &str) -> Vec<String> {
    let names = Names {
        prefix: prefix.to_owned(),
    };
    let mut streams = vec![names.events(), names.spill()];
    streams.extend(BUCKETS.map(|job| format!("KV_{}", names.bucket(job))));
    streams
}

/// The newest event of a stream as this handle last wrote it: what the
/// next append chains to without reading first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) seq: u64,
    pub(crate) base: u64,
    pub(crate) total: u64,
}

/// How many stream heads a handle remembers; past it, it forgets them all
/// (an append to a forgotten stream reads its head once).
const MAX_HEADS: usize = 16_384;

/// How many locks the appends of one handle spread their streams over.
const APPEND_LOCKS: usize = 256;

/// What the clones of one handle share.
pub(crate) struct Inner {
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) events: jetstream::stream::Stream,
    /// Values too large for one message (see `spill`).
    pub(crate) spill: jetstream::stream::Stream,
    pub(crate) sessions: kv::Store,
    /// Redeemed nonces (C21), see [`crate::redeem`].
    pub(crate) redeemed: kv::Store,
    pub(crate) tasks: kv::Store,
    pub(crate) instances: kv::Store,
    pub(crate) takeover: kv::Store,
    pub(crate) names: Names,
    pub(crate) secret: StreamKey,
    pub(crate) options: NatsOptions,
    heads: Mutex<HashMap<StreamToken, Head>>,
    /// One handle's appends to one stream take turns (a stream hashes to
    /// one of these), so they chain one after the other instead of racing
    /// for the same expected sequence.
    append_locks: Vec<tokio::sync::Mutex<()>>,
    pub(crate) wakeups: Arc<Wakeups>,
    /// The task watchers' wake-ups.
    pub(crate) task_wakeups: Arc<Wakeups>,
    /// The tasks that turn wake-up messages into follower and task
    /// watcher wake-ups.
    pub(crate) watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Set by [`NatsStore::close`].
    pub(crate) closed: AtomicBool,
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: async_nats::Client,
        js: jetstream::Context,
        events: jetstream::stream::Stream,
        spill: jetstream::stream::Stream,
        sessions: kv::Store,
        redeemed: kv::Store,
        [tasks, instances, takeover]: [kv::Store; 3],
        names: Names,
        secret: StreamKey,
        options: NatsOptions,
    ) -> Self {
        Self {
            client,
            js,
            events,
            spill,
            sessions,
            redeemed,
            tasks,
            instances,
            takeover,
            names,
            secret,
            options,
            heads: Mutex::new(HashMap::new()),
            append_locks: (0..APPEND_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            wakeups: Arc::new(Wakeups::default()),
            task_wakeups: Arc::new(Wakeups::default()),
            watchers: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// Stops the wake-up watchers.
    pub(crate) fn stop_watchers(&self) {
        for watcher in self
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            watcher.abort();
        }
    }

    fn heads(&self) -> MutexGuard<'_, HashMap<StreamToken, Head>> {
        // One map operation per critical section: a poisoned lock holds
        // nothing half-done.
        self.heads.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn head(&self, token: &StreamToken) -> Option<Head> {
        self.heads().get(token).copied()
    }

    pub(crate) fn remember_head(&self, token: StreamToken, head: Head) {
        let mut heads = self.heads();
        if heads.len() >= MAX_HEADS && !heads.contains_key(&token) {
            heads.clear();
        }
        heads.insert(token, head);
    }

    /// The turn of this handle's appends to `token`'s stream.
    pub(crate) async fn append_turn(&self, token: &StreamToken) -> tokio::sync::MutexGuard<'_, ()> {
        let slot = usize::from(u16::from_le_bytes([
            token.as_bytes()[0],
            token.as_bytes()[1],
        ]));
        self.append_locks[slot % APPEND_LOCKS].lock().await
    }

    pub(crate) fn forget_head(&self, token: &StreamToken) {
        self.heads().remove(token);
    }
}

/// What the job files share.
impl NatsStore {
    pub(crate) fn is_closed_now(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    pub(crate) fn now(&self) -> i64 {
        self.inner.options.store.clock.now_millis()
    }

    pub(crate) fn token(&self, stream_id: &str) -> StreamToken {
        self.inner.secret.token(stream_id)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_watchers();
    }
}
