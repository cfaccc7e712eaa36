//! A subject's page (`GET /admin/subjects/{kind}/{id}`: its live state and
//! recent events), the header's look-up that leads there, and the Unblock
//! form of the page and of the overview.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::form_body::FormBody;
use super::views::{self, PumpingView, SubjectPage};
use super::{
    authenticate, checked_form, csrf, html, me, path_subject, query_error, require, see_other,
    Refusal, SUBJECT_EVENTS,
};
use crate::admin::period::Period;
use crate::audit::query::{EventFilter, EventQuery};
use crate::domain::admin_role::Permission;
use crate::domain::{Subject, SubjectKind};
use crate::error::ApiError;
use crate::routes::to_the_end::to_the_end;
use crate::routes::AppState;

#[derive(serde::Deserialize)]
struct FindSubject {
    kind: String,
    id: String,
}

/// `GET /admin/subjects?kind=user&id=Alice` (the header's look-up form) →
/// 303 to the subject's page (or, for a dot segment, the page itself).
pub(super) async fn find(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let found = authenticate(&state, &req).and_then(|_| query_subject(&req));
    match found {
        // A dot segment has no page path a browser keeps: shown here.
        Ok(subject) if views::is_dot_segment(&subject.id) => {
            show_subject(&state, &req, |_| Ok(subject))
                .await
                .unwrap_or_else(|refusal| refusal.page(&req))
        }
        Ok(subject) => see_other(&views::subject_href(subject.kind, &subject.id)),
        Err(refusal) => refusal.page(&req),
    }
}

/// The subject a query names (`kind=user&id=..`), as the look-up form does.
fn query_subject(req: &HttpRequest) -> Result<Subject, Refusal> {
    let query = web::Query::<FindSubject>::from_query(req.query_string())
        .map_err(|e| ApiError::InvalidRequest(query_error(e)))?;
    let id = crate::domain::subject::plus_restored(SubjectKind::parse(&query.kind), &query.id);
    Ok(Subject::parse(&query.kind, id.trim()).map_err(ApiError::from)?)
}

/// `GET /admin/subjects/{kind}/{id}`: the subject's page, or the refusal's page.
pub(super) async fn page(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    show_subject(&state, &req, |req| path_subject(req, ""))
        .await
        .unwrap_or_else(|refusal| refusal.page(&req))
}

/// The page of the subject `named` finds in the request, once the admin
/// is authenticated (so that a stranger learns nothing of the path).
async fn show_subject(
    state: &AppState,
    req: &HttpRequest,
    named: impl FnOnce(&HttpRequest) -> Result<Subject, Refusal>,
) -> Result<HttpResponse, Refusal> {
    let admin = authenticate(state, req)?;
    let subject = named(req)?;
    let live = state.admin.state(&subject).await?;
    let filter = EventFilter {
        subject_kind: Some(subject.kind),
        subject: Some(subject.id.clone()),
        ..EventFilter::default()
    };
    let recent = EventQuery {
        filter: filter.clone(),
        limit: Some(SUBJECT_EVENTS),
        cursor: None,
    };
    let (rows, events_message) = match state
        .desk()
        .page(&admin.actor, &recent, SUBJECT_EVENTS)
        .await
    {
        Ok(page) => (views::rows(&page.events), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let now = Utc::now();
    let page = SubjectPage {
        kind: subject.kind.as_str(),
        id: subject.id.clone(),
        locked_until: SubjectPage::locked_until(&live, now),
        captcha_required: live.captcha_required,
        windows: SubjectPage::windows(&live),
        pairs: SubjectPage::pairs(&live, now),
        pumping: live.pumping.as_ref().map(|p| PumpingView::new(p, now)),
        clears: SubjectPage::clears(subject.kind),
        unblock_href: views::unblock_href(subject.kind, &subject.id),
        csrf: csrf::issue(&admin.csrf_key, &subject, now),
        can_unblock: admin.may(Permission::Unblock),
        me: Some(me(&admin)),
        unblocked: req.query_string().split('&').any(|p| p == "unblocked=1"),
        rows,
        events_message,
        all_events_href: views::events_href(&filter, None, None),
    };
    Ok(html(req, StatusCode::OK, page))
}

/// `POST /admin/subjects/{kind}/{id}/unblock`: see [`unblock_subject`].
pub(super) async fn unblock(
    state: web::Data<AppState>,
    req: HttpRequest,
    FormBody(body): FormBody,
) -> HttpResponse {
    unblock_subject(&state, &req, |req| path_subject(req, "/unblock"), &body)
        .await
        .unwrap_or_else(|refusal| refusal.page(&req))
}

/// `POST /admin/subjects/unblock?kind=user&id=..`: the same, the subject
/// named by the query; the form of a subject whose id is a dot segment
/// (`views::is_dot_segment`) posts here.
pub(super) async fn unblock_by_query(
    state: web::Data<AppState>,
    req: HttpRequest,
    FormBody(body): FormBody,
) -> HttpResponse {
    unblock_subject(&state, &req, query_subject, &body)
        .await
        .unwrap_or_else(|refusal| refusal.page(&req))
}

/// Where the browser goes after an unblock: back to the page whose form it
/// was. Only these two, so a form cannot send it anywhere else.
enum Back {
    /// The subject page (its form has no `back` field).
    Subject,
    /// The overview of a period (`back=overview`, `period=24h`).
    Overview(Period),
}

impl Back {
    fn from_fields(fields: &[(String, String)]) -> Result<Self, Refusal> {
        let field = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        match field("back") {
            None => Ok(Self::Subject),
            Some("overview") => Ok(Self::Overview(Period::from_query(field("period"))?)),
            Some(_) => {
                Err(ApiError::InvalidRequest("back must be \"overview\" or absent".into()).into())
            }
        }
    }
}

/// `POST …/unblock` from the subject page's form or the overview's: a valid
/// CSRF token for this subject and these credentials, or 403 and nothing
/// changes.
async fn unblock_subject(
    state: &web::Data<AppState>,
    req: &HttpRequest,
    named: impl FnOnce(&HttpRequest) -> Result<Subject, Refusal>,
    body: &[u8],
) -> Result<HttpResponse, Refusal> {
    let admin = authenticate(state, req)?;
    let subject = named(req)?;
    require(state, req, &admin, Permission::Unblock, &subject)?;
    let fields = checked_form(req, &admin.csrf_key, &subject, body)?;
    let back = Back::from_fields(&fields)?;
    // Lifted and audited whether or not the browser waits for the answer.
    let (lifting, target, info) = (state.clone(), subject.clone(), admin.info.clone());
    let unblock = async move { lifting.admin.unblock(&target, &info).await };
    to_the_end(state.detached.clone(), unblock)
        .await
        .map_err(ApiError::from)?;
    let location = match back {
        Back::Subject => views::unblocked_href(subject.kind, &subject.id),
        Back::Overview(period) => format!("{}&unblocked=1", views::overview::overview_href(period)),
    };
    Ok(see_other(&location))
}
