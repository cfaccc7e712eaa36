//! Reserve-then-roll-back across the subjects of one request: every subject's
//! script runs concurrently; if any refuses, the events already recorded are
//! removed again, so a request refused by its IP never uses up the phone's quota.

use futures::future::join_all;

use crate::domain::{Rule, Subject};
use crate::store::{HitOutcome, HitRequest, HitVerdict, StoreError, WindowSpec, WindowStore};

/// One subject's share of a request: its rules and, optionally, its captcha tier.
pub struct SubjectHit {
    pub subject: Subject,
    pub key: String,
    pub rules: Vec<Rule>,
    pub gate: Option<Rule>,
}

impl SubjectHit {
    fn windows(&self) -> Vec<WindowSpec> {
        self.rules
            .iter()
            .map(Rule::enforce)
            .chain(self.gate.iter().map(Rule::gate))
            .collect()
    }

    /// The rule behind window `index` of [`Self::windows`].
    fn rule_at(&self, index: usize) -> Option<Rule> {
        self.rules.get(index).copied().or(self.gate)
    }
}

/// A refusal: the subject and rule that refused, and the count it saw.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub subject: Subject,
    pub rule: Rule,
    pub observed: u32,
    /// `Some` for a rate limit, `None` for a captcha tier.
    pub retry_after_ms: Option<u64>,
}

pub struct Reservation {
    pub hits: Vec<SubjectHit>,
    pub outcomes: Vec<HitOutcome>,
    pub member: String,
    pub refusal: Option<Refusal>,
}

impl Reservation {
    pub fn outcome_of(&self, subject_index: usize) -> Option<&HitOutcome> {
        self.outcomes.get(subject_index)
    }

    /// Whether a subject's captcha tier is reached after this request.
    pub fn gate_reached_after(&self, subject_index: usize) -> bool {
        let (Some(hit), Some(outcome)) = (
            self.hits.get(subject_index),
            self.outcomes.get(subject_index),
        ) else {
            return false;
        };
        let Some(gate) = hit.gate else { return false };
        let count = outcome.counts.get(hit.rules.len()).copied().unwrap_or(0);
        count + u32::from(outcome.added) >= gate.limit
    }

    /// Give every recorded event back (a failed delivery, a refusal).
    pub async fn roll_back(&self, store: &dyn WindowStore) {
        undo_added(store, &self.hits, &self.outcomes, &self.member).await;
    }
}

async fn undo_added(
    store: &dyn WindowStore,
    hits: &[SubjectHit],
    outcomes: &[HitOutcome],
    member: &str,
) {
    let undos = hits
        .iter()
        .zip(outcomes)
        .filter(|(_, o)| o.added)
        .map(|(hit, _)| store.undo(&hit.key, member));
    for result in join_all(undos).await {
        if let Err(e) = result {
            // The event stays counted until its window passes: fail towards
            // stricter limits, never towards a lost denial.
            tracing::warn!(error = %e, "could not roll back a reservation");
        }
    }
}

/// Offer one event to every subject. `force` (shadow mode) keeps the events
/// even when refused.
pub async fn reserve(
    store: &dyn WindowStore,
    hits: Vec<SubjectHit>,
    member: String,
    gate_open: bool,
    force: bool,
) -> Result<Reservation, StoreError> {
    let windows: Vec<Vec<WindowSpec>> = hits.iter().map(SubjectHit::windows).collect();
    let calls = hits.iter().zip(&windows).map(|(hit, windows)| {
        store.hit(HitRequest {
            key: &hit.key,
            windows,
            member: &member,
            gate_open,
            force,
        })
    });
    let results = join_all(calls).await;

    let mut outcomes = Vec::with_capacity(results.len());
    let mut error = None;
    for result in results {
        match result {
            Ok(outcome) => outcomes.push(outcome),
            Err(e) => {
                error = Some(e);
                outcomes.push(HitOutcome {
                    verdict: HitVerdict::Allowed,
                    added: false,
                    counts: Vec::new(),
                    next_retry_after_ms: 0,
                });
            }
        }
    }
    if let Some(e) = error {
        undo_added(store, &hits, &outcomes, &member).await;
        return Err(e);
    }

    let refusal = pick_refusal(&hits, &outcomes);
    let reservation = Reservation {
        hits,
        outcomes,
        member,
        refusal,
    };
    if reservation.refusal.is_some() && !force {
        reservation.roll_back(store).await;
    }
    Ok(reservation)
}

/// A rate limit beats a captcha tier; among rate limits the longest wait wins,
/// since the request cannot pass before it.
fn pick_refusal(hits: &[SubjectHit], outcomes: &[HitOutcome]) -> Option<Refusal> {
    let mut denial: Option<Refusal> = None;
    let mut gate: Option<Refusal> = None;
    for (hit, outcome) in hits.iter().zip(outcomes) {
        match outcome.verdict {
            HitVerdict::Allowed => {}
            HitVerdict::Denied {
                window,
                retry_after_ms,
            } => {
                let Some(rule) = hit.rule_at(window) else {
                    continue;
                };
                if denial.as_ref().and_then(|d| d.retry_after_ms) < Some(retry_after_ms) {
                    denial = Some(Refusal {
                        subject: hit.subject.clone(),
                        rule,
                        observed: outcome.counts.get(window).copied().unwrap_or(0),
                        retry_after_ms: Some(retry_after_ms),
                    });
                }
            }
            HitVerdict::Gated { window } => {
                let Some(rule) = hit.rule_at(window) else {
                    continue;
                };
                if gate.is_none() {
                    gate = Some(Refusal {
                        subject: hit.subject.clone(),
                        rule,
                        observed: outcome.counts.get(window).copied().unwrap_or(0),
                        retry_after_ms: None,
                    });
                }
            }
        }
    }
    denial.or(gate)
}
