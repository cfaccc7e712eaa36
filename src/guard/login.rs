//! `POST /login/check` and `POST /login/attempt`: per-user captcha and
//! escalating locks, per-IP captcha and block across users. The guard asks
//! the store, `decision` says what that comes to, and the guard applies it.

mod decision;
mod rule_hits;

use std::sync::Arc;

use serde::Serialize;

use super::{
    ceil_secs, GuardContext, Lookup, Policy, ProofCheck, RequestInfo, TokenThrottle, Windows,
};
use crate::captcha::CaptchaProof;
use crate::delivery::email::{LockNotice, LockNotifier};
use crate::domain::{Action, EmailAddress, Locale, Reason, Subject, SubjectKind, Username};
use crate::lists::{EntryKind, Listed};
use crate::store::{
    IpFailureWindow, LoginOutcome, LoginRequest, LoginVerdict, NetworkFailureWindow, NetworkLimits,
    PairKeys, PeekOutcome, StoreError, WindowSpec,
};
use decision::AttemptDecision;

/// What the login flow should do with the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoginDecision {
    /// Nothing stops the login; on `/login/attempt`, the outcome was recorded.
    Allow,
    /// Refuse this attempt and show a captcha.
    Challenge,
    /// Refuse: the user is locked, the IP blocked, or the address's
    /// captcha tokens refused too often (`rate_limited`).
    Deny,
}

/// The answer of both login endpoints (DESIGN.md §3 `LoginState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"decision": "deny", "captcha_required": true, "locked": true,
    "retry_after_secs": 900, "failures": 10, "reason": "user_locked"}))]
pub struct LoginState {
    /// `allow`: go on; `challenge`: refuse this attempt and show a captcha;
    /// `deny`: refuse it, the user is locked, the IP blocked, or the
    /// address's refused captcha tokens fill `captcha.failed_token_limit`.
    pub decision: LoginDecision,
    /// Whether the next attempt needs a passed captcha.
    pub captcha_required: bool,
    /// Whether the user is locked.
    pub locked: bool,
    /// Seconds until the lock or IP block ends; null when there is none.
    #[schema(required = true)]
    pub retry_after_secs: Option<u64>,
    /// The user's failures in `login.captcha_window`.
    pub failures: u32,
    /// `user_locked`, `ip_blocked`, `captcha_required`, or `rate_limited`
    /// (refused captcha tokens); null on `allow`.
    #[schema(required = true, value_type = Option<String>, example = "user_locked")]
    pub reason: Option<Reason>,
}

impl LoginState {
    fn allow(failures: u32) -> Self {
        Self {
            decision: LoginDecision::Allow,
            captcha_required: false,
            locked: false,
            retry_after_secs: None,
            failures,
            reason: None,
        }
    }

    fn deny(denial: Denial) -> Self {
        Self {
            decision: LoginDecision::Deny,
            captcha_required: denial.captcha_required,
            locked: denial.locked,
            retry_after_secs: Some(ceil_secs(denial.retry_after_ms)),
            failures: denial.failures,
            reason: Some(denial.reason),
        }
    }

    fn challenge(failures: u32) -> Self {
        Self {
            decision: LoginDecision::Challenge,
            captcha_required: true,
            locked: false,
            retry_after_secs: None,
            failures,
            reason: Some(Reason::CaptchaRequired),
        }
    }
}

/// A refused attempt, as its answer tells it.
struct Denial {
    /// `user_locked`, `ip_blocked` or `rate_limited`.
    reason: Reason,
    /// Whether the user is locked (an IP's block may refuse a locked user).
    locked: bool,
    /// Until the lock or block ends.
    retry_after_ms: u64,
    /// The user's failures in `login.captcha_window`.
    failures: u32,
    /// Whether the next attempt needs a passed captcha.
    captcha_required: bool,
}

/// Why a login call was refused outright, rather than answered with a
/// `LoginState`.
#[derive(Debug, thiserror::Error)]
pub enum LoginRefusal {
    /// The user or IP is on the block list (403 `blocklisted`).
    #[error("the {} is on the block list", .0.as_str())]
    Blocklisted(EntryKind),
    /// The store could not answer (503 `store_unavailable`).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One reported login outcome, parsed.
pub struct LoginAttempt {
    /// Whose login it was.
    pub user: Username,
    /// Whether the password was right.
    pub success: bool,
    /// The captcha proof the attempt carries, if any.
    pub captcha: CaptchaProof,
    /// Where to tell the account's owner if this attempt locks the account.
    pub notify_email: Option<EmailAddress>,
    /// Locale of that notice.
    pub locale: Option<Locale>,
}

/// What recording an attempt came to.
enum Recorded {
    /// The store's outcome, to decide on.
    Decided(LoginOutcome),
    /// Challenged, with a token refused unasked: the address's refused
    /// tokens fill `captcha.failed_token_limit`, or as many are out.
    Throttled(TokenThrottle, LoginOutcome),
}

/// The login decisions; also mails an account's owner when it is locked.
pub struct LoginGuard {
    ctx: GuardContext,
    notifier: Arc<dyn LockNotifier>,
}

/// The pair of a login whose client IP is not known.
pub const UNKNOWN_IP: &str = "unknown";

/// The key names of one (user, IP) pair.
struct PairKeyNames {
    lock: String,
    index: String,
    ip: String,
}

impl PairKeyNames {
    fn keys(&self) -> PairKeys<'_> {
        PairKeys {
            lock_key: &self.lock,
            index_key: &self.index,
            ip: &self.ip,
        }
    }
}

/// The IP's failure windows for this attempt (`IpLoginRules::windows`).
struct IpWindows {
    subject: Subject,
    key: String,
    windows: [WindowSpec; 2],
}

/// An IPv6 client's network's failure window for this attempt: its captcha
/// tier (`LoginRules::network_limits`).
struct NetworkWindow {
    subject: Subject,
    key: String,
    limits: NetworkLimits,
}

impl NetworkWindow {
    fn store_window(&self) -> NetworkFailureWindow<'_> {
        NetworkFailureWindow {
            key: &self.key,
            limits: self.limits,
        }
    }
}

impl LoginGuard {
    /// `notifier` sends the lock notices.
    pub fn new(ctx: GuardContext, notifier: Arc<dyn LockNotifier>) -> Self {
        Self { ctx, notifier }
    }

    /// The user's failure window and lock keys, from the normalised name
    /// (no `Subject` needed: `check` would build one for nothing).
    fn user_keys(&self, user: &str) -> (String, String) {
        let (keys, kind) = (&self.ctx.keys, SubjectKind::User.as_str());
        (
            keys.window(kind, user, Action::LoginAttempt.as_str()),
            keys.lock(kind, user),
        )
    }

    /// The (user, IP) pair's keys when failures lock pairs; an attempt
    /// without an IP counts under the IP `unknown`. The IP's windows, when
    /// it has some, hold its id already (written out, about 360
    /// instructions).
    fn pair_keys(
        &self,
        policy: &Policy,
        user: &str,
        info: &RequestInfo,
        windows: Option<&IpWindows>,
    ) -> Option<PairKeyNames> {
        policy.login.pair_lock?;
        let ip = match windows {
            Some(windows) => windows.subject.id.clone(),
            None => info
                .client_ip()
                .map_or_else(|| UNKNOWN_IP.to_string(), |ip| ip.subject_id()),
        };
        let keys = &self.ctx.keys;
        Some(PairKeyNames {
            lock: keys.pair_lock(user, &ip),
            index: keys.pair_index(user),
            ip,
        })
    }

    /// The client IP's windows, as the rulebook has them; none when the
    /// IP is not known.
    fn ip_windows(&self, policy: &Policy, info: &RequestInfo) -> Option<IpWindows> {
        let Some(Windows::LoginIp(rules)) = policy.rules_for(Action::LoginAttempt, SubjectKind::Ip)
        else {
            return None;
        };
        let subject = Subject::new(SubjectKind::Ip, info.client_ip()?.subject_id());
        Some(IpWindows {
            key: self.ctx.keys.subject_window(&subject, Action::LoginAttempt),
            subject,
            windows: rules.windows(),
        })
    }

    /// The client's network's window, when the client is IPv6 and the
    /// network's captcha tier is on.
    fn network_window(&self, policy: &Policy, info: &RequestInfo) -> Option<NetworkWindow> {
        let limits = policy.login.network_limits()?;
        let id = info
            .client_ip()?
            .network_id(policy.sms.settings.network_bits)?;
        let subject = Subject::new(SubjectKind::Network, id);
        Some(NetworkWindow {
            key: self.ctx.keys.subject_window(&subject, Action::LoginAttempt),
            subject,
            limits,
        })
    }

    async fn peek_ip(&self, ip: Option<&IpWindows>) -> Result<Option<PeekOutcome>, StoreError> {
        match ip {
            Some(ip) => Ok(Some(self.ctx.store.peek(&ip.key, &ip.windows).await?)),
            None => Ok(None),
        }
    }

    /// The network's failures in its window, when it has one.
    async fn peek_network(
        &self,
        network: Option<&NetworkWindow>,
    ) -> Result<Option<u32>, StoreError> {
        let Some(network) = network else {
            return Ok(None);
        };
        let windows = network.store_window().windows();
        let peek = self.ctx.store.peek(&network.key, &windows).await?;
        Ok(Some(peek.counts.first().copied().unwrap_or(0)))
    }

    /// Read-only: what an attempt would meet now.
    pub async fn check(
        &self,
        user: &Username,
        info: &RequestInfo,
    ) -> Result<LoginState, LoginRefusal> {
        let policy = self.ctx.policy.current();
        if let Some(allowed) = self.listed(user.as_str(), &policy, info, Lookup::Peek)? {
            return Ok(allowed);
        }
        let (window_key, lock_key) = self.user_keys(user.as_str());
        let ip = self.ip_windows(&policy, info);
        let network = self.network_window(&policy, info);
        let pair = self.pair_keys(&policy, user.as_str(), info, ip.as_ref());
        let (user_state, ip_state, network_count) = futures::try_join!(
            self.ctx.store.login_state(
                &window_key,
                &lock_key,
                pair.as_ref().map(|p| p.lock.as_str()),
                &policy.login.store,
                policy.login.shadow,
            ),
            self.peek_ip(ip.as_ref()),
            self.peek_network(network.as_ref()),
        )?;
        let seen = decision::Checked {
            user: &user_state,
            ip: ip_state.as_ref(),
            network: network_count,
        };
        Ok(decision::check(&policy, seen))
    }

    /// Evaluate and record one login outcome (DESIGN.md §3, in order).
    pub async fn attempt(
        &self,
        attempt: LoginAttempt,
        info: &RequestInfo,
    ) -> Result<LoginState, LoginRefusal> {
        let policy = self.ctx.policy.current();
        let user = Subject::new(SubjectKind::User, attempt.user.as_str());
        if let Some(allowed) = self.listed(&user.id, &policy, info, Lookup::Attempt)? {
            return Ok(allowed);
        }
        let ip = self.ip_windows(&policy, info);
        let network = self.network_window(&policy, info);
        let recorded = self
            .record(
                &attempt,
                &user,
                &policy,
                (ip.as_ref(), network.as_ref()),
                info,
            )
            .await?;
        let outcome = match recorded {
            Recorded::Decided(outcome) => outcome,
            Recorded::Throttled(throttle, outcome) => {
                rule_hits::count(&policy, &outcome);
                return Ok(self.token_throttled(throttle, &outcome, info));
            }
        };
        rule_hits::count(&policy, &outcome);
        let facts = decision::Attempt {
            user: &user,
            ip: ip.as_ref(),
            network: network.as_ref().map(|n| &n.subject),
            success: attempt.success,
        };
        let decided = decision::attempt(&policy, &outcome, facts);
        Ok(self.apply(decided, attempt, info))
    }

    /// What the lists say, when it decides the answer: a block refuses
    /// (unless in shadow mode, where it is only audited); an allow answers
    /// `allow`, never captcha-gated or locked, and counts nothing.
    fn listed(
        &self,
        user: &str,
        policy: &Policy,
        info: &RequestInfo,
        lookup: Lookup,
    ) -> Result<Option<LoginState>, LoginRefusal> {
        let shadow = policy.login.shadow;
        let subject = (SubjectKind::User, user);
        let listing = self.ctx.listed(Action::LoginAttempt, info, subject, lookup);
        if let Some(row) = listing.row {
            self.ctx.audit(info, row.shadow(shadow));
        }
        match listing.listed {
            Listed::Blocked(kind) if !shadow => Err(LoginRefusal::Blocklisted(kind)),
            Listed::Allowed(_) => Ok(Some(LoginState::allow(0))),
            _ => Ok(None),
        }
    }

    /// The store decides the user, the IP and an IPv6 client's network
    /// together, in one call where it can. A captcha token goes to the provider
    /// only when it can change the answer: the attempt is challenged and
    /// nothing else refuses it (a blocked IP spraying tokens costs no provider
    /// calls), and the address's refused tokens leave room in
    /// `captcha.failed_token_limit` (else the attempt is refused unasked:
    /// `Recorded::Throttled`). The store records nothing for a challenged
    /// attempt, so it is asked again once the token passed. In shadow mode
    /// the store records on the first call: the token is checked first.
    async fn record(
        &self,
        attempt: &LoginAttempt,
        user: &Subject,
        policy: &Policy,
        (ip, network): (Option<&IpWindows>, Option<&NetworkWindow>),
        info: &RequestInfo,
    ) -> Result<Recorded, StoreError> {
        let (window_key, lock_key) = self.user_keys(&user.id);
        let ask_later = policy.captcha.asks_provider(&attempt.captcha) && !policy.login.shadow;
        let captcha_passed = !ask_later
            && attempt.captcha.offered()
            // Boxed, as below: the rare captcha path stays out of every
            // attempt's future (moved whole into its task).
            && Box::pin(self.ctx.captcha_passed_now(
                policy,
                &attempt.captcha,
                info,
                Action::LoginAttempt,
            ))
            .await?;
        let member = super::event_member();
        let pair = self.pair_keys(policy, &user.id, info, ip);
        let request = |captcha_passed| LoginRequest {
            window_key: &window_key,
            lock_key: &lock_key,
            policy: &policy.login.store,
            success: attempt.success,
            captcha_passed,
            member: &member,
            shadow: policy.login.shadow,
            ip: ip.map(|ip| IpFailureWindow {
                key: &ip.key,
                limits: policy.login.ip.limits(),
            }),
            network: network.map(NetworkWindow::store_window),
            pair: pair.as_ref().map(PairKeyNames::keys),
        };
        let outcome = self.ctx.store.login(request(captcha_passed)).await?;
        let only_challenged = outcome.user.verdict == LoginVerdict::Challenged
            && outcome
                .ip
                .is_none_or(|seen| seen.blocked_retry_after_ms.is_none());
        if !(ask_later && only_challenged) {
            return Ok(Recorded::Decided(outcome));
        }
        Ok(
            match Box::pin(self.ctx.check_captcha(
                policy,
                &attempt.captcha,
                Action::LoginAttempt,
                info.client_ip(),
            ))
            .await?
            {
                ProofCheck::Passed => Recorded::Decided(self.ctx.store.login(request(true)).await?),
                ProofCheck::NotPassed => Recorded::Decided(outcome),
                ProofCheck::Throttled(throttle) => Recorded::Throttled(throttle, outcome),
            },
        )
    }

    /// The answer to an attempt whose token was refused unasked: `deny`
    /// (`rate_limited`) until the oldest refused token leaves the window,
    /// or a token in flight comes back, audited on the address. The user's
    /// state is the challenge's.
    fn token_throttled(
        &self,
        throttle: TokenThrottle,
        outcome: &LoginOutcome,
        info: &RequestInfo,
    ) -> LoginState {
        self.ctx
            .audit(info, throttle.audit_row(Action::LoginAttempt));
        LoginState::deny(Denial {
            reason: Reason::RateLimited,
            locked: false,
            retry_after_ms: throttle.retry_after_ms(),
            failures: outcome.user.failures,
            captcha_required: true,
        })
    }

    /// The effects: the first refusal answers (and only it is audited), or
    /// the crossed thresholds are audited, the owner told of a lock, and the
    /// attempt allowed.
    fn apply(
        &self,
        decided: AttemptDecision,
        attempt: LoginAttempt,
        info: &RequestInfo,
    ) -> LoginState {
        if let Some((answer, row)) = decided.refusals.into_iter().next() {
            self.ctx.audit(info, row);
            return answer;
        }
        for row in decided.crossed {
            self.ctx.audit(info, row);
        }
        // One notice per lock: only the attempt that locked gets here.
        if let (Some((locked_for, scope)), Some(to)) = (decided.notify_lock, attempt.notify_email) {
            let to = to.into_string();
            self.notifier.lock_notice(LockNotice {
                to,
                user: attempt.user.as_str().to_string(),
                locked_for,
                scope,
                ip: info.client_ip().map(|ip| ip.to_string()),
                locale: attempt.locale.map(Locale::into_string),
            });
        }
        decided.allowed
    }
}
