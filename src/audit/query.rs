//! What an admin asks of the trail: filters and an opaque keyset cursor.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::AuditDecision;
use crate::domain::{Action, SubjectKind};

mod params;

pub use params::{Empty, EventParams, EventQuery, ParamError, MAX_LIMIT};

/// What an admin's event query filters on; each `None` matches every row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    /// Only rows of this subject kind.
    pub subject_kind: Option<SubjectKind>,
    /// Only rows of this subject id (exact).
    pub subject: Option<String>,
    /// Only rows of this action.
    pub action: Option<Action>,
    /// Only rows of this decision.
    pub decision: Option<AuditDecision>,
    /// Only rows from this client IP (exact).
    pub ip: Option<String>,
    /// Only rows of this admin (`token:oncall`, `oidc:ann@example.com`; exact).
    pub actor: Option<String>,
    /// Inclusive.
    pub since: Option<DateTime<Utc>>,
    /// Inclusive.
    pub until: Option<DateTime<Utc>>,
}

/// The position after the last row of a page, in `(occurred_at, id)` order,
/// newest first. Stable under concurrent inserts: new rows sort before it.
/// Microseconds, PostgreSQL's precision, so no row is skipped or repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Time of the page's last row.
    pub occurred_at: DateTime<Utc>,
    /// Id of that row, which orders rows of the same time.
    pub id: Uuid,
}

/// The latest time a cursor can name: RFC 3339's last second, so that any
/// well-formed cursor is a position every database can compare against.
const MAX_MICROS: u64 = 253_402_300_799_999_999;

impl Cursor {
    /// What [`Cursor::decode`] accepts, as the OpenAPI document's `pattern`:
    /// the time in microseconds since 1970 (16 hex digits), then the row id
    /// (32), lower case. Every such string is a position, so a cursor of the
    /// right form is never refused.
    pub const PATTERN: &'static str = "^[0-9a-f]{48}$";

    /// The opaque text clients get as `next_cursor`.
    pub fn encode(&self) -> String {
        let micros = u64::try_from(self.occurred_at.timestamp_micros()).unwrap_or(0);
        format!("{micros:016x}{}", self.id.simple())
    }

    /// Reads what `encode` wrote; `None` for text not of the `PATTERN` form.
    pub fn decode(token: &str) -> Option<Self> {
        let lower_hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if token.len() != 48 || !lower_hex(token) {
            return None;
        }
        let (micros, id) = token.split_at(16);
        let micros = u64::from_str_radix(micros, 16).ok()?.min(MAX_MICROS);
        Some(Self {
            occurred_at: DateTime::from_timestamp_micros(i64::try_from(micros).ok()?)?,
            id: Uuid::parse_str(id).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_rejected() {
        let cursor = Cursor {
            occurred_at: DateTime::from_timestamp_millis(1_763_805_692_622).unwrap(),
            id: Uuid::now_v7(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        let pattern = regex::Regex::new(Cursor::PATTERN).unwrap();
        for bad in [
            "",
            "zz",
            "abc",
            "6162",
            &"00".repeat(150),
            &"A".repeat(48),
            &"0".repeat(47),
        ] {
            assert_eq!(Cursor::decode(bad), None, "{bad:?}");
            assert!(!pattern.is_match(bad), "{bad:?}");
        }
        // Any cursor of the documented form is a position, within RFC 3339's years.
        for (odd, at) in [
            ("f".repeat(48), "9999-12-31T23:59:59.999999Z"),
            ("0".repeat(48), "1970-01-01T00:00:00.000000Z"),
        ] {
            assert!(pattern.is_match(&odd));
            let far = Cursor::decode(&odd).expect("a position");
            let written = far.occurred_at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
            assert_eq!(written, at);
        }
    }
}
