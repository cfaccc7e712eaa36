//! One-time codes in the in-process store: the twin of `lua/otp_put.lua`
//! and `lua/otp_check.lua`.

use subtle::ConstantTimeEq;

use super::entry::{wrong_type, Entry, Subject, Value};
use crate::store::{OtpOutcome, StoreError};

impl Subject {
    /// `WindowStore::otp_put`: replace the code at `key` with `mac`, whose
    /// send was `counted` by the pumping guard or not.
    pub(super) fn put_otp(
        &mut self,
        key: &str,
        (mac, counted): (&str, bool),
        attempts: u32,
        ttl_ms: u64,
        now: u64,
    ) {
        self.entries.remove(key);
        if ttl_ms > 0 {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::Otp {
                        mac: mac.to_owned(),
                        left: attempts,
                        counted,
                    },
                    expires_at: Some(now + ttl_ms),
                },
            );
        }
    }

    /// `WindowStore::otp_check`: compare in constant time, use up an
    /// attempt on a miss. Without a code, a stand-in with an empty MAC
    /// (which nothing matches) and `attempts` tries for `ttl_ms` takes the
    /// try, so that the answer is the one a pending code gives.
    pub(super) fn check_otp(
        &mut self,
        key: &str,
        mac: &str,
        (attempts, ttl_ms): (u32, u64),
        now: u64,
    ) -> Result<OtpOutcome, StoreError> {
        if self.live(key, now).is_none() {
            self.put_otp(key, ("", true), attempts, ttl_ms, now);
        }
        let Some(entry) = self.live(key, now) else {
            // A TTL of 0 keeps nothing: the try burns at once.
            return Ok(OtpOutcome::Wrong { attempts_left: 0 });
        };
        let Value::Otp {
            mac: stored,
            left,
            counted,
        } = &mut entry.value
        else {
            return Err(wrong_type(key, &entry.value, "otp"));
        };
        if *left == 0 {
            // A code's ttl, not its expiry, which would tell whether and
            // when a code was sent (otp_check.lua).
            return Ok(OtpOutcome::Burnt {
                retry_after_ms: ttl_ms,
            });
        }
        let matches = bool::from(stored.as_bytes().ct_eq(mac.as_bytes())) && !stored.is_empty();
        if matches {
            let (attempts_left, counted) = (*left, *counted);
            self.entries.remove(key);
            return Ok(OtpOutcome::Valid {
                attempts_left,
                counted,
            });
        }
        *left -= 1;
        Ok(OtpOutcome::Wrong {
            attempts_left: *left,
        })
    }
}
