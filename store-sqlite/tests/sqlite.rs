//! SQLite-specific behaviour beyond the conformance suite: the format
//! version (C12), closing, and clear errors on open.

use mcp_event_store_core::{Error, EventStore, NewEvent, SessionStore};
use mcp_event_store_sqlite::SqliteStore;
use sqlx::{Connection, SqliteConnection};

async fn raw(path: &std::path::Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_database_migrated_by_a_newer_release_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let id = store
        .store_event("s", NewEvent::new(b"kept"))
        .await
        .unwrap();
    store.close().await;

    let mut conn = raw(&path).await;
    sqlx::query(
        "INSERT INTO mes_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, X'00', 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();

    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(matches!(err, Error::IncompatibleFormat(_)), "{err}");
    assert!(err.to_string().contains("9999"), "{err}");

    // Refusing touched nothing: remove the foreign migration and the data is there.
    let mut conn = raw(&path).await;
    sqlx::query("DELETE FROM mes_migrations WHERE version = 9999")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(
        store
            .get_stream_id_for_event_id(&id.to_string())
            .await
            .unwrap()
            .as_deref(),
        Some("s")
    );
    store.close().await;
}

#[tokio::test]
async fn an_unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    SqliteStore::open(&path).await.unwrap().close().await;
    let mut conn = raw(&path).await;
    sqlx::query("UPDATE mes_meta SET value = 2 WHERE key = 'format_version'")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let err = SqliteStore::open(&path).await.unwrap_err();
    assert!(
        matches!(&err, Error::IncompatibleFormat(m) if m.contains("format version 2")),
        "{err}"
    );
}

#[tokio::test]
async fn a_closed_store_refuses_writes_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("e.db")).await.unwrap();
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
