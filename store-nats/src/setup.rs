//! Opening a store: connecting, the events stream and the buckets (created
//! when missing), the format check (C12) and the stream secret (C2, C14).

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::Arc;

use mcp_event_store_core::backend::follow::Wakeups;
use mcp_event_store_core::backend::{StreamKey, StreamToken};
use mcp_event_store_core::{Error, MAX_REDEEM_HORIZON, REDEEM_GRACE, Result};

use crate::error::{NAME, backend, is_conflict};
use crate::options::{MIN_CLUSTER_VERSION, MIN_SERVER_VERSION};
use crate::state::{Inner, Names};
use crate::{FORMAT_VERSION, NatsOptions};

/// The meta bucket's keys.
pub(crate) const FORMAT_KEY: &str = "format";
pub(crate) const SECRET_KEY: &str = "secret";

/// How long JetStream remembers an append's message id, so that an append
/// retried after a lost acknowledgement is stored once.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

pub(crate) async fn open(url: &str, options: NatsOptions) -> Result<Inner> {
    let (options, servers) = options.with_url(url)?;
    options.validate()?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(options.connect_timeout)
        .request_timeout(Some(options.request_timeout))
        .name("mcp-event-store")
        .require_tls(options.require_tls)
        .connect(servers.as_slice())
        .await
        .map_err(|e| {
            Error::backend(
                NAME,
                format!("could not connect to the NATS server(s) in the store URL: {e}"),
            )
        })?;
    check_server(&client)?;
    let mut js = jetstream::new(client.clone());
    js.set_timeout(options.request_timeout);
    let names = Names {
        prefix: options.prefix.clone(),
    };
    let events = ready(events_stream(&js, &names, &options).await?, &options).await?;
    let spill = ready(spill_stream(&js, &names, &options).await?, &options).await?;
    let meta = bucket(&js, &names, &options, "meta").await?;
    check_format(&meta).await?;
    let secret = secret(&meta).await?;
    let sessions = bucket(&js, &names, &options, "sessions").await?;
    let redeemed = redeem_bucket(&js, &names, &options).await?;
    let tasks = [
        bucket(&js, &names, &options, "tasks").await?,
        bucket(&js, &names, &options, "instances").await?,
        bucket(&js, &names, &options, "takeover").await?,
    ];
    let inner = Inner::new(
        client, js, events, spill, sessions, redeemed, tasks, names, secret, options,
    );
    let events = inner.names.wake_subjects();
    watch(&inner, events, inner.wakeups.clone()).await?;
    let tasks = inner.names.task_wake_subjects();
    watch(&inner, tasks, inner.task_wakeups.clone()).await?;
    Ok(inner)
}

/// JetStream must be on, and the server new enough: 2.9 on its own, and
/// 2.9.21 in a cluster, where older servers let two writes that name the
/// same expected sequence both through (nats-server issue 4320), which
/// would let two instances claim one task.
fn check_server(client: &async_nats::Client) -> Result<()> {
    let info = client.server_info();
    if !info.jetstream {
        return Err(Error::Config(
            "the NATS server has JetStream disabled; start it with -js (or `jetstream {}` in its configuration)".into(),
        ));
    }
    let clustered = info.cluster.as_deref().is_some_and(|name| !name.is_empty());
    if let Some(needed) = too_old(&info.version, clustered) {
        return Err(Error::Config(format!(
            "NATS server {} is too old for this backend{}: it needs {needed} or newer",
            info.version,
            if clustered {
                " in a cluster (older servers let concurrent compare-and-set writes to one subject all succeed, nats-server issue 4320)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// The version a server of `version` falls short of, if it does.
fn too_old(version: &str, clustered: bool) -> Option<String> {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let found = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    let needed = if clustered {
        MIN_CLUSTER_VERSION
    } else {
        (MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1, 0)
    };
    (found < needed).then(|| format!("{}.{}.{}", needed.0, needed.1, needed.2))
}

/// The events stream's configuration for these options: the count and age
/// limits are native (the server enforces them on every append and over
/// time); the byte limit is the store's (JetStream has none per subject).
pub(crate) fn events_config(names: &Names, options: &NatsOptions) -> stream::Config {
    let retention = options.store.retention;
    stream::Config {
        name: names.events(),
        subjects: vec![names.event_subjects()],
        storage: options.storage.js(),
        num_replicas: options.replicas,
        max_messages_per_subject: retention
            .max_events_per_stream
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)),
        max_age: retention.max_age.unwrap_or(Duration::ZERO),
        discard: stream::DiscardPolicy::Old,
        // Direct gets only where no replica can answer stale (see `get`).
        allow_direct: options.replicas == 1,
        deny_delete: true,
        // JetStream wants the window within the age limit.
        duplicate_window: retention
            .max_age
            .map_or(DUPLICATE_WINDOW, |age| age.min(DUPLICATE_WINDOW)),
        description: Some(format!(
            "mcp-event-store events, format {FORMAT_VERSION} (subject per stream)"
        )),
        ..Default::default()
    }
}

async fn events_stream(
    js: &jetstream::Context,
    names: &Names,
    options: &NatsOptions,
) -> Result<stream::Stream> {
    let wanted = events_config(names, options);
    for _ in 0..3 {
        match js.get_stream(names.events()).await {
            Ok(mut existing) => {
                let config = existing.info().await.map_err(backend)?.config.clone();
                if config.max_messages_per_subject != wanted.max_messages_per_subject
                    || config.max_age != wanted.max_age
                    || config.duplicate_window != wanted.duplicate_window
                {
                    // One stream holds every handle's events: the handle
                    // opened last sets its native limits.
                    let updated = stream::Config {
                        max_messages_per_subject: wanted.max_messages_per_subject,
                        max_age: wanted.max_age,
                        duplicate_window: wanted.duplicate_window,
                        ..config
                    };
                    js.update_stream(updated).await.map_err(backend)?;
                }
                return Ok(existing);
            }
            Err(e) if is_not_found(&e) => match js.create_stream(wanted.clone()).await {
                Ok(created) => return Ok(created),
                // Another handle created it meanwhile: read it again.
                Err(e) => tracing::debug!(error = %e, "creating the events stream raced"),
            },
            Err(e) => return Err(backend(e)),
        }
    }
    Err(Error::backend(
        NAME,
        format!("could not create or open the stream {}", names.events()),
    ))
}

/// The stream of values too large for one message (see `spill`): no
/// limits of its own, the store removes what no owner refers to.
async fn spill_stream(
    js: &jetstream::Context,
    names: &Names,
    options: &NatsOptions,
) -> Result<stream::Stream> {
    let config = stream::Config {
        name: names.spill(),
        subjects: vec![format!("{}.sp.>", names.prefix)],
        storage: options.storage.js(),
        num_replicas: options.replicas,
        // Direct gets only where no replica can answer stale (see `get`).
        allow_direct: options.replicas == 1,
        deny_delete: true,
        description: Some(format!(
            "mcp-event-store values too large for one message, format {FORMAT_VERSION}"
        )),
        ..Default::default()
    };
    if let Err(e) = js.create_stream(config).await {
        tracing::debug!(error = %e, "creating the spill stream raced");
    }
    js.get_stream(names.spill()).await.map_err(|e| {
        Error::backend(
            NAME,
            format!("could not open the stream {}: {e}", names.spill()),
        )
    })
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(js)
            if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

pub(crate) async fn bucket(
    js: &jetstream::Context,
    names: &Names,
    options: &NatsOptions,
    job: &str,
) -> Result<kv::Store> {
    bucket_aged(js, names, options, job, Duration::ZERO).await
}

/// How long the redemption bucket keeps a record (C21): the longest a
/// record may be needed, the horizon plus the grace. JetStream 2.9 has no
/// ttl per key: every record is kept this long from its write, however
/// early its own expiry.
pub(crate) const REDEEM_MAX_AGE: Duration = MAX_REDEEM_HORIZON.saturating_add(REDEEM_GRACE);

/// The redemption bucket (C21), whose messages JetStream removes
/// [`REDEEM_MAX_AGE`] after their write: what bounds it. A bucket found
/// with another age limit is set to this one (never shorter than a record
/// may be needed).
async fn redeem_bucket(
    js: &jetstream::Context,
    names: &Names,
    options: &NatsOptions,
) -> Result<kv::Store> {
    let bucket = bucket_aged(js, names, options, "redeemed", REDEEM_MAX_AGE).await?;
    let mut stream = bucket.stream.clone();
    let config = stream.info().await.map_err(backend)?.config.clone();
    if config.max_age != REDEEM_MAX_AGE {
        js.update_stream(stream::Config {
            max_age: REDEEM_MAX_AGE,
            ..config
        })
        .await
        .map_err(backend)?;
    }
    Ok(bucket)
}

/// A bucket whose values JetStream removes `max_age` after their write
/// (`Duration::ZERO`: never).
async fn bucket_aged(
    js: &jetstream::Context,
    names: &Names,
    options: &NatsOptions,
    job: &str,
    max_age: Duration,
) -> Result<kv::Store> {
    let name = names.bucket(job);
    if let Ok(store) = js.get_key_value(&name).await {
        return Ok(store);
    }
    // The bucket's stream as a key-value bucket lays it out (one value per
    // key), created directly: the client's own bucket creation asks for
    // account details a 2.9 server answers in a form it cannot read.
    let config = stream::Config {
        name: format!("KV_{name}"),
        description: Some(format!("mcp-event-store {job}, format {FORMAT_VERSION}")),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        storage: options.storage.js(),
        num_replicas: options.replicas,
        allow_rollup: true,
        deny_delete: true,
        // Direct gets only where no replica can answer stale (see `get`).
        allow_direct: options.replicas == 1,
        discard: stream::DiscardPolicy::New,
        max_age,
        ..Default::default()
    };
    if let Err(e) = js.create_stream(config).await {
        // Another handle created it meanwhile, or it exists under another
        // configuration: open what is there.
        tracing::debug!(error = %e, bucket = %name, "creating a bucket raced");
    }
    let bucket = js
        .get_key_value(&name)
        .await
        .map_err(|e| Error::backend(NAME, format!("could not open the bucket {name}: {e}")))?;
    ready(bucket.stream.clone(), options).await?;
    Ok(bucket)
}

/// Waits until a replicated stream has a leader, which a stream just
/// created on a cluster may not have yet (reads fail until it does), for
/// at most the request timeout.
async fn ready(mut stream: stream::Stream, options: &NatsOptions) -> Result<stream::Stream> {
    let deadline = tokio::time::Instant::now() + options.request_timeout;
    loop {
        let info = stream.info().await.map_err(backend)?;
        let led = info
            .cluster
            .as_ref()
            .is_none_or(|cluster| cluster.leader.as_deref().is_some_and(|l| !l.is_empty()));
        if led {
            return Ok(stream);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::backend(
                NAME,
                format!("the stream {} has no leader", info.config.name),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Refuses a store a newer release wrote (C12); marks a new one.
async fn check_format(meta: &kv::Store) -> Result<()> {
    for _ in 0..3 {
        if let Some(found) = meta.get(FORMAT_KEY).await.map_err(backend)? {
            let version = std::str::from_utf8(&found)
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or_else(|| Error::Corrupt("the format marker is not a number".into()))?;
            if version > FORMAT_VERSION {
                return Err(Error::IncompatibleFormat(format!(
                    "this NATS store was written in format {version}; this release reads up to {FORMAT_VERSION}"
                )));
            }
            return Ok(());
        }
        let marker = Bytes::from(FORMAT_VERSION.to_string());
        match meta.create(FORMAT_KEY, marker).await {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || is_conflict(&e) => continue,
            Err(e) => return Err(backend(e)),
        }
    }
    Err(Error::backend(NAME, "the format marker kept changing"))
}

/// The store's stream secret: read, or drawn and created once for every
/// handle (the first create wins; the others read it).
async fn secret(meta: &kv::Store) -> Result<StreamKey> {
    for _ in 0..3 {
        if let Some(found) = meta.get(SECRET_KEY).await.map_err(backend)? {
            return StreamKey::from_bytes(&found);
        }
        let drawn = StreamKey::generate()?;
        match meta
            .create(SECRET_KEY, Bytes::copy_from_slice(drawn.as_bytes()))
            .await
        {
            Ok(_) => return Ok(drawn),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || is_conflict(&e) => continue,
            Err(e) => return Err(backend(e)),
        }
    }
    Err(Error::backend(NAME, "the stream secret kept changing"))
}

/// Subscribes to a kind of wake-up subjects (`<prefix>.wake.*` for
/// streams, `<prefix>.twake.*` for tasks): every change publishes one, and
/// this handle wakes its followers or watchers of that stream or task (C13,
/// T10). A wake-up lost (a reconnect) only delays them to their next
/// re-read.
async fn watch(inner: &Inner, subjects: String, wakeups: Arc<Wakeups>) -> Result<()> {
    let mut subscriber = inner.client.subscribe(subjects).await.map_err(backend)?;
    let task = tokio::spawn(async move {
        while let Some(message) = subscriber.next().await {
            let token = message
                .subject
                .rsplit_once('.')
                .and_then(|(_, text)| StreamToken::parse(text));
            if let Some(token) = token {
                wakeups.wake(&token);
            }
        }
    });
    inner
        .watchers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(task);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::too_old;

    #[test]
    fn clusters_need_a_server_with_serialized_compare_and_set() {
        assert_eq!(too_old("2.9.10", false), None);
        assert_eq!(too_old("2.9.10", true).as_deref(), Some("2.9.21"));
        assert_eq!(too_old("2.9.21", true), None);
        assert_eq!(too_old("2.10.0", true), None);
        assert_eq!(too_old("2.8.4", false).as_deref(), Some("2.9.0"));
        assert_eq!(too_old("v2.15.1", true), None);
    }
}
