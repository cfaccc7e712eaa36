//! `GET /admin/overview?period=1h|24h|7d`: the period's refusals counted by
//! the audit database, and the subjects locked or blocked now.
//!
//! Who is locked now: the trail's `lock` rows whose time plus
//! `retry_after_ms` is still ahead and that no `unblock` of their subject
//! followed (`AuditDb::overview`), each then confirmed against the store's
//! live state (one read per subject, as the subject page makes): a lock the
//! store no longer holds (run out early, an IP whose failures left the
//! window, cleared by an unblock the trail has not written yet) is left
//! out, and the end shown is the store's. When the store does not answer,
//! the trail's list is shown as it is, marked unconfirmed.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Deserialize;

use super::views::overview::{LockList, LockRow, OverviewPage};
use super::{authenticate, csrf, html, query_error, Refusal};
use crate::admin::period::Period;
use crate::audit::stats::{Limits, OpenLock};
use crate::audit::AuditError;
use crate::domain::SubjectKind;
use crate::error::ApiError;
use crate::guard::admin::SubjectState;
use crate::routes::AppState;
use crate::settings::Secret;

/// Entries per top list.
const TOP: usize = 10;
/// Locks checked against the store and listed (each one is a store read).
const LOCKS_LISTED: usize = 25;

/// How many listed locks' states are read at once (each user's reads up
/// to eight pair locks at once itself).
const STATES_READ_AT_ONCE: usize = 4;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct OverviewQuery {
    period: Option<String>,
    /// `1` after an unblock from this page.
    unblocked: Option<String>,
}

pub(super) async fn page(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    show(&state, &req)
        .await
        .unwrap_or_else(|refusal| refusal.page(&req))
}

fn db_error(e: AuditError) -> ApiError {
    tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "overview query failed");
    ApiError::AuditUnavailable
}

async fn show(state: &AppState, req: &HttpRequest) -> Result<HttpResponse, Refusal> {
    let admin = authenticate(state, req)?;
    let query = web::Query::<OverviewQuery>::from_query(req.query_string())
        .map_err(|e| ApiError::InvalidRequest(query_error(e)))?;
    let period = Period::from_query(query.period.as_deref())?;
    let now = Utc::now();
    let span = period.span(now);
    let log = state.audit_log.as_ref().ok_or(ApiError::AuditUnavailable)?;
    let limits = Limits {
        top: TOP,
        locks: LOCKS_LISTED + 1,
    };
    let overview = log
        .overview(admin.actor.as_str(), &span, now, limits)
        .await
        .map_err(db_error)?;
    // One lock more than listed tells that the list is cut; so does a
    // search that stopped at its bound of rows.
    let more_locks = overview.locks.len() > LOCKS_LISTED || overview.locks_cut;
    let open = &overview.locks[..overview.locks.len().min(LOCKS_LISTED)];
    let locks = LockList {
        more: more_locks.then_some(open.len()),
        ..confirmed_locks(state, &admin.csrf_key, open, now).await
    };
    let unblocked = query.unblocked.as_deref() == Some("1");
    let mut page = OverviewPage::new(period, &span, &overview, locks, unblocked);
    page.can_unblock = admin.may(crate::domain::admin_role::Permission::Unblock);
    page.me = Some(super::me(&admin));
    Ok(html(req, StatusCode::OK, page))
}

/// What is locked, in words, as the store has it.
fn scope(state: &SubjectState) -> String {
    match state.kind {
        SubjectKind::User if state.locked_until.is_some() => "account".into(),
        SubjectKind::User => {
            let ips: Vec<&str> = state
                .pairs
                .iter()
                .filter(|p| p.locked_until.is_some())
                .map(|p| p.ip.as_str())
                .collect();
            match ips.as_slice() {
                [ip] => format!("from {ip}"),
                ips => format!("from {} IPs", ips.len()),
            }
        }
        SubjectKind::Ip => "login block".into(),
        SubjectKind::Network => "SMS window".into(),
        SubjectKind::Prefix | SubjectKind::Country => "SMS pumping block".into(),
        SubjectKind::Phone | SubjectKind::Global => "lock".into(),
    }
}

/// The trail's open locks that the store still holds, as rows with an
/// Unblock form each; all of them, unconfirmed, when the store fails.
async fn confirmed_locks(
    state: &AppState,
    token: &Secret,
    open: &[OpenLock],
    now: DateTime<Utc>,
) -> LockList {
    // A few at a time: a user's state reads up to 50 pair locks itself.
    let lives: Vec<_> = futures::stream::iter(open.iter().map(|l| state.admin.state(&l.subject)))
        .buffered(STATES_READ_AT_ONCE)
        .collect()
        .await;
    let mut found = Vec::new();
    let mut failure = None;
    for (lock, live) in open.iter().zip(lives) {
        match live {
            Ok(live) => {
                if let Some(end) = live.blocked_until() {
                    found.push((lock, end, scope(&live), true));
                }
            }
            Err(e) => {
                failure.get_or_insert(e);
                found.push((lock, lock.until, "lock".into(), false));
            }
        }
    }
    // Latest-ending first, by the ends shown.
    found.sort_by_key(|lock| std::cmp::Reverse(lock.1));
    let rows = found
        .into_iter()
        .map(|(lock, end, scope, confirmed)| {
            let form = csrf::issue(token, &lock.subject, now);
            LockRow::new(&lock.subject, end, scope, confirmed, form, now)
        })
        .collect();
    let message = failure.map(|e| {
        tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "overview: store read failed");
        // The store's own words (addresses, server replies) go to the log.
        "The store did not answer: these locks are the audit trail's, not confirmed, \
         and may have been lifted."
            .to_string()
    });
    LockList {
        rows,
        message,
        more: None,
    }
}
