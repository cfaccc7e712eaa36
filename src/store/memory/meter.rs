//! The in-process twin of a meter hash (GCRA windows, see `lua/reserve.lua`):
//! per window a level that each event raises by the window's length and that
//! drains by its limit per millisecond.

use std::collections::HashMap;

use crate::store::WindowSpec;

/// One subject's meters, by `(limit, window_ms)` as the Redis fields are.
#[derive(Debug, Clone, Default)]
pub(super) struct Meters {
    levels: HashMap<(u32, u64), (u64, u64)>,
}

impl Meters {
    /// Heap bytes: a hashbrown slot and a control byte per capacity.
    pub(super) fn footprint(&self) -> usize {
        self.levels.capacity() * (std::mem::size_of::<((u32, u64), (u64, u64))>() + 1)
    }

    /// The window's level now: what was set, drained since.
    fn level(&self, w: &WindowSpec, now: u64) -> u64 {
        let Some(&(level, at)) = self.levels.get(&(w.limit, w.window_ms)) else {
            return 0;
        };
        let elapsed = now.saturating_sub(at);
        if elapsed >= w.window_ms {
            return 0;
        }
        level.saturating_sub(elapsed.saturating_mul(u64::from(w.limit)))
    }

    /// Events the level stands for: `ceil(level / window_ms)`.
    pub(super) fn count(&self, w: &WindowSpec, now: u64) -> u32 {
        let count = self.level(w, now).div_ceil(w.window_ms.max(1));
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// How long until the meter admits one more event (0: at once).
    pub(super) fn wait(&self, w: &WindowSpec, now: u64) -> u64 {
        let capacity = u64::from(w.limit).saturating_mul(w.window_ms);
        let over = (self.level(w, now) + w.window_ms).saturating_sub(capacity);
        match (over, w.limit) {
            (0, _) => 0,
            (_, 0) => w.window_ms,
            (over, limit) => over.div_ceil(u64::from(limit)),
        }
    }

    /// Record one event; a forced one (shadow mode) fills the meter at most,
    /// as a log keeps at most its limit.
    pub(super) fn add(&mut self, w: &WindowSpec, now: u64) {
        let capacity = u64::from(w.limit).saturating_mul(w.window_ms);
        let level = (self.level(w, now) + w.window_ms).min(capacity);
        self.levels.insert((w.limit, w.window_ms), (level, now));
    }

    /// Take one event back (never below empty).
    pub(super) fn remove(&mut self, w: &WindowSpec) {
        if let Some((level, _)) = self.levels.get_mut(&(w.limit, w.window_ms)) {
            *level = level.saturating_sub(w.window_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(limit: u32, window_ms: u64) -> WindowSpec {
        WindowSpec::meter(limit, window_ms)
    }

    #[test]
    fn a_forced_event_fills_the_meter_and_no_more() {
        let w = meter(2, 1_000);
        let mut m = Meters::default();
        for _ in 0..5 {
            m.add(&w, 0);
        }
        assert_eq!((m.count(&w, 0), m.wait(&w, 0)), (2, 500));
        assert_eq!(
            m.count(&w, 1_000),
            0,
            "drained after one window, like a log"
        );
    }

    #[test]
    fn a_meter_admits_its_limit_at_once_then_one_per_interval() {
        let w = meter(4, 1_000);
        let mut m = Meters::default();
        for expected in 0..4 {
            assert_eq!((m.count(&w, 0), m.wait(&w, 0)), (expected, 0));
            m.add(&w, 0);
        }
        assert_eq!((m.count(&w, 0), m.wait(&w, 0)), (4, 250));
        assert_eq!((m.count(&w, 249), m.wait(&w, 249)), (4, 1));
        assert_eq!((m.count(&w, 250), m.wait(&w, 250)), (3, 0));
        m.remove(&w);
        assert_eq!(
            m.count(&w, 250),
            2,
            "one taken back: (4000 - 1000) - 250 × 4"
        );
        assert_eq!(m.count(&w, 1_000), 0);
    }
}
