//! PostgreSQL-specific rewrites in place (C22) beyond the shared cases
//! (`sessions_are_swapped_only_over_the_bytes_read`,
//! `events_are_swapped_only_over_the_bytes_read` and
//! `task_values_are_swapped_only_over_the_bytes_read`): what the schema
//! holds after a swap, which those cases see only through the store. A
//! swap changes one column and no counter (`total_bytes`, `cum_bytes`); an
//! event retention already removed logically, whose row is still there
//! until the purge, is not swapped; session rows keyed otherwise are
//! skipped without ending the listing early; a spent input keeps its
//! request, listed and swapped like any value, and a task swap changes no
//! other column. Each test owns a random schema.

use std::time::Duration;

use mcp_event_store_conformance::events::Harness;
use mcp_event_store_core::rewrite::{Swap, TaskField};
use mcp_event_store_core::task::{
    Applied, InstanceId, NewTask, Owner, RuntimeStore, TaskStore, WorkerChange,
};
use mcp_event_store_core::{
    EventStore, NewEvent, Retention, SessionDigest, SessionStore, StoreOptions,
};
use mcp_event_store_postgres::testing::PostgresHarness;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

async fn admin(h: &PostgresHarness) -> PgConnection {
    PgConnection::connect(h.url())
        .await
        .expect("admin connection")
}

/// Every row of `table` (its columns as text, in `order`), one string.
async fn dump(h: &PostgresHarness, table: &str, order: &str) -> String {
    let mut conn = admin(h).await;
    let dumped: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT string_agg(t::text, ';' ORDER BY {order}) FROM \"{}\".{table} t",
        h.schema()
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    dumped.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_swap_changes_its_data_alone_and_never_a_removed_event() {
    let h = PostgresHarness::new().await;
    let retention = Retention::unbounded().max_events_per_stream(2);
    let store = h.open(StoreOptions::default().retention(retention)).await;
    let rewriter = store.rewriter().unwrap();
    let first = store.store_event("s", NewEvent::new(b"one")).await.unwrap();
    let second = store
        .store_event(
            "s",
            NewEvent::new(b"two").with_retry(Duration::from_millis(700)),
        )
        .await
        .unwrap();
    store
        .store_event("s", NewEvent::new(b"three"))
        .await
        .unwrap();
    let streams = dump(&h, "streams", "token").await;
    let without_data = "token, seq, stored_at, cum_bytes, retry_ms";
    let events = |h: &PostgresHarness| {
        let (url, schema) = (h.url().to_owned(), h.schema().to_owned());
        async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT ({without_data})::text, data FROM \"{schema}\".events ORDER BY seq"
            )))
            .fetch_all(&mut conn)
            .await
            .unwrap();
            conn.close().await.unwrap();
            rows
        }
    };
    let before = events(&h).await;
    assert_eq!(before.len(), 3, "the first event's row waits for the purge");
    let stats = store.stats().await.unwrap();

    // Dropped by the count limit at append: its row is there, its bytes
    // too, but it is no event of the stream any more.
    assert_eq!(
        rewriter
            .swap_event("s", &first, b"one", b"ONE")
            .await
            .unwrap(),
        Swap::Changed,
        "an event retention removed was swapped"
    );
    assert_eq!(
        rewriter
            .swap_event("s", &second, b"two", b"TWO")
            .await
            .unwrap(),
        Swap::Swapped
    );
    let after = events(&h).await;
    assert_eq!(after[0], before[0]);
    assert_eq!(after[2], before[2]);
    assert_eq!(after[1].0, before[1].0, "a swap changed more than the data");
    assert_eq!(after[1].1, b"TWO");
    assert_eq!(dump(&h, "streams", "token").await, streams);
    let now = store.stats().await.unwrap();
    assert_eq!((now.events, now.bytes), (stats.events, stats.bytes));
    h.close(store).await;
    Harness::teardown(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keyed_by_raw_ids_are_skipped_without_ending_the_listing() {
    let h = PostgresHarness::new().await;
    let store = h.open(StoreOptions::default()).await;
    let ids = ["alpha", "beta", "gamma"];
    for id in ids {
        store
            .put_session(id, id.as_bytes(), Duration::from_secs(60))
            .await
            .unwrap();
    }
    // What an older release left: rows under raw ids, some of them within
    // the range of digest keys but no digest's, before and after them.
    let mut conn = admin(&h).await;
    for key in [
        &b"s1.-old-1"[..],
        b"s1.-old-2",
        b"s1.-old-3",
        b"s1.zz",
        b"s1.\xff",
        b"a raw id",
        b"zzz",
    ] {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\".sessions (session_id, state, expires_at) VALUES ($1, $2, $3)",
            h.schema()
        )))
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
    h.close(store).await;
    Harness::teardown(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_input_keeps_its_request_and_a_task_swap_changes_one_column() {
    let h = PostgresHarness::new().await;
    let store = h.open(StoreOptions::default()).await;
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

    let but_swapped = |h: &PostgresHarness| {
        let (url, schema) = (h.url().to_owned(), h.schema().to_owned());
        async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            let dumped: String = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT (SELECT string_agg((t.digest, t.owner, t.status, t.rev, t.message, \
                            t.created_at, t.updated_at, t.expires_at, t.purge_at, t.ttl_ms, \
                            t.poll_ms, t.cancel, t.instance, t.outcome, t.next_seq, \
                            t.max_attempts, t.lapses, t.epoch, t.released, t.checkpoint, \
                            t.cancel_reason)::text, ';') FROM \"{schema}\".tasks t) \
                     || ' / ' || \
                        (SELECT string_agg((k.digest, k.key, k.seq, k.state, k.response)::text, \
                            ';') FROM \"{schema}\".task_inputs k)"
            )))
            .fetch_one(&mut conn)
            .await
            .unwrap();
            conn.close().await.unwrap();
            dumped
        }
    };
    let before = but_swapped(&h).await;
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
        but_swapped(&h).await,
        before,
        "a swap changed more than a value"
    );
    let mut conn = admin(&h).await;
    let (request, context): (Vec<u8>, Vec<u8>) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT k.request, t.context FROM \"{0}\".tasks t JOIN \"{0}\".task_inputs k USING (digest)",
        h.schema()
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (&request[..], &context[..]),
        (&b"REQUEST"[..], &b"CONTEXT"[..])
    );
    conn.close().await.unwrap();
    h.close(store).await;
    Harness::teardown(h).await;
}
