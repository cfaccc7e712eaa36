//! `login_attempt.lua` is a template, as `reserve.lua` is: the login policy
//! (and whether a call names the pair's keys, the IP's window and the
//! network's, with their limits) is written into it as Lua literals, one script
//! per shape, loaded once and called by its SHA. Only the attempt's own facts
//! travel as arguments. Twelve policy numbers parsed at every call, and the
//! ranks and TTLs formatted for every `redis.call`, cost Redis about a sixth of
//! the call (docs/benchmarks.md).
//!
//! Nothing a client sends reaches the rendered text: it holds integers and
//! booleans from the configuration; keys and the pair's IP stay in
//! `KEYS`/`ARGV`.

use std::cell::RefCell;
use std::fmt::Write as _;

use fred::types::scripts::Script;

use crate::store::{IpLimits, LoginPolicy, NetworkLimits, PAIR_INDEX_KEEP};

const TEMPLATE: &str = include_str!("../../../lua/login_attempt.lua");
const POLICY_LINE: &str = "\n--@POLICY@\n";
/// A configuration has a few shapes (with or without the pair, the IP's window,
/// the network's: eight at most); more than this on a thread means reloads
/// piled them up, and its cache starts over.
const MAX_SHAPES: usize = 16;

/// What a login call's script depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginShape {
    /// The policy.
    pub policy: LoginPolicy,
    /// The call names the pair's keys (`KEYS[3]`, `KEYS[4]`) and IP (`ARGV[7]`).
    pub pair: bool,
    /// The call names the IP's window (the key after the user's and the
    /// pair's).
    pub ip: Option<IpLimits>,
    /// The call names the IP's network's window (its last key).
    pub network: Option<NetworkLimits>,
}

/// `login_attempt.lua` for `shape`: the policy in place of its `--@POLICY@`
/// line. Public for the lean limit (`examples/lean_login.rs`), which runs
/// the script tollgate runs.
pub fn render_login_attempt(shape: &LoginShape) -> String {
    let p = &shape.policy;
    let keep = p.captcha_after.max(p.lock_after);
    let mut policy = String::with_capacity(768);
    // Writing to a String cannot fail: the `let _ =` drop an Ok.
    let _ = writeln!(
        policy,
        "local captcha_after, captcha_window = {}, {}\n\
         local lock_after, lock_window = {}, {}\n\
         local lock_ms, lock_max_ms = {}, {}\n\
         local reset_on_success, escalation_reset = {}, {}\n\
         local pair_lock_after = {}\n\
         local keep, keep_rank = {keep}, '-{}'\n\
         local user_ttl, index_ttl = '{}', '{}'\n\
         local pair, pair_index_keep_rank = {}, '-{}'",
        p.captcha_after,
        p.captcha_window_ms,
        p.lock_after,
        p.lock_window_ms,
        p.lock_ms,
        p.lock_max_ms,
        p.reset_on_success,
        p.escalation_reset_ms,
        p.pair_lock_after,
        u64::from(keep) + 1,
        p.captcha_window_ms.max(p.lock_window_ms),
        p.lock_max_ms.saturating_add(p.escalation_reset_ms),
        shape.pair,
        PAIR_INDEX_KEEP + 1,
    );
    let mut key = if shape.pair { 5 } else { 3 };
    match shape.ip {
        Some(ip) => {
            let _ = writeln!(
                policy,
                "local ipkey = KEYS[{key}]\n\
                 local ip_captcha_after, ip_block_after, ip_window = {}, {}, {}\n\
                 local ip_keep_rank, ip_ttl = '-{}', '{}'",
                ip.captcha_after,
                ip.block_after,
                ip.window_ms,
                u64::from(ip.captcha_after.max(ip.block_after)) + 1,
                ip.window_ms,
            );
            key += 1;
        }
        None => policy.push_str(
            "local ipkey = false\n\
             local ip_captcha_after, ip_block_after, ip_window, ip_keep_rank, ip_ttl\n",
        ),
    }
    match shape.network {
        Some(net) => {
            let _ = writeln!(
                policy,
                "local netkey = KEYS[{key}]\n\
                 local net_captcha_after, net_window = {}, {}\n\
                 local net_keep_rank, net_ttl = '-{}', '{}'",
                net.captcha_after,
                net.window_ms,
                u64::from(net.captcha_after) + 1,
                net.window_ms,
            );
        }
        None => policy.push_str(
            "local netkey = false\n\
             local net_captcha_after, net_window, net_keep_rank, net_ttl\n",
        ),
    }
    TEMPLATE.replacen(POLICY_LINE, &format!("\n{policy}"), 1)
}

thread_local! {
    /// This thread's rendered scripts, by shape: a login finds its shape by
    /// comparing a few integers, and its script's reference count is this
    /// thread's alone (a map shared by the HTTP workers had each login hash
    /// the shape and bounce a lock's and the script's counters between cores).
    static RENDERED: RefCell<Vec<(LoginShape, Script)>> = const { RefCell::new(Vec::new()) };
}

/// The script for `shape`, rendered on this thread's first use of it.
pub(super) fn login_script_for(shape: &LoginShape) -> Script {
    RENDERED.with(|rendered| {
        let mut rendered = rendered.borrow_mut();
        if let Some((_, script)) = rendered.iter().find(|(s, _)| s == shape) {
            return script.clone();
        }
        if rendered.len() >= MAX_SHAPES {
            rendered.clear();
        }
        let script = Script::from_lua(render_login_attempt(shape));
        rendered.push((*shape, script.clone()));
        script
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LoginPolicy {
        LoginPolicy {
            captcha_after: 3,
            captcha_window_ms: 900_000,
            lock_after: 100,
            pair_lock_after: 10,
            lock_window_ms: 3_600_000,
            lock_ms: 900_000,
            lock_max_ms: 86_400_000,
            reset_on_success: true,
            escalation_reset_ms: 86_400_000,
        }
    }

    #[test]
    fn the_policy_replaces_its_marker_once() {
        let shape = LoginShape {
            policy: policy(),
            pair: true,
            ip: Some(IpLimits {
                captcha_after: 20,
                block_after: 100,
                window_ms: 3_600_000,
            }),
            network: None,
        };
        let lua = render_login_attempt(&shape);
        assert!(!lua.contains("--@POLICY@"));
        for line in [
            "local captcha_after, captcha_window = 3, 900000",
            "local keep, keep_rank = 100, '-101'",
            "local user_ttl, index_ttl = '3600000', '172800000'",
            "local pair, pair_index_keep_rank = true, '-1001'",
            "local ipkey = KEYS[5]",
            "local ip_keep_rank, ip_ttl = '-101', '3600000'",
        ] {
            assert!(lua.contains(line), "missing {line:?}");
        }
        let plain = render_login_attempt(&LoginShape {
            pair: false,
            ip: None,
            ..shape
        });
        assert!(plain.contains("local pair, pair_index_keep_rank = false, '-1001'"));
        assert!(plain.contains("local ipkey = false"));
        // The IP's key follows the user's two when there is no pair.
        let ip_only = render_login_attempt(&LoginShape {
            pair: false,
            ..shape
        });
        assert!(ip_only.contains("local ipkey = KEYS[3]"));
        assert!(ip_only.contains("local netkey = false"));
        // The network's key comes last.
        let network = NetworkLimits {
            captcha_after: 100,
            window_ms: 3_600_000,
        };
        for (pair, ip, key) in [(true, true, 6), (false, true, 4), (false, false, 3)] {
            let lua = render_login_attempt(&LoginShape {
                pair,
                ip: shape.ip.filter(|_| ip),
                network: Some(network),
                ..shape
            });
            assert!(
                lua.contains(&format!("local netkey = KEYS[{key}]")),
                "{pair} {ip}"
            );
            assert!(lua.contains("local net_keep_rank, net_ttl = '-101', '3600000'"));
        }
    }

    #[test]
    fn each_shape_has_its_own_script() {
        let a = LoginShape {
            policy: policy(),
            pair: false,
            ip: None,
            network: None,
        };
        let b = LoginShape {
            policy: LoginPolicy {
                lock_after: 5,
                ..policy()
            },
            ..a
        };
        assert_eq!(login_script_for(&a).sha1(), login_script_for(&a).sha1());
        assert_ne!(login_script_for(&a).sha1(), login_script_for(&b).sha1());
        // Past the bound the cache starts over and still answers right.
        for lock_after in 0..2 * MAX_SHAPES as u32 {
            let shape = LoginShape {
                policy: LoginPolicy {
                    lock_after,
                    ..policy()
                },
                ..a
            };
            let expected = Script::from_lua(render_login_attempt(&shape));
            assert_eq!(login_script_for(&shape).sha1(), expected.sha1());
        }
        RENDERED.with(|r| assert!(r.borrow().len() <= MAX_SHAPES));
    }
}
