//! The in-process window store: the semantics of the Lua scripts in `lua/`,
//! for a single instance and for tests.
//!
//! Keys are sharded by their Redis Cluster hash tag (the `{...}` part, see
//! [`Keys`](super::Keys)), so all of one subject's keys live under one map entry
//! and every operation runs under that subject's lock, which makes
//! `login_attempt` (window key + lock key) atomic just like its script. Values
//! and expiries mirror the Redis ones: a window key lives for the longest window
//! after a hit, a lock key `escalation_reset_ms` past the lock's end, a code for
//! its TTL; an entry counts as gone once `now > expires_at`, as in Redis.
//! [`MemoryStore::sweep`] frees expired entries.

use std::sync::Arc;

use async_trait::async_trait;
use dashmap::DashMap;
use subtle::ConstantTimeEq;

use self::entry::{wrong_type, Entry, Subject, Value};
use self::meter::Meters;
use self::window::{verdict, Window};
use super::{
    Clock, HitOutcome, HitRequest, HitVerdict, Keys, LoginAttemptOutcome, LoginAttemptRequest,
    LoginPolicy, LoginStateOutcome, OtpOutcome, PeekOutcome, StoreError, WindowMode, WindowSpec,
    WindowStore,
};

mod entry;
mod login;
mod meter;
mod window;

/// The in-process store: one instance only, state lost on restart.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    subjects: DashMap<String, Subject>,
}

impl MemoryStore {
    /// An empty store that reads the time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            subjects: DashMap::new(),
        }
    }

    /// Drop expired entries, and subjects left without any. Call periodically.
    pub fn sweep(&self) {
        let now = self.clock.now_ms();
        self.subjects.retain(|_, subject| {
            subject.entries.retain(|_, entry| !entry.expired(now));
            !subject.entries.is_empty()
        });
    }

    /// Whether `key` holds a live (unexpired) value, like Redis `EXISTS`.
    pub fn contains_key(&self, key: &str) -> bool {
        let now = self.clock.now_ms();
        self.subjects
            .get(shard_of(key))
            .and_then(|s| s.entries.get(key).map(|e| !e.expired(now)))
            .unwrap_or(false)
    }

    /// Run `f` on the subject that owns `key`, under that subject's lock.
    fn with_subject<T>(&self, key: &str, f: impl FnOnce(&mut Subject) -> T) -> T {
        let shard = shard_of(key);
        if let Some(mut subject) = self.subjects.get_mut(shard) {
            return f(&mut subject);
        }
        let mut subject = self.subjects.entry(shard.to_owned()).or_default();
        f(&mut subject)
    }
}

/// The hash tag of a key by the Redis Cluster rule: the text between the first
/// `{` and the next `}` when not empty; else the whole key.
fn shard_of(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        let rest = &key[open + 1..];
        if let Some(close) = rest.find('}') {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// A window's count now: from the log, or from the subject's meters.
fn count_of(window: &Window, meters: &Meters, w: &WindowSpec, now: u64) -> u32 {
    if w.is_meter() {
        meters.count(w, now)
    } else {
        window.count(now, w.window_ms)
    }
}

/// How long until a window admits one more event (0: at once).
fn wait_of(window: &Window, meters: &Meters, w: &WindowSpec, now: u64) -> u64 {
    if w.is_meter() {
        meters.wait(w, now)
    } else {
        window.wait(now, w.limit, w.window_ms)
    }
}

fn no_windows() -> StoreError {
    StoreError::Protocol("a window call needs at least one window".into())
}

#[async_trait]
impl WindowStore for MemoryStore {
    async fn hit(&self, req: HitRequest<'_>) -> Result<HitOutcome, StoreError> {
        let specs = req.windows;
        if specs.is_empty() {
            return Err(no_windows());
        }
        let logs = || specs.iter().filter(|w| !w.is_meter());
        let longest_log = logs().map(|w| w.window_ms).max();
        let keep = logs().map(|w| w.limit).max().unwrap_or(0) as usize;
        let longest_meter = specs
            .iter()
            .filter(|w| w.is_meter())
            .map(|w| w.window_ms)
            .max();
        let meter_key = Keys::meter_for(req.key, specs);
        let now = self.clock.now_ms();
        self.with_subject(req.key, |subject| {
            let mut meters = match &meter_key {
                Some(key) => subject.meters(key, now)?,
                None => Meters::default(),
            };
            let outcome = subject.change_window(req.key, now, |window| {
                if let Some(longest) = longest_log {
                    window.prune(now, longest);
                }
                let count = |window: &Window, meters: &Meters, w| count_of(window, meters, w, now);
                let wait = |window: &Window, meters: &Meters, w| wait_of(window, meters, w, now);
                let counts: Vec<u32> = specs.iter().map(|w| count(window, &meters, w)).collect();
                let verdict = verdict(specs, &counts, req.gate_open, |i| {
                    wait(window, &meters, &specs[i])
                });
                // Before the event is added: the wait it would have met.
                let observed_waits = if specs.iter().any(|w| w.mode == WindowMode::Observe) {
                    specs
                        .iter()
                        .zip(&counts)
                        .map(|(w, count)| match w.mode {
                            WindowMode::Observe if *count >= w.limit => wait(window, &meters, w),
                            _ => 0,
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let added = verdict == HitVerdict::Allowed || req.force;
                if added {
                    if longest_log.is_some() {
                        window.add(now, req.member);
                    }
                    for w in specs.iter().filter(|w| w.is_meter()) {
                        meters.add(w, now);
                    }
                }
                window.trim(keep);
                let next_retry_after_ms = specs
                    .iter()
                    .filter(|w| w.mode == WindowMode::Enforce)
                    .map(|w| wait(window, &meters, w))
                    .max()
                    .unwrap_or(0);
                // As in Redis, only a recorded event moves the key's expiry.
                let expires_at = longest_log.filter(|_| added).map(|longest| now + longest);
                let outcome = HitOutcome {
                    verdict,
                    added,
                    counts,
                    next_retry_after_ms,
                    observed_waits,
                };
                (outcome, expires_at)
            })?;
            if let (Some(key), Some(longest), true) = (&meter_key, longest_meter, outcome.added) {
                subject.put_meters(key, meters, Some(now + longest));
            }
            Ok(outcome)
        })
    }

    async fn peek(&self, key: &str, windows: &[WindowSpec]) -> Result<PeekOutcome, StoreError> {
        if windows.is_empty() {
            return Err(no_windows());
        }
        let now = self.clock.now_ms();
        let meter_key = Keys::meter_for(key, windows);
        self.with_subject(key, |subject| {
            let meters = match &meter_key {
                Some(key) => subject.meters(key, now)?,
                None => Meters::default(),
            };
            subject.read_window(key, now, |window| PeekOutcome {
                counts: windows
                    .iter()
                    .map(|w| count_of(window, &meters, w, now))
                    .collect(),
                retry_after_ms: windows
                    .iter()
                    .map(|w| wait_of(window, &meters, w, now))
                    .collect(),
            })
        })
    }

    async fn undo(
        &self,
        key: &str,
        member: &str,
        windows: &[WindowSpec],
    ) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        let meter_key = Keys::meter_for(key, windows);
        self.with_subject(key, |subject| {
            if let Some(meter_key) = &meter_key {
                if subject.live(meter_key, now).is_some() {
                    let mut meters = subject.meters(meter_key, now)?;
                    for w in windows.iter().filter(|w| w.is_meter()) {
                        meters.remove(w);
                    }
                    subject.put_meters(meter_key, meters, None);
                }
            }
            if subject.live(key, now).is_none() {
                return Ok(());
            }
            subject.change_window(key, now, |window| {
                window.remove(member);
                ((), None)
            })
        })
    }

    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError> {
        let now = self.clock.now_ms();
        // Both keys share the subject's hash tag, so they are in this shard.
        self.with_subject(req.window_key, |subject| login::attempt(subject, &req, now))
    }

    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        pair_lock_key: Option<&str>,
        policy: &LoginPolicy,
    ) -> Result<LoginStateOutcome, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(window_key, |subject| {
            login::state(subject, window_key, lock_key, pair_lock_key, policy, now)
        })
    }

    async fn index_members(&self, key: &str, max: usize) -> Result<Vec<String>, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, |subject| {
            subject.read_window(key, now, |index| index.newest(max))
        })
    }

    async fn otp_put(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, |subject| {
            subject.entries.remove(key);
            if ttl_ms > 0 {
                subject.entries.insert(
                    key.to_owned(),
                    Entry {
                        value: Value::Otp {
                            mac: mac.to_owned(),
                            left: attempts,
                            exp: now + ttl_ms,
                        },
                        expires_at: Some(now + ttl_ms),
                    },
                );
            }
        });
        Ok(())
    }

    async fn otp_check(&self, key: &str, mac: &str) -> Result<OtpOutcome, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, |subject| {
            let entry = match subject.live(key, now) {
                None => return Ok(OtpOutcome::Missing),
                Some(entry) => entry,
            };
            let Value::Otp {
                mac: stored,
                left,
                exp,
            } = &mut entry.value
            else {
                return Err(wrong_type(key, &entry.value, "otp"));
            };
            if *left == 0 {
                return Ok(OtpOutcome::Burnt {
                    retry_after_ms: exp.saturating_sub(now),
                });
            }
            if bool::from(stored.as_bytes().ct_eq(mac.as_bytes())) {
                subject.entries.remove(key);
                return Ok(OtpOutcome::Valid);
            }
            *left -= 1;
            Ok(OtpOutcome::Wrong {
                attempts_left: *left,
            })
        })
    }

    async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        for key in keys {
            self.with_subject(key, |subject| subject.entries.remove(key));
        }
        Ok(())
    }

    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, |subject| match subject.live(key, now) {
            Some(Entry {
                value: Value::Text(v),
                ..
            }) => Ok(v.clone()),
            Some(e) => Err(wrong_type(key, &e.value, "text")),
            None => {
                subject.entries.insert(
                    key.to_owned(),
                    Entry {
                        value: Value::Text(candidate.to_owned()),
                        expires_at: None,
                    },
                );
                Ok(candidate.to_owned())
            }
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Keys, ManualClock};

    #[test]
    fn the_shard_is_the_hash_tag_or_the_whole_key() {
        assert_eq!(shard_of("tg:{user:alice}:lock"), "user:alice");
        assert_eq!(shard_of("tg:secret:otp"), "tg:secret:otp");
        assert_eq!(shard_of("tg:{}:x{a}"), "tg:{}:x{a}");
        assert_eq!(shard_of("tg:{open"), "tg:{open");
    }

    #[tokio::test]
    async fn sweep_frees_expired_windows_and_empty_subjects() {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let keys = Keys::new("t");
        let key = keys.window("phone", "1", "sms_send");
        let windows = [WindowSpec::enforce(5, 1_000), WindowSpec::enforce(9, 3_000)];
        let req = HitRequest {
            key: &key,
            windows: &windows,
            member: "m1",
            gate_open: false,
            force: false,
        };
        store.hit(req).await.unwrap();

        clock.advance_ms(3_000);
        store.sweep();
        assert!(store.contains_key(&key), "still held at the window's end");
        assert_eq!(store.subjects.len(), 1);

        clock.advance_ms(1);
        store.sweep();
        assert!(!store.contains_key(&key));
        assert_eq!(store.subjects.len(), 0, "the empty subject is freed");
    }
}
