//! The CSV export's rows: the audit columns in DESIGN.md §4 order, each cell a
//! spreadsheet would run as a formula made text.

use actix_web::web::Bytes;

use crate::audit::{rfc3339_ms, AuditEvent};

/// DESIGN.md §4's columns in its order, then `actor` (added at the end, so
/// that the contract's order stays a prefix).
const CSV_HEADER: [&str; 17] = [
    "id",
    "occurred_at",
    "action",
    "decision",
    "reason",
    "subject_kind",
    "subject",
    "ip",
    "rule",
    "observed",
    "limit",
    "window_ms",
    "retry_after_ms",
    "request_id",
    "user_agent",
    "shadow",
    "actor",
];

/// A cell that a spreadsheet would run as a formula (it starts with `=`, `+`,
/// `-`, `@`, a tab or a carriage return) is written after a `'`, which
/// spreadsheets take as "what follows is text" (OWASP's advice against CSV
/// injection). User names, user agents and phone numbers come from outside:
/// a phone reads `'+8613800138000`, safe and still whole, where a bare
/// `+8613800138000` would become the number 8613800138000. A program reading
/// the file drops one leading `'` from such a cell.
fn cell(value: String) -> String {
    if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value
    }
}

/// `events` as CSV records, the header row first when `header` is set.
pub fn rows(events: &[AuditEvent], header: bool) -> Result<Bytes, csv::Error> {
    let mut out = csv::Writer::from_writer(Vec::with_capacity(events.len() * 200));
    if header {
        out.write_record(CSV_HEADER)?;
    }
    let opt = |v: &Option<String>| cell(v.clone().unwrap_or_default());
    let num = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
    for e in events {
        out.write_record([
            e.id.to_string(),
            rfc3339_ms::format(&e.occurred_at),
            e.action.as_str().to_string(),
            e.decision.as_str().to_string(),
            cell(e.reason.clone()),
            e.subject_kind.as_str().to_string(),
            cell(e.subject.clone()),
            opt(&e.ip),
            opt(&e.rule),
            num(e.observed),
            num(e.limit),
            num(e.window_ms),
            num(e.retry_after_ms),
            opt(&e.request_id),
            opt(&e.user_agent),
            e.shadow.to_string(),
            opt(&e.actor),
        ])?;
    }
    out.into_inner()
        .map(Bytes::from)
        .map_err(|e| csv::Error::from(e.into_error()))
}
