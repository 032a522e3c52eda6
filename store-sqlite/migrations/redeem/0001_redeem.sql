-- mcp-event-store SQLite redemptions (C21): a row per nonce redeemed, keyed
-- by the 32-byte digest of its principal and the nonce (never the nonce),
-- kept until forget_at (the nonce's expiry plus the grace, milliseconds
-- since the epoch by the store's clock) and deleted by purge_expired.
--
-- Additive, and recorded in a table of its own, mes_redeem_migrations: no
-- other migration table changes, so a release from before redemptions
-- still opens the file and serves events and tasks (it never touches this
-- table).
CREATE TABLE mes_redeemed (
    key BLOB PRIMARY KEY NOT NULL,
    forget_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX mes_redeemed_forget_at ON mes_redeemed (forget_at);
