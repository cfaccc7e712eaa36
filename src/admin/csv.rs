//! The CSV export's rows: the audit columns in DESIGN.md §4 order, each cell a
//! spreadsheet would run as a formula made text, and each piece of one it
//! could split on another separator.

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

/// What starts a formula in a spreadsheet's cell: `=`, `+`, `-`, `@`, a tab
/// or a carriage return.
const FORMULA: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// Separators besides the comma that a spreadsheet may split a line on:
/// `;` where it is the list separator (German, French, … locales), a tab,
/// a `|`. There the comma is not one, so quoting does not keep a field
/// whole: `x;=HYPERLINK(…)` opens as two cells, the second a formula.
const SEPARATORS: [char; 3] = [';', '\t', '|'];

/// A cell that a spreadsheet would run as a formula (it starts with `=`, `+`,
/// `-`, `@`, a tab or a carriage return) is written after a `'`, which
/// spreadsheets take as "what follows is text" (OWASP's advice against CSV
/// injection). User names, user agents and phone numbers come from outside:
/// a phone reads `'+8613800138000`, safe and still whole, where a bare
/// `+8613800138000` would become the number 8613800138000. A program reading
/// the file drops one leading `'` from such a cell. So does every piece a
/// spreadsheet could split the cell into (see [`SEPARATORS`]): a `'` goes
/// after a separator whose next character (past spaces and quotes) starts a
/// formula, `x;'=HYPERLINK(…)`; `(X11; Linux x86_64)` is left as it is.
///
/// A cell or piece that already starts with a `'` gets one more, `''alice`:
/// otherwise a user named `'=1` would read back as one named `=1`, and
/// `'alice`, whom an attacker can name in one login attempt, as `alice`,
/// so a script reading the export would put the first's refusals on the
/// second. Dropping one `'` where a cell or piece starts always gives the
/// value back.
fn cell(value: String) -> String {
    let leads = starts_escaped(&value);
    if !leads && !value.contains(SEPARATORS) {
        return value;
    }
    let mut out = String::with_capacity(value.len() + 2);
    if leads {
        out.push('\'');
    }
    for (i, c) in value.char_indices() {
        out.push(c);
        if SEPARATORS.contains(&c) {
            let next = value[i + c.len_utf8()..].trim_start_matches([' ', '"']);
            if starts_escaped(next) {
                out.push('\'');
            }
        }
    }
    out
}

/// Whether `piece` gets a `'` before it: it would start a formula, or it
/// starts with the `'` that a reader drops.
fn starts_escaped(piece: &str) -> bool {
    piece.starts_with(FORMULA) || piece.starts_with('\'')
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditDecision;
    use crate::domain::{Action, Reason, Subject, SubjectKind};

    #[test]
    fn each_piece_a_spreadsheet_could_split_a_cell_into_is_text() {
        for (raw, written) in [
            ("alice", "alice"),
            ("=1+1", "'=1+1"),
            ("a;=1+1;", "a;'=1+1;"),
            ("x; \"=HYPERLINK(1)", "x;' \"=HYPERLINK(1)"),
            ("a|-2", "a|'-2"),
            ("a\t@b", "a\t'@b"),
            ("-a;+b", "'-a;'+b"),
            (
                "Mozilla/5.0 (X11; Linux x86_64)",
                "Mozilla/5.0 (X11; Linux x86_64)",
            ),
            ("ü;=1", "ü;'=1"),
            ("'=1", "''=1"),
            ("'alice", "''alice"),
            ("a;'=1", "a;''=1"),
            ("a; 'b", "a;' 'b"),
            ("o'brien", "o'brien"),
        ] {
            assert_eq!(cell(raw.to_string()), written, "{raw:?}");
        }
    }

    /// Read as a `;` (or tab, or `|`) locale reads a comma file: whatever
    /// the pieces, none starts a formula.
    #[test]
    fn no_piece_of_an_exported_line_starts_a_formula_in_a_semicolon_locale() {
        let subject = Subject::new(SubjectKind::User, "a;=1+1;");
        let mut event = AuditEvent::new(
            Action::LoginAttempt,
            AuditDecision::Deny,
            Reason::UserLocked,
            &subject,
        );
        event.user_agent = Some("x;=HYPERLINK(\"https://evil.example\",\"a\")|@SUM(1)".into());
        let bytes = rows(&[event], true).unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.starts_with("id,occurred_at,action,"), "{text}");
        for line in text.lines() {
            for piece in line.split(SEPARATORS) {
                let piece = piece.trim_start_matches([' ', '"']);
                assert!(!piece.starts_with(FORMULA), "{piece:?} in {line:?}");
            }
        }
        let mut reader = csv::Reader::from_reader(&bytes[..]);
        let record = reader.records().next().unwrap().unwrap();
        assert_eq!(&record[6], "a;'=1+1;", "still one column");
    }

    /// What docs/admin.md tells a program reading the export to do: drop
    /// one `'` where a cell or a piece after a separator starts.
    fn read_back(written: &str) -> String {
        let mut out = String::with_capacity(written.len());
        let mut at_start = true;
        for c in written.chars() {
            if !(at_start && c == '\'') {
                out.push(c);
            }
            at_start = SEPARATORS.contains(&c);
        }
        out
    }

    /// Two different values never export as the same cell: whatever a
    /// caller names a user, dropping the `'`s gives that name back.
    #[test]
    fn every_value_reads_back_as_itself() {
        for raw in [
            "alice",
            "'alice",
            "''alice",
            "=1",
            "'=1",
            "a;=1",
            "a;'=1",
            "a; 'b",
            "a;''b",
            "x; \"=1",
            "o'brien",
            "-",
            "'",
            ";'",
            "a|'@b\t'c",
        ] {
            let written = cell(raw.to_string());
            assert_eq!(read_back(&written), raw, "{raw:?} written as {written:?}");
        }
        assert_ne!(cell("=1".into()), cell("'=1".into()));
        assert_ne!(cell("alice".into()), cell("'alice".into()));
    }
}
