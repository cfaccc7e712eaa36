//! What admins see of a subject's live state, and lifting its blocks.

mod pumping_state;

pub use pumping_state::{ListedBlock, PumpingBlock, PumpingLevel, PumpingState};

use chrono::{DateTime, SubsecRound, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::{captcha_tokens, pumping, GuardContext, Policy, RequestInfo, Windows};
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, Reason, Rule, Subject, SubjectKind};
use crate::store::{pair_of_member, Keys, StoreError, WindowMode, WindowSpec};

/// One window of a subject: its live count against its rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"action": "login_attempt", "rule": "user 10/1h", "count": 3, "limit": 10, "window_ms": 3600000}))]
pub struct WindowState {
    /// The action whose events the window counts.
    pub action: Action,
    /// `<subject kind> <limit>/<window>`.
    pub rule: String,
    /// Events in the window now.
    pub count: u32,
    /// The rule's limit: the window is full at this count.
    pub limit: u32,
    /// The window's length in milliseconds.
    pub window_ms: u64,
    /// The rule is on trial (`shadow = true`): counted and audited, never
    /// enforced. Present only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(default = false)]
    pub shadow: bool,
}

/// A subject's live state.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SubjectState {
    /// Which kind of subject `id` names.
    pub kind: SubjectKind,
    /// The normalised subject id.
    #[schema(example = "alice")]
    pub id: String,
    /// When the user's lock (or the IP's login block, or a prefix's or
    /// country's pumping block) ends; null when there is none.
    #[schema(required = true)]
    pub locked_until: Option<DateTime<Utc>>,
    /// Whether one of the subject's captcha thresholds is reached
    /// (`sms.captcha_after`, `sms.network_captcha_after`,
    /// `login.captcha_after`, `login.ip_captcha_after`,
    /// `login.network_captcha_after`),
    /// or a country's sends need a captcha (the pumping guard's challenge).
    pub captcha_required: bool,
    /// Every window the subject is counted in, per action.
    pub windows: Vec<WindowState>,
    /// A user's (user, IP) pairs with failures or a lock
    /// (`login.lock_scope = "user_ip"`), newest first; absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(default = json!([]))]
    pub pairs: Vec<PairState>,
    /// For a prefix or a country while the pumping guard is on: its sends,
    /// verifies and block. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pumping: Option<PumpingState>,
    /// For an IP while a captcha provider checks tokens: the tokens the
    /// provider refused against `captcha.failed_token_limit`. Absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub refused_captcha_tokens: Option<RefusedTokens>,
}

/// An address's captcha tokens the provider refused: while they fill the
/// window, its tokens are refused without asking the provider (429
/// `rate_limited`, rule `failed_captcha …`); Unblock clears them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"rule": "failed_captcha 20/10m", "count": 3, "limit": 20, "window_ms": 600000}))]
pub struct RefusedTokens {
    /// `failed_captcha <limit>/<window>`.
    pub rule: String,
    /// Refused tokens in the window now.
    pub count: u32,
    /// The address's tokens are refused unasked from this count.
    pub limit: u32,
    /// The window's length in milliseconds.
    pub window_ms: u64,
}

impl SubjectState {
    /// When the last of the subject's blocks ends: its lock (an IP's login
    /// block, a prefix's or country's pumping block) or, for a user, the
    /// lock of one of its (user, IP) pairs. None when nothing refuses it.
    pub fn blocked_until(&self) -> Option<DateTime<Utc>> {
        let pairs = self.pairs.iter().filter_map(|p| p.locked_until);
        self.locked_until.into_iter().chain(pairs).max()
    }
}

/// One (user, IP) pair of a user: its failures and lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"ip": "203.0.113.7", "rule": "user_ip 10/1h", "count": 10, "limit": 10,
    "window_ms": 3600000, "locked_until": "2026-11-02T08:30:30.123Z"}))]
pub struct PairState {
    /// The IP (an IPv6 /64), or `unknown` for logins that named none.
    pub ip: String,
    /// The pair's lock rule, `user_ip <limit>/<window>`.
    pub rule: String,
    /// The pair's failures in the lock window.
    pub count: u32,
    /// Failures that lock the pair.
    pub limit: u32,
    /// The lock window's length in milliseconds.
    pub window_ms: u64,
    /// When the pair's lock ends; null when it is not locked.
    #[schema(required = true)]
    pub locked_until: Option<DateTime<Utc>>,
}

/// The most pairs a subject's state lists.
const PAIRS_SHOWN: usize = 50;

/// How many of a user's pair locks one state read asks the store for at
/// once: the overview reads several users' states together, and 50 pairs
/// each at once made a page load over a thousand calls in flight.
const PAIR_READS_AT_ONCE: usize = 8;

/// A subject's live state for the admin API and console, and unblocking it.
pub struct SubjectAdmin {
    ctx: GuardContext,
}

/// The windows an admin sees for one (subject, action): enforced rules and
/// captcha tiers, each with the rule that defines it.
struct Watched {
    action: Action,
    rules: Vec<(Rule, WindowSpec)>,
}

/// The windows the rulebook gives `kind`, per action. A user's windows
/// come with its lock from one `login_state` call, and an address's failed
/// admin authentications are not shown; a country has no windows, only the
/// pumping guard's counts.
fn watched(policy: &Policy, kind: SubjectKind) -> Vec<Watched> {
    let watched = policy.actions_of(kind).filter_map(|action| {
        let rules = match policy.rules_for(action, kind)? {
            Windows::Counted(rules) => rules.pairs().collect(),
            Windows::LoginIp(rules) => rules.pairs().to_vec(),
            Windows::LoginUser | Windows::AdminAuth => return None,
        };
        Some(Watched { action, rules })
    });
    watched.collect()
}

/// One window's live count against its rule.
fn window_state(action: Action, rule: &Rule, count: u32) -> WindowState {
    WindowState {
        action,
        rule: rule.name(),
        count,
        limit: rule.limit,
        window_ms: rule.window_ms(),
        shadow: rule.shadow,
    }
}

/// `ms` from now, to the millisecond.
fn in_ms(ms: u64) -> DateTime<Utc> {
    // Settings keep waits within a century; a store's answer past what the
    // calendar holds says "the end of time", not a panic.
    let wait = i64::try_from(ms)
        .ok()
        .and_then(chrono::Duration::try_milliseconds)
        .unwrap_or(chrono::Duration::MAX);
    Utc::now()
        .checked_add_signed(wait)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
        .trunc_subsecs(3)
}

impl SubjectAdmin {
    /// Over the store, keys, audit sink and policy the guards share.
    pub fn new(ctx: GuardContext) -> Self {
        Self { ctx }
    }

    /// `sms.prefix_digits` as in force: how phones are cut into prefixes.
    pub fn prefix_digits(&self) -> u32 {
        self.ctx.policy.current().sms.settings.prefix_digits
    }

    /// Why an unblock of `subject` would lift nothing: a prefix of another
    /// length than `sms.prefix_digits`, or a network of another length than
    /// `sms.network_bits` and the admin sign-in throttle's /48, which no
    /// limit counts (the subject page shows such a subject empty; an
    /// unblock of it would answer and be audited as done while the block
    /// counted under the right length stays).
    fn counts_nothing(&self, subject: &Subject) -> Option<String> {
        let settings = &self.ctx.policy.current().sms.settings;
        match subject.kind {
            SubjectKind::Prefix => {
                let digits = subject.id.trim_start_matches('+').len();
                (digits != settings.prefix_digits as usize).then(|| {
                    format!(
                        "a prefix has {} digits here (sms.prefix_digits): no limit counts one of {digits}",
                        settings.prefix_digits
                    )
                })
            }
            SubjectKind::Network => {
                let bits = subject
                    .id
                    .rsplit_once('/')
                    .and_then(|(_, bits)| bits.parse::<u8>().ok());
                let counted = [settings.network_bits, super::admin_auth::NETWORK_BITS];
                (!bits.is_some_and(|bits| counted.contains(&bits))).then(|| {
                    format!(
                        "networks are counted as /{} (sms.network_bits) and /{} (admin sign-ins) here",
                        settings.network_bits,
                        super::admin_auth::NETWORK_BITS
                    )
                })
            }
            _ => None,
        }
    }

    /// What the store holds for `subject` now; reads only, counts nothing.
    pub async fn state(&self, subject: &Subject) -> Result<SubjectState, StoreError> {
        let policy = self.ctx.policy.current();
        let mut state = SubjectState {
            kind: subject.kind,
            id: subject.id.clone(),
            locked_until: None,
            captcha_required: false,
            windows: Vec::new(),
            pairs: Vec::new(),
            pumping: None,
            refused_captcha_tokens: None,
        };
        if subject.kind == SubjectKind::User {
            self.user_state(subject, &policy, &mut state).await?;
            return Ok(state);
        }
        self.window_states(subject, &policy, &mut state).await?;
        if subject.kind == SubjectKind::Ip && policy.captcha.checks_tokens() {
            let rule = policy.failed_tokens;
            state.refused_captcha_tokens = Some(RefusedTokens {
                rule: captcha_tokens::refused_rule_name(&rule),
                count: self.ctx.refused_tokens(&policy, &subject.id).await?,
                limit: rule.limit,
                window_ms: rule.window_ms(),
            });
        }
        if let Some(policy) = policy.sms.pumping.as_ref().and_then(|p| p.of(subject.kind)) {
            let live = self.pumping_state(subject, policy).await?;
            if let Some(block) = live.block.as_ref().filter(|b| !b.shadow) {
                state.locked_until = Some(block.until);
            }
            if live.challenge.as_ref().is_some_and(|c| !c.shadow) {
                state.captcha_required = true;
            }
            state.pumping = Some(live);
        }
        Ok(state)
    }

    /// A user's failures, lock and pairs, from the store's login reads.
    async fn user_state(
        &self,
        user: &Subject,
        policy: &Policy,
        state: &mut SubjectState,
    ) -> Result<(), StoreError> {
        let keys = &self.ctx.keys;
        let window_key = keys.subject_window(user, Action::LoginAttempt);
        let lock_key = keys.subject_lock(user);
        let login = self
            .ctx
            .store
            .login_state(
                &window_key,
                &lock_key,
                None,
                &policy.login.store,
                policy.login.shadow,
            )
            .await?;
        let rules = &policy.login;
        state.windows = vec![
            window_state(Action::LoginAttempt, &rules.user_captcha, login.failures),
            window_state(
                Action::LoginAttempt,
                &rules.user_lock,
                login.lock_window_failures,
            ),
        ];
        state.captcha_required = login.failures >= rules.user_captcha.limit;
        state.locked_until = login.locked_retry_after_ms.map(in_ms);
        state.pairs = self.pairs(user, policy, in_ms).await?;
        Ok(())
    }

    /// The subject's windows as the rulebook gives them, peeked.
    async fn window_states(
        &self,
        subject: &Subject,
        policy: &Policy,
        state: &mut SubjectState,
    ) -> Result<(), StoreError> {
        let keys = &self.ctx.keys;
        let watched: Vec<Watched> = watched(policy, subject.kind)
            .into_iter()
            .filter(|w| !w.rules.is_empty())
            .collect();
        let peeks = futures::future::try_join_all(watched.iter().map(|w| {
            let key = keys.subject_window(subject, w.action);
            let specs: Vec<WindowSpec> = w.rules.iter().map(|(_, spec)| *spec).collect();
            async move { self.ctx.store.peek(&key, &specs).await }
        }))
        .await?;
        for (w, peek) in watched.iter().zip(&peeks) {
            for (i, (rule, spec)) in w.rules.iter().enumerate() {
                let count = peek.counts.get(i).copied().unwrap_or(0);
                let full = count >= rule.limit;
                if full && spec.mode == WindowMode::Gate {
                    state.captcha_required = true;
                }
                // An IP is blocked while its login failures fill the block window.
                if full && w.action == Action::LoginAttempt && *rule == policy.login.ip.block {
                    state.locked_until =
                        Some(in_ms(peek.retry_after_ms.get(i).copied().unwrap_or(0)));
                }
                state.windows.push(window_state(w.action, rule, count));
            }
        }
        Ok(())
    }

    /// A user's live pairs, newest first, when failures lock pairs.
    async fn pairs(
        &self,
        user: &Subject,
        policy: &Policy,
        until: impl Fn(u64) -> DateTime<Utc>,
    ) -> Result<Vec<PairState>, StoreError> {
        let Some(rule) = policy.login.pair_lock else {
            return Ok(Vec::new());
        };
        let (keys, store) = (&self.ctx.keys, &self.ctx.store);
        let window_key = keys.subject_window(user, Action::LoginAttempt);
        let keep = policy
            .login
            .store
            .captcha_after
            .max(policy.login.store.lock_after) as usize;
        let index_key = keys.pair_index(&user.id);
        let (recent, locked) = futures::try_join!(
            store.recent_members(&window_key, rule.window_ms(), keep),
            store.index_members(&index_key, PAIRS_SHOWN),
        )?;
        // The pairs with failures in the window, newest first, then the
        // locked ones whose failures have left it.
        let mut counts: Vec<(String, u32)> = Vec::new();
        for ip in recent.iter().filter_map(|m| pair_of_member(m)) {
            match counts.iter_mut().find(|(seen, _)| seen == ip) {
                Some((_, n)) => *n += 1,
                None => counts.push((ip.to_string(), 1)),
            }
        }
        for ip in locked {
            if !counts.iter().any(|(seen, _)| *seen == ip) {
                counts.push((ip, 0));
            }
        }
        counts.truncate(PAIRS_SHOWN);
        let user_lock = keys.subject_lock(user);
        let locks: Vec<_> = futures::stream::iter(counts.iter().map(|(ip, _)| {
            let pair_lock = keys.pair_lock(&user.id, ip);
            let (window_key, user_lock) = (&window_key, &user_lock);
            async move {
                store
                    .login_state(
                        window_key,
                        user_lock,
                        Some(&pair_lock),
                        &policy.login.store,
                        policy.login.shadow,
                    )
                    .await
            }
        }))
        .buffered(PAIR_READS_AT_ONCE)
        .try_collect()
        .await?;
        let pairs = counts
            .into_iter()
            .zip(locks)
            .filter_map(|((ip, count), live)| {
                let locked_until = live.pair_locked_retry_after_ms.map(&until);
                (count > 0 || locked_until.is_some()).then(|| PairState {
                    ip,
                    rule: rule.name(),
                    count,
                    limit: rule.limit,
                    window_ms: rule.window_ms(),
                    locked_until,
                })
            });
        Ok(pairs.collect())
    }

    /// Whether the pumping guard lists `subject` as blocked now.
    async fn listed_as_blocked(&self, subject: &Subject) -> Result<bool, StoreError> {
        if !pumping::counts(subject.kind) {
            return Ok(false);
        }
        let member = pumping::listed_member(subject);
        let listed = self
            .ctx
            .store
            .expiring_members(&self.ctx.keys.conversion_blocks(), LISTED_BLOCKS_READ)
            .await?;
        Ok(listed.members.iter().any(|(m, _)| *m == member))
    }

    /// Clear every window and the lock of a subject (a phone's pending or burnt
    /// code too, a user's pairs, an IP's refused captcha tokens, a prefix's or
    /// country's pumping counts and block); audited as `unblock`. A subject
    /// no limit counts is refused, but for a prefix blocked under an
    /// earlier `sms.prefix_digits`, still listed until its block ends.
    /// Done once it answers `Ok`: the caller reads the new state apart, so a
    /// read that fails afterwards cannot pass for an unblock not done.
    pub async fn unblock(&self, subject: &Subject, info: &RequestInfo) -> Result<(), UnblockError> {
        if let Some(why) = self.counts_nothing(subject) {
            if !self.listed_as_blocked(subject).await? {
                return Err(UnblockError::CountsNothing(why));
            }
        }
        let keys = &self.ctx.keys;
        // Each window's log and the meters beside it (GCRA windows).
        let policy = self.ctx.policy.current();
        let mut doomed: Vec<String> = policy
            .actions_of(subject.kind)
            .map(|action| keys.subject_window(subject, action))
            .flat_map(|key| [Keys::meter_of(&key), key])
            .collect();
        doomed.push(keys.subject_lock(subject));
        if subject.kind == SubjectKind::Ip {
            // Its refused captcha tokens (`captcha.failed_token_limit`).
            doomed.push(keys.window(subject.kind.as_str(), &subject.id, captcha_tokens::REFUSED));
        }
        if subject.kind.is_callers_own() {
            // Its failed deliveries (`sms.failed_delivery_limit`).
            doomed.push(keys.window(
                subject.kind.as_str(),
                &subject.id,
                super::sms::FAILED_DELIVERIES,
            ));
        }
        if subject.kind == SubjectKind::Phone {
            doomed.push(keys.subject_code(subject));
        }
        if subject.kind == SubjectKind::User {
            let index = keys.pair_index(&subject.id);
            let ips = self.ctx.store.index_members(&index, usize::MAX).await?;
            // A pair's failures are the user's (deleted above); its lock is
            // in the index of locked pairs. The index itself stays: a pair
            // that locks between this read and the delete is added to it,
            // so it stays shown and a second unblock finds it (deleting the
            // index hid it for up to `lock_max_duration`). Entries of
            // lifted locks show nothing and age out with the index.
            for ip in ips {
                doomed.push(keys.pair_lock(&subject.id, &ip));
            }
        }
        if pumping::counts(subject.kind) {
            doomed.push(keys.subject_conversion(subject));
        }
        self.ctx.store.delete(&doomed).await?;
        if pumping::counts(subject.kind) {
            // After the counts and block are gone: a delete that failed
            // leaves the block in force and listed, not in force and hidden.
            // Failing now, the unblock is done all the same (and audited):
            // the listing ages out with the block it named.
            let member = pumping::listed_member(subject);
            if let Err(e) = self
                .ctx
                .store
                .expiring_remove(&keys.conversion_blocks(), &member)
                .await
            {
                tracing::warn!(error = %e, subject = %subject.kind.as_str(), "an unblocked range stays listed as blocked until its block would have ended");
            }
        }
        let event = AuditEvent::new(
            Action::Admin,
            AuditDecision::Unblock,
            Reason::AdminUnblock,
            subject,
        );
        self.ctx.audit(info, event);
        Ok(())
    }
}

/// Why an unblock was not done.
#[derive(Debug, thiserror::Error)]
pub enum UnblockError {
    /// The subject is of a length no limit counts (404 `not_found`):
    /// its unblock would lift nothing and be audited as done.
    #[error("{0}")]
    CountsNothing(String),
    /// The store did not answer (503 `store_unavailable`).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How many listed pumping blocks an unblock reads to find its subject's.
const LISTED_BLOCKS_READ: usize = 10_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_past_the_calendar_is_its_end_not_a_panic() {
        for ms in [u64::MAX, i64::MAX as u64, 200_000_000 * 86_400_000] {
            assert_eq!(in_ms(ms), DateTime::<Utc>::MAX_UTC.trunc_subsecs(3), "{ms}");
        }
        let soon = in_ms(1_000) - Utc::now();
        assert!(soon <= chrono::Duration::seconds(1) && soon > chrono::Duration::zero());
    }
}
