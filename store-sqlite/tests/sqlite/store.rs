//! SQLite-specific behaviour beyond the conformance suite: the format
//! version record (C12), connecting by URL over options, closing, and
//! clear errors on open.
//!
//! A database migrated by a newer release (a migration this release does
//! not know, and its format version) is the shared case
//! `newer_format_is_refused_and_changes_nothing` (`event_suite.rs`).

use mcp_event_store_core::{Error, EventStore, NewEvent, SessionStore, StoreOptions};
use mcp_event_store_sqlite::{Durability, FORMAT_VERSION, SqliteOptions, SqliteStore};
use sqlx::{Connection, SqliteConnection};

async fn raw(path: &std::path::Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// The format version record is checked on its own too: a newer one is
/// refused even when no migration of a newer release is recorded.
#[tokio::test]
async fn a_newer_format_version_record_alone_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    SqliteStore::open(&path).await.unwrap().close().await;
    let newer = FORMAT_VERSION + 1;
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE mes_meta SET value = ?1 WHERE key = 'format_version'")
        .bind(newer)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(&err, Error::IncompatibleFormat(m) if m.contains(&format!("format version {newer}"))),
        "{err}"
    );
}

#[tokio::test]
async fn a_closed_store_refuses_writes_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("e.db")).await.unwrap();
    let id = store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    let clone = store.clone();
    store.close().await;
    assert!(matches!(
        clone.store_event("s", NewEvent::new(b"x")).await,
        Err(Error::Closed)
    ));
    assert!(matches!(
        clone.delete_session("x").await,
        Err(Error::Closed)
    ));
    assert!(matches!(clone.purge_expired().await, Err(Error::Closed)));
    // Reads too, and closing again does nothing.
    assert!(matches!(
        clone.replay_events_after(&id.to_string()).await,
        Err(Error::Closed)
    ));
    assert!(matches!(clone.get_session("x").await, Err(Error::Closed)));
    assert!(matches!(clone.stats().await, Err(Error::Closed)));
    store.close().await;
    clone.close().await;
}

/// `connect_with` applies the URL's file and parameters over the options
/// given: a parameter in the URL wins, the options fill in the rest.
#[tokio::test]
async fn connect_with_applies_the_url_over_the_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let url = format!("sqlite://{}", path.display());
    let durability = |report: &mcp_event_store_core::HealthReport| {
        report
            .settings
            .iter()
            .find(|s| s.name == "durability")
            .map(|s| s.value.clone())
    };
    let options = || {
        SqliteOptions::new(dir.path().join("not-this.db"))
            .durability(Durability::PowerLoss)
            .store(StoreOptions::default().max_payload_bytes(4))
    };

    let store = SqliteStore::connect_with(&url, options()).await.unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(durability(&report).as_deref(), Some("power_loss"));
    assert!(matches!(
        store.store_event("s", NewEvent::new(b"too long")).await,
        Err(Error::PayloadTooLarge { .. })
    ));
    store.close().await;
    assert!(path.exists() && !dir.path().join("not-this.db").exists());

    let store = SqliteStore::connect_with(&format!("{url}?durability=process"), options())
        .await
        .unwrap();
    let report = store.check().await.unwrap();
    assert_eq!(durability(&report).as_deref(), Some("process"));
    store.close().await;

    for bad in [
        format!("{url}?durability=process&durability=process"),
        format!("{url}?colour=blue"),
    ] {
        match SqliteStore::connect_with(&bad, options()).await {
            Err(Error::Config(message)) => {
                assert!(
                    message.contains("durability") || message.contains("colour"),
                    "{message}"
                )
            }
            other => panic!("{bad}: expected a Config error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_unopenable_path_is_a_backend_error() {
    let err = SqliteStore::open("/proc/definitely/not/here/e.db")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "sqlite",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_backend_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    std::fs::write(&path, vec![0x42; 8192]).unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "sqlite",
                ..
            }
        ),
        "{err}"
    );
}

/// Appends that arrive together share one multi-row insert; a token
/// collision among them must fail only the colliding appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collision_in_a_group_fails_only_its_own_appends() {
    use futures_util::StreamExt;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .store_event("victim", NewEvent::new(b"first"))
        .await
        .unwrap();
    store.close().await;
    // Make the victim's token belong to another stream id, as a 120-bit
    // token collision would.
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE mes_streams SET stream_id = 'impostor' WHERE stream_id = 'victim'")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let store = SqliteStore::open(&path).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for round in 0..8 {
        for stream in ["a", "victim", "b", "c", "d", "e", "f", "g"] {
            let store = store.clone();
            tasks.spawn(async move {
                let payload = format!("{stream}-{round}");
                let result = store
                    .store_event(stream, NewEvent::new(payload.as_bytes()))
                    .await;
                (stream, result)
            });
        }
    }
    let mut firsts = std::collections::HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        let (stream, result) = joined.unwrap();
        if stream == "victim" {
            assert!(matches!(result, Err(Error::Corrupt(_))), "{result:?}");
        } else {
            let id = result.unwrap();
            firsts
                .entry(stream)
                .and_modify(|first: &mut mcp_event_store_core::EventId| {
                    if id.position < first.position {
                        *first = id;
                    }
                })
                .or_insert(id);
        }
    }
    for (stream, first) in firsts {
        let replay = store.replay_events_after(&first.to_string()).await.unwrap();
        assert_eq!(replay.stream_id, stream);
        let after_first: Vec<_> = replay.events.collect().await;
        assert_eq!(after_first.len(), 7, "stream {stream}");
        assert!(after_first.iter().all(|e| e.is_ok()));
    }
    // The victim's one event is untouched, still under the stored id.
    let mut conn = raw(&path).await;
    let (count, stream_id): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM mes_events e WHERE e.token = s.token), s.stream_id \
         FROM mes_streams s WHERE s.stream_id = 'impostor'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!((count, stream_id.as_str()), (1, "impostor"));
    conn.close().await.unwrap();
    store.close().await;
}
