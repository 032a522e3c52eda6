//! This backend's bench baselines and test hooks (feature `bench`):
//! [`RedisKit`], the [`Kit`] the benchmarks (`mcp-event-store-benches`)
//! and the facade's test support reach it through. Each finds its server
//! as the tests do ([`server_url`]) and works under a random key prefix
//! that it removes at the end.
//!
//! * Replay: the data set appended through the store's own script (entry
//!   ids are the server's); the raw baseline is `XRANGE` on the store's own
//!   events key.
//! * Append: raw `XADD`, `EVALSHA` of a script that only does the `XADD`
//!   (the floor of any script-based append), and `XADD MAXLEN` on a stream
//!   at the count limit.
//! * Tasks: one hash per task under the harness's prefix, written by
//!   scripts like the store's; a raw claim (`SPOP`, `HINCRBY`); `PUBLISH`
//!   heard by a `SUBSCRIBE`d connection as the raw wake-up.
//! * Bus: `PUBLISH` heard by a `SUBSCRIBE` connection, and `XADD` heard by
//!   a task blocked in `XREAD BLOCK`.
//! * Redemptions: `SET key v NX PXAT` on a multiplexed connection, under
//!   the harness's prefix with the store's key shape ([`Redeem`]).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use mcp_event_store_conformance::bench::append::{AppendBench, AppendCase, AppendFn, WRITERS};
use mcp_event_store_conformance::bench::bus::{Delivery, DeliveryCases, within_guard};
use mcp_event_store_conformance::bench::redeem::RawRedeem;
use mcp_event_store_conformance::bench::tasks::{
    MAX_WAIT, RESULT, RawClaim, RawWake, TaskOps, TaskRaw, TaskSubject, fresh_key, lifetime,
};
use mcp_event_store_conformance::bench::{
    Kit, Loaded, RAW_PAGE, RawEvent, RawRead, StreamPlan, append_plan, median_us, payload,
    process_cpu_ns, unbounded,
};
use mcp_event_store_core::backend::{RedeemKey, StreamToken};
use mcp_event_store_core::task::InstanceId;
use mcp_event_store_core::{Backend, EventStore, NewEvent, Position, Retention, Store};
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;

use crate::testing::{RedisHarness, random_prefix, server_url};
use crate::{RedisOptions, RedisStore};

/// What the facade's `for_each_backend!` passes on for this backend: its
/// kit, and what its storage allows: `restart` (a new process opens it
/// again) and `shared` (several processes at once, as its harness's
/// `shared_across_processes` says).
#[doc(hidden)]
#[macro_export]
macro_rules! test_kit {
    ($callback:ident!($($args:tt)*)) => {
        $callback!($($args)* kit = $crate::bench::RedisKit, restart = yes, shared = yes);
    };
}

/// The Redis backend's [`Kit`].
pub struct RedisKit;

/// A loaded data set: the store (whose prefix holds it), the server's URL
/// and the key prefix.
pub struct Storage {
    store: RedisStore,
    url: String,
    prefix: String,
}

/// The raw baseline: `XRANGE key (<id> + COUNT 1000` on the store's own
/// events key, until a short page.
pub struct Raw {
    conn: MultiplexedConnection,
    key: String,
}

impl RawRead for Raw {
    /// Every event after `after`, page by page.
    async fn read_after(&self, after: Position) -> Vec<RawEvent> {
        let mut conn = self.conn.clone();
        let mut out = Vec::new();
        let mut after = after;
        loop {
            let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                .arg(&self.key)
                .arg(format!("({}-{}", after.major, after.minor))
                .arg("+")
                .arg("COUNT")
                .arg(RAW_PAGE)
                .query_async(&mut conn)
                .await
                .expect("raw XRANGE");
            let n = entries.len();
            for (id, fields) in entries {
                let (major, minor) = id.split_once('-').expect("a stream entry id");
                after = Position {
                    major: major.parse().expect("ms"),
                    minor: minor.parse().expect("seq"),
                };
                let mut data = Bytes::new();
                let mut retry = None;
                for pair in fields.chunks(2) {
                    match (&pair[0][..], pair.get(1)) {
                        (b"d", Some(v)) => data = Bytes::from(v.clone()),
                        (b"r", Some(v)) => {
                            retry = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok())
                        }
                        _ => {}
                    }
                }
                out.push((after, data, retry));
            }
            if n < RAW_PAGE {
                return out;
            }
        }
    }
}

/// A raw driver connection to `url`, for the baselines: multiplexed, as
/// the store's own is.
pub async fn raw_connection(url: &str) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("raw redis connection")
}

/// A store with default options under a random key prefix on the server
/// the tests use, and a raw connection to the same server: what the append
/// cases start from. Keys the baselines write under the prefix go with the
/// store's `destroy`.
async fn store_and_raw() -> (RedisStore, MultiplexedConnection, String) {
    let url = server_url().await;
    let prefix = random_prefix();
    let store = RedisStore::connect_with(&url, RedisOptions::default().key_prefix(prefix.clone()))
        .await
        .expect("open redis");
    (store, raw_connection(&url).await, prefix)
}

/// The floor of any script-based append, for `EVALSHA`: a one-line script
/// that only does the `XADD`. KEYS: the stream. ARGV: the payload.
const XADD_SCRIPT: &str = "return redis.call('XADD', KEYS[1], '*', 'd', ARGV[1])";

/// The server's own count of calls and microseconds spent in `command`
/// (`xadd`, `evalsha`, ...) so far, from `INFO commandstats`: read before
/// and after a run of one kind of append, the difference is the server's
/// time per append, apart from the network and the client. A script's
/// time includes the commands it runs.
async fn command_time(conn: &MultiplexedConnection, command: &str) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn.clone())
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|line| line.strip_prefix(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .expect("a commandstats field")
    };
    (field("calls"), field("usec"))
}

/// Appends each writer makes to one stream before it moves to a new one,
/// in the store's append cases: half the default count limit, so no stream
/// reaches it.
const STREAM_EVENTS: u64 = 5_000;

/// The store's append, each writer moving to a new stream every
/// [`STREAM_EVENTS`] appends. A Redis stream at its count limit costs the
/// server about four times as much per append (each append then also
/// removes the oldest event), so a run whose stream crosses the limit part
/// way measures a mix that depends on how fast the machine is.
fn store_append_below_limit(store: Arc<dyn Store>) -> AppendFn {
    let data: Arc<[u8]> = payload().into();
    let counts: Arc<Vec<std::sync::atomic::AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| Default::default()).collect());
    Arc::new(move |writer| {
        let (store, data, counts) = (store.clone(), data.clone(), counts.clone());
        Box::pin(async move {
            let n = counts[writer].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let stream = format!("writer-{writer}-{}", n / STREAM_EVENTS);
            store
                .store_event(&stream, NewEvent::new(&data))
                .await
                .expect("append");
        })
    })
}

/// The stream the `store_1_writer_at_cap` case appends to.
const AT_CAP_STREAM: &str = "at-cap";

/// One raw `XADD` of `data` to `key`, with `MAXLEN = maxlen` if given.
async fn xadd(conn: &MultiplexedConnection, key: &str, maxlen: Option<u64>, data: &[u8]) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(key);
    if let Some(maxlen) = maxlen {
        cmd.arg("MAXLEN").arg("=").arg(maxlen);
    }
    let _: String = cmd
        .arg("*")
        .arg("d")
        .arg(data)
        .query_async(&mut conn.clone())
        .await
        .expect("raw XADD");
}

/// `EVALSHA` of [`XADD_SCRIPT`], a script that only does the `XADD`,
/// writer `w` on `keys[w]`: the floor of any script-based append.
fn lua_xadd(conn: &MultiplexedConnection, keys: Arc<Vec<String>>, data: Arc<[u8]>) -> AppendFn {
    let script = Arc::new(redis::Script::new(XADD_SCRIPT));
    let conn = conn.clone();
    Arc::new(move |writer| {
        let (mut conn, keys, data, script) =
            (conn.clone(), keys.clone(), data.clone(), script.clone());
        Box::pin(async move {
            let _: String = script
                .key(&keys[writer])
                .arg(&data[..])
                .invoke_async(&mut conn)
                .await
                .expect("EVALSHA XADD");
        })
    })
}

/// The CPU time the server's main thread has used so far, in
/// microseconds (`used_cpu_user_main_thread` and `used_cpu_sys_main_thread`
/// of `INFO cpu`, Redis 6.2 and newer; 0 where absent). Unlike the
/// commandstats' times, which are wall time in the command, it does not
/// grow while the server waits for a CPU on a busy machine; it covers all
/// the server does, reading requests and writing replies too, and every
/// client's requests (so it tells one kind's cost only on a server nobody
/// else uses).
async fn server_cpu_us(conn: &MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn.clone())
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(
                name,
                "used_cpu_user_main_thread" | "used_cpu_sys_main_thread"
            )
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum::<f64>()
        * 1e6
}

/// What [`one_kind`] measured, per append, in microseconds.
struct KindCost {
    /// This process's CPU (`None` off Linux).
    cpu: Option<f64>,
    /// The server's time in `command` (`INFO commandstats`).
    server: f64,
    /// The server's main thread's CPU (`INFO cpu`).
    server_cpu: f64,
}

/// Makes `rounds` appends of one kind, `append(round)` each, and returns
/// the process's own CPU per append in microseconds (`None` off Linux),
/// the server's time per append in microseconds, from its count for
/// `command` (the one each append calls) in `INFO commandstats`, and the
/// server's CPU per append ([`server_cpu_us`]).
async fn one_kind(
    conn: &MultiplexedConnection,
    command: &str,
    rounds: usize,
    mut append: impl AsyncFnMut(usize),
) -> KindCost {
    let server_before = command_time(conn, command).await;
    let server_cpu_before = server_cpu_us(conn).await;
    let cpu_before = process_cpu_ns();
    for round in 0..rounds {
        append(round).await;
    }
    let cpu = process_cpu_ns()
        .zip(cpu_before)
        .map(|(after, before)| (after - before) as f64 / rounds as f64 / 1e3);
    let server_cpu_after = server_cpu_us(conn).await;
    let server_after = command_time(conn, command).await;
    let calls = (server_after.0 - server_before.0).max(1);
    KindCost {
        cpu,
        server: (server_after.1 - server_before.1) as f64 / calls as f64,
        server_cpu: (server_cpu_after - server_cpu_before) / rounds as f64,
    }
}

/// Appends each writer makes per block of [`many_writer_pairs`].
const BLOCK_PER_WRITER: usize = 10;

/// [`WRITERS`] writers at once, each on a key (or stream) of its own,
/// making [`BLOCK_PER_WRITER`] appends each per block: raw `XADD`, the
/// `XADD`-only script and the store below the count limit, one block of
/// each kind after the other, `rounds / 100` blocks (at least 10) of each,
/// so every kind sees the same machine, as the one-writer rounds do.
/// Prints each kind's median appends per second over its blocks, the
/// ratios, and the server's time per append of each kind (`INFO
/// commandstats`, read around each block, outside its timing).
async fn many_writer_pairs(
    store: &RedisStore,
    conn: &MultiplexedConnection,
    prefix: &str,
    rounds: usize,
) {
    let data: Arc<[u8]> = payload().into();
    let keys: Arc<Vec<String>> = Arc::new(
        (0..WRITERS)
            .map(|w| format!("{prefix}:raw:many:{w}"))
            .collect(),
    );
    let (raw_conn, raw_keys, raw_data) = (conn.clone(), keys.clone(), data.clone());
    let raw: AppendFn = Arc::new(move |writer| {
        let (conn, keys, data) = (raw_conn.clone(), raw_keys.clone(), raw_data.clone());
        Box::pin(async move { xadd(&conn, &keys[writer], None, &data).await })
    });
    let script_keys: Arc<Vec<String>> = Arc::new(
        (0..WRITERS)
            .map(|w| format!("{prefix}:raw:many-script:{w}"))
            .collect(),
    );
    let lua = lua_xadd(conn, script_keys, data.clone());
    let appends = store_append_below_limit(Arc::new(store.clone()));
    let kinds: [(&AppendFn, &str); 3] = [(&raw, "xadd"), (&lua, "evalsha"), (&appends, "evalsha")];
    let blocks = (rounds / 100).max(10);
    let per_block = (WRITERS * BLOCK_PER_WRITER) as f64;
    let mut rates: Vec<Vec<f64>> = (0..3).map(|_| Vec::with_capacity(blocks)).collect();
    let mut server = [(0u64, 0u64); 3];
    let mut server_cpu = [0f64; 3];
    let mut client_cpu = [0f64; 3];
    for _ in 0..blocks {
        for (kind, (append, command)) in kinds.iter().enumerate() {
            let before = command_time(conn, command).await;
            let cpu_before = server_cpu_us(conn).await;
            let client_before = process_cpu_ns();
            let start = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for writer in 0..WRITERS {
                let append = (*append).clone();
                tasks.spawn(async move {
                    for _ in 0..BLOCK_PER_WRITER {
                        append(writer).await;
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("writer task");
            }
            rates[kind].push(per_block / start.elapsed().as_secs_f64());
            if let (Some(after), Some(before)) = (process_cpu_ns(), client_before) {
                client_cpu[kind] += (after - before) as f64 / 1e3;
            }
            server_cpu[kind] += server_cpu_us(conn).await - cpu_before;
            let after = command_time(conn, command).await;
            server[kind].0 += after.0 - before.0;
            server[kind].1 += after.1 - before.1;
        }
    }
    let [raw, floor, below] = [0, 1, 2].map(|i| {
        rates[i].sort_by(f64::total_cmp);
        rates[i][rates[i].len() / 2]
    });
    let [raw_server, floor_server, store_server] =
        server.map(|(calls, usec)| usec as f64 / calls.max(1) as f64);
    let [raw_cpu, floor_cpu, store_cpu] = server_cpu.map(|us| us / (blocks as f64 * per_block));
    let [raw_client, floor_client, store_client] =
        client_cpu.map(|us| us / (blocks as f64 * per_block));
    println!(
        "{WRITERS} writers, {blocks} blocks of {per_block} appends of each kind, medians: raw XADD \
         {raw:.0}/s; XADD-only script {floor:.0}/s ({:.2}x of raw); store below the limit \
         {below:.0}/s ({:.2}x of raw, {:.2}x of the XADD-only script); the server's time per \
         append: raw XADD {raw_server:.1} us; XADD-only script {floor_server:.1} us; store \
         {store_server:.1} us; its CPU per append (INFO cpu): raw XADD {raw_cpu:.1} us; \
         XADD-only script {floor_cpu:.1} us; store {store_cpu:.1} us; this process's CPU per \
         append: raw XADD {raw_client:.1} us; XADD-only script {floor_client:.1} us; store \
         {store_client:.1} us",
        floor / raw,
        below / raw,
        below / floor,
    );
}

/// Creates a task hash if absent, as the store's script does.
const RAW_CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'rev', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#;

/// Writes a task hash if its `rev` is still the one read, and publishes
/// the change, as the store's script does.
const RAW_WRITE: &str = r#"
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'rev', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"#;

/// The [`Claim`] script. KEYS: the takeover set. ARGV: the prefix.
const RAW_CLAIM: &str = r#"
local d = redis.call('SPOP', KEYS[1])
if not d then return 0 end
redis.call('HINCRBY', ARGV[1] .. ':t1:{' .. d .. '}:task', 'rev', 1)
return 1
"#;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The backstop TTL the store gives a fresh task: past its purge, plus a
/// day.
fn backstop_ms() -> i64 {
    let (_, purge_at) = lifetime(0);
    purge_at + 24 * 3_600_000
}

/// Raw tasks: one hash per task under the harness's prefix (so its
/// teardown removes them), written by scripts like the store's.
pub struct Tasks {
    conn: MultiplexedConnection,
    prefix: String,
    /// A value of the store's encoded size.
    value: Vec<u8>,
    create: redis::Script,
    write: redis::Script,
    channel: String,
}

impl TaskOps for Tasks {
    type Key = ([u8; 16], String);

    async fn create(&self) -> Self::Key {
        let digest = fresh_key();
        let key = format!("{}:raw:{{{}}}:task", self.prefix, hex(&digest));
        let created: i64 = self
            .create
            .key(&key)
            .arg(&self.value[..])
            .arg(1)
            .arg(backstop_ms())
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("raw create");
        assert_eq!(created, 1, "a key drawn twice");
        (digest, key)
    }

    async fn get(&self, (_, key): &Self::Key) {
        let value: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(key)
            .arg("v")
            .query_async(&mut self.conn.clone())
            .await
            .expect("raw get");
        black_box(value.expect("the task is there"));
    }

    async fn finish(&self, (digest, key): &Self::Key) {
        let (value, rev): (Option<Vec<u8>>, Option<u64>) = redis::cmd("HMGET")
            .arg(key)
            .arg("v")
            .arg("rev")
            .query_async(&mut self.conn.clone())
            .await
            .expect("raw read");
        let (mut value, rev) = (
            value.expect("the task is there"),
            rev.expect("the task's rev"),
        );
        value.extend_from_slice(RESULT);
        let written: i64 = self
            .write
            .key(key)
            .arg(rev)
            .arg(value)
            .arg(rev + 1)
            .arg(backstop_ms())
            .arg(&self.channel)
            .arg(hex(digest))
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("raw write");
        assert_eq!(written, 1, "the task changed under the compare-and-set");
    }
}

/// The raw claim: one script, `SPOP` of the store's takeover set and
/// `HINCRBY rev` of the task (a set used as a queue; standalone Redis
/// only).
pub struct Claim {
    conn: MultiplexedConnection,
    index: String,
    prefix: String,
    script: redis::Script,
}

impl RawClaim for Claim {
    async fn claim(&self, _: InstanceId) {
        let n: i64 = self
            .script
            .key(&self.index)
            .arg(&self.prefix)
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("raw claim");
        assert!(n == 1, "a queued task waits");
    }
}

/// The raw wake-up: a `PUBLISH` on a multiplexed connection until a
/// subscriber connection has it.
pub struct Wake {
    conn: MultiplexedConnection,
    messages: std::pin::Pin<Box<redis::aio::PubSubStream>>,
    channel: String,
}

impl RawWake for Wake {
    async fn round_trip(&mut self, n: u64) -> Duration {
        let payload = n.to_string();
        let start = Instant::now();
        let _: i64 = redis::cmd("PUBLISH")
            .arg(self.channel.as_str())
            .arg(payload.as_str())
            .query_async(&mut self.conn)
            .await
            .expect("raw publish");
        loop {
            let message = tokio::time::timeout(MAX_WAIT, self.messages.next())
                .await
                .expect("the message within 30 s")
                .expect("the subscriber goes on");
            if message.get_payload_bytes() == payload.as_bytes() {
                return start.elapsed();
            }
        }
    }
}

/// Redis's own pub/sub: `PUBLISH`, heard by a `SUBSCRIBE` connection.
struct Publish {
    conn: MultiplexedConnection,
    messages: futures_util::stream::BoxStream<'static, redis::Msg>,
    channel: String,
    data: Vec<u8>,
}

impl Publish {
    async fn new() -> Self {
        let url = server_url().await;
        let channel = format!("{}bus", random_prefix());
        let mut pubsub = redis::Client::open(url.as_str())
            .expect("redis url")
            .get_async_pubsub()
            .await
            .expect("a subscribing connection");
        pubsub.subscribe(&channel).await.expect("SUBSCRIBE");
        Self {
            conn: raw_connection(&url).await,
            messages: pubsub.into_on_message().boxed(),
            channel,
            data: payload(),
        }
    }
}

impl Delivery for Publish {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(&self.data)
            .query_async(&mut self.conn)
            .await
            .expect("PUBLISH");
        let message = within_guard(self.messages.next()).await;
        let took = called.elapsed();
        assert_eq!(message.get_payload_bytes(), self.data);
        took
    }
}

/// Redis Streams by hand: `XADD`, heard by a task blocked in `XREAD BLOCK`
/// on a connection of its own (what a store's follow does, without the
/// store).
struct Xadd {
    conn: MultiplexedConnection,
    key: String,
    heard: mpsc::UnboundedReceiver<String>,
    reader: tokio::task::JoinHandle<()>,
    data: Vec<u8>,
}

impl Xadd {
    async fn new() -> Self {
        let url = server_url().await;
        let key = format!("{}bus", random_prefix());
        let mut blocked = raw_connection(&url).await;
        let (tell, heard) = mpsc::unbounded_channel();
        let read_key = key.clone();
        let reader = tokio::spawn(async move {
            let mut last = "$".to_owned();
            loop {
                // Blocks a second at most: under the connection's response
                // timeout.
                // Nil when the block ran out; else per key its entries, each
                // an id and its fields.
                type Read = Option<Vec<(String, Vec<(String, Vec<Vec<u8>>)>)>>;
                let read: Read = redis::cmd("XREAD")
                    .arg("BLOCK")
                    .arg(1_000)
                    .arg("STREAMS")
                    .arg(&read_key)
                    .arg(&last)
                    .query_async(&mut blocked)
                    .await
                    .expect("XREAD");
                let entries = read.into_iter().flatten().flat_map(|(_, entries)| entries);
                for (id, _) in entries {
                    last = id.clone();
                    if tell.send(id).is_err() {
                        return;
                    }
                }
            }
        });
        Self {
            conn: raw_connection(&url).await,
            key,
            heard,
            reader,
            data: payload(),
        }
    }
}

impl Delivery for Xadd {
    async fn one(&mut self) -> Duration {
        let called = Instant::now();
        let id: String = redis::cmd("XADD")
            .arg(&self.key)
            .arg("*")
            .arg("d")
            .arg(&self.data)
            .query_async(&mut self.conn)
            .await
            .expect("XADD");
        let heard = within_guard(self.heard.recv()).await;
        let took = called.elapsed();
        assert_eq!(heard, id, "the reader got another entry");
        took
    }
}

impl Drop for Xadd {
    fn drop(&mut self) {
        self.reader.abort();
        let (mut conn, key) = (self.conn.clone(), self.key.clone());
        tokio::spawn(async move {
            let _: redis::RedisResult<i64> =
                redis::cmd("DEL").arg(key).query_async(&mut conn).await;
        });
    }
}

/// The raw redemption: one `SET <prefix>:raw:{<digest>} <forget_at> NX
/// PXAT <forget_at>` on a multiplexed connection of its own.
pub struct Redeem {
    conn: MultiplexedConnection,
    prefix: String,
}

impl RawRedeem for Redeem {
    async fn redeem(&self, key: &RedeemKey, forget_at: i64) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(format!("{}:raw:{{{}}}", self.prefix, key.to_hex()))
            .arg(forget_at)
            .arg("NX")
            .arg("PXAT")
            .arg(forget_at)
            .query_async(&mut self.conn.clone())
            .await
            .expect("raw redeem");
        set.is_some()
    }
}

impl Kit for RedisKit {
    const BACKEND: &'static Backend = &crate::BACKEND;

    type Harness = RedisHarness;
    type TaskHarness = RedisHarness;

    async fn harness() -> RedisHarness {
        RedisHarness::new().await
    }

    type RawRedeem = Redeem;

    async fn raw_redeem(harness: &RedisHarness) -> Redeem {
        let conn = redis::Client::open(harness.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("raw redis connection");
        Redeem {
            conn,
            prefix: harness.prefix().to_owned(),
        }
    }

    async fn task_harness() -> RedisHarness {
        RedisHarness::new().await
    }

    type Storage = Storage;
    type Raw = Raw;

    /// Appends every event through the store, hundreds in flight at once
    /// on the multiplexed connection, in schedule order.
    async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
        let url = server_url().await;
        let prefix = random_prefix();
        let store = RedisStore::connect_with(
            &url,
            RedisOptions::default()
                .key_prefix(prefix.clone())
                .store(unbounded()),
        )
        .await
        .expect("open redis");
        let ids = append_plan(&store, plan, 256).await;
        Loaded {
            store: Arc::new(store.clone()),
            token: ids[0].token,
            positions: ids.iter().map(|id| id.position).collect(),
            storage: Storage { store, url, prefix },
        }
    }

    /// A connection of its own, reading the probe stream's events key (the
    /// store's key layout: `<prefix>:v1:{<token>}:events`).
    async fn raw(storage: &Storage, token: StreamToken, _: &StreamPlan) -> Raw {
        let conn = raw_connection(&storage.url).await;
        let key = format!("{}:v1:{{{}}}:events", storage.prefix, token.to_text());
        Raw { conn, key }
    }

    /// Removes every key under the prefix.
    async fn cleanup(storage: Storage) {
        storage
            .store
            .destroy()
            .await
            .expect("remove the bench key prefix");
    }

    /// The store (each writer moving to a new stream every 5,000 appends,
    /// and on a stream at the count limit) beside raw `XADD`, `EVALSHA` of
    /// an `XADD`-only script, and `XADD MAXLEN` at the limit.
    async fn append() -> AppendBench {
        let (store, conn, prefix) = store_and_raw().await;
        // Under the store's prefix, so `destroy` removes them too.
        let keys: Arc<Vec<String>> =
            Arc::new((0..WRITERS).map(|w| format!("{prefix}:raw:{w}")).collect());
        let data: Arc<[u8]> = payload().into();
        let (raw_conn, raw_keys, raw_data) = (conn.clone(), keys.clone(), data.clone());
        let raw: AppendFn = Arc::new(move |writer| {
            let (mut conn, keys, data) = (raw_conn.clone(), raw_keys.clone(), raw_data.clone());
            Box::pin(async move {
                let _: String = redis::cmd("XADD")
                    .arg(&keys[writer])
                    .arg("*")
                    .arg("d")
                    .arg(&data[..])
                    .query_async(&mut conn)
                    .await
                    .expect("raw XADD");
            })
        });
        // The floor of any script-based append: `EVALSHA` of a one-line
        // script that only does the `XADD`.
        let lua = lua_xadd(&conn, keys.clone(), data.clone());
        // Both streams of the `_at_cap` cases start at the count limit.
        let limit = Retention::default()
            .max_events_per_stream
            .expect("a default count limit");
        for _ in 0..limit {
            store
                .store_event(AT_CAP_STREAM, NewEvent::new(&data))
                .await
                .expect("fill the stream at the limit");
        }
        let maxlen_key = Arc::new(format!("{prefix}:raw:maxlen"));
        for _ in 0..limit / 1_000 {
            let mut fill = redis::pipe();
            for _ in 0..1_000 {
                fill.cmd("XADD")
                    .arg(maxlen_key.as_str())
                    .arg("*")
                    .arg("d")
                    .arg(&data[..])
                    .ignore();
            }
            let () = fill
                .query_async(&mut conn.clone())
                .await
                .expect("fill the raw stream");
        }
        let (maxlen_conn, maxlen_data) = (conn.clone(), data.clone());
        let raw_maxlen: AppendFn = Arc::new(move |_| {
            let (mut conn, key, data) =
                (maxlen_conn.clone(), maxlen_key.clone(), maxlen_data.clone());
            Box::pin(async move {
                let _: String = redis::cmd("XADD")
                    .arg(key.as_str())
                    .arg("MAXLEN")
                    .arg("=")
                    .arg(limit)
                    .arg("*")
                    .arg("d")
                    .arg(&data[..])
                    .query_async(&mut conn)
                    .await
                    .expect("raw XADD MAXLEN");
            })
        });
        let appends = store_append_below_limit(Arc::new(store.clone()));
        let at_cap: AppendFn = {
            let (store, data): (Arc<dyn Store>, Arc<[u8]>) =
                (Arc::new(store.clone()), payload().into());
            Arc::new(move |_| {
                let (store, data) = (store.clone(), data.clone());
                Box::pin(async move {
                    store
                        .store_event(AT_CAP_STREAM, NewEvent::new(&data))
                        .await
                        .expect("append at the limit");
                })
            })
        };
        AppendBench::new(
            vec![
                AppendCase::one("store_1_writer", &appends),
                AppendCase::one("raw_1_writer", &raw),
                AppendCase::one("raw_lua_xadd_1_writer", &lua),
                AppendCase::one("store_1_writer_at_cap", &at_cap),
                AppendCase::one("raw_maxlen_1_writer", &raw_maxlen),
                AppendCase::many("store_32_writers", &appends),
                AppendCase::many("raw_32_writers", &raw),
                AppendCase::many("raw_lua_xadd_32_writers", &lua),
            ],
            async move {
                store.destroy().await.expect("remove the bench key prefix");
            },
        )
    }

    /// The store's append beside raw `XADD`, timed in interleaved rounds:
    /// each round makes one append of each kind, one after the other, so
    /// every kind sees the same machine. A lone append on Redis is a round
    /// trip of a few tens of microseconds, and how long a parked thread
    /// takes to wake moves it by as much again as the machine's load
    /// changes; the criterion cases (`append/redis/*_1_writer`), run one
    /// after another, each see whatever state the machine was in during
    /// theirs.
    ///
    /// Prints the median of each kind and four ratios: the store, on
    /// streams below the count limit, against raw `XADD` and against
    /// `EVALSHA` of a script that only does the `XADD` (the floor of any
    /// script-based append); that script against raw `XADD`; and the store
    /// on a stream at the default count limit (10,000), where each append
    /// also removes the oldest event, against raw `XADD MAXLEN = 10000` on
    /// a stream at that length. Each round also sends the store's own
    /// append script by hand, its call built before the clock starts, on
    /// the raw connection, which splits the store's append into what the
    /// server and the round trip cost and what the store's client path
    /// adds. Then raw `XADD`, the `XADD`-only script and
    /// the store below the limit from [`WRITERS`] writers at once, block by
    /// block (see `many_writer_pairs`). Then, over one run of each of
    /// those three kinds from one writer, the process's own CPU per append
    /// (user and system time, from `/proc/self/stat`; Linux only), what the
    /// client side costs, the server's own time per append (`INFO
    /// commandstats`, read before and after the run), what the server side
    /// costs, and the server's CPU per append (`server_cpu_us`: meaningful
    /// on a server nobody else uses, `MCP_EVENT_STORE_REDIS_URL`).
    async fn append_pairs(rounds: usize) -> bool {
        let (store, conn, prefix) = store_and_raw().await;
        let data = payload();
        let (raw_key, maxlen_key) = (format!("{prefix}:raw"), format!("{prefix}:raw:maxlen"));
        let limit = Retention::default()
            .max_events_per_stream
            .expect("a default count limit");
        for _ in 0..limit {
            store
                .store_event("at-limit", NewEvent::new(&data))
                .await
                .expect("fill the stream at the limit");
            xadd(&conn, &maxlen_key, None, &data).await;
        }
        let script = redis::Script::new(XADD_SCRIPT);
        let script_key = format!("{prefix}:raw:script");
        let xadd_script = || async {
            let _: String = script
                .key(&script_key)
                .arg(&data[..])
                .invoke_async(&mut conn.clone())
                .await
                .expect("EVALSHA XADD");
        };
        let below_limit = STREAM_EVENTS as usize;
        // The store's own script on a stream of its own, its call built
        // (token, keys, arguments) before the clock starts and sent on the
        // raw connection: the server's side of a store append and the
        // round trip, without the store's client path.
        let by_hand = async |round: usize| -> Duration {
            let stream = format!("by-hand-{}", round / below_limit);
            if round.is_multiple_of(below_limit) {
                // Created (and its secret checked) by the store.
                store
                    .store_event(&stream, NewEvent::new(&data))
                    .await
                    .expect("create the stream");
            }
            let keys = store.inner.keys.stream(&store.key().token(&stream));
            let cmd =
                crate::append::append_call(&store, &stream, NewEvent::new(&data), &keys).cmd(false);
            let start = Instant::now();
            let id: redis::Value = cmd
                .query_async(&mut conn.clone())
                .await
                .expect("the append script by hand");
            let elapsed = start.elapsed();
            assert!(
                matches!(id, redis::Value::BulkString(_)),
                "an entry id: {id:?}"
            );
            elapsed
        };
        let mut times: Vec<Vec<Duration>> = (0..6).map(|_| Vec::with_capacity(rounds)).collect();
        for round in 0..rounds {
            let start = Instant::now();
            xadd(&conn, &raw_key, None, &data).await;
            times[0].push(start.elapsed());
            let start = Instant::now();
            xadd_script().await;
            times[4].push(start.elapsed());
            let stream = format!("below-limit-{}", round / below_limit);
            let start = Instant::now();
            store
                .store_event(&stream, NewEvent::new(&data))
                .await
                .expect("append");
            times[1].push(start.elapsed());
            let start = Instant::now();
            store
                .store_event("at-limit", NewEvent::new(&data))
                .await
                .expect("append at the limit");
            times[2].push(start.elapsed());
            let start = Instant::now();
            xadd(&conn, &maxlen_key, Some(limit), &data).await;
            times[3].push(start.elapsed());
            times[5].push(by_hand(round).await);
        }
        let [raw, below, at_limit, raw_maxlen, floor, hand] =
            [0, 1, 2, 3, 4, 5].map(|i| median_us(&mut times[i]));
        println!(
            "{rounds} rounds, medians: raw XADD {raw:.1} us; store below the limit {below:.1} us \
             ({:.2}x of raw, {:.2}x of the XADD-only script); XADD-only script {floor:.1} us \
             ({:.2}x of raw); store at the limit {at_limit:.1} us; raw XADD MAXLEN at the limit \
             {raw_maxlen:.1} us ({:.2}x)",
            raw / below,
            floor / below,
            raw / floor,
            raw_maxlen / at_limit
        );
        println!(
            "the store's append script sent by hand (its call built beforehand, on the raw \
             connection): {hand:.1} us ({:.2}x of the XADD-only script); the store's client path \
             adds {:.1} us to it",
            floor / hand,
            below - hand
        );
        many_writer_pairs(&store, &conn, &prefix, rounds).await;
        // Then one kind at a time, each run read twice: the process's own
        // CPU per append (the client side) and the server's own time per
        // append (apart from the network and the client).
        let raw = one_kind(&conn, "xadd", rounds, async |_| {
            xadd(&conn, &raw_key, None, &data).await;
        })
        .await;
        let floor = one_kind(&conn, "evalsha", rounds, async |_| xadd_script().await).await;
        let below = one_kind(&conn, "evalsha", rounds, async |round| {
            let stream = format!("one-kind-{}", round / below_limit);
            store
                .store_event(&stream, NewEvent::new(&data))
                .await
                .expect("append");
        })
        .await;
        if let (Some(raw_cpu), Some(floor_cpu), Some(store_cpu)) = (raw.cpu, floor.cpu, below.cpu) {
            println!(
                "this process's CPU per append: raw XADD {raw_cpu:.1} us; XADD-only script \
                 {floor_cpu:.1} us; store below the limit {store_cpu:.1} us"
            );
        }
        println!(
            "the server's time per append: raw XADD {:.1} us; XADD-only script {:.1} us; store \
             below the limit {:.1} us",
            raw.server, floor.server, below.server
        );
        println!(
            "the server's CPU per append (INFO cpu, every client's): raw XADD {:.1} us; XADD-only \
             script {:.1} us; store below the limit {:.1} us",
            raw.server_cpu, floor.server_cpu, below.server_cpu
        );
        store.destroy().await.expect("remove the key prefix");
        true
    }

    type TaskOps = Tasks;
    type Claim = Claim;
    type Wake = Wake;

    /// A multiplexed connection and a subscriber on the harness's server,
    /// under its prefix.
    async fn task_raw(
        harness: &RedisHarness,
        subject: &TaskSubject,
    ) -> TaskRaw<Tasks, Claim, Wake> {
        let client = redis::Client::open(harness.url()).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("raw redis connection");
        let channel = format!("{}:raw:changes", harness.prefix());
        let mut pubsub = client.get_async_pubsub().await.expect("raw subscriber");
        pubsub.subscribe(&channel).await.expect("SUBSCRIBE");
        TaskRaw {
            ops: Tasks {
                conn: conn.clone(),
                prefix: harness.prefix().to_owned(),
                value: vec![0; subject.value_len()],
                create: redis::Script::new(RAW_CREATE),
                write: redis::Script::new(RAW_WRITE),
                channel: channel.clone(),
            },
            finishes: Vec::new(),
            claim: Some(Claim {
                conn: conn.clone(),
                index: format!("{}:t1:takeover", harness.prefix()),
                prefix: harness.prefix().to_owned(),
                script: redis::Script::new(RAW_CLAIM),
            }),
            wake: Some(Wake {
                conn,
                messages: Box::pin(pubsub.into_on_message()),
                channel,
            }),
            settle: Duration::from_millis(2),
        }
    }

    /// `publish`: `PUBLISH`, heard by a `SUBSCRIBE` connection; `xadd`:
    /// `XADD`, heard by a task blocked in `XREAD BLOCK` on another
    /// connection.
    fn bus(rt: &tokio::runtime::Runtime, cases: &mut impl DeliveryCases) {
        let mut publish = rt.block_on(Publish::new());
        cases.case("publish", &mut publish);
        // What the connections spawn as they close needs the runtime.
        rt.block_on(async { drop(publish) });
        let mut xadd = rt.block_on(Xadd::new());
        cases.case("xadd", &mut xadd);
        rt.block_on(async { drop(xadd) });
    }
}
