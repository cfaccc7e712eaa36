//! The decision settings (`[sms]`, `[login]`, `[captcha]`, `[shadow]`) turned
//! into rules and clients once, and swappable at run time (SIGHUP) without a
//! lock on the request path beyond one `Arc` clone.

use std::sync::Arc;

use crate::captcha::CaptchaVerifier;
use crate::domain::{Action, Rule, SubjectKind};
use crate::metrics::RuleCounters;
use crate::settings::PumpingSettings;
use crate::settings::{LimitSetting, LockScope, LoginSettings, Settings, SmsSettings};
use crate::store::{ConversionPolicy, LoginPolicy, NetworkLimits, Surge};

mod rulebook;
mod subject_rules;

pub use rulebook::{IpLoginRules, Windows, ACTIONS};
pub use subject_rules::SubjectRules;

/// The decision settings in force and the rules built from them, replaced
/// whole on reload. Which windows each subject kind has for each action is
/// said once, by [`Policy::rules_for`].
pub struct Policy {
    /// Checks captcha proofs as `[captcha]` says.
    pub captcha: Arc<CaptchaVerifier>,
    /// Refused captcha tokens per address (`captcha.failed_token_limit`).
    pub failed_tokens: Rule,
    /// `/sms/send` and `/sms/verify`.
    pub sms: SmsRules,
    /// `/login/check` and `/login/attempt`.
    pub login: LoginRules,
}

/// The SMS rules (`[sms]`).
pub struct SmsRules {
    /// `[sms]` as loaded.
    pub settings: SmsSettings,
    /// In shadow (`shadow.enabled` or `sms.shadow`): decide and audit, but
    /// refuse nothing.
    pub shadow: bool,
    /// A send's windows per phone, with the captcha tier.
    pub phone: SubjectRules,
    /// A send's windows per number prefix.
    pub prefix: SubjectRules,
    /// A send's windows per client IP, with the captcha tier.
    pub ip: SubjectRules,
    /// A send's windows per IPv6 network (`sms.network_bits`), with its own
    /// captcha tier (`sms.network_captcha_after`).
    pub network: SubjectRules,
    /// A send's windows across every caller.
    pub global: SubjectRules,
    /// A verify's failed tries per client IP.
    pub verify_ip: SubjectRules,
    /// A verify's failed tries per IPv6 network (`sms.network_bits`).
    pub verify_network: SubjectRules,
    /// Wrong tries of one code: `sms.max_verify_attempts` per
    /// `sms.code_ttl` (`phone 5/5m`).
    pub verify_attempts: Rule,
    /// Its counters.
    pub verify_counters: RuleCounters,
    /// `[sms.pumping]` as the store counts it; `None` when the guard is off.
    pub pumping: Option<PumpingPolicies>,
}

/// The login rules (`[login]`).
pub struct LoginRules {
    /// In shadow (`shadow.enabled` or `login.shadow`).
    pub shadow: bool,
    /// `[login]` in the form the store's login call takes.
    pub store: LoginPolicy,
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
    /// An IP's failures: its captcha tier and its block.
    pub ip: IpLoginRules,
    /// An IPv6 client's network's failures (`sms.network_bits`): a captcha
    /// tier, `login.network_captcha_after` per `login.ip_window`, and no
    /// enforced rule; no window at all when the tier is 0.
    pub network: SubjectRules,
    /// The counters of the rules above, the network's aside (its
    /// `SubjectRules` holds them).
    pub counters: LoginCounters,
}

impl LoginRules {
    /// The network's captcha tier as the store's login call takes it; `None`
    /// when it is off.
    pub fn network_limits(&self) -> Option<NetworkLimits> {
        self.network.gate.map(|tier| NetworkLimits {
            captcha_after: tier.limit,
            window_ms: tier.window_ms(),
        })
    }
}

/// The pumping guard's policies: a prefix is blocked at once, a country is
/// judged against its normal and challenged first.
#[derive(Debug, Clone, Copy)]
pub struct PumpingPolicies {
    /// A number prefix's.
    pub prefix: ConversionPolicy,
    /// A country's.
    pub country: ConversionPolicy,
}

impl PumpingPolicies {
    fn new(pumping: &PumpingSettings) -> Self {
        let prefix = ConversionPolicy {
            min_events: pumping.min_sends,
            min_ratio_ppm: pumping.min_conversion.ppm(),
            window_ms: pumping.window.as_millis() as u64,
            block_ms: pumping.block_duration.as_millis() as u64,
            surge: None,
        };
        let country = ConversionPolicy {
            min_events: pumping.country_min_sends,
            surge: Some(Surge {
                factor_milli: (pumping.country_surge * 1000.0).round() as u32,
                history_ms: pumping.country_history.as_millis() as u64,
                block: pumping.country_block,
            }),
            ..prefix
        };
        Self { prefix, country }
    }

    /// The policy of a prefix or a country; `None` for other kinds.
    pub fn of(&self, kind: SubjectKind) -> Option<&ConversionPolicy> {
        match kind {
            SubjectKind::Prefix => Some(&self.prefix),
            SubjectKind::Country => Some(&self.country),
            _ => None,
        }
    }
}

/// The counters of the `/login/attempt` rules, one per rule of
/// [`LoginRules`].
pub struct LoginCounters {
    /// The user's captcha tier's.
    pub user_captcha: RuleCounters,
    /// The account lock's.
    pub user_lock: RuleCounters,
    /// The pair lock's, with `lock_scope = "user_ip"`.
    pub pair_lock: Option<RuleCounters>,
    /// The IP's captcha tier's.
    pub ip_captcha: RuleCounters,
    /// The IP's block's.
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
        let shadow = settings.shadow.enabled;
        // The login rules' counters are registered first, as they always were.
        let login = LoginRules::new(&settings.login, shadow || settings.login.shadow);
        Ok(Self {
            captcha: Arc::new(CaptchaVerifier::new(&settings.captcha)?),
            failed_tokens: super::captcha_tokens::rule(
                settings.captcha.failed_token_limit.limit,
                settings.captcha.failed_token_limit.window,
            ),
            sms: SmsRules::new(&settings.sms, shadow || settings.sms.shadow),
            login,
        })
    }
}

impl SmsRules {
    fn new(sms: &SmsSettings, shadow: bool) -> Self {
        let send = |kind, limits: &[LimitSetting], captcha_after: Option<u32>| {
            let tier = captcha_after.map(|after| Rule::new(kind, after, sms.captcha_window));
            SubjectRules::new(Action::SmsSend, rules(kind, limits), tier)
        };
        let tier = Some(sms.captcha_after);
        let network_tier = Some(sms.network_captcha_after).filter(|&after| after > 0);
        let verify_attempts = Rule::new(SubjectKind::Phone, sms.max_verify_attempts, sms.code_ttl);
        Self {
            settings: sms.clone(),
            shadow,
            phone: send(SubjectKind::Phone, &sms.phone_limits, tier),
            prefix: send(SubjectKind::Prefix, &sms.prefix_limits, None),
            ip: send(SubjectKind::Ip, &sms.ip_limits, tier),
            network: send(SubjectKind::Network, &sms.network_limits, network_tier),
            global: send(SubjectKind::Global, &sms.global_limits, None),
            verify_ip: SubjectRules::new(
                Action::SmsVerify,
                rules(SubjectKind::Ip, &sms.verify_ip_limits),
                None,
            ),
            verify_network: SubjectRules::new(
                Action::SmsVerify,
                rules(SubjectKind::Network, &sms.verify_network_limits),
                None,
            ),
            verify_counters: RuleCounters::register(Action::SmsVerify, &verify_attempts),
            verify_attempts,
            pumping: sms
                .pumping
                .enabled
                .then(|| PumpingPolicies::new(&sms.pumping)),
        }
    }
}

impl LoginRules {
    fn new(login: &LoginSettings, shadow: bool) -> Self {
        let account_lock_after = match login.lock_scope {
            LockScope::User => login.lock_after,
            LockScope::UserIp => login.account_lock_after,
        };
        let user_captcha = Rule::new(SubjectKind::User, login.captcha_after, login.captcha_window);
        let user_lock = Rule::new(SubjectKind::User, account_lock_after, login.lock_window);
        let pair_lock = (login.lock_scope == LockScope::UserIp).then(|| {
            Rule::new(SubjectKind::User, login.lock_after, login.lock_window).per_client_ip()
        });
        let ip = IpLoginRules {
            captcha: Rule::new(SubjectKind::Ip, login.ip_captcha_after, login.ip_window),
            block: Rule::new(SubjectKind::Ip, login.ip_block_after, login.ip_window),
        };
        let login_rule = |rule: &Rule| RuleCounters::register(Action::LoginAttempt, rule);
        let counters = LoginCounters {
            user_captcha: login_rule(&user_captcha),
            user_lock: login_rule(&user_lock),
            pair_lock: pair_lock.as_ref().map(login_rule),
            ip_captcha: login_rule(&ip.captcha),
            ip_block: login_rule(&ip.block),
        };
        let network_tier = Some(login.network_captcha_after)
            .filter(|&after| after > 0)
            .map(|after| Rule::new(SubjectKind::Network, after, login.ip_window));
        let network = SubjectRules::new(Action::LoginAttempt, Vec::new(), network_tier);
        Self {
            shadow,
            store: LoginPolicy {
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
            ip,
            network,
            counters,
        }
    }
}

/// The policy in force, swapped whole on SIGHUP.
pub type PolicyCell = crate::in_force::InForce<Policy>;
