//! A round-robin HTTP reverse proxy on loopback, for tests of several
//! server instances behind a load balancer that keeps no affinity: each
//! request goes to the next instance, whatever session it belongs to.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A reverse proxy sending each request to the next of its backends in
/// turn, streaming bodies both ways (an SSE response flows as it comes).
/// It listens on a free loopback port; dropping it stops it.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use mcp_event_store_conformance::testkit::RoundRobin;
///
/// let a: std::net::SocketAddr = "127.0.0.1:18001".parse().unwrap();
/// let b: std::net::SocketAddr = "127.0.0.1:18002".parse().unwrap();
/// let proxy = RoundRobin::start(vec![a, b]).await?;
/// let endpoint = proxy.url("/mcp"); // clients connect here
/// # let _ = endpoint; Ok(()) }
/// ```
pub struct RoundRobin {
    addr: SocketAddr,
    served: Arc<Vec<AtomicUsize>>,
    task: JoinHandle<()>,
}

impl RoundRobin {
    /// Starts proxying to `backends` (at least one), in this order.
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Self> {
        assert!(!backends.is_empty(), "a proxy needs a backend");
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let served: Arc<Vec<AtomicUsize>> =
            Arc::new(backends.iter().map(|_| AtomicUsize::new(0)).collect());
        let shared = Arc::new(Shared {
            backends,
            next: AtomicUsize::new(0),
            served: served.clone(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(shared.forward(request).await) }
                    });
                    // A client that hangs up mid-response ends its connection.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, served, task })
    }

    /// The proxy's URL for `path` (`/mcp`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many requests each backend was sent so far, in the order given.
    pub fn served(&self) -> Vec<usize> {
        self.served
            .iter()
            .map(|count| count.load(Ordering::SeqCst))
            .collect()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    backends: Vec<SocketAddr>,
    next: AtomicUsize,
    served: Arc<Vec<AtomicUsize>>,
    client: Client<HttpConnector, Incoming>,
}

type Body = BoxBody<Bytes, hyper::Error>;

impl Shared {
    async fn forward(&self, mut request: Request<Incoming>) -> Response<Body> {
        let turn = self.next.fetch_add(1, Ordering::SeqCst) % self.backends.len();
        self.served[turn].fetch_add(1, Ordering::SeqCst);
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |path| path.as_str());
        let uri: Uri = match format!("http://{}{path}", self.backends[turn]).parse() {
            Ok(uri) => uri,
            Err(error) => return bad_gateway(format!("no backend URI: {error}")),
        };
        *request.uri_mut() = uri;
        match self.client.request(request).await {
            Ok(response) => response.map(BodyExt::boxed),
            Err(error) => bad_gateway(format!("backend {}: {error}", self.backends[turn])),
        }
    }
}

fn bad_gateway(message: String) -> Response<Body> {
    let body = http_body_util::Full::new(Bytes::from(message))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
