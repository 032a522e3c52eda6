//! [`Backend`]: what a backend crate tells the facade about itself, so that
//! `connect(url)` can open it by URL scheme without knowing its internals.

use std::sync::Arc;

use futures_core::future::BoxFuture;

use crate::error::Result;
use crate::memory::MemoryStore;
use crate::options::StoreOptions;
use crate::store::Store;

/// A backend as the facade's `connect` sees it: its name, the URL schemes
/// it opens, the facade feature that compiles it in, and how to open a URL.
///
/// Every backend crate exports one as `BACKEND`; [`MemoryStore::BACKEND`]
/// is the in-memory store's. `connect` parses the whole URL with the
/// backend's own options (so every parameter the backend reads from a URL
/// is the backend crate's business, not the facade's) and applies the
/// shared [`StoreOptions`] over them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> mcp_event_store_core::Result<()> {
/// use mcp_event_store_core::{Backend, EventStore, MemoryStore, NewEvent, StoreOptions};
///
/// let backend: &Backend = &MemoryStore::BACKEND;
/// assert!(backend.opens("memory://"));
/// assert!(!backend.opens("sqlite://events.db"));
/// let store = (backend.connect)("memory://", StoreOptions::default()).await?;
/// store.store_event("stream", NewEvent::new(b"hello")).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    /// The backend's name, as errors and traces name it (`"sqlite"`).
    pub name: &'static str,
    /// The URL schemes it opens, lowercase and without `://`
    /// (`["postgres", "postgresql"]`).
    pub schemes: &'static [&'static str],
    /// The cargo feature of the `mcp-event-store` facade that compiles it
    /// in; empty for the in-memory store, which is always there.
    pub feature: &'static str,
    /// Opens the store `url` names, with these shared options. The URL's
    /// scheme is one of [`schemes`](Self::schemes); its other parts,
    /// parameters included, are parsed by the backend, and a parameter it
    /// does not know is [`Error::Config`](crate::Error::Config).
    pub connect: fn(&str, StoreOptions) -> Connecting,
}

/// What [`Backend::connect`] returns: the store being opened, as any
/// backend (the facade's `DynStore`).
pub type Connecting = BoxFuture<'static, Result<Arc<dyn Store>>>;

impl Backend {
    /// Whether `url`'s scheme (the text before the first `:`, in any case)
    /// is one of this backend's.
    pub fn opens(&self, url: &str) -> bool {
        url.split_once(':').is_some_and(|(scheme, _)| {
            self.schemes
                .iter()
                .any(|known| known.eq_ignore_ascii_case(scheme))
        })
    }
}

impl MemoryStore {
    /// The in-memory store as a [`Backend`]: scheme `memory`
    /// (`memory://`; the rest of the URL is ignored), a fresh empty store
    /// per call.
    pub const BACKEND: Backend = Backend {
        name: "memory",
        schemes: &["memory"],
        feature: "",
        connect: |_url, options| {
            Box::pin(async move {
                Ok(Arc::new(MemoryStore::try_with_options(options)?) as Arc<dyn Store>)
            })
        },
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::options::Retention;

    #[test]
    fn schemes_match_in_any_case_and_only_before_the_colon() {
        let memory = MemoryStore::BACKEND;
        assert!(memory.opens("memory://"));
        assert!(memory.opens("MEMORY://x"));
        assert!(memory.opens("memory:"));
        assert!(!memory.opens("memory"));
        assert!(!memory.opens("memoryx://"));
        assert!(!memory.opens("sqlite://memory"));
    }

    #[tokio::test]
    async fn memory_connect_applies_and_checks_the_shared_options() {
        let store = (MemoryStore::BACKEND.connect)("memory://", StoreOptions::default())
            .await
            .unwrap();
        drop(store);
        let bad = StoreOptions::default().retention(Retention::default().max_events_per_stream(0));
        let Err(err) = (MemoryStore::BACKEND.connect)("memory://", bad).await else {
            panic!("invalid options were accepted");
        };
        assert!(matches!(err, Error::Config(_)), "{err}");
    }
}
