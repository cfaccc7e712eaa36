//! `GET /admin/api/stats?period=1h|24h|7d`: the overview's counts and top
//! lists as JSON, from the rollups (`audit::rollup`), for dashboards and
//! scripts that should not need SQL.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::gate::Admin;
use crate::admin::period::Period;
use crate::audit::stats::{Limits, Ranked};
use crate::error::{ApiError, ErrorBody};
use crate::routes::AppState;

/// Entries per top list.
const TOP: usize = 20;

// For the OpenAPI document only: the route parses the text itself
// (`Period::from_query`), so that a bad value answers the API's 400.
/// How far back the stats look.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // never built: a schema
enum StatsPeriod {
    #[serde(rename = "1h")]
    Hour,
    #[serde(rename = "24h")]
    Day,
    #[serde(rename = "7d")]
    Week,
}

/// `GET /admin/api/stats` query.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// `1h` (5-minute buckets), `24h` (hours, the default) or `7d` (6 hours).
    #[param(inline, value_type = Option<StatsPeriod>)]
    period: Option<String>,
}

/// Refusals of one action and decision in one bucket.
#[derive(Serialize, ToSchema)]
pub struct StatsBucket {
    /// Where the bucket starts (UTC, RFC 3339).
    start: DateTime<Utc>,
    /// `sms_send`, `sms_verify`, `login_attempt` or `admin`.
    action: &'static str,
    /// `deny`, `challenge` or `lock`.
    decision: &'static str,
    /// Rows (exact).
    count: u64,
}

/// One entry of a top list.
#[derive(Serialize, ToSchema)]
pub struct StatsEntry {
    /// A subject as `kind:id` (`user:alice`), an address or a phone prefix.
    key: String,
    /// Its refusals in the period: at most the true count, and at least the
    /// true count minus the list's `max_error`.
    count: u64,
}

/// A top list and how exact it is.
#[derive(Serialize, ToSchema)]
pub struct StatsTop {
    /// Most refused first.
    entries: Vec<StatsEntry>,
    /// Whether every count is exact (`max_error` is 0).
    exact: bool,
    /// How many refusals any count may lack, at most.
    max_error: u64,
}

/// The top lists.
#[derive(Serialize, ToSchema)]
pub struct StatsTops {
    /// Subjects other than IPs and prefixes, as `kind:id`.
    subjects: StatsTop,
    /// Client addresses.
    ips: StatsTop,
    /// Phone prefixes (`sms.prefix_digits`) and prefix subjects.
    prefixes: StatsTop,
}

/// `GET /admin/api/stats` 200.
#[derive(Serialize, ToSchema)]
pub struct Stats {
    /// The period asked for.
    period: &'static str,
    /// Start of the first bucket (UTC).
    from: DateTime<Utc>,
    /// End of the last bucket, which holds now (UTC).
    until: DateTime<Utc>,
    /// Each bucket's length in milliseconds.
    bucket_ms: i64,
    /// Refusals per bucket, action and decision; empty buckets left out.
    buckets: Vec<StatsBucket>,
    /// Refusals in the period.
    total: u64,
    /// The most refused subjects, addresses and prefixes.
    top: StatsTops,
}

fn top<T>(ranked: &[Ranked<T>], key: impl Fn(&T) -> String, max_error: u64) -> StatsTop {
    StatsTop {
        entries: ranked
            .iter()
            .map(|r| StatsEntry {
                key: key(&r.key),
                count: r.count,
            })
            .collect(),
        exact: max_error == 0,
        max_error,
    }
}

/// Refusals over a period, from the rollups
///
/// Counts are exact; a top list is exact unless it says by how much its
/// counts may fall short (`max_error`). Shadow-mode rows are left out.
#[utoipa::path(
    get,
    path = "/admin/api/stats",
    operation_id = "stats",
    tag = "admin",
    params(StatsQuery),
    responses(
        (status = 200, description = "The period's counts and top lists", body = Stats),
        (status = 400, description = "`invalid_request`: an unknown `period` or parameter", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times)", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
        (status = 503, description = "`audit_unavailable`: the audit database is unreachable", body = ErrorBody),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn stats(
    state: web::Data<AppState>,
    admin: Admin,
    query: web::Query<StatsQuery>,
) -> Result<HttpResponse, ApiError> {
    let period = Period::from_query(query.period.as_deref())?;
    let now = Utc::now();
    let span = period.span(now);
    let log = state.audit_log.as_ref().ok_or(ApiError::AuditUnavailable)?;
    let limits = Limits { top: TOP, locks: 0 };
    let overview = log.overview(admin.actor.as_str(), &span, now, limits).await.map_err(|e| {
        tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "stats query failed");
        ApiError::AuditUnavailable
    })?;
    let buckets: Vec<StatsBucket> = overview
        .buckets
        .iter()
        .map(|b| StatsBucket {
            start: span.bucket_start(b.bucket),
            action: b.action.as_str(),
            decision: b.decision.as_str(),
            count: b.count,
        })
        .collect();
    let errors = overview.errors;
    Ok(HttpResponse::Ok().json(Stats {
        period: period.as_str(),
        from: span.start,
        until: span.end(),
        bucket_ms: span.bucket_ms,
        total: buckets.iter().map(|b| b.count).sum(),
        buckets,
        top: StatsTops {
            subjects: top(
                &overview.subjects,
                |s| format!("{}:{}", s.kind.as_str(), s.id),
                errors.subjects,
            ),
            ips: top(&overview.ips, String::clone, errors.ips),
            prefixes: top(&overview.prefixes, String::clone, errors.prefixes),
        },
    }))
}
