//! One integration-test binary: the API against both store backends, the real
//! Redis, and the store conformance cases.

mod admin;
mod audit;
mod audit_db;
mod captcha;
mod cli;
mod cluster;
mod console;
mod cors;
mod delivery;
mod edges;
mod email;
mod gcra;
mod helpers;
mod integration_doc;
mod lists;
mod lock_scope;
mod login;
mod metrics;
mod openapi;
mod process;
mod pumping;
mod reload;
mod scale_out;
mod schemathesis;
mod shadow;
mod sms_send;
mod sms_verify;
mod smtp;
mod store_conformance;
mod templates_dir;
