//! Everything the API tests share: the app in process (`app`), the real
//! binary as a child process (`process`), audit databases and a proxy that
//! can cut them (`audit_db`), the rows they hold (`audit_trail`), an SMTP
//! server (`smtp`) and waiting with a deadline (`wait`).

pub mod app;
pub mod audit_db;
pub mod audit_trail;
pub mod process;
pub mod smtp;
pub mod wait;
