//! One subject kind's windows for one action: its enforced rules and its
//! captcha tier, with the specs the store takes and the rule counters.

use crate::domain::{Action, Rule};
use crate::metrics::RuleCounters;
use crate::store::{HitOutcome, RuleWindow, WindowSpec};

/// One subject kind's rules and optional captcha tier, with the window specs
/// the store takes built once per policy rather than on every request.
pub struct SubjectRules {
    /// The enforced rules: a full window denies.
    pub rules: Vec<Rule>,
    /// The captcha tier: a full window asks for a captcha.
    pub gate: Option<Rule>,
    windows: Vec<WindowSpec>,
    /// One per window, in the order of `windows`.
    counters: Vec<RuleCounters>,
}

impl SubjectRules {
    /// Build the window specs and register the counters once: the enforced
    /// rules', then the captcha tier's.
    pub fn new(action: Action, rules: Vec<Rule>, gate: Option<Rule>) -> Self {
        let windows = rules
            .iter()
            .map(RuleWindow::enforce)
            .chain(gate.iter().map(RuleWindow::gate))
            .collect();
        let counters = rules
            .iter()
            .chain(&gate)
            .map(|rule| RuleCounters::register(action, rule))
            .collect();
        Self {
            rules,
            gate,
            windows,
            counters,
        }
    }

    /// Count one hit on each window from the counts the store answered;
    /// `section_shadow`: the whole section refuses nothing.
    pub fn count_hits(&self, outcome: &HitOutcome, section_shadow: bool) {
        self.count(&outcome.counts, section_shadow);
    }

    /// Count one hit on each window from its count before the event, in the
    /// order of [`Self::windows`].
    pub fn count(&self, counts: &[u32], section_shadow: bool) {
        for (index, (counters, &count)) in self.counters.iter().zip(counts).enumerate() {
            let on_trial = self.rules.get(index).is_some_and(|rule| rule.shadow);
            counters.hit(count, section_shadow || on_trial);
        }
    }

    /// The enforced rules' windows, then the captcha tier's.
    pub fn windows(&self) -> &[WindowSpec] {
        &self.windows
    }

    /// The rule behind window `index` of [`Self::windows`].
    pub fn rule_at(&self, index: usize) -> Option<Rule> {
        self.rules.get(index).copied().or(self.gate)
    }

    /// Each window with the rule that defines it.
    pub fn pairs(&self) -> impl Iterator<Item = (Rule, WindowSpec)> + '_ {
        self.windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| self.rule_at(i).map(|r| (r, *w)))
    }
}
