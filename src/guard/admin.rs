//! What admins see of a subject's live state, and lifting its blocks.

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;

use super::{pumping, GuardContext, Policy, RequestInfo, SubjectRules};
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, Reason, Rule, Subject, SubjectKind};
use crate::store::{
    pair_of_member, ConversionPolicy, Keys, RuleWindow, StoreError, WindowMode, WindowSpec,
};

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

/// What the SMS pumping guard counts for a prefix or a country
/// (`sms.pumping`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"sends": 7, "verified": 2, "min_sends": 20, "window_ms": 3600000,
    "rule": "prefix conversion 2/7 (28.6%) < 20% per 1h"}))]
pub struct PumpingState {
    /// Codes sent in the window, counted in slices of a twelfth of it (the
    /// oldest slice may be partly out of the window).
    pub sends: u32,
    /// Codes verified in the window, counted the same way.
    pub verified: u32,
    /// Sends in the window below which nothing is blocked.
    pub min_sends: u32,
    /// The window's length in milliseconds.
    pub window_ms: u64,
    /// These figures against the threshold, as audit rows word them.
    pub rule: String,
    /// The block, while one lasts; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub block: Option<PumpingBlock>,
}

/// A prefix or country blocked by the SMS pumping guard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PumpingBlock {
    /// When the block ends.
    pub until: DateTime<Utc>,
    /// The codes sent that blocked it.
    pub sends: u32,
    /// How many of them were verified.
    pub verified: u32,
    /// Those figures against the threshold (`prefix conversion 3/20 (15%) < 20% per 1h`).
    pub rule: String,
    /// Decided in shadow mode: audited, never enforced.
    pub shadow: bool,
}

/// A block in the console's list: the subject and when its block ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedBlock {
    /// The prefix or country.
    pub subject: Subject,
    /// When the block ends.
    pub until: DateTime<Utc>,
}

/// A subject's live state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
    /// (`sms.captcha_after`, `login.captcha_after`, `login.ip_captcha_after`).
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

fn watched(policy: &Policy, kind: SubjectKind) -> Vec<Watched> {
    let sms = |rules: &SubjectRules| Watched {
        action: Action::SmsSend,
        rules: rules.pairs().collect(),
    };
    match kind {
        SubjectKind::Phone => vec![sms(&policy.sms_phone)],
        SubjectKind::Prefix => vec![sms(&policy.sms_prefix)],
        SubjectKind::Global => vec![sms(&policy.sms_global)],
        SubjectKind::Ip => vec![
            sms(&policy.sms_ip),
            Watched {
                action: Action::LoginAttempt,
                rules: vec![
                    (policy.ip_captcha, policy.ip_captcha.gate()),
                    (policy.ip_block, policy.ip_block.enforce()),
                ],
            },
        ],
        // A user's windows come with its lock from one `login_state` call;
        // a country has no windows, only the pumping guard's counts.
        SubjectKind::User | SubjectKind::Country => Vec::new(),
    }
}

/// `ms` from now, to the millisecond.
fn in_ms(ms: u64) -> DateTime<Utc> {
    (Utc::now() + chrono::Duration::milliseconds(ms as i64)).trunc_subsecs(3)
}

/// The actions whose windows a subject kind can have.
fn actions(kind: SubjectKind) -> &'static [Action] {
    match kind {
        SubjectKind::Phone | SubjectKind::Prefix | SubjectKind::Global => &[Action::SmsSend],
        SubjectKind::Ip => &[Action::SmsSend, Action::LoginAttempt],
        SubjectKind::User => &[Action::LoginAttempt],
        SubjectKind::Country => &[],
    }
}

impl SubjectAdmin {
    /// Over the store, keys, audit sink and policy the guards share.
    pub fn new(ctx: GuardContext) -> Self {
        Self { ctx }
    }

    /// `sms.prefix_digits` as in force: how phones are cut into prefixes.
    pub fn prefix_digits(&self) -> u32 {
        self.ctx.policy.current().sms.prefix_digits
    }

    /// What the store holds for `subject` now; reads only, counts nothing.
    pub async fn state(&self, subject: &Subject) -> Result<SubjectState, StoreError> {
        let policy = self.ctx.policy.current();
        let keys = &self.ctx.keys;
        let until = in_ms;
        let window = |action: Action, rule: &Rule, count: u32| WindowState {
            action,
            rule: rule.name(),
            count,
            limit: rule.limit,
            window_ms: rule.window_ms(),
            shadow: rule.shadow,
        };
        let mut state = SubjectState {
            kind: subject.kind,
            id: subject.id.clone(),
            locked_until: None,
            captcha_required: false,
            windows: Vec::new(),
            pairs: Vec::new(),
            pumping: None,
        };

        if subject.kind == SubjectKind::User {
            let window_key = keys.subject_window(subject, Action::LoginAttempt);
            let lock_key = keys.subject_lock(subject);
            let login = self
                .ctx
                .store
                .login_state(&window_key, &lock_key, None, &policy.login_store)
                .await?;
            state.windows = vec![
                window(Action::LoginAttempt, &policy.user_captcha, login.failures),
                window(
                    Action::LoginAttempt,
                    &policy.user_lock,
                    login.lock_window_failures,
                ),
            ];
            state.captcha_required = login.failures >= policy.user_captcha.limit;
            state.locked_until = login.locked_retry_after_ms.map(until);
            state.pairs = self.pairs(subject, &policy, until).await?;
            return Ok(state);
        }

        let watched = watched(&policy, subject.kind);
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
                if full && w.action == Action::LoginAttempt && *rule == policy.ip_block {
                    state.locked_until =
                        Some(until(peek.retry_after_ms.get(i).copied().unwrap_or(0)));
                }
                state.windows.push(window(w.action, rule, count));
            }
        }
        if let (Some(policy), true) = (&policy.pumping, pumping::counts(subject.kind)) {
            let live = self.pumping_state(subject, policy).await?;
            if let Some(block) = live.block.as_ref().filter(|b| !b.shadow) {
                state.locked_until = Some(block.until);
            }
            state.pumping = Some(live);
        }
        Ok(state)
    }

    /// A user's live pairs, newest first, when failures lock pairs.
    async fn pairs(
        &self,
        user: &Subject,
        policy: &Policy,
        until: impl Fn(u64) -> DateTime<Utc>,
    ) -> Result<Vec<PairState>, StoreError> {
        let Some(rule) = policy.pair_lock else {
            return Ok(Vec::new());
        };
        let (keys, store) = (&self.ctx.keys, &self.ctx.store);
        let window_key = keys.subject_window(user, Action::LoginAttempt);
        let keep = policy
            .login_store
            .captcha_after
            .max(policy.login_store.lock_after) as usize;
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
        let locks = futures::future::try_join_all(counts.iter().map(|(ip, _)| {
            let pair_lock = keys.pair_lock(&user.id, ip);
            let (window_key, user_lock) = (&window_key, &user_lock);
            async move {
                store
                    .login_state(window_key, user_lock, Some(&pair_lock), &policy.login_store)
                    .await
            }
        }))
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

    /// A prefix's or country's conversion and block, as the store has them.
    async fn pumping_state(
        &self,
        subject: &Subject,
        policy: &ConversionPolicy,
    ) -> Result<PumpingState, StoreError> {
        let key = self.ctx.keys.subject_conversion(subject);
        let live = self.ctx.store.conversion_state(&key, policy).await?;
        let describe = |sent, verified| pumping::describe(subject.kind, sent, verified, policy);
        Ok(PumpingState {
            sends: live.events,
            verified: live.successes,
            min_sends: policy.min_events,
            window_ms: policy.window_ms,
            rule: describe(live.events, live.successes),
            block: live.block.map(|b| PumpingBlock {
                until: in_ms(b.retry_after_ms),
                sends: b.events,
                verified: b.successes,
                rule: describe(b.events, b.successes),
                shadow: b.shadow,
            }),
        })
    }

    /// The prefixes and countries the pumping guard has blocked (not in
    /// shadow mode), latest-ending first, at most `limit`; and how many
    /// there are.
    pub async fn pumping_blocks(
        &self,
        limit: usize,
    ) -> Result<(Vec<ListedBlock>, u64), StoreError> {
        let index = self.ctx.keys.conversion_blocks();
        let listed = self.ctx.store.expiring_members(&index, limit).await?;
        let blocks = listed
            .members
            .iter()
            .filter_map(|(member, retry_ms)| {
                Some(ListedBlock {
                    subject: pumping::listed_subject(member)?,
                    until: in_ms(*retry_ms),
                })
            })
            .collect();
        Ok((blocks, listed.total))
    }

    /// Clear every window and the lock of a subject (a phone's pending or burnt
    /// code too, a user's pairs, a prefix's or country's pumping counts and
    /// block); audited as `unblock`.
    pub async fn unblock(
        &self,
        subject: &Subject,
        info: &RequestInfo,
    ) -> Result<SubjectState, StoreError> {
        let keys = &self.ctx.keys;
        // Each window's log and the meters beside it (GCRA windows).
        let mut doomed: Vec<String> = actions(subject.kind)
            .iter()
            .map(|action| keys.subject_window(subject, *action))
            .flat_map(|key| [Keys::meter_of(&key), key])
            .collect();
        doomed.push(keys.subject_lock(subject));
        if subject.kind == SubjectKind::Phone {
            doomed.push(keys.subject_code(subject));
        }
        if subject.kind == SubjectKind::User {
            let index = keys.pair_index(&subject.id);
            let ips = self.ctx.store.index_members(&index, usize::MAX).await?;
            // A pair's failures are the user's (deleted above); its lock is
            // in the index of locked pairs.
            for ip in ips {
                doomed.push(keys.pair_lock(&subject.id, &ip));
            }
            doomed.push(index);
        }
        if pumping::counts(subject.kind) {
            doomed.push(keys.subject_conversion(subject));
            let member = pumping::listed_member(subject);
            self.ctx
                .store
                .expiring_remove(&keys.conversion_blocks(), &member)
                .await?;
        }
        self.ctx.store.delete(&doomed).await?;
        let event = AuditEvent::new(
            Action::Admin,
            AuditDecision::Unblock,
            Reason::AdminUnblock,
            subject,
        );
        self.ctx.audit(info, event);
        self.state(subject).await
    }
}
