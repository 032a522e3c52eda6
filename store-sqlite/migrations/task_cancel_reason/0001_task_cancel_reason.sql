-- mcp-event-store SQLite cancel reasons (T20): the reason a client gave
-- when it asked to cancel a task, kept with the task once it ended.
--
-- Additive, and recorded in a table of its own,
-- mes_task_cancel_reason_migrations: no other migration table changes, so
-- a release from before cancel reasons still opens the file and serves
-- events and tasks. Its statements name their columns, so what it writes
-- leaves a reason as it is; it reads a task without one.
ALTER TABLE mes_tasks ADD COLUMN cancel_reason TEXT;
