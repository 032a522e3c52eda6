-- mcp-event-store SQLite task takeover (T16 to T19): a task that may
-- outlive its instance keeps how many runs it may have (max_attempts; NULL
-- for a task that dies with its instance, as every task before), the runs
-- whose instance lapsed, its claim's epoch, whether it waits for a claim
-- (released), and its newest checkpoint; the partial index finds the tasks
-- that may wait for a claim.
--
-- Additive, and recorded in a table of its own, mes_task_takeover_migrations:
-- no other migration table changes, so a release from before takeover still
-- opens the file and serves events and tasks. Its statements name their
-- columns, so what it writes leaves these as they are; it reads a task that
-- may be taken over as one that dies with its instance.
ALTER TABLE mes_tasks ADD COLUMN max_attempts INTEGER;
ALTER TABLE mes_tasks ADD COLUMN lapses INTEGER NOT NULL DEFAULT 0;
ALTER TABLE mes_tasks ADD COLUMN epoch INTEGER NOT NULL DEFAULT 1;
ALTER TABLE mes_tasks ADD COLUMN released INTEGER NOT NULL DEFAULT 0;
ALTER TABLE mes_tasks ADD COLUMN checkpoint BLOB;
CREATE INDEX mes_tasks_waiting ON mes_tasks (updated_at, digest)
    WHERE max_attempts IS NOT NULL AND status = 0;
