-- mcp-event-store SQLite format, version 1.
-- Every table carries the `mes_` prefix so the store can share a database
-- file with an application's own tables.

CREATE TABLE mes_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL
) WITHOUT ROWID;

INSERT INTO mes_meta (key, value) VALUES ('format_version', 1);

-- One row per stream: the token derived from the stream id (the event ids'
-- locator), the newest sequence number handed out, and the payload bytes
-- currently retained (for the byte limit).
CREATE TABLE mes_streams (
    token      BLOB PRIMARY KEY NOT NULL,
    stream_id  TEXT NOT NULL,
    last_seq   INTEGER NOT NULL,
    bytes      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;

-- Events live in a rowid table (payloads can be megabytes, which suits
-- rowid tables better than WITHOUT ROWID ones); the unique index on
-- (token, seq) serves replay as one seek plus a range read.
CREATE TABLE mes_events (
    token     BLOB NOT NULL,
    seq       INTEGER NOT NULL,
    stored_at INTEGER NOT NULL,
    retry_ms  INTEGER,
    payload   BLOB NOT NULL,
    UNIQUE (token, seq)
);

-- Age-based retention walks this index oldest first.
CREATE INDEX mes_events_stored_at ON mes_events (stored_at);

-- The stream row follows its events inside SQLite, so an append is a single
-- statement: the sequence number and byte count never need a round trip.
CREATE TRIGGER mes_events_inserted AFTER INSERT ON mes_events BEGIN
    UPDATE mes_streams
    SET last_seq = NEW.seq,
        bytes = bytes + length(NEW.payload),
        updated_at = NEW.stored_at
    WHERE token = NEW.token;
END;

CREATE TRIGGER mes_events_deleted AFTER DELETE ON mes_events BEGIN
    UPDATE mes_streams SET bytes = bytes - length(OLD.payload) WHERE token = OLD.token;
END;

CREATE TABLE mes_sessions (
    session_id TEXT PRIMARY KEY NOT NULL,
    state      BLOB NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE INDEX mes_sessions_expires_at ON mes_sessions (expires_at);
