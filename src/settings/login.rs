//! `[login]`: failed-login thresholds, and what a lock holds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration;

/// `[login]`: when failed logins ask for a captcha, lock the user or block the IP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginSettings {
    /// A user's failures within `captcha_window` from which its logins need a
    /// captcha; default 3.
    pub captcha_after: u32,
    /// The window of `captcha_after`, and of the `failures` count in answers;
    /// default 15 minutes.
    #[serde(with = "duration")]
    pub captcha_window: Duration,
    /// Failures within `lock_window` that lock: the (user, IP) pair with
    /// `lock_scope = "user_ip"`, the whole account with `"user"`; default 10.
    pub lock_after: u32,
    /// What `lock_after` locks: `user_ip` (the default) locks only the pair
    /// the failures came from, so nobody can lock an account's owner out by
    /// failing from elsewhere; `user` locks the account.
    #[serde(default)]
    pub lock_scope: LockScope,
    /// With `lock_scope = "user_ip"`: failures within `lock_window` from any
    /// IP that lock the whole account (an attack spread over many IPs);
    /// default 100. Not below `lock_after`.
    #[serde(default = "default_account_lock_after")]
    pub account_lock_after: u32,
    /// The window of `lock_after`; default 1 hour.
    #[serde(with = "duration")]
    pub lock_window: Duration,
    /// Length of a first lock; a lock that starts within 24 h of the previous
    /// one's end lasts twice as long as that one. Default 15 minutes.
    #[serde(with = "duration")]
    pub lock_duration: Duration,
    /// Cap of the doubled lock length, not below `lock_duration`; default 24 hours.
    #[serde(with = "duration")]
    pub lock_max_duration: Duration,
    /// Whether a successful login clears the user's failures; default true.
    pub reset_on_success: bool,
    /// Failures from one IP within `ip_window`, whatever the user, from which its
    /// logins need a captcha; default 20.
    pub ip_captcha_after: u32,
    /// Failures from one IP within `ip_window` that block it until the count
    /// drops below; default 100.
    pub ip_block_after: u32,
    /// The window of `ip_captcha_after`, `ip_block_after` and
    /// `network_captcha_after`; default 1 hour.
    #[serde(with = "duration")]
    pub ip_window: Duration,
    /// Failures from one IPv6 network (its first `sms.network_bits` bits, a
    /// /48 by default) within `ip_window`, whatever the user and the /64,
    /// from which its logins need a captcha; default 100, 0 turns it off.
    /// An IPv4 client has no network.
    pub network_captcha_after: u32,
    /// Shadow mode for `/login/*` alone: decide and audit, refuse nothing.
    #[serde(default)]
    pub shadow: bool,
}

fn default_account_lock_after() -> u32 {
    100
}

/// What a user's failures lock (`login.lock_scope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LockScope {
    /// The account, whoever tries next.
    User,
    /// The (user, client IP) pair the failures came from; the account is
    /// locked at `account_lock_after`. The default.
    #[default]
    UserIp,
}
