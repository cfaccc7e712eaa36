//! The overview's periods (`?period=1h|24h|7d`): how long each looks back,
//! how it is cut into chart columns and how those are labelled.

use chrono::{DateTime, Utc};

use crate::audit::stats::Span;

const MINUTE_MS: i64 = 60_000;
const HOUR_MS: i64 = 60 * MINUTE_MS;

/// How far back the overview looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Period {
    /// Twelve columns of 5 minutes.
    Hour,
    /// Twenty-four columns of an hour; the default.
    #[default]
    Day,
    /// Twenty-eight columns of 6 hours.
    Week,
}

impl Period {
    /// Every period, in the order the page offers them.
    pub const ALL: [Period; 3] = [Period::Hour, Period::Day, Period::Week];

    /// The query string's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "1h",
            Period::Day => "24h",
            Period::Week => "7d",
        }
    }

    /// The period `as_str` names.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == raw)
    }

    /// The period a query's `period` names; the default when it names none.
    pub fn from_query(raw: Option<&str>) -> Result<Self, crate::error::ApiError> {
        match raw {
            None => Ok(Self::default()),
            Some(raw) => Self::parse(raw).ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.map(Self::as_str).to_vec();
                crate::error::ApiError::InvalidRequest(format!(
                    "period must be one of {}",
                    names.join(", ")
                ))
            }),
        }
    }

    /// `last 24 hours`.
    pub fn words(self) -> &'static str {
        match self {
            Period::Hour => "last hour",
            Period::Day => "last 24 hours",
            Period::Week => "last 7 days",
        }
    }

    /// What one column covers, in words (`per hour`).
    pub fn per_column(self) -> &'static str {
        match self {
            Period::Hour => "per 5 minutes",
            Period::Day => "per hour",
            Period::Week => "per 6 hours",
        }
    }

    fn bucket_ms(self) -> i64 {
        match self {
            Period::Hour => 5 * MINUTE_MS,
            Period::Day => HOUR_MS,
            Period::Week => 6 * HOUR_MS,
        }
    }

    fn buckets(self) -> u32 {
        match self {
            Period::Hour => 12,
            Period::Day => 24,
            Period::Week => 28,
        }
    }

    /// The columns up to the one holding `now`.
    pub fn span(self, now: DateTime<Utc>) -> Span {
        Span::ending_at(now, self.bucket_ms(), self.buckets())
    }

    /// The time axis label of a column starting at `start`: every 15
    /// minutes, every 3 hours, or each day at midnight (UTC).
    pub fn label(self, start: DateTime<Utc>) -> Option<String> {
        let (every_ms, format) = match self {
            Period::Hour => (15 * MINUTE_MS, "%H:%M"),
            Period::Day => (3 * HOUR_MS, "%H:%M"),
            Period::Week => (24 * HOUR_MS, "%b %d"),
        };
        (start.timestamp_millis().rem_euclid(every_ms) == 0)
            .then(|| start.format(format).to_string())
    }

    /// What a column covers: `10:00–11:00 UTC`, or with the day for a week.
    pub fn column_title(self, start: DateTime<Utc>, end: DateTime<Utc>) -> String {
        let from = match self {
            Period::Week => start.format("%b %d %H:%M"),
            Period::Hour | Period::Day => start.format("%H:%M"),
        };
        format!("{from}–{} UTC", end.format("%H:%M"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn periods_parse_from_their_names_only() {
        for period in Period::ALL {
            assert_eq!(Period::parse(period.as_str()), Some(period));
        }
        for bad in ["", "1H", "24", "7d ", "week", "30d"] {
            assert_eq!(Period::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_period_covers_its_length_in_round_columns() {
        let now = at("2026-11-22T10:23:45Z");
        let cases = [
            (Period::Hour, "2026-11-22T09:25:00Z", "2026-11-22T10:25:00Z"),
            (Period::Day, "2026-11-21T11:00:00Z", "2026-11-22T11:00:00Z"),
            (Period::Week, "2026-11-15T12:00:00Z", "2026-11-22T12:00:00Z"),
        ];
        for (period, start, end) in cases {
            let span = period.span(now);
            assert_eq!((span.start, span.end()), (at(start), at(end)), "{period:?}");
        }
    }

    #[test]
    fn axis_labels_fall_on_round_times() {
        let label = |p: Period, t: &str| p.label(at(t));
        assert_eq!(
            label(Period::Hour, "2026-11-22T09:45:00Z").as_deref(),
            Some("09:45")
        );
        assert_eq!(label(Period::Hour, "2026-11-22T09:50:00Z"), None);
        assert_eq!(
            label(Period::Day, "2026-11-22T09:00:00Z").as_deref(),
            Some("09:00")
        );
        assert_eq!(label(Period::Day, "2026-11-22T10:00:00Z"), None);
        assert_eq!(
            label(Period::Week, "2026-11-22T00:00:00Z").as_deref(),
            Some("Nov 22")
        );
        assert_eq!(label(Period::Week, "2026-11-22T06:00:00Z"), None);
        assert_eq!(
            Period::Week.column_title(at("2026-11-22T06:00:00Z"), at("2026-11-22T12:00:00Z")),
            "Nov 22 06:00–12:00 UTC"
        );
    }
}
