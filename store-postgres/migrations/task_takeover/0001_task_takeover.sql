-- mcp-event-store-postgres task takeover (T16 to T19): a task that may
-- outlive its instance keeps how many runs it may have (max_attempts; NULL
-- for a task that dies with its instance, as every task before), the runs
-- whose instance lapsed, its claim's epoch, whether it waits for a claim
-- (released), and its newest checkpoint; the partial index finds the tasks
-- that may wait for a claim.
--
-- Additive, and recorded in a table of its own, _mes_task_takeover_migrations:
-- neither _sqlx_migrations, _mes_task_migrations nor
-- _mes_task_context_migrations changes, so a release from before takeover
-- still opens the schema and serves events and tasks. Its statements name
-- their columns, so its writes leave these as they are; it reads a task
-- that may be taken over as one that dies with its instance.
ALTER TABLE tasks
    ADD COLUMN max_attempts INTEGER,
    ADD COLUMN lapses INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1,
    ADD COLUMN released BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN checkpoint BYTEA;
CREATE INDEX tasks_waiting ON tasks (updated_at, digest)
    WHERE max_attempts IS NOT NULL AND status = 0;
