//! The task and instance commands (T22, T23): `tasks`, `task`, `cancel`,
//! `requeue`, `stuck` and `instances`, over the store's operator listing
//! ([`RuntimeStore::task_page`]), a page at a time.
//!
//! A store never keeps a task's id, so a task is named by its digest (the
//! 32 hex digits `tasks` prints) or by its id, which the command turns into
//! the digest.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mcp_event_store::DynStore;
use mcp_event_store::task::{InstanceId, Owner, Requeue, TaskDigest, TaskEntry, TaskStatus};
use serde_json::{Value, json};

use crate::format::{human_bytes, rfc3339, time_or_dash};
use crate::{Failure, Outcome, confirm, plural};

/// Tasks read per page.
const PAGE: usize = 200;

/// Which tasks `tasks` lists: each set field must match.
#[derive(Debug, Default)]
pub(crate) struct Filter {
    /// Any of these statuses (none: any).
    pub(crate) statuses: Vec<TaskStatus>,
    /// This owner.
    pub(crate) owner: Option<Owner>,
    /// This tool, as the task's context names it.
    pub(crate) tool: Option<String>,
    /// On this instance.
    pub(crate) instance: Option<InstanceId>,
}

impl Filter {
    fn matches(&self, entry: &TaskEntry) -> bool {
        let view = &entry.view;
        (self.statuses.is_empty() || self.statuses.contains(&view.record.status))
            && self.owner.as_ref().is_none_or(|owner| *owner == view.owner)
            && self
                .tool
                .as_ref()
                .is_none_or(|tool| tool_of(entry).as_deref() == Some(tool.as_str()))
            && self
                .instance
                .is_none_or(|instance| view.instance == Some(instance))
    }
}

/// The task a command names: its digest's 32 hex digits, or its id.
pub(crate) fn task_named(text: &str) -> Result<TaskDigest, Failure> {
    TaskDigest::parse(text)
        .or_else(|| TaskDigest::of(text))
        .ok_or_else(|| {
            Failure::Error(format!(
                "{text:?} names no task: give the 32 hex digits `tasks` lists, or the task id"
            ))
        })
}

/// The owner `--owner` names: the principal's bytes as the server binds
/// them, or `anonymous`.
pub(crate) fn owner_named(text: &str) -> Result<Owner, Failure> {
    if text == "anonymous" {
        return Ok(Owner::Anonymous);
    }
    Owner::principal(text.as_bytes()).map_err(Failure::from)
}

/// Calls `each` on every task, a page at a time, until it answers `false`.
async fn each_task(
    store: &DynStore,
    mut each: impl FnMut(TaskEntry) -> Result<bool, Failure>,
) -> Result<(), Failure> {
    let runtime = store.task_runtime();
    let mut after = None;
    loop {
        let page = runtime.task_page(after.as_ref(), PAGE).await?;
        for entry in page.tasks {
            if !each(entry)? {
                return Ok(());
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

/// The tool a task runs, from its context (the runtime's task call).
fn tool_of(entry: &TaskEntry) -> Option<String> {
    let context = entry.view.record.context.as_deref()?;
    mcp_event_store::runtime::TaskCall::tool_of(context).ok()
}

/// An owner for a table cell: the first 8 hex digits of its digest, or
/// `anonymous`.
fn short_owner(owner: &Owner) -> String {
    let mut text = owner_text(owner);
    if owner.digest().is_some() {
        text.truncate(8);
    }
    text
}

fn owner_text(owner: &Owner) -> String {
    match owner.digest() {
        Some(digest) => data_encoding::HEXLOWER.encode(digest),
        None => "anonymous".to_owned(),
    }
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether the task's instance is alive, as the listing read its lease.
fn instance_alive(entry: &TaskEntry, now: i64) -> bool {
    entry
        .view
        .instance_alive_until
        .is_some_and(|until| until > now)
}

fn len(bytes: Option<&impl AsRef<[u8]>>) -> usize {
    bytes.map_or(0, |b| b.as_ref().len())
}

/// One task as a JSON object: everything `task` shows.
fn entry_json(entry: &TaskEntry, now: i64) -> Value {
    let (view, record) = (&entry.view, &entry.view.record);
    let takeover = record.takeover.as_ref();
    json!({
        "task": entry.task.to_string(),
        "status": record.status.as_str(),
        "rev": record.rev,
        "owner": owner_text(&view.owner),
        "tool": tool_of(entry),
        "instance": view.instance.map(|i| i.to_string()),
        "instance_alive": view.instance.map(|_| instance_alive(entry, now)),
        "instance_alive_until": view.instance_alive_until.map(rfc3339),
        "message": record.message,
        "created": rfc3339(record.created_at),
        "updated": rfc3339(record.updated_at),
        "expires": rfc3339(record.expires_at),
        "purged_from": rfc3339(record.purge_at),
        "cancel_requested": record.cancel_requested,
        "cancel_reason": record.cancel_reason,
        "takeover": takeover.map(|t| json!({
            "attempt": t.attempt(),
            "max_attempts": t.max_attempts,
            "lapses": t.lapses,
            "claims": t.epoch.saturating_sub(1),
            "epoch": t.epoch,
            "released": t.released,
            "checkpoint_bytes": len(t.checkpoint.as_ref()),
        })),
        "outstanding": record.outstanding.iter().map(|(key, _)| key).collect::<Vec<_>>(),
        "answered": record.answered,
        "context_bytes": len(record.context.as_ref()),
        "outcome_bytes": len(record.outcome.as_ref()),
    })
}

/// `tasks`: the tasks `filter` keeps, one line (or JSON line) each.
pub(crate) async fn list(
    store: &DynStore,
    filter: &Filter,
    limit: Option<usize>,
    json: bool,
    out: &mut impl Write,
) -> Outcome {
    let now = now_millis();
    let limit = limit.unwrap_or(usize::MAX);
    let mut shown = 0;
    if !json {
        writeln!(
            out,
            "{:<32}  {:<14}  {:<16}  {:<9}  {:<9}  {:<7}  UPDATED",
            "TASK", "STATUS", "TOOL", "OWNER", "INSTANCE", "ATTEMPT"
        )?;
    }
    each_task(store, |entry| {
        if !filter.matches(&entry) {
            return Ok(true);
        }
        if json {
            writeln!(out, "{}", entry_json(&entry, now))?;
        } else {
            let record = &entry.view.record;
            let attempt = record.takeover.as_ref().map_or_else(
                || "-".to_owned(),
                |t| format!("{}/{}", t.attempt(), t.max_attempts),
            );
            let instance = entry.view.instance.map_or_else(
                || "-".to_owned(),
                |i| {
                    let short = i.to_string()[..8].to_owned();
                    if instance_alive(&entry, now) {
                        short
                    } else {
                        format!("{short}!")
                    }
                },
            );
            writeln!(
                out,
                "{:<32}  {:<14}  {:<16}  {:<9}  {:<9}  {:<7}  {}",
                entry.task,
                record.status.as_str(),
                tool_of(&entry).unwrap_or_else(|| "-".to_owned()),
                short_owner(&entry.view.owner),
                instance,
                attempt,
                rfc3339(record.updated_at),
            )?;
        }
        shown += 1;
        Ok(shown < limit)
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// The entry of one task, read through the listing's read.
async fn entry(store: &DynStore, task: TaskDigest) -> Result<TaskEntry, Failure> {
    let view = store
        .task_runtime()
        .view_claimed(&task)
        .await?
        .ok_or_else(|| Failure::Error(format!("no task {task} (never created, or purged)")))?;
    Ok(TaskEntry::new(task, view))
}

/// `task`: one task whole.
pub(crate) async fn show(
    store: &DynStore,
    task: TaskDigest,
    json: bool,
    out: &mut impl Write,
) -> Outcome {
    let entry = entry(store, task).await?;
    let value = entry_json(&entry, now_millis());
    if json {
        writeln!(out, "{value}")?;
        return Ok(ExitCode::SUCCESS);
    }
    let record = &entry.view.record;
    writeln!(out, "task:      {}", entry.task)?;
    writeln!(out, "status:    {} (rev {})", record.status, record.rev)?;
    if let Some(message) = &record.message {
        writeln!(out, "message:   {message}")?;
    }
    writeln!(out, "tool:      {}", value["tool"].as_str().unwrap_or("-"))?;
    writeln!(out, "owner:     {}", owner_text(&entry.view.owner))?;
    match entry.view.instance {
        Some(instance) => writeln!(
            out,
            "instance:  {instance} ({}, lease until {})",
            if instance_alive(&entry, now_millis()) {
                "alive"
            } else {
                "lapsed"
            },
            time_or_dash(entry.view.instance_alive_until)
        )?,
        None => writeln!(out, "instance:  -")?,
    }
    writeln!(out, "created:   {}", rfc3339(record.created_at))?;
    writeln!(out, "updated:   {}", rfc3339(record.updated_at))?;
    writeln!(out, "expires:   {}", rfc3339(record.expires_at))?;
    match &record.takeover {
        Some(t) => {
            writeln!(
                out,
                "runs:      attempt {} of {}, {} lost to a lapsed instance, {} {}{}",
                t.attempt(),
                t.max_attempts,
                t.lapses,
                t.epoch.saturating_sub(1),
                plural(u64::from(t.epoch.saturating_sub(1)), "claim", "claims"),
                if t.released {
                    ", waiting for a claim"
                } else {
                    ""
                }
            )?;
            writeln!(
                out,
                "checkpoint: {}",
                t.checkpoint
                    .as_ref()
                    .map_or_else(|| "none".to_owned(), |c| human_bytes(c.len() as u64))
            )?;
        }
        None => writeln!(out, "runs:      dies with its instance (not taken over)")?,
    }
    let keys = |keys: Vec<&str>| {
        if keys.is_empty() {
            "none".to_owned()
        } else {
            keys.join(", ")
        }
    };
    writeln!(
        out,
        "inputs:    outstanding {}; answered, not yet taken {}",
        keys(record.outstanding.iter().map(|(k, _)| k.as_str()).collect()),
        keys(record.answered.iter().map(String::as_str).collect())
    )?;
    if record.cancel_requested {
        writeln!(
            out,
            "cancel:    requested{}",
            record
                .cancel_reason
                .as_ref()
                .map_or_else(String::new, |r| format!(" ({r})"))
        )?;
    }
    if let Some(outcome) = &record.outcome {
        writeln!(out, "outcome:   {}", String::from_utf8_lossy(outcome))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `cancel`: ends a task `cancelled` at once, after confirmation.
pub(crate) async fn cancel(
    store: &DynStore,
    task: TaskDigest,
    reason: Option<&str>,
    yes: bool,
    out: &mut impl Write,
) -> Outcome {
    if !yes {
        let entry = entry(store, task).await?;
        let prompt = format!(
            "cancel task {task} ({}, {})?",
            entry.view.record.status,
            tool_of(&entry).unwrap_or_else(|| "no tool named".to_owned())
        );
        if !confirm(&prompt, "not cancelled")? {
            return Ok(ExitCode::from(1));
        }
    }
    let Some(record) = store.task_runtime().cancel_task(&task, reason).await? else {
        return Err(Failure::Error(format!(
            "no task {task} (never created, or purged)"
        )));
    };
    if record.status == TaskStatus::Cancelled {
        writeln!(out, "task {task} cancelled")?;
        Ok(ExitCode::SUCCESS)
    } else {
        writeln!(out, "task {task} had ended already: {}", record.status)?;
        Ok(ExitCode::from(1))
    }
}

/// `requeue`: a failed task waits for a claim again (T23).
pub(crate) async fn requeue(store: &DynStore, task: TaskDigest, out: &mut impl Write) -> Outcome {
    match store.task_runtime().requeue_task(&task).await? {
        Requeue::Requeued(record) => {
            let t = record.takeover.as_ref();
            writeln!(
                out,
                "task {task} requeued: it waits for a claim, run {} of {}",
                t.map_or(1, |t| t.attempt()),
                t.map_or(1, |t| t.max_attempts)
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Requeue::Refused(_, why) => {
            writeln!(out, "task {task} not requeued: {why}")?;
            Ok(ExitCode::from(1))
        }
        _ => Err(Failure::Error(format!(
            "no task {task} (never created, or purged)"
        ))),
    }
}

/// What `stuck` reports of one task.
/// How long `stuck` lets a task wait: for a claim, for input.
pub(crate) struct Patience {
    /// A task waiting for a claim this long (or with no live instance to
    /// claim it) is reported.
    pub(crate) claim: Duration,
    /// A task waiting for input this long is reported.
    pub(crate) input: Duration,
}

fn at_least(millis: i64, patience: Duration) -> bool {
    u128::try_from(millis.max(0)).unwrap_or(0) >= patience.as_millis()
}

fn stuck_reasons(entry: &TaskEntry, now: i64, live: usize, patience: &Patience) -> Vec<String> {
    let record = &entry.view.record;
    let mut reasons = Vec::new();
    if record.status.is_terminal() {
        return reasons;
    }
    if let Some(t) = &record.takeover {
        // Only a `working` task waits for a claim; one given back for input
        // waits for its client.
        let lapsed = !instance_alive(entry, now);
        if record.status == TaskStatus::Working && (t.released || lapsed) {
            let since = if t.released {
                record.updated_at
            } else {
                entry.view.instance_alive_until.unwrap_or(record.updated_at)
            };
            if live == 0 {
                reasons.push(format!(
                    "waiting for a claim for {} s, and no instance is alive to claim it",
                    (now - since).max(0) / 1000
                ));
            } else if at_least(now - since, patience.claim) {
                reasons.push(format!(
                    "waiting for a claim for {} s",
                    (now - since).max(0) / 1000
                ));
            }
        }
        // A run lost before, and none left after this one.
        if t.lapses > 0 && t.attempt() >= t.max_attempts {
            reasons.push(format!(
                "on its last run ({} of {})",
                t.attempt(),
                t.max_attempts
            ));
        }
    }
    let waited = now - record.updated_at;
    if record.status == TaskStatus::InputRequired && at_least(waited, patience.input) {
        reasons.push(format!(
            "input unanswered for {} s ({})",
            waited / 1000,
            record
                .outstanding
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    reasons
}

/// `stuck`: tasks waiting for a claim past `patience` (or with no instance
/// alive to claim them), on their last run after a lost one, or waiting
/// for input past `patience`. Exit 1 when any is reported.
pub(crate) async fn stuck(
    store: &DynStore,
    patience: &Patience,
    json: bool,
    out: &mut impl Write,
) -> Outcome {
    let now = now_millis();
    let live = store
        .task_runtime()
        .instances()
        .await?
        .iter()
        .filter(|lease| lease.alive)
        .count();
    let mut found = 0u64;
    each_task(store, |entry| {
        let reasons = stuck_reasons(&entry, now, live, patience);
        if reasons.is_empty() {
            return Ok(true);
        }
        found += 1;
        if json {
            let mut value = entry_json(&entry, now);
            value["stuck"] = json!(reasons);
            writeln!(out, "{value}")?;
        } else {
            writeln!(
                out,
                "{}  {}  {}: {}",
                entry.task,
                entry.view.record.status,
                tool_of(&entry).unwrap_or_else(|| "-".to_owned()),
                reasons.join("; ")
            )?;
        }
        Ok(true)
    })
    .await?;
    if !json {
        writeln!(out, "{found} {} to look at", plural(found, "task", "tasks"))?;
    }
    Ok(if found == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `instances`: every lease the store holds, with the tasks on each.
pub(crate) async fn instances(store: &DynStore, json: bool, out: &mut impl Write) -> Outcome {
    let runtime = store.task_runtime();
    let mut leases = runtime.instances().await?;
    leases.sort_by_key(|lease| std::cmp::Reverse(lease.alive_until));
    let mut running: HashMap<InstanceId, u64> = HashMap::new();
    each_task(store, |entry| {
        if let (Some(instance), false) =
            (entry.view.instance, entry.view.record.status.is_terminal())
        {
            *running.entry(instance).or_default() += 1;
        }
        Ok(true)
    })
    .await?;
    if !json {
        writeln!(
            out,
            "{:<32}  {:<6}  {:<24}  {:>5}  VERSION",
            "INSTANCE", "STATE", "LEASE UNTIL", "TASKS"
        )?;
    }
    let cards = mcp_event_store::runtime::InstanceCard::read_all(&**store).await?;
    for lease in &leases {
        let tasks = running.get(&lease.instance).copied().unwrap_or(0);
        let card = cards.get(&lease.instance);
        let version = card.map(|c| c.version.clone());
        if json {
            writeln!(
                out,
                "{}",
                json!({
                    "instance": lease.instance.to_string(),
                    "alive": lease.alive,
                    "lease_until": rfc3339(lease.alive_until),
                    "tasks": tasks,
                    "version": version,
                    "started": card.map(|c| rfc3339(c.started_millis)),
                })
            )?;
        } else {
            writeln!(
                out,
                "{:<32}  {:<6}  {:<24}  {:>5}  {}",
                lease.instance,
                if lease.alive { "alive" } else { "lapsed" },
                rfc3339(lease.alive_until),
                tasks,
                version.as_deref().unwrap_or("-")
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
