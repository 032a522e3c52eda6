//! Finding the test server: the environment, then the local default, then
//! (with the `testcontainers` feature) a pinned container.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_core::future::BoxFuture;
use tokio::sync::OnceCell;

/// Checks that a server answers at a URL; `Err` says why not.
pub type Probe = fn(String) -> BoxFuture<'static, Result<(), String>>;

/// Where a backend's tests look for their server.
///
/// ```
/// use mcp_event_store_core::testkit::{Container, ServerSpec};
///
/// const SPEC: ServerSpec = ServerSpec {
///     name: "Redis",
///     env: "MCP_EVENT_STORE_REDIS_URL",
///     local: "redis://127.0.0.1:6379",
///     container: Container {
///         image: "redis",
///         tag: "7.2.5-alpine",
///         port: 6379,
///         ready_on_stderr: false,
///         ready_message: "Ready to accept connections",
///         env: &[],
///         url: |host, port| format!("redis://{host}:{port}"),
///     },
/// };
/// assert_eq!(SPEC.container.image, "redis");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ServerSpec {
    /// The server's name in messages (`"PostgreSQL"`).
    pub name: &'static str,
    /// The environment variable that names the server's URL.
    pub env: &'static str,
    /// The URL tried when the variable is unset.
    pub local: &'static str,
    /// The container started (feature `testcontainers`) when neither
    /// answers.
    pub container: Container,
}

/// A pinned container image that serves the tests.
#[derive(Clone, Copy, Debug)]
pub struct Container {
    /// The image (`"postgres"`).
    pub image: &'static str,
    /// Its pinned tag.
    pub tag: &'static str,
    /// The port the server listens on inside the container.
    pub port: u16,
    /// Whether [`ready_message`](Self::ready_message) is written to stderr
    /// (else stdout).
    pub ready_on_stderr: bool,
    /// The log line that says the server accepts connections.
    pub ready_message: &'static str,
    /// Environment variables for the container.
    pub env: &'static [(&'static str, &'static str)],
    /// The server's URL from the host and port the container is reachable
    /// on.
    pub url: fn(&str, u16) -> String,
}

/// The URL of the server `spec` describes, found once per process and
/// spec: `spec.env` if set (its server must answer within 5 s), else
/// `spec.local` if it answers within 1 s, else, with the `testcontainers`
/// feature, a container started for the rest of the process (polled with
/// `probe` until it answers).
///
/// # Panics
///
/// When none of these gives a server that answers, with a message naming
/// each way to provide one: a server-backed test fails, never skips.
pub async fn find_server(spec: &ServerSpec, probe: Probe) -> String {
    /// The server found per environment variable, once per process.
    type Found = HashMap<&'static str, Arc<OnceCell<String>>>;
    static FOUND: Mutex<Option<Found>> = Mutex::new(None);
    let cell = FOUND
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(spec.env)
        .or_default()
        .clone();
    cell.get_or_init(|| async {
        match search(spec, probe).await {
            Ok(url) => url,
            Err(why) => panic!("{}", no_server(spec, &why)),
        }
    })
    .await
    .clone()
}

async fn answers(probe: Probe, url: &str, within: Duration) -> Result<(), String> {
    match tokio::time::timeout(within, probe(url.to_owned())).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {within:?}")),
    }
}

async fn search(spec: &ServerSpec, probe: Probe) -> Result<String, String> {
    if let Ok(url) = std::env::var(spec.env)
        && !url.is_empty()
    {
        return answers(probe, &url, Duration::from_secs(5))
            .await
            .map(|()| url)
            .map_err(|e| format!("{} is set but its server does not answer: {e}", spec.env));
    }
    let local = answers(probe, spec.local, Duration::from_secs(1)).await;
    if local.is_ok() {
        return Ok(spec.local.to_owned());
    }
    #[cfg(feature = "testcontainers")]
    {
        let _ = local;
        container::start(spec.container, probe).await.map_err(|e| {
            format!(
                "{} is unset, {} does not answer, and the container failed: {e}",
                spec.env, spec.local
            )
        })
    }
    #[cfg(not(feature = "testcontainers"))]
    Err(format!(
        "{} is unset and {} does not answer: {}",
        spec.env,
        spec.local,
        local.unwrap_err()
    ))
}

fn no_server(spec: &ServerSpec, why: &str) -> String {
    format!(
        "no {name} server for the tests ({why}). Provide one of:\n\
         1. {env}=<url> in the environment;\n\
         2. a server at {local}, answering within 1 s;\n\
         3. Docker and the backend crate's `testcontainers` feature, which starts {image}:{tag}.",
        name = spec.name,
        env = spec.env,
        local = spec.local,
        image = spec.container.image,
        tag = spec.container.tag,
    )
}

#[cfg(feature = "testcontainers")]
mod container {
    use std::time::Duration;

    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};

    use super::{Container, Probe};

    /// Starts the container on a thread of its own whose runtime lives as
    /// long as the process: each test has its own runtime, and the
    /// container must outlive all of them.
    pub(super) async fn start(spec: Container, probe: Probe) -> Result<String, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let ready = if spec.ready_on_stderr {
                    WaitFor::message_on_stderr(spec.ready_message)
                } else {
                    WaitFor::message_on_stdout(spec.ready_message)
                };
                let mut image = GenericImage::new(spec.image, spec.tag)
                    .with_exposed_port(spec.port.tcp())
                    .with_wait_for(ready)
                    .with_env_var("MCP_EVENT_STORE_TEST", "1");
                for (name, value) in spec.env {
                    image = image.with_env_var(*name, *value);
                }
                let started = async {
                    let container = image.start().await.map_err(|e| e.to_string())?;
                    let host = container.get_host().await.map_err(|e| e.to_string())?;
                    let port = container
                        .get_host_port_ipv4(spec.port.tcp())
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>((container, (spec.url)(&host.to_string(), port)))
                };
                let (container, url) = match started.await {
                    Ok(started) => started,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                // A server may log "ready" before it accepts connections
                // (PostgreSQL's init server does): poll until it answers.
                for _ in 0..60 {
                    if probe(url.clone()).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                let _ = tx.send(Ok(url));
                std::future::pending::<()>().await;
                drop(container);
            });
        });
        rx.await.map_err(|e| e.to_string())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "testcontainers"))]
    fn refuses(_url: String) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Err("refused".to_owned()) })
    }

    fn accepts(_url: String) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }

    const SPEC: ServerSpec = ServerSpec {
        name: "Example",
        env: "MCP_EVENT_STORE_TESTKIT_EXAMPLE_URL",
        local: "example://127.0.0.1:1",
        container: Container {
            image: "example",
            tag: "1",
            port: 1,
            ready_on_stderr: false,
            ready_message: "ready",
            env: &[],
            url: |host, port| format!("example://{host}:{port}"),
        },
    };

    #[tokio::test]
    async fn the_local_server_is_found_when_it_answers() {
        assert_eq!(search(&SPEC, accepts).await.unwrap(), SPEC.local);
    }

    #[cfg(not(feature = "testcontainers"))]
    #[tokio::test]
    async fn no_server_fails_naming_every_way_to_provide_one() {
        let why = search(&SPEC, refuses).await.unwrap_err();
        let message = no_server(&SPEC, &why);
        for needle in [
            SPEC.env,
            SPEC.local,
            "testcontainers",
            "example:1",
            "refused",
        ] {
            assert!(
                message.contains(needle),
                "{needle:?} missing from {message}"
            );
        }
    }

    #[cfg(not(feature = "testcontainers"))]
    #[tokio::test]
    #[should_panic(expected = "no Example server for the tests")]
    async fn find_server_panics_rather_than_skips() {
        const NONE: ServerSpec = ServerSpec {
            env: "MCP_EVENT_STORE_TESTKIT_NONE_URL",
            ..SPEC
        };
        find_server(&NONE, refuses).await;
    }
}
