//! What the store holds, and every way a stored value can fail to open:
//! a clear error for that value, never a panic, nothing else damaged.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use mcp_event_store_core::bus::{Bus, Start, Topic};
use mcp_event_store_core::task::{
    Finish, InstanceId, NewTask, Owner, RuntimeStore, TaskId, TaskStore, WorkerChange,
};
use mcp_event_store_core::{
    Error, EventId, EventStore, MemoryStore, NewEvent, SessionStore, Store, StoredEvent,
};
use mcp_event_store_sealed::{KEY_BYTES, KeyId, KeyRing, OVERHEAD, Sealed, Shape, shape};

const HOUR: Duration = Duration::from_secs(3600);

fn ring(id: u32, byte: u8) -> KeyRing {
    KeyRing::new(KeyId(id), &[byte; KEY_BYTES]).unwrap()
}

/// A memory store, and the decorator over it under key 1.
fn stores() -> (Arc<MemoryStore>, Sealed<MemoryStore>) {
    let plain = Arc::new(MemoryStore::new());
    let sealed = Sealed::new(plain.clone(), ring(1, 1));
    (plain, sealed)
}

async fn events<S: EventStore + ?Sized>(
    store: &S,
    stream: &str,
) -> Result<Vec<StoredEvent>, Error> {
    store
        .replay_stream(stream)
        .await?
        .events
        .try_collect()
        .await
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn assert_error(result: Result<impl std::fmt::Debug, Error>, kind: &str, says: &str) {
    match result {
        Err(error) => {
            assert_eq!(error.kind(), kind, "{error}");
            assert!(error.to_string().contains(says), "{error}");
        }
        Ok(value) => panic!("expected a {kind} error saying {says:?}, got {value:?}"),
    }
}

#[tokio::test]
async fn the_store_holds_envelopes_and_readers_see_plaintext() {
    let (plain, sealed) = stores();
    let secret = br#"{"arguments":{"password":"hunter2"}}"#;
    sealed
        .store_event("s", NewEvent::new(secret))
        .await
        .unwrap();
    // A priming event: empty data, sealed too, replayed empty with its hint.
    let priming = NewEvent::priming(Duration::from_millis(1500));
    sealed.store_event("s", priming).await.unwrap();
    sealed.put_session("session-1", secret, HOUR).await.unwrap();

    let raw = events(&*plain, "s").await.unwrap();
    assert_eq!(raw[0].data.len(), secret.len() + OVERHEAD);
    assert!(!contains(&raw[0].data, b"hunter2"));
    assert_eq!(raw[1].data.len(), OVERHEAD, "an empty value is sealed too");
    assert_eq!(shape(&raw[1].data), Shape::Sealed(KeyId(1)));
    let stored = plain.get_session("session-1").await.unwrap().unwrap();
    assert!(!contains(&stored, b"hunter2"));

    let read = events(&sealed, "s").await.unwrap();
    assert_eq!(&read[0].data[..], secret);
    assert!(read[1].data.is_empty());
    assert_eq!(read[1].retry, Some(Duration::from_millis(1500)));
    assert_eq!(read[0].id, raw[0].id, "ids pass through");
    let state = sealed.get_session("session-1").await.unwrap().unwrap();
    assert_eq!(&state[..], secret);
}

#[tokio::test]
async fn every_task_value_is_sealed_and_reads_back() {
    let (plain, sealed) = stores();
    let me = InstanceId::generate().unwrap();
    sealed.heartbeat(me, HOUR).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let task = NewTask::new(&owner, me).context(b"ctx-secret").takeover(2);
    let (id, created) = sealed.create(task).await.unwrap();
    assert_eq!(created.context.as_deref(), Some(&b"ctx-secret"[..]));
    let ask = WorkerChange::RequestInput {
        key: "k",
        request: b"request-secret",
    };
    sealed.apply(&id, me, ask).await.unwrap();
    sealed
        .apply(&id, me, WorkerChange::Checkpoint(b"checkpoint-secret"))
        .await
        .unwrap();
    let record = sealed
        .answer(&id.to_string(), &owner, &[("k", b"answer-secret")])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.answered, ["k"]);
    let view = sealed.view(&id).await.unwrap().unwrap();
    assert_eq!(
        view.answers,
        [("k".to_owned(), Bytes::from_static(b"answer-secret"))]
    );
    assert_eq!(
        view.record.takeover.unwrap().checkpoint.as_deref(),
        Some(&b"checkpoint-secret"[..])
    );

    // Underneath, none of it in plaintext.
    let raw = plain.view(&id).await.unwrap().unwrap();
    let mut held: Vec<Bytes> = vec![raw.record.context.clone().unwrap()];
    held.extend(raw.answers.iter().map(|(_, a)| a.clone()));
    held.extend(raw.record.takeover.unwrap().checkpoint);
    for value in &held {
        assert_eq!(shape(value), Shape::Sealed(KeyId(1)));
        assert!(!contains(value, b"secret"));
    }

    let taken = sealed
        .apply(&id, me, WorkerChange::TakeAnswer { key: "k" })
        .await
        .unwrap();
    assert!(matches!(
        taken,
        mcp_event_store_core::task::Applied::Changed { answer: Some(a), .. } if &a[..] == b"answer-secret"
    ));
    sealed
        .apply(
            &id,
            me,
            WorkerChange::Finish(Finish::Completed(b"result-secret")),
        )
        .await
        .unwrap();
    let done = sealed.get(&id.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(done.outcome.as_deref(), Some(&b"result-secret"[..]));
    let raw = plain.get(&id.to_string(), &owner).await.unwrap().unwrap();
    assert!(!contains(raw.outcome.as_deref().unwrap(), b"secret"));
}

/// The errors an event read can meet, each on a stream of its own beside a
/// stream that reads on unharmed.
#[tokio::test]
async fn damaged_events_are_clear_errors_and_harm_nothing_else() {
    let (plain, sealed) = stores();
    sealed
        .store_event("good", NewEvent::new(b"fine"))
        .await
        .unwrap();
    sealed
        .store_event("other", NewEvent::new(b"o"))
        .await
        .unwrap();
    let other = events(&*plain, "other").await.unwrap().remove(0).data;

    let mut tampered = other.to_vec();
    tampered[OVERHEAD - 20] ^= 0x40;
    let under_nine = Sealed::new(plain.clone(), ring(9, 1));
    under_nine
        .store_event("unknown-key", NewEvent::new(b"x"))
        .await
        .unwrap();
    let wrong_key = Sealed::new(plain.clone(), ring(1, 7));
    wrong_key
        .store_event("wrong-key", NewEvent::new(b"x"))
        .await
        .unwrap();
    for (stream, raw) in [
        ("plaintext", &br#"{"jsonrpc":"2.0"}"#[..]),
        ("truncated", &other[..OVERHEAD - 1]),
        ("tampered", &tampered[..]),
        // Another stream's event, copied here.
        ("swapped", &other[..]),
    ] {
        plain.store_event(stream, NewEvent::new(raw)).await.unwrap();
    }
    for (stream, kind, says) in [
        ("plaintext", "corrupt", "not sealed"),
        ("truncated", "corrupt", "truncated"),
        ("tampered", "corrupt", "fails authentication under key id 1"),
        ("swapped", "corrupt", "fails authentication"),
        (
            "wrong-key",
            "corrupt",
            "fails authentication under key id 1",
        ),
        ("unknown-key", "config", "key id 9"),
    ] {
        assert_error(events(&sealed, stream).await, kind, says);
    }
    assert_eq!(&events(&sealed, "good").await.unwrap()[0].data[..], b"fine");
    assert_eq!(&events(&sealed, "other").await.unwrap()[0].data[..], b"o");
}

/// A replay ends at the first event that fails to open (no silent gap);
/// what comes before it reads, and a replay resumed after it reads the rest.
#[tokio::test]
async fn a_replay_ends_at_a_damaged_event_and_resumes_after_it() {
    let (plain, sealed) = stores();
    let start = sealed.store_event("s", NewEvent::new(b"1")).await.unwrap();
    sealed.store_event("s", NewEvent::new(b"2")).await.unwrap();
    let bad: EventId = plain
        .store_event("s", NewEvent::new(b"plain"))
        .await
        .unwrap();
    sealed.store_event("s", NewEvent::new(b"4")).await.unwrap();
    let mut replay = sealed
        .replay_events_after(&start.to_string())
        .await
        .unwrap()
        .events;
    assert_eq!(&replay.next().await.unwrap().unwrap().data[..], b"2");
    assert_eq!(replay.next().await.unwrap().unwrap_err().kind(), "corrupt");
    assert!(replay.next().await.is_none(), "the replay went on past it");
    let rest: Vec<_> = sealed
        .replay_events_after(&bad.to_string())
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(&rest[0].data[..], b"4");
}

#[tokio::test]
async fn damaged_sessions_are_clear_errors_and_harm_nothing_else() {
    let (plain, sealed) = stores();
    sealed.put_session("a", b"state-a", HOUR).await.unwrap();
    let a = plain.get_session("a").await.unwrap().unwrap();
    let mut tampered = a.to_vec();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    Sealed::new(plain.clone(), ring(1, 7))
        .put_session("id-wrong-key", b"x", HOUR)
        .await
        .unwrap();
    Sealed::new(plain.clone(), ring(4, 1))
        .put_session("id-unknown-key", b"x", HOUR)
        .await
        .unwrap();
    for (session, raw) in [
        ("id-plaintext", &b"{}"[..]),
        ("id-truncated", &a[..10]),
        ("id-tampered", &tampered[..]),
        ("id-swapped", &a[..]),
    ] {
        plain.put_session(session, raw, HOUR).await.unwrap();
    }
    for (session, kind, says) in [
        (
            "id-plaintext",
            "corrupt",
            "a session's state read through the sealing decorator is not sealed",
        ),
        ("id-truncated", "corrupt", "truncated"),
        ("id-tampered", "corrupt", "fails authentication"),
        ("id-swapped", "corrupt", "fails authentication"),
        ("id-wrong-key", "corrupt", "fails authentication"),
        ("id-unknown-key", "config", "key id 4"),
    ] {
        let read = sealed.get_session(session).await;
        assert_error(read, kind, says);
        // The message never names the session (its id is a credential).
        let message = sealed.get_session(session).await.unwrap_err().to_string();
        assert!(!message.contains(session), "{message}");
    }
    assert_eq!(
        &sealed.get_session("a").await.unwrap().unwrap()[..],
        b"state-a"
    );
}

#[tokio::test]
async fn task_values_moved_or_damaged_are_refused_and_harm_nothing_else() {
    let (plain, sealed) = stores();
    let me = InstanceId::generate().unwrap();
    sealed.heartbeat(me, HOUR).await.unwrap();
    let owner = Owner::Anonymous;
    let create = |context: &'static [u8]| {
        let sealed = sealed.clone();
        async move {
            sealed
                .create(NewTask::new(&Owner::Anonymous, me).context(context))
                .await
                .unwrap()
                .0
        }
    };
    let (a, b, c, d) = (
        create(b"a").await,
        create(b"b").await,
        create(b"c").await,
        create(b"d").await,
    );
    let raw_context = |id: TaskId| {
        let plain = plain.clone();
        async move {
            plain
                .view(&id)
                .await
                .unwrap()
                .unwrap()
                .record
                .context
                .unwrap()
        }
    };
    let a_context = raw_context(a).await;
    // Task a's context copied into task b.
    plain
        .apply(&b, me, WorkerChange::SetContext(&a_context))
        .await
        .unwrap();
    // Task a's context copied into task c's outcome (another field).
    plain
        .apply(&c, me, WorkerChange::Finish(Finish::Completed(&a_context)))
        .await
        .unwrap();
    // A request under key "k" copied under key "j" of the same task.
    sealed
        .apply(
            &d,
            me,
            WorkerChange::RequestInput {
                key: "k",
                request: b"r",
            },
        )
        .await
        .unwrap();
    let k = plain.view(&d).await.unwrap().unwrap().record.outstanding[0]
        .1
        .clone();
    plain
        .apply(
            &d,
            me,
            WorkerChange::RequestInput {
                key: "j",
                request: &k,
            },
        )
        .await
        .unwrap();
    for id in [b, c, d] {
        assert_error(
            sealed.get(&id.to_string(), &owner).await,
            "corrupt",
            "fails authentication",
        );
        assert_error(sealed.view(&id).await, "corrupt", "fails authentication");
    }
    // Task a reads on.
    let read = sealed.get(&a.to_string(), &owner).await.unwrap().unwrap();
    assert_eq!(read.context.as_deref(), Some(&b"a"[..]));
    // A plaintext context, written around the decorator.
    plain
        .apply(&a, me, WorkerChange::SetContext(b"{}"))
        .await
        .unwrap();
    assert_error(
        sealed.get(&a.to_string(), &owner).await,
        "corrupt",
        "a task's context",
    );
}

/// A claimed task whose values do not open is given back (not run, not
/// failed), and the other claims come through.
#[tokio::test]
async fn a_claimed_task_that_does_not_open_is_released() {
    let (plain, sealed) = stores();
    let me = InstanceId::generate().unwrap();
    sealed.heartbeat(me, HOUR).await.unwrap();
    let good = sealed
        .create(
            NewTask::new(&Owner::Anonymous, me)
                .context(b"run me")
                .queued(),
        )
        .await
        .unwrap()
        .0;
    let bad = plain
        .create(
            NewTask::new(&Owner::Anonymous, me)
                .context(b"plain")
                .queued(),
        )
        .await
        .unwrap()
        .0;
    let claimed = sealed.claim(me, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].task, good.digest());
    assert_eq!(
        claimed[0].view.record.context.as_deref(),
        Some(&b"run me"[..])
    );
    let left = plain.view(&bad).await.unwrap().unwrap().record;
    assert!(
        left.takeover.unwrap().released,
        "the unreadable task is given back"
    );
    assert!(!left.status.is_terminal());
}

/// A key carried forward in a replacement (T15) keeps its stored envelope,
/// even after a rotation: the store compares request bytes.
#[tokio::test]
async fn replacing_inputs_carries_a_request_forward_across_a_rotation() {
    let plain = Arc::new(MemoryStore::new());
    let old = Sealed::new(plain.clone(), ring(1, 1));
    let me = InstanceId::generate().unwrap();
    old.heartbeat(me, HOUR).await.unwrap();
    let (id, _) = old
        .create(NewTask::new(&Owner::Anonymous, me))
        .await
        .unwrap();
    let ask = WorkerChange::RequestInput {
        key: "k",
        request: b"r",
    };
    old.apply(&id, me, ask).await.unwrap();
    let rotated = Sealed::new(
        plain.clone(),
        ring(2, 2).with_old_key(KeyId(1), &[1; KEY_BYTES]).unwrap(),
    );
    let requests: &[(&str, &[u8])] = &[("k", b"r"), ("new", b"n")];
    let replace = WorkerChange::ReplaceInputs {
        requests,
        message: None,
    };
    let applied = rotated.apply(&id, me, replace).await.unwrap();
    assert!(
        matches!(applied, mcp_event_store_core::task::Applied::Changed { .. }),
        "{applied:?}"
    );
    let record = rotated.view(&id).await.unwrap().unwrap().record;
    assert_eq!(record.outstanding.len(), 2);
    let raw = plain.view(&id).await.unwrap().unwrap().record.outstanding;
    assert_eq!(
        shape(&raw[0].1),
        Shape::Sealed(KeyId(1)),
        "carried forward as stored"
    );
    assert_eq!(shape(&raw[1].1), Shape::Sealed(KeyId(2)));
    // Another request under a carried key is refused, as without sealing.
    let requests: &[(&str, &[u8])] = &[("k", b"other")];
    let replace = WorkerChange::ReplaceInputs {
        requests,
        message: None,
    };
    assert_eq!(
        rotated.apply(&id, me, replace).await.unwrap(),
        mcp_event_store_core::task::Applied::KeySpent
    );
}

/// Values sealed under an old key open after a rotation; new ones are
/// sealed under the new key; dropping the old key makes its values a clear
/// error.
#[tokio::test]
async fn rotation_reads_old_values_and_writes_under_the_new_key() {
    let plain = Arc::new(MemoryStore::new());
    Sealed::new(plain.clone(), ring(1, 1))
        .store_event("s", NewEvent::new(b"old"))
        .await
        .unwrap();
    let rotated = Sealed::new(
        plain.clone(),
        ring(2, 2).with_old_key(KeyId(1), &[1; KEY_BYTES]).unwrap(),
    );
    rotated
        .store_event("s", NewEvent::new(b"new"))
        .await
        .unwrap();
    let read = events(&rotated, "s").await.unwrap();
    assert_eq!(
        (&read[0].data[..], &read[1].data[..]),
        (&b"old"[..], &b"new"[..])
    );
    let raw = events(&*plain, "s").await.unwrap();
    assert_eq!(shape(&raw[1].data), Shape::Sealed(KeyId(2)));
    let without_old = Sealed::new(plain.clone(), ring(2, 2));
    assert_error(events(&without_old, "s").await, "config", "key id 1");
}

#[tokio::test]
async fn the_bus_over_the_decorator_is_sealed_and_bound_to_its_topic() {
    let (plain, sealed) = stores();
    let bus = sealed.bus();
    let topic = Topic::new("replies").unwrap();
    let mut subscription = bus.subscribe(&topic, Start::Now).await.unwrap();
    bus.publish(&topic, b"bus-secret").await.unwrap();
    let message = subscription.next().await.unwrap().unwrap();
    assert_eq!(&message.payload[..], b"bus-secret");
    let stream = "\u{1}bus/replies";
    let raw = events(&*plain, stream).await.unwrap();
    assert!(raw.iter().all(|e| !contains(&e.data, b"bus-secret")));
    // Copied to another topic: refused there.
    let other = Topic::new("other").unwrap();
    let mut elsewhere = bus.subscribe(&other, Start::Now).await.unwrap();
    plain
        .store_event("\u{1}bus/other", NewEvent::new(&raw.last().unwrap().data))
        .await
        .unwrap();
    assert_eq!(
        elsewhere.next().await.unwrap().unwrap_err().kind(),
        "corrupt"
    );
}

/// The decorator over `Arc<dyn Store>` (what `connect` hands out) is a
/// store itself.
#[tokio::test]
async fn the_decorator_wraps_a_dyn_store_and_is_one() {
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let store: Arc<dyn Store> = Arc::new(Sealed::new(inner, ring(1, 1)));
    let me = InstanceId::generate().unwrap();
    store.task_runtime().heartbeat(me, HOUR).await.unwrap();
    let (id, _) = store
        .create(NewTask::new(&Owner::Anonymous, me).context(b"c"))
        .await
        .unwrap();
    let read = store
        .get(&id.to_string(), &Owner::Anonymous)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.context.as_deref(), Some(&b"c"[..]));
    // Redemptions pass through to the store's (they hold digests only).
    let soon = std::time::SystemTime::now() + HOUR;
    let redeemer = store.redeemer().expect("the store's redemptions");
    let first = redeemer
        .redeem(b"n", soon, &Owner::Anonymous)
        .await
        .unwrap();
    assert!(first.is_first());
    let again = redeemer
        .redeem(b"n", soon, &Owner::Anonymous)
        .await
        .unwrap();
    assert!(!again.is_first());
    let report = store.check().await.unwrap();
    let sealed = report.settings.iter().find(|s| s.name == "sealed").unwrap();
    assert_eq!(
        sealed.value,
        "XChaCha20-Poly1305, current key 1, keys held 1"
    );
}

/// What the excluded suite cases check besides their fixed limits (T13,
/// T19): a context kept byte for byte across handles, replaced, kept past
/// the end, an empty one apart from none; the newest checkpoint, with the
/// context and every untaken answer, handed to the next claim.
#[tokio::test]
async fn context_and_checkpoint_keep_their_bytes_across_a_takeover() {
    let (plain, sealed) = stores();
    let other = Sealed::new(plain.clone(), ring(1, 1));
    let me = InstanceId::generate().unwrap();
    sealed.heartbeat(me, HOUR).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let context: &[u8] = b"{\"tool\":\"deploy\"}\0\xff\xfe";
    let (id, _) = sealed
        .create(NewTask::new(&owner, me).context(context).takeover(3))
        .await
        .unwrap();
    let text = id.to_string();
    let seen = other.get(&text, &owner).await.unwrap().unwrap();
    assert_eq!(seen.context.as_deref(), Some(context));
    sealed
        .apply(&id, me, WorkerChange::SetContext(b"second"))
        .await
        .unwrap();
    let checkpoint: &[u8] = b"step 4\0\xff\xfe";
    sealed
        .apply(&id, me, WorkerChange::Checkpoint(b"step 3"))
        .await
        .unwrap();
    sealed
        .apply(&id, me, WorkerChange::Checkpoint(checkpoint))
        .await
        .unwrap();
    let ask = WorkerChange::RequestInput {
        key: "name",
        request: b"{\"q\":1}",
    };
    sealed.apply(&id, me, ask).await.unwrap();
    sealed
        .answer(&text, &owner, &[("name", b"\"ada\"")])
        .await
        .unwrap();
    // The creator goes; another instance claims the task.
    sealed.retire(me).await.unwrap();
    let next = InstanceId::generate().unwrap();
    other.heartbeat(next, HOUR).await.unwrap();
    let claimed = other.claim(next, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let view = &claimed[0].view;
    assert_eq!(view.owner, owner);
    assert_eq!(view.record.context.as_deref(), Some(&b"second"[..]));
    let takeover = view.record.takeover.clone().unwrap();
    assert_eq!(takeover.checkpoint.as_deref(), Some(checkpoint));
    assert_eq!(
        view.answers,
        [("name".to_owned(), Bytes::from_static(b"\"ada\""))]
    );
    let digest = claimed[0].task;
    other
        .apply_claimed(
            &digest,
            claimed[0].worker,
            WorkerChange::Finish(Finish::Completed(b"{}")),
        )
        .await
        .unwrap();
    let done = sealed.get(&text, &owner).await.unwrap().unwrap();
    assert_eq!(
        done.context.as_deref(),
        Some(&b"second"[..]),
        "kept past the end"
    );

    let (none, _) = sealed.create(NewTask::new(&owner, next)).await.unwrap();
    let (empty, _) = sealed
        .create(NewTask::new(&owner, next).context(b""))
        .await
        .unwrap();
    assert_eq!(
        sealed
            .get(&none.to_string(), &owner)
            .await
            .unwrap()
            .unwrap()
            .context,
        None
    );
    let empty = sealed
        .get(&empty.to_string(), &owner)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        empty.context.as_deref(),
        Some(&b""[..]),
        "an empty context is not none"
    );
}
