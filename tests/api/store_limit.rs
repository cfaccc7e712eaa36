//! `docs/store.md`: the in-process store's memory limit and eviction, names
//! too long once normalised, and subject ids hashed in Redis key names.

use std::time::Duration;

use fred::prelude::{ClientLike, HashesInterface};
use futures::StreamExt;
use serde_json::{json, Value};
use tollgate::settings::LockScope;
use tollgate::store::redis::RedisStore;

use crate::on_both_backends;
use crate::support::app::{spawn_app, Backend, TestApp};

on_both_backends!(names_too_long_once_normalised_are_refused_with_their_own_code,);

async fn fail(app: &TestApp, user: &str, ip: &str) -> Value {
    let answer = app
        .login_attempt(json!({ "user": user, "ip": ip, "success": false }))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

async fn check(app: &TestApp, user: &str) -> Value {
    let answer = app
        .login_check(json!({ "user": user, "ip": "192.0.2.250" }))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// Distinct names (and addresses) well past a 1 MiB limit: the metric
/// counts evictions, an idle user's failures are gone, and a locked user is
/// still locked: flooding names cannot unlock a victim.
#[tokio::test]
async fn a_flood_of_names_evicts_idle_users_but_never_a_locked_one() {
    let app = spawn_app(Backend::Memory, |s| {
        s.store.memory_limit = 1 << 20;
        s.login.lock_scope = LockScope::User;
        s.login.lock_after = 2;
        s.login.captcha_after = 1000;
        s.login.lock_duration = Duration::from_secs(3600);
    })
    .await;
    fail(&app, "victim", "203.0.113.1").await;
    assert_eq!(fail(&app, "victim", "203.0.113.1").await["locked"], true);
    fail(&app, "idle", "203.0.113.2").await;
    assert_eq!(check(&app, "idle").await["failures"], 1);
    let evictions = app.metric("tollgate_store_evictions_total").await;

    let padding = "n".repeat(200);
    futures::stream::iter(0..2_000u32)
        .map(|i| {
            let (user, ip) = (
                format!("flood-{i}-{padding}"),
                format!("10.0.{}.{}", i / 256, i % 256),
            );
            let app = &app;
            async move { fail(app, &user, &ip).await }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;

    assert!(
        app.metric("tollgate_store_evictions_total").await > evictions,
        "evictions are counted"
    );
    assert_eq!(
        check(&app, "idle").await["failures"],
        0,
        "the idle user was evicted"
    );
    let victim = check(&app, "victim").await;
    assert_eq!(victim["locked"], true, "{victim}");
    assert_eq!(victim["decision"], "deny", "{victim}");
}

/// U+FDFA is one character as given and 18 under NFKC: 15 of them pass the
/// 256-character limit on what is sent, not on what would be kept.
async fn names_too_long_once_normalised_are_refused_with_their_own_code(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    let grown = "\u{fdfa}".repeat(15);
    for answer in [
        app.login_attempt(json!({ "user": grown, "success": false }))
            .await,
        app.login_check(json!({ "user": grown })).await,
    ] {
        assert_eq!(answer.status, 400, "{}", answer.body);
        assert_eq!(answer.error(), "subject_too_long", "{}", answer.body);
        let message = answer.body["message"].as_str().unwrap();
        assert!(
            message.contains("256") && message.contains("normalised"),
            "{message}"
        );
    }
    let encoded: String =
        percent_encoding::utf8_percent_encode(&grown, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    let state = app
        .admin_get(&format!("/admin/api/subjects/user/{encoded}"))
        .await;
    assert_eq!(state.status, 400, "{}", state.body);
    assert_eq!(state.error(), "subject_too_long");

    // 14 of them make 252 characters: a name like any other.
    let fits = "\u{fdfa}".repeat(14);
    let answer = app
        .login_attempt(json!({ "user": fits, "success": false }))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // Too long as given stays what it was.
    let answer = app
        .login_attempt(json!({ "user": "a".repeat(257), "success": false }))
        .await;
    assert_eq!(answer.error(), "invalid_request");
}

/// With `store.hash_subject_ids`, no key name shows the phone, the user or
/// the address; the admin routes find the subjects all the same.
#[tokio::test]
async fn hashed_subject_ids_keep_phones_names_and_addresses_out_of_redis_keys() {
    let app = spawn_app(Backend::Redis, |s| {
        s.store.hash_subject_ids = true;
        s.login.lock_after = 2;
        s.login.captcha_after = 1000;
    })
    .await;
    let asker_ip = "203.0.113.5";
    let sent = app
        .sms_send(json!({ "phone": "+8613800138000", "ip": asker_ip }))
        .await;
    assert_eq!(sent.status, 200, "{}", sent.body);
    fail(&app, "Mallory.Victim", "203.0.113.77").await;
    // The pair (user, IP) locks, under the user's hash tag.
    assert_eq!(
        fail(&app, "Mallory.Victim", "203.0.113.77").await["locked"],
        true
    );

    let store = RedisStore::connect(&app.redis_url, Duration::from_secs(2))
        .await
        .unwrap();
    let keys = store.keys_with_prefix(&app.key_prefix).await.unwrap();
    assert!(keys.len() >= 5, "{keys:?}");
    for key in &keys {
        for clear in ["13800138000", "mallory", "203.0.113", "127.0.0.1"] {
            assert!(!key.contains(clear), "{key} shows {clear}");
        }
    }
    assert!(
        keys.iter().any(|k| k.contains(":{phone:")),
        "the kind stays readable: {keys:?}"
    );
    // The code keeps its asker (203.0.113.5) hashed as the key names are, and
    // a verify finds it so: a stranger's tries leave the asker's own.
    let otp = keys
        .iter()
        .find(|k| k.ends_with(":otp"))
        .unwrap_or_else(|| panic!("the code's key: {keys:?}"));
    let raw = fred::types::Builder::from_config(
        fred::types::config::Config::from_url(&app.redis_url).expect("a URL fred parses"),
    )
    .build()
    .expect("a Redis client");
    raw.init().await.expect("a Redis connection");
    let asker: String = raw.hget(otp, "n").await.expect("HGET");
    assert!(asker.len() == 32 && !asker.contains(asker_ip), "{asker}");
    let _ = raw.quit().await;
    let code = app.sms.last_code("+8613800138000");
    let wrong = if code == "000000" { "111111" } else { "000000" };
    for _ in 0..5 {
        app.sms_verify(json!({ "phone": "+8613800138000", "code": wrong, "ip": "203.0.113.9" }))
            .await;
    }
    let verified = app
        .sms_verify(json!({ "phone": "+8613800138000", "code": code, "ip": asker_ip }))
        .await;
    assert_eq!(verified.body, json!({ "valid": true }));

    let state = app
        .admin_get("/admin/api/subjects/phone/+8613800138000")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    let counted = state.body["windows"].as_array().unwrap();
    assert!(counted.iter().any(|w| w["count"] == 1), "{}", state.body);
    let state = app
        .admin_get("/admin/api/subjects/user/mallory.victim")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    let pair = &state.body["pairs"][0];
    assert_eq!(pair["ip"], "203.0.113.77", "{}", state.body);
    assert!(pair["locked_until"].is_string(), "{}", state.body);
    let unblocked = app
        .admin_post("/admin/api/subjects/user/mallory.victim/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    let after = fail(&app, "Mallory.Victim", "203.0.113.77").await;
    assert_eq!(
        (after["decision"].clone(), after["failures"].clone()),
        (json!("allow"), json!(1)),
        "{after}"
    );
}

/// `store.memory_limit` takes sizes with units and refuses, naming the key,
/// what is not one or is too small to work in.
#[test]
fn the_memory_limit_is_a_size_checked_at_start_up() {
    let config = |limit: &str| format!("[store]\nmemory_limit = {limit}\n");
    let loaded = crate::support::app::load_config(&config("\"64MiB\"")).unwrap();
    assert_eq!(loaded.store.memory_limit, 64 << 20);
    let loaded = crate::support::app::load_config(&config("2000000")).unwrap();
    assert_eq!(loaded.store.memory_limit, 2_000_000);
    let default = crate::support::app::load_config("").unwrap();
    assert_eq!(default.store.memory_limit, 128 << 20);
    assert!(!default.store.hash_subject_ids);

    let unit = crate::support::app::config_error(&config("\"12 parsecs\""));
    assert!(
        unit.contains("memory_limit") && unit.contains("MiB"),
        "{unit}"
    );
    let small = crate::support::app::config_error(&config("\"512KiB\""));
    assert!(
        small.contains("store.memory_limit") && small.contains("1MiB"),
        "{small}"
    );
    let secret = crate::support::app::config_error("[store]\nhash_secret = \"short\"\n");
    assert!(secret.contains("store.hash_secret"), "{secret}");
}
