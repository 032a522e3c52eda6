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

/// Each backend URL either opens (feature on) or says which feature to
/// enable; it never falls through to "unknown scheme".
#[tokio::test]
async fn a_backend_not_compiled_in_names_its_feature() {
    let mut refused = 0;
    for (url, feature) in [
        ("postgres://127.0.0.1:1/db", "postgres"),
        ("redis://127.0.0.1:1", "redis"),
        ("sled:///nonexistent/dir", "sled"),
    ] {
        if let Err(Error::BackendNotEnabled { feature: named, .. }) = connect(url).await {
            assert_eq!(named, feature, "{url}");
            let message = connect(url).await.err().unwrap().to_string();
            assert!(
                message.contains(&format!("enable the `{feature}` cargo feature")),
                "{message}"
            );
            refused += 1;
        }
    }
    // This build compiles none of these backends in.
    assert_eq!(refused, 3);
}
