//! The Lua scripts. Each touches only the keys it is given, all under one
//! hash tag, so every call runs on one node and one slot.
//!
//! Stream entries have the fields `t` (the store clock's milliseconds when
//! stored, for age retention), `d` (the payload) and, if there is one, `r`
//! (the retry hint in milliseconds). The metadata hash has `sid` (the stream
//! id, checked against token collisions), `base` (the first id of this
//! incarnation of the stream), `last` (the newest id issued), `purged` (the
//! newest id removed by retention, if any), `bytes` (payload bytes retained)
//! and `head_t` (a lower bound of the oldest retained entry's `t`).

use std::sync::LazyLock;

use redis::Script;

/// Shared by the append and purge scripts: removes a stream's oldest entries
/// while a limit is exceeded. The age limit may remove every entry; the count
/// and byte limits never remove the newest. Entries are read in small,
/// growing batches (each payload is copied once, when it is removed) and the
/// work per call is capped by `budget`.
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
    local batch = redis.call('XRANGE', ev, '-', '+', 'COUNT', math.min(want, 8, budget - removed))
    if #batch == 0 then done = true; break end
    local ids = {}
    for _, e in ipairs(batch) do
      local t, size = entry_info(e)
      if not over(tonumber(t) or 0) then next_t = t; done = true; break end
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
/// max events or '', max bytes or '', TTL ms or '' (none: `PERSIST`), trim
/// budget. Returns the new entry id; or the id in a one-element array when
/// the stream had to start over because half of it was gone (the events key
/// or the metadata lost to eviction or a manual delete); or -1 when the
/// token belongs to another stream id.
///
/// `XADD NOMKSTREAM` detects a lost events key at no extra cost. The new
/// incarnation's ids start after the newest id the old one issued, and it
/// gets a new `base`, so cursors into the lost events are refused instead of
/// resuming across the hole. A stream created where `delete_stream` left a
/// `gone` marker likewise starts after the deleted stream's newest id, so
/// even within the same millisecond no id of the old stream is issued again
/// and a replay racing the delete sees a new `base`.
const APPEND: &str = r#"
local ev, meta = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'sid', 'bytes', 'head_t', 'last')
local sid = state[1]
if sid ~= false and sid ~= ARGV[1] then return -1 end
local size = #ARGV[2]
local fields = {'t', ARGV[4], 'd', ARGV[2]}
if ARGV[3] ~= '' then
  fields[5] = 'r'
  fields[6] = ARGV[3]
end
local id = false
local restarted = false
local floor = false
if sid ~= false then
  id = redis.call('XADD', ev, 'NOMKSTREAM', '*', unpack(fields))
  restarted = id == false
  floor = state[4]
elseif redis.call('EXISTS', ev) == 1 then
  local newest = redis.call('XREVRANGE', ev, '+', '-', 'COUNT', 1)
  if #newest > 0 then floor = newest[1][1] end
  redis.call('DEL', ev)
  restarted = true
end
if sid == false and not floor then
  floor = redis.call('GET', KEYS[3])
end
if id == false then
  if floor then
    -- An empty stream whose last id is the old one, so the new ids sort
    -- after every id the lost incarnation issued.
    redis.call('XADD', ev, 'MAXLEN', '0', floor, 't', '0')
  end
  id = redis.call('XADD', ev, '*', unpack(fields))
  redis.call('DEL', meta, KEYS[3])
  redis.call('HSET', meta, 'sid', ARGV[1], 'base', id, 'last', id, 'bytes', size, 'head_t', ARGV[4])
else
  local max_n, max_b = tonumber(ARGV[5]), tonumber(ARGV[6])
  local bytes = (tonumber(state[2]) or 0) + size
  local updates
  if max_n == nil and max_b == nil then
    updates = {'bytes', string.format('%d', bytes)}
  else
    local len = redis.call('XLEN', ev)
    local _, _, u = trim(ev, len, bytes, tonumber(state[3]) or 0, nil, max_n, max_b, tonumber(ARGV[8]))
    updates = u
  end
  redis.call('HSET', meta, 'last', id, unpack(updates))
end
if ARGV[7] == '' then
  redis.call('PERSIST', ev)
  redis.call('PERSIST', meta)
else
  redis.call('PEXPIRE', ev, ARGV[7])
  redis.call('PEXPIRE', meta, ARGV[7])
end
if restarted then return {id} end
return id
"#;

/// `purge_expired`, for one stream.
///
/// KEYS: events, meta. ARGV: age cut-off (clock ms) or '', max events or '',
/// max bytes or '', budget. Returns {removed, stream removed (0/1), more (0/1)}.
const PURGE: &str = r#"
local ev, meta = KEYS[1], KEYS[2]
local state = redis.call('HMGET', meta, 'sid', 'bytes', 'head_t')
if state[1] == false then return {0, 0, 0} end
local len = redis.call('XLEN', ev)
local removed, more, updates = trim(ev, len, tonumber(state[2]) or 0, tonumber(state[3]) or 0,
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
if redis.call('XLEN', ev) == 0 then
  redis.call('DEL', ev, meta)
  return {removed, 1, 0}
end
if removed > 0 or #updates > 2 then redis.call('HSET', meta, unpack(updates)) end
return {removed, 0, more and 1 or 0}
"#;

/// `delete_stream`. KEYS: events, meta, gone. ARGV: stream id, marker TTL
/// ms. Returns the number of events removed; a token held by another stream
/// id is left alone. Leaves the stream's newest id in `gone` for the TTL, so
/// a stream re-created under the same id continues after it.
const DELETE: &str = r#"
if redis.call('HGET', KEYS[2], 'sid') ~= ARGV[1] then return 0 end
local n = redis.call('XLEN', KEYS[1])
local last = redis.call('HGET', KEYS[2], 'last')
redis.call('DEL', KEYS[1], KEYS[2])
if last then redis.call('SET', KEYS[3], last, 'PX', ARGV[2]) end
return n
"#;

/// `delete_session`. KEYS: session. ARGV: session id, clock ms. Removes the
/// session even if expired; returns 1 if it existed and had not expired.
const SESSION_DELETE: &str = r#"
local s = redis.call('HMGET', KEYS[1], 'id', 'exp')
if s[1] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local exp = tonumber(s[2])
if exp ~= nil and exp > tonumber(ARGV[2]) then return 1 end
return 0
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

/// The compiled scripts (their SHA1s are computed once).
pub struct Scripts {
    /// See [`APPEND`].
    pub append: Script,
    /// See [`PURGE`].
    pub purge: Script,
    /// See [`DELETE`].
    pub delete: Script,
    /// See [`SESSION_DELETE`].
    pub session_delete: Script,
    /// See [`SESSION_PURGE`].
    pub session_purge: Script,
}

/// The scripts, shared by every store in the process.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    append: Script::new(&format!("{TRIM}\n{APPEND}")),
    purge: Script::new(&format!("{TRIM}\n{PURGE}")),
    delete: Script::new(DELETE),
    session_delete: Script::new(SESSION_DELETE),
    session_purge: Script::new(SESSION_PURGE),
});
