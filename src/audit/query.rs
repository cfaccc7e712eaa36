//! What an admin asks of the trail: filters and an opaque keyset cursor.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::AuditDecision;
use crate::domain::{Action, SubjectKind};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    pub subject_kind: Option<SubjectKind>,
    pub subject: Option<String>,
    pub action: Option<Action>,
    pub decision: Option<AuditDecision>,
    pub ip: Option<String>,
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
    pub occurred_at: DateTime<Utc>,
    pub id: Uuid,
}

impl Cursor {
    pub fn encode(&self) -> String {
        let raw = format!(
            "{}.{}",
            self.occurred_at.timestamp_micros(),
            self.id.simple()
        );
        raw.bytes().map(|b| format!("{b:02x}")).collect()
    }

    pub fn decode(token: &str) -> Option<Self> {
        if !token.len().is_multiple_of(2) || token.len() > 200 {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..token.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
            .collect();
        let raw = String::from_utf8(bytes?).ok()?;
        let (micros, id) = raw.split_once('.')?;
        Some(Self {
            occurred_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
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
        for bad in ["", "zz", "abc", "6162", &"00".repeat(150)] {
            assert_eq!(Cursor::decode(bad), None, "{bad:?}");
        }
    }
}
