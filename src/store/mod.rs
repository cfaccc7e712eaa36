//! The window store: sliding-window counters, login locks and one-time codes.
//!
//! Every operation here is atomic per subject. On Redis each is one Lua script
//! call whose keys share the subject's hash tag; in-process each runs under the
//! subject's lock. Both backends implement exactly the semantics documented on
//! [`WindowStore`], and `tests/api/store_conformance.rs` runs the same cases
//! against both.

pub mod clock;
mod conversion;
pub mod keys;
mod login;
pub mod memory;
pub mod redis;
pub mod resilient;
mod steps;
mod window;

use async_trait::async_trait;

use crate::metrics;

pub use clock::{Clock, ManualClock, SystemClock};
pub use conversion::{
    normal_milli, ConversionBlock, ConversionHit, ConversionOutcome, ConversionPolicy,
    ConversionState, ConversionVerdict, Escalation, ExpiringMembers, Surge, HISTORY_BUCKETS,
};
pub use keys::Keys;
pub use login::{
    pair_member, pair_of_member, FailuresBefore, IpFailureWindow, IpFailures, IpLimits,
    LoginAttemptOutcome, LoginAttemptRequest, LoginOutcome, LoginPolicy, LoginRequest,
    LoginStateOutcome, LoginVerdict, NetworkFailureWindow, NetworkLimits, PairKeys,
    PAIR_INDEX_KEEP,
};
pub use window::{
    CodeToStore, CodeTry, DroppedCode, HitOutcome, HitRequest, HitVerdict, OtpOutcome, PeekOutcome,
    ReserveOutcome, ReserveRequest, RollBack, RuleWindow, SubjectWindows, WindowMode, WindowSpec,
};

/// Why a store call failed; `ResilientStore` applies `store.on_error` to it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within `store.timeout`.
    #[error("store call timed out")]
    Timeout,
    /// The store cannot be reached (disconnected, refused, bad credentials).
    #[error("store unreachable: {0}")]
    Unavailable(String),
    /// An answer the caller cannot read, or a refused call (a key holding another
    /// type, say).
    #[error("store answered something unexpected: {0}")]
    Protocol(String),
}

impl StoreError {
    /// The `kind` this failure is counted under.
    pub fn failure(&self) -> metrics::StoreFailure {
        match self {
            Self::Timeout => metrics::StoreFailure::Timeout,
            Self::Unavailable(_) => metrics::StoreFailure::Unavailable,
            Self::Protocol(_) => metrics::StoreFailure::Refused,
        }
    }
}

/// The window store. Times are milliseconds on the store's clock (Redis `TIME`
/// or the injected [`Clock`]).
///
/// Window semantics: an event at time `t` counts in a window of length `w`
/// while `now - w < t <= now`. At most `max(limit)` newest members are kept
/// (older ones count in no window and go as newer ones come), and a subject's
/// key expires its longest window after its last recorded event.
#[async_trait]
pub trait WindowStore: Send + Sync {
    /// Offer one event to one subject, atomically:
    /// 1. (a backend may drop members older than the longest window);
    /// 2. count every window;
    /// 3. verdict: `Denied` when an `Enforce` window has `count >= limit` (the
    ///    refusing window with the longest wait is reported; its wait is when
    ///    the member at position `count - limit` from the window's oldest
    ///    leaves it); else `Gated` when a `Gate` window is full and
    ///    `!gate_open`; else `Allowed`;
    /// 4. add the member (score = now) when `Allowed` or `force`;
    /// 5. when the member was added: keep the `max(limit)` newest members,
    ///    set the key to expire after the longest window;
    /// 6. compute `next_retry_after_ms` from the counts after the add.
    async fn hit(&self, req: HitRequest<'_>) -> Result<HitOutcome, StoreError>;

    /// Count the windows without recording anything.
    async fn peek(&self, key: &str, windows: &[WindowSpec]) -> Result<PeekOutcome, StoreError>;

    /// Remove a previously recorded event (the roll-back of a reservation)
    /// from the log at `key`, and lower the meters among `windows` by it.
    async fn undo(&self, key: &str, member: &str, windows: &[WindowSpec])
        -> Result<(), StoreError>;

    /// Give a recorded reservation back (a failed delivery): `undo` in
    /// every subject and `conversion_undo` in every conversion, each
    /// failure logged. An event a failure leaves counted stays so until its
    /// window passes: stricter, never looser.
    async fn roll_back(&self, roll_back: &RollBack<'_>) {
        steps::roll_back(self, roll_back).await;
    }

    /// One login outcome for the user alone, atomically with the lock check
    /// and the lock decision:
    /// 1. a live lock → `Locked` (nothing recorded unless `shadow`, and a
    ///    shadow record never starts a new lock);
    /// 2. captcha-window failures `>= captcha_after`, or `captcha_demanded`,
    ///    while `!captcha_passed` → `Challenged` (nothing recorded unless
    ///    `shadow`);
    /// 3. success: with `reset_on_success` the failures are deleted;
    ///    failure: the member is added (trimmed to `max(captcha_after,
    ///    lock_after)` newest, expiry = the longest window); when the
    ///    lock-window count reaches `lock_after` the user is locked for
    ///    `lock_ms * 2^level` capped at `lock_max_ms`, where `level` grows by
    ///    one for each lock that starts within `escalation_reset_ms` of the end
    ///    of the previous lock and resets to 0 otherwise. The lock key expires
    ///    `escalation_reset_ms` after the lock ends.
    ///
    /// With `ip_blocked` the verdict is computed but nothing is recorded
    /// (unless `shadow`).
    ///
    /// `before` answers the failures read before anything was recorded: in
    /// the captcha window, in the lock window and (with `pair`) the pair's
    /// in the lock window, whatever the verdict (the rules' metrics count
    /// against them).
    ///
    /// With `pair`, the (user, IP) pair has a lock of its own: a live pair
    /// lock answers `PairLocked` (after a live account lock, before the
    /// captcha tier); a recorded failure goes into the user's window as
    /// [`pair_member`]`(ip, member)`, and the pair locks when the user's
    /// lock window holds `pair_lock_after` of its failures, escalating as the
    /// user's lock does; the IP then goes into the user's index of locked
    /// pairs (score = now, its 1000 newest kept, expiry = `lock_max_ms +
    /// escalation_reset_ms`, longer than any lock it lists). The account
    /// locks at `lock_after`.
    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError>;

    /// Everything `/sms/send` writes, in as few round trips as the backend
    /// allows. First the conversions ([`WindowStore::conversion_hit`] per
    /// subject): when one blocks and not `force`, nothing else is read or
    /// written (each window subject's outcome is [`HitOutcome::open`]).
    /// Then `member` is offered to every subject ([`WindowStore::hit`]
    /// semantics per subject); when every subject allows it, no conversion
    /// challenges it without `gate_open` (or `force`), the event is recorded
    /// in all of them, the code stored and the event counted in every
    /// conversion, otherwise nothing is written (a conversion's escalation,
    /// once tripped, stays). The provided method checks
    /// the conversions, calls `hit` per subject concurrently and rolls back
    /// (a race can then refuse a request that an atomic call would have
    /// admitted, never the reverse), then counts the recorded event in each
    /// conversion; a backend that can do it atomically in one call
    /// overrides it.
    async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        steps::reserve(self, req).await
    }

    /// One login outcome for a user and its IP (DESIGN.md §3 order): the IP's
    /// failures in its window are counted; the IP is blocked at
    /// `block_after`, and demands a captcha at `captcha_after`; the user's
    /// side is [`WindowStore::login_attempt`] with those two facts; when the
    /// outcome is recorded (see [`LoginOutcome::recorded`]) a failure is
    /// added to the IP's window too (keeping its `max(limits)` newest). The
    /// provided method reads and records the IP first, then the user, and
    /// takes the IP's failure back when the user's side refused; a backend
    /// that can do it atomically in one call overrides it. An IPv6 client's
    /// network (`network`) is a captcha tier beside the IP's, which the
    /// provided method reads and records first, in a call of its own (see
    /// `steps::network_first`).
    async fn login(&self, req: LoginRequest<'_>) -> Result<LoginOutcome, StoreError> {
        steps::login(self, req).await
    }

    /// The user's lock and failure counts, and the lock at `pair_lock_key`
    /// when given; records nothing. Unless `shadow`, a lock a shadow call
    /// wrote does not hold.
    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        pair_lock_key: Option<&str>,
        policy: &LoginPolicy,
        shadow: bool,
    ) -> Result<LoginStateOutcome, StoreError>;

    /// The members of the index at `key` (a user's pair index), newest first,
    /// at most `max`.
    async fn index_members(&self, key: &str, max: usize) -> Result<Vec<String>, StoreError>;

    /// The members of the window at `key` scored within the last
    /// `window_ms`, newest first, at most `max`.
    async fn recent_members(
        &self,
        key: &str,
        window_ms: u64,
        max: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// Offer one event to one subject's conversion counters, atomically:
    /// 1. slices older than the policy's last `slices()` are dropped; with a
    ///    [`Surge`], each that [teaches](ConversionPolicy::teaches) adds its
    ///    events to its history bucket first, and buckets older than the
    ///    [`HISTORY_BUCKETS`] before the current one are dropped; the normal
    ///    is [`ConversionPolicy::normal`] of the events in those buckets;
    /// 2. a live escalation answers with the figures (and normal) it was set
    ///    on: an enforced one always, a shadow one only when `force`. A
    ///    block → `Blocked`; a challenge → `Challenged`, unless the policy
    ///    escalates, `force` is the challenge's own mode, and the slices from
    ///    the challenge's first on [surge](ConversionPolicy::surges): then
    ///    those counters are deleted (the history stays) and a block is set
    ///    for `block_ms` on their figures, the normal now and the
    ///    challenge's mode → `Tripped`;
    /// 3. otherwise the window's events and successes are summed; when they
    ///    [trip](ConversionPolicy::trips) a policy without a surge, the
    ///    counters are deleted and a block is set for `block_ms` with those
    ///    figures → `Tripped`; when they [surge](ConversionPolicy::surges)
    ///    under a policy with one, a challenge is set for `block_ms` with
    ///    those figures and the normal, its first slice the next one, the
    ///    counters kept → `ChallengeTripped`; either marked shadow when
    ///    `force`. The key then lives [`ConversionPolicy::trip_keep_ms`].
    ///
    /// The event itself is not counted here ([`WindowStore::reserve`] or
    /// [`WindowStore::conversion_count`] count it once it is recorded), so
    /// that requests refused meanwhile never count towards a block.
    async fn conversion_hit(
        &self,
        hit: ConversionHit<'_>,
        force: bool,
    ) -> Result<ConversionOutcome, StoreError>;

    /// Count one event (a recorded send) in the current slice
    /// (`now / slice_ms`), and answer that slice; the key then expires after
    /// [`ConversionPolicy::keep_ms`], or after its escalation when that ends
    /// later. `None`: nothing was counted (a store failing open).
    async fn conversion_count(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<Option<u64>, StoreError>;

    /// Take back an event counted in `slice` (a send that was not delivered
    /// after all); a slice never goes below zero.
    async fn conversion_undo(&self, key: &str, slice: u64) -> Result<(), StoreError>;

    /// Count one success (a verified code) in the current slice.
    async fn conversion_success(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<(), StoreError>;

    /// A subject's counts in the window, its normal (as step 1 of
    /// [`WindowStore::conversion_hit`] would find it) and its live
    /// escalation (shadow or not), recording nothing.
    async fn conversion_state(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<ConversionState, StoreError>;

    /// Put `member` in the expiring set at `key` until `ttl_ms` from now
    /// (replacing its time), dropping the members whose time has passed.
    async fn expiring_add(&self, key: &str, member: &str, ttl_ms: u64) -> Result<(), StoreError>;

    /// Take `member` out of the expiring set at `key`.
    async fn expiring_remove(&self, key: &str, member: &str) -> Result<(), StoreError>;

    /// The live members of the expiring set at `key`, latest-ending first, at
    /// most `limit` of them, and how many there are.
    async fn expiring_members(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<ExpiringMembers, StoreError>;

    /// Store a one-time code's MAC, replacing any previous one. `counted`:
    /// whether its send was counted by the pumping guard, which `otp_check`
    /// hands back with a right code (a code `reserve` stores is counted).
    /// The live code it replaces (a sent one, burnt or not, with the tries
    /// it has left; not a stand-in) is kept beside it for `otp_drop`; so
    /// does `reserve`.
    async fn otp_put(&self, code: CodeToStore<'_>, counted: bool) -> Result<(), StoreError>;

    /// Check a code: a match deletes it (`Valid`, single use); a miss uses up
    /// one attempt (`Wrong`), the last one burns it (kept until its expiry so
    /// that further tries answer `Burnt`). The address that asked for the
    /// code has its own attempts; every other address shares as many again,
    /// and using them up refuses only those addresses. Without a code at
    /// `key` (never put, used, expired) a stand-in is put first that no MAC
    /// matches and no address asked for, with `attempts` tries for
    /// `ttl_ms`, and the try is a miss on it: the answers never tell
    /// whether a code was pending.
    async fn otp_check(&self, code: CodeTry<'_>) -> Result<OtpOutcome, StoreError>;

    /// Delete the code at `key` if it is still the one sealed as `mac`, and
    /// put back the code it replaced, if still live, with the tries that
    /// one had left: a failed delivery takes back its own code, never one a
    /// racing send has put since (whose SMS went out), and leaves the
    /// phone's earlier code as it was. When a racing send has replaced it,
    /// that send forgets it, so that a code no SMS carried never comes back.
    /// What the failed code, stored with `attempts` tries, had come to
    /// (here, or where a racing send kept it).
    async fn otp_drop(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
    ) -> Result<DroppedCode, StoreError>;

    /// The code at `key` sealed as `mac` was delivered, or may have been
    /// (its provider timed out): the newest code now. A store that holds
    /// another code for `key` elsewhere lets it go (the fallback's local
    /// copy from an outage, which until then stays the one checked, so that
    /// it is still there should this code's delivery fail).
    fn code_delivered(&self, _key: &str, _mac: &str) {}

    /// Delete keys (an admin unblock).
    async fn delete(&self, keys: &[String]) -> Result<(), StoreError>;

    /// Set `key` to `candidate` unless it holds a value; return the stored value.
    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError>;

    /// Reachability, for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether the store takes a write (at `key`, which expires) and runs
    /// a decision's kind of script, for `/readyz`: a Redis over `maxmemory`
    /// under `noeviction` answers `PING` but refuses every write a request
    /// makes; a Redis user refused scripts, or a proxy refusing keys of
    /// several slots, takes the write and fails every decision.
    async fn writable(&self, key: &str) -> Result<(), StoreError>;
}
