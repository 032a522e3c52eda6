//! Test support: the conformance harness for this backend.
//!
//! The server is found as [`testkit::find_server`] says, and the tests fail
//! (never skip) when none is found:
//!
//! 1. the `MCP_EVENT_STORE_NATS_URL` environment variable;
//! 2. the local default `nats://127.0.0.1:4222`, if it answers within a
//!    second with JetStream enabled;
//! 3. with the `testcontainers` feature, a container of a pinned NATS
//!    image run with `-js` ([`SERVER`]; `MCP_EVENT_STORE_NATS_IMAGE=name:tag`
//!    starts another image).
//!
//! `MCP_EVENT_STORE_TEST_SERVER=env`, `local` or `container` uses only that
//! way.
//!
//! ```ignore
//! use mcp_event_store_nats::testing::NatsHarness;
//! mcp_event_store_conformance::event_suite!(NatsHarness::new(), persistent);
//! ```

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures_core::future::BoxFuture;
use mcp_event_store_conformance::events::{Harness, PersistentHarness, UrlHarness};
use mcp_event_store_conformance::tasks::{NO_RECHECK, PersistentTaskHarness, TaskHarness};
use mcp_event_store_conformance::testkit::{self, Container, Namespace, ServerSpec};
use mcp_event_store_core::{Result, StoreOptions};

use crate::setup::FORMAT_KEY;
use crate::{FORMAT_VERSION, NatsOptions, NatsStore};

/// Where the tests find their NATS server.
pub const SERVER: ServerSpec = ServerSpec {
    name: "NATS (JetStream)",
    env: "MCP_EVENT_STORE_NATS_URL",
    local: "nats://127.0.0.1:4222",
    container: Container {
        image: "nats",
        tag: "2.10-alpine",
        image_env: "MCP_EVENT_STORE_NATS_IMAGE",
        port: 4222,
        ready_on_stderr: true,
        ready_message: "Server is ready",
        env: &[],
        // JetStream on (the official image's entry point is the server).
        cmd: &["-js"],
        url: |host, port| format!("nats://{host}:{port}"),
    },
};

/// The prefix of every test's store: `mcp-es-test-<16 random hex digits>`.
pub const TEST_PREFIX: &str = "mcp-es-test-";

/// The URL of the test server ([`testkit::find_server`] with [`SERVER`]).
///
/// # Panics
///
/// When no server is found, with a message naming every way to provide one.
pub async fn server_url() -> String {
    testkit::find_server(&SERVER, probe).await
}

/// Whether the server at `url` answers, with JetStream on.
fn probe(url: String) -> BoxFuture<'static, std::result::Result<(), String>> {
    Box::pin(async move {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(std::time::Duration::from_secs(1))
            .connect(servers(&url).as_slice())
            .await
            .map_err(|e| e.to_string())?;
        if client.server_info().jetstream {
            Ok(())
        } else {
            Err("JetStream is disabled on this server (start it with -js)".into())
        }
    })
}

/// A prefix of one test's own on the server at `url`: [`Namespace::remove`]
/// deletes its streams and buckets, and so does dropping the guard if the
/// test panicked first.
pub fn namespace(url: &str) -> Namespace {
    let url = url.to_owned();
    Namespace::new(TEST_PREFIX, move |prefix| {
        Box::pin(async move {
            remove_prefix(&url, &prefix)
                .await
                .map_err(|e| e.to_string())
        })
    })
}

/// Deletes every stream and bucket of the store under `prefix`.
pub async fn remove_prefix(url: &str, prefix: &str) -> Result<()> {
    let client = async_nats::connect(servers(url).as_slice())
        .await
        .map_err(crate::error::backend)?;
    let js = async_nats::jetstream::new(client);
    for stream in crate::state::stream_names(prefix) {
        if let Err(e) = js.delete_stream(&stream).await
            && !e.to_string().contains("not found")
        {
            return Err(crate::error::backend(e));
        }
    }
    Ok(())
}

/// The servers of a store URL, each a URL of its own, without the
/// store's parameters.
fn servers(url: &str) -> Vec<String> {
    NatsOptions::default()
        .servers(url)
        .map(|(servers, _)| servers)
        .unwrap_or_else(|e| panic!("not a NATS URL ({e})"))
}

/// `url` with the `prefix` parameter set.
fn with_prefix(url: &str, prefix: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}prefix={prefix}")
}

/// The conformance harness: one server, one prefix ([`namespace`]) per
/// harness. Every [`open`](Harness::open) is a new connection on that
/// prefix, which is exactly a reopen, so the `persistent` cases apply.
/// Clones share the prefix; [`Harness::teardown`] deletes it. A harness
/// made by [`attach`](PersistentHarness::attach) deletes nothing.
#[derive(Debug, Clone)]
pub struct NatsHarness {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    url: String,
    prefix: String,
    namespace: Mutex<Option<Namespace>>,
}

impl NatsHarness {
    /// A harness on the test server (see [`server_url`]).
    pub async fn new() -> Self {
        Self::with_url(server_url().await).await
    }

    /// A harness on the server or cluster at `url`, under a prefix of its
    /// own.
    pub async fn with_url(url: impl Into<String>) -> Self {
        let url = url.into();
        let namespace = namespace(&url);
        Self::on(url, namespace)
    }

    fn on(url: String, namespace: Namespace) -> Self {
        Self {
            shared: Arc::new(Shared {
                url,
                prefix: namespace.name().to_owned(),
                namespace: Mutex::new(Some(namespace)),
            }),
        }
    }

    /// The server URL.
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// This harness's prefix.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The options `open` uses: the given store options under this prefix.
    pub fn options(&self, store: StoreOptions) -> NatsOptions {
        NatsOptions::default().store(store).prefix(self.prefix())
    }
}

#[async_trait]
impl Harness for NatsHarness {
    type Store = NatsStore;

    async fn open(&self, options: StoreOptions) -> NatsStore {
        self.try_open(options)
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()))
    }

    async fn close(&self, store: NatsStore) {
        store.close().await;
    }

    /// Redemption records age out of their bucket by JetStream's own
    /// clock (its age limit, C21).
    fn forgets_redemptions_itself(&self) -> bool {
        true
    }

    async fn teardown(self) {
        let namespace = self
            .shared
            .namespace
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(namespace) = namespace {
            namespace.remove().await;
        }
    }
}

#[async_trait]
impl PersistentHarness for NatsHarness {
    /// The server URL with this harness's prefix as its `prefix` parameter.
    fn locator(&self) -> String {
        with_prefix(self.url(), self.prefix())
    }

    async fn attach(locator: &str) -> Self {
        let prefix = NatsOptions::from_url(locator)
            .unwrap_or_else(|e| panic!("not a NATS harness locator ({e})"))
            .prefix;
        // The locator's other parameters (replicas) stay with the URL.
        let url = locator.replace(&format!("prefix={prefix}"), "");
        let url = url
            .trim_end_matches(['?', '&'])
            .replace("?&", "?")
            .replace("&&", "&");
        Self::on(url, Namespace::borrowed(prefix))
    }

    async fn try_open(&self, options: StoreOptions) -> Result<NatsStore> {
        NatsStore::connect_with(self.url(), self.options(options)).await
    }

    fn format_version(&self) -> u64 {
        u64::from(FORMAT_VERSION)
    }

    /// Sets the meta bucket's `format` key, where every release keeps it.
    async fn set_format_version(&self, version: u64) {
        let client = async_nats::connect(servers(self.url()).as_slice())
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()));
        let js = async_nats::jetstream::new(client);
        let meta = js
            .get_key_value(format!("{}-meta", self.prefix()))
            .await
            .unwrap_or_else(|e| panic!("opening the meta bucket failed: {e}"));
        meta.put(FORMAT_KEY, Bytes::from(version.to_string()))
            .await
            .unwrap_or_else(|e| panic!("setting the format failed: {e}"));
    }

    /// Every message (subject, headers, payload) of every stream of the
    /// harness's prefix: its events and spill streams and its key-value
    /// buckets' streams.
    async fn stored_bytes(&self) -> Vec<u8> {
        use futures_util::TryStreamExt;
        let client = async_nats::connect(servers(self.url()).as_slice())
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()));
        let js = async_nats::jetstream::new(client);
        let names: Vec<String> = js
            .stream_names()
            .try_collect()
            .await
            .expect("list the server's streams");
        let mut bytes = Vec::new();
        for name in names
            .into_iter()
            .filter(|name| name.contains(self.prefix()))
        {
            let mut stream = js.get_stream(&name).await.expect("open a stream");
            let state = &stream.info().await.expect("a stream's state").state;
            let (first, last) = (state.first_sequence, state.last_sequence);
            for seq in first..=last {
                let Ok(message) = stream.get_raw_message(seq).await else {
                    continue; // removed since (a purge, a deleted key)
                };
                bytes.extend(message.subject.as_bytes());
                for (name, values) in message.headers.iter() {
                    bytes.extend(name.to_string().into_bytes());
                    for value in values {
                        bytes.extend(value.as_str().as_bytes());
                    }
                }
                bytes.extend_from_slice(&message.payload);
            }
        }
        bytes
    }
}

#[async_trait]
impl UrlHarness for NatsHarness {
    /// The server URL with this harness's prefix as its `prefix` parameter.
    fn url(&self) -> String {
        with_prefix(&self.shared.url, &self.shared.prefix)
    }

    async fn remove(self: Box<Self>) {
        Harness::teardown(*self).await;
    }
}

/// The task suite on NATS: every [`open`](TaskHarness::open) is a new
/// connection on the harness's prefix, and
/// [`raw_rows`](TaskHarness::raw_rows) dumps the task buckets.
#[async_trait]
impl TaskHarness for NatsHarness {
    type Store = NatsStore;

    async fn open(&self, options: StoreOptions) -> NatsStore {
        Harness::open(self, options).await
    }

    /// A handle whose watches re-read only when woken (the safety-net
    /// re-read an hour away).
    async fn open_without_recheck(&self, options: StoreOptions) -> NatsStore {
        NatsStore::connect_with(self.url(), self.options(options).follow_recheck(NO_RECHECK))
            .await
            .unwrap_or_else(|e| panic!("connecting to {} failed: {e}", self.url()))
    }

    async fn close(&self, store: NatsStore) {
        Harness::close(self, store).await;
    }

    /// The store's own (C22): every NATS store is an event store.
    fn rewriter<'s>(
        &self,
        store: &'s Self::Store,
    ) -> Option<&'s dyn mcp_event_store_core::rewrite::RewriteStore> {
        mcp_event_store_core::EventStore::rewriter(store)
    }

    async fn raw_rows(&self) -> Option<Vec<Vec<u8>>> {
        let store = Harness::open(self, StoreOptions::default()).await;
        let rows = crate::tasks::raw_rows(&store).await.unwrap_or_else(|e| {
            panic!("dumping the task buckets of {} failed: {e}", self.prefix())
        });
        store.close().await;
        Some(rows)
    }

    async fn teardown(self) {
        Harness::teardown(self).await;
    }
}

/// Each task value starts with its format (core's `codec::VALUE_VERSION`),
/// checked when the task is read or written.
#[async_trait]
impl PersistentTaskHarness for NatsHarness {
    fn task_format_version(&self) -> u64 {
        u64::from(mcp_event_store_core::backend::task::codec::VALUE_VERSION)
    }

    async fn set_task_format_version(&self, version: u64) {
        let version = u8::try_from(version).expect("task value formats are one byte");
        let store = Harness::open(self, StoreOptions::default()).await;
        crate::tasks::set_task_format(&store, version)
            .await
            .unwrap_or_else(|e| panic!("rewriting the tasks of {} failed: {e}", self.prefix()));
        store.close().await;
    }
}
