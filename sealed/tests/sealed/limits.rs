//! The limits through the decorator: exact in plaintext bytes, and the
//! sizes the store reports and retention counts are the sealed ones.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::task::{
    InstanceId, MAX_CHECKPOINT_BYTES, MAX_CONTEXT_BYTES, MAX_INPUT_BYTES, NewTask, Owner,
    RuntimeStore, TaskStore, WorkerChange,
};
use mcp_event_store_core::{
    Error, EventStore, MemoryStore, NewEvent, Retention, SessionStore, StoreOptions,
};
use mcp_event_store_sealed::{KEY_BYTES, KeyId, KeyRing, OVERHEAD, Sealed, headroom};

const HOUR: Duration = Duration::from_secs(3600);

fn sealed(options: StoreOptions) -> (Arc<MemoryStore>, Sealed<MemoryStore>) {
    let plain = Arc::new(MemoryStore::with_options(options));
    let keys = KeyRing::new(KeyId(1), &[1; KEY_BYTES]).unwrap();
    (plain.clone(), Sealed::new(plain, keys))
}

fn assert_too_large<T: std::fmt::Debug>(result: Result<T, Error>, size: usize, max: usize) {
    match result {
        Err(Error::PayloadTooLarge { size: s, max: m }) => assert_eq!((s, m), (size, max)),
        other => panic!("expected PayloadTooLarge {{ {size}, {max} }}, got {other:?}"),
    }
}

/// Without headroom the plaintext limit is the store's less the
/// envelope; with it, the store's as configured. Refusals store nothing.
#[tokio::test]
async fn event_and_session_limits_are_exact_in_plaintext_bytes() {
    for (options, limit) in [
        (
            StoreOptions::default().max_payload_bytes(1_000),
            1_000 - OVERHEAD,
        ),
        (
            headroom(StoreOptions::default().max_payload_bytes(1_000)),
            1_000,
        ),
    ] {
        let (plain, store) = sealed(options);
        store
            .store_event("s", NewEvent::new(&vec![1; limit]))
            .await
            .unwrap();
        assert_too_large(
            store
                .store_event("s", NewEvent::new(&vec![2; limit + 1]))
                .await,
            limit + 1,
            limit,
        );
        assert_eq!(
            plain.stats().await.unwrap().events,
            1,
            "the refusal stored nothing"
        );
        store.put_session("a", &vec![1; limit], HOUR).await.unwrap();
        assert_too_large(
            store.put_session("a", &vec![2; limit + 1], HOUR).await,
            limit + 1,
            limit,
        );
        assert_eq!(
            store.get_session("a").await.unwrap().unwrap(),
            vec![1; limit]
        );
    }
}

/// The fixed task limits (1 MiB each, set in core) hold for the sealed
/// value, so through the decorator each is `OVERHEAD` less, exactly; the
/// outcome follows the store's payload limit, so headroom keeps it.
#[tokio::test]
async fn task_limits_are_the_fixed_limits_less_the_envelope() {
    let (_, store) = sealed(headroom(StoreOptions::default().max_payload_bytes(4_096)));
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, HOUR).await.unwrap();
    let owner = Owner::Anonymous;
    let context = MAX_CONTEXT_BYTES - OVERHEAD;
    assert_too_large(
        store
            .create(
                NewTask::new(&owner, me)
                    .context(&vec![1; context + 1])
                    .takeover(2),
            )
            .await,
        context + 1,
        context,
    );
    let (id, _) = store
        .create(
            NewTask::new(&owner, me)
                .context(&vec![1; context])
                .takeover(2),
        )
        .await
        .unwrap();
    let before = store.view(&id).await.unwrap().unwrap();
    let input = MAX_INPUT_BYTES - OVERHEAD;
    let checkpoint = MAX_CHECKPOINT_BYTES - OVERHEAD;
    for (change, size, max) in [
        (
            WorkerChange::SetContext(&vec![2; context + 1]),
            context + 1,
            context,
        ),
        (
            WorkerChange::Checkpoint(&vec![2; checkpoint + 1]),
            checkpoint + 1,
            checkpoint,
        ),
        (
            WorkerChange::RequestInput {
                key: "k",
                request: &vec![2; input + 1],
            },
            input + 1,
            input,
        ),
        (
            WorkerChange::Finish(mcp_event_store_core::task::Finish::Completed(&[2; 4_097])),
            4_097,
            4_096,
        ),
    ] {
        assert_too_large(store.apply(&id, me, change).await, size, max);
    }
    assert_eq!(
        store.view(&id).await.unwrap().unwrap(),
        before,
        "a refusal changed the task"
    );
    for change in [
        WorkerChange::SetContext(&vec![3; context]),
        WorkerChange::Checkpoint(&vec![3; checkpoint]),
        WorkerChange::RequestInput {
            key: "k",
            request: &vec![3; input],
        },
    ] {
        store.apply(&id, me, change).await.unwrap();
    }
    let text = id.to_string();
    assert_too_large(
        store
            .answer(&text, &owner, &[("k", &vec![4; input + 1])])
            .await,
        input + 1,
        input,
    );
    store
        .answer(&text, &owner, &[("k", &vec![4; input])])
        .await
        .unwrap();
    let view = store.view(&id).await.unwrap().unwrap();
    assert_eq!(view.answers[0].1.len(), input);
    assert_eq!(view.record.context.unwrap().len(), context);
    // A status message is not sealed: its limit is unchanged.
    let message = "m".repeat(mcp_event_store_core::task::MAX_MESSAGE_BYTES);
    store
        .apply(&id, me, WorkerChange::SetMessage(Some(&message)))
        .await
        .unwrap();
}

/// Stats, listings and retention's byte limit count what the store holds:
/// each event's data and its envelope.
#[tokio::test]
async fn sizes_and_the_byte_limit_count_sealed_bytes() {
    let retention = Retention::unbounded().max_bytes_per_stream(1_000);
    let (_, store) = sealed(StoreOptions::default().retention(retention));
    for i in 0..10u8 {
        store
            .store_event("s", NewEvent::new(&[i; 100]))
            .await
            .unwrap();
    }
    store.purge_expired().await.unwrap();
    let kept: Vec<_> = store
        .replay_stream("s")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    // 6 × 145 = 870 fit in 1,000 bytes; 7 × 145 = 1,015 do not.
    assert_eq!(kept.len(), 6);
    assert_eq!(&kept[0].data[..], &[4; 100][..]);
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.bytes, 6 * (100 + OVERHEAD as u64));
    let page = store.list_streams(None, 10).await.unwrap();
    assert_eq!(page.streams[0].bytes, stats.bytes);
}
