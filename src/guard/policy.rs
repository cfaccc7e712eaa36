//! The decision settings (`[sms]`, `[login]`, `[captcha]`, `[shadow]`) turned
//! into rules and clients once, and swappable at run time (SIGHUP) without a
//! lock on the request path beyond one `Arc` clone.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::captcha::CaptchaVerifier;
use crate::domain::{Rule, SubjectKind};
use crate::settings::{LimitSetting, LoginSettings, Settings, SmsSettings};
use crate::store::{LoginPolicy, RuleWindow, WindowSpec};

pub struct Policy {
    pub captcha: Arc<CaptchaVerifier>,
    pub sms: SmsSettings,
    pub login: LoginSettings,
    pub shadow: bool,
    /// `/sms/send` per subject kind; phone and IP carry the captcha tier.
    pub sms_phone: SubjectRules,
    pub sms_prefix: SubjectRules,
    pub sms_ip: SubjectRules,
    pub sms_global: SubjectRules,
    pub login_store: LoginPolicy,
    pub user_captcha: Rule,
    pub user_lock: Rule,
    pub ip_captcha: Rule,
    pub ip_block: Rule,
}

const ESCALATION_RESET_MS: u64 = 24 * 3_600_000;

fn rules(kind: SubjectKind, limits: &[LimitSetting]) -> Vec<Rule> {
    limits
        .iter()
        .map(|l| Rule::new(kind, l.limit, l.window))
        .collect()
}

impl Policy {
    pub fn from_settings(settings: &Settings) -> Result<Self, reqwest::Error> {
        let sms = &settings.sms;
        let login = &settings.login;
        Ok(Self {
            captcha: Arc::new(CaptchaVerifier::new(&settings.captcha)?),
            sms_phone: SubjectRules::new(
                rules(SubjectKind::Phone, &sms.phone_limits),
                Some(Rule::new(
                    SubjectKind::Phone,
                    sms.captcha_after,
                    sms.captcha_window,
                )),
            ),
            sms_prefix: SubjectRules::new(rules(SubjectKind::Prefix, &sms.prefix_limits), None),
            sms_ip: SubjectRules::new(
                rules(SubjectKind::Ip, &sms.ip_limits),
                Some(Rule::new(
                    SubjectKind::Ip,
                    sms.captcha_after,
                    sms.captcha_window,
                )),
            ),
            sms_global: SubjectRules::new(rules(SubjectKind::Global, &sms.global_limits), None),
            login_store: LoginPolicy {
                captcha_after: login.captcha_after,
                captcha_window_ms: login.captcha_window.as_millis() as u64,
                lock_after: login.lock_after,
                lock_window_ms: login.lock_window.as_millis() as u64,
                lock_ms: login.lock_duration.as_millis() as u64,
                lock_max_ms: login.lock_max_duration.as_millis() as u64,
                reset_on_success: login.reset_on_success,
                escalation_reset_ms: ESCALATION_RESET_MS,
            },
            user_captcha: Rule::new(SubjectKind::User, login.captcha_after, login.captcha_window),
            user_lock: Rule::new(SubjectKind::User, login.lock_after, login.lock_window),
            ip_captcha: Rule::new(SubjectKind::Ip, login.ip_captcha_after, login.ip_window),
            ip_block: Rule::new(SubjectKind::Ip, login.ip_block_after, login.ip_window),
            sms: sms.clone(),
            login: login.clone(),
            shadow: settings.shadow.enabled,
        })
    }
}

/// One subject kind's rules and optional captcha tier, with the window specs
/// the store takes built once per policy rather than on every request.
pub struct SubjectRules {
    pub rules: Vec<Rule>,
    pub gate: Option<Rule>,
    windows: Vec<WindowSpec>,
}

impl SubjectRules {
    pub fn new(rules: Vec<Rule>, gate: Option<Rule>) -> Self {
        let windows = rules
            .iter()
            .map(RuleWindow::enforce)
            .chain(gate.iter().map(RuleWindow::gate))
            .collect();
        Self {
            rules,
            gate,
            windows,
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

pub struct PolicyCell(RwLock<Arc<Policy>>);

impl PolicyCell {
    pub fn new(policy: Policy) -> Self {
        Self(RwLock::new(Arc::new(policy)))
    }

    pub fn current(&self) -> Arc<Policy> {
        self.0.read().clone()
    }

    pub fn replace(&self, policy: Policy) {
        *self.0.write() = Arc::new(policy);
    }
}
