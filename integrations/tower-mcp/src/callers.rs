//! The one hook that says who is calling ([`Callers`]), wired into
//! tower-mcp's own bindings: sessions (its session principal) and tasks
//! (its task owner).

use std::task::{Context, Poll};

use axum::http::Request;
use mcp_event_store_runtime::Callers;
use tower_mcp::{Extensions, HttpTransport, McpRouter};

/// The principal [`Callers`] read from a request, put where tower-mcp's
/// resolvers see it by [`CallersLayer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallerPrincipal(pub String);

/// Binds what tower-mcp binds to a principal (a session, C20; a task, T3)
/// to the principal [`Callers`] reads from each request: the same hook an
/// rmcp server of this project takes, so both frameworks bind alike.
///
/// Set it on the [`McpRouter`] (task owners) and on the [`HttpTransport`]
/// (session principals), and put [`CallersLayer`] around the router the
/// transport makes. tower-mcp then answers a request of any other
/// principal as for an unknown session or task, on every instance (the
/// principal is kept with the session's record in the store).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use mcp_event_store_tower_mcp::{BindCallers, Callers, CallersLayer};
/// use tower_mcp::{HttpTransport, McpRouter};
///
/// /// What your authentication middleware inserts in the request.
/// #[derive(Clone)]
/// struct Claims { sub: String }
///
/// let callers = Callers::from_extension(|claims: &Claims| claims.sub.clone());
/// let router = McpRouter::new().server_info("demo", "1").bind_callers();
/// let app = HttpTransport::new(router)
///     .bind_callers()
///     .into_router_at("/mcp")
///     .layer(CallersLayer::new(callers));
/// # let _ = app;
/// # }
/// ```
pub trait BindCallers {
    /// This, reading principals [`CallersLayer`] put in the request.
    fn bind_callers(self) -> Self;
}

fn principal(extensions: &Extensions) -> Option<String> {
    extensions
        .get::<CallerPrincipal>()
        .map(|caller| caller.0.clone())
}

impl BindCallers for McpRouter {
    fn bind_callers(self) -> Self {
        self.task_owner_resolver(principal)
    }
}

impl BindCallers for HttpTransport {
    fn bind_callers(self) -> Self {
        self.bridge_extension::<CallerPrincipal>()
            .session_principal_resolver(principal)
    }
}

/// A layer that reads each request's principal with [`Callers`] and puts
/// it in the request as a [`CallerPrincipal`], for what
/// [`BindCallers`] set. Put it outside tower-mcp's router, inside your
/// authentication.
#[derive(Clone, Debug)]
pub struct CallersLayer {
    callers: Callers,
}

impl CallersLayer {
    /// The layer for `callers`.
    pub fn new(callers: Callers) -> Self {
        Self { callers }
    }
}

impl<S> tower_layer::Layer<S> for CallersLayer {
    type Service = CallersService<S>;

    fn layer(&self, inner: S) -> CallersService<S> {
        CallersService {
            inner,
            callers: self.callers.clone(),
        }
    }
}

/// The service [`CallersLayer`] makes.
#[derive(Clone, Debug)]
pub struct CallersService<S> {
    inner: S,
    callers: Callers,
}

impl<S, B> tower_service::Service<Request<B>> for CallersService<S>
where
    S: tower_service::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if let Some(principal) = self.callers.principal(request.extensions()) {
            request.extensions_mut().insert(CallerPrincipal(principal));
        }
        self.inner.call(request)
    }
}
