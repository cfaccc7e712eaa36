//! `store.memory_limit`: the accounting and the eviction order.

use std::sync::Arc;

use super::MemoryStore;
use crate::domain::{Subject, SubjectKind};
use crate::store::{
    ConversionHit, ConversionPolicy, ConversionVerdict, HitRequest, Keys, LoginAttemptRequest,
    LoginPolicy, ManualClock, WindowSpec, WindowStore,
};

const MIB: usize = 1 << 20;

fn limited(limit: usize) -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new(1_000_000);
    (
        MemoryStore::with_limit(Arc::new(clock.clone()), limit),
        clock,
    )
}

fn windows() -> [WindowSpec; 1] {
    [WindowSpec::enforce(10, 3_600_000)]
}

/// One recorded event in the user `name`'s window.
async fn fail(store: &MemoryStore, name: &str) {
    record(store, name, "0123456789abcdef").await;
}

/// `member` recorded in the user `name`'s window.
async fn record(store: &MemoryStore, name: &str, member: &str) {
    let key = Keys::new("tg").window("user", name, "login_attempt");
    let req = HitRequest {
        key: &key,
        windows: &windows(),
        member,
        gate_open: false,
        force: false,
    };
    store.hit(req).await.unwrap();
}

/// One failure that locks the user `name` for an hour.
async fn lock(store: &MemoryStore, name: &str) {
    let policy = LoginPolicy {
        captcha_after: 100,
        captcha_window_ms: 3_600_000,
        lock_after: 1,
        pair_lock_after: 1,
        lock_window_ms: 3_600_000,
        lock_ms: 3_600_000,
        lock_max_ms: 3_600_000,
        reset_on_success: true,
        escalation_reset_ms: 3_600_000,
    };
    let keys = Keys::new("tg");
    let (window_key, lock_key) = (
        keys.window("user", name, "login_attempt"),
        keys.lock("user", name),
    );
    let req = LoginAttemptRequest {
        window_key: &window_key,
        lock_key: &lock_key,
        policy: &policy,
        success: false,
        captcha_passed: false,
        captcha_demanded: false,
        ip_blocked: false,
        member: "0123456789abcdef",
        shadow: false,
        pair: None,
    };
    store.login_attempt(req).await.unwrap();
}

/// What the store would count if it counted every subject afresh.
fn recounted(store: &MemoryStore) -> usize {
    store
        .subjects
        .iter()
        .map(|s| s.value().footprint(s.key().len()))
        .sum()
}

#[tokio::test]
async fn a_flood_of_names_stays_within_the_limit_and_counts_its_evictions() {
    let (store, clock) = limited(MIB);
    let names = 20_000;
    for i in 0..names {
        fail(&store, &format!("flood-{i:06}-{}", "x".repeat(100))).await;
        clock.advance_ms(1);
        assert!(
            store.accounted_bytes() <= MIB,
            "{} bytes after {i} names",
            store.accounted_bytes()
        );
    }
    assert!(store.evictions() > 0);
    assert_eq!(
        store.evictions() + store.subject_count() as u64,
        names,
        "every name is either kept or counted as evicted"
    );
    assert_eq!(
        store.accounted_bytes(),
        recounted(&store),
        "the running count has not drifted"
    );
    // The newest names are the ones kept.
    let newest = Keys::new("tg").window(
        "user",
        &format!("flood-{:06}-{}", names - 1, "x".repeat(100)),
        "login_attempt",
    );
    assert!(store.contains_key(&newest));
    let oldest = Keys::new("tg").window(
        "user",
        &format!("flood-000000-{}", "x".repeat(100)),
        "login_attempt",
    );
    assert!(!store.contains_key(&oldest));
}

#[tokio::test]
async fn the_least_recently_changed_go_first_and_a_read_is_no_touch() {
    let (store, clock) = limited(MIB);
    fail(&store, "kept").await;
    fail(&store, "idle").await;
    fail(&store, "only-read").await;
    for i in 0..20_000 {
        clock.advance_ms(1);
        fail(&store, &format!("flood-{i}-{}", "y".repeat(100))).await;
        if i % 100 == 0 {
            fail(&store, "kept").await;
            // A read (what `/login/check` does, free to any client) must not
            // keep a subject: else a flooder keeps its own names the newest.
            let key = Keys::new("tg").window("user", "only-read", "login_attempt");
            store.peek(&key, &windows()).await.unwrap();
        }
    }
    assert!(store.evictions() > 0);
    let key = |name| Keys::new("tg").window("user", name, "login_attempt");
    assert!(
        store.contains_key(&key("kept")),
        "changed within the last 100 names"
    );
    assert!(!store.contains_key(&key("idle")));
    assert!(
        !store.contains_key(&key("only-read")),
        "read, never changed"
    );
}

/// Locked subjects are never evicted, so an attacker who locks enough of
/// them holds the store past its limit. The others must still have the
/// limit's room: were every call then to evict every unlocked subject, a
/// victim's failures would be forgotten as soon as they are recorded and
/// never lock it.
#[tokio::test]
async fn locked_subjects_past_the_limit_leave_the_others_their_room() {
    let (store, clock) = limited(MIB);
    let mut locked = 0;
    while store.accounted_bytes() <= MIB + MIB / 10 {
        lock(&store, &format!("locked-{locked}-{}", "z".repeat(100))).await;
        locked += 1;
        clock.advance_ms(1);
    }
    assert_eq!(store.evictions(), 0, "a locked subject is never evicted");
    for failure in 0..3 {
        clock.advance_ms(1);
        record(&store, "victim", &format!("failure-{failure}")).await;
    }
    let key = Keys::new("tg").window("user", "victim", "login_attempt");
    let peeked = store.peek(&key, &windows()).await.unwrap();
    assert_eq!(peeked.counts, [3], "every failure of the victim is kept");
    assert_eq!(store.evictions(), 0);
    assert_eq!(store.subject_count(), locked + 1);
}

/// A pumping block, the code key and the index of pumping blocks outlive
/// a flood that evicts everything idle around them.
#[tokio::test]
async fn a_flood_never_evicts_a_pumping_block_or_the_process_secrets() {
    let (store, clock) = limited(MIB);
    let keys = Keys::new("tg");
    let policy = ConversionPolicy {
        min_events: 3,
        min_ratio_ppm: 500_000,
        window_ms: 3_600_000,
        block_ms: 3_600_000,
        surge: None,
    };
    let prefix = keys.subject_conversion(&Subject::new(SubjectKind::Prefix, "86138"));
    for _ in 0..3 {
        store.conversion_count(&prefix, &policy).await.unwrap();
    }
    let hit = ConversionHit {
        key: &prefix,
        policy: &policy,
    };
    let tripped = store.conversion_hit(hit, false).await.unwrap();
    assert_eq!(tripped.verdict, ConversionVerdict::Tripped);
    let (secret, blocks) = (keys.secret("code"), keys.conversion_blocks());
    store.get_or_init(&secret, "the code key").await.unwrap();
    store
        .expiring_add(&blocks, "prefix:86138", 3_600_000)
        .await
        .unwrap();

    for i in 0..20_000 {
        clock.advance_ms(1);
        fail(&store, &format!("flood-{i}-{}", "y".repeat(100))).await;
    }
    assert!(store.evictions() > 0);
    let blocked = store.conversion_hit(hit, false).await.unwrap();
    assert!(
        matches!(blocked.verdict, ConversionVerdict::Blocked { .. }),
        "{blocked:?}"
    );
    assert_eq!(
        store.get_or_init(&secret, "another").await.unwrap(),
        "the code key"
    );
    let listed = store.expiring_members(&blocks, 10).await.unwrap();
    assert_eq!(listed.members.len(), 1, "{listed:?}");
}

#[tokio::test]
async fn a_read_of_an_unknown_subject_keeps_nothing() {
    let (store, _) = limited(MIB);
    let key = Keys::new("tg").window("user", "nobody", "login_attempt");
    store.peek(&key, &windows()).await.unwrap();
    store.delete(std::slice::from_ref(&key)).await.unwrap();
    assert_eq!(store.subject_count(), 0);
    assert_eq!(store.accounted_bytes(), 0);
}

#[tokio::test]
async fn sweeping_gives_back_what_expired() {
    let (store, clock) = limited(MIB);
    for i in 0..100 {
        fail(&store, &format!("user-{i}")).await;
    }
    assert!(
        store.accounted_bytes() > 100 * 100,
        "{}",
        store.accounted_bytes()
    );
    clock.advance_ms(3_600_001);
    store.sweep();
    assert_eq!(store.accounted_bytes(), 0);
}
