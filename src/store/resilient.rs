//! `store.on_error`: what a decision does when the configured store fails.
//! All of that policy lives here, so guards only ever see one store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;

use super::memory::MemoryStore;
use super::{
    CodeToStore, CodeTry, ConversionHit, ConversionOutcome, ConversionPolicy, ConversionState,
    DroppedCode, ExpiringMembers, HitOutcome, HitRequest, IpFailures, LoginAttemptOutcome,
    LoginAttemptRequest, LoginOutcome, LoginPolicy, LoginRequest, LoginStateOutcome, LoginVerdict,
    OtpOutcome, PeekOutcome, ReserveOutcome, ReserveRequest, RollBack, StoreError, WindowSpec,
    WindowStore,
};
use crate::metrics;

/// How long past its expiry, as read before it is stored, a local code is
/// still looked up.
const HOLD_SLACK_MS: u64 = 1_000;

/// What [`ResilientStore`] does when the primary store fails.
pub enum Fallback {
    /// Fail closed: errors reach the caller (503 `store_unavailable`).
    Deny,
    /// Fail open: counters answer as if nothing had been counted; codes are
    /// kept in this in-process store meanwhile (what they need is a place,
    /// not a count), so `/sms/send` and `/sms/verify` keep working.
    Allow(Arc<MemoryStore>),
    /// Decide with an in-process store until the primary answers again.
    Local(Arc<MemoryStore>),
}

/// The store guards see: the configured one, with `store.on_error` applied
/// to its failures, its calls timed and its errors counted.
pub struct ResilientStore {
    primary: Arc<dyn WindowStore>,
    fallback: Fallback,
    /// The local store took a code while the primary failed: until a send
    /// stored in the primary after it is delivered, that code is checked
    /// where it is, not in the primary (which never saw it) once the
    /// primary answers again. This is
    /// when the last code it took expires, by the local store's clock (ms),
    /// and 0 when it holds none: never set without an outage, and back to 0
    /// once the codes of the last one have expired, so that a send or a
    /// verify otherwise pays nothing.
    codes_held_until: AtomicU64,
    /// Codes the primary took for a key while the local store held one for
    /// it, whose delivery is not known yet: each one's MAC, and the MAC of
    /// the code held then. Only such a code's delivery lets the held code
    /// go, and only that one held code: a send stored in the primary
    /// before the outage, or one a later held code has replaced since, must
    /// not make the newest held code give way. Each leaves at its delivery
    /// or its roll-back; one whose send ended otherwise (the process
    /// dropped it) stays until the map starts over at `PENDING_MAX`.
    pending_after_held: Mutex<HashMap<String, String>>,
    /// How many `pending_after_held` holds: while 0, as without an
    /// outage, a delivery takes no lock.
    pending_count: AtomicUsize,
}

/// Past this many, `pending_after_held` starts over (their codes then no
/// longer let a held code go: it stays the one checked until it expires).
const PENDING_MAX: usize = 10_000;

impl ResilientStore {
    /// `primary`, with `fallback` applied whenever a call to it fails.
    pub fn new(primary: Arc<dyn WindowStore>, fallback: Fallback) -> Self {
        Self {
            primary,
            fallback,
            codes_held_until: AtomicU64::new(0),
            pending_after_held: Mutex::new(HashMap::new()),
            pending_count: AtomicUsize::new(0),
        }
    }

    /// A code sealed as `mac` went to the primary at `key`: when the local
    /// store holds one for it, that one stays until this one is delivered.
    fn stored_after_held(&self, key: &str, mac: &str) {
        let Some(held) = self
            .local_codes()
            .and_then(|local| local.held_code_mac(key))
        else {
            return;
        };
        let mut pending = self
            .pending_after_held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if pending.len() >= PENDING_MAX {
            pending.clear();
        }
        pending.insert(mac.to_owned(), held);
        self.pending_count.store(pending.len(), Ordering::Relaxed);
    }

    /// The send of the code sealed as `mac` is over: the held code its
    /// delivery would let go, if any.
    fn settled_after_held(&self, mac: &str) -> Option<String> {
        if self.pending_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut pending = self
            .pending_after_held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let held = pending.remove(mac);
        self.pending_count.store(pending.len(), Ordering::Relaxed);
        held
    }

    /// The local store codes go to while the primary fails, if any.
    fn code_store(&self) -> Option<&MemoryStore> {
        match &self.fallback {
            Fallback::Deny => None,
            Fallback::Allow(local) | Fallback::Local(local) => Some(local),
        }
    }

    /// The local store, when it holds a code sent to `key` during an
    /// outage (live or burnt). Not a stand-in a check left there: that
    /// would hide a code Redis held all along once Redis answers again.
    fn held_code(&self, key: &str) -> Option<&MemoryStore> {
        let local = self.local_codes()?;
        local.holds_code(key).then_some(local)
    }

    /// The local store, while a code it took during an outage may be live.
    fn local_codes(&self) -> Option<&MemoryStore> {
        let until = self.codes_held_until.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let local = self.code_store()?;
        if local.now_ms() > until {
            // Every code held has expired. A code taken meanwhile moved the
            // time on, and then this leaves it.
            let _ = self.codes_held_until.compare_exchange(
                until,
                0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return None;
        }
        Some(local)
    }

    /// The local store is taking a code that lives `ttl_ms`. A second more:
    /// the store stamps the code's expiry with its own clock read, a little
    /// later than this one.
    fn hold_code(&self, local: &MemoryStore, ttl_ms: u64) {
        let until = local
            .now_ms()
            .saturating_add(ttl_ms)
            .saturating_add(HOLD_SLACK_MS);
        self.codes_held_until.fetch_max(until, Ordering::Relaxed);
    }

    /// After a call to the primary started at `started`: its time
    /// measured and, when it failed, the failure counted and logged.
    fn settle<T>(&self, started: Instant, result: &Result<T, StoreError>) {
        metrics::store_call(started.elapsed());
        if let Err(e) = result {
            self.failed(e);
        }
    }

    /// A call to the primary that has no fallback, timed and its failure
    /// counted.
    async fn primary_only<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        self.settle(started, &result);
        result
    }

    fn failed(&self, e: &StoreError) {
        metrics::store_error(e.failure());
        tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "store call failed");
    }
}

/// Try the primary; on error apply the fallback: the local store under
/// `Local`; under `Allow` the `$open` answer (an `Option`), or the local store
/// when there is none; else the error.
macro_rules! resilient {
    ($self:ident, |$s:ident| $call:expr, open: $open:expr) => {{
        let $s = $self.primary.as_ref();
        let started = Instant::now();
        let result = $call.await;
        $self.settle(started, &result);
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                match &$self.fallback {
                    Fallback::Deny => Err(e),
                    // Failing open: the open answer where there is one
                    // (counters); a code has none, and goes to the local store.
                    Fallback::Allow(local) => match $open {
                        Some(open) => Ok(open),
                        None => {
                            let $s: &dyn WindowStore = local.as_ref();
                            $call.await
                        }
                    },
                    Fallback::Local(local) => {
                        let $s: &dyn WindowStore = local.as_ref();
                        $call.await
                    }
                }
            }
        }
    }};
}

#[async_trait]
impl WindowStore for ResilientStore {
    async fn hit(&self, req: HitRequest<'_>) -> Result<HitOutcome, StoreError> {
        let open = HitOutcome::open(req.windows.len());
        resilient!(self, |s| s.hit(req.clone()), open: Some(open))
    }

    async fn peek(&self, key: &str, windows: &[WindowSpec]) -> Result<PeekOutcome, StoreError> {
        let open = PeekOutcome {
            counts: vec![0; windows.len()],
            retry_after_ms: vec![0; windows.len()],
        };
        resilient!(self, |s| s.peek(key, windows), open: Some(open))
    }

    /// The primary's, or nothing: an event is given back to the store that
    /// recorded it ([`WindowStore::roll_back`]), never to the fallback
    /// because the primary failed now.
    async fn undo(
        &self,
        key: &str,
        member: &str,
        windows: &[WindowSpec],
    ) -> Result<(), StoreError> {
        self.primary_only(self.primary.undo(key, member, windows))
            .await
    }

    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError> {
        resilient!(self, |s| s.login_attempt(req.clone()), open: Some(open_login()))
    }

    /// Failing open, the windows answer "allowed, nothing counted" and the
    /// code goes to the local store.
    async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        let started = Instant::now();
        let result = self.primary.reserve(req.clone()).await;
        self.settle(started, &result);
        let e = match result {
            Ok(outcome) => {
                if let (Some(code), true) = (req.code, outcome.recorded) {
                    self.stored_after_held(code.key, code.mac);
                }
                return Ok(outcome);
            }
            Err(e) => e,
        };
        if let (Some(code), Some(local)) = (req.code, self.code_store()) {
            self.hold_code(local, code.ttl_ms);
        }
        match &self.fallback {
            Fallback::Deny => Err(e),
            Fallback::Local(local) => {
                let outcome = local.reserve(req).await?;
                Ok(ReserveOutcome {
                    by_fallback: true,
                    ..outcome
                })
            }
            Fallback::Allow(local) => {
                if let Some(code) = req.code {
                    // Nothing counted this send (the store is down): nor
                    // will its verify be.
                    local.otp_put(code, false).await?;
                }
                Ok(ReserveOutcome {
                    outcomes: req
                        .subjects
                        .iter()
                        .map(|s| HitOutcome::open(s.windows.len()))
                        .collect(),
                    conversions: req
                        .conversions
                        .iter()
                        .map(|_| ConversionOutcome::open())
                        .collect(),
                    recorded: false,
                    by_fallback: false,
                })
            }
        }
    }

    /// Back to the store that recorded the reservation, and there only:
    /// the other never counted it, and taking it back there would free a
    /// slot on every meter and take a real send off the pumping guard's
    /// counts. A failure leaves it counted (stricter, never looser).
    async fn roll_back(&self, roll_back: &RollBack<'_>) {
        if roll_back.by_fallback {
            if let Some(local) = self.code_store() {
                local.roll_back(roll_back).await;
            }
            return;
        }
        super::steps::roll_back(self, roll_back).await;
    }

    async fn login(&self, req: LoginRequest<'_>) -> Result<LoginOutcome, StoreError> {
        let open = LoginOutcome {
            user: open_login(),
            ip: req.ip.map(|_| IpFailures {
                count: 0,
                blocked_retry_after_ms: None,
            }),
            network: req.network.map(|_| 0),
        };
        resilient!(self, |s| s.login(req.clone()), open: Some(open))
    }

    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        pair_lock_key: Option<&str>,
        policy: &LoginPolicy,
        shadow: bool,
    ) -> Result<LoginStateOutcome, StoreError> {
        let open = LoginStateOutcome {
            locked_retry_after_ms: None,
            pair_locked_retry_after_ms: None,
            failures: 0,
            lock_window_failures: 0,
        };
        resilient!(self, |s| s.login_state(window_key, lock_key, pair_lock_key, policy, shadow), open: Some(open))
    }

    // An admin's view of a subject follows what decides meanwhile: the
    // local store's while the primary fails (under `Allow` it holds
    // nothing, as nothing is enforced then). An admin's change goes to the
    // primary alone (`delete`, `expiring_remove`).
    async fn recent_members(
        &self,
        key: &str,
        window_ms: u64,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        resilient!(self, |s| s.recent_members(key, window_ms, max), open: None)
    }

    async fn index_members(&self, key: &str, max: usize) -> Result<Vec<String>, StoreError> {
        resilient!(self, |s| s.index_members(key, max), open: None)
    }

    // The pumping guard's counters fail open like the windows: it is a
    // heuristic over hours of traffic, and a store that cannot count cannot
    // tell pumping from an outage. Refusing every send to every range while
    // Redis is down (on top of what `on_error = "allow"` chose for the
    // windows) would take the service down with it; counts lost meanwhile
    // only delay a block.
    async fn conversion_hit(
        &self,
        hit: ConversionHit<'_>,
        force: bool,
    ) -> Result<ConversionOutcome, StoreError> {
        resilient!(self, |s| s.conversion_hit(hit, force), open: Some(ConversionOutcome::open()))
    }

    async fn conversion_count(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<Option<u64>, StoreError> {
        resilient!(self, |s| s.conversion_count(key, policy), open: Some(None))
    }

    /// The primary's, or nothing, as [`ResilientStore::undo`].
    async fn conversion_undo(&self, key: &str, slice: u64) -> Result<(), StoreError> {
        self.primary_only(self.primary.conversion_undo(key, slice))
            .await
    }

    async fn conversion_success(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<(), StoreError> {
        resilient!(self, |s| s.conversion_success(key, policy), open: Some(()))
    }

    async fn conversion_state(
        &self,
        key: &str,
        policy: &ConversionPolicy,
    ) -> Result<ConversionState, StoreError> {
        let open = ConversionState::default();
        resilient!(self, |s| s.conversion_state(key, policy), open: Some(open))
    }

    async fn expiring_add(&self, key: &str, member: &str, ttl_ms: u64) -> Result<(), StoreError> {
        resilient!(self, |s| s.expiring_add(key, member, ttl_ms), open: Some(()))
    }

    /// An admin's change: the primary's, or an error (503: the local
    /// store's success would report the primary's block lifted while it
    /// stays). Once the primary has taken it, the local store's copy goes
    /// too, so a later outage does not bring it back; while the primary
    /// fails the local one, which decides then, is left as it is: a
    /// refused change changes nothing.
    async fn expiring_remove(&self, key: &str, member: &str) -> Result<(), StoreError> {
        self.primary_only(self.primary.expiring_remove(key, member))
            .await?;
        if let Some(local) = self.code_store() {
            let _ = local.expiring_remove(key, member).await;
        }
        Ok(())
    }

    async fn expiring_members(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<ExpiringMembers, StoreError> {
        let open = ExpiringMembers::default();
        resilient!(self, |s| s.expiring_members(key, limit), open: Some(open))
    }

    async fn otp_put(&self, code: CodeToStore<'_>, counted: bool) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.primary.otp_put(code, counted).await;
        self.settle(started, &result);
        match result {
            Ok(()) => {
                self.stored_after_held(code.key, code.mac);
                Ok(())
            }
            Err(e) => {
                let Some(local) = self.code_store() else {
                    return Err(e);
                };
                self.hold_code(local, code.ttl_ms);
                local.otp_put(code, counted).await
            }
        }
    }

    async fn otp_check(&self, code: CodeTry<'_>) -> Result<OtpOutcome, StoreError> {
        let key = code.key;
        // A code sent during an outage is checked where it was kept, Redis
        // back or not (design-differences.md: "checked by the instance that
        // sent it").
        if let Some(local) = self.held_code(key) {
            let outcome = local.otp_check(code).await?;
            if matches!(outcome, OtpOutcome::Valid { .. }) {
                // Single use across both stores: the send that timed out may
                // have reached Redis after all (a stalled call still runs),
                // leaving a copy there. An extra call, only on this path.
                if let Err(e) = self.primary.delete(&[key.to_string()]).await {
                    self.failed(&e);
                }
            }
            return Ok(outcome);
        }
        resilient!(self, |s| s.otp_check(code), open: None)
    }

    /// A code held locally from an outage stays the one checked until the
    /// code that went to the primary since is delivered: were it forgotten
    /// when that one was stored, that one's failed delivery would put back
    /// the primary's older code (kept from before the outage) in its place.
    fn code_delivered(&self, key: &str, mac: &str) {
        if let Some(held) = self.settled_after_held(mac) {
            if let Some(local) = self.code_store() {
                local.forget_code_sealed_as(key, &held);
            }
        }
    }

    async fn otp_drop(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
    ) -> Result<DroppedCode, StoreError> {
        self.settled_after_held(mac);
        // Both stores: a code put during an outage is held locally, and the
        // call that timed out may have reached Redis after all.
        let dropped = resilient!(self, |s| s.otp_drop(key, mac, attempts), open: None);
        match self.local_codes() {
            Some(local) => both_dropped(dropped, local.otp_drop(key, mac, attempts).await),
            None => dropped,
        }
    }

    /// An admin's change: the primary's, or an error (503: the local
    /// store's success would report an unblock done that left the
    /// primary's lock in place). Once the primary has taken it, the local
    /// store's keys go too: a code it holds from an outage, and what it
    /// counted then, which it would decide with again in the next one.
    /// While the primary fails the local store, which decides then, is left
    /// as it is: a refused unblock changes nothing.
    async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        self.primary_only(self.primary.delete(keys)).await?;
        if let Some(local) = self.code_store() {
            let _ = local.delete(keys).await;
        }
        Ok(())
    }

    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        resilient!(self, |s| s.get_or_init(key, candidate), open: None)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.primary.ping().await
    }

    async fn writable(&self, key: &str) -> Result<(), StoreError> {
        self.primary.writable(key).await
    }
}

/// What a code's drop found in both stores, the primary's answer and the
/// local one's: a code held locally from an outage takes its verifies
/// there (`held_code`) while a copy the timed-out call left in Redis stays
/// untouched, so a try found in either store counts; then a code either
/// found; then the primary's word (an error included).
fn both_dropped(
    primary: Result<DroppedCode, StoreError>,
    local: Result<DroppedCode, StoreError>,
) -> Result<DroppedCode, StoreError> {
    match (primary, local) {
        (Ok(DroppedCode::Tried), _) | (_, Ok(DroppedCode::Tried)) => Ok(DroppedCode::Tried),
        (_, Ok(DroppedCode::Untried)) => Ok(DroppedCode::Untried),
        (primary, _) => primary,
    }
}

/// A login outcome when failing open: recorded, nothing counted.
fn open_login() -> LoginAttemptOutcome {
    LoginAttemptOutcome {
        verdict: LoginVerdict::Recorded,
        failures: 0,
        captcha_crossed: false,
        locked_for_ms: None,
        pair_locked_for_ms: None,
        before: None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::redis::RedisStore;
    use crate::store::ManualClock;

    const KEY: &str = "tg:{phone:+33612345678}:otp";

    /// A try found in either store counts; a code the primary does not
    /// have is the local store's to tell; else the primary's word stands.
    #[test]
    fn a_drop_takes_a_try_from_either_store_and_a_code_from_the_one_that_held_it() {
        use DroppedCode::{Absent, Tried, Untried};
        let down = || Err(StoreError::Timeout);
        let cases = [
            (Ok(Untried), Ok(Tried), Some(Tried)),
            (Ok(Tried), Ok(Absent), Some(Tried)),
            (down(), Ok(Tried), Some(Tried)),
            (Ok(Absent), Ok(Untried), Some(Untried)),
            (down(), Ok(Untried), Some(Untried)),
            (Ok(Untried), Ok(Absent), Some(Untried)),
            (Ok(Absent), Ok(Absent), Some(Absent)),
            (down(), Ok(Absent), None),
        ];
        for (primary, local, expected) in cases {
            let said = format!("{primary:?} and {local:?}");
            assert_eq!(both_dropped(primary, local).ok(), expected, "{said}");
        }
    }

    #[tokio::test]
    async fn a_code_held_through_an_outage_is_looked_up_until_it_expires_and_then_no_more() {
        // Nothing listens on port 1: every call to the primary fails.
        let down = RedisStore::connect("redis://127.0.0.1:1", Duration::from_millis(100))
            .await
            .expect("a store that is down");
        let clock = ManualClock::new(1_000_000);
        let local = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let store = ResilientStore::new(Arc::new(down), Fallback::Local(local));
        assert!(store.local_codes().is_none(), "no outage, no lookup");

        store
            .otp_put(
                CodeToStore {
                    key: KEY,
                    mac: "mac",
                    attempts: 3,
                    ttl_ms: 60_000,
                    asker: "",
                },
                true,
            )
            .await
            .expect("kept in the local store");
        assert!(store.held_code(KEY).is_some());
        clock.advance_ms(60_000);
        assert!(store.held_code(KEY).is_some(), "live to its last ms");
        clock.advance_ms(1);
        assert!(store.held_code(KEY).is_none(), "expired");
        assert_ne!(
            store.codes_held_until.load(Ordering::Relaxed),
            0,
            "looked for a second more"
        );

        clock.advance_ms(HOLD_SLACK_MS);
        assert!(store.held_code(KEY).is_none());
        assert_eq!(
            store.codes_held_until.load(Ordering::Relaxed),
            0,
            "later sends and verifies skip the local store again"
        );
    }
}
