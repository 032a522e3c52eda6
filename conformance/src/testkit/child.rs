//! Child processes a test starts (a server, a crashing appender), owned by
//! a guard that kills them by pid when dropped.

use std::io;
use std::process::{Child, ChildStdout, Command, ExitStatus};

/// A child process, killed (SIGKILL, by pid) and reaped when the guard is
/// dropped, also when the test panics, so no test leaves a process behind.
///
/// ```
/// use std::process::{Command, Stdio};
/// use mcp_event_store_conformance::testkit::ChildGuard;
///
/// let mut sleeper = ChildGuard::spawn(Command::new("sleep").arg("60").stdout(Stdio::null()))?;
/// assert!(sleeper.is_running());
/// sleeper.kill();
/// assert!(!sleeper.is_running());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
    pid: u32,
}

impl ChildGuard {
    /// Starts `command`.
    pub fn spawn(command: &mut Command) -> io::Result<Self> {
        let child = command.spawn()?;
        let pid = child.id();
        Ok(Self {
            child: Some(child),
            pid,
        })
    }

    /// The child's pid (still its pid after [`kill`](Self::kill)).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its stdout, if it was piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    /// Whether it has neither exited nor been killed.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Kills it with SIGKILL and reaps it; does nothing if it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for it to exit by itself.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        match self.child.take() {
            Some(mut child) => child.wait(),
            None => Err(io::Error::other("the child was already killed or reaped")),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The name the test harness gives test `name` of the module whose
/// `module_path!()` is `module`: the path without the crate, as
/// [`test_child`] wants it, so a test need not know where its binary mounts
/// its module.
///
/// ```
/// use mcp_event_store_conformance::testkit::test_path;
///
/// assert_eq!(test_path("sqlite::tasks", "crash_child"), "tasks::crash_child");
/// assert_eq!(test_path("sqlite", "crash_child"), "crash_child");
/// ```
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// A command that runs one `#[ignore]`d test of the current test binary,
/// `name` (its full path, `module::test`: see [`test_path`]), alone and
/// with its output shown:
/// how a test starts a child process of its own code (an appender to kill
/// with SIGKILL, a second writer). Set the environment the child needs on
/// the returned command.
pub fn test_child(name: &str) -> io::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    Ok(command)
}

/// A test of this binary run as a child ([`test_child`]) whose stdout is
/// read whole line by whole line: how a SIGKILL case hears what its child
/// acknowledged. A line the kill cut short was never printed whole, so it
/// is never delivered.
#[derive(Debug)]
pub struct ChildLines {
    child: ChildGuard,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl ChildLines {
    /// Starts test `name` (its full path: see [`test_path`]) with these
    /// environment variables, its stdout read on a thread of its own and
    /// its stderr shown.
    pub fn spawn(name: &str, env: &[(&str, &str)]) -> io::Result<Self> {
        use std::io::BufRead;

        let mut command = test_child(name)?;
        command
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit());
        let mut child = ChildGuard::spawn(&mut command)?;
        let stdout = child
            .take_stdout()
            .ok_or_else(|| io::Error::other("the child's stdout was not piped"))?;
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let mut reader = io::BufReader::new(stdout);
            let mut line = String::new();
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                if line.ends_with('\n') && sender.send(std::mem::take(&mut line)).is_err() {
                    return;
                }
                line.clear();
            }
        });
        Ok(Self { child, lines })
    }

    /// The next whole line: `Ok(None)` once the child has closed its
    /// stdout (it ended), `Err` if none came before `deadline`.
    pub async fn next_line(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<String>, tokio::time::error::Elapsed> {
        tokio::time::timeout_at(deadline, self.lines.recv()).await
    }

    /// Kills the child with SIGKILL and returns the whole lines it printed
    /// before it died that were not read yet: what it acknowledged too.
    pub async fn kill(mut self) -> Vec<String> {
        self.child.kill();
        let mut rest = Vec::new();
        while let Some(line) = self.lines.recv().await {
            rest.push(line);
        }
        rest
    }
}
