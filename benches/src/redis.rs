//! Redis: the data set appended through the store's own script (entry ids
//! are the server's), under a random key prefix; the raw baseline is
//! `XRANGE` on the store's own events key.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use mcp_event_store::{EventId, EventStore, NewEvent, Position};
use mcp_event_store_redis::{RedisOptions, RedisStore};

use crate::{Loaded, RAW_PAGE, RawEvent, StreamPlan, StreamToken, payload, schedule, unbounded};

/// The store (whose prefix holds the data set), the server's URL and the
/// key prefix.
pub struct Storage {
    store: RedisStore,
    url: String,
    prefix: String,
}

/// Appends every event through the store, hundreds in flight at once on the
/// multiplexed connection, in schedule order.
pub async fn load(plan: &[StreamPlan]) -> Loaded<Storage> {
    let url = mcp_event_store_redis::testing::server_url().await;
    let prefix = mcp_event_store_redis::testing::random_prefix();
    let store = RedisStore::connect_with(
        &url,
        RedisOptions::default()
            .key_prefix(prefix.clone())
            .store(unbounded()),
    )
    .await
    .expect("open redis");
    let probe = plan.len() as u32 - 1;
    let data = payload();
    let mut ids: Vec<EventId> = futures_util::stream::iter(schedule(plan))
        .map(|i| {
            let store = &store;
            let data = &data;
            async move {
                let id = store
                    .store_event(&plan[i as usize].stream_id, NewEvent::new(data))
                    .await
                    .expect("append");
                (i == probe).then_some(id)
            }
        })
        .buffer_unordered(256)
        .filter_map(|id| async move { id })
        .collect()
        .await;
    ids.sort_by_key(|id| id.position);
    Loaded {
        store: Arc::new(store.clone()),
        token: ids[0].token,
        positions: ids.iter().map(|id| id.position).collect(),
        storage: Storage { store, url, prefix },
    }
}

/// The raw baseline: `XRANGE key (<id> + COUNT 1000` on the store's own
/// events key, until a short page.
pub struct Raw {
    conn: redis::aio::MultiplexedConnection,
    key: String,
}

/// A connection of its own, reading the probe stream's events key (the
/// store's key layout: `<prefix>:v1:{<token>}:events`).
pub async fn raw(storage: &Storage, token: StreamToken, _probe: &StreamPlan) -> Raw {
    let conn = raw_connection(&storage.url).await;
    let key = format!("{}:v1:{{{}}}:events", storage.prefix, token.to_text());
    Raw { conn, key }
}

/// A raw driver connection to `url`, for the baselines: multiplexed, as
/// the store's own is.
pub async fn raw_connection(url: &str) -> redis::aio::MultiplexedConnection {
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
/// benches start from. Keys the baselines write under the prefix go with
/// the store's `destroy`.
pub async fn store_and_raw() -> (RedisStore, redis::aio::MultiplexedConnection, String) {
    let url = mcp_event_store_redis::testing::server_url().await;
    let prefix = mcp_event_store_redis::testing::random_prefix();
    let store = RedisStore::connect_with(&url, RedisOptions::default().key_prefix(prefix.clone()))
        .await
        .expect("open redis");
    (store, raw_connection(&url).await, prefix)
}

impl Raw {
    /// Every event after `after`, page by page.
    pub async fn read_after(&self, after: Position) -> Vec<RawEvent> {
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

/// Removes every key under the prefix.
pub async fn cleanup(storage: Storage) {
    storage
        .store
        .destroy()
        .await
        .expect("remove the bench key prefix");
}

/// The floor of any script-based append, for `EVALSHA`: a one-line script
/// that only does the `XADD`. KEYS: the stream. ARGV: the payload.
pub const XADD_SCRIPT: &str = "return redis.call('XADD', KEYS[1], '*', 'd', ARGV[1])";

/// The server's own count of calls and microseconds spent in `command`
/// (`xadd`, `evalsha`, ...) so far, from `INFO commandstats`: read before
/// and after a run of one kind of append, the difference is the server's
/// time per append, apart from the network and the client. A script's
/// time includes the commands it runs.
pub async fn command_time(conn: &redis::aio::MultiplexedConnection, command: &str) -> (u64, u64) {
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
