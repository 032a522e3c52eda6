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

/// The default backend's URL with a parameter it reads (SQLite's
/// `durability`, as the README gives it) opens a file that persists; a
/// build without the default backend has nothing to check here (every
/// backend's storage is checked below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_url_opens_a_file_that_persists() {
    if !mcp_event_store::backends()
        .iter()
        .any(|b| b.name == "sqlite")
    {
        return;
    }
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
/// never falls through to "unknown scheme". Every scheme `connect` knows:
/// one whose backend is compiled in reaches it.
#[tokio::test]
async fn a_backend_not_compiled_in_names_its_feature() {
    let backends = mcp_event_store::backends();
    for (scheme, feature) in mcp_event_store::KNOWN_SCHEMES {
        let url = format!("{scheme}://127.0.0.1:1/nonexistent");
        if let Some(backend) = backends.iter().find(|b| b.feature == *feature) {
            // Routed to its backend (opening it is the backend's business:
            // `connect` is not called, a relative path would be made).
            assert!(backend.opens(&url), "{url}: the {feature} backend");
            assert_eq!(
                backends.iter().filter(|b| b.opens(&url)).count(),
                1,
                "{url}: one backend opens it"
            );
            continue;
        }
        let Err(err) = connect(&url).await else {
            panic!("{url}: the {feature} backend is not compiled in");
        };
        assert!(
            matches!(&err, Error::BackendNotEnabled { feature: named, .. } if named == feature),
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

/// The facade's scheme table (which names the feature of a backend that is
/// not compiled in) says, for each backend compiled in, exactly what that
/// backend's crate says. With `--all-features` this covers every backend:
/// then every feature the table names is a backend's.
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
    if compiled_in().len() == known_features().len() {
        for (scheme, feature) in KNOWN_SCHEMES {
            assert!(
                backends().iter().any(|b| b.feature == *feature),
                "{scheme}:// names the feature {feature:?}, which no backend has"
            );
        }
    }
}

/// The backends `for_each_backend!` expands for, by module name: those
/// compiled in (with test support, as here).
fn compiled_in() -> Vec<&'static str> {
    #[allow(unused_mut)] // with no backend feature on
    let mut names = Vec::new();
    macro_rules! push {
        ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {
            names.push(stringify!($backend));
        };
    }
    mcp_event_store::for_each_backend!(push);
    names
}

/// Every backend feature the facade knows of, compiled in or not.
fn known_features() -> Vec<&'static str> {
    let mut features: Vec<&str> = mcp_event_store::KNOWN_SCHEMES
        .iter()
        .map(|(_, feature)| *feature)
        .filter(|feature| !feature.is_empty())
        .collect();
    features.dedup();
    features
}

/// `backends()` lists the memory store first and every backend compiled in
/// once, under its own name and feature, in the order `for_each_backend!`
/// expands them (two lists the facade builds from its one, each checked by
/// the other).
#[test]
fn backends_names_each_compiled_backend_once() {
    let names: Vec<&str> = mcp_event_store::backends().iter().map(|b| b.name).collect();
    let mut expected = vec!["memory"];
    expected.extend(compiled_in());
    assert_eq!(names, expected);
    for backend in mcp_event_store::backends().iter().skip(1) {
        assert_eq!(backend.feature, backend.name, "{}", backend.name);
        assert!(
            known_features().contains(&backend.feature),
            "{}",
            backend.name
        );
    }
}

/// What each backend's crate says its test storage allows, for
/// `for_each_backend!` (`shared`), is what its harness says
/// (`shared_across_processes`), and its module is named as its backend;
/// every kit is the one of the backend it is listed for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kit_agrees_with_its_harness_and_descriptor() {
    use mcp_event_store::testing::bench::Kit;

    macro_rules! check {
        ($backend:ident, kit = $kit:path, restart = $restart:ident, shared = $shared:ident) => {{
            let name = stringify!($backend);
            assert_eq!(name, mcp_event_store::$backend::BACKEND.name);
            assert_eq!(<$kit as Kit>::BACKEND.name, name);
            let storage = mcp_event_store::testing::storage(name).await.unwrap();
            assert_eq!(
                storage.shared_across_processes(),
                stringify!($shared) == "yes",
                "{name}: `shared = {}`",
                stringify!($shared)
            );
            assert!(matches!(stringify!($restart), "yes" | "no"), "{name}");
            storage.remove().await;
        }};
    }
    mcp_event_store::for_each_backend!(check);
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
    for (scheme, _) in mcp_event_store::KNOWN_SCHEMES {
        assert!(message.contains(scheme), "{message}");
    }
}
