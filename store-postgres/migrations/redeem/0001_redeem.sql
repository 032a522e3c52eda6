-- mcp-event-store-postgres redemptions (C21): a row per nonce redeemed,
-- keyed by the 32-byte digest of its principal and the nonce (never the
-- nonce), kept until forget_at (the nonce's expiry plus the grace,
-- milliseconds since the epoch by the store's clock) and deleted by
-- purge_expired, in batches on the forget_at index.
--
-- Additive, and recorded in a table of its own, _mes_redeem_migrations: no
-- other migration table changes, so a release from before redemptions
-- still opens the schema and serves events and tasks (it never touches
-- this table).
CREATE TABLE redeemed (
    key BYTEA PRIMARY KEY,
    forget_at BIGINT NOT NULL
);
CREATE INDEX redeemed_forget_at ON redeemed (forget_at);
