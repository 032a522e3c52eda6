//! `connect(url)`: the backend is chosen by URL, and a URL for a backend that
//! is not compiled in says which feature to enable.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store::task::{
    Applied, Finish, InstanceId, NewTask, Owner, TaskStatus, WorkerChange,
};
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

/// Every persistent backend compiled in, through the same list `connect`
/// chooses from: its test storage's URL opens a store that two handles
/// share and that keeps its events after both are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_opens_shared_persistent_storage_by_url() {
    for (backend, storage) in mcp_event_store::testing::storages().await {
        let url = storage.url();
        assert!(backend.opens(&url), "{}: {url}", backend.name);
        let one = connect(&url).await.unwrap();
        let two = connect(&url).await.unwrap();
        let first = one.store_event("s", NewEvent::new(b"a")).await.unwrap();
        two.store_event("s", NewEvent::new(b"b")).await.unwrap();
        // The same handles are task stores on the same storage; the
        // runtime's operations are there when asked for.
        let me = InstanceId::generate().unwrap();
        let runtime = one.task_runtime();
        assert!(
            runtime
                .heartbeat(me, Duration::from_secs(60))
                .await
                .unwrap()
        );
        let owner = Owner::principal(b"alice").unwrap();
        let (task, _) = one.create(NewTask::new(&owner, me)).await.unwrap();
        let finish = WorkerChange::Finish(Finish::Completed(b"{}"));
        assert!(matches!(
            two.task_runtime().apply(&task, me, finish).await.unwrap(),
            Applied::Changed { .. }
        ));
        let replay = one.replay_events_after(&first.to_string()).await.unwrap();
        let events: Vec<_> = replay.events.try_collect().await.unwrap();
        assert_eq!(&events[0].data[..], b"b", "{}", backend.name);
        drop((one, two));
        let again = connect(&url).await.unwrap();
        let replay = again.replay_events_after(&first.to_string()).await.unwrap();
        let events: Vec<_> = replay.events.try_collect().await.unwrap();
        assert_eq!(events.len(), 1, "{}: reopened", backend.name);
        let done = again.get(&task.to_string(), &owner).await.unwrap();
        assert_eq!(
            done.map(|task| task.status),
            Some(TaskStatus::Completed),
            "{}: the task, reopened",
            backend.name
        );
        drop(again);
        storage.remove().await;
    }
}

/// Every scheme of the Redis crate reaches the Redis backend, the Valkey
/// Cluster forms included: the error is the backend's (nothing listens on
/// port 1), never "unknown scheme" or "not compiled in".
#[cfg(feature = "redis")]
#[tokio::test]
async fn every_redis_scheme_reaches_the_redis_backend() {
    for url in [
        "valkey+cluster://127.0.0.1:1",
        "valkeys+cluster://127.0.0.1:1",
        "valkey+unix:///nonexistent/redis.sock",
    ] {
        let Err(err) = connect(url).await else {
            panic!("{url}: nothing listens there");
        };
        let message = err.to_string();
        assert!(
            !message.contains("unknown store URL scheme")
                && !matches!(err, Error::BackendNotEnabled { .. }),
            "{url}: {message}"
        );
    }
}

/// The facade's scheme table (which names the feature of a backend that is
/// not compiled in) says, for each backend compiled in, exactly what that
/// backend's crate says. With `--all-features` this covers every backend.
#[test]
fn the_scheme_table_matches_every_compiled_backend() {
    use mcp_event_store::{KNOWN_SCHEMES, backends};

    for backend in backends() {
        let listed: Vec<&str> = KNOWN_SCHEMES
            .iter()
            .filter(|(_, feature)| *feature == backend.feature)
            .map(|(scheme, _)| *scheme)
            .collect();
        assert_eq!(listed, backend.schemes, "the {} backend", backend.name);
    }
    if cfg!(all(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "sled"
    )) {
        for (scheme, feature) in KNOWN_SCHEMES {
            assert!(
                backends().iter().any(|b| b.feature == *feature),
                "{scheme}:// names the feature {feature:?}, which no backend has"
            );
        }
    }
    #[cfg(feature = "redis")]
    assert_eq!(
        mcp_event_store::redis::BACKEND.schemes,
        mcp_event_store::redis::URL_SCHEMES
    );
}

/// `backends()` lists the memory store first and every backend compiled in
/// once, under its own name and feature.
#[test]
fn backends_names_each_compiled_backend_once() {
    let names: Vec<&str> = mcp_event_store::backends().iter().map(|b| b.name).collect();
    let expected: Vec<&str> = [
        ("memory", true),
        ("sqlite", cfg!(feature = "sqlite")),
        ("postgres", cfg!(feature = "postgres")),
        ("redis", cfg!(feature = "redis")),
        ("sled", cfg!(feature = "sled")),
    ]
    .into_iter()
    .filter_map(|(name, compiled_in)| compiled_in.then_some(name))
    .collect();
    assert_eq!(names, expected);
    for backend in mcp_event_store::backends().iter().skip(1) {
        assert_eq!(backend.feature, backend.name, "{}", backend.name);
    }
}

/// A scheme is matched in any case, as before.
#[tokio::test]
async fn schemes_are_case_insensitive() {
    connect("MEMORY://").await.unwrap();
}

/// An unknown scheme is a configuration error that lists the known ones.
#[tokio::test]
async fn an_unknown_scheme_lists_the_known_ones() {
    let Err(Error::Config(message)) = connect("mongodb://127.0.0.1:1").await else {
        panic!("mongodb:// is not a backend");
    };
    for scheme in ["memory", "sqlite", "postgres", "valkey+cluster", "sled"] {
        assert!(message.contains(scheme), "{message}");
    }
}
