-- mcp-event-store-postgres, format 2: stream incarnations from a sequence.
--
-- An event id's position is `<incarnation>-<seq>`. A stream row takes its
-- incarnation from this sequence when it is created, so a stream started
-- again after its row was removed (deleted, or expired whole, then purged)
-- gets an incarnation larger than any before it, and no event id is ever
-- issued twice. A sequence never hands a value out twice (NO CYCLE), and
-- with CACHE 1 the values increase in the order they are drawn, whichever
-- connection draws them. The append statement draws one value per event
-- (only a new row keeps it); 2^63 of them outlast any store.
CREATE SEQUENCE incarnations AS BIGINT MINVALUE 1 START WITH 1 CACHE 1 NO CYCLE;

-- Format 1 drew incarnations at random per handle: any BIGINT, zero and
-- negatives included. Renumber the existing streams from the sequence, so
-- every incarnation is positive, distinct, and below all drawn from now on.
-- (Event ids issued under format 1, `v1.<token>.<seq>`, have no incarnation
-- and are refused as unknown from now on.)
UPDATE streams SET incarnation = nextval('incarnations');

ALTER TABLE streams ADD CONSTRAINT streams_incarnation_positive CHECK (incarnation > 0);
