//! The decision settings (`[sms]`, `[login]`, `[captcha]`, `[shadow]`) turned
//! into rules and clients once, and swappable at run time (SIGHUP) without a
//! lock on the request path beyond one `Arc` clone.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::captcha::CaptchaVerifier;
use crate::domain::{Action, Rule, SubjectKind};
use crate::metrics::RuleCounters;
use crate::settings::{LimitSetting, LockScope, LoginSettings, Settings, SmsSettings};
use crate::store::{ConversionPolicy, HitOutcome, LoginPolicy, RuleWindow, WindowSpec};

/// The decision settings in force and the rules built from them, replaced
/// whole on reload.
pub struct Policy {
    /// Checks captcha proofs as `[captcha]` says.
    pub captcha: Arc<CaptchaVerifier>,
    /// `[sms]` as loaded.
    pub sms: SmsSettings,
    /// `[login]` as loaded.
    pub login: LoginSettings,
    /// `/sms/*` in shadow (`shadow.enabled` or `sms.shadow`): decide and
    /// audit, but refuse nothing.
    pub sms_shadow: bool,
    /// `/login/*` in shadow (`shadow.enabled` or `login.shadow`).
    pub login_shadow: bool,
    /// `/sms/send` per subject kind; phone and IP carry the captcha tier.
    pub sms_phone: SubjectRules,
    /// `/sms/send` per number prefix.
    pub sms_prefix: SubjectRules,
    /// `/sms/send` per client IP, with the captcha tier.
    pub sms_ip: SubjectRules,
    /// `/sms/send` across every caller.
    pub sms_global: SubjectRules,
    /// `[sms.pumping]` as the store counts it; `None` when the guard is off.
    pub pumping: Option<ConversionPolicy>,
    /// `[login]` in the form the store's login call takes.
    pub login_store: LoginPolicy,
    /// A user's captcha tier: `login.captcha_after` failures per
    /// `login.captcha_window`.
    pub user_captcha: Rule,
    /// An account's lock: failures from any IP per `login.lock_window`,
    /// `login.lock_after` of them with `lock_scope = "user"`,
    /// `login.account_lock_after` with `"user_ip"`.
    pub user_lock: Rule,
    /// With `lock_scope = "user_ip"`, a (user, IP) pair's lock:
    /// `login.lock_after` failures per `login.lock_window` (`user_ip 10/1h`).
    pub pair_lock: Option<Rule>,
    /// An IP's captcha tier: `login.ip_captcha_after` failures per
    /// `login.ip_window`.
    pub ip_captcha: Rule,
    /// An IP's block: `login.ip_block_after` failures per `login.ip_window`.
    pub ip_block: Rule,
    /// The counters of the login rules above.
    pub login_counters: LoginCounters,
    /// Wrong tries of one code: `sms.max_verify_attempts` per
    /// `sms.code_ttl` (`phone 5/5m`).
    pub verify_attempts: Rule,
    /// Its counters.
    pub verify_counters: RuleCounters,
}

/// The counters of the `/login/attempt` rules, one per rule of [`Policy`].
pub struct LoginCounters {
    pub user_captcha: RuleCounters,
    pub user_lock: RuleCounters,
    pub pair_lock: Option<RuleCounters>,
    pub ip_captcha: RuleCounters,
    pub ip_block: RuleCounters,
}

const ESCALATION_RESET_MS: u64 = 24 * 3_600_000;

fn rules(kind: SubjectKind, limits: &[LimitSetting]) -> Vec<Rule> {
    limits
        .iter()
        .map(|l| {
            Rule::new(kind, l.limit, l.window)
                .shadowed(l.shadow)
                .counted_by(l.algorithm)
        })
        .collect()
}

impl Policy {
    /// Build the rules and the captcha verifier; fails only when the
    /// verifier's HTTP client cannot be built.
    pub fn from_settings(settings: &Settings) -> Result<Self, reqwest::Error> {
        let sms = &settings.sms;
        let login = &settings.login;
        let account_lock_after = match login.lock_scope {
            LockScope::User => login.lock_after,
            LockScope::UserIp => login.account_lock_after,
        };
        let user_captcha = Rule::new(SubjectKind::User, login.captcha_after, login.captcha_window);
        let user_lock = Rule::new(SubjectKind::User, account_lock_after, login.lock_window);
        let pair_lock = (login.lock_scope == LockScope::UserIp).then(|| {
            Rule::new(SubjectKind::User, login.lock_after, login.lock_window).per_client_ip()
        });
        let ip_captcha = Rule::new(SubjectKind::Ip, login.ip_captcha_after, login.ip_window);
        let ip_block = Rule::new(SubjectKind::Ip, login.ip_block_after, login.ip_window);
        let login_rule = |rule: &Rule| RuleCounters::register(Action::LoginAttempt, rule);
        let login_counters = LoginCounters {
            user_captcha: login_rule(&user_captcha),
            user_lock: login_rule(&user_lock),
            pair_lock: pair_lock.as_ref().map(login_rule),
            ip_captcha: login_rule(&ip_captcha),
            ip_block: login_rule(&ip_block),
        };
        let verify_attempts = Rule::new(SubjectKind::Phone, sms.max_verify_attempts, sms.code_ttl);
        let send = Action::SmsSend;
        Ok(Self {
            captcha: Arc::new(CaptchaVerifier::new(&settings.captcha)?),
            sms_phone: SubjectRules::new(
                send,
                rules(SubjectKind::Phone, &sms.phone_limits),
                Some(Rule::new(
                    SubjectKind::Phone,
                    sms.captcha_after,
                    sms.captcha_window,
                )),
            ),
            sms_prefix: SubjectRules::new(
                send,
                rules(SubjectKind::Prefix, &sms.prefix_limits),
                None,
            ),
            sms_ip: SubjectRules::new(
                send,
                rules(SubjectKind::Ip, &sms.ip_limits),
                Some(Rule::new(
                    SubjectKind::Ip,
                    sms.captcha_after,
                    sms.captcha_window,
                )),
            ),
            sms_global: SubjectRules::new(
                send,
                rules(SubjectKind::Global, &sms.global_limits),
                None,
            ),
            pumping: sms.pumping.enabled.then(|| ConversionPolicy {
                min_events: sms.pumping.min_sends,
                min_ratio_ppm: sms.pumping.min_conversion.ppm(),
                window_ms: sms.pumping.window.as_millis() as u64,
                block_ms: sms.pumping.block_duration.as_millis() as u64,
            }),
            login_store: LoginPolicy {
                captcha_after: login.captcha_after,
                captcha_window_ms: login.captcha_window.as_millis() as u64,
                lock_after: account_lock_after,
                pair_lock_after: login.lock_after,
                lock_window_ms: login.lock_window.as_millis() as u64,
                lock_ms: login.lock_duration.as_millis() as u64,
                lock_max_ms: login.lock_max_duration.as_millis() as u64,
                reset_on_success: login.reset_on_success,
                escalation_reset_ms: ESCALATION_RESET_MS,
            },
            user_captcha,
            user_lock,
            pair_lock,
            ip_captcha,
            ip_block,
            login_counters,
            verify_counters: RuleCounters::register(Action::SmsVerify, &verify_attempts),
            verify_attempts,
            sms: sms.clone(),
            login: login.clone(),
            sms_shadow: settings.shadow.enabled || sms.shadow,
            login_shadow: settings.shadow.enabled || login.shadow,
        })
    }
}

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
        for (index, (counters, &count)) in self.counters.iter().zip(&outcome.counts).enumerate() {
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

/// The policy in force, swapped whole on SIGHUP; a request holds one `Arc`
/// to the end, so it never sees half of a reload.
pub struct PolicyCell(RwLock<Arc<Policy>>);

impl PolicyCell {
    /// Start with `policy` in force.
    pub fn new(policy: Policy) -> Self {
        Self(RwLock::new(Arc::new(policy)))
    }

    /// The policy in force; a reload does not change the one returned.
    pub fn current(&self) -> Arc<Policy> {
        self.0.read().clone()
    }

    /// Put `policy` in force; requests under way keep the old one.
    pub fn replace(&self, policy: Policy) {
        *self.0.write() = Arc::new(policy);
    }
}
