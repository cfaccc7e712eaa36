//! `GET /admin/lists`: the allow and block lists, with a form to add an
//! entry (`POST /admin/lists`) and one to delete each stored entry
//! (`POST /admin/lists/{id}/delete`), both carrying a CSRF token.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use chrono::Utc;
use uuid::Uuid;

use crate::admin::lists::{lists_subject, NewEntry};
use crate::domain::admin_role::Permission;

use super::form_body::FormBody;
use super::{authenticate, checked_form, csrf, html, see_other, Refusal};
use crate::domain::{Subject, SubjectKind};
use crate::error::ApiError;
use crate::guard::RequestInfo;
use crate::lists::{EntryKind, EntrySource, ListEntry, ListName};
use crate::routes::AppState;

/// What the CSRF tokens of the list forms are bound to (no real subject).
fn forms() -> Subject {
    Subject::new(SubjectKind::Global, "lists")
}

/// One entry as the page shows it.
pub struct EntryRow {
    /// The List column: `allow` or `block`.
    pub list: &'static str,
    /// The Kind column: what the value matches (`ip`, `phone`, `user`).
    pub kind: &'static str,
    /// The Value column: the CIDR, number, number prefix or user name matched.
    pub value: String,
    /// The Note column: why the entry was added.
    pub note: String,
    /// The From column: `config file` or `admin`.
    pub source: &'static str,
    /// The Added column, in UTC to the minute; empty for the config file's.
    pub added: String,
    /// Where its delete form posts; none for the config file's entries.
    pub delete_href: Option<String>,
}

impl From<&ListEntry> for EntryRow {
    fn from(e: &ListEntry) -> Self {
        Self {
            list: e.list.as_str(),
            kind: e.kind.as_str(),
            value: e.value.clone(),
            note: e.note.clone(),
            source: match e.source {
                EntrySource::Config => "config file",
                EntrySource::Admin => "admin",
            },
            added: e
                .created_at
                .map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
                .unwrap_or_default(),
            delete_href: e.id.map(|id| format!("/admin/lists/{id}/delete")),
        }
    }
}

/// The lists page.
#[derive(Template, WebTemplate)]
#[template(path = "admin/lists.html")]
pub struct ListsPage {
    /// Every entry, the config file's first.
    pub rows: Vec<EntryRow>,
    /// The stored rows of a value no version reads: not in force.
    pub unreadable: Vec<EntryRow>,
    /// The token every add and delete form carries.
    pub csrf: String,
    /// A change just happened: say which.
    pub notice: Option<&'static str>,
    /// The add and delete forms are shown.
    pub can_edit: bool,
    /// Who is signed in.
    pub me: Option<super::Me>,
}

/// `GET /admin/lists`: the lists page, or the refusal's page.
pub async fn page(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    let show = || -> Result<HttpResponse, Refusal> {
        let admin = authenticate(&state, &req)?;
        let notice = match req.query_string() {
            "added=1" => Some("Entry added."),
            "deleted=1" => Some("Entry deleted."),
            _ => None,
        };
        let page = ListsPage {
            rows: state.lists.entries().iter().map(EntryRow::from).collect(),
            unreadable: state
                .lists
                .unreadable()
                .iter()
                .map(EntryRow::from)
                .collect(),
            csrf: csrf::issue(&admin.csrf_key, &forms(), Utc::now()),
            notice,
            can_edit: admin.may(Permission::EditLists),
            me: Some(super::me(&admin)),
        };
        Ok(html(&req, StatusCode::OK, page))
    };
    show().unwrap_or_else(|refusal| refusal.page(&req))
}

/// A posted list form: its admin, whose role must allow editing the lists
/// (checked first, audited), and its fields, once its CSRF token is.
fn edit_form(
    state: &AppState,
    req: &HttpRequest,
    body: &[u8],
) -> Result<(RequestInfo, Vec<(String, String)>), Refusal> {
    let admin = authenticate(state, req)?;
    super::require(state, req, &admin, Permission::EditLists, &lists_subject())?;
    let fields = checked_form(req, &admin.csrf_key, &forms(), body)?;
    Ok((admin.info, fields))
}

/// `POST /admin/lists`: add an entry, then 303 back to the page, which says
/// so; or the refusal's page.
pub async fn add(
    state: web::Data<AppState>,
    req: HttpRequest,
    FormBody(body): FormBody,
) -> HttpResponse {
    let result = async {
        let (info, fields) = edit_form(&state, &req, &body)?;
        let field = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .unwrap_or_default()
        };
        let bad = |what: &str| Refusal::Api(ApiError::InvalidRequest(format!("unknown {what}")));
        let list = ListName::parse(field("list")).ok_or_else(|| bad("list"))?;
        let kind = EntryKind::parse(field("kind")).ok_or_else(|| bad("kind"))?;
        let entry = NewEntry {
            list,
            kind,
            value: field("value"),
            note: field("note"),
        };
        state
            .desk()
            .add_list_entry(&info, entry)
            .await
            .map_err(|e| Refusal::Api(e.into()))?;
        Ok::<_, Refusal>(see_other("/admin/lists?added=1"))
    };
    result.await.unwrap_or_else(|refusal| refusal.page(&req))
}

/// `POST /admin/lists/{id}/delete`: delete a stored entry, then 303 back to
/// the page, which says so; or the refusal's page.
pub async fn delete(
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<String>,
    FormBody(body): FormBody,
) -> HttpResponse {
    let result = async {
        let (info, _) = edit_form(&state, &req, &body)?;
        let id = Uuid::parse_str(&id).map_err(|_| {
            Refusal::Api(ApiError::InvalidRequest(
                "the entry id is not a UUID".into(),
            ))
        })?;
        state
            .desk()
            .remove_list_entry(&info, id)
            .await
            .map_err(|e| Refusal::Api(e.into()))?;
        Ok::<_, Refusal>(see_other("/admin/lists?deleted=1"))
    };
    result.await.unwrap_or_else(|refusal| refusal.page(&req))
}
