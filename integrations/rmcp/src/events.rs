//! rmcp's `EventStore` over ours.

use std::borrow::Cow;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_core::Stream;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventStore as RmcpEventStoreTrait, EventStoreError, EventStream, ServerSseMessage,
};

use super::AdapterError;
use super::codec::{decode, encode};
use mcp_event_store_core::EventId;
use mcp_event_store_core::EventStore;
use mcp_event_store_core::FollowOptions;
use mcp_event_store_core::NewEvent;
use mcp_event_store_core::SessionDigest;
use mcp_event_store_runtime::Runtime;

/// Any of our [`EventStore`]s as rmcp's
/// `rmcp::transport::streamable_http_server::session::EventStore`.
///
/// Build it with [`RmcpEventStore::new`] or
/// [`IntoRmcp::into_rmcp`](super::IntoRmcp::into_rmcp), and hand it to
/// `LocalSessionManager::with_event_store` (session mode) or
/// `NeverSessionManager::with_event_store` (stateless mode).
///
/// A resume *follows* its stream by default (C13): it delivers what is
/// stored after `Last-Event-ID`, then each message appended afterwards by
/// any server instance sharing the store, and ends right after the JSON-RPC
/// response (or error) that answers the stream's request. The standalone
/// stream (`<session>:common`), and a request stream whose answer has not
/// come, end after [`DEFAULT_FOLLOW_HOLD`] (see
/// [`with_follow_hold`](RmcpEventStore::with_follow_hold)); the client then
/// resumes again with the newest id it received (SEP-1699).
/// [`without_follow`](RmcpEventStore::without_follow) restores plain
/// replays that end with what is stored.
///
/// See the [module documentation](super) for how messages are stored and
/// what happens when a replay fails half way.
pub struct RmcpEventStore<S: ?Sized> {
    store: Arc<S>,
    follow_hold: Option<Duration>,
    /// The instance's runtime: its lease tells followers elsewhere whether
    /// the writer of a stream lives (and this store keeps it running).
    runtime: Option<Runtime>,
}

/// How long a resume keeps following a stream with no answer to end it:
/// five minutes, long enough for most tool calls to finish within one
/// resume, short enough that an idle standalone stream is handed back.
pub const DEFAULT_FOLLOW_HOLD: Duration = Duration::from_secs(300);

impl<S: ?Sized> RmcpEventStore<S> {
    /// Wraps a store; resumes follow their stream for at most
    /// [`DEFAULT_FOLLOW_HOLD`].
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            follow_hold: Some(DEFAULT_FOLLOW_HOLD),
            runtime: None,
        }
    }

    /// Follows a resumed stream for at most `hold` when no answer ends it
    /// sooner.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use mcp_event_store_core::MemoryStore;
    /// use mcp_event_store_rmcp::RmcpEventStore;
    ///
    /// let events = RmcpEventStore::new(Arc::new(MemoryStore::new()))
    ///     .with_follow_hold(Duration::from_secs(30));
    /// assert_eq!(events.follow_hold(), Some(Duration::from_secs(30)));
    /// // Hand rmcp an `Arc` of it, as `into_rmcp` does.
    /// let events = Arc::new(events);
    /// ```
    pub fn with_follow_hold(mut self, hold: Duration) -> Self {
        self.follow_hold = Some(hold);
        self
    }

    /// Resumes replay what is stored and end there, as before following
    /// existed: the client polls again for what comes later.
    pub fn without_follow(mut self) -> Self {
        self.follow_hold = None;
        self
    }

    /// How long a resume follows its stream, or `None` if it does not.
    pub fn follow_hold(&self) -> Option<Duration> {
        self.follow_hold
    }

    /// Records this instance (the runtime's) as the writer of each request
    /// stream it starts, and ends a followed resume of a request stream
    /// once its writer is known gone, right after what it stored: a resume
    /// on instance B of a call whose instance A was killed ends about one
    /// lease after A died, rather than after the whole follow hold, and the
    /// client can call again ([`Runtime::produces`],
    /// [`Runtime::producer_lost`]). Give every instance sharing the store
    /// its runtime.
    ///
    /// A stream's writer is recorded when rmcp stores the stream's priming
    /// event (it does so for every request stream while
    /// `StreamableHttpServerConfig::sse_retry` is set, as it is by
    /// default): one session-store write per tool call. The standalone
    /// stream (`<session>:common`) has no one writer and is followed for
    /// the whole hold.
    pub fn with_runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
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
            follow_hold: self.follow_hold,
            runtime: self.runtime.clone(),
        }
    }
}

impl<S: ?Sized> fmt::Debug for RmcpEventStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RmcpEventStore")
            .field("follow_hold", &self.follow_hold)
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
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
                &stored_stream_id(stream_id),
                NewEvent {
                    data: &payload,
                    retry,
                },
            )
            .await
            .map_err(|e| AdapterError::store("store_event", e))?;
        if let Some(runtime) = &self.runtime
            && event.message.is_none()
            && !stream_id.ends_with(STANDALONE_STREAM_SUFFIX)
        {
            // A request stream's priming event: the stream starts here.
            if let Err(error) = runtime.produces(&id.token).await {
                tracing::warn!(%error, stream_id, "cannot record this instance as the stream's writer; a resume elsewhere follows it for the whole hold");
            }
        }
        Ok(id.to_string())
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> std::result::Result<EventStream, EventStoreError> {
        let replay = match self.follow_hold {
            Some(hold) => {
                let mut options = FollowOptions::default().max_hold(hold);
                // Ended early once the stream's writer is gone (a request
                // stream; its id is checked again by the replay).
                if let (Some(runtime), Some(id)) = (&self.runtime, EventId::parse(last_event_id)) {
                    options = options.until(runtime.producer_lost(id.token));
                }
                self.store
                    .follow_events_after(last_event_id, options)
                    .await
                    .map_err(|e| AdapterError::store("replay", e))?
            }
            None => self
                .store
                .replay_events_after(last_event_id)
                .await
                .map_err(|e| AdapterError::store("replay", e))?,
        };
        Ok(Box::pin(ReplayStream {
            events: Mutex::new(replay.events),
            end_after_answer: self.follow_hold.is_some()
                && !replay.stream_id.ends_with(STANDALONE_STREAM_SUFFIX),
            stream_id: replay.stream_id,
            last_event_id: last_event_id.to_owned(),
            done: false,
        }))
    }
}

/// rmcp's name for a session's standalone (GET) stream ends with this; it
/// carries no answers, so only the hold ends a follow of it.
const STANDALONE_STREAM_SUFFIX: &str = ":common";

/// The stream id the store keeps for rmcp's `stream_id`: a session's
/// standalone stream (`<session id>:common`) as `<digest>:common`, the
/// session id's [`SessionDigest`] in hex (C20), so no stream id in the
/// store names a live session; a request stream (a random UUID) as it is.
pub(crate) fn stored_stream_id(stream_id: &str) -> Cow<'_, str> {
    match stream_id.strip_suffix(STANDALONE_STREAM_SUFFIX) {
        Some(session) => Cow::Owned(format!(
            "{}{STANDALONE_STREAM_SUFFIX}",
            SessionDigest::of(session).hex()
        )),
        None => Cow::Borrowed(stream_id),
    }
}

/// Whether the store's stream id `stored` is `session`'s standalone stream:
/// as [`stored_stream_id`] names it, or as a release before it did (the
/// session id itself, in streams written before, until retention takes
/// them).
pub(crate) fn is_standalone_of(stored: &str, session: &str) -> bool {
    stored
        .strip_suffix(STANDALONE_STREAM_SUFFIX)
        .is_some_and(|named| {
            named == session || SessionDigest::from_hex(named) == Some(SessionDigest::of(session))
        })
}

/// A replay as rmcp wants it: `Send + Sync`, no error items.
///
/// The backend's stream is `Send` but not `Sync`; it sits in a mutex that is
/// only reached through `&mut self` (`Mutex::get_mut`), so it is never
/// actually locked. On the first error the stream logs it and ends.
struct ReplayStream {
    events: Mutex<mcp_event_store_core::ReplayEvents>,
    stream_id: String,
    /// The newest id handed out so far (initially the client's cursor), for
    /// the log line if the replay breaks off.
    last_event_id: String,
    /// A followed request stream ends after the message answering its
    /// request, as rmcp ends the live response.
    end_after_answer: bool,
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
        let failure = match Pin::new(events).poll_next(cx) {
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
                    if this.end_after_answer
                        && message.message.as_deref().is_some_and(|message| {
                            matches!(
                                message,
                                ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
                            )
                        })
                    {
                        this.done = true;
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
