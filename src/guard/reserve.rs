//! One event offered to every subject of a request at once (the store makes
//! it all or nothing), and the refusal that decides the answer.

use super::SubjectRules;
use crate::domain::{Rule, Subject, SubjectKind};
use crate::store::{
    CodeToStore, ConversionHit, ConversionOutcome, ConversionPolicy, HitOutcome, HitVerdict,
    ReserveOutcome, ReserveRequest, RollBack, StoreError, SubjectWindows, WindowStore,
};

/// One subject's share of a request: its key and its kind's rules.
pub struct SubjectHit<'a> {
    /// The subject counted.
    pub subject: Subject,
    /// Its window key for this action.
    pub key: String,
    /// Its kind's rules for this action.
    pub rules: &'a SubjectRules,
}

/// One subject's conversion counters (the pumping guard's prefix or
/// country): checked before the windows, counted with them.
pub struct ConversionSubject<'a> {
    /// The subject counted.
    pub subject: Subject,
    /// Its conversion key.
    pub key: String,
    /// When its conversion blocks it.
    pub policy: &'a ConversionPolicy,
}

/// What a request offers the store, all or nothing.
pub struct Offer<'a, 'c> {
    /// The subjects whose windows count the event.
    pub hits: Vec<SubjectHit<'a>>,
    /// The conversions that may refuse it first, and count it.
    pub conversions: Vec<ConversionSubject<'a>>,
    /// The event's id in every window.
    pub member: String,
    /// The request passed a captcha.
    pub gate_open: bool,
    /// Shadow mode: record the event even when refused.
    pub force: bool,
    /// Stored when the event is recorded.
    pub code: Option<CodeToStore<'c>>,
}

/// What a refusal asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// Wait this long: a window is full.
    RateLimited { retry_after_ms: u64 },
    /// Pass a captcha: a captcha tier is reached.
    CaptchaRequired,
}

/// A refusal: the subject and rule that refused, and the count it saw.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The subject whose window refused.
    pub subject: Subject,
    /// The rule of that window.
    pub rule: Rule,
    /// The window's count before this request (the audit `observed`).
    pub observed: u32,
    /// Whether to wait or to pass a captcha.
    pub kind: RefusalKind,
}

impl Refusal {
    fn retry_after_ms(&self) -> Option<u64> {
        match self.kind {
            RefusalKind::RateLimited { retry_after_ms } => Some(retry_after_ms),
            RefusalKind::CaptchaRequired => None,
        }
    }
}

/// What offering the event came to: each subject's outcome, and the
/// refusal that answers, if any.
pub struct Reservation<'a> {
    /// The subjects offered the event, in the caller's order.
    pub hits: Vec<SubjectHit<'a>>,
    /// The store's answer per subject, in the order of `hits`.
    pub outcomes: Vec<HitOutcome>,
    /// The event's id in every window, to roll it back by.
    pub member: String,
    /// The conversions offered the event, in the caller's order.
    pub conversions: Vec<ConversionSubject<'a>>,
    /// The store's answer per conversion, in the order of `conversions`.
    pub conversion_outcomes: Vec<ConversionOutcome>,
    /// The event was recorded in every subject (and the code stored).
    pub recorded: bool,
    /// By the store `store.on_error` falls back to (see [`RollBack`]).
    pub by_fallback: bool,
    /// The request passed a captcha (the offer's `gate_open`).
    pub gate_open: bool,
    /// What refuses the request, if anything (see `pick_refusal`); a
    /// conversion's block or challenge is read from `conversion_outcomes`.
    pub refusal: Option<Refusal>,
}

impl Reservation<'_> {
    /// The subject of `kind` (a request counts at most one of each), with
    /// the store's answer for it.
    pub fn hit_of(&self, kind: SubjectKind) -> Option<(&SubjectHit<'_>, &HitOutcome)> {
        let index = self.hits.iter().position(|h| h.subject.kind == kind)?;
        Some((&self.hits[index], self.outcomes.get(index)?))
    }

    /// Whether a captcha is all that refuses the request: a subject's
    /// captcha tier or a conversion's challenge, and no rate limit or block.
    /// A passed captcha would then let it through.
    pub fn only_captcha_refuses(&self) -> bool {
        let outcomes = &self.conversion_outcomes;
        let gated = match &self.refusal {
            Some(refusal) => refusal.kind == RefusalKind::CaptchaRequired,
            None => outcomes.iter().any(|o| o.refuses(self.gate_open)),
        };
        !self.recorded && gated && !outcomes.iter().any(|o| o.blocks())
    }

    /// Whether a conversion asks for a captcha now (a country's challenge):
    /// the next send needs one.
    pub fn challenged(&self) -> bool {
        self.conversion_outcomes.iter().any(|o| o.challenges())
    }

    /// Whether the captcha tier of the subject of `kind` is reached after
    /// this request.
    pub fn gate_reached_after(&self, kind: SubjectKind) -> bool {
        let Some((hit, outcome)) = self.hit_of(kind) else {
            return false;
        };
        let Some(gate) = hit.rules.gate else {
            return false;
        };
        let count = outcome
            .counts
            .get(hit.rules.rules.len())
            .copied()
            .unwrap_or(0);
        count + u32::from(outcome.added) >= gate.limit
    }

    /// Whether the store counted the windows: it recorded the event, a
    /// window refused it, or a conversion's challenge did (the windows are
    /// read under a challenge). Otherwise it answered without reading them
    /// (a pumping block refused first, or the store fails open), and every
    /// outcome is the open one.
    fn windows_counted(&self) -> bool {
        let conversions = &self.conversion_outcomes;
        self.recorded
            || self
                .outcomes
                .iter()
                .any(|outcome| outcome.verdict != HitVerdict::Allowed)
            || (conversions.iter().any(|o| o.challenges())
                && !conversions.iter().any(|o| o.blocks()))
    }

    /// Count one hit on every window the store counted; `section_shadow`:
    /// the section refuses nothing.
    pub fn count_rule_hits(&self, section_shadow: bool) {
        if !self.windows_counted() {
            return;
        }
        for (hit, outcome) in self.hits.iter().zip(&self.outcomes) {
            hit.rules.count_hits(outcome, section_shadow);
        }
    }

    /// What the rules in shadow would have refused: one rate-limit refusal
    /// per full `Observe` window, each with the wait it would have answered.
    pub fn observed_refusals(&self) -> Vec<Refusal> {
        let mut refusals = Vec::new();
        for (hit, outcome) in self.hits.iter().zip(&self.outcomes) {
            for (index, rule) in hit.rules.rules.iter().enumerate() {
                let count = outcome.counts.get(index).copied().unwrap_or(0);
                if rule.shadow && count >= rule.limit {
                    let retry_after_ms = outcome.observed_waits.get(index).copied().unwrap_or(0);
                    refusals.push(Refusal {
                        subject: hit.subject.clone(),
                        rule: *rule,
                        observed: count,
                        kind: RefusalKind::RateLimited { retry_after_ms },
                    });
                }
            }
        }
        refusals
    }

    /// Give every recorded event back, to the store that recorded it (a
    /// verify's try on its address, once the code proved right).
    pub async fn roll_back(&self, store: &dyn WindowStore) {
        self.give_back(store, |_| true).await;
    }

    /// Give the event back to the pumping guard's conversions and to every
    /// subject but those whose kind `kept` picks, whose windows go on
    /// counting it (a delivery that failed some ways, see
    /// `sms::decision::GiveBack`).
    pub async fn roll_back_keeping(
        &self,
        store: &dyn WindowStore,
        kept: impl Fn(SubjectKind) -> bool,
    ) {
        self.give_back(store, |hit| !kept(hit.subject.kind)).await;
    }

    /// Give the event back to the conversions and to the subjects
    /// `windows_back` picks.
    async fn give_back(
        &self,
        store: &dyn WindowStore,
        windows_back: impl Fn(&SubjectHit<'_>) -> bool,
    ) {
        if !self.recorded {
            return;
        }
        let subjects = self
            .hits
            .iter()
            .filter(|hit| windows_back(hit))
            .map(|hit| SubjectWindows {
                key: &hit.key,
                windows: hit.rules.windows(),
                callers_own: hit.subject.kind.is_callers_own(),
            })
            .collect::<Vec<_>>();
        let conversions = self
            .conversions
            .iter()
            .zip(&self.conversion_outcomes)
            .filter_map(|(c, outcome)| Some((c.key.as_str(), outcome.counted_in?)))
            .collect::<Vec<_>>();
        if subjects.is_empty() && conversions.is_empty() {
            return;
        }
        store
            .roll_back(&RollBack {
                subjects,
                member: &self.member,
                conversions,
                by_fallback: self.by_fallback,
            })
            .await;
    }
}

/// Offer one event to every subject, with the code to store when it is
/// recorded. `force` (shadow mode) records it even when refused.
pub async fn reserve<'a>(
    store: &dyn WindowStore,
    offer: Offer<'a, '_>,
) -> Result<Reservation<'a>, StoreError> {
    let Offer {
        hits,
        conversions,
        member,
        gate_open,
        force,
        code,
    } = offer;
    let subjects: Vec<SubjectWindows<'_>> = hits
        .iter()
        .map(|hit| SubjectWindows {
            key: &hit.key,
            windows: hit.rules.windows(),
            callers_own: hit.subject.kind.is_callers_own(),
        })
        .collect();
    let conversion_hits: Vec<ConversionHit<'_>> = conversions
        .iter()
        .map(|c| ConversionHit {
            key: &c.key,
            policy: c.policy,
        })
        .collect();
    // Nothing to count or store (an allow-listed phone's send from an
    // address without windows): no store call.
    let outcome = if subjects.is_empty() && conversion_hits.is_empty() && code.is_none() {
        ReserveOutcome {
            outcomes: Vec::new(),
            conversions: Vec::new(),
            recorded: true,
            by_fallback: false,
        }
    } else {
        store
            .reserve(ReserveRequest {
                subjects: &subjects,
                conversions: &conversion_hits,
                member: &member,
                gate_open,
                force,
                code,
            })
            .await?
    };
    drop((subjects, conversion_hits));
    let refusal = pick_refusal(&hits, &outcome.outcomes);
    Ok(Reservation {
        hits,
        outcomes: outcome.outcomes,
        member,
        conversions,
        conversion_outcomes: outcome.conversions,
        recorded: outcome.recorded,
        by_fallback: outcome.by_fallback,
        gate_open,
        refusal,
    })
}

/// A rate limit beats a captcha tier; among rate limits the longest wait wins,
/// since the request cannot pass before it.
fn pick_refusal(hits: &[SubjectHit<'_>], outcomes: &[HitOutcome]) -> Option<Refusal> {
    let mut denial: Option<Refusal> = None;
    let mut gate: Option<Refusal> = None;
    for (hit, outcome) in hits.iter().zip(outcomes) {
        match outcome.verdict {
            HitVerdict::Allowed => {}
            HitVerdict::Denied {
                window,
                retry_after_ms,
            } => {
                let Some(rule) = hit.rules.rule_at(window) else {
                    continue;
                };
                if denial.as_ref().and_then(Refusal::retry_after_ms) < Some(retry_after_ms) {
                    denial = Some(Refusal {
                        subject: hit.subject.clone(),
                        rule,
                        observed: outcome.counts.get(window).copied().unwrap_or(0),
                        kind: RefusalKind::RateLimited { retry_after_ms },
                    });
                }
            }
            HitVerdict::Gated { window } => {
                let Some(rule) = hit.rules.rule_at(window) else {
                    continue;
                };
                if gate.is_none() {
                    gate = Some(Refusal {
                        subject: hit.subject.clone(),
                        rule,
                        observed: outcome.counts.get(window).copied().unwrap_or(0),
                        kind: RefusalKind::CaptchaRequired,
                    });
                }
            }
        }
    }
    denial.or(gate)
}
