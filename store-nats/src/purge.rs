//! Retention (C8): what JetStream enforces natively (the count limit, on
//! every append; the age limit, by the server's clock) and what the store
//! enforces in `purge_expired` (the age limit by the store's clock, the
//! byte limit, expired sessions), and deleting a stream.

use futures_util::TryStreamExt;
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{PurgeReport, Result};

use crate::NatsStore;
use crate::error::backend;
use crate::replay::{Read, event_owner, last_event, next_event};
use crate::sessions::{purge_sessions, spilled_session};
use crate::spill::{drop_spilled, drop_unreferenced, spilled};
use crate::tasks::spilled_task;
use crate::wire::Body;

/// Removes a stream's events (its subject, whole); how many went.
pub(crate) async fn remove_stream(store: &NatsStore, stream_id: &str) -> Result<u64> {
    let token = store.token(stream_id);
    let purged = purge_subject(store, &token, None).await?;
    store.inner.forget_head(&token);
    drop_spilled(store, &event_owner(&token), None).await?;
    Ok(purged)
}

/// Purges a stream's subject: everything, or what comes before
/// sequence `before`.
async fn purge_subject(store: &NatsStore, token: &StreamToken, before: Option<u64>) -> Result<u64> {
    let purge = store
        .inner
        .events
        .purge()
        .filter(store.inner.names.event_subject(token));
    let response = match before {
        Some(seq) => purge.sequence(seq).await,
        None => purge.await,
    }
    .map_err(backend)?;
    Ok(response.purged)
}

/// Keeps a stream's newest `keep` events; how many went.
async fn trim_subject(store: &NatsStore, token: &StreamToken, keep: u64) -> Result<u64> {
    let response = store
        .inner
        .events
        .purge()
        .filter(store.inner.names.event_subject(token))
        .keep(keep)
        .await
        .map_err(backend)?;
    Ok(response.purged)
}

/// Every stream's token and event count, as JetStream lists the
/// subjects it holds.
pub(crate) async fn tokens(store: &NatsStore) -> Result<Vec<(StreamToken, u64)>> {
    let mut subjects = store
        .inner
        .events
        .info_with_subjects(store.inner.names.event_subjects())
        .await
        .map_err(backend)?;
    let mut tokens = Vec::new();
    while let Some((subject, count)) = subjects.try_next().await.map_err(backend)? {
        if let Some(token) = subject
            .rsplit_once('.')
            .and_then(|(_, text)| StreamToken::parse(text))
        {
            tokens.push((token, count as u64));
        }
    }
    Ok(tokens)
}

/// Applies this handle's count limit, the age limit by the store's
/// clock and the byte limit to every stream, then removes expired
/// sessions. (JetStream applies the count limit on each append and
/// the age limit by its own clock already; the stream's limits are the
/// last opener's, this handle's may be lower.)
pub(crate) async fn purge(store: &NatsStore) -> Result<PurgeReport> {
    let retention = store.inner.options.store.retention;
    let mut report = PurgeReport::default();
    if retention != mcp_event_store_core::Retention::unbounded() {
        for (token, count) in tokens(store).await? {
            let (events, gone) = purge_stream(store, &token, count).await?;
            report.events += events;
            report.streams += u64::from(gone);
        }
    }
    report.sessions = purge_sessions(store).await?;
    purge_spilled(store).await?;
    Ok(report)
}

/// Removes spilled values their owners no longer refer to (see
/// `spill`): an event's of a stream, by reading the stream's retained
/// events; a session's or task's, by reading its value.
async fn purge_spilled(store: &NatsStore) -> Result<u64> {
    let mut by_owner: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (owner, id) in spilled(store).await? {
        by_owner.entry(owner).or_default().push(id);
    }
    let mut dropped = 0;
    for (owner, ids) in by_owner {
        let kept = match owner.split_at(1) {
            ("e", token) => match StreamToken::parse(token) {
                Some(token) => spilled_events(store, &token).await?,
                None => continue,
            },
            ("s", key) => spilled_session(store, key).await?.into_iter().collect(),
            ("t", key) => spilled_task(store, key).await?.into_iter().collect(),
            _ => continue,
        };
        dropped += drop_unreferenced(store, &owner, &ids, &kept).await?;
    }
    Ok(dropped)
}

/// The ids of the spilled payloads a stream's retained events refer to.
async fn spilled_events(store: &NatsStore, token: &StreamToken) -> Result<Vec<String>> {
    let subject = store.inner.names.event_subject(token);
    let mut kept = Vec::new();
    let mut from = None;
    while let Some(read) = next_event(store, &subject, from).await? {
        if let Body::Spilled(spilled) = &read.3 {
            kept.push(spilled.id.clone());
        }
        from = Some(read.0 + 1);
    }
    Ok(kept)
}

/// One stream's share of [`purge`]: the events it removed, and whether
/// the stream went whole.
async fn purge_stream(store: &NatsStore, token: &StreamToken, count: u64) -> Result<(u64, bool)> {
    let retention = store.inner.options.store.retention;
    let subject = store.inner.names.event_subject(token);
    let mut removed = 0;
    if let Some(keep) = retention.max_events_per_stream.filter(|&keep| count > keep) {
        removed += trim_subject(store, token, keep).await?;
    }
    let Some(last) = last_event(store, &subject).await? else {
        return Ok((removed, false));
    };
    let Some(mut first) = next_event(store, &subject, None).await? else {
        return Ok((removed, false));
    };
    if let Some(max_age) = retention.max_age {
        let cutoff = store
            .now()
            .saturating_sub(i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX));
        if last.1.at < cutoff {
            // Nothing young enough: the stream goes whole.
            let purged = purge_subject(store, token, None).await?;
            store.inner.forget_head(token);
            drop_spilled(store, &event_owner(token), None).await?;
            return Ok((removed + purged, true));
        }
        if first.1.at < cutoff {
            // Events of one stream are in append order, so the old
            // ones are a prefix: walk to the first young one.
            let keep = walk(store, &subject, first, |read| read.1.at >= cutoff).await?;
            removed += purge_subject(store, token, Some(keep.0)).await?;
            first = keep;
        }
    }
    if let Some(max_bytes) = retention.max_bytes_per_stream {
        let retained = |first: &Read| last.1.total - first.1.total + first.3.len();
        if retained(&first) > max_bytes {
            // The newest event always stays (C8), however large.
            let keep = walk(store, &subject, first, |read| {
                read.0 == last.0 || retained(read) <= max_bytes
            })
            .await?;
            removed += purge_subject(store, token, Some(keep.0)).await?;
        }
    }
    Ok((removed, false))
}

/// The first event from `from` on (in the stream's order) that `keep`
/// accepts; the stream's newest if none before it does.
async fn walk(
    store: &NatsStore,
    subject: &str,
    from: Read,
    keep: impl Fn(&Read) -> bool,
) -> Result<Read> {
    let mut at = from;
    loop {
        if keep(&at) {
            return Ok(at);
        }
        match next_event(store, subject, Some(at.0 + 1)).await? {
            Some(next) => at = next,
            None => return Ok(at),
        }
    }
}
