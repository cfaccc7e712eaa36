//! Reserve-then-roll-back across the subjects of one request: every subject's
//! script runs concurrently; if any refuses, the events already recorded are
//! removed again, so a request refused by its IP never uses up the phone's quota.

use futures::future::join_all;

use super::SubjectRules;
use crate::domain::{Rule, Subject};
use crate::store::{HitOutcome, HitRequest, HitVerdict, StoreError, WindowStore};

/// One subject's share of a request: its key and its kind's rules.
pub struct SubjectHit<'a> {
    pub subject: Subject,
    pub key: String,
    pub rules: &'a SubjectRules,
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

pub struct Reservation<'a> {
    pub hits: Vec<SubjectHit<'a>>,
    pub outcomes: Vec<HitOutcome>,
    pub member: String,
    pub refusal: Option<Refusal>,
}

impl Reservation<'_> {
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

    /// Give every recorded event back (a failed delivery, a refusal).
    pub async fn roll_back(&self, store: &dyn WindowStore) {
        undo_added(store, &self.hits, &self.outcomes, &self.member).await;
    }
}

async fn undo_added(
    store: &dyn WindowStore,
    hits: &[SubjectHit<'_>],
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
pub async fn reserve<'a>(
    store: &dyn WindowStore,
    hits: Vec<SubjectHit<'a>>,
    member: String,
    gate_open: bool,
    force: bool,
) -> Result<Reservation<'a>, StoreError> {
    let calls = hits.iter().map(|hit| {
        store.hit(HitRequest {
            key: &hit.key,
            windows: hit.rules.windows(),
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
                let Some(rule) = hit.rules.rule_at(window) else {
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
