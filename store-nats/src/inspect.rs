//! Inspecting (C15): statistics and the stream listing from the subjects
//! JetStream holds and each stream's first and newest events; the check of
//! the settings that decide durability and boundedness.

use futures_util::TryStreamExt;
use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{
    HealthReport, Result, Setting, StoreStats, StreamCursor, StreamInfo, StreamPage,
};

use crate::error::{NAME, backend};
use crate::options::Storage;
use crate::purge::tokens;
use crate::replay::{last_event, next_event, stream_id};
use crate::{FORMAT_VERSION, NatsStore};

/// One stream as a listing shows it, from its oldest and newest events
/// (the retained count from the subject's message count); `None` when
/// it has none left.
async fn stream_info(store: &NatsStore, token: &StreamToken) -> Result<Option<StreamInfo>> {
    let subject = store.inner.names.event_subject(token);
    let Some(first) = next_event(store, &subject, None).await? else {
        return Ok(None);
    };
    let Some(last) = last_event(store, &subject).await? else {
        return Ok(None);
    };
    let mut counts = store
        .inner
        .events
        .info_with_subjects(&subject)
        .await
        .map_err(backend)?;
    let mut events = 0;
    while let Some((_, count)) = counts.try_next().await.map_err(backend)? {
        events += count as u64;
    }
    let bytes = last.1.total - first.1.total + first.3.len();
    Ok(Some(StreamInfo::new(
        stream_id(&last.2)?,
        events,
        bytes,
        Some(first.1.at),
        Some(last.1.at),
    )))
}

/// The statistics of every stream (C15).
pub(crate) async fn stats(store: &NatsStore) -> Result<StoreStats> {
    let mut stats = StoreStats::default();
    for (token, _) in tokens(store).await? {
        let Some(info) = stream_info(store, &token).await? else {
            continue;
        };
        stats.streams += 1;
        stats.events += info.events;
        stats.bytes += info.bytes;
        stats.oldest_millis = min(stats.oldest_millis, info.oldest_millis);
        stats.newest_millis = stats.newest_millis.max(info.newest_millis);
    }
    Ok(stats)
}

/// A page of streams in token order, after `after`'s token.
pub(crate) async fn streams(
    store: &NatsStore,
    after: Option<&StreamCursor>,
    limit: usize,
) -> Result<StreamPage> {
    let after = after.map(|cursor| cursor.as_str().to_owned());
    let mut tokens: Vec<StreamToken> = tokens(store)
        .await?
        .into_iter()
        .map(|(token, _)| token)
        .filter(|token| {
            after
                .as_deref()
                .is_none_or(|a| token.to_text().as_str() > a)
        })
        .collect();
    tokens.sort();
    let more = tokens.len() > limit;
    tokens.truncate(limit);
    let mut streams = Vec::with_capacity(tokens.len());
    for token in &tokens {
        if let Some(info) = stream_info(store, token).await? {
            streams.push(info);
        }
    }
    let next = more
        .then(|| tokens.last().map(|t| StreamCursor::new(t.to_text())))
        .flatten();
    Ok(StreamPage::new(streams, next))
}

/// The settings that decide durability and boundedness, each judged.
pub(crate) async fn check(store: &NatsStore) -> Result<HealthReport> {
    let options = &store.inner.options;
    let mut events = store.inner.events.clone();
    let config = events.info().await.map_err(backend)?.config.clone();
    let mut settings = Vec::new();
    settings.push(match config.storage {
        async_nats::jetstream::stream::StorageType::File => {
            Setting::ok("storage", Storage::File.as_str())
        }
        async_nats::jetstream::stream::StorageType::Memory => Setting::warn(
            "storage",
            Storage::Memory.as_str(),
            "memory streams lose every event when the server restarts; use storage=file",
        ),
    });
    settings.push(if config.num_replicas >= 3 {
        Setting::ok("replicas", config.num_replicas.to_string())
    } else {
        Setting::warn(
            "replicas",
            config.num_replicas.to_string(),
            "one copy of each event: losing this server's disk loses them; on a cluster use replicas=3",
        )
    });
    // Values above the server's message size are spilled (see
    // `spill`): the setting bounds nothing, it only says when.
    let max_payload = store.inner.client.max_payload();
    settings.push(Setting::ok(
        "max_payload",
        format!("{max_payload} (larger values are stored in chunks)"),
    ));
    settings.push(Setting::retention(&options.store.retention));
    Ok(HealthReport::new(NAME, FORMAT_VERSION, settings))
}

fn min(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
