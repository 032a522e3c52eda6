//! Appending (`store_event`): one run of the append script, and the check
//! of the stream secret when the script created the stream (C14).

use mcp_event_store_core::backend::{StreamToken, retry_to_millis};
use mcp_event_store_core::{Error, EventId, NewEvent, Result};
use redis::{FromRedisValue, Value};

use crate::RedisStore;
use crate::keys::StreamKeys;
use crate::options::{APPEND_TRIM_BUDGET, SECRET_ATTEMPTS};
use crate::scripts::{Call, OrEmpty, SCRIPTS, ttl_ms, ttl_with_slack_ms};
use crate::setup::secret_kept_changing;
use crate::wire::{entry_id, parse_entry_id};

/// Appends `event` to `stream_id` (`store_event`), then wakes this
/// handle's followers of the stream.
pub(crate) async fn append(
    store: &RedisStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    let id = append_confirmed(store, stream_id, event).await?;
    // The script returned: the event is visible to every reader now.
    store.inner.follow.hub().wake(&id.token);
    Ok(id)
}

/// Appends `event` to `stream_id`, checking the stream secret first when
/// the append created the stream or found it pending.
async fn append_confirmed(
    store: &RedisStore,
    stream_id: &str,
    event: NewEvent<'_>,
) -> Result<EventId> {
    for _ in 0..SECRET_ATTEMPTS {
        let key = store.key();
        let token = key.token(stream_id);
        let keys = store.inner.keys.stream(&token);
        let (id, check) = append_once(store, stream_id, event, token, &keys).await?;
        let Some(check) = check else {
            return Ok(id);
        };
        if check == "restarted" {
            tracing::warn!(
                stream_id,
                "part of this stream's keys was gone (evicted or deleted by hand); \
                 it starts over, and cursors into its old events are refused"
            );
        }
        match store.secret_holds(&key).await {
            Ok(true) => {
                let confirmed: i64 = store
                    .invoke(
                        SCRIPTS
                            .confirm
                            .call()
                            .key(&keys.events)
                            .key(&keys.meta)
                            .arg(entry_id(id.position))
                            .arg(stream_id),
                    )
                    .await?;
                if confirmed == 1 {
                    return Ok(id);
                }
                // The entry went between the append and this check (the
                // backend lost its data again): append once more.
            }
            Ok(false) => discard(store, &keys, stream_id).await?,
            Err(e) => {
                if matches!(e, Error::IncompatibleFormat(_)) {
                    // A newer release took the prefix over after a loss.
                    discard(store, &keys, stream_id).await?;
                }
                return Err(e);
            }
        }
    }
    Err(secret_kept_changing())
}

/// Removes a stream this handle created under a secret that turned out
/// to be out of date (nothing in it was acknowledged).
async fn discard(store: &RedisStore, keys: &StreamKeys, stream_id: &str) -> Result<()> {
    let _: i64 = store
        .invoke(
            SCRIPTS
                .discard
                .call()
                .key(&keys.events)
                .key(&keys.meta)
                .arg(stream_id),
        )
        .await?;
    Ok(())
}

/// The append script's call for `event` on the stream whose keys are
/// `keys` (see the script for its arguments).
pub(crate) fn append_call<'a>(
    store: &RedisStore,
    stream_id: &str,
    event: NewEvent<'_>,
    keys: &StreamKeys,
) -> Call<'a> {
    let retention = store.inner.options.store.retention;
    SCRIPTS
        .append
        .call()
        .key(&keys.events)
        .key(&keys.meta)
        .key(&keys.gone)
        .arg(stream_id)
        .arg(event.data)
        .arg(OrEmpty(retry_to_millis(event.retry)))
        .arg(store.now())
        .arg(OrEmpty(retention.max_events_per_stream))
        .arg(OrEmpty(retention.max_bytes_per_stream))
        .arg(OrEmpty(ttl_ms(retention.max_age)))
        .arg(APPEND_TRIM_BUDGET)
        .arg(OrEmpty(ttl_with_slack_ms(retention.max_age)))
}

/// One run of the append script (and `WAIT`): the id, and the state
/// (`new`, `restarted`, `pending`) when the secret must be checked
/// before the id may be returned.
async fn append_once(
    store: &RedisStore,
    stream_id: &str,
    event: NewEvent<'_>,
    token: StreamToken,
    keys: &StreamKeys,
) -> Result<(EventId, Option<&'static str>)> {
    let call = append_call(store, stream_id, event, keys);
    let (reply, acked) = store.run(&call, true).await?;
    let (id, check) = match reply {
        Value::BulkString(id) => (parse_entry_id(&id)?, None),
        Value::SimpleString(id) => (parse_entry_id(id.as_bytes())?, None),
        Value::Array(parts) => match <(Vec<u8>, String)>::from_redis_value(Value::Array(parts)) {
            Ok((id, state)) => {
                let check = match state.as_str() {
                    "new" => "new",
                    "restarted" => "restarted",
                    "pending" => "pending",
                    _ => return Err(unexpected_reply("append")),
                };
                (parse_entry_id(&id)?, Some(check))
            }
            Err(_) => return Err(unexpected_reply("append")),
        },
        Value::Int(-1) => {
            return Err(Error::Corrupt(format!(
                "stream token {token} already belongs to another stream id"
            )));
        }
        _ => return Err(unexpected_reply("append")),
    };
    store.check_wait(acked, "the event")?;
    Ok((EventId::new(token, id), check))
}

fn unexpected_reply(script: &str) -> Error {
    Error::Corrupt(format!("unexpected reply from the {script} script"))
}
