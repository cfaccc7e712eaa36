//! Events the journal did not take (it was past `audit.journal_max_bytes`,
//! or failing), held in memory until the database has them. `record` puts
//! them here rather than on the queue, and the writer inserts them from
//! here; the sink's flush (`SIGTERM`'s) journals what is here past the
//! bound. So a writer that waits on an insert or a replay outlasting the
//! flush's wait cannot take them with the process: not those its insert
//! has taken, nor those that came meanwhile.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::audit::AuditEvent;

/// The held events, each with the number it came in with: an insert
/// removes the events it copied, by number, whatever came or went
/// meanwhile.
#[derive(Clone, Default)]
pub(in crate::audit) struct Held(Arc<Mutex<Numbered>>);

#[derive(Default)]
struct Numbered {
    next: u64,
    events: Vec<(u64, AuditEvent)>,
}

impl Numbered {
    fn push(&mut self, event: AuditEvent) {
        self.events.push((self.next, event));
        self.next += 1;
    }
}

impl Held {
    pub(super) fn is_empty(&self) -> bool {
        self.0.lock().events.is_empty()
    }

    /// Hold `event` (`None`), unless `cap` are held already: then it is
    /// handed back.
    pub(super) fn push_within(&self, event: AuditEvent, cap: usize) -> Option<AuditEvent> {
        let mut held = self.0.lock();
        if held.events.len() >= cap {
            return Some(event);
        }
        held.push(event);
        None
    }

    /// Hold these again (a flush could not journal them), as newcomers: an
    /// insert under way that copied them before does not remove them, so
    /// at worst one is inserted twice (the second skipped by its id).
    pub(super) fn extend(&self, events: impl IntoIterator<Item = AuditEvent>) {
        let mut held = self.0.lock();
        for event in events {
            held.push(event);
        }
    }

    /// A copy of what is held, for an insert, and the mark to hand
    /// [`Held::inserted`] once it is in: the events stay here meanwhile, for
    /// a flush to find.
    pub(super) fn copy(&self) -> (Vec<AuditEvent>, u64) {
        let held = self.0.lock();
        let events = held.events.iter().map(|(_, e)| e.clone()).collect();
        (events, held.next)
    }

    /// The events a [`Held::copy`] that gave `mark` copied are in the
    /// database; those a flush took meanwhile are gone already.
    pub(super) fn inserted(&self, mark: u64) {
        self.0.lock().events.retain(|(n, _)| *n >= mark);
    }

    /// Everything held, now no longer.
    pub(super) fn take(&self) -> Vec<AuditEvent> {
        let events = std::mem::take(&mut self.0.lock().events);
        events.into_iter().map(|(_, e)| e).collect()
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

    fn hold(held: &Held, ips: &[&str]) {
        for ip in ips {
            assert!(held.push_within(event(ip), 100).is_none());
        }
    }

    #[test]
    fn an_insert_removes_what_it_copied_and_nothing_that_came_or_came_back() {
        let held = Held::default();
        hold(&held, &["a", "b"]);
        let (copy, mark) = held.copy();
        assert_eq!(subjects(&copy), ["a", "b"]);
        assert!(!held.is_empty(), "a copy leaves them held");
        hold(&held, &["c"]);
        held.inserted(mark);
        assert_eq!(subjects(&held.take()), ["c"], "only the copied ones went");

        // A flush takes them during the insert, and gives one back.
        hold(&held, &["d", "e"]);
        let (_, mark) = held.copy();
        let taken = held.take();
        assert_eq!(subjects(&taken), ["d", "e"]);
        hold(&held, &["f"]);
        held.extend(taken.into_iter().skip(1));
        held.inserted(mark);
        assert_eq!(
            subjects(&held.take()),
            ["f", "e"],
            "what came meanwhile and what came back stay"
        );
    }

    #[test]
    fn past_the_cap_an_event_is_handed_back() {
        let held = Held::default();
        assert!(held.push_within(event("a"), 1).is_none());
        let refused = held.push_within(event("b"), 1).expect("handed back");
        assert_eq!(refused.subject, "b");
        assert_eq!(subjects(&held.take()), ["a"]);
    }
}
