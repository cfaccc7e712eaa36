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
//!
//! Every call re-counts the bytes of the subject it touched against the
//! store's memory limit (`budget.rs`); past it, the least recently touched
//! subjects that are not locked are evicted.
//!
//! A request of several subjects (`reserve`, `login`) runs the provided
//! steps (`steps.rs`: each subject, then taking back what a refusal made
//! unwanted) one request at a time, as the Lua scripts are atomic: between
//! a request's reservation and its take-back, another could find a slot
//! held and be refused for it (a victim's phone refused, and audited as
//! refused, by a send whose address was refused).

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use dashmap::DashMap;

use self::budget::Budget;
use self::conversion::Conversion;
use self::entry::{wrong_type, Entry, Subject, Value};
use self::expiring::Expiring;
use super::{
    Clock, CodeToStore, CodeTry, ConversionHit, ConversionOutcome, ConversionPolicy,
    ConversionState, DroppedCode, ExpiringMembers, HitOutcome, HitRequest, LoginAttemptOutcome,
    LoginAttemptRequest, LoginOutcome, LoginPolicy, LoginRequest, LoginStateOutcome, OtpOutcome,
    PeekOutcome, ReserveOutcome, ReserveRequest, StoreError, WindowSpec, WindowStore,
};

mod budget;
mod conversion;
mod entry;
mod expiring;
mod login;
mod meter;
mod otp;
mod window;
mod windows;

thread_local! {
    static IN_ONE_REQUEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread runs a request's steps under `one_request`
/// (`MemoryStore::one_request_at_a_time`) while it lives, even through a
/// panic.
struct InOneRequest;

impl InOneRequest {
    fn enter() -> Self {
        IN_ONE_REQUEST.with(|flag| flag.set(true));
        Self
    }

    fn here() -> bool {
        IN_ONE_REQUEST.with(std::cell::Cell::get)
    }
}

impl Drop for InOneRequest {
    fn drop(&mut self) {
        IN_ONE_REQUEST.with(|flag| flag.set(false));
    }
}

/// The in-process store: one instance only, state lost on restart.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    subjects: DashMap<String, Subject>,
    budget: Budget,
    /// Held through a request of several subjects (see the module doc).
    one_request: parking_lot::Mutex<()>,
}

impl MemoryStore {
    /// An empty store that reads the time from `clock`, without a memory
    /// limit (tests and benchmarks).
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_limit(clock, usize::MAX)
    }

    /// An empty store that evicts idle subjects once they are counted to
    /// hold more than `limit` bytes (`store.memory_limit`).
    pub fn with_limit(clock: Arc<dyn Clock>, limit: usize) -> Self {
        Self {
            clock,
            subjects: DashMap::new(),
            budget: Budget::new(limit),
            one_request: parking_lot::Mutex::new(()),
        }
    }

    /// Run `steps` (a request of several subjects) under `one_request`.
    /// The in-process steps never wait, so one poll under a thread lock
    /// finishes them: an async lock cost a fifth of the store's logins a
    /// second in task wake-ups. Were a step ever to wait, the rest runs
    /// after the lock, as before it existed. An eviction pass, which walks
    /// every subject, waits until the lock is let go: under it, it would
    /// stall every other request's steps too.
    async fn one_request_at_a_time<T>(&self, steps: impl Future<Output = T>) -> T {
        let mut steps = std::pin::pin!(steps);
        let polled = {
            let _one_request = self.one_request.lock();
            let _no_eviction = InOneRequest::enter();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            steps.as_mut().poll(&mut cx)
        };
        if self.budget.over() {
            self.budget.evict(&self.subjects, self.clock.now_ms());
        }
        if let std::task::Poll::Ready(done) = polled {
            return done;
        }
        debug_assert!(false, "an in-process step waited");
        tracing::warn!("an in-process store step waited: this request ran outside the lock");
        steps.await
    }

    /// The time now, by the store's clock, in ms.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The bytes the subjects are counted to hold now.
    pub fn accounted_bytes(&self) -> usize {
        self.budget.used()
    }

    /// The memory limit, in bytes.
    pub fn memory_limit(&self) -> usize {
        self.budget.limit()
    }

    /// Subjects evicted to stay within the limit since the store was made.
    pub fn evictions(&self) -> u64 {
        self.budget.evictions()
    }

    /// How many subjects the store holds.
    pub fn subject_count(&self) -> usize {
        self.subjects.len()
    }

    /// Drop expired entries, and subjects left without any. Call periodically.
    pub fn sweep(&self) {
        let now = self.clock.now_ms();
        self.subjects.retain(|shard, subject| {
            subject.entries.retain(|_, entry| !entry.expired(now));
            if subject.entries.is_empty() {
                self.budget.recount(subject.bytes, 0);
                return false;
            }
            let bytes = subject.footprint(shard.len());
            self.budget.recount(subject.bytes, bytes);
            subject.bytes = bytes;
            true
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

    /// Delete the code at `key` if it is the one sealed as `mac`.
    pub fn forget_code_sealed_as(&self, key: &str, mac: &str) {
        let now = self.clock.now_ms();
        self.with_subject(key, now, Access::Write, |subject| {
            let sealed_so = subject
                .entries
                .get(key)
                .is_some_and(|e| matches!(&e.value, Value::Otp { code, .. } if code.mac == mac));
            if sealed_so {
                subject.entries.remove(key);
            }
        });
    }

    /// The MAC of the live code at `key` that was sent (burnt or not), if
    /// any: not the stand-in a check without a code leaves.
    pub fn held_code_mac(&self, key: &str) -> Option<String> {
        let now = self.clock.now_ms();
        let shard = self.subjects.get(shard_of(key))?;
        let entry = shard.entries.get(key)?;
        match &entry.value {
            Value::Otp { code, .. } if !entry.expired(now) && !code.mac.is_empty() => {
                Some(code.mac.clone())
            }
            _ => None,
        }
    }

    /// Whether `key` holds a live one-time code that was sent (burnt or
    /// not), not the stand-in a check without a code leaves.
    pub fn holds_code(&self, key: &str) -> bool {
        self.held_code_mac(key).is_some()
    }

    /// Run `f` on the conversion at `key` and the time now, under its
    /// subject's lock (see `Subject::change_conversion`).
    fn with_conversion<T>(
        &self,
        key: &str,
        access: Access,
        f: impl FnOnce(&mut Conversion, u64) -> (T, Option<u64>),
    ) -> Result<T, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, access, |subject| {
            subject.change_conversion(key, now, |c| f(c, now))
        })
    }

    /// Run `f` on the expiring set at `key` and the time now, under its lock.
    fn with_expiring<T>(
        &self,
        key: &str,
        access: Access,
        f: impl FnOnce(&mut Expiring, u64) -> (T, Option<u64>),
    ) -> Result<T, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, access, |subject| {
            subject.change_expiring(key, now, |set| f(set, now))
        })
    }

    /// Run `f` on the subject that owns `key`, under that subject's lock,
    /// at `now`; then re-count its bytes, drop it when `f` left it empty,
    /// and evict when the store is over its limit.
    fn with_subject<T>(
        &self,
        key: &str,
        now: u64,
        access: Access,
        f: impl FnOnce(&mut Subject) -> T,
    ) -> T {
        let shard = shard_of(key);
        let (out, empty) = match self.subjects.get_mut(shard) {
            Some(mut subject) => self.run(&mut subject, shard, now, access, f),
            // A read of a subject the store does not hold sees an empty one,
            // without taking a shard's write lock or keeping anything.
            None if access == Access::Read => return f(&mut Subject::default()),
            None => {
                let mut subject = self.subjects.entry(shard.to_owned()).or_default();
                self.run(&mut subject, shard, now, access, f)
            }
        };
        // The subject's guard is dropped: removing and evicting take shard
        // locks of their own.
        if empty {
            if let Some((_, gone)) = self.subjects.remove_if(shard, |_, s| s.entries.is_empty()) {
                self.budget.recount(gone.bytes, 0);
            }
        }
        if self.budget.over() && !InOneRequest::here() {
            self.budget.evict(&self.subjects, now);
        }
        out
    }

    fn run<T>(
        &self,
        subject: &mut Subject,
        shard: &str,
        now: u64,
        access: Access,
        f: impl FnOnce(&mut Subject) -> T,
    ) -> (T, bool) {
        let out = f(subject);
        if access == Access::Write {
            subject.touched = subject.touched.max(now);
        }
        self.budget.recount_subject(subject, shard);
        (out, subject.entries.is_empty())
    }
}

/// Whether a call changes its subject. Only changes count as a touch for
/// the memory limit: were reads to count, `/login/check` (which records
/// nothing and no limit counts) would let a client keep its own names the
/// newest for free, so that a victim's counters are the oldest and go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
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

#[async_trait]
impl WindowStore for MemoryStore {
    async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        self.one_request_at_a_time(super::steps::reserve(self, req))
            .await
    }

    async fn login(&self, req: LoginRequest<'_>) -> Result<LoginOutcome, StoreError> {
        self.one_request_at_a_time(super::steps::login(self, req))
            .await
    }

    async fn hit(&self, req: HitRequest<'_>) -> Result<HitOutcome, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(req.key, now, Access::Write, |subject| {
            windows::hit(subject, &req, now)
        })
    }

    async fn peek(&self, key: &str, windows: &[WindowSpec]) -> Result<PeekOutcome, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, Access::Read, |subject| {
            self::windows::peek(subject, key, windows, now)
        })
    }

    async fn undo(
        &self,
        key: &str,
        member: &str,
        windows: &[WindowSpec],
    ) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, Access::Write, |subject| {
            self::windows::undo(subject, key, member, windows, now)
        })
    }

    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError> {
        let now = self.clock.now_ms();
        // Both keys share the subject's hash tag, so they are in this shard.
        self.with_subject(req.window_key, now, Access::Write, |subject| {
            login::attempt(subject, &req, now)
        })
    }

    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        pair_lock_key: Option<&str>,
        policy: &LoginPolicy,
        shadow: bool,
    ) -> Result<LoginStateOutcome, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(window_key, now, Access::Read, |subject| {
            login::state(
                subject,
                window_key,
                lock_key,
                pair_lock_key,
                policy,
                shadow,
                now,
            )
        })
    }

    async fn recent_members(
        &self,
        key: &str,
        window_ms: u64,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, Access::Read, |subject| {
            subject.read_window(key, now, |w| w.newest_within(now, window_ms, max))
        })
    }

    async fn index_members(&self, key: &str, max: usize) -> Result<Vec<String>, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, Access::Read, |subject| {
            subject.read_window(key, now, |index| index.newest(max))
        })
    }

    async fn conversion_hit(
        &self,
        hit: ConversionHit<'_>,
        force: bool,
    ) -> Result<ConversionOutcome, StoreError> {
        self.with_conversion(hit.key, Access::Write, |c, now| {
            c.hit(hit.policy, now, force)
        })
    }

    async fn conversion_count(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<Option<u64>, StoreError> {
        self.with_conversion(key, Access::Write, |c, now| {
            let (slice, expires_at) = c.count(policy, now);
            (Some(slice), Some(expires_at))
        })
    }

    async fn conversion_undo(&self, key: &str, slice: u64) -> Result<(), StoreError> {
        self.with_conversion(key, Access::Write, |c, _| (c.undo(slice), None))
    }

    async fn conversion_success(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<(), StoreError> {
        self.with_conversion(key, Access::Write, |c, now| {
            ((), Some(c.success(policy, now)))
        })
    }

    async fn conversion_state(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<ConversionState, StoreError> {
        self.with_conversion(key, Access::Read, |c, now| (c.state(policy, now), None))
    }

    async fn expiring_add(&self, key: &str, member: &str, ttl_ms: u64) -> Result<(), StoreError> {
        self.with_expiring(key, Access::Write, |set, now| {
            ((), Some(set.add(member, now + ttl_ms, now)))
        })
    }

    async fn expiring_remove(&self, key: &str, member: &str) -> Result<(), StoreError> {
        self.with_expiring(key, Access::Write, |set, _| (set.remove(member), None))
    }

    async fn expiring_members(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<ExpiringMembers, StoreError> {
        self.with_expiring(key, Access::Read, |set, now| (set.live(now, limit), None))
    }

    async fn otp_put(&self, code: CodeToStore<'_>, counted: bool) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(code.key, now, Access::Write, |subject| {
            subject.put_otp(code, counted, now)
        });
        Ok(())
    }

    async fn otp_check(&self, code: CodeTry<'_>) -> Result<OtpOutcome, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(code.key, now, Access::Write, |subject| {
            subject.check_otp(code, now)
        })
    }

    async fn otp_drop(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
    ) -> Result<DroppedCode, StoreError> {
        let now = self.clock.now_ms();
        Ok(self.with_subject(key, now, Access::Write, |subject| {
            subject.drop_otp(key, mac, attempts, now)
        }))
    }

    async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        let now = self.clock.now_ms();
        for key in keys {
            self.with_subject(key, now, Access::Write, |subject| {
                subject.entries.remove(key)
            });
        }
        Ok(())
    }

    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        let now = self.clock.now_ms();
        self.with_subject(key, now, Access::Write, |subject| {
            match subject.live(key, now) {
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
            }
        })
    }

    /// Always: at its memory limit the in-process store evicts.
    async fn writable(&self, _key: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod limit_tests;
