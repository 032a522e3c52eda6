//! NATS JetStream backend for **mcp-event-store**: a shared, bounded event
//! store for resumable MCP Streamable HTTP streams, on one NATS server or a
//! cluster (NATS 2.9 or newer, JetStream enabled).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use mcp_event_store_core::{EventStore, NewEvent};
//! use mcp_event_store_nats::NatsStore;
//!
//! let store = NatsStore::connect("nats://127.0.0.1:4222").await?;
//! let id = store.store_event("session-1:common", NewEvent::new(b"{}")).await?;
//! let replay = store.replay_events_after(&id.to_string()).await?;
//! # drop(replay);
//! store.close().await;
//! # Ok(()) }
//! ```
//!
//! # Connecting
//!
//! [`NatsStore::connect`] and [`NatsStore::connect_with`] take
//! `nats://[user:pass@]host[:port][,host[:port]...]` (several seed
//! servers of a cluster, comma separated) or `tls://...`, with these
//! parameters ([`URL_PARAMETERS`]): `prefix` (the names of this store's
//! streams, buckets and subjects; default `mcp-event-store`), `replicas`
//! (1 to 5, for the streams and buckets the store creates), `storage`
//! (`file` or `memory`), `request_timeout_ms` and `follow_recheck_ms`.
//! An unknown or repeated parameter is an error.
//!
//! # Layout
//!
//! * the stream `<prefix>-events` holds every event, one subject per MCP
//!   stream, `<prefix>.ev.<token>`, where the token is a keyed hash of the
//!   stream id under a secret kept in the store (so any stream id is a
//!   valid subject, and nothing in a subject names a stream);
//! * the key-value bucket `<prefix>-meta` holds the format marker and the
//!   secret; `<prefix>-sessions` one key per session.
//!
//! An event's message carries a small binary header before its payload
//! (the append time by the store's clock, its stream's first sequence in
//! this life, the previous event's sequence, the running byte total) and
//! its stream id. An event id is `v1.<token>.<base>-<seq>`: the first
//! JetStream sequence of the stream's life and the event's own. JetStream
//! sequences are never reused within the stream, so no id is issued twice,
//! even after a stream is deleted and started again (C2); a cursor of an
//! earlier life names a base the stream no longer has.
//!
//! # Durability
//!
//! `store_event` returns once JetStream acknowledged the event: stored by
//! the stream's leader and a quorum of its replicas. With `storage=file`
//! (the default) an acknowledged event survives a server restart. JetStream
//! writes to the operating system at once and syncs to disk every two
//! minutes by default (`sync_interval` in the server configuration; set
//! `sync_interval: always` for an fsync per write on a single server).
//! With `replicas=3` on a cluster an acknowledged event is on two servers
//! at least and survives losing one. `storage=memory` loses everything
//! when the server (every replica) restarts.
//!
//! # Retention
//!
//! The count limit is JetStream's own (`max_msgs_per_subject`, enforced on
//! every append) and so is the age limit (`max_age`, by the server's
//! clock); both are set on the events stream from the options of the
//! handle that opened it last, so every handle of a store should use the
//! same retention. `purge_expired` applies the age limit again by the
//! store's clock, applies the byte limit (JetStream has none per subject)
//! and removes expired sessions.
//!
//! # Following
//!
//! Every append publishes a wake-up on the core subject
//! `<prefix>.wake.<token>`; each handle subscribes once and re-reads its
//! followed streams by cursor when woken, and every `follow_recheck`
//! (5 s) without one.
//!
//! # Inspecting
//!
//! Statistics and the stream listing come from the subjects JetStream
//! holds and each stream's oldest and newest events: two reads per stream.
//!
//! # Format
//!
//! The format is version [`FORMAT_VERSION`], in the meta bucket's `format`
//! key and in every event header; a store of a newer format is refused.
//!
//! # Limits
//!
//! A NATS server takes messages of at most `max_payload` bytes (1 MiB by
//! default, 64 MiB at most): payloads and session states larger than that
//! less the header are refused with `PayloadTooLarge`. Raise `max_payload`
//! in the server configuration to the store's payload limit (8 MiB by
//! default) or lower the store's.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod append;
mod error;
mod follow;
mod get;
mod inspect;
mod options;
mod purge;
mod replay;
mod sessions;
mod setup;
mod spill;
mod state;
mod store;
mod tasks;
mod wire;

#[cfg(feature = "conformance")]
pub mod testing;

pub use options::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_FOLLOW_RECHECK, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT,
    MIN_CLUSTER_VERSION, MIN_SERVER_VERSION, NatsOptions, Storage, URL_PARAMETERS, URL_SCHEMES,
    validate_prefix,
};
pub use store::NatsStore;

use std::sync::Arc;

use mcp_event_store_core::{Backend, Store};

/// This backend as the `mcp-event-store` facade's `connect` finds it: URL
/// schemes [`URL_SCHEMES`], facade feature `nats`. Its `connect` reads the
/// URL with [`NatsStore::connect_with`] and applies the shared
/// [`StoreOptions`](mcp_event_store_core::StoreOptions).
///
/// ```
/// assert!(mcp_event_store_nats::BACKEND.opens("nats://127.0.0.1:4222?replicas=3"));
/// ```
pub const BACKEND: Backend = Backend {
    name: error::NAME,
    schemes: URL_SCHEMES,
    feature: "nats",
    connect: |url, options| {
        let url = url.to_owned();
        Box::pin(async move {
            let options = NatsOptions::default().store(options);
            Ok(Arc::new(NatsStore::connect_with(&url, options).await?) as Arc<dyn Store>)
        })
    },
};

/// The storage format this release reads and writes (the meta bucket's
/// `format` key, and the version byte of every event header).
pub const FORMAT_VERSION: u32 = 1;
