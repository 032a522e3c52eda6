//! Retention (C8): `purge_expired` over every stream and session of the
//! prefix (`SCAN` on every master), `delete_stream`, and removing every key
//! of a prefix.

use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::{PurgeReport, Result};

use crate::RedisStore;
use crate::conn::{self, Conn};
use crate::error::backend;
use crate::options::{
    GONE_MARKER_TTL, PURGE_CONCURRENCY, PURGE_TRIM_BUDGET, SCAN_BATCH, SECRET_ATTEMPTS,
};
use crate::scripts::{SCRIPTS, optional};
use crate::setup::secret_kept_changing;

/// Applies retention to every stream and expiry to every session.
pub(crate) async fn purge(store: &RedisStore) -> Result<PurgeReport> {
    let now = store.now();
    let pattern = store.inner.keys.scan_pattern();
    let mut report = PurgeReport::default();
    for node in conn::nodes(&store.inner.conn).await? {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH)
                .arg("TYPE")
                .arg("hash");
            let (next, found): (u64, Vec<Vec<u8>>) = node.query(&store.inner.conn, &scan).await?;
            let reports: Vec<PurgeReport> = futures_util::stream::iter(found)
                .filter_map(|key| async move { String::from_utf8(key).ok() })
                .map(|key| async move { purge_key(store, &key, now).await })
                .buffer_unordered(PURGE_CONCURRENCY)
                .try_collect()
                .await?;
            for one in reports {
                report.add(one);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(report)
}

/// Applies retention to one stream, or expiry to one session, found by SCAN.
async fn purge_key(store: &RedisStore, key: &str, now: i64) -> Result<PurgeReport> {
    let mut report = PurgeReport::default();
    if key.ends_with(":session") {
        let removed: u64 = store
            .invoke(SCRIPTS.session_purge.call().key(key).arg(now))
            .await?;
        report.sessions += removed;
        return Ok(report);
    }
    let Some(keys) = store.inner.keys.stream_of_meta(key) else {
        return Ok(report);
    };
    let retention = store.inner.options.store.retention;
    let cutoff = retention.expiry_cutoff_millis(now);
    loop {
        let (removed, gone, more): (u64, u64, u64) = store
            .invoke(
                SCRIPTS
                    .purge
                    .call()
                    .key(&keys.events)
                    .key(&keys.meta)
                    .key(&keys.gone)
                    .arg(cutoff.map(|c| c.to_string()).unwrap_or_default())
                    .arg(optional(retention.max_events_per_stream))
                    .arg(optional(retention.max_bytes_per_stream))
                    .arg(PURGE_TRIM_BUDGET)
                    .arg(GONE_MARKER_TTL.as_millis() as u64),
            )
            .await?;
        report.events += removed;
        report.streams += gone;
        if more == 0 {
            return Ok(report);
        }
    }
}

/// Deletes a stream (`delete_stream`), returning how many events went.
pub(crate) async fn remove_stream(store: &RedisStore, stream_id: &str) -> Result<u64> {
    for _ in 0..SECRET_ATTEMPTS {
        let key = store.key();
        let keys = store.inner.keys.stream(&key.token(stream_id));
        let removed: i64 = store
            .invoke(
                SCRIPTS
                    .delete
                    .call()
                    .key(&keys.events)
                    .key(&keys.meta)
                    .key(&keys.gone)
                    .arg(stream_id)
                    .arg(GONE_MARKER_TTL.as_millis() as u64),
            )
            .await?;
        // No such stream: unless this handle's secret is out of date
        // (then the stream lives under another token), there is
        // nothing to delete.
        if removed >= 0 || store.secret_holds(&key).await? {
            return Ok(u64::try_from(removed).unwrap_or(0));
        }
    }
    Err(secret_kept_changing())
}

/// Removes every key matching `pattern` on every node (`SCAN` + `UNLINK`
/// per master), returning how many went.
pub(crate) async fn unlink_matching(conn: &Conn, pattern: &str) -> Result<u64> {
    let mut removed = 0;
    for node in conn::nodes(conn).await? {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_BATCH);
            let (next, found): (u64, Vec<Vec<u8>>) = node.query(conn, &scan).await?;
            for key in found {
                // One key per UNLINK: keys of different slots may not
                // share a command, and UNLINK frees big streams off-thread.
                let n: u64 = redis::cmd("UNLINK")
                    .arg(key)
                    .query_async(&mut conn.clone())
                    .await
                    .map_err(backend)?;
                removed += n;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(removed)
}
