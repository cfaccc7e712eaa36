//! Admins' changes to the allow and block lists, each audited: action
//! `admin`, decision `list_add` or `list_remove`, reason the list
//! (`allow_list`, `block_list`), the entry's kind and value as the subject.

use uuid::Uuid;

use super::Desk;
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, Reason, Subject, SubjectKind};
use crate::guard::RequestInfo;
use crate::lists::{EntryKind, ListEntry, ListError, ListName};

/// What a refused list change is audited against: the lists as a whole.
pub fn lists_subject() -> Subject {
    Subject::new(SubjectKind::Global, "lists")
}

/// A new entry as an admin gives it.
pub struct NewEntry<'a> {
    /// The allow or the block list.
    pub list: ListName,
    /// What the value is.
    pub kind: EntryKind,
    /// The value as typed; normalised before it is stored.
    pub value: &'a str,
    /// The admin's note.
    pub note: &'a str,
}

impl Desk<'_> {
    /// Store `entry` (an equal one already stored is answered instead), in
    /// force here at once.
    pub async fn add_list_entry(
        &self,
        info: &RequestInfo,
        entry: NewEntry<'_>,
    ) -> Result<ListEntry, ListError> {
        // Audited once committed, before the lists are read back.
        let audit = |stored: &ListEntry| self.audit_change(info, AuditDecision::ListAdd, stored);
        self.lists
            .add(entry.list, entry.kind, entry.value, entry.note, audit)
            .await
    }

    /// Delete the stored entry `id`; the entry deleted.
    pub async fn remove_list_entry(
        &self,
        info: &RequestInfo,
        id: Uuid,
    ) -> Result<ListEntry, ListError> {
        let audit =
            |removed: &ListEntry| self.audit_change(info, AuditDecision::ListRemove, removed);
        self.lists.remove(id, audit).await
    }

    fn audit_change(&self, info: &RequestInfo, decision: AuditDecision, entry: &ListEntry) {
        let reason = match entry.list {
            ListName::Allow => Reason::AllowList,
            ListName::Block => Reason::BlockList,
        };
        let kind = match entry.kind {
            EntryKind::Ip => SubjectKind::Ip,
            EntryKind::Phone => SubjectKind::Phone,
            EntryKind::User => SubjectKind::User,
        };
        let subject = Subject::new(kind, entry.value.clone());
        let event = AuditEvent::new(Action::Admin, decision, reason, &subject);
        self.audit.record(info.stamp(event));
    }
}
