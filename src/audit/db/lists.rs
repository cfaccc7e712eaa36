//! The `list_entries` table: allow and block entries admins add at run time.
//! Both databases keep them in the same plain columns (TEXT id, BIGINT ms),
//! so one macro writes the queries for each, with its placeholders.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use super::AuditDb;
use super::AuditError;
use crate::lists::{EntryKind, EntrySource, ListEntry, ListError, ListName, ListStore};
use crate::telemetry::log_budget::LogBudget;

/// One stored row, as read.
type Columns = (String, String, String, String, String, i64);

fn entry_from_columns(
    (id, list, kind, value, note, created_at_ms): Columns,
) -> Result<ListEntry, AuditError> {
    let corrupt = |what: &str| AuditError::Corrupt(format!("list entry {id}: {what}"));
    Ok(ListEntry {
        id: Some(Uuid::parse_str(&id).map_err(|_| corrupt("id"))?),
        list: ListName::parse(&list).ok_or_else(|| corrupt("list"))?,
        kind: EntryKind::parse(&kind).ok_or_else(|| corrupt("kind"))?,
        value,
        note,
        source: EntrySource::Admin,
        created_at: Some(
            Utc.timestamp_millis_opt(created_at_ms)
                .single()
                .ok_or_else(|| corrupt("created_at_ms"))?,
        ),
    })
}

/// Lines about stored rows that are no entry: one a minute, however many
/// rows and however short `lists.refresh_interval` (each refresh finds
/// them again).
static SKIPPED_LINES: LogBudget = LogBudget::new(Duration::from_secs(60));

/// The rows that read as entries. One that does not (a list or kind no
/// version writes, an id or time edited by hand) is skipped, not allowed
/// to stop every instance's refresh, and with it every admin's change
/// (each reads the lists back).
fn readable(rows: Vec<Columns>) -> Vec<ListEntry> {
    rows.into_iter()
        .filter_map(|row| {
            entry_from_columns(row)
                .map_err(|e| {
                    if let Some(held_back) = SKIPPED_LINES.admit() {
                        tracing::warn!(error = %e, held_back, "stored list entry cannot be read; skipped");
                    }
                })
                .ok()
        })
        .collect()
}

fn created_ms(entry: &ListEntry) -> i64 {
    entry
        .created_at
        .map_or(0, |t: DateTime<Utc>| t.timestamp_millis())
}

/// The columns of a stored row.
const SELECT: &str = "SELECT id, list, kind, value, note, created_at_ms FROM list_entries";

/// Every stored row, oldest first.
const SELECT_ALL: &str = "SELECT id, list, kind, value, note, created_at_ms FROM list_entries \
                          ORDER BY created_at_ms, id";

/// Every stored entry, oldest first; a row that is no entry (edited by
/// hand) is left out with a warning.
pub async fn sqlite_all(pool: &sqlx::SqlitePool) -> Result<Vec<ListEntry>, AuditError> {
    let rows: Vec<Columns> = sqlx::query_as(SELECT_ALL).fetch_all(pool).await?;
    Ok(readable(rows))
}

/// [`sqlite_all`] on PostgreSQL, the server ending the read, its wait for a lock
/// included, past `bound`: cut off on the client instead, the query stayed
/// queued behind the lock on a connection the pool took back, and the next
/// user of it (the audit writer, an admin's read) waited there too. A
/// connection cut off mid-read is closed (`closing`).
pub async fn postgres_all_within(
    pool: &sqlx::PgPool,
    bound: Duration,
) -> Result<Vec<ListEntry>, AuditError> {
    let mut conn = super::closing::ClosedUnlessDone::acquire(pool).await?;
    let tx = super::postgres::begin(&mut conn, Some(bound)).await?;
    let read = read_all_in(tx).await;
    conn.done();
    read
}

async fn read_all_in(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
) -> Result<Vec<ListEntry>, AuditError> {
    let rows: Vec<Columns> = sqlx::query_as(SELECT_ALL).fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(readable(rows))
}

/// Store `entry` on PostgreSQL, each statement and lock wait given up
/// past `bound`: a table an operator locked would otherwise hold the
/// admin's request, and, once the admin gave up, leave the statement queued
/// on a pooled connection the audit writer then waits behind (a connection
/// dropped mid-statement is closed, not pooled).
pub async fn postgres_insert_within(
    pool: &sqlx::PgPool,
    entry: &ListEntry,
    bound: Duration,
) -> Result<ListEntry, AuditError> {
    let mut conn = super::closing::ClosedUnlessDone::acquire(pool).await?;
    let tx = super::postgres::begin(&mut conn, Some(bound)).await?;
    let stored = postgres::insert_in(tx, entry).await;
    conn.done();
    stored
}

/// Delete the entry `id` on PostgreSQL, bound as [`postgres_insert_within`].
pub async fn postgres_delete_within(
    pool: &sqlx::PgPool,
    id: Uuid,
    bound: Duration,
) -> Result<Option<ListEntry>, AuditError> {
    let mut conn = super::closing::ClosedUnlessDone::acquire(pool).await?;
    let tx = super::postgres::begin(&mut conn, Some(bound)).await?;
    let deleted = postgres::delete_in(tx, id).await;
    conn.done();
    deleted
}

macro_rules! list_queries {
    ($module:ident, $db:ty, insert: $insert:literal, find: $find:literal, delete: $delete:literal) => {
        pub mod $module {
            use super::*;

            /// Store `entry` unless an equal one (same list, kind and value)
            /// is stored: answer the stored one. An equal row no version
            /// reads (its id or time edited by hand) is in force nowhere
            /// and would hold the entry out for good: `entry` takes its
            /// place. One transaction: a read back that fails leaves
            /// nothing stored, rather than an entry its caller could not
            /// audit.
            pub async fn insert_in(
                mut tx: sqlx::Transaction<'_, $db>,
                entry: &ListEntry,
            ) -> Result<ListEntry, AuditError> {
                let id = entry.id.unwrap_or_else(crate::uuid_v7::now).to_string();
                let mut replaced = false;
                loop {
                    sqlx::query($insert)
                        .bind(&id)
                        .bind(entry.list.as_str())
                        .bind(entry.kind.as_str())
                        .bind(&entry.value)
                        .bind(&entry.note)
                        .bind(created_ms(entry))
                        .execute(&mut *tx)
                        .await?;
                    let row: Columns = sqlx::query_as(&format!("{SELECT} {}", $find))
                        .bind(entry.list.as_str())
                        .bind(entry.kind.as_str())
                        .bind(&entry.value)
                        .fetch_one(&mut *tx)
                        .await?;
                    match entry_from_columns(row) {
                        Ok(stored) => {
                            tx.commit().await?;
                            return Ok(stored);
                        }
                        Err(error) if !replaced => {
                            tracing::warn!(%error, "a stored list row no version reads is replaced by an admin's equal entry");
                            sqlx::query(&format!("DELETE FROM list_entries {}", $find))
                                .bind(entry.list.as_str())
                                .bind(entry.kind.as_str())
                                .bind(&entry.value)
                                .execute(&mut *tx)
                                .await?;
                            replaced = true;
                        }
                        Err(error) => return Err(error),
                    }
                }
            }

            /// Delete the entry `id`; the entry, when there was one. A row
            /// that is no entry is not deleted (`AuditError::Corrupt`): its
            /// deletion could not be audited as one.
            pub async fn delete_in(
                mut tx: sqlx::Transaction<'_, $db>,
                id: Uuid,
            ) -> Result<Option<ListEntry>, AuditError> {
                let row: Option<Columns> = sqlx::query_as(&format!(
                    "{} RETURNING id, list, kind, value, note, created_at_ms",
                    $delete
                ))
                .bind(id.to_string())
                .fetch_optional(&mut *tx)
                .await?;
                // Dropped without a commit on an unreadable row: rolled back.
                let entry = row.map(entry_from_columns).transpose()?;
                tx.commit().await?;
                Ok(entry)
            }
        }
    };
}

list_queries!(postgres, sqlx::Postgres,
    insert: "INSERT INTO list_entries (id, list, kind, value, note, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (list, kind, value) DO NOTHING",
    find: "WHERE list = $1 AND kind = $2 AND value = $3",
    delete: "DELETE FROM list_entries WHERE id = $1");

list_queries!(sqlite, sqlx::Sqlite,
    insert: "INSERT INTO list_entries (id, list, kind, value, note, created_at_ms) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (list, kind, value) DO NOTHING",
    find: "WHERE list = ? AND kind = ? AND value = ?",
    delete: "DELETE FROM list_entries WHERE id = ?");

fn unavailable(e: AuditError) -> ListError {
    ListError::Unavailable(e.to_string())
}

#[async_trait::async_trait]
impl ListStore for AuditDb {
    async fn all(&self, bound: Duration) -> Result<Vec<ListEntry>, ListError> {
        self.list_entries_within(bound).await.map_err(unavailable)
    }

    async fn insert(&self, entry: &ListEntry, bound: Duration) -> Result<ListEntry, ListError> {
        self.insert_list_entry(entry, bound)
            .await
            .map_err(unavailable)
    }

    async fn delete(&self, id: Uuid, bound: Duration) -> Result<Option<ListEntry>, ListError> {
        self.delete_list_entry(id, bound)
            .await
            .map_err(|e| match e {
                AuditError::Corrupt(row) => ListError::Invalid(format!(
                    "{row}: a row no version reads (edited by hand?); delete it in the database"
                )),
                e => unavailable(e),
            })
    }
}
