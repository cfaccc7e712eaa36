//! The CSV export's rows: the audit columns in DESIGN.md §4 order, each cell a
//! spreadsheet would run as a formula made text, and each record a
//! spreadsheet could split on another separator quoted.

use std::cell::RefCell;
use std::io::Write;

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

/// Whether a spreadsheet may split `cell` on something other than the
/// comma: where the list separator is `;` (German, French, … locales) a
/// bare `x;=HYPERLINK(…)` would open as two cells, the second a formula
/// that [`cell`]'s `'` does not reach. Such a record is quoted whole, and a
/// quoted field is one cell whatever the separator.
fn may_split(cell: &str) -> bool {
    cell.contains([';', '\t', '|'])
}

/// `events` as CSV records, the header row first when `header` is set.
pub fn rows(events: &[AuditEvent], header: bool) -> Result<Bytes, csv::Error> {
    let bytes = RefCell::new(Vec::with_capacity(events.len() * 200));
    let mut out = csv::Writer::from_writer(Shared(&bytes));
    let mut quoted = csv::WriterBuilder::new()
        .quote_style(csv::QuoteStyle::Always)
        .from_writer(Shared(&bytes));
    if header {
        out.write_record(CSV_HEADER)?;
    }
    let opt = |v: &Option<String>| cell(v.clone().unwrap_or_default());
    let num = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
    for e in events {
        let record = [
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
        ];
        if record.iter().any(|c| may_split(c)) {
            // Both write to one buffer: what `out` holds goes first.
            out.flush()?;
            quoted.write_record(&record)?;
            quoted.flush()?;
        } else {
            out.write_record(&record)?;
        }
    }
    out.flush()?;
    drop((out, quoted));
    Ok(Bytes::from(bytes.into_inner()))
}

/// One buffer both of [`rows`]' writers append to.
struct Shared<'a>(&'a RefCell<Vec<u8>>);

impl Write for Shared<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditDecision;
    use crate::domain::{Action, Reason, Subject, SubjectKind};

    fn refusal(user: &str, user_agent: &str) -> AuditEvent {
        let subject = Subject::new(SubjectKind::User, user);
        let mut event = AuditEvent::new(
            Action::LoginAttempt,
            AuditDecision::Deny,
            Reason::UserLocked,
            &subject,
        );
        event.user_agent = Some(user_agent.to_string());
        event
    }

    fn lines(events: &[AuditEvent]) -> Vec<String> {
        let bytes = rows(events, true).unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn a_cell_a_semicolon_locale_would_split_is_quoted_with_its_record() {
        let events = [
            refusal("alice", "curl/8"),
            refusal("a;=1+1;", "x;=HYPERLINK(\"https://evil.example\");"),
            refusal("bob", "tab\there"),
            refusal("carol", "curl/8"),
        ];
        let lines = lines(&events);
        assert!(lines[0].starts_with("id,occurred_at,"), "{}", lines[0]);
        assert!(
            !lines[1].contains('"'),
            "plain records stay plain: {}",
            lines[1]
        );
        assert!(
            lines[2].contains(r#","a;=1+1;","#)
                && lines[2].contains(r#","x;=HYPERLINK(""https://evil.example"");","#),
            "{}",
            lines[2]
        );
        assert!(lines[2].starts_with('"'), "the whole record: {}", lines[2]);
        assert!(lines[3].contains("\"tab\there\""), "{}", lines[3]);
        assert!(!lines[4].contains('"'), "{}", lines[4]);
        assert!(lines[4].contains(",carol,"), "{}", lines[4]);

        // Read back, every field is whole and in its column.
        let bytes = rows(&events, true).unwrap();
        let mut reader = csv::Reader::from_reader(&bytes[..]);
        let read: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        assert_eq!(read.len(), 4);
        assert_eq!(&read[1][6], "a;=1+1;");
        assert_eq!(&read[1][14], "x;=HYPERLINK(\"https://evil.example\");");
        assert_eq!(&read[3][6], "carol");
    }
}
