//! Stream incarnations on SQLite beyond the conformance suite: a stream
//! started again by another handle, a replay whose stream is started again
//! under it, and the migration of a format 1 database (C2, C5, C12).

use futures_util::StreamExt;
use mcp_event_store_core::backend::{StreamKey, dense};
use mcp_event_store_core::{
    Error, EventId, EventStore, NewEvent, Position, Retention, StoreOptions,
};
use mcp_event_store_sqlite::{FORMAT_VERSION, SqliteOptions, SqliteStore};
use sqlx::{Connection, SqliteConnection};

fn unbounded() -> StoreOptions {
    StoreOptions::default().retention(Retention::unbounded())
}

async fn open(path: &std::path::Path, options: StoreOptions) -> SqliteStore {
    SqliteStore::open_with(SqliteOptions::new(path).store(options))
        .await
        .unwrap()
}

async fn raw(path: &std::path::Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

async fn append(store: &SqliteStore, stream: &str, data: &str) -> EventId {
    store
        .store_event(stream, NewEvent::new(data.as_bytes()))
        .await
        .unwrap()
}

/// Every event after `id`, as `(id, data)`; panics on an error.
async fn replay(store: &SqliteStore, id: &EventId) -> (String, Vec<(EventId, String)>) {
    let replay = store.replay_events_after(&id.to_string()).await.unwrap();
    let events = replay
        .events
        .map(|event| {
            let event = event.unwrap();
            (event.id, String::from_utf8(event.data.to_vec()).unwrap())
        })
        .collect()
        .await;
    (replay.stream_id, events)
}

fn incarnation(id: &EventId) -> u64 {
    dense::parts(id.position).unwrap().0
}

/// A handle that appended to a stream before another handle deleted it and
/// started it again must append to the new life, under its incarnation:
/// never an id named after the incarnation it remembered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_appends_to_the_new_life_another_handle_started() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let a = open(&path, unbounded()).await;
    let b = open(&path, unbounded()).await;
    let old = [append(&a, "s", "a-0").await, append(&a, "s", "a-1").await];
    assert_eq!(b.delete_stream("s").await.unwrap(), 2);
    let new = append(&b, "s", "b-0").await;
    assert_ne!(incarnation(&new), incarnation(&old[0]));
    assert!(new.position > old[1].position);

    // One lone append, then a group of them (the multi-row path).
    let lone = append(&a, "s", "a-2").await;
    let mut group = Vec::new();
    for i in 3..40 {
        let a = a.clone();
        group.push(tokio::spawn(async move {
            append(&a, "s", &format!("a-{i}")).await
        }));
    }
    let mut ids = vec![lone];
    for task in group {
        ids.push(task.await.unwrap());
    }
    for id in &ids {
        assert_eq!(incarnation(id), incarnation(&new), "{id}");
        assert!(!old.contains(id), "{id} reissued");
        let found = b.get_stream_id_for_event_id(&id.to_string()).await.unwrap();
        assert_eq!(found.as_deref(), Some("s"), "{id}");
    }
    let (stream, events) = replay(&b, &new).await;
    assert_eq!(stream, "s");
    assert_eq!(events.len(), ids.len());
    ids.sort_by_key(|id| id.position);
    assert_eq!(events.iter().map(|(id, _)| *id).collect::<Vec<_>>(), ids);
    for old in &old {
        assert!(matches!(
            b.replay_events_after(&old.to_string()).await,
            Err(Error::UnknownEventId { .. })
        ));
    }
    a.close().await;
    b.close().await;
}

/// A replay that has read its first page and finds, on the next, that its
/// stream was deleted and started again ends in `EventsPurged`: it never
/// goes on with events of the new life, whose sequence numbers are again
/// past the cursor.
#[tokio::test]
async fn a_replay_whose_stream_started_again_under_it_ends_in_events_purged() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("e.db"), unbounded().page_size(2)).await;
    let first = append(&store, "s", "old-0").await;
    for i in 1..6 {
        append(&store, "s", &format!("old-{i}")).await;
    }
    let mut replay = store
        .replay_events_after(&first.to_string())
        .await
        .unwrap()
        .events;
    for expected in ["old-1", "old-2"] {
        let event = replay.next().await.unwrap().unwrap();
        assert_eq!(event.data, expected.as_bytes());
    }
    store.delete_stream("s").await.unwrap();
    for i in 0..10 {
        append(&store, "s", &format!("new-{i}")).await;
    }
    match replay.next().await {
        Some(Err(Error::EventsPurged { .. })) => {}
        Some(Ok(event)) => panic!(
            "the replay went on into the new life: {} {:?}",
            event.id, event.data
        ),
        other => panic!("expected EventsPurged, got {other:?}"),
    }
    store.close().await;
}

/// A database written by format 1 (ids `<seq>`, no incarnations) is migrated
/// on open: every event is kept, each stream gets its own incarnation above
/// every sequence number format 1 issued (so new ids sort after old ones),
/// old ids are refused rather than misread, and streams started again,
/// including one whose deletion a crash left half done, never reissue ids.
#[tokio::test]
async fn a_format_1_database_is_migrated_and_never_reissues_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let key = StreamKey::generate().unwrap();
    {
        // Format 1 exactly as its release left it: its migration, its key,
        // and rows written the way its writer wrote them.
        let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
        let mut migrator = sqlx::migrate!("./migrations");
        migrator.dangerous_set_table_name("mes_migrations");
        migrator
            .run_direct(Some(1), &mut conn, false)
            .await
            .unwrap();
        sqlx::query("INSERT INTO mes_meta (key, value) VALUES ('stream_key', ?1)")
            .bind(&key.as_bytes()[..])
            .execute(&mut conn)
            .await
            .unwrap();
        for (stream, events) in [("a", 3), ("b", 5)] {
            sqlx::query(
                "INSERT INTO mes_streams (token, stream_id, last_seq, bytes, updated_at) \
                 VALUES (?1, ?2, 0, 0, 0)",
            )
            .bind(&key.token(stream).as_bytes()[..])
            .bind(stream)
            .execute(&mut conn)
            .await
            .unwrap();
            for seq in 1..=events {
                sqlx::query(
                    "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
                     VALUES (?1, ?2, 0, NULL, ?3)",
                )
                .bind(&key.token(stream).as_bytes()[..])
                .bind(seq)
                .bind(format!("{stream}-{seq}").into_bytes())
                .execute(&mut conn)
                .await
                .unwrap();
            }
        }
        // "c" was deleted by format 1 and a crash struck between its two
        // statements: the row went, its events stayed.
        for seq in 1..=2i64 {
            sqlx::query(
                "INSERT INTO mes_events (token, seq, stored_at, retry_ms, payload) \
                 VALUES (?1, ?2, 0, NULL, x'00')",
            )
            .bind(&key.token("c").as_bytes()[..])
            .bind(seq)
            .execute(&mut conn)
            .await
            .unwrap();
        }
        conn.close().await.unwrap();
    }

    let store = open(&path, unbounded()).await;
    let old_id = |stream: &str, seq: u64| EventId::new(key.token(stream), Position::seq(seq));

    // Old ids carry no incarnation: refused, never read as something else.
    for id in [
        old_id("a", 1),
        old_id("a", 3),
        old_id("b", 2),
        old_id("c", 1),
    ] {
        assert!(
            matches!(
                store.replay_events_after(&id.to_string()).await,
                Err(Error::UnknownEventId { .. })
            ),
            "{id}"
        );
        assert_eq!(
            store
                .get_stream_id_for_event_id(&id.to_string())
                .await
                .unwrap(),
            None
        );
    }

    // Each stream continues its numbering under an incarnation of its own,
    // above every sequence number format 1 issued.
    let a4 = append(&store, "a", "a-4").await;
    let b6 = append(&store, "b", "b-6").await;
    let (a_life, b_life) = (incarnation(&a4), incarnation(&b6));
    assert_ne!(a_life, b_life);
    assert_eq!(dense::parts(a4.position), Some((a_life, 4)));
    assert_eq!(dense::parts(b6.position), Some((b_life, 6)));
    assert!(a4.position > old_id("a", 3).position);
    assert!(b6.position > old_id("b", 5).position);
    // The migrated events are all there, under their new names.
    let a1 = EventId::new(key.token("a"), dense::position(a_life, 1));
    let (stream, events) = replay(&store, &a1).await;
    assert_eq!(stream, "a");
    let data: Vec<&str> = events.iter().map(|(_, data)| data.as_str()).collect();
    assert_eq!(data, ["a-2", "a-3", "a-4"]);
    let b1 = EventId::new(key.token("b"), dense::position(b_life, 1));
    assert_eq!(replay(&store, &b1).await.1.len(), 5);

    // "c" starts a life of its own, at 1, past the events the crash left.
    let c1 = append(&store, "c", "c-new-1").await;
    let c2 = append(&store, "c", "c-new-2").await;
    assert_eq!(dense::parts(c1.position).map(|(_, seq)| seq), Some(1));
    assert!(incarnation(&c1) > a_life.max(b_life));
    let (stream, events) = replay(&store, &c1).await;
    assert_eq!((stream.as_str(), events.len()), ("c", 1));
    assert_eq!(events[0].0, c2);

    // A migrated stream deleted and started again gets a new incarnation.
    store.delete_stream("a").await.unwrap();
    let again = append(&store, "a", "again").await;
    assert!(incarnation(&again) > incarnation(&c1));
    assert_eq!(dense::parts(again.position).map(|(_, seq)| seq), Some(1));
    assert!(matches!(
        store.replay_events_after(&a4.to_string()).await,
        Err(Error::UnknownEventId { .. })
    ));
    store.close().await;

    let mut conn = raw(&path).await;
    let format: i64 = sqlx::query_scalar(
        "SELECT CAST(value AS INTEGER) FROM mes_meta WHERE key = 'format_version'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(format, FORMAT_VERSION);
    conn.close().await.unwrap();
}

/// The counter refuses a stream row that would reuse an incarnation, however
/// it is written (an older release still running, a hand-made row).
#[tokio::test]
async fn a_stream_row_without_a_fresh_incarnation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = open(&path, unbounded()).await;
    let id = append(&store, "s", "x").await;
    store.close().await;
    let mut conn = raw(&path).await;
    for incarnation in [None, Some(incarnation(&id) as i64)] {
        let insert = match incarnation {
            // What a format 1 writer would run.
            None => sqlx::query(
                "INSERT INTO mes_streams (token, stream_id, last_seq, bytes, updated_at) \
                 VALUES (x'01', 'other', 0, 0, 0)",
            ),
            Some(taken) => sqlx::query(
                "INSERT INTO mes_streams \
                     (token, stream_id, incarnation, last_seq, bytes, updated_at) \
                 VALUES (x'01', 'other', ?1, 0, 0, 0)",
            )
            .bind(taken),
        };
        let err = insert.execute(&mut conn).await.unwrap_err();
        assert!(err.to_string().contains("incarnation"), "{err}");
    }
    conn.close().await.unwrap();
}
