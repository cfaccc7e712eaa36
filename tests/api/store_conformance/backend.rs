//! The backend under test, its clock, and helpers shared by the cases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::{ClientLike, HashesInterface, KeysInterface};
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::RedisStore;
use tollgate::store::{
    HitOutcome, HitRequest, HitVerdict, Keys, LoginAttemptOutcome, LoginAttemptRequest,
    LoginPolicy, LoginStateOutcome, ManualClock, PairKeys, WindowSpec, WindowStore,
};

/// Real sleeps on Redis last this much longer than asked, so that a boundary
/// the case steps over is really behind the server's clock.
const SLEEP_MARGIN_MS: u64 = 25;

pub use crate::support::app::redis_url;

/// The denying window and the wait of a hit that must be denied; `why`
/// names the expectation when it is not.
pub fn denied(hit: &HitOutcome, why: &str) -> (usize, u64) {
    match hit.verdict {
        HitVerdict::Denied {
            window,
            retry_after_ms,
        } => (window, retry_after_ms),
        _ => panic!("{why}, got {hit:?}"),
    }
}

enum Kind {
    Memory {
        clock: ManualClock,
        store: Arc<MemoryStore>,
    },
    Redis {
        store: Arc<RedisStore>,
        raw: fred::clients::Client,
    },
}

pub struct StoreUnderTest {
    pub keys: Keys,
    store: Arc<dyn WindowStore>,
    kind: Kind,
    /// Time the case asked to pass, in ms.
    elapsed_ms: AtomicU64,
}

/// A point in the case's time, to check waits measured from it.
pub struct Mark {
    elapsed_ms: u64,
    real: Instant,
}

impl StoreUnderTest {
    pub fn memory() -> Self {
        let clock = ManualClock::new(1_700_000_000_000);
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        StoreUnderTest {
            keys: Keys::new("tgtest"),
            store: store.clone(),
            kind: Kind::Memory { clock, store },
            elapsed_ms: AtomicU64::new(0),
        }
    }

    pub async fn redis() -> Self {
        let url = redis_url();
        let store = RedisStore::connect(&url, Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("bad TOLLGATE_TEST_REDIS_URL {url}: {e}"));
        if let Err(e) = store.ping().await {
            panic!("no Redis at {url} ({e}): start one or set TOLLGATE_TEST_REDIS_URL");
        }
        let raw = fred::types::Builder::from_config(
            fred::types::config::Config::from_url(&url).expect("a URL fred parses"),
        )
        .build()
        .expect("a Redis client");
        raw.init().await.expect("a second Redis connection");
        let store = Arc::new(store);
        StoreUnderTest {
            keys: Keys::new(format!("tgtest-{}", uuid::Uuid::new_v4())),
            store: store.clone(),
            kind: Kind::Redis { store, raw },
            elapsed_ms: AtomicU64::new(0),
        }
    }

    pub fn store(&self) -> Arc<dyn WindowStore> {
        self.store.clone()
    }

    /// Whether time is exact here (manual clock) rather than real.
    pub fn exact(&self) -> bool {
        matches!(self.kind, Kind::Memory { .. })
    }

    /// Let `ms` pass: the manual clock moves, or the test sleeps a bit longer.
    pub async fn advance(&self, ms: u64) {
        self.elapsed_ms.fetch_add(ms, Ordering::SeqCst);
        match &self.kind {
            Kind::Memory { clock, .. } => clock.advance_ms(ms),
            Kind::Redis { .. } => {
                tokio::time::sleep(Duration::from_millis(ms + SLEEP_MARGIN_MS)).await
            }
        }
    }

    pub fn mark(&self) -> Mark {
        Mark {
            elapsed_ms: self.elapsed_ms.load(Ordering::SeqCst),
            real: Instant::now(),
        }
    }

    /// `actual` is a wait that was `full_ms` at `since` (an event made then
    /// leaves after `full_ms`). Exactly `full_ms` minus the time passed since on
    /// the manual clock; on Redis within the time that really passed.
    #[track_caller]
    pub fn assert_wait(&self, actual: u64, full_ms: u64, since: &Mark, what: &str) {
        let passed = self.elapsed_ms.load(Ordering::SeqCst) - since.elapsed_ms;
        let expected = full_ms.saturating_sub(passed);
        if self.exact() {
            assert_eq!(actual, expected, "{what}");
        } else {
            let real = since.real.elapsed().as_millis() as u64 + 1;
            let lowest = full_ms.saturating_sub(real);
            assert!(
                (lowest..=expected).contains(&actual),
                "{what}: {actual} ms is not within [{lowest}, {expected}]"
            );
        }
    }

    /// Whether `key` exists (Redis `EXISTS`).
    pub async fn exists(&self, key: &str) -> bool {
        match &self.kind {
            Kind::Memory { store, .. } => store.contains_key(key),
            Kind::Redis { raw, .. } => raw.exists::<i64, _>(key).await.expect("EXISTS") == 1,
        }
    }

    /// Write fields of the hash at `key` straight into Redis, as an earlier
    /// build's scripts wrote them; Redis only.
    pub async fn redis_hset(&self, key: &str, fields: Vec<(&str, String)>) {
        let Kind::Redis { raw, .. } = &self.kind else {
            panic!("only Redis holds what an earlier build wrote");
        };
        let _: i64 = raw.hset(key, fields).await.expect("HSET");
    }

    /// Delete this test's Redis keys.
    pub async fn cleanup(&self) {
        if let Kind::Redis { store, raw } = &self.kind {
            if let Err(e) = store.delete_prefix(self.keys.prefix()).await {
                eprintln!(
                    "could not delete the keys under {}: {e}",
                    self.keys.prefix()
                );
            }
            let _ = raw.quit().await;
        }
    }

    pub async fn hit(&self, key: &str, windows: &[WindowSpec]) -> HitOutcome {
        self.hit_as(key, windows, &member(), Offer::default()).await
    }

    pub async fn hit_as(
        &self,
        key: &str,
        windows: &[WindowSpec],
        member: &str,
        offer: Offer,
    ) -> HitOutcome {
        self.store
            .hit(HitRequest {
                key,
                windows,
                member,
                gate_open: offer.gate_open,
                force: offer.force,
            })
            .await
            .expect("hit")
    }

    pub async fn login(
        &self,
        user: &str,
        policy: &LoginPolicy,
        attempt: Attempt,
    ) -> LoginAttemptOutcome {
        login(&*self.store, &self.keys, user, policy, attempt).await
    }

    pub async fn login_state(&self, user: &str, policy: &LoginPolicy) -> LoginStateOutcome {
        self.login_state_as(user, policy, false).await
    }

    /// [`login_state`](Self::login_state) as a shadow call (`shadow`)
    /// reads it, or an enforcing one.
    pub async fn login_state_as(
        &self,
        user: &str,
        policy: &LoginPolicy,
        shadow: bool,
    ) -> LoginStateOutcome {
        let window_key = self.keys.window("user", user, "login_attempt");
        let lock_key = self.keys.lock("user", user);
        self.store
            .login_state(&window_key, &lock_key, None, policy, shadow)
            .await
            .expect("login_state")
    }

    /// The state of `user` with the lock of its pair with `ip`.
    pub async fn pair_state(
        &self,
        user: &str,
        ip: &str,
        policy: &LoginPolicy,
    ) -> LoginStateOutcome {
        let window_key = self.keys.window("user", user, "login_attempt");
        let lock_key = self.keys.lock("user", user);
        let pair_lock = self.keys.pair_lock(user, ip);
        self.store
            .login_state(&window_key, &lock_key, Some(&pair_lock), policy, false)
            .await
            .expect("login_state")
    }

    /// The IPs of `user`'s pair index, newest first, at most `max`.
    pub async fn pair_ips(&self, user: &str, max: usize) -> Vec<String> {
        self.store
            .index_members(&self.keys.pair_index(user), max)
            .await
            .expect("index_members")
    }
}

/// One login attempt against `store`, with a fresh member.
pub async fn login(
    store: &dyn WindowStore,
    keys: &Keys,
    user: &str,
    policy: &LoginPolicy,
    attempt: Attempt,
) -> LoginAttemptOutcome {
    let window_key = keys.window("user", user, "login_attempt");
    let lock_key = keys.lock("user", user);
    let pair_keys = attempt
        .pair_ip
        .map(|ip| (keys.pair_lock(user, ip), keys.pair_index(user), ip));
    store
        .login_attempt(LoginAttemptRequest {
            window_key: &window_key,
            lock_key: &lock_key,
            policy,
            success: attempt.success,
            captcha_passed: attempt.captcha_passed,
            captcha_demanded: attempt.captcha_demanded,
            ip_blocked: false,
            member: &member(),
            shadow: attempt.shadow,
            pair: pair_keys
                .as_ref()
                .map(|(lock_key, index_key, ip)| PairKeys {
                    lock_key,
                    index_key,
                    ip,
                }),
        })
        .await
        .expect("login_attempt")
}

/// A unique event id.
pub fn member() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Offer {
    pub gate_open: bool,
    pub force: bool,
}

impl Offer {
    pub fn gate_open() -> Self {
        Offer {
            gate_open: true,
            force: false,
        }
    }
    pub fn forced() -> Self {
        Offer {
            gate_open: false,
            force: true,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Attempt {
    pub success: bool,
    pub captcha_passed: bool,
    pub captcha_demanded: bool,
    pub shadow: bool,
    /// Counted for the (user, this IP) pair too.
    pub pair_ip: Option<&'static str>,
}

impl Attempt {
    pub fn failure() -> Self {
        Attempt::default()
    }
    pub fn success() -> Self {
        Attempt {
            success: true,
            ..Attempt::default()
        }
    }
    pub fn with_captcha(self) -> Self {
        Attempt {
            captcha_passed: true,
            ..self
        }
    }
    pub fn captcha_demanded(self) -> Self {
        Attempt {
            captcha_demanded: true,
            ..self
        }
    }
    pub fn shadow(self) -> Self {
        Attempt {
            shadow: true,
            ..self
        }
    }
    pub fn sent_from(self, ip: &'static str) -> Self {
        Attempt {
            pair_ip: Some(ip),
            ..self
        }
    }
}

/// A policy that never challenges and locks after 5 failures a minute for a
/// minute; cases override what they test.
pub fn policy() -> LoginPolicy {
    LoginPolicy {
        captcha_after: 1_000,
        captcha_window_ms: 60_000,
        lock_after: 5,
        pair_lock_after: 2,
        lock_window_ms: 60_000,
        lock_ms: 60_000,
        lock_max_ms: 600_000,
        reset_on_success: true,
        escalation_reset_ms: 3_600_000,
    }
}
