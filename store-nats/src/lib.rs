//! NATS JetStream backend for **mcp-event-store**: a shared, bounded event
//! store for resumable MCP Streamable HTTP streams, on one NATS server or a
//! cluster (NATS 2.9 or newer, 2.9.21 in a cluster; JetStream enabled).
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
//! `nats://[user:pass@]host[:port][,host[:port]...]` (the seed servers of
//! a cluster, comma separated; the credentials apply to each), with these
//! parameters ([`URL_PARAMETERS`]): `prefix` (the names of this store's
//! streams, buckets and subjects; default `mcp-event-store`), `replicas`
//! (1 to 5, for the streams and buckets the store creates), `storage`
//! (`file` or `memory`), `tls=true` (refuse a server without TLS),
//! `request_timeout_ms` and `follow_recheck_ms`. An unknown or repeated
//! parameter, or a bad value, is an error that never quotes the URL.
//!
//! The server must run JetStream and be NATS 2.9 or newer; in a cluster,
//! 2.9.21 or newer ([`MIN_CLUSTER_VERSION`]): older clustered servers let
//! concurrent writes that name the same expected sequence all succeed
//! (nats-server issue 4320), which would break the chain of a stream's
//! events and let two instances claim one task. The store refuses them.
//!
//! # Layout
//!
//! * the stream `<prefix>-events` holds every event, one subject per MCP
//!   stream, `<prefix>.ev.<token>`, where the token is a keyed hash of the
//!   stream id under a secret kept in the store (so any stream id is a
//!   valid subject, and nothing in a subject names a stream);
//! * the stream `<prefix>-spill` holds values too large for one message
//!   (see [Limits](#limits));
//! * the key-value buckets `<prefix>-meta` (the format marker and the
//!   secret), `<prefix>-sessions` (a key per session, named by a keyed
//!   hash of its id), `<prefix>-tasks`, `<prefix>-instances` and
//!   `<prefix>-takeover` (see [Tasks](#tasks)), and `<prefix>-redeemed`
//!   (see [Redemptions](#redemptions)).
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
//! An append is one JetStream publish that names the sequence of the
//! stream's newest event (`Nats-Expected-Last-Subject-Sequence`): it is
//! stored only if that is still the newest, so a stream's events form an
//! unbroken chain whatever the writers (C6), and a replay that finds an
//! event not chained to the one before it knows retention removed what
//! was between (C5). A handle remembers each stream's newest event, so the
//! steady state is one round trip; appends of one handle to one stream take
//! turns, and another writer's append in between costs a re-read and a
//! retry. Each append carries a message id, so one retried after a lost
//! acknowledgement is stored once.
//!
//! ## Redemptions
//!
//! [`RedeemStore::redeem`](mcp_event_store_core::RedeemStore::redeem)
//! (C21) is the bucket `<prefix>-redeemed`'s `create` of one key, the
//! 32-byte digest core computes (the principal's digest and the nonce, in
//! hex; never the nonce): a publish that expects no message on the key's
//! subject yet (`Nats-Expected-Last-Subject-Sequence: 0`), which of racing
//! creates exactly one passes; acknowledged by JetStream before the
//! answer. NATS 2.9 has no ttl per key, so the bucket's age limit bounds
//! it: every record is removed by the server
//! [`MAX_REDEEM_HORIZON`](mcp_event_store_core::MAX_REDEEM_HORIZON) plus
//! [`REDEEM_GRACE`](mcp_event_store_core::REDEEM_GRACE) (24 h 5 min) after
//! its write, by the server's clock, however early its own expiry: never
//! before it may still be needed (an expiry is at most the horizon ahead),
//! and the bucket holds at most the redemptions of that long.
//! `purge_expired` has nothing to do for them and counts none. Every open
//! sets the bucket's age limit back to that if it finds another.
//!
//! ## Rewriting in place
//!
//! The [rewriter](mcp_event_store_core::EventStore::rewriter) (C22) lists
//! sessions and tasks as their buckets hold them and swaps one value by a
//! revision-checked write of its key (the bucket's `update`), which lands
//! only if nothing wrote the key since the read; a session keeps the
//! expiry its value holds, a task everything but the value, and a value
//! too large for one message is written to new chunks first, as any write
//! is. A session's key is a keyed hash, which says nothing of its digest's
//! order, so each page of the session listing reads every session's value;
//! a task's key is its digest, so a page reads only its own tasks. Events
//! are JetStream messages, which never change: the rewriter says so
//! (`rewrites_events` is `false`) and refuses an event swap; events leave
//! with retention.
//!
//! # Durability
//!
//! `store_event` returns once JetStream acknowledged the event: stored by
//! the stream's leader and, with replicas, by a quorum of them. With
//! `storage=file` (the default) an acknowledged event survives the server
//! process being killed (it is in the operating system's files); against
//! power loss, JetStream syncs its files to disk on an interval (two
//! minutes by default; `sync_interval: always` in the server
//! configuration, NATS 2.10 and newer, syncs every write). With
//! `replicas=3` on a cluster, an acknowledged event is on at least two
//! servers and survives losing any one (the tests SIGKILL the stream's
//! leader and replay everything through the other two). `storage=memory`
//! loses everything when the server (or every replica) restarts.
//!
//! # Retention
//!
//! The count limit is JetStream's own (`max_msgs_per_subject`, enforced on
//! every append) and so is the age limit (`max_age`, by the server's
//! clock); both are set on the events stream from the options of the
//! handle that opened it last, so every handle of a store should use the
//! same retention. `purge_expired` applies this handle's count limit, the
//! age limit by the store's clock and the byte limit (JetStream has none
//! per subject: each event's running byte total makes it two reads per
//! stream), and removes expired sessions and unreferenced spilled values.
//! It visits every stream, a few reads each.
//!
//! # Following
//!
//! Every append publishes a wake-up on the core subject
//! `<prefix>.wake.<token>`; each handle subscribes once and re-reads its
//! followed streams by cursor when woken, and every `follow_recheck`
//! (5 s) without one. A wake-up carries nothing: a lost one (a reconnect)
//! only delays a follower to its next re-read.
//!
//! # Tasks
//!
//! A task is one value in `<prefix>-tasks` under its digest (core's task
//! codec), an instance's lease one value in `<prefix>-instances`, and the
//! tasks that may be taken over are indexed in `<prefix>-takeover` (what a
//! claim scans). Every change is a compare-and-set on the key's revision
//! (JetStream orders the writes to one key on every server), so exactly one
//! of racing claimants wins (T17) and a fenced worker's write never lands
//! (T18). A removed key is purged from its bucket's stream, leaving no
//! delete marker behind. A change wakes watchers on every handle through
//! `<prefix>.twake.<token>`. `purge_expired_tasks` reads every task.
//!
//! # Inspecting
//!
//! Statistics and the stream listing come from the subjects JetStream
//! holds and each stream's oldest and newest events: two reads per stream.
//! `check` reports the storage, the replicas, the server's message size
//! and the retention.
//!
//! # Format
//!
//! The format is version [`FORMAT_VERSION`], in the meta bucket's `format`
//! key and in every event header; a store of a newer format is refused.
//! Task values carry core's task value format.
//! The redemption bucket came without a new format version: releases
//! from before it never open it.
//!
//! # Limits
//!
//! A NATS server takes messages of at most `max_payload` bytes (1 MiB by
//! default). A payload, session state or task value larger than one
//! message allows is written first in chunks to `<prefix>-spill`, on a
//! subject of its own that names its owner, and the event, session or
//! task keeps a 44-byte reference to it. Removing the owner removes its
//! chunks; a value no owner refers to any more (an event the count limit
//! removed, a session written again, a crash between the chunks and the
//! owner) is removed by `purge_expired` once it is five minutes old. The
//! store's own payload limit (8 MiB by default) applies as everywhere.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod append;
mod error;
mod follow;
mod get;
mod inspect;
mod options;
mod purge;
mod redeem;
mod replay;
mod rewrite;
mod sessions;
mod setup;
mod spill;
mod state;
mod store;
mod tasks;
mod wire;

#[cfg(feature = "bench")]
pub mod bench;
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
