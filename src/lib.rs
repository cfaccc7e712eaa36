//! tollgate: SMS and login abuse decisions on sliding windows, with an audit
//! trail. `main.rs` is a thin command line over [`startup::Application`].
#![warn(missing_docs)]
// Functions stay under ~80 lines (clippy.toml); the guards keep to ~60 by review.
#![warn(clippy::too_many_lines)]

pub mod admin;
mod answer_body;
pub mod audit;
pub mod captcha;
pub mod connections;
pub mod delivery;
pub mod domain;
pub mod error;
pub mod guard;
mod hex;
pub mod in_force;
pub mod lists;
pub mod metrics;
pub mod oidc;
mod regular_file;
pub mod reload;
pub mod routes;
pub mod settings;
pub mod startup;
pub mod store;
pub mod telemetry;
mod uuid_v7;
