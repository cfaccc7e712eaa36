//! One rule's counters (hits, over, near and within the limit, shadowed),
//! registered once when the policy is built: `metrics::counter!` hashes its
//! labels and looks the series up on every call, a handle only adds to an
//! atomic. A policy rebuilt on SIGHUP gets the same series back for the same
//! rule names, so reloads do not reset them.

use metrics::{counter, Counter};

use super::{
    NEAR_LIMIT_RATIO, RULE_HITS, RULE_NEAR_LIMIT, RULE_OVER_LIMIT, RULE_SHADOWED, RULE_WITHIN_LIMIT,
};
use crate::domain::{Action, Rule};

/// Where one hit stands against its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// The rule was at its limit.
    Over,
    /// Within the limit, at `NEAR_LIMIT_RATIO` of it or more.
    Near,
    /// Within the limit, below that.
    Within,
}

/// The count from which a hit is near a limit: the hit that makes the
/// count exceed `limit * 0.8` (rounded down), as Envoy's ratelimit decides
/// it. With a limit of 1, the first hit is near; of 10, the 9th and 10th.
fn near_from(limit: u32) -> u32 {
    let (num, den) = NEAR_LIMIT_RATIO;
    u32::try_from(u64::from(limit) * num / den).unwrap_or(u32::MAX)
}

fn standing(count: u32, over: bool, near_from: u32) -> Standing {
    if over {
        Standing::Over
    } else if count >= near_from {
        Standing::Near
    } else {
        Standing::Within
    }
}

/// One rule's counters for one action (`{action, rule}` labels).
#[derive(Clone)]
pub struct RuleCounters {
    limit: u32,
    near_from: u32,
    hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadowed: Counter,
}

impl RuleCounters {
    /// Register `rule`'s series under `action` (no-ops when no recorder is
    /// installed, as in benchmarks).
    pub fn register(action: Action, rule: &Rule) -> Self {
        let name = rule.name();
        let series = |metric: &'static str| counter!(metric, "action" => action.as_str(), "rule" => name.clone());
        Self {
            limit: rule.limit,
            near_from: near_from(rule.limit),
            hits: series(RULE_HITS),
            over_limit: series(RULE_OVER_LIMIT),
            near_limit: series(RULE_NEAR_LIMIT),
            within_limit: series(RULE_WITHIN_LIMIT),
            shadowed: series(RULE_SHADOWED),
        }
    }

    /// One hit on a window rule that held `count` events before it: over
    /// the limit when `count` has reached it. `shadow`: the rule or its
    /// section refuses nothing, so an over-limit hit went through.
    pub fn hit(&self, count: u32, shadow: bool) {
        self.hit_with(count, count >= self.limit, shadow);
    }

    /// One hit whose standing the store decided (`over`: a live lock, a
    /// burnt code), with the count it held before the hit for the near-limit
    /// test.
    pub fn hit_with(&self, count: u32, over: bool, shadow: bool) {
        self.hits.increment(1);
        match standing(count, over, self.near_from) {
            Standing::Over => {
                self.over_limit.increment(1);
                if shadow {
                    self.shadowed.increment(1);
                }
            }
            Standing::Near => {
                self.within_limit.increment(1);
                self.near_limit.increment(1);
            }
            Standing::Within => self.within_limit.increment(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_starts_where_envoy_puts_it() {
        // Envoy: near when hits after this one > floor(limit * 0.8).
        for (limit, first_near_count) in [(1, 0), (3, 2), (5, 4), (10, 8), (100, 80), (0, 0)] {
            assert_eq!(near_from(limit), first_near_count, "limit {limit}");
        }
    }

    #[test]
    fn a_hit_is_over_near_or_within() {
        let near = near_from(10);
        assert_eq!(standing(7, false, near), Standing::Within);
        assert_eq!(standing(8, false, near), Standing::Near);
        assert_eq!(standing(9, false, near), Standing::Near);
        assert_eq!(standing(10, true, near), Standing::Over);
        // A lock refuses below its count (the count may have fallen since).
        assert_eq!(standing(3, true, near), Standing::Over);
    }
}
