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
