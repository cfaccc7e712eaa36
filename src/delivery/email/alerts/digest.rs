//! What the alert task keeps between digests ([`Watch`]) and what a digest
//! tells ([`Digest`]): the locks since the last one, and the SMS rules whose
//! denials went over the threshold.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use tokio::time::Instant;

use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, SubjectKind};

/// Locks listed one by one in a digest; the rest are counted.
pub(super) const LISTED_LOCKS: usize = 50;

/// What a digest tells (the variables of `templates/email/*/alert_digest.txt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Digest {
    /// Start of the period the digest covers, RFC 3339.
    pub since: String,
    /// End of that period, RFC 3339.
    pub until: String,
    /// Locks of the period, at most 50, shared among the kinds of subject.
    pub locks: Vec<LockSeen>,
    /// Locks beyond those listed.
    pub more_locks: u64,
    /// SMS rules that went over the threshold.
    pub rules: Vec<RuleOverThreshold>,
}

/// One lock (or IP block) in a digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockSeen {
    /// The subject's kind.
    pub kind: String,
    /// The subject's id; a user name defanged (see [`shown_subject`]).
    pub subject: String,
    /// Why, e.g. `too_many_failures`.
    pub reason: String,
    /// The rule that locked, when there is one.
    pub rule: Option<String>,
    /// Length of the lock in minutes, rounded up.
    pub minutes: u64,
    /// When it happened, RFC 3339.
    pub at: String,
    /// Recorded in shadow mode: not enforced.
    pub shadow: bool,
}

/// An SMS rule that denied more than `threshold` requests within `window`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleOverThreshold {
    /// The action, e.g. `sms_send`.
    pub action: String,
    /// The rule's name, or the reason of denials without a rule
    /// (`region_blocked`).
    pub rule: String,
    /// Denials since the last digest.
    pub denials: u64,
    /// `email.alert_threshold`.
    pub threshold: u32,
    /// `email.alert_window`, as humantime text (`5m`).
    pub window: String,
}

#[derive(Debug, Default)]
pub(super) struct RuleCount {
    /// Times of the latest denials, at most `threshold + 1` of them.
    recent: VecDeque<Instant>,
    /// Denials since the last digest.
    since_last: u64,
    /// More than `threshold` within the window since the last digest.
    over: bool,
}

/// The alert state, apart from time and sending so it can be tested alone.
#[derive(Debug)]
pub(super) struct Watch {
    threshold: u32,
    window: Duration,
    interval: Duration,
    last_sent: Option<Instant>,
    /// When something first waited for the next digest.
    pending_since: Option<Instant>,
    since: DateTime<Utc>,
    locks: Vec<LockSeen>,
    more_locks: u64,
    rules: BTreeMap<(String, String), RuleCount>,
}

impl Watch {
    pub(super) fn new(
        threshold: u32,
        window: Duration,
        interval: Duration,
        started: DateTime<Utc>,
    ) -> Self {
        Self {
            threshold,
            window,
            interval,
            last_sent: None,
            pending_since: None,
            since: started,
            locks: Vec::new(),
            more_locks: 0,
            rules: BTreeMap::new(),
        }
    }

    pub(super) fn observe(&mut self, event: &AuditEvent, now: Instant) {
        if !alert_worthy(event) {
            return;
        }
        let alerting = match event.decision {
            AuditDecision::Lock => {
                self.list(LockSeen {
                    kind: event.subject_kind.to_string(),
                    subject: shown_subject(event.subject_kind, &event.subject),
                    reason: event.reason.clone(),
                    rule: event.rule.clone(),
                    minutes: (event.retry_after_ms.unwrap_or(0).max(0) as u64).div_ceil(60_000),
                    at: event.occurred_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                    shadow: event.shadow,
                });
                true
            }
            AuditDecision::Deny => {
                // Denials without a rule (region_blocked) are grouped by reason.
                let rule = event.rule.clone().unwrap_or_else(|| event.reason.clone());
                let count = self
                    .rules
                    .entry((event.action.to_string(), rule))
                    .or_default();
                count.since_last += 1;
                count.recent.push_back(now);
                let keep = self.threshold as usize + 1;
                while count.recent.len() > keep {
                    count.recent.pop_front();
                }
                let over = count.recent.len() == keep
                    && count
                        .recent
                        .front()
                        .is_some_and(|first| now.duration_since(*first) < self.window);
                if over {
                    count.over = true;
                }
                over
            }
            // `alert_worthy` let only locks and denials through; it names
            // every decision, so a new one is considered there.
            _ => false,
        };
        if alerting && self.pending_since.is_none() {
            self.pending_since = Some(now);
        }
    }

    /// List `lock`, or count it among the rest. The listed locks are
    /// shared among the kinds of subject: once the list is full, a lock
    /// of a kind with fewer listed than the most listed kind takes the
    /// place of that kind's latest. First come, first listed, would let
    /// anyone push a real lock out of sight: ten wrong passwords for each
    /// of 50 made-up names fill the list with user locks, and the pumping
    /// block or IP block after them became "and N more".
    fn list(&mut self, lock: LockSeen) {
        if self.locks.len() < LISTED_LOCKS {
            self.locks.push(lock);
            return;
        }
        self.more_locks += 1;
        let mut listed: BTreeMap<&str, usize> = BTreeMap::new();
        for seen in &self.locks {
            *listed.entry(seen.kind.as_str()).or_default() += 1;
        }
        let own = listed.get(lock.kind.as_str()).copied().unwrap_or(0);
        let Some((crowded, most)) = listed.into_iter().max_by_key(|&(_, n)| n) else {
            return;
        };
        if own + 1 >= most {
            return;
        }
        let crowded = crowded.to_string();
        if let Some(latest) = self.locks.iter().rposition(|seen| seen.kind == crowded) {
            self.locks.remove(latest);
            self.locks.push(lock);
        }
    }

    /// Take back a digest no admin got, so that the next one tells it:
    /// its period, its locks before the ones seen since (within the
    /// listing's bound; with `keep_locks` false, only counted), its rules'
    /// denials. It waits for the interval, as any digest after a first one
    /// does.
    pub(super) fn restore(&mut self, digest: Digest, keep_locks: bool, now: Instant) {
        if let Ok(since) = DateTime::parse_from_rfc3339(&digest.since) {
            self.since = self.since.min(since.with_timezone(&Utc));
        }
        self.more_locks += digest.more_locks;
        if keep_locks {
            let seen_since = std::mem::take(&mut self.locks);
            for lock in digest.locks.into_iter().chain(seen_since) {
                self.list(lock);
            }
        } else {
            self.more_locks += digest.locks.len() as u64;
        }
        for rule in digest.rules {
            let count = self.rules.entry((rule.action, rule.rule)).or_default();
            count.since_last += rule.denials;
            count.over = true;
        }
        self.pending_since.get_or_insert(now);
    }

    /// When the next digest may go out; `None` while nothing waits for one.
    pub(super) fn next_send(&self) -> Option<Instant> {
        let pending = self.pending_since?;
        Some(match self.last_sent {
            Some(sent) => (sent + self.interval).max(pending),
            None => pending,
        })
    }

    /// The digest of whatever waits, due or not (at shutdown).
    pub(super) fn take_pending(&mut self, now: Instant, wall: DateTime<Utc>) -> Option<Digest> {
        let due = self.next_send()?;
        self.take_digest(due.max(now), wall)
    }

    /// The digest, if one is due at `now`; starts the next period.
    pub(super) fn take_digest(&mut self, now: Instant, wall: DateTime<Utc>) -> Option<Digest> {
        if self.next_send().is_none_or(|due| due > now) {
            return None;
        }
        let rules = self
            .rules
            .iter_mut()
            .filter(|(_, count)| count.over)
            .map(|((action, rule), count)| RuleOverThreshold {
                action: action.clone(),
                rule: rule.clone(),
                denials: count.since_last,
                threshold: self.threshold,
                window: humantime::format_duration(self.window).to_string(),
            })
            .collect();
        for count in self.rules.values_mut() {
            count.since_last = 0;
            count.over = false;
        }
        // Rules quiet for a whole window are forgotten, so the map stays small.
        let window = self.window;
        self.rules.retain(|_, count| {
            count
                .recent
                .back()
                .is_some_and(|last| now.duration_since(*last) < window)
        });
        let digest = Digest {
            since: self.since.to_rfc3339_opts(SecondsFormat::Secs, true),
            until: wall.to_rfc3339_opts(SecondsFormat::Secs, true),
            locks: std::mem::take(&mut self.locks),
            more_locks: std::mem::take(&mut self.more_locks),
            rules,
        };
        self.since = wall;
        self.last_sent = Some(now);
        self.pending_since = None;
        Some(digest)
    }
}

/// A subject as a digest shows it. A user name is whatever a caller sent
/// to `/login/attempt`: `evil.example/reset-your-token` or
/// `https://evil.example`, printed as is, becomes a link in the admin's
/// mail client, in a mail tollgate sent. Its dots and colons are shown as
/// `[.]` and `[:]` (as security alerts defang addresses), so no client
/// sees a host or a scheme in it; the dots IDNA also reads as a label's
/// end (`。`, `．`, `｡`, which NFKC leaves in a name or folds to `.`)
/// too. Phones, prefixes, addresses and countries are tollgate's own
/// formatting, shown as they are.
pub(super) fn shown_subject(kind: SubjectKind, subject: &str) -> String {
    const DOTS: [char; 4] = ['.', '\u{3002}', '\u{FF0E}', '\u{FF61}'];
    match kind {
        // A line or paragraph separator (U+2028, U+2029) passes the
        // guards' check for control characters, and mail clients break
        // lines at it: a name could write lines of its own into the digest
        // ("No further locks."). Shown as U+FFFD, as the console does.
        SubjectKind::User => crate::domain::text::undisguised(subject)
            .replace(DOTS, "[.]")
            .replace(':', "[:]"),
        _ => subject.to_string(),
    }
}

/// Locks (user locks, IP blocks) and denials of the SMS actions.
pub(super) fn alert_worthy(event: &AuditEvent) -> bool {
    match event.decision {
        AuditDecision::Lock => true,
        AuditDecision::Deny => matches!(event.action, Action::SmsSend | Action::SmsVerify),
        AuditDecision::Challenge
        | AuditDecision::Unblock
        | AuditDecision::ListAdd
        | AuditDecision::ListRemove
        | AuditDecision::Export
        | AuditDecision::SignIn
        | AuditDecision::SignInFailed
        | AuditDecision::SignOut => false,
    }
}
