//! Sealed values for **mcp-event-store**: a decorator over any store that
//! encrypts every payload it keeps.
//!
//! A shared store holds what an MCP server must not leak: tool arguments
//! and results in events and task outcomes, elicitation requests and the
//! user's answers, session state, task contexts and checkpoints. Whoever
//! reads the database, a dump or a backup reads them too. [`Sealed`] wraps
//! a store (any backend, or the `Arc<dyn Store>` that `connect` hands out)
//! so that each of those values is kept sealed: encrypted and
//! authenticated under a key the store never sees, and bound to the place
//! it was written to.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> mcp_event_store_core::Result<()> {
//! use std::sync::Arc;
//! use futures_util::TryStreamExt;
//! use mcp_event_store_core::{EventStore, MemoryStore, NewEvent, StoreOptions, Store};
//! use mcp_event_store_sealed::{KeyRing, Sealed, headroom};
//!
//! // In production: KeyRing::from_env(KEYS_ENV), "2:<base64>,1:<base64>".
//! let keys: KeyRing = format!("1:{}", *KeyRing::generate_key()?).parse()?;
//! // The store underneath, opened with room for the envelope (connect_with
//! // takes the same options), so callers keep the payload limit they set.
//! let plain = Arc::new(MemoryStore::with_options(headroom(StoreOptions::default())));
//! let store: Arc<dyn Store> = Arc::new(Sealed::new(plain.clone(), keys));
//!
//! let first = store.store_event("call-1", NewEvent::new(b"{\"result\":42}")).await?;
//! store.store_event("call-1", NewEvent::new(b"{\"secret\":true}")).await?;
//! let replay = store.replay_events_after(&first.to_string()).await?;
//! let events: Vec<_> = replay.events.try_collect().await?;
//! assert_eq!(&events[0].data[..], b"{\"secret\":true}");
//!
//! // The store itself holds only the envelope.
//! let raw: Vec<_> = plain.replay_events_after(&first.to_string()).await?.events.try_collect().await?;
//! assert!(!raw[0].data.windows(6).any(|w| w == b"secret"));
//! # Ok(()) }
//! ```
//!
//! # What is sealed, and what stays plaintext
//!
//! Sealed, each value on its own, with its place as associated data:
//!
//! | value | bound to |
//! |---|---|
//! | an event's data (priming events' empty data included) | its stream id |
//! | a bus message ([`StoreBus`](mcp_event_store_core::bus::StoreBus) over the decorator, [`Sealed::bus`]) | its topic (a topic is a stream) |
//! | a session's state | the digest of its session id (the key the store keeps it under, C20) |
//! | a task's context (tool name and arguments) | the task's digest and the field |
//! | a task's outcome (result or error) | the task's digest and the field |
//! | a task's checkpoint | the task's digest and the field |
//! | an input request (elicitation, sampling) | the task's digest, the field and the input key |
//! | an input response (the user's answer) | the task's digest, the field and the input key |
//!
//! Plaintext, because queries, retention, the state machine or the
//! protocol need them, or because the store writes them itself:
//!
//! * **ids**: stream ids (and so bus topics), event ids, session ids, task
//!   digests (an unkeyed digest of a random 128-bit id), instance ids,
//!   input keys;
//! * **owners**: the owner digest of a task (an unkeyed digest of the
//!   principal: whoever can guess a principal can confirm it owns a task);
//! * **times and sizes**: event, session and task times, ttls, poll
//!   intervals, retry hints, event counts and byte counts (of the sealed
//!   bytes, see below);
//! * **task state**: status, revision, cancel flag, takeover counters
//!   (attempts, epoch, released), the instance running it;
//! * **short texts the protocol shows the client**: a task's status
//!   message and the reason given with a cancel (at most 4 KiB each, UTF-8
//!   text the stores keep as text). Keep secrets out of them;
//! * **what the store writes itself**: a task the store fails as expired or
//!   lost carries the fixed error [`EXPIRED_ERROR`](mcp_event_store_core::task::EXPIRED_ERROR)
//!   or [`INSTANCE_LOST_ERROR`](mcp_event_store_core::task::INSTANCE_LOST_ERROR)
//!   as its outcome, in plaintext; the decorator accepts exactly these two
//!   on a `failed` task and nothing else unsealed;
//! * **redemptions** (single use of a nonce): the store keeps only a digest
//!   of the principal and the nonce, nothing to seal.
//!
//! # The envelope
//!
//! Every sealed value is `version (1 byte) ‖ key id (4 bytes, big-endian)
//! ‖ nonce (24 bytes) ‖ ciphertext ‖ tag (16 bytes)`: [`OVERHEAD`], 45
//! bytes, whatever the value. The version byte is `0xF1`, which never
//! starts UTF-8 text, so a plaintext value (JSON, say) read through the
//! decorator is told from an envelope; bytes `0xF2` to `0xFF` are kept
//! for later formats, refused as
//! [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat).
//! [`shape`] reads the header without a key.
//!
//! The associated data is a domain string, the envelope's header and the
//! place, each part length-prefixed: the value's stream id, session id, or
//! task digest, field and input key. A value copied to another stream,
//! session, task, field or input key fails to open.
//!
//! **Within one stream, events are not bound to their position.** An
//! event's id is assigned by the store after the write (it carries the
//! stream's sequence), so it cannot be part of what was sealed before the
//! write. Whoever can write the database can therefore reorder, repeat or
//! drop a stream's events without the decorator noticing (it can drop or
//! reorder whole rows of any table, too); what it cannot do is read them,
//! alter them, or move one into another stream. Binding positions would
//! need an id the writer knows before the append (a store-side sequence
//! handed out first, or a chain over the previous event's tag, which
//! retention's purges would break).
//!
//! **Empty values are sealed too**, priming events (C7) included: an empty
//! stored value would otherwise be a valid value of every place, and a
//! writer could blank any event out unnoticed. Clients see no difference
//! (replays open them back to empty data, retry hint and id unchanged);
//! each costs [`OVERHEAD`] bytes of storage.
//!
//! # Why XChaCha20-Poly1305 with random nonces
//!
//! Many server instances seal under one key at once, with no counter they
//! could share. XChaCha20-Poly1305's 192-bit nonces can be drawn at random
//! for every value (the chance of a repeat stays negligible far beyond any
//! store's lifetime), where AES-GCM's 96-bit nonces allow about 2^32
//! random ones per key before a repeat, which breaks it, becomes a real
//! risk. It is fast in software on every CPU, constant-time without AES
//! instructions, and RustCrypto's `chacha20poly1305` is pure Rust. The
//! cost is 45 bytes per value and about 2 µs per 200-byte value sealed or
//! opened (0.7 µs built with `-C target-cpu=native`): appends 1.03x to
//! 1.2x on the persistent backends, replays of 100 events 1.7x to 5x (the
//! crate's README and the performance report have the figures).
//!
//! # Keys and rotation
//!
//! A [`KeyRing`] holds numbered keys: the current one seals every value
//! written, the others only open older values. A rotation has three steps:
//!
//! 1. **Add the new key first** (`3:<new>,2:<old>`) on every instance and
//!    restart them: from then on every value written is sealed under key
//!    3, and older ones still open.
//! 2. **Re-seal what is stored**, while the servers run:
//!    `mcp-event-store keys URL --rewrite` ([`rotate::reseal`]) walks the
//!    store a bounded page at a time and seals each value under an older
//!    key again under the current one, swapping it in only if the store
//!    still holds the bytes it read (C22): a server's write in between
//!    wins, and is already under the new key. Run it again until it
//!    reports nothing re-sealed; `keys URL` ([`scan::key_usage`]) then
//!    counts nothing under the old key.
//! 3. **Drop the old key** from every instance's ring.
//!
//! What the rewrite covers, per backend:
//!
//! * **sessions and tasks** (context, outcome, checkpoint, input requests
//!   and responses) on every backend: a swap keeps a session's expiry and
//!   a task's status, revision, instance and claim, so no client or
//!   worker sees a change;
//! * **events** on SQLite, PostgreSQL, sled and memory, in place (same id,
//!   time and retry hint). Redis streams and NATS JetStream keep events in
//!   append-only logs that cannot be changed in place: there the rewrite
//!   counts the events still under older keys, which leave with
//!   retention, at the latest the store's `max_age` after the newest of
//!   them (`keys URL` shows when). Keep the old key until then.
//!
//! A value that does not open with the ring given to the rewrite (a key
//! it lacks, damage) is counted and left as it is.
//!
//! # Payload limits
//!
//! The store underneath checks its limits on the sealed bytes, so the
//! plaintext a caller may give is [`OVERHEAD`] (45) bytes less, and a
//! refusal says so exactly: [`Error::PayloadTooLarge`](mcp_event_store_core::Error::PayloadTooLarge)
//! with the caller's size and the plaintext limit (the store's limit less
//! [`OVERHEAD`]), storing nothing.
//!
//! * Events, bus messages, session state and task outcomes are limited by
//!   the store's `max_payload_bytes`: open the store with [`headroom`] and
//!   callers keep exactly the limit they configured.
//! * Task contexts, checkpoints, input requests and responses have fixed
//!   limits in core (1 MiB each, `MAX_CONTEXT_BYTES` and friends), which
//!   no option raises: through the decorator each is 1 MiB less 45 bytes.
//! * Retention's `max_bytes_per_stream`, and the byte counts of `stats`
//!   and `list_streams`, count what the store holds: each event's data
//!   plus [`OVERHEAD`]. A stream of 200-byte events holds about 18% fewer
//!   of them under the same byte limit.
//!
//! # Errors
//!
//! Opening never panics, whatever the stored bytes, and a value that does
//! not open fails that read only (other values, streams, sessions and
//! tasks read as before):
//!
//! | stored value | error |
//! |---|---|
//! | not an envelope (written without the decorator) | [`Error::Corrupt`](mcp_event_store_core::Error::Corrupt), "… is not sealed …" |
//! | shorter than an envelope | `Corrupt`, "… truncated …" |
//! | altered, sealed under another key with the same id, or moved from another place | `Corrupt`, "… fails authentication under key id N …" |
//! | sealed under a key id the ring lacks | [`Error::Config`](mcp_event_store_core::Error::Config), naming the id |
//! | a later envelope format | [`Error::IncompatibleFormat`](mcp_event_store_core::Error::IncompatibleFormat) |
//!
//! Messages name the kind of value (an event, a session's state, a task's
//! context), never an id (a session id is a credential) nor a value. A
//! replay or follow ends with the first event that fails to open, as it
//! ends on a backend error: no event is skipped silently. A claimed task
//! whose values do not open is released for another instance (see
//! [`Sealed`]'s `claim`).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod envelope;
mod keys;
pub mod rotate;
pub mod scan;
mod store;

pub use envelope::{HEADER_BYTES, NONCE_BYTES, OVERHEAD, Shape, TAG_BYTES, VERSION, shape};
pub use keys::{KEY_BYTES, KEYS_ENV, KeyId, KeyRing};
pub use store::{Sealed, headroom};
