//! Writes a batch's rollup deltas (`audit::rollup`) in the transaction that
//! inserts its rows: counts added, top summaries merged (and pruned past
//! twice their capacity). Every statement touches its rows in key order; a
//! prune still updates a summary's rows in whatever order it finds them, so
//! on PostgreSQL the caller serialises rollup writers with a lock (SQLite
//! has one writer at a time anyway).
//!
//! On PostgreSQL the counts and the top keys are each one statement of one
//! array per column (`UNNEST`), the same text for any batch, kept prepared:
//! PostgreSQL neither parses nor plans them again, and no placeholder is
//! formatted per row. Elsewhere a statement's text depends on how many rows
//! it writes, so none is kept prepared (`persistent(false)`): sqlx keeps up
//! to 100 prepared statements per connection, and a flood's batches of
//! every size filled that cache with statements of up to a thousand rows
//! each (on SQLite a process grew by some 1.3 KB an audited refusal, past
//! 400 MB).

use sqlx::QueryBuilder;

use super::AuditError;
use crate::audit::rollup::{prune_cut, Deltas, SummaryKey, PRUNE_ABOVE, TOP_CAPACITY};

/// Rows per multi-row statement on SQLite (5 binds each).
const ROWS_PER_STATEMENT: usize = 1000;

/// The top summaries' keys with their counts, in one order every writer
/// shares (the summary, then the key's bytes): writers (other instances,
/// concurrent inserters) that took them in different orders could deadlock
/// where the rollup lock does not serialise them.
fn top_keys(deltas: &Deltas) -> Vec<(&SummaryKey, &String, i64)> {
    let mut keys: Vec<(&SummaryKey, &String, i64)> = deltas
        .tops
        .iter()
        .flat_map(|(s, summary)| summary.keys.iter().map(move |(k, n)| (s, k, *n)))
        .collect();
    keys.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    keys
}

macro_rules! rollup_writes {
    ($db:ty) => {
        /// Add `deltas` to the rollups, inside the rows' transaction.
        pub async fn write(
            tx: &mut sqlx::Transaction<'_, $db>,
            deltas: &Deltas,
        ) -> Result<(), AuditError> {
            add_counts(tx, deltas).await?;
            add_top_keys(tx, deltas).await?;
            let errors: Vec<(&SummaryKey, i64)> = deltas
                .tops
                .iter()
                .filter(|(_, s)| s.dropped > 0)
                .map(|(k, s)| (k, s.dropped))
                .collect();
            add_errors(tx, &errors).await?;

            prune_grown(tx, deltas).await
        }

        /// Prune the summaries this batch grew past twice their capacity.
        async fn prune_grown(
            tx: &mut sqlx::Transaction<'_, $db>,
            deltas: &Deltas,
        ) -> Result<(), AuditError> {
            // Only summaries that gained keys can have grown past the bound.
            let grown: Vec<&SummaryKey> = deltas
                .tops
                .iter()
                .filter(|(_, s)| !s.keys.is_empty())
                .map(|(k, _)| k)
                .collect();
            if grown.is_empty() {
                return Ok(());
            }
            let mut qb = QueryBuilder::<$db>::new(
                "SELECT width_ms, start_ms, list FROM audit_top WHERE ",
            );
            for (i, s) in grown.iter().enumerate() {
                if i > 0 {
                    qb.push(" OR ");
                }
                qb.push("(width_ms = ")
                    .push_bind(s.width_ms)
                    .push(" AND start_ms = ")
                    .push_bind(s.start_ms)
                    .push(" AND list = ")
                    .push_bind(s.list.as_str())
                    .push(")");
            }
            qb.push(" GROUP BY width_ms, start_ms, list HAVING COUNT(*) > ")
                .push_bind(PRUNE_ABOVE as i64);
            let over: Vec<(i64, i64, String)> = qb
                .build_query_as()
                .persistent(false)
                .fetch_all(&mut **tx)
                .await?;
            let mut cuts = Vec::new();
            for (width_ms, start_ms, list) in over {
                let Some(s) = grown
                    .iter()
                    .find(|s| s.width_ms == width_ms && s.start_ms == start_ms && s.list.as_str() == list)
                else {
                    continue;
                };
                if let Some(cut) = prune(tx, s).await? {
                    cuts.push((*s, cut));
                }
            }
            add_errors(tx, &cuts).await
        }

        /// Take the `TOP_CAPACITY`+1-th count off every key of a summary
        /// and drop the keys left at zero; the count taken.
        async fn prune(
            tx: &mut sqlx::Transaction<'_, $db>,
            s: &SummaryKey,
        ) -> Result<Option<i64>, AuditError> {
            let counts: Vec<(i64,)> = sqlx::query_as(
                "SELECT n FROM audit_top WHERE width_ms = $1 AND start_ms = $2 AND list = $3 \
                 ORDER BY n DESC",
            )
            .bind(s.width_ms)
            .bind(s.start_ms)
            .bind(s.list.as_str())
            .fetch_all(&mut **tx)
            .await?;
            let counts: Vec<i64> = counts.into_iter().map(|(n,)| n).collect();
            let Some(cut) = prune_cut(&counts) else {
                return Ok(None);
            };
            debug_assert!(counts.len() > TOP_CAPACITY);
            sqlx::query(
                "UPDATE audit_top SET n = n - $1 WHERE width_ms = $2 AND start_ms = $3 AND list = $4",
            )
            .bind(cut)
            .bind(s.width_ms)
            .bind(s.start_ms)
            .bind(s.list.as_str())
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "DELETE FROM audit_top WHERE width_ms = $1 AND start_ms = $2 AND list = $3 AND n <= 0",
            )
            .bind(s.width_ms)
            .bind(s.start_ms)
            .bind(s.list.as_str())
            .execute(&mut **tx)
            .await?;
            Ok(Some(cut))
        }

        async fn add_errors(
            tx: &mut sqlx::Transaction<'_, $db>,
            errors: &[(&SummaryKey, i64)],
        ) -> Result<(), AuditError> {
            for chunk in errors.chunks(ROWS_PER_STATEMENT) {
                let mut qb = QueryBuilder::<$db>::new(
                    "INSERT INTO audit_top_error (width_ms, start_ms, list, dropped) ",
                );
                qb.push_values(chunk, |mut row, (s, dropped)| {
                    row.push_bind(s.width_ms)
                        .push_bind(s.start_ms)
                        .push_bind(s.list.as_str())
                        .push_bind(*dropped);
                });
                qb.push(
                    " ON CONFLICT (width_ms, start_ms, list) \
                     DO UPDATE SET dropped = audit_top_error.dropped + excluded.dropped",
                );
                qb.build().persistent(false).execute(&mut **tx).await?;
            }
            Ok(())
        }
    };
}

pub mod postgres {
    use super::*;
    rollup_writes!(sqlx::Postgres);

    /// The decision counts per bucket, added to: one statement of one
    /// array per column, whatever the batch holds, so it is kept prepared.
    async fn add_counts(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        deltas: &Deltas,
    ) -> Result<(), AuditError> {
        if deltas.counts.is_empty() {
            return Ok(());
        }
        let keys = || deltas.counts.keys();
        sqlx::query(
            "INSERT INTO audit_counts (bucket_ms, action, decision, shadow, n) \
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::bool[], $5::bigint[]) \
             ON CONFLICT (bucket_ms, action, decision, shadow) \
             DO UPDATE SET n = audit_counts.n + excluded.n",
        )
        .bind(keys().map(|k| k.bucket_ms).collect::<Vec<_>>())
        .bind(keys().map(|k| k.action).collect::<Vec<_>>())
        .bind(keys().map(|k| k.decision).collect::<Vec<_>>())
        .bind(keys().map(|k| k.shadow).collect::<Vec<_>>())
        .bind(deltas.counts.values().copied().collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// The top summaries' keys, their counts added to, in `top_keys`'s
    /// order (`UNNEST` gives its rows in array order).
    async fn add_top_keys(
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        deltas: &Deltas,
    ) -> Result<(), AuditError> {
        let keys = top_keys(deltas);
        if keys.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO audit_top (width_ms, start_ms, list, key, n) \
             SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::bigint[]) \
             ON CONFLICT (width_ms, start_ms, list, key) \
             DO UPDATE SET n = audit_top.n + excluded.n",
        )
        .bind(keys.iter().map(|(s, _, _)| s.width_ms).collect::<Vec<_>>())
        .bind(keys.iter().map(|(s, _, _)| s.start_ms).collect::<Vec<_>>())
        .bind(keys.iter().map(|(s, _, _)| s.list.as_str()).collect::<Vec<_>>())
        .bind(keys.iter().map(|(_, k, _)| k.as_str()).collect::<Vec<_>>())
        .bind(keys.iter().map(|(_, _, n)| *n).collect::<Vec<_>>())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

pub mod sqlite {
    use super::*;
    rollup_writes!(sqlx::Sqlite);

    /// The decision counts per bucket, added to.
    async fn add_counts(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        deltas: &Deltas,
    ) -> Result<(), AuditError> {
        let counts: Vec<_> = deltas.counts.iter().collect();
        for chunk in counts.chunks(ROWS_PER_STATEMENT) {
            let mut qb = QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO audit_counts (bucket_ms, action, decision, shadow, n) ",
            );
            qb.push_values(chunk, |mut row, (key, n)| {
                row.push_bind(key.bucket_ms)
                    .push_bind(key.action)
                    .push_bind(key.decision)
                    .push_bind(key.shadow)
                    .push_bind(**n);
            });
            qb.push(
                " ON CONFLICT (bucket_ms, action, decision, shadow) \
                 DO UPDATE SET n = audit_counts.n + excluded.n",
            );
            qb.build().persistent(false).execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// The top summaries' keys, their counts added to, in `top_keys`'s order.
    async fn add_top_keys(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        deltas: &Deltas,
    ) -> Result<(), AuditError> {
        let keys = top_keys(deltas);
        for chunk in keys.chunks(ROWS_PER_STATEMENT) {
            let mut qb = QueryBuilder::<sqlx::Sqlite>::new(
                "INSERT INTO audit_top (width_ms, start_ms, list, key, n) ",
            );
            qb.push_values(chunk, |mut row, (s, key, n)| {
                row.push_bind(s.width_ms)
                    .push_bind(s.start_ms)
                    .push_bind(s.list.as_str())
                    .push_bind(key.as_str())
                    .push_bind(*n);
            });
            qb.push(
                " ON CONFLICT (width_ms, start_ms, list, key) \
                 DO UPDATE SET n = audit_top.n + excluded.n",
            );
            qb.build().persistent(false).execute(&mut **tx).await?;
        }
        Ok(())
    }
}
