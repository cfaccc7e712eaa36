//! How often one address is told of locks. Each lock of an account from
//! one more address (`login.lock_scope = "user_ip"`) is a lock of its own,
//! so anyone with a few networks could have the owner mailed once a lock,
//! each from your relay, and fill the mail queue that real owners' notices
//! wait in. A whole account's lock is always told (its locks grow longer
//! with each repeat); an address's, at most once an hour per recipient.
//! Deliberately per instance and in memory: a notice is off a request's
//! path, and a few instances each telling once an hour is still bounded.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use tokio::time::Instant;

use super::notice::LockedScope;

/// Least time between two notices to one address, but for an account's lock.
pub(super) const ADDRESS_NOTICE_GAP: Duration = Duration::from_secs(3600);

/// Recipients remembered at most; past it the one told longest ago is
/// forgotten (it may be told again within its hour): memory stays bounded,
/// and a wave of locks over many accounts never silences the rest.
const REMEMBERED: usize = 10_000;

/// When each recipient was last told, by a keyed hash of the address: the
/// address itself goes from the request to the mail queue and is kept
/// nowhere.
#[derive(Debug)]
pub(super) struct NoticeGate {
    gap: Duration,
    remembered: usize,
    keys: RandomState,
    last: HashMap<u64, Instant>,
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
            keys: RandomState::new(),
            last: HashMap::new(),
        }
    }

    /// One key per address, whatever its case.
    fn key(&self, to: &str) -> u64 {
        self.keys.hash_one(to.to_ascii_lowercase())
    }

    /// Whether a notice of a lock of `scope` goes to `to` at `now`; if so,
    /// it counts as told then (see [`NoticeGate::forget`]).
    pub(super) fn admit(&mut self, to: &str, scope: LockedScope, now: Instant) -> bool {
        let key = self.key(to);
        let told_within_the_gap = self
            .last
            .get(&key)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.gap);
        if scope == LockedScope::Address && told_within_the_gap {
            return false;
        }
        if self.last.len() >= self.remembered && !self.last.contains_key(&key) {
            let gap = self.gap;
            self.last
                .retain(|_, at| now.saturating_duration_since(*at) < gap);
            if self.last.len() >= self.remembered {
                let oldest = self.last.iter().min_by_key(|(_, at)| **at);
                if let Some(oldest) = oldest.map(|(key, _)| *key) {
                    self.last.remove(&oldest);
                }
            }
        }
        self.last.insert(key, now);
        true
    }

    /// The notice told at `at` was not queued, or never reached `to`: its
    /// hour is not spent (unless a later one was told since).
    pub(super) fn forget(&mut self, to: &str, at: Instant) {
        let to = self.key(to);
        if self.last.get(&to) == Some(&at) {
            self.last.remove(&to);
        }
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
        // A notice never queued, or that never arrived, spends no hour.
        assert!(gate.admit("carol@example.com", address, later));
        gate.forget("Carol@example.com", later);
        assert!(gate.admit("carol@example.com", address, later));
        gate.forget("carol@example.com", t0);
        assert!(
            !gate.admit("carol@example.com", address, later),
            "a later one stays"
        );
    }

    #[test]
    fn remembered_recipients_are_bounded_and_a_full_gate_still_tells() {
        let mut gate = NoticeGate::new(Duration::from_secs(60), 2);
        let t0 = Instant::now();
        let address = LockedScope::Address;
        assert!(gate.admit("a@example.com", address, t0));
        let t1 = t0 + Duration::from_secs(1);
        assert!(gate.admit("b@example.com", address, t1));
        assert!(
            gate.admit("c@example.com", address, t1),
            "full: the oldest goes"
        );
        assert_eq!(gate.last.len(), 2);
        assert!(
            !gate.admit("b@example.com", address, t1),
            "still remembered"
        );
        assert!(gate.admit("a@example.com", address, t1), "forgotten first");
        let later = t1 + Duration::from_secs(61);
        assert!(gate.admit("d@example.com", address, later));
        assert_eq!(gate.last.len(), 1, "aged out together");
    }
}
