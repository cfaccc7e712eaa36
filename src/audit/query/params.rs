//! The event filters as an admin gives them (query parameters or the
//! console's form fields, as text), read into an [`EventFilter`], a page size
//! and a cursor. The JSON API and the console both read them here.

use std::sync::LazyLock;

use chrono::{DateTime, Datelike, Timelike, Utc};
use regex::Regex;

use super::{Cursor, EventFilter};
use crate::audit::AuditDecision;
use crate::domain::{Action, ClientIp, Subject, SubjectKind};

/// The largest page an admin may ask for.
pub const MAX_LIMIT: usize = 500;

/// The filters as given, each the text of one parameter.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventParams<'a> {
    /// `subject_kind`.
    pub subject_kind: Option<&'a str>,
    /// `subject`.
    pub subject: Option<&'a str>,
    /// `action`.
    pub action: Option<&'a str>,
    /// `decision`.
    pub decision: Option<&'a str>,
    /// `ip`.
    pub ip: Option<&'a str>,
    /// `actor`.
    pub actor: Option<&'a str>,
    /// `since`, RFC 3339.
    pub since: Option<&'a str>,
    /// `until`, RFC 3339.
    pub until: Option<&'a str>,
    /// `limit`, digits.
    pub limit: Option<&'a str>,
    /// `cursor`, as [`Cursor::encode`] wrote it.
    pub cursor: Option<&'a str>,
}

/// What the parameters come to.
#[derive(Debug, Clone, PartialEq)]
pub struct EventQuery {
    /// The rows asked for.
    pub filter: EventFilter,
    /// The page size or row cap, when given.
    pub limit: Option<usize>,
    /// Where the page starts, when given.
    pub cursor: Option<Cursor>,
}

/// How an empty parameter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Empty {
    /// The JSON API: every parameter given is a value of its documented
    /// form, and an empty one is not (`until=` is refused).
    Refused,
    /// The console's filter form sends every field; an empty (or blank) one
    /// means "no filter".
    NoFilter,
}

/// A parameter that is not of its form (400 `invalid_request`); the text
/// says which and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamError(String);

type Read<T> = Result<Option<T>, ParamError>;

impl EventParams<'_> {
    /// Read every parameter; `empty` says what an empty one means.
    pub fn parse(&self, empty: Empty) -> Result<EventQuery, ParamError> {
        let read = Reader { empty };
        let subject_kind =
            read.enumerated("subject_kind", self.subject_kind, SubjectKind::parse)?;
        Ok(EventQuery {
            filter: EventFilter {
                subject_kind,
                subject: read.subject(subject_kind, self.subject)?,
                action: read.enumerated("action", self.action, Action::parse)?,
                decision: read.enumerated("decision", self.decision, AuditDecision::parse)?,
                ip: read.ip(self.ip)?,
                actor: read.actor(self.actor)?,
                since: read.time("since", self.since)?,
                until: read.time("until", self.until)?,
            },
            limit: read.parsed("limit", self.limit, page_size, |_| {
                format!("limit must be between 1 and {MAX_LIMIT}")
            })?,
            cursor: read.parsed("cursor", self.cursor, Cursor::decode, |_| {
                "cursor is not one this API gave".into()
            })?,
        })
    }
}

/// An RFC 3339 date-time as JSON Schema's `date-time` format has it: `T` (or
/// `t`) between date and time, seconds always, a `Z` or `±hh:mm` offset;
/// and, in UTC, within years 0000-9999, as RFC 3339 has them: an offset
/// can carry `9999-12-31T23:00:00-05:00` into year 10,000, which the trail's
/// fixed-width text times (SQLite's, the console's links) cannot hold.
fn rfc3339(raw: &str) -> Option<DateTime<Utc>> {
    static SHAPE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
            .expect("a valid pattern")
    });
    let seconds = SHAPE.captures(raw)?.get(1)?.as_str();
    let time = DateTime::parse_from_rfc3339(raw).ok()?.with_timezone(&Utc);
    // A leap second is the last second of a UTC day.
    let leap_ok = seconds != "60" || (time.hour(), time.minute()) == (23, 59);
    (leap_ok && (0..=9999).contains(&time.year())).then_some(time)
}

/// A page size: digits only, 1 to [`MAX_LIMIT`].
fn page_size(raw: &str) -> Option<usize> {
    let n = raw.parse::<usize>().ok()?;
    (raw.bytes().all(|b| b.is_ascii_digit()) && (1..=MAX_LIMIT).contains(&n)).then_some(n)
}

/// Reads the parameters one at a time, empty ones as `Empty` says.
struct Reader {
    empty: Empty,
}

impl Reader {
    fn text(&self, name: &str, value: Option<&str>) -> Read<String> {
        match (value, self.empty) {
            (None, _) => Ok(None),
            (Some(""), Empty::Refused) => Err(ParamError(format!("{name} is empty"))),
            (Some(v), Empty::Refused) => Ok(Some(v.to_string())),
            (Some(v), Empty::NoFilter) => {
                Ok(Some(v.trim()).filter(|v| !v.is_empty()).map(str::to_string))
            }
        }
    }

    /// A value `parse` reads, or a refusal saying `refusal`.
    fn parsed<T>(
        &self,
        name: &str,
        value: Option<&str>,
        parse: impl FnOnce(&str) -> Option<T>,
        refusal: impl FnOnce(&str) -> String,
    ) -> Read<T> {
        self.text(name, value)?
            .map(|raw| parse(&raw).ok_or_else(|| ParamError(refusal(&raw))))
            .transpose()
    }

    fn enumerated<T>(
        &self,
        name: &str,
        value: Option<&str>,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Read<T> {
        // Not the text given: a link chose it, and the console shows this
        // in its own red box (as `pages::query_error`).
        self.parsed(name, value, parse, |_| format!("unknown {name}"))
    }

    fn time(&self, name: &str, value: Option<&str>) -> Read<DateTime<Utc>> {
        self.parsed(name, value, rfc3339, |_| {
            format!("{name} must be an RFC 3339 time")
        })
    }

    /// The subject, normalised as the guards store it when the kind is
    /// known; an id that cannot be of that kind is kept as given and
    /// matches nothing.
    fn subject(&self, kind: Option<SubjectKind>, value: Option<&str>) -> Read<String> {
        // Before `text` trims the space a lost `+` left.
        let value = value.map(|v| crate::domain::subject::plus_restored(kind, v));
        let Some(raw) = self.text("subject", value.as_deref())? else {
            return Ok(None);
        };
        if raw.chars().any(char::is_control) {
            return Err(ParamError("subject contains control characters".into()));
        }
        Ok(Some(match kind {
            Some(kind) => Subject::parse(kind.as_str(), &raw)
                .map(|s| s.id)
                .unwrap_or(raw),
            None => raw,
        }))
    }

    /// The address as the trail writes it (`::ffff:1.2.3.4` is `1.2.3.4`,
    /// and so is `64:ff9b::1.2.3.4`; rows written before such addresses
    /// counted as IPv4 hold the IPv6 text, and are found by their /64 subject).
    /// The API refuses what is not one, as its document says; the console
    /// keeps it as typed, to match nothing and be shown back.
    fn ip(&self, value: Option<&str>) -> Read<String> {
        let Some(raw) = self.text("ip", value)? else {
            return Ok(None);
        };
        if raw.chars().any(char::is_control) {
            // Kept as typed, a NUL would reach PostgreSQL, which refuses it.
            return Err(ParamError("ip contains control characters".into()));
        }
        match (ClientIp::parse(&raw), self.empty) {
            (Some(ip), _) => Ok(Some(ip.to_string())),
            (None, Empty::NoFilter) => Ok(Some(raw)),
            (None, Empty::Refused) => Err(ParamError("ip is not an IP address".into())),
        }
    }

    /// An actor as the trail writes it; control characters never are.
    fn actor(&self, value: Option<&str>) -> Read<String> {
        let actor = self.text("actor", value)?;
        if actor
            .as_deref()
            .is_some_and(|a| a.chars().any(char::is_control))
        {
            return Err(ParamError("actor contains control characters".into()));
        }
        Ok(actor)
    }
}

impl EventFilter {
    /// The filter as the query string that asks for it again
    /// (`subject_kind=phone&since=…`), with `limit` when given; `all` when
    /// there is neither. What an export's audit row names in `rule`.
    pub fn describe(&self, limit: Option<usize>) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        let time = |t: &DateTime<Utc>| crate::audit::rfc3339_ms::format(t);
        let pairs = [
            (
                "subject_kind",
                self.subject_kind.map(|k| k.as_str().to_string()),
            ),
            ("subject", self.subject.clone()),
            ("action", self.action.map(|a| a.as_str().to_string())),
            ("decision", self.decision.map(|d| d.as_str().to_string())),
            ("ip", self.ip.clone()),
            ("actor", self.actor.clone()),
            ("since", self.since.as_ref().map(time)),
            ("until", self.until.as_ref().map(time)),
            ("limit", limit.map(|n| n.to_string())),
        ];
        for (name, value) in pairs {
            if let Some(value) = value {
                query.append_pair(name, &value);
            }
        }
        let described = query.finish();
        if described.is_empty() {
            "all".into()
        } else {
            described
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_refuses_an_empty_parameter_the_console_reads_it_as_no_filter() {
        let params = EventParams {
            until: Some(""),
            ip: Some(" "),
            ..EventParams::default()
        };
        assert!(params.parse(Empty::Refused).is_err());
        let console = params.parse(Empty::NoFilter).expect("no filter");
        assert_eq!(console.filter, EventFilter::default());
    }

    /// The console keeps an `ip` that is no address as typed, to match
    /// nothing; a NUL kept so would reach PostgreSQL, which refuses it (503).
    #[test]
    fn an_ip_with_a_control_character_is_refused_in_both_modes() {
        for ip in ["\u{0}", "1.2.3.4\u{0}", "a\nb"] {
            let params = EventParams {
                ip: Some(ip),
                ..EventParams::default()
            };
            assert!(params.parse(Empty::Refused).is_err(), "{ip:?}");
            assert!(params.parse(Empty::NoFilter).is_err(), "{ip:?}");
        }
        let typed = EventParams {
            ip: Some("office"),
            ..EventParams::default()
        };
        assert!(typed.parse(Empty::NoFilter).is_ok());
    }

    #[test]
    fn a_subject_of_a_known_kind_is_normalised_and_a_plus_lost_as_a_space_restored() {
        let params = EventParams {
            subject_kind: Some("phone"),
            subject: Some(" 8613800138000"),
            ..EventParams::default()
        };
        for empty in [Empty::Refused, Empty::NoFilter] {
            let query = params.parse(empty).expect("valid");
            assert_eq!(query.filter.subject.as_deref(), Some("+8613800138000"));
            assert_eq!(
                query.filter.describe(None),
                "subject_kind=phone&subject=%2B8613800138000"
            );
        }
        // Not for an address or a user: a pasted leading space is trimmed.
        for (kind, typed, kept) in [("ip", " 203.0.113.7", "203.0.113.7"), ("user", " 42", "42")] {
            let params = EventParams {
                subject_kind: Some(kind),
                subject: Some(typed),
                ..EventParams::default()
            };
            let query = params.parse(Empty::NoFilter).expect("valid");
            assert_eq!(query.filter.subject.as_deref(), Some(kept), "{kind}");
        }
    }

    #[test]
    fn limits_outside_one_to_the_maximum_and_bad_times_are_refused() {
        for params in [
            EventParams {
                limit: Some("0"),
                ..EventParams::default()
            },
            EventParams {
                limit: Some("501"),
                ..EventParams::default()
            },
            EventParams {
                limit: Some("+5"),
                ..EventParams::default()
            },
            EventParams {
                since: Some("2026-01-01"),
                ..EventParams::default()
            },
            EventParams {
                since: Some("2026-01-01T12:00:60Z"),
                ..EventParams::default()
            },
            EventParams {
                actor: Some("a\u{7}"),
                ..EventParams::default()
            },
            // Years 10,000 and -1 in UTC.
            EventParams {
                since: Some("9999-12-31T23:00:00-05:00"),
                ..EventParams::default()
            },
            EventParams {
                until: Some("0000-01-01T00:30:00+01:00"),
                ..EventParams::default()
            },
        ] {
            assert!(params.parse(Empty::Refused).is_err(), "{params:?}");
        }
        let last_second = EventParams {
            until: Some("2026-06-30T23:59:60Z"),
            ..EventParams::default()
        };
        assert!(last_second.parse(Empty::Refused).is_ok());
        let edges = EventParams {
            since: Some("0000-01-01T00:00:00Z"),
            until: Some("9999-12-31T23:59:59.999Z"),
            ..EventParams::default()
        };
        assert!(edges.parse(Empty::Refused).is_ok(), "the first and last ms");
    }
}
