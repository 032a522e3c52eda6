//! Rotation: values re-sealed under the current key while servers write,
//! on the memory store and on every backend compiled into the facade.
//!
//! Each case writes through a decorator under key 1, rotates to key 2
//! ([`reseal`] with the ring `2, 1`), and then reads everything through a
//! decorator that holds key 2 alone: what opens there is what the old key
//! no longer guards. Where the backend keeps events in an append-only log
//! (Redis, NATS), the events are counted as left for retention instead.

use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_conformance::tasks::TaskHarness;
use mcp_event_store_core::task::{
    Applied, Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskId, TaskStore, WorkerChange,
};
use mcp_event_store_core::{NewEvent, SessionStore, Store, StoreOptions};
use mcp_event_store_sealed::rotate::{RotateOptions, reseal};
use mcp_event_store_sealed::scan::{ScanOptions, key_usage};
use mcp_event_store_sealed::{KEY_BYTES, KeyId, KeyRing, Sealed, headroom};

const HOUR: Duration = Duration::from_secs(3600);

fn key(byte: u8) -> [u8; KEY_BYTES] {
    [byte; KEY_BYTES]
}

fn old_ring() -> KeyRing {
    KeyRing::new(KeyId(1), &key(1)).unwrap()
}

fn rotating_ring() -> KeyRing {
    KeyRing::new(KeyId(2), &key(2))
        .unwrap()
        .with_old_key(KeyId(1), &key(1))
        .unwrap()
}

fn new_ring() -> KeyRing {
    KeyRing::new(KeyId(2), &key(2)).unwrap()
}

/// A store of the harness's storage, shared.
async fn open<H: TaskHarness>(h: &H) -> Arc<H::Store> {
    Arc::new(h.open(headroom(StoreOptions::default())).await)
}

/// What was written before the rotation: the ids to read it back by.
struct Written {
    sessions: Vec<String>,
    streams: Vec<String>,
    running: (TaskId, InstanceId),
    done: TaskId,
}

const EVENTS_PER_STREAM: usize = 4;

async fn write_everything<S: Store + RuntimeStore + ?Sized>(store: &S) -> Written {
    let sessions: Vec<String> = (0..3).map(|i| format!("session-{i}")).collect();
    for id in &sessions {
        store
            .put_session(id, format!("state of {id}").as_bytes(), HOUR)
            .await
            .unwrap();
    }
    let streams: Vec<String> = (0..2).map(|i| format!("call-{i}")).collect();
    for stream in &streams {
        for n in 0..EVENTS_PER_STREAM {
            store
                .store_event(stream, NewEvent::new(format!("{stream} #{n}").as_bytes()))
                .await
                .unwrap();
        }
    }
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, HOUR).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let (running, _) = store
        .create(
            NewTask::new(&owner, me)
                .context(b"{\"tool\":\"count\"}")
                .takeover(3),
        )
        .await
        .unwrap();
    for change in [
        WorkerChange::Checkpoint(b"{\"step\":1}"),
        WorkerChange::RequestInput {
            key: "asked",
            request: b"{\"q\":1}",
        },
        WorkerChange::RequestInput {
            key: "answered",
            request: b"{\"q\":2}",
        },
    ] {
        assert!(matches!(
            store.apply(&running, me, change).await.unwrap(),
            Applied::Changed { .. }
        ));
    }
    store
        .answer(&running.to_string(), &owner, &[("answered", b"\"yes\"")])
        .await
        .unwrap()
        .unwrap();
    let (done, _) = store
        .create(NewTask::new(&owner, me).context(b"{\"tool\":\"echo\"}"))
        .await
        .unwrap();
    store
        .apply(
            &done,
            me,
            WorkerChange::Finish(Finish::Completed(b"{\"content\":[]}")),
        )
        .await
        .unwrap();
    Written {
        sessions,
        streams,
        running: (running, me),
        done,
    }
}

/// Reads back everything written, through `store`.
async fn read_everything<S: Store + RuntimeStore + ?Sized>(
    store: &S,
    written: &Written,
    events_too: bool,
) {
    for id in &written.sessions {
        assert_eq!(
            store.get_session(id).await.unwrap().as_deref(),
            Some(format!("state of {id}").as_bytes()),
            "session {id}"
        );
    }
    if events_too {
        for stream in &written.streams {
            let events: Vec<_> = store
                .replay_stream(stream)
                .await
                .unwrap()
                .events
                .try_collect()
                .await
                .unwrap();
            assert_eq!(events.len(), EVENTS_PER_STREAM);
            assert_eq!(&events[1].data[..], format!("{stream} #1").as_bytes());
        }
    }
    let owner = Owner::principal(b"alice").unwrap();
    let (running, me) = &written.running;
    let record = store
        .get(&running.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.context.as_deref(),
        Some(&b"{\"tool\":\"count\"}"[..])
    );
    assert_eq!(
        record.takeover.unwrap().checkpoint.as_deref(),
        Some(&b"{\"step\":1}"[..])
    );
    assert_eq!(record.outstanding[0].1.as_ref(), b"{\"q\":1}");
    let done = store
        .get(&written.done.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.outcome.as_deref(), Some(&b"{\"content\":[]}"[..]));
    match store
        .apply(running, *me, WorkerChange::TakeAnswer { key: "answered" })
        .await
        .unwrap()
    {
        Applied::Changed { answer, .. } => {
            assert_eq!(answer.as_deref(), Some(&b"\"yes\""[..]));
        }
        other => panic!("take the answer: {other:?}"),
    }
}

/// Every value written under key 1 is re-sealed under key 2, and the
/// ring without key 1 reads it all; key 1 is then in use nowhere (events
/// of an append-only log excepted, counted as left); a second run finds
/// everything current.
pub async fn a_rewrite_reseals_every_value<H>(h: &H)
where
    H: TaskHarness,
    H::Store: Store,
{
    let plain = open(h).await;
    let written = write_everything(&Sealed::new(plain.clone(), old_ring())).await;

    let before = key_usage(&*plain, &ScanOptions::default()).await.unwrap();
    let one = before.keys[&KeyId(1)];
    assert_eq!(one.sessions, 3);
    assert_eq!(one.events, (2 * EVENTS_PER_STREAM) as u64);
    assert!(one.task_values >= 6, "{before:?}");

    let options = RotateOptions::default().batch(2);
    let report = reseal(&*plain, &rotating_ring(), &options).await.unwrap();
    assert_eq!(report.sessions.resealed, 3, "{report:?}");
    assert_eq!(report.tasks.resealed, one.task_values, "{report:?}");
    assert_eq!(report.tasks.not_sealed + report.tasks.unreadable, 0);
    let in_place = report.events_in_place;
    if in_place {
        assert_eq!(report.events.resealed, one.events, "{report:?}");
    } else {
        assert_eq!(report.events_left, one.events, "{report:?}");
    }

    let after = key_usage(&*plain, &ScanOptions::default()).await.unwrap();
    let left = after.keys.get(&KeyId(1)).copied().unwrap_or_default();
    assert_eq!((left.sessions, left.task_values), (0, 0), "{after:?}");
    assert_eq!(left.events, if in_place { 0 } else { one.events });
    read_everything(&Sealed::new(plain.clone(), new_ring()), &written, in_place).await;

    let again = reseal(&*plain, &rotating_ring(), &options).await.unwrap();
    assert_eq!(
        (
            again.sessions.resealed,
            again.tasks.resealed,
            again.events.resealed
        ),
        (0, 0, 0),
        "{again:?}"
    );
    assert_eq!(again.sessions.current, 3);
}

/// Servers keep writing while the rewrite runs, as in a rolling restart:
/// each session put again and each task's checkpoint saved again, round
/// after round, by an instance on the old ring (odd rounds, under key 1)
/// and one on the new ring (even rounds, under key 2). Every value ends as
/// its server last wrote it (a rewrite that swapped without checking would
/// put an older state back), and, after a last run, everything is under
/// key 2.
pub async fn a_rewrite_loses_no_concurrent_write<H>(h: &H)
where
    H: TaskHarness,
    H::Store: Store,
{
    const SESSIONS: usize = 24;
    const ROUNDS: usize = 12;
    let plain = open(h).await;
    let old = Sealed::new(plain.clone(), old_ring());
    let ids: Vec<String> = (0..SESSIONS).map(|i| format!("busy-{i}")).collect();
    for id in &ids {
        old.put_session(id, b"round 000", HOUR).await.unwrap();
    }
    let me = InstanceId::generate().unwrap();
    assert!(old.heartbeat(me, HOUR).await.unwrap());
    let owner = Owner::principal(b"alice").unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (task, _) = old
            .create(NewTask::new(&owner, me).takeover(2))
            .await
            .unwrap();
        old.apply(&task, me, WorkerChange::Checkpoint(b"round 000"))
            .await
            .unwrap();
        tasks.push(task);
    }

    let new = Sealed::new(plain.clone(), rotating_ring());
    let writer = {
        let (old, new, ids, tasks) = (old.clone(), new.clone(), ids.clone(), tasks.clone());
        tokio::spawn(async move {
            for round in 1..=ROUNDS {
                let state = format!("round {round:03}");
                let server = if round % 2 == 1 { &old } else { &new };
                for id in &ids {
                    server
                        .put_session(id, state.as_bytes(), HOUR)
                        .await
                        .unwrap();
                }
                for task in &tasks {
                    let applied = server
                        .apply(task, me, WorkerChange::Checkpoint(state.as_bytes()))
                        .await
                        .unwrap();
                    assert!(matches!(applied, Applied::Changed { .. }), "{applied:?}");
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut runs = Vec::new();
    while !writer.is_finished() {
        runs.push(
            reseal(
                &*plain,
                &rotating_ring(),
                &RotateOptions::default().batch(3),
            )
            .await
            .unwrap(),
        );
    }
    writer.await.unwrap();
    runs.push(
        reseal(&*plain, &rotating_ring(), &RotateOptions::default())
            .await
            .unwrap(),
    );

    let last = format!("round {ROUNDS:03}");
    let reader = Sealed::new(plain.clone(), new_ring());
    for id in &ids {
        assert_eq!(
            reader.get_session(id).await.unwrap().as_deref(),
            Some(last.as_bytes()),
            "session {id} after {} runs",
            runs.len()
        );
    }
    for task in &tasks {
        let record = reader
            .get(&task.to_string(), &owner)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            record.takeover.unwrap().checkpoint.as_deref(),
            Some(last.as_bytes()),
            "task {task}"
        );
    }
    let usage = key_usage(&*plain, &ScanOptions::default()).await.unwrap();
    assert!(!usage.keys.contains_key(&KeyId(1)), "{usage:?}");
}

/// A ring without the key a value was sealed under: the rewrite counts
/// the value unreadable, leaves it exactly as it was, and goes on.
pub async fn a_value_the_ring_cannot_open_is_left_alone<H>(h: &H)
where
    H: TaskHarness,
    H::Store: Store,
{
    let plain = open(h).await;
    let old = Sealed::new(plain.clone(), old_ring());
    old.put_session("kept", b"under key 1", HOUR).await.unwrap();
    let lacking = KeyRing::new(KeyId(3), &key(3))
        .unwrap()
        .with_old_key(KeyId(2), &key(2))
        .unwrap();
    let report = reseal(&*plain, &lacking, &RotateOptions::default())
        .await
        .unwrap();
    assert_eq!(report.sessions.unreadable, 1, "{report:?}");
    assert_eq!(report.sessions.resealed, 0);
    assert_eq!(
        old.get_session("kept").await.unwrap().as_deref(),
        Some(&b"under key 1"[..])
    );
}

macro_rules! rotation_cases {
    ($harness:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_rewrite_reseals_every_value() {
            let harness = $harness.await;
            crate::rotation::a_rewrite_reseals_every_value(&harness).await;
            mcp_event_store_conformance::tasks::TaskHarness::teardown(harness).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_rewrite_loses_no_concurrent_write() {
            let harness = $harness.await;
            crate::rotation::a_rewrite_loses_no_concurrent_write(&harness).await;
            mcp_event_store_conformance::tasks::TaskHarness::teardown(harness).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_value_the_ring_cannot_open_is_left_alone() {
            let harness = $harness.await;
            crate::rotation::a_value_the_ring_cannot_open_is_left_alone(&harness).await;
            mcp_event_store_conformance::tasks::TaskHarness::teardown(harness).await;
        }
    };
}

mod memory {
    use mcp_event_store_conformance::MemoryHarness;

    rotation_cases!(MemoryHarness::new());
}

macro_rules! backend_rotation {
    ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
        mod $backend {
            use mcp_event_store::testing::bench::Kit;

            rotation_cases!(<$kit as Kit>::task_harness());
        }
    };
}

mcp_event_store::for_each_backend!(backend_rotation);
