//! The audit rows a test reads back, and the refusal that writes one.

use std::collections::HashMap;

use serde_json::json;
use tollgate::audit::query::EventFilter;
use tollgate::audit::{AuditDb, AuditEvent};

use super::app::{TestApp, API_KEY};

const PHONE: &str = "+8613800138000";

/// One refused send, tagged with `request_id`.
pub async fn refused_send(app: &TestApp, request_id: &str) {
    let request = app
        .client
        .post(format!("{}/sms/send", app.address))
        .bearer_auth(API_KEY)
        .header("x-request-id", request_id)
        .json(&json!({ "phone": PHONE }));
    let answer = app.send_raw(request).await;
    assert_eq!(answer.status, 429, "{}", answer.body);
}

pub async fn all_rows(db: &AuditDb) -> Vec<AuditEvent> {
    db.page(&EventFilter::default(), None, 100_000)
        .await
        .expect("the audit table is readable")
}

/// How often each request id appears in the table.
pub fn request_id_counts(rows: &[AuditEvent]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for row in rows {
        *counts
            .entry(row.request_id.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    counts
}

/// Whether each of `ids` is the request id of exactly one of `rows`.
pub fn each_once<S: AsRef<str>>(rows: &[AuditEvent], ids: impl IntoIterator<Item = S>) -> bool {
    let counts = request_id_counts(rows);
    ids.into_iter()
        .all(|id| counts.get(id.as_ref()) == Some(&1))
}

/// The rollups hold what the rows say: `audit_counts` equals the rows
/// counted per 5-minute bucket, action, decision and shadow flag; and
/// where a summary's stretch had no more keys than it keeps, its top list
/// equals the rows' exact counts.
pub async fn assert_rollups_match(db: &AuditDb) {
    use tollgate::audit::rollup;

    let rows = all_rows(db).await;
    let expected = rollup::deltas(rows.iter(), 7);
    let counts: Vec<(i64, String, String, bool, i64)> = match db {
        AuditDb::Postgres(pool) => {
            sqlx::query_as("SELECT bucket_ms, action, decision, shadow, n FROM audit_counts")
                .fetch_all(pool)
                .await
        }
        AuditDb::Sqlite(pool) => {
            sqlx::query_as("SELECT bucket_ms, action, decision, shadow, n FROM audit_counts")
                .fetch_all(pool)
                .await
        }
    }
    .expect("audit_counts is readable");
    let mut stored: Vec<(i64, String, String, bool, i64)> =
        counts.into_iter().filter(|c| c.4 != 0).collect();
    stored.sort();
    let mut wanted: Vec<(i64, String, String, bool, i64)> = expected
        .counts
        .iter()
        .map(|(k, n)| {
            (
                k.bucket_ms,
                k.action.into(),
                k.decision.into(),
                k.shadow,
                *n,
            )
        })
        .collect();
    wanted.sort();
    assert_eq!(stored, wanted, "audit_counts equals the rows' counts");

    const TOP: &str = "SELECT width_ms, start_ms, list, key, n FROM audit_top";
    let tops: Vec<(i64, i64, String, String, i64)> = match db {
        AuditDb::Postgres(pool) => sqlx::query_as(TOP).fetch_all(pool).await,
        AuditDb::Sqlite(pool) => sqlx::query_as(TOP).fetch_all(pool).await,
    }
    .expect("audit_top is readable");
    // Summaries past what a period reads are trimmed (rollup::TOP_KEPT_MS).
    let now = chrono::Utc::now().timestamp_millis();
    let kept = |key: &rollup::SummaryKey| {
        rollup::TOP_KEPT_MS
            .iter()
            .any(|(w, kept)| *w == key.width_ms && key.start_ms >= now - kept)
    };
    for (key, summary) in expected
        .tops
        .iter()
        .filter(|(k, s)| s.dropped == 0 && kept(k))
    {
        let mut have: Vec<(String, i64)> = tops
            .iter()
            .filter(|t| t.0 == key.width_ms && t.1 == key.start_ms && t.2 == key.list.as_str())
            .map(|t| (t.3.clone(), t.4))
            .collect();
        have.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        assert_eq!(have, summary.keys, "the top summary of {key:?}");
    }
}
