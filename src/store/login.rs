//! The values of the login operations: the policy in store units, what one
//! login offers to the user's and the IP's windows, and what they answer.

use super::WindowSpec;

/// The login brute-force policy, in store units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginPolicy {
    /// Failures in the captcha window from which a captcha is required.
    pub captcha_after: u32,
    /// Length of the captcha window.
    pub captcha_window_ms: u64,
    /// Failures in the lock window, from any IP, that lock the whole account.
    pub lock_after: u32,
    /// Failures in the lock window from one (user, IP) pair that lock the
    /// pair; read only when a request names the pair's keys.
    pub pair_lock_after: u32,
    /// Length of the lock window.
    pub lock_window_ms: u64,
    /// Length of a first lock.
    pub lock_ms: u64,
    /// Cap of a doubled lock.
    pub lock_max_ms: u64,
    /// Whether a success deletes the user's failures.
    pub reset_on_success: bool,
    /// A lock that starts within this long of the previous lock's end doubles.
    pub escalation_reset_ms: u64,
}

/// The newest locked pairs a user's index keeps (both stores; the Redis
/// script gets it rendered in).
pub const PAIR_INDEX_KEEP: usize = 1000;

/// The limits of an IP's login failure window: its captcha tier and its
/// block, over one length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpLimits {
    /// Failures from which logins from the IP need a captcha.
    pub captcha_after: u32,
    /// Failures that block the IP.
    pub block_after: u32,
    /// Length of the window both count in.
    pub window_ms: u64,
}

/// The IP's login failure window: its key and its limits.
#[derive(Debug, Clone, Copy)]
pub struct IpFailureWindow<'a> {
    /// `Keys::window` of the IP for the `login_attempt` action.
    pub key: &'a str,
    /// Its captcha tier, block and length.
    pub limits: IpLimits,
}

impl IpFailureWindow<'_> {
    /// The same windows as `WindowSpec`s: `[captcha tier, block]`.
    pub fn windows(&self) -> [WindowSpec; 2] {
        let l = self.limits;
        [
            WindowSpec::gate(l.captcha_after, l.window_ms),
            WindowSpec::enforce(l.block_after, l.window_ms),
        ]
    }
}

/// An IPv6 client's network's login failure window: a captcha tier only,
/// as a block would refuse a whole site (`login.network_captcha_after`).
#[derive(Debug, Clone, Copy)]
pub struct NetworkFailureWindow<'a> {
    /// `Keys::window` of the network for the `login_attempt` action.
    pub key: &'a str,
    /// Its captcha tier.
    pub limits: NetworkLimits,
}

impl NetworkFailureWindow<'_> {
    /// Whether `count` failures before an attempt fill the tier.
    pub fn demands_captcha(&self, count: u32) -> bool {
        count >= self.limits.captcha_after
    }

    /// The same window as a `WindowSpec`: the captcha tier, a sliding log.
    pub fn windows(&self) -> [WindowSpec; 1] {
        [WindowSpec::gate(
            self.limits.captcha_after,
            self.limits.window_ms,
        )]
    }
}

/// The limits of an IPv6 network's login failure window: its captcha tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkLimits {
    /// Failures from which logins from the network need a captcha.
    pub captcha_after: u32,
    /// Length of the window they count in.
    pub window_ms: u64,
}

/// A (user, client IP) pair (`login.lock_scope = "user_ip"`): its failures
/// are the user's that carry its IP (see [`pair_member`]); its lock record
/// and the user's index of locked pairs live under the user's hash tag.
#[derive(Debug, Clone, Copy)]
pub struct PairKeys<'a> {
    /// `Keys::pair_lock` of the pair.
    pub lock_key: &'a str,
    /// `Keys::pair_index` of the user.
    pub index_key: &'a str,
    /// The IP's subject id, as the index lists it.
    pub ip: &'a str,
}

/// A pair's failure as the user's window holds it: `<ip>|<attempt id>`.
pub fn pair_member(ip: &str, member: &str) -> String {
    format!("{ip}|{member}")
}

/// The IP a member of a user's window was recorded for, if any.
pub fn pair_of_member(member: &str) -> Option<&str> {
    member.rsplit_once('|').map(|(ip, _)| ip)
}

/// One login outcome for a user and, optionally, the IP it came from.
#[derive(Debug, Clone)]
pub struct LoginRequest<'a> {
    /// `Keys::window` of the user for the `login_attempt` action.
    pub window_key: &'a str,
    /// `Keys::lock` of the user.
    pub lock_key: &'a str,
    /// The user's thresholds.
    pub policy: &'a LoginPolicy,
    /// Whether the login succeeded.
    pub success: bool,
    /// A captcha was verified for this attempt.
    pub captcha_passed: bool,
    /// Unique id of this attempt in the windows.
    pub member: &'a str,
    /// Shadow mode: decide as usual, but record the outcome as if allowed.
    pub shadow: bool,
    /// The IP's failure window, when the request named an IP.
    pub ip: Option<IpFailureWindow<'a>>,
    /// The IP's network's failure window, when the IP is IPv6 and the tier
    /// is on.
    pub network: Option<NetworkFailureWindow<'a>>,
    /// The (user, IP) pair's keys, when failures lock pairs.
    pub pair: Option<PairKeys<'a>>,
}

/// What the IP's failure window held when a login was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpFailures {
    /// Failures in the window before this attempt.
    pub count: u32,
    /// `Some` while the IP is blocked: how long it stays blocked.
    pub blocked_retry_after_ms: Option<u64>,
}

/// The answer of `WindowStore::login`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    /// The user's side; `verdict` is what the user's rules say (with the IP's
    /// captcha tier), whether or not the IP blocked the attempt.
    pub user: LoginAttemptOutcome,
    /// Present when the request named an IP.
    pub ip: Option<IpFailures>,
    /// The network's failures in its window before this attempt, when the
    /// request named its window.
    pub network: Option<u32>,
}

impl LoginOutcome {
    /// Whether the outcome was recorded (as a failure or a success).
    pub fn recorded(&self, shadow: bool) -> bool {
        let ip_blocked = self
            .ip
            .is_some_and(|ip| ip.blocked_retry_after_ms.is_some());
        shadow || (self.user.verdict == LoginVerdict::Recorded && !ip_blocked)
    }
}

/// The user's side of a login outcome; see `WindowStore::login_attempt`.
#[derive(Debug, Clone)]
pub struct LoginAttemptRequest<'a> {
    /// `Keys::window` of the user for the `login_attempt` action.
    pub window_key: &'a str,
    /// `Keys::lock` of the user.
    pub lock_key: &'a str,
    /// The user's thresholds.
    pub policy: &'a LoginPolicy,
    /// Whether the login succeeded.
    pub success: bool,
    /// A captcha was verified for this attempt.
    pub captcha_passed: bool,
    /// Something outside the user (the IP) demands a captcha.
    pub captcha_demanded: bool,
    /// Something outside the user (the IP) refuses the attempt: the verdict is
    /// computed, but nothing is recorded (unless `shadow`).
    pub ip_blocked: bool,
    /// Unique id of this attempt in the window.
    pub member: &'a str,
    /// Shadow mode: decide as usual, but record the outcome as if allowed.
    pub shadow: bool,
    /// The (user, IP) pair's keys, when failures lock pairs.
    pub pair: Option<PairKeys<'a>>,
}

/// What the user's side decided about a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginVerdict {
    /// The user is locked; nothing was recorded (unless shadow).
    Locked {
        /// How long until the user's lock ends, or the pair's when that
        /// is locked too and ends later: the wait before a retry can pass.
        retry_after_ms: u64,
    },
    /// The (user, IP) pair is locked, the account is not; nothing was
    /// recorded (unless shadow).
    PairLocked {
        /// How long until the pair's lock ends.
        retry_after_ms: u64,
    },
    /// A captcha is required and was not passed; nothing recorded (unless shadow).
    Challenged,
    /// The outcome was recorded (unless `ip_blocked`).
    Recorded,
}

/// The answer of `WindowStore::login_attempt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginAttemptOutcome {
    /// What was decided.
    pub verdict: LoginVerdict,
    /// Failures in the captcha window after this call.
    pub failures: u32,
    /// This call recorded the failure that made the captcha window reach
    /// `captcha_after`.
    pub captcha_crossed: bool,
    /// This call locked the user, for this long.
    pub locked_for_ms: Option<u64>,
    /// This call locked the (user, IP) pair, for this long.
    pub pair_locked_for_ms: Option<u64>,
    /// The failures the rules saw before this call; `None` when nothing
    /// was read (a store failing open).
    pub before: Option<FailuresBefore>,
}

/// A user's failures before a login attempt, per rule window: what the
/// rules' metrics count against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailuresBefore {
    /// In `captcha_window`.
    pub captcha_window: u32,
    /// In `lock_window`, from any IP.
    pub lock_window: u32,
    /// The (user, IP) pair's in `lock_window`, when the request named it.
    pub pair: Option<u32>,
}

/// The answer of `WindowStore::login_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginStateOutcome {
    /// Remaining lock time when locked.
    pub locked_retry_after_ms: Option<u64>,
    /// Remaining lock time of the (user, IP) pair asked about, when locked.
    pub pair_locked_retry_after_ms: Option<u64>,
    /// Failures in the captcha window.
    pub failures: u32,
    /// Failures in the lock window.
    pub lock_window_failures: u32,
}
