//! How often one address is told of locks. Each lock of an account from
//! one more address (`login.lock_scope = "user_ip"`) is a lock of its own,
//! so anyone with a few networks could have the owner mailed once a lock,
//! each from your relay, and fill the mail queue that real owners' notices
//! wait in. A whole account's lock is always told (its locks grow longer
//! with each repeat); an address's, at most once an hour per recipient.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::notice::LockedScope;

/// Least time between two notices to one address, but for an account's lock.
pub(super) const ADDRESS_NOTICE_GAP: Duration = Duration::from_secs(3600);

/// Recipients remembered at most; past it, address notices wait for the
/// oldest to age out (memory stays bounded whatever the flood).
const REMEMBERED: usize = 10_000;

/// When each recipient was last told.
#[derive(Debug)]
pub(super) struct NoticeGate {
    gap: Duration,
    remembered: usize,
    last: HashMap<String, Instant>,
}

impl Default for NoticeGate {
    fn default() -> Self {
        Self::new(ADDRESS_NOTICE_GAP, REMEMBERED)
    }
}

impl NoticeGate {
    fn new(gap: Duration, remembered: usize) -> Self {
        Self {
            gap,
            remembered,
            last: HashMap::new(),
        }
    }

    /// Whether a notice of a lock of `scope` goes to `to` at `now`; if so,
    /// it counts as the last one told.
    pub(super) fn admit(&mut self, to: &str, scope: LockedScope, now: Instant) -> bool {
        let to = to.to_ascii_lowercase();
        let recent = |at: &Instant| now.saturating_duration_since(*at) < self.gap;
        if scope == LockedScope::Address && self.last.get(&to).is_some_and(recent) {
            return false;
        }
        if self.last.len() >= self.remembered && !self.last.contains_key(&to) {
            self.last.retain(|_, at| recent(at));
        }
        if self.last.len() >= self.remembered && !self.last.contains_key(&to) {
            // Full of recipients told within the gap: an account's lock is
            // still told, unremembered; an address's waits.
            return scope == LockedScope::Account;
        }
        self.last.insert(to, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_lock_is_told_once_a_gap_and_an_account_lock_always() {
        let mut gate = NoticeGate::new(Duration::from_secs(60), 100);
        let t0 = Instant::now();
        let (address, account) = (LockedScope::Address, LockedScope::Account);
        assert!(gate.admit("Alice@example.com", address, t0));
        let soon = t0 + Duration::from_secs(59);
        assert!(
            !gate.admit("alice@example.com", address, soon),
            "case aside, one address"
        );
        assert!(
            gate.admit("bob@example.com", address, soon),
            "another recipient"
        );
        assert!(gate.admit("alice@example.com", account, soon));
        assert!(!gate.admit("alice@example.com", address, soon + Duration::from_secs(30)));
        let later = soon + Duration::from_secs(60);
        assert!(
            gate.admit("alice@example.com", address, later),
            "after the gap"
        );
    }

    #[test]
    fn remembered_recipients_are_bounded() {
        let mut gate = NoticeGate::new(Duration::from_secs(60), 2);
        let t0 = Instant::now();
        assert!(gate.admit("a@example.com", LockedScope::Address, t0));
        assert!(gate.admit("b@example.com", LockedScope::Address, t0));
        assert!(
            !gate.admit("c@example.com", LockedScope::Address, t0),
            "full"
        );
        assert!(gate.admit("c@example.com", LockedScope::Account, t0));
        assert_eq!(gate.last.len(), 2);
        let later = t0 + Duration::from_secs(61);
        assert!(
            gate.admit("c@example.com", LockedScope::Address, later),
            "aged out"
        );
        assert_eq!(gate.last.len(), 1);
    }
}
