//! Every answer of every listener timed into `tollgate_http_request_duration_seconds`
//! by route pattern (never the path: a path can hold a phone number, and
//! paths are unbounded), method and status; and the `debug` line per request.
//!
//! The histogram handles are kept per worker thread, by (route, method,
//! status), so that a request does not build a metric key and look it up in
//! the registry: the set is bounded by the routes, the methods named below
//! and the statuses the service answers. Finding a request's route pattern
//! walks the route table (a regex per parametrised route) and builds a
//! string, so the paths that are their own pattern (every public route) are
//! remembered per thread: only patterns go in that set, so it stays as
//! small as the route table. Both maps hash with `rustc-hash`'s Fx: no
//! request can add a key to them (a path goes in only as its own route
//! pattern), so colliding keys cost nothing, and SipHash was about 300
//! instructions a lookup.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use metrics::{histogram, Histogram};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::metrics::HTTP_SECONDS;

/// The `route` of a request no route matched.
pub const UNMATCHED: &str = "unmatched";

/// The `method` label: the standard methods by name, any other as `other`
/// (a client may send any token as a method).
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::HEAD, "HEAD"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::PATCH, "PATCH"),
        (Method::TRACE, "TRACE"),
        (Method::CONNECT, "CONNECT"),
    ];
    KNOWN
        .iter()
        .find(|(known, _)| known == method)
        .map_or("other", |(_, label)| label)
}

type SeriesKey = (Option<Rc<str>>, &'static str, u16);

thread_local! {
    static SERIES: RefCell<FxHashMap<SeriesKey, Histogram>> = RefCell::new(FxHashMap::default());
    static LITERAL_ROUTES: RefCell<FxHashSet<Rc<str>>> = RefCell::new(FxHashSet::default());
}

/// The route pattern `req` matches, `None` when it matches none. A worker
/// thread serves one listener's routes, so a path once found to be a
/// pattern stays one on that thread; it is then shared, not copied, so a
/// request on a public route allocates nothing here.
fn route_of(req: &ServiceRequest) -> Option<Rc<str>> {
    let path = req.path();
    if let Some(known) = LITERAL_ROUTES.with(|known| known.borrow().get(path).cloned()) {
        return Some(known);
    }
    let pattern: Option<Rc<str>> = req.match_pattern().map(Rc::from);
    if let Some(literal) = pattern.as_ref().filter(|p| &p[..] == path) {
        LITERAL_ROUTES.with(|known| known.borrow_mut().insert(literal.clone()));
    }
    pattern
}

/// Record one request's duration in its series.
fn observe(route: Option<Rc<str>>, method: &'static str, status: StatusCode, elapsed: Duration) {
    SERIES.with(|series| {
        let mut series = series.borrow_mut();
        let key = (route, method, status.as_u16());
        let handle = series.entry(key).or_insert_with_key(|(route, method, status)| {
            let route = route.as_deref().unwrap_or(UNMATCHED).to_string();
            histogram!(HTTP_SECONDS, "route" => route, "method" => *method, "status" => status.to_string())
        });
        handle.record(elapsed.as_secs_f64());
    });
}

/// One request's timing, from its arrival until its response head is ready;
/// started and finished by the request-id layer (`request_id::RequestIdLayer`):
/// a layer of its own cost every request some 300 instructions of boxed
/// futures (callgrind, a login).
pub struct Timing {
    started: Instant,
    method: &'static str,
    route: Option<Rc<str>>,
}

impl Timing {
    /// Start timing `req`, finding its route before routing: an error answer
    /// no longer carries its request.
    pub fn start(req: &ServiceRequest) -> Self {
        Self {
            started: Instant::now(),
            method: method_label(req.method()),
            route: route_of(req),
        }
    }

    /// Record the answer's duration and write the `debug` line, which names
    /// the route pattern, never the path.
    pub fn finish<B>(self, result: &Result<ServiceResponse<B>, actix_web::Error>) {
        let elapsed = self.started.elapsed();
        let status = match result {
            Ok(response) => response.status(),
            Err(error) => error.as_response_error().status_code(),
        };
        tracing::debug!(
            method = self.method,
            route = self.route.as_deref().unwrap_or(UNMATCHED),
            status = status.as_u16(),
            elapsed_us = elapsed.as_micros() as u64,
            "request done"
        );
        observe(self.route, self.method, status, elapsed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_methods_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        let made_up = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&made_up), "other");
    }
}
