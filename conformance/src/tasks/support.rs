//! What the task cases share: the fixture (a handle, its clock, a
//! heartbeating instance and an owner) and the guards of the wake-up cases.

use std::sync::Arc;
use std::time::Duration;

use crate::events::{test_clock, test_options};
use mcp_event_store_core::task::{
    Applied, CancelMode, InstanceId, NewTask, Owner, RuntimeStore, TaskId, TaskRecord, TaskStatus,
    WorkerChange,
};
use mcp_event_store_core::{Error, ManualClock, StoreOptions};

use super::TaskHarness;

pub(crate) const DAY: Duration = Duration::from_secs(24 * 60 * 60);
pub(crate) const LONG: Duration = Duration::from_secs(10);
/// "Must happen eventually" guard in the wake-up cases; never a latency
/// bound. A watch not back within it was not woken.
pub(crate) const EVENTUALLY: Duration = Duration::from_secs(30);

/// `watch` within [`EVENTUALLY`], or the case fails naming `what`.
pub(crate) async fn eventually<T>(what: &str, watch: impl Future<Output = T>) -> T {
    tokio::time::timeout(EVENTUALLY, watch)
        .await
        .unwrap_or_else(|_| panic!("{what}: not woken within {EVENTUALLY:?}"))
}

/// A handle, its clock, a heartbeating instance and an owner.
pub(crate) struct Fixture<S> {
    pub(crate) store: S,
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) me: InstanceId,
    pub(crate) owner: Owner,
}

pub(crate) async fn fixture<H: TaskHarness>(h: &H) -> Fixture<H::Store> {
    fixture_with(h, test_options(&test_clock())).await
}

pub(crate) async fn fixture_with<H: TaskHarness>(
    h: &H,
    options: StoreOptions,
) -> Fixture<H::Store> {
    let clock = test_clock();
    let store = h.open(options.clock(clock.clone())).await;
    let me = InstanceId::generate().unwrap();
    assert!(store.heartbeat(me, DAY).await.unwrap());
    Fixture {
        store,
        clock,
        me,
        owner: Owner::principal(b"alice").unwrap(),
    }
}

impl<S: RuntimeStore> Fixture<S> {
    pub(crate) async fn create(&self) -> (TaskId, String) {
        self.create_with(NewTask::new(&self.owner, self.me)).await
    }

    pub(crate) async fn create_with(&self, task: NewTask<'_>) -> (TaskId, String) {
        let (id, record) = self.store.create(task).await.unwrap();
        assert_eq!(record.status, TaskStatus::Working);
        (id, id.to_string())
    }

    pub(crate) async fn get(&self, id: &str) -> TaskRecord {
        self.store
            .get(id, &self.owner)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("task {id:?} should be readable"))
    }

    pub(crate) async fn apply(&self, id: &TaskId, change: WorkerChange<'_>) -> Applied {
        self.store.apply(id, self.me, change).await.unwrap()
    }

    pub(crate) async fn request(&self, id: &TaskId, key: &str) {
        let applied = self
            .apply(
                id,
                WorkerChange::RequestInput {
                    key,
                    request: b"{\"q\":1}",
                },
            )
            .await;
        assert!(
            matches!(applied, Applied::Changed { .. }),
            "request {key:?}: {applied:?}"
        );
    }

    pub(crate) async fn answer(&self, id: &str, responses: &[(&str, &[u8])]) -> TaskRecord {
        self.store
            .answer(id, &self.owner, responses)
            .await
            .unwrap()
            .expect("the owner may answer")
    }

    pub(crate) async fn cancel(&self, id: &str, mode: CancelMode) -> TaskRecord {
        self.cancel_because(id, mode, None).await
    }

    pub(crate) async fn cancel_because(
        &self,
        id: &str,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> TaskRecord {
        self.store
            .request_cancel(id, &self.owner, mode, reason)
            .await
            .unwrap()
            .expect("the owner may cancel")
    }

    pub(crate) async fn take(&self, id: &TaskId, key: &str) -> Option<Vec<u8>> {
        match self.apply(id, WorkerChange::TakeAnswer { key }).await {
            Applied::Changed { answer, .. } => answer.map(|a| a.to_vec()),
            other => panic!("take_answer({key:?}): {other:?}"),
        }
    }

    pub(crate) async fn close<H: TaskHarness<Store = S>>(self, h: &H) {
        h.close(self.store).await;
    }
}

pub(crate) fn is_changed(applied: &Applied) -> bool {
    matches!(applied, Applied::Changed { .. })
}

/// The keys of `(key, bytes)` pairs, in order.
pub(crate) fn keys<T>(pairs: &[(String, T)]) -> Vec<&str> {
    pairs.iter().map(|(k, _)| k.as_str()).collect()
}

pub(crate) fn assert_too_large<T: std::fmt::Debug>(
    result: mcp_event_store_core::Result<T>,
    what: &str,
) {
    match result {
        Err(Error::PayloadTooLarge { .. }) => {}
        other => panic!("{what}: expected PayloadTooLarge, got {other:?}"),
    }
}
