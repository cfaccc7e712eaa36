//! One-time codes in the in-process store: the twin of `lua/otp_put.lua`,
//! `lua/otp_check.lua` and `lua/otp_drop.lua`.

use subtle::ConstantTimeEq;

use super::entry::{wrong_type, Entry, Subject, Value};
use crate::store::{CodeToStore, CodeTry, OtpOutcome, StoreError};

impl Subject {
    /// `WindowStore::otp_put`: replace the code at `code.key`, whose send
    /// was `counted` by the pumping guard or not.
    pub(super) fn put_otp(&mut self, code: CodeToStore<'_>, counted: bool, now: u64) {
        self.entries.remove(code.key);
        if code.ttl_ms > 0 {
            self.entries.insert(
                code.key.to_owned(),
                Entry {
                    value: Value::Otp {
                        mac: code.mac.to_owned(),
                        left: code.attempts,
                        others_left: code.attempts,
                        asker: code.asker.to_owned(),
                        counted,
                    },
                    expires_at: Some(now + code.ttl_ms),
                },
            );
        }
    }

    /// `WindowStore::otp_drop`: delete the code at `key` if it is the one
    /// sealed as `mac`.
    pub(super) fn drop_otp(&mut self, key: &str, mac: &str, now: u64) {
        let sealed_so = self
            .live(key, now)
            .is_some_and(|e| matches!(&e.value, Value::Otp { mac: m, .. } if m == mac));
        if sealed_so {
            self.entries.remove(key);
        }
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
            mac: stored,
            left,
            others_left,
            asker,
            counted,
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
