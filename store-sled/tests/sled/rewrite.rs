//! sled-specific checks of values swapped in place (C22), beyond the
//! shared cases: a swapped event keeps its header (time, retry hint,
//! cumulative byte count), so stats and byte retention stay right, and
//! the swap is on disk after a reopen; a swapped session keeps its entry
//! in the expiry index, so the purge still removes it at its time;
//! session keys of a release from before digests are not listed; and a
//! worker stepping a task while its values are swapped never writes back
//! bytes a swap replaced (each step swaps over the whole value it read).

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_conformance::events::{test_clock, test_options};
use mcp_event_store_core::rewrite::{RewriteStore, Swap, TaskField};
use mcp_event_store_core::task::{
    Applied, InstanceId, NewTask, Owner, RuntimeStore, TaskStore, WorkerChange,
};
use mcp_event_store_core::{EventStore, NewEvent, Retention, SessionDigest, SessionStore};
use mcp_event_store_sled::{SledOptions, SledStore};

const SESSIONS: &str = "mcp-event-store/v1/sessions";
const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// sled keeps a closed database's directory locked a moment longer.
const LOCK_RELEASE: Duration = Duration::from_secs(10);

fn flipped(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().map(|b| b ^ 0x5a).collect()
}

fn rewriter(store: &SledStore) -> &dyn RewriteStore {
    store.rewriter().expect("the sled store rewrites")
}

/// Opens the store, retrying while the directory's lock is released.
async fn open(dir: &std::path::Path, options: SledOptions) -> SledStore {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match SledStore::open(dir, options.clone()).await {
            Err(e)
                if e.to_string().contains("locked by another process")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            opened => return opened.unwrap(),
        }
    }
}

/// Opens the database with sled directly, retrying the same way.
fn raw_open(dir: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match sled::open(dir) {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            opened => return opened.unwrap(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_event_keeps_its_header_and_counts_and_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    // Room for three 10-byte events: byte retention counts the swapped
    // event as it did before.
    let options = SledOptions::default()
        .store(test_options(&clock).retention(Retention::unbounded().max_bytes_per_stream(30)));
    let store = open(dir.path(), options.clone()).await;
    let first = store
        .store_event("s", NewEvent::new(b"0123456789"))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(5));
    let second = store
        .store_event(
            "s",
            NewEvent::new(b"abcdefghij").with_retry(Duration::from_millis(700)),
        )
        .await
        .unwrap();
    let before = store.stats().await.unwrap();
    assert_eq!(
        rewriter(&store)
            .swap_event("s", &second, b"abcdefghij", &flipped(b"abcdefghij"))
            .await
            .unwrap(),
        Swap::Swapped
    );
    assert_eq!(store.stats().await.unwrap(), before);
    store.close().await.unwrap();

    let store = open(dir.path(), options).await;
    let events: Vec<_> = store
        .replay_events_after(&first.to_string())
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].id, second);
    assert_eq!(events[0].data[..], flipped(b"abcdefghij")[..]);
    assert_eq!(events[0].retry, Some(Duration::from_millis(700)));
    assert_eq!(store.stats().await.unwrap(), before);
    // Two more events of 10 bytes: the first one goes, as it would have.
    store
        .store_event("s", NewEvent::new(b"klmnopqrst"))
        .await
        .unwrap();
    store
        .store_event("s", NewEvent::new(b"uvwxyz0123"))
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.events, stats.bytes), (3, 30), "{stats:?}");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_session_is_purged_at_its_time_and_old_keys_are_not_listed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let options = SledOptions::default().store(test_options(&clock));
    let store = open(dir.path(), options.clone()).await;
    store
        .put_session("short", b"state", Duration::from_secs(10))
        .await
        .unwrap();
    store.close().await.unwrap();
    {
        // Sessions as a release from before digests keyed them (by the id
        // itself), one of them looking like a digest's key.
        let db = raw_open(dir.path());
        let sessions = db.open_tree(SESSIONS).unwrap();
        let mut value = u64::MAX.to_be_bytes().to_vec();
        value.extend_from_slice(b"old");
        for key in ["legacy-session", "s1.not-a-digest", "zzz"] {
            sessions.insert(key, value.clone()).unwrap();
        }
        db.flush().unwrap();
    }

    let store = open(dir.path(), options).await;
    let page = rewriter(&store).session_values(None, 10).await.unwrap();
    let digest = SessionDigest::of("short");
    assert_eq!(
        page.sessions
            .iter()
            .map(|s| (s.digest, s.state.to_vec()))
            .collect::<Vec<_>>(),
        vec![(digest, b"state".to_vec())]
    );
    assert_eq!(page.next, None);
    assert_eq!(
        rewriter(&store)
            .swap_session(&digest, b"state", b"STATE")
            .await
            .unwrap(),
        Swap::Swapped
    );
    clock.advance(Duration::from_secs(11));
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.sessions, 1, "{report:?}");
    assert!(
        rewriter(&store)
            .session_values(None, 10)
            .await
            .unwrap()
            .sessions
            .is_empty()
    );
    store.close().await.unwrap();
}

/// Each worker step swaps its new value over the whole value it read: a
/// step that read before a swap fails and reads again, so every swap over
/// the bytes the previous one wrote finds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_never_writes_back_what_a_swap_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let clock = test_clock();
    let store = open(
        dir.path(),
        SledOptions::default().store(test_options(&clock)),
    )
    .await;
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let (task, _) = store
        .create(NewTask::new(&owner, me).takeover(3))
        .await
        .unwrap();
    let applied = store
        .apply(&task, me, WorkerChange::Checkpoint(b"{\"step\":1}"))
        .await
        .unwrap();
    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");

    let worker = async {
        for i in 0..300 {
            let message = format!("step {i}");
            let applied = store
                .apply(&task, me, WorkerChange::SetMessage(Some(&message)))
                .await
                .unwrap();
            assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
        }
    };
    let swapper = async {
        let mut current = b"{\"step\":1}".to_vec();
        for i in 0..300 {
            let new = flipped(&current);
            assert_eq!(
                rewriter(&store)
                    .swap_task(&task.digest(), &TaskField::Checkpoint, &current, &new)
                    .await
                    .unwrap(),
                Swap::Swapped,
                "swap {i}: a step wrote back the bytes an earlier swap replaced"
            );
            current = new;
        }
        current
    };
    let ((), last) = tokio::join!(worker, swapper);
    let page = rewriter(&store).task_values(None, 10).await.unwrap();
    let checkpoint = page.tasks[0]
        .values
        .iter()
        .find(|v| v.field == TaskField::Checkpoint)
        .unwrap();
    assert_eq!(checkpoint.bytes[..], last[..]);
    store.close().await.unwrap();
}
