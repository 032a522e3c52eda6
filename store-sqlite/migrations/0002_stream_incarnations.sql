-- mcp-event-store SQLite format, version 2: every stream row carries an
-- incarnation, so a stream started again (after it was deleted, or expired
-- whole) never reissues an event id. Ids are `<incarnation>-<seq>`.
--
-- Incarnations come from one counter for the whole store,
-- `mes_meta.last_incarnation`, which only ever goes up: a new stream row
-- takes `last_incarnation + 1`, and the trigger below moves the counter in
-- the same statement. The counter survives every stream it numbered, so its
-- state is one row, however many streams come and go.

ALTER TABLE mes_streams ADD COLUMN incarnation INTEGER NOT NULL DEFAULT 0;

-- Format 1 deleted a stream's row before its events in two statements; a
-- crash in between left events with no stream. They are unreachable (their
-- ids were refused already) and would collide with the events of the
-- stream's next life, which starts again at sequence 1.
DELETE FROM mes_events
WHERE NOT EXISTS (SELECT 1 FROM mes_streams s WHERE s.token = mes_events.token);

-- Existing streams get incarnations above every sequence number format 1
-- issued (its ids were `<seq>`), so within each stream the new ids
-- `<incarnation>-<seq>` still sort after the old ones. Old ids themselves are
-- refused from now on: format 1 ids have no incarnation.
UPDATE mes_streams
SET incarnation = numbered.incarnation
FROM (
    SELECT token,
           (SELECT COALESCE(MAX(last_seq), 0) FROM mes_streams)
               + ROW_NUMBER() OVER (ORDER BY token) AS incarnation
    FROM mes_streams
) AS numbered
WHERE mes_streams.token = numbered.token;

INSERT INTO mes_meta (key, value)
VALUES ('last_incarnation', (SELECT COALESCE(MAX(incarnation), 0) FROM mes_streams));

-- A stream row must take an incarnation never handed out before; anything
-- else (a writer of an older format, a hand-made row) is refused rather
-- than allowed to reissue ids.
CREATE TRIGGER mes_streams_fresh_incarnation BEFORE INSERT ON mes_streams
WHEN NEW.incarnation <= (SELECT value FROM mes_meta WHERE key = 'last_incarnation')
BEGIN
    SELECT RAISE(ABORT, 'mes_streams: a new stream needs an incarnation above mes_meta.last_incarnation');
END;

CREATE TRIGGER mes_streams_inserted AFTER INSERT ON mes_streams BEGIN
    UPDATE mes_meta SET value = NEW.incarnation WHERE key = 'last_incarnation';
END;

UPDATE mes_meta SET value = 2 WHERE key = 'format_version';
