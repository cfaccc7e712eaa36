//! The in-process twin of a conversion hash (see `lua/reserve.lua` and
//! `lua/conversion_*.lua`): per slice a pair of counters (events,
//! successes), and the block with the figures it was set on.

use std::collections::BTreeMap;

use crate::store::{
    ConversionBlock, ConversionOutcome, ConversionPolicy, ConversionState, ConversionVerdict,
};

/// One subject's conversion counters and block.
#[derive(Debug, Clone, Default)]
pub(super) struct Conversion {
    /// Slice index (`time / slice_ms`) → (events, successes).
    slices: BTreeMap<u64, (u32, u32)>,
    block: Option<Block>,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    until: u64,
    events: u32,
    successes: u32,
    shadow: bool,
}

/// What a change asks of the key's expiry: keep it, or set it to this time.
pub(super) type Expiry = Option<u64>;

impl Conversion {
    pub(super) fn is_empty(&self) -> bool {
        self.slices.is_empty() && self.block.is_none()
    }

    /// The first slice a count at `now` still sums.
    fn oldest(policy: &ConversionPolicy, now: u64) -> u64 {
        (now / policy.slice_ms()).saturating_sub(policy.slices() - 1)
    }

    /// Drop the slices no count sums any more, and a block that has ended.
    fn prune(&mut self, policy: &ConversionPolicy, now: u64) {
        self.slices = self.slices.split_off(&Self::oldest(policy, now));
        if self.block.is_some_and(|b| b.until <= now) {
            self.block = None;
        }
    }

    fn sums(&self) -> (u32, u32) {
        self.slices.values().fold((0, 0), |(e, s), (de, ds)| {
            (e.saturating_add(*de), s.saturating_add(*ds))
        })
    }

    /// The key lives for the window, or until the block ends when later.
    fn expires_at(&self, policy: &ConversionPolicy, now: u64) -> u64 {
        let counts = now + policy.slices() * policy.slice_ms();
        self.block.map_or(counts, |b| counts.max(b.until))
    }

    /// `WindowStore::conversion_hit`, step by step: counts nothing.
    pub(super) fn hit(
        &mut self,
        policy: &ConversionPolicy,
        now: u64,
        force: bool,
    ) -> (ConversionOutcome, Expiry) {
        self.prune(policy, now);
        let (events, successes) = self.sums();
        let mut outcome = ConversionOutcome {
            verdict: ConversionVerdict::Open,
            events,
            successes,
            counted_in: None,
        };
        if let Some(block) = self.block.filter(|b| force || !b.shadow) {
            outcome.verdict = ConversionVerdict::Blocked {
                retry_after_ms: block.until - now,
            };
            (outcome.events, outcome.successes) = (block.events, block.successes);
            return (outcome, None);
        }
        if !policy.trips(events, successes) {
            return (outcome, None);
        }
        *self = Self {
            slices: BTreeMap::new(),
            block: Some(Block {
                until: now + policy.block_ms,
                events,
                successes,
                shadow: force,
            }),
        };
        outcome.verdict = ConversionVerdict::Tripped;
        (outcome, Some(now + policy.block_ms))
    }

    /// `WindowStore::conversion_count`: one event more, now; answers its
    /// slice and the key's new expiry.
    pub(super) fn count(&mut self, policy: &ConversionPolicy, now: u64) -> (u64, u64) {
        let slice = now / policy.slice_ms();
        self.slices.entry(slice).or_default().0 += 1;
        (slice, self.expires_at(policy, now))
    }

    /// `WindowStore::conversion_undo`: one event less in `slice`.
    pub(super) fn undo(&mut self, slice: u64) {
        if let Some((events, successes)) = self.slices.get_mut(&slice) {
            *events = events.saturating_sub(1);
            if *events == 0 && *successes == 0 {
                self.slices.remove(&slice);
            }
        }
    }

    /// `WindowStore::conversion_success`: one success more, now.
    pub(super) fn success(&mut self, policy: &ConversionPolicy, now: u64) -> u64 {
        self.prune(policy, now);
        let slice = now / policy.slice_ms();
        self.slices.entry(slice).or_default().1 += 1;
        self.expires_at(policy, now)
    }

    /// `WindowStore::conversion_state`.
    pub(super) fn state(&self, policy: &ConversionPolicy, now: u64) -> ConversionState {
        let oldest = Self::oldest(policy, now);
        let (events, successes) = self
            .slices
            .range(oldest..)
            .fold((0u32, 0u32), |(e, s), (_, (de, ds))| {
                (e.saturating_add(*de), s.saturating_add(*ds))
            });
        ConversionState {
            events,
            successes,
            block: self
                .block
                .filter(|b| b.until > now)
                .map(|b| ConversionBlock {
                    retry_after_ms: b.until - now,
                    events: b.events,
                    successes: b.successes,
                    shadow: b.shadow,
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: ConversionPolicy = ConversionPolicy {
        min_events: 3,
        min_ratio_ppm: 500_000,
        window_ms: 1_200,
        block_ms: 5_000,
    };

    #[test]
    fn old_slices_stop_counting() {
        let mut c = Conversion::default();
        for t in [0, 100, 200] {
            assert_eq!(c.hit(&POLICY, t, false).0.verdict, ConversionVerdict::Open);
            c.count(&POLICY, t);
        }
        // Slices of 100 ms, twelve summed: at 1_250 the slice of 0..100 is out.
        let state = c.state(&POLICY, 1_250);
        assert_eq!((state.events, state.successes), (2, 0));
        let (open, _) = c.hit(&POLICY, 1_250, false);
        assert_eq!(
            open.verdict,
            ConversionVerdict::Open,
            "two are below min_events"
        );
        assert_eq!(open.counted_in, None, "a check counts nothing");
    }

    #[test]
    fn a_trip_blocks_and_starts_the_counts_afresh() {
        let mut c = Conversion::default();
        for t in [0, 100, 200] {
            c.count(&POLICY, t);
        }
        c.success(&POLICY, 300);
        let (tripped, expiry) = c.hit(&POLICY, 400, false);
        assert_eq!(
            tripped.verdict,
            ConversionVerdict::Tripped,
            "1/3 is below half"
        );
        assert_eq!(
            (tripped.events, tripped.successes, tripped.counted_in),
            (3, 1, None)
        );
        assert_eq!(expiry, Some(5_400));
        let state = c.state(&POLICY, 500);
        assert_eq!((state.events, state.successes), (0, 0));
        let (blocked, _) = c.hit(&POLICY, 500, false);
        assert_eq!(
            (blocked.verdict, blocked.events, blocked.successes),
            (
                ConversionVerdict::Blocked {
                    retry_after_ms: 4_900
                },
                3,
                1
            )
        );
        assert_eq!(
            c.hit(&POLICY, 5_400, false).0.verdict,
            ConversionVerdict::Open
        );
    }

    #[test]
    fn a_shadow_block_is_seen_only_by_forced_events() {
        let mut c = Conversion::default();
        for t in 0..3 {
            c.count(&POLICY, t);
        }
        let (tripped, _) = c.hit(&POLICY, 10, true);
        assert_eq!(tripped.verdict, ConversionVerdict::Tripped);
        c.count(&POLICY, 10);
        let (seen, _) = c.hit(&POLICY, 20, true);
        assert_eq!(
            seen.verdict,
            ConversionVerdict::Blocked {
                retry_after_ms: 4_990
            }
        );
        let (enforced, _) = c.hit(&POLICY, 30, false);
        assert_eq!(
            (enforced.verdict, enforced.events),
            (ConversionVerdict::Open, 1)
        );
        assert!(c.state(&POLICY, 30).block.is_some_and(|b| b.shadow));
    }
}
