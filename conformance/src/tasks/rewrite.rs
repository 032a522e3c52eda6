//! C22 for tasks: every value a task holds is listed as stored and
//! swapped in place, only over the bytes read, changing nothing a client
//! or worker can see but the value.

use std::collections::BTreeMap;

use mcp_event_store_core::Error;
use mcp_event_store_core::rewrite::{RewriteStore, Swap, TaskField, TaskValues};
use mcp_event_store_core::task::{Applied, Finish, NewTask, TaskDigest, TaskRecord, WorkerChange};

use super::TaskHarness;
use super::support::*;
use crate::events::flipped;

/// Every task the listing holds, read a page of `limit` at a time.
async fn all_tasks(rewriter: &dyn RewriteStore, limit: usize) -> Vec<TaskValues> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = rewriter.task_values(after.as_ref(), limit).await.unwrap();
        assert!(page.tasks.len() <= limit, "a page over its limit");
        all.extend(page.tasks);
        match page.next {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

/// The values of task `digest` in a listing, by field.
fn values_of(listed: &[TaskValues], digest: TaskDigest) -> BTreeMap<TaskField, Vec<u8>> {
    let task = listed
        .iter()
        .find(|t| t.digest == digest)
        .unwrap_or_else(|| panic!("task {digest:?} is not listed"));
    task.values
        .iter()
        .map(|v| (v.field.clone(), v.bytes.to_vec()))
        .collect()
}

/// What a client and a worker see of a task but its values.
fn without_values(mut record: TaskRecord) -> TaskRecord {
    record.context = None;
    record.outcome = None;
    for (_, request) in &mut record.outstanding {
        *request = Default::default();
    }
    if let Some(takeover) = &mut record.takeover {
        takeover.checkpoint = None;
    }
    record
}

/// C22 for tasks: the listing holds each task once, ascending by digest,
/// page by page, with its context, outcome, checkpoint, outstanding
/// requests and untaken responses; a swap over the bytes read replaces one
/// value and nothing else (not the revision, the status, the claim); a
/// swap over other bytes, of another length, of a value the task does not
/// hold or of an unknown task changes nothing; the worker goes on writing
/// after it.
pub async fn task_values_are_swapped_only_over_the_bytes_read<H: TaskHarness>(h: &H) {
    let f = fixture(h).await;
    let Some(rewriter) = h.rewriter(&f.store) else {
        // A store of tasks alone: its values are rewritten through the
        // event store holding it, which runs this case.
        f.close(h).await;
        return;
    };
    let (running, running_id) = f
        .create_with(
            NewTask::new(&f.owner, f.me)
                .context(b"{\"tool\":\"count\",\"to\":3}")
                .takeover(3),
        )
        .await;
    assert!(is_changed(
        &f.apply(&running, WorkerChange::Checkpoint(b"{\"step\":2}"))
            .await
    ));
    f.request(&running, "asked").await;
    f.request(&running, "answered").await;
    f.answer(&running_id, &[("answered", b"\"yes\"")]).await;
    let (done, done_id) = f
        .create_with(NewTask::new(&f.owner, f.me).context(b"{\"tool\":\"echo\"}"))
        .await;
    assert!(is_changed(
        &f.apply(
            &done,
            WorkerChange::Finish(Finish::Completed(b"{\"content\":[]}"))
        )
        .await
    ));

    let listed = all_tasks(rewriter, 1).await;
    let digests: Vec<TaskDigest> = listed.iter().map(|t| t.digest).collect();
    let mut expected = vec![running.digest(), done.digest()];
    expected.sort();
    assert_eq!(digests, expected, "each task once, ascending by digest");
    let running_values = values_of(&listed, running.digest());
    let done_values = values_of(&listed, done.digest());
    for field in [
        TaskField::Context,
        TaskField::Checkpoint,
        TaskField::Request("asked".into()),
        TaskField::Response("answered".into()),
    ] {
        assert!(
            running_values.contains_key(&field),
            "{field:?} is not listed: {running_values:?}"
        );
    }
    assert!(!running_values.contains_key(&TaskField::Outcome));
    assert!(done_values.contains_key(&TaskField::Context));
    assert!(done_values.contains_key(&TaskField::Outcome));
    let plain = running_values[&TaskField::Context] == b"{\"tool\":\"count\",\"to\":3}";
    if plain {
        assert_eq!(running_values[&TaskField::Checkpoint], b"{\"step\":2}");
        assert_eq!(
            running_values[&TaskField::Request("asked".into())],
            b"{\"q\":1}"
        );
        assert_eq!(
            running_values[&TaskField::Response("answered".into())],
            b"\"yes\""
        );
        assert_eq!(done_values[&TaskField::Outcome], b"{\"content\":[]}");
    }

    let before = (f.get(&running_id).await, f.get(&done_id).await);
    for (digest, values) in [
        (running.digest(), &running_values),
        (done.digest(), &done_values),
    ] {
        for (field, old) in values {
            let new = flipped(old);
            assert_eq!(
                rewriter.swap_task(&digest, field, old, &new).await.unwrap(),
                Swap::Swapped,
                "{field:?}"
            );
            assert_eq!(
                rewriter.swap_task(&digest, field, old, old).await.unwrap(),
                Swap::Changed,
                "{field:?} swapped over bytes no longer there"
            );
        }
    }
    let context = &running_values[&TaskField::Context];
    assert!(matches!(
        rewriter
            .swap_task(&running.digest(), &TaskField::Context, context, b"{}")
            .await,
        Err(Error::Config(_))
    ));
    assert_eq!(
        rewriter
            .swap_task(&running.digest(), &TaskField::Outcome, context, context)
            .await
            .unwrap(),
        Swap::Changed,
        "a value the task does not hold"
    );
    let unknown = TaskDigest::of(
        &mcp_event_store_core::task::TaskId::generate()
            .unwrap()
            .to_string(),
    )
    .unwrap();
    assert_eq!(
        rewriter
            .swap_task(&unknown, &TaskField::Context, context, context)
            .await
            .unwrap(),
        Swap::Changed
    );

    let relisted = all_tasks(rewriter, 10).await;
    for (digest, values) in [
        (running.digest(), &running_values),
        (done.digest(), &done_values),
    ] {
        let now = values_of(&relisted, digest);
        let want: BTreeMap<TaskField, Vec<u8>> = values
            .iter()
            .map(|(field, old)| (field.clone(), flipped(old)))
            .collect();
        assert_eq!(now, want, "every value swapped, nothing else listed");
    }
    if plain {
        let after = (f.get(&running_id).await, f.get(&done_id).await);
        assert_eq!(
            without_values(after.0.clone()),
            without_values(before.0.clone()),
            "a swap changed more than a value"
        );
        assert_eq!(
            without_values(after.1.clone()),
            without_values(before.1.clone()),
            "a swap changed more than a value"
        );
        assert_eq!(
            after.0.context.as_deref(),
            Some(&flipped(b"{\"tool\":\"count\",\"to\":3}")[..])
        );
        assert_eq!(
            after.1.outcome.as_deref(),
            Some(&flipped(b"{\"content\":[]}")[..])
        );
    }

    // Swapped back, the tasks read exactly as before (what a decorator
    // over the store opens included): nothing but the values ever moved.
    for (digest, values) in [
        (running.digest(), &running_values),
        (done.digest(), &done_values),
    ] {
        for (field, old) in values {
            assert_eq!(
                rewriter
                    .swap_task(&digest, field, &flipped(old), old)
                    .await
                    .unwrap(),
                Swap::Swapped,
                "{field:?} back"
            );
        }
    }
    let after = (f.get(&running_id).await, f.get(&done_id).await);
    assert_eq!(after, before, "a swap changed more than a value");

    // The worker goes on: it takes the answer and writes again.
    assert_eq!(
        f.take(&running, "answered").await.as_deref(),
        Some(&b"\"yes\""[..])
    );
    match f
        .apply(&running, WorkerChange::SetMessage(Some("after the swap")))
        .await
    {
        Applied::Changed { rev, .. } => assert!(rev > after.0.rev, "{rev:?}"),
        other => panic!("the worker's write after a swap: {other:?}"),
    }
    f.close(h).await;
}

/// Registers this file's cases with [`task_suite!`](crate::task_suite).
#[doc(hidden)]
#[macro_export]
macro_rules! __task_cases_rewrite {
    ($harness:expr) => {
        $crate::__task_conformance_cases!($harness;
            task_values_are_swapped_only_over_the_bytes_read
        );
    };
}
