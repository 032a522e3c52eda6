//! How to open a [`PostgresStore`](crate::PostgresStore).

use std::str::FromStr;
use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};
use sqlx::postgres::PgConnectOptions;

/// The schema the store uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "mcp_event_store";

/// The `application_name` the store's connections report unless the URL or
/// [`PostgresOptions::application_name`] names another; it is how an operator
/// finds them in `pg_stat_activity`.
pub const DEFAULT_APPLICATION_NAME: &str = "mcp-event-store";

/// Most events one replay query reads. Larger `LIMIT`s make PostgreSQL 15
/// give up the primary-key range scan for a parallel sequential scan plus a
/// sort (measured: 2.2 times slower at 10,000), so
/// [`StoreOptions::page_size`] is capped here.
pub const MAX_PAGE_SIZE: usize = 1_000;

/// Whether [`purge_expired`](mcp_event_store_core::EventStore::purge_expired)
/// also vacuums the store's tables. URL parameter `vacuum=off|auto`.
///
/// Rows a purge deletes leave dead tuples behind; until a `VACUUM` marks
/// their space free, new events go at the end of the table, which then
/// grows with every event ever appended, however few are retained. That is
/// autovacuum's job; where autovacuum is off or lags, [`Vacuum::Auto`] has
/// the purge do it (see the crate docs, "Disk space and autovacuum").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Vacuum {
    /// Leave reclaiming space to autovacuum (the default).
    #[default]
    Off,
    /// After a purge, once this handle's purges have deleted at least
    /// [`VACUUM_MIN_ROWS`] rows and at least a fifth of the rows the
    /// store's tables held when last counted, run a plain `VACUUM` (never
    /// `FULL`) of the store's tables. It takes no lock that appends or
    /// replays wait for; it cannot run in a transaction, so it runs on a
    /// pooled connection of its own.
    Auto,
}

impl Vacuum {
    fn parse(value: &str) -> Result<Self> {
        match value {
            "off" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            other => Err(Error::Config(format!(
                "unknown value {:?} of the postgres URL parameter vacuum (known: off, auto)",
                other.chars().take(80).collect::<String>()
            ))),
        }
    }
}

/// Rows a handle's purges delete at least before [`Vacuum::Auto`] vacuums.
pub const VACUUM_MIN_ROWS: u64 = 1_000;

/// How often a follower re-reads its stream when no wake-up came, unless
/// [`PostgresOptions::follow_recheck`] says otherwise: the safety net for a
/// notification lost with the listener's connection.
pub const DEFAULT_FOLLOW_RECHECK: Duration = Duration::from_secs(5);

/// Most rows (events, streams or sessions) one retention statement
/// touches.
pub const BATCH: usize = 1_000;

/// Stream rows one `stats` statement totals: each statement stays short
/// (a few milliseconds per thousand streams), so `stats` on a large store
/// never holds one snapshot for long (which would keep vacuum from
/// reclaiming rows deleted meanwhile).
pub(crate) const STATS_BATCH: usize = 10_000;

/// Events one batched append statement carries at most.
pub(crate) const APPEND_BATCH_EVENTS: usize = 64;

/// Payload bytes one batched append statement carries at most (a larger
/// single event still goes, alone).
pub(crate) const APPEND_BATCH_BYTES: usize = 4 << 20;

/// Batched append statements in flight at once, each on its own pooled
/// connection. One runs at a time as a rule; more start only when a full
/// batch is waiting or the running ones have stalled (see
/// [`APPEND_BATCH_STALL`]).
pub(crate) const APPEND_BATCHES_IN_FLIGHT: usize = 4;

/// How long the newest running batch holds the next one back: past this,
/// appends waiting start a batch beside it, so that a batch waiting for a
/// stream row's lock or a slow commit does not hold up every other stream.
pub(crate) const APPEND_BATCH_STALL: std::time::Duration = std::time::Duration::from_millis(20);

/// Options for [`PostgresStore::connect_with`](crate::PostgresStore::connect_with).
///
/// ```
/// use mcp_event_store_postgres::PostgresOptions;
///
/// let options = PostgresOptions::default()
///     .schema("tenant_a_events")
///     .max_connections(16);
/// assert_eq!(options.schema, "tenant_a_events");
/// assert!(options.run_migrations);
/// ```
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// The options every backend shares: retention, payload limit, page
    /// size (capped at [`MAX_PAGE_SIZE`]), clock.
    pub store: StoreOptions,
    /// The schema holding the store's tables, created if missing. Must match
    /// `^[a-z_][a-z0-9_]{0,62}$`; it is quoted wherever it appears in SQL.
    /// Several independent stores can share a database under different
    /// schemas. Default [`DEFAULT_SCHEMA`].
    pub schema: String,
    /// Create the schema and apply the embedded migrations when opening
    /// (default `true`). Turn it off when a privileged deploy step migrates
    /// and the application's role may not run DDL; the store then only checks
    /// that the schema is at the format this release expects.
    pub run_migrations: bool,
    /// Most connections the store's pool opens (default 10).
    pub max_connections: u32,
    /// How long a call waits for a free pooled connection before failing
    /// (default 10 s).
    pub acquire_timeout: Duration,
    /// The `application_name` of the store's connections (URL parameter
    /// `application_name=`, which wins); `None`: the environment's
    /// `PGAPPNAME`, else [`DEFAULT_APPLICATION_NAME`].
    pub application_name: Option<String>,
    /// Whether purges vacuum the store's tables (default [`Vacuum::Off`]:
    /// autovacuum's job).
    pub vacuum: Vacuum,
    /// How often a follower re-reads its stream by itself, when no
    /// wake-up came (default [`DEFAULT_FOLLOW_RECHECK`], 5 s). Wake-ups
    /// (in process, and `LISTEN`/`NOTIFY` between handles) deliver events
    /// within about a millisecond; this only bounds how late an event is
    /// whose notification was lost (the listener's connection died). Each
    /// recheck costs every idle follower one indexed read. URL parameter
    /// `follow_recheck_ms=`.
    pub follow_recheck: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            store: StoreOptions::default(),
            schema: DEFAULT_SCHEMA.to_owned(),
            run_migrations: true,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            application_name: None,
            vacuum: Vacuum::Off,
            follow_recheck: DEFAULT_FOLLOW_RECHECK,
        }
    }
}

impl PostgresOptions {
    /// Sets the shared store options.
    pub fn store(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Sets the schema name.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Chooses whether opening runs the embedded migrations.
    pub fn run_migrations(mut self, run: bool) -> Self {
        self.run_migrations = run;
        self
    }

    /// Sets the pool size.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets how long a call waits for a pooled connection.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets the connections' `application_name`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// Sets whether purges vacuum the store's tables.
    pub fn vacuum(mut self, vacuum: Vacuum) -> Self {
        self.vacuum = vacuum;
        self
    }

    /// Sets how often an idle follower re-reads its stream by itself.
    pub fn follow_recheck(mut self, every: Duration) -> Self {
        self.follow_recheck = every;
        self
    }

    /// Options read from a connection URL: the defaults, with every
    /// parameter the URL gives applied. The URL's location (host, port, database, user) and
    /// the driver's parameters stay the connection's:
    /// [`PostgresStore::connect_with`](crate::PostgresStore::connect_with)
    /// takes them from the URL it is given.
    ///
    /// This crate's parameters:
    ///
    /// * `schema=name`: [`PostgresOptions::schema`];
    /// * `vacuum=off|auto`: [`PostgresOptions::vacuum`];
    /// * `follow_recheck_ms=N`: [`PostgresOptions::follow_recheck`], in
    ///   milliseconds (at least 1).
    ///
    /// The driver's (sqlx's) parameters, checked here and applied by the
    /// driver: `sslmode` (or `ssl-mode`), `sslrootcert` (`ssl-root-cert`,
    /// `ssl-ca`), `sslcert` (`ssl-cert`), `sslkey` (`ssl-key`),
    /// `statement-cache-capacity`, `host`, `hostaddr`, `port`, `dbname`,
    /// `user`, `password`, `options`, `options[name]`, and
    /// `application_name`, which also sets
    /// [`PostgresOptions::application_name`].
    ///
    /// Any other parameter, one given twice (under any of its names), or a
    /// value a parameter does not take is [`Error::Config`] naming it.
    ///
    /// ```
    /// use mcp_event_store_postgres::{PostgresOptions, Vacuum};
    ///
    /// let options = PostgresOptions::from_url(
    ///     "postgres://app@db/app?schema=tenant_a&sslmode=require&vacuum=auto&follow_recheck_ms=2000",
    /// )
    /// .unwrap();
    /// assert_eq!(options.schema, "tenant_a");
    /// assert_eq!(options.vacuum, Vacuum::Auto);
    /// assert_eq!(options.follow_recheck, std::time::Duration::from_secs(2));
    ///
    /// let typo = PostgresOptions::from_url("postgres://app@db/app?sslmod=require").unwrap_err();
    /// assert!(typo.to_string().contains("sslmod"));
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        Self::default().apply_url(url).map(|(options, _)| options)
    }

    /// Applies a connection URL's parameters over these options (a
    /// parameter the URL gives wins), as [`from_url`](Self::from_url)
    /// reads them, and returns the connect options the driver gets: the
    /// URL's location and the driver's parameters.
    pub(crate) fn apply_url(mut self, url: &str) -> Result<(Self, PgConnectOptions)> {
        let (parameters, driver_url) = split_url(url)?;
        self.apply_own(&parameters)?;
        let connect = PgConnectOptions::from_str(&driver_url)
            .map_err(|e| Error::Config(format!("invalid PostgreSQL URL: {e}")))?;
        if parameters.application_name {
            self.application_name = connect.get_application_name().map(str::to_owned);
        }
        Ok((self, connect))
    }

    /// Applies this crate's own parameters.
    fn apply_own(&mut self, parameters: &UrlParameters<'_>) -> Result<()> {
        if let Some(schema) = parameters.schema {
            validate_schema_name(schema)?;
            self.schema = schema.to_owned();
        }
        if let Some(vacuum) = parameters.vacuum {
            self.vacuum = Vacuum::parse(vacuum)?;
        }
        if let Some(recheck) = parameters.follow_recheck_ms {
            self.follow_recheck = parse_recheck_ms(recheck)?;
        }
        Ok(())
    }

    /// Checks the options before anything touches the server.
    pub fn validate(&self) -> Result<()> {
        self.store.validate()?;
        validate_schema_name(&self.schema)?;
        if self.max_connections == 0 {
            return Err(Error::Config("max_connections must be at least 1".into()));
        }
        if self.follow_recheck < Duration::from_millis(1) {
            return Err(Error::Config("follow_recheck must be at least 1 ms".into()));
        }
        Ok(())
    }
}

fn parse_recheck_ms(value: &str) -> Result<Duration> {
    match value.parse::<u64>() {
        Ok(ms) if ms >= 1 => Ok(Duration::from_millis(ms)),
        _ => Err(Error::Config(format!(
            "the postgres URL parameter follow_recheck_ms takes a whole number of \
             milliseconds, at least 1, not {:?}",
            value.chars().take(80).collect::<String>()
        ))),
    }
}

/// This crate's own URL parameters, taken out of the URL before the
/// driver reads it.
const OWN_PARAMETERS: &[&str] = &["schema", "vacuum", "follow_recheck_ms"];

/// The driver's URL parameters (sqlx 0.9, `PgConnectOptions`), each with
/// its other names; `options[name]` comes on top.
const DRIVER_PARAMETERS: &[&[&str]] = &[
    &["sslmode", "ssl-mode"],
    &["sslrootcert", "ssl-root-cert", "ssl-ca"],
    &["sslcert", "ssl-cert"],
    &["sslkey", "ssl-key"],
    &["statement-cache-capacity"],
    &["host"],
    &["hostaddr"],
    &["port"],
    &["dbname"],
    &["user"],
    &["password"],
    &["application_name"],
    &["options"],
];

/// The parameters of a URL that [`split_url`] read: this crate's values
/// (raw, as the URL spells them), and whether the driver gets an
/// `application_name`.
#[derive(Debug, Default)]
struct UrlParameters<'a> {
    schema: Option<&'a str>,
    vacuum: Option<&'a str>,
    follow_recheck_ms: Option<&'a str>,
    application_name: bool,
}

/// The name a URL parameter is known by (its first name), or `None` when
/// it is no parameter of this backend.
fn parameter_name(key: &str) -> Option<&str> {
    if OWN_PARAMETERS.contains(&key) {
        return Some(key);
    }
    if key.starts_with("options[") && key.ends_with(']') {
        return Some(key);
    }
    DRIVER_PARAMETERS
        .iter()
        .find(|names| names.contains(&key))
        .map(|names| names[0])
}

/// Reads a connection URL's parameters: this crate's own, taken out, and
/// the URL left for the driver (its location, the driver's parameters and
/// any fragment). An unknown or repeated parameter is [`Error::Config`].
fn split_url(url: &str) -> Result<(UrlParameters<'_>, String)> {
    let mut parameters = UrlParameters::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((parameters, url.to_owned()));
    };
    // A fragment is not part of the query.
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let quoted = |key: &str| format!("{:?}", key.chars().take(80).collect::<String>());
    let mut seen: Vec<&str> = Vec::new();
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(name) = parameter_name(key) else {
            return Err(Error::Config(format!(
                "unknown postgres URL parameter {}; this backend takes {} and the driver's \
                 {}, options[name]",
                quoted(key),
                OWN_PARAMETERS.join(", "),
                DRIVER_PARAMETERS
                    .iter()
                    .map(|names| names[0])
                    .collect::<Vec<_>>()
                    .join(", "),
            )));
        };
        if seen.contains(&name) {
            return Err(Error::Config(format!(
                "the postgres URL parameter {} is given twice",
                quoted(name)
            )));
        }
        seen.push(name);
        let slot = match name {
            "schema" => &mut parameters.schema,
            "vacuum" => &mut parameters.vacuum,
            "follow_recheck_ms" => &mut parameters.follow_recheck_ms,
            _ => {
                parameters.application_name |= name == "application_name";
                rest.push(pair);
                continue;
            }
        };
        *slot = Some(value);
    }
    let mut driver_url = base.to_owned();
    if !rest.is_empty() {
        driver_url.push('?');
        driver_url.push_str(&rest.join("&"));
    }
    if let Some(fragment) = fragment {
        driver_url.push('#');
        driver_url.push_str(fragment);
    }
    Ok((parameters, driver_url))
}

/// The schema a connection URL names (`schema=`), if any, and the URL
/// left for the driver; every parameter checked as
/// [`PostgresOptions::from_url`] checks it.
#[cfg(feature = "conformance")]
pub(crate) fn schema_and_driver_url(url: &str) -> Result<(Option<String>, String)> {
    let (parameters, driver_url) = split_url(url)?;
    let mut options = PostgresOptions::default();
    options.apply_own(&parameters)?;
    Ok((parameters.schema.map(|_| options.schema), driver_url))
}

/// Checks that `schema` is a plain lowercase identifier,
/// `^[a-z_][a-z0-9_]{0,62}$`, so it can be quoted into SQL with no escaping
/// and names the same schema quoted or not.
///
/// ```
/// use mcp_event_store_postgres::validate_schema_name;
///
/// assert!(validate_schema_name("mcp_event_store").is_ok());
/// assert!(validate_schema_name("events\"; DROP SCHEMA public; --").is_err());
/// assert!(validate_schema_name("Events").is_err());
/// ```
pub fn validate_schema_name(schema: &str) -> Result<()> {
    let mut bytes = schema.bytes();
    let valid = match bytes.next() {
        Some(first) => {
            (first == b'_' || first.is_ascii_lowercase())
                && schema.len() <= 63
                && bytes.all(|b| b == b'_' || b.is_ascii_lowercase() || b.is_ascii_digit())
        }
        None => false,
    };
    if valid {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "schema name {:?} is not a plain identifier matching ^[a-z_][a-z0-9_]{{0,62}}$",
            schema.chars().take(80).collect::<String>()
        )))
    }
}

/// The schema as a quoted identifier, for splicing into SQL. Only called on
/// names [`validate_schema_name`] accepted, which contain no quote.
pub(crate) fn quote_schema(schema: &str) -> String {
    debug_assert!(validate_schema_name(schema).is_ok());
    format!("\"{schema}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for good in ["a", "_", "mcp_event_store", "s0", &"x".repeat(63)] {
            assert!(validate_schema_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "0abc",
            "Abc",
            "a-b",
            "a b",
            "a\"b",
            "a;b",
            "é",
            "a\0",
            &"x".repeat(64),
        ] {
            assert!(validate_schema_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn options_validate() {
        assert!(PostgresOptions::default().validate().is_ok());
        assert!(
            PostgresOptions::default()
                .max_connections(0)
                .validate()
                .is_err()
        );
        assert!(PostgresOptions::default().schema("").validate().is_err());
        assert!(
            PostgresOptions::default()
                .follow_recheck(Duration::ZERO)
                .validate()
                .is_err()
        );
    }

    /// The URL the driver gets, after [`split_url`].
    fn driver_url(url: &str) -> String {
        split_url(url).unwrap().1
    }

    #[test]
    fn from_url_reads_every_parameter() {
        let options = PostgresOptions::from_url("postgres://u@h/db").unwrap();
        assert_eq!(options.schema, DEFAULT_SCHEMA);
        assert_eq!(options.vacuum, Vacuum::Off);
        assert_eq!(options.follow_recheck, DEFAULT_FOLLOW_RECHECK);
        assert_eq!(options.application_name, None);
        assert_eq!(driver_url("postgres://u@h/db"), "postgres://u@h/db");

        let options = PostgresOptions::from_url("postgres://u@h/db?schema=s1").unwrap();
        assert_eq!(options.schema, "s1");
        assert_eq!(
            driver_url("postgres://u@h/db?schema=s1"),
            "postgres://u@h/db"
        );

        let url = "postgres://u@h/db?application_name=a&vacuum=auto&&sslmode=disable&schema=s2";
        let options = PostgresOptions::from_url(url).unwrap();
        assert_eq!(options.schema, "s2");
        assert_eq!(options.vacuum, Vacuum::Auto);
        assert_eq!(options.application_name.as_deref(), Some("a"));
        assert_eq!(
            driver_url(url),
            "postgres://u@h/db?application_name=a&sslmode=disable"
        );

        let url = "postgres://u@h/db?follow_recheck_ms=250&sslmode=disable#f";
        let options = PostgresOptions::from_url(url).unwrap();
        assert_eq!(options.follow_recheck, Duration::from_millis(250));
        assert_eq!(driver_url(url), "postgres://u@h/db?sslmode=disable#f");

        // The driver's parameters, under any of their names.
        PostgresOptions::from_url(
            "postgres://u@h/db?ssl-mode=disable&statement-cache-capacity=10&port=5433\
             &options=-c%20statement_timeout%3D5s&options[search_path]=x&options[jit]=off\
             &user=v&dbname=d&host=h2&application_name=my%20app",
        )
        .unwrap();
        let options =
            PostgresOptions::from_url("postgres://u@h/db?application_name=my%20app").unwrap();
        assert_eq!(options.application_name.as_deref(), Some("my app"));
    }

    #[test]
    fn the_url_wins_over_the_options() {
        let base = PostgresOptions::default()
            .vacuum(Vacuum::Auto)
            .schema("s0")
            .application_name("from-options");
        let (options, _) = base
            .clone()
            .apply_url("postgres://u@h/db?vacuum=off&application_name=from-url")
            .unwrap();
        assert_eq!(options.vacuum, Vacuum::Off);
        assert_eq!(options.application_name.as_deref(), Some("from-url"));
        assert_eq!(options.schema, "s0", "not named in the URL");
        let (options, _) = base.apply_url("postgres://u@h/db").unwrap();
        assert_eq!(options.application_name.as_deref(), Some("from-options"));
    }

    #[test]
    fn bad_urls_are_config_errors_naming_the_parameter() {
        for (bad, named) in [
            ("postgres://u@h/db?schema=Bad", "Bad"),
            ("postgres://u@h/db?schema=", "schema name"),
            ("postgres://u@h/db?schema", "schema name"),
            ("postgres://u@h/db?schema=a%22b", "a%22b"),
            ("postgres://u@h/db?vacuum=sometimes", "vacuum"),
            ("postgres://u@h/db?vacuum=", "vacuum"),
            ("postgres://u@h/db?schema=a&schema=b", "schema"),
            ("postgres://u@h/db?vacuum=off&vacuum=off", "vacuum"),
            ("postgres://u@h/db?follow_recheck_ms=0", "follow_recheck_ms"),
            (
                "postgres://u@h/db?follow_recheck_ms=-5",
                "follow_recheck_ms",
            ),
            (
                "postgres://u@h/db?follow_recheck_ms=1s",
                "follow_recheck_ms",
            ),
            ("postgres://u@h/db?follow_recheck_ms=", "follow_recheck_ms"),
            ("postgres://u@h/db?sslmod=require", "sslmod"),
            ("postgres://u@h/db?prefix=x", "prefix"),
            (
                "postgres://u@h/db?sslmode=disable&ssl-mode=require",
                "sslmode",
            ),
            (
                "postgres://u@h/db?options[jit]=off&options[jit]=on",
                "options[jit]",
            ),
            (
                "postgres://u@h/db?sslmode=sometimes",
                "invalid PostgreSQL URL",
            ),
            ("postgres://u@h/db?port=many", "invalid PostgreSQL URL"),
        ] {
            match PostgresOptions::from_url(bad) {
                Err(Error::Config(message)) => {
                    assert!(message.contains(named), "{bad}: {message}")
                }
                other => panic!("{bad}: expected a config error, got {other:?}"),
            }
        }
    }
}
