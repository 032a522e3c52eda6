//! C15 Inspect: store-wide totals and the stream listing, both read from the
//! stream rows (one primary-key probe per stream for its oldest retained
//! event, never a scan of the events), and the health check.

use sqlx::Row;
use sqlx::postgres::PgRow;

use mcp_event_store_core::backend::StreamToken;
use mcp_event_store_core::{
    Error, HealthReport, Result, Retention, Setting, StoreStats, StreamCursor, StreamInfo,
    StreamPage,
};

use crate::PostgresStore;
use crate::error::{NAME, backend};
use crate::options::{STATS_BATCH, Vacuum};
use crate::replay::decode_id;
use crate::setup::{AUTOVACUUM_ON, TRACK_COUNTS_ON, VacuumSettings, table_reset};

fn corrupt_summary() -> Error {
    Error::Corrupt(
        "a stream's oldest retained event row is missing (its stream row says it is retained)"
            .into(),
    )
}

fn get<'r, T>(row: &'r PgRow, column: usize) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column).map_err(backend)
}

/// The totals, [`STATS_BATCH`] stream rows per statement, in token order.
/// Streams appended, purged or deleted meanwhile are counted as each batch
/// found them.
pub(crate) async fn stats(store: &PostgresStore) -> Result<StoreStats> {
    let mut stats = StoreStats::default();
    let mut after: Vec<u8> = Vec::new();
    loop {
        let row = sqlx::query(store.sql().stats_page.clone())
            .bind(&after)
            .bind(STATS_BATCH as i64)
            .fetch_one(store.pool())
            .await
            .map_err(backend)?;
        let rows: i64 = get(&row, 0)?;
        let last: Option<Vec<u8>> = get(&row, 1)?;
        let streams: i64 = get(&row, 2)?;
        let events: i64 = get(&row, 3)?;
        let bytes: i64 = get(&row, 4)?;
        let oldest: Option<i64> = get(&row, 5)?;
        let newest: Option<i64> = get(&row, 6)?;
        let missing: i64 = get(&row, 7)?;
        if missing > 0 {
            return Err(corrupt_summary());
        }
        stats.streams += streams as u64;
        stats.events += events as u64;
        stats.bytes += bytes as u64;
        stats.oldest_millis = match (stats.oldest_millis, oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        stats.newest_millis = stats.newest_millis.max(newest);
        match last {
            Some(last) if rows >= STATS_BATCH as i64 => after = last,
            _ => return Ok(stats),
        }
    }
}

/// One page of streams with retained events, in token order; the cursor
/// is the last token's text form.
pub(crate) async fn streams(
    store: &PostgresStore,
    after: Option<&StreamCursor>,
    limit: usize,
) -> Result<StreamPage> {
    let after: Vec<u8> = match after {
        None => Vec::new(),
        Some(cursor) => StreamToken::parse(cursor.as_str())
            .ok_or_else(|| Error::Config(format!("not a stream cursor of this store: {cursor:?}")))?
            .as_bytes()
            .to_vec(),
    };
    // One row more than asked: whether another page follows.
    let rows = sqlx::query(store.sql().list_page.clone())
        .bind(&after)
        .bind(limit as i64 + 1)
        .fetch_all(store.pool())
        .await
        .map_err(backend)?;
    let more = rows.len() > limit;
    let mut streams = Vec::with_capacity(rows.len().min(limit));
    let mut last = None;
    for row in rows.into_iter().take(limit) {
        let token: Vec<u8> = get(&row, 0)?;
        let stream_id = decode_id(get(&row, 1)?)?;
        let events: i64 = get(&row, 2)?;
        let bytes: Option<i64> = get(&row, 3)?;
        let oldest: Option<i64> = get(&row, 4)?;
        let newest: i64 = get(&row, 5)?;
        let bytes = bytes.ok_or_else(corrupt_summary)?;
        streams.push(StreamInfo::new(
            stream_id,
            events as u64,
            bytes as u64,
            oldest,
            Some(newest),
        ));
        last = Some(token);
    }
    let next = match (more, last) {
        (true, Some(token)) => Some(StreamCursor::new(
            StreamToken::from_bytes(&token)
                .ok_or_else(|| Error::Corrupt(format!("a stream token of {} bytes", token.len())))?
                .to_text(),
        )),
        _ => None,
    };
    Ok(StreamPage::new(streams, next))
}

/// The server settings the health check judges, as the store's pooled
/// connections see them.
#[derive(Clone, Debug)]
pub(crate) struct ServerSettings {
    pub synchronous_commit: String,
    pub fsync: String,
    pub full_page_writes: String,
    pub vacuum: VacuumSettings,
}

/// The health check: the schema's format and the settings that decide
/// durability and boundedness.
pub(crate) async fn check(store: &PostgresStore) -> Result<HealthReport> {
    let row = sqlx::query(store.sql().durability.clone())
        .fetch_one(store.pool())
        .await
        .map_err(backend)?;
    let format: Option<i64> = get(&row, 3)?;
    let format = format.and_then(|v| u32::try_from(v).ok()).ok_or_else(|| {
        Error::Corrupt(format!(
            "schema \"{}\" records no applied migration",
            store.schema()
        ))
    })?;
    let server = ServerSettings {
        synchronous_commit: get(&row, 0)?,
        fsync: get(&row, 1)?,
        full_page_writes: get(&row, 2)?,
        vacuum: VacuumSettings::read(store.pool(), store.schema()).await?,
    };
    Ok(HealthReport::new(
        NAME,
        format,
        settings(
            &server,
            store.schema(),
            store.vacuum(),
            &store.options().retention,
        ),
    ))
}

/// Judges each setting: durability first (`synchronous_commit`, `fsync`,
/// `full_page_writes`), then what reclaims the space of purged events
/// (`autovacuum`, `track_counts`, the tables' `autovacuum_enabled`, and the
/// store's own `vacuum` option, which stands in for autovacuum when on),
/// and the handle's retention (without a maximum age nothing ever removes
/// a stream).
pub(crate) fn settings(
    server: &ServerSettings,
    schema: &str,
    vacuum: Vacuum,
    retention: &Retention,
) -> Vec<Setting> {
    let mut settings = Vec::with_capacity(8);
    let sync = server.synchronous_commit.as_str();
    settings.push(if sync == "off" {
        Setting::warn(
            "synchronous_commit",
            sync,
            "appends are acknowledged before their WAL is flushed, so a server crash loses the \
             last ones: set synchronous_commit = on for the store's role or database (ALTER \
             ROLE <role> SET synchronous_commit = on) or in postgresql.conf",
        )
    } else {
        Setting::ok("synchronous_commit", sync)
    });
    settings.push(if server.fsync == "on" {
        Setting::ok("fsync", "on")
    } else {
        Setting::warn(
            "fsync",
            server.fsync.as_str(),
            "an operating-system crash or power loss can lose or corrupt committed events: \
             ALTER SYSTEM SET fsync = on; SELECT pg_reload_conf();",
        )
    });
    settings.push(if server.full_page_writes == "on" {
        Setting::ok("full_page_writes", "on")
    } else {
        Setting::warn(
            "full_page_writes",
            server.full_page_writes.as_str(),
            "a crash in the middle of a page write can leave a page the WAL cannot repair: \
             ALTER SYSTEM SET full_page_writes = on; SELECT pg_reload_conf();",
        )
    });

    let auto = vacuum == Vacuum::Auto;
    let v = &server.vacuum;
    // A setting that keeps autovacuum from the store's tables: fine when
    // the store vacuums them itself, a warning otherwise.
    let blocked = |name: &str, value: String, remedy: String| {
        if auto {
            Setting::ok(name, format!("{value} (the store vacuums: vacuum=auto)"))
        } else {
            Setting::warn(
                name,
                value,
                format!(
                    "autovacuum never reclaims the space of purged events, so the tables grow \
                     with every event ever appended: {remedy} Or open the store with \
                     vacuum=auto."
                ),
            )
        }
    };
    settings.push(if v.autovacuum {
        Setting::ok("autovacuum", "on")
    } else {
        blocked("autovacuum", "off".into(), AUTOVACUUM_ON.into())
    });
    settings.push(if v.track_counts {
        Setting::ok("track_counts", "on")
    } else {
        blocked("track_counts", "off".into(), TRACK_COUNTS_ON.into())
    });
    settings.push(if v.disabled.is_empty() {
        Setting::ok("autovacuum_enabled", "on (events, streams, sessions)")
    } else {
        let resets: Vec<String> = v.disabled.iter().map(|t| table_reset(schema, t)).collect();
        blocked(
            "autovacuum_enabled",
            format!("off ({})", v.disabled.join(", ")),
            resets.join(" "),
        )
    });
    settings.push(match (vacuum, v.reclaims()) {
        (Vacuum::Auto, _) => {
            Setting::ok("vacuum", "auto (purge_expired vacuums the store's tables)")
        }
        (_, true) => Setting::ok("vacuum", "off (autovacuum reclaims the space)"),
        (_, false) => Setting::warn(
            "vacuum",
            "off",
            "neither autovacuum nor the store reclaims the space of purged events: open the \
             store with vacuum=auto (URL parameter, or PostgresOptions::vacuum) and run \
             purge_expired on an interval, or fix the autovacuum settings above",
        ),
    });
    settings.push(Setting::retention(retention));
    settings
}

#[cfg(test)]
mod tests {
    use mcp_event_store_core::Verdict;

    use super::*;

    fn server(sync: &str, vacuum: VacuumSettings) -> ServerSettings {
        ServerSettings {
            synchronous_commit: sync.into(),
            fsync: "on".into(),
            full_page_writes: "on".into(),
            vacuum,
        }
    }

    fn healthy_vacuum() -> VacuumSettings {
        VacuumSettings {
            autovacuum: true,
            track_counts: true,
            disabled: Vec::new(),
        }
    }

    fn warnings(settings: &[Setting]) -> Vec<&str> {
        settings
            .iter()
            .filter(|s| s.verdict != Verdict::Ok)
            .map(|s| s.name.as_str())
            .collect()
    }

    #[test]
    fn safe_settings_are_all_ok() {
        for sync in ["on", "local", "remote_write", "remote_apply"] {
            let all = settings(
                &server(sync, healthy_vacuum()),
                "s",
                Vacuum::Off,
                &Retention::default(),
            );
            assert!(warnings(&all).is_empty(), "{all:?}");
            assert_eq!(all.len(), 8);
        }
    }

    #[test]
    fn risky_durability_settings_warn() {
        let mut risky = server("off", healthy_vacuum());
        risky.fsync = "off".into();
        risky.full_page_writes = "off".into();
        let all = settings(&risky, "s", Vacuum::Auto, &Retention::default());
        assert_eq!(
            warnings(&all),
            ["synchronous_commit", "fsync", "full_page_writes"]
        );
    }

    #[test]
    fn autovacuum_settings_warn_unless_the_store_vacuums() {
        let broken = VacuumSettings {
            autovacuum: false,
            track_counts: false,
            disabled: vec!["events".into(), "events (TOAST)".into()],
        };
        let off = settings(
            &server("on", broken.clone()),
            "s",
            Vacuum::Off,
            &Retention::default(),
        );
        assert_eq!(
            warnings(&off),
            ["autovacuum", "track_counts", "autovacuum_enabled", "vacuum"]
        );
        let tables = off.iter().find(|s| s.name == "autovacuum_enabled").unwrap();
        assert_eq!(tables.value, "off (events, events (TOAST))");
        let Verdict::Warn { remedy } = &tables.verdict else {
            unreachable!()
        };
        assert!(
            remedy.contains("ALTER TABLE \"s\".events RESET (autovacuum_enabled);")
                && remedy.contains("RESET (toast.autovacuum_enabled);")
                && remedy.contains("vacuum=auto"),
            "{remedy}"
        );
        let auto = settings(
            &server("on", broken),
            "s",
            Vacuum::Auto,
            &Retention::default(),
        );
        assert!(warnings(&auto).is_empty(), "{auto:?}");
        assert!(
            auto[3].value.starts_with("off (the store vacuums"),
            "{auto:?}"
        );
    }

    #[test]
    fn retention_without_a_maximum_age_warns() {
        let all = settings(
            &server("on", healthy_vacuum()),
            "s",
            Vacuum::Off,
            &Retention::unbounded().max_events_per_stream(5),
        );
        assert_eq!(warnings(&all), ["retention"]);
        assert_eq!(
            all[7].value,
            "max_age=none max_events_per_stream=5 max_bytes_per_stream=none"
        );
    }
}
