-- mcp-event-store SQLite task tables (durable tasks, SEP-2663).
--
-- These tables are additive: the event format (mes_meta.format_version 2)
-- is unchanged, and this migration is recorded in its own table,
-- mes_task_migrations, never in mes_migrations. A release that knows only
-- the event migrations checks mes_migrations, finds exactly the migrations
-- it knows, and keeps serving events from a file holding these tables.
--
-- A task is keyed by the 16-byte digest of its id; the id itself is never
-- stored (a dump hands out no bearer token). The owner is the 16-byte
-- digest of the principal, or the empty blob for an anonymous task, so
-- `owner = ?` matches anonymous only against anonymous.

-- A rowid table: outcomes can be megabytes.
CREATE TABLE mes_tasks (
    digest     BLOB PRIMARY KEY NOT NULL,
    owner      BLOB NOT NULL,
    -- 0 working, 1 input_required, 2 completed, 3 failed, 4 cancelled:
    -- "still running" is status < 2.
    status     INTEGER NOT NULL,
    rev        INTEGER NOT NULL,
    message    TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    purge_at   INTEGER NOT NULL,
    ttl_ms     INTEGER,
    poll_ms    INTEGER,
    cancel     INTEGER NOT NULL,
    -- The instance that last worked on the task (T11).
    instance   BLOB NOT NULL,
    -- The result (completed) or the error (failed), as given.
    outcome    BLOB,
    -- The sequence number of the newest input request.
    next_seq   INTEGER NOT NULL
);

CREATE INDEX mes_tasks_purge_at ON mes_tasks (purge_at);
CREATE INDEX mes_tasks_running_instance ON mes_tasks (instance) WHERE status < 2;

-- One row per input key a task ever used: 0 outstanding, 1 answered,
-- 2 spent (taken or superseded). Rows stay until the task goes, so a key
-- is never usable twice (T5). Deleted with their task, in the same
-- transaction (the store's connections run with foreign keys off).
CREATE TABLE mes_task_inputs (
    digest   BLOB NOT NULL,
    key      BLOB NOT NULL,
    seq      INTEGER NOT NULL,
    state    INTEGER NOT NULL,
    request  BLOB NOT NULL,
    response BLOB,
    PRIMARY KEY (digest, key)
);

-- Each runtime instance's heartbeat deadline (T11).
CREATE TABLE mes_instances (
    id          BLOB PRIMARY KEY NOT NULL,
    alive_until INTEGER NOT NULL
) WITHOUT ROWID;
