-- mcp-event-store-postgres cancel reasons (T20): the reason a client gave
-- when it asked to cancel a task, kept with the task once it ended.
--
-- Additive, and recorded in a table of its own,
-- _mes_task_cancel_reason_migrations: no other migration table changes,
-- so a release from before cancel reasons still opens the schema and
-- serves events and tasks. Its statements name their columns, so its
-- writes leave a reason as it is; it reads a task without one.
-- BYTEA, as the status message: text cannot hold NUL.
ALTER TABLE tasks ADD COLUMN cancel_reason BYTEA;
