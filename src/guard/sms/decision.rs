//! What a send (or a verify) comes to, decided in pure code from what the
//! lists, the region rule and the store said: the refusals in the order
//! DESIGN.md §3 checks them, the audit rows, the pumping blocks to list and
//! what the answer tells (resend-after, captcha, quota). `SmsGuard` applies
//! it; shadow mode is one step, [`Decision::shadowed`].
//!
//! The order of the refusals: the block list, the region, then on the
//! reservation a pumping block (the store read no window), a window's rate
//! limit (a wait beats a captcha: the send cannot pass before it), then a
//! captcha (a subject's tier or the country's challenge). The send that
//! starts a block or a challenge is audited whatever answers; a live
//! challenge only when it is what answers.

use super::refusal::{refusal_row, region_allowed};
use super::{Quota, SmsRefusal};
use crate::audit::{AuditDecision, AuditEvent};
use crate::delivery::DeliveryError;
use crate::domain::{Action, PhoneNumber, Reason, Subject, SubjectKind};
use crate::guard::pumping::{self, Found};
use crate::guard::reserve::{RefusalKind, Reservation};
use crate::guard::{Listing, SubjectRules};
use crate::lists::{EntryKind, Listed};
use crate::metrics::SmsDelivery;
use crate::settings::SmsSettings;
use crate::store::{DroppedCode, HitOutcome};

/// A decision, before any effect.
#[derive(Debug)]
pub(super) struct Decision<A> {
    /// What refuses the request, in the order checked, each with the rows
    /// that tell it. The first one answers, and only its rows are written.
    pub refusals: Vec<(SmsRefusal, Vec<AuditEvent>)>,
    /// Rows written whatever answers (the pumping guard's own decisions).
    pub rows: Vec<AuditEvent>,
    /// What rules on trial would have refused: written when nothing
    /// refuses (already marked shadow).
    pub observed: Vec<AuditEvent>,
    /// The subjects this send blocked, with the block's length, for the
    /// list admins see.
    pub new_blocks: Vec<(Subject, u64)>,
    /// The answer when nothing refuses.
    pub answer: A,
}

/// What an answer becomes in shadow mode.
pub(super) trait Answer {
    /// The answer once nothing is enforced.
    fn shadowed(self) -> Self;
}

/// What a send whose delivery failed gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GiveBack {
    /// The whole send: its windows, its pumping count and its code. The
    /// provider or the set-up failed, and a retry may pass.
    Whole,
    /// All but its client address's windows (the IP's and the IPv6
    /// network's), which go on counting it: the provider refused to text
    /// the number, or declined it past the address's budget. Given back
    /// whole, such a send could be repeated without end, each a provider
    /// call no window saw.
    AllButTheAddress,
    /// All but the phone's windows, which go on counting it: a connection
    /// dropped once the message went out, on a send that names no client
    /// and so has no budget of failures. The phone's windows bound what a
    /// provider that takes a message and then drops the connection can
    /// text one phone; the prefix's and the global ones are everyone's, and
    /// a proxy dropping every send during an outage would fill them.
    AllButThePhone,
    /// Its pumping count alone: the message may have gone (no answer in time).
    PumpingCount,
    /// Its pumping count and its code, not one window: what
    /// `AllButTheAddress` becomes on a send that counts in no address
    /// window (an allow-listed address's, or one naming no client), which
    /// so costs the windows a delivered send would.
    CodeAndPumpingCount,
}

impl GiveBack {
    /// What keeps a send its address must pay for: the address's
    /// windows, or, on a send counted in none (`address_counted` false: an
    /// allow-listed address's, or one that names no client), every window.
    /// Else whoever may name that address, or name none, would make a
    /// provider call per request for nothing.
    fn kept_by_the_address(address_counted: bool) -> Self {
        if address_counted {
            GiveBack::AllButTheAddress
        } else {
            GiveBack::CodeAndPumpingCount
        }
    }

    /// What a failure given back whole becomes once its address spent its
    /// budget of failed deliveries.
    pub(super) fn past_the_budget(self, address_counted: bool) -> Self {
        match self {
            GiveBack::Whole => GiveBack::kept_by_the_address(address_counted),
            other => other,
        }
    }

    /// Whether the windows of a subject of this kind go on counting the send.
    pub(super) fn keeps_windows_of(self, kind: SubjectKind) -> bool {
        match self {
            GiveBack::Whole => false,
            GiveBack::AllButTheAddress => ADDRESS_KINDS.contains(&kind),
            GiveBack::AllButThePhone => kind == SubjectKind::Phone,
            GiveBack::PumpingCount | GiveBack::CodeAndPumpingCount => true,
        }
    }

    /// Whether the send's code stays, to verify should the message arrive.
    pub(super) fn keeps_the_code(self) -> bool {
        self == GiveBack::PumpingCount
    }
}

/// Whether a failed send's code may have been guessed at while the
/// provider had it (a verify comes any time after the reservation stored
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guessed {
    No,
    /// A wrong try took one of its tries, or it is gone (a right try used
    /// it, or the racing send's code that kept it), or its drop failed
    /// and it may stay with whatever tries it took.
    Maybe,
}

/// What a failed send's code came to, by what its drop found (`None`: the
/// drop failed).
pub(super) fn guessed_at(dropped: Option<DroppedCode>) -> Guessed {
    match dropped {
        Some(DroppedCode::Untried) => Guessed::No,
        Some(DroppedCode::Tried | DroppedCode::Absent) | None => Guessed::Maybe,
    }
}

/// Whether the windows of a subject of `kind` go on counting a failed
/// send that gives back `give_back`: the phone's windows keep a send whose
/// code may have been guessed at, as they would a delivered one's, so that
/// a phone gets no more tries in a day than its sends allow, whatever
/// fails. A user who types the code of an earlier SMS while a resend is
/// at the provider takes a try of the resend's code (the newest is the one
/// checked), and such a resend, failing, is kept too: one send of the
/// phone's.
pub(super) fn keeps_windows_of(give_back: GiveBack, guessed: Guessed, kind: SubjectKind) -> bool {
    give_back.keeps_windows_of(kind) || (guessed == Guessed::Maybe && kind == SubjectKind::Phone)
}

/// The subject kinds whose windows keep a send the provider refused.
const ADDRESS_KINDS: [SubjectKind; 2] = [SubjectKind::Ip, SubjectKind::Network];

/// Whether `reservation` counts its send in a window of its client
/// address: not an allow-listed address's, nor one that names no client.
pub(super) fn counts_an_address(reservation: &Reservation<'_>) -> bool {
    reservation
        .hits
        .iter()
        .any(|hit| ADDRESS_KINDS.contains(&hit.subject.kind))
}

/// What a failed delivery gives back of its send, `address_counted`
/// telling whether the send counts in its address's windows.
pub(super) fn give_back(error: &DeliveryError, address_counted: bool) -> GiveBack {
    if error.may_have_been_delivered() {
        GiveBack::PumpingCount
    } else if error.refused_the_number() {
        GiveBack::kept_by_the_address(address_counted)
    } else {
        GiveBack::Whole
    }
}

/// What a failure that spends the budget of failed deliveries gives back
/// on a send that names no client, which has no budget (`said` being what
/// the failure alone gives). A declined send keeps what a delivered one
/// would, or a backend relaying no `ip` would make a provider call per
/// request; a dropped connection only the phone's windows.
pub(super) fn without_a_budget(
    error: &DeliveryError,
    said: GiveBack,
    address_counted: bool,
) -> GiveBack {
    if error.dropped_the_connection() {
        GiveBack::AllButThePhone
    } else {
        said.past_the_budget(address_counted)
    }
}

/// What `tollgate_sms_deliveries_total` counts a failed delivery as, by
/// its failure alone (`OverBudget` is the budget's word).
fn outcome(error: &DeliveryError) -> SmsDelivery {
    if error.may_have_been_delivered() {
        SmsDelivery::TimedOut
    } else if error.refused_the_number() {
        SmsDelivery::RefusedNumber
    } else if error.the_requests_own() {
        SmsDelivery::Declined
    } else if error.spends_the_failure_budget() {
        SmsDelivery::Dropped
    } else {
        SmsDelivery::Failed
    }
}

/// What `tollgate_sms_deliveries_total` counts a failed delivery as: its
/// failure's own word, unless the failure budgets keep more of it than
/// that word gives back (`said`, `given` what they left of it): then it is
/// `OverBudget`, as is a declined send naming no client, which has no
/// budget at all.
pub(super) fn delivery_outcome(
    error: &DeliveryError,
    said: GiveBack,
    given: GiveBack,
) -> SmsDelivery {
    if given == said {
        outcome(error)
    } else {
        SmsDelivery::OverBudget
    }
}

/// What the lists and the region rule let through goes on one of three ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// Counted in the windows and the pumping guard.
    Counted,
    /// An allow-listed phone: its own, its prefix's and the global windows
    /// and the pumping guard do not apply, the asking address's and
    /// network's windows (sends and tries) do. Else anyone could ask for
    /// the listed phone's codes without end and guess each one's tries:
    /// a fresh code, fresh tries.
    AskerCounted,
    /// A phone allow-listed by a prefix entry (`+44*`) that the request's
    /// client asks for: its prefix's and the global windows and the
    /// pumping guard do not apply, its own windows and the asker's do.
    /// Else such an entry took every limit off each number of its range:
    /// anyone could text one of them without end.
    RangeAllowed,
    /// An allow-listed address: its own and its network's windows and
    /// every captcha tier do not apply, the phone's, its prefix's, the
    /// global windows and the pumping guard do. Else whoever may name the
    /// client (any API key's holder, with `ip`) could name a listed
    /// address and text any number without end.
    AddressExempt,
    /// An allow-listed address asking for an allow-listed phone (a test
    /// rig and its phone): no window, captcha tier or pumping block
    /// applies, and nothing is counted.
    Exempt,
}

impl Answer for Pass {
    fn shadowed(self) -> Self {
        self
    }
}

impl Answer for () {
    fn shadowed(self) -> Self {}
}

/// What a send that goes ahead tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Grant {
    /// When the phone's next send would pass its windows (0: at once).
    pub resend_after_ms: u64,
    /// Whether the next send will need a captcha.
    pub captcha_required: bool,
    /// The phone's enforced window with the fewest sends left.
    pub quota: Option<Quota>,
}

impl Answer for Grant {
    /// In shadow mode nothing was refused, so nothing is said to wait for.
    fn shadowed(self) -> Self {
        Grant::default()
    }
}

/// A decision's effects, in the order they are applied.
pub(super) struct Settled<A> {
    /// The answer: the first refusal, or what goes ahead.
    pub answer: Result<A, SmsRefusal>,
    /// The audit rows to write.
    pub rows: Vec<AuditEvent>,
    /// The pumping blocks to list.
    pub new_blocks: Vec<(Subject, u64)>,
}

impl<A: Answer> Decision<A> {
    fn new(answer: A) -> Self {
        Self {
            refusals: Vec::new(),
            rows: Vec::new(),
            observed: Vec::new(),
            new_blocks: Vec::new(),
            answer,
        }
    }

    /// Shadow mode: every row is written, marked shadow (every would-be
    /// refusal, not just the first); nothing is refused or listed.
    pub fn shadowed(self) -> Self {
        let told = self.refusals.into_iter().flat_map(|(_, rows)| rows);
        let rows = self.rows.into_iter().chain(told).chain(self.observed);
        Self {
            refusals: Vec::new(),
            rows: rows.map(|row| row.shadow(true)).collect(),
            observed: Vec::new(),
            new_blocks: Vec::new(),
            answer: self.answer.shadowed(),
        }
    }

    /// The first refusal answers, with its rows; otherwise the answer goes
    /// ahead, with the rows of the rules on trial.
    pub fn settle(self) -> Settled<A> {
        let mut rows = self.rows;
        let answer = match self.refusals.into_iter().next() {
            Some((refusal, mut told)) => {
                rows.append(&mut told);
                Err(refusal)
            }
            None => {
                rows.extend(self.observed);
                Ok(self.answer)
            }
        };
        Settled {
            answer,
            rows,
            new_blocks: self.new_blocks,
        }
    }
}

/// The region rule's word on a phone. It is policy, not a limit: an allow
/// entry does not lift it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Region {
    /// Codes may go to the phone's region.
    Allowed,
    /// They may not; the region, when the number has one.
    Denied(Option<String>),
}

impl Region {
    /// `sms.allowed_regions` and `sms.denied_regions` on `phone`.
    pub fn of(phone: &PhoneNumber, sms: &SmsSettings) -> Self {
        let region = phone.region();
        if region_allowed(region, &sms.allowed_regions, &sms.denied_regions) {
            Region::Allowed
        } else {
            Region::Denied(region.map(str::to_string))
        }
    }
}

/// What the lists say: a block refuses; an allowed address exempts; an
/// allowed phone leaves only its asker counted (one a range's entry allows,
/// its own windows too), and when the request names no client (no asker to
/// count) is counted as any phone, else a backend that leaves out `ip`
/// could ask for its codes without end.
pub(super) fn lists(listing: Listing, names_client: bool) -> Decision<Pass> {
    let pass = match listing.listed {
        Listed::Allowed(EntryKind::Ip) if !listing.subject_allowed_exactly => Pass::AddressExempt,
        Listed::Allowed(EntryKind::Phone) if !names_client => Pass::Counted,
        Listed::Allowed(EntryKind::Phone) if listing.subject_allowed_exactly => Pass::AskerCounted,
        Listed::Allowed(EntryKind::Phone) => Pass::RangeAllowed,
        Listed::Allowed(_) => Pass::Exempt,
        _ => Pass::Counted,
    };
    let mut decision = Decision::new(pass);
    if let Listed::Blocked(kind) = listing.listed {
        let rows = listing.row.into_iter().collect();
        decision
            .refusals
            .push((SmsRefusal::Blocklisted(kind), rows));
    }
    decision
}

/// A send before any window: the lists, then the region rule.
pub(super) fn screen(
    listing: Listing,
    names_client: bool,
    region: Region,
    phone: &Subject,
) -> Decision<Pass> {
    let mut decision = lists(listing, names_client);
    if let Region::Denied(region) = region {
        let row = AuditEvent::new(
            Action::SmsSend,
            AuditDecision::Deny,
            Reason::RegionBlocked,
            phone,
        );
        let refusal = SmsRefusal::RegionBlocked { region };
        decision.refusals.push((refusal, vec![row]));
    }
    decision
}

/// The audit rows of the country challenges a send's offer started: they
/// stay whatever comes of the send, so they are written before anything
/// else is awaited (a captcha token's check).
pub(super) fn started_challenges(reservation: &Reservation<'_>) -> Vec<AuditEvent> {
    let findings = pumping::findings(reservation).into_iter();
    findings
        .filter(|finding| finding.found == Found::Challenges)
        .map(|finding| finding.row)
        .collect()
}

/// A send's reservation: the pumping guard's findings, the windows'
/// refusal, the country's challenge, and what the answer tells. A
/// challenge the send started is audited here unless `challenge_audited`
/// (before a captcha token's check).
pub(super) fn reserved(reservation: &Reservation<'_>, challenge_audited: bool) -> Decision<Grant> {
    let mut decision = Decision::new(grant(reservation));
    let mut challenged = Vec::new();
    let mut blocked = false;
    for finding in pumping::findings(reservation) {
        match finding.found {
            Found::Blocks => {
                blocked = true;
                let block = (finding.subject.clone(), finding.lasts_ms);
                decision.new_blocks.push(block);
                decision.rows.push(finding.row);
            }
            Found::Blocked => {
                blocked = true;
                decision.rows.push(finding.row);
            }
            Found::Challenges if challenge_audited => {}
            Found::Challenges => decision.rows.push(finding.row),
            Found::Challenged => challenged.push(finding.row),
        }
    }
    if blocked {
        let refusal = (SmsRefusal::PumpingSuspected, Vec::new());
        decision.refusals.push(refusal);
    }
    let country_gate = !reservation.gate_open
        && reservation
            .conversion_outcomes
            .iter()
            .any(|o| o.challenges());
    match reservation.refusal.as_ref() {
        Some(window) => {
            let mut told = vec![refusal_row(Action::SmsSend, window)];
            if window.kind == RefusalKind::CaptchaRequired {
                told.append(&mut challenged);
            }
            decision.refusals.push((SmsRefusal::from(window), told));
        }
        None if country_gate => {
            let refusal = (SmsRefusal::CaptchaRequired, challenged);
            decision.refusals.push(refusal);
        }
        None => {}
    }
    decision.observed = observed(Action::SmsSend, reservation);
    decision
}

/// A verify try on the client IP's (and its network's) windows: their
/// refusal, and what the rules on trial would have refused.
pub(super) fn verify_try(reservation: &Reservation<'_>) -> Decision<()> {
    let mut decision = Decision::new(());
    if let Some(window) = &reservation.refusal {
        let row = refusal_row(Action::SmsVerify, window);
        decision
            .refusals
            .push((SmsRefusal::from(window), vec![row]));
    }
    decision.observed = observed(Action::SmsVerify, reservation);
    decision
}

/// Rules on trial: what they would have refused, audited, not enforced.
fn observed(action: Action, reservation: &Reservation<'_>) -> Vec<AuditEvent> {
    let refusals = reservation.observed_refusals();
    let rows = refusals.iter().map(|r| refusal_row(action, r).shadow(true));
    rows.collect()
}

/// What a send that goes ahead tells: the phone's wait and quota, and
/// whether the next send needs a captcha (the phone's, the IP's or the
/// network's tier reached, or the country challenged).
fn grant(reservation: &Reservation<'_>) -> Grant {
    let phone = reservation.hit_of(SubjectKind::Phone);
    let tiers = [SubjectKind::Phone, SubjectKind::Ip, SubjectKind::Network];
    Grant {
        resend_after_ms: phone.map_or(0, |(_, outcome)| outcome.next_retry_after_ms),
        captcha_required: tiers
            .into_iter()
            .any(|kind| reservation.gate_reached_after(kind))
            || reservation.challenged(),
        quota: phone.and_then(|(hit, outcome)| quota(hit.rules, outcome)),
    }
}

/// The enforced window with the fewest sends left after this one (the
/// enforced rules come first among a subject's windows).
fn quota(rules: &SubjectRules, outcome: &HitOutcome) -> Option<Quota> {
    let windows = rules.rules.iter().zip(&outcome.counts);
    windows
        .filter(|(rule, _)| !rule.shadow)
        .map(|(rule, count)| Quota {
            limit: rule.limit,
            window_secs: rule.window.as_secs(),
            remaining: rule.limit.saturating_sub(count + 1),
        })
        .min_by_key(|q| q.remaining)
}

#[cfg(test)]
mod tests;
