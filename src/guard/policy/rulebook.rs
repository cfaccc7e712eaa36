//! The rulebook: which windows a subject of each kind has for each action,
//! said once. The guards count a request against it and the admin state
//! reads a subject's windows (and clears them) by it.

use super::{Policy, SubjectRules};
use crate::domain::{Action, Rule, SubjectKind};
use crate::store::{IpLimits, PeekOutcome, RuleWindow, WindowSpec};

/// Every action with windows, in the order a subject's state lists them.
pub const ACTIONS: [Action; 4] = Action::ALL;

/// The windows a subject kind has for one action.
#[derive(Clone, Copy)]
pub enum Windows<'p> {
    /// Counted by a reservation (`guard::reserve`), or for a login's
    /// network by the store's login call: enforced rules, then a captcha
    /// tier; the rules may be empty (none configured).
    Counted(&'p SubjectRules),
    /// A login IP's failures (`login.ip_*`), counted by the store's login
    /// call.
    LoginIp(&'p IpLoginRules),
    /// A user's failures and lock (`login.*`), counted and read by the
    /// store's login calls.
    LoginUser,
    /// An address's failed admin authentications (`[admin]`,
    /// `guard::admin_auth`).
    AdminAuth,
}

impl<'p> Windows<'p> {
    /// The rules a reservation counts, for the actions that have them.
    pub fn counted(self) -> Option<&'p SubjectRules> {
        match self {
            Windows::Counted(rules) => Some(rules),
            _ => None,
        }
    }
}

impl Policy {
    /// The rulebook: the windows a subject of `kind` has for `action`;
    /// `None` when it has none. Which kinds an action counts does not
    /// depend on the settings: a kind with no rules configured answers its
    /// empty rules (its windows may still hold events from before).
    pub fn rules_for(&self, action: Action, kind: SubjectKind) -> Option<Windows<'_>> {
        let sms = &self.sms;
        let windows = match (action, kind) {
            (Action::SmsSend, SubjectKind::Phone) => Windows::Counted(&sms.phone),
            (Action::SmsSend, SubjectKind::Ip) => Windows::Counted(&sms.ip),
            (Action::SmsSend, SubjectKind::Network) => Windows::Counted(&sms.network),
            (Action::SmsSend, SubjectKind::Prefix) => Windows::Counted(&sms.prefix),
            (Action::SmsSend, SubjectKind::Global) => Windows::Counted(&sms.global),
            (Action::SmsVerify, SubjectKind::Ip) => Windows::Counted(&sms.verify_ip),
            (Action::SmsVerify, SubjectKind::Network) => Windows::Counted(&sms.verify_network),
            (Action::LoginAttempt, SubjectKind::Ip) => Windows::LoginIp(&self.login.ip),
            (Action::LoginAttempt, SubjectKind::User) => Windows::LoginUser,
            (Action::LoginAttempt, SubjectKind::Network) => Windows::Counted(&self.login.network),
            (Action::Admin, SubjectKind::Ip | SubjectKind::Network) => Windows::AdminAuth,
            _ => return None,
        };
        Some(windows)
    }

    /// The actions whose windows a subject of `kind` has, in [`ACTIONS`]'
    /// order.
    pub fn actions_of(&self, kind: SubjectKind) -> impl Iterator<Item = Action> + '_ {
        ACTIONS
            .into_iter()
            .filter(move |action| self.rules_for(*action, kind).is_some())
    }
}

/// An IP's login failures, one window length (`login.ip_window`) for two
/// thresholds.
#[derive(Debug, Clone, Copy)]
pub struct IpLoginRules {
    /// The captcha tier: `login.ip_captcha_after` failures.
    pub captcha: Rule,
    /// The block: `login.ip_block_after` failures.
    pub block: Rule,
}

impl IpLoginRules {
    const CAPTCHA: usize = 0;
    const BLOCK: usize = 1;

    /// The limits the store's login call takes (both rules count over
    /// `login.ip_window`).
    pub fn limits(&self) -> IpLimits {
        IpLimits {
            captcha_after: self.captcha.limit,
            block_after: self.block.limit,
            window_ms: self.block.window_ms(),
        }
    }

    /// The windows as the store peeks them: the captcha tier, then the
    /// block.
    pub fn windows(&self) -> [WindowSpec; 2] {
        [self.captcha.gate(), self.block.enforce()]
    }

    /// Each window with the rule that defines it, in the order of
    /// [`Self::windows`].
    pub fn pairs(&self) -> [(Rule, WindowSpec); 2] {
        let windows = self.windows();
        [
            (self.captcha, windows[Self::CAPTCHA]),
            (self.block, windows[Self::BLOCK]),
        ]
    }

    /// The failures a peek of [`Self::windows`] counted toward the captcha
    /// tier.
    pub fn captcha_count(peek: &PeekOutcome) -> u32 {
        peek.counts.get(Self::CAPTCHA).copied().unwrap_or(0)
    }

    /// The failures it counted toward the block.
    pub fn block_count(peek: &PeekOutcome) -> u32 {
        peek.counts.get(Self::BLOCK).copied().unwrap_or(0)
    }

    /// How long until the block's window lets the IP in again.
    pub fn block_retry_after_ms(peek: &PeekOutcome) -> u64 {
        peek.retry_after_ms.get(Self::BLOCK).copied().unwrap_or(0)
    }
}
