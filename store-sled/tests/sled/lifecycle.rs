//! Opening, closing, format versions and the migration from format 1
//! (C12), URLs, and new lives of streams (after a delete, or after a lost
//! relaxed session).

use std::time::Duration;

use futures_util::TryStreamExt;
use mcp_event_store_core::backend::dense::position;
use mcp_event_store_core::{Error, EventId, EventStore, NewEvent, StoreOptions};
use mcp_event_store_sled::{Durability, FORMAT_VERSION, SledOptions, SledStore};

const META: &str = "mcp-event-store/meta";

/// sled 0.34's background threads keep a database's directory locked a
/// moment after its last `sled::Db` is dropped. The store retries after a
/// close of its own; these tests also open the directory with sled
/// directly, and retry the same way around those opens.
const LOCK_RELEASE: Duration = Duration::from_secs(10);

/// Opens the store, retrying while a raw `sled::Db` of this test is still
/// releasing the directory's lock.
async fn open(dir: &std::path::Path) -> mcp_event_store_core::Result<SledStore> {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match SledStore::open(dir, SledOptions::default()).await {
            Err(e)
                if e.to_string().contains("locked by another process")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            opened => return opened,
        }
    }
}

/// Opens the database with sled directly, retrying while the store or an
/// earlier raw open is still releasing the directory's lock.
fn raw_open(dir: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + LOCK_RELEASE;
    loop {
        match sled::open(dir) {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            opened => return opened.unwrap(),
        }
    }
}

/// Edits the metadata tree with sled directly, as another release would.
fn with_raw_meta(dir: &std::path::Path, edit: impl FnOnce(&sled::Tree)) {
    let db = raw_open(dir);
    let meta = db.open_tree(META).unwrap();
    edit(&meta);
    db.flush().unwrap();
}

/// The refusal of a newer format names the release that wrote it and what
/// to do. (That it is refused and changes nothing is the shared case
/// `newer_format_is_refused_and_changes_nothing`, C12.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_is_refused_naming_the_release_that_wrote_it() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).await.unwrap().close().await.unwrap();
    with_raw_meta(dir.path(), |meta| {
        meta.insert("format_version", &(FORMAT_VERSION + 1).to_be_bytes())
            .unwrap();
        meta.insert("created_by", &b"mcp-event-store-sled 9.0.0"[..])
            .unwrap();
    });
    match open(dir.path()).await {
        Err(Error::IncompatibleFormat(message)) => {
            let newer = format!("format {}", FORMAT_VERSION + 1);
            assert!(message.contains(&newer), "{message}");
            assert!(message.contains("mcp-event-store-sled 9.0.0"), "{message}");
            assert!(message.contains("Upgrade"), "{message}");
        }
        other => panic!("expected IncompatibleFormat, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_sled_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = raw_open(dir.path());
        db.insert("someone", "else's data").unwrap();
        db.flush().unwrap();
    }
    match open(dir.path()).await {
        Err(Error::IncompatibleFormat(message)) => {
            assert!(message.contains("did not write"), "{message}")
        }
        other => panic!("expected IncompatibleFormat, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_format_record_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).await.unwrap().close().await.unwrap();
    with_raw_meta(dir.path(), |meta| {
        meta.insert("format_version", &b"?"[..]).unwrap();
    });
    assert!(matches!(open(dir.path()).await, Err(Error::Corrupt(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_reopen_repeatedly_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut last: Option<EventId> = None;
    for round in 0..30u32 {
        let store = open(dir.path()).await.unwrap();
        let id = store
            .store_event("s", NewEvent::new(&round.to_be_bytes()))
            .await
            .unwrap();
        assert_eq!(id.position.minor, u64::from(round) + 1);
        if let Some(last) = last {
            assert_eq!(id.token, last.token, "the stream key persists");
            assert_eq!(id.position.major, last.position.major, "one life");
        }
        last = Some(id);
        if round % 2 == 0 {
            store.close().await.unwrap();
        } else {
            // A plain drop must not lose anything either.
            drop(store);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_share_one_database() {
    let dir = tempfile::tempdir().unwrap();
    let one = open(dir.path()).await.unwrap();
    // Through the registry, by a different spelling of the same path.
    let two = open(&dir.path().join(".")).await.unwrap();
    let three = one
        .handle_with_options(StoreOptions::default().page_size(1))
        .await
        .unwrap();
    let first = one.store_event("s", NewEvent::new(b"1")).await.unwrap();
    two.store_event("s", NewEvent::new(b"2")).await.unwrap();
    three.store_event("s", NewEvent::new(b"3")).await.unwrap();
    let replay = three.replay_events_after(&first.to_string()).await.unwrap();
    let got: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(one.path(), two.path());
    one.close().await.unwrap();
    two.close().await.unwrap();
    three.close().await.unwrap();
}

/// `close(&self)` closes a handle and its clones: every later call through
/// them is `Error::Closed`, closing again does nothing, other handles on the
/// directory stay open, and once the last one is closed the database is
/// closed too and opens afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_a_handle_and_its_clones_once() {
    use mcp_event_store_core::{FollowOptions, SessionStore};

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await.unwrap();
    let clone = store.clone();
    let other = open(dir.path()).await.unwrap();
    let id = store.store_event("s", NewEvent::new(b"1")).await.unwrap();
    let cursor = id.to_string();
    store.close().await.unwrap();
    store.close().await.unwrap();
    clone.close().await.unwrap();

    fn closed<T: std::fmt::Debug>(what: &str, result: mcp_event_store_core::Result<T>) {
        assert!(
            matches!(result, Err(Error::Closed)),
            "{what} after close: {result:?}"
        );
    }
    for handle in [&store, &clone] {
        closed(
            "store_event",
            handle.store_event("s", NewEvent::new(b"2")).await,
        );
        closed(
            "replay",
            handle
                .replay_events_after(&cursor)
                .await
                .map(|r| r.stream_id),
        );
        closed("lookup", handle.get_stream_id_for_event_id(&cursor).await);
        closed("delete_stream", handle.delete_stream("s").await);
        closed("purge_expired", handle.purge_expired().await);
        closed(
            "follow",
            handle
                .follow_events_after(&cursor, FollowOptions::default())
                .await
                .map(|r| r.stream_id),
        );
        closed("stats", handle.stats().await);
        closed("list_streams", handle.list_streams(None, 10).await);
        closed("check", handle.check().await);
        closed(
            "put_session",
            handle
                .put_session("x", b"state", Duration::from_secs(60))
                .await,
        );
        closed("get_session", handle.get_session("x").await);
        closed("delete_session", handle.delete_session("x").await);
        closed("flush", handle.flush().await);
        closed(
            "handle_with_options",
            handle.handle_with_options(StoreOptions::default()).await,
        );
        assert_eq!(handle.open_follows(), 0);
        assert_eq!(handle.path(), other.path(), "accessors still answer");
    }

    // Another handle on the directory is unaffected.
    let next = other.store_event("s", NewEvent::new(b"2")).await.unwrap();
    assert_eq!(next.position, position(id.position.major, 2));
    other.close().await.unwrap();

    // The database really closed: it opens afresh and has everything.
    let again = open(dir.path()).await.unwrap();
    let replay = again.replay_events_after(&cursor).await.unwrap();
    let got: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(got.len(), 1);
    again.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sled://{}?flush_interval_ms=5", dir.path().display());
    assert!(url.starts_with("sled:///"));
    let store = SledStore::connect(&url).await.unwrap();
    assert_eq!(
        store.durability(),
        Durability::Interval(Duration::from_millis(5))
    );
    store.store_event("s", NewEvent::new(b"x")).await.unwrap();
    store.close().await.unwrap();
    assert!(matches!(
        SledStore::connect("sled://").await,
        Err(Error::Config(_))
    ));
    assert!(matches!(
        SledStore::connect("redis://x").await,
        Err(Error::Config(_))
    ));
    // A parameter given twice, or both durability parameters, is refused.
    for url in [
        "?flush_interval_ms=5&flush_interval_ms=6",
        "?durability=flush&flush_interval_ms=5",
    ] {
        let url = format!("sled://{}{url}", dir.path().display());
        assert!(
            matches!(SledStore::connect(&url).await, Err(Error::Config(_))),
            "{url}"
        );
    }

    // The URL's parameters win over the options given with it.
    let url = format!("sled://{}?durability=flush", dir.path().display());
    let relaxed = SledOptions::default()
        .durability(Durability::Interval(Duration::from_millis(5)))
        .follow_recheck(Duration::from_millis(7));
    let store = SledStore::connect_with(&url, relaxed).await.unwrap();
    assert_eq!(store.durability(), Durability::Flush);
    assert_eq!(store.follow_recheck(), Duration::from_millis(7));
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_mode_is_visible_at_once_and_flushed_on_close() {
    let dir = tempfile::tempdir().unwrap();
    let relaxed =
        SledOptions::default().durability(Durability::Interval(Duration::from_secs(3600)));
    let store = SledStore::open(dir.path(), relaxed).await.unwrap();
    let first = store.store_event("s", NewEvent::new(b"1")).await.unwrap();
    let second = store.store_event("s", NewEvent::new(b"2")).await.unwrap();
    assert!(
        store
            .get_stream_id_for_event_id(&second.to_string())
            .await
            .unwrap()
            .is_some()
    );
    store.close().await.unwrap();

    // A clean close: the stream's life and numbering simply continue.
    let store = open(dir.path()).await.unwrap();
    let third = store.store_event("s", NewEvent::new(b"3")).await.unwrap();
    assert_eq!(third.position, position(first.position.major, 3));
    let replay = store.replay_events_after(&first.to_string()).await.unwrap();
    let got: Vec<_> = replay.events.try_collect().await.unwrap();
    assert_eq!(got.len(), 2);
    store.close().await.unwrap();
}

/// Opens with one event per replay page, so a replay reads its stream in
/// several steps.
async fn open_paging_by_one(dir: &std::path::Path) -> SledStore {
    let options = SledOptions::default().store(StoreOptions::default().page_size(1));
    SledStore::open(dir, options).await.unwrap()
}

async fn append(store: &SledStore, stream: &str, data: &str) -> EventId {
    store
        .store_event(stream, NewEvent::new(data.as_bytes()))
        .await
        .unwrap()
}

/// Reads a replay to its end: the payloads, then the error if it failed.
async fn drain(events: mcp_event_store_core::Replay) -> (Vec<String>, Option<Error>) {
    let mut events = events.events;
    let mut data = Vec::new();
    loop {
        match events.try_next().await {
            Ok(Some(event)) => data.push(String::from_utf8(event.data.to_vec()).unwrap()),
            Ok(None) => return (data, None),
            Err(e) => return (data, Some(e)),
        }
    }
}

/// Replays after `cursor` to the end, as payloads.
async fn replay(store: &SledStore, cursor: &EventId) -> Result<Vec<String>, Error> {
    let replay = store.replay_events_after(&cursor.to_string()).await?;
    match drain(replay).await {
        (data, None) => Ok(data),
        (_, Some(e)) => Err(e),
    }
}

/// Checks that `cursor`, an id of an earlier life of its stream, resumes
/// nothing and finds nothing.
async fn assert_gone(store: &SledStore, cursor: &EventId) {
    match replay(store, cursor).await {
        Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. }) => {}
        other => panic!("replay after {cursor} of an earlier life gave {other:?}"),
    }
    let found = store
        .get_stream_id_for_event_id(&cursor.to_string())
        .await
        .unwrap();
    assert_eq!(found, None, "lookup of {cursor} of an earlier life");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_lost_relaxed_session_each_stream_starts_a_new_life() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await.unwrap();
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(append(&store, "s", &format!("old-{i}")).await);
    }
    let t_old = append(&store, "t", "t-old").await;
    store.close().await.unwrap();

    // What a relaxed handle leaves behind when its process is killed.
    with_raw_meta(dir.path(), |meta| {
        meta.insert("relaxed_open", &[1u8][..]).unwrap();
    });

    let store = open_paging_by_one(dir.path()).await;
    // Before the stream appends again, old cursors still replay.
    assert_eq!(replay(&store, &old[0]).await.unwrap(), ["old-1", "old-2"]);
    // An id the lost session may have acknowledged, never on disk here, is
    // unknown, not an empty replay.
    let lost = EventId::new(old[0].token, position(old[0].position.major, 4));
    assert!(matches!(
        replay(&store, &lost).await,
        Err(Error::UnknownEventId { .. })
    ));
    // A replay under way when the life ends.
    let pending = store
        .replay_events_after(&old[0].to_string())
        .await
        .unwrap();

    // The next append starts a new life: numbers the lost session may have
    // handed out are never handed out again.
    let mut new = Vec::new();
    for i in 0..4 {
        new.push(append(&store, "s", &format!("new-{i}")).await);
    }
    assert_eq!(new[0].position.minor, 1, "{}", new[0]);
    assert_eq!(new[3].position, position(new[0].position.major, 4));
    assert!(new[0].position > t_old.position && new[0].position > old[2].position);
    let (data, error) = drain(pending).await;
    assert_eq!(
        data,
        ["old-1"],
        "the replay under way went on into the new life"
    );
    assert!(
        matches!(error, Some(Error::EventsPurged { .. })),
        "{error:?}"
    );
    for cursor in old.iter().chain([&lost]) {
        assert_gone(&store, cursor).await;
    }
    assert_eq!(replay(&store, &new[2]).await.unwrap(), ["new-3"]);
    // Every stream does, each under its own new incarnation.
    let t_new = append(&store, "t", "t-new").await;
    assert_eq!(t_new.position.minor, 1);
    assert!(t_new.position.major > t_old.position.major);
    assert_gone(&store, &t_old).await;
    store.close().await.unwrap();

    // The new life began once: a clean reopen continues it.
    let store = open(dir.path()).await.unwrap();
    let after = append(&store, "s", "new-4").await;
    assert_eq!(after.position, position(new[0].position.major, 5));
    assert_eq!(replay(&store, &new[2]).await.unwrap(), ["new-3", "new-4"]);
    store.close().await.unwrap();
}

/// A replay whose stream is deleted and started again while it runs ends
/// with `EventsPurged` at its next page, never reading the new life, whose
/// events sit under the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_never_reads_on_into_the_next_life_of_its_stream() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_paging_by_one(dir.path()).await;
    let mut old = Vec::new();
    for i in 0..5 {
        old.push(append(&store, "s", &format!("old-{i}")).await);
    }
    let pending = store
        .replay_events_after(&old[0].to_string())
        .await
        .unwrap();
    assert_eq!(store.delete_stream("s").await.unwrap(), 5);
    let mut new = Vec::new();
    for i in 0..6 {
        new.push(append(&store, "s", &format!("new-{i}")).await);
    }
    assert!(new[0].position > old[4].position);
    let (data, error) = drain(pending).await;
    assert_eq!(data, ["old-1"], "the replay went on into the new life");
    assert!(
        matches!(error, Some(Error::EventsPurged { .. })),
        "{error:?}"
    );
    for cursor in &old {
        assert_gone(&store, cursor).await;
    }
    store.close().await.unwrap();
}

/// What the previous release (storage format 1) wrote, with sled directly:
/// the layout of `mcp-event-store-sled` 0.1.0, byte for byte.
mod format_1 {
    use mcp_event_store_core::backend::StreamKey;
    use mcp_event_store_core::{EventId, Position};

    pub const EVENTS: &str = "mcp-event-store/v1/events";
    pub const STREAMS: &str = "mcp-event-store/v1/streams";
    pub const STREAM_AGE: &str = "mcp-event-store/v1/stream_age";
    pub const SESSIONS: &str = "mcp-event-store/v1/sessions";
    pub const SESSION_EXPIRY: &str = "mcp-event-store/v1/session_expiry";

    /// Format 1's era jump: after a lost relaxed session, a stream's next
    /// append went on at `era << 40` + 1.
    pub const fn era_base(era: u64) -> u64 {
        era << 40
    }

    /// Times as format 1 stored them (sign bit flipped, big-endian).
    fn time(millis: i64) -> [u8; 8] {
        ((millis as u64) ^ (1 << 63)).to_be_bytes()
    }

    pub struct Db {
        pub db: sled::Db,
        pub key: StreamKey,
        now: i64,
    }

    impl Db {
        /// A format 1 database whose last lost relaxed session began `era`
        /// (0: none).
        pub fn create(dir: &std::path::Path, era: u64) -> Self {
            let db = super::raw_open(dir);
            let key = StreamKey::generate().unwrap();
            let meta = db.open_tree(super::META).unwrap();
            meta.insert("stream_key", &key.as_bytes()[..]).unwrap();
            meta.insert("created_by", &b"mcp-event-store-sled 0.1.0"[..])
                .unwrap();
            meta.insert("format_version", &1u32.to_be_bytes()).unwrap();
            if era > 0 {
                meta.insert("era", &era.to_be_bytes()).unwrap();
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            Self { db, key, now }
        }

        /// A stream that last appended in `era`, retaining events `seqs`
        /// (payloads `<stream_id>-<seq>`), as format 1 kept it. Returns the
        /// ids format 1 issued for them.
        pub fn stream(
            &self,
            stream_id: &str,
            era: u64,
            seqs: std::ops::RangeInclusive<u64>,
        ) -> Vec<EventId> {
            let token = self.key.token(stream_id);
            let events = self.db.open_tree(EVENTS).unwrap();
            let mut ids = Vec::new();
            let mut cum = 0u64;
            for seq in seqs {
                let data = format!("{stream_id}-{seq}");
                cum += data.len() as u64;
                let mut value = time(self.now).to_vec();
                value.extend_from_slice(&u64::MAX.to_be_bytes()); // no retry hint
                value.extend_from_slice(&cum.to_be_bytes());
                value.extend_from_slice(data.as_bytes());
                events
                    .insert([&token.as_bytes()[..], &seq.to_be_bytes()].concat(), value)
                    .unwrap();
                ids.push(EventId::new(token, Position::seq(seq)));
            }
            self.record(stream_id, era);
            ids
        }

        /// A stream record and its age index entry.
        pub fn record(&self, stream_id: &str, era: u64) {
            let token = self.key.token(stream_id);
            let record = [
                &era.to_be_bytes()[..],
                &time(self.now),
                stream_id.as_bytes(),
            ]
            .concat();
            self.db
                .open_tree(STREAMS)
                .unwrap()
                .insert(token.as_bytes(), record)
                .unwrap();
            self.db
                .open_tree(STREAM_AGE)
                .unwrap()
                .insert([&time(self.now)[..], &token.as_bytes()[..]].concat(), &[])
                .unwrap();
        }

        /// A session valid for an hour.
        pub fn session(&self, session_id: &str, state: &[u8]) {
            let expires = time(self.now + 3_600_000);
            self.db
                .open_tree(SESSIONS)
                .unwrap()
                .insert(session_id, [&expires[..], state].concat())
                .unwrap();
            self.db
                .open_tree(SESSION_EXPIRY)
                .unwrap()
                .insert([&expires[..], session_id.as_bytes()].concat(), &[])
                .unwrap();
        }

        pub fn close(self) {
            self.db.flush().unwrap();
        }
    }
}

/// C12: a database the previous release wrote (format 1) is migrated on
/// open and keeps serving: its streams keep their events and go on in the
/// same life, ids that release issued still resume (and what it never
/// issued or purged is still refused), sessions stay; a stream format 1
/// would have jumped to a new era starts a new life instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_database_is_migrated_and_keeps_serving_its_events() {
    use mcp_event_store_core::{Position, SessionStore};
    let dir = tempfile::tempdir().unwrap();
    let era = 1;
    let base = format_1::era_base(era);
    let old = format_1::Db::create(dir.path(), era);
    // Appended since the lost session: numbered after the era jump.
    let current = old.stream("current", era, base + 1..=base + 3);
    // Not appended since: format 1 would jump it at its next append.
    let stale = old.stream("stale", 0, 1..=3);
    // Trimmed by retention: its first events are gone.
    let trimmed = old.stream("trimmed", era, base + 5..=base + 7);
    // A record whose events never made it (a crash mid-create): no stream.
    old.record("ghost", era);
    old.session("sess", b"state");
    old.close();

    let store = open(dir.path()).await.unwrap();
    // Ids of the previous release resume as before; events come back under
    // ids of this format, `<incarnation>-<seq>`, in one life per stream.
    let replayed = store
        .replay_events_after(&current[0].to_string())
        .await
        .unwrap();
    assert_eq!(replayed.stream_id, "current");
    let events: Vec<_> = replayed.events.try_collect().await.unwrap();
    let life = events[0].id.position.major;
    let ids: Vec<_> = events.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        [
            EventId::new(current[0].token, position(life, base + 2)),
            EventId::new(current[0].token, position(life, base + 3)),
        ]
    );
    let data: Vec<_> = events.iter().map(|e| e.data.to_vec()).collect();
    assert_eq!(
        data,
        [
            format!("current-{}", base + 2).into_bytes(),
            format!("current-{}", base + 3).into_bytes()
        ]
    );
    // Within a stream, ids of this format sort after those format 1 issued.
    assert!(ids.iter().all(|id| id.position > current[2].position));
    // The same event in either spelling.
    let respelled = EventId::new(current[0].token, position(life, base + 1));
    assert_eq!(
        replay(&store, &respelled).await.unwrap(),
        replay(&store, &current[0]).await.unwrap()
    );
    for id in current.iter().chain(&stale).chain(&trimmed) {
        let found = store
            .get_stream_id_for_event_id(&id.to_string())
            .await
            .unwrap();
        assert!(found.is_some(), "lookup of {id}, issued by format 1");
    }
    assert_eq!(
        replay(&store, &stale[0]).await.unwrap(),
        ["stale-2", "stale-3"]
    );
    assert_eq!(
        replay(&store, &trimmed[1]).await.unwrap(),
        [format!("trimmed-{}", base + 7)]
    );
    // What format 1 never issued, or purged, is still refused. (`base`,
    // the number its era jump skipped, passes as a cursor just before the
    // first retained event, as it did in format 1: it resumes the whole
    // stream, without a gap.)
    let token = current[0].token;
    for never in [0, 1, base - 1, base + 4, u64::MAX] {
        let id = EventId::new(token, Position::seq(never));
        assert!(
            matches!(
                replay(&store, &id).await,
                Err(Error::UnknownEventId { .. } | Error::EventsPurged { .. })
            ),
            "{id}"
        );
        let found = store
            .get_stream_id_for_event_id(&id.to_string())
            .await
            .unwrap();
        assert_eq!(found, None, "lookup of {id}");
    }
    assert!(matches!(
        replay(
            &store,
            &EventId::new(trimmed[0].token, Position::seq(base + 3))
        )
        .await,
        Err(Error::EventsPurged { .. })
    ));
    // A session format 1 kept under its id is not found by it any more
    // (C20: sessions are looked up by the digest of their id); its client
    // starts a new one, and the record goes with its time to live.
    assert_eq!(store.get_session("sess").await.unwrap(), None);

    // "current" goes on in the same life, after its last number.
    let next = append(&store, "current", "next").await;
    assert_eq!(next.position, position(life, base + 4));
    assert_eq!(replay(&store, &current[2]).await.unwrap(), ["next"]);
    // "stale" starts a new life, as format 1 would have jumped it.
    let restarted = append(&store, "stale", "again").await;
    assert_eq!(restarted.position.minor, 1);
    assert!(restarted.position.major > life);
    assert!(stale.iter().all(|id| restarted.position > id.position));
    for id in &stale {
        assert_gone(&store, id).await;
    }
    // "ghost" never existed: it starts a life of its own, whose ids sort
    // after any id format 1 could have issued to a stream of that name
    // before deleting it.
    let ghost = append(&store, "ghost", "boo").await;
    assert_eq!(ghost.position.minor, 1);
    assert!(ghost.position.major > life);
    assert_ne!(ghost.position.major, restarted.position.major);
    assert!(ghost.position > Position::seq(format_1::era_base(era + 1) - 1));
    store.close().await.unwrap();

    // Migrated once, to this format; format 1's records are gone.
    {
        let db = raw_open(dir.path());
        let meta = db.open_tree(META).unwrap();
        assert_eq!(
            meta.get("format_version").unwrap().as_deref(),
            Some(&FORMAT_VERSION.to_be_bytes()[..])
        );
        assert_eq!(meta.get("era").unwrap(), None);
        assert!(db.open_tree(format_1::STREAMS).unwrap().is_empty());
    }
    let store = open(dir.path()).await.unwrap();
    assert_eq!(replay(&store, &current[1]).await.unwrap().len(), 2);
    assert_eq!(replay(&store, &restarted).await.unwrap().len(), 0);
    let after = append(&store, "current", "x").await;
    assert_eq!(after.position, position(life, base + 5));
    store.close().await.unwrap();
}

/// A format 1 database whose relaxed session was lost is migrated, then
/// every stream starts a new life at its next append, as format 1 would
/// have jumped every stream to a new era.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_database_left_by_a_lost_relaxed_session_is_migrated_then_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let old = format_1::Db::create(dir.path(), 0);
    let ids = old.stream("s", 0, 1..=3);
    old.db
        .open_tree(META)
        .unwrap()
        .insert("relaxed_open", &[1u8][..])
        .unwrap();
    old.close();

    let store = open(dir.path()).await.unwrap();
    assert_eq!(replay(&store, &ids[0]).await.unwrap(), ["s-2", "s-3"]);
    let lost = EventId::new(ids[0].token, mcp_event_store_core::Position::seq(4));
    assert!(matches!(
        replay(&store, &lost).await,
        Err(Error::UnknownEventId { .. })
    ));
    let new = append(&store, "s", "new").await;
    assert_eq!(new.position.minor, 1);
    for id in ids.iter().chain([&lost]) {
        assert_gone(&store, id).await;
    }
    store.close().await.unwrap();
}

#[test]
fn outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let opened =
        futures_util::FutureExt::now_or_never(SledStore::open(dir.path(), SledOptions::default()));
    assert!(matches!(opened, Some(Err(Error::Config(_)))), "{opened:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_applies_limits_lowered_since_the_events_were_appended() {
    use mcp_event_store_core::Retention;
    let dir = tempfile::tempdir().unwrap();
    let loose =
        SledOptions::default().store(StoreOptions::default().retention(Retention::unbounded()));
    let tight = Retention::unbounded().max_events_per_stream(5);

    // Appended without limits by an earlier run.
    let store = SledStore::open(dir.path(), loose.clone()).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..20u8 {
        ids.push(store.store_event("s", NewEvent::new(&[i])).await.unwrap());
    }
    store.close().await.unwrap();

    let store = SledStore::open(
        dir.path(),
        SledOptions::default().store(StoreOptions::default().retention(tight)),
    )
    .await
    .unwrap();
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 15, "{report:?}");
    assert!(matches!(
        store.replay_events_after(&ids[0].to_string()).await,
        Err(Error::EventsPurged { .. })
    ));
    let replay = store
        .replay_events_after(&ids[14].to_string())
        .await
        .unwrap();
    assert_eq!(
        replay.events.try_collect::<Vec<_>>().await.unwrap().len(),
        5
    );

    // A looser handle in the same process appends; the tight one trims it.
    let other = store
        .handle_with_options(StoreOptions::default().retention(Retention::unbounded()))
        .await
        .unwrap();
    for i in 0..10u8 {
        other.store_event("t", NewEvent::new(&[i])).await.unwrap();
    }
    assert_eq!(store.purge_expired().await.unwrap().events, 5);
    assert_eq!(store.purge_expired().await.unwrap().events, 0);
    other.close().await.unwrap();
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_walks_many_streams_and_sessions_in_batches() {
    use mcp_event_store_core::{ManualClock, Retention, SessionStore};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let options = StoreOptions::default()
        .retention(Retention::unbounded().max_age(Duration::from_secs(60)))
        .clock(clock.clone());
    let store = SledStore::open(dir.path(), SledOptions::default().store(options))
        .await
        .unwrap();
    for s in 0..600 {
        for _ in 0..2 {
            store
                .store_event(&format!("s{s}"), NewEvent::new(b"old"))
                .await
                .unwrap();
        }
        let ttl = Duration::from_secs(if s % 2 == 0 { 30 } else { 600 });
        store
            .put_session(&format!("sess{s}"), b"x", ttl)
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(61));
    let mut fresh = Vec::new();
    for s in 0..100 {
        fresh.push(
            store
                .store_event(&format!("s{s}"), NewEvent::new(b"new"))
                .await
                .unwrap(),
        );
    }
    let report = store.purge_expired().await.unwrap();
    assert_eq!(report.events, 1200, "{report:?}");
    assert_eq!(report.streams, 500, "{report:?}");
    assert_eq!(report.sessions, 300, "{report:?}");
    for id in &fresh {
        assert!(
            store
                .get_stream_id_for_event_id(&id.to_string())
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(
        store.get_session("sess1").await.unwrap().as_deref(),
        Some(&b"x"[..])
    );
    assert_eq!(store.get_session("sess0").await.unwrap(), None);
    assert_eq!(store.purge_expired().await.unwrap(), Default::default());
    store.close().await.unwrap();
}
