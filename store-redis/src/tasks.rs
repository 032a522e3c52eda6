//! The task store (SEP-2663 durable tasks); see the crate docs, "Tasks".
//!
//! A task is one hash, `<prefix>:t1:{<digest hex>}:task`, with `v` (the
//! task and its inputs in core's [`codec`] encoding, without its context),
//! `rev`, and `c`, its context (T13), when it has one. Every
//! mutation reads the task, lets the state machine every backend shares
//! decide ([`TaskMachine::seen_at`](mcp_event_store_core::backend::task::TaskMachine::seen_at), then [`TaskMachine::answer`](mcp_event_store_core::backend::task::TaskMachine::answer),
//! [`TaskMachine::request_cancel`](mcp_event_store_core::backend::task::TaskMachine::request_cancel) or [`TaskMachine::apply`](mcp_event_store_core::backend::task::TaskMachine::apply)), and writes the
//! new value with one Lua script that does so only if `rev` is still the
//! one read, sets the backstop TTL and `PUBLISH`es the digest on
//! `<prefix>:t1:changes`; a lost race reads again. Watchers wait in the
//! handle's wake-up hub, fed by one subscriber connection per handle.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::backend::follow::{Subscription, Wakeups, task_token, watch_task};
use mcp_event_store_core::backend::task::codec::{self, StoredTask};
use mcp_event_store_core::backend::task::{
    OwnerKey, TaskDigest, TaskMachine, count_ended, stored_instance,
};
use mcp_event_store_core::backend::{Reader, RuntimeBackend, TaskBackend};
use mcp_event_store_core::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Requeue, Rev, TaskOptions,
    TaskPurgeReport, TaskRecord, TaskView, Worker, WorkerChange,
};
use mcp_event_store_core::{Error, Result};
#[cfg(feature = "conformance")]
use redis::Value;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::RedisStore;
use crate::conn;
use crate::error::{NAME, backend};
use crate::keys::{digest_of_hex, hex};
use crate::options::{MAX_PEXPIRE_MS, PURGE_CONCURRENCY, SCAN_BATCH};
use crate::scripts::{Call, SCRIPTS};

/// How much longer than the store's clock says a key must live Redis keeps
/// it, as a real-time backstop: a task key `purge_at + 1 day` (by the time
/// of its last write), an instance key one lease plus the longest a task
/// lives and is kept, plus a day. So Redis deletes by itself only what the
/// purge would have deleted a day earlier, yet nothing grows without bound
/// when nobody purges.
const BACKSTOP: Duration = Duration::from_secs(24 * 60 * 60);
/// First and longest wait before the subscriber connects again.
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

fn corrupt() -> Error {
    Error::Corrupt("a task's hash is malformed".into())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A backstop TTL argument: `ms` (at least 1), or `''` (none) past what
/// `PEXPIRE` takes.
fn backstop_arg(ms: i64) -> String {
    match u64::try_from(ms.max(1)) {
        Ok(ms) if ms <= MAX_PEXPIRE_MS => ms.to_string(),
        _ => String::new(),
    }
}

/// `HMGET task v c s`: the task's value, its context and its swap stamp,
/// if any.
type ValueContextStamp = (Option<Vec<u8>>, Option<Vec<u8>>, Option<String>);

/// How many times a task's values were swapped in place (C22), the hash
/// field `s` (empty: never): the `TASK_WRITE` script writes only over the
/// stamp a step read, so a step that read the task before a swap reads
/// again instead of writing back the bytes the swap replaced.
pub(crate) type Stamp = String;

/// A task's value `v`: core's encoding without the context, which is a
/// field of its own (`c`).
fn encode_value(stored: &StoredTask) -> Vec<u8> {
    if stored.record.context.is_none() {
        return codec::encode(stored);
    }
    let mut bare = stored.clone();
    bare.record.context = None;
    codec::encode(&bare)
}

/// A task key's backstop, written at `now`.
fn task_backstop(record: &TaskRecord, now: i64) -> String {
    backstop_arg(
        record
            .purge_at
            .saturating_sub(now)
            .max(0)
            .saturating_add(millis(BACKSTOP)),
    )
}

/// An instance key's backstop, for a lease: it outlives every task the
/// instance can have run, so a lapsed instance is never forgotten (and
/// revived) by Redis while one of its tasks is still kept.
fn instance_backstop(lease: Duration, options: &TaskOptions) -> String {
    backstop_arg(
        millis(lease)
            .saturating_add(millis(options.max_task_age))
            .saturating_add(millis(options.grace))
            .saturating_add(millis(BACKSTOP)),
    )
}

// ------------------------------------------------------------ wake-ups

/// One handle's task wake-ups: the hub its watchers wait in, and the one
/// subscriber connection (started by the first watch, ended by `close` or
/// the handle's drop) that turns published changes into wake-ups.
pub(crate) struct TaskWakeups {
    shared: Arc<WakeShared>,
}

struct WakeShared {
    hub: Arc<Wakeups>,
    /// Where to subscribe: the server, or each cluster seed in turn
    /// (`PUBLISH` reaches every node of a cluster).
    urls: Vec<String>,
    channel: String,
    connect_timeout: Duration,
    /// Whether the subscriber is subscribed now.
    ready: watch::Sender<bool>,
    state: Mutex<WakeState>,
}

#[derive(Default)]
struct WakeState {
    task: Option<AbortHandle>,
    closed: bool,
}

impl TaskWakeups {
    pub(crate) fn new(urls: Vec<String>, channel: String, connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(WakeShared {
                hub: Arc::new(Wakeups::default()),
                urls,
                channel,
                connect_timeout,
                ready: watch::channel(false).0,
                state: Mutex::new(WakeState::default()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, WakeState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Wakes the watchers of `digest` on this handle.
    pub(crate) fn wake(&self, digest: &TaskDigest) {
        self.shared.hub.wake(&task_token(digest));
    }

    /// Registers a watcher of `digest`, and makes sure the subscriber runs
    /// and is subscribed (waiting at most the connect timeout: if it is
    /// not, the watcher's periodic re-read stands in).
    async fn subscribe(&self, digest: &TaskDigest) -> Subscription {
        let subscription = self.shared.hub.subscribe(task_token(digest));
        {
            let mut state = self.state();
            if !state.closed && state.task.is_none() {
                let shared = self.shared.clone();
                state.task = Some(tokio::spawn(async move { shared.run().await }).abort_handle());
            }
        }
        let mut ready = self.shared.ready.subscribe();
        let subscribed = async move { ready.wait_for(|r| *r).await.map(drop) };
        // Not subscribed in time: the watcher's periodic re-read stands in.
        let _ = tokio::time::timeout(self.shared.connect_timeout, subscribed).await;
        subscription
    }

    /// Stops the subscriber for good and wakes every watcher.
    pub(crate) fn close(&self) {
        let task = {
            let mut state = self.state();
            state.closed = true;
            state.task.take()
        };
        if let Some(task) = task {
            task.abort();
        }
        self.shared.ready.send_replace(false);
        self.shared.hub.wake_all();
    }

    /// Whether the subscriber is running (for tests and the docs' claims).
    #[cfg(test)]
    fn running(&self) -> bool {
        self.state().task.is_some()
    }
}

impl Drop for TaskWakeups {
    fn drop(&mut self) {
        if let Some(task) = self.state().task.take() {
            task.abort();
        }
    }
}

impl WakeShared {
    async fn run(self: Arc<Self>) {
        let mut backoff = RECONNECT_MIN;
        let mut next = 0usize;
        loop {
            let url = &self.urls[next % self.urls.len()];
            next = next.wrapping_add(1);
            let subscribed = async {
                let client = redis::Client::open(url.as_str())?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(&self.channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let mut pubsub = match tokio::time::timeout(self.connect_timeout, subscribed).await {
                Ok(Ok(pubsub)) => pubsub,
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_owned(),
                    };
                    tracing::warn!(%error, "the task subscriber cannot connect; retrying (watchers still re-read periodically)");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                    continue;
                }
            };
            backoff = RECONNECT_MIN;
            self.ready.send_replace(true);
            // Whatever was published while not subscribed is unknown.
            self.hub.wake_all();
            let mut messages = std::pin::pin!(pubsub.on_message());
            while let Some(message) = messages.next().await {
                match digest_of_hex(message.get_payload_bytes()) {
                    Some(digest) => self.hub.wake(&task_token(&digest)),
                    None => self.hub.wake_all(),
                }
            }
            self.ready.send_replace(false);
            tracing::debug!("the task subscriber lost its connection; reconnecting");
            tokio::time::sleep(backoff).await;
        }
    }
}

// ------------------------------------------------------------ reading

/// A task as read: its value and swap stamp, and the task as a read at
/// `now` shows it (`None`: past its purge time) with its instance's
/// deadline.
struct Found {
    stored: StoredTask,
    stamp: Stamp,
    seen: Option<TaskRecord>,
    alive_until: Option<i64>,
}

/// What a step decided: the new value to write (`None`: nothing changes)
/// and the answer.
type Decision<T> = (Option<StoredTask>, T);

fn task_options(store: &RedisStore) -> TaskOptions {
    store.inner.options.store.tasks
}

/// The task's value, with its context (the field `c`), and its swap
/// stamp, read together; or `None`.
async fn load_task(store: &RedisStore, digest: &TaskDigest) -> Result<Option<(StoredTask, Stamp)>> {
    let mut pipe = redis::pipe();
    pipe.cmd("HMGET")
        .arg(store.inner.keys.task(digest))
        .arg(&["v", "c", "s"]);
    let ((value, context, stamp),): (ValueContextStamp,) = store.read(&pipe).await?;
    let Some(value) = value else {
        return Ok(None);
    };
    let mut stored = codec::decode(&value)?;
    if let Some(context) = context {
        stored.record.context = Some(context.into());
    }
    Ok(Some((stored, stamp.unwrap_or_default())))
}

/// Instance `id`'s heartbeat deadline (the orphan check, T11: a second
/// command, in another slot).
async fn alive_until(store: &RedisStore, id: &InstanceId) -> Result<Option<i64>> {
    let mut pipe = redis::pipe();
    pipe.cmd("GET").arg(store.inner.keys.instance(id));
    let (value,): (Option<String>,) = store.read(&pipe).await?;
    value
        .map(|v| v.parse::<i64>().map_err(|_| corrupt()))
        .transpose()
}

/// The task, if `owner` (`None`: anyone) may see it, as read at `now`.
async fn find_task(
    store: &RedisStore,
    digest: &TaskDigest,
    owner: Option<&[u8]>,
    now: i64,
) -> Result<Option<Found>> {
    let Some((stored, stamp)) = load_task(store, digest).await? else {
        return Ok(None);
    };
    if owner.is_some_and(|o| o != stored.owner) {
        return Ok(None);
    }
    let alive_until = alive_until(store, &stored_instance(&stored.instance)?).await?;
    let seen = stored.record.clone().seen_at(now, alive_until);
    Ok(Some(Found {
        stored,
        stamp,
        seen,
        alive_until,
    }))
}

/// The task as `owner` (`None`: anyone) sees it now.
async fn read_task(
    store: &RedisStore,
    digest: &TaskDigest,
    owner: Option<&[u8]>,
) -> Result<Option<TaskRecord>> {
    let now = store.now();
    Ok(find_task(store, digest, owner, now)
        .await?
        .and_then(|found| found.seen))
}

/// A watch of the task as `reader` sees it.
async fn watch_as(
    store: &RedisStore,
    digest: TaskDigest,
    reader: Reader,
    after: Rev,
    max_wait: Duration,
) -> Result<Option<TaskRecord>> {
    let deadline = tokio::time::Instant::now() + max_wait;
    // Registered, and the subscriber subscribed, before the first read.
    let woken = store.inner.tasks.subscribe(&digest).await;
    let recheck = store.inner.options.follow_recheck;
    watch_task(woken, after, deadline, recheck, || {
        let (store, reader) = (store.clone(), reader.clone());
        // `close` wakes every watch, whose read then ends it with `Closed`.
        async move { read_task(&store, &digest, reader.owner().map(Vec::as_slice)).await }
    })
    .await
}

/// One command on the takeover index (`SADD`, `SREM`) for `digest`.
async fn index_takeover(store: &RedisStore, command: &str, digest: &TaskDigest) -> Result<()> {
    let _: i64 = redis::cmd(command)
        .arg(store.inner.keys.takeover_index())
        .arg(hex(digest.as_bytes()))
        .query_async(&mut store.conn())
        .await
        .map_err(backend)?;
    Ok(())
}

/// Claims into `claimed`, for `by` (alive until `mine`), the tasks of
/// the takeover index that wait for a runtime, up to `limit`.
async fn claim_into(
    store: &RedisStore,
    by: InstanceId,
    mine: Option<i64>,
    now: i64,
    limit: usize,
    claimed: &mut Vec<Claimed>,
) -> Result<()> {
    let mut cursor = 0u64;
    loop {
        let mut scan = redis::pipe();
        scan.cmd("SSCAN")
            .arg(store.inner.keys.takeover_index())
            .arg(cursor)
            .arg("COUNT")
            .arg(SCAN_BATCH);
        let ((next, members),): ((u64, Vec<Vec<u8>>),) = store.read(&scan).await?;
        // The batch's tasks are read concurrently (each task and its
        // instance are in slots of their own, so not one pipeline):
        // running tasks, which stay in the set, cost the round trips
        // of one read, not one each.
        let digests: Vec<TaskDigest> = members.iter().filter_map(|m| digest_of_hex(m)).collect();
        let mut found = futures_util::stream::iter(digests)
            .map(|digest| async move {
                let found = find_task(store, &digest, None, now).await?;
                Ok::<_, Error>((digest, found))
            })
            .buffered(PURGE_CONCURRENCY);
        while let Some(next) = found.next().await {
            if claimed.len() >= limit {
                return Ok(());
            }
            let (digest, found) = next?;
            if let Some(claim) = claim_one(store, &digest, found, by, mine, now).await? {
                claimed.push(claim);
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// Drops `digest`, found with no task, from the takeover index. The
/// index entry of a task being created is written before the task
/// (see `task_create`), so the task may have appeared
/// since the read: it is read again after the `SREM`, and put back if
/// it is there. With the creator's own `SADD` after the task, an entry
/// is never lost: whichever of the two `SADD`s follows this `SREM`
/// puts it back.
async fn drop_stale_takeover(store: &RedisStore, digest: &TaskDigest) -> Result<()> {
    index_takeover(store, "SREM", digest).await?;
    if load_task(store, digest).await?.is_some() {
        index_takeover(store, "SADD", digest).await?;
    }
    Ok(())
}

/// Claims the task under `digest` for `by` (alive until `mine`) if it
/// waits for a runtime; a task that never will again leaves the index.
async fn claim_one(
    store: &RedisStore,
    digest: &TaskDigest,
    found: Option<Found>,
    by: InstanceId,
    mine: Option<i64>,
    now: i64,
) -> Result<Option<Claimed>> {
    let Some(found) = found else {
        drop_stale_takeover(store, digest).await?;
        return Ok(None);
    };
    let done = found
        .seen
        .as_ref()
        .is_none_or(|seen| seen.status.is_terminal());
    if done || found.stored.record.takeover.is_none() {
        index_takeover(store, "SREM", digest).await?;
        return Ok(None);
    }
    let Some((new, claim)) = found
        .stored
        .claim_step(*digest, by, found.alive_until, mine, now)?
    else {
        return Ok(None);
    };
    // A lost race (another claim, or any change) leaves it: whoever
    // changed it holds it or changed what a claim would see. (A value
    // swapped in place, C22, changes nothing a claim sees: the task
    // waits for the next claim.)
    match write_task(store, digest, &found.stored, &found.stamp, &new, now).await {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        // The script may have run with its reply lost (a timeout, a
        // dropped connection): a claim nobody is told of would hold
        // the task until this instance lapses. Read back: the claim
        // landed if the task is at its `rev`, under this claim.
        Err(error) => match find_task(store, digest, None, now).await {
            Ok(Some(back))
                if back.stored.record.rev == new.record.rev
                    && back.stored.instance == *by.as_bytes()
                    && back.stored.record.takeover == new.record.takeover => {}
            _ => return Err(error),
        },
    }
    Ok(Some(claim))
}

/// Runs a task script, waiting for replicas as appends do.
pub(crate) async fn task_script(store: &RedisStore, call: Call<'_>, what: &str) -> Result<i64> {
    let (reply, acked) = store.run(&call, true).await?;
    let reply: i64 = redis::from_redis_value(reply).map_err(|e| Error::backend(NAME, e))?;
    if reply == 1 {
        store.check_wait(acked, what)?;
    }
    Ok(reply)
}

/// Writes `new` over the task `read`, if it is still at `read`'s `rev`
/// and swap `stamp`; its context only when it changed.
async fn write_task(
    store: &RedisStore,
    digest: &TaskDigest,
    read: &StoredTask,
    stamp: &str,
    new: &StoredTask,
    now: i64,
) -> Result<bool> {
    let context = new
        .record
        .context
        .as_ref()
        .filter(|c| read.record.context.as_ref() != Some(c));
    let written = task_script(
        store,
        SCRIPTS
            .task_write
            .call()
            .key(store.inner.keys.task(digest))
            .arg(read.record.rev)
            .arg(encode_value(new))
            .arg(new.record.rev)
            .arg(task_backstop(&new.record, now))
            .arg(store.inner.keys.task_channel())
            .arg(hex(digest.as_bytes()))
            .arg(if context.is_some() { "1" } else { "0" })
            .arg(context.map_or(&[][..], |c| &c[..]))
            .arg(stamp),
        "the task change",
    )
    .await?;
    if written == 1 {
        // Published for every handle; this one's watchers need not
        // wait for the message.
        store.inner.tasks.wake(digest);
        let ended = new.record.status.is_terminal() && !read.record.status.is_terminal();
        if ended && new.record.takeover.is_some() {
            // No claim will want it again. An entry left by a failure
            // here is harmless: the next claim that meets it drops it.
            if let Err(error) = index_takeover(store, "SREM", digest).await {
                tracing::debug!(%error, "cannot drop an ended task from the takeover set");
            }
        }
    }
    Ok(written == 1)
}

/// One atomic step on a task: `decide` sees what was read at `now` and
/// names the new value, written only if `rev` did not move meanwhile,
/// else the step runs again. Returns the answer.
async fn task_step<T>(
    store: &RedisStore,
    digest: &TaskDigest,
    owner: Option<&[u8]>,
    now: i64,
    mut decide: impl FnMut(Option<&Found>) -> Result<Decision<T>>,
) -> Result<T> {
    loop {
        let found = find_task(store, digest, owner, now).await?;
        let found = found.filter(|f| f.seen.is_some());
        let (new, answer) = decide(found.as_ref())?;
        let (Some(new), Some(found)) = (new, found) else {
            return Ok(answer);
        };
        if write_task(store, digest, &found.stored, &found.stamp, &new, now).await? {
            return Ok(answer);
        }
    }
}

/// A client's step (`answer`, `request_cancel`): the owner must match,
/// a terminal task is answered as read; returns the task after it.
async fn client_step(
    store: &RedisStore,
    digest: &TaskDigest,
    owner: &[u8],
    now: i64,
    change: impl Fn(&mut StoredTask) -> bool,
) -> Result<Option<TaskRecord>> {
    task_step(store, digest, Some(owner), now, |found| {
        let Some(Found {
            stored,
            seen: Some(seen),
            alive_until,
            ..
        }) = found
        else {
            return Ok((None, None));
        };
        Ok(stored.client_step(seen, now, *alive_until, &change))
    })
    .await
}

// ------------------------------------------------------------ the trait

#[async_trait]
impl TaskBackend for RedisStore {
    async fn task_create(
        &self,
        digest: TaskDigest,
        task: &NewTask<'_>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        // Only under an instance alive at the task's birth (T11). The
        // instance key lives in another slot, so this is a read before the
        // script, judged at the same `now` the task is created at: the
        // deadline read only moves later while the instance lives.
        if alive_until(self, &task.instance)
            .await?
            .is_none_or(|until| until <= now)
        {
            return Err(Error::instance_lapsed(&task.instance));
        }
        if task.takeover.is_some() {
            // The index first: a crash between leaves an entry a claim
            // finds stale, never a task no claim can find.
            index_takeover(self, "SADD", &digest).await?;
        }
        let record = TaskRecord::created(task, now, &task_options(self));
        let stored = StoredTask::new(task.owner, *task.instance.as_bytes(), record.clone());
        let created = task_script(
            self,
            SCRIPTS
                .task_create
                .call()
                .key(self.inner.keys.task(&digest))
                .arg(encode_value(&stored))
                .arg(record.rev)
                .arg(task_backstop(&record, now))
                .arg(if record.context.is_some() { "1" } else { "0" })
                .arg(record.context.as_deref().unwrap_or_default()),
            "the task",
        )
        .await;
        if task.takeover.is_some() && !matches!(created, Ok(0)) {
            // And again after it (also when the reply was lost: the task
            // may be there): a claim that read the index before the task
            // was written may have dropped the entry as stale meanwhile.
            let indexed = index_takeover(self, "SADD", &digest).await;
            let created = created?;
            indexed?;
            return Ok((created == 1).then_some(record));
        }
        Ok((created? == 1).then_some(record))
    }

    async fn task_read(&self, digest: TaskDigest, reader: Reader) -> Result<Option<TaskRecord>> {
        read_task(self, &digest, reader.owner().map(Vec::as_slice)).await
    }

    async fn task_answer(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        responses: &[(&str, &[u8])],
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        client_step(self, &digest, &owner, now, |new| {
            new.record_answers(responses, now)
        })
        .await
    }

    async fn task_cancel(
        &self,
        digest: TaskDigest,
        owner: OwnerKey,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> Result<Option<TaskRecord>> {
        let now = self.now();
        client_step(self, &digest, &owner, now, |new| {
            new.record.request_cancel(mode, reason, now)
        })
        .await
    }

    async fn task_watch(
        &self,
        digest: TaskDigest,
        reader: Reader,
        after: Rev,
        max_wait: Duration,
    ) -> Result<Option<TaskRecord>> {
        watch_as(self, digest, reader, after, max_wait).await
    }

    /// `SCAN`s the task hashes in batches of 500 on every master, ending
    /// (persisting as `failed`) what reads show ended and deleting what is
    /// past its grace, then the instance keys, forgetting lapsed instances;
    /// see the crate docs, "Tasks".
    async fn task_purge(&self) -> Result<TaskPurgeReport> {
        purge_tasks(self, self.now()).await
    }

    async fn task_delete(&self, digest: TaskDigest) -> Result<bool> {
        // Not read first: it may be in the set.
        let deleted = delete_task(self, &digest, None, true).await?;
        Ok(deleted == 1)
    }
}

#[async_trait]
impl RuntimeBackend for RedisStore {
    async fn claimed_apply(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> Result<Applied> {
        let now = self.now();
        let options = task_options(self);
        task_step(self, task, None, now, |found| {
            let Some(Found {
                stored,
                seen: Some(seen),
                alive_until,
                ..
            }) = found
            else {
                return Ok((None, Applied::Unknown));
            };
            stored.worker_step(seen, *alive_until, by, change, &options, now)
        })
        .await
    }

    /// `SSCAN`s the takeover index and claims each task with the same
    /// conditional write as every change; see the crate docs, "Tasks".
    async fn claim_tasks(&self, by: InstanceId, limit: usize) -> Result<Vec<Claimed>> {
        let now = self.now();
        let mine = alive_until(self, &by).await?;
        if mine.is_none_or(|until| until <= now) {
            return Err(Error::instance_lapsed(&by));
        }
        let mut claimed = Vec::new();
        match claim_into(self, by, mine, now, limit, &mut claimed).await {
            Ok(()) => Ok(claimed),
            // The claims made are this instance's now: dropping them would
            // leave their tasks held by a live instance that runs none.
            Err(error) if !claimed.is_empty() => {
                tracing::warn!(
                    %error,
                    claimed = claimed.len(),
                    "a claim failed part way; the tasks claimed so far are returned"
                );
                Ok(claimed)
            }
            Err(error) => Err(error),
        }
    }

    async fn lease_renew(&self, me: InstanceId, lease: Duration) -> Result<bool> {
        let now = self.now();
        let until = now.saturating_add(millis(lease));
        let renewed = task_script(
            self,
            SCRIPTS
                .instance_beat
                .call()
                .key(self.inner.keys.instance(&me))
                .arg(now)
                .arg(until)
                .arg(instance_backstop(lease, &task_options(self))),
            "the heartbeat",
        )
        .await?;
        Ok(renewed == 1)
    }

    async fn lease_alive(&self, id: InstanceId) -> Result<bool> {
        let now = self.now();
        Ok(alive_until(self, &id)
            .await?
            .is_some_and(|until| until > now))
    }

    /// `SCAN`s the instance keys on every master.
    async fn leases(&self) -> Result<Vec<InstanceLease>> {
        let now = self.now();
        let mut leases = Vec::new();
        for batch in scan_all(self, &self.inner.keys.instance_pattern()).await? {
            for key in batch {
                let Some(instance) = self.inner.keys.instance_of(&key) else {
                    continue;
                };
                if let Some(until) = alive_until(self, &instance).await? {
                    leases.push(InstanceLease::new(instance, until, now));
                }
            }
        }
        Ok(leases)
    }

    async fn claimed_view(&self, task: &TaskDigest) -> Result<Option<TaskView>> {
        let now = self.now();
        let Some(found) = find_task(self, task, None, now).await? else {
            return Ok(None);
        };
        found.stored.view(found.alive_until, now)
    }

    /// The index first, as at creation: a refused requeue leaves an entry
    /// the next claim finds stale and drops.
    async fn task_requeue(&self, task: &TaskDigest) -> Result<Requeue> {
        let now = self.now();
        index_takeover(self, "SADD", task).await?;
        task_step(self, task, None, now, |found| {
            Ok(match found {
                Some(Found {
                    stored,
                    seen: Some(seen),
                    ..
                }) => stored.requeue_step(seen, now),
                _ => (None, Requeue::Unknown),
            })
        })
        .await
    }
}

async fn purge_tasks(store: &RedisStore, now: i64) -> Result<TaskPurgeReport> {
    let mut report = TaskPurgeReport::default();
    for batch in scan_all(store, &store.inner.keys.task_pattern()).await? {
        let digests: Vec<TaskDigest> = batch
            .iter()
            .filter_map(|key| store.inner.keys.digest_of_task(key))
            .collect();
        let done: Vec<TaskPurgeReport> = futures_util::stream::iter(digests)
            .map(|digest| async move { purge_task(store, &digest, now).await })
            .buffer_unordered(PURGE_CONCURRENCY)
            .try_collect()
            .await?;
        for one in done {
            report += one;
        }
    }
    for batch in scan_all(store, &store.inner.keys.instance_pattern()).await? {
        for key in batch {
            let forgotten = task_script(
                store,
                SCRIPTS.instance_forget.call().key(key).arg(now),
                "forgetting the instance",
            )
            .await?;
            report.instances += u64::from(forgotten == 1);
        }
    }
    Ok(report)
}

/// Deletes a task (if still at `rev`, when given); 1 deleted, 0 none,
/// -1 its `rev` moved on. `in_takeover_set`: whether its digest may be
/// in the takeover set (then it leaves the set too).
async fn delete_task(
    store: &RedisStore,
    digest: &TaskDigest,
    rev: Option<Rev>,
    in_takeover_set: bool,
) -> Result<i64> {
    let deleted = task_script(
        store,
        SCRIPTS
            .task_delete
            .call()
            .key(store.inner.keys.task(digest))
            .arg(rev.map(|r| r.to_string()).unwrap_or_default())
            .arg(store.inner.keys.task_channel())
            .arg(hex(digest.as_bytes())),
        "the task deletion",
    )
    .await?;
    if deleted == 1 {
        store.inner.tasks.wake(digest);
        if in_takeover_set {
            index_takeover(store, "SREM", digest).await?;
        }
    }
    Ok(deleted)
}

/// Every key matching `pattern` on every master, one `SCAN` batch per
/// item (each at most about [`SCAN_BATCH`] keys), so a purge's work
/// comes in bounded steps.
async fn scan_all(store: &RedisStore, pattern: &str) -> Result<Vec<Vec<Vec<u8>>>> {
    let conn = store.conn();
    let mut batches = Vec::new();
    for node in conn::nodes(&conn).await? {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let (next, found): (u64, Vec<Vec<u8>>) = node.query(&conn, &scan).await?;
            if !found.is_empty() {
                batches.push(found);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(batches)
}

/// Persists what a read of one task shows at `now`, or deletes it past
/// its grace.
async fn purge_task(store: &RedisStore, digest: &TaskDigest, now: i64) -> Result<TaskPurgeReport> {
    let mut report = TaskPurgeReport::default();
    loop {
        let Some(found) = find_task(store, digest, None, now).await? else {
            return Ok(report);
        };
        let rev = found.stored.record.rev;
        let read = found.stored.clone();
        let Some(seen) = found.seen else {
            // An ended task that may be taken over left the set when
            // its end was written; only one that ended unwritten
            // (expired past its grace before any purge) is still in.
            let stored = &found.stored.record;
            let in_set = stored.takeover.is_some() && !stored.status.is_terminal();
            match delete_task(store, digest, Some(rev), in_set).await? {
                -1 => continue,
                deleted => {
                    report.deleted += u64::from(deleted == 1);
                    return Ok(report);
                }
            }
        };
        let Some(new) = found.stored.ended_as_read(&seen) else {
            return Ok(report);
        };
        if write_task(store, digest, &read, &found.stamp, &new, now).await? {
            count_ended(&mut report, &seen);
            return Ok(report);
        }
    }
}

/// Every key under the store's prefix with its value, `key | value`, as an
/// operator's dump would show them: for the conformance suite's raw scan.
#[cfg(feature = "conformance")]
pub(crate) async fn raw_rows(store: &RedisStore) -> Result<Vec<Vec<u8>>> {
    let mut rows = Vec::new();
    let pattern = store.inner.keys.all_pattern();
    for keys in scan_all(store, &pattern).await? {
        for key in keys {
            let mut pipe = redis::pipe();
            pipe.cmd("TYPE").arg(&key);
            let (kind,): (String,) = store.read(&pipe).await?;
            let mut row = key.clone();
            row.extend_from_slice(b" | ");
            let mut pipe = redis::pipe();
            if kind == "set" {
                // The takeover index, in a stable order.
                pipe.cmd("SMEMBERS").arg(&key);
                let (mut members,): (Vec<Vec<u8>>,) = store.read(&pipe).await?;
                members.sort();
                for member in members {
                    row.extend(member);
                    row.push(b' ');
                }
                rows.push(row);
                continue;
            }
            match kind.as_str() {
                "hash" => pipe.cmd("HGETALL").arg(&key),
                "string" => pipe.cmd("GET").arg(&key),
                "stream" => pipe.cmd("XRANGE").arg(&key).arg("-").arg("+"),
                other => {
                    return Err(Error::Corrupt(format!(
                        "an unexpected {other} key under the prefix"
                    )));
                }
            };
            let (value,): (Value,) = store.read(&pipe).await?;
            flatten(value, &mut row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Rewrites the first byte (the format) of every task value under the
/// store's prefix: how the conformance suite ages stored tasks to another
/// release's format.
#[cfg(feature = "conformance")]
pub(crate) async fn set_task_format(store: &RedisStore, version: u8) -> Result<()> {
    let pattern = store.inner.keys.all_pattern();
    for keys in scan_all(store, &pattern).await? {
        for key in keys.into_iter().filter(|key| key.ends_with(b":task")) {
            let mut pipe = redis::pipe();
            pipe.cmd("HGET").arg(&key).arg("v");
            let (value,): (Option<Vec<u8>>,) = store.read(&pipe).await?;
            let Some(mut value) = value.filter(|value| !value.is_empty()) else {
                continue;
            };
            value[0] = version;
            let mut pipe = redis::pipe();
            pipe.cmd("HSET").arg(&key).arg("v").arg(value).ignore();
            store.read::<()>(&pipe).await?;
        }
    }
    Ok(())
}

/// Every byte string in `value`, space-separated.
#[cfg(feature = "conformance")]
fn flatten(value: Value, out: &mut Vec<u8>) {
    match value {
        Value::BulkString(bytes) => {
            out.extend(bytes);
            out.push(b' ');
        }
        Value::SimpleString(s) => {
            out.extend(s.into_bytes());
            out.push(b' ');
        }
        Value::Array(items) | Value::Set(items) => {
            items.into_iter().for_each(|v| flatten(v, out));
        }
        Value::Map(pairs) => pairs.into_iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        other => out.extend(format!("{other:?} ").into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use mcp_event_store_core::task::Owner;

    use super::*;

    #[test]
    fn backstops_outlive_the_store_clock() {
        let record = TaskRecord::created(
            &NewTask::new(&Owner::Anonymous, stored_instance(&[0; 16]).unwrap()),
            1_000,
            &TaskOptions::default(),
        );
        let ttl: i64 = task_backstop(&record, 1_000).parse().unwrap();
        assert_eq!(ttl, record.purge_at - 1_000 + millis(BACKSTOP));
        assert_eq!(backstop_arg(-5), "1");
        assert_eq!(backstop_arg(i64::MAX), "");
        let lease = Duration::from_secs(30);
        let beat: i64 = instance_backstop(lease, &TaskOptions::default())
            .parse()
            .unwrap();
        assert!(beat > millis(lease) + record.purge_at - record.created_at);
    }

    #[test]
    fn a_new_handle_runs_no_subscriber() {
        let wakeups = TaskWakeups::new(vec![], "c".into(), Duration::from_secs(1));
        assert!(!wakeups.running());
    }
}
