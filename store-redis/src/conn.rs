//! One connection type for standalone Redis and Redis Cluster, the URL
//! locations that choose between them, the nodes that hold data, and the
//! check of a write's replica acknowledgements (`WAIT`).

use mcp_event_store_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::error::{NAME, backend};

/// Where to connect, as parsed from the URL.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// One server (or a proxy in front of several), by its URL.
    Standalone(String),
    /// Seed nodes of a Redis Cluster, one URL each.
    Cluster(Vec<String>),
}

/// Where a URL's location points (the URL forms are in the
/// [crate docs](crate#connecting)):
///
/// * `redis://[user:pass@]host[:port][/db]`, `rediss://...`, `valkey://...`,
///   `redis+unix:///path`, `unix:///path`: one server;
/// * `redis+cluster://[user:pass@]host:port[,host:port...]` (and
///   `rediss+cluster://`): a Redis Cluster, given one or more seed nodes;
/// * any `redis://` or `rediss://` URL with `cluster` true (hosts may be
///   comma-separated there too): a Redis Cluster.
///
/// `url` is a URL whose scheme [`RedisOptions`](crate::RedisOptions) checked
/// and from which it took this crate's parameters; `cluster` is its
/// `cluster` parameter, if given. The query left (the redis crate's
/// parameters) and the fragment go to every node. Errors never quote the
/// URL, which may hold a password.
pub fn target(url: &str, cluster: Option<bool>) -> Result<Target> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Error::Config("Redis URL has no scheme (expected redis://...)".into()))?;
    let (base_scheme, by_scheme) = match scheme.strip_suffix("+cluster") {
        Some(base) => (base, true),
        None => (scheme, false),
    };
    let cluster = cluster.unwrap_or(by_scheme);
    // A fragment (`#insecure` for TLS) applies to every node.
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, fragment)) => (rest, format!("#{fragment}")),
        None => (rest, String::new()),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) if !query.is_empty() => (before, format!("?{query}")),
        Some((before, _)) => (before, String::new()),
        None => (rest, String::new()),
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

/// `WAIT` arguments for writes that must reach replicas: (replicas, ms).
pub type Wait = Option<(u32, u64)>;

/// The error when `WAIT` saw fewer replicas than asked for.
pub fn check_replicas(acked: u32, replicas: u32, ms: u64, what: &str) -> Result<()> {
    if acked >= replicas {
        return Ok(());
    }
    Err(Error::backend(
        NAME,
        format!(
            "{what} was stored on the Redis primary, but only {acked} of {replicas} replicas \
             acknowledged it within {ms} ms (WAIT): it may not survive a failover"
        ),
    ))
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
