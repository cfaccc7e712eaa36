//! Events the journal did not take (it was past `audit.journal_max_bytes`,
//! or failing), held in memory until the database has them. Shared between
//! the writer and the sink's flush: while the writer waits on an insert or
//! a replay that outlasts `SIGTERM`'s flush, the flush still finds them
//! here and journals them past the bound, instead of their going with the
//! process.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::audit::AuditEvent;

/// The held events, oldest first. Only the writer adds; the writer's
/// inserts remove what they took from the front, a flush takes them all.
#[derive(Clone, Default)]
pub(in crate::audit) struct Held(Arc<Mutex<Vec<AuditEvent>>>);

impl Held {
    pub(super) fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }

    pub(super) fn extend(&self, events: impl IntoIterator<Item = AuditEvent>) {
        self.0.lock().extend(events);
    }

    /// A copy of what is held, for an insert: the events stay here, for a
    /// flush to find, until [`Held::inserted`] says they are in.
    pub(super) fn copy(&self) -> Vec<AuditEvent> {
        self.0.lock().clone()
    }

    /// The first `n` events (a [`Held::copy`]'s) are in the database. A
    /// flush may have taken them meanwhile: then fewer are left.
    pub(super) fn inserted(&self, n: usize) {
        let mut held = self.0.lock();
        let n = n.min(held.len());
        held.drain(..n);
    }

    /// Everything held, now no longer.
    pub(in crate::audit) fn take(&self) -> Vec<AuditEvent> {
        std::mem::take(&mut *self.0.lock())
    }

    /// Keep at most `cap` events, the oldest; the rest are handed back.
    pub(super) fn keep_at_most(&self, cap: usize) -> Vec<AuditEvent> {
        let mut held = self.0.lock();
        if held.len() > cap {
            held.split_off(cap)
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditDecision;
    use crate::domain::{Action, Reason, Subject, SubjectKind};

    fn event(ip: &str) -> AuditEvent {
        let subject = Subject::new(SubjectKind::Ip, ip);
        AuditEvent::new(
            Action::LoginAttempt,
            AuditDecision::Deny,
            Reason::IpBlocked,
            &subject,
        )
    }

    fn subjects(events: &[AuditEvent]) -> Vec<&str> {
        events.iter().map(|e| e.subject.as_str()).collect()
    }

    #[test]
    fn an_insert_removes_what_it_copied_and_a_flush_may_take_it_first() {
        let held = Held::default();
        held.extend([event("a"), event("b")]);
        let copy = held.copy();
        assert_eq!(subjects(&copy), ["a", "b"]);
        assert!(!held.is_empty(), "a copy leaves them held");
        held.extend([event("c")]);
        held.inserted(copy.len());
        assert_eq!(subjects(&held.take()), ["c"], "only the copied ones went");

        held.extend([event("d"), event("e")]);
        let copy = held.copy();
        assert_eq!(subjects(&held.take()), ["d", "e"], "a flush takes them");
        held.inserted(copy.len());
        assert!(held.is_empty(), "and the insert's end does not panic");
    }

    #[test]
    fn past_the_cap_the_newest_are_handed_back() {
        let held = Held::default();
        held.extend([event("a"), event("b"), event("c")]);
        assert!(held.keep_at_most(3).is_empty());
        assert_eq!(subjects(&held.keep_at_most(1)), ["b", "c"]);
        assert_eq!(subjects(&held.take()), ["a"]);
    }
}
