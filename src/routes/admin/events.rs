//! `GET /admin/api/events` and `/admin/api/events.csv`: the audit trail
//! filtered, as JSON pages or streamed CSV. Filters are parsed here as the
//! OpenAPI document states them; the trail is read through `AuditLog`.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use std::sync::LazyLock;

use chrono::{DateTime, Timelike, Utc};
use futures::StreamExt;
use regex::Regex;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::csv;
use crate::audit::query::{Cursor, EventFilter};
use crate::audit::{AuditDecision, AuditEvent, AuditLog};
use crate::domain::{Action, ClientIp, SubjectKind};
use crate::error::{ApiError, ErrorBody};
use crate::routes::{schemas, AppState};

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 500;

/// The event filters as given; shared with the HTML console. Each
/// parameter's schema is the form [`EventsQuery::parse`] takes.
#[derive(Deserialize, Default, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    #[param(value_type = Option<SubjectKind>)]
    pub(super) subject_kind: Option<String>,
    /// The subject id. With `subject_kind` it is normalised as the guards
    /// store it (`Alice` → `alice`, `+86 138 0013 8000` → `+8613800138000`);
    /// an id that cannot be of that kind matches no event.
    #[param(schema_with = schemas::filter_text, example = "alice")]
    pub(super) subject: Option<String>,
    #[param(value_type = Option<Action>)]
    pub(super) action: Option<String>,
    #[param(value_type = Option<AuditDecision>)]
    pub(super) decision: Option<String>,
    /// The client address, IPv4 or IPv6 (the full address, not its /64).
    #[param(schema_with = schemas::ip_address, example = "203.0.113.7")]
    pub(super) ip: Option<String>,
    /// Events at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub(super) since: Option<String>,
    /// Events at or before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub(super) until: Option<String>,
    /// Page size (default 100); above 500 answers 400.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub(super) limit: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(schema_with = schemas::cursor)]
    pub(super) cursor: Option<String>,
}

/// `GET /admin/api/events` 200.
#[derive(Serialize, ToSchema)]
pub struct EventsPage {
    /// Newest first.
    events: Vec<AuditEvent>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

pub(super) struct Parsed {
    pub(super) filter: EventFilter,
    pub(super) limit: Option<usize>,
    pub(super) cursor: Option<Cursor>,
}

/// How an empty parameter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Empty {
    /// The JSON API: every parameter given is a value of its documented
    /// form, and an empty one is not (`until=` answers 400).
    Refused,
    /// The console's filter form sends every field; an empty (or blank) one
    /// means "no filter".
    NoFilter,
}

/// An RFC 3339 date-time as JSON Schema's `date-time` format has it: `T` (or
/// `t`) between date and time, seconds always, a `Z` or `±hh:mm` offset.
fn rfc3339(raw: &str) -> Option<DateTime<Utc>> {
    static SHAPE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
            .expect("a valid pattern")
    });
    let seconds = SHAPE.captures(raw)?.get(1)?.as_str();
    let time = DateTime::parse_from_rfc3339(raw).ok()?.with_timezone(&Utc);
    // A leap second is the last second of a UTC day.
    let leap_ok = seconds != "60" || (time.hour(), time.minute()) == (23, 59);
    leap_ok.then_some(time)
}

/// Reads the parameters one at a time, empty ones as `Empty` says.
struct Reader {
    empty: Empty,
}

impl Reader {
    fn text(&self, name: &str, value: &Option<String>) -> Result<Option<String>, ApiError> {
        match (value.as_deref(), self.empty) {
            (None, _) => Ok(None),
            (Some(""), Empty::Refused) => Err(ApiError::InvalidRequest(format!("{name} is empty"))),
            (Some(v), Empty::Refused) => Ok(Some(v.to_string())),
            (Some(v), Empty::NoFilter) => {
                Ok(Some(v.trim()).filter(|v| !v.is_empty()).map(str::to_string))
            }
        }
    }

    /// A value `parse` reads, or 400 `invalid_request` saying `refusal`.
    fn parsed<T>(
        &self,
        name: &str,
        value: &Option<String>,
        parse: impl FnOnce(&str) -> Option<T>,
        refusal: impl FnOnce(&str) -> String,
    ) -> Result<Option<T>, ApiError> {
        self.text(name, value)?
            .map(|raw| parse(&raw).ok_or_else(|| ApiError::InvalidRequest(refusal(&raw))))
            .transpose()
    }

    fn enumerated<T>(
        &self,
        name: &str,
        value: &Option<String>,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        self.parsed(name, value, parse, |raw| format!("unknown {name} {raw:?}"))
    }

    fn time(&self, name: &str, value: &Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
        self.parsed(name, value, rfc3339, |_| {
            format!("{name} must be an RFC 3339 time")
        })
    }

    /// The subject, normalised as the guards store it when the kind is
    /// known; an id that cannot be of that kind is kept as given and
    /// matches nothing.
    fn subject(
        &self,
        kind: Option<SubjectKind>,
        value: &Option<String>,
    ) -> Result<Option<String>, ApiError> {
        let Some(raw) = self.text("subject", value)? else {
            return Ok(None);
        };
        if raw.chars().any(char::is_control) {
            return Err(ApiError::InvalidRequest(
                "subject contains control characters".into(),
            ));
        }
        // A raw `+` in a query string arrives as a space: `subject=+8613800138000`.
        let raw = match raw.strip_prefix(' ') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => format!("+{rest}"),
            _ => raw,
        };
        Ok(Some(match kind {
            Some(kind) => super::subjects::subject(kind.as_str(), &raw)
                .map(|s| s.id)
                .unwrap_or(raw),
            None => raw,
        }))
    }

    /// The address as the trail writes it (`::ffff:1.2.3.4` is `1.2.3.4`).
    /// The API refuses what is not one, as its document says; the console
    /// keeps it as typed, to match nothing and be shown back.
    fn ip(&self, value: &Option<String>) -> Result<Option<String>, ApiError> {
        let Some(raw) = self.text("ip", value)? else {
            return Ok(None);
        };
        match (ClientIp::parse(&raw), self.empty) {
            (Some(ip), _) => Ok(Some(ip.to_string())),
            (None, Empty::NoFilter) => Ok(Some(raw)),
            (None, Empty::Refused) => {
                Err(ApiError::InvalidRequest("ip is not an IP address".into()))
            }
        }
    }
}

/// A page size: digits only, 1 to [`MAX_LIMIT`].
fn page_size(raw: &str) -> Option<usize> {
    let n = raw.parse::<usize>().ok()?;
    (raw.bytes().all(|b| b.is_ascii_digit()) && (1..=MAX_LIMIT).contains(&n)).then_some(n)
}

impl EventsQuery {
    pub(super) fn parse(&self, empty: Empty) -> Result<Parsed, ApiError> {
        let read = Reader { empty };
        let subject_kind =
            read.enumerated("subject_kind", &self.subject_kind, SubjectKind::parse)?;
        Ok(Parsed {
            filter: EventFilter {
                subject_kind,
                subject: read.subject(subject_kind, &self.subject)?,
                action: read.enumerated("action", &self.action, Action::parse)?,
                decision: read.enumerated("decision", &self.decision, AuditDecision::parse)?,
                ip: read.ip(&self.ip)?,
                since: read.time("since", &self.since)?,
                until: read.time("until", &self.until)?,
            },
            limit: read.parsed("limit", &self.limit, page_size, |_| {
                format!("limit must be between 1 and {MAX_LIMIT}")
            })?,
            cursor: read.parsed("cursor", &self.cursor, Cursor::decode, |_| {
                "cursor is not one this API gave".into()
            })?,
        })
    }
}

fn audit_log(state: &AppState) -> Result<AuditLog, ApiError> {
    let db = state.audit_db.as_ref().ok_or(ApiError::AuditUnavailable)?;
    Ok(AuditLog::new(db.clone()))
}

fn db_error(e: crate::audit::AuditError) -> ApiError {
    tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "admin query failed");
    ApiError::AuditUnavailable
}

/// Audit events, newest first, one page at a time
///
/// Unknown or empty parameters answer 400.
#[utoipa::path(
    get,
    path = "/admin/api/events",
    operation_id = "list_events",
    tag = "admin",
    params(EventsQuery),
    responses(
        (status = 200, description = "One page of events", body = EventsPage),
        (status = 400, description = "`invalid_request`: a bad filter, `limit` or `cursor`, or an unknown parameter", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 503, description = "`audit_unavailable`: the audit database is unreachable", body = ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    state.access.admin(&req)?;
    let (events, next_cursor) = page(&state, &query.parse(Empty::Refused)?, DEFAULT_LIMIT).await?;
    Ok(HttpResponse::Ok().json(EventsPage {
        events,
        next_cursor,
    }))
}

/// One page of events, newest first, and the cursor of the next page if any.
pub(super) async fn page(
    state: &AppState,
    parsed: &Parsed,
    default_limit: usize,
) -> Result<(Vec<AuditEvent>, Option<String>), ApiError> {
    let limit = parsed.limit.unwrap_or(default_limit);
    let page = audit_log(state)?
        .page(&parsed.filter, parsed.cursor.as_ref(), limit)
        .await
        .map_err(db_error)?;
    Ok((page.events, page.next.map(|cursor| cursor.encode())))
}

/// The same filters as the JSON list, streamed page by page; `limit`, when
/// given, caps the rows.
#[utoipa::path(
    get,
    path = "/admin/api/events.csv",
    operation_id = "export_events_csv",
    tag = "admin",
    params(EventsQuery),
    summary = "Audit events as streamed CSV",
    description = "The same filters as `/admin/api/events`; `limit`, when given, caps the rows. \
        A header row with the audit columns, then one row per event, newest first, times in RFC 3339.",
    responses(
        (status = 200, description = "CSV with a header row", body = String, content_type = "text/csv; charset=utf-8"),
        (status = 400, description = "`invalid_request`: a bad filter, `limit` or `cursor`, or an unknown parameter", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 503, description = "`audit_unavailable`: the audit database is unreachable", body = ErrorBody),
    ),
    security(("admin_token" = [])),
)]
pub async fn csv(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    state.access.admin(&req)?;
    let Parsed {
        filter,
        limit,
        cursor,
    } = query.parse(Empty::Refused)?;
    let pages = audit_log(&state)?.stream(filter, cursor, limit.unwrap_or(usize::MAX));
    let header = csv::rows(&[], true).map_err(|e| ApiError::Internal(e.into()))?;
    let rows = pages.map(|page| match page {
        Ok(events) => csv::rows(&events, false).map_err(actix_web::error::ErrorInternalServerError),
        Err(e) => {
            tracing::error!(error = %e, "CSV export stopped by a database error");
            Err(actix_web::error::ErrorServiceUnavailable(
                "audit database unavailable",
            ))
        }
    });
    let body = futures::stream::once(async move { Ok::<_, actix_web::Error>(header) }).chain(rows);
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/csv; charset=utf-8"))
        .insert_header((
            header::CONTENT_DISPOSITION,
            "attachment; filename=\"audit-events.csv\"",
        ))
        .streaming(body))
}
