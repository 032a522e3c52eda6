//! Values swapped in place (C22) as the buckets hold them, which the
//! conformance cases cannot see: a session's expiry in its value, spilled
//! values (new chunks, the old ones left for the purge), and a task's
//! key written by a worker and the rewriter at once.

use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use mcp_event_store_conformance::events::{Harness, test_clock, test_options};
use mcp_event_store_core::rewrite::{Swap, TaskField};
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskStore, WorkerChange,
};
use mcp_event_store_core::{EventStore, SessionDigest, SessionStore};
use mcp_event_store_nats::NatsOptions;
use mcp_event_store_nats::testing::NatsHarness;

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn flipped(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().map(|b| b ^ 0x5a).collect()
}

async fn jetstream(url: &str) -> async_nats::jetstream::Context {
    let (servers, _) = NatsOptions::default().servers(url).unwrap();
    async_nats::jetstream::new(async_nats::connect(servers.as_slice()).await.unwrap())
}

/// The one value of the bucket `<prefix>-<job>` under `key` (the only key
/// when `None`), with its revision.
async fn raw(h: &NatsHarness, job: &str, key: Option<&str>) -> (u64, Bytes) {
    let bucket = jetstream(h.url())
        .await
        .get_key_value(format!("{}-{job}", h.prefix()))
        .await
        .unwrap();
    let key = match key {
        Some(key) => key.to_owned(),
        None => {
            let keys: Vec<String> = bucket.keys().await.unwrap().try_collect().await.unwrap();
            assert_eq!(keys.len(), 1, "{keys:?}");
            keys[0].clone()
        }
    };
    let entry = bucket.entry(&key).await.unwrap().expect("the key is there");
    (entry.revision, entry.value)
}

/// How many spilled values the store holds.
async fn spilled(h: &NatsHarness) -> usize {
    let stream = jetstream(h.url())
        .await
        .get_stream(format!("{}-spill", h.prefix()))
        .await
        .unwrap();
    let subjects: Vec<_> = stream
        .info_with_subjects(format!("{}.sp.>", h.prefix()))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    subjects.len()
}

/// A session's expiry is in its value (the bucket has no age limit), and a
/// swap writes it back as read: the store computes the same expiry after
/// it, inline or spilled. A spilled state is swapped through new chunks;
/// the old ones stay until the purge finds them unreferenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_session_keeps_its_expiry() {
    let h = NatsHarness::new().await;
    let clock = test_clock();
    let store = Harness::open(&h, test_options(&clock)).await;
    let rewriter = store.rewriter().expect("a rewriter");
    let mut bucket = jetstream(h.url())
        .await
        .get_stream(format!("KV_{}-sessions", h.prefix()))
        .await
        .unwrap();
    assert_eq!(
        bucket.info().await.unwrap().config.max_age,
        Duration::ZERO,
        "no age limit: a rewrite's new message time cannot move an expiry"
    );

    store
        .put_session("short", b"state of short", Duration::from_secs(10))
        .await
        .unwrap();
    let (revision, before) = raw(&h, "sessions", None).await;
    clock.advance(Duration::from_secs(4));
    let digest = SessionDigest::of("short");
    let new = flipped(b"state of short");
    assert_eq!(
        rewriter
            .swap_session(&digest, b"state of short", &new)
            .await
            .unwrap(),
        Swap::Swapped
    );
    let (swapped, after) = raw(&h, "sessions", None).await;
    assert!(swapped > revision);
    assert_eq!(after[..8], before[..8], "the expiry as stored");
    assert_eq!(after.len(), before.len());
    assert_eq!(
        store.get_session("short").await.unwrap().as_deref(),
        Some(&new[..])
    );
    clock.advance(Duration::from_secs(6));
    assert_eq!(
        store.get_session("short").await.unwrap(),
        None,
        "gone at the expiry it had before the swap"
    );
    assert_eq!(store.purge_expired().await.unwrap().sessions, 1);

    // Larger than one message: the state is in chunks.
    let big = vec![7u8; 2 * 1024 * 1024 + 3];
    store
        .put_session("big", &big, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(spilled(&h).await, 1);
    let (_, before) = raw(&h, "sessions", None).await;
    let page = rewriter.session_values(None, 10).await.unwrap();
    assert_eq!(page.sessions.len(), 1);
    assert_eq!(page.sessions[0].state[..], big[..], "listed whole");
    let new = flipped(&big);
    assert_eq!(
        rewriter
            .swap_session(&SessionDigest::of("big"), &big, &new)
            .await
            .unwrap(),
        Swap::Swapped
    );
    assert_eq!(
        rewriter
            .swap_session(&SessionDigest::of("big"), &big, &new)
            .await
            .unwrap(),
        Swap::Changed
    );
    let (_, after) = raw(&h, "sessions", None).await;
    assert_eq!(after[..8], before[..8], "the expiry as stored");
    assert_ne!(after, before, "a reference to new chunks");
    assert_eq!(after.len(), before.len());
    assert_eq!(store.get_session("big").await.unwrap().unwrap(), new);
    assert_eq!(spilled(&h).await, 2, "the old chunks wait for the purge");
    clock.advance(Duration::from_secs(6 * 60));
    store.purge_expired().await.unwrap();
    assert_eq!(spilled(&h).await, 1);
    assert_eq!(store.get_session("big").await.unwrap().unwrap(), new);
    Harness::close(&h, store).await;
    h.teardown().await;
}

/// A task value too large for one message is swapped through new chunks
/// of the same count, the task's key by revision; the task reads the same
/// but for the value, and the old chunks go with the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_task_value_is_swapped() {
    let h = NatsHarness::new().await;
    let clock = test_clock();
    let store = Harness::open(&h, test_options(&clock)).await;
    let rewriter = store.rewriter().expect("a rewriter");
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let (id, _) = store
        .create(NewTask::new(&owner, me).context(b"{\"tool\":\"big\"}"))
        .await
        .unwrap();
    let outcome = vec![b'x'; 3 * 1024 * 1024 + 11];
    assert!(matches!(
        store
            .apply(&id, me, WorkerChange::Finish(Finish::Completed(&outcome)))
            .await
            .unwrap(),
        Applied::Changed { .. }
    ));
    let key: String = id
        .digest()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (revision, before) = raw(&h, "tasks", Some(&key)).await;
    assert_eq!(before[0], 0xff, "spilled: the key holds a reference");
    assert_eq!(spilled(&h).await, 1);
    let record = store.get(&id.to_string(), &owner).await.unwrap().unwrap();

    let page = rewriter.task_values(None, 10).await.unwrap();
    assert_eq!(page.tasks.len(), 1);
    let listed = page.tasks[0]
        .values
        .iter()
        .find(|v| v.field == TaskField::Outcome)
        .expect("the outcome is listed");
    assert_eq!(listed.bytes[..], outcome[..]);
    let new = flipped(&outcome);
    assert_eq!(
        rewriter
            .swap_task(&id.digest(), &TaskField::Outcome, &outcome, &new)
            .await
            .unwrap(),
        Swap::Swapped
    );
    let (swapped, after) = raw(&h, "tasks", Some(&key)).await;
    assert!(swapped > revision);
    assert_eq!(after[0], 0xff);
    assert_ne!(after[1..33], before[1..33], "new chunks, under a new id");
    assert_eq!(after[33..], before[33..], "of the same length and count");
    let now = store.get(&id.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(now.outcome.as_deref(), Some(&new[..]));
    assert_eq!(
        (now.rev, now.updated_at, now.status, now.context.clone()),
        (
            record.rev,
            record.updated_at,
            record.status,
            record.context.clone()
        ),
        "nothing but the value changed"
    );
    assert_eq!(spilled(&h).await, 2, "the old chunks wait for the purge");
    clock.advance(Duration::from_secs(6 * 60));
    store.purge_expired().await.unwrap();
    assert_eq!(spilled(&h).await, 1);
    let now = store.get(&id.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(now.outcome.as_deref(), Some(&new[..]));
    Harness::close(&h, store).await;
    h.teardown().await;
}

/// A worker writing a task while its context is swapped: each write that
/// loses the revision race runs again on what the other wrote, so every
/// swap lands (nothing else writes the context) and every checkpoint
/// does, and no write brings back bytes the other replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_and_the_rewriter_write_one_task_at_once() {
    let h = NatsHarness::new().await;
    let clock = test_clock();
    let store = Harness::open(&h, test_options(&clock)).await;
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let context = b"{\"tool\":\"count\",\"to\":3}".to_vec();
    let (id, _) = store
        .create(NewTask::new(&owner, me).context(&context).takeover(3))
        .await
        .unwrap();
    const ROUNDS: usize = 50;
    let worker = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..ROUNDS {
                let checkpoint = format!("{{\"step\":{i}}}");
                let applied = store
                    .apply(&id, me, WorkerChange::Checkpoint(checkpoint.as_bytes()))
                    .await
                    .unwrap();
                assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
            }
        })
    };
    let rewriter = store.rewriter().expect("a rewriter");
    let mut current = context.clone();
    for _ in 0..ROUNDS {
        let new = flipped(&current);
        assert_eq!(
            rewriter
                .swap_task(&id.digest(), &TaskField::Context, &current, &new)
                .await
                .unwrap(),
            Swap::Swapped,
            "a checkpoint written meanwhile left the context as read"
        );
        current = new;
    }
    worker.await.unwrap();
    let record = store.get(&id.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(record.context.as_deref(), Some(&current[..]));
    assert_eq!(
        record
            .takeover
            .as_ref()
            .and_then(|t| t.checkpoint.as_deref()),
        Some(format!("{{\"step\":{}}}", ROUNDS - 1).as_bytes())
    );
    Harness::close(&h, store).await;
    h.teardown().await;
}
