//! What the clones of one [`RedisStore`] share ([`Inner`]: the connection,
//! the keys, the stream secret, the options, the follow watcher and the
//! task wake-ups), and the plumbing the job files reach it through.

use std::sync::RwLock;
use std::sync::atomic::AtomicBool;

use mcp_event_store_core::backend::{BackendHandle, StreamKey};
use mcp_event_store_core::{Error, Result};
use redis::{FromRedisValue, Pipeline};

use crate::conn::{Conn, Wait};
use crate::error::backend;
use crate::follow::Follow;
use crate::keys::Keys;
use crate::{RedisOptions, RedisStore};

/// What the clones of one handle share.
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) keys: Keys,
    pub(crate) secret: Secret,
    pub(crate) options: RedisOptions,
    pub(crate) follow: Follow,
    /// The task watchers' wake-ups and their subscriber.
    pub(crate) tasks: crate::tasks::TaskWakeups,
    /// Set by [`RedisStore::close`].
    pub(crate) closed: AtomicBool,
}

/// What the job files share.
impl RedisStore {
    pub(crate) fn conn(&self) -> Conn {
        self.inner.conn.clone()
    }

    /// The stream secret this handle uses now.
    pub(crate) fn key(&self) -> StreamKey {
        self.inner.secret.current()
    }

    /// `WAIT` arguments, if appends wait for replicas.
    pub(crate) fn wait(&self) -> Wait {
        self.inner.options.wait()
    }

    pub(crate) fn now(&self) -> i64 {
        self.inner.options.store.clock.now_millis()
    }

    pub(crate) fn page_size(&self) -> usize {
        self.inner.options.store.page_size
    }

    /// Runs a read-only pipeline, retrying once if the connection dropped
    /// under it (reads are idempotent; appends are never retried). Refused
    /// once the handle is closed, so the later pages of a replay are too,
    /// and the re-reads of follows and task watches, which `close` wakes.
    pub(crate) async fn read<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        let mut conn = self.conn();
        match pipe.query_async(&mut conn).await {
            Ok(value) => Ok(value),
            Err(e) if e.is_connection_dropped() || (e.is_io_error() && !e.is_timeout()) => {
                tracing::debug!(error = %e, "connection lost during a read; retrying once");
                pipe.query_async(&mut conn).await.map_err(backend)
            }
            Err(e) => Err(backend(e)),
        }
    }
}

/// The stream secret a handle currently uses; replaced when the stored one
/// turns out to differ.
pub(crate) struct Secret(RwLock<StreamKey>);

impl Secret {
    /// Holds `key`.
    pub(crate) fn new(key: StreamKey) -> Self {
        Self(RwLock::new(key))
    }

    /// The secret in use now.
    pub(crate) fn current(&self) -> StreamKey {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Uses `key` from now on.
    pub(crate) fn adopt(&self, key: StreamKey) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = key;
    }
}
