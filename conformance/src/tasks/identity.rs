//! T1, T2, T3 and T9: a created task is readable from every handle, under an id
//! that is unguessable and never stored, and only by its owner.

use std::collections::HashSet;
use std::time::Duration;

use crate::events::test_options;
use mcp_event_store_core::task::{CancelMode, NewTask, Owner, TaskId, TaskStore};

use super::TaskHarness;
use super::support::*;

/// T1, T9: a created task is readable at once from another handle.
pub async fn created_task_is_readable_from_another_handle<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let other = h.open(test_options(&f.clock)).await;
    let (_, id) = f
        .create_with(NewTask::new(&f.owner, f.me).message("starting").ttl(LONG))
        .await;
    let seen = other
        .get(&id, &f.owner)
        .await
        .unwrap()
        .expect("visible on B");
    assert_eq!(seen, f.get(&id).await);
    assert_eq!(seen.message.as_deref(), Some("starting"));
    assert_eq!(seen.ttl_ms, Some(10_000));
    assert!(!seen.cancel_requested && seen.outcome.is_none());
    h.close(other).await;
    f.close(h).await;
}

/// T2: 10k ids are distinct and spelled `t1.` + 26 base32hex characters;
/// no stored row contains an id.
pub async fn task_ids_are_unique_well_formed_and_never_stored<H: TaskHarness>(h: &H) {
    let mut seen = HashSet::new();
    for _ in 0..10_000 {
        let id = TaskId::generate().unwrap().to_string();
        assert_eq!(id.len(), 29, "{id}");
        assert!(id.starts_with("t1."), "{id}");
        assert!(
            id[3..]
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'v')),
            "{id}"
        );
        assert_eq!(TaskId::parse(&id).map(|p| p.to_string()), Some(id.clone()));
        assert!(seen.insert(id), "an id was drawn twice");
    }
    let f = fixture(h).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (task, id) = f.create().await;
        f.request(&task, "k").await;
        ids.push(id);
    }
    if let Some(rows) = h.raw_rows().await {
        assert!(!rows.is_empty(), "the harness sees no rows");
        for id in &ids {
            for needle in [id.as_bytes(), &id.as_bytes()[3..]] {
                assert!(
                    !rows
                        .iter()
                        .any(|row| row.windows(needle.len()).any(|w| w == needle)),
                    "a stored row contains the task id {id}"
                );
            }
        }
    }
    f.close(h).await;
}

/// T2: malformed ids, altered ids and the empty id find nothing, through
/// every call taking an id, and change nothing.
pub async fn malformed_task_ids_find_nothing<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let (_, id) = f.create().await;
    let before = f.get(&id).await;
    let mut bad: Vec<String> = vec![
        String::new(),
        "t1.".into(),
        "t1".into(),
        id.to_uppercase(),
        id.replacen("t1.", "t2.", 1),
        id.replacen("t1.", "T1.", 1),
        format!("{id} "),
        format!(" {id}"),
        format!("{id}0"),
        id[..id.len() - 1].to_owned(),
        id[3..].to_owned(),
        format!("{id}\0"),
        "t1.zzzzzzzzzzzzzzzzzzzzzzzzzz".into(),
        "t1.😀😀😀😀😀😀".into(),
        "x".repeat(100_000),
    ];
    for (i, _) in id.char_indices().skip(3) {
        let mut altered = id.clone().into_bytes();
        altered[i] = if altered[i] == b'0' { b'1' } else { b'0' };
        bad.push(String::from_utf8(altered).unwrap());
    }
    for text in &bad {
        assert_eq!(f.store.get(text, &f.owner).await.unwrap(), None, "{text:?}");
        assert_eq!(
            f.store
                .answer(text, &f.owner, &[("k", b"1")])
                .await
                .unwrap(),
            None
        );
        for mode in [CancelMode::Cooperative, CancelMode::Immediate] {
            assert_eq!(
                f.store
                    .request_cancel(text, &f.owner, mode, None)
                    .await
                    .unwrap(),
                None
            );
        }
        assert_eq!(
            f.store
                .watch(text, &f.owner, 0, Duration::ZERO)
                .await
                .unwrap(),
            None
        );
        assert!(!f.store.delete(text).await.unwrap(), "{text:?}");
    }
    assert_eq!(f.get(&id).await, before, "a malformed id changed the task");
    f.close(h).await;
}

/// T3: a wrong owner, anonymous against owned and owned against anonymous
/// all get what an unknown id gets, from every client-facing call, and
/// change nothing.
pub async fn wrong_owner_is_indistinguishable_from_unknown<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let bob = Owner::principal(b"bob").unwrap();
    let (owned_task, owned) = f.create().await;
    f.request(&owned_task, "k").await;
    let (anon_task, anon) = f.create_with(NewTask::new(&Owner::Anonymous, f.me)).await;
    f.request(&anon_task, "k").await;
    let unknown = TaskId::generate().unwrap().to_string();
    let cases = [
        (&owned, bob),
        (&owned, Owner::Anonymous),
        (&anon, f.owner),
        (&anon, bob),
        (&unknown, f.owner),
    ];
    let owned_before = f.get(&owned).await;
    let anon_before = f.store.get(&anon, &Owner::Anonymous).await.unwrap();
    assert!(anon_before.is_some(), "anonymous sees its own task");
    for (id, who) in &cases {
        let who = *who;
        assert_eq!(f.store.get(id, &who).await.unwrap(), None, "get {who:?}");
        assert_eq!(
            f.store.answer(id, &who, &[("k", b"1")]).await.unwrap(),
            None,
            "answer {who:?}"
        );
        for mode in [CancelMode::Cooperative, CancelMode::Immediate] {
            assert_eq!(
                f.store.request_cancel(id, &who, mode, None).await.unwrap(),
                None,
                "cancel {who:?}"
            );
        }
        assert_eq!(
            f.store
                .watch(id, &who, 0, Duration::from_millis(1))
                .await
                .unwrap(),
            None,
            "watch {who:?}"
        );
    }
    assert_eq!(f.get(&owned).await, owned_before);
    assert_eq!(
        f.store.get(&anon, &Owner::Anonymous).await.unwrap(),
        anon_before
    );
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_identity {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            created_task_is_readable_from_another_handle,
            task_ids_are_unique_well_formed_and_never_stored,
            malformed_task_ids_find_nothing,
            wrong_owner_is_indistinguishable_from_unknown,
        );
    };
}
