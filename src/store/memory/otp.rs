//! One-time codes in the in-process store: the twin of `lua/otp_put.lua`,
//! `lua/otp_check.lua` and `lua/otp_drop.lua`.

use subtle::ConstantTimeEq;

use super::entry::{wrong_type, Entry, KeptCode, StoredCode, Subject, Value};
use crate::store::{CodeToStore, CodeTry, DroppedCode, OtpOutcome, StoreError};

/// How many replaced codes a code keeps (otp_keep.lua): one for a resend,
/// more for sends that overlap, each of which may fail while the others
/// are in flight.
const KEPT_MAX: usize = 8;

impl Subject {
    /// `WindowStore::otp_put`: replace the code at `code.key`, whose send
    /// was `counted` by the pumping guard or not, keeping the live code it
    /// replaces (a sent one, not a stand-in) ahead of those that one kept.
    pub(super) fn put_otp(&mut self, code: CodeToStore<'_>, counted: bool, now: u64) {
        let kept = self
            .entries
            .remove(code.key)
            .map_or_else(Vec::new, |e| kept_after(e, now));
        if code.ttl_ms > 0 {
            self.entries.insert(
                code.key.to_owned(),
                Entry {
                    value: Value::Otp {
                        code: StoredCode {
                            mac: code.mac.to_owned(),
                            left: code.attempts,
                            others_left: code.attempts,
                            asker: code.asker.to_owned(),
                            counted,
                        },
                        kept,
                    },
                    expires_at: Some(now + code.ttl_ms),
                },
            );
        }
    }

    /// `WindowStore::otp_drop`: while the code at `key` is the one sealed as
    /// `mac`, delete it and put back the code it replaced (the first it
    /// kept) if that one is still live, with the codes kept behind it; when
    /// a racing send has replaced it since, that send takes it out of those
    /// it kept, so that it never comes back (otp_drop.lua). What the failed
    /// code, stored with `attempts` tries, had come to.
    pub(super) fn drop_otp(
        &mut self,
        key: &str,
        mac: &str,
        attempts: u32,
        now: u64,
    ) -> DroppedCode {
        let found = |code: &StoredCode| {
            if code.left == attempts && code.others_left == attempts {
                DroppedCode::Untried
            } else {
                DroppedCode::Tried
            }
        };
        let Some(entry) = self.live(key, now) else {
            return DroppedCode::Absent;
        };
        let Value::Otp {
            code: current,
            kept,
        } = &mut entry.value
        else {
            return DroppedCode::Absent;
        };
        if current.mac != mac {
            let kept_here = kept.iter().find(|k| k.code.mac == mac);
            let dropped = kept_here.map_or(DroppedCode::Absent, |k| found(&k.code));
            kept.retain(|k| k.code.mac != mac);
            return dropped;
        }
        let dropped = found(current);
        let mut kept = std::mem::take(kept).into_iter();
        self.entries.remove(key);
        // Only the first: one further back was replaced by a send whose SMS
        // may have gone (otp_drop.lua).
        if let Some(back) = kept.next().filter(|k| k.expires_at > now) {
            let value = Value::Otp {
                code: back.code,
                kept: kept.collect(),
            };
            let expires_at = Some(back.expires_at);
            self.entries
                .insert(key.to_owned(), Entry { value, expires_at });
        }
        dropped
    }

    /// `WindowStore::otp_check`: compare in constant time, use up an
    /// attempt on a miss: the asker's own, or everyone else's. Without a
    /// code, a stand-in with an empty MAC (which nothing matches), no asker
    /// and `attempts` tries for `ttl_ms` takes the try, so that the answer
    /// is the one a pending code gives.
    pub(super) fn check_otp(
        &mut self,
        code: CodeTry<'_>,
        now: u64,
    ) -> Result<OtpOutcome, StoreError> {
        let key = code.key;
        if self.live(key, now).is_none() {
            let stand_in = CodeToStore {
                key,
                mac: "",
                attempts: code.attempts,
                ttl_ms: code.ttl_ms,
                asker: "",
            };
            self.put_otp(stand_in, true, now);
        }
        let Some(entry) = self.live(key, now) else {
            // A TTL of 0 keeps nothing: the try burns at once.
            return Ok(OtpOutcome::Wrong { attempts_left: 0 });
        };
        let Value::Otp {
            code:
                StoredCode {
                    mac: stored,
                    left,
                    others_left,
                    asker,
                    counted,
                },
            ..
        } = &mut entry.value
        else {
            return Err(wrong_type(key, &entry.value, "otp"));
        };
        let own = !asker.is_empty() && asker == code.client;
        let burnt = *left == 0;
        let tries = if own { left } else { others_left };
        if burnt || *tries == 0 {
            // A code's ttl, not its expiry, which would tell whether and
            // when a code was sent (otp_check.lua).
            return Ok(OtpOutcome::Burnt {
                retry_after_ms: code.ttl_ms,
            });
        }
        let matches =
            bool::from(stored.as_bytes().ct_eq(code.mac.as_bytes())) && !stored.is_empty();
        if matches {
            let (attempts_left, counted) = (*tries, *counted);
            self.entries.remove(key);
            return Ok(OtpOutcome::Valid {
                attempts_left,
                counted,
            });
        }
        *tries -= 1;
        Ok(OtpOutcome::Wrong {
            attempts_left: *tries,
        })
    }
}

/// What a code written over `entry` keeps: the code it held, if that is a
/// live one that was sent (a stand-in, with its empty MAC, is none), ahead
/// of the codes that one kept, at most `KEPT_MAX`.
fn kept_after(entry: Entry, now: u64) -> Vec<KeptCode> {
    let Some(expires_at) = entry.expires_at.filter(|&at| at > now) else {
        return Vec::new();
    };
    match entry.value {
        Value::Otp { code, kept } if !code.mac.is_empty() => {
            let newest = KeptCode { code, expires_at };
            std::iter::once(newest).chain(kept).take(KEPT_MAX).collect()
        }
        _ => Vec::new(),
    }
}
