//! What the instances of one deployment tell each other, over the store's
//! bus (core's [`bus`](mcp_event_store_core::bus), C17 to C19): the
//! answers to server-to-client requests that reached another instance,
//! notifications for listeners wherever they are connected, and sessions
//! ended anywhere.
//!
//! Each comes as a [`Listener`]: it keeps its subscription across backend
//! errors (resuming after the last message, so nothing is lost) and says
//! [`Heard::Missed`] when retention overtook it, then goes on from now.
//! It ends when the runtime shuts down.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use mcp_event_store_core::bus::{Bus, Cursor, Message, Start, StoreBus, Subscription, Topic};
use mcp_event_store_core::task::InstanceId;
use mcp_event_store_core::{Error, Result, SessionDigest};

use crate::Runtime;

/// The topic every instance hears notifications on.
const NOTIFICATIONS: &str = "mcp/notifications";
/// The topic every instance hears ended sessions on.
const ENDED_SESSIONS: &str = "mcp/sessions/ended";
/// The topic of an instance's replies: this and its id.
const REPLIES_PREFIX: &str = "mcp/replies/";

/// How many notifications the listeners sharing one subscription may be
/// behind the quickest before the slowest hears [`Heard::Missed`] (and
/// what they share holds no more).
const FANOUT_CAPACITY: usize = 1_024;

/// How long a runtime remembers a session ended anywhere
/// ([`Runtime::session_ended`]), and how many at most (the oldest go
/// first).
const ENDED_KEPT: Duration = Duration::from_secs(3_600);
const ENDED_MAX: usize = 100_000;

/// The first pause before a listener subscribes again after a backend
/// error; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// What a [`Listener`] yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard<T> {
    /// The next message.
    Message(T),
    /// Retention overtook the listener (it was too slow, or away too
    /// long): messages were lost. It goes on with those published from
    /// now; whoever acts on the messages should catch up from the source
    /// of truth.
    Missed,
}

/// Messages of one kind from every instance, in the order published.
///
/// It keeps its subscription across backend errors (resuming after the
/// last message, so nothing is lost), yields [`Heard::Missed`] when
/// retention overtook it and goes on from now, and ends when the runtime
/// shuts down. It reads the store only as it is polled: a slow listener
/// holds no backlog. (The listeners of
/// [`notifications`](Runtime::notifications) share one subscription
/// instead, within a bounded window: see there.)
pub struct Listener<T> {
    heard: BoxStream<'static, Heard<T>>,
}

impl<T> fmt::Debug for Listener<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}

impl<T> Stream for Listener<T> {
    type Item = Heard<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Heard<T>>> {
        self.heard.poll_next_unpin(cx)
    }
}

/// A server-to-client request's answer that a client sent to another
/// instance, forwarded here, where the request waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The session the client answered in.
    pub session: String,
    /// The JSON-RPC response or error, as the client sent it.
    pub message: Bytes,
}

/// Where [`Runtime::route_reply`] sent an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The request waits here (or its id is not one this runtime minted):
    /// hand the answer to the local session.
    Local,
    /// Forwarded to the instance whose request waits for it.
    Forwarded(InstanceId),
    /// The instance that sent the request is gone (its lease lapsed):
    /// nobody will take the answer.
    Gone(InstanceId),
}

/// Who a notification is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Every listener of every session.
    All,
    /// The listeners of one session, named by its digest (C20: the bus
    /// keeps what it carries in the store, and a session id there would be
    /// a live credential). [`Audience::session`] makes one from an id.
    Session(SessionDigest),
}

impl Audience {
    /// The listeners of the session `id`.
    ///
    /// ```
    /// use mcp_event_store_core::SessionDigest;
    /// use mcp_event_store_runtime::Audience;
    ///
    /// let audience = Audience::session("0b5c4a9e-1b9f-4c55-9f43-7a3c6f0d2e11");
    /// assert_eq!(
    ///     audience,
    ///     Audience::Session(SessionDigest::of("0b5c4a9e-1b9f-4c55-9f43-7a3c6f0d2e11"))
    /// );
    /// ```
    pub fn session(id: &str) -> Self {
        Self::Session(SessionDigest::of(id))
    }
}

/// The session a message on the bus names: a digest's key, or, from an
/// instance of a release before digests, the session id itself.
fn heard_session(bytes: &[u8]) -> Option<SessionDigest> {
    let text = std::str::from_utf8(bytes).ok()?;
    Some(SessionDigest::from_key(text).unwrap_or_else(|| SessionDigest::of(text)))
}

/// A notification raised on some instance, for the listeners of this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// Who it is for.
    pub audience: Audience,
    /// The JSON-RPC notification, as raised.
    pub message: Bytes,
}

impl Runtime {
    /// The store's bus, shared by every instance on the store: for
    /// messages of an application's own.
    pub fn bus(&self) -> &StoreBus {
        &self.inner.bus
    }

    /// Listens to `topic` from now, for as long as the runtime runs.
    pub async fn listen(&self, topic: &Topic) -> Result<Listener<Message>> {
        self.ensure_open()?;
        let first = self.inner.bus.subscribe(topic, Start::Now).await?;
        Ok(self.keep(topic.clone(), first, Some))
    }

    /// A fresh id for a server-to-client request sent from this instance:
    /// unique across instances and restarts, and naming this instance, so
    /// that whichever instance the client answers knows where the request
    /// waits ([`route_reply`](Self::route_reply)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> mcp_event_store_core::Result<()> {
    /// # let store = std::sync::Arc::new(mcp_event_store_core::MemoryStore::new());
    /// # let runtime = mcp_event_store_runtime::Runtime::builder(store).start().await?;
    /// let id = runtime.request_id();
    /// assert!(id.starts_with(&runtime.instance().to_string()));
    /// assert_ne!(runtime.request_id(), id);
    /// # runtime.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn request_id(&self) -> String {
        let n = self.inner.requests.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}", self.instance())
    }

    /// Counts an answer dropped because no request here waits for it
    /// (forged, repeated, or another session's): a framework's transport
    /// calls it when it drops one.
    pub fn reply_dropped(&self) {
        self.inner.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// How many answers were dropped so far ([`reply_dropped`](Self::reply_dropped)).
    pub fn replies_dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Sends a client's answer (`message`, a JSON-RPC response or error
    /// to request `id`, in `session`) to the instance whose request waits
    /// for it; see [`Route`].
    pub async fn route_reply(&self, session: &str, id: &str, message: &[u8]) -> Result<Route> {
        let Some(to) = request_instance(id) else {
            return Ok(Route::Local);
        };
        if to == self.instance() {
            return Ok(Route::Local);
        }
        if !self.runtime_store().is_alive(to).await? {
            return Ok(Route::Gone(to));
        }
        let topic = replies_topic(&to);
        self.inner
            .bus
            .publish(&topic, &frame(session.as_bytes(), message)?)
            .await?;
        Ok(Route::Forwarded(to))
    }

    /// The answers other instances forward here: hand each to its session.
    ///
    /// They are addressed to this runtime's instance; when it lapsed and
    /// was replaced by a fresh one (whose id the requests sent from then on
    /// carry), the listener hears the fresh instance's instead.
    pub async fn replies(&self) -> Result<Listener<Reply>> {
        self.ensure_open()?;
        let mut instance = self.inner.instance.subscribe();
        // The id read out first: a `watch::Ref` held across the `.await`
        // would make this future (and the servers that await it) not `Send`.
        let me = *instance.borrow_and_update();
        let first = self.replies_to(me).await?;
        let runtime = Arc::downgrade(&self.inner);
        let heard =
            futures_util::stream::unfold((first, instance), move |(mut listener, mut instance)| {
                let runtime = runtime.clone();
                async move {
                    loop {
                        tokio::select! {
                            heard = listener.next() => {
                                return heard.map(|heard| (heard, (listener, instance)));
                            }
                            changed = instance.changed() => {
                                let (Ok(()), Some(inner)) = (changed, runtime.upgrade()) else {
                                    return None;
                                };
                                let fresh = *instance.borrow_and_update();
                                match (Runtime { inner }).replies_to(fresh).await {
                                    Ok(replies) => listener = replies,
                                    Err(error) => tracing::warn!(%error, instance = %fresh,
                                        "cannot listen to the fresh instance's replies"),
                                }
                            }
                        }
                    }
                }
            });
        Ok(Listener {
            heard: heard.boxed(),
        })
    }

    /// The answers forwarded to `instance`.
    async fn replies_to(&self, instance: InstanceId) -> Result<Listener<Reply>> {
        let topic = replies_topic(&instance);
        let first = self.inner.bus.subscribe(&topic, Start::Now).await?;
        Ok(self.keep(topic, first, |message| {
            let (session, reply) = unframe(&message.payload)?;
            Some(Reply {
                session: String::from_utf8(session.to_vec()).ok()?,
                message: reply,
            })
        }))
    }

    /// Tells every instance that `session` ended (a client deleted it
    /// here): each ends it where it holds it. What the bus carries, and
    /// the store keeps, is the session's digest, never its id (C20).
    pub async fn end_session(&self, session: &str) -> Result<()> {
        let digest = SessionDigest::of(session);
        self.inner.ended().insert(digest);
        self.inner
            .bus
            .publish(&topic(ENDED_SESSIONS), digest.key().as_bytes())
            .await
            .map(drop)
    }

    /// The sessions ended on any instance, this one included, as their
    /// digests: compare [`SessionDigest::of`] a session you hold. Each one
    /// heard is also remembered ([`session_ended`](Self::session_ended)).
    pub async fn ended_sessions(&self) -> Result<Listener<SessionDigest>> {
        self.ensure_open()?;
        let topic = topic(ENDED_SESSIONS);
        let first = self.inner.bus.subscribe(&topic, Start::Now).await?;
        let runtime = Arc::downgrade(&self.inner);
        Ok(self.keep(topic, first, move |message| {
            let session = heard_session(&message.payload)?;
            if let Some(inner) = runtime.upgrade() {
                inner.ended().insert(session);
            }
            Some(session)
        }))
    }

    /// Whether `session` was ended within the last hour: here
    /// ([`end_session`](Self::end_session)), or on another instance as a
    /// listener of [`ended_sessions`](Self::ended_sessions) heard. A
    /// framework answers such a session as unknown, whatever it still
    /// holds or another instance wrote back before it heard. At most
    /// 100,000 are remembered (the oldest go first).
    pub fn session_ended(&self, session: &str) -> bool {
        self.inner.ended().contains(&SessionDigest::of(session))
    }

    /// Raises a notification once for the listeners of every instance.
    pub async fn notify(&self, audience: &Audience, message: &[u8]) -> Result<()> {
        let to = match audience {
            Audience::All => String::new(),
            Audience::Session(session) => session.key(),
        };
        self.inner
            .bus
            .publish(&topic(NOTIFICATIONS), &frame(to.as_bytes(), message)?)
            .await
            .map(drop)
    }

    /// The notifications raised on any instance, this one included: deliver
    /// each to this instance's listeners it is for.
    ///
    /// Every listener this runtime hands out shares one subscription to
    /// the bus (made by the first call), so a thousand listeners cost the
    /// store what one does: each notification is read once and handed to
    /// each. A listener that falls more than 1,024 notifications behind
    /// the others hears [`Heard::Missed`] and goes on from the newest, so
    /// a slow one holds up nobody and holds no more than that.
    pub async fn notifications(&self) -> Result<Listener<Notification>> {
        self.ensure_open()?;
        let fanout = self
            .inner
            .notified
            .get_or_try_init(|| async {
                let topic = topic(NOTIFICATIONS);
                let first = self.inner.bus.subscribe(&topic, Start::Now).await?;
                let heard = self.keep(topic, first, |message| {
                    let (to, notification) = unframe(&message.payload)?;
                    let audience = match to.is_empty() {
                        true => Audience::All,
                        false => Audience::Session(heard_session(&to)?),
                    };
                    Some(Notification {
                        audience,
                        message: notification,
                    })
                });
                Ok::<_, Error>(Fanout::start(heard))
            })
            .await?;
        Ok(fanout.listener(self.inner.stopping.subscribe()))
    }

    /// A listener over `first`, subscribed again after errors, until the
    /// runtime shuts down; `decode` turns a message into what it yields
    /// (`None`: not one of ours, skipped).
    fn keep<T: Send + 'static>(
        &self,
        topic: Topic,
        first: Subscription,
        decode: impl Fn(Message) -> Option<T> + Send + 'static,
    ) -> Listener<T> {
        struct State<D> {
            bus: StoreBus,
            topic: Topic,
            subscription: Option<Subscription>,
            last: Option<Cursor>,
            retry: Duration,
            stopping: tokio::sync::watch::Receiver<bool>,
            decode: D,
        }
        let state = State {
            bus: self.inner.bus.clone(),
            topic,
            subscription: Some(first),
            last: None,
            retry: FIRST_RETRY,
            stopping: self.inner.stopping.subscribe(),
            decode,
        };
        let heard = futures_util::stream::unfold(state, |mut state| async move {
            loop {
                let Some(subscription) = &mut state.subscription else {
                    // After a backend error: resume after the last message
                    // heard (from now if none was, so say some may be lost).
                    let start = state.last.map_or(Start::Now, Start::After);
                    tokio::select! {
                        _ = state.stopping.wait_for(|stopping| *stopping) => return None,
                        () = tokio::time::sleep(state.retry) => {}
                    }
                    match state.bus.subscribe(&state.topic, start).await {
                        Ok(subscription) => {
                            state.subscription = Some(subscription);
                            if start == Start::Now {
                                return Some((Heard::Missed, state));
                            }
                        }
                        Err(Error::FellBehind { .. }) => {
                            state.last = None;
                            state.retry = FIRST_RETRY;
                        }
                        Err(error) => {
                            tracing::warn!(%error, topic = %state.topic, retry_in = ?state.retry,
                                "cannot listen to the bus; retrying");
                            state.retry = (state.retry * 2).min(MAX_RETRY);
                        }
                    }
                    continue;
                };
                let next = tokio::select! {
                    _ = state.stopping.wait_for(|stopping| *stopping) => return None,
                    next = subscription.next() => next,
                };
                match next {
                    Some(Ok(message)) => {
                        state.last = Some(message.cursor);
                        state.retry = FIRST_RETRY;
                        match (state.decode)(message) {
                            Some(decoded) => return Some((Heard::Message(decoded), state)),
                            None => tracing::warn!(topic = %state.topic,
                                "skipped a bus message this release cannot read"),
                        }
                    }
                    Some(Err(Error::FellBehind { .. })) => {
                        tracing::warn!(topic = %state.topic,
                            "retention overtook a bus listener: messages were lost");
                        state.last = None;
                        state.subscription = None;
                        match state.bus.subscribe(&state.topic, Start::Now).await {
                            Ok(subscription) => state.subscription = Some(subscription),
                            Err(error) => tracing::warn!(%error, topic = %state.topic,
                                "cannot listen to the bus; retrying"),
                        }
                        return Some((Heard::Missed, state));
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, topic = %state.topic,
                            "a bus subscription failed; subscribing again");
                        state.subscription = None;
                    }
                    // A subscription ends only after an error.
                    None => state.subscription = None,
                }
            }
        });
        Listener {
            heard: heard.boxed(),
        }
    }
}

fn topic(name: &str) -> Topic {
    Topic::new(name).expect("the runtime's topics are valid")
}

fn replies_topic(instance: &InstanceId) -> Topic {
    topic(&format!("{REPLIES_PREFIX}{instance}"))
}

/// The instance a [`Runtime::request_id`] names.
fn request_instance(id: &str) -> Option<InstanceId> {
    let (instance, n) = id.split_once('.')?;
    n.parse::<u64>().ok()?;
    InstanceId::parse(instance)
}

/// `head` and `body` as one message: `head`'s length (2 bytes, big
/// endian), `head`, `body`.
fn frame(head: &[u8], body: &[u8]) -> Result<Vec<u8>> {
    let len = u16::try_from(head.len()).map_err(|_| Error::InvalidSessionId {
        reason: format!(
            "a session id is at most 65535 bytes; this one is {}",
            head.len()
        ),
    })?;
    let mut framed = Vec::with_capacity(2 + head.len() + body.len());
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(head);
    framed.extend_from_slice(body);
    Ok(framed)
}

/// The `head` and `body` of a [`frame`], or `None` if it is not one.
fn unframe(framed: &Bytes) -> Option<(Bytes, Bytes)> {
    let len = usize::from(u16::from_be_bytes(framed.get(..2)?.try_into().ok()?));
    let head = framed.get(2..2 + len)?;
    Some((Bytes::copy_from_slice(head), framed.slice(2 + len..)))
}

pub(crate) fn new_bus(store: &Arc<dyn mcp_event_store_core::Store>) -> StoreBus {
    StoreBus::new(store.clone())
}

/// Sessions ended anywhere, oldest first, for [`ENDED_KEPT`].
#[derive(Default)]
pub(crate) struct Ended {
    at: HashMap<SessionDigest, Instant>,
    order: VecDeque<(Instant, SessionDigest)>,
}

impl Ended {
    fn insert(&mut self, session: SessionDigest) {
        let now = Instant::now();
        self.forget_before(now);
        if self.at.len() >= ENDED_MAX
            && let Some((_, oldest)) = self.order.pop_front()
        {
            self.at.remove(&oldest);
        }
        if self.at.insert(session, now).is_none() {
            self.order.push_back((now, session));
        }
    }

    fn contains(&mut self, session: &SessionDigest) -> bool {
        self.forget_before(Instant::now());
        self.at.contains_key(session)
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front()
            && now.duration_since(*at) >= ENDED_KEPT
        {
            if let Some((_, session)) = self.order.pop_front() {
                self.at.remove(&session);
            }
        }
    }
}

/// One listener's messages handed to many in this process: what the
/// listeners of [`Runtime::notifications`] share.
pub(crate) struct Fanout<T> {
    sender: tokio::sync::broadcast::Sender<Heard<T>>,
}

impl<T: Clone + Send + 'static> Fanout<T> {
    /// Hands out what `source` hears, on a task of its own, until it ends
    /// (at shutdown).
    fn start(mut source: Listener<T>) -> Self {
        let (sender, _) = tokio::sync::broadcast::channel(FANOUT_CAPACITY);
        let handing = sender.clone();
        tokio::spawn(async move {
            while let Some(heard) = source.next().await {
                // None listening now is no error: the next listener
                // starts from what comes after.
                let _ = handing.send(heard);
            }
        });
        Self { sender }
    }

    /// A listener of what is heard from now, until `stopping` turns
    /// `true`.
    fn listener(&self, stopping: tokio::sync::watch::Receiver<bool>) -> Listener<T> {
        use tokio::sync::broadcast::error::RecvError;

        let state = (self.sender.subscribe(), stopping);
        let heard = futures_util::stream::unfold(
            state,
            |(mut receiver, mut stopping)| async move {
                let next = tokio::select! {
                    _ = stopping.wait_for(|stopping| *stopping) => return None,
                    next = receiver.recv() => next,
                };
                let heard = match next {
                    Ok(heard) => heard,
                    Err(RecvError::Lagged(skipped)) => {
                        tracing::warn!(
                            skipped,
                            "a notification listener fell behind the others: notifications were lost to it"
                        );
                        Heard::Missed
                    }
                    Err(RecvError::Closed) => return None,
                };
                Some((heard, (receiver, stopping)))
            },
        );
        Listener {
            heard: heard.boxed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_sessions_are_remembered_within_a_bound() {
        let mut ended = Ended::default();
        let s = |i: usize| SessionDigest::of(&format!("s-{i}"));
        for i in 0..=ENDED_MAX {
            ended.insert(s(i));
        }
        assert!(!ended.contains(&s(0)), "the oldest went first");
        assert!(ended.contains(&s(1)) && ended.contains(&s(ENDED_MAX)));
        assert_eq!(ended.at.len(), ENDED_MAX);
        assert_eq!(ended.order.len(), ENDED_MAX);
        ended.insert(s(1));
        assert_eq!(ended.order.len(), ENDED_MAX, "one entry per session");
    }

    #[test]
    fn a_heard_session_is_a_digest_or_an_older_release_s_id() {
        let digest = SessionDigest::of("session-1");
        assert_eq!(heard_session(digest.key().as_bytes()), Some(digest));
        assert_eq!(heard_session(b"session-1"), Some(digest));
        assert_eq!(heard_session(b"\xff"), None);
    }

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let framed = Bytes::from(frame(b"session-1", b"{}").unwrap());
        assert_eq!(
            unframe(&framed),
            Some((Bytes::from_static(b"session-1"), Bytes::from_static(b"{}")))
        );
        assert_eq!(unframe(&Bytes::from_static(b"\x00")), None);
        assert_eq!(unframe(&Bytes::from_static(b"\x00\x09abc")), None);
        assert!(frame(&vec![b'x'; 70_000], b"").is_err());
    }

    #[test]
    fn request_ids_name_their_instance_and_nothing_else_does() {
        let instance = InstanceId::generate().unwrap();
        assert_eq!(request_instance(&format!("{instance}.7")), Some(instance));
        for other in [
            "7",
            "x.7",
            &format!("{instance}"),
            &format!("{instance}.x"),
            "",
        ] {
            assert_eq!(request_instance(other), None, "{other:?}");
        }
    }
}
