//! Reading an admin request: the event filters of a query string and the
//! subject a path names. The JSON API and the console both read theirs here.

use actix_web::HttpRequest;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::audit::query::{Empty, EventParams, EventQuery};
use crate::audit::AuditDecision;
use crate::domain::{Action, Subject, SubjectKind};
use crate::error::ApiError;
use crate::routes::schemas;

/// The event filters as given; shared with the HTML console. Each
/// parameter's schema is the form [`EventsQuery::parse`] takes.
#[derive(Deserialize, Default, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    #[param(value_type = Option<SubjectKind>)]
    pub subject_kind: Option<String>,
    /// The subject id. With `subject_kind` it is normalised as the guards
    /// store it (`Alice` → `alice`, `+86 138 0013 8000` → `+8613800138000`);
    /// an id that cannot be of that kind matches no event.
    #[param(schema_with = schemas::filter_text, example = "alice")]
    pub subject: Option<String>,
    #[param(value_type = Option<Action>)]
    pub action: Option<String>,
    #[param(value_type = Option<AuditDecision>)]
    pub decision: Option<String>,
    /// The client address, IPv4 or IPv6 (the full address, not its /64).
    #[param(schema_with = schemas::ip_address, example = "203.0.113.7")]
    pub ip: Option<String>,
    /// The admin who acted (exact): `token:<name>` or `oidc:<email or subject>`.
    #[param(schema_with = schemas::filter_text, example = "oidc:ann@example.com")]
    pub actor: Option<String>,
    /// Events at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<String>,
    /// Events at or before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<String>,
    /// Page size (default 100); above 500 answers 400.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(schema_with = schemas::cursor)]
    pub cursor: Option<String>,
}

impl EventsQuery {
    /// Each parameter as given.
    pub fn params(&self) -> EventParams<'_> {
        EventParams {
            subject_kind: self.subject_kind.as_deref(),
            subject: self.subject.as_deref(),
            action: self.action.as_deref(),
            decision: self.decision.as_deref(),
            ip: self.ip.as_deref(),
            actor: self.actor.as_deref(),
            since: self.since.as_deref(),
            until: self.until.as_deref(),
            limit: self.limit.as_deref(),
            cursor: self.cursor.as_deref(),
        }
    }

    /// The filters as the trail reads them; `empty` says what an empty
    /// parameter means.
    pub fn parse(&self, empty: Empty) -> Result<EventQuery, ApiError> {
        Ok(self.params().parse(empty)?)
    }
}

/// `{kind}/{id}` from the path, the id normalised as the guards store it
/// (`%2B8613800138000` and a raw `+` both name the phone `+8613800138000`).
///
/// The `{kind}/{id}` that follows `prefix` in the request's path, the id
/// percent-decoded exactly once. actix decodes path parameters but leaves
/// `%2F` encoded, so decoding that again would turn a user literally named
/// `a%2Fb` (sent as `a%252Fb`) into `a/b`; the raw path avoids both.
/// `suffix` is what follows the id on this route (`/unblock`), so that a
/// user named `unblock` is a user like any other on the others.
pub fn path_subject(req: &HttpRequest, prefix: &str, suffix: &str) -> Result<Subject, ApiError> {
    let malformed = || ApiError::InvalidRequest("the path names no subject".into());
    let rest = req
        .uri()
        .path()
        .strip_prefix(prefix)
        .ok_or_else(malformed)?;
    let rest = rest.strip_suffix(suffix).ok_or_else(malformed)?;
    let (kind, id) = rest.split_once('/').ok_or_else(malformed)?;
    let id = percent_encoding::percent_decode_str(id)
        .decode_utf8()
        .map_err(|_| ApiError::InvalidRequest("the subject id is not UTF-8".into()))?;
    Ok(Subject::parse(kind, &id)?)
}
