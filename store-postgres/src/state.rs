//! What the clones of one [`PostgresStore`] share ([`Inner`]: the pools, the
//! statements, the stream key, the append batcher, the follows and the
//! vacuum count), and the accessors the job files reach it through.

use std::sync::atomic::{AtomicU64, Ordering};

use mcp_event_store_core::StoreOptions;
use mcp_event_store_core::backend::StreamKey;
use mcp_event_store_core::task::TaskOptions;
use sqlx::postgres::PgPool;

use crate::PostgresStore;
use crate::append::Batcher;
use crate::batches::Batched;
use crate::creates::Creates;
use crate::follow::{Follows, Notifier};
use crate::options::{VACUUM_MIN_ROWS, Vacuum};
use crate::sql::Sql;
use crate::steps::Applies;
use crate::tasks::Reads;

/// What the clones of one handle share.
pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    pub(crate) sql: Sql,
    pub(crate) key: StreamKey,
    pub(crate) options: StoreOptions,
    pub(crate) schema: String,
    pub(crate) page_size: i64,
    /// Whether purges vacuum the store's tables.
    pub(crate) vacuum: Vacuum,
    /// Rows this handle's purges deleted since it last vacuumed.
    pub(crate) deleted_since_vacuum: AtomicU64,
    /// Runs appends alone or batched with concurrent ones, and announces
    /// them to other handles once committed.
    pub(crate) batcher: Batcher,
    /// Runs task creates alone or batched with concurrent ones.
    pub(crate) creates: Batched<Creates>,
    /// Runs task reads alone or batched with concurrent ones.
    pub(crate) reads: Batched<Reads>,
    /// Runs worker steps alone or batched with concurrent ones.
    pub(crate) applies: Batched<Applies>,
    /// The wake-up hub and the listener of this handle's follows.
    pub(crate) follows: Follows,
    /// Announces committed appends (through the batcher) and task changes
    /// to other handles.
    pub(crate) notifier: Notifier,
    /// The task heartbeat's own connection (a pool of one, connecting on
    /// the first heartbeat): a renewal never waits behind the calls that
    /// fill the main pool, so a busy instance is not taken for a dead one
    /// (T11).
    pub(crate) heartbeats: PgPool,
}

impl PostgresStore {
    /// The connection task heartbeats renew on.
    pub(crate) fn heartbeats(&self) -> &PgPool {
        &self.inner.heartbeats
    }

    /// The statements, with this store's schema spliced in.
    pub(crate) fn sql(&self) -> &Sql {
        &self.inner.sql
    }

    /// The schema's stream key.
    pub(crate) fn key(&self) -> &StreamKey {
        &self.inner.key
    }

    /// Events one replay page reads at most.
    pub(crate) fn page_size(&self) -> i64 {
        self.inner.page_size
    }

    /// Runs this handle's appends.
    pub(crate) fn batcher(&self) -> &Batcher {
        &self.inner.batcher
    }

    /// This handle's wake-up hub and listener.
    pub(crate) fn follows(&self) -> &Follows {
        &self.inner.follows
    }

    /// Runs this handle's task creates.
    pub(crate) fn creates(&self) -> &Batched<Creates> {
        &self.inner.creates
    }

    /// Runs this handle's worker steps.
    pub(crate) fn applies(&self) -> &Batched<Applies> {
        &self.inner.applies
    }

    /// Runs this handle's task reads.
    pub(crate) fn reads(&self) -> &Batched<Reads> {
        &self.inner.reads
    }

    /// Announces committed changes to other handles.
    pub(crate) fn notifier(&self) -> &Notifier {
        &self.inner.notifier
    }

    /// How long this handle's tasks live.
    pub(crate) fn task_options(&self) -> &TaskOptions {
        &self.inner.options.tasks
    }

    /// The store clock's time, in milliseconds.
    pub(crate) fn now(&self) -> i64 {
        self.inner.options.clock.now_millis()
    }

    /// Counts rows a purge deleted and says whether, under
    /// [`Vacuum::Auto`], enough have gone since the last vacuum to weigh
    /// one (see [`purge::vacuum_if_due`](crate::purge::vacuum_if_due)).
    pub(crate) fn add_deleted(&self, rows: u64) -> Option<u64> {
        let total = self
            .inner
            .deleted_since_vacuum
            .fetch_add(rows, Ordering::Relaxed)
            .saturating_add(rows);
        (self.inner.vacuum == Vacuum::Auto && total >= VACUUM_MIN_ROWS).then_some(total)
    }

    /// Starts counting afresh after a vacuum that covered `rows` deletions.
    pub(crate) fn vacuumed(&self, rows: u64) {
        // Deletions that raced with the vacuum stay counted.
        let _ = self.inner.deleted_since_vacuum.fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |n| Some(n.saturating_sub(rows)),
        );
    }
}
