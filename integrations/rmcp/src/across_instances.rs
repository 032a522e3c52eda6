//! Two `SessionScoped` managers (two server instances) sharing one store,
//! driven through rmcp's real session machinery the way
//! `StreamableHttpService` drives it: create or restore a session, replay
//! the handshake, open request streams, `DELETE` it.
//!
//! Time: the session check interval runs on tokio's clock (paused here, so
//! it moves only when the test sleeps), the store's expiry on its own
//! [`ManualClock`](mcp_event_store_core::ManualClock).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_core::Stream;
use futures_util::StreamExt;
use rmcp::ServerHandler;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager, SessionState, SessionStore as _,
};
use serde_json::json;

use super::*;
use mcp_event_store_core::{
    EventId, EventStore, ManualClock, MemoryStore, NewEvent, PurgeReport, Replay, SessionStore,
    StoreOptions,
};

/// A store that counts reads of rmcp session state (keys under `rmcp/`).
struct Counting {
    inner: MemoryStore,
    session_reads: AtomicUsize,
}

impl Counting {
    fn reads(&self) -> usize {
        self.session_reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl EventStore for Counting {
    async fn store_event(
        &self,
        stream_id: &str,
        event: NewEvent<'_>,
    ) -> mcp_event_store_core::Result<EventId> {
        self.inner.store_event(stream_id, event).await
    }
    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> mcp_event_store_core::Result<Replay> {
        self.inner.replay_events_after(last_event_id).await
    }
    async fn get_stream_id_for_event_id(
        &self,
        event_id: &str,
    ) -> mcp_event_store_core::Result<Option<String>> {
        self.inner.get_stream_id_for_event_id(event_id).await
    }
    async fn delete_stream(&self, stream_id: &str) -> mcp_event_store_core::Result<u64> {
        self.inner.delete_stream(stream_id).await
    }
    async fn purge_expired(&self) -> mcp_event_store_core::Result<PurgeReport> {
        self.inner.purge_expired().await
    }
    async fn follow_events_after(
        &self,
        last_event_id: &str,
        options: mcp_event_store_core::FollowOptions,
    ) -> mcp_event_store_core::Result<Replay> {
        self.inner.follow_events_after(last_event_id, options).await
    }
    fn open_follows(&self) -> usize {
        self.inner.open_follows()
    }
    fn retention(&self) -> mcp_event_store_core::Retention {
        self.inner.retention()
    }
    async fn stats(&self) -> mcp_event_store_core::Result<mcp_event_store_core::StoreStats> {
        self.inner.stats().await
    }
    async fn list_streams(
        &self,
        after: Option<&mcp_event_store_core::StreamCursor>,
        limit: usize,
    ) -> mcp_event_store_core::Result<mcp_event_store_core::StreamPage> {
        self.inner.list_streams(after, limit).await
    }
    async fn check(&self) -> mcp_event_store_core::Result<mcp_event_store_core::HealthReport> {
        self.inner.check().await
    }
}

#[async_trait]
impl SessionStore for Counting {
    async fn put_session(
        &self,
        id: &str,
        state: &[u8],
        ttl: Duration,
    ) -> mcp_event_store_core::Result<()> {
        self.inner.put_session(id, state, ttl).await
    }
    async fn get_session(&self, id: &str) -> mcp_event_store_core::Result<Option<Bytes>> {
        if id.starts_with(DEFAULT_SESSION_KEY_PREFIX) {
            self.session_reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.get_session(id).await
    }
    async fn delete_session(&self, id: &str) -> mcp_event_store_core::Result<bool> {
        self.inner.delete_session(id).await
    }
}

fn counting(clock: &Arc<ManualClock>) -> Arc<Counting> {
    Arc::new(Counting {
        inner: MemoryStore::with_options(StoreOptions::default().clock(clock.clone())),
        session_reads: AtomicUsize::new(0),
    })
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_700_000_000_000))
}

type Instance = SessionScoped<LocalSessionManager, Counting>;

/// An MCP server with nothing but the defaults.
#[derive(Clone)]
struct Nop;
impl ServerHandler for Nop {}

fn message(value: serde_json::Value) -> ClientJsonRpcMessage {
    serde_json::from_value(value).expect("a client message")
}

fn initialize_params() -> serde_json::Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "two-instances", "version": "1"}
    })
}

/// Serves the session's transport and replays the handshake, as rmcp does
/// for a new session and for a restored one.
async fn handshake<M>(manager: &M, id: &SessionId, transport: M::Transport)
where
    M: SessionManager,
{
    tokio::spawn(async move {
        if let Ok(running) = rmcp::serve_server(Nop, transport).await {
            let _ = running.waiting().await;
        }
    });
    manager
        .initialize_session(
            id,
            message(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                           "params": initialize_params()})),
        )
        .await
        .expect("initialize");
    manager
        .accept_message(
            id,
            message(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
        )
        .await
        .expect("initialized");
}

/// A new session on `manager`, its state stored as rmcp stores it.
async fn open<M: SessionManager>(
    manager: &M,
    sessions: &dyn rmcp::transport::streamable_http_server::session::SessionStore,
) -> SessionId {
    let (id, transport) = manager.create_session().await.expect("create");
    handshake(manager, &id, transport).await;
    let state: SessionState =
        serde_json::from_value(json!({"initialize_params": initialize_params()})).unwrap();
    sessions.store(&id, &state).await.expect("store state");
    id
}

/// What rmcp does for a session it does not know: load the state, then
/// restore it.
async fn restore<M: SessionManager>(
    manager: &M,
    sessions: &dyn rmcp::transport::streamable_http_server::session::SessionStore,
    id: &SessionId,
) {
    assert!(!manager.has_session(id).await.unwrap());
    assert!(sessions.load(id).await.unwrap().is_some(), "stored");
    let Ok(RestoreOutcome::Restored(transport)) = manager.restore_session(id.clone()).await else {
        panic!("restored");
    };
    handshake(manager, id, transport).await;
}

/// What rmcp does on `DELETE`: close the session here, then delete its
/// state from the session store.
async fn delete<M: SessionManager>(
    manager: &M,
    sessions: &dyn rmcp::transport::streamable_http_server::session::SessionStore,
    id: &SessionId,
) {
    manager.close_session(id).await.expect("close");
    sessions.delete(id).await.expect("delete state");
}

/// A `ping` on a request stream of the session; the ids of its events.
async fn request(manager: &impl SessionManager, id: &SessionId, n: u64) -> Vec<String> {
    let stream = manager
        .create_stream(
            id,
            message(json!({"jsonrpc": "2.0", "id": n, "method": "ping"})),
        )
        .await
        .expect("a request stream");
    let mut stream = std::pin::pin!(stream);
    let mut ids = Vec::new();
    while let Some(event) = stream.next().await {
        ids.extend(event.event_id.clone());
        if event.message.is_some() {
            break;
        }
    }
    assert!(!ids.is_empty(), "the stream carried stored events");
    ids
}

/// The session-store key binding the stream of `event_id` to its session.
fn binding_key(event_id: &str) -> String {
    format!(
        "{DEFAULT_BINDING_KEY_PREFIX}{}",
        EventId::parse(event_id).expect("our id").token
    )
}

async fn bound(store: &Counting, event_id: &str) -> bool {
    store
        .inner
        .get_session(&binding_key(event_id))
        .await
        .unwrap()
        .is_some()
}

/// Lets tokio's (paused) clock run past the session check interval and any
/// cleanup the managers scheduled.
async fn later() {
    tokio::time::sleep(Duration::from_secs(30)).await;
}

#[tokio::test(start_paused = true)]
async fn a_session_deleted_on_one_instance_is_gone_on_every_instance() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone());
    let b: Instance = SessionScoped::local(store.clone());

    let id = open(&a, &*sessions).await;
    restore(&b, &*sessions, &id).await;
    assert!(b.has_session(&id).await.unwrap());
    request(&b, &id, 1).await;

    delete(&a, &*sessions, &id).await;
    later().await;
    assert!(
        !b.has_session(&id).await.unwrap(),
        "B still serves a deleted session"
    );
    assert!(
        !b.inner().has_session(&id).await.unwrap(),
        "B closed its copy, so a restore is not AlreadyPresent"
    );
    assert!(
        sessions.load(&id).await.unwrap().is_none(),
        "rmcp answers 404"
    );
    assert!(!a.has_session(&id).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn an_expired_session_is_gone_on_every_instance_with_its_bindings() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = Arc::new(RmcpSessionStore::new(store.clone()).with_ttl(Duration::from_secs(60)));
    let a: Instance = SessionScoped::local(store.clone());
    let b: Instance = SessionScoped::local(store.clone());

    let id = open(&a, &*sessions).await;
    assert!(a.has_session(&id).await.unwrap());
    let on_a = request(&a, &id, 1).await;
    restore(&b, &*sessions, &id).await;
    let on_b = request(&b, &id, 2).await;
    assert!(bound(&store, &on_a[0]).await && bound(&store, &on_b[0]).await);

    clock.advance(Duration::from_secs(61));
    later().await;
    assert!(!a.has_session(&id).await.unwrap(), "expired, gone on A");
    assert!(!b.has_session(&id).await.unwrap(), "expired, gone on B");
    later().await;
    assert!(!bound(&store, &on_a[0]).await, "A's binding removed");
    assert!(!bound(&store, &on_b[0]).await, "B's binding removed");
}

#[tokio::test(start_paused = true)]
async fn a_deleted_sessions_bindings_are_removed_from_the_store() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone());
    let b: Instance = SessionScoped::local(store.clone());

    let id = open(&a, &*sessions).await;
    let mut ids = request(&a, &id, 1).await;
    ids.extend(request(&a, &id, 2).await);
    restore(&b, &*sessions, &id).await;
    ids.extend(request(&b, &id, 3).await);
    for event in &ids {
        assert!(bound(&store, event).await, "{event} bound");
    }

    delete(&a, &*sessions, &id).await;
    later().await;
    assert!(!b.has_session(&id).await.unwrap());
    later().await;
    for event in &ids {
        assert!(!bound(&store, event).await, "{event} still bound");
    }
}

#[tokio::test(start_paused = true)]
async fn bindings_live_as_long_as_events_by_default() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone());
    let id = open(&a, &*sessions).await;
    let ids = request(&a, &id, 1).await;
    assert!(bound(&store, &ids[0]).await);
    let max_age = mcp_event_store_core::Retention::default().max_age.unwrap();
    clock.advance(max_age - Duration::from_secs(1));
    assert!(bound(&store, &ids[0]).await, "bound while its events live");
    clock.advance(Duration::from_secs(2));
    assert!(
        !bound(&store, &ids[0]).await,
        "a binding outlives the events of its stream"
    );
}

#[tokio::test(start_paused = true)]
async fn the_check_reads_the_store_at_most_once_per_interval() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone());
    let id = open(&a, &*sessions).await;
    let before = store.reads();
    for _ in 0..100 {
        assert!(a.has_session(&id).await.unwrap());
    }
    assert_eq!(store.reads() - before, 1, "one read for 100 requests");
    tokio::time::sleep(Duration::from_millis(1001)).await;
    for _ in 0..100 {
        assert!(a.has_session(&id).await.unwrap());
    }
    assert_eq!(store.reads() - before, 2, "one more in the next second");
}

#[tokio::test(start_paused = true)]
async fn sessions_of_a_server_without_a_session_store_keep_working() {
    let clock = clock();
    let store = counting(&clock);
    let a: Instance = SessionScoped::local(store.clone());
    let (id, transport) = a.create_session().await.unwrap();
    handshake(&a, &id, transport).await;
    for n in 0..5 {
        assert!(a.has_session(&id).await.unwrap());
        request(&a, &id, n).await;
        later().await;
    }
    assert!(store.reads() <= 1, "{} reads", store.reads());
}

#[tokio::test(start_paused = true)]
async fn with_a_linked_session_store_a_session_is_checked_from_its_first_request() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone()).with_session_store(&sessions);
    let b: Instance = SessionScoped::local(store.clone()).with_session_store(&sessions);

    // Created on A, restored and deleted on B before A ever asked the store.
    let id = open(&a, &*sessions).await;
    restore(&b, &*sessions, &id).await;
    delete(&b, &*sessions, &id).await;
    assert!(!a.has_session(&id).await.unwrap(), "A knew it was stored");
    assert!(!a.inner().has_session(&id).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_linked_session_store_with_its_own_prefix_is_the_one_checked() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = Arc::new(RmcpSessionStore::new(store.clone()).with_key_prefix("app/sessions/"));
    let a: Instance = SessionScoped::local(store.clone()).with_session_store(&sessions);
    let id = open(&a, &*sessions).await;
    later().await;
    assert!(
        a.has_session(&id).await.unwrap(),
        "found under app/sessions/"
    );
    sessions.delete(&id).await.unwrap();
    later().await;
    assert!(!a.has_session(&id).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_zero_check_interval_reads_the_store_on_every_request() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance =
        SessionScoped::local(store.clone()).with_session_check_interval(Duration::ZERO);
    let b: Instance =
        SessionScoped::local(store.clone()).with_session_check_interval(Duration::ZERO);
    let id = open(&a, &*sessions).await;
    restore(&b, &*sessions, &id).await;
    let before = store.reads();
    for _ in 0..10 {
        assert!(b.has_session(&id).await.unwrap());
    }
    assert_eq!(store.reads() - before, 10);
    delete(&a, &*sessions, &id).await;
    assert!(!b.has_session(&id).await.unwrap(), "at once, no waiting");
}

#[tokio::test(start_paused = true)]
async fn closing_a_session_that_lives_on_elsewhere_keeps_its_bindings() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone()).with_session_store(&sessions);
    let b: Instance = SessionScoped::local(store.clone()).with_session_store(&sessions);
    let id = open(&a, &*sessions).await;
    let on_a = request(&a, &id, 1).await;
    restore(&b, &*sessions, &id).await;
    // A closes its copy (rmcp's idle timeout does this); B carries on.
    a.close_session(&id).await.unwrap();
    later().await;
    assert!(
        bound(&store, &on_a[0]).await,
        "the stream is still resumable"
    );
    assert!(b.has_session(&id).await.unwrap());
    b.check_owner(&id, &on_a[0]).await.expect("resumable on B");
}

#[tokio::test(start_paused = true)]
async fn a_session_without_a_session_store_takes_its_bindings_when_it_closes() {
    let clock = clock();
    let store = counting(&clock);
    let a: Instance = SessionScoped::local(store.clone());
    let (id, transport) = a.create_session().await.unwrap();
    handshake(&a, &id, transport).await;
    assert!(a.has_session(&id).await.unwrap());
    let ids = request(&a, &id, 1).await;
    assert!(bound(&store, &ids[0]).await);
    a.close_session(&id).await.unwrap();
    later().await;
    assert!(
        !bound(&store, &ids[0]).await,
        "nobody can resume it any more"
    );
}

#[tokio::test(start_paused = true)]
async fn the_binding_lifetime_follows_the_retention() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let retention = mcp_event_store_core::Retention::default().max_age(Duration::from_secs(600));
    let a: Instance = SessionScoped::local(store.clone()).with_retention(retention);
    assert_eq!(a.binding_ttl(), Duration::from_secs(600));
    let id = open(&a, &*sessions).await;
    let ids = request(&a, &id, 1).await;
    clock.advance(Duration::from_secs(599));
    assert!(bound(&store, &ids[0]).await);
    clock.advance(Duration::from_secs(2));
    assert!(!bound(&store, &ids[0]).await);

    let unaged = mcp_event_store_core::Retention {
        max_age: None,
        ..mcp_event_store_core::Retention::default()
    };
    let a: Instance = SessionScoped::local(store.clone()).with_retention(unaged);
    assert_eq!(a.binding_ttl(), DEFAULT_SESSION_TTL);
}

/// Events arriving on a stream, one per `gap` of tokio's and the store's
/// time.
fn slow_events(
    ids: Vec<String>,
    gap: Duration,
    clock: Arc<ManualClock>,
) -> impl Stream<Item = ServerSseMessage> {
    futures_util::stream::iter(ids).then(move |id| {
        let clock = clock.clone();
        async move {
            tokio::time::sleep(gap).await;
            clock.advance(gap);
            let mut event = ServerSseMessage::retry(Duration::from_secs(1));
            event.event_id = Some(id);
            event
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_stream_running_longer_than_half_the_binding_lifetime_is_bound_again() {
    let clock = clock();
    let store = counting(&clock);
    let ttl = Duration::from_secs(60);
    let a: Instance = SessionScoped::local(store.clone()).with_binding_ttl(ttl);
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(
            store
                .store_event("long-request", NewEvent::new(b"{}"))
                .await
                .unwrap()
                .to_string(),
        );
    }
    // Four events 20 s apart: bound at the first (20 s), again at the third
    // (60 s: 40 s later, past half the lifetime).
    let events = slow_events(ids.clone(), Duration::from_secs(20), clock.clone());
    let passed: Vec<_> = a
        .bind_stream(&"s1".into(), events)
        .map(|event| event.event_id.unwrap())
        .collect()
        .await;
    assert_eq!(passed, ids);
    // Now at 80 s: the first write would have expired at 80 s, the second
    // lasts until 120 s.
    assert!(bound(&store, &ids[0]).await, "bound again while it ran");
    clock.advance(Duration::from_secs(39));
    assert!(bound(&store, &ids[0]).await);
    clock.advance(Duration::from_secs(2));
    assert!(!bound(&store, &ids[0]).await);
}

#[tokio::test(start_paused = true)]
async fn a_delete_through_a_linked_session_store_takes_the_bindings_at_once() {
    let clock = clock();
    let store = counting(&clock);
    let sessions = store.clone().into_rmcp_sessions();
    let a: Instance = SessionScoped::local(store.clone()).with_session_store(&sessions);
    let id = open(&a, &*sessions).await;
    let ids = request(&a, &id, 1).await;
    delete(&a, &*sessions, &id).await;
    // A millisecond of tokio time: long before the manager would ask the
    // store by itself.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!bound(&store, &ids[0]).await);
}
