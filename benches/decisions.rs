//! `WindowStore::hit` on the in-process and the Redis store.
//!
//! The workload is the phone rule on `sms_send` (1 per 60 s, 5 per 1 h, 10 per
//! 24 h) over many distinct phones, each offered four times, so about one hit in
//! four is allowed and the rest are denied by the 60 s window.
//!
//! First a throughput run, printed as plain lines a README can quote:
//!
//! ```text
//! decisions/s: memory N     (sequential calls)
//! decisions/s: redis N      (64 calls in flight on one connection)
//! ```
//!
//! then the in-process store's cost per call against the members one subject
//! keeps (it must stay flat from 10 to 10,000):
//!
//! ```text
//! memory, ns per call with N members kept: N  offer+undo X  refused Y
//! ```
//!
//! then criterion's per-call latency. Redis is `TOLLGATE_BENCH_REDIS_URL`
//! (default `redis://127.0.0.1:6379`); when it is unreachable the Redis part is
//! skipped with a message. Its keys live under a random prefix and are deleted
//! at the end.
//!
//! `cargo bench --bench decisions`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use futures::StreamExt;
use tokio::runtime::Runtime;
use tollgate::store::memory::MemoryStore;
use tollgate::store::redis::RedisStore;
use tollgate::store::{HitRequest, HitVerdict, Keys, SystemClock, WindowSpec, WindowStore};

const PHONE_WINDOWS: [WindowSpec; 3] = [
    WindowSpec {
        limit: 1,
        window_ms: 60_000,
        mode: tollgate::store::WindowMode::Enforce,
        algorithm: tollgate::domain::Algorithm::SlidingLog,
    },
    WindowSpec {
        limit: 5,
        window_ms: 3_600_000,
        mode: tollgate::store::WindowMode::Enforce,
        algorithm: tollgate::domain::Algorithm::SlidingLog,
    },
    WindowSpec {
        limit: 10,
        window_ms: 86_400_000,
        mode: tollgate::store::WindowMode::Enforce,
        algorithm: tollgate::domain::Algorithm::SlidingLog,
    },
];

/// Calls per throughput run; each phone is offered `CALLS / PHONES` times.
const MEMORY_CALLS: u64 = 200_000;
const REDIS_CALLS: u64 = 20_000;
const OFFERS_PER_PHONE: u64 = 4;
const IN_FLIGHT: usize = 64;

/// One decision: the `i`-th call, for the `phone`-th phone.
async fn decide(store: &dyn WindowStore, keys: &Keys, i: u64, phone: u64) -> bool {
    let phone = format!("+3361{phone:07}");
    let key = keys.window("phone", &phone, "sms_send");
    let member = format!("bench-{i}");
    let outcome = store
        .hit(HitRequest {
            key: &key,
            windows: &PHONE_WINDOWS,
            member: &member,
            gate_open: false,
            force: false,
        })
        .await;
    match outcome {
        Ok(o) => o.verdict == HitVerdict::Allowed,
        Err(e) => panic!("hit failed: {e}"),
    }
}

struct Rate {
    per_second: f64,
    allowed: u64,
    calls: u64,
}

async fn memory_rate() -> Rate {
    let store = MemoryStore::new(Arc::new(SystemClock));
    let keys = Keys::new("tgbench");
    let phones = MEMORY_CALLS / OFFERS_PER_PHONE;
    let started = Instant::now();
    let mut allowed = 0;
    for i in 0..MEMORY_CALLS {
        allowed += u64::from(decide(&store, &keys, i, i % phones).await);
    }
    Rate {
        per_second: MEMORY_CALLS as f64 / started.elapsed().as_secs_f64(),
        allowed,
        calls: MEMORY_CALLS,
    }
}

async fn redis_rate(store: &RedisStore, keys: &Keys) -> Rate {
    let phones = REDIS_CALLS / OFFERS_PER_PHONE;
    let started = Instant::now();
    let allowed: u64 = futures::stream::iter(0..REDIS_CALLS)
        .map(|i| decide(store, keys, i, i % phones))
        .buffer_unordered(IN_FLIGHT)
        .map(u64::from)
        .fold(0, |sum, a| async move { sum + a })
        .await;
    Rate {
        per_second: REDIS_CALLS as f64 / started.elapsed().as_secs_f64(),
        allowed,
        calls: REDIS_CALLS,
    }
}

/// One subject whose window keeps `kept` members (a busy IP, a global
/// window): the cost of an offer that is admitted and taken back (a
/// reservation that another subject refused), and of one that is refused.
async fn memory_per_call(kept: u32) -> (f64, f64) {
    const CALLS: u32 = 20_000;
    let store = MemoryStore::new(Arc::new(SystemClock));
    let key = Keys::new("tgbench").window("ip", "192.0.2.1", "login_attempt");
    let room = [WindowSpec::enforce(kept + 1, 3_600_000)];
    let full = [WindowSpec::enforce(kept, 3_600_000)];
    for i in 0..kept {
        offer(&store, &key, &room, &format!("fill-{i}")).await;
    }
    let started = Instant::now();
    for i in 0..CALLS {
        let member = format!("offer-{i}");
        let verdict = offer(&store, &key, &room, &member).await;
        assert_eq!(verdict, HitVerdict::Allowed);
        store
            .undo(&key, &member, &room)
            .await
            .expect("a memory undo");
    }
    let admitted = started.elapsed().as_nanos() as f64 / f64::from(CALLS);
    let started = Instant::now();
    for i in 0..CALLS {
        let verdict = offer(&store, &key, &full, &format!("refused-{i}")).await;
        assert!(matches!(verdict, HitVerdict::Denied { .. }));
    }
    let refused = started.elapsed().as_nanos() as f64 / f64::from(CALLS);
    (admitted, refused)
}

async fn offer(store: &MemoryStore, key: &str, windows: &[WindowSpec], member: &str) -> HitVerdict {
    let request = HitRequest {
        key,
        windows,
        member,
        gate_open: false,
        force: false,
    };
    store.hit(request).await.expect("a memory hit").verdict
}

fn print_rate(name: &str, rate: &Rate, how: &str) {
    println!("decisions/s: {name} {:.0}", rate.per_second);
    println!(
        "  ({} calls {how}, {} allowed, {} denied)",
        rate.calls,
        rate.allowed,
        rate.calls - rate.allowed
    );
}

async fn connect_redis() -> Option<RedisStore> {
    let url = std::env::var("TOLLGATE_BENCH_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    match RedisStore::connect(&url, Duration::from_secs(2)).await {
        Ok(store) if store.ping().await.is_ok() => Some(store),
        _ => {
            println!("decisions/s: redis skipped (no Redis at {url})");
            None
        }
    }
}

/// Per-call latency of `hit`, one call at a time, over ever new phones
/// offered four times each.
fn bench_hit(c: &mut Criterion, rt: &Runtime, name: &str, store: &dyn WindowStore, keys: &Keys) {
    let next = AtomicU64::new(0);
    c.bench_function(name, |b| {
        b.to_async(rt).iter(|| {
            let i = next.fetch_add(1, Ordering::Relaxed);
            decide(store, keys, i, i / OFFERS_PER_PHONE)
        })
    });
}

fn main() {
    let rt = match Runtime::new() {
        Ok(rt) => rt,
        Err(e) => panic!("no tokio runtime: {e}"),
    };

    let memory = rt.block_on(memory_rate());
    print_rate("memory", &memory, "in sequence");
    for kept in [10, 100, 1_000, 10_000] {
        let (admitted, refused) = rt.block_on(memory_per_call(kept));
        println!(
            "memory, ns per call with N members kept: {kept:>6}  offer+undo {admitted:>6.0}  refused {refused:>6.0}"
        );
    }

    let redis = rt.block_on(connect_redis());
    let redis_keys = Keys::new(format!("tgbench-{}", uuid::Uuid::new_v4()));
    if let Some(store) = &redis {
        let rate = rt.block_on(redis_rate(store, &redis_keys));
        print_rate("redis", &rate, &format!("with {IN_FLIGHT} in flight"));
    }

    let mut criterion = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let memory_store = MemoryStore::new(Arc::new(SystemClock));
    let memory_keys = Keys::new("tgbench");
    bench_hit(
        &mut criterion,
        &rt,
        "hit/memory",
        &memory_store,
        &memory_keys,
    );
    if let Some(store) = &redis {
        bench_hit(&mut criterion, &rt, "hit/redis", store, &redis_keys);
        match rt.block_on(store.delete_prefix(redis_keys.prefix())) {
            Ok(n) => println!("deleted {n} benchmark keys"),
            Err(e) => println!("could not delete the benchmark keys: {e}"),
        }
    }
    criterion.final_summary();
}
