//! The in-process twin of an expiring set (a ZSET scored by the time each
//! member expires, see `lua/expiring_*.lua`).

use std::collections::HashMap;

use crate::store::ExpiringMembers;

/// Members and the time each expires.
#[derive(Debug, Clone, Default)]
pub(super) struct Expiring {
    members: HashMap<String, u64>,
}

impl Expiring {
    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Heap bytes: a hashbrown slot and a control byte per capacity, and
    /// each member's text.
    pub(super) fn footprint(&self) -> usize {
        let slots = self.members.capacity() * (std::mem::size_of::<(String, u64)>() + 1);
        slots + self.members.keys().map(String::capacity).sum::<usize>()
    }

    /// Add or re-time `member`, dropping the expired ones; answers when the
    /// set's last member expires (the key's expiry).
    pub(super) fn add(&mut self, member: &str, until: u64, now: u64) -> u64 {
        self.members.retain(|_, at| *at > now);
        self.members.insert(member.to_owned(), until);
        self.members.values().copied().max().unwrap_or(until)
    }

    pub(super) fn remove(&mut self, member: &str) {
        self.members.remove(member);
    }

    /// Latest-ending first; among equal times, the member sorting last
    /// first (as `ZREVRANGEBYSCORE` orders them).
    pub(super) fn live(&self, now: u64, limit: usize) -> ExpiringMembers {
        let mut live: Vec<(&String, u64)> = self
            .members
            .iter()
            .filter(|(_, at)| **at > now)
            .map(|(m, at)| (m, *at))
            .collect();
        live.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(a.0)));
        ExpiringMembers {
            total: live.len() as u64,
            members: live
                .into_iter()
                .take(limit)
                .map(|(m, at)| (m.clone(), at - now))
                .collect(),
        }
    }
}
