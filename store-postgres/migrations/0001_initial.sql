-- mcp-event-store-postgres, format 1.
--
-- Every table lives in the store's own schema (default `mcp_event_store`);
-- the store runs this with `search_path` set to that schema only, and
-- schema-qualifies every table in the statements it runs afterwards.

-- Store-wide metadata. `stream_key` holds the 32-byte secret that keys the
-- stream tokens in event ids, shared by every instance on this database.
CREATE TABLE meta (
    key   TEXT  PRIMARY KEY,
    value BYTEA NOT NULL
);

-- One row per stream, keyed by its 15-byte token (HMAC of the stream id).
-- The row is the stream's lock and its counters:
--   [first_seq, last_seq]   the retained events (empty when first > last);
--   clean_seq               every event row below it is physically deleted;
--   total_bytes             payload bytes ever appended (only grows);
--   incarnation             random per creation, so a purge planned against
--                           a deleted stream never touches its successor.
-- Appends update the row in place; fillfactor leaves room for HOT updates.
CREATE TABLE streams (
    token          BYTEA  PRIMARY KEY,
    stream_id      BYTEA  NOT NULL,
    incarnation    BIGINT NOT NULL,
    first_seq      BIGINT NOT NULL,
    last_seq       BIGINT NOT NULL,
    clean_seq      BIGINT NOT NULL,
    total_bytes    BIGINT NOT NULL,
    last_stored_at BIGINT NOT NULL
) WITH (fillfactor = 70);

-- The events, clustered by the (token, seq) primary key so a replay is one
-- index seek plus a range read. cum_bytes is the stream's total_bytes
-- before this event, which makes byte retention a range condition.
CREATE TABLE events (
    token     BYTEA  NOT NULL,
    seq       BIGINT NOT NULL,
    stored_at BIGINT NOT NULL,
    cum_bytes BIGINT NOT NULL,
    retry_ms  BIGINT,
    data      BYTEA  NOT NULL,
    PRIMARY KEY (token, seq)
);

-- Opaque session state with an expiry (milliseconds since the epoch).
CREATE TABLE sessions (
    session_id BYTEA  PRIMARY KEY,
    state      BYTEA  NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX sessions_expires_at ON sessions (expires_at);
