//! An in-memory store: the whole contract except persistence.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::backend::dense::{self, DenseStream};
use crate::backend::follow::{self, Wakeups};
use crate::backend::task::OwnerKey;
use crate::backend::{
    BackendHandle, EventBackend, Reader, RedeemBackend, RedeemKey, RewriteBackend, RuntimeBackend,
    SessionBackend, TaskBackend,
};
use crate::error::{Error, Result};
use crate::event::{NewEvent, StoredEvent};
use crate::id::{EventId, StreamKey, StreamToken};
use crate::inspect::{HealthReport, Setting, StoreStats, StreamCursor, StreamInfo, StreamPage};
use crate::options::{PurgeReport, StoreOptions};
use crate::rewrite::{SessionValue, SessionValuePage, TaskField, TaskValuePage};
use crate::session::SessionDigest;
use crate::store::FollowOptions;
use crate::store::{Page, Replay, paged_replay, paged_replay_with};
use crate::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, MemoryTaskStore, NewTask, Requeue,
    Rev, TaskDigest, TaskPurgeReport, TaskRecord, TaskView, Worker, WorkerChange,
};

/// An [`EventStore`](crate::EventStore), [`SessionStore`](crate::SessionStore)
/// and [`TaskStore`](crate::task::TaskStore) kept in process memory.
///
/// Useful for tests and for single-process servers that accept losing
/// resumability on restart. It is bounded by its [`Retention`](crate::Retention)
/// like every other store, and a replay costs O(k) for k events (a stream's
/// events sit in a ring buffer indexed by sequence number), however many
/// other events the store holds.
///
/// Clones share the same data, like two handles on one database. Its tasks
/// are a [`MemoryTaskStore`] with the same options (its clock, payload
/// limit and task lifetimes).
///
/// It is built as every backend is: it implements the job traits of
/// [`backend`](crate::backend) ([`EventBackend`], [`SessionBackend`],
/// [`TaskBackend`], [`RuntimeBackend`], [`RedeemBackend`]), and the public traits, with their
/// checks and observation, come from core.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use mcp_event_store_core::{EventStore, MemoryStore, NewEvent};
///
/// let store = MemoryStore::new();
/// let id = store.store_event("stream", NewEvent::new(b"hello")).await?;
/// assert_eq!(store.get_stream_id_for_event_id(&id.to_string()).await?.as_deref(), Some("stream"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    key: StreamKey,
    options: StoreOptions,
    state: Arc<Mutex<State>>,
    /// Shared by every handle on the same data, like `state`.
    wakeups: Arc<Wakeups>,
    /// The tasks, shared by every handle on the same data like `state`.
    tasks: MemoryTaskStore,
}

#[derive(Debug, Default)]
struct State {
    /// Ordered by token, so stream listings page by token.
    streams: BTreeMap<StreamToken, Stream>,
    sessions: HashMap<String, Session>,
    /// Redeemed nonces (C21), by key, with the time they may be forgotten.
    redeemed: HashMap<RedeemKey, i64>,
    /// The last incarnation handed to a stream; never handed out twice.
    last_incarnation: u64,
}

/// Every append wakes its followers in process, so the periodic re-read is
/// only a safety net.
const RECHECK: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Stream {
    stream_id: String,
    /// This life of the stream (see [`dense`](crate::backend::dense)).
    incarnation: u64,
    last_seq: u64,
    bytes: u64,
    /// Dense: `events[i].seq == events[0].seq + i`.
    events: VecDeque<Entry>,
}

/// The memory store has one layout, never stored: version 1.
const FORMAT_VERSION: u32 = 1;

/// The smaller of two optional times.
fn min_some(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Stream {
    fn info(&self) -> StreamInfo {
        StreamInfo::new(
            self.stream_id.clone(),
            self.events.len() as u64,
            self.bytes,
            self.events.front().map(|e| e.stored_at),
            self.events.back().map(|e| e.stored_at),
        )
    }

    fn dense(&self) -> DenseStream {
        DenseStream {
            incarnation: self.incarnation,
            last_seq: self.last_seq,
            first_retained: self.events.front().map(|e| e.seq),
        }
    }
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    stored_at: i64,
    data: Bytes,
    retry: Option<Duration>,
}

#[derive(Debug)]
struct Session {
    state: Bytes,
    expires_at: i64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with default options.
    pub fn new() -> Self {
        Self::with_options(StoreOptions::default())
    }

    /// A store with these options.
    ///
    /// # Panics
    ///
    /// If the options are invalid (see [`StoreOptions::validate`]) or the
    /// operating system has no randomness to key stream tokens with; use
    /// [`MemoryStore::try_with_options`] to get an error instead.
    pub fn with_options(options: StoreOptions) -> Self {
        Self::try_with_options(options).expect("valid memory store options")
    }

    /// A store with these options, or an error if they are invalid.
    pub fn try_with_options(options: StoreOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                key: StreamKey::generate()?,
                tasks: MemoryTaskStore::with_options(options.clone()),
                options,
                state: Arc::default(),
                wakeups: Arc::default(),
            }),
        })
    }

    /// Another handle on the same data, with different options (as two
    /// processes may open one database with different settings).
    pub fn share_with_options(&self, options: StoreOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            inner: Arc::new(Inner {
                key: self.inner.key.clone(),
                tasks: self.inner.tasks.share_with_options(options.clone()),
                options,
                state: self.inner.state.clone(),
                wakeups: self.inner.wakeups.clone(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied change
        // behind (every mutation completes before the guard drops), so a
        // poisoned lock is safe to keep using.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends an event under the lock: its stream's next id, the stream
    /// trimmed to the retention limits.
    fn insert(&self, stream_id: &str, event: NewEvent<'_>) -> EventId {
        let token = self.inner.key.token(stream_id);
        let retention = self.inner.options.retention;
        let now = self.now_millis();
        let mut state = self.state();
        let state = &mut *state;
        let stream = state.streams.entry(token).or_insert_with(|| {
            state.last_incarnation += 1;
            Stream {
                stream_id: stream_id.to_owned(),
                incarnation: state.last_incarnation,
                last_seq: 0,
                bytes: 0,
                events: VecDeque::new(),
            }
        });
        stream.last_seq += 1;
        stream.bytes += event.data.len() as u64;
        stream.events.push_back(Entry {
            seq: stream.last_seq,
            stored_at: now,
            data: Bytes::copy_from_slice(event.data),
            retry: event.retry,
        });
        let max_events = retention.max_events_per_stream.unwrap_or(u64::MAX);
        let max_bytes = retention.max_bytes_per_stream.unwrap_or(u64::MAX);
        while stream.events.len() > 1
            && (stream.events.len() as u64 > max_events || stream.bytes > max_bytes)
        {
            let dropped = stream.events.pop_front().expect("len > 1");
            stream.bytes -= dropped.data.len() as u64;
        }
        EventId::new(token, dense::position(stream.incarnation, stream.last_seq))
    }

    fn page(&self, raw: &str, token: StreamToken, incarnation: u64, after: u64) -> Result<Page> {
        let state = self.state();
        let Some(stream) = state
            .streams
            .get(&token)
            .filter(|stream| stream.incarnation == incarnation)
        else {
            // Deleted or expired under the replay (perhaps started again).
            return Err(Error::events_purged(raw));
        };
        self.page_of(stream, raw, token, incarnation, after)
    }

    /// The page of `stream` (of life `incarnation`) after `after`.
    fn page_of(
        &self,
        stream: &Stream,
        raw: &str,
        token: StreamToken,
        incarnation: u64,
        after: u64,
    ) -> Result<Page> {
        let limit = self.inner.options.page_size;
        let first_retained = stream.events.front().map(|e| e.seq);
        let skip = first_retained.map_or(0, |first| (after + 1).saturating_sub(first));
        let events: Vec<StoredEvent> = stream
            .events
            .range(
                usize::try_from(skip)
                    .unwrap_or(usize::MAX)
                    .min(stream.events.len())..,
            )
            .take(limit)
            .map(|entry| StoredEvent {
                id: EventId::new(token, dense::position(incarnation, entry.seq)),
                data: entry.data.clone(),
                retry: entry.retry,
            })
            .collect();
        dense::check_page(
            raw,
            after,
            events.first().map(|e| e.id.position.minor),
            Some(stream.last_seq),
        )?;
        Ok(Page {
            last: events.len() < limit,
            events,
        })
    }
}

impl BackendHandle for MemoryStore {
    const NAME: &'static str = "memory";

    fn store_options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// A memory store is never closed: it lives as long as its handles.
    fn is_closed(&self) -> bool {
        false
    }
}

#[async_trait]
impl EventBackend for MemoryStore {
    async fn append(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId> {
        let id = self.insert(stream_id, event);
        self.inner.wakeups.wake(&id.token);
        Ok(id)
    }

    async fn replay_after(&self, raw: &str, cursor: EventId) -> Result<Replay> {
        let token = cursor.token;
        let incarnation = cursor.position.major;
        // The cursor check and the first page under one lock: most
        // replays are one page, and then need nothing more.
        let (stream_id, after, first) = {
            let state = self.state();
            let stream = state
                .streams
                .get(&cursor.token)
                .ok_or_else(|| Error::unknown_event_id(raw))?;
            let after = dense::check_cursor(raw, &cursor, stream.dense())?;
            let first = self.page_of(stream, raw, token, incarnation, after)?;
            (stream.stream_id.clone(), after, first)
        };
        let store = self.clone();
        let raw = raw.to_owned();
        let start = dense::position(incarnation, after);
        let events = paged_replay_with(start, first, move |after| {
            let page = store.page(&raw, token, incarnation, after.minor);
            async move { page }
        });
        Ok(Replay { stream_id, events })
    }

    async fn replay_whole(&self, stream_id: &str) -> Result<Replay> {
        let token = self.inner.key.token(stream_id);
        let oldest = {
            let state = self.state();
            state.streams.get(&token).and_then(|stream| {
                let first = stream.events.front()?.seq;
                Some((stream.incarnation, first))
            })
        };
        let Some((incarnation, first)) = oldest else {
            return Ok(Replay::empty(stream_id));
        };
        // Read as a replay after the event before the oldest: the same
        // pages and gap checks, so retention overtaking it is refused.
        let raw = EventId::new(token, dense::position(incarnation, first)).to_string();
        let store = self.clone();
        let events = paged_replay(dense::position(incarnation, first - 1), move |after| {
            let page = store.page(&raw, token, incarnation, after.minor);
            async move { page }
        });
        Ok(Replay {
            stream_id: stream_id.to_owned(),
            events,
        })
    }

    async fn follow_after(
        &self,
        raw: &str,
        cursor: EventId,
        options: FollowOptions,
    ) -> Result<Replay> {
        // Subscribe before the first read, so no append falls in between.
        let subscription = self.inner.wakeups.subscribe(cursor.token);
        let first = self.replay_after(raw, cursor).await?;
        Ok(follow::follow(
            Self::NAME,
            first,
            subscription,
            raw.to_owned(),
            RECHECK,
            options,
            follow::reread(self.clone()),
        ))
    }

    fn follows_open(&self) -> usize {
        self.inner.wakeups.followers()
    }

    async fn stream_of(&self, id: EventId) -> Result<Option<String>> {
        let state = self.state();
        Ok(state
            .streams
            .get(&id.token)
            .filter(|stream| stream.dense().retains(id.position))
            .map(|stream| stream.stream_id.clone()))
    }

    async fn remove_stream(&self, stream_id: &str) -> Result<u64> {
        let token = self.inner.key.token(stream_id);
        let removed = self.state().streams.remove(&token);
        Ok(removed.map_or(0, |s| s.events.len() as u64))
    }

    async fn purge(&self) -> Result<PurgeReport> {
        let now = self.now_millis();
        let mut report = PurgeReport::default();
        let mut state = self.state();
        if let Some(cutoff) = self.inner.options.retention.expiry_cutoff_millis(now) {
            state.streams.retain(|_, stream| {
                while stream.events.front().is_some_and(|e| e.stored_at < cutoff) {
                    let dropped = stream.events.pop_front().expect("front exists");
                    stream.bytes -= dropped.data.len() as u64;
                    report.events += 1;
                }
                let keep = !stream.events.is_empty();
                if !keep {
                    report.streams += 1;
                }
                keep
            });
        }
        state.sessions.retain(|_, session| {
            let keep = session.expires_at > now;
            if !keep {
                report.sessions += 1;
            }
            keep
        });
        let held = state.redeemed.len();
        state.redeemed.retain(|_, forget_at| *forget_at > now);
        report.redemptions = (held - state.redeemed.len()) as u64;
        Ok(report)
    }

    async fn inspect_stats(&self) -> Result<StoreStats> {
        let state = self.state();
        let mut stats = StoreStats::default();
        for stream in state.streams.values().filter(|s| !s.events.is_empty()) {
            let info = stream.info();
            stats.streams += 1;
            stats.events += info.events;
            stats.bytes += info.bytes;
            stats.oldest_millis = min_some(stats.oldest_millis, info.oldest_millis);
            stats.newest_millis = stats.newest_millis.max(info.newest_millis);
        }
        Ok(stats)
    }

    async fn inspect_streams(
        &self,
        after: Option<&StreamCursor>,
        limit: usize,
    ) -> Result<StreamPage> {
        let start = match after {
            None => Bound::Unbounded,
            Some(cursor) => {
                Bound::Excluded(StreamToken::parse(cursor.as_str()).ok_or_else(|| {
                    Error::Config(format!("not a stream cursor of this store: {cursor:?}"))
                })?)
            }
        };
        let state = self.state();
        let mut streams = Vec::with_capacity(limit);
        let mut last = None;
        let mut more = false;
        for (token, stream) in state
            .streams
            .range((start, Bound::Unbounded))
            .filter(|(_, s)| !s.events.is_empty())
        {
            if streams.len() == limit {
                more = true;
                break;
            }
            streams.push(stream.info());
            last = Some(*token);
        }
        let next = more
            .then_some(last)
            .flatten()
            .map(|token| StreamCursor::new(token.to_text()));
        Ok(StreamPage::new(streams, next))
    }

    async fn inspect_check(&self) -> Result<HealthReport> {
        Ok(HealthReport::new(
            Self::NAME,
            FORMAT_VERSION,
            vec![
                Setting::warn(
                    "persistence",
                    "none (process memory)",
                    "use sqlite://, postgres://, redis:// or sled:// for events that must survive a restart",
                ),
                Setting::retention(&self.inner.options.retention),
            ],
        ))
    }
}

/// Redemptions (C21) in a map shared by every handle on the data; the
/// purge forgets those past their time.
#[async_trait]
impl RedeemBackend for MemoryStore {
    async fn redeem_once(&self, key: &RedeemKey, forget_at: i64) -> Result<bool> {
        let mut state = self.state();
        match state.redeemed.entry(*key) {
            std::collections::hash_map::Entry::Occupied(_) => Ok(false),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(forget_at);
                Ok(true)
            }
        }
    }
}

#[async_trait]
impl SessionBackend for MemoryStore {
    async fn session_put(
        &self,
        session_id: &str,
        state: &[u8],
        _ttl: Duration,
        expires_at: i64,
    ) -> Result<()> {
        self.state().sessions.insert(
            session_id.to_owned(),
            Session {
                state: Bytes::copy_from_slice(state),
                expires_at,
            },
        );
        Ok(())
    }

    async fn session_get(&self, session_id: &str) -> Result<Option<Bytes>> {
        let now = self.now_millis();
        let state = self.state();
        Ok(state
            .sessions
            .get(session_id)
            .filter(|s| s.expires_at > now)
            .map(|s| s.state.clone()))
    }

    async fn session_delete(&self, session_id: &str) -> Result<bool> {
        let now = self.now_millis();
        let removed = self.state().sessions.remove(session_id);
        Ok(removed.is_some_and(|s| s.expires_at > now))
    }
}

/// Values swapped in place (C22): under the lock, so each swap is one
/// step against every other handle's writes.
#[async_trait]
impl RewriteBackend for MemoryStore {
    fn rewrites_events(&self) -> bool {
        true
    }

    async fn event_swap(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let token = self.inner.key.token(stream_id);
        let mut state = self.state();
        let Some(stream) = state
            .streams
            .get_mut(&token)
            .filter(|stream| id.token == token && stream.incarnation == id.position.major)
        else {
            return Ok(false);
        };
        let entry = stream
            .events
            .iter_mut()
            .find(|entry| entry.seq == id.position.minor);
        Ok(match entry {
            Some(entry) if entry.data[..] == *expected => {
                entry.data = Bytes::copy_from_slice(new);
                true
            }
            _ => false,
        })
    }

    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        let state = self.state();
        let mut sessions: Vec<SessionValue> = state
            .sessions
            .iter()
            .filter_map(|(key, session)| {
                let digest = SessionDigest::from_key(key)?;
                after
                    .is_none_or(|after| digest > *after)
                    .then(|| SessionValue::new(digest, session.state.clone()))
            })
            .collect();
        sessions.sort_unstable_by_key(|session| session.digest);
        sessions.truncate(limit);
        Ok(SessionValuePage::new(sessions, limit))
    }

    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let mut state = self.state();
        Ok(match state.sessions.get_mut(&digest.key()) {
            Some(session) if session.state[..] == *expected => {
                session.state = Bytes::copy_from_slice(new);
                true
            }
            _ => false,
        })
    }

    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        Ok(self.inner.tasks.value_page(after, limit))
    }

    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        Ok(self.inner.tasks.value_swap(digest, field, expected, new))
    }
}

/// The tasks of a [`MemoryStore`]: its [`MemoryTaskStore`], one call each.
#[async_trait]
impl TaskBackend for MemoryStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        self.inner.tasks.task_create(digest, task).await
    }

    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>> {
        self.inner.tasks.task_read(digest, reader).await
    }

    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        self.inner.tasks.task_answer(digest, owner, responses).await
    }

    async fn task_cancel(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        self.inner
            .tasks
            .task_cancel(digest, owner, mode, reason)
            .await
    }

    async fn task_watch(
        &self,
        digest: TaskDigest,
        reader: Reader,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        self.inner
            .tasks
            .task_watch(digest, reader, after, max_wait)
            .await
    }

    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        self.inner.tasks.task_purge().await
    }

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        self.inner.tasks.task_delete(digest).await
    }
}

#[async_trait]
impl RuntimeBackend for MemoryStore {
    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        self.inner.tasks.lease_renew(me, lease).await
    }

    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        self.inner.tasks.lease_alive(id).await
    }

    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        self.inner.tasks.leases().await
    }

    async fn claimed_apply(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        self.inner.tasks.claimed_apply(task, by, change).await
    }

    async fn claimed_view(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        self.inner.tasks.claimed_view(task).await
    }

    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        self.inner.tasks.claim_tasks(by, limit).await
    }

    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        self.inner.tasks.task_requeue(task).await
    }
}
