//! SQLite-specific rewrites in place (C22) beyond the shared cases
//! (`sessions_are_swapped_only_over_the_bytes_read`,
//! `events_are_swapped_only_over_the_bytes_read` and
//! `task_values_are_swapped_only_over_the_bytes_read`): what the file holds
//! after a swap, which those cases see only through the store. A swapped
//! event leaves `mes_streams.bytes` the sum of the stream's payloads, also
//! once retention removed it (the triggers count inserts and deletes, and a
//! swap is neither); session rows an older release keyed otherwise are
//! skipped without ending the listing early; a spent input keeps its
//! request, listed and swapped like any value, and a task swap changes no
//! other column.

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::rewrite::{Swap, TaskField};
use mcp_event_store_core::task::{
    Applied, InstanceId, NewTask, Owner, RuntimeStore, TaskStore, WorkerChange,
};
use mcp_event_store_core::{
    EventStore, NewEvent, Retention, SessionDigest, SessionStore, StoreOptions,
};
use mcp_event_store_sqlite::{SqliteOptions, SqliteStore};
use sqlx::{Connection, SqliteConnection};

async fn raw(path: &std::path::Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap()
}

/// The stream's byte count, and the sum of its payloads' lengths.
async fn bytes(path: &std::path::Path, stream_id: &str) -> (i64, i64) {
    let mut conn = raw(path).await;
    let counted = sqlx::query_as(
        "SELECT s.bytes, (SELECT COALESCE(SUM(length(e.payload)), 0) FROM mes_events e \
                          WHERE e.token = s.token) \
         FROM mes_streams s WHERE s.stream_id = ?1",
    )
    .bind(stream_id)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    counted
}

#[tokio::test]
async fn a_swapped_event_leaves_the_stream_byte_count_the_sum_of_its_payloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let retention = Retention::unbounded().max_events_per_stream(3);
    let store = SqliteStore::open_with(
        SqliteOptions::new(&path).store(StoreOptions::default().retention(retention)),
    )
    .await
    .unwrap();
    let rewriter = store.rewriter().unwrap();
    let first = store.store_event("s", NewEvent::new(b"one")).await.unwrap();
    store
        .store_event("s", NewEvent::new(b"two!"))
        .await
        .unwrap();
    store
        .store_event("s", NewEvent::new(b"three"))
        .await
        .unwrap();
    let before = bytes(&path, "s").await;
    assert_eq!(before, (12, 12));

    assert_eq!(
        rewriter
            .swap_event("s", &first, b"one", b"ONE")
            .await
            .unwrap(),
        Swap::Swapped
    );
    assert_eq!(bytes(&path, "s").await, before, "a swap moved the count");
    let events: Vec<_> = rewriter
        .event_values("s")
        .await
        .unwrap()
        .events
        .try_collect()
        .await
        .unwrap();
    assert_eq!(events[0].data[..], b"ONE"[..]);

    // The swapped event goes with retention: the delete trigger takes its
    // length off, which is the length it was counted with.
    store
        .store_event("s", NewEvent::new(b"four"))
        .await
        .unwrap();
    assert_eq!(bytes(&path, "s").await, (13, 13));
    assert_eq!(
        rewriter
            .swap_event("s", &first, b"ONE", b"one")
            .await
            .unwrap(),
        Swap::Changed,
        "an event retention removed"
    );
    store.close().await;
}

#[tokio::test]
async fn sessions_keyed_by_raw_ids_are_skipped_without_ending_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let ids = ["alpha", "beta", "gamma"];
    for id in ids {
        store
            .put_session(id, id.as_bytes(), Duration::from_secs(60))
            .await
            .unwrap();
    }
    // What an older release left: rows under raw ids, some of them within
    // the range of digest keys but no digest's, before and after them.
    let mut conn = raw(&path).await;
    for key in [
        "s1.-old-1",
        "s1.-old-2",
        "s1.-old-3",
        "s1.zz",
        "a raw id",
        "zzz",
    ] {
        sqlx::query("INSERT INTO mes_sessions (session_id, state, expires_at) VALUES (?1, ?2, ?3)")
            .bind(key)
            .bind(&b"old"[..])
            .bind(i64::MAX)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    conn.close().await.unwrap();

    let rewriter = store.rewriter().unwrap();
    let mut listed = Vec::new();
    let mut after = None;
    loop {
        let page = rewriter.session_values(after.as_ref(), 1).await.unwrap();
        assert!(page.sessions.len() <= 1);
        listed.extend(page.sessions.iter().map(|s| (s.digest, s.state.to_vec())));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut expected: Vec<_> = ids
        .iter()
        .map(|id| (SessionDigest::of(id), id.as_bytes().to_vec()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
    store.close().await;
}

#[tokio::test]
async fn a_spent_input_keeps_its_request_and_a_task_swap_changes_one_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("e.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let me = InstanceId::generate().unwrap();
    store.heartbeat(me, Duration::from_secs(60)).await.unwrap();
    let owner = Owner::principal(b"alice").unwrap();
    let (task, _) = store
        .create(NewTask::new(&owner, me).context(b"context"))
        .await
        .unwrap();
    let request = WorkerChange::RequestInput {
        key: "k",
        request: b"request",
    };
    assert!(matches!(
        store.apply(&task, me, request).await.unwrap(),
        Applied::Changed { .. }
    ));
    store
        .answer(&task.to_string(), &owner, &[("k", b"response")])
        .await
        .unwrap()
        .unwrap();
    let taken = store
        .apply(&task, me, WorkerChange::TakeAnswer { key: "k" })
        .await
        .unwrap();
    assert!(matches!(taken, Applied::Changed { .. }), "{taken:?}");

    let rewriter = store.rewriter().unwrap();
    let page = rewriter.task_values(None, 10).await.unwrap();
    assert_eq!(page.tasks.len(), 1);
    let values = &page.tasks[0].values;
    let listed = |field: &TaskField| {
        values
            .iter()
            .find(|v| v.field == *field)
            .map(|v| v.bytes.to_vec())
    };
    let request = TaskField::Request("k".into());
    assert_eq!(listed(&request).as_deref(), Some(&b"request"[..]));
    assert_eq!(listed(&TaskField::Response("k".into())), None, "taken");
    assert_eq!(values.len(), 2, "{values:?}");

    let mut conn = raw(&path).await;
    let before = all_but_contexts_and_requests(&mut conn).await;
    let digest = page.tasks[0].digest;
    assert_eq!(
        rewriter
            .swap_task(&digest, &request, b"request", b"REQUEST")
            .await
            .unwrap(),
        Swap::Swapped
    );
    assert_eq!(
        rewriter
            .swap_task(&digest, &TaskField::Context, b"context", b"CONTEXT")
            .await
            .unwrap(),
        Swap::Swapped
    );
    assert_eq!(
        all_but_contexts_and_requests(&mut conn).await,
        before,
        "a swap changed more than a value"
    );
    let (request, context): (Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT i.request, t.context FROM mes_tasks t JOIN mes_task_inputs i USING (digest)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (&request[..], &context[..]),
        (&b"REQUEST"[..], &b"CONTEXT"[..])
    );
    conn.close().await.unwrap();
    store.close().await;
}

/// Every column of the task tables but the two the test swaps (`context`,
/// `request`), as SQLite's `quote()` shows them.
async fn all_but_contexts_and_requests(conn: &mut SqliteConnection) -> String {
    const TASK: &[&str] = &[
        "digest",
        "owner",
        "status",
        "rev",
        "message",
        "created_at",
        "updated_at",
        "expires_at",
        "purge_at",
        "ttl_ms",
        "poll_ms",
        "cancel",
        "instance",
        "outcome",
        "next_seq",
        "max_attempts",
        "lapses",
        "epoch",
        "released",
        "checkpoint",
        "cancel_reason",
    ];
    const INPUT: &[&str] = &["digest", "key", "seq", "state", "response"];
    let quoted = |columns: &[&str]| {
        columns
            .iter()
            .map(|column| format!("quote({column})"))
            .collect::<Vec<_>>()
            .join(" || '|' || ")
    };
    let select = format!(
        "SELECT (SELECT group_concat({}, ';') FROM mes_tasks) || ' / ' || \
                (SELECT group_concat({}, ';') FROM mes_task_inputs)",
        quoted(TASK),
        quoted(INPUT)
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(select))
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}
