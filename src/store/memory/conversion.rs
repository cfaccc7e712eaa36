//! The in-process twin of a conversion hash (see `lua/reserve.lua` and
//! `lua/conversion_*.lua`): per slice a pair of counters (events,
//! successes), with a surge policy the history buckets its normal is
//! learnt from, and the escalation (challenge or block) with the figures
//! it was set on.

use std::collections::BTreeMap;

use crate::store::conversion::normal_milli;
use crate::store::{
    ConversionBlock, ConversionOutcome, ConversionPolicy, ConversionState, ConversionVerdict,
    Escalation, HISTORY_BUCKETS,
};

/// One subject's conversion counters and escalation.
#[derive(Debug, Clone, Default)]
pub(super) struct Conversion {
    /// Slice index (`time / slice_ms`) → (events, successes).
    slices: BTreeMap<u64, (u32, u32)>,
    /// Bucket index (`time / bucket_ms`) → events taught (surge only).
    buckets: BTreeMap<u64, u64>,
    level: Option<Level>,
}

#[derive(Debug, Clone, Copy)]
struct Level {
    escalation: Escalation,
    until: u64,
    events: u32,
    successes: u32,
    shadow: bool,
    normal_milli: u64,
    /// The first slice counted entirely under the challenge.
    from: u64,
}

/// What a change asks of the key's expiry: keep it, or set it to this time.
pub(super) type Expiry = Option<u64>;

impl Conversion {
    pub(super) fn is_empty(&self) -> bool {
        self.slices.is_empty() && self.buckets.is_empty() && self.level.is_none()
    }

    /// Heap bytes, estimated: a B-tree node holds up to 11 pairs and is
    /// about half full at worst, so twice the pairs' size each.
    pub(super) fn footprint(&self) -> usize {
        use std::mem::size_of;
        2 * (self.slices.len() * size_of::<(u64, (u32, u32))>()
            + self.buckets.len() * size_of::<(u64, u64)>())
    }

    /// Whether a challenge or a block (shadow or not) is live: the memory
    /// limit never evicts one, or flooding the store with fresh subjects
    /// would lift a pumping block.
    pub(super) fn escalated(&self, now: u64) -> bool {
        self.level.is_some_and(|l| l.until > now)
    }

    /// The first slice a count at `now` still sums.
    fn oldest(policy: &ConversionPolicy, now: u64) -> u64 {
        (now / policy.slice_ms()).saturating_sub(policy.slices() - 1)
    }

    /// The bucket a slice's events are taught in.
    fn bucket_of(policy: &ConversionPolicy, bucket_ms: u64, slice: u64) -> u64 {
        slice * policy.slice_ms() / bucket_ms
    }

    /// Drop the slices no count sums any more (with a surge, teaching the
    /// normal those whose conversion met the threshold first), the buckets
    /// the normal no longer reads, and an escalation that has ended.
    /// Slices and buckets "after" now were counted under a longer
    /// `sms.pumping.window` or `country_history` (numbered from a longer
    /// length): dropped, teaching nothing, as `reserve.lua` does.
    fn prune(&mut self, policy: &ConversionPolicy, now: u64) {
        let current = now / policy.slice_ms();
        // `split_off` makes a node even when nothing is cut: a send's path.
        if self
            .slices
            .last_key_value()
            .is_some_and(|(s, _)| *s > current)
        {
            drop(self.slices.split_off(&current.saturating_add(1)));
        }
        let live = self.slices.split_off(&Self::oldest(policy, now));
        let stale = std::mem::replace(&mut self.slices, live);
        if let Some(bucket_ms) = policy.bucket_ms() {
            for (slice, (events, successes)) in stale {
                if policy.teaches(events, successes) {
                    let bucket = Self::bucket_of(policy, bucket_ms, slice);
                    *self.buckets.entry(bucket).or_default() += u64::from(events);
                }
            }
            let current = now / bucket_ms;
            if self
                .buckets
                .last_key_value()
                .is_some_and(|(b, _)| *b > current)
            {
                drop(self.buckets.split_off(&current.saturating_add(1)));
            }
            let first_read = current.saturating_sub(HISTORY_BUCKETS);
            self.buckets = self.buckets.split_off(&first_read);
        }
        if self.level.is_some_and(|l| l.until <= now) {
            self.level = None;
        }
    }

    /// Events and successes of the slices from `from` on that a count at
    /// `now` sums.
    fn sums_from(&self, policy: &ConversionPolicy, now: u64, from: u64) -> (u32, u32) {
        let first = Self::oldest(policy, now).max(from);
        let current = now / policy.slice_ms();
        if first > current {
            return (0, 0);
        }
        self.slices
            .range(first..=current)
            .fold((0, 0), |(e, s), (_, (de, ds))| {
                (e.saturating_add(*de), s.saturating_add(*ds))
            })
    }

    /// The normal at `now`: the events taught in the history's complete
    /// buckets, those of slices not yet folded in included (a read-only
    /// count sees what a prune would teach).
    fn normal(&self, policy: &ConversionPolicy, now: u64) -> f64 {
        let Some(bucket_ms) = policy.bucket_ms() else {
            return 0.0;
        };
        let current = now / bucket_ms;
        let read = current.saturating_sub(HISTORY_BUCKETS)..current;
        let stored: u64 = self.buckets.range(read.clone()).map(|(_, n)| n).sum();
        let unfolded: u64 = self
            .slices
            .range(..Self::oldest(policy, now))
            .filter(|(slice, (e, s))| {
                policy.teaches(*e, *s)
                    && read.contains(&Self::bucket_of(policy, bucket_ms, **slice))
            })
            .map(|(_, (e, _))| u64::from(*e))
            .sum();
        policy.normal(stored + unfolded)
    }

    /// The key lives for [`ConversionPolicy::keep_ms`], or until the
    /// escalation ends when later.
    fn expires_at(&self, policy: &ConversionPolicy, now: u64) -> u64 {
        let counts = now + policy.keep_ms();
        self.level.map_or(counts, |l| counts.max(l.until))
    }

    /// `WindowStore::conversion_hit`, step by step: counts nothing.
    pub(super) fn hit(
        &mut self,
        policy: &ConversionPolicy,
        now: u64,
        force: bool,
    ) -> (ConversionOutcome, Expiry) {
        self.prune(policy, now);
        let (events, successes) = self.sums_from(policy, now, 0);
        let normal = self.normal(policy, now);
        let mut outcome = ConversionOutcome {
            verdict: ConversionVerdict::Open,
            events,
            successes,
            counted_in: None,
            normal_milli: policy.surge.map_or(0, |_| normal_milli(normal)),
        };
        if let Some(level) = self.level.filter(|l| force || !l.shadow) {
            let retry_after_ms = level.until - now;
            (outcome.events, outcome.successes) = (level.events, level.successes);
            outcome.normal_milli = level.normal_milli;
            if level.escalation == Escalation::Block {
                outcome.verdict = ConversionVerdict::Blocked { retry_after_ms };
                return (outcome, None);
            }
            outcome.verdict = ConversionVerdict::Challenged { retry_after_ms };
            // Only events of the challenge's own mode escalate it: shadow
            // mode never sets an enforced block.
            let escalates = policy.surge.is_some_and(|s| s.block) && level.shadow == force;
            // A first slice after the next was numbered under a longer
            // window: counted from this one, as `reserve.lua` does.
            let current = now / policy.slice_ms();
            let from = if level.from > current + 1 {
                current
            } else {
                level.from
            };
            let (since, passed) = self.sums_from(policy, now, from);
            if !(escalates && policy.surges(since, passed, normal)) {
                return (outcome, None);
            }
            self.slices.clear();
            let base = Level {
                normal_milli: normal_milli(normal),
                from,
                ..level
            };
            return self.trip(policy, now, Escalation::Block, (since, passed), base);
        }
        let tripped = match policy.surge {
            None => policy.trips(events, successes),
            Some(_) => policy.surges(events, successes, normal),
        };
        if !tripped {
            return (outcome, None);
        }
        let level = Level {
            escalation: Escalation::Challenge,
            until: 0,
            events,
            successes,
            shadow: force,
            normal_milli: outcome.normal_milli,
            from: now / policy.slice_ms() + 1,
        };
        match policy.surge {
            None => {
                self.slices.clear();
                self.trip(policy, now, Escalation::Block, (events, successes), level)
            }
            Some(_) => self.trip(
                policy,
                now,
                Escalation::Challenge,
                (events, successes),
                level,
            ),
        }
    }

    /// Set the escalation `to`, for `block_ms` from now, on `figures`
    /// (events, successes); the rest of `base` (shadow, normal, first slice)
    /// carries over.
    fn trip(
        &mut self,
        policy: &ConversionPolicy,
        now: u64,
        to: Escalation,
        (events, successes): (u32, u32),
        base: Level,
    ) -> (ConversionOutcome, Expiry) {
        let level = Level {
            escalation: to,
            until: now + policy.block_ms,
            events,
            successes,
            ..base
        };
        self.level = Some(level);
        let verdict = match to {
            Escalation::Block => ConversionVerdict::Tripped,
            Escalation::Challenge => ConversionVerdict::ChallengeTripped,
        };
        let outcome = ConversionOutcome {
            verdict,
            events,
            successes,
            counted_in: None,
            normal_milli: level.normal_milli,
        };
        (outcome, Some(now + policy.trip_keep_ms()))
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
        let (events, successes) = self.sums_from(policy, now, 0);
        ConversionState {
            events,
            successes,
            normal_milli: policy
                .surge
                .map_or(0, |_| normal_milli(self.normal(policy, now))),
            block: self
                .level
                .filter(|l| l.until > now)
                .map(|l| ConversionBlock {
                    level: l.escalation,
                    retry_after_ms: l.until - now,
                    events: l.events,
                    successes: l.successes,
                    shadow: l.shadow,
                    normal_milli: l.normal_milli,
                }),
        }
    }
}

#[cfg(test)]
mod tests;
