//! rmcp's `EventStore` over ours.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures_core::Stream;
use futures_core::stream::BoxStream;
use rmcp::transport::streamable_http_server::session::{
    EventStore as RmcpEventStoreTrait, EventStoreError, EventStream, ServerSseMessage,
};

use super::AdapterError;
use super::codec::{decode, encode};
use crate::error::Result;
use crate::event::{NewEvent, StoredEvent};
use crate::store::EventStore;

/// Any of our [`EventStore`]s as rmcp's
/// `rmcp::transport::streamable_http_server::session::EventStore`.
///
/// Build it with [`RmcpEventStore::new`] or
/// [`IntoRmcp::into_rmcp`](super::IntoRmcp::into_rmcp), and hand it to
/// `LocalSessionManager::with_event_store` (session mode) or
/// `NeverSessionManager::with_event_store` (stateless mode).
///
/// See the [module documentation](super) for how messages are stored and
/// what happens when a replay fails half way.
pub struct RmcpEventStore<S: ?Sized> {
    store: Arc<S>,
}

impl<S: ?Sized> RmcpEventStore<S> {
    /// Wraps a store.
    pub fn new(store: Arc<S>) -> Self {
        Self { store }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.store
    }
}

impl<S: ?Sized> Clone for RmcpEventStore<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
        }
    }
}

impl<S: ?Sized> fmt::Debug for RmcpEventStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RmcpEventStore").finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: EventStore + ?Sized> RmcpEventStoreTrait for RmcpEventStore<S> {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> std::result::Result<String, EventStoreError> {
        let (payload, retry) = encode(event).map_err(AdapterError::Encode)?;
        let id = self
            .store
            .store_event(
                stream_id,
                NewEvent {
                    data: &payload,
                    retry,
                },
            )
            .await
            .map_err(|e| AdapterError::store("store_event", e))?;
        Ok(id.to_string())
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> std::result::Result<EventStream, EventStoreError> {
        let replay = self
            .store
            .replay_events_after(last_event_id)
            .await
            .map_err(|e| AdapterError::store("replay", e))?;
        Ok(Box::pin(ReplayStream {
            events: Mutex::new(replay.events),
            stream_id: replay.stream_id,
            last_event_id: last_event_id.to_owned(),
            done: false,
        }))
    }
}

/// A replay as rmcp wants it: `Send + Sync`, no error items.
///
/// The backend's stream is `Send` but not `Sync`; it sits in a mutex that is
/// only reached through `&mut self` (`Mutex::get_mut`), so it is never
/// actually locked. On the first error the stream logs it and ends.
struct ReplayStream {
    events: Mutex<BoxStream<'static, Result<StoredEvent>>>,
    stream_id: String,
    /// The newest id handed out so far (initially the client's cursor), for
    /// the log line if the replay breaks off.
    last_event_id: String,
    done: bool,
}

impl Stream for ReplayStream {
    type Item = ServerSseMessage;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ServerSseMessage>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let events = this
            .events
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let failure = match events.as_mut().poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Ok(event))) => match decode(&event) {
                Ok(message) => {
                    if let Some(id) = &message.event_id {
                        this.last_event_id.clone_from(id);
                    }
                    return Poll::Ready(Some(message));
                }
                Err(e) => e.to_string(),
            },
            Poll::Ready(Some(Err(e))) => e.to_string(),
        };
        this.done = true;
        tracing::warn!(
            stream_id = %this.stream_id,
            last_event_id = %this.last_event_id,
            error = %failure,
            "replay ended early; the client can resume from the last event it received"
        );
        Poll::Ready(None)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done { (0, Some(0)) } else { (0, None) }
    }
}
