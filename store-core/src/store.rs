//! The two traits every backend implements, and the replay result.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_core::future::BoxFuture;
use futures_core::stream::BoxStream;
use futures_util::StreamExt;

use crate::error::Result;
use crate::event::{NewEvent, StoredEvent};
use crate::id::{EventId, Position};
use crate::inspect::{HealthReport, StoreStats, StreamCursor, StreamPage};
use crate::options::{PurgeReport, Retention};
use crate::redeem::RedeemStore;
use crate::rewrite::RewriteStore;
use crate::task::{Owner, RuntimeStore, TaskStore};

/// How a follow ends, besides being dropped or failing.
///
/// ```
/// use std::time::Duration;
/// use mcp_event_store_core::FollowOptions;
///
/// // Hand the client back after 30 s; it resumes with its newest id.
/// let options = FollowOptions::default().max_hold(Duration::from_secs(30));
/// assert_eq!(options.max_hold, Some(Duration::from_secs(30)));
/// // Or as soon as nothing more can come (here: never).
/// let options = options.until(std::future::pending());
/// assert!(options.until.is_some());
/// ```
#[derive(Default)]
#[non_exhaustive]
pub struct FollowOptions {
    /// End the follow this long after it opened, even if events may still
    /// come; `None` (the default) follows until dropped.
    pub max_hold: Option<Duration>,
    /// End the follow once this resolves: it then reads what is stored
    /// once more, delivers it and ends, so it never ends in the middle of
    /// stored events. For a stream nothing more will be appended to, such
    /// as one whose writer is known gone (the runtime crate's
    /// `Runtime::producer_lost`).
    pub until: Option<BoxFuture<'static, ()>>,
}

impl fmt::Debug for FollowOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FollowOptions")
            .field("max_hold", &self.max_hold)
            .field("until", &self.until.as_ref().map(|_| ".."))
            .finish()
    }
}

impl FollowOptions {
    /// Ends the follow `hold` after it opened.
    pub fn max_hold(mut self, hold: Duration) -> Self {
        self.max_hold = Some(hold);
        self
    }

    /// Ends the follow, once it delivered what is stored, when `end`
    /// resolves (see [`until`](Self::until)).
    pub fn until(mut self, end: impl Future<Output = ()> + Send + 'static) -> Self {
        self.until = Some(Box::pin(end));
        self
    }
}

/// A durable, shared log of SSE events, one ordered stream per stream id.
///
/// Every method is cancel-safe in the sense a database user expects: a call
/// dropped before it returns may or may not have taken effect, but never
/// leaves the store inconsistent. The trait is object safe: hold stores as
/// `Arc<dyn EventStore>`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use futures_util::TryStreamExt;
/// use mcp_event_store_core::{EventStore, MemoryStore, NewEvent};
///
/// let store = MemoryStore::new();
/// let first = store.store_event("stream-a", NewEvent::new(b"one")).await?;
/// store.store_event("stream-a", NewEvent::new(b"two")).await?;
///
/// let replay = store.replay_events_after(&first.to_string()).await?;
/// assert_eq!(replay.stream_id, "stream-a");
/// let missed: Vec<_> = replay.events.try_collect().await?;
/// assert_eq!(missed.len(), 1);
/// assert_eq!(&missed[0].data[..], b"two");
/// # Ok(()) }
/// ```
#[async_trait]
pub trait EventStore: Send + Sync + 'static {
    /// Appends an event to `stream_id` and returns its id once the event is
    /// durable under the store's durability setting (C1).
    async fn store_event(&self, stream_id: &str, event: NewEvent<'_>) -> Result<EventId>;

    /// Everything stored on `last_event_id`'s stream after it, in order (C3).
    ///
    /// Fails with [`Error::UnknownEventId`](crate::Error::UnknownEventId) for
    /// ids this store never issued and [`Error::EventsPurged`](crate::Error::EventsPurged)
    /// when retention removed part of what follows (C5). The event stream
    /// itself reads the backend page by page and ends at the newest event it
    /// finds; it yields `EventsPurged` if a purge races it and would open a gap.
    async fn replay_events_after(&self, last_event_id: &str) -> Result<Replay>;

    /// Every retained event of `stream_id`, from its oldest, in order, with
    /// their original ids (C16): a replay that needs no cursor, for a
    /// transport that numbers its events itself and keeps its numbers in the
    /// payloads (tower-mcp's event store).
    ///
    /// A stream never written, deleted, or expired whole replays nothing;
    /// an invalid stream id is [`Error::InvalidStreamId`](crate::Error::InvalidStreamId).
    /// The event stream pages through the backend like every replay (C3),
    /// and yields [`Error::EventsPurged`](crate::Error::EventsPurged) if
    /// retention removes an event it has not reached yet: it never skips one.
    ///
    /// Provided, so that a store written before it keeps compiling; the
    /// default refuses with [`Error::Config`](crate::Error::Config). Every
    /// store of this project implements it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// use futures_util::TryStreamExt;
    /// use mcp_event_store_core::{EventStore, MemoryStore, NewEvent};
    ///
    /// let store = MemoryStore::new();
    /// store.store_event("session-1", NewEvent::new(b"one")).await?;
    /// store.store_event("session-1", NewEvent::new(b"two")).await?;
    /// let replay = store.replay_stream("session-1").await?;
    /// let all: Vec<_> = replay.events.try_collect().await?;
    /// assert_eq!(all.len(), 2);
    /// assert_eq!(&all[0].data[..], b"one");
    /// let none: Vec<_> = store.replay_stream("never-written").await?.events.try_collect().await?;
    /// assert!(none.is_empty());
    /// # Ok(()) }
    /// ```
    async fn replay_stream(&self, stream_id: &str) -> Result<Replay> {
        let _ = stream_id;
        Err(crate::Error::Config(
            "this store cannot replay a stream from its oldest event (C16)".into(),
        ))
    }

    /// The stream of a retained event, or `None` for unknown, expired or
    /// malformed ids (C4).
    async fn get_stream_id_for_event_id(&self, event_id: &str) -> Result<Option<String>>;

    /// Removes a stream and all its events; returns how many events went.
    async fn delete_stream(&self, stream_id: &str) -> Result<u64>;

    /// Applies the retention limits now (C8), and removes expired sessions.
    async fn purge_expired(&self) -> Result<PurgeReport>;

    /// A replay that stays open (C13): the events stored after
    /// `last_event_id`, then each event appended to that stream afterwards,
    /// through any handle or process sharing the storage, in order, each
    /// once.
    ///
    /// Fails at once as [`replay_events_after`](EventStore::replay_events_after)
    /// does. The event stream ends when dropped (releasing everything it
    /// held), when [`FollowOptions::max_hold`] passes, or after yielding an
    /// error: [`Error::EventsPurged`](crate::Error::EventsPurged) if
    /// retention overtakes a slow follower.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// use futures_util::StreamExt;
    /// use mcp_event_store_core::{EventStore, FollowOptions, MemoryStore, NewEvent};
    ///
    /// let store = MemoryStore::new();
    /// let first = store.store_event("call-7", NewEvent::new(b"progress 1")).await?;
    /// let mut follow = store
    ///     .follow_events_after(&first.to_string(), FollowOptions::default())
    ///     .await?;
    /// // Appended after the follow opened: delivered live.
    /// store.store_event("call-7", NewEvent::new(b"result")).await?;
    /// let next = follow.events.next().await.unwrap()?;
    /// assert_eq!(&next.data[..], b"result");
    /// # Ok(()) }
    /// ```
    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: FollowOptions,
    ) -> Result<Replay>;

    /// How many follows are open on this handle now; a dropped follow is
    /// no longer counted (C13).
    fn open_follows(&self) -> usize;

    /// The retention this handle enforces, as it was opened (C8): what an
    /// integration reads to keep what guards a stream (a session binding, a
    /// writer's record) as long as its events.
    fn retention(&self) -> Retention;

    /// Store-wide totals: streams, events, payload bytes, oldest and newest
    /// event time (C15). Reads every stream's summary, not every event.
    async fn stats(&self) -> Result<StoreStats>;

    /// One page of streams with their event count, bytes and ages (C15),
    /// starting after `after` (`None`: the first page). At most `limit`
    /// streams, cut to [`MAX_LIST_PAGE`](crate::MAX_LIST_PAGE); a zero limit
    /// is [`Error::Config`](crate::Error::Config). Streams appended or
    /// removed while paging may or may not appear; none appears twice.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// use mcp_event_store_core::{EventStore, MemoryStore, NewEvent};
    ///
    /// let store = MemoryStore::new();
    /// for stream in ["a", "b", "c"] {
    ///     store.store_event(stream, NewEvent::new(b"x")).await?;
    /// }
    /// let mut seen = Vec::new();
    /// let mut after = None;
    /// loop {
    ///     let page = store.list_streams(after.as_ref(), 2).await?;
    ///     seen.extend(page.streams.into_iter().map(|s| s.stream_id));
    ///     match page.next {
    ///         Some(next) => after = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// seen.sort();
    /// assert_eq!(seen, ["a", "b", "c"]);
    /// # Ok(()) }
    /// ```
    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> Result<StreamPage>;

    /// The storage format and the backend settings that decide whether
    /// acknowledged events survive and the store stays bounded, each with
    /// a verdict and, when risky, its remedy (C15).
    async fn check(&self) -> Result<HealthReport>;

    /// The redemptions of this store's storage (C21): single use of a
    /// nonce across every handle and process sharing it. Through an
    /// `Arc<dyn `[`Store`]`>` (what `connect` hands out), this is how a
    /// server reaches them.
    ///
    /// Every store of this project answers `Some` (a backend's comes with
    /// its event side: every [`EventBackend`](crate::backend::EventBackend)
    /// is a [`RedeemBackend`](crate::backend::RedeemBackend)). Provided,
    /// answering `None`, so that a store written before it (a wrapper
    /// forwarding to another store) keeps compiling; such a wrapper should
    /// forward this too. With `None` there is nothing that could enforce
    /// single use, and callers refuse rather than let a value through
    /// twice.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// use std::sync::Arc;
    /// use std::time::{Duration, SystemTime};
    /// use mcp_event_store_core::task::Owner;
    /// use mcp_event_store_core::{MemoryStore, Redemption, Store};
    ///
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let soon = SystemTime::now() + Duration::from_secs(60);
    /// let redeemer = store.redeemer().unwrap();
    /// assert_eq!(redeemer.redeem(b"n-1", soon, &Owner::Anonymous).await?, Redemption::Redeemed);
    /// assert_eq!(redeemer.redeem(b"n-1", soon, &Owner::Anonymous).await?, Redemption::AlreadyRedeemed);
    /// # Ok(()) }
    /// ```
    fn redeemer(&self) -> Option<&dyn RedeemStore> {
        None
    }

    /// This store's values as the database holds them, listed and swapped
    /// in place (C22): what an operator's tool re-sealing the store under
    /// a new key works on (see [`rewrite`](crate::rewrite)).
    ///
    /// Every store of this project answers `Some` (every
    /// [`EventBackend`](crate::backend::EventBackend) is a
    /// [`RewriteBackend`](crate::backend::RewriteBackend)); a decorator
    /// answers with the store underneath's, whose bytes are what it keeps.
    /// Provided, answering `None`, for wrappers written before it.
    fn rewriter(&self) -> Option<&dyn RewriteStore> {
        None
    }
}

/// Opaque session state with a time to live, keyed by session id.
///
/// MCP servers use it to restore a session on another instance behind a load
/// balancer. A store keeps each session under the digest of its id
/// ([`SessionDigest`](crate::SessionDigest)), never the id (C20); the `_as`
/// methods bind a session to the caller who opened it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use std::time::Duration;
/// use mcp_event_store_core::{MemoryStore, SessionStore};
///
/// let store = MemoryStore::new();
/// store.put_session("session-1", b"state", Duration::from_secs(60)).await?;
/// assert_eq!(store.get_session("session-1").await?.as_deref(), Some(&b"state"[..]));
/// assert!(store.delete_session("session-1").await?);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Stores (or replaces) a session's state, to expire after `ttl`.
    async fn put_session(&self, session_id: &str, state: &[u8], ttl: Duration) -> Result<()>;

    /// The session's state, or `None` if it is unknown or expired.
    async fn get_session(&self, session_id: &str) -> Result<Option<Bytes>>;

    /// Removes a session; `true` if it existed and had not expired.
    async fn delete_session(&self, session_id: &str) -> Result<bool>;

    /// Stores (or replaces) a session's state bound to `owner` (C20): only
    /// [`get_session_as`](Self::get_session_as) with the same owner reads
    /// it back.
    ///
    /// The owner is kept with the state, in the value: a session written
    /// this way is read with the `_as` methods only (its plain
    /// [`get_session`](Self::get_session) holds the owner's digest before
    /// the state). Provided over the three methods above, so every store,
    /// and every wrapper of one, binds the same way.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// use std::time::Duration;
    /// use mcp_event_store_core::task::Owner;
    /// use mcp_event_store_core::{MemoryStore, SessionStore};
    ///
    /// let store = MemoryStore::new();
    /// let alice = Owner::principal(b"alice")?;
    /// let bob = Owner::principal(b"bob")?;
    /// store.put_session_as(&alice, "s-1", b"state", Duration::from_secs(60)).await?;
    /// // Bob holding Alice's session id is answered as for an unknown session.
    /// assert_eq!(store.get_session_as(&bob, "s-1").await?, None);
    /// assert!(!store.delete_session_as(&bob, "s-1").await?);
    /// assert_eq!(store.get_session_as(&alice, "s-1").await?.as_deref(), Some(&b"state"[..]));
    /// # Ok(()) }
    /// ```
    async fn put_session_as(
        &self,
        owner: &Owner,
        session_id: &str,
        state: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        let value = crate::session::bind(owner, state);
        self.put_session(session_id, &value, ttl).await
    }

    /// The state of a session stored with
    /// [`put_session_as`](Self::put_session_as) by the same `owner`; `None`
    /// if it is unknown, expired, or bound to another owner (C20): a
    /// session of someone else reads exactly as one that does not exist.
    async fn get_session_as(&self, owner: &Owner, session_id: &str) -> Result<Option<Bytes>> {
        Ok(self
            .get_session(session_id)
            .await?
            .and_then(|value| crate::session::unbind(owner, value)))
    }

    /// Removes a session stored with [`put_session_as`](Self::put_session_as)
    /// if `owner` is its owner; `true` if it existed, had not expired and
    /// was `owner`'s. Another owner's session is left alone and answered
    /// `false`, as an unknown one.
    async fn delete_session_as(&self, owner: &Owner, session_id: &str) -> Result<bool> {
        if self.get_session_as(owner, session_id).await?.is_none() {
            return Ok(false);
        }
        self.delete_session(session_id).await
    }
}

/// A store that is an [`EventStore`], a [`SessionStore`] and a
/// [`TaskStore`] at once: what `connect` hands out, so that one URL serves
/// both protocol eras (resumable streams up to 2025-11-25, durable tasks
/// from 2026-07-28). An `Arc<dyn Store>` passes where an
/// `Arc<dyn TaskStore>` (or any of the three) is wanted.
///
/// What the runtime running tasks needs besides (instances and their
/// leases, claims, writes under a claim) it asks for with
/// [`task_runtime`](Self::task_runtime): a handle offers none of it
/// otherwise.
///
/// Single use of a nonce (C21) it reaches through
/// [`redeemer`](EventStore::redeemer), as every event store does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use mcp_event_store_core::task::{InstanceId, NewTask, Owner, TaskStore};
/// use mcp_event_store_core::{EventStore, MemoryStore, NewEvent, Store};
///
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// store.store_event("stream", NewEvent::new(b"hello")).await?;
/// // The runtime's part, asked for: an instance with a lease.
/// let me = InstanceId::generate()?;
/// store.task_runtime().heartbeat(me, Duration::from_secs(30)).await?;
/// let tasks: Arc<dyn TaskStore> = store.clone();
/// let (id, _) = tasks.create(NewTask::new(&Owner::Anonymous, me)).await?;
/// assert!(store.get(&id.to_string(), &Owner::Anonymous).await?.is_some());
/// # Ok(()) }
/// ```
pub trait Store: EventStore + SessionStore + TaskStore {
    /// This store's runtime operations ([`RuntimeStore`]): for the runtime
    /// that registers instances, claims tasks and writes under its claims.
    /// Applications serving clients need none of it.
    fn task_runtime(&self) -> &dyn RuntimeStore;
}

impl<T: EventStore + SessionStore + RuntimeStore> Store for T {
    fn task_runtime(&self) -> &dyn RuntimeStore {
        self
    }
}

/// The result of [`EventStore::replay_events_after`]: which stream, and its
/// events after the cursor.
pub struct Replay {
    /// The stream the cursor belongs to.
    pub stream_id: String,
    /// The events, read lazily from the backend a page at a time.
    pub events: ReplayEvents,
}

impl Replay {
    /// A replay of `stream_id` with no events: what
    /// [`EventStore::replay_stream`] gives for a stream with none retained.
    pub fn empty(stream_id: &str) -> Self {
        Self {
            stream_id: stream_id.to_owned(),
            events: ReplayEvents::empty(),
        }
    }
}

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("stream_id", &self.stream_id)
            .finish_non_exhaustive()
    }
}

/// The events of a [`Replay`]: a `Stream` of `Result<StoredEvent>`, `Send`,
/// `Unpin` and `'static`, used as any stream is (`next`, `try_collect`,
/// `boxed`).
///
/// A replay read in pages ([`paged_replay`]) hands each event straight out
/// of the page it read, with no boxed stream or per-event bookkeeping in
/// between: a replay's cost is its pages. Any other stream (a follow, a
/// decorator's mapped events) is wrapped with [`ReplayEvents::new`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use futures_util::{StreamExt, TryStreamExt};
/// use mcp_event_store_core::{EventStore, MemoryStore, NewEvent, ReplayEvents};
///
/// let store = MemoryStore::new();
/// let first = store.store_event("s", NewEvent::new(b"one")).await?;
/// store.store_event("s", NewEvent::new(b"two")).await?;
/// let replay = store.replay_events_after(&first.to_string()).await?;
/// // A decorator maps the events and hands them on as a replay's events.
/// let upper: ReplayEvents = ReplayEvents::new(replay.events.map_ok(|mut event| {
///     event.data = event.data.to_ascii_uppercase().into();
///     event
/// }));
/// let events: Vec<_> = upper.try_collect().await?;
/// assert_eq!(&events[0].data[..], b"TWO");
/// # Ok(()) }
/// ```
pub struct ReplayEvents {
    source: Source,
    /// What the replay's span and metrics report when it ends; set by
    /// core's observation of a backend's replay.
    tally: Option<crate::backend::observe::Tally>,
}

enum Source {
    Paged(Paged),
    Stream(BoxStream<'static, Result<StoredEvent>>),
}

impl ReplayEvents {
    /// Events that any stream yields.
    pub fn new(
        events: impl futures_core::Stream<Item = Result<StoredEvent>> + Send + 'static,
    ) -> Self {
        Self::from(events.boxed())
    }

    /// No events.
    pub fn empty() -> Self {
        Self::from_source(Source::Paged(Paged::done()))
    }

    fn from_source(source: Source) -> Self {
        Self {
            source,
            tally: None,
        }
    }

    /// Has the replay's span and metrics report what it handed out when
    /// it is dropped: counted a page at a time, never per event.
    pub(crate) fn observed(mut self, tally: crate::backend::observe::Tally) -> Self {
        self.tally = Some(tally);
        self
    }
}

impl From<BoxStream<'static, Result<StoredEvent>>> for ReplayEvents {
    fn from(events: BoxStream<'static, Result<StoredEvent>>) -> Self {
        Self::from_source(Source::Stream(events))
    }
}

impl fmt::Debug for ReplayEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Paged(paged) => format!("paged, {} buffered", paged.page.len()),
            Source::Stream(_) => "stream".to_owned(),
        };
        f.debug_struct("ReplayEvents")
            .field("source", &source)
            .finish_non_exhaustive()
    }
}

impl futures_core::Stream for ReplayEvents {
    type Item = Result<StoredEvent>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match &mut this.source {
            Source::Paged(paged) => paged.poll_next(cx),
            Source::Stream(events) => {
                let next = events.as_mut().poll_next(cx);
                if let (Some(tally), std::task::Poll::Ready(Some(Ok(event)))) =
                    (&mut this.tally, &next)
                {
                    tally.add(1, event.data.len() as u64);
                }
                next
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.source {
            Source::Paged(paged) => paged.size_hint(),
            Source::Stream(events) => events.size_hint(),
        }
    }
}

impl ReplayEvents {
    /// The events and payload bytes a paged replay handed out so far:
    /// everything its pages read, less what is still buffered.
    fn paged_out(&self) -> Option<(u64, u64)> {
        let Source::Paged(paged) = &self.source else {
            return None;
        };
        let buffered = paged.page.as_slice();
        let unread: u64 = buffered.iter().map(|e| e.data.len() as u64).sum();
        Some((
            paged.read_events - buffered.len() as u64,
            paged.read_bytes - unread,
        ))
    }
}

impl Drop for ReplayEvents {
    fn drop(&mut self) {
        if let Some((events, bytes)) = self.paged_out()
            && let Some(tally) = &mut self.tally
        {
            tally.add(events, bytes);
        }
    }
}

/// One page read from a backend during replay.
#[derive(Debug, Default)]
pub struct Page {
    /// The events, in order, all after the position asked for.
    pub events: Vec<StoredEvent>,
    /// `true` when the backend has nothing more after these events.
    pub last: bool,
}

/// Builds a replay's events from a function that reads one page after a
/// position. The function is called again after each page until it reports
/// the last one, so at most one page is held in memory at a time (C3).
///
/// Backends put their gap checks inside `fetch_page`.
pub fn paged_replay<F, Fut>(after: Position, fetch_page: F) -> ReplayEvents
where
    F: FnMut(Position) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Page>> + Send + 'static,
{
    ReplayEvents::from_source(Source::Paged(Paged::new(after, fetch_page)))
}

/// [`paged_replay`] whose first page was read already (with the cursor
/// check, in the same round trip, say): `first`'s events, then the pages
/// `fetch_page` reads after its newest event, or after `after` when it is
/// empty. Like any page, an empty or last `first` ends the replay.
pub fn paged_replay_with<F, Fut>(after: Position, first: Page, fetch_page: F) -> ReplayEvents
where
    F: FnMut(Position) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Page>> + Send + 'static,
{
    let mut paged = Paged::new(after, fetch_page);
    paged.take(first);
    ReplayEvents::from_source(Source::Paged(paged))
}

/// A replay's pages: each event straight from the page being read out, and
/// the next page asked for only once that one is used up. Concrete, so
/// that handing out an event is a call the compiler sees through; only the
/// page read behind it is boxed.
struct Paged {
    /// Where the next page starts: the newest event of the last page.
    after: Position,
    fetch_page: Box<dyn FnMut(Position) -> BoxFuture<'static, Result<Page>> + Send>,
    /// The page being read out.
    page: std::vec::IntoIter<StoredEvent>,
    /// The read of the next page, once asked for.
    reading: Option<BoxFuture<'static, Result<Page>>>,
    /// Set by the last page, or an error: nothing more after `page`.
    done: bool,
    /// Events and payload bytes of every page read so far.
    read_events: u64,
    read_bytes: u64,
}

impl Paged {
    fn new<F, Fut>(after: Position, mut fetch_page: F) -> Self
    where
        F: FnMut(Position) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Page>> + Send + 'static,
    {
        Self {
            after,
            fetch_page: Box::new(move |after| Box::pin(fetch_page(after))),
            page: Vec::new().into_iter(),
            reading: None,
            done: false,
            read_events: 0,
            read_bytes: 0,
        }
    }

    fn done() -> Self {
        let mut paged = Self::new(Position::seq(0), |_| {
            std::future::ready(Ok(Page::default()))
        });
        paged.done = true;
        paged
    }

    /// Starts reading out `page`; an empty or last one ends the replay.
    fn take(&mut self, page: Page) {
        self.done = page.last || page.events.is_empty();
        if let Some(last) = page.events.last() {
            self.after = last.id.position;
        }
        self.read_events += page.events.len() as u64;
        self.read_bytes += page.events.iter().map(|e| e.data.len() as u64).sum::<u64>();
        self.page = page.events.into_iter();
    }

    #[inline]
    fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<StoredEvent>>> {
        use std::task::Poll;
        loop {
            if let Some(event) = self.page.next() {
                return Poll::Ready(Some(Ok(event)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            let after = self.after;
            let fetch_page = &mut self.fetch_page;
            let reading = self.reading.get_or_insert_with(|| fetch_page(after));
            let result = std::task::ready!(reading.as_mut().poll(cx));
            self.reading = None;
            match result {
                Ok(page) => self.take(page),
                Err(e) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let buffered = self.page.len();
        if self.done {
            (buffered, Some(buffered))
        } else {
            (buffered, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::StreamKey;
    use futures_util::TryStreamExt;

    #[tokio::test]
    async fn paged_replay_reads_page_by_page_until_the_last() {
        let token = StreamKey::generate().unwrap().token("s");
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = calls.clone();
        let events = paged_replay(Position::seq(0), move |after| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let events: Vec<_> = (after.major + 1..=(after.major + 3).min(7))
                    .map(|seq| StoredEvent {
                        id: EventId::new(token, Position::seq(seq)),
                        data: Bytes::new(),
                        retry: None,
                    })
                    .collect();
                Ok(Page {
                    last: events.len() < 3,
                    events,
                })
            }
        });
        let got: Vec<u64> = events
            .map_ok(|e| e.id.position.major)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(got, (1..=7).collect::<Vec<_>>());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_replay_with_its_first_page_reads_on_after_it() {
        let token = StreamKey::generate().unwrap().token("s");
        let event = move |seq| StoredEvent {
            id: EventId::new(token, Position::seq(seq)),
            data: Bytes::new(),
            retry: None,
        };
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let first = Page {
            events: vec![event(4), event(5)],
            last: false,
        };
        let seen = asked.clone();
        let events = paged_replay_with(Position::seq(3), first, move |after| {
            seen.lock().unwrap().push(after.major);
            let events = if after.major < 7 {
                vec![event(after.major + 1)]
            } else {
                vec![]
            };
            async move {
                Ok(Page {
                    last: events.is_empty(),
                    events,
                })
            }
        });
        let got: Vec<u64> = events
            .map_ok(|e| e.id.position.major)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(got, vec![4, 5, 6, 7]);
        assert_eq!(*asked.lock().unwrap(), vec![5, 6, 7]);
        // A first page that is the last asks for nothing more.
        let last = Page {
            events: vec![event(4)],
            last: true,
        };
        let events = paged_replay_with(Position::seq(3), last, |_| async {
            Err::<Page, _>(crate::Error::events_purged("x"))
        });
        assert_eq!(events.collect::<Vec<_>>().await.len(), 1);
    }

    #[tokio::test]
    async fn a_paged_replay_counts_what_it_handed_out_not_what_it_read() {
        let token = StreamKey::generate().unwrap().token("s");
        let mut events = paged_replay(Position::seq(0), move |after| {
            let events: Vec<_> = (after.major + 1..=(after.major + 3).min(7))
                .map(|seq| StoredEvent {
                    id: EventId::new(token, Position::seq(seq)),
                    data: Bytes::from(vec![0u8; seq as usize]),
                    retry: None,
                })
                .collect();
            async move {
                Ok(Page {
                    last: events.len() < 3,
                    events,
                })
            }
        });
        assert_eq!(events.paged_out(), Some((0, 0)));
        for _ in 0..4 {
            events.next().await.unwrap().unwrap();
        }
        // Two pages read (1 to 3, 4 to 6), events 1 to 4 handed out.
        assert_eq!(events.paged_out(), Some((4, 1 + 2 + 3 + 4)));
        let rest: Vec<_> = (&mut events).collect().await;
        assert_eq!(rest.len(), 3);
        assert_eq!(events.paged_out(), Some((7, 28)));
        assert_eq!(
            ReplayEvents::new(futures_util::stream::empty()).paged_out(),
            None
        );
    }

    #[tokio::test]
    async fn paged_replay_surfaces_an_error_and_stops() {
        let events = paged_replay(Position::seq(0), |_| async {
            Err::<Page, _>(crate::Error::events_purged("x"))
        });
        let got: Vec<_> = events.collect().await;
        assert_eq!(got.len(), 1);
        assert!(matches!(got[0], Err(crate::Error::EventsPurged { .. })));
    }
}
