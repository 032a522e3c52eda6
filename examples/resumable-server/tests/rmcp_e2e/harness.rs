//! Stores to run against, and servers to run on them: in this process, or
//! as a child process that can be killed and started again.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use mcp_event_store::rmcp::{Durable, DurableTasks, Runtime};
use mcp_event_store::task::{
    Applied, CancelMode, Claimed, InstanceId, InstanceLease, NewTask, Owner, Requeue, Rev,
    RuntimeStore, TaskDigest, TaskId, TaskPage, TaskPurgeReport, TaskRecord, TaskStore, TaskView,
    Worker, WorkerChange,
};
use mcp_event_store::testing::UrlHarness;
use mcp_event_store::{
    EventId, EventStore, FollowOptions, HealthReport, NewEvent, PurgeReport, Replay, Retention,
    SessionStore, StoreStats, StreamCursor, StreamPage,
};
use tokio_util::sync::CancellationToken;

use crate::server;

/// A store URL for one test, and what to clean up after it.
pub struct Fixture {
    url: String,
    storage: Option<Box<dyn UrlHarness>>,
}

impl Fixture {
    /// `memory://`: every server opens its own, empty store.
    pub async fn memory() -> Self {
        Self {
            url: "memory://".into(),
            storage: None,
        }
    }

    /// Private storage on the backend named `name`, from the facade's
    /// test list (`mcp_event_store::testing::storage`): a temporary file or
    /// directory, or a schema or key prefix of its own on the test server,
    /// removed afterwards. For `memory`, [`Fixture::memory`].
    pub async fn on(name: &str) -> Self {
        if name == mcp_event_store::MemoryStore::BACKEND.name {
            return Self::memory().await;
        }
        let storage = mcp_event_store::testing::storage(name)
            .await
            .unwrap_or_else(|| panic!("no test storage for {name}: is its feature on?"));
        Self {
            url: storage.url(),
            storage: Some(storage),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Removes what the test stored. (If the test panicked first, the
    /// storage's guard removes it when dropped.)
    pub async fn teardown(self) {
        if let Some(storage) = self.storage {
            storage.remove().await;
        }
    }
}

/// Sessions or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Sessions,
    Stateless,
}

/// The `retry` hint the test servers send, short so clients come back fast.
pub const RETRY: Duration = Duration::from_millis(100);

/// The server, in this process, on a free loopback port.
pub struct Server {
    pub url: String,
    /// `GET`s that carried a `Last-Event-ID`: resumes.
    resumes: Arc<AtomicUsize>,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Shut down with the server, as the real one does.
    durable: Durable,
}

impl Server {
    pub async fn start(store_url: &str, mode: Mode, poll_every: Option<usize>) -> Self {
        Self::start_with(server::Options {
            store: store_url.to_owned(),
            stateless: mode == Mode::Stateless,
            poll_every,
            retry: RETRY,
            ..server::Options::default()
        })
        .await
    }

    /// The server whose `POST` responses (the live streams) end
    /// after `messages` JSON-RPC messages, while resumes are left alone:
    /// the client must resume once, mid-call, and get the rest there.
    pub async fn start_cutting_posts(store_url: &str, mode: Mode, messages: usize) -> Self {
        Self::start_layered(
            server::Options {
                store: store_url.to_owned(),
                stateless: mode == Mode::Stateless,
                retry: RETRY,
                ..server::Options::default()
            },
            Some(messages),
        )
        .await
    }

    /// The server with these options (the listening address is
    /// ignored: a free loopback port is taken).
    pub async fn start_with(options: server::Options) -> Self {
        Self::start_layered(options, None).await
    }

    /// The server on `store_url` whose durable tasks go through a
    /// [`CountingTasks`] around the store; the counter.
    pub async fn start_counting_tasks(store_url: &str) -> (Self, Arc<CountingTasks>) {
        let options = server::Options {
            store: store_url.to_owned(),
            retry: RETRY,
            ..server::Options::default()
        };
        let store = mcp_event_store::connect_with(store_url, options.store_options())
            .await
            .unwrap_or_else(|e| panic!("opening {store_url}: {e}"));
        let counting = Arc::new(CountingTasks {
            inner: store.clone(),
            writes: AtomicUsize::new(0),
        });
        let runtime = Runtime::builder(counting.clone())
            .start()
            .await
            .unwrap_or_else(|e| panic!("the task runtime on {store_url}: {e}"));
        let tasks = DurableTasks::builder()
            .owner(server::owner_of)
            .build(&runtime);
        let durable = server::durable(store, &options)
            .await
            .unwrap_or_else(|e| panic!("wiring {store_url}: {e}"));
        let server = Self::serve(durable, tasks, options, None).await;
        (server, counting)
    }

    async fn start_layered(options: server::Options, cut_posts_after: Option<usize>) -> Self {
        let store_url = &options.store;
        let store = mcp_event_store::connect_with(store_url, options.store_options())
            .await
            .unwrap_or_else(|e| panic!("opening {store_url}: {e}"));
        let durable = server::durable(store, &options)
            .await
            .unwrap_or_else(|e| panic!("wiring {store_url}: {e}"));
        let tasks = durable.tasks();
        Self::serve(durable, tasks, options, cut_posts_after).await
    }

    async fn serve(
        durable: Durable,
        tasks: DurableTasks,
        options: server::Options,
        cut_posts_after: Option<usize>,
    ) -> Self {
        let cancel = CancellationToken::new();
        let resumes = Arc::new(AtomicUsize::new(0));
        let counter = resumes.clone();
        let mut app = server::router(&durable, tasks, &options, &cancel);
        if let Some(messages) = cut_posts_after {
            app = app.layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| async move {
                    let post = request.method() == axum::http::Method::POST;
                    let response = next.run(request).await;
                    if post {
                        server::close_after(response, messages, RETRY)
                    } else {
                        response
                    }
                },
            ));
        }
        let app = app.layer(axum::middleware::map_request(
            move |request: axum::extract::Request| {
                if request.method() == axum::http::Method::GET
                    && request.headers().contains_key("last-event-id")
                {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                std::future::ready(request)
            },
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .expect("the server runs");
        });
        Self {
            url,
            resumes,
            cancel,
            task: Some(task),
            durable,
        }
    }

    pub fn resumes(&self) -> usize {
        self.resumes.load(Ordering::SeqCst)
    }

    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        self.durable.shutdown().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The environment variable that makes this test binary a server process.
pub const CHILD_ENV: &str = "MCP_EVENT_STORE_E2E_SERVER_ARGS";

/// The server in a child process (this test binary, re-executed to
/// run `child_server`), killed by pid when dropped.
pub struct ChildServer {
    child: Child,
    pub url: String,
}

impl ChildServer {
    pub fn spawn(args: &[String]) -> Self {
        Self::spawn_until(args, "LISTENING ")
    }

    /// A worker process (`--worker`): no endpoint, so `url` is empty. It
    /// is ready once it says `WORKING`.
    pub fn spawn_worker(args: &[String]) -> Self {
        let mut args = args.to_vec();
        args.push("--worker".into());
        Self::spawn_until(&args, "WORKING")
    }

    /// The process, once a line of its stdout has `marker`; `url` is what
    /// follows the marker on that line.
    fn spawn_until(args: &[String], marker: &'static str) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "child_server",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, args.join("\u{1f}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the server process");
        let stdout = child.stdout.take().expect("piped stdout");
        let (found, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find(marker) {
                    let _ = found.send(line[at + marker.len()..].trim().to_owned());
                }
            }
        });
        let mut server = Self {
            child,
            url: String::new(),
        };
        server.url = url
            .recv_timeout(Duration::from_secs(60))
            .expect("the server process reports its address");
        server
    }

    /// `SIGKILL`s the server and waits for it to die.
    pub fn kill(mut self) {
        self.child.kill().expect("kill the server process");
        let status = self.child.wait().expect("wait for the server process");
        assert!(!status.success(), "killed, not exited");
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A store that counts the task writes reaching the store it wraps.
pub struct CountingTasks {
    inner: mcp_event_store::DynStore,
    writes: AtomicUsize,
}

impl CountingTasks {
    /// Task writes so far (creates, answers, cancels, worker changes,
    /// claims).
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
    }
}

type R<T> = mcp_event_store::Result<T>;

#[async_trait]
impl EventStore for CountingTasks {
    async fn store_event(&self, stream: &str, event: NewEvent<'_>) -> R<EventId> {
        self.inner.store_event(stream, event).await
    }
    async fn replay_events_after(&self, id: &str) -> R<Replay> {
        self.inner.replay_events_after(id).await
    }
    async fn replay_stream(&self, stream: &str) -> R<Replay> {
        self.inner.replay_stream(stream).await
    }
    async fn get_stream_id_for_event_id(&self, id: &str) -> R<Option<String>> {
        self.inner.get_stream_id_for_event_id(id).await
    }
    async fn delete_stream(&self, stream: &str) -> R<u64> {
        self.inner.delete_stream(stream).await
    }
    async fn purge_expired(&self) -> R<PurgeReport> {
        self.inner.purge_expired().await
    }
    async fn follow_events_after(&self, id: &str, options: FollowOptions) -> R<Replay> {
        self.inner.follow_events_after(id, options).await
    }
    fn open_follows(&self) -> usize {
        self.inner.open_follows()
    }
    fn retention(&self) -> Retention {
        self.inner.retention()
    }
    async fn stats(&self) -> R<StoreStats> {
        self.inner.stats().await
    }
    async fn list_streams(&self, after: Option<&StreamCursor>, limit: usize) -> R<StreamPage> {
        self.inner.list_streams(after, limit).await
    }
    async fn check(&self) -> R<HealthReport> {
        self.inner.check().await
    }
}

#[async_trait]
impl SessionStore for CountingTasks {
    async fn put_session(&self, id: &str, state: &[u8], ttl: Duration) -> R<()> {
        self.inner.put_session(id, state, ttl).await
    }
    async fn get_session(&self, id: &str) -> R<Option<bytes::Bytes>> {
        self.inner.get_session(id).await
    }
    async fn delete_session(&self, id: &str) -> R<bool> {
        self.inner.delete_session(id).await
    }
}

#[async_trait]
impl TaskStore for CountingTasks {
    async fn try_create(&self, id: &TaskId, task: &NewTask<'_>) -> R<Option<TaskRecord>> {
        self.wrote();
        self.inner.try_create(id, task).await
    }
    async fn get(&self, id: &str, who: &Owner) -> R<Option<TaskRecord>> {
        TaskStore::get(&*self.inner, id, who).await
    }
    async fn answer(
        &self,
        id: &str,
        who: &Owner,
        responses: &[(&str, &[u8])],
    ) -> R<Option<TaskRecord>> {
        self.wrote();
        self.inner.answer(id, who, responses).await
    }
    async fn request_cancel(
        &self,
        id: &str,
        who: &Owner,
        mode: CancelMode,
        reason: Option<&str>,
    ) -> R<Option<TaskRecord>> {
        self.wrote();
        self.inner.request_cancel(id, who, mode, reason).await
    }
    async fn watch(
        &self,
        id: &str,
        who: &Owner,
        after: Rev,
        max_wait: Duration,
    ) -> R<Option<TaskRecord>> {
        self.inner.watch(id, who, after, max_wait).await
    }
    async fn purge_expired_tasks(&self) -> R<TaskPurgeReport> {
        self.inner.purge_expired_tasks().await
    }
    async fn delete(&self, id: &str) -> R<bool> {
        TaskStore::delete(&*self.inner, id).await
    }
}

#[async_trait]
impl RuntimeStore for CountingTasks {
    async fn heartbeat(&self, me: InstanceId, lease: Duration) -> R<bool> {
        self.inner.task_runtime().heartbeat(me, lease).await
    }
    async fn is_alive(&self, id: InstanceId) -> R<bool> {
        self.inner.task_runtime().is_alive(id).await
    }
    async fn instances(&self) -> R<Vec<InstanceLease>> {
        self.inner.task_runtime().instances().await
    }
    async fn apply_claimed(
        &self,
        task: &TaskDigest,
        by: Worker,
        change: WorkerChange<'_>,
    ) -> R<Applied> {
        self.wrote();
        self.inner
            .task_runtime()
            .apply_claimed(task, by, change)
            .await
    }
    async fn view_claimed(&self, task: &TaskDigest) -> R<Option<TaskView>> {
        self.inner.task_runtime().view_claimed(task).await
    }
    async fn watch_claimed(
        &self,
        task: &TaskDigest,
        after: Rev,
        max_wait: Duration,
    ) -> R<Option<TaskRecord>> {
        self.inner
            .task_runtime()
            .watch_claimed(task, after, max_wait)
            .await
    }
    async fn claim(&self, by: InstanceId, limit: usize) -> R<Vec<Claimed>> {
        self.wrote();
        self.inner.task_runtime().claim(by, limit).await
    }
    async fn task_page(&self, after: Option<&TaskDigest>, limit: usize) -> R<TaskPage> {
        self.inner.task_runtime().task_page(after, limit).await
    }
    async fn cancel_task(&self, task: &TaskDigest, reason: Option<&str>) -> R<Option<TaskRecord>> {
        self.wrote();
        self.inner.task_runtime().cancel_task(task, reason).await
    }
    async fn requeue_task(&self, task: &TaskDigest) -> R<Requeue> {
        self.wrote();
        self.inner.task_runtime().requeue_task(task).await
    }
}
