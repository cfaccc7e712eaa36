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

    /// Whether a notice of a lock of `scope` may go to `to` at `now`.
    pub(super) fn admits(&self, to: &str, scope: LockedScope, now: Instant) -> bool {
        let told_within_the_gap = self
            .last
            .get(&self.key(to))
            .is_some_and(|at| now.saturating_duration_since(*at) < self.gap);
        scope == LockedScope::Account || !told_within_the_gap
    }

    /// A notice went to `to` at `now` (queued: one dropped, or not
    /// rendered, leaves the recipient's hour unspent).
    pub(super) fn told(&mut self, to: &str, now: Instant) {
        let to = self.key(to);
        if self.last.len() >= self.remembered && !self.last.contains_key(&to) {
            let gap = self.gap;
            self.last
                .retain(|_, at| now.saturating_duration_since(*at) < gap);
            if self.last.len() >= self.remembered {
                let oldest = self.last.iter().min_by_key(|(_, at)| **at);
                if let Some(oldest) = oldest.map(|(to, _)| *to) {
                    self.last.remove(&oldest);
                }
            }
        }
        self.last.insert(to, now);
    }

    /// The notice told at `at` never reached `to`: its hour is not spent
    /// (unless a later one was told since).
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

    fn tell(gate: &mut NoticeGate, to: &str, scope: LockedScope, now: Instant) -> bool {
        let admitted = gate.admits(to, scope, now);
        if admitted {
            gate.told(to, now);
        }
        admitted
    }

    #[test]
    fn an_address_lock_is_told_once_a_gap_and_an_account_lock_always() {
        let mut gate = NoticeGate::new(Duration::from_secs(60), 100);
        let t0 = Instant::now();
        let (address, account) = (LockedScope::Address, LockedScope::Account);
        assert!(tell(&mut gate, "Alice@example.com", address, t0));
        let soon = t0 + Duration::from_secs(59);
        assert!(
            !tell(&mut gate, "alice@example.com", address, soon),
            "case aside, one address"
        );
        assert!(
            tell(&mut gate, "bob@example.com", address, soon),
            "another recipient"
        );
        assert!(tell(&mut gate, "alice@example.com", account, soon));
        assert!(!tell(
            &mut gate,
            "alice@example.com",
            address,
            soon + Duration::from_secs(30)
        ));
        let later = soon + Duration::from_secs(60);
        assert!(
            tell(&mut gate, "alice@example.com", address, later),
            "after the gap"
        );
        // A notice never queued spends no hour, nor one that never arrived.
        assert!(gate.admits("carol@example.com", address, later));
        assert!(tell(&mut gate, "carol@example.com", address, later));
        gate.forget("Carol@example.com", later);
        assert!(tell(&mut gate, "carol@example.com", address, later));
        gate.forget("carol@example.com", t0);
        assert!(
            !gate.admits("carol@example.com", address, later),
            "a later one stays"
        );
    }

    #[test]
    fn remembered_recipients_are_bounded_and_a_full_gate_still_tells() {
        let mut gate = NoticeGate::new(Duration::from_secs(60), 2);
        let t0 = Instant::now();
        let address = LockedScope::Address;
        assert!(tell(&mut gate, "a@example.com", address, t0));
        let t1 = t0 + Duration::from_secs(1);
        assert!(tell(&mut gate, "b@example.com", address, t1));
        assert!(
            tell(&mut gate, "c@example.com", address, t1),
            "full: the oldest goes"
        );
        assert_eq!(gate.last.len(), 2);
        assert!(
            !tell(&mut gate, "b@example.com", address, t1),
            "still remembered"
        );
        assert!(
            tell(&mut gate, "a@example.com", address, t1),
            "forgotten first"
        );
        let later = t1 + Duration::from_secs(61);
        assert!(tell(&mut gate, "d@example.com", address, later));
        assert_eq!(gate.last.len(), 1, "aged out together");
    }
}
