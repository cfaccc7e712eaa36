//! What admins do to the audit trail and the lists, below the routes: the
//! JSON API (`routes::admin`) and the HTML console both call these, never
//! each other, and every change an admin makes is audited here, in one
//! place. Who may do what is asked before (`routes::admin::roles`); a
//! subject's live state and unblock are `guard::admin`'s.

pub mod csv;
pub mod lists;
pub mod period;
pub mod trail;

use crate::audit::{AuditLog, AuditSink};
use crate::lists::Lists;

/// What the admin operations work on.
#[derive(Clone, Copy)]
pub struct Desk<'a> {
    /// Where the rows of admins' own actions go.
    pub audit: &'a dyn AuditSink,
    /// The trail admins read; absent when a test replaced the sink.
    pub audit_log: Option<&'a AuditLog>,
    /// The allow and block lists admins change.
    pub lists: &'a Lists,
}
