//! One sorted event log, the in-process twin of a window ZSET. Every operation
//! costs O(log n) or touches only the events it removes, so a subject that
//! keeps thousands of members costs no more per call than one that keeps ten.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A sorted set of events: `(time, member)`, ordered like a Redis ZSET (by
/// score, then by member bytes), members unique. `times` finds a member's
/// time, so that finding the member itself is a binary search.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    events: VecDeque<(u64, Arc<str>)>,
    times: HashMap<Arc<str>, u64>,
    /// The members' text, summed: kept as they come and go so that the
    /// store's memory accounting costs O(1) a call (`footprint`).
    member_bytes: usize,
}

impl Window {
    pub(super) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.events.len()
    }

    /// Bytes this log holds on the heap, estimated from capacities: the
    /// event deque, the member index (a hashbrown slot and a control byte
    /// each) and each member's shared text with its reference counts.
    pub(super) fn footprint(&self) -> usize {
        use std::mem::size_of;
        self.events.capacity() * size_of::<(u64, Arc<str>)>()
            + self.times.capacity() * (size_of::<(Arc<str>, u64)>() + 1)
            + self.events.len() * 2 * size_of::<usize>()
            + self.member_bytes
    }

    /// Drop events that no window of length `longest` still counts.
    pub(super) fn prune(&mut self, now: u64, longest: u64) {
        while self
            .events
            .front()
            .is_some_and(|(t, _)| t.saturating_add(longest) <= now)
        {
            self.pop_oldest();
        }
    }

    /// Events with `now - length < t`.
    pub(super) fn count(&self, now: u64, length: u64) -> u32 {
        let first = self
            .events
            .partition_point(|(t, _)| t.saturating_add(length) <= now);
        u32::try_from(self.events.len() - first).unwrap_or(u32::MAX)
    }

    /// How long until a window of `length` holds fewer than `limit` events.
    pub(super) fn wait(&self, now: u64, limit: u32, length: u64) -> u64 {
        if self.count(now, length) < limit {
            return 0;
        }
        if limit == 0 {
            return length;
        }
        // The counted events are the newest ones; the `limit`-th newest must
        // leave the window before one more fits.
        let (t, _) = &self.events[self.events.len() - limit as usize];
        (t + length).saturating_sub(now)
    }

    /// `ZADD`: insert, or move an existing member to the new time.
    pub(super) fn add(&mut self, now: u64, member: &str) {
        self.remove(member);
        let member: Arc<str> = member.into();
        self.member_bytes += member.len();
        self.times.insert(member.clone(), now);
        let after_last = self
            .events
            .back()
            .is_none_or(|(t, m)| (*t, &**m) <= (now, &*member));
        if after_last {
            self.events.push_back((now, member));
        } else {
            let pos = self
                .events
                .partition_point(|(t, m)| (*t, &**m) < (now, &*member));
            self.events.insert(pos, (now, member));
        }
    }

    /// `ZREM`. Removing near the newest end (the usual case: an event taken
    /// back right after it was added) moves nothing.
    pub(super) fn remove(&mut self, member: &str) -> bool {
        let Some(time) = self.times.remove(member) else {
            return false;
        };
        let pos = self
            .events
            .partition_point(|(t, m)| (*t, &**m) < (time, member));
        self.events.remove(pos);
        self.member_bytes -= member.len();
        true
    }

    /// Keep the `keep` newest events.
    pub(super) fn trim(&mut self, keep: usize) {
        while self.events.len() > keep {
            self.pop_oldest();
        }
    }

    /// Events with `now - length < t` recorded for the (user, `ip`) pair
    /// (members `pair_member(ip, …)`).
    pub(super) fn count_pair(&self, now: u64, length: u64, ip: &str) -> u32 {
        let recent = self
            .events
            .iter()
            .rev()
            .take_while(|(t, _)| t.saturating_add(length) > now);
        let tagged = recent
            .filter(|(_, m)| crate::store::pair_of_member(m) == Some(ip))
            .count();
        u32::try_from(tagged).unwrap_or(u32::MAX)
    }

    /// `ZREVRANGEBYSCORE key +inf (now-length LIMIT 0 max`.
    pub(super) fn newest_within(&self, now: u64, length: u64, max: usize) -> Vec<String> {
        let recent = self
            .events
            .iter()
            .rev()
            .take_while(|(t, _)| t.saturating_add(length) > now);
        recent.take(max).map(|(_, m)| m.to_string()).collect()
    }

    /// `ZRANGE key 0 max-1 REV`: the `max` newest members, newest first.
    pub(super) fn newest(&self, max: usize) -> Vec<String> {
        let events = self.events.iter().rev().take(max);
        events.map(|(_, m)| m.to_string()).collect()
    }

    fn pop_oldest(&mut self) {
        if let Some((_, member)) = self.events.pop_front() {
            self.times.remove(&member);
            self.member_bytes -= member.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn events_stay_sorted_by_time_then_member() {
        let mut w = Window::default();
        w.add(10, "b");
        w.add(10, "a");
        w.add(5, "z");
        w.add(20, "c");
        let order: Vec<_> = w.events.iter().map(|(t, m)| (*t, &**m)).collect();
        assert_eq!(order, [(5, "z"), (10, "a"), (10, "b"), (20, "c")]);

        w.add(30, "a"); // moves
        assert_eq!(w.len(), 4);
        assert_eq!(w.count(30, 1), 1);
        assert!(w.remove("z"));
        assert!(!w.remove("z"));
        assert!(w.remove("b"));
        let order: Vec<_> = w.events.iter().map(|(t, m)| (*t, &**m)).collect();
        assert_eq!(order, [(20, "c"), (30, "a")]);
        assert_eq!(w.times.len(), 2);
    }

    #[test]
    fn counts_and_waits_at_the_window_edges() {
        let mut w = Window::default();
        for (t, m) in [(100, "a"), (200, "b"), (300, "c")] {
            w.add(t, m);
        }
        // A window of 200 ms at 400 counts events after 200.
        assert_eq!(w.count(400, 200), 1);
        assert_eq!(w.count(399, 200), 2);
        // Limit 2 in 250 ms at 400: b and c count; b leaves at 450.
        assert_eq!(w.wait(400, 2, 250), 50);
        assert_eq!(w.wait(400, 3, 250), 0);
        w.prune(400, 250);
        assert_eq!(w.len(), 2);
        w.trim(1);
        assert_eq!(w.count(400, 1_000), 1);
        assert_eq!(w.times.len(), 1, "the index forgets what was dropped");
    }
}
