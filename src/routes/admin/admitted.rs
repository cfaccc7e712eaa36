//! The admin the door let in (`gate`), as handlers and pages see it: who,
//! with which roles, how they got in.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};

use crate::domain::admin_role::{Actor, Permission, Roles};
use crate::error::ApiError;
use crate::guard::RequestInfo;
use crate::settings::Secret;

/// How an admin got in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Via {
    /// A static token (Bearer, or the console's Basic password).
    Token,
    /// A JWT access token from the OpenID provider.
    Jwt,
    /// A console session from single sign-on; the hash names its row.
    Session { id_hash: String },
}

/// An admitted admin: who asked, with which roles, and the secret the
/// console keys its CSRF tokens by.
#[derive(Clone)]
pub struct Admin {
    /// For audit rows; its `actor` is this admin's.
    pub info: RequestInfo,
    /// `token:<name>` or `oidc:<email or subject>`.
    pub actor: Actor,
    /// What the admin may do (`domain::admin_role`).
    pub roles: Roles,
    /// The token, JWT or session id presented; never logged.
    pub csrf_key: Secret,
    /// How the admin got in.
    pub via: Via,
}

impl Admin {
    /// Whether the admin's roles allow `permission`.
    pub fn may(&self, permission: Permission) -> bool {
        self.roles.allow(permission)
    }
}

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    /// The admin the door let in; a route outside the door has none (401),
    /// so a route registered without it fails closed.
    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<Admin>()
                .cloned()
                .ok_or(ApiError::Unauthorized),
        )
    }
}
