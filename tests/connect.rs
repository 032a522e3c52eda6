//! `connect(url)`: the backend is chosen by URL, and a URL for a backend that
//! is not compiled in says which feature to enable.

use futures_util::TryStreamExt;
use mcp_event_store::{Error, NewEvent, connect};

#[tokio::test]
async fn memory_url_opens_a_working_store() {
    let store = connect("memory://").await.unwrap();
    let first = store.store_event("s", NewEvent::new(b"a")).await.unwrap();
    store.store_event("s", NewEvent::new(b"b")).await.unwrap();
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(events.len(), 1);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_url_opens_a_file_that_persists() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?durability=power_loss",
        dir.path().join("e.db").display()
    );
    let first = {
        let store = connect(&url).await.unwrap();
        let first = store.store_event("s", NewEvent::new(b"a")).await.unwrap();
        store.store_event("s", NewEvent::new(b"b")).await.unwrap();
        first
    };
    let store = connect(&url).await.unwrap();
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(&events[0].data[..], b"b");
}

#[tokio::test]
async fn bad_urls_are_clear_errors() {
    for url in [
        "",
        "events.db",
        "ftp://x",
        "sqlite://",
        "sqlite://e.db?durability=maybe",
    ] {
        let Err(err) = connect(url).await else {
            panic!("{url:?} should be refused");
        };
        assert!(matches!(err, Error::Config(_)), "{url:?}: {err}");
    }
}

/// A backend URL whose feature is off says which feature to enable; it
/// never falls through to "unknown scheme".
#[tokio::test]
async fn a_backend_not_compiled_in_names_its_feature() {
    let backends = [
        (
            "postgres://127.0.0.1:1/db",
            "postgres",
            cfg!(feature = "postgres"),
        ),
        ("redis://127.0.0.1:1", "redis", cfg!(feature = "redis")),
        (
            "sled:///proc/nonexistent/dir",
            "sled",
            cfg!(feature = "sled"),
        ),
    ];
    for (url, feature, compiled_in) in backends {
        let result = connect(url).await;
        if compiled_in {
            assert!(
                !matches!(result, Err(Error::BackendNotEnabled { .. })),
                "{url}: the {feature} backend is compiled in"
            );
            continue;
        }
        let Err(err) = result else {
            panic!("{url}: the {feature} backend is not compiled in");
        };
        assert!(
            matches!(&err, Error::BackendNotEnabled { feature: named, .. } if *named == feature),
            "{url}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&format!("enable the `{feature}` cargo feature")),
            "{message}"
        );
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_url_opens_a_shared_store() {
    use mcp_event_store_postgres::testing::{drop_schema, random_schema, server_url};

    let server = server_url().await;
    let schema = random_schema();
    let separator = if server.contains('?') { '&' } else { '?' };
    let url = format!("{server}{separator}schema={schema}");
    let one = connect(&url).await.unwrap();
    let two = connect(&url).await.unwrap();
    let first = one.store_event("s", NewEvent::new(b"a")).await.unwrap();
    two.store_event("s", NewEvent::new(b"b")).await.unwrap();
    let replay = one.replay_events_after(&first.to_string()).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    drop((one, two));
    drop_schema(&server, &schema).await.unwrap();
    assert_eq!(&events[0].data[..], b"b");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_url_opens_a_shared_store() {
    use mcp_event_store_redis::testing::{random_prefix, server_url};
    use mcp_event_store_redis::{RedisOptions, RedisStore};

    let server = server_url().await;
    let prefix = random_prefix();
    let separator = if server.contains('?') { '&' } else { '?' };
    let url = format!("{server}{separator}prefix={prefix}");
    let one = connect(&url).await.unwrap();
    let two = connect(&url).await.unwrap();
    let first = one.store_event("s", NewEvent::new(b"a")).await.unwrap();
    two.store_event("s", NewEvent::new(b"b")).await.unwrap();
    let replay = one.replay_events_after(&first.to_string()).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    RedisStore::connect_with(&server, RedisOptions::default().key_prefix(prefix))
        .await
        .unwrap()
        .destroy()
        .await
        .unwrap();
    assert_eq!(&events[0].data[..], b"b");
}

#[cfg(feature = "sled")]
#[tokio::test]
async fn sled_url_opens_a_directory_that_persists() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sled://{}", dir.path().join("events").display());
    let first = {
        let store = connect(&url).await.unwrap();
        let first = store.store_event("s", NewEvent::new(b"a")).await.unwrap();
        store.store_event("s", NewEvent::new(b"b")).await.unwrap();
        first
    };
    let store = connect(&url).await.unwrap();
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let events: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(&events[0].data[..], b"b");
}
