//! `POST /login/check` and `POST /login/attempt` decisions: per-user captcha
//! and escalating locks, per-IP captcha and block across users.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::{ceil_secs, GuardContext, Policy, RequestInfo};
use crate::audit::{AuditDecision, AuditEvent};
use crate::captcha::CaptchaProof;
use crate::delivery::email::{LockNotice, LockNotifier};
use crate::domain::{Action, Subject, SubjectKind, Username};
use crate::store::{
    IpFailureWindow, LoginRequest, LoginVerdict, PeekOutcome, StoreError, WindowSpec,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LoginDecision {
    Allow,
    Challenge,
    Deny,
}

/// The answer of both login endpoints (DESIGN.md §3 `LoginState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"decision": "deny", "captcha_required": true, "locked": true,
    "retry_after_secs": 900, "failures": 10, "reason": "user_locked"}))]
pub struct LoginState {
    pub decision: LoginDecision,
    /// Whether the next attempt needs a passed captcha.
    pub captcha_required: bool,
    pub locked: bool,
    /// Seconds until the lock or IP block ends; null when there is none.
    #[schema(required = true)]
    pub retry_after_secs: Option<u64>,
    /// The user's failures in `login.captcha_window`.
    pub failures: u32,
    /// `user_locked`, `ip_blocked` or `captcha_required`; null on `allow`.
    #[schema(required = true, value_type = Option<String>, example = "user_locked")]
    pub reason: Option<&'static str>,
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
}

pub struct LoginAttempt {
    pub user: Username,
    pub success: bool,
    pub captcha: CaptchaProof,
    /// Where to tell the account's owner if this attempt locks the account.
    pub notify_email: Option<String>,
    /// Locale of that notice.
    pub locale: Option<String>,
}

pub struct LoginGuard {
    ctx: GuardContext,
    notifier: Arc<dyn LockNotifier>,
}

/// The IP's failure windows: `[captcha tier, block]`.
struct IpWindows {
    subject: Subject,
    key: String,
    windows: [WindowSpec; 2],
}

impl IpWindows {
    fn captcha_count(peek: &PeekOutcome) -> u32 {
        peek.counts.first().copied().unwrap_or(0)
    }
    fn block_count(peek: &PeekOutcome) -> u32 {
        peek.counts.get(1).copied().unwrap_or(0)
    }
}

impl LoginGuard {
    pub fn new(ctx: GuardContext, notifier: Arc<dyn LockNotifier>) -> Self {
        Self { ctx, notifier }
    }

    fn user_keys(&self, user: &Username) -> (String, String) {
        let kind = SubjectKind::User.as_str();
        (
            self.ctx
                .keys
                .window(kind, user.as_str(), Action::LoginAttempt.as_str()),
            self.ctx.keys.lock(kind, user.as_str()),
        )
    }

    fn ip_windows(&self, policy: &Policy, info: &RequestInfo) -> Option<IpWindows> {
        let ip = info.ip?;
        let subject = Subject::new(SubjectKind::Ip, ip.subject_id());
        let key = self.ctx.keys.window(
            SubjectKind::Ip.as_str(),
            &subject.id,
            Action::LoginAttempt.as_str(),
        );
        Some(IpWindows {
            subject,
            key,
            windows: [policy.ip_captcha.gate(), policy.ip_block.enforce()],
        })
    }

    async fn peek_ip(&self, ip: Option<&IpWindows>) -> Result<Option<PeekOutcome>, StoreError> {
        match ip {
            Some(ip) => Ok(Some(self.ctx.store.peek(&ip.key, &ip.windows).await?)),
            None => Ok(None),
        }
    }

    /// Read-only: what an attempt would meet now.
    pub async fn check(
        &self,
        user: &Username,
        info: &RequestInfo,
    ) -> Result<LoginState, StoreError> {
        let policy = self.ctx.policy.current();
        let (window_key, lock_key) = self.user_keys(user);
        let ip = self.ip_windows(&policy, info);
        let (user_state, ip_state) = futures::try_join!(
            self.ctx
                .store
                .login_state(&window_key, &lock_key, &policy.login_store),
            self.peek_ip(ip.as_ref()),
        )?;
        let failures = user_state.failures;
        if policy.shadow {
            return Ok(LoginState::allow(failures));
        }
        let ip_captcha = ip_state
            .as_ref()
            .is_some_and(|p| IpWindows::captcha_count(p) >= policy.ip_captcha.limit);
        let captcha_required = failures >= policy.user_captcha.limit || ip_captcha;
        let locked = user_state.locked_retry_after_ms.is_some();
        if let Some(retry) = user_state.locked_retry_after_ms {
            return Ok(deny("user_locked", true, retry, failures, captcha_required));
        }
        if let Some(peek) = &ip_state {
            if IpWindows::block_count(peek) >= policy.ip_block.limit {
                let retry = peek.retry_after_ms.get(1).copied().unwrap_or(0);
                return Ok(deny(
                    "ip_blocked",
                    locked,
                    retry,
                    failures,
                    captcha_required,
                ));
            }
        }
        if captcha_required {
            return Ok(challenge(failures));
        }
        Ok(LoginState::allow(failures))
    }

    /// Evaluate and record one login outcome (DESIGN.md §3, in order): the
    /// store decides the user and the IP together, in one call where it can.
    pub async fn attempt(
        &self,
        attempt: LoginAttempt,
        info: &RequestInfo,
    ) -> Result<LoginState, StoreError> {
        let policy = self.ctx.policy.current();
        let shadow = policy.shadow;
        let user_subject = Subject::new(SubjectKind::User, attempt.user.as_str());
        let (window_key, lock_key) = self.user_keys(&attempt.user);
        let ip = self.ip_windows(&policy, info);
        // Only a captcha check needs the address as text.
        let remote_ip = || info.ip.map(|ip| ip.to_string());
        // A token goes to the provider only when it can change the answer: the
        // attempt is challenged and nothing else refuses it (a blocked IP
        // spraying tokens costs no provider calls). The store records nothing
        // for a challenged attempt, so it is asked again once the token passed.
        // In shadow mode the store records on the first call: the token is
        // checked first.
        let ask_later = policy.captcha.asks_provider(&attempt.captcha) && !shadow;
        let has_proof = attempt.captcha.token.is_some() || attempt.captcha.passed.is_some();
        let captcha_passed = has_proof
            && !ask_later
            && policy
                .captcha
                .passed(&attempt.captcha, remote_ip().as_deref())
                .await;
        let member = super::event_member();
        let ip_window = ip.as_ref().map(|ip| IpFailureWindow {
            key: &ip.key,
            captcha_after: policy.ip_captcha.limit,
            block_after: policy.ip_block.limit,
            window_ms: policy.ip_block.window_ms(),
        });
        let request = |captcha_passed| LoginRequest {
            window_key: &window_key,
            lock_key: &lock_key,
            policy: &policy.login_store,
            success: attempt.success,
            captcha_passed,
            member: &member,
            shadow,
            ip: ip_window,
        };
        let mut outcome = self.ctx.store.login(request(captcha_passed)).await?;
        let only_challenged = outcome.user.verdict == LoginVerdict::Challenged
            && outcome
                .ip
                .is_none_or(|seen| seen.blocked_retry_after_ms.is_none());
        if ask_later
            && only_challenged
            && policy
                .captcha
                .passed(&attempt.captcha, remote_ip().as_deref())
                .await
        {
            outcome = self.ctx.store.login(request(true)).await?;
        }
        let recorded = outcome.recorded(shadow);
        let user = &outcome.user;
        let failures = user.failures;
        let ip_count = outcome.ip.map_or(0, |seen| seen.count);
        let ip_demands_captcha = outcome
            .ip
            .is_some_and(|seen| seen.count >= policy.ip_captcha.limit);

        // 1. IP blocked.
        if let (Some(ip), Some(retry)) =
            (&ip, outcome.ip.and_then(|seen| seen.blocked_retry_after_ms))
        {
            let event = AuditEvent::new(
                Action::LoginAttempt,
                AuditDecision::Deny,
                "ip_blocked",
                &ip.subject,
            )
            .rule(&policy.ip_block, ip_count)
            .retry_after_ms(retry)
            .shadow(shadow);
            self.ctx.audit(info, event);
            if !shadow {
                let captcha_required = failures >= policy.user_captcha.limit || ip_demands_captcha;
                let locked = matches!(user.verdict, LoginVerdict::Locked { .. });
                return Ok(deny(
                    "ip_blocked",
                    locked,
                    retry,
                    failures,
                    captcha_required,
                ));
            }
        }

        match user.verdict {
            // 1. The user is locked.
            LoginVerdict::Locked { retry_after_ms } => {
                let event = AuditEvent::new(
                    Action::LoginAttempt,
                    AuditDecision::Deny,
                    "user_locked",
                    &user_subject,
                )
                .rule(&policy.user_lock, policy.user_lock.limit)
                .retry_after_ms(retry_after_ms)
                .shadow(shadow);
                self.ctx.audit(info, event);
                if !shadow {
                    let captcha_required =
                        failures >= policy.user_captcha.limit || ip_demands_captcha;
                    return Ok(deny(
                        "user_locked",
                        true,
                        retry_after_ms,
                        failures,
                        captcha_required,
                    ));
                }
            }
            // 2. A captcha is required and was not passed.
            LoginVerdict::Challenged => {
                // The user's own tier first; otherwise the IP demanded it.
                let user_tier = failures >= policy.user_captcha.limit || !ip_demands_captcha;
                let event = match (&ip, user_tier) {
                    (Some(ip), false) => AuditEvent::new(
                        Action::LoginAttempt,
                        AuditDecision::Challenge,
                        "captcha_required",
                        &ip.subject,
                    )
                    .rule(&policy.ip_captcha, ip_count),
                    _ => AuditEvent::new(
                        Action::LoginAttempt,
                        AuditDecision::Challenge,
                        "captcha_required",
                        &user_subject,
                    )
                    .rule(&policy.user_captcha, failures),
                };
                self.ctx.audit(info, event.shadow(shadow));
                if !shadow {
                    return Ok(challenge(failures));
                }
            }
            LoginVerdict::Recorded => {}
        }

        // 3. The outcome was recorded (or, in shadow mode, recorded as allowed).
        if user.captcha_crossed {
            let event = AuditEvent::new(
                Action::LoginAttempt,
                AuditDecision::Challenge,
                "captcha_required",
                &user_subject,
            )
            .rule(&policy.user_captcha, failures)
            .shadow(shadow);
            self.ctx.audit(info, event);
        }
        if let Some(lock_ms) = user.locked_for_ms {
            let event = AuditEvent::new(
                Action::LoginAttempt,
                AuditDecision::Lock,
                "too_many_failures",
                &user_subject,
            )
            .rule(&policy.user_lock, policy.user_lock.limit)
            .retry_after_ms(lock_ms)
            .shadow(shadow);
            self.ctx.audit(info, event);
            // One notice per lock: only the attempt that locked gets here.
            if let (false, Some(to)) = (shadow, attempt.notify_email) {
                self.notifier.lock_notice(LockNotice {
                    to,
                    user: attempt.user.as_str().to_string(),
                    locked_for: Duration::from_millis(lock_ms),
                    ip: info.ip.map(|ip| ip.to_string()),
                    locale: attempt.locale,
                });
            }
        }
        let mut ip_captcha_after = ip_count;
        if let (true, false, Some(ip)) = (recorded, attempt.success, &ip) {
            let after = ip_count + 1;
            ip_captcha_after = after;
            if after == policy.ip_captcha.limit {
                let event = AuditEvent::new(
                    Action::LoginAttempt,
                    AuditDecision::Challenge,
                    "captcha_required",
                    &ip.subject,
                )
                .rule(&policy.ip_captcha, after)
                .shadow(shadow);
                self.ctx.audit(info, event);
            }
            if after == policy.ip_block.limit {
                let event = AuditEvent::new(
                    Action::LoginAttempt,
                    AuditDecision::Lock,
                    "ip_blocked",
                    &ip.subject,
                )
                .rule(&policy.ip_block, after)
                .retry_after_ms(policy.ip_block.window_ms())
                .shadow(shadow);
                self.ctx.audit(info, event);
            }
        }

        if shadow {
            return Ok(LoginState::allow(failures));
        }
        let captcha_required = failures >= policy.user_captcha.limit
            || (ip.is_some() && ip_captcha_after >= policy.ip_captcha.limit);
        Ok(LoginState {
            decision: LoginDecision::Allow,
            captcha_required,
            locked: user.locked_for_ms.is_some(),
            retry_after_secs: user.locked_for_ms.map(ceil_secs),
            failures,
            reason: None,
        })
    }
}

fn deny(
    reason: &'static str,
    locked: bool,
    retry_after_ms: u64,
    failures: u32,
    captcha_required: bool,
) -> LoginState {
    LoginState {
        decision: LoginDecision::Deny,
        captcha_required,
        locked,
        retry_after_secs: Some(ceil_secs(retry_after_ms)),
        failures,
        reason: Some(reason),
    }
}

fn challenge(failures: u32) -> LoginState {
    LoginState {
        decision: LoginDecision::Challenge,
        captcha_required: true,
        locked: false,
        retry_after_secs: None,
        failures,
        reason: Some("captcha_required"),
    }
}
