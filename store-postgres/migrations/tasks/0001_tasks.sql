-- mcp-event-store-postgres durable tasks (SEP-2663), task format 1.
--
-- Additive: the event format (FORMAT_VERSION 2, the rows of
-- _sqlx_migrations) is unchanged, and this migration is recorded in its own
-- table, _mes_task_migrations. A release from before tasks checks
-- _sqlx_migrations, finds only the migrations it knows, and keeps serving
-- events from a schema that also holds these tables.
--
-- A task is keyed by the 16-byte digest of its id; the id itself is never
-- stored (a dump hands out no bearer token). The owner is the 16-byte
-- digest of the principal, or the empty bytea for an anonymous task, so
-- `owner = $n` matches anonymous only against anonymous. Keys and the
-- status message are bytea: text refuses NUL, and the store never
-- interprets them.
CREATE TABLE tasks (
    digest     BYTEA PRIMARY KEY,
    owner      BYTEA NOT NULL,
    -- 0 working, 1 input_required, 2 completed, 3 failed, 4 cancelled:
    -- "still running" is status < 2.
    status     INT2 NOT NULL,
    rev        INT8 NOT NULL,
    message    BYTEA,
    created_at INT8 NOT NULL,
    updated_at INT8 NOT NULL,
    expires_at INT8 NOT NULL,
    purge_at   INT8 NOT NULL,
    ttl_ms     INT8,
    poll_ms    INT8,
    cancel     BOOLEAN NOT NULL,
    -- The instance that last worked on the task (T11).
    instance   BYTEA NOT NULL,
    -- The result (completed) or the error (failed), as given.
    outcome    BYTEA,
    -- The sequence number of the newest input request.
    next_seq   INT8 NOT NULL
);

CREATE INDEX tasks_purge_at ON tasks (purge_at);
CREATE INDEX tasks_running_instance ON tasks (instance) WHERE status < 2;

-- One row per input key a task ever used: 0 outstanding, 1 answered,
-- 2 spent (taken or superseded). Rows stay until the task goes, so a key
-- is never usable twice (T5); they go with it (ON DELETE CASCADE).
CREATE TABLE task_inputs (
    digest   BYTEA NOT NULL REFERENCES tasks (digest) ON DELETE CASCADE,
    key      BYTEA NOT NULL,
    seq      INT8 NOT NULL,
    state    INT2 NOT NULL,
    request  BYTEA NOT NULL,
    response BYTEA,
    PRIMARY KEY (digest, key)
);

-- Each runtime instance's heartbeat deadline (T11).
CREATE TABLE instances (
    id          BYTEA PRIMARY KEY,
    alive_until INT8 NOT NULL
);
