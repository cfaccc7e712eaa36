//! What a client can hold of the service through its connections, bounded.
//!
//! Threat model: anyone who reaches a listener can open connections and send
//! bytes as slowly as TCP allows, never read an answer, or come from many
//! addresses. Each connection holds a descriptor and a slot of its worker;
//! descriptors are shared with Redis, the audit database and files. So:
//!
//! - **Time** ([`watchdog`], [`deadline`]): every request, head and body,
//!   must arrive within `server.request_timeout` of the connection's accept
//!   or of the previous answer on it. A body still arriving then is answered
//!   408 `request_timeout` (JSON, connection closed); a connection still
//!   short of a head, idling, or not reading its answer is closed.
//! - **Count** ([`budget`], [`per_ip`]): each listener holds at most its cap
//!   (`server.max_connections`, `server.admin_max_connections`; more wait in
//!   the kernel's backlog, holding no descriptor of ours), one client address
//!   at most `server.max_connections_per_ip` on the public listener (one more
//!   is closed at accept). The caps are carved out of `RLIMIT_NOFILE` after a
//!   reserve, so the public listener cannot take what the admin listener,
//!   Redis and the database need.
//!
//! [`hook`] ties them to each accepted connection; `startup` installs it.

pub mod budget;
pub mod deadline;
mod hook;
pub mod per_ip;
mod watchdog;

pub use budget::{ConnectionPlan, DescriptorLimit, ListenerCap};
pub use hook::ListenerHook;

/// Which listener a connection came in on (the `listener` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `server.bind`: the API (and everything, without `admin_bind`).
    Public,
    /// `server.admin_bind`: the console, the admin API and `/metrics`.
    Admin,
}

impl Listener {
    /// The `listener` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Public => "public",
            Listener::Admin => "admin",
        }
    }
}
