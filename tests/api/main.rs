//! One integration-test binary: the API against both store backends, the real
//! Redis, and the store conformance cases.

mod edges;
mod helpers;
mod login;
mod sms_send;
mod sms_verify;
mod store_conformance;
