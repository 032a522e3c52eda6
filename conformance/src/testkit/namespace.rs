//! A private namespace per test (a schema, a key prefix), removed when
//! the test ends, also when it panics.

use std::fmt;

use futures_core::future::BoxFuture;

/// Removes a namespace's data, given its name.
pub type Cleanup = Box<dyn FnOnce(String) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// 16 random hex digits, from the OS's random source: enough that tests
/// running at once on one server never share a namespace.
pub fn random_suffix() -> String {
    let n = getrandom::u64().expect("OS randomness");
    format!("{n:016x}")
}

/// A namespace of one test's own on a shared server: a name (a prefix and
/// [`random_suffix`]) and how to remove its data.
///
/// [`remove`](Self::remove) removes it when the test ends and reports a
/// failure. A test that panics first never gets there: dropping the guard
/// then removes the data on a thread with a runtime of its own (`Drop`
/// cannot await), so a failing test leaves nothing behind on a shared
/// server either.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::{Arc, Mutex};
/// use mcp_event_store_conformance::testkit::Namespace;
///
/// let removed = Arc::new(Mutex::new(Vec::new()));
/// let seen = removed.clone();
/// let namespace = Namespace::new("mcp_test_", move |name| {
///     Box::pin(async move {
///         seen.lock().unwrap().push(name);
///         Ok(())
///     })
/// });
/// let name = namespace.name().to_owned();
/// assert!(name.starts_with("mcp_test_"));
/// drop(namespace); // as when the test panicked before removing it
/// assert_eq!(*removed.lock().unwrap(), vec![name]);
/// # }
/// ```
pub struct Namespace {
    name: String,
    cleanup: Option<Cleanup>,
}

impl Namespace {
    /// A fresh namespace named `prefix` and a random suffix; `cleanup`
    /// removes its data.
    pub fn new<F>(prefix: &str, cleanup: F) -> Self
    where
        F: FnOnce(String) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
    {
        Self::named(format!("{prefix}{}", random_suffix()), cleanup)
    }

    /// A namespace with exactly this name (another process's, to share).
    pub fn named<F>(name: String, cleanup: F) -> Self
    where
        F: FnOnce(String) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static,
    {
        Self {
            name,
            cleanup: Some(Box::new(cleanup)),
        }
    }

    /// A namespace this guard never removes: another guard (in this or
    /// another process) owns it.
    pub fn borrowed(name: String) -> Self {
        Self {
            name,
            cleanup: None,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes its data now.
    ///
    /// # Panics
    ///
    /// When the removal fails, naming the namespace: a test that cannot
    /// clean up says so.
    pub async fn remove(mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            let name = self.name.clone();
            cleanup(name.clone())
                .await
                .unwrap_or_else(|e| panic!("removing test namespace {name}: {e}"));
        }
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .field("owned", &self.cleanup.is_some())
            .finish()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        let removal = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(cleanup(name))
        });
        if let Ok(Err(e)) = removal.join() {
            eprintln!("removing a test namespace after a failure: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn recording(
        log: &Arc<Mutex<Vec<String>>>,
    ) -> impl FnOnce(String) -> BoxFuture<'static, Result<(), String>> + Send + Sync + 'static {
        let log = log.clone();
        move |name| {
            Box::pin(async move {
                log.lock().unwrap().push(name);
                Ok(())
            })
        }
    }

    #[tokio::test]
    async fn remove_cleans_up_once() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let namespace = Namespace::new("t_", recording(&log));
        let name = namespace.name().to_owned();
        namespace.remove().await;
        assert_eq!(*log.lock().unwrap(), vec![name]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_test_still_cleans_up() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let recorder = recording(&log);
        let task = tokio::spawn(async move {
            let _namespace = Namespace::new("t_", recorder);
            panic!("the test failed");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn borrowed_namespaces_are_left_alone_and_names_differ() {
        drop(Namespace::borrowed("someone-else".into()));
        let a = Namespace::borrowed(format!("p{}", random_suffix()));
        let b = Namespace::borrowed(format!("p{}", random_suffix()));
        assert_ne!(a.name(), b.name());
    }

    #[tokio::test]
    #[should_panic(expected = "removing test namespace")]
    async fn a_failed_removal_is_reported() {
        Namespace::new("t_", |_| Box::pin(async { Err("gone".to_owned()) }))
            .remove()
            .await;
    }
}
