//! What only the Redis store has: connecting, outages, the script cache.

use std::time::{Duration, Instant};

use fred::prelude::{
    ClientLike, HashesInterface, KeysInterface, LuaInterface, SortedSetsInterface,
};
use tollgate::store::redis::RedisStore;
use tollgate::store::{
    ConversionHit, ConversionPolicy, ConversionVerdict, HitRequest, HitVerdict, LoginPolicy,
    LoginVerdict, ReserveRequest, StoreError, Surge, WindowSpec, WindowStore,
};

use super::backend::{member, policy, redis_url, Attempt, Offer, StoreUnderTest};
use super::conversions;

#[tokio::test]
async fn a_redis_that_is_down_gives_a_store_that_answers_unavailable_at_once() {
    // A port nobody listens on.
    let port = crate::support::app::free_port();
    let url = format!("redis://127.0.0.1:{port}");

    let started = Instant::now();
    // A timeout far above the bounds below: neither connecting nor a call
    // may wait for it.
    let store = RedisStore::connect(&url, Duration::from_secs(3))
        .await
        .expect("connect does not fail when Redis is down");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "connect waited {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let windows = [WindowSpec::enforce(1, 1_000)];
    let hit = store
        .hit(HitRequest {
            key: "tgtest:{down}:x",
            windows: &windows,
            member: &member(),
            gate_open: false,
            force: false,
        })
        .await;
    assert!(matches!(hit, Err(StoreError::Unavailable(_))), "{hit:?}");
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "calls fail without waiting for the timeout: {:?}",
        started.elapsed()
    );
}

/// A Redis user whose ACL refuses scripts (`-@scripting`), as a managed
/// Redis may hand out, takes readiness's `SET` and would fail every
/// decision: `writable` (what `/readyz` asks) says so; given scripts, the
/// same user passes.
#[tokio::test]
async fn a_user_that_may_not_run_scripts_is_not_ready() {
    let raw = raw_client().await;
    let user = format!("tgtest-{}", uuid::Uuid::new_v4().simple());
    let acl = |rules: &[&str]| {
        let mut args = vec!["SETUSER".to_string(), user.clone()];
        args.extend(rules.iter().map(|r| r.to_string()));
        raw.custom::<(), _>(fred::cmd!("ACL"), args)
    };
    acl(&["on", ">readyz-secret", "~*", "&*", "+@all", "-@scripting"])
        .await
        .expect("ACL SETUSER");
    let url = redis_url().replacen("redis://", &format!("redis://{user}:readyz-secret@"), 1);
    let store = RedisStore::connect(&url, Duration::from_secs(2))
        .await
        .expect("a store");
    let key = format!("tgtest-{}:readyz", uuid::Uuid::new_v4().simple());

    let refused = store.writable(&key).await;
    acl(&["+@scripting"]).await.expect("ACL SETUSER");
    let allowed = store.writable(&key).await;
    let _: Result<(), _> = raw
        .custom(fred::cmd!("ACL"), vec!["DELUSER".to_string(), user.clone()])
        .await;

    assert!(
        refused.is_err() && format!("{refused:?}").contains("NOPERM"),
        "{refused:?}"
    );
    assert!(allowed.is_ok(), "{allowed:?}");
}

#[tokio::test]
async fn a_malformed_url_is_refused() {
    let result = RedisStore::connect("redis://[::1", Duration::from_millis(100)).await;
    assert!(result.is_err());
}

#[tokio::test]
async fn scripts_are_loaded_again_after_the_script_cache_is_flushed() {
    let b = StoreUnderTest::redis().await;
    let key = b.keys.window("phone", "+33600000000", "sms_send");
    let windows = [WindowSpec::enforce(2, 60_000)];
    assert_eq!(b.hit(&key, &windows).await.verdict, HitVerdict::Allowed);
    let user = "flushed-scripts";
    let first = b.login(user, &policy(), Attempt::failure()).await;
    assert_eq!(first.failures, 1);

    let raw = fred::types::Builder::from_config(
        fred::types::config::Config::from_url(&redis_url()).expect("a URL fred parses"),
    )
    .build()
    .expect("a client");
    raw.init().await.expect("a connection");
    raw.script_flush(false).await.expect("SCRIPT FLUSH");
    let _ = raw.quit().await;

    let second = b
        .store()
        .hit(HitRequest {
            key: &key,
            windows: &windows,
            member: &member(),
            gate_open: false,
            force: false,
        })
        .await;
    // Each script is loaded again and run once: the second failure counts
    // once, and a script other than the two rendered ones loads too.
    let again = b.login(user, &policy(), Attempt::failure()).await;
    let peeked = b.store().peek(&key, &windows).await;
    b.cleanup().await;
    assert_eq!(second.expect("reloaded on NOSCRIPT").counts, [1]);
    assert_eq!(again.verdict, LoginVerdict::Recorded);
    assert_eq!(again.failures, 2);
    assert_eq!(peeked.expect("window_peek reloaded").counts, [2]);
}

/// `login_attempt.lua` is rendered with the policy written into it: a call
/// under another policy (a reload) must run that policy's script, on the
/// same store and the same thread, and the first policy's must still be
/// there when it comes back.
#[tokio::test]
async fn a_login_under_another_policy_runs_that_policys_script() {
    let b = StoreUnderTest::redis().await;
    let calm = policy();
    let strict = LoginPolicy {
        captcha_after: 2,
        ..policy()
    };
    let user = "policy-swap";
    for n in 1..=2 {
        let out = b.login(user, &calm, Attempt::failure()).await;
        assert_eq!(
            out.verdict,
            LoginVerdict::Recorded,
            "failure {n} under the calm policy"
        );
    }
    let challenged = b.login(user, &strict, Attempt::failure()).await;
    assert_eq!(
        challenged.verdict,
        LoginVerdict::Challenged,
        "2 failures reach the strict policy's captcha_after"
    );
    let recorded = b.login(user, &calm, Attempt::failure()).await;
    assert_eq!(
        recorded.verdict,
        LoginVerdict::Recorded,
        "the calm policy again"
    );
    assert_eq!(recorded.failures, 3);
    b.cleanup().await;
}

/// A client of the test Redis, to look behind the store's back.
async fn raw_client() -> fred::clients::Client {
    let raw = fred::types::Builder::from_config(
        fred::types::config::Config::from_url(&redis_url()).expect("a URL fred parses"),
    )
    .build()
    .expect("a client");
    raw.init().await.expect("a connection");
    raw
}

/// `write` writes `key`, a hash that must live `keep_ms` past each write: its
/// expiry is set with its `exp` field, left alone while `exp` is far enough
/// (a key every send writes takes no `PEXPIRE` per call), and renewed once
/// `exp` falls within `keep_ms`.
async fn assert_renewed_only_when_short(key: &str, keep_ms: i64, write: impl AsyncFn()) {
    let raw = raw_client().await;
    let bounds = keep_ms..=keep_ms + keep_ms / 8;
    let pttl = async || raw.pttl::<i64, _>(key).await.expect("PTTL");
    let exp = async || {
        raw.hget::<Option<i64>, _, _>(key, "exp")
            .await
            .expect("HGET")
    };

    write().await;
    let first = pttl().await;
    assert!(bounds.contains(&first), "keep and an eighth: {first}");
    let set = exp().await.expect("exp is written");

    // Lengthen the key behind the scripts' back: a write that finds "exp"
    // far enough leaves the expiry alone.
    raw.pexpire::<(), _>(key, 10 * keep_ms, None)
        .await
        .expect("PEXPIRE");
    write().await;
    assert!(pttl().await > 9 * keep_ms, "not renewed");
    assert_eq!(exp().await, Some(set));

    // "exp" within keep: the next write renews.
    raw.hset::<(), _, _>(key, ("exp", set - keep_ms / 2))
        .await
        .expect("HSET");
    write().await;
    let renewed = pttl().await;
    assert!(bounds.contains(&renewed), "renewed: {renewed}");
    assert!(exp().await > Some(set - keep_ms / 2));
    let _ = raw.quit().await;
}

/// A meter hash every send writes (a prefix's, the global one).
#[tokio::test]
async fn a_meter_renews_its_expiry_only_when_it_falls_short() {
    let b = StoreUnderTest::redis().await;
    let key = b.keys.window("global", "renew", "sms_send");
    let windows = [WindowSpec {
        algorithm: tollgate::domain::Algorithm::Gcra,
        ..WindowSpec::enforce(1_000, 60_000)
    }];
    let meter_key = format!("{key}:meter");
    assert_renewed_only_when_short(&meter_key, 60_000, async || {
        b.hit(&key, &windows).await;
    })
    .await;
    b.cleanup().await;
}

/// A subject whose log is read whole keeps its meters in that log's ZSET
/// (src/store/redis/layout.rs): no hash beside it, two members a meter
/// scored below every event, one expiry for both, the longer; a log too
/// large to be read whole keeps its hash.
#[tokio::test]
async fn meters_beside_a_log_read_whole_are_members_of_it() {
    let b = StoreUnderTest::redis().await;
    let raw = raw_client().await;
    let meter = WindowSpec {
        algorithm: tollgate::domain::Algorithm::Gcra,
        ..WindowSpec::enforce(20, 7_200_000)
    };
    let key = b.keys.window("ip", "192.0.2.44", "sms_send");
    let windows = [WindowSpec::gate(3, 3_600_000), meter];
    let before = redis_now_ms(&raw).await;
    b.hit(&key, &windows).await;
    b.hit(&key, &windows).await;
    let after = redis_now_ms(&raw).await;

    let meter_key = format!("{key}:meter");
    assert_eq!(raw.exists::<u32, _>(&meter_key).await.expect("EXISTS"), 0);
    let members: Vec<(String, f64)> = raw
        .zrange(&key, 0, -1, None, false, None, true)
        .await
        .expect("ZRANGE");
    assert_eq!(
        members.len(),
        4,
        "two events and the meter's two: {members:?}"
    );
    let score = |name: &str| {
        members
            .iter()
            .find(|(m, _)| m == name)
            .map(|(_, score)| *score as i64)
    };
    // two events' level, less what drained between them (20 a ms)
    let level = score("m:20/7200000").map(|s| -1 - s);
    let full = 2 * 7_200_000;
    assert!(
        level.is_some_and(|l| (full - 20 * (after - before)..=full).contains(&l)),
        "{level:?}"
    );
    let stamp = score("m:20/7200000:t").map(|s| -1 - s);
    assert!(
        stamp.is_some_and(|at| (before..=after).contains(&at)),
        "{stamp:?} in {before}..={after}"
    );
    // the meter's members first, then the events
    assert!(
        members[..2].iter().all(|(m, _)| m.starts_with("m:")),
        "{members:?}"
    );
    assert!(members[2..]
        .iter()
        .all(|(_, at)| (before..=after).contains(&(*at as i64))));
    let pttl: i64 = raw.pttl(&key).await.expect("PTTL");
    assert!(
        (7_100_000..=7_200_000).contains(&pttl),
        "the meter's 2 h: {pttl}"
    );

    // A changed meter starts afresh: the old one's members leave at the
    // first send that finds them beside the new one's.
    let changed = [
        WindowSpec::gate(3, 3_600_000),
        WindowSpec { limit: 30, ..meter },
    ];
    for _ in 0..2 {
        let hit = b
            .hit_as(&key, &changed, &member(), Offer::gate_open())
            .await;
        assert!(hit.added, "{hit:?}");
    }
    let members: Vec<String> = raw
        .zrange(&key, 0, -1, None, false, None, false)
        .await
        .expect("ZRANGE");
    assert_eq!(
        members.len(),
        5,
        "three events kept and one meter: {members:?}"
    );
    assert_eq!(
        members[..2],
        ["m:30/7200000:t", "m:30/7200000"],
        "{members:?}"
    );
    let back = b.hit(&key, &windows).await;
    assert_eq!(back.counts, [3, 0], "the old meter is gone: {back:?}");

    let big = b.keys.window("ip", "192.0.2.45", "sms_send");
    let windows = [WindowSpec::enforce(33, 3_600_000), meter];
    b.hit(&big, &windows).await;
    let big_meter = format!("{big}:meter");
    assert_eq!(raw.exists::<u32, _>(&big_meter).await.expect("EXISTS"), 1);
    assert_eq!(raw.zcard::<u32, _>(&big).await.expect("ZCARD"), 1);
    let _ = raw.quit().await;
    b.cleanup().await;
}

/// The Redis server's clock, in ms.
async fn redis_now_ms(raw: &fred::clients::Client) -> i64 {
    let t: Vec<i64> = raw
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .expect("TIME");
    t[0] * 1000 + t[1] / 1000
}

/// A conversion hash, counted by a send's reservation (`reserve.lua`) and by
/// a verified code (`conversion_count.lua`): both renew by the same rule.
#[tokio::test]
async fn a_conversion_renews_its_expiry_only_when_it_falls_short() {
    let b = StoreUnderTest::redis().await;
    let policy = ConversionPolicy {
        min_events: 1_000,
        min_ratio_ppm: 0,
        window_ms: 60_000,
        block_ms: 60_000,
        surge: None,
    };
    let keep = i64::try_from(policy.keep_ms()).expect("a small keep");
    let sent = b.keys.window("prefix", "+3361111", "conversion");
    assert_renewed_only_when_short(&sent, keep, async || {
        let conversions = [ConversionHit {
            key: &sent,
            policy: &policy,
        }];
        let outcome = b
            .store()
            .reserve(ReserveRequest {
                subjects: &[],
                conversions: &conversions,
                member: &member(),
                gate_open: false,
                force: false,
                code: None,
            })
            .await
            .expect("reserve");
        assert!(outcome.recorded);
    })
    .await;
    let verified = b.keys.window("prefix", "+3361112", "conversion");
    assert_renewed_only_when_short(&verified, keep, async || {
        b.store()
            .conversion_success(&verified, &policy)
            .await
            .expect("conversion_success");
    })
    .await;
    b.cleanup().await;
}

/// Waits, when fewer than 20 s of the current slice of `slice_ms` are left
/// by Redis's clock, until the next one begins.
async fn start_early_in_a_slice(raw: &fred::clients::Client, slice_ms: u64) {
    let (secs, micros): (u64, u64) = raw
        .custom(fred::cmd!("TIME"), Vec::<String>::new())
        .await
        .expect("TIME");
    let into = (secs * 1_000 + micros / 1_000) % slice_ms;
    let left = slice_ms - into;
    if left < 20_000 {
        tokio::time::sleep(Duration::from_millis(left + 100)).await;
    }
}

/// A conversion keeps the sums of the slices before the current one in its
/// hash ("cur", "be", "bs"), made once a slice from the whole hash, and
/// reads the current slice's own counts as they change; a count taken back
/// from a given slice drops the sums, so the next call sums the slices
/// again. Without that drop the last answer below would still count the
/// event taken back.
#[tokio::test]
async fn a_conversion_sums_its_history_once_a_slice_and_sees_a_count_taken_back() {
    let b = StoreUnderTest::redis().await;
    let raw = raw_client().await;
    // Slices of five minutes; the test must run within one, so it starts
    // early in one by Redis's clock, which the script reads.
    let policy = ConversionPolicy {
        min_events: 1_000_000,
        min_ratio_ppm: 0,
        window_ms: 3_600_000,
        block_ms: 60_000,
        surge: None,
    };
    start_early_in_a_slice(&raw, policy.slice_ms()).await;
    let key = b.keys.window("prefix", "+3361113", "conversion");
    let store = b.store();
    let hit = async || {
        let outcome = conversions::hit(&b, &key, &policy, false).await;
        (outcome.events, outcome.successes)
    };
    // One send now (the hash, its expiry and the current slice), then the
    // eleven earlier live slices a running service leaves.
    let slice = store
        .conversion_count(&key, &policy)
        .await
        .expect("conversion_count")
        .expect("counted");
    for back in 1..12 {
        raw.hset::<(), _, _>(
            &key,
            [
                (format!("e:{}", slice - back), 10),
                (format!("s:{}", slice - back), 2),
            ],
        )
        .await
        .expect("HSET");
    }
    assert_eq!(hit().await, (111, 22));
    let sums = async || -> (Option<u64>, Option<i64>, Option<i64>) {
        raw.hmget(&key, vec!["cur", "be", "bs"])
            .await
            .expect("HMGET")
    };
    assert_eq!(sums().await, (Some(slice), Some(110), Some(22)));
    // Within the slice the answer comes from the sums: an earlier slice
    // changed behind the store's back does not show (then it is put back).
    let earlier = format!("e:{}", slice - 5);
    raw.hset::<(), _, _>(&key, (earlier.as_str(), 50))
        .await
        .expect("HSET");
    assert_eq!(hit().await, (111, 22), "read from the sums");
    raw.hset::<(), _, _>(&key, (earlier.as_str(), 10))
        .await
        .expect("HSET");

    store
        .conversion_count(&key, &policy)
        .await
        .expect("conversion_count");
    store
        .conversion_success(&key, &policy)
        .await
        .expect("conversion_success");
    assert_eq!(
        hit().await,
        (112, 23),
        "the current slice read as it changes"
    );

    store
        .conversion_undo(&key, slice - 3)
        .await
        .expect("conversion_undo");
    assert_eq!(
        hit().await,
        (111, 23),
        "a send taken back from an earlier slice"
    );
    assert_eq!(sums().await, (Some(slice), Some(109), Some(22)));
    let _ = raw.quit().await;
    b.cleanup().await;
}

/// A send reads a conversion's sums without asking for `until` (a field
/// the hash lacks is a scan of all of it), so a challenge tripped from the
/// sums must stop the sums being read: the next send sees the challenge,
/// not the sums of its slice. Without that, a country challenged early in
/// a slice would be open again until the slice ends.
#[tokio::test]
async fn a_challenge_tripped_from_the_sums_is_seen_by_the_next_send() {
    let b = StoreUnderTest::redis().await;
    let raw = raw_client().await;
    // Five-minute slices, the normal over seven buckets of an hour; the
    // calls below must fall in one slice.
    let policy = country_policy(4, 7 * 3_600_000);
    start_early_in_a_slice(&raw, policy.slice_ms()).await;
    let key = b.keys.window("country", "FR", "conversion");
    let hit = async || conversions::hit(&b, &key, &policy, false).await;
    let count = async || conversions::count(&b, &key, &policy).await;
    // One send gives the hash its expiry; the next check makes the sums.
    let slice = count().await;
    assert_eq!(hit().await.verdict, ConversionVerdict::Open);
    let cur: Option<u64> = raw.hget(&key, "cur").await.expect("HGET");
    assert_eq!(cur, Some(slice), "the sums are made");
    for _ in 0..3 {
        count().await;
    }
    let tripped = hit().await;
    assert_eq!(
        (tripped.verdict, tripped.events),
        (ConversionVerdict::ChallengeTripped, 4),
        "tripped on the sums and the slice's own count"
    );
    let next = hit().await;
    assert!(
        matches!(next.verdict, ConversionVerdict::Challenged { .. }),
        "the challenge holds within the slice it began in: {next:?}"
    );
    let cur: Option<String> = raw.hget(&key, "cur").await.expect("HGET");
    assert_eq!(
        cur.as_deref(),
        Some("-"),
        "no slice's sums while challenged"
    );
    let _ = raw.quit().await;
    b.cleanup().await;
}

/// A conversion hash a send reads often is written again, at the first
/// send of a slice, with what a send reads first: its sums, then the
/// current slice's counts (a listpack is scanned from its first field, and
/// a hash made field by field keeps them last, after some forty others in
/// a country's). Nothing else changes: the live slices, the buckets with
/// what this send taught them, any other field, the answer, the expiry. A
/// quiet hash (fewer than 16 events in the slice before) keeps its order.
#[tokio::test]
async fn a_busy_conversion_is_written_again_in_the_order_a_send_reads_it() {
    let b = StoreUnderTest::redis().await;
    let raw = raw_client().await;
    // Five-minute slices, buckets of an hour; one slice for the whole test.
    let policy = country_policy(1_000_000, 7 * 3_600_000);
    start_early_in_a_slice(&raw, policy.slice_ms()).await;
    let slice_ms = policy.slice_ms();
    let bucket_ms = policy.bucket_ms().expect("a surge");
    // One count for the slice now; the hash is then made again by hand in
    // a running service's order: its expiry and stale sums first, the
    // buckets, the slices oldest first, the current one last.
    let fields_in_order = async |key: &str, before: u64| -> Vec<(String, String)> {
        let slice = conversions::count(&b, key, &policy).await;
        let exp: i64 = raw.hget(key, "exp").await.expect("HGET");
        let mut fields = vec![
            ("exp".to_string(), exp.to_string()),
            ("cur".to_string(), "0".to_string()),
            ("be".to_string(), "0".to_string()),
            ("bs".to_string(), "0".to_string()),
            ("nt".to_string(), "0".to_string()),
            ("x-later".to_string(), "kept".to_string()),
        ];
        // a bucket too old to keep, seven the normal reads, today's
        let first = slice * slice_ms / bucket_ms - 8;
        for bucket in first..=first + 8 {
            fields.push((format!("n:{bucket}"), "100".to_string()));
        }
        // a stale slice that teaches its bucket 10, then eleven live ones
        fields.push((format!("e:{}", slice - 12), "10".to_string()));
        fields.push((format!("s:{}", slice - 12), "10".to_string()));
        for back in (1..12).rev() {
            let events = if back == 1 { before } else { 3 };
            fields.push((format!("e:{}", slice - back), events.to_string()));
            fields.push((format!("s:{}", slice - back), "1".to_string()));
        }
        fields.push((format!("e:{slice}"), "1".to_string()));
        raw.del::<(), _>(key).await.expect("DEL");
        // HSET by hand: fred's map of fields would not keep their order
        let mut args = vec![key.to_string()];
        args.extend(fields.iter().flat_map(|(n, v)| [n.clone(), v.clone()]));
        raw.custom::<(), _>(fred::cmd!("HSET"), args)
            .await
            .expect("HSET");
        raw.pexpire_at::<(), _>(key, exp, None)
            .await
            .expect("PEXPIRE_AT");
        fields
    };
    let read_all = async |key: &str| fields_in_listpack_order(&raw, key).await;

    let busy = b.keys.window("country", "FR", "conversion");
    let seeded = fields_in_order(&busy, 16).await;
    let outcome = conversions::hit(&b, &busy, &policy, false).await;
    // 10 * 3 + 16 + 1 events, 11 successes in the live slices
    assert_eq!((outcome.events, outcome.successes), (47, 11));
    let slice = outcome_slice(&seeded);
    let rewritten = read_all(&busy).await;
    let names: Vec<&str> = rewritten.iter().map(|(n, _)| n.as_str()).collect();
    let current_e = format!("e:{slice}");
    let current_s = format!("s:{slice}");
    assert_eq!(
        names[..7],
        ["cur", "exp", "be", "bs", "nt", &current_e, &current_s],
        "what a send reads comes first: {names:?}"
    );
    let value = |name: &str| {
        rewritten
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(value("cur"), Some(slice.to_string().as_str()));
    assert_eq!((value("be"), value("bs")), (Some("46"), Some("11")));
    assert_eq!(
        (value(&current_e), value(&current_s)),
        (Some("1"), Some("0"))
    );
    assert_eq!(
        value("nt"),
        Some("710"),
        "the seven buckets before today's, one taught 10"
    );
    assert_eq!(value("x-later"), Some("kept"));
    let first_bucket = slice * slice_ms / bucket_ms - 8;
    assert_eq!(
        value(&format!("n:{first_bucket}")),
        None,
        "a bucket too old"
    );
    assert_eq!(value(&format!("e:{}", slice - 12)), None, "a stale slice");
    let taught = format!("n:{}", (slice - 12) * slice_ms / bucket_ms);
    assert_eq!(
        value(&taught),
        Some("110"),
        "the stale slice taught its bucket"
    );
    for (name, old) in &seeded {
        let dropped = name == &format!("n:{first_bucket}")
            || name.ends_with(&format!(":{}", slice - 12))
            || ["cur", "be", "bs", "nt"].contains(&name.as_str())
            || name == &taught;
        if !dropped {
            assert_eq!(value(name), Some(old.as_str()), "{name} kept as it was");
        }
    }
    assert_eq!(
        rewritten.len(),
        seeded.len() - 3 + 1,
        "the stale fields gone, s:<now> made"
    );
    let exp: i64 = value("exp").and_then(|e| e.parse().ok()).expect("exp");
    // The clock first: PTTL, read after it, can only be less than what was
    // left then, however long a loaded machine takes between the two.
    let left = exp - redis_now_ms(&raw).await;
    let pttl: i64 = raw.pttl(&busy).await.expect("PTTL");
    assert!(
        (left - 2_000..=left + 1).contains(&pttl),
        "the key expires at its exp: {pttl} ms left, exp in {left}"
    );
    // Read from the sums now, and counted where the send found it.
    let again = conversions::hit(&b, &busy, &policy, false).await;
    assert_eq!((again.events, again.successes), (47, 11));
    conversions::count(&b, &busy, &policy).await;
    let after: Vec<String> = read_all(&busy).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(after[5], current_e, "no field appended: {after:?}");

    let quiet = b.keys.window("country", "DE", "conversion");
    fields_in_order(&quiet, 15).await;
    conversions::hit(&b, &quiet, &policy, false).await;
    let kept: Vec<String> = read_all(&quiet).await.into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        kept.last(),
        Some(&current_e),
        "a quiet hash keeps its order: {kept:?}"
    );
    assert_eq!(kept[0], "exp");
    let _ = raw.quit().await;
    b.cleanup().await;
}

/// The current slice of a hash `fields_in_order` made: its last field's.
fn outcome_slice(fields: &[(String, String)]) -> u64 {
    fields
        .last()
        .and_then(|(name, _)| name.strip_prefix("e:"))
        .and_then(|n| n.parse().ok())
        .expect("the current slice last")
}

/// The rewrite of a busy conversion hash happens once a slice: in a slice
/// that spans two buckets of the history every send reads the whole hash,
/// and only the first, which finds the sums stale, writes it again. And it
/// leaves alone what is not its to drop: without a surge, an "nt" field.
#[tokio::test]
async fn a_busy_conversion_is_written_again_once_a_slice_and_only_what_it_owns() {
    let b = StoreUnderTest::redis().await;
    let raw = raw_client().await;
    // Buckets of 100 s, shorter than a slice of 5 minutes: every slice
    // spans several.
    let spanning = country_policy(1_000_000, 700_000);
    let plain = ConversionPolicy {
        surge: None,
        ..spanning
    };
    start_early_in_a_slice(&raw, spanning.slice_ms()).await;
    let names = async |key: &str| -> Vec<String> {
        let fields = fields_in_listpack_order(&raw, key).await;
        fields.into_iter().map(|(name, _)| name).collect()
    };
    // A busy hash with stale sums: 20 sends in the slice before, a bucket
    // the normal reads, and for the plain one an "nt" of another policy.
    let seed = async |key: &str, policy: &ConversionPolicy| {
        let slice = conversions::count(&b, key, policy).await;
        let (secs, _): (u64, u64) = raw
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .expect("TIME");
        let bucket = secs * 1_000 / 100_000 - 1;
        raw.custom::<(), _>(
            fred::cmd!("HSET"),
            vec![
                key.to_string(),
                "cur".into(),
                "0".into(),
                "nt".into(),
                "5".into(),
                format!("n:{bucket}"),
                "7".into(),
                format!("e:{}", slice - 1),
                "20".into(),
            ],
        )
        .await
        .expect("HSET");
        slice
    };

    let key = b.keys.window("country", "FR", "conversion");
    let slice = seed(&key, &spanning).await;
    let first = conversions::hit(&b, &key, &spanning, false).await;
    assert_eq!(
        names(&key).await[..2],
        ["cur".to_string(), "exp".to_string()],
        "written again by the first send of the slice"
    );
    raw.hset::<(), _, _>(&key, ("x-last", 1))
        .await
        .expect("HSET");
    let second = conversions::hit(&b, &key, &spanning, false).await;
    assert_eq!(
        (second.events, second.successes),
        (first.events, first.successes)
    );
    assert_eq!(
        names(&key).await.last().map(String::as_str),
        Some("x-last"),
        "not written again by the next send of the slice"
    );
    assert_eq!(first.events, 21, "the slice before and this one: {slice}");

    let key = b.keys.window("prefix", "+3361114", "conversion");
    seed(&key, &plain).await;
    conversions::hit(&b, &key, &plain, false).await;
    let nt: Option<String> = raw.hget(&key, "nt").await.expect("HGET");
    assert_eq!(
        names(&key).await[..2],
        ["cur".to_string(), "exp".to_string()]
    );
    assert_eq!(nt.as_deref(), Some("5"), "not the plain policy's to drop");
    let _ = raw.quit().await;
    b.cleanup().await;
}

/// A country's pumping policy as these tests take it: a one-hour window in
/// five-minute slices, surges of twice a normal over seven buckets of
/// `history_ms / 7`, escalating to a block; never tripping by itself when
/// `min_events` is large.
fn country_policy(min_events: u32, history_ms: u64) -> ConversionPolicy {
    ConversionPolicy {
        min_events,
        min_ratio_ppm: 500_000,
        window_ms: 3_600_000,
        block_ms: 60_000,
        surge: Some(Surge {
            factor_milli: 2_000,
            history_ms,
            block: true,
        }),
    }
}

/// A hash's fields and values in the order HGETALL answers them: a
/// listpack's own (fred's map of them would not keep it).
async fn fields_in_listpack_order(raw: &fred::clients::Client, key: &str) -> Vec<(String, String)> {
    let flat: Vec<String> = raw
        .custom(fred::cmd!("HGETALL"), vec![key.to_string()])
        .await
        .expect("HGETALL");
    flat.chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}
