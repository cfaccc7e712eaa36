//! The Lua scripts (`lua/`) and how their arguments and answers are laid
//! out: every window operation is one script call, atomic per subject.

use fred::bytes::Bytes;
use fred::prelude::{LuaInterface, Value};
use fred::types::scripts::Script;
use fred::types::{FromValue, MultipleKeys};

use super::layout::meter_hash;
use super::login_script::{login_script_for, LoginShape};
use super::reserve_policy::{answer_len, reserve_script_for, Render, KEEP_LINE, KEPT_AFTER};
use super::RedisStore;
use crate::store::{
    ConversionOutcome, ConversionVerdict, FailuresBefore, HitOutcome, HitVerdict, IpFailureWindow,
    IpFailures, LoginAttemptOutcome, LoginAttemptRequest, LoginVerdict, NetworkFailureWindow,
    ReserveOutcome, ReserveRequest, StoreError, SubjectWindows, WindowMode, WindowSpec,
};

/// What `login_attempt.lua` answered: the user's side, the IP's failures
/// and the network's, each when the call named its window.
pub(super) type LoginScriptAnswer = (LoginAttemptOutcome, Option<IpFailures>, Option<u32>);

/// Every script, loaded once per store.
pub(super) struct Scripts {
    pub(super) window_peek: Script,
    pub(super) login_state: Script,
    pub(super) otp_put: Script,
    pub(super) otp_check: Script,
    pub(super) otp_drop: Script,
    pub(super) get_or_init: Script,
    pub(super) undo: Script,
    pub(super) conversion_count: Script,
    pub(super) conversion_peek: Script,
    pub(super) expiring_add: Script,
    pub(super) expiring_members: Script,
    pub(super) recent_members: Script,
    pub(super) readyz: Script,
}

/// A script with `kept_after` in place of its KEEP line.
fn with_kept_after(template: &str) -> String {
    template.replacen(KEEP_LINE, &format!("\n{KEPT_AFTER}"), 1)
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            window_peek: Script::from_lua(include_str!("../../../lua/window_peek.lua")),
            login_state: Script::from_lua(include_str!("../../../lua/login_state.lua")),
            otp_put: Script::from_lua(with_kept_after(include_str!("../../../lua/otp_put.lua"))),
            otp_check: Script::from_lua(include_str!("../../../lua/otp_check.lua")),
            otp_drop: Script::from_lua(include_str!("../../../lua/otp_drop.lua")),
            get_or_init: Script::from_lua(include_str!("../../../lua/get_or_init.lua")),
            undo: Script::from_lua(include_str!("../../../lua/undo.lua")),
            conversion_count: Script::from_lua(include_str!("../../../lua/conversion_count.lua")),
            conversion_peek: Script::from_lua(include_str!("../../../lua/conversion_peek.lua")),
            expiring_add: Script::from_lua(include_str!("../../../lua/expiring_add.lua")),
            expiring_members: Script::from_lua(include_str!("../../../lua/expiring_members.lua")),
            recent_members: Script::from_lua(include_str!("../../../lua/recent_members.lua")),
            readyz: Script::from_lua(include_str!("../../../lua/readyz.lua")),
        }
    }

    /// `reserve.lua` and `login_attempt.lua` are not among them: they are
    /// rendered per request shape (`reserve_script_for`, `login_script_for`)
    /// and load on their first use.
    pub(super) fn all(&self) -> [&Script; 13] {
        [
            &self.window_peek,
            &self.login_state,
            &self.otp_put,
            &self.otp_check,
            &self.otp_drop,
            &self.get_or_init,
            &self.undo,
            &self.conversion_count,
            &self.conversion_peek,
            &self.expiring_add,
            &self.expiring_members,
            &self.recent_members,
            &self.readyz,
        ]
    }
}

/// What `reserve.lua` does with a request's conversions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conversions {
    /// Check them, and count the event in them when it is recorded.
    Count,
    /// Check them only.
    CheckOnly,
}

impl RedisStore {
    /// Call `script` with `keys` and the arguments `args` makes: `EVALSHA`,
    /// and after a `NOSCRIPT` (Redis restarted, or its scripts flushed)
    /// `SCRIPT LOAD` and once more. fred's `evalsha_with_reload` copies every
    /// key and argument before the first try, on every call, for a second
    /// try that almost never comes (a dozen allocations a login); here a
    /// second try makes its arguments again.
    pub(super) async fn eval<R: FromValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: impl Fn() -> Vec<Value> + Send + Sync,
    ) -> Result<R, StoreError> {
        let client = self.client_here();
        // fred's call is a future of some kilobytes: boxed once, each caller
        // that awaits it moves a pointer and not a memcpy of it
        let call = Box::pin(async {
            let names = || keys.iter().copied().collect::<MultipleKeys>();
            let sha = script.sha1();
            match client
                .evalsha::<R, _, _, _>(sha.clone(), names(), args())
                .await
            {
                Err(e) if e.details().starts_with("NOSCRIPT") => {
                    script.load(&client).await?;
                    client.evalsha(sha.clone(), names(), args()).await
                }
                answer => answer,
            }
        });
        self.run_on(&client, call).await
    }

    /// `reserve.lua` over the request's conversions, subjects and code:
    /// one call, atomic. `conversions` says whether the event is counted
    /// in the conversions when it is recorded, or they are only checked
    /// (the pumping check of one subject, `WindowStore::conversion_hit`,
    /// with no subject).
    pub(super) async fn reserve_script(
        &self,
        req: ReserveRequest<'_>,
        conversions: Conversions,
    ) -> Result<ReserveOutcome, StoreError> {
        let ReserveRequest {
            subjects,
            conversions: conversion_hits,
            member,
            gate_open,
            force,
            code,
        } = req;
        let count_conversions = conversions == Conversions::Count;
        let conversions = conversion_hits;
        if (subjects.is_empty() && conversions.is_empty())
            || subjects.iter().any(|s| s.windows.is_empty())
        {
            return Err(no_windows());
        }
        let mut keys = Vec::with_capacity(2 * subjects.len() + conversions.len() + 1);
        // Only a request with a meter window pays for its keys' strings.
        let meter_keys: Vec<Option<String>> = if subjects.iter().any(|s| has_meter(s.windows)) {
            subjects
                .iter()
                .map(|s| meter_hash(s.key, s.windows))
                .collect()
        } else {
            Vec::new()
        };
        // A subject of meters only never touches its ZSET: its key is not sent.
        for (i, subject) in subjects.iter().enumerate() {
            if has_log(subject.windows) {
                keys.push(subject.key);
            }
            keys.extend(meter_keys.get(i).and_then(Option::as_deref));
        }
        keys.extend(conversions.iter().map(|c| c.key));
        keys.extend(code.map(|code| code.key));
        let deadline = self.script_deadline();
        let args = || {
            let mut args = Vec::with_capacity(8);
            args.extend([Value::from(member), flag(gate_open), flag(force)]);
            if let Some(code) = code {
                args.extend([
                    Value::from(code.mac),
                    int(u64::from(code.attempts)),
                    int(code.ttl_ms),
                    Value::from(code.asker),
                ]);
            }
            args.push(Value::from(deadline));
            args
        };
        let script = reserve_script_for(
            subjects,
            conversions,
            Render {
                count: count_conversions,
                code: code.is_some(),
            },
        );
        let packed: Bytes = self.eval(&script, &keys, args).await?;
        self.refuse_late(&packed)?;
        let out = unpack_answer(&packed, answer_len(subjects, conversions))?;
        reserve_answer(&out, subjects)
    }

    /// `login_attempt.lua`: the user's keys, and the IP's and the network's
    /// windows when given; answers the network's failures before the call
    /// beside the user's and the IP's outcome.
    pub(super) async fn login_script(
        &self,
        req: &LoginAttemptRequest<'_>,
        ip: Option<&IpFailureWindow<'_>>,
        network: Option<&NetworkFailureWindow<'_>>,
    ) -> Result<LoginScriptAnswer, StoreError> {
        let mut keys = Vec::with_capacity(6);
        keys.extend([req.window_key, req.lock_key]);
        if let Some(pair) = &req.pair {
            keys.extend([pair.lock_key, pair.index_key]);
        }
        keys.extend(ip.map(|ip| ip.key));
        keys.extend(network.map(|network| network.key));
        let deadline = self.script_deadline();
        let args = || {
            let mut args = Vec::with_capacity(8);
            args.extend([
                Value::from(req.member),
                flag(req.success),
                flag(req.captcha_passed),
                flag(req.captcha_demanded),
                flag(req.shadow),
                flag(req.ip_blocked),
            ]);
            args.extend(req.pair.as_ref().map(|pair| Value::from(pair.ip)));
            args.push(Value::from(deadline));
            args
        };
        let script = login_script_for(&LoginShape {
            policy: *req.policy,
            pair: req.pair.is_some(),
            ip: ip.map(|ip| ip.limits),
            network: network.map(|network| network.limits),
        });
        let packed: Bytes = self.eval(&script, &keys, args).await?;
        self.refuse_late(&packed)?;
        let out = unpack_answer(&packed, 11 + usize::from(network.is_some()))?;
        let verdict = match out[0] {
            0 => LoginVerdict::Recorded,
            1 => LoginVerdict::Locked {
                retry_after_ms: wait(out[1]),
            },
            2 => LoginVerdict::Challenged,
            3 => LoginVerdict::PairLocked {
                retry_after_ms: wait(out[1]),
            },
            v => {
                return Err(StoreError::Protocol(format!(
                    "bad verdict {v} from login_attempt"
                )))
            }
        };
        let user = LoginAttemptOutcome {
            verdict,
            failures: count(out[2])?,
            captcha_crossed: out[3] == 1,
            locked_for_ms: u64::try_from(out[4]).ok(),
            pair_locked_for_ms: u64::try_from(out[7]).ok(),
            before: Some(FailuresBefore {
                captcha_window: count(out[8])?,
                lock_window: count(out[9])?,
                pair: u32::try_from(out[10]).ok(),
            }),
        };
        let ip = match ip {
            Some(_) => Some(IpFailures {
                count: count(out[5])?,
                blocked_retry_after_ms: u64::try_from(out[6]).ok(),
            }),
            None => None,
        };
        let network = match network {
            Some(_) => Some(count(out[11])?),
            None => None,
        };
        Ok((user, ip, network))
    }

    /// `conversion_count.lua`: add `delta` to `field` (`e` events, `s`
    /// successes) of the slice `slice` (-1: the current one), the slices
    /// `slice_ms` long and kept `keep_ms`; answers the slice counted in.
    pub(super) async fn count_conversion(
        &self,
        key: &str,
        field: &'static str,
        delta: i64,
        slice: i64,
        slice_ms: u64,
        keep_ms: u64,
    ) -> Result<i64, StoreError> {
        let args = || {
            vec![
                Value::from(field),
                Value::from(delta),
                Value::from(slice),
                int(slice_ms),
                int(keep_ms),
            ]
        };
        self.eval(&self.scripts.conversion_count, &[key], args)
            .await
    }

    /// Run a script that answers an array of `len` integers.
    pub(super) async fn eval_ints(
        &self,
        script: &Script,
        keys: &[&str],
        args: impl Fn() -> Vec<Value> + Send + Sync,
        len: usize,
    ) -> Result<Vec<i64>, StoreError> {
        let out: Vec<i64> = self.eval(script, keys, args).await?;
        if out.len() != len {
            return Err(StoreError::Protocol(format!(
                "expected {len} integers from the script, got {}",
                out.len()
            )));
        }
        Ok(out)
    }
}

/// The answer of `reserve.lua` or `login_attempt.lua`: `len` integers
/// packed as little-endian doubles.
/// Each is cut to an integer as Redis cuts a Lua number it answers. Public
/// for the lean limit (`examples/lean_login.rs`).
pub fn unpack_answer(packed: &[u8], len: usize) -> Result<Vec<i64>, StoreError> {
    if packed.len() != 8 * len {
        return Err(StoreError::Protocol(format!(
            "expected {len} numbers ({} bytes) from the script, got {} bytes",
            8 * len,
            packed.len()
        )));
    }
    Ok(packed
        .chunks_exact(8)
        .map(|c| {
            let mut le = [0u8; 8];
            le.copy_from_slice(c);
            // saturating, NaN to 0: as Redis's (long long) cast of a Lua number
            f64::from_le_bytes(le) as i64
        })
        .collect())
}

/// Read `reserve.lua`'s answer (its length already checked): whether the
/// event was recorded, each subject's part, then six numbers a conversion.
fn reserve_answer(
    out: &[i64],
    subjects: &[SubjectWindows<'_>],
) -> Result<ReserveOutcome, StoreError> {
    let recorded = out[0] == 1;
    let mut outcomes = Vec::with_capacity(subjects.len());
    let mut at = 1;
    for subject in subjects {
        let n = subject.windows.len();
        let waits = if has_observe(subject.windows) { n } else { 0 };
        let part = &out[at..at + 4 + n + waits];
        at += 4 + n + waits;
        outcomes.push(subject_outcome(part, n, recorded)?);
    }
    let conversions = out[at..]
        .chunks_exact(6)
        .map(conversion_outcome)
        .collect::<Result<_, _>>()?;
    Ok(ReserveOutcome {
        outcomes,
        conversions,
        recorded,
        by_fallback: false,
    })
}

/// One subject's part of the answer: verdict, window, retry, next retry,
/// then a count per window (`n`) and, when it observes, a wait per window.
fn subject_outcome(part: &[i64], n: usize, recorded: bool) -> Result<HitOutcome, StoreError> {
    let verdict = match part[0] {
        0 => HitVerdict::Allowed,
        1 => HitVerdict::Denied {
            window: window_index(part[1], n)?,
            retry_after_ms: wait(part[2]),
        },
        2 => HitVerdict::Gated {
            window: window_index(part[1], n)?,
        },
        v => {
            return Err(StoreError::Protocol(format!(
                "bad verdict {v} from reserve"
            )))
        }
    };
    Ok(HitOutcome {
        verdict,
        added: recorded,
        counts: part[4..4 + n]
            .iter()
            .map(|c| count(*c))
            .collect::<Result<_, _>>()?,
        next_retry_after_ms: wait(part[3]),
        observed_waits: part[4 + n..].iter().map(|w| wait(*w)).collect(),
    })
}

/// One conversion's part of `reserve.lua`'s answer: verdict, events,
/// successes, retry_after_ms, slice counted in (-1: none), normal.
fn conversion_outcome(part: &[i64]) -> Result<ConversionOutcome, StoreError> {
    let verdict = match part[0] {
        0 => ConversionVerdict::Open,
        1 => ConversionVerdict::Blocked {
            retry_after_ms: wait(part[3]),
        },
        2 => ConversionVerdict::Tripped,
        3 => ConversionVerdict::Challenged {
            retry_after_ms: wait(part[3]),
        },
        4 => ConversionVerdict::ChallengeTripped,
        v => {
            return Err(StoreError::Protocol(format!(
                "bad conversion verdict {v} from reserve"
            )))
        }
    };
    Ok(ConversionOutcome {
        verdict,
        events: count(part[1])?,
        successes: count(part[2])?,
        counted_in: u64::try_from(part[4]).ok(),
        normal_milli: wait(part[5]),
    })
}

pub(super) fn int(v: u64) -> Value {
    Value::from(i64::try_from(v).unwrap_or(i64::MAX))
}

fn has_meter(windows: &[WindowSpec]) -> bool {
    windows.iter().any(WindowSpec::is_meter)
}

fn has_log(windows: &[WindowSpec]) -> bool {
    windows.iter().any(|w| !w.is_meter())
}

fn has_observe(windows: &[WindowSpec]) -> bool {
    windows.iter().any(|w| w.mode == WindowMode::Observe)
}

/// A flag as the string `"1"` or `"0"` (what Redis hands the script either
/// way): an integer argument costs fred a floating-point log10 to size it.
pub(super) fn flag(v: bool) -> Value {
    Value::from_static(if v { b"1" } else { b"0" })
}

pub(super) fn count(v: i64) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Protocol(format!("bad count {v} from the script")))
}

/// A wait in ms; never negative (a clock step on the server could make it so).
pub(super) fn wait(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

pub(super) fn window_index(v: i64, n: usize) -> Result<usize, StoreError> {
    usize::try_from(v)
        .ok()
        .filter(|i| *i < n)
        .ok_or_else(|| StoreError::Protocol(format!("bad window index {v} from the script")))
}

pub(super) fn no_windows() -> StoreError {
    StoreError::Protocol("a window call needs at least one window".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(values: &[f64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn the_answer_unpacks_to_its_integers_in_order() {
        let out = unpack_answer(&packed(&[1.0, 0.0, -1.0, 86_400_000.0, 2.0e15]), 5);
        assert_eq!(
            out.ok(),
            Some(vec![1, 0, -1, 86_400_000, 2_000_000_000_000_000])
        );
    }

    #[test]
    fn an_answer_of_another_length_is_a_protocol_error() {
        let short = unpack_answer(&packed(&[1.0, 0.0]), 3);
        assert!(matches!(short, Err(StoreError::Protocol(_))), "{short:?}");
        let ragged = unpack_answer(&[0u8; 17], 2);
        assert!(matches!(ragged, Err(StoreError::Protocol(_))), "{ragged:?}");
    }
}
