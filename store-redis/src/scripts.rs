//! The Lua scripts. Each touches only the keys it is given, all under one
//! hash tag, so every call runs on one node and one slot.
//!
//! Stream entries have the fields `t` (the store clock's milliseconds when
//! stored, for age retention), `d` (the payload) and, if there is one, `r`
//! (the retry hint in milliseconds). The metadata hash has `sid` (the stream
//! id, checked against token collisions), `base` (the first id of this
//! incarnation of the stream), `last` (the newest id issued), `purged` (the
//! newest id removed by retention, if any), `bytes` (payload bytes retained),
//! `head_t` (a lower bound of the oldest retained entry's `t`) and, until a
//! handle has checked the stream secret after creating it, `pending`. The
//! append script reads only `sid`, `bytes` and `pending` (and `last` when
//! the events key was lost), and writes `last` and `bytes` (and what a
//! trim changed). A stream's two keys always get their TTL together, in
//! the same script, so the events key's `PTTL` tells both.
//!
//! # Converging on one secret (C14)
//!
//! The stream secret lives in its own key, in another cluster slot than any
//! stream, so no script can read it. Instead a script says when it *created*
//! a stream (or a session): only then can the handle's cached secret be out
//! of date (the backend lost its data, and another handle may have created
//! a new secret since). A created stream carries `pending` until a handle
//! has checked the secret (`SET NX` of its cached secret, then `GET`):
//! every append to a pending stream, by any handle, reports it, so no event
//! in it is acknowledged before that check. If the secret matches, the
//! handle clears `pending` with [`CONFIRM`] (which also checks that its
//! entry still exists); if not, it adopts the stored secret, removes the
//! stream with [`DISCARD`] and appends again under the right token. Appends
//! to a stream that exists and is not pending cost nothing extra.

use std::sync::LazyLock;
use std::time::Duration;

use mcp_event_store_core::{Error, Result};
use redis::{
    Arg, Cmd, ErrorKind, FromRedisValue, RedisWrite, Script, ServerErrorKind, ToRedisArgs, Value,
};

use crate::RedisStore;
use crate::conn::check_replicas;
use crate::error::{NAME, backend};
use crate::options::{MAX_PEXPIRE_MS, TTL_SLACK_MAX};

/// Shared by the append and purge scripts: removes a stream's oldest entries
/// while a limit is exceeded. The age limit may remove every entry; the count
/// and byte limits never remove the newest. Entries are read in small,
/// growing batches, each with one entry more than it may remove: the entry
/// that stops the trim (its `t` becomes `head_t`) comes in the same read, so
/// an append at a stream's count limit reads once, not twice (measured with
/// `redis-benchmark` and `INFO commandstats` on Redis 7.0: 17.1 against
/// 15.0 us per append script). The work per call is capped by `budget`.
///
/// Takes the stream's length, retained bytes and `head_t` as the caller read
/// them, and returns what to write back rather than writing it, so each
/// script updates the metadata hash with a single `HSET`: the number
/// removed, whether the budget ran out with work left, and the `HSET`
/// field/value pairs (bytes, purged, head_t) to apply.
const TRIM: &str = r#"
local function entry_info(e)
  local f = e[2]
  local t, size = nil, 0
  for i = 1, #f, 2 do
    local name = f[i]
    if name == 't' then t = f[i + 1] elseif name == 'd' then size = #f[i + 1] end
  end
  return t, size
end

local function trim(ev, len, bytes, head_t, cutoff, max_n, max_b, budget)
  local updates = {'bytes', string.format('%d', bytes)}
  local function over(t)
    if len == 0 then return false end
    if cutoff ~= nil and t < cutoff then return true end
    if len < 2 then return false end
    return (max_n ~= nil and len > max_n) or (max_b ~= nil and bytes > max_b)
  end
  if budget == nil or budget < 1 or not over(head_t) then return 0, false, updates end
  local removed, last_id, next_t, done = 0, nil, nil, false
  local want = 1
  if max_n ~= nil and len > max_n then want = len - max_n end
  while not done and removed < budget do
    local n = math.min(want, 8, budget - removed)
    local batch = redis.call('XRANGE', ev, '-', '+', 'COUNT', n + 1)
    if #batch == 0 then done = true; break end
    local ids = {}
    for i, e in ipairs(batch) do
      local t, size = entry_info(e)
      if not over(tonumber(t) or 0) then next_t = t; done = true; break end
      if i > n then break end
      ids[#ids + 1] = e[1]
      last_id = e[1]
      len = len - 1
      bytes = bytes - size
      removed = removed + 1
    end
    if #ids > 0 then redis.call('XDEL', ev, unpack(ids)) end
    want = want * 2
  end
  updates[2] = string.format('%d', bytes)
  if last_id ~= nil then
    updates[#updates + 1] = 'purged'
    updates[#updates + 1] = last_id
  end
  if next_t ~= nil then
    updates[#updates + 1] = 'head_t'
    updates[#updates + 1] = next_t
  end
  return removed, (not done) and removed >= budget, updates
end
"#;

/// `store_event`: one round trip.
///
/// KEYS: events, meta, gone. ARGV: stream id, payload, retry ms or '', clock ms,
/// max events or '', max bytes or '', TTL ms or '' (none: no TTL), trim
/// budget, the TTL ms to set (the TTL plus its slack, see [`ttl_with_slack_ms`]) or
/// ''. Returns the new entry id when the stream existed and was checked;
/// `{id, state}` when the handle must check the stream secret before
/// answering, with `state` one of `new` (this call created the stream),
/// `restarted` (the stream had to start over because half of it was gone:
/// the events key or the metadata lost to eviction or a manual delete) or
/// `pending` (another handle created it and has not checked the secret
/// yet); or -1 when the token belongs to another stream id.
///
/// `XADD NOMKSTREAM` detects a lost events key at no extra cost. The new
/// incarnation's ids start after the newest id the old one issued, and it
/// gets a new `base`, so cursors into the lost events are refused instead of
/// resuming across the hole. A stream created where `delete_stream` left a
/// `gone` marker likewise starts after the deleted stream's newest id, so
/// even within the same millisecond no id of the old stream is issued again
/// and a replay racing the delete sees a new `base`.
///
/// An append to an existing stream runs five commands: `HMGET` of the
/// three fields it needs (`sid`, `bytes`, `pending`; `last` is read only
/// when the events key was lost), `XADD NOMKSTREAM`, `XLEN` (with a count
/// limit; without one, only when the byte limit is exceeded), one `HSET`
/// (`last`, `bytes` and what a trim changed) and `PTTL` of the events key.
/// The TTL is not set again on every append: both keys get the TTL plus a
/// slack, and are given it again only once `PTTL` shows less than the TTL
/// left, so at most once per slack. Each append thus leaves both keys at
/// least the TTL to live, as setting it every time did, and at most the
/// slack more. Without a TTL, `PERSIST` runs only when `PTTL` shows one (a
/// store opened before with an age limit).
///
/// What it costs the server (Redis 7.0, below the limits): this body run in
/// a loop inside one script, 7.4 us of the server's CPU per append, against
/// 10.9 us for the previous script (`HMGET` of five fields, `XLEN`, two
/// `PEXPIRE`s every time, the trim's bookkeeping every time) and 1.7 us for
/// a lone `XADD`; `XLEN` and `PTTL` are 0.8 us of the 7.4. As whole
/// `EVALSHA`s among other work each costs about twice its loop time. Every
/// `redis.call` costs far more than the work of a small command, so what
/// is left is the calls the guarantees need; keeping the count in the hash
/// instead of `XLEN` would save under half a microsecond, less the fields
/// it would need to stay right beside releases that do not keep it.
const APPEND: &str = r#"
local ev, meta = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'sid', 'bytes', 'pending')
local sid = state[1]
if sid ~= false and sid ~= ARGV[1] then return -1 end
local data, retry, now = ARGV[2], ARGV[3], ARGV[4]
local id = false
if sid ~= false then
  if retry == '' then
    id = redis.call('XADD', ev, 'NOMKSTREAM', '*', 't', now, 'd', data)
  else
    id = redis.call('XADD', ev, 'NOMKSTREAM', '*', 't', now, 'd', data, 'r', retry)
  end
end
local check = false
if id then
  -- The stream exists: the hot path.
  local bytes = (tonumber(state[2]) or 0) + #data
  local max_n, max_b = tonumber(ARGV[5]), tonumber(ARGV[6])
  local len = nil
  if max_n ~= nil then len = redis.call('XLEN', ev) end
  if (len ~= nil and len > max_n) or (max_b ~= nil and bytes > max_b) then
    if len == nil then len = redis.call('XLEN', ev) end
    local _, _, updates = trim(ev, len, bytes, 0, nil, max_n, max_b, tonumber(ARGV[8]))
    redis.call('HSET', meta, 'last', id, unpack(updates))
  else
    -- A Lua number goes to Redis as '%.17g': exact digits below 10^17.
    redis.call('HSET', meta, 'last', id, 'bytes', bytes)
  end
  if state[3] then check = 'pending' end
else
  local floor = false
  if sid ~= false then
    floor = redis.call('HGET', meta, 'last')
    check = 'restarted'
  else
    if redis.call('EXISTS', ev) == 1 then
      local newest = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
      if #newest > 0 then floor = newest[1][1] end
      redis.call('DEL', ev)
      check = 'restarted'
    else
      check = 'new'
    end
    if not floor then floor = redis.call('GET', KEYS[3]) end
  end
  if floor then
    -- An empty stream whose last id is the old one, so the new ids sort
    -- after every id the lost incarnation issued.
    redis.call('XADD', ev, 'MAXLEN', '0', floor, 't', '0')
  end
  if retry == '' then
    id = redis.call('XADD', ev, '*', 't', now, 'd', data)
  else
    id = redis.call('XADD', ev, '*', 't', now, 'd', data, 'r', retry)
  end
  redis.call('DEL', meta, KEYS[3])
  redis.call('HSET', meta, 'sid', ARGV[1], 'base', id, 'last', id, 'bytes', #data, 'head_t', now,
    'pending', '1')
end
-- Both keys always get their TTL together, so the events key's tells
-- both. -1: none.
local pttl = redis.call('PTTL', ev)
if ARGV[7] == '' then
  if pttl ~= -1 then
    redis.call('PERSIST', ev)
    redis.call('PERSIST', meta)
  end
elseif pttl < tonumber(ARGV[7]) then
  redis.call('PEXPIRE', ev, ARGV[9])
  redis.call('PEXPIRE', meta, ARGV[9])
end
if check then return {id, check} end
return id
"#;

/// After the stream secret checked out: clears `pending`, if the entry the
/// handle appended is still there. KEYS: events, meta. ARGV: entry id,
/// stream id. Returns 1, or 0 when the entry is gone (the backend lost its
/// data again since the append), and the handle appends once more.
const CONFIRM: &str = r#"
if redis.call('HGET', KEYS[2], 'sid') ~= ARGV[2] then return 0 end
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], 'pending')
return 1
"#;

/// After the stream secret turned out to have changed: removes a stream
/// created under the old secret's token, if still pending (nothing in it was
/// acknowledged). KEYS: events, meta. ARGV: stream id. Returns 1 if removed.
const DISCARD: &str = r#"
local m = redis.call('HMGET', KEYS[2], 'sid', 'pending')
if m[1] ~= ARGV[1] or not m[2] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"#;

/// `purge_expired`, for one stream.
///
/// KEYS: events, meta, gone. ARGV: age cut-off (clock ms) or '', max events
/// or '', max bytes or '', budget, marker TTL ms. Returns {removed, stream
/// removed (0/1), more (0/1)}. A stream that expired whole leaves its newest
/// id in `gone`, as `delete_stream` does, so a stream started again under
/// the same id (even within the same server millisecond) issues only later
/// ids.
const PURGE: &str = r#"
local ev, meta = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'sid', 'bytes', 'head_t', 'last')
if state[1] == false then return {0, 0, 0} end
local len = redis.call('XLEN', ev)
local removed, more, updates = trim(ev, len, tonumber(state[2]) or 0, tonumber(state[3]) or 0,
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
if redis.call('XLEN', ev) == 0 then
  redis.call('DEL', ev, meta)
  if state[4] then redis.call('SET', KEYS[3], state[4], 'PX', ARGV[5]) end
  return {removed, 1, 0}
end
if removed > 0 or #updates > 2 then redis.call('HSET', meta, unpack(updates)) end
return {removed, 0, more and 1 or 0}
"#;

/// `delete_stream`. KEYS: events, meta, gone. ARGV: stream id, marker TTL
/// ms. Returns the number of events removed, or -1 when there is no such
/// stream (the handle then checks its secret); a token held by another
/// stream id is left alone. Leaves the stream's newest id in `gone` for the
/// TTL, so a stream re-created under the same id continues after it.
const DELETE: &str = r#"
local m = redis.call('HMGET', KEYS[2], 'sid', 'last')
if m[1] == false then return -1 end
if m[1] ~= ARGV[1] then return 0 end
local n = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
if m[2] then redis.call('SET', KEYS[3], m[2], 'PX', ARGV[2]) end
return n
"#;

/// A stream's summary for statistics and listings, read-only. KEYS: events,
/// meta. Returns nil when there is no stream (or only half of one: its
/// metadata without a stream id), else `{sid, events, bytes, first t, last t}`,
/// the times `''` when no entry is retained. The oldest and newest entries
/// are read here, server-side, so only their `t` crosses the network.
const SUMMARY: &str = r#"
local m = redis.call('HMGET', KEYS[2], 'sid', 'bytes')
if m[1] == false then return false end
local n = redis.call('XLEN', KEYS[1])
local function t_of(entries)
  if #entries == 0 then return '' end
  local f = entries[1][2]
  for i = 1, #f, 2 do
    if f[i] == 't' then return f[i + 1] end
  end
  return ''
end
local first, last = '', ''
if n > 0 then
  first = t_of(redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1))
  last = t_of(redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1))
end
return {m[1], n, m[2] or '0', first, last}
"#;

/// `put_session`. KEYS: session. ARGV: session id, state, expiry (clock
/// ms), TTL ms or '' (none: `PERSIST`). Returns 1 when the handle must check
/// the stream secret (the session was created here, or is still pending),
/// else 0.
const SESSION_PUT: &str = r#"
local old = redis.call('HMGET', KEYS[1], 'id', 'pending')
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'd', ARGV[2], 'exp', ARGV[3])
local fresh = old[1] == false
if fresh then redis.call('HSET', KEYS[1], 'pending', '1') end
if ARGV[4] == '' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
if fresh or old[2] then return 1 end
return 0
"#;

/// After the secret checked out: clears a session's `pending`. KEYS:
/// session. ARGV: session id. Returns 0 if the session is gone.
const SESSION_CONFIRM: &str = r#"
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'pending')
return 1
"#;

/// After the secret changed: removes a session put under the old secret's
/// key, if still pending. KEYS: session. ARGV: session id.
const SESSION_DISCARD: &str = r#"
local s = redis.call('HMGET', KEYS[1], 'id', 'pending')
if s[1] ~= ARGV[1] or not s[2] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// `delete_session`. KEYS: session. ARGV: session id, clock ms. Removes the
/// session even if expired; returns 1 if it existed and had not expired, 2
/// if it had expired, -1 if there was none (the handle then checks its
/// secret).
const SESSION_DELETE: &str = r#"
local s = redis.call('HMGET', KEYS[1], 'id', 'exp')
if s[1] == false then return -1 end
if s[1] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local exp = tonumber(s[2])
if exp ~= nil and exp > tonumber(ARGV[2]) then return 1 end
return 2
"#;

/// Session expiry during `purge_expired`. KEYS: session. ARGV: clock ms.
/// Returns 1 if the session had expired by the store's clock and went.
const SESSION_PURGE: &str = r#"
local exp = tonumber(redis.call('HGET', KEYS[1], 'exp'))
if exp ~= nil and exp <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#;

/// A session's state swapped in place (C22). KEYS: session. ARGV: session
/// key (the digest's `s1.` form, checked against the `id` field), the
/// state expected, the new state (same length). Writes `d` only if it
/// holds exactly the state expected; `exp`, `pending` and the key's TTL
/// stay as they are (`HSET` keeps a TTL). Returns 1 when swapped, 0 when
/// the state is another (or the key holds another session), -1 when there
/// is no session (the handle then checks its secret, as a read does).
const SESSION_SWAP: &str = r#"
local s = redis.call('HMGET', KEYS[1], 'id', 'd')
if s[1] == false then return -1 end
if s[1] ~= ARGV[1] or s[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'd', ARGV[3])
return 1
"#;

/// `TaskStore::try_create`: insert if absent. KEYS: task. ARGV: value,
/// rev, backstop TTL ms or '' (none), '1' and the context (T13) or '0'.
/// Returns 1 when created, 0 when the key was taken (nothing changed).
const TASK_CREATE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'rev', ARGV[2])
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'c', ARGV[5]) end
if ARGV[3] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
"#;

/// One task mutation, compare-and-set on `rev` and the swap stamp `s`:
/// writes the new value only if the stored `rev` and `s` are still the
/// ones the handle read, sets the backstop TTL and publishes the change.
/// KEYS: task. ARGV: rev read, value, new rev, backstop TTL ms or ''
/// (none: `PERSIST`), channel, digest hex, '1' and the new context (T13)
/// or '0' to leave it, the swap stamp read ('' for none).
/// Returns 1 when written, 0 when the task changed (or went) meanwhile.
/// The context is a field of its own, `c`: a release from before contexts
/// writes only `v` and `rev`, and so leaves it as it is.
///
/// `s` counts the swaps of [`TASK_SWAP`], which rewrite `v` or `c` in
/// place without moving `rev` (C22): a step that read the task before a
/// swap would otherwise pass the `rev` check and write back the bytes the
/// swap replaced, undoing it. With the stamp checked too, that step fails
/// as after any change, and reads again.
const TASK_WRITE: &str = r#"
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[1] then return 0 end
if (redis.call('HGET', KEYS[1], 's') or '') ~= ARGV[9] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'rev', ARGV[3])
if ARGV[7] == '1' then redis.call('HSET', KEYS[1], 'c', ARGV[8]) end
if ARGV[4] == '' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
"#;

/// Deletes a task and publishes it. KEYS: task. ARGV: rev read, or ''
/// to delete whatever is stored; channel; digest hex. Returns 1 when
/// deleted, 0 when there was no task, -1 when its `rev` moved on.
const TASK_DELETE: &str = r#"
local rev = redis.call('HGET', KEYS[1], 'rev')
if rev == false then return 0 end
if ARGV[1] ~= '' and rev ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"#;

/// A task's value swapped in place (C22). KEYS: task. ARGV: the hash
/// field (`v`, the encoded task, or `c`, its context), the bytes expected
/// there, the new bytes (same length). Writes only if the field holds
/// exactly the bytes expected, and then bumps the swap stamp `s`, which
/// [`TASK_WRITE`] checks beside `rev`; `rev`, the other fields and the
/// key's TTL stay as they are (`HSET` and `HINCRBY` keep a TTL), and
/// nothing is published: no reader or watcher sees a change. Returns 1
/// when swapped, 0 when the field holds other bytes (or the task went).
const TASK_SWAP: &str = r#"
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[1], 's', 1)
return 1
"#;

/// `RuntimeStore::heartbeat`. KEYS: instance. ARGV: clock ms now, new
/// deadline (clock ms), backstop TTL ms. A deadline already past by the
/// store's clock is a lapsed instance, never revived: returns 0 and
/// changes nothing; else stores the deadline and returns 1.
const INSTANCE_BEAT: &str = r#"
local old = redis.call('GET', KEYS[1])
if old and tonumber(old) <= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"#;

/// Forgets an instance lapsed by the store's clock. KEYS: instance. ARGV:
/// clock ms now. Returns 1 if it went.
const INSTANCE_FORGET: &str = r#"
local old = redis.call('GET', KEYS[1])
if old and tonumber(old) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#;

/// A script and its source. A node that does not know the script yet (it
/// restarted, was promoted, or joined the cluster) gets it by `EVAL` of the
/// source on the one call that found it missing, sent where the call's keys
/// live: the redis crate's own fallback sends `SCRIPT LOAD` to every node
/// of a cluster, replicas included, and waits for a node that does not
/// answer until the response timeout.
pub struct Lua {
    source: String,
    hash: String,
}

impl Lua {
    fn new(source: String) -> Self {
        let hash = Script::new(&source).get_hash().to_owned();
        Self { source, hash }
    }

    /// A call of this script, to which keys and arguments are added.
    pub fn call(&self) -> Call<'_> {
        Call {
            lua: self,
            keys: 0,
            body: Cmd::new(),
        }
    }
}

/// A script call being built: keys, then arguments, written straight into
/// one buffer (a [`Cmd`] of the keys and arguments alone), which [`cmd`]
/// copies once behind `EVALSHA <sha1> <numkeys>`: no buffer per argument,
/// which an append's client side spent a tenth of its time on.
///
/// [`cmd`]: Call::cmd
pub struct Call<'a> {
    lua: &'a Lua,
    keys: usize,
    body: Cmd,
}

impl Call<'_> {
    /// Adds a key (`KEYS[i]`). Keys come before every argument.
    pub fn key(mut self, key: impl ToRedisArgs) -> Self {
        let before = self.body.args_iter().len();
        debug_assert_eq!(before, self.keys, "a key after an argument");
        self.body.arg(key);
        self.keys = self.body.args_iter().len();
        self
    }

    /// Adds an argument (`ARGV[i]`).
    pub fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.body.arg(arg);
        self
    }

    /// `EVALSHA <sha1> ...`, or `EVAL <source> ...` when `by_source`.
    pub fn cmd(&self, by_source: bool) -> Cmd {
        let (name, script) = if by_source {
            ("EVAL", &self.lua.source)
        } else {
            ("EVALSHA", &self.lua.hash)
        };
        let parts = self.body.args_iter();
        let size = parts
            .clone()
            .map(|part| match part {
                Arg::Simple(bytes) => bytes.len(),
                _ => 0,
            })
            .sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + parts.len(), name.len() + script.len() + 20 + size);
        cmd.arg(name).arg(script).arg(self.keys);
        for part in parts {
            if let Arg::Simple(bytes) = part {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

/// The scripts (their SHA1s are computed once).
pub struct Scripts {
    /// See [`APPEND`].
    pub append: Lua,
    /// See [`CONFIRM`].
    pub confirm: Lua,
    /// See [`DISCARD`].
    pub discard: Lua,
    /// See [`PURGE`].
    pub purge: Lua,
    /// See [`DELETE`].
    pub delete: Lua,
    /// See [`SUMMARY`].
    pub summary: Lua,
    /// See [`SESSION_PUT`].
    pub session_put: Lua,
    /// See [`SESSION_CONFIRM`].
    pub session_confirm: Lua,
    /// See [`SESSION_DISCARD`].
    pub session_discard: Lua,
    /// See [`SESSION_DELETE`].
    pub session_delete: Lua,
    /// See [`SESSION_PURGE`].
    pub session_purge: Lua,
    /// See [`SESSION_SWAP`].
    pub session_swap: Lua,
    /// See [`TASK_CREATE`].
    pub task_create: Lua,
    /// See [`TASK_WRITE`].
    pub task_write: Lua,
    /// See [`TASK_DELETE`].
    pub task_delete: Lua,
    /// See [`TASK_SWAP`].
    pub task_swap: Lua,
    /// See [`INSTANCE_BEAT`].
    pub instance_beat: Lua,
    /// See [`INSTANCE_FORGET`].
    pub instance_forget: Lua,
}

/// The scripts, shared by every store in the process.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    append: Lua::new(format!("{TRIM}\n{APPEND}")),
    confirm: Lua::new(CONFIRM.to_owned()),
    discard: Lua::new(DISCARD.to_owned()),
    purge: Lua::new(format!("{TRIM}\n{PURGE}")),
    delete: Lua::new(DELETE.to_owned()),
    summary: Lua::new(SUMMARY.to_owned()),
    session_put: Lua::new(SESSION_PUT.to_owned()),
    session_confirm: Lua::new(SESSION_CONFIRM.to_owned()),
    session_discard: Lua::new(SESSION_DISCARD.to_owned()),
    session_delete: Lua::new(SESSION_DELETE.to_owned()),
    session_purge: Lua::new(SESSION_PURGE.to_owned()),
    session_swap: Lua::new(SESSION_SWAP.to_owned()),
    task_create: Lua::new(TASK_CREATE.to_owned()),
    task_write: Lua::new(TASK_WRITE.to_owned()),
    task_delete: Lua::new(TASK_DELETE.to_owned()),
    task_swap: Lua::new(TASK_SWAP.to_owned()),
    instance_beat: Lua::new(INSTANCE_BEAT.to_owned()),
    instance_forget: Lua::new(INSTANCE_FORGET.to_owned()),
});

/// A limit as a script argument: its decimal value, or `''` for none.
pub(crate) fn optional(limit: Option<u64>) -> String {
    limit.map(|l| l.to_string()).unwrap_or_default()
}

/// A number as a script argument, or `''` for none, written straight into
/// the command (what [`optional`] makes, without a `String` of its own).
pub(crate) struct OrEmpty<T>(pub(crate) Option<T>);

impl<T: ToRedisArgs> ToRedisArgs for OrEmpty<T> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        match &self.0 {
            Some(value) => value.write_redis_args(out),
            None => out.write_arg(b""),
        }
    }
}

/// The real-time TTL that backs up age retention: `max_age` in ms (at least
/// 1, since `PEXPIRE 0` deletes at once), or `None` for no TTL.
pub(crate) fn ttl_ms(max_age: Option<Duration>) -> Option<u64> {
    match max_age.map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)) {
        Some(ms) if ms <= MAX_PEXPIRE_MS => Some(ms.max(1)),
        _ => None,
    }
}

/// [`ttl_ms`] as a script argument, `''` for no TTL.
pub(crate) fn ttl_arg(max_age: Option<Duration>) -> String {
    optional(ttl_ms(max_age))
}

/// What the append script's `PEXPIRE` sets: [`ttl_ms`] plus a slack of
/// 1/16 of it, at most [`TTL_SLACK_MAX`]. The script sets it again only
/// once less than [`ttl_ms`] is left, so an idle stream's keys go between
/// `max_age` and `max_age` plus the slack after its last append, and a
/// busy stream pays for two `PEXPIRE`s at most once per slack instead of
/// on every append.
pub(crate) fn ttl_with_slack_ms(max_age: Option<Duration>) -> Option<u64> {
    let slack_max = u64::try_from(TTL_SLACK_MAX.as_millis()).unwrap_or(u64::MAX);
    ttl_ms(max_age).map(|ms| ms + (ms / 16).min(slack_max))
}

/// Running the scripts.
impl RedisStore {
    /// Runs `call`, followed in the same round trip by `WAIT` when `wait`
    /// and appends wait for replicas (on the same connection and, on a
    /// cluster, on the same master: a pipeline goes where its first key
    /// lives). By `EVALSHA`; if the node does not know the script (it
    /// restarted, was promoted, or `SCRIPT FLUSH`), once more by `EVAL` of
    /// the source (the script did not run, so nothing is done twice).
    /// Returns the script's reply and, with `WAIT`, how many replicas
    /// acknowledged.
    pub(crate) async fn run(&self, call: &Call<'_>, wait: bool) -> Result<(Value, Option<u32>)> {
        let wait = self.wait().filter(|_| wait);
        let mut conn = self.conn();
        let mut by_source = false;
        loop {
            let result = match wait {
                Some((replicas, ms)) => {
                    let mut pipe = redis::pipe();
                    pipe.add_command(call.cmd(by_source));
                    pipe.cmd("WAIT").arg(replicas).arg(ms);
                    pipe.query_async::<(Value, u32)>(&mut conn)
                        .await
                        .map(|(reply, acked)| (reply, Some(acked)))
                }
                // A lone command, not a pipeline of one: the client side
                // of an append is a good part of its cost.
                None => call
                    .cmd(by_source)
                    .query_async::<Value>(&mut conn)
                    .await
                    .map(|reply| (reply, None)),
            };
            match result {
                Err(e)
                    if !by_source && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    by_source = true;
                }
                other => return other.map_err(backend),
            }
        }
    }

    /// Runs `call` (never followed by `WAIT`) and converts its reply.
    pub(crate) async fn invoke<T: FromRedisValue>(&self, call: Call<'_>) -> Result<T> {
        let (reply, _) = self.run(&call, false).await?;
        T::from_redis_value(reply).map_err(|e| Error::backend(NAME, e))
    }

    /// Fails a write that `WAIT` says too few replicas hold.
    pub(crate) fn check_wait(&self, acked: Option<u32>, what: &str) -> Result<()> {
        match (self.wait(), acked) {
            (Some((replicas, ms)), Some(acked)) => check_replicas(acked, replicas, ms, what),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_arguments() {
        assert_eq!(ttl_arg(None), "");
        assert_eq!(ttl_arg(Some(Duration::ZERO)), "1");
        assert_eq!(ttl_arg(Some(Duration::from_secs(60))), "60000");
        assert_eq!(ttl_arg(Some(Duration::MAX)), "");
        assert_eq!(ttl_with_slack_ms(None), None);
        assert_eq!(ttl_with_slack_ms(Some(Duration::ZERO)), Some(1));
        assert_eq!(
            ttl_with_slack_ms(Some(Duration::from_millis(160))),
            Some(170)
        );
        assert_eq!(
            ttl_with_slack_ms(Some(Duration::from_secs(60))),
            Some(61_000)
        );
        assert_eq!(
            ttl_with_slack_ms(Some(Duration::from_secs(3600))),
            Some(3_601_000)
        );
        assert_eq!(ttl_with_slack_ms(Some(Duration::MAX)), None);
        assert_eq!(optional(None), "");
        assert_eq!(optional(Some(5)), "5");
    }

    #[test]
    fn calls_name_the_script_by_hash_or_by_source() {
        let call = SCRIPTS.delete.call().key("k").arg("a").arg(5u64);
        let by_hash = call.cmd(false).get_packed_command();
        let by_source = call.cmd(true).get_packed_command();
        let text = |packed: &[u8]| String::from_utf8_lossy(packed).into_owned();
        assert!(text(&by_hash).contains("EVALSHA"));
        assert!(text(&by_hash).contains(&SCRIPTS.delete.hash));
        assert!(text(&by_source).contains("redis.call('HMGET', KEYS[2], 'sid', 'last')"));
        assert!(text(&by_source).ends_with("$1\r\n1\r\n$1\r\nk\r\n$1\r\na\r\n$1\r\n5\r\n"));
    }
}
