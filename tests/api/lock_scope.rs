//! `login.lock_scope`: failures lock the (user, IP) pair they came from (the
//! default), the account locks at `login.account_lock_after`, or with
//! `"user"` failures from anywhere lock the account.

use serde_json::{json, Value};
use tollgate::audit::AuditDecision;
use tollgate::settings::{LockScope, Settings};

use crate::on_both_backends;
use crate::support::app::{spawn_app, spawn_app_timed, Backend, TestApp};

on_both_backends!(
    a_pair_is_locked_while_the_same_user_from_another_ip_is_not,
    failures_spread_over_ips_lock_the_account_at_account_lock_after,
    subject_state_names_the_pairs_and_unblock_clears_them,
    with_lock_scope_user_failures_from_anywhere_lock_the_account,
    a_login_with_an_unusable_ip_counts_under_the_proxys_pair,
);

async fn attempt(app: &TestApp, ip: Option<&str>, success: bool) -> Value {
    let mut body = json!({ "user": "alice", "success": success });
    if let Some(ip) = ip {
        body["ip"] = json!(ip);
    }
    let answer = app.login_attempt(body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

async fn check(app: &TestApp, ip: &str) -> Value {
    let answer = app.login_check(json!({ "user": "alice", "ip": ip })).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

fn scoped(s: &mut Settings) {
    s.login.captcha_after = 100;
    s.login.ip_captcha_after = 100;
    s.login.lock_after = 3;
}

const ATTACKER: &str = "203.0.113.66";
const OWNER: &str = "198.51.100.7";

async fn a_pair_is_locked_while_the_same_user_from_another_ip_is_not(backend: Backend) {
    let app = spawn_app(backend, scoped).await;
    for _ in 0..2 {
        assert_eq!(attempt(&app, Some(ATTACKER), false).await["locked"], false);
    }
    let locking = attempt(&app, Some(ATTACKER), false).await;
    assert_eq!(
        (
            &locking["decision"],
            &locking["locked"],
            &locking["retry_after_secs"]
        ),
        (&json!("allow"), &json!(true), &json!(900)),
        "the third failure locks the pair: {locking}"
    );

    // The attacker's address is refused, even with the right password.
    let refused = attempt(&app, Some(ATTACKER), true).await;
    assert_eq!(refused["decision"], "deny", "{refused}");
    assert_eq!(refused["reason"], "user_locked");
    assert_eq!(refused["locked"], true);
    assert_eq!(check(&app, ATTACKER).await["reason"], "user_locked");

    // The owner, from their own address, is not locked out.
    assert_eq!(check(&app, OWNER).await["decision"], "allow");
    let owner = attempt(&app, Some(OWNER), true).await;
    assert_eq!(owner["decision"], "allow", "{owner}");
    assert_eq!(owner["locked"], false);

    // The rows name the pair: the user, the IP, and the `user_ip` rule.
    let rows: Vec<_> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.decision != AuditDecision::Challenge)
        .map(|e| {
            (
                e.decision, e.reason, e.subject, e.ip, e.rule, e.observed, e.limit,
            )
        })
        .collect();
    let pair_row = |decision, reason: &str| {
        (
            decision,
            reason.to_string(),
            "alice".to_string(),
            Some(ATTACKER.to_string()),
            Some("user_ip 3/1h".to_string()),
            Some(3),
            Some(3),
        )
    };
    assert_eq!(
        rows,
        [
            pair_row(AuditDecision::Lock, "too_many_failures"),
            pair_row(AuditDecision::Deny, "user_locked"),
        ]
    );
}

async fn failures_spread_over_ips_lock_the_account_at_account_lock_after(backend: Backend) {
    let app = spawn_app_timed(backend, |s| {
        scoped(s);
        s.login.account_lock_after = 5;
    })
    .await;
    for i in 1..=4 {
        app.pass(std::time::Duration::from_millis(3)).await;
        let answer = attempt(&app, Some(&format!("192.0.2.{i}")), false).await;
        assert_eq!(answer["locked"], false, "failure {i}: {answer}");
    }
    app.pass(std::time::Duration::from_millis(3)).await;
    let locking = attempt(&app, Some("192.0.2.5"), false).await;
    assert_eq!(
        locking["locked"], true,
        "the fifth failure locks the account"
    );
    // Now every address is refused, the owner's too.
    let owner = attempt(&app, Some(OWNER), true).await;
    assert_eq!(
        (&owner["decision"], &owner["reason"]),
        (&json!("deny"), &json!("user_locked"))
    );
    assert_eq!(check(&app, OWNER).await["reason"], "user_locked");
    let lock = app
        .audit_events()
        .into_iter()
        .find(|e| e.decision == AuditDecision::Lock)
        .expect("a lock row");
    assert_eq!(lock.rule.as_deref(), Some("user 5/1h"));
    assert_eq!(lock.subject, "alice");

    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    assert!(state.body["locked_until"].is_string(), "{}", state.body);
    let counts: Vec<_> = state.body["pairs"]
        .as_array()
        .expect("five pairs")
        .iter()
        .map(|p| (p["ip"].as_str().unwrap().to_string(), p["count"].clone()))
        .collect();
    assert_eq!(counts.len(), 5, "{}", state.body);
    assert_eq!(
        counts[0],
        ("192.0.2.5".to_string(), json!(1)),
        "newest first"
    );
}

async fn subject_state_names_the_pairs_and_unblock_clears_them(backend: Backend) {
    let app = spawn_app_timed(backend, scoped).await;
    for ip in [ATTACKER, ATTACKER, ATTACKER, OWNER] {
        // Apart in time, so that "newest first" has one answer.
        app.pass(std::time::Duration::from_millis(3)).await;
        attempt(&app, Some(ip), false).await;
    }
    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    assert_eq!(state.status, 200, "{}", state.body);
    assert_eq!(
        state.body["locked_until"],
        Value::Null,
        "the account is not locked"
    );
    let pairs = state.body["pairs"].as_array().expect("pairs").clone();
    assert_eq!(pairs.len(), 2, "{}", state.body);
    assert_eq!(pairs[0]["ip"], OWNER);
    assert_eq!(pairs[0]["count"], 1);
    assert_eq!(pairs[0]["locked_until"], Value::Null);
    assert_eq!(pairs[1]["ip"], ATTACKER);
    assert_eq!(
        (&pairs[1]["rule"], &pairs[1]["count"], &pairs[1]["limit"]),
        (&json!("user_ip 3/1h"), &json!(3), &json!(3))
    );
    assert!(pairs[1]["locked_until"].is_string(), "{}", state.body);
    assert_eq!(state.body["windows"][1]["rule"], "user 100/1h");
    assert_eq!(state.body["windows"][1]["count"], 4);

    let unblocked = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(unblocked.body.get("pairs"), None, "{}", unblocked.body);
    // The pair's failures went with its lock: it takes three more to lock.
    for _ in 0..2 {
        assert_eq!(attempt(&app, Some(ATTACKER), false).await["locked"], false);
    }
    assert_eq!(attempt(&app, Some(ATTACKER), false).await["locked"], true);
}

/// An unblock leaves the user's index of locked pairs in Redis: a pair that
/// locks while the unblock runs (after it read the index, before it
/// deleted) is added to it, and so stays shown and liftable by a second
/// unblock; deleting the index hid that lock until it ended. Entries of
/// lifted locks show nothing.
#[tokio::test]
async fn an_unblock_keeps_the_index_of_locked_pairs() {
    let app = spawn_app(Backend::Redis, scoped).await;
    for _ in 0..3 {
        attempt(&app, Some(ATTACKER), false).await;
    }
    let index = || async {
        let store = tollgate::store::redis::RedisStore::connect(
            &app.redis_url,
            std::time::Duration::from_secs(2),
        )
        .await
        .unwrap();
        store
            .keys_with_prefix(&app.key_prefix)
            .await
            .unwrap()
            .into_iter()
            .filter(|k| k.ends_with("login_pairs"))
            .count()
    };
    assert_eq!(index().await, 1, "the pair locked and was indexed");
    let unblocked = app
        .admin_post("/admin/api/subjects/user/alice/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(index().await, 1, "the index stays");
    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    assert_eq!(state.body.get("pairs"), None, "{}", state.body);
    assert_eq!(attempt(&app, Some(ATTACKER), false).await["locked"], false);
}

async fn with_lock_scope_user_failures_from_anywhere_lock_the_account(backend: Backend) {
    let app = spawn_app(backend, |s| {
        scoped(s);
        s.login.lock_scope = LockScope::User;
    })
    .await;
    for i in 1..=2 {
        attempt(&app, Some(&format!("192.0.2.{i}")), false).await;
    }
    assert_eq!(
        attempt(&app, Some("192.0.2.3"), false).await["locked"],
        true
    );
    let owner = attempt(&app, Some(OWNER), true).await;
    assert_eq!(owner["reason"], "user_locked", "{owner}");
    let lock = app
        .audit_events()
        .into_iter()
        .find(|e| e.decision == AuditDecision::Lock)
        .expect("a lock row");
    assert_eq!(lock.rule.as_deref(), Some("user 3/1h"));
    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    assert!(state.body["locked_until"].is_string(), "{}", state.body);
    assert_eq!(
        state.body.get("pairs"),
        None,
        "no pairs are kept: {}",
        state.body
    );
}

/// The client's address is unusable (a trusted proxy forwarded garbage):
/// such attempts count under the proxy's address, one pair, so hiding the
/// address buys an attacker nothing and costs the owner nothing.
async fn a_login_with_an_unusable_ip_counts_under_the_proxys_pair(backend: Backend) {
    let app = spawn_app(backend, |s| {
        scoped(s);
        s.server.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let hidden = |success: bool| {
        let request = app
            .client
            .post(format!("{}/login/attempt", app.address))
            .bearer_auth(app.api_key.as_deref().unwrap_or_default())
            .header("x-forwarded-for", "garbage")
            .json(&json!({ "user": "alice", "success": success }));
        app.send_raw(request)
    };
    for _ in 0..3 {
        assert_eq!(hidden(false).await.status, 200);
    }
    let refused = hidden(true).await;
    assert_eq!(refused.body["reason"], "user_locked", "{}", refused.body);
    assert_eq!(attempt(&app, Some(OWNER), true).await["decision"], "allow");
    let state = app.admin_get("/admin/api/subjects/user/alice").await;
    assert_eq!(state.body["pairs"][0]["ip"], "127.0.0.1", "{}", state.body);
}

#[test]
fn the_lock_scope_reads_from_the_file_and_bad_values_are_refused() {
    let load = crate::support::app::load_config;
    let defaults = load("").unwrap();
    assert_eq!(defaults.login.lock_scope, LockScope::UserIp);
    assert_eq!(defaults.login.account_lock_after, 100);
    let user = load("[login]\nlock_scope = \"user\"\n").unwrap();
    assert_eq!(user.login.lock_scope, LockScope::User);
    let printed = user.to_redacted_toml();
    assert!(printed.contains("lock_scope = \"user\""), "{printed}");
    assert!(printed.contains("account_lock_after = 100"), "{printed}");

    let error = |toml: &str| load(toml).err().map(|e| e.to_string()).unwrap_or_default();
    let below = error("[login]\nlock_after = 10\naccount_lock_after = 5\n");
    assert!(below.contains("login.account_lock_after"), "{below}");
    // With lock_scope = "user" the account threshold is not used.
    assert!(load("[login]\nlock_scope = \"user\"\naccount_lock_after = 5\n").is_ok());
    // Each attempt on a user reads as many of its failures as these keep.
    let huge = error("[login]\naccount_lock_after = 1001\n");
    assert!(huge.contains("login.account_lock_after"), "{huge}");
    let huge = error("[login]\ncaptcha_after = 1001\n");
    assert!(huge.contains("login.captcha_after"), "{huge}");
    let huge = error("[login]\nlock_scope = \"user\"\nlock_after = 5000\n");
    assert!(huge.contains("login.lock_after"), "{huge}");
    assert!(load("[login]\ncaptcha_after = 1000\naccount_lock_after = 1000\n").is_ok());
    let unknown = error("[login]\nlock_scope = \"ip\"\n");
    assert!(unknown.contains("login.lock_scope"), "{unknown}");
}
