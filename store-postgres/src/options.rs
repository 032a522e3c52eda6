//! How to open a [`PostgresStore`](crate::PostgresStore).

use std::time::Duration;

use mcp_event_store_core::{Error, Result, StoreOptions};

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
    /// The `application_name` of the store's connections; `None` keeps the
    /// URL's, or [`DEFAULT_APPLICATION_NAME`].
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

    /// Takes this crate's own parameters out of a connection URL, applying
    /// them over these options, and returns the options and the URL left
    /// for the driver (which would otherwise ignore them):
    ///
    /// * `schema=name`: [`PostgresOptions::schema`];
    /// * `vacuum=off|auto`: [`PostgresOptions::vacuum`];
    /// * `follow_recheck_ms=N`: [`PostgresOptions::follow_recheck`], in
    ///   milliseconds (at least 1).
    ///
    /// Every other parameter (`sslmode`, `application_name`, ...) stays in
    /// the URL for sqlx. A parameter of ours given twice, or with a value
    /// it does not take, is [`Error::Config`].
    ///
    /// ```
    /// use mcp_event_store_postgres::{PostgresOptions, Vacuum};
    ///
    /// let (options, url) = PostgresOptions::default()
    ///     .with_url_parameters(
    ///         "postgres://app@db/app?schema=tenant_a&sslmode=require&vacuum=auto&follow_recheck_ms=2000",
    ///     )
    ///     .unwrap();
    /// assert_eq!(options.schema, "tenant_a");
    /// assert_eq!(options.vacuum, Vacuum::Auto);
    /// assert_eq!(options.follow_recheck, std::time::Duration::from_secs(2));
    /// assert_eq!(url, "postgres://app@db/app?sslmode=require");
    /// ```
    pub fn with_url_parameters(mut self, url: &str) -> Result<(Self, String)> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((self, url.to_owned()));
        };
        // A fragment is not part of the query.
        let (query, fragment) = match query.split_once('#') {
            Some((query, fragment)) => (query, Some(fragment)),
            None => (query, None),
        };
        let (mut schema, mut vacuum, mut recheck) = (None, None, None);
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "schema" => &mut schema,
                "vacuum" => &mut vacuum,
                "follow_recheck_ms" => &mut recheck,
                _ => {
                    rest.push(pair);
                    continue;
                }
            };
            if slot.replace(value).is_some() {
                return Err(Error::Config(format!(
                    "the postgres URL parameter {key} is given twice"
                )));
            }
        }
        if let Some(schema) = schema {
            validate_schema_name(schema)?;
            self.schema = schema.to_owned();
        }
        if let Some(vacuum) = vacuum {
            self.vacuum = Vacuum::parse(vacuum)?;
        }
        if let Some(recheck) = recheck {
            self.follow_recheck = parse_recheck_ms(recheck)?;
        }
        let mut url = base.to_owned();
        if !rest.is_empty() {
            url.push('?');
            url.push_str(&rest.join("&"));
        }
        if let Some(fragment) = fragment {
            url.push('#');
            url.push_str(fragment);
        }
        Ok((self, url))
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

    #[test]
    fn url_parameters_of_ours_are_taken_out() {
        let base = PostgresOptions::default();
        let (options, url) = base
            .clone()
            .with_url_parameters("postgres://u@h/db")
            .unwrap();
        assert_eq!(url, "postgres://u@h/db");
        assert_eq!(options.schema, DEFAULT_SCHEMA);
        assert_eq!(options.vacuum, Vacuum::Off);

        let (options, url) = base
            .clone()
            .with_url_parameters("postgres://u@h/db?schema=s1")
            .unwrap();
        assert_eq!(
            (options.schema.as_str(), url.as_str()),
            ("s1", "postgres://u@h/db")
        );

        let (options, url) = base
            .clone()
            .with_url_parameters(
                "postgres://u@h/db?application_name=a&vacuum=auto&&sslmode=disable&schema=s2",
            )
            .unwrap();
        assert_eq!(options.schema, "s2");
        assert_eq!(options.vacuum, Vacuum::Auto);
        assert_eq!(url, "postgres://u@h/db?application_name=a&sslmode=disable");

        let (options, _) = base
            .clone()
            .vacuum(Vacuum::Auto)
            .with_url_parameters("postgres://u@h/db?vacuum=off")
            .unwrap();
        assert_eq!(options.vacuum, Vacuum::Off, "the URL wins");

        let (options, url) = base
            .clone()
            .with_url_parameters("postgres://u@h/db?follow_recheck_ms=250&sslmode=disable")
            .unwrap();
        assert_eq!(options.follow_recheck, Duration::from_millis(250));
        assert_eq!(url, "postgres://u@h/db?sslmode=disable");
        assert_eq!(base.follow_recheck, DEFAULT_FOLLOW_RECHECK);

        for bad in [
            "postgres://u@h/db?schema=Bad",
            "postgres://u@h/db?schema=",
            "postgres://u@h/db?schema",
            "postgres://u@h/db?schema=a%22b",
            "postgres://u@h/db?vacuum=sometimes",
            "postgres://u@h/db?vacuum=",
            "postgres://u@h/db?schema=a&schema=b",
            "postgres://u@h/db?vacuum=off&vacuum=off",
            "postgres://u@h/db?follow_recheck_ms=0",
            "postgres://u@h/db?follow_recheck_ms=-5",
            "postgres://u@h/db?follow_recheck_ms=1s",
            "postgres://u@h/db?follow_recheck_ms=",
        ] {
            assert!(
                matches!(base.clone().with_url_parameters(bad), Err(Error::Config(_))),
                "{bad}"
            );
        }
    }
}
