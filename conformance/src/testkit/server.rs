//! Finding the test server: the environment, then the local default, then
//! (with the `testcontainers` feature) a container; or only one of them,
//! as [`SERVER_SOURCE_ENV`] says.
//!
//! A container serves every test of the binary that started it, and is
//! removed when that binary exits, however it ends: a watchdog process
//! started with it (`sh` and the `docker` command) waits for the end of a
//! pipe the test process holds open, then removes every container carrying
//! the process's [`CONTAINER_LABEL`]. Rust runs no destructor for statics
//! at exit, so nothing inside the process could do it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_core::future::BoxFuture;
use tokio::sync::OnceCell;

/// Checks that a server answers at a URL; `Err` says why not.
pub type Probe = fn(String) -> BoxFuture<'static, Result<(), String>>;

/// The environment variable that chooses where [`find_server`] looks:
/// unset, empty or `auto` for the environment, then the local default,
/// then a container; `env`, `local` or `container` for that one alone
/// ([`ServerSource`]). Any other value is an error, never ignored.
pub const SERVER_SOURCE_ENV: &str = "MCP_EVENT_STORE_TEST_SERVER";

/// The label on every container the test kit starts; its value is the
/// test process's own (pid and random digits). A leftover is found with
/// `docker ps -a --filter label=mcp-event-store.test-run`.
pub const CONTAINER_LABEL: &str = "mcp-event-store.test-run";

/// Where a backend's tests look for their server.
///
/// ```
/// use mcp_event_store_conformance::testkit::{Container, ServerSpec};
///
/// const SPEC: ServerSpec = ServerSpec {
///     name: "Redis",
///     env: "MCP_EVENT_STORE_REDIS_URL",
///     local: "redis://127.0.0.1:6379",
///     container: Container {
///         image: "redis",
///         tag: "7.2.5-alpine",
///         image_env: "MCP_EVENT_STORE_REDIS_IMAGE",
///         port: 6379,
///         ready_on_stderr: false,
///         ready_message: "Ready to accept connections",
///         env: &[],
///         cmd: &[],
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
    /// The environment variable that names another image to start instead,
    /// as `name:tag` (`"MCP_EVENT_STORE_POSTGRES_IMAGE"`): one built or
    /// mirrored locally where no registry is reachable, tagged for what it
    /// is rather than as the pinned image. It must log
    /// [`ready_message`](Self::ready_message) as the pinned image does.
    pub image_env: &'static str,
    /// The port the server listens on inside the container.
    pub port: u16,
    /// Whether [`ready_message`](Self::ready_message) is written to stderr
    /// (else stdout).
    pub ready_on_stderr: bool,
    /// The log line that says the server accepts connections.
    pub ready_message: &'static str,
    /// Environment variables for the container.
    pub env: &'static [(&'static str, &'static str)],
    /// The command the container runs (the image's own when empty): the
    /// arguments after the image's entry point (`["-js"]`).
    pub cmd: &'static [&'static str],
    /// The server's URL from the host and port the container is reachable
    /// on.
    pub url: fn(&str, u16) -> String,
}

impl Container {
    /// The image to start: the one [`image_env`](Self::image_env) names if
    /// it is set and not empty, else the pinned [`image`](Self::image) and
    /// [`tag`](Self::tag). `Err` when the variable's value is no `name:tag`.
    pub fn image_ref(&self) -> Result<ImageRef, String> {
        self.image_ref_from(&var)
    }

    fn image_ref_from(&self, var: Lookup<'_>) -> Result<ImageRef, String> {
        match var(self.image_env) {
            Some(reference) => {
                ImageRef::parse(&reference).map_err(|e| format!("{}: {e}", self.image_env))
            }
            None => Ok(ImageRef {
                name: self.image.to_owned(),
                tag: self.tag.to_owned(),
            }),
        }
    }
}

/// An image reference, `name:tag`.
///
/// ```
/// use mcp_event_store_conformance::testkit::ImageRef;
///
/// let image = ImageRef::parse("localhost:5000/tests/postgres:15-debian")?;
/// assert_eq!((image.name.as_str(), image.tag.as_str()), ("localhost:5000/tests/postgres", "15-debian"));
/// assert!(ImageRef::parse("postgres").is_err(), "a tag is required");
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// The repository, with its registry if any (`"postgres"`).
    pub name: String,
    /// The tag (`"15.10-alpine"`).
    pub tag: String,
}

impl ImageRef {
    /// Parses `name:tag`. The tag is required (an override names the image
    /// it means, never `latest` by default); digests are refused, since
    /// the container is started by name and tag.
    pub fn parse(reference: &str) -> Result<Self, String> {
        let invalid =
            |why: &str| format!("{reference:?} is not an image reference name:tag ({why})");
        if reference.is_empty() {
            return Err(invalid("it is empty"));
        }
        if reference
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid("it contains white space"));
        }
        if reference.contains('@') {
            return Err(invalid("digests are not supported: tag the image"));
        }
        // A colon before the last slash belongs to a registry's port.
        let last_part = reference.rfind('/').map_or(0, |slash| slash + 1);
        let Some(colon) = reference[last_part..].rfind(':') else {
            return Err(invalid("it has no tag"));
        };
        let (name, tag) = reference.split_at(last_part + colon);
        let tag = &tag[1..];
        if name.is_empty() || name.ends_with('/') {
            return Err(invalid("the name is empty"));
        }
        if tag.is_empty() {
            return Err(invalid("the tag is empty"));
        }
        Ok(Self {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// Where [`find_server`] looks, as [`SERVER_SOURCE_ENV`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerSource {
    /// Unset, empty or `auto`: the environment, then the local default,
    /// then a container.
    Auto,
    /// `env`: only the URL in the spec's variable; fails when it is unset.
    Env,
    /// `local`: only the local default; the URL variable is not read.
    Local,
    /// `container`: only a container, even when a local server or the URL
    /// variable would do (needs the `testcontainers` feature and Docker).
    Container,
}

impl ServerSource {
    /// Reads [`SERVER_SOURCE_ENV`]; `Err` names the variable, its value and
    /// the values it takes.
    pub fn from_env() -> Result<Self, String> {
        Self::parse(&var(SERVER_SOURCE_ENV).unwrap_or_default())
    }

    /// Parses a value of [`SERVER_SOURCE_ENV`]: empty, `auto`, `env`,
    /// `local` or `container`, exactly.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "" | "auto" => Ok(Self::Auto),
            "env" => Ok(Self::Env),
            "local" => Ok(Self::Local),
            "container" => Ok(Self::Container),
            other => Err(format!(
                "{SERVER_SOURCE_ENV}={other:?} is not one of auto, env, local, container \
                 (unset means auto)"
            )),
        }
    }

    /// The value that selects it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Env => "env",
            Self::Local => "local",
            Self::Container => "container",
        }
    }
}

/// The URL of the server `spec` describes, found once per process and
/// spec. By default (see [`ServerSource`]): `spec.env` if set (its server
/// must answer within 5 s), else `spec.local` if it answers within 1 s,
/// else, with the `testcontainers` feature, a container of
/// [`Container::image_ref`] started for the rest of the process: reached on
/// loopback when the Docker engine is local (else on the host testcontainers
/// names), polled with `probe` until it answers, and removed when the
/// process exits.
///
/// # Panics
///
/// When [`SERVER_SOURCE_ENV`] has a value it does not take; when none of
/// these gives a server that answers, with a message naming each way to
/// provide one: a server-backed test fails, never skips. Once the search
/// has failed, every later call in the process fails with its message.
pub async fn find_server(spec: &ServerSpec, probe: Probe) -> String {
    /// The outcome per environment variable, once per process.
    type Found = HashMap<&'static str, Arc<OnceCell<Result<String, String>>>>;
    static FOUND: Mutex<Option<Found>> = Mutex::new(None);
    let source = ServerSource::from_env().unwrap_or_else(|e| panic!("{e}"));
    let cell = FOUND
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get_or_insert_with(HashMap::new)
        .entry(spec.env)
        .or_default()
        .clone();
    let found = cell
        .get_or_init(|| async {
            search(spec, probe, source, &var)
                .await
                .map_err(|why| no_server(spec, source, &why, &var))
        })
        .await;
    match found {
        Ok(url) => url.clone(),
        Err(message) => panic!("{message}"),
    }
}

/// Reads an environment variable: the process's ([`var`]), or a test's
/// own, since tests cannot set the process's safely.
type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A variable of the process's environment; unset, empty and not Unicode
/// are alike.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

async fn answers(probe: Probe, url: &str, within: Duration) -> Result<(), String> {
    match tokio::time::timeout(within, probe(url.to_owned())).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {within:?}")),
    }
}

async fn search(
    spec: &ServerSpec,
    probe: Probe,
    source: ServerSource,
    var: Lookup<'_>,
) -> Result<String, String> {
    let mut tried = Vec::new();
    if matches!(source, ServerSource::Auto | ServerSource::Env) {
        match var(spec.env) {
            Some(url) => {
                return answers(probe, &url, Duration::from_secs(5))
                    .await
                    .map(|()| url)
                    .map_err(|e| {
                        format!("{} is set but its server does not answer: {e}", spec.env)
                    });
            }
            None if source == ServerSource::Env => return Err(format!("{} is unset", spec.env)),
            None => tried.push(format!("{} is unset", spec.env)),
        }
    }
    if matches!(source, ServerSource::Auto | ServerSource::Local) {
        match answers(probe, spec.local, Duration::from_secs(1)).await {
            Ok(()) => return Ok(spec.local.to_owned()),
            Err(e) if source == ServerSource::Local => {
                return Err(format!("{} does not answer: {e}", spec.local));
            }
            Err(e) => tried.push(format!("{} does not answer: {e}", spec.local)),
        }
    }
    let image = match spec.container.image_ref_from(var) {
        Ok(image) => image,
        Err(e) => {
            tried.push(e);
            return Err(tried.join("; "));
        }
    };
    #[cfg(feature = "testcontainers")]
    match container::start(spec, &image, probe).await {
        Ok(url) => return Ok(url),
        Err(e) => tried.push(e),
    }
    #[cfg(not(feature = "testcontainers"))]
    tried.push(format!(
        "no {image} container: the `testcontainers` feature is off"
    ));
    Err(tried.join("; "))
}

fn no_server(spec: &ServerSpec, source: ServerSource, why: &str, var: Lookup<'_>) -> String {
    let image = spec.container.image_ref_from(var).map_or_else(
        |_| format!("{}:{}", spec.container.image, spec.container.tag),
        |image| image.to_string(),
    );
    let searched = match source {
        ServerSource::Auto => "all three were tried in this order".to_owned(),
        only => format!("{SERVER_SOURCE_ENV}={} chose that one alone", only.as_str()),
    };
    format!(
        "no {name} server for the tests ({why}). Provide one of:\n\
         1. {env}=<url> in the environment;\n\
         2. a server at {local}, answering within 1 s;\n\
         3. Docker and the backend crate's `testcontainers` feature, which starts {image} \
         ({image_env}=<name:tag> starts another image, such as one .ci/build-test-images.sh builds).\n\
         {searched}; {SERVER_SOURCE_ENV}=env, local or container uses only that way, \
         unset or auto tries them in this order.",
        name = spec.name,
        env = spec.env,
        local = spec.local,
        image_env = spec.container.image_env,
    )
}

#[cfg(feature = "testcontainers")]
mod container {
    use std::io::{BufRead, BufReader};
    #[cfg(unix)]
    use std::os::unix::process::CommandExt;
    use std::process::{ChildStdin, Command, Stdio};
    use std::sync::OnceLock;
    use std::time::Duration;

    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, GenericImage, ImageExt};
    use tokio::sync::{mpsc, oneshot};

    use super::{CONTAINER_LABEL, ImageRef, Probe, ServerSpec, answers};

    /// How long a started container may take to answer its probe.
    const ANSWER_WITHIN: Duration = Duration::from_secs(30);
    /// How long one probe may take.
    const PROBE_WITHIN: Duration = Duration::from_secs(2);
    /// How long the image may take to log its ready message.
    const READY_WITHIN: Duration = Duration::from_secs(60);

    /// Waits for the end of its stdin, which the test process holds open
    /// until it exits (however it ends), then removes the containers that
    /// carry the label `$1`. It ignores the terminal's signals (a Ctrl-C
    /// must not stop it first) and runs in a process group of its own.
    const WATCHDOG: &str = r#"trap '' HUP INT QUIT
command -v docker >/dev/null 2>&1 || { echo "no docker command on PATH to remove containers with"; exit 1; }
echo ready
exec >/dev/null 2>&1
cat
ids=$(docker ps -aq --filter "label=$1")
[ -z "$ids" ] || docker rm -f -v $ids
"#;

    /// A container to start, and where to send its URL.
    struct Request {
        spec: ServerSpec,
        image: ImageRef,
        probe: Probe,
        reply: oneshot::Sender<Result<String, String>>,
    }

    /// The end of the watchdog's pipe, open until the process exits.
    static WATCHDOG_PIPE: OnceLock<ChildStdin> = OnceLock::new();

    /// This process's value of [`CONTAINER_LABEL`] (arming the watchdog
    /// if it is not yet).
    #[cfg(test)]
    pub(super) fn run_label() -> Option<String> {
        starter().ok().map(|(_, run)| run.clone())
    }

    /// Starts a container of `image` for `spec` and returns its URL once
    /// `probe` answers there; `Err` names the image.
    pub(super) async fn start(
        spec: &ServerSpec,
        image: &ImageRef,
        probe: Probe,
    ) -> Result<String, String> {
        let (sender, _) = starter().map_err(|e| format!("no {image} container: {e}"))?;
        let (reply, answer) = oneshot::channel();
        sender
            .send(Request {
                spec: *spec,
                image: image.clone(),
                probe,
                reply,
            })
            .map_err(|_| format!("no {image} container: the starter thread is gone"))?;
        answer
            .await
            .map_err(|_| format!("no {image} container: the starter thread is gone"))?
    }

    /// The thread that starts and holds every container of the process,
    /// with the watchdog armed first. One runtime, driven for the rest of
    /// the process, serves them all: each test has its own runtime, which
    /// ends with the test, and testcontainers' Docker client outlives none
    /// of them.
    fn starter() -> Result<&'static (mpsc::UnboundedSender<Request>, String), String> {
        static STARTER: OnceLock<Result<(mpsc::UnboundedSender<Request>, String), String>> =
            OnceLock::new();
        STARTER
            .get_or_init(|| {
                let run = arm_watchdog()?;
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("a runtime for the containers: {e}"))?;
                let (sender, mut requests) = mpsc::unbounded_channel::<Request>();
                let label = run.clone();
                std::thread::Builder::new()
                    .name("testkit-containers".to_owned())
                    .spawn(move || {
                        runtime.block_on(async move {
                            // Never dropped: the watchdog removes them.
                            let mut held = Vec::new();
                            while let Some(request) = requests.recv().await {
                                let started = run_container(&request, &label).await;
                                let url = started.map(|(container, url)| {
                                    held.push(container);
                                    url
                                });
                                let _ = request.reply.send(url);
                            }
                        })
                    })
                    .map_err(|e| format!("a thread for the containers: {e}"))?;
                Ok((sender, run))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Starts the watchdog and waits until it is ready; returns the label
    /// value it removes containers by.
    fn arm_watchdog() -> Result<String, String> {
        let run = format!(
            "{}-{}",
            std::process::id(),
            &super::super::random_suffix()[..8]
        );
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHDOG, "sh", &format!("{CONTAINER_LABEL}={run}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        #[cfg(unix)]
        command.process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting the container watchdog (sh): {e}"))?;
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        let _ = BufReader::new(stdout).read_line(&mut line);
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the container watchdog did not start: {}",
                if line.trim().is_empty() {
                    "it exited"
                } else {
                    line.trim()
                }
            ));
        }
        let pipe = child.stdin.take().expect("piped");
        WATCHDOG_PIPE
            .set(pipe)
            .map_err(|_| "the container watchdog was armed twice".to_owned())?;
        Ok(run)
    }

    async fn run_container(
        request: &Request,
        run: &str,
    ) -> Result<(ContainerAsync<GenericImage>, String), String> {
        let Request {
            spec, image, probe, ..
        } = request;
        let container = spec.container;
        let ready = if container.ready_on_stderr {
            WaitFor::message_on_stderr(container.ready_message)
        } else {
            WaitFor::message_on_stdout(container.ready_message)
        };
        let slug = spec
            .name
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|word| !word.is_empty())
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
            .join("-");
        let name = format!("mcp-event-store-test-{slug}-{run}");
        let mut request = GenericImage::new(image.name.as_str(), image.tag.as_str())
            .with_exposed_port(container.port.tcp())
            .with_wait_for(ready)
            .with_env_var("MCP_EVENT_STORE_TEST", "1")
            .with_label(CONTAINER_LABEL, run)
            .with_container_name(&name)
            .with_startup_timeout(READY_WITHIN);
        for (variable, value) in container.env {
            request = request.with_env_var(*variable, *value);
        }
        if !container.cmd.is_empty() {
            request = request.with_cmd(container.cmd.iter().copied());
        }
        let started = request
            .start()
            .await
            .map_err(|e| format!("the {image} container did not start: {e}"))?;
        let port = started
            .get_host_port_ipv4(container.port.tcp())
            .await
            .map_err(|e| format!("the {image} container ({name}) publishes no port: {e}"))?;
        let urls: Vec<String> = hosts(&started)
            .await
            .iter()
            .map(|host| (container.url)(host, port))
            .collect();

        // A server may log "ready" before it accepts connections
        // (PostgreSQL's init server does): poll until one host answers.
        let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
        let mut last = vec![String::new(); urls.len()];
        loop {
            for (url, last) in urls.iter().zip(&mut last) {
                match answers(*probe, url, PROBE_WITHIN).await {
                    Ok(()) => return Ok((started, url.clone())),
                    Err(e) => *last = e,
                }
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let tried: Vec<String> = urls
            .iter()
            .zip(&last)
            .map(|(url, e)| format!("{url}: {e}"))
            .collect();
        Err(format!(
            "the {image} container ({name}) started but did not answer within {ANSWER_WITHIN:?} ({})",
            tried.join("; ")
        ))
    }

    /// Where the container's published port is reached, in the order to
    /// try: loopback first when the engine is local (testcontainers 0.28
    /// names the bridge's gateway whenever `/.dockerenv` exists, which is
    /// unreachable when the engine runs beside the tests rather than around
    /// them), then the host testcontainers names.
    async fn hosts(container: &ContainerAsync<GenericImage>) -> Vec<String> {
        let mut hosts = Vec::new();
        if engine_is_local() {
            hosts.push("127.0.0.1".to_owned());
        }
        match container.get_host().await.map(|host| host.to_string()) {
            Ok(host) if host == "localhost" => {
                if hosts.is_empty() {
                    hosts.push("127.0.0.1".to_owned());
                }
            }
            Ok(host) if !hosts.contains(&host) => hosts.push(host),
            Ok(_) => {}
            Err(_) if hosts.is_empty() => hosts.push("127.0.0.1".to_owned()),
            Err(_) => {}
        }
        hosts
    }

    /// Whether the engine is reached through a Unix socket (`DOCKER_HOST`
    /// unset or `unix://`), so it runs on this machine.
    fn engine_is_local() -> bool {
        super::var("DOCKER_HOST").is_none_or(|host| host.starts_with("unix://"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            image_env: "MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE",
            port: 1,
            ready_on_stderr: false,
            ready_message: "ready",
            env: &[],
            cmd: &[],
            url: |host, port| format!("example://{host}:{port}"),
        },
    };

    /// An environment of the given variables only.
    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, v)| *n == name && !v.is_empty())
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_switch_takes_its_documented_values_only() {
        for (value, source) in [
            ("", ServerSource::Auto),
            ("auto", ServerSource::Auto),
            ("env", ServerSource::Env),
            ("local", ServerSource::Local),
            ("container", ServerSource::Container),
        ] {
            assert_eq!(ServerSource::parse(value), Ok(source));
            if !value.is_empty() {
                assert_eq!(source.as_str(), value);
            }
        }
        for value in ["docker", "Container", " local", "env,local", "none"] {
            let e = ServerSource::parse(value).unwrap_err();
            for needle in [
                SERVER_SOURCE_ENV,
                format!("{value:?}").as_str(),
                "auto, env, local, container",
            ] {
                assert!(e.contains(needle), "{needle:?} missing from {e}");
            }
        }
    }

    #[test]
    fn image_references_need_a_name_and_a_tag() {
        for (reference, name, tag) in [
            ("postgres:15.10-alpine", "postgres", "15.10-alpine"),
            (
                "mcp-event-store-test/redis:7.0-debian",
                "mcp-event-store-test/redis",
                "7.0-debian",
            ),
            (
                "localhost:5000/tests/pg:15",
                "localhost:5000/tests/pg",
                "15",
            ),
        ] {
            let image = ImageRef::parse(reference).unwrap();
            assert_eq!((image.name.as_str(), image.tag.as_str()), (name, tag));
            assert_eq!(image.to_string(), reference);
        }
        for (reference, why) in [
            ("", "empty"),
            ("postgres", "no tag"),
            ("localhost:5000/postgres", "no tag"),
            ("postgres:", "tag is empty"),
            (":15", "name is empty"),
            ("postgres:15 ", "white space"),
            ("postgres@sha256:00ff", "digests"),
        ] {
            let e = ImageRef::parse(reference).unwrap_err();
            assert!(e.contains(why), "{reference:?}: {why:?} missing from {e}");
        }
    }

    #[test]
    fn the_image_variable_replaces_the_pinned_image() {
        let pinned = SPEC.container.image_ref_from(&env(&[])).unwrap();
        assert_eq!(pinned.to_string(), "example:1");
        let empty = [("MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE", "")];
        assert_eq!(SPEC.container.image_ref_from(&env(&empty)).unwrap(), pinned);
        let local = [(
            "MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE",
            "tests/example:1-debian",
        )];
        let image = SPEC.container.image_ref_from(&env(&local)).unwrap();
        assert_eq!(image.to_string(), "tests/example:1-debian");
        let bad = [("MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE", "example")];
        let e = SPEC.container.image_ref_from(&env(&bad)).unwrap_err();
        assert!(
            e.starts_with("MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE: "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn the_local_server_is_found_when_it_answers() {
        let url = search(&SPEC, accepts, ServerSource::Auto, &env(&[])).await;
        assert_eq!(url.unwrap(), SPEC.local);
    }

    #[tokio::test]
    async fn the_url_variable_comes_first_unless_the_switch_says_local() {
        let set = [(
            "MCP_EVENT_STORE_TESTKIT_EXAMPLE_URL",
            "example://elsewhere:2",
        )];
        for source in [ServerSource::Auto, ServerSource::Env] {
            let url = search(&SPEC, accepts, source, &env(&set)).await.unwrap();
            assert_eq!(url, "example://elsewhere:2", "{source:?}");
        }
        let url = search(&SPEC, accepts, ServerSource::Local, &env(&set)).await;
        assert_eq!(url.unwrap(), SPEC.local);
        let e = search(&SPEC, refuses, ServerSource::Env, &env(&set))
            .await
            .unwrap_err();
        assert!(
            e.contains("is set but its server does not answer: refused"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_chosen_way_is_the_only_one_tried() {
        let e = search(&SPEC, accepts, ServerSource::Env, &env(&[]))
            .await
            .unwrap_err();
        assert_eq!(e, "MCP_EVENT_STORE_TESTKIT_EXAMPLE_URL is unset");
        let e = search(&SPEC, refuses, ServerSource::Local, &env(&[]))
            .await
            .unwrap_err();
        assert_eq!(e, "example://127.0.0.1:1 does not answer: refused");
        // The container way reads neither the variable nor the local server
        // (an image no engine has: it fails without reaching one).
        let bad = [
            (
                "MCP_EVENT_STORE_TESTKIT_EXAMPLE_URL",
                "example://elsewhere:2",
            ),
            ("MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE", "example"),
        ];
        let e = search(&SPEC, accepts, ServerSource::Container, &env(&bad))
            .await
            .unwrap_err();
        assert!(
            e.starts_with("MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE: "),
            "{e}"
        );
    }

    #[cfg(not(feature = "testcontainers"))]
    #[tokio::test]
    async fn without_the_feature_no_container_is_started() {
        let e = search(&SPEC, refuses, ServerSource::Auto, &env(&[]))
            .await
            .unwrap_err();
        for needle in [
            "MCP_EVENT_STORE_TESTKIT_EXAMPLE_URL is unset",
            "example://127.0.0.1:1 does not answer: refused",
            "no example:1 container: the `testcontainers` feature is off",
        ] {
            assert!(e.contains(needle), "{needle:?} missing from {e}");
        }
        let e = search(&SPEC, refuses, ServerSource::Container, &env(&[]))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            "no example:1 container: the `testcontainers` feature is off"
        );
    }

    #[test]
    fn no_server_names_every_way_to_provide_one() {
        let local = [(
            "MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE",
            "tests/example:1-debian",
        )];
        for (source, chosen) in [
            (ServerSource::Auto, "all three were tried in this order"),
            (
                ServerSource::Container,
                "MCP_EVENT_STORE_TEST_SERVER=container chose that one alone",
            ),
        ] {
            let message = no_server(&SPEC, source, "refused", &env(&local));
            for needle in [
                "no Example server for the tests (refused)",
                SPEC.env,
                SPEC.local,
                "testcontainers",
                "tests/example:1-debian",
                "MCP_EVENT_STORE_TESTKIT_EXAMPLE_IMAGE=<name:tag>",
                ".ci/build-test-images.sh",
                SERVER_SOURCE_ENV,
                chosen,
            ] {
                assert!(
                    message.contains(needle),
                    "{needle:?} missing from {message}"
                );
            }
        }
        let message = no_server(&SPEC, ServerSource::Auto, "refused", &env(&[]));
        assert!(message.contains("starts example:1 "), "{message}");
    }

    /// Tells [`switch_child`] to run.
    const SWITCH_CHILD_ENV: &str = "MCP_EVENT_STORE_TESTKIT_SWITCH_CHILD";

    #[test]
    fn find_server_refuses_an_unknown_switch() {
        let (mut output, writer) = std::io::pipe().unwrap();
        let mut command =
            crate::testkit::test_child("testkit::server::tests::switch_child").unwrap();
        command
            .env(SWITCH_CHILD_ENV, "1")
            .env(SERVER_SOURCE_ENV, "contianer")
            .stdin(std::process::Stdio::null())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer);
        let mut child = crate::testkit::ChildGuard::spawn(&mut command).unwrap();
        // The command holds the pipe's other end until it goes.
        drop(command);
        let mut printed = String::new();
        std::io::Read::read_to_string(&mut output, &mut printed).unwrap();
        assert!(
            !child.wait().unwrap().success(),
            "the child passed:\n{printed}"
        );
        assert!(
            printed.contains(
                r#"MCP_EVENT_STORE_TEST_SERVER="contianer" is not one of auto, env, local, container"#
            ),
            "{printed}"
        );
    }

    /// The child of [`find_server_refuses_an_unknown_switch`]: a search
    /// that would succeed but for the switch.
    #[tokio::test]
    #[ignore = "the child process of find_server_refuses_an_unknown_switch"]
    async fn switch_child() {
        if std::env::var_os(SWITCH_CHILD_ENV).is_none() {
            return;
        }
        find_server(&SPEC, accepts).await;
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

    #[cfg(feature = "testcontainers")]
    mod docker {
        //! The container path itself, which needs Docker and a Redis image
        //! (`MCP_EVENT_STORE_REDIS_IMAGE`, else the pinned official one):
        //! ignored by a plain `cargo test`, run by CI's container step
        //! (`.ci/container-tests.sh`).

        use std::io::{BufRead, BufReader, Read, Write};
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};

        use super::super::*;
        use crate::testkit::{ChildGuard, test_child};

        /// A Redis like the Redis backend's, with a probe of its own
        /// (core has no Redis client).
        const REDIS: ServerSpec = ServerSpec {
            name: "Redis (test kit)",
            env: "MCP_EVENT_STORE_TESTKIT_REDIS_URL",
            local: "redis://127.0.0.1:1",
            container: Container {
                image: "redis",
                tag: "7.2.5-alpine",
                image_env: "MCP_EVENT_STORE_REDIS_IMAGE",
                port: 6379,
                ready_on_stderr: false,
                ready_message: "Ready to accept connections",
                env: &[],
                cmd: &[],
                url: |host, port| format!("redis://{host}:{port}"),
            },
        };

        /// `PING` answered by `+PONG`.
        fn ping(url: String) -> BoxFuture<'static, Result<(), String>> {
            Box::pin(async move {
                let address = url.trim_start_matches("redis://").to_owned();
                tokio::task::spawn_blocking(move || {
                    let address = std::net::ToSocketAddrs::to_socket_addrs(&address)
                        .map_err(|e| e.to_string())?
                        .next()
                        .ok_or("no address")?;
                    let mut stream =
                        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1))
                            .map_err(|e| e.to_string())?;
                    stream
                        .set_read_timeout(Some(Duration::from_secs(1)))
                        .map_err(|e| e.to_string())?;
                    stream.write_all(b"PING\r\n").map_err(|e| e.to_string())?;
                    let mut reply = [0; 7];
                    stream.read_exact(&mut reply).map_err(|e| e.to_string())?;
                    match &reply {
                        b"+PONG\r\n" => Ok(()),
                        other => Err(format!(
                            "PING answered {:?}",
                            String::from_utf8_lossy(other)
                        )),
                    }
                })
                .await
                .map_err(|e| e.to_string())?
            })
        }

        /// What [`container_child`] does once its server is found: `exit`
        /// or `hang` (until killed).
        const CHILD_ENV: &str = "MCP_EVENT_STORE_TESTKIT_CONTAINER_CHILD";

        /// The containers carrying `label` (`key=value`), running or not.
        fn containers(label: &str) -> Vec<String> {
            let output = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("label={label}")])
                .output()
                .expect("the docker command");
            assert!(
                output.status.success(),
                "docker ps: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        }

        /// Runs [`container_child`] in `mode`; returns its guard and the
        /// label of its containers once it has found its server.
        fn spawn_child(mode: &str) -> (ChildGuard, String) {
            let mut command =
                test_child("testkit::server::tests::docker::container_child").unwrap();
            command
                .env(CHILD_ENV, mode)
                .env(SERVER_SOURCE_ENV, "container")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = ChildGuard::spawn(&mut command).expect("re-running the test binary");
            let mut lines = BufReader::new(child.take_stdout().unwrap()).lines();
            let label = lines
                .by_ref()
                .map_while(Result::ok)
                .find_map(|line| line.split_once("LABEL ").map(|(_, label)| label.to_owned()))
                .expect("the child found no server (its output is above)");
            // Keep reading so the child never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            (child, label)
        }

        /// The containers with `label` are gone within a minute.
        fn removed_eventually(label: &str) {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let left = containers(label);
                if left.is_empty() {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "containers left with {label}: {left:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }

        #[test]
        #[ignore = "needs Docker and a Redis image; .ci/container-tests.sh runs it"]
        fn one_container_per_test_binary_removed_when_it_exits() {
            // Killed: one container served both of its searches, and it is
            // removed although the process never ran another instruction.
            let (mut child, label) = spawn_child("hang");
            assert!(label.starts_with(&format!("{CONTAINER_LABEL}=")), "{label}");
            assert_eq!(containers(&label).len(), 1, "one container per test binary");
            child.kill();
            removed_eventually(&label);

            // Exited by itself, as a test binary does.
            let (mut child, label) = spawn_child("exit");
            assert!(child.wait().unwrap().success());
            removed_eventually(&label);
        }

        /// The child of [`one_container_per_test_binary_removed_when_it_exits`]:
        /// finds its server twice, on two runtimes, prints the label of its
        /// containers, then exits or hangs as told.
        #[tokio::test]
        #[ignore = "the child process of one_container_per_test_binary_removed_when_it_exits"]
        async fn container_child() {
            let Ok(mode) = std::env::var(CHILD_ENV) else {
                return;
            };
            let url = find_server(&REDIS, ping).await;
            let again = std::thread::spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(find_server(&REDIS, ping))
            })
            .join()
            .unwrap();
            assert_eq!(again, url);
            ping(url).await.unwrap();
            let label = container::run_label().expect("the watchdog is armed");
            let mut out = std::io::stdout().lock();
            writeln!(out, "\nLABEL {CONTAINER_LABEL}={label}").unwrap();
            out.flush().unwrap();
            drop(out);
            if mode == "hang" {
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
        }
    }
}
