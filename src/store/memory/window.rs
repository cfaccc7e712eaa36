//! One sorted event log, the in-process twin of a window ZSET.

/// A sorted set of events: `(time, member)`, ordered like a Redis ZSET (by
/// score, then by member bytes), members unique.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    pub(super) events: Vec<(u64, String)>,
}

impl Window {
    /// Drop events that no window of length `longest` still counts.
    pub(super) fn prune(&mut self, now: u64, longest: u64) {
        self.events.retain(|(t, _)| t.saturating_add(longest) > now);
    }

    /// Events with `now - length < t`.
    pub(super) fn count(&self, now: u64, length: u64) -> u32 {
        let n = self
            .events
            .iter()
            .rev()
            .take_while(|(t, _)| t.saturating_add(length) > now)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// How long until a window of `length` holds fewer than `limit` events.
    pub(super) fn wait(&self, now: u64, limit: u32, length: u64) -> u64 {
        let count = self.count(now, length);
        if count < limit {
            return 0;
        }
        if limit == 0 {
            return length;
        }
        // The counted events are the newest `count`; the one at position
        // `count - limit` among them (oldest first) is the `limit`-th newest.
        let idx = self.events.len() - limit as usize;
        let (t, _) = &self.events[idx];
        (t + length).saturating_sub(now)
    }

    /// `ZADD`: insert, or move an existing member to the new time.
    pub(super) fn add(&mut self, now: u64, member: &str) {
        self.remove(member);
        let pos = self
            .events
            .partition_point(|(t, m)| (*t, m.as_str()) < (now, member));
        self.events.insert(pos, (now, member.to_owned()));
    }

    pub(super) fn remove(&mut self, member: &str) -> bool {
        match self.events.iter().position(|(_, m)| m == member) {
            Some(i) => {
                self.events.remove(i);
                true
            }
            None => false,
        }
    }

    /// Keep the `keep` newest events.
    pub(super) fn trim(&mut self, keep: usize) {
        if self.events.len() > keep {
            let excess = self.events.len() - keep;
            self.events.drain(..excess);
        }
    }
}
