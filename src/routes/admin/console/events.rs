//! `GET /admin`: the audit trail's events, a page at a time, under the
//! number ranges the pumping guard blocks now.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use chrono::Utc;

use super::views::{self, BlockList, EventsPage, FilterForm};
use super::{authenticate, html, me, query_error, Refusal, PAGE_SIZE};
use crate::admin::trail::export_subject;
use crate::audit::query::Empty;
use crate::domain::admin_role::Permission;
use crate::guard::pumping::LISTED_BLOCKS;
use crate::routes::admin::csrf;
use crate::routes::admin::request::EventsQuery;
use crate::routes::AppState;

/// `GET /admin`: the events page, or the refusal's page.
pub(super) async fn page(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    show_events(&state, &req)
        .await
        .unwrap_or_else(|refusal| refusal.page(&req))
}

/// The event table; bad filters show the form again with the reason (400).
async fn show_events(state: &AppState, req: &HttpRequest) -> Result<HttpResponse, Refusal> {
    let admin = authenticate(state, req)?;
    let me = Some(me(&admin));
    // Read whatever the audit trail does: the blocks come from the store.
    let blocks = blocks(state).await;
    let refused = |blocks, query: &EventsQuery, status: StatusCode, message: String| {
        let page = EventsPage {
            blocks,
            form: FilterForm::new(query),
            message: Some(message),
            rows: Vec::new(),
            first_href: None,
            next_href: None,
            export_href: None,
            me: me.clone(),
        };
        Ok(html(req, status, page))
    };
    let query = match web::Query::<EventsQuery>::from_query(req.query_string()) {
        Ok(query) => query.into_inner(),
        Err(e) => {
            let message = query_error(e);
            return refused(
                blocks,
                &EventsQuery::default(),
                StatusCode::BAD_REQUEST,
                message,
            );
        }
    };
    let parsed = match query.parse(Empty::NoFilter) {
        Ok(parsed) => parsed,
        Err(e) => return refused(blocks, &query, StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (events, next_cursor) = match state.desk().page(&admin.actor, &parsed, PAGE_SIZE).await {
        Ok(page) => (page.events, page.next_cursor),
        Err(e) => return refused(blocks, &query, e.status_code(), e.to_string()),
    };
    let page = EventsPage {
        blocks,
        form: FilterForm::new(&query),
        message: None,
        rows: views::rows(&events),
        first_href: parsed
            .cursor
            .is_some()
            .then(|| views::events_href(&parsed.filter, parsed.limit, None)),
        next_href: next_cursor.map(|c| views::events_href(&parsed.filter, parsed.limit, Some(&c))),
        export_href: admin.may(Permission::ExportCsv).then(|| {
            // The whole filter, from its newest row: not the page's size,
            // which would cut the file with nothing in it to say so.
            let href = views::events_href(&parsed.filter, None, None);
            let token = csrf::issue(&admin.csrf_key, &export_subject(), Utc::now());
            let token = form_urlencoded::Serializer::new(String::new())
                .append_pair(csrf::QUERY_PARAMETER, &token)
                .finish();
            match href.split_once('?') {
                Some((_, query)) => format!("/admin/events.csv?{query}&{token}"),
                None => format!("/admin/events.csv?{token}"),
            }
        }),
        me: me.clone(),
    };
    Ok(html(req, StatusCode::OK, page))
}

/// The pumping blocks for the top of the events page; a store failure
/// only says so there.
async fn blocks(state: &AppState) -> BlockList {
    match state.admin.pumping_blocks(LISTED_BLOCKS).await {
        Ok((blocks, total)) => BlockList::new(&blocks, total, Utc::now()),
        // The store's own words (addresses, server replies) go to the log.
        Err(e) => {
            tracing::error!(request_id = %crate::telemetry::request_id(), error = %e, "admin console: pumping blocks");
            BlockList {
                message: Some(
                    "The blocked number ranges cannot be read: the store is unavailable.".into(),
                ),
                ..BlockList::default()
            }
        }
    }
}
