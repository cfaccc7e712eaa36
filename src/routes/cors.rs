//! CORS for the routes browsers call directly (`/sms/send`, `/sms/verify`):
//! the origins of `server.cors_origins` may call them, preflights are
//! answered, and no credentials are ever allowed (the API takes none a
//! browser would send), so `*` is safe where it is configured.

use actix_cors::Cors;
use actix_web::http::header;
use actix_web::middleware::Condition;

/// The origins allowed to call the browser-facing routes.
#[derive(Debug, Clone, Default)]
pub struct CorsOrigins(Vec<String>);

impl CorsOrigins {
    /// `origins` as `server.cors_origins` gives them (checked at start-up).
    pub fn new(origins: &[String]) -> Self {
        Self(origins.to_vec())
    }

    /// The middleware for one resource: none without configured origins,
    /// so that nothing changes for callers that are not browsers.
    pub fn middleware(&self) -> Condition<Cors> {
        let mut cors = Cors::default()
            .allowed_methods(["POST"])
            .allowed_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
            .expose_headers([
                header::RETRY_AFTER,
                header::HeaderName::from_static("ratelimit"),
                header::HeaderName::from_static("ratelimit-policy"),
            ])
            .max_age(600);
        for origin in &self.0 {
            cors = if origin == "*" {
                cors.allow_any_origin().send_wildcard()
            } else {
                cors.allowed_origin(origin)
            };
        }
        Condition::new(!self.0.is_empty(), cors)
    }
}
