use std::time::Duration;

use serde_json::{json, Value};
use tollgate::audit::AuditDecision;
use tollgate::domain::SubjectKind;
use tollgate::store::ManualClock;

use crate::on_both_backends;
use crate::support::app::{spawn_app, spawn_app_timed, spawn_app_with_clock, Backend, TestApp};

on_both_backends!(
    failures_turn_on_a_captcha_then_a_lock,
    simultaneous_failures_record_exactly_lock_after_and_lock_once,
    a_lock_after_a_lock_doubles_up_to_the_maximum,
    success_clears_the_failures_when_reset_on_success,
    failures_stay_after_success_when_reset_on_success_is_off,
    a_correct_password_is_still_denied_while_locked,
    check_counts_nothing,
    one_ip_failing_across_users_gets_a_captcha_then_a_block,
    simultaneous_failures_from_one_ip_record_exactly_ip_block_after,
    a_failure_refused_for_its_user_is_not_counted_against_its_ip,
    failures_refused_at_once_for_their_user_never_block_their_ip,
    names_that_look_alike_share_one_counter,
    ipv6_addresses_of_one_64_share_a_counter,
    translated_ipv4_clients_count_apart,
    the_64s_of_one_network_share_a_captcha_tier,
    a_refused_failure_past_a_full_tier_leaves_the_tier_full,
    a_failure_with_a_captcha_keeps_a_full_tier_full_longer,
    a_network_tier_in_shadow_refuses_nothing_and_audits_what_it_would,
    simultaneous_failures_from_one_network_fill_its_tier_exactly,
    a_refused_failure_is_taken_back_from_its_network,
    shadow_mode_answers_allow_and_audits_would_be_refusals,
    a_backend_that_names_no_client_is_not_one_address_every_failure_fills,
    a_backend_that_passes_its_own_loopback_address_names_no_client,
);

/// The `login_attempt` window of the subject state at `path`.
async fn login_window(app: &TestApp, path: &str) -> Value {
    let state = app.admin_get(path).await;
    assert_eq!(state.status, 200, "{}", state.body);
    let windows = state.body["windows"].as_array().unwrap();
    let login = windows.iter().find(|w| w["action"] == "login_attempt");
    login
        .cloned()
        .unwrap_or_else(|| panic!("no login window: {}", state.body))
}

async fn fail(app: &TestApp, user: &str, extra: Value) -> Value {
    let mut body = json!({ "user": user, "success": false });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let answer = app.login_attempt(body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

fn state(
    decision: &str,
    captcha: bool,
    locked: bool,
    retry: Option<u64>,
    failures: u32,
    reason: Option<&str>,
) -> Value {
    json!({
        "decision": decision,
        "captcha_required": captcha,
        "locked": locked,
        "retry_after_secs": retry,
        "failures": failures,
        "reason": reason,
    })
}

async fn failures_turn_on_a_captcha_then_a_lock(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 2;
        s.login.lock_after = 4;
        s.login.lock_duration = Duration::from_secs(3600);
        s.login.lock_max_duration = Duration::from_secs(7200);
    })
    .await;
    let passed = json!({ "captcha_passed": true });

    assert_eq!(
        fail(&app, "Alice", json!({})).await,
        state("allow", false, false, None, 1, None)
    );
    assert_eq!(
        fail(&app, "alice", json!({})).await,
        state("allow", true, false, None, 2, None)
    );
    assert_eq!(
        fail(&app, "ALICE", json!({})).await,
        state("challenge", true, false, None, 2, Some("captcha_required")),
        "without a captcha the attempt is refused and not counted"
    );
    assert_eq!(
        fail(&app, "alice", passed.clone()).await,
        state("allow", true, false, None, 3, None)
    );
    assert_eq!(
        fail(&app, "alice", passed.clone()).await,
        state("allow", true, true, Some(3600), 4, None)
    );

    let denied = fail(&app, "alice", passed.clone()).await;
    assert_eq!(denied["decision"], "deny");
    assert_eq!(denied["reason"], "user_locked");
    assert_eq!(denied["locked"], true);
    assert_eq!(
        denied["captcha_required"], true,
        "the failures still demand a captcha"
    );
    assert_eq!(denied["failures"], 4, "denied attempts are not counted");
    let retry = denied["retry_after_secs"].as_u64().unwrap();
    assert!((3599..=3600).contains(&retry), "{retry}");

    let check = app.login_check(json!({ "user": "alice" })).await;
    assert_eq!(check.body["decision"], "deny");
    assert_eq!(check.body["reason"], "user_locked");

    let events = app.audit_events();
    let summary: Vec<(AuditDecision, &str)> = events
        .iter()
        .map(|e| (e.decision, e.reason.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (AuditDecision::Challenge, "captcha_required"),
            (AuditDecision::Challenge, "captcha_required"),
            (AuditDecision::Lock, "too_many_failures"),
            (AuditDecision::Deny, "user_locked"),
        ]
    );
    assert!(events
        .iter()
        .all(|e| e.subject_kind == SubjectKind::User && e.subject == "alice"));
    assert_eq!(events[0].rule.as_deref(), Some("user 2/15m"));
    assert_eq!(events[2].rule.as_deref(), Some("user_ip 4/1h"));
    assert_eq!(events[2].retry_after_ms, Some(3_600_000));
}

async fn simultaneous_failures_record_exactly_lock_after_and_lock_once(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 10;
    })
    .await;

    let attempts = (0..50).map(|_| app.login_attempt(json!({ "user": "bob", "success": false })));
    let answers = futures::future::join_all(attempts).await;

    let decisions = |d: &str| answers.iter().filter(|a| a.body["decision"] == d).count();
    assert_eq!((decisions("allow"), decisions("deny")), (10, 40));
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.body["locked"] == true && a.body["decision"] == "allow")
            .count(),
        1
    );
    let locks = app
        .audit_events()
        .iter()
        .filter(|e| e.decision == AuditDecision::Lock)
        .count();
    assert_eq!(locks, 1);
    let check = app.login_check(json!({ "user": "bob" })).await;
    assert_eq!(check.body["failures"], 10);
}

async fn a_lock_after_a_lock_doubles_up_to_the_maximum(backend: Backend) {
    // Real time on Redis (one-second locks), the manual clock in process.
    let app = spawn_app_timed(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 2;
        s.login.lock_duration = Duration::from_millis(1000);
        s.login.lock_max_duration = Duration::from_millis(2000);
    })
    .await;

    fail(&app, "carol", json!({})).await;
    assert_eq!(fail(&app, "carol", json!({})).await["retry_after_secs"], 1);
    app.pass(Duration::from_millis(1_100)).await;
    let second = fail(&app, "carol", json!({})).await;
    assert_eq!(
        (second["locked"].clone(), second["retry_after_secs"].clone()),
        (json!(true), json!(2))
    );
    app.pass(Duration::from_millis(2_100)).await;
    let third = fail(&app, "carol", json!({})).await;
    assert_eq!(third["retry_after_secs"], 2, "capped at lock_max_duration");
}

async fn success_clears_the_failures_when_reset_on_success(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    fail(&app, "dave", json!({})).await;
    fail(&app, "dave", json!({})).await;
    let ok = app
        .login_attempt(json!({ "user": "dave", "success": true }))
        .await;
    assert_eq!(ok.body, state("allow", false, false, None, 0, None));
    assert_eq!(
        app.login_check(json!({ "user": "dave" })).await.body["failures"],
        0
    );
}

async fn failures_stay_after_success_when_reset_on_success_is_off(backend: Backend) {
    let app = spawn_app(backend, |s| s.login.reset_on_success = false).await;
    fail(&app, "erin", json!({})).await;
    fail(&app, "erin", json!({})).await;
    let ok = app
        .login_attempt(json!({ "user": "erin", "success": true }))
        .await;
    assert_eq!(ok.body["failures"], 2);
}

async fn a_correct_password_is_still_denied_while_locked(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1;
    })
    .await;
    assert_eq!(fail(&app, "frank", json!({})).await["locked"], true);
    let ok = app
        .login_attempt(json!({ "user": "frank", "success": true }))
        .await;
    assert_eq!(ok.body["decision"], "deny");
    assert_eq!(ok.body["reason"], "user_locked");
    assert_eq!(
        ok.body["failures"], 1,
        "the lock did not clear the failures"
    );
}

async fn check_counts_nothing(backend: Backend) {
    let app = spawn_app(backend, |_| {}).await;
    for _ in 0..5 {
        let check = app
            .login_check(json!({ "user": "grace", "ip": "203.0.113.5" }))
            .await;
        assert_eq!(check.status, 200);
        assert_eq!(check.body, state("allow", false, false, None, 0, None));
    }
    assert_eq!(fail(&app, "grace", json!({})).await["failures"], 1);
    assert!(
        app.audit_events().is_empty(),
        "check answers are not audited"
    );
}

async fn one_ip_failing_across_users_gets_a_captcha_then_a_block(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 2;
        s.login.ip_block_after = 4;
    })
    .await;
    let ip = json!({ "ip": "203.0.113.50" });
    let ip_passed = json!({ "ip": "203.0.113.50", "captcha_passed": true });

    assert_eq!(
        fail(&app, "u1", ip.clone()).await["captcha_required"],
        false
    );
    assert_eq!(fail(&app, "u2", ip.clone()).await["captcha_required"], true);
    let challenged = fail(&app, "u3", ip.clone()).await;
    assert_eq!(challenged["decision"], "challenge");
    assert_eq!(challenged["failures"], 0);
    assert_eq!(
        fail(&app, "u3", ip_passed.clone()).await["decision"],
        "allow"
    );
    assert_eq!(
        fail(&app, "u4", ip_passed.clone()).await["decision"],
        "allow"
    );

    let blocked = fail(&app, "u5", ip_passed.clone()).await;
    assert_eq!(blocked["decision"], "deny");
    assert_eq!(blocked["reason"], "ip_blocked");
    let retry = blocked["retry_after_secs"].as_u64().unwrap();
    assert!((3599..=3600).contains(&retry), "{retry}");
    let check = app
        .login_check(json!({ "user": "u5", "ip": "203.0.113.50" }))
        .await;
    assert_eq!(check.body["reason"], "ip_blocked");

    let elsewhere = fail(&app, "u5", json!({ "ip": "198.51.100.1" })).await;
    assert_eq!(elsewhere["decision"], "allow");

    let ip_rows: Vec<(AuditDecision, String)> = app
        .audit_events()
        .iter()
        .filter(|e| e.subject_kind == SubjectKind::Ip)
        .map(|e| (e.decision, e.rule.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        ip_rows,
        vec![
            (AuditDecision::Challenge, "ip 2/1h".to_string()),
            (AuditDecision::Challenge, "ip 2/1h".to_string()),
            (AuditDecision::Lock, "ip 4/1h".to_string()),
            (AuditDecision::Deny, "ip 4/1h".to_string()),
        ]
    );
}

async fn simultaneous_failures_from_one_ip_record_exactly_ip_block_after(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 5;
        s.login.ip_block_after = 5;
    })
    .await;
    assert_ip_block_is_exact(&app).await;
}

/// Sixty failures at once, of users `user0` to `user59`, each with
/// `extra(i)` in its body; how many answers had each (decision, reason), in
/// the order `expected` names them, must be `expected`'s counts.
async fn sixty_failures_at_once(
    app: &TestApp,
    extra: impl Fn(usize) -> Value,
    expected: [(&str, Value, usize); 2],
) {
    let attempts = (0..60).map(|i| {
        let mut body = json!({ "user": format!("user{i}"), "success": false });
        body.as_object_mut()
            .unwrap()
            .extend(extra(i).as_object().unwrap().clone());
        app.login_attempt(body)
    });
    let answers = futures::future::join_all(attempts).await;
    let count = |decision: &str, reason: &Value| {
        answers
            .iter()
            .filter(|a| a.body["decision"] == decision && a.body["reason"] == *reason)
            .count()
    };
    let counted = expected
        .iter()
        .map(|(decision, reason, _)| count(decision, reason));
    assert_eq!(
        counted.collect::<Vec<_>>(),
        expected.iter().map(|e| e.2).collect::<Vec<_>>(),
        "{:?}",
        answers.iter().map(|a| &a.body).collect::<Vec<_>>()
    );
    app.flush_audit().await;
}

/// Sixty failures for sixty users from one IP at once, with a passed captcha:
/// exactly `ip_block_after` (5) are recorded, one of them the block.
pub async fn assert_ip_block_is_exact(app: &TestApp) {
    let from = |_| json!({ "ip": "203.0.113.77", "captcha_passed": true });
    let expected = [("allow", Value::Null, 5), ("deny", json!("ip_blocked"), 55)];
    sixty_failures_at_once(app, from, expected).await;
    let blocks = app
        .audit_events()
        .iter()
        .filter(|e| e.decision == AuditDecision::Lock && e.subject_kind == SubjectKind::Ip)
        .count();
    assert_eq!(blocks, 1, "the IP is blocked once");
}

/// A hundred failures at once of a locked user from an address one
/// failure short of its block: each is refused for the user, and none for
/// the address (a failure another refused attempt held there for a
/// moment), so the address stays unblocked for everyone else behind it.
async fn failures_refused_at_once_for_their_user_never_block_their_ip(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 1;
        s.login.ip_captcha_after = 3;
        s.login.ip_block_after = 3;
    })
    .await;
    let from = json!({ "ip": "203.0.113.79", "captcha_passed": true });
    assert_eq!(fail(&app, "carol", from.clone()).await["locked"], true);
    assert_eq!(fail(&app, "dave", from.clone()).await["decision"], "allow");
    for round in 0..15 {
        let attempts = (0..100).map(|_| fail(&app, "carol", from.clone()));
        let answers = futures::future::join_all(attempts).await;
        let reasons: Vec<_> = answers.iter().map(|a| a["reason"].clone()).collect();
        assert!(
            reasons.iter().all(|r| r == "user_locked"),
            "round {round}: {reasons:?}"
        );
    }
    let erin = app
        .login_check(json!({ "user": "erin", "ip": "203.0.113.79" }))
        .await;
    assert_eq!(erin.body["decision"], "allow", "{}", erin.body);
}

async fn a_failure_refused_for_its_user_is_not_counted_against_its_ip(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 100;
        s.login.ip_block_after = 100;
    })
    .await;
    let ip = json!({ "ip": "203.0.113.78" });
    assert_eq!(fail(&app, "carol", ip.clone()).await["decision"], "allow");
    // Carol's own captcha tier refuses these: neither carol nor the IP counts them.
    for _ in 0..3 {
        assert_eq!(
            fail(&app, "carol", ip.clone()).await["decision"],
            "challenge"
        );
    }
    assert_eq!(fail(&app, "dave", ip.clone()).await["decision"], "allow");
    let login = login_window(&app, "/admin/api/subjects/ip/203.0.113.78").await;
    assert_eq!(login["count"], 2, "{login}");
}

async fn names_that_look_alike_share_one_counter(backend: Backend) {
    let app = spawn_app(backend, |s| s.login.captcha_after = 1000).await;
    for name in [
        "alice\u{200b}",
        "al\u{ad}ice",
        "\u{feff}ALICE",
        "Ａｌｉｃｅ",
    ] {
        fail(&app, name, json!({})).await;
    }
    let check = app.login_check(json!({ "user": "alice" })).await;
    assert_eq!(check.body["failures"], 4, "{}", check.body);
}

async fn ipv6_addresses_of_one_64_share_a_counter(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.ip_block_after = 2;
    })
    .await;
    fail(&app, "v1", json!({ "ip": "2001:db8:1:2::1" })).await;
    fail(&app, "v2", json!({ "ip": "2001:db8:1:2:ffff::9" })).await;
    let blocked = fail(&app, "v3", json!({ "ip": "2001:db8:1:2::77" })).await;
    assert_eq!(blocked["reason"], "ip_blocked");
    let other_64 = fail(&app, "v3", json!({ "ip": "2001:db8:1:3::1" })).await;
    assert_eq!(other_64["decision"], "allow");
    let deny = app
        .audit_events()
        .into_iter()
        .find(|e| e.decision == AuditDecision::Deny)
        .unwrap();
    assert_eq!(deny.subject, "2001:db8:1:2::/64");
}

/// Behind a NAT64 or SIIT translator every IPv4 client is an address of
/// 64:ff9b::/96, one /64: counted per /64, two failures from one of them
/// blocked them all.
async fn translated_ipv4_clients_count_apart(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.ip_block_after = 2;
    })
    .await;
    fail(&app, "v1", json!({ "ip": "64:ff9b::203.0.113.7" })).await;
    fail(&app, "v2", json!({ "ip": "64:ff9b::203.0.113.7" })).await;
    let blocked = fail(&app, "v3", json!({ "ip": "64:ff9b::cb00:7107" })).await;
    assert_eq!(blocked["reason"], "ip_blocked");
    let neighbour = fail(&app, "v3", json!({ "ip": "64:ff9b::203.0.113.8" })).await;
    assert_eq!(neighbour["decision"], "allow");
    // The address it carries is the subject: the same client over IPv4.
    let direct = fail(&app, "v4", json!({ "ip": "203.0.113.7" })).await;
    assert_eq!(direct["reason"], "ip_blocked");
    let deny = app
        .audit_events()
        .into_iter()
        .find(|e| e.decision == AuditDecision::Deny)
        .unwrap();
    assert_eq!(deny.subject, "203.0.113.7");
    assert_eq!(deny.ip.as_deref(), Some("203.0.113.7"));
}

/// An IPv6 client also counts in its network (`sms.network_bits`, a /48):
/// failures from many /64s of one network, each far below the IP's tiers,
/// fill the network's captcha tier (`login.network_captcha_after`); then
/// every /64 of it needs a captcha, other networks and IPv4 clients do not.
/// The admin sees the window and lifts it; 0 turns the tier off.
async fn the_64s_of_one_network_share_a_captcha_tier(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.network_captcha_after = 3;
    })
    .await;
    let from = |n: u32| json!({ "ip": format!("2001:db8:1:{n:x}::1") });
    for n in 1..=2 {
        assert_eq!(
            fail(&app, &format!("u{n}"), from(n)).await["captcha_required"],
            false
        );
    }
    // The third fills the tier: allowed, and the answer says what comes.
    let filling = fail(&app, "u3", from(3)).await;
    assert_eq!(
        (&filling["decision"], &filling["captcha_required"]),
        (&json!("allow"), &json!(true))
    );
    let challenged = fail(&app, "u4", from(4)).await;
    assert_eq!(challenged["decision"], "challenge", "{challenged}");
    let check = app
        .login_check(json!({ "user": "u5", "ip": "2001:db8:1:ffff::5" }))
        .await;
    assert_eq!(check.body["decision"], "challenge", "{}", check.body);
    let passed = json!({ "ip": "2001:db8:1:4::1", "captcha_passed": true });
    assert_eq!(fail(&app, "u4", passed).await["decision"], "allow");
    for elsewhere in ["2001:db8:2::1", "203.0.113.9"] {
        let answer = fail(&app, "u6", json!({ "ip": elsewhere })).await;
        assert_eq!(answer["decision"], "allow", "{elsewhere}: {answer}");
    }
    // Translated IPv4 clients share a /96 and have no network: more than
    // the tier's worth of them is never challenged.
    for n in 1..=5 {
        let translated = json!({ "ip": format!("64:ff9b::203.0.113.{n}") });
        let answer = fail(&app, &format!("t{n}"), translated).await;
        assert_eq!(answer["captcha_required"], false, "{answer}");
    }

    let rows: Vec<(AuditDecision, String, String)> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.subject_kind == SubjectKind::Network)
        .map(|e| (e.decision, e.subject, e.rule.unwrap_or_default()))
        .collect();
    let row = |decision| {
        (
            decision,
            "2001:db8:1::/48".to_string(),
            "network 3/1h".to_string(),
        )
    };
    assert_eq!(
        rows,
        [row(AuditDecision::Challenge), row(AuditDecision::Challenge)]
    );

    // Its window keeps the tier's newest three failures.
    let state = app
        .admin_get("/admin/api/subjects/network/2001:db8:1::%2F48")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    assert_eq!(state.body["captcha_required"], true, "{}", state.body);
    let login = login_window(&app, "/admin/api/subjects/network/2001:db8:1::%2F48").await;
    assert_eq!(
        login,
        json!({ "action": "login_attempt", "rule": "network 3/1h", "count": 3, "limit": 3,
                "window_ms": 3_600_000 })
    );
    let unblocked = app
        .admin_post("/admin/api/subjects/network/2001:db8:1::%2F48/unblock")
        .await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    assert_eq!(fail(&app, "u7", from(7)).await["decision"], "allow");

    let off = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.network_captcha_after = 0;
    })
    .await;
    for n in 1..=4 {
        let answer = fail(&off, &format!("u{n}"), from(n)).await;
        assert_eq!(answer["captcha_required"], false, "{answer}");
    }
    let state = off
        .admin_get("/admin/api/subjects/network/2001:db8:1::%2F48")
        .await;
    assert_eq!(state.status, 200, "{}", state.body);
    let counted = state.body["windows"].as_array().unwrap();
    assert!(
        counted.iter().all(|w| w["action"] != "login_attempt"),
        "no login window with the tier off: {}",
        state.body
    );
}

async fn simultaneous_failures_from_one_network_fill_its_tier_exactly(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.network_captcha_after = 5;
    })
    .await;
    assert_network_tier_is_exact(&app).await;
}

/// Sixty failures at once from sixty /64s of one /48, for sixty users:
/// exactly `network_captcha_after` (5) are recorded, the rest challenged,
/// and the tier's crossing is audited once.
pub async fn assert_network_tier_is_exact(app: &TestApp) {
    let from = |i| json!({ "ip": format!("2001:db8:5:{i:x}::1") });
    let expected = [
        ("allow", Value::Null, 5),
        ("challenge", json!("captcha_required"), 55),
    ];
    sixty_failures_at_once(app, from, expected).await;
    let rows: Vec<AuditDecision> = app
        .audit_events()
        .iter()
        .filter(|e| e.subject_kind == SubjectKind::Network)
        .map(|e| e.decision)
        .collect();
    assert_eq!(rows.len(), 56, "one crossing and 55 challenges: {rows:?}");
    assert!(
        rows.iter().all(|d| *d == AuditDecision::Challenge),
        "{rows:?}"
    );
}

/// A failure with a captcha past the network's full tier, refused by its
/// user's lock, takes nothing out of the window: the window keeps only the
/// tier's newest failures, so it is added only once an attempt is
/// recorded, and the next failure without a captcha is still challenged.
async fn a_refused_failure_past_a_full_tier_leaves_the_tier_full(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1;
        s.login.lock_scope = tollgate::settings::LockScope::User;
        s.login.ip_captcha_after = 1000;
        s.login.network_captcha_after = 2;
    })
    .await;
    // Locked from an IPv4 address, which counts in no network.
    fail(&app, "mallory", json!({ "ip": "203.0.113.60" })).await;
    for n in 1..=2 {
        let answer = fail(
            &app,
            &format!("u{n}"),
            json!({ "ip": format!("2001:db8:9:{n}::1") }),
        )
        .await;
        assert_eq!(answer["decision"], "allow", "{answer}");
    }
    for _ in 0..3 {
        let refused = fail(
            &app,
            "mallory",
            json!({ "ip": "2001:db8:9:3::1", "captcha_passed": true }),
        )
        .await;
        assert_eq!(refused["reason"], "user_locked", "{refused}");
    }
    let next = fail(&app, "u4", json!({ "ip": "2001:db8:9:4::1" })).await;
    assert_eq!(next["decision"], "challenge", "{next}");
    // One with a captcha that is recorded still counts, as the newest.
    let passed = json!({ "ip": "2001:db8:9:4::1", "captcha_passed": true });
    assert_eq!(fail(&app, "u4", passed).await["decision"], "allow");
    let login = login_window(&app, "/admin/api/subjects/network/2001:db8:9::%2F48").await;
    assert_eq!(login["count"], 2, "{login}");
}

/// A recorded failure with a passed captcha past a full tier counts as the
/// newest: once the failures that filled the tier leave the window, it is
/// still there. (On the in-process store and a cluster it is added after the
/// attempt is recorded, not with the first call.)
async fn a_failure_with_a_captcha_keeps_a_full_tier_full_longer(backend: Backend) {
    let app = spawn_app_timed(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.ip_window = Duration::from_secs(2);
        s.login.network_captcha_after = 2;
    })
    .await;
    let from = |n: u32| json!({ "ip": format!("2001:db8:a:{n}::1") });
    for n in 1..=2 {
        fail(&app, &format!("u{n}"), from(n)).await;
    }
    app.pass(Duration::from_millis(1_000)).await;
    let passed = json!({ "ip": "2001:db8:a:3::1", "captcha_passed": true });
    assert_eq!(fail(&app, "u3", passed).await["decision"], "allow");
    // The first two have left the window; the third is still in it.
    app.pass(Duration::from_millis(1_200)).await;
    let path = "/admin/api/subjects/network/2001:db8:a::%2F48";
    let login = login_window(&app, path).await;
    assert_eq!(login["count"], 1, "{login}");
}

/// `login.shadow`: a full network tier challenges nobody; the failure that
/// fills it and each attempt it would have challenged are audited with
/// `shadow = true`, and every failure counts.
async fn a_network_tier_in_shadow_refuses_nothing_and_audits_what_it_would(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.shadow = true;
        s.login.captcha_after = 1000;
        s.login.ip_captcha_after = 1000;
        s.login.network_captcha_after = 2;
    })
    .await;
    for n in 1..=4 {
        let ip = json!({ "ip": format!("2001:db8:6:{n}::1") });
        let answer = fail(&app, &format!("u{n}"), ip).await;
        assert_eq!(answer["decision"], "allow", "{answer}");
    }
    let rows: Vec<(AuditDecision, bool, Option<i64>)> = app
        .audit_events()
        .into_iter()
        .filter(|e| e.subject_kind == SubjectKind::Network)
        .map(|e| (e.decision, e.shadow, e.observed))
        .collect();
    // The second fills the tier (2 after it); the third and fourth would
    // have been challenged, the window full (2 kept).
    let row = |observed| (AuditDecision::Challenge, true, Some(observed));
    assert_eq!(rows, [row(2), row(2), row(2)]);
}

/// A failure the user's side refuses (a locked user) or the IP's block
/// refuses counts against nothing, the network included.
async fn a_refused_failure_is_taken_back_from_its_network(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 1;
        s.login.lock_scope = tollgate::settings::LockScope::User;
        s.login.ip_captcha_after = 1000;
        s.login.ip_block_after = 1;
        s.login.network_captcha_after = 2;
    })
    .await;
    // One failure each: the user locks, and the IP is blocked.
    assert_eq!(
        fail(&app, "mallory", json!({ "ip": "2001:db8:7:1::1" })).await["decision"],
        "allow"
    );
    let locked = fail(&app, "mallory", json!({ "ip": "2001:db8:7:2::1" })).await;
    assert_eq!(locked["reason"], "user_locked", "{locked}");
    let blocked = fail(&app, "trent", json!({ "ip": "2001:db8:7:1::2" })).await;
    assert_eq!(blocked["reason"], "ip_blocked", "{blocked}");
    // Only the first failure counts: the network is below its tier of 2.
    let login = login_window(&app, "/admin/api/subjects/network/2001:db8:7::%2F48").await;
    assert_eq!(login["count"], 1, "{login}");
    let next = fail(&app, "walter", json!({ "ip": "2001:db8:7:3::1" })).await;
    assert_eq!(next["decision"], "allow", "{next}");
}

async fn shadow_mode_answers_allow_and_audits_would_be_refusals(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.shadow.enabled = true;
        s.login.captcha_after = 1;
        s.login.lock_after = 2;
        s.login.lock_scope = tollgate::settings::LockScope::User;
    })
    .await;
    for failures in 1..=4 {
        assert_eq!(
            fail(&app, "heidi", json!({})).await,
            state("allow", false, false, None, failures.min(2), None),
            "failures are kept up to max(captcha_after, lock_after)"
        );
    }
    let check = app.login_check(json!({ "user": "heidi" })).await;
    assert_eq!(check.body["decision"], "allow");

    let events = app.audit_events();
    assert!(events.iter().all(|e| e.shadow), "{events:?}");
    let decisions: Vec<AuditDecision> = events.iter().map(|e| e.decision).collect();
    assert_eq!(
        decisions,
        vec![
            AuditDecision::Challenge, // 1st failure crosses captcha_after
            AuditDecision::Challenge, // 2nd: would be challenged
            AuditDecision::Lock,      // 2nd: would lock
            AuditDecision::Deny,      // 3rd: would be denied (locked)
            AuditDecision::Deny,      // 4th: would be denied (locked)
        ]
    );
}

#[tokio::test]
async fn lock_escalation_is_exact_and_resets_after_a_day_without_locks() {
    let clock = ManualClock::new(1_700_000_000_000);
    let app = spawn_app_with_clock(Backend::Memory, Some(clock.clone()), |s| {
        s.login.captcha_after = 1000;
        s.login.lock_after = 2;
        s.login.lock_window = Duration::from_secs(3600);
        s.login.lock_duration = Duration::from_secs(60);
        s.login.lock_max_duration = Duration::from_secs(180);
    })
    .await;
    let lock_secs = |body: Value| {
        assert_eq!(body["locked"], true, "{body}");
        body["retry_after_secs"].as_u64().unwrap()
    };

    fail(&app, "ivan", json!({})).await;
    assert_eq!(lock_secs(fail(&app, "ivan", json!({})).await), 60);
    clock.advance_ms(30_000);
    assert_eq!(fail(&app, "ivan", json!({})).await["retry_after_secs"], 30);
    clock.advance_ms(30_000);
    assert_eq!(lock_secs(fail(&app, "ivan", json!({})).await), 120);
    clock.advance_ms(120_000);
    assert_eq!(lock_secs(fail(&app, "ivan", json!({})).await), 180);
    clock.advance_ms(180_000);
    assert_eq!(lock_secs(fail(&app, "ivan", json!({})).await), 180);

    clock.advance_ms(180_000 + 24 * 3_600_000 + 1);
    assert_eq!(
        fail(&app, "ivan", json!({})).await["locked"],
        false,
        "old failures left the window"
    );
    assert_eq!(
        lock_secs(fail(&app, "ivan", json!({})).await),
        60,
        "the doubling reset"
    );
}

/// A backend behind a proxy on its own host that passes what it reads as
/// the client's address (`remote_addr`: loopback) names no client either:
/// strangers' typos from "127.0.0.1" must not block every user's logins.
async fn a_backend_that_passes_its_own_loopback_address_names_no_client(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.ip_captcha_after = 2;
        s.login.ip_block_after = 4;
    })
    .await;
    let uncounted = r#"tollgate_backend_without_client_ip_total{route="login_attempt"}"#;
    let before = app.metric(uncounted).await;
    let own = [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "127.0.0.1",
        "::1",
    ];
    for (i, ip) in own.into_iter().enumerate() {
        let failed = fail(&app, &format!("stranger{i}"), json!({ "ip": ip })).await;
        assert_eq!(failed["decision"], "allow", "{ip}: {failed}");
    }
    let check = app
        .login_check(json!({ "user": "someone", "ip": "127.0.0.1" }))
        .await;
    assert_eq!(check.body["decision"], "allow", "{}", check.body);
    assert!(app.metric(uncounted).await - before >= 6.0);
}

/// `ip` is optional in DESIGN.md: a login backend that leaves it out
/// reports every user's failures from its own address. Four strangers'
/// typos must not block everyone's logins (nor an allow-listed backend
/// address take every user past its lock); a user's own failures still
/// lock it, and a client the backend names still counts as itself.
async fn a_backend_that_names_no_client_is_not_one_address_every_failure_fills(backend: Backend) {
    let app = spawn_app(backend, |s| {
        s.login.captcha_after = 2;
        s.login.lock_after = 3;
        s.login.ip_captcha_after = 2;
        s.login.ip_block_after = 4;
        s.lists.allow_ips = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let uncounted = r#"tollgate_backend_without_client_ip_total{route="login_attempt"}"#;
    let before = app.metric(uncounted).await;
    for i in 0..6 {
        let failed = fail(&app, &format!("stranger{i}"), json!({})).await;
        assert_eq!(failed, state("allow", false, false, None, 1, None), "{i}");
    }
    let check = app.login_check(json!({ "user": "someone" })).await;
    assert_eq!(check.body["decision"], "allow", "{}", check.body);
    assert!(app.metric(uncounted).await - before >= 6.0);

    let passed = json!({ "captcha_passed": true });
    for _ in 0..3 {
        fail(&app, "alice", passed.clone()).await;
    }
    let locked = fail(&app, "alice", passed).await;
    assert_eq!(locked["reason"], "user_locked", "{locked}");

    let named = json!({ "ip": "203.0.113.50", "captcha_passed": true });
    for i in 0..4 {
        fail(&app, &format!("named{i}"), named.clone()).await;
    }
    let blocked = fail(&app, "named4", named).await;
    assert_eq!(blocked["reason"], "ip_blocked", "{blocked}");
}
