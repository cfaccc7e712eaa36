//! The audit database: PostgreSQL in production, SQLite as the embedded
//! default. All SQL lives below this module; each database has its own file
//! because their types differ (UUID/TIMESTAMPTZ there, TEXT here).

mod closing;
mod lists;
pub mod partitions;
mod postgres;
mod rollups;
mod rows;
mod sessions;
mod sqlite;
mod stats;

pub use sessions::StoredSession;

use rows::{corrupt, event_from_columns, push_conditions, repository, EventColumns, COLUMNS};

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::error::DatabaseError;
use sqlx::sqlite::SqliteError;

use super::query::{Cursor, EventFilter};
use super::AuditEvent;

/// SQLite's result code for a statement its progress handler ended.
const SQLITE_INTERRUPT: &str = "9";

/// Why an audit database call failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The database refused the call or could not be reached.
    #[error("audit database: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed to apply.
    #[error("audit database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value this version does not know (an unknown action, say).
    #[error("audit database holds a row tollgate cannot read: {0}")]
    Corrupt(String),
    /// `audit.database_url` names neither SQLite nor PostgreSQL.
    #[error("audit.database_url is not a sqlite: or postgres:// URL")]
    UnsupportedUrl,
    /// The database took the connection but did not answer a write at all
    /// within this long, twice `audit.write_timeout` (hung, or a network
    /// that drops packets).
    #[error("audit database did not answer within {0:?} (twice audit.write_timeout)")]
    TimedOut(std::time::Duration),
    /// Admins' reads of the trail already ran as many at once as allowed,
    /// or this admin's own read before it (`audit::read_turns`), and no
    /// turn came free in time.
    #[error("audit database: no admin read's turn came free in time")]
    ReadsBusy,
}

impl AuditError {
    /// The database did not answer in time: the writer's own bound, the
    /// bound PostgreSQL enforces for it (`lock_timeout`, 55P03;
    /// `statement_timeout`, 57014), the one SQLite's progress handler
    /// enforces for a read (`SQLITE_INTERRUPT`), or no pooled connection
    /// within the pool's wait. Asking again at once would only wait as long
    /// again.
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::TimedOut(_) | Self::Database(sqlx::Error::PoolTimedOut) => true,
            Self::Database(sqlx::Error::Database(e)) => match e.try_downcast_ref::<SqliteError>() {
                Some(sqlite) => sqlite.code().as_deref() == Some(SQLITE_INTERRUPT),
                None => matches!(e.code().as_deref(), Some("55P03" | "57014")),
            },
            _ => false,
        }
    }

    /// The database answered and refused these rows, not the connection:
    /// a value it will not take (PostgreSQL's classes 22, data exception,
    /// and 23, integrity constraint; 54000, an index row too large; P0001,
    /// a trigger's `RAISE EXCEPTION`, which is not a constraint's class) or a
    /// constraint or trigger an operator added (SQLite's `SQLITE_CONSTRAINT`,
    /// `SQLITE_TOOBIG`, `SQLITE_MISMATCH`). Asking again brings the same
    /// answer, but the other rows of the batch may go in without them: a
    /// trigger's refusal taken for an outage held every later journal
    /// segment behind the one that holds its row, for good.
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Database(e)) => match e.try_downcast_ref::<SqliteError>() {
                Some(sqlite) => sqlite
                    .code()
                    .and_then(|code| code.parse::<i32>().ok())
                    // Extended result codes keep the primary one in the low byte.
                    .is_some_and(|code| matches!(code & 0xff, 18..=20)),
                None => e.code().is_some_and(|code| {
                    code.starts_with("22")
                        || code.starts_with("23")
                        || code == "54000"
                        || code == "P0001"
                }),
            },
            _ => false,
        }
    }

    /// The audit table does not exist (the database was dropped and made
    /// again while running): migrating again fixes it.
    pub fn is_missing_table(&self) -> bool {
        match self {
            // 42P01: undefined_table.
            Self::Database(sqlx::Error::Database(e)) => {
                e.code().as_deref() == Some("42P01") || e.message().contains("no such table")
            }
            _ => false,
        }
    }
}

/// Partitions made ahead of today (PostgreSQL): a clock running ahead, or
/// an instance down over midnight, still finds its day's.
pub const PARTITION_DAYS_AHEAD: u64 = 7;

/// What a retention cut removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionCut {
    /// Another instance holds the retention lock: nothing was done.
    pub skipped: bool,
    /// Where the cut fell: rows before it are gone.
    pub before: Option<DateTime<Utc>>,
    /// Partitions dropped (PostgreSQL), by name.
    pub partitions: Vec<String>,
    /// Rows removed: exact on SQLite, the statistics' estimate for
    /// dropped partitions.
    pub rows: u64,
}

/// Rows per SQLite INSERT statement: 17 binds a row stay far below its bind
/// limit. (PostgreSQL takes a whole batch as one set of arrays.)
const ROWS_PER_STATEMENT: usize = 1000;

/// The audit database behind a connection pool; cheap to clone.
#[derive(Clone, Debug)]
pub enum AuditDb {
    /// PostgreSQL, for production.
    Postgres(sqlx::PgPool),
    /// SQLite, the embedded default.
    Sqlite(sqlx::SqlitePool),
}

impl AuditDb {
    /// A lazily connecting pool: a database that is down at start-up is retried
    /// by the writer, not fatal.
    pub fn connect_lazy(url: &str) -> Result<Self, AuditError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres(postgres::pool(url)?))
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite(sqlite::pool(url)?))
        } else {
            Err(AuditError::UnsupportedUrl)
        }
    }

    /// Apply the migrations of `migrations/postgres` or `migrations/sqlite`
    /// (compiled in); on PostgreSQL, make sure yesterday's, today's and the
    /// next [`PARTITION_DAYS_AHEAD`] days' partitions exist (retention
    /// makes the rest of its period).
    pub async fn migrate(&self) -> Result<(), AuditError> {
        match self {
            Self::Postgres(pool) => {
                // On a connection of its own, closed afterwards: sqlx's
                // migration lock is a session lock it releases only when the
                // run ends well, and a run cut short (start-up's timeout, a
                // failure) would leave it on a pooled connection, blocking
                // the writer's migration until that connection is reaped.
                let mut conn = pool.acquire().await?;
                conn.close_on_drop();
                sqlx::migrate!("./migrations/postgres")
                    .run_direct(&mut *conn)
                    .await?;
                drop(conn);
                let now = Utc::now();
                let today = partitions::day(now);
                let first = today.pred_opt().unwrap_or(today);
                self.prepare_partitions(first, now).await?;
            }
            Self::Sqlite(pool) => sqlx::migrate!("./migrations/sqlite").run(pool).await?,
        }
        Ok(())
    }

    /// PostgreSQL: make the partitions from `first` to
    /// [`PARTITION_DAYS_AHEAD`] days after `now`'s day that do not exist
    /// yet; how many were made. SQLite has one table: nothing to do.
    pub async fn prepare_partitions(
        &self,
        first: NaiveDate,
        now: DateTime<Utc>,
    ) -> Result<usize, AuditError> {
        match self {
            Self::Postgres(pool) => {
                let today = partitions::day(now);
                let last = today
                    .checked_add_days(chrono::Days::new(PARTITION_DAYS_AHEAD))
                    .unwrap_or(today);
                Ok(
                    partitions::ensure(pool, partitions::days(first.min(today), last), None)
                        .await?
                        .len(),
                )
            }
            Self::Sqlite(_) => Ok(0),
        }
    }

    /// Insert events, all or none, and add the ones that were new to the
    /// rollups in the same transaction (`prefix_digits` cuts phones into
    /// prefixes for the top lists); an id already present is skipped, which
    /// makes replays after a crash idempotent. Returns the rows inserted.
    /// PostgreSQL takes the batch as one `INSERT … SELECT FROM UNNEST` of
    /// column arrays (18 binds, whatever the size), plain first and again
    /// with `ON CONFLICT DO NOTHING` when a row was present, making a
    /// missing day's partition when a row needs one; SQLite as multi-row
    /// INSERTs.
    pub async fn insert(
        &self,
        events: &[AuditEvent],
        prefix_digits: u32,
    ) -> Result<u64, AuditError> {
        self.insert_within(events, prefix_digits, None).await
    }

    /// [`insert`](Self::insert), with PostgreSQL told to end any lock wait
    /// or statement of the batch's transactions past `bound` (the writer's
    /// `audit.write_timeout`), so that a wait ends with an error and a
    /// clean connection rather than only when the caller gives up.
    pub async fn insert_within(
        &self,
        events: &[AuditEvent],
        prefix_digits: u32,
        bound: Option<std::time::Duration>,
    ) -> Result<u64, AuditError> {
        if events.is_empty() {
            return Ok(0);
        }
        match self {
            Self::Postgres(pool) => postgres::insert(pool, events, prefix_digits, bound).await,
            Self::Sqlite(pool) => sqlite::insert(pool, events, prefix_digits).await,
        }
    }

    /// Newest first, after `cursor`, at most `limit` rows.
    pub async fn page(
        &self,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Vec<AuditEvent>, AuditError> {
        self.page_bounded(filter, cursor, limit, None).await
    }

    /// [`page`](Self::page), ending the read at `bound`
    /// ([`is_timeout`](Self::is_timeout)): on PostgreSQL its lock waits and
    /// statement (57014 or 55P03), on SQLite its steps (`SQLITE_INTERRUPT`).
    pub async fn page_within(
        &self,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
        bound: std::time::Duration,
    ) -> Result<Vec<AuditEvent>, AuditError> {
        self.page_bounded(filter, cursor, limit, Some(bound)).await
    }

    async fn page_bounded(
        &self,
        filter: &EventFilter,
        cursor: Option<&Cursor>,
        limit: usize,
        bound: Option<std::time::Duration>,
    ) -> Result<Vec<AuditEvent>, AuditError> {
        match self {
            Self::Postgres(pool) => postgres::page_within(pool, filter, cursor, limit, bound).await,
            Self::Sqlite(pool) => sqlite::page(pool, filter, cursor, limit, bound).await,
        }
    }

    /// Remove the rows (and their rollups) older than `cutoff`, rounded
    /// down to a partition's day on PostgreSQL and to an hour on SQLite, so
    /// that rows and rollups go together. On PostgreSQL one instance at a
    /// time does it (an advisory lock; the others answer `skipped`).
    pub async fn cut_before(&self, cutoff: DateTime<Utc>) -> Result<RetentionCut, AuditError> {
        match self {
            Self::Postgres(pool) => postgres::cut_before(pool, cutoff).await,
            Self::Sqlite(pool) => sqlite::cut_before(pool, cutoff).await,
        }
    }

    /// The database's own clock: PostgreSQL's `now()`, the one clock every
    /// instance writing to it shares; none for SQLite, whose file is this
    /// host's, and so is its clock.
    pub async fn clock(&self) -> Result<Option<DateTime<Utc>>, AuditError> {
        match self {
            Self::Postgres(pool) => postgres::clock(pool).await.map(Some),
            Self::Sqlite(_) => Ok(None),
        }
    }

    /// Delete the top summaries no period reads any more
    /// (`rollup::TOP_KEPT_MS`, as of `now`); how many rows.
    pub async fn trim_summaries(&self, now: DateTime<Utc>) -> Result<u64, AuditError> {
        match self {
            Self::Postgres(pool) => postgres::trim_summaries(pool, now.timestamp_millis()).await,
            Self::Sqlite(pool) => sqlite::trim_summaries(pool, now.timestamp_millis()).await,
        }
    }

    /// The allow and block entries admins stored, oldest first, the read
    /// given up past `bound` (on PostgreSQL by the server, its lock waits
    /// included; SQLite waits on no other process's lock for long).
    pub async fn list_entries_within(
        &self,
        bound: std::time::Duration,
    ) -> Result<Vec<crate::lists::ListEntry>, AuditError> {
        match self {
            Self::Postgres(pool) => lists::postgres_all_within(pool, bound).await,
            Self::Sqlite(pool) => lists::sqlite_all(pool).await,
        }
    }

    /// Store a list entry, or answer the equal one already stored; on
    /// PostgreSQL given up past `bound` (its lock waits included).
    pub async fn insert_list_entry(
        &self,
        entry: &crate::lists::ListEntry,
        bound: std::time::Duration,
    ) -> Result<crate::lists::ListEntry, AuditError> {
        match self {
            Self::Postgres(pool) => lists::postgres_insert_within(pool, entry, bound).await,
            Self::Sqlite(pool) => lists::sqlite::insert_in(pool.begin().await?, entry).await,
        }
    }

    /// Delete a stored list entry; the entry, when there was one; bound as
    /// [`Self::insert_list_entry`].
    pub async fn delete_list_entry(
        &self,
        id: uuid::Uuid,
        bound: std::time::Duration,
    ) -> Result<Option<crate::lists::ListEntry>, AuditError> {
        match self {
            Self::Postgres(pool) => lists::postgres_delete_within(pool, id, bound).await,
            Self::Sqlite(pool) => lists::sqlite::delete_in(pool.begin().await?, id).await,
        }
    }

    /// Store a new admin session (and drop the expired ones).
    pub async fn insert_session(
        &self,
        session: &StoredSession,
        now_ms: i64,
    ) -> Result<(), AuditError> {
        match self {
            Self::Postgres(pool) => sessions::postgres::insert(pool, session, now_ms).await,
            Self::Sqlite(pool) => sessions::sqlite::insert(pool, session, now_ms).await,
        }
    }

    /// The admin session `id_hash` names, unless it has expired at `now_ms`.
    pub async fn find_session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<StoredSession>, AuditError> {
        match self {
            Self::Postgres(pool) => sessions::postgres::find(pool, id_hash, now_ms).await,
            Self::Sqlite(pool) => sessions::sqlite::find(pool, id_hash, now_ms).await,
        }
    }

    /// End the admin session `id_hash`; whether there was one.
    pub async fn delete_session(&self, id_hash: &str) -> Result<bool, AuditError> {
        match self {
            Self::Postgres(pool) => sessions::postgres::delete(pool, id_hash).await,
            Self::Sqlite(pool) => sessions::sqlite::delete(pool, id_hash).await,
        }
    }

    /// Whether the audit table answers (the writer's health check).
    pub async fn check_table(&self) -> Result<(), AuditError> {
        match self {
            // `ONLY`: the partitioned parent alone, which answers the same
            // question (is the table there, may we read it). Planned over
            // its ~100 partitions the probe took PostgreSQL 8-9 ms of CPU,
            // every second an instance is idle; the parent alone 0.4 ms.
            Self::Postgres(pool) => sqlx::query("SELECT 1 FROM ONLY audit_events LIMIT 1")
                .execute(pool)
                .await
                .map(drop)?,
            Self::Sqlite(pool) => sqlx::query("SELECT 1 FROM audit_events LIMIT 1")
                .execute(pool)
                .await
                .map(drop)?,
        }
        Ok(())
    }

    /// Whether the database answers `SELECT 1`.
    pub async fn ping(&self) -> Result<(), AuditError> {
        match self {
            Self::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
            Self::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(drop)?,
        }
        Ok(())
    }
}
