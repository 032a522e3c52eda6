//! One connection type for standalone Redis and Redis Cluster, and the URL
//! forms that choose between them.

use std::time::Duration;

use mcp_event_store_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::NAME;

/// Oldest server accepted: exclusive `XRANGE` bounds (`(id`) came in 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// Every URL scheme [`RedisStore::connect`](crate::RedisStore::connect)
/// accepts. The `+cluster` forms open a Redis Cluster; `redis+unix`,
/// `valkey+unix` and `unix` a unix socket; `rediss` and `valkeys` TLS (when
/// the redis crate is built with a TLS feature).
pub const URL_SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "valkey",
    "valkeys",
    "valkey+unix",
    "valkey+cluster",
    "valkeys+cluster",
];

/// Where to connect, as parsed from the URL.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// One server (or a proxy in front of several), by its URL.
    Standalone(String),
    /// Seed nodes of a Redis Cluster, one URL each.
    Cluster(Vec<String>),
}

/// Parses the URL forms this backend accepts:
///
/// * `redis://[user:pass@]host[:port][/db]`, `rediss://...`, `valkey://...`,
///   `redis+unix:///path`, `unix:///path`: one server;
/// * `redis+cluster://[user:pass@]host:port[,host:port...]` (and
///   `rediss+cluster://`): a Redis Cluster, given one or more seed nodes;
/// * any `redis://` or `rediss://` URL with `?cluster=true` (hosts may be
///   comma-separated there too): a Redis Cluster.
///
/// The `cluster` parameter is removed; every other query parameter is passed
/// to the redis crate unchanged. Errors never quote the URL, which may hold a
/// password.
pub fn parse_url(url: &str) -> Result<Target> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Error::Config("Redis URL has no scheme (expected redis://...)".into()))?;
    if !URL_SCHEMES.contains(&scheme) {
        return Err(Error::Config(format!(
            "unsupported Redis URL scheme {scheme:?}; use one of {}",
            URL_SCHEMES.join("://, ") + "://"
        )));
    }
    let (base_scheme, mut cluster) = match scheme.strip_suffix("+cluster") {
        Some(base) => (base, true),
        None => (scheme, false),
    };
    // A fragment (`#insecure` for TLS) applies to every node.
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, fragment)) => (rest, format!("#{fragment}")),
        None => (rest, String::new()),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let mut kept = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("cluster", value) => {
                cluster = match value {
                    "true" | "1" | "yes" | "" => true,
                    "false" | "0" | "no" => false,
                    _ => {
                        return Err(Error::Config(
                            "the Redis URL parameter `cluster` must be true or false".into(),
                        ));
                    }
                };
            }
            _ if pair.is_empty() => {}
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    if !cluster {
        if before_query.contains(',') && !base_scheme.contains("unix") {
            return Err(Error::Config(
                "several hosts in a Redis URL need redis+cluster:// or ?cluster=true".into(),
            ));
        }
        return Ok(Target::Standalone(format!(
            "{base_scheme}://{before_query}{query}{fragment}"
        )));
    }
    if base_scheme.contains("unix") {
        return Err(Error::Config(
            "Redis Cluster over unix sockets is not supported".into(),
        ));
    }
    let (authority, path) = match before_query.find('/') {
        Some(at) => before_query.split_at(at),
        None => (before_query, ""),
    };
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|host| format!("{base_scheme}://{userinfo}{host}{path}{query}{fragment}"))
        .collect();
    if nodes.is_empty() {
        return Err(Error::Config("Redis Cluster URL names no node".into()));
    }
    Ok(Target::Cluster(nodes))
}

/// A connection to either kind of deployment. Cheap to clone: clones share
/// one multiplexed connection (standalone) or one set of node connections
/// (cluster), and both reconnect by themselves after a connection is lost.
#[derive(Clone)]
pub enum Conn {
    /// Standalone server, through a reconnecting multiplexed connection.
    Single(ConnectionManager),
    /// Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// Maps a driver error, keeping it as the source.
pub fn backend(e: redis::RedisError) -> Error {
    Error::backend(NAME, e)
}

/// Opens the connection and checks the server version.
pub async fn open(
    target: &Target,
    response_timeout: Duration,
    connect_timeout: Duration,
) -> Result<Conn> {
    let conn = match target {
        Target::Standalone(url) => {
            let client = redis::Client::open(url.as_str()).map_err(backend)?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(response_timeout))
                .set_connection_timeout(Some(connect_timeout))
                .set_max_delay(Duration::from_secs(2));
            Conn::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(backend)?,
            )
        }
        Target::Cluster(nodes) => {
            let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                .connection_timeout(connect_timeout)
                .response_timeout(response_timeout)
                .build()
                .map_err(backend)?;
            Conn::Cluster(client.get_async_connection().await.map_err(backend)?)
        }
    };
    for node in nodes(&conn).await? {
        let info: String = node.query(&conn, redis::cmd("INFO").arg("server")).await?;
        check_version(&info)?;
    }
    Ok(conn)
}

/// Refuses servers older than [`MIN_REDIS_VERSION`], from `INFO server`.
pub fn check_version(info: &str) -> Result<()> {
    let version = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))
        .ok_or_else(|| Error::Config("the server's INFO has no redis_version".into()))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_REDIS_VERSION {
        return Err(Error::Config(format!(
            "Redis {version} is too old: this store needs Redis {}.{} or newer (exclusive XRANGE ranges)",
            MIN_REDIS_VERSION.0, MIN_REDIS_VERSION.1
        )));
    }
    Ok(())
}

/// One node to send keyless commands (`SCAN`, `INFO`) to: the server itself,
/// or one cluster master, addressed through a slot it owns.
#[derive(Clone, Copy, Debug)]
pub enum Node {
    /// The standalone server.
    Only,
    /// The cluster master currently owning this slot.
    Slot(u16),
}

impl Node {
    /// Sends `cmd` to this node.
    pub async fn query<T: redis::FromRedisValue>(&self, conn: &Conn, cmd: &Cmd) -> Result<T> {
        let mut conn = conn.clone();
        let value = match (self, &mut conn) {
            (Self::Slot(slot), Conn::Cluster(cluster)) => cluster
                .route_command(
                    cmd.clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                        *slot,
                        SlotAddr::Master,
                    ))),
                )
                .await
                .map_err(backend)?,
            (_, conn) => cmd.query_async::<Value>(conn).await.map_err(backend)?,
        };
        redis::from_redis_value(value).map_err(|e| Error::backend(NAME, e))
    }
}

/// The nodes that hold data: the server, or every cluster master (from
/// `CLUSTER SLOTS`, one slot of each).
pub async fn nodes(conn: &Conn) -> Result<Vec<Node>> {
    Ok(masters(conn)
        .await?
        .into_iter()
        .map(|master| master.node)
        .collect())
}

/// A node that holds data, with where it is.
#[derive(Clone, Debug)]
pub struct Master {
    /// How to address it.
    pub node: Node,
    /// `host:port` of a cluster master; `None` for the standalone server.
    pub address: Option<String>,
}

/// The nodes that hold data, with their addresses: the standalone server,
/// or every cluster master (from `CLUSTER SLOTS`, each addressed through the
/// first slot of its first range), in the order of those slots.
pub async fn masters(conn: &Conn) -> Result<Vec<Master>> {
    let Conn::Cluster(_) = conn else {
        return Ok(vec![Master {
            node: Node::Only,
            address: None,
        }]);
    };
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn.clone())
        .await
        .map_err(backend)?;
    let mut masters: Vec<(Vec<u8>, i64, u16)> = Vec::new();
    let Value::Array(ranges) = slots else {
        return Err(Error::Corrupt("unexpected CLUSTER SLOTS reply".into()));
    };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let (Some(Value::Int(start)), Some(Value::Array(master))) = (parts.first(), parts.get(2))
        else {
            continue;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (master.first(), master.get(1))
        else {
            continue;
        };
        let slot = u16::try_from(*start)
            .map_err(|_| Error::Corrupt("slot out of range in CLUSTER SLOTS".into()))?;
        match masters.iter_mut().find(|(h, p, _)| h == host && p == port) {
            Some(known) => known.2 = known.2.min(slot),
            None => masters.push((host.clone(), *port, slot)),
        }
    }
    if masters.is_empty() {
        return Err(Error::Config(
            "the Redis Cluster has no slots assigned".into(),
        ));
    }
    masters.sort_by_key(|(_, _, slot)| *slot);
    Ok(masters
        .into_iter()
        .map(|(host, port, slot)| Master {
            node: Node::Slot(slot),
            address: Some(format!("{}:{port}", String::from_utf8_lossy(&host))),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls_pass_through() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://:secret@host/2",
            "rediss://host:6380",
            "redis+unix:///run/redis.sock",
        ] {
            assert_eq!(parse_url(url).unwrap(), Target::Standalone(url.into()));
        }
        assert_eq!(
            parse_url("redis://h?protocol=resp3&cluster=false").unwrap(),
            Target::Standalone("redis://h?protocol=resp3".into())
        );
    }

    #[test]
    fn cluster_urls_name_every_seed() {
        let want = Target::Cluster(vec!["redis://u:p@a:1/0".into(), "redis://u:p@b:2/0".into()]);
        assert_eq!(parse_url("redis+cluster://u:p@a:1,b:2/0").unwrap(), want);
        assert_eq!(
            parse_url("redis://u:p@a:1,b:2/0?cluster=true").unwrap(),
            want
        );
        assert_eq!(
            parse_url("rediss+cluster://a:1?protocol=resp3").unwrap(),
            Target::Cluster(vec!["rediss://a:1?protocol=resp3".into()])
        );
        assert_eq!(
            parse_url("rediss+cluster://a:1,b:2#insecure").unwrap(),
            Target::Cluster(vec![
                "rediss://a:1#insecure".into(),
                "rediss://b:2#insecure".into()
            ])
        );
    }

    #[test]
    fn every_listed_scheme_parses() {
        for scheme in URL_SCHEMES {
            let url = if scheme.contains("unix") {
                format!("{scheme}:///run/redis.sock")
            } else {
                format!("{scheme}://127.0.0.1:6379")
            };
            let target = parse_url(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                matches!(target, Target::Cluster(_)),
                scheme.ends_with("+cluster"),
                "{url}"
            );
        }
    }

    #[test]
    fn bad_urls_are_config_errors_without_the_password() {
        for url in [
            "127.0.0.1:6379",
            "http://user:hunter2@host",
            "redis://user:hunter2@a,b",
            "redis+cluster://user:hunter2@",
            "redis://h?cluster=maybe",
            "redis+unix:///x?cluster=true",
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{url}: {err}");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn old_servers_are_refused() {
        check_version("# Server\r\nredis_version:7.0.15\r\n").unwrap();
        check_version("redis_version:6.2.0").unwrap();
        let err = check_version("redis_version:6.0.9").unwrap_err();
        assert!(err.to_string().contains("6.2"), "{err}");
        assert!(check_version("nothing").is_err());
    }
}
