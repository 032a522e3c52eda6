//! Every statement the store runs, as templates whose `{s}` becomes the
//! quoted schema once, when the store opens. Client input only ever travels
//! as bound parameters.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// Appends events of distinct streams, one or many, in one statement (see
/// the crate docs, "Durability", and [`crate::append`]). For each event,
/// the upsert takes the stream row's lock and yields the new sequence
/// number, and the event is inserted in the same statement, so both commit
/// together. Stream rows are locked in token order, as every statement
/// that locks several stream rows does, so no two of them deadlock.
/// `first_seq` moves past events that the count and byte limits drop
/// (retention applied logically at once; rows go in `purge_expired`).
///
/// A new stream row takes its incarnation from the `incarnations`
/// sequence (see `migrations/0002_incarnations.sql`). The value is drawn
/// for every event, since PostgreSQL builds the row it proposes before it
/// finds the conflict; an existing row keeps its own.
///
/// The statement does not `NOTIFY`: a transaction that notifies holds a
/// cluster-wide lock from its commit's start until its WAL is flushed, so
/// durable commits that notify cannot share a flush (see [`NOTIFY`]).
///
/// The byte limit reads no event while the stream's lifetime bytes
/// (`total_bytes`, this event included) are within it, since what it
/// retains is at most that: nearly every stream, whose whole life is under
/// the limit (64 MiB by default). That saved about 110 of 620 us of server
/// CPU per 32-event batch (`log_statement_stats` over `pgbench -M
/// prepared`, 2,000 batches, medians of two runs each). Past that, it
/// probes the oldest retained event by its full key (`seq = first_seq`):
/// while the stream is within the limit, which is nearly always, that
/// event already satisfies it and the range search never runs. The range search (`seq >= first_seq .. ORDER BY seq LIMIT
/// 1`) is cheap only as an ordered primary-key scan that stops at its
/// first row, and PostgreSQL does not always plan it so: on a
/// schema without statistics (autovacuum off or behind, a fresh store), a
/// connection caches the generic plan it makes at the statement's sixth
/// run, while the table is small, and that plan was seen to be a bitmap
/// scan of every retained event of the stream plus a sort, for every
/// append. Measured with `auto_explain` under 32 writers: 7,536 buffers
/// and 11 ms (median) per 32-event batch, growing with the streams, 0.2
/// to 0.4x raw inserts; the probe by full key is a unique-index lookup
/// whatever the statistics.
///
/// $1 tokens, $2 stream ids, $3 payload lengths, $4 now (ms), $5 retries
/// (ms), $6 payloads (arrays, one element per event); $7 max events, $8 max
/// bytes. Returns `(token, incarnation, seq)` for each event stored; a token
/// missing belongs to another stream id.
pub(crate) const APPEND: &str = r#"
WITH i AS (
    SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::int8[], $5::int8[],
                         $6::bytea[])
        AS i(token, stream_id, len, stored_at, retry_ms, data)
), s AS (
    INSERT INTO {s}.streams AS st
        (token, stream_id, incarnation, first_seq, last_seq, clean_seq, total_bytes, last_stored_at)
    SELECT token, stream_id, nextval('{s}.incarnations'), 1, 1, 1, len, stored_at
      FROM i ORDER BY token
{upsert}), ins AS (
    INSERT INTO {s}.events (token, seq, stored_at, cum_bytes, retry_ms, data)
    SELECT s.token, s.last_seq, i.stored_at, s.total_bytes - i.len, i.retry_ms, i.data
      FROM s JOIN i ON i.token = s.token
)
SELECT token, incarnation, last_seq FROM s
"#;

/// [`APPEND`] for one event, its parameters the same but each a single
/// value rather than an array: what a lone append runs. The server does
/// less for it (no arrays to build and unnest, no sort, no join): under one
/// writer, `log_statement_stats` gave 15 µs of server CPU to bind it and
/// 102 µs to execute it (medians), against 20 and 145 µs for [`APPEND`]
/// with one-element arrays; the lone append went from 0.76 to 0.81x of a
/// raw insert to 0.83 to 0.88x (`postgres_append_pairs` in the benches).
pub(crate) const APPEND_ONE: &str = r#"
WITH s AS (
    INSERT INTO {s}.streams AS st
        (token, stream_id, incarnation, first_seq, last_seq, clean_seq, total_bytes, last_stored_at)
    VALUES ($1, $2, nextval('{s}.incarnations'), 1, 1, 1, $3, $4)
{upsert}), ins AS (
    INSERT INTO {s}.events (token, seq, stored_at, cum_bytes, retry_ms, data)
    SELECT s.token, s.last_seq, $4, s.total_bytes - $3, $5, $6 FROM s
)
SELECT token, incarnation, last_seq FROM s
"#;

/// How both append statements move an existing stream row: the next
/// sequence number, the running byte count, and `first_seq` past what the
/// count and byte limits drop. `EXCLUDED` is the row proposed for the
/// event; `$7` and `$8` are the limits.
const APPEND_UPSERT: &str = r#"    ON CONFLICT (token) DO UPDATE SET
        last_seq = st.last_seq + 1,
        total_bytes = st.total_bytes + EXCLUDED.total_bytes,
        last_stored_at = GREATEST(st.last_stored_at, EXCLUDED.last_stored_at),
        first_seq = GREATEST(
            st.first_seq,
            st.last_seq + 2 - $7::int8,
            CASE WHEN $8::int8 IS NULL THEN NULL
                 WHEN st.total_bytes + EXCLUDED.total_bytes <= $8::int8
                 THEN st.first_seq
                 WHEN (SELECT e.cum_bytes FROM {s}.events e
                        WHERE e.token = st.token AND e.seq = st.first_seq)
                      >= st.total_bytes + EXCLUDED.total_bytes - $8::int8
                 THEN st.first_seq
                 ELSE LEAST(st.last_seq + 1, COALESCE(
                (SELECT e.seq FROM {s}.events e
                  WHERE e.token = st.token AND e.seq >= st.first_seq
                    AND e.cum_bytes >= st.total_bytes + EXCLUDED.total_bytes - $8::int8
                  ORDER BY e.seq LIMIT 1),
                CASE WHEN EXISTS (SELECT 1 FROM {s}.events e
                                   WHERE e.token = st.token AND e.seq = st.last_seq)
                     THEN st.last_seq + 1 ELSE st.first_seq END)) END)
    WHERE st.stream_id = EXCLUDED.stream_id
    RETURNING st.token, st.incarnation, st.last_seq, st.total_bytes
"#;

/// Announces appended streams to every handle listening on the store's
/// channel `{c}` (see [`crate::follow`]), after their appends committed:
/// one notification per stream, its token in hex. Sent only while another
/// handle listens ([`crate::follow::Listeners`]).
///
/// It runs in a transaction of its own, not in the append's. PostgreSQL
/// serializes the commits of notifying transactions cluster-wide (a lock
/// taken before the commit record and held until the commit is flushed),
/// so a `pg_notify` inside the durable append transaction makes concurrent
/// appends wait for each other's WAL flush one by one. Measured here with
/// pgbench, 32 clients each inserting a row: 5,500 to 7,500 commits/s
/// without `NOTIFY`, 335 to 750 with `pg_notify` in the same statement.
/// This transaction writes nothing, and `synchronous_commit` is off for
/// it alone (`set_config(.., true)`), so it never waits for a flush while
/// holding that lock.
///
/// $1 the tokens (hex text).
pub(crate) const NOTIFY: &str = r#"
SELECT set_config('synchronous_commit', 'off', true), pg_notify('{c}', t)
  FROM unnest($1::text[]) t
"#;

/// One replay page and, in one snapshot, the stream's state: event rows
/// (seq set) and one header row (seq null) with the stream's incarnation,
/// first/last seq and, when $4, the stream id. No header row: the stream
/// does not exist. Events come only from incarnation $5: once a stream is
/// started again, a cursor of its earlier life reads nothing of the new one
/// (the header says which incarnation the stream is in).
///
/// The event branch sees its inputs only through sub-selects (the token,
/// the cursor merged with `first_seq`, the limit), so a custom plan is
/// estimated exactly like the generic one and PostgreSQL keeps the cached
/// generic plan from the sixth execution of the prepared statement on
/// (the same index range scan). With the values visible, a short replay's
/// custom plan always looked cheaper, so every replay was planned afresh:
/// 50 to 90 us of planning per call on top of 10 to 20 us of execution.
///
/// The incarnation, like the cursor, stays inside the lower bound's
/// sub-select, so the plan is unchanged.
///
/// $1 token, $2 after seq, $3 limit, $4 want stream id, $5 incarnation.
pub(crate) const PAGE: &str = r#"
(SELECT e.seq, e.retry_ms, e.data, NULL::int8 AS incarnation,
        NULL::int8 AS first_seq, NULL::int8 AS last_seq, NULL::bytea AS stream_id
   FROM {s}.events e
  WHERE e.token = (SELECT $1::bytea)
    AND e.seq > (SELECT GREATEST($2::int8, st.first_seq - 1)
                   FROM {s}.streams st WHERE st.token = $1 AND st.incarnation = $5::int8)
  ORDER BY e.seq
  LIMIT (SELECT $3::int8))
UNION ALL
SELECT NULL, NULL, NULL, st.incarnation, st.first_seq, st.last_seq,
       CASE WHEN $4 THEN st.stream_id END
  FROM {s}.streams st
 WHERE st.token = $1
"#;

/// A stream's id and state, for a lookup to check an event id against
/// (`DenseStream::retains`). $1 token.
const LOOKUP: &str = r#"
SELECT stream_id, incarnation, first_seq, last_seq FROM {s}.streams WHERE token = $1
"#;

/// Empties a stream logically (its rows go in bounded batches afterwards)
/// and returns its state from before. It locks one stream row, so it needs
/// no lock order. $1 token, $2 stream id.
const DELETE_MARK: &str = r#"
UPDATE {s}.streams st SET first_seq = st.last_seq + 1
  FROM (SELECT token, first_seq FROM {s}.streams
         WHERE token = $1 AND stream_id = $2 FOR UPDATE) old
 WHERE st.token = old.token
RETURNING old.first_seq, st.last_seq, st.clean_seq, st.incarnation
"#;

/// One bounded batch of retention work over several streams: raises each
/// stream's `first_seq` (logical removal) and deletes the rows in
/// `[lo, hi)` with `hi <= new_first` (physical removal), atomically, and
/// only on the incarnation that was planned. Returns the rows deleted.
///
/// `locked` takes the stream rows' locks first, in token order (PostgreSQL
/// locks the rows of `ORDER BY .. FOR UPDATE` after sorting them), as
/// appends take theirs: an `UPDATE .. FROM` alone locks rows in whatever
/// order its join yields them, and purges then deadlocked with batched
/// appends. The update touches only rows `locked` already holds, and the
/// delete only event rows of streams it updated.
///
/// $1 tokens, $2 incarnations, $3 new first seqs, $4 lo, $5 hi.
pub(crate) const TRIM: &str = r#"
WITH u AS (
    SELECT * FROM unnest($1::bytea[], $2::int8[], $3::int8[], $4::int8[], $5::int8[])
        AS u(token, incarnation, new_first, lo, hi)
), locked AS (
    SELECT st.token FROM {s}.streams st
     WHERE st.token = ANY($1::bytea[])
     ORDER BY st.token
       FOR UPDATE
), logical AS (
    UPDATE {s}.streams st
       SET first_seq = GREATEST(st.first_seq, u.new_first),
           clean_seq = GREATEST(st.clean_seq, u.hi)
      FROM u, locked
     WHERE st.token = locked.token AND st.token = u.token
       AND st.incarnation = u.incarnation
    RETURNING st.token
), physical AS (
    DELETE FROM {s}.events e
     USING u, logical
     WHERE logical.token = u.token AND e.token = u.token
       AND e.seq >= u.lo AND e.seq < u.hi
    RETURNING 1
)
SELECT count(*) FROM physical
"#;

/// Removes stream rows that are empty and whose event rows are all gone,
/// locking them in token order first (see [`TRIM`]). A stream appended to
/// meanwhile is no longer empty and stays. $1 tokens.
const REMOVE_EMPTY: &str = r#"
WITH locked AS (
    SELECT token FROM {s}.streams
     WHERE token = ANY($1::bytea[]) AND first_seq > last_seq AND clean_seq > last_seq
     ORDER BY token
       FOR UPDATE
)
DELETE FROM {s}.streams st
 USING locked
 WHERE st.token = locked.token AND st.first_seq > st.last_seq AND st.clean_seq > st.last_seq
"#;

/// Plans retention for a batch of streams in token order: for each, the
/// first event to keep by age (`last_seq + 1` when all expired) and by
/// bytes (never past the newest). Each is one index probe plus the events
/// it passes over.
///
/// $1 after token, $2 age cut-off (ms) or null, $3 max bytes or null,
/// $4 batch size.
const PLAN: &str = r#"
SELECT st.token, st.incarnation, st.first_seq, st.last_seq, st.clean_seq,
    CASE WHEN $2::int8 IS NULL THEN NULL
         WHEN st.last_stored_at < $2::int8 THEN st.last_seq + 1
         ELSE COALESCE((SELECT e.seq FROM {s}.events e
                         WHERE e.token = st.token AND e.seq >= st.first_seq
                           AND e.stored_at >= $2::int8
                         ORDER BY e.seq LIMIT 1), st.last_seq + 1)
    END AS age_keep,
    CASE WHEN $3::int8 IS NULL OR st.first_seq > st.last_seq THEN NULL
         ELSE LEAST(st.last_seq, COALESCE((SELECT e.seq FROM {s}.events e
                         WHERE e.token = st.token AND e.seq >= st.first_seq
                           AND e.cum_bytes >= st.total_bytes - $3::int8
                         ORDER BY e.seq LIMIT 1), st.last_seq))
    END AS bytes_keep
  FROM {s}.streams st
 WHERE st.token > $1
 ORDER BY st.token
 LIMIT $4
"#;

/// Deletes a bounded batch of expired sessions. Rows another purge (or a
/// `put_session`) holds are skipped, not waited for, so two purges never
/// deadlock on sessions; the next purge gets them. $1 now (ms), $2 batch
/// size.
const PURGE_SESSIONS: &str = r#"
DELETE FROM {s}.sessions
 WHERE session_id IN (SELECT session_id FROM {s}.sessions WHERE expires_at <= $1
                       LIMIT $2 FOR UPDATE SKIP LOCKED)
"#;

/// $1 session id, $2 state, $3 expiry (ms).
const PUT_SESSION: &str = r#"
INSERT INTO {s}.sessions (session_id, state, expires_at) VALUES ($1, $2, $3)
ON CONFLICT (session_id) DO UPDATE SET state = EXCLUDED.state, expires_at = EXCLUDED.expires_at
"#;

/// $1 session id, $2 now (ms).
const GET_SESSION: &str = r#"
SELECT state FROM {s}.sessions WHERE session_id = $1 AND expires_at > $2
"#;

/// $1 session id, $2 now (ms). Returns whether it was still live.
const DELETE_SESSION: &str = r#"
DELETE FROM {s}.sessions WHERE session_id = $1 RETURNING expires_at > $2
"#;

/// $1 the candidate key; the first instance to open the schema wins.
pub(crate) const INSERT_KEY: &str = r#"
INSERT INTO {s}.meta (key, value) VALUES ('stream_key', $1) ON CONFLICT (key) DO NOTHING
"#;

pub(crate) const SELECT_KEY: &str = r#"
SELECT value FROM {s}.meta WHERE key = 'stream_key'
"#;

/// Redeems a nonce (C21): inserts its digest unless it is there; one row
/// affected when this call redeemed it. The primary key orders racing
/// inserts, so exactly one of them inserts. $1 key (32 bytes), $2 forget
/// at (ms).
const REDEEM: &str = r#"
INSERT INTO {s}.redeemed (key, forget_at) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING
"#;

/// Deletes a bounded batch of redemptions past their time (C21), skipping
/// rows another transaction holds, as [`PURGE_SESSIONS`] does. $1 now
/// (ms), $2 batch size.
const PURGE_REDEEMED: &str = r#"
DELETE FROM {s}.redeemed
 WHERE key IN (SELECT key FROM {s}.redeemed WHERE forget_at <= $1
                LIMIT $2 FOR UPDATE SKIP LOCKED)
"#;

/// What decides whether deleted rows are ever reclaimed: the server's
/// `autovacuum` and `track_counts`, and the store's tables (or their TOAST
/// tables) with `autovacuum_enabled` off. $1 schema name.
pub(crate) const VACUUM_SETTINGS: &str = r#"
SELECT current_setting('autovacuum')::bool,
       current_setting('track_counts')::bool,
       ARRAY(SELECT c.relname::text || CASE WHEN t.oid = c.oid THEN '' ELSE ' (TOAST)' END
               FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_class t ON t.oid = c.oid OR t.oid = c.reltoastrelid
              WHERE n.nspname = $1 AND c.relname IN ('events', 'streams', 'sessions', 'redeemed')
                AND EXISTS (SELECT 1 FROM pg_options_to_table(t.reloptions) o
                             WHERE o.option_name = 'autovacuum_enabled'
                               AND NOT o.option_value::bool)
              ORDER BY 1)
"#;

/// The rows the store's tables held at their last vacuum or analyze (0
/// when never counted): what a purge's deletions are measured against.
const TABLE_ROWS: &str = r#"
SELECT sum(GREATEST(reltuples, 0))::int8 FROM pg_class
 WHERE oid IN ('{s}.events'::regclass, '{s}.streams'::regclass, '{s}.sessions'::regclass,
               '{s}.redeemed'::regclass)
"#;

/// Plain `VACUUM` (never FULL) of the store's tables: it takes a lock that
/// conflicts only with other vacuums and schema changes, so appends and
/// replays go on meanwhile. `SKIP_LOCKED` skips a table another vacuum is
/// working on; `TRUNCATE false` keeps it from taking the exclusive lock that
/// returning empty pages at the end of a table to the OS needs (the pages
/// stay, free for new rows). It cannot run inside a transaction.
const VACUUM: &str = r#"
VACUUM (SKIP_LOCKED, TRUNCATE false) {s}.events, {s}.streams, {s}.sessions, {s}.redeemed
"#;

/// Totals over one page of stream rows in token order (C15), for `stats`:
/// the page's row count and last token (to go on from), then, over its
/// streams with retained events, how many, their events (the sequence
/// numbers are dense, so `last_seq - first_seq + 1`), their payload bytes
/// (`total_bytes` less the `cum_bytes` of the oldest retained event), the
/// oldest retained event's time and the newest append's. One primary-key
/// probe into `events` per stream, for its oldest retained event; no event
/// is read otherwise. The last column counts streams whose oldest retained
/// event row is missing (corruption: it is never deleted before
/// `first_seq` passes it). (PostgreSQL has no `max(bytea)`, hence the
/// ordered sub-select for the last token.)
///
/// The probe is a `LATERAL` sub-select with `LIMIT 1` so that PostgreSQL
/// cannot flatten it into a join: as a plain join it planned a merge join
/// walking `events` in key order, which reads every event of the page's
/// streams (every event, for long streams), or a hash join over the whole
/// table.
///
/// $1 after token, $2 page size.
const STATS_PAGE: &str = r#"
WITH page AS (
    SELECT token, first_seq, last_seq, total_bytes, last_stored_at
      FROM {s}.streams
     WHERE token > $1
     ORDER BY token
     LIMIT $2
)
SELECT (SELECT count(*) FROM page),
       (SELECT token FROM page ORDER BY token DESC LIMIT 1),
       count(*),
       COALESCE(sum(p.last_seq - p.first_seq + 1), 0)::int8,
       COALESCE(sum(p.total_bytes - e.cum_bytes), 0)::int8,
       min(e.stored_at),
       max(p.last_stored_at),
       count(*) FILTER (WHERE e.token IS NULL)
  FROM page p
  LEFT JOIN LATERAL (SELECT e.token, e.cum_bytes, e.stored_at FROM {s}.events e
                      WHERE e.token = p.token AND e.seq = p.first_seq LIMIT 1) e ON true
 WHERE p.first_seq <= p.last_seq
"#;

/// One page of the stream listing (C15): streams with retained events
/// after a token, in token order, with their counts, bytes and times as
/// [`STATS_PAGE`] computes them, with the same forced probe (`cum_bytes`
/// null: the oldest retained event's row is missing, which is corruption).
/// The primary-key scan of `streams` stops after $2 non-empty rows.
///
/// $1 after token, $2 most rows.
const LIST_PAGE: &str = r#"
SELECT st.token, st.stream_id, st.last_seq - st.first_seq + 1,
       st.total_bytes - e.cum_bytes, e.stored_at, st.last_stored_at
  FROM {s}.streams st
  LEFT JOIN LATERAL (SELECT e.cum_bytes, e.stored_at FROM {s}.events e
                      WHERE e.token = st.token AND e.seq = st.first_seq LIMIT 1) e ON true
 WHERE st.token > $1 AND st.first_seq <= st.last_seq
 ORDER BY st.token
 LIMIT $2
"#;

/// The server settings that decide whether a commit the store acknowledged
/// survives a crash, as the store's own connections see them (a role or
/// database can override `synchronous_commit`), and the newest format
/// version the schema holds (C15).
const DURABILITY: &str = r#"
SELECT current_setting('synchronous_commit'), current_setting('fsync'),
       current_setting('full_page_writes'),
       (SELECT max(version) FROM {s}._sqlx_migrations WHERE success)
"#;

/// The applied migrations, to check the format (C12).
pub(crate) const APPLIED_MIGRATIONS: &str = r#"
SELECT version, description, success FROM {s}._sqlx_migrations ORDER BY version
"#;

/// The statements of one store, with its schema spliced in.
#[derive(Clone, Debug)]
pub(crate) struct Sql {
    pub append: SqlStr,
    pub append_one: SqlStr,
    pub notify: SqlStr,
    pub page: SqlStr,
    pub lookup: SqlStr,
    pub delete_mark: SqlStr,
    pub trim: SqlStr,
    pub remove_empty: SqlStr,
    pub plan: SqlStr,
    pub purge_sessions: SqlStr,
    pub put_session: SqlStr,
    pub get_session: SqlStr,
    pub delete_session: SqlStr,
    pub redeem: SqlStr,
    pub purge_redeemed: SqlStr,
    pub table_rows: SqlStr,
    pub vacuum: SqlStr,
    pub stats_page: SqlStr,
    pub list_page: SqlStr,
    pub durability: SqlStr,
}

impl Sql {
    /// `quoted_schema` must come from [`crate::options::quote_schema`],
    /// `channel` from [`crate::follow::channel`] (letters, digits, `_`
    /// and `.` only, so it needs no escaping inside a string literal).
    pub(crate) fn new(quoted_schema: &str, channel: &str) -> Self {
        debug_assert!(
            channel
                .bytes()
                .all(|b| b == b'_' || b == b'.' || b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        let make = |template: &str| render(template, quoted_schema);
        Self {
            append: make(&APPEND.replace("{upsert}", APPEND_UPSERT)),
            append_one: make(&APPEND_ONE.replace("{upsert}", APPEND_UPSERT)),
            notify: make(&NOTIFY.replace("{c}", channel)),
            page: make(PAGE),
            lookup: make(LOOKUP),
            delete_mark: make(DELETE_MARK),
            trim: make(TRIM),
            remove_empty: make(REMOVE_EMPTY),
            plan: make(PLAN),
            purge_sessions: make(PURGE_SESSIONS),
            put_session: make(PUT_SESSION),
            get_session: make(GET_SESSION),
            delete_session: make(DELETE_SESSION),
            redeem: make(REDEEM),
            purge_redeemed: make(PURGE_REDEEMED),
            table_rows: make(TABLE_ROWS),
            vacuum: make(VACUUM),
            stats_page: make(STATS_PAGE),
            list_page: make(LIST_PAGE),
            durability: make(DURABILITY),
        }
    }
}

/// Splices a validated, quoted schema name into a template. Safe: the name
/// matched `^[a-z_][a-z0-9_]*$` and the templates are constants.
pub(crate) fn render(template: &str, quoted_schema: &str) -> SqlStr {
    let sql: Arc<str> = template.replace("{s}", quoted_schema).into();
    AssertSqlSafe(sql).into_sql_str()
}
