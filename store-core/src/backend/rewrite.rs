//! The rewrite side of a backend (C22): what [`RewriteStore`] needs from
//! the database, a listing and a compare-and-swap per kind of value.
//!
//! [`RewriteStore`] is written once, here, over [`RewriteBackend`]: the
//! closed check, the limits, the length rule and the event refusal of a
//! backend that keeps events in an append-only log. A backend receives
//! only checked input: a limit of 1 to [`MAX_LIST_PAGE`](crate::MAX_LIST_PAGE),
//! a valid stream id, and new bytes as long as the expected ones. Each
//! swap is one atomic step of the database (a conditional `UPDATE`, a
//! compare-and-swap, a script, a revision-checked write) that writes only
//! if the value holds exactly `expected`, and changes nothing else.

use async_trait::async_trait;

use crate::backend::jobs::{BackendHandle, ensure_open};
use crate::error::{Error, Result};
use crate::id::EventId;
use crate::inspect::check_list_limit;
use crate::options::validate_stream_id;
use crate::rewrite::{RewriteStore, SessionValuePage, Swap, TaskField, TaskValuePage};
use crate::session::SessionDigest;
use crate::store::{EventStore, Replay};
use crate::task::TaskDigest;

/// What a database makes different when values are listed and swapped in
/// place (C22); see the [module docs](self).
#[async_trait]
pub trait RewriteBackend: BackendHandle {
    /// Whether events can be swapped in place: `false` for an append-only
    /// log, whose [`event_swap`](Self::event_swap) is then never called.
    fn rewrites_events(&self) -> bool;

    /// Replaces the data of event `id` of `stream_id` with `new` if it is
    /// `expected` (same length), keeping the event's id, time and retry
    /// hint; `false` if it is not, or the event is gone.
    async fn event_swap(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool>;

    /// Up to `limit` stored sessions after `after`, ascending by digest.
    async fn session_page(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage>;

    /// Replaces the state stored under `digest` with `new` if it is
    /// `expected` (same length), keeping the expiry; `false` if it is not,
    /// or the session is gone.
    async fn session_swap(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool>;

    /// Up to `limit` stored tasks after `after`, ascending by digest, each
    /// with every value it holds.
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage>;

    /// Replaces the value `field` of task `digest` with `new` if it is
    /// `expected` (same length), changing nothing else (not the task's
    /// `rev`); `false` if it is not, or the task or input is gone.
    async fn task_swap(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool>;
}

/// The task keys an operator's listing pages through (T22): up to `limit`
/// (checked) after `after`, ascending, and where the next page starts.
/// Every [`RewriteBackend`] has them from its task listing; a store of
/// tasks alone lists its own.
#[async_trait]
pub trait TaskKeys: Send + Sync {
    /// See the [trait docs](TaskKeys).
    async fn task_keys(
        &self,
        after: Option<&TaskDigest>,
        limit: usize,
    ) -> Result<(Vec<TaskDigest>, Option<TaskDigest>)>;
}

#[async_trait]
impl<B: RewriteBackend> TaskKeys for B {
    async fn task_keys(
        &self,
        after: Option<&TaskDigest>,
        limit: usize,
    ) -> Result<(Vec<TaskDigest>, Option<TaskDigest>)> {
        Ok(self.task_page(after, limit).await?.keys())
    }
}

/// The length rule every swap checks.
fn same_length(expected: &[u8], new: &[u8]) -> Result<()> {
    if expected.len() == new.len() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "a swap keeps a value's length: {} bytes expected, {} given",
            expected.len(),
            new.len()
        )))
    }
}

fn swapped(done: bool) -> Swap {
    if done { Swap::Swapped } else { Swap::Changed }
}

#[async_trait]
impl<B: RewriteBackend + EventStore> RewriteStore for B {
    async fn event_values(&self, stream_id: &str) -> Result<Replay> {
        self.replay_stream(stream_id).await
    }

    fn rewrites_events(&self) -> bool {
        RewriteBackend::rewrites_events(self)
    }

    async fn swap_event(
        &self,
        stream_id: &str,
        id: &EventId,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap> {
        ensure_open(self)?;
        validate_stream_id(stream_id)?;
        same_length(expected, new)?;
        if !RewriteBackend::rewrites_events(self) {
            return Err(Error::Config(format!(
                "the {} backend keeps events in an append-only log: they cannot be \
                 rewritten in place, and leave with retention",
                B::NAME
            )));
        }
        Ok(swapped(
            self.event_swap(stream_id, id, expected, new).await?,
        ))
    }

    async fn session_values(
        &self,
        after: Option<&SessionDigest>,
        limit: usize,
    ) -> Result<SessionValuePage> {
        ensure_open(self)?;
        let limit = check_list_limit(limit)?;
        self.session_page(after, limit).await
    }

    async fn swap_session(
        &self,
        digest: &SessionDigest,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap> {
        ensure_open(self)?;
        same_length(expected, new)?;
        Ok(swapped(self.session_swap(digest, expected, new).await?))
    }

    async fn task_values(&self, after: Option<&TaskDigest>, limit: usize) -> Result<TaskValuePage> {
        ensure_open(self)?;
        let limit = check_list_limit(limit)?;
        self.task_page(after, limit).await
    }

    async fn swap_task(
        &self,
        digest: &TaskDigest,
        field: &TaskField,
        expected: &[u8],
        new: &[u8],
    ) -> Result<Swap> {
        ensure_open(self)?;
        same_length(expected, new)?;
        Ok(swapped(self.task_swap(digest, field, expected, new).await?))
    }
}
