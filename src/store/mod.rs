//! The window store: sliding-window counters, login locks and one-time codes.
//!
//! Every operation here is atomic per subject. On Redis each is one Lua script
//! call whose keys share the subject's hash tag; in-process each runs under the
//! subject's lock. Both backends implement exactly the semantics documented on
//! [`WindowStore`], and `tests/api/store_conformance.rs` runs the same cases
//! against both.

pub mod clock;
pub mod keys;
pub mod memory;
pub mod redis;
pub mod resilient;
mod steps;

use async_trait::async_trait;

pub use clock::{Clock, ManualClock, SystemClock};
pub use keys::Keys;

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

/// What a window does once its count has reached its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowMode {
    /// The event is refused (a rate limit).
    Enforce,
    /// The event is refused unless the request opened the gate (a captcha tier).
    Gate,
}

/// A rule's window as the store counts it: enforced (a full window
/// refuses) or a gate (a full window asks for a captcha).
pub trait RuleWindow {
    /// The window as a limit that refuses once full.
    fn enforce(&self) -> WindowSpec;
    /// The window as a captcha tier.
    fn gate(&self) -> WindowSpec;
}

impl RuleWindow for crate::domain::Rule {
    fn enforce(&self) -> WindowSpec {
        WindowSpec::enforce(self.limit, self.window_ms())
    }

    fn gate(&self) -> WindowSpec {
        WindowSpec::gate(self.limit, self.window_ms())
    }
}

/// One window of a subject's key, as the store counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    /// Events the window admits.
    pub limit: u32,
    /// Length of the window, in milliseconds.
    pub window_ms: u64,
    /// What the window does once full.
    pub mode: WindowMode,
}

impl WindowSpec {
    /// A window that refuses once full.
    pub fn enforce(limit: u32, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            mode: WindowMode::Enforce,
        }
    }
    /// A window that asks for a captcha once full.
    pub fn gate(limit: u32, window_ms: u64) -> Self {
        Self {
            limit,
            window_ms,
            mode: WindowMode::Gate,
        }
    }
}

/// One event offered to one subject's windows.
#[derive(Debug, Clone)]
pub struct HitRequest<'a> {
    /// The subject's window key, from [`Keys::window`].
    pub key: &'a str,
    /// The windows to count on that key.
    pub windows: &'a [WindowSpec],
    /// Unique id of this event; [`WindowStore::undo`] removes it again.
    pub member: &'a str,
    /// The request passed a captcha: `Gate` windows do not refuse it.
    pub gate_open: bool,
    /// Shadow mode: record the event even when a window refuses it.
    pub force: bool,
}

/// What one subject's windows say about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitVerdict {
    Allowed,
    /// An `Enforce` window is full. `window` indexes the request's windows: the
    /// refusing window whose wait is longest; `retry_after_ms` is that wait.
    Denied {
        window: usize,
        retry_after_ms: u64,
    },
    /// No `Enforce` window refused, but a `Gate` window is full and the gate was
    /// closed. `window` is the first such window.
    Gated {
        window: usize,
    },
}

/// The answer of [`WindowStore::hit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitOutcome {
    /// What the windows decided.
    pub verdict: HitVerdict,
    /// Whether the event was recorded (allowed, or forced).
    pub added: bool,
    /// Each window's count before this event, in request order.
    pub counts: Vec<u32>,
    /// After this call: how long until every `Enforce` window would admit one
    /// more event (0 = at once).
    pub next_retry_after_ms: u64,
}

/// The answer of [`WindowStore::peek`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekOutcome {
    /// Each window's current count, in request order.
    pub counts: Vec<u32>,
    /// Per window: how long until its count drops below its limit (0 when it
    /// is already below).
    pub retry_after_ms: Vec<u64>,
}

/// The login brute-force policy, in store units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginPolicy {
    /// Failures in the captcha window from which a captcha is required.
    pub captcha_after: u32,
    /// Length of the captcha window.
    pub captcha_window_ms: u64,
    /// Failures in the lock window that lock the user.
    pub lock_after: u32,
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

/// One subject's share of a [`ReserveRequest`].
#[derive(Debug, Clone, Copy)]
pub struct SubjectWindows<'a> {
    /// The subject's window key, from [`Keys::window`].
    pub key: &'a str,
    /// That subject's windows.
    pub windows: &'a [WindowSpec],
}

/// A one-time code to store together with a reservation.
#[derive(Debug, Clone, Copy)]
pub struct CodeToStore<'a> {
    /// [`Keys::otp`] of the phone.
    pub key: &'a str,
    /// HMAC of the code; the code itself is never stored.
    pub mac: &'a str,
    /// Wrong tries allowed; the last one burns the code.
    pub attempts: u32,
    /// Lifetime of the code.
    pub ttl_ms: u64,
}

/// One event offered to every subject of a request, all or nothing.
#[derive(Debug, Clone)]
pub struct ReserveRequest<'a> {
    /// Every subject the event counts against.
    pub subjects: &'a [SubjectWindows<'a>],
    /// Unique id of this event in every subject; [`WindowStore::undo`] removes it.
    pub member: &'a str,
    /// The request passed a captcha: `Gate` windows do not refuse it.
    pub gate_open: bool,
    /// Shadow mode: record the event (and store the code) even when refused.
    pub force: bool,
    /// Stored when the event is recorded, replacing the phone's previous code.
    pub code: Option<CodeToStore<'a>>,
}

/// The answer of [`WindowStore::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveOutcome {
    /// Per subject, in request order. Every `added` equals `recorded`.
    pub outcomes: Vec<HitOutcome>,
    /// The event was recorded in every subject and the code stored: every
    /// subject allowed it, or `force`. Otherwise nothing was written.
    pub recorded: bool,
}

/// The IP's login failure window: its captcha tier and its block.
#[derive(Debug, Clone, Copy)]
pub struct IpFailureWindow<'a> {
    /// [`Keys::window`] of the IP for the `login_attempt` action.
    pub key: &'a str,
    /// Failures from which logins from the IP need a captcha.
    pub captcha_after: u32,
    /// Failures that block the IP.
    pub block_after: u32,
    /// Length of the window both count in.
    pub window_ms: u64,
}

impl IpFailureWindow<'_> {
    /// The same windows as [`WindowSpec`]s: `[captcha tier, block]`.
    pub fn windows(&self) -> [WindowSpec; 2] {
        [
            WindowSpec::gate(self.captcha_after, self.window_ms),
            WindowSpec::enforce(self.block_after, self.window_ms),
        ]
    }
}

/// One login outcome for a user and, optionally, the IP it came from.
#[derive(Debug, Clone)]
pub struct LoginRequest<'a> {
    /// [`Keys::window`] of the user for the `login_attempt` action.
    pub window_key: &'a str,
    /// [`Keys::lock`] of the user.
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
}

/// What the IP's failure window held when a login was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpFailures {
    /// Failures in the window before this attempt.
    pub count: u32,
    /// `Some` while the IP is blocked: how long it stays blocked.
    pub blocked_retry_after_ms: Option<u64>,
}

/// The answer of [`WindowStore::login`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    /// The user's side; `verdict` is what the user's rules say (with the IP's
    /// captcha tier), whether or not the IP blocked the attempt.
    pub user: LoginAttemptOutcome,
    /// Present when the request named an IP.
    pub ip: Option<IpFailures>,
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

/// The user's side of a login outcome; see [`WindowStore::login_attempt`].
#[derive(Debug, Clone)]
pub struct LoginAttemptRequest<'a> {
    /// [`Keys::window`] of the user for the `login_attempt` action.
    pub window_key: &'a str,
    /// [`Keys::lock`] of the user.
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
}

/// What the user's side decided about a login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginVerdict {
    /// The user is locked; nothing was recorded (unless shadow).
    Locked { retry_after_ms: u64 },
    /// A captcha is required and was not passed; nothing recorded (unless shadow).
    Challenged,
    /// The outcome was recorded (unless `ip_blocked`).
    Recorded,
}

/// The answer of [`WindowStore::login_attempt`].
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
}

/// The answer of [`WindowStore::login_state`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginStateOutcome {
    /// Remaining lock time when locked.
    pub locked_retry_after_ms: Option<u64>,
    /// Failures in the captcha window.
    pub failures: u32,
    /// Failures in the lock window.
    pub lock_window_failures: u32,
}

/// The answer of [`WindowStore::otp_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtpOutcome {
    Valid,
    /// Wrong code; `attempts_left` 0 means this try burnt the code.
    Wrong {
        attempts_left: u32,
    },
    /// The code was already burnt by wrong tries; it expires after this long.
    Burnt {
        retry_after_ms: u64,
    },
    /// No code: never sent, used, or expired.
    Missing,
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

    /// Remove a previously recorded event (the roll-back of a reservation).
    async fn undo(&self, key: &str, member: &str) -> Result<(), StoreError>;

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
    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError>;

    /// Everything `/sms/send` writes, in as few round trips as the backend
    /// allows: offer `member` to every subject ([`WindowStore::hit`] semantics
    /// per subject); when every subject allows it (or `force`) the event is
    /// recorded in all of them and the code stored, otherwise nothing is
    /// written. The provided method calls `hit` per subject concurrently and
    /// rolls back (a race can then refuse a request that an atomic call would
    /// have admitted, never the reverse); a backend that can do it atomically
    /// in one call overrides it.
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
    /// that can do it atomically in one call overrides it.
    async fn login(&self, req: LoginRequest<'_>) -> Result<LoginOutcome, StoreError> {
        steps::login(self, req).await
    }

    /// The user's lock and failure counts, recording nothing.
    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        policy: &LoginPolicy,
    ) -> Result<LoginStateOutcome, StoreError>;

    /// Store a one-time code's MAC, replacing any previous one.
    async fn otp_put(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
        ttl_ms: u64,
    ) -> Result<(), StoreError>;

    /// Check a code: a match deletes it (`Valid`, single use); a miss uses up
    /// one attempt (`Wrong`), the last one burns it (kept until its expiry so
    /// that further tries answer `Burnt`).
    async fn otp_check(&self, key: &str, mac: &str) -> Result<OtpOutcome, StoreError>;

    /// Delete keys (a failed delivery's code, an admin unblock).
    async fn delete(&self, keys: &[String]) -> Result<(), StoreError>;

    /// Set `key` to `candidate` unless it holds a value; return the stored value.
    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError>;

    /// Reachability, for `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;
}
