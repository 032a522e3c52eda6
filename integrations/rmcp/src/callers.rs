//! Each request served as its caller: what binds sessions to the principal
//! that opened them (C20).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use mcp_event_store_core::task::Owner;
use mcp_event_store_runtime::Callers;

tokio::task_local! {
    /// The owner of the request this task serves.
    static CALLER: Owner;
}

/// Whether the missing-scope warning was logged already (once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Who the request being served is bound to: [`Owner::Anonymous`] when
/// callers are not told apart (`bound` false); the caller [`CallerScoped`]
/// recorded otherwise, or `None` (nobody: the request is refused as for an
/// unknown session) when it did not pass through it.
pub(crate) fn caller(bound: bool) -> Option<Owner> {
    if !bound {
        return Some(Owner::Anonymous);
    }
    let caller = CALLER.try_with(|owner| *owner).ok();
    if caller.is_none() && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::error!(
            "callers are bound but a request was served outside CallerScoped: its sessions \
             answer as unknown; serve rmcp's service through Durable::service or \
             Durable::scoped"
        );
    }
    caller
}

/// The owner of the request being served, if this task serves one
/// through [`CallerScoped`]; `None` for rmcp's own tasks (a session's
/// worker closing it when it ends).
pub(crate) fn scoped_caller() -> Option<Owner> {
    CALLER.try_with(|owner| *owner).ok()
}

/// `future`, run as a request of `owner`: what [`CallerScoped`] does for
/// each request of a tower service, for any future (`Send` or not).
pub(crate) fn serve_as<F: Future>(
    owner: Owner,
    future: F,
) -> impl Future<Output = F::Output> + use<F> {
    CALLER.scope(owner, future)
}

/// An HTTP service (rmcp's `StreamableHttpService`) that serves each
/// request as its caller, so that the session store and the session
/// manager know who asks: a session restored, resumed or deleted by anyone
/// but the principal that opened it is answered as an unknown one (C20).
///
/// [`Durable::service`](crate::Durable::service) returns its service
/// wrapped so; wrap one you build yourself with
/// [`Durable::scoped`](crate::Durable::scoped).
#[derive(Clone)]
pub struct CallerScoped<S> {
    inner: S,
    callers: Callers,
}

impl<S> CallerScoped<S> {
    /// `inner`, with each request's caller read by `callers`.
    pub fn new(inner: S, callers: Callers) -> Self {
        Self { inner, callers }
    }

    /// The wrapped service.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S> fmt::Debug for CallerScoped<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallerScoped")
            .field("callers", &self.callers)
            .finish_non_exhaustive()
    }
}

impl<S, B> tower_service::Service<http::Request<B>> for CallerScoped<S>
where
    S: tower_service::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let owner = self.callers.owner(request.extensions());
        Box::pin(serve_as(owner, self.inner.call(request)))
    }
}
