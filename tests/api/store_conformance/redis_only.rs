//! What only the Redis store has: connecting, outages, the script cache.

use std::time::{Duration, Instant};

use fred::prelude::{ClientLike, HashesInterface, KeysInterface, LuaInterface};
use tollgate::store::redis::RedisStore;
use tollgate::store::{HitRequest, HitVerdict, StoreError, WindowSpec, WindowStore};

use super::backend::{member, redis_url, StoreUnderTest};

#[tokio::test]
async fn a_redis_that_is_down_gives_a_store_that_answers_unavailable_at_once() {
    // A port nobody listens on.
    let port = crate::support::app::free_port();
    let url = format!("redis://127.0.0.1:{port}");

    let started = Instant::now();
    let store = RedisStore::connect(&url, Duration::from_millis(300))
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
        started.elapsed() < Duration::from_millis(100),
        "calls fail fast"
    );
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
    b.cleanup().await;
    assert_eq!(second.expect("reloaded on NOSCRIPT").counts, [1]);
}

/// A meter hash every send writes (a prefix's, the global one) takes a
/// `PEXPIRE` only when its `exp` field says the key would expire within its
/// window: never cut short, not renewed at every call.
#[tokio::test]
async fn a_meter_renews_its_expiry_only_when_it_falls_short() {
    let b = StoreUnderTest::redis().await;
    let key = b.keys.window("global", "renew", "sms_send");
    let meter_key = format!("{key}:meter");
    let windows = [WindowSpec {
        algorithm: tollgate::domain::Algorithm::Gcra,
        ..WindowSpec::enforce(1_000, 60_000)
    }];
    let raw = fred::types::Builder::from_config(
        fred::types::config::Config::from_url(&redis_url()).expect("a URL fred parses"),
    )
    .build()
    .expect("a client");
    raw.init().await.expect("a connection");
    let pttl = |raw: &fred::clients::Client, key: String| {
        let raw = raw.clone();
        async move { raw.pttl::<i64, _>(key).await.expect("PTTL") }
    };
    let exp = |raw: &fred::clients::Client, key: String| {
        let raw = raw.clone();
        async move {
            raw.hget::<Option<i64>, _, _>(key, "exp")
                .await
                .expect("HGET")
        }
    };

    b.hit(&key, &windows).await;
    let first = pttl(&raw, meter_key.clone()).await;
    assert!(
        (60_000..=67_500).contains(&first),
        "the window and an eighth: {first}"
    );
    let set = exp(&raw, meter_key.clone()).await.expect("exp is written");

    // Lengthen the key behind the script's back: a hit that finds "exp" far
    // enough leaves the expiry alone.
    raw.pexpire::<(), _>(&meter_key, 500_000, None)
        .await
        .expect("PEXPIRE");
    b.hit(&key, &windows).await;
    assert!(pttl(&raw, meter_key.clone()).await > 400_000, "not renewed");
    assert_eq!(exp(&raw, meter_key.clone()).await, Some(set));

    // "exp" within the window: the next hit renews.
    raw.hset::<(), _, _>(&meter_key, ("exp", set - 30_000))
        .await
        .expect("HSET");
    b.hit(&key, &windows).await;
    let renewed = pttl(&raw, meter_key.clone()).await;
    assert!((60_000..=67_500).contains(&renewed), "renewed: {renewed}");
    assert!(exp(&raw, meter_key.clone()).await > Some(set - 30_000));

    let _ = raw.quit().await;
    b.cleanup().await;
}
