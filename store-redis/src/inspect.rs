//! C15 Inspect: store statistics, stream listings and the health check.
//!
//! Redis keeps no store-wide totals (a cluster cannot update one key from
//! scripts running on every master), so statistics and listings walk this
//! prefix's stream metadata hashes with `SCAN ... TYPE hash` on every
//! master, in batches, and read one summary per stream (the `SUMMARY`
//! script: `XLEN`, the byte counter, and the `t` of the oldest and newest
//! entries). Nothing grows with the number of streams but the time taken.

use std::collections::HashSet;

use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{
    Error, HealthReport, Result, Setting, StoreStats, StreamCursor, StreamInfo, StreamPage,
};
use redis::Value;

use crate::conn::{self, Master, Node};
use crate::error::NAME;
use crate::scripts::SCRIPTS;
use crate::{FORMAT_VERSION, RedisStore};

/// `SCAN COUNT` for statistics and listings. Part of what a listing cursor
/// means: a page that ends inside a batch reads that batch again, with the
/// same count, from the same `SCAN` cursor.
const INSPECT_SCAN_COUNT: u32 = 250;
/// Stream summaries read at once.
const SUMMARY_CONCURRENCY: usize = 16;
/// Slots of a Redis Cluster.
const CLUSTER_SLOTS: u16 = 16_384;

/// Where a listing goes on: the master (by a slot it owns; 0 on a
/// standalone server), the `SCAN` cursor of the batch, and the last stream
/// of that batch already listed (streams of a batch are listed in token
/// order).
#[derive(Clone, Debug, PartialEq, Eq)]
struct At {
    slot: u16,
    scan: u64,
    after: Option<StreamToken>,
}

impl At {
    /// `<slot>.<scan cursor>.<token or ->`.
    fn to_text(&self) -> String {
        let after = self
            .after
            .map(|t| t.to_text())
            .unwrap_or_else(|| "-".into());
        format!("{}.{}.{after}", self.slot, self.scan)
    }

    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('.');
        let (Some(slot), Some(scan), Some(after), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let slot: u16 = slot.parse().ok().filter(|s| *s < CLUSTER_SLOTS)?;
        let scan: u64 = scan.parse().ok()?;
        let after = match after {
            "-" => None,
            token => Some(StreamToken::parse(token)?),
        };
        Some(Self { slot, scan, after })
    }
}

/// The slot a master is addressed by in cursors (0 for a standalone server).
fn slot_of(master: &Master) -> u16 {
    match master.node {
        Node::Only => 0,
        Node::Slot(slot) => slot,
    }
}

/// Where the listing goes after the batch at `at` is done, whose `SCAN`
/// returned `next`: the next batch, the next master, or the end.
fn advance(masters: &[Master], at: &At, next: u64) -> Option<At> {
    if next != 0 {
        return Some(At {
            slot: at.slot,
            scan: next,
            after: None,
        });
    }
    masters
        .iter()
        .map(slot_of)
        .find(|slot| *slot > at.slot)
        .map(|slot| At {
            slot,
            scan: 0,
            after: None,
        })
}

/// One `SCAN` batch of this prefix's stream metadata hashes on `node`:
/// the next cursor and the batch's stream tokens, sorted, once each.
async fn scan_streams(
    store: &RedisStore,
    node: Node,
    cursor: u64,
) -> Result<(u64, Vec<StreamToken>)> {
    let mut scan = redis::cmd("SCAN");
    scan.arg(cursor)
        .arg("MATCH")
        .arg(store.inner.keys.meta_pattern())
        .arg("COUNT")
        .arg(INSPECT_SCAN_COUNT)
        .arg("TYPE")
        .arg("hash");
    let (next, found): (u64, Vec<Vec<u8>>) = node.query(&store.inner.conn, &scan).await?;
    let mut tokens: Vec<StreamToken> = found
        .iter()
        .filter_map(|key| store.inner.keys.token_of_meta(key))
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    Ok((next, tokens))
}

/// The summaries of `tokens`' streams, in order; `None` for a stream
/// that is gone or retains no event.
async fn summaries(store: &RedisStore, tokens: &[StreamToken]) -> Result<Vec<Option<StreamInfo>>> {
    futures_util::stream::iter(tokens.iter().copied())
        .map(|token| summary(store, token))
        .buffered(SUMMARY_CONCURRENCY)
        .try_collect()
        .await
}

async fn summary(store: &RedisStore, token: StreamToken) -> Result<Option<StreamInfo>> {
    let keys = store.inner.keys.stream(&token);
    let row: Option<(String, u64, u64, String, String)> = store
        .invoke(SCRIPTS.summary.call().key(&keys.events).key(&keys.meta))
        .await?;
    let Some((stream_id, events, bytes, first, last)) = row else {
        return Ok(None);
    };
    if events == 0 {
        return Ok(None);
    }
    let time = |t: &str| t.parse::<i64>().ok();
    Ok(Some(StreamInfo::new(
        stream_id,
        events,
        bytes,
        time(&first),
        time(&last),
    )))
}

pub(crate) async fn stats(store: &RedisStore) -> Result<StoreStats> {
    let mut stats = StoreStats::default();
    for master in conn::masters(&store.inner.conn).await? {
        let mut cursor = 0;
        loop {
            let (next, tokens) = scan_streams(store, master.node, cursor).await?;
            for info in summaries(store, &tokens).await?.into_iter().flatten() {
                stats.streams += 1;
                stats.events += info.events;
                stats.bytes += info.bytes;
                stats.oldest_millis = match (stats.oldest_millis, info.oldest_millis) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                stats.newest_millis = stats.newest_millis.max(info.newest_millis);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(stats)
}

pub(crate) async fn streams(
    store: &RedisStore,
    after: Option<&StreamCursor>,
    limit: usize,
) -> Result<StreamPage> {
    let masters = conn::masters(&store.inner.conn).await?;
    let mut at = match after {
        None => At {
            slot: slot_of(&masters[0]),
            scan: 0,
            after: None,
        },
        Some(cursor) => At::parse(cursor.as_str())
            .filter(|at| store.is_cluster() || at.slot == 0)
            .ok_or_else(|| {
                Error::Config(format!("not a stream cursor of this store: {cursor:?}"))
            })?,
    };
    let mut streams = Vec::with_capacity(limit);
    // A key met twice by one page's SCAN batches (the table was resized
    // in between) is listed once.
    let mut seen = HashSet::new();
    loop {
        let node = if store.is_cluster() {
            Node::Slot(at.slot)
        } else {
            Node::Only
        };
        let (next, mut tokens) = scan_streams(store, node, at.scan).await?;
        if let Some(after) = at.after {
            tokens.retain(|t| *t > after);
        }
        let mut done = 0;
        while done < tokens.len() {
            let room = limit - streams.len();
            let chunk = &tokens[done..(done + room).min(tokens.len())];
            for (token, info) in chunk.iter().zip(summaries(store, chunk).await?) {
                done += 1;
                if let Some(info) = info
                    && seen.insert(*token)
                {
                    streams.push(info);
                }
                if streams.len() == limit {
                    let rest = if done < tokens.len() {
                        Some(At {
                            after: Some(*token),
                            ..at.clone()
                        })
                    } else {
                        advance(&masters, &at, next)
                    };
                    let next = rest.map(|at| StreamCursor::new(at.to_text()));
                    return Ok(StreamPage::new(streams, next));
                }
            }
        }
        match advance(&masters, &at, next) {
            Some(rest) => at = rest,
            None => return Ok(StreamPage::new(streams, None)),
        }
    }
}

pub(crate) async fn check(store: &RedisStore) -> Result<HealthReport> {
    let masters = conn::masters(&store.inner.conn).await?;
    let mut per_node = Vec::with_capacity(masters.len());
    for master in &masters {
        let config = node_config(store, master.node).await?;
        per_node.push((
            master.address.clone(),
            judge(&config, store.inner.options.wait_replicas),
        ));
    }
    let mut settings = merge(per_node);
    settings.push(Setting::retention(&store.inner.options.store.retention));
    Ok(HealthReport::new(NAME, FORMAT_VERSION, settings))
}

/// What one node says about its persistence, eviction and replicas:
/// `CONFIG GET`, or where `CONFIG` is refused (managed services rename
/// or forbid it) what `INFO` tells.
async fn node_config(store: &RedisStore, node: Node) -> Result<NodeConfig> {
    let conn = &store.inner.conn;
    let mut config = NodeConfig::default();
    match config_get(store, node, "appendonly").await {
        Ok(appendonly) => {
            config.appendonly = appendonly;
            config.appendfsync = config_get(store, node, "appendfsync").await?;
            config.save = config_get(store, node, "save").await?;
            config.policy = config_get(store, node, "maxmemory-policy").await?;
        }
        Err(e) => {
            tracing::debug!(error = %e, "CONFIG GET refused; reading INFO instead");
            let persistence: String = node
                .query(conn, redis::cmd("INFO").arg("persistence"))
                .await?;
            config.appendonly = info_field(&persistence, "aof_enabled")
                .map(|on| if on == "1" { "yes" } else { "no" }.to_owned());
            let memory: String = node.query(conn, redis::cmd("INFO").arg("memory")).await?;
            config.policy = info_field(&memory, "maxmemory_policy");
        }
    }
    let replication: Result<String> = node
        .query(conn, redis::cmd("INFO").arg("replication"))
        .await;
    config.replicas = replication
        .ok()
        .and_then(|info| info_field(&info, "connected_slaves"))
        .and_then(|n| n.parse().ok());
    Ok(config)
}

/// `CONFIG GET <name>`: its value, or `None` if the server has no such
/// setting.
async fn config_get(store: &RedisStore, node: Node, name: &str) -> Result<Option<String>> {
    let reply: Value = node
        .query(&store.inner.conn, redis::cmd("CONFIG").arg("GET").arg(name))
        .await?;
    let pairs = match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs,
        _ => Vec::new(),
    };
    for (key, value) in pairs {
        let key: String = redis::from_redis_value(key).map_err(|e| Error::backend(NAME, e))?;
        if key.eq_ignore_ascii_case(name) {
            let value: String =
                redis::from_redis_value(value).map_err(|e| Error::backend(NAME, e))?;
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// `field:value` from an `INFO` section.
fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
        .map(str::to_owned)
}

/// One node's settings as read; `None` where it did not say.
#[derive(Clone, Debug, Default)]
struct NodeConfig {
    appendonly: Option<String>,
    appendfsync: Option<String>,
    save: Option<String>,
    policy: Option<String>,
    replicas: Option<u64>,
}

/// The remedy for a setting this store could not read.
fn verify_by_hand(what: &str) -> String {
    format!(
        "the server refuses CONFIG GET (a managed Redis?): verify by hand, in its console or \
         documentation, that {what}"
    )
}

/// One node's settings, each with its verdict.
fn judge(config: &NodeConfig, wait_replicas: u32) -> Vec<Setting> {
    let appendonly = config.appendonly.as_deref();
    let mut settings = Vec::with_capacity(5);
    settings.push(match appendonly {
        Some("yes") => Setting::ok("appendonly", "yes"),
        Some(other) => Setting::warn(
            "appendonly",
            other,
            "set appendonly yes (with appendfsync always): without an append-only file a \
             restart or crash of Redis loses acknowledged events and tasks (a task \
             acknowledged as created can vanish)",
        ),
        None => Setting::warn("appendonly", "unknown", verify_by_hand("appendonly is yes")),
    });
    settings.push(match (appendonly, config.appendfsync.as_deref()) {
        (Some("no"), fsync) => Setting::ok(
            "appendfsync",
            format!(
                "{} (unused while appendonly is no)",
                fsync.unwrap_or("unknown")
            ),
        ),
        (_, Some("always")) => Setting::ok("appendfsync", "always"),
        (_, Some("everysec")) => Setting::warn(
            "appendfsync",
            "everysec",
            "set appendfsync always if acknowledged events must survive power loss: with \
             everysec an operating-system crash can lose about the last second of them, \
             and of acknowledged task changes (a task acknowledged as created can vanish)",
        ),
        (_, Some(other)) => Setting::warn(
            "appendfsync",
            other,
            "set appendfsync always (or everysec): otherwise the operating system decides \
             when the append-only file reaches the disk, and a crash can lose many seconds \
             of acknowledged events and task changes",
        ),
        (_, None) => Setting::warn(
            "appendfsync",
            "unknown",
            verify_by_hand("appendfsync is always"),
        ),
    });
    let save = config.save.as_deref().map(|save| {
        if save.is_empty() {
            "\"\" (no snapshots)".to_owned()
        } else {
            save.to_owned()
        }
    });
    settings.push(match (appendonly, save) {
        (Some("yes"), save) => Setting::ok(
            "save",
            format!(
                "{} (the append-only file keeps the events)",
                save.as_deref().unwrap_or("unknown")
            ),
        ),
        (Some(_), Some(save)) if config.save.as_deref().is_some_and(str::is_empty) => {
            Setting::warn(
                "save",
                save,
                "nothing is persisted, so a restart of Redis loses every event: set appendonly yes",
            )
        }
        (Some(_), Some(save)) => Setting::warn(
            "save",
            save,
            "RDB snapshots are the only persistence, so a crash of Redis loses every event \
             acknowledged since the last one: set appendonly yes",
        ),
        (_, save) => Setting::warn(
            "save",
            save.unwrap_or_else(|| "unknown".into()),
            verify_by_hand("appendonly is yes"),
        ),
    });
    settings.push(match config.policy.as_deref() {
        Some("noeviction") => Setting::ok("maxmemory-policy", "noeviction"),
        Some(other) => Setting::warn(
            "maxmemory-policy",
            other,
            "set maxmemory-policy noeviction: any other policy lets Redis evict a stream's \
             keys when memory runs short, losing acknowledged events (with noeviction, \
             appends fail instead)",
        ),
        None => Setting::warn(
            "maxmemory-policy",
            "unknown",
            verify_by_hand("maxmemory-policy is noeviction"),
        ),
    });
    settings.push(match (wait_replicas, config.replicas) {
        (0, Some(0)) => Setting::ok("wait_replicas", "0 (no replica connected)"),
        (0, Some(n)) => Setting::warn(
            "wait_replicas",
            format!("0 ({n} replicas connected)"),
            "set wait_replicas=1 (or more): replication is asynchronous, so a failover to a \
             replica can lose the newest acknowledged events",
        ),
        (wait, Some(n)) if u64::from(wait) > n => Setting::warn(
            "wait_replicas",
            format!("{wait} ({n} replicas connected)"),
            "appends fail while fewer replicas than wait_replicas are connected: add replicas \
             or lower wait_replicas",
        ),
        (wait, Some(n)) => Setting::ok("wait_replicas", format!("{wait} ({n} replicas connected)")),
        (wait, None) => Setting::warn(
            "wait_replicas",
            format!("{wait} (replicas unknown)"),
            "the server refuses INFO replication: verify by hand that it has at least \
             wait_replicas replicas, and set wait_replicas=1 if it has any",
        ),
    });
    settings
}

/// One list of settings from every master's: a setting with the same value
/// and verdict everywhere is reported once ("on all 3 masters"), otherwise
/// once per value, naming the masters that have it. A standalone server's
/// settings are reported as they are.
fn merge(per_node: Vec<(Option<String>, Vec<Setting>)>) -> Vec<Setting> {
    if per_node.len() == 1 && per_node[0].0.is_none() {
        return per_node
            .into_iter()
            .next()
            .map(|(_, s)| s)
            .unwrap_or_default();
    }
    let count = per_node.len();
    let width = per_node.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    let mut merged = Vec::new();
    for i in 0..width {
        // (the setting, the masters that have it), in first-seen order.
        let mut groups: Vec<(Setting, Vec<String>)> = Vec::new();
        for (address, settings) in &per_node {
            let Some(setting) = settings.get(i) else {
                continue;
            };
            let address = address.clone().unwrap_or_else(|| "the server".into());
            match groups.iter_mut().find(|(s, _)| s == setting) {
                Some((_, addresses)) => addresses.push(address),
                None => groups.push((setting.clone(), vec![address])),
            }
        }
        for (mut setting, addresses) in groups {
            setting.value = if addresses.len() == count && count > 1 {
                format!("{} on all {count} masters", setting.value)
            } else {
                format!("{} on {}", setting.value, addresses.join(", "))
            };
            merged.push(setting);
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use mcp_event_store_core::Verdict;

    use super::*;

    fn config(appendonly: &str, fsync: &str, save: &str, policy: &str) -> NodeConfig {
        NodeConfig {
            appendonly: Some(appendonly.into()),
            appendfsync: Some(fsync.into()),
            save: Some(save.into()),
            policy: Some(policy.into()),
            replicas: Some(0),
        }
    }

    fn warned(settings: &[Setting]) -> Vec<&str> {
        settings
            .iter()
            .filter(|s| matches!(s.verdict, Verdict::Warn { .. }))
            .map(|s| s.name.as_str())
            .collect()
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let token = mcp_event_store_core::backend::StreamKey::generate()
            .unwrap()
            .token("s");
        for at in [
            At {
                slot: 0,
                scan: 0,
                after: None,
            },
            At {
                slot: 5461,
                scan: 123_456,
                after: Some(token),
            },
        ] {
            assert_eq!(At::parse(&at.to_text()), Some(at));
        }
        for bad in [
            "",
            "1.2",
            "1.2.3.4",
            "x.0.-",
            "16384.0.-",
            "0.-1.-",
            "0.0.zz",
        ] {
            assert_eq!(At::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn settings_are_judged_together() {
        let safe = judge(&config("yes", "always", "", "noeviction"), 0);
        assert!(warned(&safe).is_empty(), "{safe:?}");
        let bare = judge(&config("no", "everysec", "", "noeviction"), 0);
        assert_eq!(warned(&bare), ["appendonly", "save"]);
        let rdb = judge(&config("no", "everysec", "3600 1", "noeviction"), 0);
        assert_eq!(warned(&rdb), ["appendonly", "save"]);
        let usual = judge(&config("yes", "everysec", "3600 1", "allkeys-lru"), 0);
        assert_eq!(warned(&usual), ["appendfsync", "maxmemory-policy"]);
        let mut replicated = config("yes", "always", "", "noeviction");
        replicated.replicas = Some(2);
        assert_eq!(warned(&judge(&replicated, 0)), ["wait_replicas"]);
        assert!(warned(&judge(&replicated, 2)).is_empty());
        assert_eq!(warned(&judge(&replicated, 3)), ["wait_replicas"]);
        // Managed Redis without CONFIG: what INFO told, and "unknown".
        let managed = NodeConfig {
            appendonly: Some("yes".into()),
            policy: Some("noeviction".into()),
            replicas: Some(0),
            ..NodeConfig::default()
        };
        let settings = judge(&managed, 0);
        assert_eq!(warned(&settings), ["appendfsync"]);
        let fsync = &settings[1];
        assert_eq!(fsync.value, "unknown");
        assert!(
            matches!(&fsync.verdict, Verdict::Warn { remedy } if remedy.contains("by hand")),
            "{fsync:?}"
        );
        for setting in safe.iter().chain(&bare).chain(&settings) {
            assert!(!setting.value.is_empty(), "{setting:?}");
        }
    }

    #[test]
    fn masters_that_agree_are_reported_once() {
        let node = |address: &str, aof: &str| {
            (
                Some(address.to_owned()),
                judge(&config(aof, "always", "", "noeviction"), 0),
            )
        };
        let same = merge(vec![node("a:1", "yes"), node("b:2", "yes")]);
        assert_eq!(same.len(), 5);
        assert_eq!(same[0].value, "yes on all 2 masters");
        let split = merge(vec![
            node("a:1", "yes"),
            node("b:2", "no"),
            node("c:3", "yes"),
        ]);
        let appendonly: Vec<&str> = split
            .iter()
            .filter(|s| s.name == "appendonly")
            .map(|s| s.value.as_str())
            .collect();
        assert_eq!(appendonly, ["yes on a:1, c:3", "no on b:2"]);
        let standalone = merge(vec![(
            None,
            judge(&config("yes", "always", "", "noeviction"), 0),
        )]);
        assert_eq!(standalone[0].value, "yes");
    }
}
