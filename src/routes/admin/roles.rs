//! Refusing what an admin's roles do not allow: one check for the JSON API
//! and the console, which answers 403 `forbidden` and audits the refusal
//! (`admin` / `deny` / `forbidden`, the permission and the role it needs in
//! `rule`, the admin in `actor`). What each role allows is decided in
//! `domain::admin_role`, nowhere else.

use super::gate::Admin;
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::admin_role::{Permission, Roles};
use crate::domain::{Action, Reason, Subject};
use crate::error::ApiError;
use crate::routes::AppState;

/// An admin may repeat a refused action at will: one line a minute; the
/// trail has each.
static REFUSED_LINES: crate::telemetry::log_budget::LogBudget =
    crate::telemetry::log_budget::LogBudget::new(std::time::Duration::from_secs(60));

/// Ok when `admin` may do `permission` to `subject`; otherwise the refusal,
/// audited.
pub(super) fn require(
    state: &AppState,
    admin: &Admin,
    permission: Permission,
    subject: &Subject,
) -> Result<(), ApiError> {
    if admin.may(permission) {
        return Ok(());
    }
    let needed = Roles::needed_for(permission);
    if let Some(held_back) = REFUSED_LINES.admit() {
        tracing::warn!(
            request_id = %admin.info.request_id,
            actor = %admin.actor,
            permission = permission.as_str(),
            held_back,
            "admin action refused: the admin's roles do not allow it"
        );
    }
    let mut event = AuditEvent::new(
        Action::Admin,
        AuditDecision::Deny,
        Reason::Forbidden,
        subject,
    );
    event.rule = Some(format!("{} needs {}", permission.as_str(), needed.as_str()));
    state.audit.record(admin.info.stamp(event));
    Err(ApiError::Forbidden(match permission {
        Permission::Read => "your role may not read the admin API",
        Permission::Unblock => "your role may not unblock (the operator role may)",
        Permission::EditLists => "your role may not change the lists (the operator role may)",
        Permission::ExportCsv => "your role may not export CSV (the auditor role may)",
    }))
}
