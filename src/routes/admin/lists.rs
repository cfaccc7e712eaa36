//! `/admin/api/lists`: the allow and block lists, and changing the entries
//! admins keep in the audit database (the config file's are read-only here).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::gate::Admin;
use crate::admin::lists::{lists_subject, NewEntry};
use crate::domain::admin_role::Permission;
use crate::error::{ApiError, ErrorBody};
use crate::guard::RequestInfo;
use crate::lists::{EntryKind, ListEntry, ListError, ListName};
use crate::routes::{schemas, AppState};

/// Every entry in force, and the stored rows that are not.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ListEntries {
    /// The config file's entries first, then the stored ones, oldest first.
    pub entries: Vec<ListEntry>,
    /// Stored entries of a value no version since reads (an IP range the
    /// translators' change refuses, a row edited by hand): not in force,
    /// so an admin's block there blocks no one: delete one by its id
    /// (`DELETE /admin/api/lists/{id}`) and add what it meant anew.
    pub unreadable: Vec<ListEntry>,
}

/// A new entry of one kind; the kind is the path's (`/admin/api/lists/ip`),
/// so that the document can say what its `value` must be.
macro_rules! new_entry {
    ($name:ident, $value_schema:path, $example:literal) => {
        #[derive(Debug, Deserialize, utoipa::ToSchema)]
        #[serde(deny_unknown_fields)]
        #[schema(example = json!({"list": "block", "value": $example, "note": "abuse"}))]
        pub struct $name {
            /// `allow` or `block`.
            pub list: ListName,
            /// What the entry matches.
            #[schema(schema_with = $value_schema)]
            pub value: String,
            /// Why it is added.
            #[serde(default)]
            #[schema(schema_with = schemas::note)]
            pub note: String,
        }
    };
}

new_entry!(NewIpEntry, schemas::cidr, "198.51.100.0/24");
new_entry!(NewPhoneEntry, schemas::phone_entry, "+88213*");
new_entry!(NewUserEntry, schemas::user, "mallory");

impl From<ListError> for ApiError {
    fn from(e: ListError) -> Self {
        match e {
            ListError::Invalid(why) => ApiError::InvalidRequest(why),
            ListError::NotFound => ApiError::NotFound,
            ListError::Unavailable(why) => {
                tracing::warn!(error = %why, "list entries unavailable");
                ApiError::AuditUnavailable
            }
        }
    }
}

/// The allow and block lists in force
#[utoipa::path(
    get,
    path = "/admin/api/lists",
    operation_id = "get_lists",
    tag = "admin",
    responses(
        (status = 200, description = "Every entry in force, and in `unreadable` the stored rows that are not (a value no version since reads)", body = ListEntries),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn list(state: web::Data<AppState>, _admin: Admin) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(ListEntries {
        entries: state.lists.entries(),
        unreadable: state.lists.unreadable(),
    }))
}

async fn add(
    state: &AppState,
    info: RequestInfo,
    kind: EntryKind,
    (list, value, note): (ListName, String, String),
) -> Result<HttpResponse, ApiError> {
    let entry = NewEntry {
        list,
        kind,
        value: &value,
        note: &note,
    };
    let stored = state.desk().add_list_entry(&info, entry).await?;
    Ok(HttpResponse::Created().json(stored))
}

macro_rules! add_route {
    ($fn:ident, $kind:expr, $body:ty, $path:literal, $id:literal, $what:literal) => {
        #[doc = concat!("Add an allow or block entry for ", $what)]
        ///
        /// In force on this instance at once, on the others within
        /// `lists.refresh_interval`. Adding an entry that is already stored
        /// answers the stored one. Audited as `admin` / `list_add`.
        #[utoipa::path(
            post,
            path = $path,
            operation_id = $id,
            tag = "admin",
            request_body = $body,
            responses(
                (status = 201, description = "The stored entry", body = ListEntry),
                (status = 400, description = "`invalid_request`: a value not of its kind, malformed JSON", body = ErrorBody),
                (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
                (status = 403, description = "`forbidden`: the admin's role may not change the lists (the operator role may); audited", body = ErrorBody),
                (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
                    headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
                (status = 413, description = "`payload_too_large`: body over 16 KiB", body = ErrorBody),
                (status = 415, description = "`unsupported_media_type`: body not `application/json`, or compressed (`Content-Encoding`)", body = ErrorBody),
                (status = 503, description = "`audit_unavailable`: the audit database, which keeps the entries, does not answer", body = ErrorBody),
            ),
            security(("admin_token" = []), ("oidc_jwt" = [])),
        )]
        pub async fn $fn(
            state: web::Data<AppState>,
            admin: Admin,
            req: HttpRequest,
            body: Result<crate::routes::json::Body<$body>, actix_web::Error>,
        ) -> Result<HttpResponse, actix_web::Error> {
            // The door (`gate`) asked who asks first: without a token the
            // answer was 401, whatever the body holds.
            crate::routes::json::check_media_type(&req)?;
            super::roles::require(&state, &admin, Permission::EditLists, &lists_subject())?;
            let body = body?.into_inner();
            Ok(add(&state, admin.info, $kind, (body.list, body.value, body.note)).await?)
        }
    };
}

add_route!(
    add_ip,
    EntryKind::Ip,
    NewIpEntry,
    "/admin/api/lists/ip",
    "add_ip_list_entry",
    "client IPs (an address or CIDR)"
);
add_route!(
    add_phone,
    EntryKind::Phone,
    NewPhoneEntry,
    "/admin/api/lists/phone",
    "add_phone_list_entry",
    "phones (a number, or a prefix ending in `*`)"
);
add_route!(
    add_user,
    EntryKind::User,
    NewUserEntry,
    "/admin/api/lists/user",
    "add_user_list_entry",
    "users"
);

/// Delete a stored entry
///
/// Audited as `admin` / `list_remove`.
#[utoipa::path(
    delete,
    path = "/admin/api/lists/{id}",
    operation_id = "delete_list_entry",
    tag = "admin",
    params(("id" = Uuid, Path, description = "The entry's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "`invalid_request`: the id is not a UUID, or names a row of a list or kind no version writes (edited by hand), which is kept; a row of a value no version reads (listed under `unreadable`) is deleted", body = ErrorBody),
        (status = 401, description = "`unauthorized`: no valid admin token", body = ErrorBody),
        (status = 403, description = "`forbidden`: the admin's role may not change the lists (the operator role may); audited", body = ErrorBody),
        (status = 429, description = "`rate_limited`: this address failed admin authentication `server.admin_auth_limit` times (or its IPv6 /48 `server.admin_auth_network_limit` times); every admin route refuses it, token or not, until `Retry-After`", body = crate::routes::schemas::RateLimitedError,
            headers(("Retry-After" = u64, description = "Whole seconds until the oldest counted failure leaves the window"))),
        (status = 404, description = "`not_found`: no stored entry has this id", body = ErrorBody),
        (status = 503, description = "`audit_unavailable`", body = ErrorBody),
    ),
    security(("admin_token" = []), ("oidc_jwt" = [])),
)]
pub async fn delete(
    state: web::Data<AppState>,
    admin: Admin,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    super::roles::require(&state, &admin, Permission::EditLists, &lists_subject())?;
    let info = admin.info;
    let id = Uuid::parse_str(&id)
        .map_err(|_| ApiError::InvalidRequest("the entry id is not a UUID".into()))?;
    state.desk().remove_list_entry(&info, id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// `/lists` (GET), `/lists/{ip,phone,user}` (POST) and `/lists/{id}`
/// (DELETE); other methods answer a JSON 405.
pub fn configure(scope: actix_web::Scope) -> actix_web::Scope {
    scope
        .service(crate::routes::get("/lists", list))
        .service(crate::routes::post("/lists/ip", add_ip))
        .service(crate::routes::post("/lists/phone", add_phone))
        .service(crate::routes::post("/lists/user", add_user))
        .service(
            web::resource("/lists/{id}")
                .route(web::delete().to(delete))
                .default_service(web::to(|| async {
                    Err::<HttpResponse, _>(ApiError::MethodNotAllowed("DELETE"))
                })),
        )
}
