//! Who is calling: the one hook an application sets so that every
//! framework binds sessions, streams and tasks to the same principal.

use std::fmt;
use std::sync::Arc;

use mcp_event_store_core::task::Owner;
use sha2::{Digest, Sha256};

/// The domain of a principal's digest. (It names the tower-mcp adapter
/// because that adapter bound tasks this way first: tasks it stored keep
/// their owner.)
const PRINCIPAL_DOMAIN: &[u8] = b"mcp-event-store-tower-mcp/owner\0";

type Resolve = dyn Fn(&http::Extensions) -> Option<String> + Send + Sync;

/// Who is calling: the principal your authentication established for a
/// request, read from the request's extensions (C20, T3).
///
/// Set it once; both integrations take it (rmcp's `Durable::builder(..)
/// .callers(..)`, tower-mcp's `TowerMcp::session_principal`) and bind to
/// it every session a request opens, the streams of that session and the
/// tasks it creates. A request of another principal is then answered as if
/// the session or task did not exist: a restore, a resume, a `DELETE`, a
/// task call, on every instance.
///
/// Your authentication middleware (a JWT check, mTLS, an authenticating
/// proxy's header read by a layer of yours) puts its result in the
/// request's extensions; the hook maps it to a principal string. A request
/// with no principal is anonymous: it reaches only anonymous sessions and
/// tasks, and never one bound to a principal.
///
/// ```
/// use mcp_event_store_runtime::Callers;
///
/// /// What the application's authentication inserts.
/// #[derive(Clone)]
/// struct Claims { sub: String }
///
/// let callers = Callers::from_extension(|claims: &Claims| claims.sub.clone());
/// let mut extensions = http::Extensions::new();
/// assert_eq!(callers.principal(&extensions), None);
/// extensions.insert(Claims { sub: "alice".into() });
/// assert_eq!(callers.principal(&extensions).as_deref(), Some("alice"));
/// assert_ne!(callers.owner(&extensions), Callers::anonymous().owner(&extensions));
/// ```
#[derive(Clone, Default)]
pub struct Callers {
    resolve: Option<Arc<Resolve>>,
}

impl Callers {
    /// Every caller anonymous: session and task ids are the only
    /// credentials. The default.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// The principal `resolve` reads from a request's extensions; `None`
    /// for an anonymous request. Every string is a principal of its own,
    /// the empty one included (tower-mcp refuses a request with a blank
    /// one).
    pub fn from_fn(
        resolve: impl Fn(&http::Extensions) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            resolve: Some(Arc::new(resolve)),
        }
    }

    /// The principal `principal` reads from the extension of type `T` your
    /// authentication inserts; a request without one is anonymous.
    pub fn from_extension<T: Send + Sync + 'static>(
        principal: impl Fn(&T) -> String + Send + Sync + 'static,
    ) -> Self {
        Self::from_fn(move |extensions| extensions.get::<T>().map(&principal))
    }

    /// Whether a hook is set: callers are told apart.
    pub fn is_bound(&self) -> bool {
        self.resolve.is_some()
    }

    /// The principal of a request with these extensions, `None` if it is
    /// anonymous.
    pub fn principal(&self, extensions: &http::Extensions) -> Option<String> {
        (self.resolve.as_ref()?)(extensions)
    }

    /// The store's owner for a request with these extensions: what
    /// sessions and tasks are bound to.
    pub fn owner(&self, extensions: &http::Extensions) -> Owner {
        owner_of(self.principal(extensions).as_deref())
    }
}

/// The store's owner for a principal (`None`: anonymous): a digest of the
/// principal, so any string, however long, is an owner of its own.
pub fn owner_of(principal: Option<&str>) -> Owner {
    match principal {
        None => Owner::Anonymous,
        Some(principal) => {
            let digest = Sha256::new()
                .chain_update(PRINCIPAL_DOMAIN)
                .chain_update(principal.as_bytes())
                .finalize();
            Owner::principal(&digest).expect("a digest is a principal's size")
        }
    }
}

impl fmt::Debug for Callers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callers")
            .field("bound", &self.is_bound())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_principal_is_an_owner_of_its_own() {
        let callers = Callers::from_fn(|extensions| extensions.get::<String>().cloned());
        let with = |principal: &str| {
            let mut extensions = http::Extensions::new();
            extensions.insert(principal.to_owned());
            callers.owner(&extensions)
        };
        assert_ne!(with(""), Owner::Anonymous);
        assert_ne!(with(""), with(" "));
        assert_ne!(with("alice"), Owner::Anonymous);
        assert_ne!(with("alice"), with("bob"));
        assert_eq!(with("alice"), owner_of(Some("alice")));
        // Longer than a raw principal may be: still an owner of its own.
        assert_ne!(with(&"a".repeat(300)), with(&"a".repeat(301)));
        assert_eq!(
            Callers::anonymous().owner(&http::Extensions::new()),
            Owner::Anonymous
        );
    }
}
