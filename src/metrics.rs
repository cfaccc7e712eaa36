//! Metric names and help texts, all declared here.

use metrics::{counter, describe_counter, describe_histogram};

pub const REQUESTS: &str = "tollgate_requests_total";
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";
pub const STORE_SECONDS: &str = "tollgate_store_seconds";
pub const AUDIT_EVENTS: &str = "tollgate_audit_events_total";

pub fn describe() {
    describe_counter!(REQUESTS, "Requests answered, by route and decision");
    describe_counter!(STORE_ERRORS, "Window-store calls that failed or timed out");
    describe_histogram!(STORE_SECONDS, "Duration of window-store calls");
    describe_counter!(
        AUDIT_EVENTS,
        "Audit events by outcome: queued, written, spooled, replayed"
    );
}

pub fn store_error() {
    counter!(STORE_ERRORS).increment(1);
}
