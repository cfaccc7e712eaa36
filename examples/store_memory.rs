//! The in-process store's memory against `store.memory_limit`: the process's
//! resident memory before and after N distinct user names, each with one
//! failed login recorded (a user window and an IP window, as `/login/attempt`
//! writes them), beside what the store counts (`docs/store.md` quotes it).
//!
//! `cargo run --release --example store_memory -- 300000 64MiB`
//! (`0` as the limit: none).

use std::sync::Arc;

use tollgate::store::memory::MemoryStore;
use tollgate::store::{HitRequest, Keys, SystemClock, WindowSpec, WindowStore};

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn size(arg: Option<String>) -> usize {
    let text = arg.unwrap_or_else(|| "64MiB".into());
    let (number, scale) = match text.strip_suffix("MiB") {
        Some(n) => (n, 1 << 20),
        None => (text.as_str(), 1),
    };
    number.parse::<usize>().expect("a number, or NMiB") * scale
}

/// The allocator of tollgate's binary: resident memory is the allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let names: u32 = args.next().map_or(300_000, |n| n.parse().expect("a count"));
    let limit = match size(args.next()) {
        0 => usize::MAX,
        limit => limit,
    };
    let store = MemoryStore::with_limit(Arc::new(SystemClock), limit);
    let keys = Keys::new("tg");
    let user_windows = [
        WindowSpec::enforce(3, 900_000),
        WindowSpec::enforce(10, 3_600_000),
    ];
    let ip_windows = [
        WindowSpec::enforce(20, 3_600_000),
        WindowSpec::enforce(100, 3_600_000),
    ];
    let before = rss_bytes();
    for i in 0..names {
        let user = keys.window("user", &format!("user-{i:08}@example.com"), "login_attempt");
        let ip = keys.window(
            "ip",
            &format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
            "login_attempt",
        );
        let member = format!("{i:016x}");
        for (key, windows) in [(&user, &user_windows[..]), (&ip, &ip_windows[..])] {
            let req = HitRequest {
                key,
                windows,
                member: &member,
                gate_open: false,
                force: false,
            };
            store.hit(req).await.expect("the in-process store answers");
        }
    }
    let after = rss_bytes();
    let mib = |b: usize| b as f64 / f64::from(1 << 20);
    println!(
        "{names} names, limit {}: RSS {:.1} -> {:.1} MiB (+{:.1}); counted {:.1} MiB in {} subjects \
         ({:.0} B each); {} evicted; RSS growth / counted = {:.2}",
        if limit == usize::MAX { "none".to_string() } else { format!("{:.0} MiB", mib(limit)) },
        mib(before),
        mib(after),
        mib(after.saturating_sub(before)),
        mib(store.accounted_bytes()),
        store.subject_count(),
        store.accounted_bytes() as f64 / store.subject_count().max(1) as f64,
        store.evictions(),
        after.saturating_sub(before) as f64 / store.accounted_bytes().max(1) as f64,
    );
}
