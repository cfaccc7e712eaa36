//! `GET /openapi.json`: the OpenAPI document, generated from the code. Each
//! handler carries a `#[utoipa::path]` (responses, parameters, security); the
//! query parameters come from the handlers' `web::Query<T>` arguments, the
//! request bodies from the attribute's `request_body` (every JSON body is
//! read by `routes::json::Body<T>`), and the schemas from
//! `ToSchema` on the types the handlers
//! (de)serialise, so a renamed or added field shows up here by itself.

use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi};

use super::{admin, login, ops, schemas, sms};
use crate::domain::{Action, SubjectKind};

/// Register `GET /openapi.json`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(super::get("/openapi.json", openapi_json));
}

/// Bearer scheme of the public routes: an entry of `server.api_keys`.
pub const API_KEY_SCHEME: &str = "api_key";
/// Bearer scheme of the admin routes: an entry of `server.admin_tokens`.
pub const ADMIN_TOKEN_SCHEME: &str = "admin_token";
/// The other bearer scheme of the admin routes: a JWT access token from the
/// OpenID provider of `[admin.oidc]`.
pub const OIDC_JWT_SCHEME: &str = "oidc_jwt";

#[derive(OpenApi)]
#[openapi(
    paths(
        sms::send,
        sms::verify,
        login::check,
        login::attempt,
        admin::events::list,
        admin::events::csv,
        admin::stats::stats,
        admin::subjects::state,
        admin::subjects::unblock,
        admin::lists::list,
        admin::lists::add_ip,
        admin::lists::add_phone,
        admin::lists::add_user,
        admin::lists::delete,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        openapi_json,
    ),
    modifiers(&SecuritySchemes, &SubjectPaths),
    tags(
        (name = "sms", description = "SMS verification codes: `/sms/send`, `/sms/verify`"),
        (name = "login", description = "Login captcha and lock decisions"),
        (name = "admin", description = "Audit events and live subject state; needs an admin token"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    ),
)]
/// Where the document is derived: the documented paths, then the security
/// schemes and the per-kind subject paths added.
pub struct ApiDoc;

/// The two bearer schemes. Neither opens the other's routes.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            API_KEY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <API key>`, one of `server.api_keys`. \
                         Required on `/sms/*` and `/login/*` when `server.api_keys` is non-empty; \
                         the body's `ip` is honoured only on requests that carry one.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            ADMIN_TOKEN_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "`Authorization: Bearer <admin token>`, one of `server.admin_tokens`. \
                         A plain-string token may do everything (it is named `token:<position>`); \
                         a `{ name, token, role }` entry what its role allows. \
                         With no admin token configured (and no `[admin.oidc]`) the admin routes answer 401.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            OIDC_JWT_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "`Authorization: Bearer <JWT access token>` from the OpenID provider of \
                         `[admin.oidc]`: signed by one of its keys (JWKS, asymmetric algorithms only), \
                         issued by `admin.oidc.issuer_url` for the audience `admin.oidc.api_audience`, \
                         not expired. Its `admin.oidc.roles_claim` values map to roles through \
                         `admin.oidc.role_map`. Off while `api_audience` is empty.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The subject routes, `/admin/api/subjects/{kind}/{id}[/unblock]`, written
/// out once per kind (`/admin/api/subjects/ip/{id}`), since what an id may
/// be depends on its kind and one `{kind}` parameter cannot say so.
struct SubjectPaths;

fn subject_id_schema(kind: SubjectKind) -> Object {
    match kind {
        SubjectKind::Phone => schemas::phone(),
        SubjectKind::Prefix => schemas::prefix(),
        SubjectKind::User => schemas::user(),
        SubjectKind::Ip => schemas::ip_subject(),
        SubjectKind::Network => schemas::network_subject(),
        SubjectKind::Country => schemas::country(),
        SubjectKind::Global => ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some([Action::SmsSend.as_str()]))
            .description(Some("The one global subject: `sms_send`."))
            .build(),
    }
}

impl Modify for SubjectPaths {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for suffix in ["", "/unblock"] {
            let generic = format!("/admin/api/subjects/{{kind}}/{{id}}{suffix}");
            let Some(item) = openapi.paths.paths.remove(&generic) else {
                continue;
            };
            for kind in SubjectKind::ALL {
                let mut item = item.clone();
                for operation in [&mut item.get, &mut item.post].into_iter().flatten() {
                    operation.operation_id = operation
                        .operation_id
                        .take()
                        .map(|id| format!("{id}_{kind}"));
                    let parameters = operation.parameters.get_or_insert_with(Vec::new);
                    parameters.retain(|p| !matches!(p, RefOr::T(p) if p.name == "kind"));
                    for parameter in parameters.iter_mut() {
                        if let RefOr::T(p) = parameter {
                            if p.name == "id" {
                                p.schema = Some(subject_id_schema(kind).into());
                            }
                        }
                    }
                }
                openapi
                    .paths
                    .paths
                    .insert(format!("/admin/api/subjects/{kind}/{{id}}{suffix}"), item);
            }
        }
    }
}

/// The document, built once.
pub static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_json()
        .expect("the OpenAPI document serialises")
});

/// The document as `tollgate openapi` prints it and `docs/openapi.json`
/// keeps it: indented, with a final newline, so that a diff of two versions
/// reads line by line.
pub fn pretty_document() -> String {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    text.push('\n');
    text
}

/// This OpenAPI document
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3 document of this API", body = Object,
        content_type = "application/json")),
)]
async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(DOCUMENT.as_str())
}
