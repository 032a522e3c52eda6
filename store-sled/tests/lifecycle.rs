//! Opening, closing, format versions (C12), URLs and the relaxed-crash era.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::{Error, EventId, EventStore, NewEvent, Position, StoreOptions};
use mcp_event_store_sled::{Durability, FORMAT_VERSION, SledOptions, SledStore};

const META: &str = "mcp-event-store/meta";

async fn open(dir: &std::path::Path) -> mcp_event_store_core::Result<SledStore> {
    SledStore::open(dir, SledOptions::default()).await
}

/// Edits the metadata tree with sled directly, as another release would.
fn with_raw_meta(dir: &std::path::Path, edit: impl FnOnce(&sled::Tree)) {
    let db = sled::open(dir).unwrap();
    let meta = db.open_tree(META).unwrap();
    edit(&meta);
    db.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await.unwrap();
    let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    store.close().await.unwrap();

    with_raw_meta(dir.path(), |meta| {
        meta.insert("format_version", &(FORMAT_VERSION + 1).to_be_bytes())
            .unwrap();
        meta.insert("created_by", &b"mcp-event-store-sled 9.0.0"[..])
            .unwrap();
    });
    match open(dir.path()).await {
        Err(Error::IncompatibleFormat(message)) => {
            assert!(message.contains("format 2"), "{message}");
            assert!(message.contains("mcp-event-store-sled 9.0.0"), "{message}");
            assert!(message.contains("Upgrade"), "{message}");
        }
        other => panic!("expected IncompatibleFormat, got {other:?}"),
    }

    // Nothing was changed by the refused open: back to format 1, it works.
    with_raw_meta(dir.path(), |meta| {
        meta.insert("format_version", &FORMAT_VERSION.to_be_bytes())
            .unwrap();
    });
    let store = open(dir.path()).await.unwrap();
    assert_eq!(
        store
            .get_stream_id_for_event_id(&id.to_string())
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_sled_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sled::open(dir.path()).unwrap();
        db.insert("someone", "else's data").unwrap();
        db.flush().unwrap();
    }
    match open(dir.path()).await {
        Err(Error::IncompatibleFormat(message)) => {
            assert!(message.contains("did not write"), "{message}")
        }
        other => panic!("expected IncompatibleFormat, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_format_record_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).await.unwrap().close().await.unwrap();
    with_raw_meta(dir.path(), |meta| {
        meta.insert("format_version", &b"?"[..]).unwrap();
    });
    assert!(matches!(open(dir.path()).await, Err(Error::Corrupt(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_reopen_repeatedly_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut last: Option<EventId> = None;
    for round in 0..30u32 {
        let store = open(dir.path()).await.unwrap();
        let id = store
            .store_event("s", NewEvent::new(&round.to_be_bytes()))
            .await
            .unwrap();
        assert_eq!(id.position, Position::seq(u64::from(round) + 1));
        if let Some(last) = last {
            assert_eq!(id.token, last.token, "the stream key persists");
        }
        last = Some(id);
        if round % 2 == 0 {
            store.close().await.unwrap();
        } else {
            // A plain drop must not lose anything either.
            drop(store);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_share_one_database() {
    let dir = tempfile::tempdir().unwrap();
    let one = open(dir.path()).await.unwrap();
    // Through the registry, by a different spelling of the same path.
    let two = open(&dir.path().join(".")).await.unwrap();
    let three = one
        .handle_with_options(StoreOptions::default().page_size(1))
        .await
        .unwrap();
    let first = one.store_event("s", NewEvent::new(b"1")).await.unwrap();
    two.store_event("s", NewEvent::new(b"2")).await.unwrap();
    three.store_event("s", NewEvent::new(b"3")).await.unwrap();
    let replay = three.replay_events_after(&first.to_string()).await.unwrap();
    let got: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(one.path(), two.path());
    one.close().await.unwrap();
    two.close().await.unwrap();
    three.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sled://{}?flush_interval_ms=5", dir.path().display());
    assert!(url.starts_with("sled:///"));
    let store = SledStore::connect(&url).await.unwrap();
    assert_eq!(
        store.durability(),
        Durability::Interval(Duration::from_millis(5))
    );
    store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    store.close().await.unwrap();
    assert!(matches!(
        SledStore::connect("sled://").await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        SledStore::connect("redis://x").await,
        Err(Error::Config(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_mode_is_visible_at_once_and_flushed_on_close() {
    let dir = tempfile::tempdir().unwrap();
    let relaxed =
        SledOptions::default().durability(Durability::Interval(Duration::from_secs(3600)));
    let store = SledStore::open(dir.path(), relaxed).await.unwrap();
    let first = store.store_event("s", NewEvent::new(b"1")).await.unwrap();
    let second = store.store_event("s", NewEvent::new(b"2")).await.unwrap();
    assert!(
        store
            .get_stream_id_for_event_id(&second.to_string())
            .await
            .unwrap()
            .is_some()
    );
    store.close().await.unwrap();

    // A clean close: no era jump, numbering simply continues.
    let store = open(dir.path()).await.unwrap();
    let third = store.store_event("s", NewEvent::new(b"3")).await.unwrap();
    assert_eq!(third.position, Position::seq(3));
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let got: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(got.len(), 2);
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lost_relaxed_session_streams_jump_to_a_new_era() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await.unwrap();
    let old = store.store_event("s", NewEvent::new(b"old")).await.unwrap();
    store
        .store_event("s", NewEvent::new(b"old 2"))
        .await
        .unwrap();
    store.close().await.unwrap();

    // What a relaxed handle leaves behind when its process is killed.
    with_raw_meta(dir.path(), |meta| {
        meta.insert("relaxed_open", &[1u8][..]).unwrap();
    });

    let store = open(dir.path()).await.unwrap();
    // Before the stream appends again, old cursors still replay.
    let replay = store.replay_events_after(&old.to_string()).await.unwrap();
    assert_eq!(
        replay.events.try_collect::<Vec<_>>().await.unwrap().len(),
        1
    );
    // A lost id (never durable here) is unknown, not an empty replay.
    let lost = EventId::new(old.token, Position::seq(3));
    assert!(matches!(
        store.replay_events_after(&lost.to_string()).await,
        Err(Error::UnknownEventId { .. })
    ));

    let jumped = store.store_event("s", NewEvent::new(b"new")).await.unwrap();
    assert_eq!(jumped.position, Position::seq((1 << 40) + 1));
    let next = store
        .store_event("s", NewEvent::new(b"new 2"))
        .await
        .unwrap();
    assert_eq!(next.position, Position::seq((1 << 40) + 2));
    for cursor in [old, lost] {
        assert!(
            matches!(
                store.replay_events_after(&cursor.to_string()).await,
                Err(Error::EventsPurged { .. })
            ),
            "{cursor} must be told to start over"
        );
    }
    let replay = store
        .replay_events_after(&jumped.to_string())
        .await
        .unwrap();
    assert_eq!(
        replay.events.try_collect::<Vec<_>>().await.unwrap().len(),
        1
    );
    // New streams start in the new era too.
    let other = store.store_event("t", NewEvent::new(b"x")).await.unwrap();
    assert_eq!(other.position, Position::seq((1 << 40) + 1));
    store.close().await.unwrap();

    // The jump happened once: a clean reopen continues the numbering.
    let store = open(dir.path()).await.unwrap();
    let after = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    assert_eq!(after.position, Position::seq((1 << 40) + 3));
    store.close().await.unwrap();
}

#[test]
fn outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let opened =
        futures_util::FutureExt::now_or_never(SledStore::open(dir.path(), SledOptions::default()));
    assert!(matches!(opened, Some(Err(Error::Config(_)))), "{opened:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_applies_limits_lowered_since_the_events_were_appended() {
    use mcp_event_store_core::Retention;
    let dir = tempfile::tempdir().unwrap();
    let loose =
        SledOptions::default().store(StoreOptions::default().retention(Retention::unbounded()));
    let tight = Retention::unbounded().max_events_per_stream(5);

    // Appended without limits by an earlier run.
    let store = SledStore::open(dir.path(), loose.clone()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..20u8 {
        ids.push(store.store_event("s", NewEvent::new(&[i])).await.unwrap());
    }
    store.close().await.unwrap();

    let store = SledStore::open(
        dir.path(),
        SledOptions::default().store(StoreOptions::default().retention(tight)),
    )
    .await
    .unwrap();
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 15, "{report:?}");
    assert!(matches!(
        store.replay_events_after(&ids[0].to_string()).await,
        Err(Error::EventsPurged { .. })
    ));
    let replay = store
        .replay_events_after(&ids[14].to_string())
        .await
        .unwrap();
    assert_eq!(
        replay.events.try_collect::<Vec<_>>().await.unwrap().len(),
        5
    );

    // A looser handle in the same process appends; the tight one trims it.
    let other = store
        .handle_with_options(StoreOptions::default().retention(Retention::unbounded()))
        .await
        .unwrap();
    for i in 0..10u8 {
        other.store_event("t", NewEvent::new(&[i])).await.unwrap();
    }
    assert_eq!(store.purge_expired().await.unwrap().events, 5);
    assert_eq!(store.purge_expired().await.unwrap().events, 0);
    other.close().await.unwrap();
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_walks_many_streams_and_sessions_in_batches() {
    use mcp_event_store_core::{ManualClock, Retention, SessionStore};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let options = StoreOptions::default()
        .retention(Retention::unbounded().max_age(Duration::from_secs(60)))
        .clock(clock.clone());
    let store = SledStore::open(dir.path(), SledOptions::default().store(options))
        .await
        .unwrap();
    for s in 0..600 {
        for _ in 0..2 {
            store
                .store_event(&format!("s{s}"), NewEvent::new(b"old"))
                .await
                .unwrap();
        }
        let ttl = Duration::from_secs(if s % 2 == 0 { 30 } else { 600 });
        store
            .put_session(&format!("sess{s}"), b"x", ttl)
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(61));
    let mut fresh = Vec::new();
    for s in 0..100 {
        fresh.push(
            store
                .store_event(&format!("s{s}"), NewEvent::new(b"new"))
                .await
                .unwrap(),
        );
    }
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 1200, "{report:?}");
    assert_eq!(report.streams, 500, "{report:?}");
    assert_eq!(report.sessions, 300, "{report:?}");
    for id in &fresh {
        assert!(
            store
                .get_stream_id_for_event_id(&id.to_string())
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(
        store.get_session("sess1").await.unwrap().as_deref(),
        Some(&b"x"[..])
    );
    assert_eq!(store.get_session("sess0").await.unwrap(), None);
    assert_eq!(store.purge_expired().await.unwrap(), Default::default());
    store.close().await.unwrap();
}
