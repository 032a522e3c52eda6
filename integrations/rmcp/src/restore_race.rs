//! Two requests of one session arriving together on an instance that must
//! restore it, through rmcp 3.11's own `StreamableHttpService` over the
//! adapter: two instances (two services, two managers) on one store, the
//! session opened on A, its requests sent to B.
//!
//! rmcp restores a session in one request (`has_session` false, then
//! under its `pending_restores`: load the state, `restore_session`,
//! replay `initialize` and `notifications/initialized`); the other
//! requests of the session either wait for that restore or see the
//! session held. Two orderings go wrong with rmcp alone, and each is
//! forced here with a gate in a manager wrapped around the adapter's:
//!
//! * **The late one.** R2 finds the session absent (`has_session`
//!   false), and reaches rmcp's restore only after R1 restored the session
//!   completely and rmcp forgot that restore: R2 restores again, the
//!   manager answers `AlreadyPresent`, and rmcp 3.11 answers 500.
//! * **Half made.** R2 arrives after R1's `restore_session` (the session
//!   is held) and before R1 replayed `initialize`: `has_session` says
//!   true, R2's request reaches the session's worker before the
//!   `initialize`, and the worker dies (both answer 500).
//!
//! With sessions bound to their callers (`callers_racing`), the owner's
//! request and another caller's racing on that instance must not share
//! rmcp's restore attempt: each ordering is forced with a gate in the
//! manager or in rmcp's load of the session's state (`GatedStore`).
//!
//! Time is tokio's, paused: a sleep returns once every other task has
//! run as far as it can, which is how the tests let rmcp finish what it
//! spawned; no outcome depends on how long anything takes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_core::Stream;
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::model::{
    ClientJsonRpcMessage, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, ServerJsonRpcMessage,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    EventStore as RmcpEventStoreTrait, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
    SessionState, SessionStore as RmcpSessionStoreTrait, SessionStoreError,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio::sync::oneshot;
use tower_service::Service as _;

use super::*;
use mcp_event_store_core::MemoryStore;

/// Holds the first call that passes it once armed, until released.
#[derive(Default)]
struct Gate {
    armed: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

/// An armed gate, from the test's side.
struct Held {
    reached: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl Gate {
    fn arm(&self) -> Held {
        let (reached, reached_rx) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *self.armed.lock().unwrap() = Some((reached, release_rx));
        Held {
            reached: reached_rx,
            release,
        }
    }

    async fn pass(&self) {
        let armed = self.armed.lock().unwrap().take();
        if let Some((reached, release)) = armed {
            let _ = reached.send(());
            let _ = release.await;
        }
    }
}

impl Held {
    /// Waits until a call is held.
    async fn reached(&mut self) {
        within(&mut self.reached).await.expect("the gate's sender");
    }

    fn release(self) {
        let _ = self.release.send(());
    }
}

/// The adapter's manager with two gates, as rmcp's service drives it.
struct Gated<M> {
    inner: M,
    /// Holds a request whose `has_session` answered `false`, before rmcp
    /// goes on to restore the session.
    missed: Gate,
    /// Holds rmcp's restore after `restore_session` (the session is
    /// held), before it replays `initialize`.
    replaying: Gate,
}

impl<M: SessionManager> SessionManager for Gated<M> {
    type Error = M::Error;
    type Transport = M::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let ClientJsonRpcMessage::Request(request) = &message else {
            unreachable!("initialize is a request");
        };
        if rmcp::model::GetExtensions::extensions(&request.request)
            .get::<rmcp::transport::streamable_http_server::SessionRestoreMarker>()
            .is_some()
        {
            self.replaying.pass().await;
        }
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        let held = self.inner.has_session(id).await?;
        if !held {
            self.missed.pass().await;
        }
        Ok(held)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn RmcpEventStoreTrait>> {
        self.inner.event_store()
    }
}

/// The session store rmcp is given: the adapter's, with a gate on `load`
/// (rmcp loads a session's state right after it took the restore of the
/// session on: its other requests that found the session absent wait for
/// this one's outcome).
struct GatedStore {
    inner: Arc<RmcpSessionStore<MemoryStore>>,
    /// Holds a load, before the store is read.
    loading: Arc<Gate>,
}

#[async_trait::async_trait]
impl RmcpSessionStoreTrait for GatedStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        self.loading.pass().await;
        self.inner.load(session_id).await
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        self.inner.store(session_id, state).await
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.inner.delete(session_id).await
    }
}

/// A server whose `tools/list` counts the requests that reached it.
#[derive(Clone, Default)]
struct Counted {
    listed: Arc<AtomicUsize>,
}

impl ServerHandler for Counted {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.listed.fetch_add(1, Ordering::SeqCst);
        Ok(ListToolsResult::default())
    }
}

impl Counted {
    fn listed(&self) -> usize {
        self.listed.load(Ordering::SeqCst)
    }
}

type Manager = Gated<SessionScoped<LocalSessionManager, MemoryStore>>;

/// One server instance on the shared store.
struct Instance {
    manager: Arc<Manager>,
    service: CallerScoped<StreamableHttpService<Counted, Manager>>,
    /// Holds rmcp's next load of a session's state.
    loading: Arc<Gate>,
}

/// Who a request is from (what an authentication layer would insert).
#[derive(Clone)]
struct Principal(&'static str);

fn callers() -> Callers {
    Callers::from_extension(|principal: &Principal| principal.0.to_owned())
}

fn instance(store: &Arc<MemoryStore>, handler: &Counted, callers: &Callers) -> Instance {
    let sessions = Arc::new(RmcpSessionStore::new(store.clone()).with_callers(callers));
    let manager = Arc::new(Gated {
        inner: SessionScoped::local(store.clone())
            .with_session_store(&sessions)
            .with_callers(callers),
        missed: Gate::default(),
        replaying: Gate::default(),
    });
    let loading = Arc::new(Gate::default());
    let mut config = StreamableHttpServerConfig::default();
    config.session_store = Some(Arc::new(GatedStore {
        inner: sessions,
        loading: loading.clone(),
    }));
    let handler = handler.clone();
    let service = StreamableHttpService::new(move || Ok(handler.clone()), manager.clone(), config);
    Instance {
        manager,
        service: CallerScoped::new(service, callers.clone()),
        loading,
    }
}

impl Instance {
    /// Sends one request; its status (the body, an SSE stream, is dropped).
    fn send(
        &self,
        session: Option<&str>,
        caller: Option<&'static str>,
        message: serde_json::Value,
    ) -> impl Future<Output = u16> + Send + 'static {
        let mut request = http::Request::post("http://localhost/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        let mut request = request.body(message.to_string()).unwrap();
        if let Some(caller) = caller {
            request.extensions_mut().insert(Principal(caller));
        }
        let mut service = self.service.clone();
        async move {
            let response = service.call(request).await.expect("infallible");
            response.status().as_u16()
        }
    }

    /// A new session, opened as `caller`.
    async fn open(&self, caller: Option<&'static str>) -> String {
        let mut request = http::Request::post("http://localhost/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .body(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "restore-race", "version": "1"}
                }})
                .to_string(),
            )
            .unwrap();
        if let Some(caller) = caller {
            request.extensions_mut().insert(Principal(caller));
        }
        let response = self.service.clone().call(request).await.unwrap();
        assert_eq!(response.status(), 200, "initialize");
        let session = response.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(
            self.send(Some(&session), caller, initialized).await,
            202,
            "initialized"
        );
        session
    }

    fn list(
        &self,
        session: &str,
        caller: Option<&'static str>,
        id: u64,
    ) -> impl Future<Output = u16> + Send + 'static {
        self.send(
            Some(session),
            caller,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}}),
        )
    }

    fn scoped(&self) -> &SessionScoped<LocalSessionManager, MemoryStore> {
        &self.manager.inner
    }

    async fn holds(&self, session: &str) -> bool {
        self.scoped()
            .inner()
            .has_session(&session.into())
            .await
            .unwrap()
    }
}

/// Lets every task run as far as it can (tokio's clock is paused: the
/// sleep ends once nothing else can run).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A generous deadline: what never comes fails the test, it does not
/// hang it.
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("within a minute")
}

/// Until `done`, or fails after a generous deadline.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..6_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// R2 found the session absent; R1 then restored it and was served, and
/// rmcp forgot that restore; only then does R2 reach rmcp's restore. It
/// is served by the session held here (rmcp alone: 500, "restore_session
/// returned AlreadyPresent unexpectedly"), and the session lives on.
#[tokio::test(start_paused = true)]
async fn a_request_that_found_its_session_absent_is_served_once_another_restored_it() {
    let store = Arc::new(MemoryStore::new());
    let handler = Counted::default();
    let anonymous = Callers::anonymous();
    let a = instance(&store, &handler, &anonymous);
    let b = instance(&store, &handler, &anonymous);
    let session = a.open(None).await;

    let mut missed = b.manager.missed.arm();
    let late = tokio::spawn(b.list(&session, None, 2));
    missed.reached().await;
    assert_eq!(within(b.list(&session, None, 3)).await, 200, "R1 restores");
    settle().await;
    assert!(b.holds(&session).await);
    missed.release();
    assert_eq!(
        within(late).await.unwrap(),
        200,
        "R2, restoring after R1 did, is served (rmcp alone: 500)"
    );
    until("both requests reach the session's handler", || {
        handler.listed() == 2
    })
    .await;

    // The handshake replayed aside for R2 is over, its worker gone, and
    // its end closed nothing: the session serves on, on both instances.
    settle().await;
    assert_eq!(b.scoped().restores_pending(), (0, 0));
    assert!(b.holds(&session).await, "the session lives on on B");
    assert_eq!(within(b.list(&session, None, 4)).await, 200);
    assert_eq!(within(a.list(&session, None, 5)).await, 200);
    until("every request reached the handler", || {
        handler.listed() == 4
    })
    .await;
}

/// R2 arrives when R1's restore holds the session but has not replayed
/// `initialize` yet. R2 waits for the handshake, then is served (rmcp
/// alone: R2 reaches the session's worker first, the worker dies, both
/// answer 500).
#[tokio::test(start_paused = true)]
async fn a_request_arriving_while_its_session_is_restored_waits_for_the_handshake() {
    let store = Arc::new(MemoryStore::new());
    let handler = Counted::default();
    let anonymous = Callers::anonymous();
    let a = instance(&store, &handler, &anonymous);
    let b = instance(&store, &handler, &anonymous);
    let session = a.open(None).await;

    let mut replaying = b.manager.replaying.arm();
    let first = tokio::spawn(b.list(&session, None, 2));
    replaying.reached().await;
    assert!(b.holds(&session).await, "R1's restore holds the session");
    let second = tokio::spawn(b.list(&session, None, 3));
    settle().await;
    if second.is_finished() {
        let status = second.await.unwrap();
        panic!("R2 was answered ({status}) before the session's handshake was replayed");
    }
    replaying.release();
    assert_eq!(within(first).await.unwrap(), 200, "R1");
    assert_eq!(within(second).await.unwrap(), 200, "R2");
    until("both requests reach the session's handler", || {
        handler.listed() == 2
    })
    .await;
    assert_eq!(b.scoped().restores_pending(), (0, 0));
    assert_eq!(within(b.list(&session, None, 4)).await, 200);
}

/// With sessions bound to their callers (C20), another caller's request
/// racing the owner's restore of the session is answered exactly as for an
/// unknown session, 404, and never reaches the session; the owner's
/// requests are served. Each ordering of the two on the instance that
/// restores is forced below; rmcp serializes the requests that found the
/// session absent behind the first one's restore and hands them its
/// outcome, so without the adapter's care the other caller got the
/// owner's (500 once its request reached the session), or the owner got
/// the other caller's (404).
mod callers_racing {
    use super::*;

    /// Two instances on one store, sessions bound to their callers, a
    /// session of alice's opened on A, and when the race begins.
    async fn setup() -> (Instance, Instance, Counted, String, tokio::time::Instant) {
        let store = Arc::new(MemoryStore::new());
        let handler = Counted::default();
        let callers = callers();
        let a = instance(&store, &handler, &callers);
        let b = instance(&store, &handler, &callers);
        let session = a.open(Some("alice")).await;
        (a, b, handler, session, tokio::time::Instant::now())
    }

    /// Whether `task` is still waiting, once everything else ran as far as
    /// it can.
    async fn waiting<T>(task: &tokio::task::JoinHandle<T>) -> bool {
        settle().await;
        !task.is_finished()
    }

    /// After a race: only alice's requests reached the handler, B serves
    /// her and still not mallory, nothing is left in flight, and no wait
    /// ran out (each ended when what it waited for was over; tokio's clock
    /// is paused, so this is no timing).
    async fn afterwards(
        b: &Instance,
        handler: &Counted,
        session: &str,
        alice_served: usize,
        started: tokio::time::Instant,
    ) {
        until("alice's requests reach the handler", || {
            handler.listed() >= alice_served
        })
        .await;
        assert_eq!(within(b.list(session, Some("mallory"), 90)).await, 404);
        assert_eq!(within(b.list(session, Some("alice"), 91)).await, 200);
        until("alice's last request reaches the handler", || {
            handler.listed() > alice_served
        })
        .await;
        settle().await;
        assert_eq!(
            handler.listed(),
            alice_served + 1,
            "only alice's requests were served"
        );
        assert_eq!(b.scoped().restores_pending(), (0, 0));
        assert_eq!(b.scoped().misses_pending(), 0);
        assert!(
            started.elapsed() < crate::restores::RESTORE_WAIT,
            "a wait ran out"
        );
    }

    /// Mallory's request arrives while alice's restore loads the session's
    /// state (rmcp has taken the restore on; mallory's request would wait
    /// for it and be handed its outcome). It waits for alice's restore to
    /// be over, then finds the session unknown: 404.
    #[tokio::test(start_paused = true)]
    async fn while_the_owners_restore_loads_the_other_callers_request_is_404() {
        let (_a, b, handler, session, started) = setup().await;
        let mut loading = b.loading.arm();
        let first = tokio::spawn(b.list(&session, Some("alice"), 2));
        loading.reached().await;
        let theirs = tokio::spawn(b.list(&session, Some("mallory"), 3));
        settle().await;
        loading.release();
        assert_eq!(within(first).await.unwrap(), 200, "alice's restore");
        assert_eq!(
            within(theirs).await.unwrap(),
            404,
            "mallory (rmcp alone: 500)"
        );
        afterwards(&b, &handler, &session, 1, started).await;
    }

    /// Mallory's request arrives when alice's restore holds the session
    /// but has not replayed `initialize` yet; with it, another request of
    /// alice's. Alice's is served once the handshake is replayed,
    /// mallory's is 404.
    #[tokio::test(start_paused = true)]
    async fn mid_restore_the_other_callers_request_is_404() {
        let (_a, b, handler, session, started) = setup().await;
        let mut replaying = b.manager.replaying.arm();
        let first = tokio::spawn(b.list(&session, Some("alice"), 2));
        replaying.reached().await;
        let theirs = tokio::spawn(b.list(&session, Some("mallory"), 3));
        let mine = tokio::spawn(b.list(&session, Some("alice"), 4));
        assert!(waiting(&theirs).await, "mallory waits for the restore");
        assert!(waiting(&mine).await, "alice waits for the restore");
        replaying.release();
        assert_eq!(within(first).await.unwrap(), 200, "alice's restore");
        assert_eq!(within(mine).await.unwrap(), 200, "alice, mid-restore");
        assert_eq!(
            within(theirs).await.unwrap(),
            404,
            "mallory (rmcp alone: 500)"
        );
        afterwards(&b, &handler, &session, 2, started).await;
    }

    /// Mallory's request came first: rmcp is loading the session's state
    /// for it (and will find none for mallory) when alice's arrives. Alice's
    /// waits for that to be over, then restores the session: 200 (rmcp
    /// alone: alice's request is handed mallory's outcome, 404).
    #[tokio::test(start_paused = true)]
    async fn the_owners_request_arriving_while_the_other_callers_loads_is_served() {
        let (_a, b, handler, session, started) = setup().await;
        let mut loading = b.loading.arm();
        let theirs = tokio::spawn(b.list(&session, Some("mallory"), 2));
        loading.reached().await;
        let mine = tokio::spawn(b.list(&session, Some("alice"), 3));
        settle().await;
        loading.release();
        assert_eq!(within(theirs).await.unwrap(), 404, "mallory");
        assert_eq!(within(mine).await.unwrap(), 200, "alice (rmcp alone: 404)");
        afterwards(&b, &handler, &session, 1, started).await;
    }

    /// Mallory's request found the session absent and is on its way to
    /// rmcp's restore when alice's arrives: alice's waits for mallory's to
    /// be answered (404), then restores the session (200).
    #[tokio::test(start_paused = true)]
    async fn the_owners_request_waits_for_the_other_callers_that_found_the_session_absent() {
        let (_a, b, handler, session, started) = setup().await;
        let mut missed = b.manager.missed.arm();
        let theirs = tokio::spawn(b.list(&session, Some("mallory"), 2));
        missed.reached().await;
        let mine = tokio::spawn(b.list(&session, Some("alice"), 3));
        assert!(waiting(&mine).await, "alice waits for mallory's request");
        missed.release();
        assert_eq!(within(theirs).await.unwrap(), 404, "mallory");
        assert_eq!(within(mine).await.unwrap(), 200, "alice");
        afterwards(&b, &handler, &session, 1, started).await;
    }

    /// Alice's request found the session absent and is on its way to
    /// restore it when mallory's arrives: mallory's waits for alice's
    /// restore, then is 404 (rmcp alone: handed alice's outcome, 500).
    #[tokio::test(start_paused = true)]
    async fn the_other_callers_request_waits_for_the_owners_that_found_the_session_absent() {
        let (_a, b, handler, session, started) = setup().await;
        let mut missed = b.manager.missed.arm();
        let first = tokio::spawn(b.list(&session, Some("alice"), 2));
        missed.reached().await;
        let theirs = tokio::spawn(b.list(&session, Some("mallory"), 3));
        assert!(waiting(&theirs).await, "mallory waits for alice's request");
        missed.release();
        assert_eq!(within(first).await.unwrap(), 200, "alice");
        assert_eq!(
            within(theirs).await.unwrap(),
            404,
            "mallory (rmcp alone: 500)"
        );
        afterwards(&b, &handler, &session, 1, started).await;
    }
}
