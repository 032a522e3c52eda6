//! `mcp-event-store`: the operator's command line for any mcp-event-store
//! store, named by the same URL the server is configured with.
//!
//! ```text
//! mcp-event-store check   sqlite://events.db            # durability settings, exit 1 on a warning
//! mcp-event-store stats   postgres://app@db/app         # streams, events, bytes, oldest/newest
//! mcp-event-store streams redis://cache:6379 --sort size --limit 20
//! mcp-event-store replay  sqlite://events.db EVENT_ID   # the events after it, as SSE text
//! mcp-event-store tail    sqlite://events.db EVENT_ID   # ... and the new ones, until Ctrl-C
//! mcp-event-store purge   sled:///var/lib/app/events    # apply retention and task expiry now
//! mcp-event-store delete-stream sqlite://events.db STREAM_ID [--yes]
//! mcp-event-store keys    sqlite://events.db [--verify]  # values per key id of a sealed store
//! mcp-event-store keys    sqlite://events.db --rewrite   # re-seal them under the current key
//! mcp-event-store tasks   sqlite://events.db --status working --tool deploy
//! mcp-event-store task    sqlite://events.db TASK        # one task whole
//! mcp-event-store cancel  sqlite://events.db TASK --reason "maintenance" [--yes]
//! mcp-event-store requeue sqlite://events.db TASK        # a failed task runs again
//! mcp-event-store stuck   sqlite://events.db             # tasks to look at, exit 1 if any
//! mcp-event-store instances sqlite://events.db           # leases, tasks, versions
//! ```
//!
//! `--json` gives machine-readable output where it is tabular: one object
//! for `check`, `stats`, `keys` and `task`, JSON lines for `streams`,
//! `replay`, `tail`, `tasks`, `stuck` and `instances`.
//!
//! The task commands read the store's operator listing (task clauses T22
//! and T23), a page at a time; a task is named by the 32 hex digits `tasks`
//! lists (its digest: no store keeps a task's id) or by its id.
//!
//! URLs are those of `mcp_event_store::connect`: `memory://`,
//! `sqlite://path`, `postgres://…[?schema=]`, `redis://…[?prefix=]`,
//! `sled://dir`. SQLite is compiled in by default, every backend with the
//! feature `full`, one more alone with `--features mcp-event-store/<name>`
//! (the facade's feature: `postgres`, `redis`, `sled`); a URL whose backend
//! is not compiled in says which feature to enable.
//!
//! `keys` reads a store written through `mcp-event-store-sealed`'s
//! decorator: how many events, sessions and task values each key id
//! sealed, and when the events of each key age out under the store's
//! `max_age`. With `--verify` it opens every value with the key ring in
//! `MCP_EVENT_STORE_SEALED_KEYS` (or `--keys-env`). With `--rewrite` it
//! first re-seals, under that ring's current key, every value sealed under
//! another, a page at a time while servers run (each swap only over the
//! bytes it read, C22; see the sealed crate's docs, "Keys and rotation"):
//! on Redis and NATS, whose events live in append-only logs, events are
//! counted, not rewritten, and leave with retention.
//!
//! Exit status: 0 on success; 1 when `check` found a risky setting,
//! `delete-stream` or `cancel` was not confirmed, `cancel` found the task
//! ended already, `requeue` was refused, `stuck` reported a task, or `keys`
//! found a value that is not
//! sealed, not of this release's format, or (with `--verify` or
//! `--rewrite`) does not open; 2 on any error, reported as one
//! `error: …` line on stderr. Output cut short by a closed pipe
//! (`| head`) ends the command quietly.

mod format;
mod tasks;

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::io::{self, BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use futures_util::StreamExt;
use mcp_event_store::{DynStore, FollowOptions, MAX_LIST_PAGE, StreamInfo, Verdict};
use serde_json::json;

use crate::format::{
    display_id, event_json, human_bytes, rfc3339, sse_frame, stream_json, time_or_dash,
};

/// How many streams `streams --sort` keeps when no `--limit` is given: a
/// sorted listing must hold its candidates in memory, so it is always
/// bounded.
const DEFAULT_SORTED_LIMIT: usize = 100;

#[derive(Parser, Debug)]
#[command(
    name = "mcp-event-store",
    version,
    about = "Inspect and maintain an mcp-event-store store by URL",
    long_about = "Inspect and maintain an mcp-event-store store (memory://, sqlite://, \
                  postgres://, redis://, sled://) by URL.\n\nExit status: 0 on success, 1 when \
                  `check` warns or a deletion is not confirmed, 2 on error."
)]
struct Cli {
    /// Give up connecting after this many seconds (an unreachable server
    /// should fail, not hang).
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 10)]
    connect_timeout: u64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Report the storage format and the settings that decide durability and
    /// boundedness, with a remedy for each risky one. Exit 1 on any warning.
    Check {
        /// The store URL.
        url: String,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Store-wide totals: streams, events, bytes, oldest and newest event.
    Stats {
        /// The store URL.
        url: String,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List streams with their events, bytes and ages.
    Streams {
        /// The store URL.
        url: String,
        /// Largest first (`size`) or oldest first (`age`); without it, the
        /// store's own order.
        #[arg(long, value_enum)]
        sort: Option<SortBy>,
        /// Show at most N streams (with --sort: the top N, default 100).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the events stored after EVENT_ID on its stream.
    Replay {
        /// The store URL.
        url: String,
        /// The last event id the client saw.
        event_id: String,
        /// JSON lines (`id`, `data` or `data_base64`, `retry_ms`) instead of
        /// SSE text.
        #[arg(long)]
        json: bool,
    },
    /// Like replay, then print new events of that stream as they are
    /// appended, until Ctrl-C.
    Tail {
        /// The store URL.
        url: String,
        /// The last event id the client saw.
        event_id: String,
        /// JSON lines instead of SSE text.
        #[arg(long)]
        json: bool,
    },
    /// Apply the retention limits and task expiry now and report what was
    /// removed.
    Purge {
        /// The store URL.
        url: String,
    },
    /// Delete a stream and all its events, after confirmation.
    DeleteStream {
        /// The store URL.
        url: String,
        /// The stream to delete.
        stream_id: String,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// List tasks, a page at a time: status, tool, owner, instance (`!`
    /// when lapsed), run and last change. Filters combine.
    Tasks {
        /// The store URL.
        url: String,
        /// Only tasks in this status (repeatable).
        #[arg(long, value_enum)]
        status: Vec<StatusArg>,
        /// Only tasks of this owner: the principal as the server binds it,
        /// or `anonymous`.
        #[arg(long, value_name = "PRINCIPAL")]
        owner: Option<String>,
        /// Only tasks running this tool.
        #[arg(long, value_name = "NAME")]
        tool: Option<String>,
        /// Only tasks on this instance (32 hex digits, as `instances` lists).
        #[arg(long, value_name = "ID", value_parser = parse_instance)]
        instance: Option<mcp_event_store::task::InstanceId>,
        /// Show at most N tasks.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one task: status, tool, owner, instance and its lease, runs,
    /// claims and checkpoint size, pending inputs, times, outcome.
    Task {
        /// The store URL.
        url: String,
        /// The task: the 32 hex digits `tasks` lists, or its id.
        task: String,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// End a task `cancelled` at once, whoever owns it, after
    /// confirmation. Exit 1 when it had ended already.
    Cancel {
        /// The store URL.
        url: String,
        /// The task: the 32 hex digits `tasks` lists, or its id.
        task: String,
        /// The reason its client is told.
        #[arg(long)]
        reason: Option<String>,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Give a failed task that may be taken over another run: it waits for
    /// a claim again. Exit 1, saying why, when it may not be requeued.
    Requeue {
        /// The store URL.
        url: String,
        /// The task: the 32 hex digits `tasks` lists, or its id.
        task: String,
    },
    /// Report tasks to look at: waiting for a claim for longer than
    /// --claim-after (at once when no instance is alive to take them), on
    /// their last run after a run was lost, or waiting for input for longer
    /// than --input-after. Exit 1 when any is reported.
    Stuck {
        /// The store URL.
        url: String,
        /// Report a task waiting for a claim for this many seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        claim_after: u64,
        /// Report input unanswered for this many seconds.
        #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
        input_after: u64,
        /// JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the instances the store holds a lease of: alive or lapsed,
    /// lease, tasks running on each, version.
    Instances {
        /// The store URL.
        url: String,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Count a sealed store's events, sessions and task values by the key
    /// id that sealed them, and say when the events of each key age out;
    /// with --rewrite, first re-seal every value under the current key
    /// while servers run. Reads page by page. Exit 1 when a value is not
    /// sealed, or (with --verify or --rewrite) does not open.
    Keys {
        /// The store URL (the store underneath the decorator).
        url: String,
        /// Open every value with the key ring in the environment variable
        /// named by --keys-env, counting those that do not open.
        #[arg(long)]
        verify: bool,
        /// Re-seal every value sealed under another key than the ring's
        /// current one (the ring in --keys-env), each swapped in only if
        /// no server wrote it meanwhile; then report as with --verify.
        #[arg(long)]
        rewrite: bool,
        /// The environment variable holding the key ring
        /// (`id:base64-key,...`, the current key first).
        #[arg(long, value_name = "VAR", default_value = mcp_event_store_sealed::KEYS_ENV)]
        keys_env: String,
        /// Streams, sessions or tasks read per page (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 100,
              value_parser = clap::value_parser!(u64).range(1..=1000))]
        batch: u64,
        /// Pause this long after each page, to leave the store to the
        /// servers running on it.
        #[arg(long, value_name = "MS", default_value_t = 0)]
        pause_ms: u64,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// A task status, as `tasks --status` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StatusArg {
    /// Running.
    Working,
    /// Waiting for the client's input.
    InputRequired,
    /// Ended with a result.
    Completed,
    /// Ended with an error.
    Failed,
    /// Ended on a cancel.
    Cancelled,
}

impl From<StatusArg> for mcp_event_store::task::TaskStatus {
    fn from(status: StatusArg) -> Self {
        use mcp_event_store::task::TaskStatus;
        match status {
            StatusArg::Working => TaskStatus::Working,
            StatusArg::InputRequired => TaskStatus::InputRequired,
            StatusArg::Completed => TaskStatus::Completed,
            StatusArg::Failed => TaskStatus::Failed,
            StatusArg::Cancelled => TaskStatus::Cancelled,
        }
    }
}

fn parse_instance(text: &str) -> Result<mcp_event_store::task::InstanceId, String> {
    mcp_event_store::task::InstanceId::parse(text)
        .ok_or_else(|| "an instance id is 32 lowercase hex digits".to_owned())
}

/// The order of `streams --sort`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SortBy {
    /// Most payload bytes first.
    Size,
    /// Oldest first event first.
    Age,
}

/// Why a command stopped early.
enum Failure {
    /// Report as one `error:` line, exit 2.
    Error(String),
    /// Stdout was closed by the reader (`| head`): nothing to report.
    ClosedPipe,
}

impl From<mcp_event_store::Error> for Failure {
    fn from(err: mcp_event_store::Error) -> Self {
        Failure::Error(err.to_string())
    }
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::BrokenPipe {
            Failure::ClosedPipe
        } else {
            Failure::Error(format!("output: {err}"))
        }
    }
}

type Outcome = Result<ExitCode, Failure>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return report(Failure::Error(format!("starting the runtime: {err}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(failure) => report(failure),
    }
}

/// Prints a failure as exactly one line, whatever the driver's message
/// looked like: operators grep logs and scripts read the first line.
fn report(failure: Failure) -> ExitCode {
    match failure {
        Failure::ClosedPipe => ExitCode::SUCCESS,
        Failure::Error(message) => {
            let line: String = message
                .split(['\n', '\r'])
                .map(str::trim)
                .filter(|part| !part.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(io::stderr(), "error: {line}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Outcome {
    let timeout = Duration::from_secs(cli.connect_timeout);
    let mut out = io::BufWriter::new(io::stdout().lock());
    let code = match cli.command {
        Command::Check { url, json } => check(&connect(&url, timeout).await?, json, &mut out).await,
        Command::Stats { url, json } => stats(&connect(&url, timeout).await?, json, &mut out).await,
        Command::Streams {
            url,
            sort,
            limit,
            json,
        } => {
            let limit = limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            let store = connect(&url, timeout).await?;
            streams(&store, sort, limit, json, &mut out).await
        }
        Command::Replay {
            url,
            event_id,
            json,
        } => replay(&connect(&url, timeout).await?, &event_id, json, &mut out).await,
        Command::Tail {
            url,
            event_id,
            json,
        } => tail(&connect(&url, timeout).await?, &event_id, json, &mut out).await,
        Command::Purge { url } => purge(&connect(&url, timeout).await?, &mut out).await,
        Command::DeleteStream {
            url,
            stream_id,
            yes,
        } => delete_stream(&connect(&url, timeout).await?, &stream_id, yes, &mut out).await,
        Command::Tasks {
            url,
            status,
            owner,
            tool,
            instance,
            limit,
            json,
        } => {
            let filter = tasks::Filter {
                statuses: status.into_iter().map(Into::into).collect(),
                owner: owner.as_deref().map(tasks::owner_named).transpose()?,
                tool,
                instance,
            };
            let limit = limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            tasks::list(
                &connect(&url, timeout).await?,
                &filter,
                limit,
                json,
                &mut out,
            )
            .await
        }
        Command::Task { url, task, json } => {
            let task = tasks::task_named(&task)?;
            tasks::show(&connect(&url, timeout).await?, task, json, &mut out).await
        }
        Command::Cancel {
            url,
            task,
            reason,
            yes,
        } => {
            let task = tasks::task_named(&task)?;
            let store = connect(&url, timeout).await?;
            tasks::cancel(&store, task, reason.as_deref(), yes, &mut out).await
        }
        Command::Requeue { url, task } => {
            let task = tasks::task_named(&task)?;
            tasks::requeue(&connect(&url, timeout).await?, task, &mut out).await
        }
        Command::Stuck {
            url,
            claim_after,
            input_after,
            json,
        } => {
            let patience = tasks::Patience {
                claim: Duration::from_secs(claim_after),
                input: Duration::from_secs(input_after),
            };
            let store = connect(&url, timeout).await?;
            tasks::stuck(&store, &patience, json, &mut out).await
        }
        Command::Instances { url, json } => {
            tasks::instances(&connect(&url, timeout).await?, json, &mut out).await
        }
        Command::Keys {
            url,
            verify,
            rewrite,
            keys_env,
            batch,
            pause_ms,
            json,
        } => {
            let ring = if verify || rewrite {
                Some(mcp_event_store_sealed::KeyRing::from_env(&keys_env)?)
            } else {
                None
            };
            let mut options = mcp_event_store_sealed::scan::ScanOptions::default()
                .batch(usize::try_from(batch).unwrap_or(MAX_LIST_PAGE))
                .pause(Duration::from_millis(pause_ms));
            if let Some(ring) = &ring {
                options = options.verify(ring);
            }
            let store = connect(&url, timeout).await?;
            let rewritten = match (&ring, rewrite) {
                (Some(ring), true) => {
                    let options = mcp_event_store_sealed::rotate::RotateOptions::default()
                        .batch(options.batch)
                        .pause(options.pause);
                    Some(mcp_event_store_sealed::rotate::reseal(&*store, ring, &options).await?)
                }
                _ => None,
            };
            keys(&store, &options, rewritten.as_ref(), json, &mut out).await
        }
    }?;
    out.flush()?;
    Ok(code)
}

/// Opens the store, failing after `timeout` rather than waiting on an
/// unreachable server for as long as its driver would.
async fn connect(url: &str, timeout: Duration) -> Result<DynStore, Failure> {
    match tokio::time::timeout(timeout, mcp_event_store::connect(url)).await {
        Ok(store) => Ok(store?),
        Err(_) => Err(Failure::Error(format!(
            "no answer from the store within {} s (see --connect-timeout)",
            timeout.as_secs()
        ))),
    }
}

async fn check(store: &DynStore, json: bool, out: &mut impl Write) -> Outcome {
    let report = store.check().await?;
    if json {
        let settings: Vec<_> = report
            .settings
            .iter()
            .map(|s| match &s.verdict {
                Verdict::Warn { remedy } => json!({
                    "name": s.name, "value": s.value, "verdict": "warn", "remedy": remedy,
                }),
                _ => json!({"name": s.name, "value": s.value, "verdict": "ok"}),
            })
            .collect();
        let value = json!({
            "backend": report.backend,
            "format_version": report.format_version,
            "healthy": report.healthy(),
            "settings": settings,
        });
        writeln!(out, "{value}")?;
    } else {
        writeln!(out, "backend:        {}", report.backend)?;
        writeln!(out, "format version: {}", report.format_version)?;
        for setting in &report.settings {
            match &setting.verdict {
                Verdict::Warn { remedy } => {
                    writeln!(out, "warn  {} = {}", setting.name, setting.value)?;
                    writeln!(out, "      remedy: {remedy}")?;
                }
                _ => writeln!(out, "ok    {} = {}", setting.name, setting.value)?,
            }
        }
        let warnings = report
            .settings
            .iter()
            .filter(|s| s.verdict != Verdict::Ok)
            .count();
        match warnings {
            0 => writeln!(out, "healthy")?,
            1 => writeln!(out, "1 warning")?,
            n => writeln!(out, "{n} warnings")?,
        }
    }
    Ok(if report.healthy() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn stats(store: &DynStore, json: bool, out: &mut impl Write) -> Outcome {
    let stats = store.stats().await?;
    if json {
        let value = json!({
            "streams": stats.streams,
            "events": stats.events,
            "bytes": stats.bytes,
            "oldest": stats.oldest_millis.map(rfc3339),
            "newest": stats.newest_millis.map(rfc3339),
            "oldest_millis": stats.oldest_millis,
            "newest_millis": stats.newest_millis,
        });
        writeln!(out, "{value}")?;
    } else {
        writeln!(out, "streams: {}", stats.streams)?;
        writeln!(out, "events:  {}", stats.events)?;
        writeln!(
            out,
            "bytes:   {} ({})",
            stats.bytes,
            human_bytes(stats.bytes)
        )?;
        writeln!(out, "oldest:  {}", time_or_dash(stats.oldest_millis))?;
        writeln!(out, "newest:  {}", time_or_dash(stats.newest_millis))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A stream ranked for `--sort`: greater is kept before lesser, ties broken
/// by stream id (smaller first) so the output does not depend on paging.
struct Ranked {
    key: i128,
    info: StreamInfo,
}

impl Ranked {
    fn new(sort: SortBy, info: StreamInfo) -> Self {
        let key = match sort {
            SortBy::Size => i128::from(info.bytes),
            // Oldest first; a stream without a time sorts last.
            SortBy::Age => -i128::from(info.oldest_millis.unwrap_or(i64::MAX)),
        };
        Self { key, info }
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .cmp(&other.key)
            .then_with(|| other.info.stream_id.cmp(&self.info.stream_id))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

/// Pages through every stream with `MAX_LIST_PAGE`. Unsorted, each page is
/// printed as it comes and paging stops at `limit`; sorted, a min-heap keeps
/// only the best `limit`, so memory is one page plus `limit` entries
/// however many streams the store holds.
async fn streams(
    store: &DynStore,
    sort: Option<SortBy>,
    limit: Option<usize>,
    json: bool,
    out: &mut impl Write,
) -> Outcome {
    if !json {
        writeln!(
            out,
            "{:>10}  {:>10}  {:<24}  {:<24}  STREAM",
            "EVENTS", "BYTES", "OLDEST", "NEWEST"
        )?;
    }
    let mut print = |info: &StreamInfo| -> io::Result<()> {
        if json {
            writeln!(out, "{}", stream_json(info))
        } else {
            writeln!(
                out,
                "{:>10}  {:>10}  {:<24}  {:<24}  {}",
                info.events,
                human_bytes(info.bytes),
                time_or_dash(info.oldest_millis),
                time_or_dash(info.newest_millis),
                display_id(&info.stream_id)
            )
        }
    };
    let mut after = None;
    match sort {
        None => {
            let mut left = limit.unwrap_or(usize::MAX);
            while left > 0 {
                let page = store
                    .list_streams(after.as_ref(), left.min(MAX_LIST_PAGE))
                    .await?;
                for info in page.streams.iter().take(left) {
                    print(info)?;
                }
                left = left.saturating_sub(page.streams.len());
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
        Some(sort) => {
            let keep = limit.unwrap_or(DEFAULT_SORTED_LIMIT);
            let mut best: BinaryHeap<Reverse<Ranked>> = BinaryHeap::new();
            loop {
                let page = store.list_streams(after.as_ref(), MAX_LIST_PAGE).await?;
                for info in page.streams {
                    best.push(Reverse(Ranked::new(sort, info)));
                    if best.len() > keep {
                        best.pop();
                    }
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            // Ascending `Reverse` is descending rank: best first.
            for Reverse(ranked) in best.into_sorted_vec() {
                print(&ranked.info)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn replay(store: &DynStore, event_id: &str, json: bool, out: &mut impl Write) -> Outcome {
    let mut replay = store.replay_events_after(event_id).await?;
    while let Some(event) = replay.events.next().await {
        write_event(out, &event?, json)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Replays, then follows until Ctrl-C or the store ends the follow. Each
/// event is flushed as it is written, so a reader sees it at once.
async fn tail(store: &DynStore, event_id: &str, json: bool, out: &mut impl Write) -> Outcome {
    let mut follow = store
        .follow_events_after(event_id, FollowOptions::default())
        .await?;
    out.flush()?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        // Biased, Ctrl-C first: the handler is installed on its first poll,
        // which must come before the first event is printed, or a Ctrl-C
        // sent after seeing output would kill the process uncleanly.
        tokio::select! {
            biased;
            _ = &mut ctrl_c => break,
            next = follow.events.next() => match next {
                Some(event) => {
                    write_event(out, &event?, json)?;
                    out.flush()?;
                }
                None => break,
            },
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_event(
    out: &mut impl Write,
    event: &mcp_event_store::StoredEvent,
    json: bool,
) -> io::Result<()> {
    if json {
        writeln!(out, "{}", event_json(event))
    } else {
        out.write_all(sse_frame(event).as_bytes())
    }
}

/// Runs retention with a spinner on stderr when it is a terminal (a purge of
/// a large store can take a while, and a silent cursor looks hung); never
/// in a pipe or a log.
async fn purge(store: &DynStore, out: &mut impl Write) -> Outcome {
    let spinner = io::stderr().is_terminal().then(|| {
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.set_message("purging expired events, sessions and tasks");
        spinner.enable_steady_tick(Duration::from_millis(100));
        spinner
    });
    let result = async {
        let events = store.purge_expired().await?;
        Ok::<_, mcp_event_store::Error>((events, store.purge_expired_tasks().await?))
    }
    .await;
    if let Some(spinner) = spinner {
        spinner.finish_and_clear();
    }
    let (report, tasks) = result?;
    writeln!(
        out,
        "purged {} {}, {} {} and {} {}",
        report.events,
        plural(report.events, "event", "events"),
        report.streams,
        plural(report.streams, "stream", "streams"),
        report.sessions,
        plural(report.sessions, "session", "sessions"),
    )?;
    writeln!(
        out,
        "tasks: {} expired and {} orphaned ({} with no run left) marked failed, {} deleted, {} lapsed {} forgotten",
        tasks.expired,
        tasks.orphaned,
        tasks.exhausted,
        tasks.deleted,
        tasks.instances,
        plural(tasks.instances, "instance", "instances"),
    )?;
    Ok(ExitCode::SUCCESS)
}

fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// Asks `prompt` on stderr; only `y` or `yes` goes ahead, else it says
/// `refused`.
fn confirm(prompt: &str, refused: &str) -> Result<bool, Failure> {
    let mut stderr = io::stderr();
    write!(stderr, "{prompt} [y/N] ")?;
    stderr.flush()?;
    let mut answer = String::new();
    io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Error(format!("reading the answer: {e}")))?;
    let answer = answer.trim().to_ascii_lowercase();
    let yes = answer == "y" || answer == "yes";
    if !yes {
        writeln!(stderr, "{refused}")?;
    }
    Ok(yes)
}

/// Deletes a stream. Without `--yes` it first finds the stream's event count
/// (paging through the listing, as the contract has no lookup by stream id)
/// and asks on stderr; only `y` or `yes` goes ahead.
async fn delete_stream(
    store: &DynStore,
    stream_id: &str,
    yes: bool,
    out: &mut impl Write,
) -> Outcome {
    if !yes {
        let events = count_events(store, stream_id).await?;
        let prompt = format!(
            "delete stream {stream_id:?} and its {events} {}?",
            plural(events, "event", "events")
        );
        if !confirm(&prompt, "not deleted")? {
            return Ok(ExitCode::from(1));
        }
    }
    let deleted = store.delete_stream(stream_id).await?;
    writeln!(
        out,
        "deleted stream {stream_id:?} ({deleted} {})",
        plural(deleted, "event", "events")
    )?;
    Ok(ExitCode::SUCCESS)
}

/// `keys`: what `--rewrite` did, then values per key id, what is not
/// sealed, and when each key's events age out under the store's
/// `max_age`.
async fn keys(
    store: &DynStore,
    options: &mcp_event_store_sealed::scan::ScanOptions<'_>,
    rewritten: Option<&mcp_event_store_sealed::rotate::RotateReport>,
    json: bool,
    out: &mut impl Write,
) -> Outcome {
    let usage = mcp_event_store_sealed::scan::key_usage(&**store, options).await?;
    let max_age = store
        .retention()
        .max_age
        .map(|age| i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
    let ages_out = |newest: Option<i64>| Some(newest?.saturating_add(max_age?));
    let verified = options.verify.is_some();
    let unreadable = verified.then_some(usage.unreadable);
    if json {
        let keys: Vec<_> = usage
            .keys
            .iter()
            .map(|(key, count)| {
                json!({
                    "key": key.0,
                    "events": count.events,
                    "sessions": count.sessions,
                    "task_values": count.task_values,
                    "streams": count.streams,
                    "newest_millis": count.newest_millis,
                    "ages_out_by_millis": ages_out(count.newest_millis),
                    "ages_out_by": ages_out(count.newest_millis).map(rfc3339),
                })
            })
            .collect();
        let value = json!({
            "rewrite": rewritten.map(rewrite_json),
            "streams": usage.streams,
            "events": usage.events,
            "sessions": usage.sessions,
            "task_values": usage.task_values,
            "keys": keys,
            "not_sealed": usage.not_sealed,
            "truncated": usage.truncated,
            "newer_format": usage.newer,
            "unreadable": unreadable,
            "interrupted": usage.interrupted,
            "max_age_millis": max_age,
        });
        writeln!(out, "{value}")?;
    } else {
        if let Some(report) = rewritten {
            write_rewrite(report, out)?;
        }
        writeln!(
            out,
            "{} {} in {} {}, {} {}, {} task {}",
            usage.events,
            plural(usage.events, "event", "events"),
            usage.streams,
            plural(usage.streams, "stream", "streams"),
            usage.sessions,
            plural(usage.sessions, "session", "sessions"),
            usage.task_values,
            plural(usage.task_values, "value", "values"),
        )?;
        for (key, count) in &usage.keys {
            let by = match (max_age, ages_out(count.newest_millis)) {
                (None, _) => "never ages out (no max_age)".to_owned(),
                (Some(_), by) => format!("ages out by {}", time_or_dash(by)),
            };
            writeln!(
                out,
                "key {key}: {} {} in {} {}, newest stream time {}, {by}; {} {}, {} task {}",
                count.events,
                plural(count.events, "event", "events"),
                count.streams,
                plural(count.streams, "stream", "streams"),
                time_or_dash(count.newest_millis),
                count.sessions,
                plural(count.sessions, "session", "sessions"),
                count.task_values,
                plural(count.task_values, "value", "values"),
            )?;
        }
        writeln!(out, "not sealed: {}", usage.not_sealed)?;
        if usage.truncated + usage.newer > 0 {
            writeln!(out, "truncated: {}", usage.truncated)?;
            writeln!(out, "newer envelope format: {}", usage.newer)?;
        }
        if let Some(unreadable) = unreadable {
            writeln!(out, "do not open with the key ring: {unreadable}")?;
        }
        if usage.interrupted > 0 {
            writeln!(
                out,
                "streams cut short by retention while read: {}",
                usage.interrupted
            )?;
        }
    }
    let bad = usage.not_sealed + usage.truncated + usage.newer + unreadable.unwrap_or(0);
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// What `keys --rewrite` did, as JSON.
fn rewrite_json(report: &mcp_event_store_sealed::rotate::RotateReport) -> serde_json::Value {
    let counts = |c: &mcp_event_store_sealed::rotate::Counts| {
        json!({
            "read": c.read,
            "resealed": c.resealed,
            "current": c.current,
            "changed": c.changed,
            "unreadable": c.unreadable,
            "not_sealed": c.not_sealed,
        })
    };
    json!({
        "sessions": counts(&report.sessions),
        "task_values": counts(&report.tasks),
        "events": counts(&report.events),
        "events_in_place": report.events_in_place,
        "events_left": report.events_left,
        "interrupted": report.interrupted,
    })
}

/// What `keys --rewrite` did, as text.
fn write_rewrite(
    report: &mcp_event_store_sealed::rotate::RotateReport,
    out: &mut impl Write,
) -> io::Result<()> {
    let line = |out: &mut dyn Write, what: &str, c: &mcp_event_store_sealed::rotate::Counts| {
        writeln!(
            out,
            "rewrite, {what}: {} read, {} re-sealed, {} already current, {} written by a server \
             meanwhile, {} do not open, {} not sealed",
            c.read, c.resealed, c.current, c.changed, c.unreadable, c.not_sealed
        )
    };
    line(out, "sessions", &report.sessions)?;
    line(out, "task values", &report.tasks)?;
    if report.events_in_place {
        line(out, "events", &report.events)?;
    } else {
        writeln!(
            out,
            "rewrite, events: this backend keeps events in an append-only log; {} under older \
             keys leave with retention",
            report.events_left
        )?;
    }
    Ok(())
}

/// The stream's retained events, 0 if the store does not list it.
async fn count_events(store: &DynStore, stream_id: &str) -> Result<u64, Failure> {
    let mut after = None;
    loop {
        let page = store.list_streams(after.as_ref(), MAX_LIST_PAGE).await?;
        if let Some(info) = page.streams.iter().find(|s| s.stream_id == stream_id) {
            return Ok(info.events);
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, bytes: u64, oldest: Option<i64>) -> StreamInfo {
        StreamInfo::new(id, 1, bytes, oldest, oldest)
    }

    /// The heap as `streams --sort` drives it, on one list fed in any order.
    fn top(sort: SortBy, keep: usize, streams: Vec<StreamInfo>) -> Vec<String> {
        let mut best = BinaryHeap::new();
        for info in streams {
            best.push(Reverse(Ranked::new(sort, info)));
            if best.len() > keep {
                best.pop();
            }
        }
        best.into_sorted_vec()
            .into_iter()
            .map(|Reverse(r)| r.info.stream_id)
            .collect()
    }

    #[test]
    fn sort_keeps_the_largest_or_oldest() {
        let streams = vec![
            info("c", 30, Some(300)),
            info("a", 10, Some(100)),
            info("none", 0, None),
            info("d", 40, Some(50)),
            info("b", 30, Some(200)),
        ];
        assert_eq!(top(SortBy::Size, 3, streams.clone()), ["d", "b", "c"]);
        assert_eq!(top(SortBy::Age, 2, streams.clone()), ["d", "a"]);
        assert_eq!(top(SortBy::Age, 10, streams).last().unwrap(), "none");
    }

    #[test]
    fn the_arguments_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
