//! C15 Inspect on Redis: the health check against servers of our own,
//! started risky and safe, and listings and totals beside another
//! prefix's keys.

use std::collections::HashSet;

use mcp_event_store_conformance::events::{Harness, append, test_clock, test_options};
use mcp_event_store_core::{
    Error, EventStore, HealthReport, Setting, StreamCursor, StreamInfo, Verdict,
};
use mcp_event_store_redis::testing::RedisHarness;
use mcp_event_store_redis::{RedisOptions, RedisStore};

use crate::common::RedisProcess;

/// A server of our own with `extra` arguments, and its directory.
fn server(extra: &[&str]) -> (RedisProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let process = RedisProcess::start(dir.path(), crate::common::free_port(), extra);
    (process, dir)
}

async fn check(url: &str, options: RedisOptions) -> HealthReport {
    let store = RedisStore::connect_with(url, options).await.unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(report.backend, "redis");
    assert_eq!(report.format_version, mcp_event_store_redis::FORMAT_VERSION);
    report
}

fn setting<'a>(report: &'a HealthReport, name: &str) -> &'a Setting {
    report
        .settings
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} in {report:?}"))
}

fn warned(report: &HealthReport) -> Vec<&str> {
    report
        .settings
        .iter()
        .filter(|s| matches!(s.verdict, Verdict::Warn { .. }))
        .map(|s| s.name.as_str())
        .collect()
}

fn remedy(setting: &Setting) -> &str {
    match &setting.verdict {
        Verdict::Warn { remedy } => remedy,
        other => panic!("{} is {other:?}, expected a warning", setting.name),
    }
}

#[tokio::test]
async fn check_warns_without_persistence_and_passes_a_safe_server() {
    let (bare, _d1) = server(&["--appendonly", "no"]);
    let report = check(&bare.url(), RedisOptions::default()).await;
    assert!(!report.healthy(), "{report:?}");
    assert_eq!(warned(&report), ["appendonly", "save"], "{report:?}");
    assert!(remedy(setting(&report, "appendonly")).contains("appendonly yes"));
    assert_eq!(setting(&report, "save").value, "\"\" (no snapshots)");
    assert!(remedy(setting(&report, "save")).contains("restart"));

    let (safe, _d2) = server(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--maxmemory-policy",
        "noeviction",
    ]);
    let report = check(&safe.url(), RedisOptions::default()).await;
    assert!(report.healthy(), "{report:?}");
    let names: Vec<&str> = report.settings.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "appendonly",
            "appendfsync",
            "save",
            "maxmemory-policy",
            "wait_replicas",
            "retention"
        ]
    );
    assert_eq!(setting(&report, "appendfsync").value, "always");
    assert_eq!(
        setting(&report, "wait_replicas").value,
        "0 (no replica connected)"
    );

    // The same server made risky while the store is connected: the check
    // reads the settings afresh.
    let _: () = crate::common::command(
        &safe.url(),
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendfsync")
            .arg("everysec"),
    )
    .unwrap();
    let _: () = crate::common::command(
        &safe.url(),
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("allkeys-lru"),
    )
    .unwrap();
    let report = check(&safe.url(), RedisOptions::default()).await;
    assert_eq!(
        warned(&report),
        ["appendfsync", "maxmemory-policy"],
        "{report:?}"
    );
    assert!(remedy(setting(&report, "appendfsync")).contains("appendfsync always"));
    assert!(remedy(setting(&report, "maxmemory-policy")).contains("noeviction"));
}

/// Managed services refuse `CONFIG`: what `INFO` tells is reported, and
/// what it does not is "unknown", to be verified by hand.
#[tokio::test]
async fn check_without_config_falls_back_to_info() {
    let (managed, _dir) = server(&[
        "--appendonly",
        "yes",
        "--maxmemory-policy",
        "noeviction",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let report = check(&managed.url(), RedisOptions::default()).await;
    assert_eq!(setting(&report, "appendonly").value, "yes");
    assert_eq!(setting(&report, "maxmemory-policy").value, "noeviction");
    assert_eq!(warned(&report), ["appendfsync"], "{report:?}");
    let fsync = setting(&report, "appendfsync");
    assert_eq!(fsync.value, "unknown");
    assert!(remedy(fsync).contains("by hand"), "{fsync:?}");
}

#[tokio::test]
async fn check_weighs_wait_replicas_against_connected_replicas() {
    let (primary, dir) = server(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let port = primary.port().to_string();
    let _replica = RedisProcess::start(
        dir.path(),
        crate::common::free_port(),
        &["--appendonly", "no", "--replicaof", "127.0.0.1", &port],
    );
    tokio::task::spawn_blocking({
        let url = primary.url();
        move || crate::common::wait_replica_acknowledges(&url)
    })
    .await
    .unwrap();
    let with = |n: u32| RedisOptions {
        wait_replicas: n,
        ..RedisOptions::default()
    };

    let report = check(&primary.url(), with(0)).await;
    assert_eq!(warned(&report), ["wait_replicas"], "{report:?}");
    let wait = setting(&report, "wait_replicas");
    assert_eq!(wait.value, "0 (1 replicas connected)");
    assert!(remedy(wait).contains("wait_replicas=1"));

    let report = check(&primary.url(), with(1)).await;
    assert!(report.healthy(), "{report:?}");

    let report = check(&primary.url(), with(2)).await;
    assert_eq!(warned(&report), ["wait_replicas"], "{report:?}");
    assert!(remedy(setting(&report, "wait_replicas")).contains("add replicas"));
}

/// Every page of a listing with `limit`, checked against its bounds.
async fn list_all(store: &RedisStore, limit: usize) -> Vec<StreamInfo> {
    let mut all = Vec::new();
    let mut after: Option<StreamCursor> = None;
    loop {
        let page = store.list_streams(after.as_ref(), limit).await.unwrap();
        assert!(page.streams.len() <= limit);
        all.extend(page.streams);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

/// On a server of its own: `SCAN` may return a key again after the server
/// shrank its key table between two calls (see the crate docs on listings),
/// which other tests' keys going on the shared server can make happen in
/// the middle of this test's pages. Another prefix's streams stand in for
/// theirs.
#[tokio::test]
async fn listings_and_totals_cover_many_scan_batches() {
    let (server, _dir) = server(&[]);
    let url = server.url();
    let clock = test_clock();
    let prefix = "listed";
    let options = |prefix: &str| {
        RedisOptions::default()
            .store(test_options(&clock))
            .key_prefix(prefix)
    };
    let other = RedisStore::connect_with(&url, options("other"))
        .await
        .unwrap();
    for i in 0..300 {
        append(&other, &format!("o-{i}"), b"x").await;
    }
    let store = RedisStore::connect_with(&url, options(prefix))
        .await
        .unwrap();
    // More streams than one SCAN batch holds, beside this prefix's other
    // keys (events, the secret, the marker) and another prefix's.
    let streams = 700;
    let mut firsts = Vec::new();
    for i in 0..streams {
        firsts.push(append(&store, &format!("s-{i}"), &[0u8; 3]).await);
    }
    append(&store, "s-0", b"four").await;

    for limit in [1_000, 64, 7] {
        let listed = list_all(&store, limit).await;
        let mut names = HashSet::new();
        for info in &listed {
            assert!(names.insert(info.stream_id.clone()), "{info:?} twice");
        }
        assert_eq!(names.len(), streams, "limit {limit}");
        let s0 = listed.iter().find(|s| s.stream_id == "s-0").unwrap();
        assert_eq!((s0.events, s0.bytes), (2, 7));
    }
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.streams, stats.events, stats.bytes),
        (700, 701, 2_104)
    );

    // A stream whose events key was lost (evicted, or deleted by hand)
    // retains nothing: it leaves the totals and the listing.
    let lost = &firsts[5];
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: u64 = redis::cmd("UNLINK")
        .arg(format!("{prefix}:v1:{{{}}}:events", lost.token.to_text()))
        .query_async(&mut conn)
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.streams, stats.events), (699, 700));
    let listed = list_all(&store, 1_000).await;
    assert_eq!(listed.len(), 699);
    assert!(listed.iter().all(|s| s.stream_id != "s-5"));
    drop((store, other));
}

#[tokio::test]
async fn cursors_of_another_kind_are_refused() {
    let h = RedisHarness::new().await;
    let clock = test_clock();
    let store = RedisStore::connect_with(h.url(), h.options(test_options(&clock)))
        .await
        .unwrap();
    append(&store, "s", b"x").await;
    for bad in ["", "garbage", "1.0.-", "0.0.0.0", "0.x.-"] {
        // Slot 1 names a cluster master; this server is standalone.
        match store.list_streams(Some(&StreamCursor::new(bad)), 10).await {
            Err(Error::Config(_)) => {}
            other => panic!("{bad:?}: expected a configuration error, got {other:?}"),
        }
    }
    drop(store);
    h.teardown().await;
}
