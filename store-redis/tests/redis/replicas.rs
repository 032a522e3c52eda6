//! A primary and a replica started from `redis-server` on loopback ports
//! (each owned by a guard that kills it by pid on drop): with
//! `wait_replicas`, every acknowledged event survives the primary being
//! killed with SIGKILL and the replica promoted; without it, events the
//! primary acknowledged while the replica was cut off are lost in the same
//! failover. Plus the cost of waiting, measured (ignored by default).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use mcp_event_store_core::{Error, EventId, EventStore, NewEvent};
use mcp_event_store_redis::testing::random_prefix;
use mcp_event_store_redis::{RedisOptions, RedisStore};
use tokio::sync::Mutex;

use crate::common::RedisProcess;

/// The user the replica authenticates as, so the test can cut it off (by
/// disabling the user) without touching the store's connections.
const REPLICATOR: &str = "replicator";
const REPLICATOR_PASSWORD: &str = "replicator-password";

/// A primary and its replica, in sync.
struct Pair {
    primary: RedisProcess,
    replica: RedisProcess,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // No delay before the first (diskless) sync, which waits 5 s by
        // default for more replicas to join.
        let primary = RedisProcess::start(
            dir.path(),
            crate::common::free_port(),
            &["--appendonly", "no", "--repl-diskless-sync-delay", "0"],
        );
        let _: () = crate::common::command(
            &primary.url(),
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg(REPLICATOR)
                .arg("on")
                .arg(format!(">{REPLICATOR_PASSWORD}"))
                .arg("+@all")
                .arg("~*"),
        )
        .unwrap();
        let port = primary.port().to_string();
        let replica = RedisProcess::start(
            dir.path(),
            crate::common::free_port(),
            &[
                "--appendonly",
                "no",
                "--replicaof",
                "127.0.0.1",
                &port,
                "--masteruser",
                REPLICATOR,
                "--masterauth",
                REPLICATOR_PASSWORD,
            ],
        );
        let pair = Self {
            primary,
            replica,
            _dir: dir,
        };
        pair.wait_replicas(1);
        crate::common::wait_replica_acknowledges(&pair.primary.url());
        pair
    }

    /// Waits until the primary counts `n` connected replicas, each online
    /// (synchronised and acknowledging, which is what `WAIT` counts).
    fn wait_replicas(&self, n: usize) {
        let want = format!("connected_slaves:{n}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info: String =
                crate::common::command(&self.primary.url(), redis::cmd("INFO").arg("replication"))
                    .unwrap_or_default();
            let linked: String =
                crate::common::command(&self.replica.url(), redis::cmd("INFO").arg("replication"))
                    .unwrap_or_default();
            let link_up = linked.contains("master_link_status:up");
            let online = info.matches("state=online").count() == n;
            if info.contains(&want) && (n == 0 || (link_up && online)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the primary did not reach {want} within 30 s:\n{info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Cuts the replica off (as a network partition would): its user is
    /// disabled and its connection killed, so it cannot resynchronise. The
    /// primary goes on acknowledging writes.
    fn partition(&self) {
        let url = self.primary.url();
        let _: () = crate::common::command(
            &url,
            redis::cmd("ACL").arg("SETUSER").arg(REPLICATOR).arg("off"),
        )
        .unwrap();
        let _: u64 = crate::common::command(
            &url,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
        )
        .unwrap();
        self.wait_replicas(0);
    }

    /// SIGKILLs the primary and promotes the replica.
    fn fail_over(&mut self) {
        self.primary.kill();
        let _: () = crate::common::command(
            &self.replica.url(),
            redis::cmd("REPLICAOF").arg("NO").arg("ONE"),
        )
        .unwrap();
    }
}

/// Acknowledged (id, payload) pairs per stream, in order.
type Ledger = Mutex<HashMap<String, Vec<(EventId, Vec<u8>)>>>;

/// Every acknowledged event replays from the store, in order, with its
/// payload.
async fn assert_all_replay(store: &RedisStore, acked: &HashMap<String, Vec<(EventId, Vec<u8>)>>) {
    assert!(!acked.is_empty());
    for (stream, events) in acked {
        let (first, _) = &events[0];
        let replay = store
            .replay_events_after(&first.to_string())
            .await
            .unwrap_or_else(|e| panic!("replay of {stream} from {first}: {e}"));
        let replayed: Vec<_> = replay.events.try_collect().await.unwrap();
        let mut replayed = replayed.iter();
        for (id, payload) in &events[1..] {
            let found = replayed
                .by_ref()
                .find(|e| e.id == *id)
                .unwrap_or_else(|| panic!("acknowledged event {id} of {stream} was lost"));
            assert_eq!(&found.data[..], &payload[..], "{id} changed");
        }
    }
}

/// With `?wait_replicas=1`, eight writers append; the replica is cut off
/// while they go on (so the primary holds events the replica never gets),
/// then the primary is SIGKILLed with appends in flight and the replica
/// promoted: it replays every event that was acknowledged. (Without the
/// option this fails: the primary acknowledges what it wrote during the
/// partition, and the failover loses it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_a_failover_with_wait_replicas() {
    let mut pair = tokio::task::spawn_blocking(Pair::start).await.unwrap();
    let prefix = random_prefix();
    let url = format!(
        "{}?prefix={prefix}&wait_replicas=1&wait_timeout_ms=300",
        pair.primary.url()
    );
    let store = Arc::new(RedisStore::connect(&url).await.unwrap());
    assert_eq!(store.options().wait_replicas, 1);
    assert_eq!(store.key_prefix(), prefix);

    let acked: Arc<Ledger> = Arc::default();
    let acks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, acked, acks, stop) =
                (store.clone(), acked.clone(), acks.clone(), stop.clone());
            tokio::spawn(async move {
                let stream = format!("writer-{w}");
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let payload = format!("{w}:{i}").into_bytes();
                    i += 1;
                    match store.store_event(&stream, NewEvent::new(&payload)).await {
                        Ok(id) => {
                            acked
                                .lock()
                                .await
                                .entry(stream.clone())
                                .or_default()
                                .push((id, payload));
                            acks.fetch_add(1, Ordering::SeqCst);
                        }
                        // After the kill: nothing more is acknowledged.
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while acks.load(Ordering::SeqCst) < 400 {
        assert!(Instant::now() < deadline, "appends did not get going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The replica is cut off while the writers go on; then the primary is
    // killed, with appends in flight.
    tokio::task::block_in_place(|| pair.partition());
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| pair.fail_over());
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    // A writer may be waiting for its handle to reconnect to the dead
    // primary; what it has not been told is not in the ledger.
    for writer in writers {
        writer.abort();
        let _ = writer.await;
    }

    let promoted = RedisStore::connect_with(
        &pair.replica.url(),
        RedisOptions::default().key_prefix(&prefix),
    )
    .await
    .unwrap();
    let acked = acked.lock().await;
    assert_all_replay(&promoted, &acked).await;
}

/// Without the option, the primary acknowledges events its replica never
/// receives (here: the replica is cut off), and the failover loses them.
/// A store with `wait_replicas` refuses to acknowledge in the same state,
/// saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_a_failover_loses_acknowledged_events() {
    let mut pair = tokio::task::spawn_blocking(Pair::start).await.unwrap();
    let prefix = random_prefix();
    let plain = RedisStore::connect(&format!("{}?prefix={prefix}", pair.primary.url()))
        .await
        .unwrap();
    let waiting = RedisStore::connect(&format!(
        "{}?prefix={prefix}&wait_replicas=1&wait_timeout_ms=200",
        pair.primary.url()
    ))
    .await
    .unwrap();
    let replicated = plain.store_event("s", NewEvent::new(b"0")).await.unwrap();
    let waited = waiting.store_event("w", NewEvent::new(b"0")).await.unwrap();

    tokio::task::block_in_place(|| pair.partition());
    let mut lost = Vec::new();
    for i in 1..=5u8 {
        lost.push(plain.store_event("s", NewEvent::new(&[i])).await.unwrap());
    }
    let err = waiting
        .store_event("w", NewEvent::new(b"1"))
        .await
        .expect_err("no replica can acknowledge");
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("0 of 1 replicas") && message.contains("may not survive a failover"),
        "{message}"
    );

    tokio::task::block_in_place(|| pair.fail_over());
    let promoted = RedisStore::connect_with(
        &pair.replica.url(),
        RedisOptions::default().key_prefix(&prefix),
    )
    .await
    .unwrap();
    // What was replicated before the partition is there ...
    assert_eq!(
        promoted
            .get_stream_id_for_event_id(&waited.to_string())
            .await
            .unwrap()
            .as_deref(),
        Some("w")
    );
    let replay = promoted
        .replay_events_after(&replicated.to_string())
        .await
        .unwrap();
    let after: Vec<_> = replay.events.try_collect().await.unwrap();
    // ... and the five acknowledged during it are gone.
    assert!(after.is_empty(), "{} events survived", after.len());
    for id in &lost {
        assert_eq!(
            promoted
                .get_stream_id_for_event_id(&id.to_string())
                .await
                .unwrap(),
            None,
            "{id} survived"
        );
    }
}

/// The median of `samples`, in microseconds.
fn median_us(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// Latency of one append.
async fn timed(store: &RedisStore, stream: &str, payload: &[u8]) -> Duration {
    let started = Instant::now();
    store
        .store_event(stream, NewEvent::new(payload))
        .await
        .unwrap();
    started.elapsed()
}

/// Appends per second from `writers` concurrent tasks on their own streams,
/// `per_writer` appends each.
async fn concurrent(store: &Arc<RedisStore>, writers: usize, per_writer: usize) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let payload = vec![b'x'; 256];
                for _ in 0..per_writer {
                    store
                        .store_event(&format!("c-{w}"), NewEvent::new(&payload))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (writers * per_writer) as f64 / started.elapsed().as_secs_f64()
}

/// What `wait_replicas=1` costs per append, with a replica on loopback.
/// Prints figures; asserts nothing about them. Run with
/// `cargo test -p mcp-event-store-redis --release --test redis -- --ignored --nocapture wait_cost_per_append`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn wait_cost_per_append() {
    let pair = tokio::task::spawn_blocking(Pair::start).await.unwrap();
    let prefix = random_prefix();
    let plain = Arc::new(
        RedisStore::connect(&format!("{}?prefix={prefix}", pair.primary.url()))
            .await
            .unwrap(),
    );
    let waiting = Arc::new(
        RedisStore::connect(&format!(
            "{}?prefix={prefix}&wait_replicas=1",
            pair.primary.url()
        ))
        .await
        .unwrap(),
    );
    const N: usize = 5_000;
    let payload = vec![b'x'; 256];
    // Warm up both (scripts loaded, streams created).
    for _ in 0..200 {
        timed(&plain, "plain", &payload).await;
        timed(&waiting, "waiting", &payload).await;
    }
    for round in 0..3 {
        // Interleaved, so both see the same load on a shared machine.
        let (mut without, mut with, mut existing, mut created) = (
            Vec::with_capacity(N),
            Vec::with_capacity(N),
            Vec::with_capacity(N),
            Vec::with_capacity(N),
        );
        for i in 0..N {
            without.push(timed(&plain, "plain", &payload).await);
            with.push(timed(&waiting, "waiting", &payload).await);
            existing.push(timed(&plain, "existing", &payload).await);
            created.push(timed(&plain, &format!("new-{round}-{i}"), &payload).await);
        }
        let tput_without = concurrent(&plain, 32, 500).await;
        let tput_with = concurrent(&waiting, 32, 500).await;
        println!(
            "round {round}: median of {N} appends, 1 writer: {:.1} us without WAIT, {:.1} us \
             with wait_replicas=1; {:.1} us to an existing stream, {:.1} us for the append \
             that creates a stream; 32 writers on one handle: {tput_without:.0}/s without \
             WAIT, {tput_with:.0}/s with",
            median_us(&mut without),
            median_us(&mut with),
            median_us(&mut existing),
            median_us(&mut created),
        );
    }
}
